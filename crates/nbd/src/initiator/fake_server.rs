//! A scripted NBD server for the initiator's tests: a loopback listener whose thread
//! negotiates like a fixed newstyle server (through the codec in [`crate::wire`]),
//! then hands every connection, in transmission, to the test's script. Every read
//! times out, and so does waiting for the initiator to connect, so a broken initiator
//! fails a test instead of hanging it.
//!
//! Built for this crate's unit tests and, with the `test-support` feature, for its
//! integration tests (`tests/`), so both script the same server; never part of a
//! release build.
//!
//! ```no_run
//! use blockwire_nbd::initiator::fake_server::{self, FakeExport};
//!
//! let export = FakeExport { size: 1 << 20, flags: 0 };
//! let server = fake_server::start(export, 1, |mut peers, _listener| {
//!     let mut peer = peers.pop().unwrap();
//!     let request = peer.request();
//!     // ... answer it with peer.send(&reply_bytes) ...
//!     peer.until_disconnect();
//!     request
//! });
//! // Connect an initiator to `server.uri` and send one request, then:
//! let request = server.join();
//! ```

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::NbdUri;
use crate::wire::*;

/// How long the fake server waits for the initiator's next bytes or connection.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The name the initiator's URI gives the export (the fake server takes any).
const EXPORT_NAME: &str = "fake";

/// Option data larger than this is not a test's initiator.
const MAX_OPTION: u32 = 64 * 1024;

/// What the fake server exports.
#[derive(Debug, Clone, Copy)]
pub struct FakeExport {
    /// The export's size in bytes.
    pub size: u64,
    /// Transmission flags; NBD_FLAG_HAS_FLAGS is added.
    pub flags: u16,
}

/// One negotiated connection in transmission, from the server's end.
pub struct Peer {
    stream: TcpStream,
    /// Structured replies were negotiated.
    pub structured: bool,
}

impl Peer {
    /// The next request (a write's payload is read and dropped); `None` when the
    /// initiator sent NBD_CMD_DISC or closed the connection. Panics on a timeout.
    pub fn next_request(&mut self) -> Option<Request> {
        self.read_request()
            .filter(|request| request.command != NBD_CMD_DISC)
    }

    /// The next request as sent, NBD_CMD_DISC included (for a test that checks how
    /// the initiator disconnects); a write's payload is read and dropped. Panics if
    /// the initiator closed the connection instead, or on a timeout.
    pub fn request(&mut self) -> Request {
        self.read_request()
            .expect("fake server: the initiator closed the connection")
    }

    /// The next request, NBD_CMD_DISC included; `None` at the end of the stream.
    fn read_request(&mut self) -> Option<Request> {
        let mut header = [0u8; REQUEST_LEN];
        match self.stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return None,
            Err(e) => panic!("fake server: reading a request: {e}"),
        }
        let request = Request::decode(&header).expect("fake server: request magic");
        if request.command == NBD_CMD_WRITE {
            let mut payload = vec![0u8; request.len as usize];
            self.stream
                .read_exact(&mut payload)
                .expect("fake server: reading a write's payload");
        }
        Some(request)
    }

    /// Exactly `count` requests; panics if the initiator stops sending earlier.
    pub fn requests(&mut self, count: usize) -> Vec<Request> {
        (0..count)
            .map(|i| {
                self.next_request()
                    .unwrap_or_else(|| panic!("fake server: disconnected after {i} requests"))
            })
            .collect()
    }

    /// Writes reply bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .expect("fake server: writing replies");
    }

    /// Waits for the initiator's disconnect; panics on any further request.
    pub fn until_disconnect(mut self) {
        if let Some(request) = self.next_request() {
            panic!("fake server: unexpected request {request:?}");
        }
    }

    /// Waits for the initiator to close its end, dropping whatever it still sends:
    /// for a test whose initiator has given up on the connection (a protocol
    /// violation), where NBD_CMD_DISC may come or not and a reset is as good as a
    /// close. Panics if the initiator goes quiet for [`PATIENCE`] without closing.
    pub fn until_closed(mut self) {
        let mut scratch = [0u8; 4096];
        loop {
            match self.stream.read(&mut scratch) {
                Ok(0) => return,
                Ok(_) => {}
                Err(e) => match e.kind() {
                    io::ErrorKind::Interrupted => {}
                    // The read timeout (PATIENCE) is reported as either, by platform.
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                        panic!("fake server: the connection still open after {PATIENCE:?}")
                    }
                    // Reset or aborted: closed all the same.
                    _ => return,
                },
            }
        }
    }

    /// Hangs up at once, whatever is in flight.
    pub fn hang_up(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// A running fake server.
pub struct FakeServer<T> {
    /// Where the initiator connects: 127.0.0.1, the listener's port, any export name.
    pub uri: NbdUri,
    thread: JoinHandle<T>,
}

impl<T> FakeServer<T> {
    /// What the script returned; a panic in the server thread fails the test here.
    pub fn join(self) -> T {
        self.thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

/// Listens on 127.0.0.1, accepts and negotiates `connections` connections one after
/// another (as the initiator opens them), then runs `script` on them, in accept
/// order, with the listener (non-blocking by then, so a script can check that no
/// further connection is waiting).
pub fn start<T, F>(export: FakeExport, connections: usize, script: F) -> FakeServer<T>
where
    T: Send + 'static,
    F: FnOnce(Vec<Peer>, TcpListener) -> T + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").expect("fake server: bind");
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let thread = thread::Builder::new()
        .name("fake-nbd-server".into())
        .spawn(move || {
            let peers = (0..connections)
                .map(|_| negotiate(accept(&listener), export))
                .collect();
            script(peers, listener)
        })
        .unwrap();
    FakeServer {
        uri: NbdUri::tcp("127.0.0.1", port, EXPORT_NAME),
        thread,
    }
}

/// Accepts and negotiates one more connection on the listener a script was given
/// (an initiator that reconnects), offering `export`.
pub fn accept_another(listener: &TcpListener, export: FakeExport) -> Peer {
    negotiate(accept(listener), export)
}

fn accept(listener: &TcpListener) -> TcpStream {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).unwrap();
                stream.set_read_timeout(Some(PATIENCE)).unwrap();
                return stream;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(
                    Instant::now() < deadline,
                    "fake server: no connection within {PATIENCE:?}"
                );
                thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("fake server: accept: {e}"),
        }
    }
}

/// The server's side of fixed newstyle negotiation: structured replies when asked,
/// no metadata contexts, NBD_OPT_GO with the export's size and flags.
fn negotiate(mut stream: TcpStream, export: FakeExport) -> Peer {
    let mut out = Vec::new();
    encode_greeting(&mut out, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
    stream.write_all(&out).unwrap();
    let mut client_flags = [0u8; 4];
    stream
        .read_exact(&mut client_flags)
        .expect("fake server: client flags");
    let mut structured = false;
    loop {
        let mut head = [0u8; OPTION_HEADER_LEN];
        stream
            .read_exact(&mut head)
            .expect("fake server: option header");
        let header = OptionHeader::decode(&head).expect("fake server: option magic");
        assert!(header.len <= MAX_OPTION, "fake server: option too long");
        let mut data = vec![0u8; header.len as usize];
        stream
            .read_exact(&mut data)
            .expect("fake server: option data");
        let option = ClientOption::parse(header.option, &data).expect("fake server: option");
        let mut out = Vec::new();
        match option {
            ClientOption::StructuredReply => {
                structured = true;
                encode_option_reply(&mut out, header.option, NBD_REP_ACK, &[]);
            }
            ClientOption::Go { .. } => {
                let flags = NBD_FLAG_HAS_FLAGS | export.flags;
                let info = info_export_payload(export.size, flags);
                encode_option_reply(&mut out, NBD_OPT_GO, NBD_REP_INFO, &info);
                encode_option_reply(&mut out, NBD_OPT_GO, NBD_REP_ACK, &[]);
                stream.write_all(&out).unwrap();
                return Peer { stream, structured };
            }
            // No metadata contexts, nor anything else a test does not need.
            _ => encode_option_reply(&mut out, header.option, NBD_REP_ERR_UNSUP, &[]),
        }
        stream.write_all(&out).unwrap();
    }
}
