//! The netperf protocol's messages, sans-IO: fixed-size records in, typed values out,
//! and back. No sockets, no clocks.
//!
//! One TCP connection carries one request: a test (one stream of data in one
//! [`Direction`]) or a CPU sample (no data).
//!
//! ```text
//! client                                        server
//!   Request (28 bytes)            ------------>
//!                                 <------------ Accept (12 bytes)
//! Test, ClientSends:
//!   data ... (any bytes)          ------------>   counted, discarded
//!   shutdown(write) = end         ------------>
//!                                 <------------ Report (32 bytes)
//! Test, ClientReceives:
//!   START (1 byte)                ------------>
//!                                 <------------ chunk: u32 length + payload, ...
//!                                 <------------ chunk of length 0 = end
//!                                 <------------ Report (32 bytes)
//! CpuSample (no data):
//!                                 <------------ Report (32 bytes), cpu_ns = the
//!                                               process's CPU time so far
//! ```
//!
//! A request is 28 bytes whatever its kind, so that a server of any version reads
//! the same number of bytes before it checks the version: a peer of another
//! version is answered "unsupported version", never left waiting for more bytes
//! or misread.
//!
//! ```text
//! bytes  0..8   magic "BWNETPRF"
//!        8..10  version (2)
//!       10      kind: 0 = test, 1 = CPU sample
//!       11      test: direction (0 = client sends, 1 = client receives)
//!       12..16  test: duration_ms
//!       16..24  test: byte_limit
//!       24..28  test: buffer_size
//!               (a CPU sample's bytes 11..28 are all 0)
//! ```
//!
//! A CPU sample is how `blockwire serve --netserve` tells a bench on another host
//! what the target spends: the bench takes one before and one after each phase.
//!
//! All integers are big-endian. The server sends the chunk framing only when it
//! sends: the client needs to know where the data ends and the report begins, and a
//! 4-byte header per buffer (1 MiB by default) costs nothing measurable. When the
//! client sends, closing its write half marks the end, as it does for any TCP
//! stream. The START byte lets a client with several streams open them all before
//! any of them starts, so every server clock starts together.
//!
//! Version 2 made the request kind its own byte; version 1 coded the CPU sample as
//! a third direction.

/// First bytes of a request and an accept: "blockwire netperf".
pub const MAGIC: [u8; 8] = *b"BWNETPRF";
/// The protocol version this code speaks.
pub const VERSION: u16 = 2;
/// Bytes in an encoded [`Request`].
pub const REQUEST_LEN: usize = 28;
/// Bytes in an encoded [`Accept`].
pub const ACCEPT_LEN: usize = 12;
/// Bytes in an encoded [`Report`].
pub const REPORT_LEN: usize = 32;
/// The request kind byte of a test.
const KIND_TEST: u8 = 0;
/// The request kind byte of a CPU sample.
const KIND_CPU_SAMPLE: u8 = 1;
/// Bytes in a chunk header (the payload length) when the server sends.
pub const CHUNK_HEADER_LEN: usize = 4;
/// The byte a receiving client sends when it is ready for data.
pub const START: u8 = 1;
/// First bytes of a report.
const REPORT_TAG: [u8; 4] = *b"DONE";
/// Smallest buffer a request may ask for.
pub const MIN_BUFFER: u32 = 1024;
/// Largest buffer a request may ask for: bounds the server's memory per connection.
pub const MAX_BUFFER: u32 = 4 << 20;
/// Longest test a request may ask for (one hour), so that no request ties up a
/// server indefinitely.
pub const MAX_DURATION_MS: u32 = 3_600_000;
/// A report field the server could not measure (its CPU time, on a system without
/// a process CPU clock).
const UNKNOWN: u64 = u64::MAX;

/// Which way a test's data flows, named from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: an upload to the target host, what storage writes need.
    ClientSends,
    /// Server to client: a download from the target host, what storage reads need.
    ClientReceives,
}

impl Direction {
    fn code(self) -> u8 {
        match self {
            Direction::ClientSends => 0,
            Direction::ClientReceives => 1,
        }
    }

    fn from_code(code: u8) -> Option<Direction> {
        match code {
            0 => Some(Direction::ClientSends),
            1 => Some(Direction::ClientReceives),
            _ => None,
        }
    }
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not our protocol at all: the peer is something else.
    #[error("not a blockwire netperf peer (bad magic)")]
    BadMagic,
    /// Our protocol, another version.
    #[error("protocol version {0} is not supported (this side speaks {VERSION})")]
    UnsupportedVersion(u16),
    /// Our protocol and version, but a field out of range.
    #[error("invalid {0}")]
    Invalid(String),
    /// The record has the wrong length.
    #[error("a {what} is {expected} bytes, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
}

fn exact<'a, const N: usize>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<&'a [u8; N], WireError> {
    bytes.try_into().map_err(|_| WireError::Length {
        what,
        expected: N,
        got: bytes.len(),
    })
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// What a client asks of the server on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// A throughput test: one stream of data in one direction.
    Test(TestRequest),
    /// No data: the server answers at once with a report whose `cpu_ns` is its
    /// process's whole CPU time so far. Two samples around a storage phase give
    /// the target's CPU use over it, from a host the bench cannot see into.
    CpuSample,
}

impl Request {
    /// magic(8) version(2) kind(1), then for a test direction(1) duration_ms(4)
    /// byte_limit(8) buffer_size(4); for a CPU sample 17 zero bytes.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut out = [0u8; REQUEST_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&VERSION.to_be_bytes());
        match self {
            Request::Test(test) => {
                out[10] = KIND_TEST;
                out[11] = test.direction.code();
                out[12..16].copy_from_slice(&test.duration_ms.to_be_bytes());
                out[16..24].copy_from_slice(&test.byte_limit.to_be_bytes());
                out[24..28].copy_from_slice(&test.buffer_size.to_be_bytes());
            }
            Request::CpuSample => out[10] = KIND_CPU_SAMPLE,
        }
        out
    }

    /// Decodes and validates a request. The magic is checked first, so anything
    /// that is not our protocol is [`WireError::BadMagic`] whatever else it holds;
    /// then the version, so a peer of another version is
    /// [`WireError::UnsupportedVersion`] whatever its other fields mean to it.
    pub fn decode(bytes: &[u8]) -> Result<Request, WireError> {
        let bytes = exact::<REQUEST_LEN>("request", bytes)?;
        if bytes[..8] != MAGIC {
            return Err(WireError::BadMagic);
        }
        let version = u16_at(bytes, 8);
        if version != VERSION {
            return Err(WireError::UnsupportedVersion(version));
        }
        match bytes[10] {
            KIND_TEST => {
                let direction = Direction::from_code(bytes[11])
                    .ok_or_else(|| WireError::Invalid(format!("direction {}", bytes[11])))?;
                let test = TestRequest {
                    direction,
                    duration_ms: u32_at(bytes, 12),
                    byte_limit: u64_at(bytes, 16),
                    buffer_size: u32_at(bytes, 24),
                };
                test.validate()?;
                Ok(Request::Test(test))
            }
            KIND_CPU_SAMPLE => match bytes[11..].iter().position(|&b| b != 0) {
                None => Ok(Request::CpuSample),
                Some(at) => Err(WireError::Invalid(format!(
                    "CPU sample: byte {} is {}, not 0",
                    11 + at,
                    bytes[11 + at]
                ))),
            },
            kind => Err(WireError::Invalid(format!("request kind {kind}"))),
        }
    }
}

/// What a client asks of the server for one stream of a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestRequest {
    pub direction: Direction,
    /// How long the stream runs, in milliseconds (1 ..= [`MAX_DURATION_MS`]).
    pub duration_ms: u32,
    /// Stop after this many bytes, if sooner than the duration (0: no limit).
    pub byte_limit: u64,
    /// Bytes per write of the sending side ([`MIN_BUFFER`] ..= [`MAX_BUFFER`]).
    pub buffer_size: u32,
}

impl TestRequest {
    /// Checks the ranges; the client calls it before sending, the server's decode
    /// after reading.
    pub fn validate(&self) -> Result<(), WireError> {
        if !(1..=MAX_DURATION_MS).contains(&self.duration_ms) {
            return Err(WireError::Invalid(format!(
                "duration {} ms (1 to {MAX_DURATION_MS})",
                self.duration_ms
            )));
        }
        if !(MIN_BUFFER..=MAX_BUFFER).contains(&self.buffer_size) {
            return Err(WireError::Invalid(format!(
                "buffer size {} (from {MIN_BUFFER} to {MAX_BUFFER} bytes)",
                self.buffer_size
            )));
        }
        Ok(())
    }
}

/// The server's answer to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The test starts.
    Accepted,
    /// The server does not speak the request's version.
    UnsupportedVersion,
    /// A field was out of range.
    InvalidRequest,
    /// The server has as many connections as it takes.
    Busy,
}

impl Status {
    fn code(self) -> u8 {
        match self {
            Status::Accepted => 0,
            Status::UnsupportedVersion => 1,
            Status::InvalidRequest => 2,
            Status::Busy => 3,
        }
    }

    fn from_code(code: u8) -> Option<Status> {
        match code {
            0 => Some(Status::Accepted),
            1 => Some(Status::UnsupportedVersion),
            2 => Some(Status::InvalidRequest),
            3 => Some(Status::Busy),
            _ => None,
        }
    }
}

/// The server's answer: its magic (so a client knows it reached a netperf server
/// and not some other service), its version, and whether the test starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accept {
    /// The version the server speaks.
    pub version: u16,
    pub status: Status,
}

impl Accept {
    /// The answer of this version of the server.
    pub fn new(status: Status) -> Accept {
        Accept {
            version: VERSION,
            status,
        }
    }

    /// magic(8) version(2) status(1) reserved(1).
    pub fn encode(&self) -> [u8; ACCEPT_LEN] {
        let mut out = [0u8; ACCEPT_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8..10].copy_from_slice(&self.version.to_be_bytes());
        out[10] = self.status.code();
        out
    }

    /// Decodes an answer of any version: the version is for the client to report.
    pub fn decode(bytes: &[u8]) -> Result<Accept, WireError> {
        let bytes = exact::<ACCEPT_LEN>("accept", bytes)?;
        if bytes[..8] != MAGIC {
            return Err(WireError::BadMagic);
        }
        let status = Status::from_code(bytes[10])
            .ok_or_else(|| WireError::Invalid(format!("status {}", bytes[10])))?;
        Ok(Accept {
            version: u16_at(bytes, 8),
            status,
        })
    }
}

/// What the server counted for one stream, sent when the stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Bytes the server received (client sends) or sent (client receives).
    pub bytes: u64,
    /// Nanoseconds from the stream's start to its end, by the server's clock.
    pub elapsed_ns: u64,
    /// User + system CPU time of the whole server process over the same interval,
    /// in nanoseconds; `None` when the server could not read it.
    pub cpu_ns: Option<u64>,
}

impl Report {
    /// tag "DONE"(4) reserved(4) bytes(8) elapsed_ns(8) cpu_ns(8, all ones =
    /// unknown).
    pub fn encode(&self) -> [u8; REPORT_LEN] {
        let mut out = [0u8; REPORT_LEN];
        out[..4].copy_from_slice(&REPORT_TAG);
        out[8..16].copy_from_slice(&self.bytes.to_be_bytes());
        out[16..24].copy_from_slice(&self.elapsed_ns.to_be_bytes());
        out[24..32].copy_from_slice(&self.cpu_ns.unwrap_or(UNKNOWN).to_be_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Report, WireError> {
        let bytes = exact::<REPORT_LEN>("report", bytes)?;
        if bytes[..4] != REPORT_TAG {
            return Err(WireError::Invalid("report tag".into()));
        }
        let cpu_ns = u64_at(bytes, 24);
        Ok(Report {
            bytes: u64_at(bytes, 8),
            elapsed_ns: u64_at(bytes, 16),
            cpu_ns: (cpu_ns != UNKNOWN).then_some(cpu_ns),
        })
    }
}

/// The header of a chunk the server sends: the payload length (0 ends the data).
pub fn encode_chunk_header(len: u32) -> [u8; CHUNK_HEADER_LEN] {
    len.to_be_bytes()
}

/// Decodes a chunk header; a payload longer than the buffer the client asked for
/// is a protocol error (and would overrun the client's buffer).
pub fn decode_chunk_header(
    bytes: [u8; CHUNK_HEADER_LEN],
    buffer_size: u32,
) -> Result<u32, WireError> {
    let len = u32::from_be_bytes(bytes);
    if len > buffer_size {
        return Err(WireError::Invalid(format!(
            "chunk of {len} bytes (buffer {buffer_size})"
        )));
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test() -> TestRequest {
        TestRequest {
            direction: Direction::ClientReceives,
            duration_ms: 3000,
            byte_limit: 0x0102_0304_0506_0708,
            buffer_size: 1 << 20,
        }
    }

    fn request() -> Request {
        Request::Test(test())
    }

    #[test]
    fn request_vectors() {
        let bytes = request().encode();
        let expected: [u8; REQUEST_LEN] = [
            b'B', b'W', b'N', b'E', b'T', b'P', b'R', b'F', // magic
            0, 2, // version
            0, 1, // kind: test; direction: client receives
            0, 0, 0x0b, 0xb8, // 3000 ms
            1, 2, 3, 4, 5, 6, 7, 8, // byte limit
            0, 0x10, 0, 0, // 1 MiB
        ];
        assert_eq!(bytes, expected);
        assert_eq!(Request::decode(&bytes), Ok(request()));
        let sends = Request::Test(TestRequest {
            direction: Direction::ClientSends,
            ..test()
        });
        assert_eq!(sends.encode()[10..12], [0, 0]);
        assert_eq!(Request::decode(&sends.encode()), Ok(sends));

        let sample = Request::CpuSample.encode();
        let mut expected = [0u8; REQUEST_LEN];
        expected[..12].copy_from_slice(b"BWNETPRF\x00\x02\x01\x00"); // kind: CPU sample
        assert_eq!(sample, expected);
        assert_eq!(Request::decode(&sample), Ok(Request::CpuSample));
    }

    #[test]
    fn bad_magic_is_rejected_before_anything_else() {
        let mut bytes = request().encode();
        bytes[0] = b'X';
        bytes[9] = 99; // a bad version too: the magic decides
        assert_eq!(Request::decode(&bytes), Err(WireError::BadMagic));
        // An HTTP request or any other stranger's first bytes.
        let stranger = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\0";
        assert_eq!(Request::decode(stranger), Err(WireError::BadMagic));
    }

    #[test]
    fn version_1_requests_are_an_unsupported_version_not_a_misread() {
        // Version 1 coded direction(1) reserved(1) where version 2 has kind(1)
        // direction(1): its "client receives" would read as a test with a bad
        // direction, its CPU sample (direction 2) as an unknown kind.
        let mut receives = request().encode();
        receives[8..12].copy_from_slice(&[0, 1, 1, 0]);
        let mut sample = request().encode();
        sample[8..12].copy_from_slice(&[0, 1, 2, 0]);
        for bytes in [receives, sample] {
            assert_eq!(
                Request::decode(&bytes),
                Err(WireError::UnsupportedVersion(1))
            );
        }
        assert_eq!(
            WireError::UnsupportedVersion(1).to_string(),
            "protocol version 1 is not supported (this side speaks 2)"
        );
    }

    #[test]
    fn other_versions_and_bad_fields_are_rejected() {
        let mut bytes = request().encode();
        bytes[8..10].copy_from_slice(&3u16.to_be_bytes());
        assert_eq!(
            Request::decode(&bytes),
            Err(WireError::UnsupportedVersion(3))
        );

        for (at, value) in [(10, 2), (10, 0xff), (11, 2)] {
            let mut bytes = request().encode();
            bytes[at] = value;
            assert!(
                matches!(Request::decode(&bytes), Err(WireError::Invalid(_))),
                "byte {at} = {value}"
            );
        }
        // A CPU sample carries nothing: a direction or test fields make it invalid.
        for at in [11, 12, 27] {
            let mut bytes = Request::CpuSample.encode();
            bytes[at] = 1;
            assert!(
                matches!(Request::decode(&bytes), Err(WireError::Invalid(_))),
                "byte {at}"
            );
        }

        for bad in [
            TestRequest {
                duration_ms: 0,
                ..test()
            },
            TestRequest {
                duration_ms: MAX_DURATION_MS + 1,
                ..test()
            },
            TestRequest {
                buffer_size: MIN_BUFFER - 1,
                ..test()
            },
            TestRequest {
                buffer_size: MAX_BUFFER + 1,
                ..test()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
            assert!(
                matches!(
                    Request::decode(&Request::Test(bad).encode()),
                    Err(WireError::Invalid(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Request::decode(&request().encode()[..REQUEST_LEN - 1]),
            Err(WireError::Length { got: 27, .. })
        ));
    }

    #[test]
    fn accept_vector() {
        let accept = Accept::new(Status::Busy);
        let bytes = accept.encode();
        assert_eq!(bytes, *b"BWNETPRF\x00\x02\x03\x00");
        assert_eq!(Accept::decode(&bytes), Ok(accept));
        // A newer server's answer still decodes: the client reports its version.
        let mut newer = Accept::new(Status::UnsupportedVersion).encode();
        newer[9] = 9;
        assert_eq!(Accept::decode(&newer).unwrap().version, 9);
        let mut bad = bytes;
        bad[10] = 200;
        assert!(Accept::decode(&bad).is_err());
        bad[0] = 0;
        assert_eq!(Accept::decode(&bad), Err(WireError::BadMagic));
    }

    #[test]
    fn report_vector() {
        let report = Report {
            bytes: 1_000_000_000,
            elapsed_ns: 2_000_000_000,
            cpu_ns: Some(500_000_000),
        };
        let bytes = report.encode();
        let mut expected = Vec::new();
        expected.extend_from_slice(b"DONE\0\0\0\0");
        expected.extend_from_slice(&[0, 0, 0, 0, 0x3b, 0x9a, 0xca, 0x00]);
        expected.extend_from_slice(&[0, 0, 0, 0, 0x77, 0x35, 0x94, 0x00]);
        expected.extend_from_slice(&[0, 0, 0, 0, 0x1d, 0xcd, 0x65, 0x00]);
        assert_eq!(bytes.to_vec(), expected);
        assert_eq!(Report::decode(&bytes), Ok(report));
        let unknown = Report {
            cpu_ns: None,
            ..report
        };
        assert_eq!(&unknown.encode()[24..], &[0xff; 8]);
        assert_eq!(Report::decode(&unknown.encode()), Ok(unknown));
        let mut bad = bytes;
        bad[0] = b'X';
        assert!(Report::decode(&bad).is_err());
    }

    #[test]
    fn chunk_headers_are_bounded_by_the_buffer() {
        assert_eq!(encode_chunk_header(0x0010_0000), [0, 0x10, 0, 0]);
        assert_eq!(decode_chunk_header([0, 0x10, 0, 0], 1 << 20), Ok(1 << 20));
        assert_eq!(decode_chunk_header([0; 4], 1 << 20), Ok(0));
        assert!(decode_chunk_header([0, 0x10, 0, 1], 1 << 20).is_err());
    }
}
