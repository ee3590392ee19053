//! Our iSCSI initiator against real targets: Debian's tgtd (the reference) and
//! `blockwire serve --iscsi` (our target in its own process). The device
//! conformance suite runs through the initiator against both; CHAP with the right
//! secret logs in and with a wrong one fails with the target's status in one line;
//! `blockwire info iscsi://HOST:PORT` lists what `iscsi-ls` lists; `blockwire copy`
//! moves data both ways. Tests that need tgtd say why they skip when it cannot run.

use std::sync::Arc;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::conformance::{self, pattern};
use blockwire_blockdev::{Device, WriteFlags};
use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions, IscsiUri};
use blockwire_tests::iscsi::{tool_ok, Backing, Tgtd, TOOL_LIMIT};
use blockwire_tests::{
    blockwire_bin, copy_in_background, free_port, patterned_file, require, require_tgtd,
    run_bounded, sparse_file, text, Served, MIB,
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

/// `blockwire serve IMAGE --iscsi 127.0.0.1:PORT`, up and announced.
fn serve_on(image: &std::path::Path, port: u16) -> Served {
    let mut command = Command::new(blockwire_bin());
    command
        .arg("serve")
        .arg(image)
        .args(["--iscsi", &format!("127.0.0.1:{port}")]);
    Served::spawn_ready(command, "restarted")
}

#[test]
fn writes_ride_out_a_target_killed_and_restarted_twice() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "restart.img", 32 * MIB);
    let port = free_port();
    let served = serve_on(&image, port);
    // Two sessions: both reconnect, each reinstating its own ISID.
    let device = connect(&format!("{}?reconnect=20&sessions=2", served.iscsi_url()));
    const CHUNK: usize = 64 * 1024;
    let chunks = (16 * MIB) as usize / CHUNK;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Rounds of writes over 16 MiB until told to stop; returns the last round.
    let writer = {
        let device = device.clone();
        let stop = stop.clone();
        thread::spawn(move || {
            let mut round = 0u64;
            loop {
                for i in 0..chunks {
                    let offset = (i * CHUNK) as u64;
                    device
                        .write(&pattern(round, offset, CHUNK), offset, WriteFlags::NONE)
                        .unwrap_or_else(|e| panic!("write at {offset} in round {round}: {e}"));
                }
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                round += 1;
            }
            device.flush().expect("flush after the restarts");
            round
        })
    };
    let mut served = served;
    for _ in 0..2 {
        thread::sleep(Duration::from_millis(300));
        served.kill_hard();
        thread::sleep(Duration::from_millis(300));
        served = serve_on(&image, port);
    }
    thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    let last = writer.join().expect("the writer rode out both restarts");
    assert!(started.elapsed() < Duration::from_secs(60));
    // What the last round wrote is there, through the initiator and in the file.
    let mut back = vec![0u8; CHUNK];
    for i in (0..chunks).step_by(37) {
        let offset = (i * CHUNK) as u64;
        device.read(&mut back, offset).unwrap();
        assert_eq!(back, pattern(last, offset, CHUNK), "at {offset}");
    }
    drop(device);
    drop(served);
    let file = std::fs::read(&image).unwrap();
    assert_eq!(&file[..CHUNK], &pattern(last, 0, CHUNK)[..]);
}

#[test]
fn a_different_unit_behind_the_same_address_is_not_replayed_onto() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "first.img", 16 * MIB);
    let other = sparse_file(dir.path(), "first-bigger.img", 32 * MIB);
    let port = free_port();
    let served = serve_on(&image, port);
    let iqn = served.iqn().to_string();
    let device = connect(&format!("{}?reconnect=5", served.iscsi_url()));
    device.write(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
    served.kill_hard();
    // The same target name, a different size: the identity check refuses it.
    let mut command = Command::new(blockwire_bin());
    command
        .arg("serve")
        .arg(&other)
        .args(["--iscsi", &format!("127.0.0.1:{port}"), "--iqn", &iqn]);
    let _served = Served::spawn_ready(command, "other");
    let error = device.write(&[2u8; 4096], 0, WriteFlags::NONE).unwrap_err();
    assert!(error.to_string().contains("identity"), "{error}");
}

#[test]
fn a_copy_with_verify_rides_out_two_target_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "copy-restart.img", 512 * MIB);
    let source = patterned_file(dir.path(), "copy-source.img", (512 * MIB) as usize, 9);
    let port = free_port();
    let mut served = serve_on(&image, port);
    let url = served.iscsi_url().to_string();
    let copy = copy_in_background(&source, &url, &[]);
    for _ in 0..2 {
        thread::sleep(Duration::from_millis(400));
        served.kill_hard();
        thread::sleep(Duration::from_millis(300));
        served = serve_on(&image, port);
    }
    let output = copy.join().unwrap();
    assert!(
        output.status.success(),
        "the copy failed: {}",
        text(&output.stderr)
    );
    // The restarts happened under the copy (two, or both inside one reconnect when
    // the second kill lands while the first reconnect is still checking the unit).
    let stderr = text(&output.stderr);
    assert!(stderr.contains("reconnecting"), "{stderr}");
    drop(served);
    assert!(std::fs::read(&image).unwrap() == std::fs::read(&source).unwrap());
}

#[test]
fn bench_measures_an_iscsi_lun() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "bench.img", 64 * MIB);
    let served = Served::start_iscsi(&[image.to_str().unwrap()], "bench");
    let json = dir.path().join("bench.json");
    let output = blockwire(&[
        "bench",
        served.iscsi_url(),
        "--workload",
        "sequential,random",
        "--size",
        "16M",
        "--time",
        "1",
        "--random-depths",
        "4",
        "--force",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    for op in ["write", "read", "randread", "randwrite"] {
        let row = results
            .iter()
            .find(|r| r["op"] == op)
            .unwrap_or_else(|| panic!("no {op} row in {report}"));
        assert!(row["mb_per_s"].as_f64().unwrap() > 0.0, "{row}");
    }
}

#[test]
fn a_gateway_serves_an_iscsi_lun_again() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "behind.img", 32 * MIB);
    let behind = Served::start_iscsi(&[image.to_str().unwrap()], "behind");
    // `blockwire serve iscsi://...`: our initiator below, our target above.
    let gateway = Served::start_iscsi(&[behind.iscsi_url()], "gateway");
    let device = connect(gateway.iscsi_url());
    assert_eq!(device.info().size, 32 * MIB);
    conformance::write_read_verify(&device);
    conformance::trim(&device);
    conformance::write_zeroes(&device);
    device.write(&[0x5a; 4096], 8192, WriteFlags::FUA).unwrap();
    drop(device);
    drop(gateway);
    drop(behind);
    let file = std::fs::read(&image).unwrap();
    assert!(file[8192..12288].iter().all(|&b| b == 0x5a));
}
