//! The whole server side of a connection on arbitrary client bytes: handshake, then
//! transmission against an in-memory export. Must never panic or hang.
//!
//! The first byte decides how the client reads its replies: when its top bit is set,
//! the client stops reading after the (byte & 0x7f) × 256 bytes of transmission
//! replies, and every later send fails as a send timeout does on a real socket.
//! The connection must then end, with nothing left waiting.
#![no_main]

use std::io::{self, Cursor, Read, Write};
use std::sync::{Arc, OnceLock};

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_nbd::target::{
    negotiate, transmit, ReplySink, ReplyWriter, RequestSource, WorkerPool,
};
use blockwire_nbd::{Export, ExportSet};
use libfuzzer_sys::fuzz_target;

/// Where replies go: accepted until `room` runs out, if there is a limit.
struct Replies {
    room: Option<usize>,
}

impl Write for Replies {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.room {
            None => Ok(buf.len()),
            Some(0) => Err(io::ErrorKind::WouldBlock.into()),
            Some(room) => {
                let n = buf.len().min(*room);
                *room -= n;
                Ok(n)
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ReplySink for Replies {}

/// Client bytes in; handshake answers discarded.
struct Pipe(Cursor<Vec<u8>>);

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl RequestSource for Pipe {
    fn input_pending(&self) -> bool {
        (self.0.position() as usize) < self.0.get_ref().len()
    }
}

fn pool() -> &'static WorkerPool {
    static POOL: OnceLock<WorkerPool> = OnceLock::new();
    POOL.get_or_init(|| WorkerPool::new("fuzz-worker", 2))
}

fuzz_target!(|data: &[u8]| {
    let Some((&reading, client)) = data.split_first() else {
        return;
    };
    let room = (reading & 0x80 != 0).then(|| usize::from(reading & 0x7f) * 256);
    let mut exports = ExportSet::new();
    let device = Device::from_device(MemoryDevice::new(1 << 20));
    exports.add(Export::new("", "", device)).unwrap();
    let mut pipe = Pipe(Cursor::new(client.to_vec()));
    if let Ok(Some(session)) = negotiate(&mut pipe, Arc::new(exports), "fuzz") {
        let writer = Arc::new(ReplyWriter::new(Replies { room }));
        let _ = transmit(Arc::new(session), pipe, writer, pool());
    }
});
