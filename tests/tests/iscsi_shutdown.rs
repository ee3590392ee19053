//! SIGTERM with initiators logged in: our iSCSI target asks them to log out,
//! finishes, flushes and exits 0, and what they wrote before is in the file.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use blockwire_tests::iscsi::tool_ok;
use blockwire_tests::{path_str, require, require_qemu_iscsi, sparse_file, Served, MIB};

/// A client we started, stopped by PID when dropped (also when a test fails) if the
/// target's goodbye did not end it: libiscsi may keep trying to reconnect.
struct Client(Child);

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Spawns `program ARGS...` and waits until its stdout contains `ready`. Through
/// `stdbuf -oL`: qemu-io and iscsi-perf buffer stdout in a pipe otherwise.
fn spawn_until(program: &str, args: &[&str], ready: &'static str) -> Client {
    let mut child = Command::new("stdbuf")
        .arg("-oL")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let (found, seen) = mpsc::channel();
    std::thread::spawn(move || {
        // Not by lines: iscsi-perf ends its progress lines with \r alone.
        let mut stdout = stdout;
        let mut seen_so_far = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut chunk) {
            if n == 0 {
                break;
            }
            seen_so_far.extend_from_slice(&chunk[..n]);
            if String::from_utf8_lossy(&seen_so_far).contains(ready) {
                let _ = found.send(());
                seen_so_far.clear();
            }
        }
    });
    if seen.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{program} {args:?} never printed {ready:?}");
    }
    Client(child)
}

#[test]
fn sigterm_with_initiators_logged_in_exits_0_and_keeps_their_writes() {
    require!("iscsi-perf", "qemu-io");
    require_qemu_iscsi!();
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "disk.img", 32 * MIB);
    let served = Served::start_iscsi(&[path_str(&image)], "disk");
    let url = served.iscsi_url().to_string();

    // A session that wrote and logged out (no flush: SIGTERM flushes).
    tool_ok("qemu-io", &["-f", "raw", "-c", "write -P 0x5e 0 1M", &url]);
    // A session that wrote and stays logged in, idle.
    let idle = spawn_until(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            "write -P 0xe5 4M 1M",
            "-c",
            "sleep 120000",
            &url,
        ],
        "wrote 1048576/1048576",
    );
    // A session reading as fast as it can, 16 requests in flight.
    let busy = spawn_until(
        "iscsi-perf",
        &["-t", "120", "-m", "16", "-b", "8", "-r", &url],
        "iops current",
    );

    let code = served.terminate();
    drop(idle);
    drop(busy);
    assert_eq!(code, Some(0), "blockwire exits 0 after SIGTERM");
    let data = std::fs::read(&image).unwrap();
    assert!(
        data[..1 << 20].iter().all(|&b| b == 0x5e),
        "the first write is in the file"
    );
    assert!(
        data[4 << 20..5 << 20].iter().all(|&b| b == 0xe5),
        "the logged-in session's write is in the file"
    );
}

#[test]
fn sigterm_during_a_write_stream_exits_0() {
    require!("qemu-io");
    require_qemu_iscsi!();
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "disk.img", 64 * MIB);
    let served = Served::start_iscsi(&[path_str(&image)], "disk");
    let url = served.iscsi_url().to_string();
    // Many 1 MiB writes in a row; SIGTERM lands while they run. Each write the
    // target acknowledged is whole in the file afterwards.
    let mut args = vec!["-f".to_string(), "raw".to_string()];
    for i in 0..64 {
        args.push("-c".into());
        args.push(format!("write -P 0x{:02x} {i}M 1M", 0x40 + i));
    }
    args.push(url.clone());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let writer = spawn_until("qemu-io", &args, "wrote 1048576/1048576 bytes at offset 0");
    let code = served.terminate();
    // It may be reconnecting to the target that is gone.
    drop(writer);
    assert_eq!(code, Some(0), "blockwire exits 0 after SIGTERM");
    // Each MiB is all its pattern or (not written yet) all zeroes.
    let data = std::fs::read(&image).unwrap();
    for i in 0..64usize {
        let chunk = &data[i << 20..(i + 1) << 20];
        let pattern = 0x40 + i as u8;
        assert!(
            chunk.iter().all(|&b| b == pattern) || chunk.iter().all(|&b| b == 0),
            "MiB {i} is torn: neither all 0x{pattern:02x} nor all zeroes"
        );
    }
    assert!(
        data[..1 << 20].iter().all(|&b| b == 0x40),
        "the first write is in the file"
    );
}
