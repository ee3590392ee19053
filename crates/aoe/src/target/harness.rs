//! A target without sockets: frames in, response frames out. The receive loop's own
//! frame handling, driven directly, for unit tests and the fuzz target.

use std::io;
use std::sync::{Arc, Mutex};

use blockwire_blockdev::Device;
use blockwire_engine::WorkerPool;

use super::receiver::{Outbox, Receiver};
use super::{FrameSink, Port, Shared, TargetConfig};
use crate::rawsock::Interface;
use crate::wire::MacAddr;

/// Collects what workers send.
#[derive(Default)]
struct Collector(Mutex<Vec<Vec<u8>>>);

impl FrameSink for Collector {
    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<()> {
        let mut sent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        sent.extend(frames.iter().map(|f| f.to_vec()));
        Ok(())
    }
}

/// One target "interface" fed by hand.
pub struct TargetHarness {
    shared: Arc<Shared>,
    port: Arc<Port>,
    collector: Arc<Collector>,
    pool: Arc<WorkerPool>,
}

impl TargetHarness {
    /// A target for `device` at `config`'s address, answering as `mac` on an
    /// interface of `mtu` (`config.interfaces` is not used).
    pub fn new(
        device: Device,
        config: &TargetConfig,
        mac: MacAddr,
        mtu: usize,
    ) -> io::Result<TargetHarness> {
        let shared = Arc::new(Shared::new(device, config)?);
        let collector = Arc::new(Collector::default());
        let interface = Interface {
            name: "harness".into(),
            index: 0,
            mac,
            mtu,
        };
        let port = Arc::new(Port::new(interface, collector.clone())?);
        Ok(TargetHarness {
            shared,
            port,
            collector,
            pool: Arc::new(WorkerPool::new("aoe-harness", 2)),
        })
    }

    /// Handles one batch of frames and returns every response, in the order they
    /// were sent (those completed on workers last).
    pub fn handle(&self, frames: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut out = Outbox::default();
        let mut receiver = Receiver::new(&self.shared, &self.port, &self.pool);
        receiver.batch(frames.iter().copied(), &mut out);
        out.send(self.collector.as_ref());
        self.shared.engine.wait_idle();
        std::mem::take(&mut *self.collector.0.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Handles several batches as the receive loop does while frames keep coming:
    /// a run bound for a worker may grow from one batch into the next, and is
    /// started when the batches end (an empty ring). Returns every response.
    pub fn handle_batches(&self, batches: &[&[&[u8]]]) -> Vec<Vec<u8>> {
        let mut out = Outbox::default();
        let mut held = None;
        for frames in batches {
            let mut receiver = Receiver::resuming(&self.shared, &self.port, &self.pool, held);
            held = receiver.batch_holding(frames.iter().copied(), &mut out);
            out.send(self.collector.as_ref());
        }
        Receiver::resuming(&self.shared, &self.port, &self.pool, held)
            .batch(std::iter::empty(), &mut out);
        out.send(self.collector.as_ref());
        self.shared.engine.wait_idle();
        std::mem::take(&mut *self.collector.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ata, encode_frame, AtaArgs, Body, Command, Header, SECTOR_SIZE};
    use blockwire_blockdev::{BlockDevice, DeviceInfo, MemoryDevice, WriteFlags};
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

    const TARGET: MacAddr = [2, 0, 0, 0, 0, 1];
    const INITIATOR: MacAddr = [2, 0, 0, 0, 0, 2];

    fn harness() -> TargetHarness {
        let device = Device::from_device(MemoryDevice::new(1 << 20));
        TargetHarness::new(device, &TargetConfig::new(1, 1, vec![]), TARGET, 1500).unwrap()
    }

    fn ata_frame(tag: u32, cmd: u8, lba: u64, data: &[u8]) -> Vec<u8> {
        let header = Header::request(TARGET, INITIATOR, 1, 1, Command::Ata, tag);
        let args = AtaArgs {
            extended: true,
            write: !data.is_empty(),
            sector_count: 2,
            cmd_status: cmd,
            lba,
            ..AtaArgs::default()
        };
        let mut frame = Vec::new();
        encode_frame(&header, &Body::Ata(args, data), &mut frame);
        frame
    }

    /// Writes of `count` consecutive sector pairs from LBA 0, pair `i` filled with
    /// byte `i` and tagged `i`.
    fn stream_writes(count: u32) -> Vec<Vec<u8>> {
        (0..count)
            .map(|i| {
                ata_frame(
                    i,
                    ata::WRITE_SECTORS_EXT,
                    u64::from(i) * 2,
                    &[i as u8; 1024],
                )
            })
            .collect()
    }

    /// Reads of the same sector pairs, pair `i` tagged `100 + i`.
    fn stream_reads(count: u32) -> Vec<Vec<u8>> {
        (0..count)
            .map(|i| ata_frame(100 + i, ata::READ_SECTORS_EXT, u64::from(i) * 2, &[]))
            .collect()
    }

    #[test]
    fn a_batch_of_consecutive_writes_then_reads_round_trips() {
        let target = harness();
        let writes = stream_writes(8);
        let refs: Vec<&[u8]> = writes.iter().map(Vec::as_slice).collect();
        let answers = target.handle(&refs);
        assert_eq!(answers.len(), 8);
        let reads = stream_reads(8);
        let refs: Vec<&[u8]> = reads.iter().map(Vec::as_slice).collect();
        for answer in target.handle(&refs) {
            let (header, body) = Header::parse(&answer).unwrap();
            let (args, data) = AtaArgs::parse(body).unwrap();
            assert_eq!(args.cmd_status, ata::STATUS_DRDY);
            let i = (header.tag - 100) as u8;
            assert!(data[..2 * SECTOR_SIZE].iter().all(|&b| b == i));
        }
    }

    /// A memory device that completes on workers (as direct I/O does) and counts
    /// its device writes and reads.
    struct OnWorkers {
        memory: MemoryDevice,
        writes: Arc<AtomicUsize>,
        reads: Arc<AtomicUsize>,
    }

    impl BlockDevice for OnWorkers {
        fn info(&self) -> DeviceInfo {
            let mut info = self.memory.info();
            info.completes_inline = false;
            info
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> blockwire_blockdev::Result<()> {
            self.reads.fetch_add(1, SeqCst);
            self.memory.read_at(buf, offset)
        }
        fn write_at(
            &self,
            buf: &[u8],
            offset: u64,
            flags: WriteFlags,
        ) -> blockwire_blockdev::Result<()> {
            self.writes.fetch_add(1, SeqCst);
            self.memory.write_at(buf, offset, flags)
        }
    }

    /// A target over an [`OnWorkers`] device, with its write and read counters.
    fn on_workers(buffer_count: u16) -> (TargetHarness, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (writes, reads) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let device = Device::from_device(OnWorkers {
            memory: MemoryDevice::new(1 << 20),
            writes: writes.clone(),
            reads: reads.clone(),
        });
        let mut config = TargetConfig::new(1, 1, vec![]);
        config.buffer_count = buffer_count;
        let target = TargetHarness::new(device, &config, TARGET, 1500).unwrap();
        (target, writes, reads)
    }

    #[test]
    fn a_stream_spanning_batches_is_one_device_io_on_workers() {
        let (target, writes, reads) = on_workers(256);
        // 24 full frames (2 sectors at MTU 1500) in three batches: one stream.
        let frames = stream_writes(24);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let answers = target.handle_batches(&[&refs[..8], &refs[8..16], &refs[16..]]);
        assert_eq!(answers.len(), 24);
        assert_eq!(writes.load(SeqCst), 1, "one device write for the stream");
        // The same stream read back: one device read, each answer its own data,
        // sent from the read buffer (head and data gathered).
        let frames = stream_reads(24);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let answers = target.handle_batches(&[&refs[..5], &refs[5..]]);
        assert_eq!(answers.len(), 24);
        assert_eq!(reads.load(SeqCst), 1, "one device read for the stream");
        for answer in answers {
            let (header, body) = Header::parse(&answer).unwrap();
            let (args, data) = AtaArgs::parse(body).unwrap();
            assert_eq!(args.cmd_status, ata::STATUS_DRDY);
            let i = (header.tag - 100) as u8;
            assert_eq!(data.len(), 2 * SECTOR_SIZE);
            assert!(data.iter().all(|&b| b == i), "answer {i}");
        }
    }

    #[test]
    fn a_held_run_never_outgrows_its_share_of_the_window() {
        let (target, writes, _) = on_workers(128); // a quarter is 32 frames
        let frames = stream_writes(100);
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let batches: Vec<&[&[u8]]> = refs.chunks(10).collect();
        assert_eq!(target.handle_batches(&batches).len(), 100);
        // 100 frames in runs of at most 32: four device writes.
        assert_eq!(writes.load(SeqCst), 4);
    }

    #[test]
    fn zero_sector_transfers_get_a_padded_answer() {
        let target = harness();
        let mut read = ata_frame(9, ata::READ_SECTORS_EXT, 4, &[]);
        read[26] = 0; // sector count
        let mut write = ata_frame(10, ata::WRITE_SECTORS_EXT, 4, &[1; 1024]);
        write[26] = 0;
        let answers = target.handle(&[&read, &write]);
        assert_eq!(answers.len(), 2);
        for answer in answers {
            assert!(answer.len() >= crate::wire::MIN_FRAME_LEN);
            let (_, body) = Header::parse(&answer).unwrap();
            assert_eq!(AtaArgs::parse(body).unwrap().0.cmd_status, ata::STATUS_DRDY);
        }
    }

    #[test]
    fn flush_answers_through_a_worker() {
        let target = harness();
        let answers = target.handle(&[&ata_frame(7, ata::FLUSH_CACHE_EXT, 0, &[])]);
        assert_eq!(answers.len(), 1);
        let (header, body) = Header::parse(&answers[0]).unwrap();
        assert_eq!(header.tag, 7);
        assert_eq!(AtaArgs::parse(body).unwrap().0.cmd_status, ata::STATUS_DRDY);
    }
}
