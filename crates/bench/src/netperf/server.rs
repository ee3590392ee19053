//! The netperf server (`blockwire netserve`, or `blockwire serve --netserve`): accepts
//! connections, runs each one's test on its own thread, and reports what it counted
//! and the CPU time its process used.
//!
//! Nothing a client sends can stop the server or hold a thread forever: the request
//! must arrive within the handshake timeout, every read and write in a test within
//! the idle timeout, a test ends at its duration (a sending client gets the idle
//! timeout as grace to stop), and connections beyond the limit are turned away.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{
    encode_chunk_header, Accept, Direction, Report, Request, Status, TestRequest, WireError,
    CHUNK_HEADER_LEN, REQUEST_LEN, START,
};
use super::{fill_pattern, process_cpu_ns};
use crate::meter::MB;

/// How long a stop waits for connection threads after closing their sockets.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Limits of a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Connections beyond this many at once are answered "busy" and closed. Each
    /// holds a thread and a buffer of up to 4 MiB.
    pub max_connections: usize,
    /// A client must send its request (and a receiving client its start byte)
    /// within this time.
    pub handshake_timeout: Duration,
    /// Longest wait for any one read or write during a test; also the grace a
    /// sending client gets past its duration.
    pub idle_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 32,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(10),
        }
    }
}

struct Shared {
    listener: TcpListener,
    stopping: AtomicBool,
    next_id: AtomicU64,
    /// Open connections: a clone of each socket, to close them on stop.
    connections: Mutex<HashMap<u64, TcpStream>>,
    connections_changed: Condvar,
}

impl Shared {
    fn connections(&self) -> std::sync::MutexGuard<'_, HashMap<u64, TcpStream>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Asks a running server to stop. Cheap to clone; safe to call from a signal
/// thread, and more than once.
#[derive(Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.stopping.store(true, Ordering::SeqCst);
        // SAFETY: shutdown(2) on the listening socket `Shared` owns (and keeps open
        // while this handle holds it) wakes a thread blocked in accept().
        unsafe { libc::shutdown(self.0.listener.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

/// A bound netperf server; [`run`](NetServer::run) serves until a
/// [`ShutdownHandle`] fires.
pub struct NetServer {
    shared: Arc<Shared>,
    config: ServerConfig,
}

impl NetServer {
    /// Binds the listening socket (port 0 picks a free one; see
    /// [`local_addr`](NetServer::local_addr)).
    pub fn bind(addr: impl ToSocketAddrs, config: ServerConfig) -> io::Result<NetServer> {
        let listener = TcpListener::bind(addr)?;
        Ok(NetServer {
            shared: Arc::new(Shared {
                listener,
                stopping: AtomicBool::new(false),
                next_id: AtomicU64::new(0),
                connections: Mutex::new(HashMap::new()),
                connections_changed: Condvar::new(),
            }),
            config,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.shared.listener.local_addr()
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shared.clone())
    }

    /// Accepts and serves connections until shut down; then closes every open
    /// connection and waits (briefly) for their threads.
    pub fn run(self) -> io::Result<()> {
        let shared = &self.shared;
        loop {
            let accepted = shared.listener.accept();
            if shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("netserve: accept failed: {e}");
                    // Out of file descriptors and the like: do not spin.
                    thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            self.start_connection(stream, peer);
        }
        let mut connections = shared.connections();
        for stream in connections.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while !connections.is_empty() && Instant::now() < deadline {
            connections = shared
                .connections_changed
                .wait_timeout(connections, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        tracing::info!("netserve: stopped");
        Ok(())
    }

    /// Runs the server on a thread of its own.
    pub fn spawn(self) -> io::Result<RunningServer> {
        let addr = self.local_addr()?;
        let handle = self.shutdown_handle();
        let thread = thread::Builder::new()
            .name("netserve".into())
            .spawn(move || self.run())?;
        Ok(RunningServer {
            addr,
            handle,
            thread,
        })
    }

    fn start_connection(&self, stream: TcpStream, peer: SocketAddr) {
        let shared = &self.shared;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut connections = shared.connections();
            if connections.len() >= self.config.max_connections {
                tracing::warn!(
                    %peer,
                    "netserve: too many connections ({}); turning one away",
                    connections.len()
                );
                turn_away(stream);
                return;
            }
            match stream.try_clone() {
                Ok(clone) => connections.insert(id, clone),
                Err(e) => {
                    tracing::warn!(%peer, "netserve: cannot track a connection: {e}");
                    return;
                }
            };
        }
        let shared_for_thread = shared.clone();
        let config = self.config.clone();
        let spawned = thread::Builder::new()
            .name(format!("netserve-{id}"))
            .spawn(move || {
                match serve_connection(stream, &config, &shared_for_thread.stopping) {
                    Ok(Done::CpuSample) => tracing::debug!(%peer, "netserve: CPU sample taken"),
                    Ok(Done::Test { direction, report }) => tracing::info!(
                        %peer,
                        "netserve: {} {} bytes in {:.2} s ({:.1} MB/s)",
                        match direction {
                            Direction::ClientSends => "received",
                            Direction::ClientReceives => "sent",
                        },
                        report.bytes,
                        report.elapsed_ns as f64 / 1e9,
                        mb_per_s(&report)
                    ),
                    Err(e @ ConnectionError::ClosedEarly) => {
                        tracing::debug!(%peer, "netserve: {e}")
                    }
                    Err(e) => tracing::warn!(%peer, "netserve: {e}; connection closed"),
                }
                let mut connections = shared_for_thread.connections();
                connections.remove(&id);
                shared_for_thread.connections_changed.notify_all();
            });
        if let Err(e) = spawned {
            tracing::error!("netserve: cannot start a connection thread: {e}");
            shared.connections().remove(&id);
            shared.connections_changed.notify_all();
        }
    }
}

/// A server running on its own thread.
pub struct RunningServer {
    pub addr: SocketAddr,
    handle: ShutdownHandle,
    thread: thread::JoinHandle<io::Result<()>>,
}

impl RunningServer {
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Stops the server and waits for it.
    pub fn stop(self) -> io::Result<()> {
        self.handle.shutdown();
        self.thread
            .join()
            .map_err(|_| io::Error::other("the netserve thread panicked"))?
    }
}

/// Tells a client over the limit that the server is busy, without waiting on it.
fn turn_away(mut stream: TcpStream) {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = stream.write_all(&Accept::new(Status::Busy).encode());
    let _ = stream.shutdown(Shutdown::Write);
}

/// Why a connection ended without a report.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
    #[error("bad request: {0}")]
    Request(WireError),
    #[error("the client did not send its start byte (got {0})")]
    NoStart(u8),
    #[error("the client kept sending {0:.1} s past its duration")]
    Overran(f64),
    #[error("the server is stopping")]
    Stopping,
    /// Closed before sending a whole request: a port check (`nc -z`), not a client
    /// gone wrong.
    #[error("closed before sending a request")]
    ClosedEarly,
}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> ConnectionError {
    move |source| ConnectionError::Io { what, source }
}

/// One request served.
enum Done {
    Test {
        direction: Direction,
        report: Report,
    },
    CpuSample,
}

/// A test's throughput by the server's count and clock.
fn mb_per_s(report: &Report) -> f64 {
    report.bytes as f64 / MB / (report.elapsed_ns as f64 / 1e9).max(1e-9)
}

/// Serves one connection from request to report.
fn serve_connection(
    mut stream: TcpStream,
    config: &ServerConfig,
    stopping: &AtomicBool,
) -> Result<Done, ConnectionError> {
    stream
        .set_read_timeout(Some(config.handshake_timeout))
        .map_err(io_error("setting a timeout"))?;
    stream
        .set_write_timeout(Some(config.idle_timeout))
        .map_err(io_error("setting a timeout"))?;
    let mut bytes = [0u8; REQUEST_LEN];
    stream.read_exact(&mut bytes).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => ConnectionError::ClosedEarly,
        _ => ConnectionError::Io {
            what: "reading the request",
            source: e,
        },
    })?;
    let request = match Request::decode(&bytes) {
        Ok(request) => request,
        Err(e) => {
            // Answer only our own protocol; a stranger gets nothing back.
            let status = match e {
                WireError::BadMagic => None,
                WireError::UnsupportedVersion(_) => Some(Status::UnsupportedVersion),
                _ => Some(Status::InvalidRequest),
            };
            if let Some(status) = status {
                let _ = stream.write_all(&Accept::new(status).encode());
            }
            return Err(ConnectionError::Request(e));
        }
    };
    stream
        .write_all(&Accept::new(Status::Accepted).encode())
        .map_err(io_error("answering the request"))?;
    let (report, done) = match request {
        Request::Test(test) => {
            let report = match test.direction {
                Direction::ClientSends => receive(&mut stream, &test, config, stopping)?,
                Direction::ClientReceives => send(&mut stream, &test, stopping)?,
            };
            let done = Done::Test {
                direction: test.direction,
                report,
            };
            (report, done)
        }
        Request::CpuSample => {
            let report = Report {
                bytes: 0,
                elapsed_ns: 0,
                cpu_ns: process_cpu_ns(),
            };
            (report, Done::CpuSample)
        }
    };
    stream
        .write_all(&report.encode())
        .map_err(io_error("sending the report"))?;
    let _ = stream.shutdown(Shutdown::Write);
    Ok(done)
}

/// The client sends: count and discard until it closes its side. The clock starts
/// at the first byte, so a client that opens several streams before starting them
/// is timed from when data flows.
fn receive(
    stream: &mut TcpStream,
    test: &TestRequest,
    config: &ServerConfig,
    stopping: &AtomicBool,
) -> Result<Report, ConnectionError> {
    stream
        .set_read_timeout(Some(config.idle_timeout))
        .map_err(io_error("setting a timeout"))?;
    let mut buffer = vec![0u8; test.buffer_size as usize];
    let limit = Duration::from_millis(test.duration_ms.into()) + config.idle_timeout;
    let mut started: Option<(Instant, Option<u64>)> = None;
    let mut received = 0u64;
    loop {
        let n = match stream.read(&mut buffer) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(ConnectionError::Io {
                    what: "receiving data",
                    source: e,
                })
            }
        };
        let (start, _) = *started.get_or_insert_with(|| (Instant::now(), process_cpu_ns()));
        if n == 0 {
            break;
        }
        received += n as u64;
        if stopping.load(Ordering::Relaxed) {
            return Err(ConnectionError::Stopping);
        }
        let elapsed = start.elapsed();
        if elapsed > limit {
            return Err(ConnectionError::Overran(
                elapsed.as_secs_f64() - limit.as_secs_f64(),
            ));
        }
    }
    Ok(finish(received, started))
}

/// The client receives: wait for its start byte (within the handshake timeout, still
/// set), then send chunks until the duration or byte limit is reached (each write
/// within the idle timeout), then the end-of-data chunk.
fn send(
    stream: &mut TcpStream,
    test: &TestRequest,
    stopping: &AtomicBool,
) -> Result<Report, ConnectionError> {
    let mut start_byte = [0u8; 1];
    stream
        .read_exact(&mut start_byte)
        .map_err(io_error("waiting for the start byte"))?;
    if start_byte[0] != START {
        return Err(ConnectionError::NoStart(start_byte[0]));
    }
    // Header and payload in one buffer: one write per chunk.
    let buffer_size = test.buffer_size as usize;
    let mut chunk = vec![0u8; CHUNK_HEADER_LEN + buffer_size];
    fill_pattern(&mut chunk[CHUNK_HEADER_LEN..]);
    chunk[..CHUNK_HEADER_LEN].copy_from_slice(&encode_chunk_header(test.buffer_size));
    let duration = Duration::from_millis(test.duration_ms.into());
    let limit = (test.byte_limit > 0).then_some(test.byte_limit);
    let started = (Instant::now(), process_cpu_ns());
    let mut sent = 0u64;
    while started.0.elapsed() < duration && !stopping.load(Ordering::Relaxed) {
        let len = match limit {
            Some(limit) if sent >= limit => break,
            Some(limit) => (limit - sent).min(buffer_size as u64) as usize,
            None => buffer_size,
        };
        if len < buffer_size {
            chunk[..CHUNK_HEADER_LEN].copy_from_slice(&encode_chunk_header(len as u32));
        }
        stream
            .write_all(&chunk[..CHUNK_HEADER_LEN + len])
            .map_err(io_error("sending data"))?;
        sent += len as u64;
    }
    stream
        .write_all(&encode_chunk_header(0))
        .map_err(io_error("ending the data"))?;
    Ok(finish(sent, Some(started)))
}

/// The report of a test that started at `started` (None: no data ever came).
fn finish(bytes: u64, started: Option<(Instant, Option<u64>)>) -> Report {
    let Some((start, cpu_before)) = started else {
        return Report {
            bytes,
            elapsed_ns: 0,
            cpu_ns: Some(0),
        };
    };
    let elapsed_ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let cpu_ns = cpu_before
        .zip(process_cpu_ns())
        .map(|(before, after)| after.saturating_sub(before));
    Report {
        bytes,
        elapsed_ns,
        cpu_ns,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::netperf::wire::{ACCEPT_LEN, REPORT_LEN, VERSION};

    /// A server on a free loopback port, running on its own thread.
    pub(crate) fn server() -> RunningServer {
        NetServer::bind("127.0.0.1:0", ServerConfig::default())
            .unwrap()
            .spawn()
            .unwrap()
    }

    fn connect(server: &RunningServer) -> TcpStream {
        let stream = TcpStream::connect(server.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
    }

    #[test]
    fn a_stranger_gets_no_answer_and_the_server_lives_on() {
        let server = server();
        let mut stranger = connect(&server);
        stranger
            .write_all(b"GET / HTTP/1.1\r\nHost: netserve\r\n\r\n")
            .unwrap();
        let mut answer = Vec::new();
        // The server closes without writing anything; closing with the stranger's
        // unread bytes still queued makes that a reset rather than an end of file.
        match stranger.read_to_end(&mut answer) {
            Ok(_) => assert!(answer.is_empty(), "{answer:?}"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        }

        // A proper client is still served.
        let mut client = connect(&server);
        let request = Request::Test(TestRequest {
            direction: Direction::ClientSends,
            duration_ms: 1000,
            byte_limit: 0,
            buffer_size: 4096,
        });
        client.write_all(&request.encode()).unwrap();
        let mut accept = [0u8; ACCEPT_LEN];
        client.read_exact(&mut accept).unwrap();
        assert_eq!(Accept::decode(&accept).unwrap().status, Status::Accepted);
        client.write_all(&[7u8; 10_000]).unwrap();
        client.shutdown(Shutdown::Write).unwrap();
        let mut report = [0u8; REPORT_LEN];
        client.read_exact(&mut report).unwrap();
        assert_eq!(Report::decode(&report).unwrap().bytes, 10_000);
        server.stop().unwrap();
    }

    #[test]
    fn other_versions_and_bad_requests_are_answered_then_closed() {
        let server = server();
        let test = TestRequest {
            direction: Direction::ClientReceives,
            duration_ms: 1000,
            byte_limit: 0,
            buffer_size: 4096,
        };
        let mut newer = Request::Test(test).encode();
        newer[9] = 3;
        // A version 1 client's CPU sample: direction 2 where kind and direction are now.
        let mut older = Request::CpuSample.encode();
        older[8..12].copy_from_slice(&[0, 1, 2, 0]);
        let huge = TestRequest {
            buffer_size: 1 << 30,
            ..test
        };
        for (bytes, status) in [
            (newer, Status::UnsupportedVersion),
            (older, Status::UnsupportedVersion),
            (Request::Test(huge).encode(), Status::InvalidRequest),
        ] {
            let mut client = connect(&server);
            client.write_all(&bytes).unwrap();
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).unwrap();
            let accept = Accept::decode(&answer).unwrap();
            assert_eq!((accept.version, accept.status), (VERSION, status));
        }
        server.stop().unwrap();
    }

    #[test]
    fn a_silent_client_is_dropped_after_the_handshake_timeout() {
        let config = ServerConfig {
            handshake_timeout: Duration::from_millis(200),
            ..ServerConfig::default()
        };
        let server = NetServer::bind("127.0.0.1:0", config)
            .unwrap()
            .spawn()
            .unwrap();
        let mut silent = connect(&server);
        let started = Instant::now();
        let mut answer = Vec::new();
        let _ = silent.read_to_end(&mut answer);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(answer.is_empty());
        server.stop().unwrap();
    }

    #[test]
    fn connections_over_the_limit_are_told_busy() {
        let config = ServerConfig {
            max_connections: 1,
            ..ServerConfig::default()
        };
        let server = NetServer::bind("127.0.0.1:0", config)
            .unwrap()
            .spawn()
            .unwrap();
        // The first holds the only slot (it never sends its request in this test).
        let _first = connect(&server);
        thread::sleep(Duration::from_millis(100));
        let mut second = connect(&server);
        let mut answer = [0u8; ACCEPT_LEN];
        second.read_exact(&mut answer).unwrap();
        assert_eq!(Accept::decode(&answer).unwrap().status, Status::Busy);
        server.stop().unwrap();
    }

    #[test]
    fn stop_closes_a_test_in_progress() {
        let server = server();
        let mut client = connect(&server);
        let request = Request::Test(TestRequest {
            direction: Direction::ClientReceives,
            duration_ms: 60_000,
            byte_limit: 0,
            buffer_size: 65536,
        });
        client.write_all(&request.encode()).unwrap();
        let mut accept = [0u8; ACCEPT_LEN];
        client.read_exact(&mut accept).unwrap();
        client.write_all(&[START]).unwrap();
        let mut some = [0u8; 4096];
        client.read_exact(&mut some).unwrap();
        let started = Instant::now();
        server.stop().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
