//! The netperf client: one test in one direction over one or more parallel streams,
//! measured as the receiving side saw it, with the CPU time of both ends.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{
    decode_chunk_header, Accept, Direction, Report, Request, Status, TestRequest, WireError,
    ACCEPT_LEN, CHUNK_HEADER_LEN, MAX_DURATION_MS, REPORT_LEN, START,
};
use super::{fill_pattern, process_cpu_ns};
use crate::meter::MB;

/// Most parallel streams one test may open.
pub const MAX_STREAMS: u32 = 64;

/// How a test runs.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Parallel TCP connections (1 ..= [`MAX_STREAMS`]).
    pub streams: u32,
    /// Bytes per write of the sending side. Large writes (1 MiB) keep the
    /// per-call cost out of the figure, as the storage workloads' 1 MiB requests do.
    pub buffer_size: u32,
    /// How long the data flows.
    pub duration: Duration,
    /// Each stream stops after this many bytes if sooner than `duration`.
    pub byte_limit: Option<u64>,
    /// Longest wait for a connection and for the server's answer to the request:
    /// short, so that probing a host with no server never hangs a run.
    pub connect_timeout: Duration,
    /// Longest wait for any one read or write once the test runs.
    pub io_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            streams: 1,
            buffer_size: 1 << 20,
            duration: Duration::from_secs(3),
            byte_limit: None,
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a test failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The test as configured cannot run.
    #[error("invalid test: {0}")]
    Config(String),
    /// Nothing accepted a connection (refused, unreachable, timed out).
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    /// Something accepted the connection but did not answer as a netperf server.
    #[error("{addr} is not a blockwire netserve ({reason})")]
    NotNetserve { addr: String, reason: String },
    /// The server answered and turned the test down.
    #[error("{addr} refused the test: {reason}")]
    Refused { addr: String, reason: String },
    /// The connection failed during the test.
    #[error("{addr}: {what}: {source}")]
    Io {
        addr: String,
        what: &'static str,
        source: io::Error,
    },
    /// The server broke the protocol during the test.
    #[error("{addr}: {source}")]
    Protocol { addr: String, source: WireError },
}

impl ClientError {
    /// Whether no netperf server is there at all (as opposed to one that failed):
    /// what a probe of the default port tells apart.
    pub fn no_server(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. } | ClientError::NotNetserve { .. }
        )
    }
}

/// One test's result.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    pub direction: Direction,
    pub streams: u32,
    pub buffer_size: u32,
    /// Bytes the receiving side counted, over all streams.
    pub bytes: u64,
    /// Bytes the sending side wrote. Equal to `bytes` when every stream ended
    /// cleanly: the receiver reads to the end before it reports.
    pub sent_bytes: u64,
    /// Seconds the receiving side took (the longest stream).
    pub seconds: f64,
    /// CPU time of this process (user + system, all threads) over the test, in
    /// percent of one core.
    pub cpu_percent: f64,
    /// The server process's CPU time over its side of the test, in percent of one
    /// core, when it could measure it.
    pub server_cpu_percent: Option<f64>,
}

impl Measurement {
    /// Throughput as the receiving side saw it, in MB/s (10⁶ bytes).
    pub fn mb_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / MB / self.seconds
        } else {
            0.0
        }
    }
}

/// What one stream counted.
struct StreamResult {
    sent: u64,
    received: u64,
    /// The receiving side's seconds for this stream.
    receiver_seconds: f64,
    report: Report,
}

/// Runs one test against the netperf server at `host`:`port`.
pub fn measure(
    host: &str,
    port: u16,
    direction: Direction,
    config: &ClientConfig,
) -> Result<Measurement, ClientError> {
    let test = TestRequest {
        direction,
        duration_ms: u32::try_from(config.duration.as_millis())
            .unwrap_or(u32::MAX)
            .clamp(1, MAX_DURATION_MS),
        byte_limit: config.byte_limit.unwrap_or(0),
        buffer_size: config.buffer_size,
    };
    test.validate()
        .map_err(|e| ClientError::Config(e.to_string()))?;
    if !(1..=MAX_STREAMS).contains(&config.streams) {
        return Err(ClientError::Config(format!(
            "{} streams (1 to {MAX_STREAMS})",
            config.streams
        )));
    }
    let addr = format!("{host}:{port}");
    let request = Request::Test(test);
    // Every stream is connected and accepted before any data flows, so that all
    // of them run over the same interval.
    let mut streams = Vec::new();
    for _ in 0..config.streams {
        streams.push(open_stream(host, port, &addr, &request, config)?);
    }
    let cpu_before = process_cpu_ns();
    let started = Instant::now();
    let results: Vec<Result<StreamResult, ClientError>> = thread::scope(|scope| {
        let workers: Vec<_> = streams
            .into_iter()
            .map(|stream| {
                let addr = &addr;
                let test = &test;
                scope.spawn(move || match direction {
                    Direction::ClientSends => send(stream, addr, test, config),
                    Direction::ClientReceives => receive(stream, addr, test, config, started),
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("a stream thread panicked"))
            .collect()
    });
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    let cpu_percent = cpu_before
        .zip(process_cpu_ns())
        .map_or(0.0, |(before, after)| {
            after.saturating_sub(before) as f64 / 1e9 / wall * 100.0
        });
    let results = results.into_iter().collect::<Result<Vec<_>, _>>()?;
    // All streams ran over (nearly) the same interval and the server's CPU time is
    // its whole process's, so each report measures the same thing; the longest
    // stream's covers the whole test.
    let longest = results
        .iter()
        .max_by_key(|r| r.report.elapsed_ns)
        .expect("at least one stream");
    let server_cpu_percent = longest
        .report
        .cpu_ns
        .filter(|_| longest.report.elapsed_ns > 0)
        .map(|cpu| cpu as f64 / longest.report.elapsed_ns as f64 * 100.0);
    Ok(Measurement {
        direction,
        streams: config.streams,
        buffer_size: config.buffer_size,
        bytes: results.iter().map(|r| r.received).sum(),
        sent_bytes: results.iter().map(|r| r.sent).sum(),
        seconds: results
            .iter()
            .map(|r| r.receiver_seconds)
            .fold(0.0, f64::max),
        cpu_percent,
        server_cpu_percent,
    })
}

/// Asks the netperf server at `host`:`port` for its process's CPU time so far
/// (user + system, all threads). `Ok(None)`: the server cannot measure it.
pub fn sample_cpu(
    host: &str,
    port: u16,
    config: &ClientConfig,
) -> Result<Option<Duration>, ClientError> {
    let addr = format!("{host}:{port}");
    let mut stream = open_stream(host, port, &addr, &Request::CpuSample, config)?;
    let report = read_report(&mut stream, &addr)?;
    Ok(report.cpu_ns.map(Duration::from_nanos))
}

/// Connects (trying each address the host resolves to) within the connect timeout.
fn connect(host: &str, port: u16, addr: &str, timeout: Duration) -> Result<TcpStream, ClientError> {
    let connect_error = |source| ClientError::Connect {
        addr: addr.to_string(),
        source,
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(connect_error)?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host has no address");
    for candidate in addrs {
        match TcpStream::connect_timeout(&candidate, timeout) {
            Ok(stream) => return Ok(stream),
            Err(e) => last = e,
        }
    }
    Err(connect_error(last))
}

/// Connects one stream and has its request accepted.
fn open_stream(
    host: &str,
    port: u16,
    addr: &str,
    request: &Request,
    config: &ClientConfig,
) -> Result<TcpStream, ClientError> {
    let mut stream = connect(host, port, addr, config.connect_timeout)?;
    let io = |what| io_error(addr, what);
    stream
        .set_read_timeout(Some(config.connect_timeout))
        .map_err(io("setting a timeout"))?;
    stream
        .set_write_timeout(Some(config.io_timeout))
        .map_err(io("setting a timeout"))?;
    stream
        .write_all(&request.encode())
        .map_err(io("sending the request"))?;
    let mut answer = [0u8; ACCEPT_LEN];
    if let Err(e) = stream.read_exact(&mut answer) {
        // Silence or a hang-up: whatever listens there does not speak netperf.
        return Err(ClientError::NotNetserve {
            addr: addr.to_string(),
            reason: match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => format!(
                    "no answer to the handshake within {:.0?}",
                    config.connect_timeout
                ),
                _ => format!("no answer to the handshake: {e}"),
            },
        });
    }
    let accept = Accept::decode(&answer).map_err(|e| ClientError::NotNetserve {
        addr: addr.to_string(),
        reason: e.to_string(),
    })?;
    let refused = |reason: String| ClientError::Refused {
        addr: addr.to_string(),
        reason,
    };
    match accept.status {
        Status::Accepted => {}
        Status::UnsupportedVersion => {
            return Err(refused(format!(
                "it speaks netperf protocol version {}, this client {} \
                 (run the same blockwire release on both hosts)",
                accept.version,
                super::wire::VERSION
            )))
        }
        Status::InvalidRequest => return Err(refused(format!("invalid request {request:?}"))),
        Status::Busy => return Err(refused("too many connections".into())),
    }
    stream
        .set_read_timeout(Some(config.io_timeout))
        .map_err(io("setting a timeout"))?;
    Ok(stream)
}

fn read_report(stream: &mut TcpStream, addr: &str) -> Result<Report, ClientError> {
    let mut bytes = [0u8; REPORT_LEN];
    stream
        .read_exact(&mut bytes)
        .map_err(|source| ClientError::Io {
            addr: addr.to_string(),
            what: "reading the server's report",
            source,
        })?;
    Report::decode(&bytes).map_err(|source| ClientError::Protocol {
        addr: addr.to_string(),
        source,
    })
}

/// Client sends: write until the duration (or byte limit), close the write side,
/// and take the server's count and time as the measurement.
fn send(
    mut stream: TcpStream,
    addr: &str,
    test: &TestRequest,
    config: &ClientConfig,
) -> Result<StreamResult, ClientError> {
    let mut buffer = vec![0u8; test.buffer_size as usize];
    fill_pattern(&mut buffer);
    let started = Instant::now();
    let limit = config.byte_limit.filter(|&limit| limit > 0);
    let mut sent = 0u64;
    while started.elapsed() < config.duration {
        let len = match limit {
            Some(limit) if sent >= limit => break,
            Some(limit) => (limit - sent).min(buffer.len() as u64) as usize,
            None => buffer.len(),
        };
        stream
            .write_all(&buffer[..len])
            .map_err(|source| ClientError::Io {
                addr: addr.to_string(),
                what: "sending data",
                source,
            })?;
        sent += len as u64;
    }
    // The end of the data; the server reads what is still in flight, then reports.
    stream
        .shutdown(Shutdown::Write)
        .map_err(|source| ClientError::Io {
            addr: addr.to_string(),
            what: "closing the data",
            source,
        })?;
    let report = read_report(&mut stream, addr)?;
    Ok(StreamResult {
        sent,
        received: report.bytes,
        receiver_seconds: report.elapsed_ns as f64 / 1e9,
        report,
    })
}

/// Client receives: send the start byte, read chunks until the empty one, and
/// time it by this side's clock from the common start.
fn receive(
    mut stream: TcpStream,
    addr: &str,
    test: &TestRequest,
    config: &ClientConfig,
    started: Instant,
) -> Result<StreamResult, ClientError> {
    let io = |what| io_error(addr, what);
    stream
        .write_all(&[START])
        .map_err(io("starting the test"))?;
    let mut buffer = vec![0u8; test.buffer_size as usize];
    // The server ends the data at the duration; past that plus a timeout's grace it
    // is not going to.
    let limit = config.duration + config.io_timeout;
    let mut received = 0u64;
    loop {
        let mut header = [0u8; CHUNK_HEADER_LEN];
        stream
            .read_exact(&mut header)
            .map_err(io("receiving data"))?;
        let len = decode_chunk_header(header, test.buffer_size).map_err(|source| {
            ClientError::Protocol {
                addr: addr.to_string(),
                source,
            }
        })? as usize;
        if len == 0 {
            break;
        }
        stream
            .read_exact(&mut buffer[..len])
            .map_err(io("receiving data"))?;
        received += len as u64;
        if started.elapsed() > limit {
            return Err(ClientError::Protocol {
                addr: addr.to_string(),
                source: WireError::Invalid("data past the test's duration".into()),
            });
        }
    }
    let receiver_seconds = started.elapsed().as_secs_f64();
    let report = read_report(&mut stream, addr)?;
    Ok(StreamResult {
        sent: report.bytes,
        received,
        receiver_seconds,
        report,
    })
}

/// Maps an I/O error while doing `what` with `addr` to a client error.
fn io_error<'a>(
    addr: &'a str,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> ClientError + 'a {
    move |source| ClientError::Io {
        addr: addr.to_string(),
        what,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netperf::server::tests::server;
    use crate::netperf::wire::REQUEST_LEN;

    fn quick(streams: u32) -> ClientConfig {
        ClientConfig {
            streams,
            buffer_size: 256 << 10,
            duration: Duration::from_millis(300),
            ..ClientConfig::default()
        }
    }

    #[test]
    fn loopback_round_trip_in_both_directions() {
        let server = server();
        for direction in [Direction::ClientSends, Direction::ClientReceives] {
            let m = measure("127.0.0.1", server.addr.port(), direction, &quick(1)).unwrap();
            assert_eq!(m.direction, direction);
            assert!(m.bytes > 0, "{m:?}");
            // The receiver reads to the end of the data before it reports, so
            // nothing is left in flight: both sides counted the same bytes.
            assert_eq!(m.bytes, m.sent_bytes, "{m:?}");
            assert!(m.seconds > 0.2 && m.seconds < 5.0, "{m:?}");
            assert!(m.mb_per_s() > 0.0);
            assert!(m.cpu_percent > 0.0, "{m:?}");
            // Client and server share this process here: its CPU time is counted
            // by both.
            assert!(m.server_cpu_percent.unwrap() > 0.0, "{m:?}");
        }
        server.stop().unwrap();
    }

    #[test]
    fn cpu_samples_give_the_servers_growing_cpu_time() {
        let server = server();
        let port = server.addr.port();
        let config = ClientConfig::default();
        let before = sample_cpu("127.0.0.1", port, &config).unwrap().unwrap();
        // The server shares this process: burn 100 ms of CPU here (by the process's
        // CPU clock, not the wall clock, which other tests' threads may share) and
        // its total grows at least as much.
        let target = process_cpu_ns().unwrap() + 100_000_000;
        let mut x = 1u64;
        while process_cpu_ns().unwrap() < target {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = sample_cpu("127.0.0.1", port, &config).unwrap().unwrap();
        assert!(
            after >= before + Duration::from_millis(100),
            "{before:?} -> {after:?}"
        );
        server.stop().unwrap();
    }

    #[test]
    fn parallel_streams_add_up() {
        let server = server();
        for direction in [Direction::ClientSends, Direction::ClientReceives] {
            let m = measure("localhost", server.addr.port(), direction, &quick(3)).unwrap();
            assert_eq!(m.streams, 3);
            assert!(m.bytes > 0);
            assert_eq!(m.bytes, m.sent_bytes, "{m:?}");
        }
        server.stop().unwrap();
    }

    #[test]
    fn byte_limits_end_a_test_early_and_exactly() {
        let server = server();
        let config = ClientConfig {
            byte_limit: Some(1_000_000),
            duration: Duration::from_secs(30),
            buffer_size: 64 << 10,
            ..ClientConfig::default()
        };
        for direction in [Direction::ClientSends, Direction::ClientReceives] {
            let started = Instant::now();
            let m = measure("127.0.0.1", server.addr.port(), direction, &config).unwrap();
            assert_eq!((m.bytes, m.sent_bytes), (1_000_000, 1_000_000));
            assert!(started.elapsed() < Duration::from_secs(10));
        }
        server.stop().unwrap();
    }

    #[test]
    fn no_server_is_told_apart_from_a_failing_one() {
        // A port that was free a moment ago: refused at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = measure("127.0.0.1", port, Direction::ClientSends, &quick(1)).unwrap_err();
        assert!(err.no_server(), "{err}");
        assert!(matches!(err, ClientError::Connect { .. }), "{err}");

        // Something that accepts and stays silent: not a netserve, within the
        // connect timeout.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = ClientConfig {
            connect_timeout: Duration::from_millis(300),
            ..quick(1)
        };
        let started = Instant::now();
        let err = measure(
            "127.0.0.1",
            silent.local_addr().unwrap().port(),
            Direction::ClientReceives,
            &config,
        )
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(matches!(err, ClientError::NotNetserve { .. }), "{err}");
        assert!(err.to_string().contains("no answer"), "{err}");
    }

    #[test]
    fn a_server_of_another_version_is_reported_as_such() {
        // What a version 1 server answers to any version 2 request: its magic, its
        // version and "unsupported version", read from a fixed-size request.
        let old = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = old.local_addr().unwrap().port();
        let server = thread::spawn(move || {
            for _ in 0..2 {
                let (mut stream, _) = old.accept().unwrap();
                let mut request = [0u8; REQUEST_LEN];
                stream.read_exact(&mut request).unwrap();
                let answer = Accept {
                    version: 1,
                    status: Status::UnsupportedVersion,
                };
                stream.write_all(&answer.encode()).unwrap();
            }
        });
        let err = measure("127.0.0.1", port, Direction::ClientSends, &quick(1)).unwrap_err();
        assert!(matches!(err, ClientError::Refused { .. }), "{err}");
        assert!(!err.no_server(), "{err}");
        assert!(
            err.to_string()
                .contains("protocol version 1, this client 2"),
            "{err}"
        );
        let err = sample_cpu("127.0.0.1", port, &quick(1)).unwrap_err();
        assert!(matches!(err, ClientError::Refused { .. }), "{err}");
        server.join().unwrap();
    }

    #[test]
    fn bad_configurations_are_refused_before_connecting() {
        let mut config = quick(0);
        assert!(matches!(
            measure("127.0.0.1", 1, Direction::ClientSends, &config),
            Err(ClientError::Config(_))
        ));
        config.streams = 1;
        config.buffer_size = 1;
        assert!(matches!(
            measure("127.0.0.1", 1, Direction::ClientSends, &config),
            Err(ClientError::Config(_))
        ));
    }
}
