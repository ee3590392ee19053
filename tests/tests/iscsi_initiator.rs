//! Our iSCSI initiator against real targets: Debian's tgtd (the reference) and
//! `blockwire serve --iscsi` (our target in its own process). The device
//! conformance suite runs through the initiator against both; CHAP with the right
//! secret logs in and with a wrong one fails with the target's status in one line;
//! `blockwire info iscsi://HOST:PORT` lists what `iscsi-ls` lists; `blockwire copy`
//! moves data both ways. Tests that need tgtd say why they skip when it cannot run.

use std::sync::Arc;

use blockwire_blockdev::conformance;
use blockwire_blockdev::{Device, WriteFlags};
use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions, IscsiUri};
use blockwire_tests::iscsi::{tool_ok, Backing, Tgtd, TOOL_LIMIT};
use blockwire_tests::{
    blockwire_bin, patterned_file, require, require_tgtd, run_bounded, sparse_file, text, Served,
    MIB,
};

fn connect(url: &str) -> Device {
    let uri: IscsiUri = url.parse().expect("an iscsi:// URL");
    let client = IscsiClient::connect(&uri, IscsiOptions::default())
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    Device::new(Arc::new(client))
}

/// `blockwire ARGS...`, bounded, output captured, success or not.
fn blockwire(args: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(blockwire_bin());
    command.args(args);
    run_bounded(command, TOOL_LIMIT)
}

#[test]
fn conformance_against_tgtd() {
    require_tgtd!();
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "tgt.img", 64 * MIB);
    let mut tgtd = Tgtd::start();
    let url = tgtd.add_target("initiator", Backing::File(&image));
    let device = connect(&url);
    assert_eq!(device.info().size, 64 * MIB);
    conformance::run_all(&device);
    // With CRC32C digests too, once tgtd is told to allow them (it answers None
    // to an initiator that offers only CRC32C otherwise).
    for key in ["HeaderDigest", "DataDigest"] {
        tgtd.tgtadm(&[
            "--mode",
            "target",
            "--op",
            "update",
            "--tid",
            "1",
            "--name",
            key,
            "--value",
            "CRC32C,None",
        ]);
    }
    let device = connect(&format!("{url}?digest=crc32c"));
    conformance::write_read_verify(&device);
}

#[test]
fn chap_against_tgtd() {
    require_tgtd!();
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "chap.img", 16 * MIB);
    let mut tgtd = Tgtd::start();
    let url = tgtd.add_target("chap", Backing::File(&image));
    tgtd.tgtadm(&[
        "--mode",
        "account",
        "--op",
        "new",
        "--user",
        "alice",
        "--password",
        "alice-secret-12",
    ]);
    tgtd.tgtadm(&[
        "--mode", "account", "--op", "bind", "--tid", "1", "--user", "alice",
    ]);
    let rest = url.strip_prefix("iscsi://").unwrap();
    let good = format!("iscsi://alice%alice-secret-12@{rest}");
    let device = connect(&good);
    device.write(&[7u8; 4096], 0, WriteFlags::NONE).unwrap();
    let bad: IscsiUri = format!("iscsi://alice%wrong-secret-99@{rest}")
        .parse()
        .unwrap();
    let error = IscsiClient::connect(&bad, IscsiOptions::default()).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("authentication failure (0x0201)"),
        "{message}"
    );
    assert!(!message.contains('\n'), "{message}");
    // The same through the command line: one line on stderr naming the status.
    let output = blockwire(&["info", &format!("iscsi://alice%wrong-secret-99@{rest}")]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("authentication failure (0x0201)"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn discovery_lists_what_iscsi_ls_lists_on_tgtd() {
    require_tgtd!();
    require!("iscsi-ls");
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "disc.img", 32 * MIB);
    let mut tgtd = Tgtd::start();
    let url = tgtd.add_target("discovery", Backing::File(&image));
    let iqn = url.split('/').nth(3).unwrap().to_string();
    let portal = format!("iscsi://127.0.0.1:{}", tgtd.port);
    let ours = text(&blockwire(&["info", &portal]).stdout);
    let theirs = text(&tool_ok("iscsi-ls", &["-s", &portal]).stdout);
    assert!(theirs.contains(&iqn), "{theirs}");
    assert!(ours.contains(&format!("Target: {iqn}")), "{ours}");
    // tgtd's controller at LUN 0 and the disk at LUN 1, as iscsi-ls shows them.
    assert!(
        ours.contains("Lun:0 Type:STORAGE_ARRAY_CONTROLLER"),
        "{ours}"
    );
    assert!(ours.contains("Lun:1 Type:DISK"), "{ours}");
    assert!(ours.contains("(33554432 bytes"), "{ours}");
}

#[test]
fn copy_through_tgtd_and_back() {
    require_tgtd!();
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "copy.img", 8 * MIB);
    let source = patterned_file(dir.path(), "source.img", 8 * MIB as usize, 3);
    let back = dir.path().join("back.img");
    let mut tgtd = Tgtd::start();
    let url = tgtd.add_target("copy", Backing::File(&image));
    let output = blockwire(&["copy", source.to_str().unwrap(), &url]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let output = blockwire(&["copy", &url, back.to_str().unwrap()]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(&source).unwrap()
    );
    assert_eq!(
        std::fs::read(&image).unwrap(),
        std::fs::read(&source).unwrap()
    );
}

#[test]
fn conformance_against_blockwire_serve() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "served.img", 64 * MIB);
    let served = Served::start_iscsi(&[image.to_str().unwrap()], "served");
    let device = connect(served.iscsi_url());
    conformance::run_all(&device);
    let info = text(&blockwire(&["info", &format!("iscsi://{}", served.iscsi_portal())]).stdout);
    assert!(
        info.contains(&format!("Target: {}", served.iqn())),
        "{info}"
    );
    assert!(info.contains("Lun:0 Type:DISK"), "{info}");
}

#[test]
fn chap_against_blockwire_serve() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "chap.img", 16 * MIB);
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "served-secret-1\n").unwrap();
    let served = Served::start_iscsi(
        &[
            image.to_str().unwrap(),
            "--chap-user",
            "bob",
            "--chap-secret-file",
            secret.to_str().unwrap(),
        ],
        "chap",
    );
    let rest = served
        .iscsi_url()
        .strip_prefix("iscsi://")
        .unwrap()
        .to_string();
    // The secret from a file named in the URL.
    let good = format!("iscsi://bob@{rest}?secret-file={}", secret.display());
    connect(&good)
        .write(&[1u8; 512], 0, WriteFlags::FUA)
        .unwrap();
    let output = blockwire(&["info", &format!("iscsi://bob%nope@{rest}")]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("authentication failure (0x0201)"),
        "{stderr}"
    );
}
