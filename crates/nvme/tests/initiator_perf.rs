//! Throughput of the initiator against the crate's target over loopback, with
//! a memory device: 4 KiB random QD32 and 1 MiB sequential QD16 through the
//! request queue. Ignored by default (it measures, it does not check); run
//! with `cargo test --release -p blockwire-nvme --test initiator_perf -- --ignored --nocapture`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use blockwire_blockdev::{
    BlockDevice, Device, IoBuf, MemoryDevice, QueuedOp, RequestQueue, Submission, WriteFlags,
};
use blockwire_nvme::controller::Subsystem;
use blockwire_nvme::initiator::{NvmeClient, NvmeOptions};
use blockwire_nvme::{NvmeConfig, NvmeTarget};

const SIZE: u64 = 256 << 20;
const NQN: &str = "nqn.2026-11.dev.blockwire:perf";

/// Keeps `depth` requests of `block` bytes in flight for `time`; returns MB/s
/// and requests per second.
fn run(
    queue: &mut dyn RequestQueue,
    op: QueuedOp,
    block: usize,
    depth: usize,
    random: bool,
    time: Duration,
) -> (f64, f64) {
    let slots = SIZE / block as u64;
    let mut next = 0u64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut offset = || {
        let slot = if random {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % slots
        } else {
            next = (next + 1) % slots;
            next
        };
        slot * block as u64
    };
    let start = Instant::now();
    let mut done = Vec::new();
    let mut count = 0u64;
    for tag in 0..depth as u64 {
        queue.submit(Submission {
            tag,
            op,
            buf: IoBuf::new(block),
            offset: offset(),
        });
    }
    while start.elapsed() < time {
        queue.complete(1, &mut done);
        for c in done.drain(..) {
            c.result.unwrap();
            count += 1;
            queue.submit(Submission {
                tag: c.tag,
                op,
                buf: c.buf,
                offset: offset(),
            });
        }
    }
    let in_flight = queue.in_flight();
    queue.complete(in_flight, &mut done);
    let secs = start.elapsed().as_secs_f64();
    (
        count as f64 * block as f64 / secs / 1e6,
        count as f64 / secs,
    )
}

#[test]
#[ignore = "a measurement"]
fn throughput_over_loopback() {
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = NvmeConfig::new(vec![loopback]);
    config.workers = 4;
    let device = Device::from_device(MemoryDevice::new(SIZE));
    let subsystem = Arc::new(Subsystem::new("perf", device).with_nqn(NQN));
    let target = NvmeTarget::bind(config, vec![subsystem]).unwrap();
    let addr = target.local_addrs()[0];
    let shutdown = target.shutdown_handle();
    let server = thread::spawn(move || target.run().unwrap());
    for query in ["", "?hdr_digest=1&data_digest=1"] {
        let options = NvmeOptions::parse(&format!("nvme+tcp://{addr}/{NQN}{query}")).unwrap();
        let client = NvmeClient::open(options).unwrap();
        // Fill the device so reads are of written data.
        let fill = vec![0x5au8; 1 << 20];
        for i in 0..SIZE >> 20 {
            client.write_at(&fill, i << 20, WriteFlags::NONE).unwrap();
        }
        let mut queue = client.queue().unwrap();
        let time = Duration::from_secs(3);
        let write = QueuedOp::Write(WriteFlags::NONE);
        for (name, op, block, depth, random) in [
            ("4k randread  QD32", QueuedOp::Read, 4096, 32, true),
            ("4k randwrite QD32", write, 4096, 32, true),
            ("1M seqread   QD16", QueuedOp::Read, 1 << 20, 16, false),
            ("1M seqwrite  QD16", write, 1 << 20, 16, false),
        ] {
            let (mbs, iops) = run(queue.as_mut(), op, block, depth, random, time);
            println!(
                "{name} {:>8} queues {} digests {:>5}: {mbs:8.1} MB/s {iops:9.0} IOPS",
                "",
                client.io_queues(),
                !query.is_empty()
            );
        }
    }
    shutdown.shutdown();
    server.join().unwrap();
}
