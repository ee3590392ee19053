//! `blockwire copy` between files and our NBD export: bytes equal, holes kept holes.

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use blockwire_tests::{blockwire_bin, patterned_file, Served};

fn copy(args: &[&str]) -> String {
    let output = Command::new(blockwire_bin())
        .arg("copy")
        .args(args)
        .arg("--quiet")
        .output()
        .expect("run blockwire copy");
    assert!(
        output.status.success(),
        "blockwire copy {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn copies_through_an_export_and_back_keeping_holes() {
    let dir = tempfile::tempdir().unwrap();
    // 8 MiB of data followed by 56 MiB of hole.
    let source = patterned_file(dir.path(), "source.img", 8 << 20, 9);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let exported = dir.path().join("exported.img");
    std::fs::File::create(&exported)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let served = Served::start(&[exported.to_str().unwrap(), "--name", "disk"], "disk");

    let report = copy(&[source.to_str().unwrap(), &served.uri(), "--verify"]);
    assert!(report.contains("verified"), "{report}");
    let back = dir.path().join("back.img");
    copy(&[&served.uri(), back.to_str().unwrap(), "--verify"]);

    let original = std::fs::read(&source).unwrap();
    assert!(
        std::fs::read(&back).unwrap() == original,
        "copied image differs"
    );
    // The hole stayed a hole: far less than 64 MiB allocated.
    let allocated = std::fs::metadata(&back).unwrap().blocks() * 512;
    assert!(allocated < 16 << 20, "{allocated} bytes allocated");
    assert_eq!(served.terminate(), Some(0));
    assert!(
        std::fs::read(&exported).unwrap() == original,
        "export's file differs"
    );
}

#[test]
fn refuses_a_destination_smaller_than_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let source = patterned_file(dir.path(), "source.img", 4 << 20, 1);
    let small = dir.path().join("small.img");
    std::fs::File::create(&small)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let output = Command::new(blockwire_bin())
        .args([
            "copy",
            source.to_str().unwrap(),
            small.to_str().unwrap(),
            "--quiet",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("destination holds"), "{stderr}");
    assert_eq!(std::fs::metadata(&small).unwrap().len(), 1 << 20);
}

/// `--timeout` bounds how long a remote target may sit on a request: against an
/// nbdkit whose reads take 30 s, the copy fails with a clear error within seconds.
#[test]
fn a_timeout_fails_a_copy_from_a_server_that_does_not_answer() {
    blockwire_tests::require!("nbdkit");
    let port = blockwire_tests::free_port();
    let mut nbdkit = blockwire_tests::nbdkit(
        port,
        false,
        &["--filter=delay", "pattern", "16M", "rdelay=30"],
    )
    .spawn()
    .expect("start nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.img");
    let uri = format!("nbd://127.0.0.1:{port}/");
    let started = std::time::Instant::now();
    let mut output = None;
    // nbdkit may take a moment to listen.
    for _ in 0..50 {
        let attempt = Command::new(blockwire_bin())
            .args(["copy", &uri])
            .arg(&out)
            .args(["--timeout", "0.5"])
            .output()
            .unwrap();
        let text = blockwire_tests::text(&attempt.stderr);
        if text.contains("onnection refused") {
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        }
        output = Some(attempt);
        break;
    }
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(nbdkit.id() as i32, libc::SIGTERM) };
    let _ = nbdkit.wait();
    let output = output.expect("nbdkit listened");
    let stderr = blockwire_tests::text(&output.stderr);
    assert!(!output.status.success(), "the copy must fail");
    assert!(stderr.contains("no reply"), "{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

/// Between two exports both sides have request queues: the copy is pipelined through
/// them (reads and writes in flight at once), with holes zeroed on the destination.
#[test]
fn copies_between_two_exports_pipelined() {
    let dir = tempfile::tempdir().unwrap();
    // 24 MiB of data, a 16 MiB hole, then 8 MiB more data: data after a hole too.
    let source = patterned_file(dir.path(), "source.img", 48 << 20, 5);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&source)
        .unwrap();
    // SAFETY: fallocate on a file we own; punching a hole keeps the size.
    let punched = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            24 << 20,
            16 << 20,
        )
    };
    assert_eq!(punched, 0, "punch a hole in the source");
    drop(file);
    // The destination starts full of other bytes, so the hole must be written.
    let target = patterned_file(dir.path(), "target.img", 48 << 20, 77);
    let from = Served::start(&[source.to_str().unwrap(), "--name", "from"], "from");
    let to = Served::start(&[target.to_str().unwrap(), "--name", "to"], "to");

    let report = copy(&[
        &from.uri(),
        &to.uri(),
        "--request-size",
        "256K",
        "--requests",
        "4",
        "--verify",
    ]);
    assert!(report.contains("verified"), "{report}");
    assert_eq!(from.terminate(), Some(0));
    assert_eq!(to.terminate(), Some(0));
    assert!(
        std::fs::read(&target).unwrap() == std::fs::read(&source).unwrap(),
        "destination differs from the source"
    );
}

/// A destination that refuses writes fails the pipelined copy with the server's
/// error, at once, instead of hanging.
#[test]
fn a_pipelined_copy_to_a_read_only_export_fails() {
    let dir = tempfile::tempdir().unwrap();
    let source = patterned_file(dir.path(), "source.img", 8 << 20, 3);
    let target = patterned_file(dir.path(), "target.img", 8 << 20, 4);
    let before = std::fs::read(&target).unwrap();
    let from = Served::start(&[source.to_str().unwrap(), "--name", "from"], "from");
    let to = Served::start(
        &[target.to_str().unwrap(), "--name", "to", "--read-only"],
        "to",
    );
    let output = Command::new(blockwire_bin())
        .args(["copy", &from.uri(), &to.uri(), "--quiet"])
        .output()
        .expect("run blockwire copy");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("read-only") || stderr.contains("EPERM") || stderr.contains("ermission"),
        "{stderr}"
    );
    assert_eq!(to.terminate(), Some(0));
    assert!(
        std::fs::read(&target).unwrap() == before,
        "a read-only export changed"
    );
    drop(from);
}
