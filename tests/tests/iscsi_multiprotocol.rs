//! One export served over several protocols at once: what one client writes, the
//! others read. NBD and iSCSI on loopback (qemu-img and qemu-io on both); with root,
//! AoE too, across a veth pair between two network namespaces (our AoE initiator).

use std::process::Command;
use std::sync::Arc;

use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
use blockwire_blockdev::{Device, WriteFlags};
use blockwire_tests::aoe::{SHELF, SLOT};
use blockwire_tests::iscsi::{tool_ok, TOOL_LIMIT};
use blockwire_tests::netns::VethLab;
use blockwire_tests::{
    blockwire_bin, path_str, patterned_file, require, require_qemu_iscsi, require_root,
    run_bounded, sparse_file, text, Served, MIB,
};

#[test]
fn nbd_and_iscsi_read_what_the_other_wrote() {
    require!("qemu-img", "qemu-io");
    require_qemu_iscsi!();
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "shared.img", 32 * MIB);
    let served = Served::start_iscsi(
        &[
            path_str(&image),
            "--name",
            "shared",
            "--listen",
            "127.0.0.1:0",
        ],
        "shared",
    );
    assert_ne!(served.port, 0, "NBD is served too");
    let nbd = served.uri();
    let iscsi = served.iscsi_url().to_string();

    // NBD writes, iSCSI reads.
    let source = patterned_file(dir.path(), "source.img", (4 * MIB) as usize, 9);
    tool_ok(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            path_str(&source),
            &nbd,
        ],
    );
    let back = dir.path().join("back.img");
    tool_ok(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &iscsi, path_str(&back)],
    );
    let expected = std::fs::read(&source).unwrap();
    let read = std::fs::read(&back).unwrap();
    assert_eq!(read.len() as u64, 32 * MIB);
    assert!(
        read[..expected.len()] == expected[..],
        "iSCSI reads what NBD wrote"
    );

    // iSCSI writes, NBD reads (and the other way with qemu-io, in place).
    tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x6b 8M 1M",
            "-c",
            "flush",
            &iscsi,
        ],
    );
    tool_ok(
        "qemu-io",
        &["-r", "-f", "raw", "-c", "read -P 0x6b 8M 1M", &nbd],
    );
    tool_ok(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0x2e 31M 1M",
            "-c",
            "flush",
            &nbd,
        ],
    );
    tool_ok(
        "qemu-io",
        &["-r", "-f", "raw", "-c", "read -P 0x2e 31M 1M", &iscsi],
    );
    if blockwire_tests::have("nbdcopy") {
        let copy = dir.path().join("nbdcopy.img");
        tool_ok("nbdcopy", &[&nbd, path_str(&copy)]);
        let iscsi_copy = dir.path().join("iscsi-copy.img");
        tool_ok(
            "qemu-img",
            &[
                "convert",
                "-f",
                "raw",
                "-O",
                "raw",
                &iscsi,
                path_str(&iscsi_copy),
            ],
        );
        assert!(
            std::fs::read(&copy).unwrap() == std::fs::read(&iscsi_copy).unwrap(),
            "nbdcopy and qemu-img over iSCSI read the same image"
        );
    }
}

/// Runs `qemu-io ARGS... URL` in the target's namespace (where NBD and iSCSI listen
/// on its loopback), failing the test unless it succeeds.
fn qemu_io_in(lab: &VethLab, args: &[&str], url: &str) {
    let mut command = lab.command_in(lab.target_ns(), "qemu-io");
    command.args(["-f", "raw"]).args(args).arg(url);
    let output = run_bounded(command, TOOL_LIMIT);
    assert!(
        output.status.success(),
        "qemu-io {args:?} {url}: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
}

#[test]
fn nbd_aoe_and_iscsi_on_one_export() {
    require_root!();
    require!("qemu-io");
    require_qemu_iscsi!();
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "three.img", 16 * MIB);
    let tag = format!("im{}", std::process::id() % 100000);
    let lab = VethLab::new(&tag, 1, 1500).expect("build the veth lab");
    let mut command: Command = lab.command_in(lab.target_ns(), blockwire_bin());
    command.arg("serve").arg(&image).args([
        "--name",
        "three",
        "--listen",
        "127.0.0.1:0",
        "--iscsi",
        "127.0.0.1:0",
        "--aoe",
        "eth0",
        "--shelf",
        &SHELF.to_string(),
        "--slot",
        &SLOT.to_string(),
    ]);
    let served = Served::spawn_ready(command, "three");
    let nbd = served.uri();
    let iscsi = served.iscsi_url().to_string();
    let uri: AoeUri = format!("aoe://eth0/e{SHELF}.{SLOT}").parse().unwrap();
    let aoe = lab.run_in(lab.initiator_ns(), || {
        AoeClient::open(&uri, AoeOptions::default()).expect("open the AoE target")
    });
    let aoe = Device::new(Arc::new(aoe));

    // AoE writes; NBD and iSCSI read.
    let data = vec![0x4d; 256 << 10];
    aoe.write(&data, 2 * MIB, WriteFlags::default()).unwrap();
    aoe.flush().unwrap();
    qemu_io_in(&lab, &["-r", "-c", "read -P 0x4d 2M 256k"], &nbd);
    qemu_io_in(&lab, &["-r", "-c", "read -P 0x4d 2M 256k"], &iscsi);

    // iSCSI writes; AoE and NBD read.
    qemu_io_in(
        &lab,
        &["-c", "write -P 0x91 5M 512k", "-c", "flush"],
        &iscsi,
    );
    let mut back = vec![0; 512 << 10];
    aoe.read(&mut back, 5 * MIB).unwrap();
    assert!(
        back.iter().all(|&b| b == 0x91),
        "AoE reads what iSCSI wrote"
    );
    qemu_io_in(&lab, &["-r", "-c", "read -P 0x91 5M 512k"], &nbd);

    // NBD writes; AoE and iSCSI read.
    qemu_io_in(&lab, &["-c", "write -P 0xc2 9M 64k", "-c", "flush"], &nbd);
    let mut back = vec![0; 64 << 10];
    aoe.read(&mut back, 9 * MIB).unwrap();
    assert!(back.iter().all(|&b| b == 0xc2), "AoE reads what NBD wrote");
    qemu_io_in(&lab, &["-r", "-c", "read -P 0xc2 9M 64k"], &iscsi);

    drop(aoe);
    drop(served);
    let file = std::fs::read(&image).unwrap();
    assert!(file[2 << 20..(2 << 20) + (256 << 10)]
        .iter()
        .all(|&b| b == 0x4d));
    assert!(file[5 << 20..(5 << 20) + (512 << 10)]
        .iter()
        .all(|&b| b == 0x91));
    assert!(file[9 << 20..(9 << 20) + (64 << 10)]
        .iter()
        .all(|&b| b == 0xc2));
}
