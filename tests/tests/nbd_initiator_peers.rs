//! Our NBD initiator against other people's NBD servers: nbdkit (memory and file
//! plugins), qemu-nbd and nbd-server. Each test starts its own server on a loopback
//! port, runs the device conformance suite (or the part of it the peer supports)
//! through the initiator, and stops the server by the PID it started. A test whose
//! peer program is missing is skipped with a message.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::conformance::{self, pattern};
use blockwire_blockdev::{
    Device, ErrorKind, FileDevice, FileOptions, IoBuf, QueuedOp, Submission, WriteFlags,
};
use blockwire_nbd::initiator::{list_exports, ClientError, ClientOptions, NbdClient, NbdUri};
use blockwire_tests::{free_port, nbdkit, path_str, require, run_queued, sparse_file, MIB};

/// A peer server we started, stopped when dropped: the child itself and, for a
/// server that daemonizes, the daemon's PID from the pid file we told it to write.
struct Peer {
    name: &'static str,
    child: Child,
    pid_file: Option<PathBuf>,
}

impl Peer {
    fn start(name: &'static str, command: &mut Command) -> Peer {
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Peer {
            name,
            child,
            pid_file: None,
        }
    }

    /// The daemon's PID, once its pid file is written.
    fn daemon_pid(&self) -> Option<i32> {
        let path = self.pid_file.as_ref()?;
        std::fs::read_to_string(path).ok()?.trim().parse().ok()
    }

    /// Connects once the peer accepts connections.
    fn connect(&mut self, uri: &NbdUri, options: ClientOptions) -> NbdClient {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match NbdClient::connect(uri, options) {
                Ok(client) => return client,
                // Refused, or reset or closed in the handshake: a peer still
                // starting up (nbdkit accepts before its plugin is ready).
                Err(
                    ClientError::Connect { .. }
                    | ClientError::Io { .. }
                    | ClientError::Closed { .. },
                ) if Instant::now() < deadline => {
                    // A daemonizing peer's first process exits 0 by design.
                    if let Ok(Some(status)) = self.child.try_wait() {
                        assert!(status.success(), "{} exited with {status}", self.name);
                    }
                    thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{}: cannot connect to {uri}: {e}", self.name),
            }
        }
    }

    /// Kills the peer abruptly (SIGKILL), as a crash would.
    fn kill(&mut self) {
        if let Some(pid) = self.daemon_pid() {
            // SAFETY: kill(2) on the daemon our own command started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_gone(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: signal 0 only checks that the process exists.
    while unsafe { libc::kill(pid, 0) } == 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(pid) = self.daemon_pid() {
            // SAFETY: kill(2) on the daemon our own command started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            wait_gone(pid);
            // SAFETY: as above; it had its chance to exit.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn options(connections: usize) -> ClientOptions {
    ClientOptions {
        connections,
        ..ClientOptions::default()
    }
}

/// For tests of what a dropped connection does to its requests when nothing
/// reconnects (reconnecting has its own: crates/nbd/tests/client_reconnect.rs).
fn without_reconnect(connections: usize) -> ClientOptions {
    ClientOptions {
        reconnect: None,
        ..options(connections)
    }
}

/// Connects with 1 and with 4 connections and runs the whole conformance suite
/// each time; checks the connection count follows the peer's multi-conn flag.
fn conformance_with(peer: &mut Peer, uri: &NbdUri) {
    for wanted in [1, 4] {
        let client = peer.connect(uri, options(wanted));
        let multi_conn = client.details().flag_words().contains(&"multi-conn");
        let expected = if multi_conn { wanted } else { 1 };
        assert_eq!(client.connections(), expected, "{}", peer.name);
        eprintln!(
            "{}: {} connection(s), flags {:?}, structured {}, extended headers {}, contexts {:?}",
            peer.name,
            client.connections(),
            client.details().flag_words(),
            client.details().structured,
            client.details().extended_headers,
            client.details().contexts
        );
        conformance::run_all(&Device::new(Arc::new(client)));
    }
}

#[test]
fn nbdkit_memory_conformance() {
    require!("nbdkit");
    let port = free_port();
    let mut peer = memory_peer(port, "64M");
    let uri = NbdUri::tcp("127.0.0.1", port, "");
    let client = peer.connect(&uri, options(1));
    let details = client.details();
    assert_eq!(details.size, 64 * MIB);
    assert!(details.structured && details.base_allocation() && details.used_go);
    // nbdkit 1.32 predates extended headers: it refuses the option, and the
    // initiator falls back to structured replies (the suite below runs on them).
    if nbdkit_version().is_some_and(|v| v < (1, 36)) {
        assert!(!details.extended_headers, "nbdkit {:?}", nbdkit_version());
    }
    drop(client);
    conformance_with(&mut peer, &uri);
}

#[test]
fn nbdkit_file_writes_reach_the_file() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 32 * MIB);
    let port = free_port();
    let mut peer = Peer::start(
        "nbdkit file",
        &mut nbdkit(port, false, &["file", path_str(&disk)]),
    );
    let uri = NbdUri::tcp("127.0.0.1", port, "");
    conformance_with(&mut peer, &uri);

    let device = Device::new(Arc::new(peer.connect(&uri, options(4))));
    let data = pattern(77, 5 * MIB, 3 * MIB as usize);
    device.write(&data, 5 * MIB, WriteFlags::NONE).unwrap();
    device.flush().unwrap();
    drop(device);
    let file = std::fs::read(&disk).unwrap();
    assert!(
        file[5 * MIB as usize..8 * MIB as usize] == data[..],
        "the file does not hold what was written through nbdkit"
    );
}

#[test]
fn nbdkit_read_only_file() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 8 * MIB);
    let port = free_port();
    let mut peer = Peer::start(
        "nbdkit -r file",
        &mut nbdkit(port, true, &["file", path_str(&disk)]),
    );
    let client = peer.connect(&NbdUri::tcp("127.0.0.1", port, ""), options(1));
    assert!(client.details().read_only());
    let local = FileDevice::open(&disk, FileOptions::default()).unwrap();
    conformance::run_read_only(&Device::new(Arc::new(client)), &Device::from_device(local));
}

#[test]
fn nbdkit_killed_fails_requests_with_disconnected() {
    require!("nbdkit");
    let port = free_port();
    let mut peer = memory_peer(port, "64M");
    let device = Device::new(Arc::new(
        peer.connect(&NbdUri::tcp("127.0.0.1", port, ""), without_reconnect(2)),
    ));
    let mut buf = vec![0u8; 64 * 1024];
    device.read(&mut buf, 0).unwrap();
    // Readers keep requests in flight while the server dies under them.
    let readers: Vec<_> = (0..4u64)
        .map(|i| {
            let device = device.clone();
            thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                let started = Instant::now();
                loop {
                    if let Err(e) = device.read(&mut buf, i << 20) {
                        return (e, started.elapsed());
                    }
                    assert!(started.elapsed() < Duration::from_secs(20), "never failed");
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(100));
    let killed = Instant::now();
    peer.kill();
    for reader in readers {
        let (err, _) = reader.join().unwrap();
        assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
    }
    assert!(
        killed.elapsed() < Duration::from_secs(5),
        "requests took {:?} to fail",
        killed.elapsed()
    );
    let err = device.read(&mut buf, 0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Disconnected, "{err}");
}

#[test]
fn qemu_nbd_conformance() {
    require!("qemu-nbd");
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 64 * MIB);
    let port = free_port();
    // Without --discard=unmap qemu-nbd advertises trim but ignores it (the protocol
    // allows that); the conformance suite checks that a native trim reads zeroes.
    let mut peer = Peer::start(
        "qemu-nbd",
        Command::new("qemu-nbd").args([
            "-f",
            "raw",
            "-p",
            &port.to_string(),
            "-b",
            "127.0.0.1",
            "-x",
            "disk",
            "-D",
            "qemu scratch",
            "--shared=8",
            "--discard=unmap",
            "--persistent",
            path_str(&disk),
        ]),
    );
    let uri = NbdUri::tcp("127.0.0.1", port, "disk");
    let client = peer.connect(&uri, options(1));
    let details = client.details().clone();
    drop(client);
    assert_eq!(details.size, 64 * MIB);
    assert!(details.structured && details.base_allocation());
    // qemu-nbd 8.2 and later speak extended headers: the conformance suite below
    // then runs on 32-byte headers and 64-bit block status.
    if qemu_nbd_version().is_some_and(|v| v >= (8, 2)) {
        assert!(
            details.extended_headers,
            "qemu-nbd {:?}",
            qemu_nbd_version()
        );
    }
    assert_eq!(details.description.as_deref(), Some("qemu scratch"));
    let listed = list_exports(&uri).unwrap();
    assert_eq!(
        listed,
        vec![("disk".to_string(), "qemu scratch".to_string())]
    );
    conformance_with(&mut peer, &uri);
}

#[test]
fn nbd_server_conformance() {
    require!("nbd-server");
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 64 * MIB);
    let port = free_port();
    let config = dir.path().join("nbd-server.conf");
    let pid_file = dir.path().join("nbd-server.pid");
    std::fs::write(
        &config,
        format!(
            "[generic]\nport = {port}\nlistenaddr = 127.0.0.1\nallowlist = true\n\
             [disk]\nexportname = {}\ntrim = true\nflush = true\nfua = true\n",
            disk.display()
        ),
    )
    .unwrap();
    // nbd-server daemonizes (-d would serve a single connection and exit); the
    // pid file names the daemon so the test can stop exactly that process.
    let mut peer = Peer::start(
        "nbd-server",
        Command::new("nbd-server")
            .arg("-C")
            .arg(&config)
            .arg("-p")
            .arg(&pid_file),
    );
    peer.pid_file = Some(pid_file);
    let uri = NbdUri::tcp("127.0.0.1", port, "disk");
    let client = peer.connect(&uri, options(1));
    assert_eq!(client.details().size, 64 * MIB);
    drop(client);
    let listed = list_exports(&uri).unwrap();
    assert!(
        listed.iter().any(|(name, _)| name == "disk"),
        "listed: {listed:?}"
    );
    conformance_with(&mut peer, &uri);
}

/// nbdkit serving `size` of memory.
/// (major, minor) of the first "X.Y" in a program's `--version` output.
fn version_of(program: &str) -> Option<(u32, u32)> {
    let output = Command::new(program).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.split_whitespace().find_map(|word| {
        let mut parts = word.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some((major, minor))
    })
}

fn qemu_nbd_version() -> Option<(u32, u32)> {
    version_of("qemu-nbd")
}

fn nbdkit_version() -> Option<(u32, u32)> {
    version_of("nbdkit")
}

fn memory_peer(port: u16, size: &str) -> Peer {
    Peer::start("nbdkit memory", &mut nbdkit(port, false, &["memory", size]))
}

/// nbdkit whose every read waits 30 s: a server that sits on requests.
fn sitting_on_reads(port: u16) -> Peer {
    Peer::start(
        "nbdkit delay",
        &mut nbdkit(
            port,
            false,
            &["--filter=delay", "memory", "16M", "rdelay=30"],
        ),
    )
}

/// A server that stops answering: with a request timeout the request fails as timed
/// out (and the connection closes) instead of waiting forever; without one, a slow
/// but live server is waited for.
#[test]
fn request_timeout_fails_a_request_the_server_sits_on() {
    require!("nbdkit");
    let port = free_port();
    let mut peer = sitting_on_reads(port);
    let uri = NbdUri::tcp("127.0.0.1", port, "");
    let options = ClientOptions {
        request_timeout: Some(Duration::from_millis(500)),
        ..ClientOptions::default()
    };
    let device = Device::new(Arc::new(peer.connect(&uri, options)));
    let started = Instant::now();
    let mut buf = vec![0u8; 4096];
    let err = device
        .read(&mut buf, 0)
        .expect_err("the server never answers in time");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "gave up after {:?}",
        started.elapsed()
    );
    assert!(err.to_string().contains("no reply"), "{err}");
    // Writes are not delayed, but the connection is closed now: they fail too.
    let err = device
        .write(&[1; 4096], 0, WriteFlags::default())
        .expect_err("a closed connection takes no more requests");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
}

#[test]
fn request_queue_sends_requests_nobody_waited_for() {
    // The queue gathers small requests and sends them together; requests that were
    // submitted and never waited for must still leave when the queue goes away.
    require!("nbdkit");
    let port = free_port();
    let mut peer = memory_peer(port, "16M");
    let client = peer.connect(&NbdUri::tcp("127.0.0.1", port, ""), options(1));
    let device = Device::new(Arc::new(client));
    let block = 4096usize;
    {
        let mut queue = device
            .queue()
            .expect("the NBD initiator has a request queue");
        for n in 0..2u64 {
            queue.submit(Submission {
                tag: n,
                op: QueuedOp::Write(WriteFlags::NONE),
                buf: IoBuf::from_slice(&pattern(n, 7, block)),
                offset: n * block as u64,
            });
        }
    }
    // Their replies are not waited for, so poll until the server has the data.
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in 0..2u64 {
        let mut back = vec![0u8; block];
        loop {
            device.read(&mut back, n * block as u64).expect("read");
            if back == pattern(n, 7, block) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "block {n} written through a dropped queue never reached the server"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn request_queue_round_trips_data_with_many_in_flight() {
    require!("nbdkit");
    let port = free_port();
    let mut peer = memory_peer(port, "64M");
    let client = peer.connect(&NbdUri::tcp("127.0.0.1", port, ""), options(2));
    assert_eq!(client.connections(), 2);
    let device = Device::new(Arc::new(client));
    let mut queue = device
        .queue()
        .expect("the NBD initiator has a request queue");
    // 512 writes of 4 KiB, each block its own pattern, 48 in flight over 2
    // connections; then every block read back the same way, in another order.
    let block = 4096usize;
    let writes: Vec<Submission> = (0..512u64)
        .map(|n| Submission {
            tag: n,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&pattern(n, 0, block)),
            offset: n * 3 * block as u64,
        })
        .collect();
    let written = run_queued(queue.as_mut(), writes, 48);
    assert_eq!(written.len(), 512);
    for completion in &written {
        completion.result.as_ref().expect("queued write");
    }
    let reads: Vec<Submission> = (0..512u64)
        .rev()
        .map(|n| Submission {
            tag: n,
            op: QueuedOp::Read,
            buf: IoBuf::new(block),
            offset: n * 3 * block as u64,
        })
        .collect();
    let read = run_queued(queue.as_mut(), reads, 48);
    assert_eq!(read.len(), 512);
    let mut seen = vec![false; 512];
    for completion in read {
        completion.result.expect("queued read");
        let n = completion.tag;
        assert!(!seen[n as usize], "tag {n} completed twice");
        seen[n as usize] = true;
        assert!(completion.buf[..] == pattern(n, 0, block)[..], "block {n}");
    }
    // The checked handle refuses what is out of range; it comes back failed.
    queue.submit(Submission {
        tag: 9,
        op: QueuedOp::Read,
        buf: IoBuf::new(block),
        offset: 64 * MIB,
    });
    let mut refused = Vec::new();
    queue.complete(1, &mut refused);
    assert_eq!(refused.len(), 1);
    let err = refused.pop().unwrap().result.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfRange, "{err}");
    assert_eq!(queue.in_flight(), 0);
    drop(queue);
    // What the queue wrote, the blocking path reads.
    let mut buf = vec![0u8; block];
    device.read(&mut buf, 5 * 3 * block as u64).unwrap();
    assert!(buf == pattern(5, 0, block));
}

#[test]
fn request_queue_hands_back_everything_when_the_server_dies() {
    require!("nbdkit");
    let port = free_port();
    let mut peer = memory_peer(port, "64M");
    let device = Device::new(Arc::new(
        peer.connect(&NbdUri::tcp("127.0.0.1", port, ""), without_reconnect(2)),
    ));
    let mut queue = device.queue().unwrap();
    let mut done = Vec::new();
    let mut tag = 0u64;
    let started = Instant::now();
    let mut killed: Option<Instant> = None;
    let failure = loop {
        while queue.in_flight() < 32 {
            queue.submit(Submission {
                tag,
                op: QueuedOp::Read,
                buf: IoBuf::new(1 << 20),
                offset: (tag % 60) * MIB,
            });
            tag += 1;
        }
        queue.complete(1, &mut done);
        if killed.is_none() && started.elapsed() > Duration::from_millis(100) {
            peer.kill();
            killed = Some(Instant::now());
        }
        if let Some(err) = done.iter().find_map(|c| c.result.as_ref().err()) {
            break (err.kind(), err.to_string());
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never failed");
    };
    assert_eq!(failure.0, ErrorKind::Disconnected, "{}", failure.1);
    // Everything still in flight comes back, failed, without waiting long.
    while queue.in_flight() > 0 {
        queue.complete(queue.in_flight(), &mut done);
    }
    assert!(killed.unwrap().elapsed() < Duration::from_secs(5));
    assert_eq!(done.len() as u64, tag, "every request came back once");
}

#[test]
fn request_queue_times_out_requests_the_server_sits_on() {
    require!("nbdkit");
    let port = free_port();
    let mut peer = sitting_on_reads(port);
    let options = ClientOptions {
        request_timeout: Some(Duration::from_millis(500)),
        ..ClientOptions::default()
    };
    let device = Device::new(Arc::new(
        peer.connect(&NbdUri::tcp("127.0.0.1", port, ""), options),
    ));
    let mut queue = device.queue().unwrap();
    for tag in 0..4 {
        queue.submit(Submission {
            tag,
            op: QueuedOp::Read,
            buf: IoBuf::new(4096),
            offset: tag * 4096,
        });
    }
    let started = Instant::now();
    let mut done = Vec::new();
    queue.complete(4, &mut done);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(done.len(), 4);
    for completion in done {
        let err = completion.result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    }
}
