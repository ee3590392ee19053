//! `blockwire copy` to an NBD export whose server is killed (SIGKILL) and started
//! again on the same file, twice, while the copy runs: the initiator reconnects,
//! sends again what had no reply, and the copy completes and verifies. With
//! `--reconnect 0` the same kill fails the copy, saying why.

use std::process::Command;
use std::thread;
use std::time::Duration;

use blockwire_tests::{
    blockwire_bin, copy_in_background, free_port, patterned_file, sparse_file, text, Served,
};

const MIB: u64 = 1 << 20;

/// `blockwire serve IMAGE --listen 127.0.0.1:PORT`, up and announced.
fn serve_on(image: &std::path::Path, port: u16) -> Served {
    let mut command = Command::new(blockwire_bin());
    command
        .arg("serve")
        .arg(image)
        .args(["--listen", &format!("127.0.0.1:{port}")]);
    let name = image.file_name().unwrap().to_str().unwrap();
    Served::spawn_ready(command, name)
}

#[test]
fn a_copy_with_verify_rides_out_two_target_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "nbd-restart.img", 256 * MIB);
    let source = patterned_file(dir.path(), "source.img", (256 * MIB) as usize, 5);
    let port = free_port();
    let mut served = serve_on(&image, port);
    // Four connections (the server allows multi-conn): each reconnects.
    let copy = copy_in_background(&source, &served.uri(), &["--connections", "4"]);
    for _ in 0..2 {
        thread::sleep(Duration::from_millis(400));
        assert!(!copy.is_finished(), "the copy ended before the kill");
        served.kill_hard();
        thread::sleep(Duration::from_millis(500));
        served = serve_on(&image, port);
    }
    let output = copy.join().unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "the copy failed: {stderr}");
    assert!(stderr.contains("reconnecting"), "{stderr}");
    assert!(stderr.contains("reconnected after"), "{stderr}");
    drop(served);
    assert!(std::fs::read(&image).unwrap() == std::fs::read(&source).unwrap());
}

#[test]
fn with_reconnect_off_a_killed_target_fails_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "nbd-no-reconnect.img", 256 * MIB);
    let source = patterned_file(dir.path(), "source.img", (256 * MIB) as usize, 6);
    let port = free_port();
    let served = serve_on(&image, port);
    let copy = copy_in_background(&source, &served.uri(), &["--reconnect", "0"]);
    thread::sleep(Duration::from_millis(400));
    assert!(!copy.is_finished(), "the copy ended before the kill");
    served.kill_hard();
    // Back at once: it would be found, were the copy looking.
    let served = serve_on(&image, port);
    let output = copy.join().unwrap();
    let stderr = text(&output.stderr);
    assert!(!output.status.success(), "the copy succeeded: {stderr}");
    assert!(stderr.contains("disconnected"), "{stderr}");
    assert!(!stderr.contains("reconnecting"), "{stderr}");
    drop(served);
}
