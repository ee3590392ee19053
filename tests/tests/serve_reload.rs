//! `serve --config` applies an edited file on SIGHUP with clients connected
//! (issue 24): a new export is served at once, a removed one refuses new clients
//! and answers its connected ones NBD_ESHUTDOWN (closing those that stay idle), an
//! unchanged one keeps every connection and its I/O, and an invalid file is refused
//! with the reason in the log while everything keeps serving. Raw NBD clients, so
//! every reply is seen as sent.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_nbd::wire::*;
use blockwire_tests::{http, path_str, require, run, Served, MIB};

/// A client in transmission with simple replies (no structured replies asked for).
#[derive(Debug)]
struct Client {
    stream: TcpStream,
    cookie: u64,
}

/// How a connection attempt ended.
#[derive(Debug)]
enum Opened {
    Ready(Client),
    /// NBD_OPT_GO was answered with this error.
    Refused(u32),
}

fn open(port: u16, export: &str) -> Opened {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut greeting = [0u8; GREETING_LEN];
    stream.read_exact(&mut greeting).unwrap();
    decode_greeting(&greeting).unwrap();
    let flags = NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES;
    stream.write_all(&flags.to_be_bytes()).unwrap();
    let mut go = Vec::new();
    ClientOption::Go {
        name: export.to_string(),
        requests: vec![],
    }
    .encode(&mut go);
    stream.write_all(&go).unwrap();
    loop {
        let mut header = [0u8; OPTION_REPLY_HEADER_LEN];
        stream.read_exact(&mut header).unwrap();
        let header = OptionReplyHeader::decode(&header).unwrap();
        let mut payload = vec![0u8; header.len as usize];
        stream.read_exact(&mut payload).unwrap();
        match header.reply {
            NBD_REP_ACK => return Opened::Ready(Client { stream, cookie: 0 }),
            NBD_REP_INFO => {}
            other => return Opened::Refused(other),
        }
    }
}

fn ready(port: u16, export: &str) -> Client {
    match open(port, export) {
        Opened::Ready(client) => client,
        other => panic!("export {export}: {other:?}"),
    }
}

impl Client {
    /// Sends one request and returns the reply's error and, for a successful read,
    /// its data.
    fn request(&mut self, command: u16, offset: u64, len: u32, payload: &[u8]) -> (u32, Vec<u8>) {
        self.cookie += 1;
        let mut bytes = Vec::new();
        Request {
            flags: 0,
            command,
            cookie: self.cookie,
            offset,
            len: len.into(),
        }
        .encode(&mut bytes);
        bytes.extend_from_slice(payload);
        self.stream.write_all(&bytes).unwrap();
        let mut head = [0u8; SIMPLE_REPLY_LEN];
        self.stream.read_exact(&mut head).unwrap();
        let magic = u32::from_be_bytes(head[0..4].try_into().unwrap());
        assert_eq!(magic, NBD_SIMPLE_REPLY_MAGIC);
        let error = u32::from_be_bytes(head[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(head[8..16].try_into().unwrap());
        assert_eq!(cookie, self.cookie);
        let mut data = Vec::new();
        if command == NBD_CMD_READ && error == 0 {
            data = vec![0u8; len as usize];
            self.stream.read_exact(&mut data).unwrap();
        }
        (error, data)
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.request(NBD_CMD_WRITE, offset, data.len() as u32, data)
            .0
    }

    fn read(&mut self, offset: u64, len: u32) -> (u32, Vec<u8>) {
        self.request(NBD_CMD_READ, offset, len, &[])
    }

    fn disconnect(mut self) {
        let mut bytes = Vec::new();
        Request {
            flags: 0,
            command: NBD_CMD_DISC,
            cookie: 0,
            offset: 0,
            len: 0,
        }
        .encode(&mut bytes);
        self.stream.write_all(&bytes).unwrap();
    }
}

fn sparse(dir: &Path, name: &str) -> String {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(16 * MIB)
        .unwrap();
    path_str(&path).to_string()
}

/// The config: `exports` as (name, source line) and a metrics endpoint.
fn config(exports: &[(&str, &str)]) -> String {
    let mut text =
        "[server]\nlisten = [\"127.0.0.1:0\"]\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n".to_string();
    for (name, source) in exports {
        text.push_str(&format!("\n[[export]]\nname = \"{name}\"\n{source}\n"));
    }
    text
}

fn signal(served: &Served, signal: i32) {
    // SAFETY: kill(2) on our own child's PID.
    assert_eq!(unsafe { libc::kill(served.pid(), signal) }, 0);
}

/// Waits until the log holds `count` lines containing `text`.
fn wait_logged(log: &Path, text: &str, count: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let logged = std::fs::read_to_string(log).unwrap_or_default();
        if logged.matches(text).count() >= count {
            return logged;
        }
        assert!(
            Instant::now() < deadline,
            "no '{text}' in the log:\n{logged}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes and reads back on `client` until `stop`, counting rounds in `done`;
/// any error or wrong byte fails the test from the thread.
fn keep_busy(
    mut client: Client,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> std::thread::JoinHandle<(Client, u64)> {
    std::thread::spawn(move || {
        let mut rounds = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let byte = (rounds % 251) as u8;
            let offset = (rounds % 64) * 4096;
            assert_eq!(client.write(offset, &[byte; 4096]), 0, "round {rounds}");
            let (error, data) = client.read(offset, 4096);
            assert_eq!(error, 0, "round {rounds}");
            assert!(data.iter().all(|b| *b == byte), "round {rounds}");
            rounds += 1;
            done.store(rounds, Ordering::SeqCst);
        }
        (client, rounds)
    })
}

#[test]
fn exports_are_added_and_removed_on_sighup_while_clients_stay() {
    let dir = tempfile::tempdir().unwrap();
    let keep = sparse(dir.path(), "keep.img");
    let gone = sparse(dir.path(), "gone.img");
    let keep_source = format!("path = \"{keep}\"");
    let gone_source = format!("path = \"{gone}\"");
    let file = dir.path().join("serve.toml");
    std::fs::write(
        &file,
        config(&[("keep", &keep_source), ("gone", &gone_source)]),
    )
    .unwrap();
    let log = dir.path().join("serve.log");
    let served = Served::start_config_logged(&file, "keep", &log);
    let port = served.port;

    let mut on_gone = ready(port, "gone");
    assert_eq!(on_gone.write(MIB, &[0x5a; 4096]), 0);
    let idle_on_gone = ready(port, "gone");
    let on_keep = ready(port, "keep");
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let busy = keep_busy(on_keep, stop.clone(), rounds.clone());
    // I/O is running when each reload comes, and goes on after it.
    let busy_for = |more: u64| {
        let target = rounds.load(Ordering::SeqCst) + more;
        let deadline = Instant::now() + Duration::from_secs(20);
        while rounds.load(Ordering::SeqCst) < target {
            assert!(Instant::now() < deadline, "the I/O on 'keep' stalled");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    busy_for(20);

    // "gone" removed, "fresh" added, "keep" unchanged.
    std::fs::write(
        &file,
        config(&[("keep", &keep_source), ("fresh", "memory = \"16M\"")]),
    )
    .unwrap();
    signal(&served, libc::SIGHUP);
    let logged = wait_logged(&log, "reload: unchanged", 1);
    assert!(
        logged.contains("reload: export 'gone' removed (nbd)"),
        "{logged}"
    );
    assert!(
        logged.contains("reload: export 'fresh' added (nbd)"),
        "{logged}"
    );
    assert!(logged.contains("reload: unchanged 1"), "{logged}");
    busy_for(20);

    // The new export serves new clients at once.
    let mut fresh = ready(port, "fresh");
    assert_eq!(fresh.write(0, &[7; 512]), 0);
    assert_eq!(fresh.read(0, 512), (0, vec![7; 512]));
    fresh.disconnect();
    // The removed one is not found any more...
    match open(port, "gone") {
        Opened::Refused(reply) => assert_eq!(reply, NBD_REP_ERR_UNKNOWN),
        other => panic!("a removed export was opened: {other:?}"),
    }
    // ...and its connected client is told to go (proto.md: ESHUTDOWN), then leaves.
    assert_eq!(on_gone.read(MIB, 4096).0, NBD_ESHUTDOWN);
    assert_eq!(on_gone.write(0, &[1; 512]), NBD_ESHUTDOWN);
    on_gone.disconnect();
    // The metrics show the new export.
    let metrics = served.metrics.clone().expect("metrics announced");
    let (status, exposition) = http::get(&metrics, "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(
        exposition.contains("export=\"fresh\",protocol=\"nbd\""),
        "{exposition}"
    );

    // An invalid file: refused, with the reason and line; everything keeps serving.
    std::fs::write(
        &file,
        format!(
            "{}bogus_key = 1\n",
            config(&[("keep", &keep_source), ("fresh", "memory = \"16M\"")])
        ),
    )
    .unwrap();
    signal(&served, libc::SIGHUP);
    let logged = wait_logged(&log, "reload refused", 1);
    busy_for(20);
    assert!(logged.contains("bogus_key"), "{logged}");
    assert!(logged.contains("serve.toml:"), "the line: {logged}");
    let mut fresh = ready(port, "fresh");
    assert_eq!(fresh.read(0, 512), (0, vec![7; 512]));
    fresh.disconnect();

    // A client that stays idle on a removed export is closed after the grace
    // period (10 s): its socket reaches end of file.
    let mut idle = idle_on_gone.stream;
    idle.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        idle.read(&mut byte).unwrap(),
        0,
        "an idle client was not closed"
    );
    wait_logged(&log, "removed export drained", 1);

    stop.store(true, Ordering::SeqCst);
    let (on_keep, rounds) = busy.join().expect("I/O on the unchanged export failed");
    assert!(
        rounds >= 60,
        "only {rounds} rounds of I/O across the reloads"
    );
    on_keep.disconnect();

    // What was written to the removed export before is on disk.
    let data = std::fs::read(&gone).unwrap();
    assert!(data[MIB as usize..MIB as usize + 4096]
        .iter()
        .all(|b| *b == 0x5a));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("panicked"), "{logged}");
    assert_eq!(served.terminate(), Some(0));
}

#[test]
fn nbdinfo_sees_added_exports_and_misses_removed_ones() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("serve.toml");
    std::fs::write(&file, config(&[("first", "memory = \"16M\"")])).unwrap();
    let log = dir.path().join("serve.log");
    let served = Served::start_config_logged(&file, "first", &log);
    let uri = |name: &str| format!("nbd://127.0.0.1:{}/{name}", served.port);
    run("nbdinfo", &[&uri("first")]);

    std::fs::write(&file, config(&[("second", "memory = \"32M\"")])).unwrap();
    signal(&served, libc::SIGHUP);
    wait_logged(&log, "reload: unchanged", 1);
    let info = run("nbdinfo", &["--size", &uri("second")]);
    assert_eq!(String::from_utf8_lossy(&info.stdout).trim(), "33554432");
    let refused = std::process::Command::new("nbdinfo")
        .arg(uri("first"))
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "a removed export answered nbdinfo"
    );
    // libnbd reports NBD_REP_ERR_UNKNOWN as ENOENT.
    let stderr = String::from_utf8_lossy(&refused.stderr).to_lowercase();
    assert!(stderr.contains("no such file or directory"), "{stderr}");
    assert_eq!(served.terminate(), Some(0));
}
