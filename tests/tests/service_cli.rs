//! `serve` as a systemd service: the unit in packaging/ passes `systemd-analyze
//! verify`; READY=1 reaches NOTIFY_SOCKET once the listeners are up and STOPPING=1
//! at shutdown; SIGHUP with an invalid file is refused, logged, and the old
//! configuration keeps serving; logs carry no timestamps under journald
//! (JOURNAL_STREAM) and are JSON lines with --log-format json.

use std::net::TcpStream;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blockwire_tests::{assert_success, blockwire_bin, path_str, require, text};

/// The repository's packaging/ directory.
fn packaging() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    require!("systemd-analyze", "man");
    let dir = tempfile::tempdir().unwrap();
    // The unit's Documentation= pages must exist: ours, on a MANPATH of their own.
    let pages = dir.path().join("pages");
    assert_success(
        &Command::new(blockwire_bin())
            .arg("manpages")
            .arg(&pages)
            .output()
            .unwrap(),
    );
    for section in ["1", "5"] {
        let into = dir.path().join(format!("man/man{section}"));
        std::fs::create_dir_all(&into).unwrap();
        for entry in std::fs::read_dir(&pages).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) == Some(section) {
                std::fs::copy(&path, into.join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    // The binary under test stands in for /usr/bin/blockwire.
    let unit = std::fs::read_to_string(packaging().join("blockwire.service")).unwrap();
    let unit = unit.replace("/usr/bin/blockwire", path_str(&blockwire_bin()));
    let path = dir.path().join("blockwire.service");
    std::fs::write(&path, unit).unwrap();
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .env("MANPATH", dir.path().join("man"))
        .output()
        .unwrap();
    assert_success(&output);
    assert_eq!(text(&output.stderr), "", "systemd-analyze warns");
}

/// Messages sent to a NOTIFY_SOCKET of ours.
struct NotifySocket {
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind(path: &Path) -> NotifySocket {
        let socket = UnixDatagram::bind(path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        NotifySocket { socket }
    }

    /// The next message, or panics after 20 s.
    fn next(&self) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .socket
            .recv(&mut buf)
            .expect("a message on NOTIFY_SOCKET");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    /// Waits for a message containing `line` (as one of its lines).
    fn wait_for(&self, line: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let message = self.next();
            if message.lines().any(|l| l == line) {
                return message;
            }
            assert!(Instant::now() < deadline, "no {line} (last: {message})");
        }
    }
}

fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on our own child's PID.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

#[test]
fn ready_after_the_listeners_stopping_at_the_end_and_an_invalid_reload_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let notify = NotifySocket::bind(&dir.path().join("notify"));
    let port = blockwire_tests::free_port();
    let config = dir.path().join("serve.toml");
    let valid = format!(
        "[server]\nlisten = [\"127.0.0.1:{port}\"]\n\n[[export]]\nname = \"disk\"\nmemory = \"16M\"\n"
    );
    std::fs::write(&config, &valid).unwrap();
    let log = dir.path().join("serve.log");
    let mut child = Command::new(blockwire_bin())
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .env("NOTIFY_SOCKET", dir.path().join("notify"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let ready = notify.wait_for("READY=1");
    // Ready means listening: a client can connect at once.
    TcpStream::connect(("127.0.0.1", port)).expect("listening when READY=1 came");
    assert!(ready.contains("STATUS=serving"), "{ready}");

    // An invalid file: refused, said why (with the line), and still serving.
    std::fs::write(&config, format!("{valid}bogus_key = 1\n")).unwrap();
    signal(pid, libc::SIGHUP);
    notify.wait_for("RELOADING=1");
    let after = notify.wait_for("READY=1");
    assert!(after.contains("invalid"), "{after}");
    TcpStream::connect(("127.0.0.1", port)).expect("still serving after a refused reload");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("reload refused"), "{logged}");
    assert!(
        logged.contains("serve.toml:7"),
        "the line of the error: {logged}"
    );
    assert!(logged.contains("bogus_key"), "{logged}");
    assert_eq!(child.try_wait().unwrap(), None, "SIGHUP ended serve");

    signal(pid, libc::SIGTERM);
    notify.wait_for("STOPPING=1");
    assert!(child.wait().unwrap().success());
}

/// The log of `serve --listen 127.0.0.1:0 ARGS` started and stopped at once (it
/// logs its signal and its shutdown), with stderr the file `log` and, if
/// `journal`, JOURNAL_STREAM naming that file as journald would.
fn log_of(dir: &Path, args: &[&str], log: &str, journal: bool) -> String {
    let log = dir.join(log);
    let stderr = std::fs::File::create(&log).unwrap();
    let socket = dir.join(format!("{}.notify", log.display()));
    let notify = NotifySocket::bind(&socket);
    let mut command = Command::new(blockwire_bin());
    command
        .arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("NOTIFY_SOCKET", &socket)
        .stdout(Stdio::null())
        .stderr(stderr);
    if journal {
        let meta = std::fs::metadata(&log).unwrap();
        command.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
    }
    let mut child = command.spawn().unwrap();
    notify.wait_for("READY=1");
    signal(child.id(), libc::SIGTERM);
    assert!(child.wait().unwrap().success());
    std::fs::read_to_string(&log).unwrap()
}

#[test]
fn no_timestamps_under_journald_and_json_lines_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();

    let plain = log_of(dir, &[], "plain.log", false);
    let first = plain.lines().next().expect("serve logs something");
    assert!(first.starts_with("20"), "a timestamp first: {first:?}");

    let journal = log_of(dir, &[], "journal.log", true);
    assert!(journal.lines().count() >= 2, "{journal}");
    for line in journal.lines() {
        assert!(
            line.trim_start().starts_with("INFO") || line.trim_start().starts_with("WARN"),
            "a line for journald starts with its level, no time: {line:?}"
        );
        assert!(!line.contains('\u{1b}'), "colour codes: {line:?}");
    }

    let json = log_of(dir, &["--log-format", "json"], "json.log", false);
    let mut lines = 0;
    for line in json.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(event["timestamp"].is_string(), "{line}");
        assert!(event["level"].is_string(), "{line}");
        assert!(event["message"].is_string(), "{line}");
        lines += 1;
    }
    assert!(lines >= 2, "{json}");
}

/// SIGUSR1 logs one status line (memory, threads, open files, NBD and iSCSI
/// connections) and changes nothing else.
#[test]
fn sigusr1_logs_the_status_and_serving_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let notify = NotifySocket::bind(&dir.path().join("notify"));
    let port = blockwire_tests::free_port();
    let iscsi_port = blockwire_tests::free_port();
    let log = dir.path().join("serve.log");
    let mut child = Command::new(blockwire_bin())
        .args(["serve", "--size", "16M", "--name", "disk"])
        .arg(dir.path().join("disk.img"))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--iscsi", &format!("127.0.0.1:{iscsi_port}")])
        .env("NOTIFY_SOCKET", dir.path().join("notify"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    notify.wait_for("READY=1");
    let mut open: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    open.push(TcpStream::connect(("127.0.0.1", iscsi_port)).unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        signal(child.id(), libc::SIGUSR1);
        std::thread::sleep(Duration::from_millis(200));
        let logged = std::fs::read_to_string(&log).unwrap();
        // The two connections may still be on their way in: ask until they count.
        if let Some(line) = logged.lines().rev().find(|l| {
            l.contains("status:")
                && l.contains("2 NBD connections")
                && l.contains("1 iSCSI connections")
        }) {
            break line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no status line with both connections:\n{logged}"
        );
    };
    assert!(
        status.contains("MiB") && status.contains("threads"),
        "{status}"
    );
    assert!(status.contains("open files"), "{status}");
    assert_eq!(child.try_wait().unwrap(), None, "SIGUSR1 ended serve");
    drop(open);
    signal(child.id(), libc::SIGTERM);
    assert!(child.wait().unwrap().success());
}
