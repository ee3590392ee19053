//! The whole server side of a connection on arbitrary client bytes: handshake, then
//! transmission against an in-memory export. Must never panic or hang.
#![no_main]

use std::io::{self, Cursor, Read, Write};
use std::sync::{Arc, OnceLock};

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_nbd::server::{negotiate, transmit, ReplySink, ReplyWriter, WorkerPool};
use blockwire_nbd::{Export, ExportSet};
use libfuzzer_sys::fuzz_target;

struct Null;

impl Write for Null {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ReplySink for Null {}

/// Client bytes in, server bytes discarded.
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

fn pool() -> &'static WorkerPool {
    static POOL: OnceLock<WorkerPool> = OnceLock::new();
    POOL.get_or_init(|| WorkerPool::new("fuzz-worker", 2))
}

fuzz_target!(|data: &[u8]| {
    let mut exports = ExportSet::new();
    let device = Device::from_device(MemoryDevice::new(1 << 20));
    exports.add(Export::new("", "", device)).unwrap();
    let mut pipe = Pipe(Cursor::new(data.to_vec()));
    if let Ok(Some(session)) = negotiate(&mut pipe, Arc::new(exports), "fuzz") {
        let writer = Arc::new(ReplyWriter::new(Null));
        let _ = transmit(Arc::new(session), pipe, writer, pool());
    }
});
