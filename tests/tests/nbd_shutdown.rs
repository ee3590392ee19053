//! Shutdown while a client has stopped reading replies: the server must not hang.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use blockwire_nbd::wire::*;
use blockwire_tests::{patterned_file, Served};

/// Opens a connection and negotiates the default export with NBD_OPT_GO.
fn connect(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut greeting = [0u8; GREETING_LEN];
    stream.read_exact(&mut greeting).unwrap();
    decode_greeting(&greeting).unwrap();
    let flags = NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES;
    stream.write_all(&flags.to_be_bytes()).unwrap();
    let mut go = Vec::new();
    ClientOption::Go {
        name: String::new(),
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
            NBD_REP_ACK => return stream,
            NBD_REP_INFO => {}
            other => panic!("GO failed with reply {other:#x}"),
        }
    }
}

#[test]
fn sigterm_does_not_hang_on_a_client_that_stopped_reading() {
    let dir = tempfile::tempdir().unwrap();
    let path = patterned_file(dir.path(), "disk.img", 8 << 20, 3);
    let served = Served::start(&[path.to_str().unwrap(), "--name", "disk"], "disk");
    let mut stuck = connect(served.port);
    // Ask for far more reply data than the socket buffers hold, and never read it.
    let mut requests = Vec::new();
    for cookie in 0..256u64 {
        let read = Request {
            flags: 0,
            command: NBD_CMD_READ,
            cookie,
            offset: (cookie % 8) << 20,
            len: 1 << 20,
        };
        read.encode(&mut requests);
    }
    stuck.write_all(&requests).unwrap();
    std::thread::sleep(Duration::from_millis(500));

    let started = Instant::now();
    let status = served.terminate();
    assert_eq!(status, Some(0), "server did not exit cleanly");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "shutdown took {:?}",
        started.elapsed()
    );
    drop(stuck);
}
