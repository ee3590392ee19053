//! The NVMe/TCP initiator against the crate's own target over loopback:
//! identify, 1 MiB written and read back (in-capsule and R2T/H2CData writes,
//! C2HData reads), FUA, flush, trim, write zeroes, digests, several I/O
//! queues through the request queue, discovery, and a target restart in the
//! middle of a stream of writes with the data intact afterwards.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use blockwire_blockdev::{
    BlockDevice, Completion, Device, DeviceInfo, ErrorKind, IoBuf, MemoryDevice, QueuedCommand,
    QueuedOp, Result, Submission, WriteFlags, ZeroFlags,
};
use blockwire_nvme::controller::Subsystem;
use blockwire_nvme::initiator::{discover, NvmeClient, NvmeOptions};
use blockwire_nvme::{NvmeConfig, NvmeTarget, ShutdownHandle};

const SIZE: u64 = 16 << 20;

/// A memory device that counts what reaches it, so the tests can see that a
/// FUA write, a flush or a trim travelled as one.
struct Counting {
    inner: MemoryDevice,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
}

impl BlockDevice for Counting {
    fn info(&self) -> DeviceInfo {
        self.inner.info()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        if flags.fua {
            self.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.trims.fetch_add(1, Ordering::SeqCst);
        self.inner.trim(offset, len, flags)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.inner.write_zeroes(offset, len, flags)
    }
}

struct Running {
    addr: SocketAddr,
    shutdown: ShutdownHandle,
    thread: Option<thread::JoinHandle<()>>,
}

impl Running {
    fn stop(&mut self) {
        self.shutdown.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

const NQN: &str = "nqn.2026-11.dev.blockwire:disk";

/// A target serving `device` as subsystem [`NQN`] on `addr`, with a small
/// MAXH2CDATA so large writes take several H2CData PDUs.
fn start_on(addr: SocketAddr, device: Device) -> Running {
    let mut config = NvmeConfig::new(vec![addr]);
    config.workers = 4;
    config.maxh2cdata = 64 * 1024;
    let subsystem = Arc::new(Subsystem::new("disk", device).with_nqn(NQN));
    let target = NvmeTarget::bind(config, vec![subsystem]).expect("bind");
    let addr = target.local_addrs()[0];
    let shutdown = target.shutdown_handle();
    let thread = thread::spawn(move || target.run().expect("run"));
    Running {
        addr,
        shutdown,
        thread: Some(thread),
    }
}

fn counting() -> (Arc<Counting>, Device) {
    let counting = Arc::new(Counting {
        inner: MemoryDevice::new(SIZE),
        fua_writes: AtomicU64::new(0),
        flushes: AtomicU64::new(0),
        trims: AtomicU64::new(0),
    });
    let device = Device::new(counting.clone());
    (counting, device)
}

fn options(addr: SocketAddr, query: &str) -> NvmeOptions {
    let mut options =
        NvmeOptions::parse(&format!("nvme+tcp://{addr}/{NQN}?queues=2{query}")).unwrap();
    options.reconnect = Some(Duration::from_secs(10));
    options
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[2] ^ seed)
        .collect()
}

/// 1 MiB in pieces of every size class: in-capsule (4 KiB), just past the
/// capsule (20 KiB, one R2T answered by one H2CData), and R2T with several
/// H2CData PDUs (the rest); then read back whole.
fn write_and_read_back(client: &NvmeClient) {
    let data = pattern(7, 1 << 20);
    client.write_at(&data[..4096], 0, WriteFlags::NONE).unwrap();
    client
        .write_at(&data[4096..24576], 4096, WriteFlags::NONE)
        .unwrap();
    client
        .write_at(&data[24576..], 24576, WriteFlags::NONE)
        .unwrap();
    let mut back = vec![0u8; 1 << 20];
    client.read_at(&mut back, 0).unwrap();
    assert!(back == data, "1 MiB read back differs");
    let mut small = vec![0u8; 512];
    client.read_at(&mut small, 4096 + 512).unwrap();
    assert_eq!(small, data[4096 + 512..4096 + 1024]);
}

#[test]
fn identify_and_info() {
    let (_, device) = counting();
    let target = start_on("127.0.0.1:0".parse().unwrap(), device);
    let client = NvmeClient::open(options(target.addr, "")).unwrap();
    let info = client.info();
    assert_eq!(info.size, SIZE);
    assert_eq!(info.block_sizes.minimum, 512);
    assert!(info.block_sizes.maximum >= 128 * 1024);
    assert!(info.capabilities.trim.is_native());
    assert!(info.capabilities.write_zeroes.is_native());
    assert!(info.capabilities.fua.is_native());
    let ctrl = client.controller();
    assert_eq!(ctrl.model, "blockwire");
    assert!(ctrl.cntlid >= 1);
    assert!(ctrl.volatile_write_cache);
    assert_eq!(client.namespace().blocks, SIZE / 512);
    assert_eq!(client.io_queues(), 2);
    // Each queue is its own TCP connection: the admin queue and two I/O queues.
    assert_eq!(target.shutdown.open_connections(), 3);
    // Misaligned and out-of-range requests are refused before they travel.
    let mut buf = vec![0u8; 100];
    assert_eq!(
        client.read_at(&mut buf, 0).unwrap_err().kind(),
        ErrorKind::Misaligned
    );
    let mut buf = vec![0u8; 512];
    assert_eq!(
        client.read_at(&mut buf, SIZE).unwrap_err().kind(),
        ErrorKind::OutOfRange
    );
}

#[test]
fn a_missing_namespace_or_subsystem_is_an_error() {
    let (_, device) = counting();
    let target = start_on("127.0.0.1:0".parse().unwrap(), device);
    let mut wrong = options(target.addr, "");
    wrong.nsid = 2;
    assert!(NvmeClient::open(wrong).is_err());
    let mut wrong = options(target.addr, "");
    wrong.subnqn = "nqn.2026-11.dev.blockwire:none".into();
    let error = NvmeClient::open(wrong).unwrap_err().to_string();
    assert!(error.contains("Connect"), "{error}");
}

#[test]
fn one_mib_written_and_read_back() {
    let (_, device) = counting();
    let target = start_on("127.0.0.1:0".parse().unwrap(), device);
    let client = NvmeClient::open(options(target.addr, "")).unwrap();
    write_and_read_back(&client);
}

#[test]
fn one_mib_with_header_and_data_digests() {
    let (_, device) = counting();
    let target = start_on("127.0.0.1:0".parse().unwrap(), device);
    let client = NvmeClient::open(options(target.addr, "&hdr_digest=1&data_digest=1")).unwrap();
    write_and_read_back(&client);
    let client = NvmeClient::open(options(target.addr, "&hdr_digest=1")).unwrap();
    write_and_read_back(&client);
}

#[test]
fn fua_flush_trim_and_write_zeroes_reach_the_device() {
    let (counts, device) = counting();
    let target = start_on("127.0.0.1:0".parse().unwrap(), device);
    let client = NvmeClient::open(options(target.addr, "")).unwrap();
    client
        .write_at(&pattern(1, 8192), 65536, WriteFlags::FUA)
        .unwrap();
    assert_eq!(counts.fua_writes.load(Ordering::SeqCst), 1);
    client.flush().unwrap();
    assert_eq!(counts.flushes.load(Ordering::SeqCst), 1);

    client
        .write_at(&pattern(2, 65536), 0, WriteFlags::NONE)
        .unwrap();
    client.trim(4096, 8192, WriteFlags::NONE).unwrap();
    assert_eq!(counts.trims.load(Ordering::SeqCst), 1);
    let mut back = vec![1u8; 8192];
    client.read_at(&mut back, 4096).unwrap();
    assert!(back.iter().all(|&b| b == 0), "trimmed range reads non-zero");

    client
        .write_zeroes(16384, 16384, ZeroFlags::default())
        .unwrap();
    let mut back = vec![1u8; 65536];
    client.read_at(&mut back, 0).unwrap();
    let expected = pattern(2, 65536);
    assert_eq!(back[..4096], expected[..4096]);
    assert!(back[16384..32768].iter().all(|&b| b == 0));
    assert_eq!(back[32768..], expected[32768..]);
    // Write zeroes larger than one command (65536 blocks) is split.
    client
        .write_zeroes(
            0,
            SIZE,
            ZeroFlags {
                no_hole: true,
                ..ZeroFlags::default()
            },
        )
        .unwrap();
    client.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

fn collect(queue: &mut dyn blockwire_blockdev::RequestQueue, n: usize) -> Vec<Completion> {
    let mut done = Vec::new();
    while done.len() < n {
        queue.complete(1, &mut done);
    }
    done
}

#[test]
fn request_queue_keeps_many_commands_in_flight() {
    let (counts, device) = counting();
    let target = start_on("127.0.0.1:0".parse().unwrap(), device);
    let client = NvmeClient::open(options(target.addr, "&data_digest=1")).unwrap();
    let mut queue = client.queue().expect("a request queue");
    let block = 64 * 1024;
    for i in 0..64u64 {
        queue.submit(Submission {
            tag: i,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&pattern(i as u8, block)),
            offset: i * block as u64,
        });
    }
    assert_eq!(queue.in_flight(), 64);
    for done in collect(queue.as_mut(), 64) {
        done.result.unwrap();
    }
    queue.submit_command(100, QueuedCommand::Flush).unwrap();
    let done = collect(queue.as_mut(), 1);
    assert_eq!(done[0].tag, 100);
    done[0].result.as_ref().unwrap();
    assert_eq!(counts.flushes.load(Ordering::SeqCst), 1);
    for i in 0..64u64 {
        queue.submit(Submission {
            tag: i,
            op: QueuedOp::Read,
            buf: IoBuf::new(block),
            offset: i * block as u64,
        });
    }
    for done in collect(queue.as_mut(), 64) {
        done.result.unwrap();
        assert!(
            done.buf[..] == pattern(done.tag as u8, block)[..],
            "block {}",
            done.tag
        );
    }
    queue
        .submit_command(
            101,
            QueuedCommand::Trim {
                offset: 0,
                len: block as u64,
                flags: WriteFlags::NONE,
            },
        )
        .unwrap();
    collect(queue.as_mut(), 1)[0].result.as_ref().unwrap();
    assert_eq!(counts.trims.load(Ordering::SeqCst), 1);
    // Beyond the end: a completion with the error, not a panic.
    queue.submit(Submission {
        tag: 7,
        op: QueuedOp::Read,
        buf: IoBuf::new(4096),
        offset: SIZE,
    });
    let done = collect(queue.as_mut(), 1);
    assert_eq!(
        done[0].result.as_ref().unwrap_err().kind(),
        ErrorKind::OutOfRange
    );
}

#[test]
fn target_restart_mid_stream_keeps_the_data() {
    let (_, device) = counting();
    let mut target = start_on("127.0.0.1:0".parse().unwrap(), device.clone());
    let addr = target.addr;
    let client = Arc::new(NvmeClient::open(options(addr, "")).unwrap());
    let chunk = 128 * 1024;
    let chunks = 64u64;
    let writer = {
        let client = client.clone();
        thread::spawn(move || {
            for i in 0..chunks {
                client
                    .write_at(&pattern(i as u8, chunk), i * chunk as u64, WriteFlags::NONE)
                    .unwrap();
                thread::sleep(Duration::from_millis(10));
            }
        })
    };
    thread::sleep(Duration::from_millis(150));
    target.stop();
    thread::sleep(Duration::from_millis(300));
    let _restarted = start_on(addr, device);
    writer.join().expect("writes ride out the restart");
    assert!(client.reconnects() >= 1);
    let mut back = vec![0u8; chunk];
    for i in 0..chunks {
        client.read_at(&mut back, i * chunk as u64).unwrap();
        assert!(back == pattern(i as u8, chunk), "chunk {i} differs");
    }
}

#[test]
fn requests_fail_disconnected_when_the_target_stays_away() {
    let (_, device) = counting();
    let mut target = start_on("127.0.0.1:0".parse().unwrap(), device);
    let mut opts = options(target.addr, "");
    opts.reconnect = Some(Duration::from_millis(500));
    let client = NvmeClient::open(opts).unwrap();
    target.stop();
    let mut buf = vec![0u8; 4096];
    let error = client.read_at(&mut buf, 0).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Disconnected);
}

/// A target with a discovery listener, and the discovery address.
fn start_with_discovery(device: Device) -> (Running, SocketAddr) {
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut config = NvmeConfig::new(vec![loopback]);
    config.discovery_listen = vec![loopback];
    let subsystem = Arc::new(Subsystem::new("disk", device).with_nqn(NQN));
    let target = NvmeTarget::bind(config, vec![subsystem]).expect("bind");
    let discovery = target.discovery_addrs()[0];
    let mut running = Running {
        addr: target.local_addrs()[0],
        shutdown: target.shutdown_handle(),
        thread: None,
    };
    running.thread = Some(thread::spawn(move || target.run().expect("run")));
    (running, discovery)
}

#[test]
fn discovery_reads_the_log() {
    let (_, device) = counting();
    let (target, disc) = start_with_discovery(device);
    let options = NvmeOptions::parse(&format!("nvme+tcp://{disc}")).unwrap();
    assert!(options.is_discovery());
    let entries = discover(&options).unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!((entries[0].trtype, entries[0].subtype), (3, 2));
    assert_eq!(entries[0].portid, 1);
    assert_eq!(entries[0].trsvcid, target.addr.port().to_string());
}

/// NVMe-oF puts SUBNQN at byte 256 of an entry and TRADDR at 512 (Linux's
/// struct nvmf_disc_rsp_page_entry agrees).
#[test]
fn discovery_entry_names_the_subsystem_and_opens_it() {
    let (_, device) = counting();
    let (_target, disc) = start_with_discovery(device);
    let options = NvmeOptions::parse(&format!("nvme+tcp://{disc}")).unwrap();
    let entries = discover(&options).unwrap();
    assert_eq!(entries[0].subnqn, NQN);
    assert_eq!(entries[0].traddr, "127.0.0.1");
    let client = NvmeClient::open_uri(&entries[0].uri()).unwrap();
    assert_eq!(client.info().size, SIZE);
}

#[test]
fn keep_alive_holds_an_idle_association() {
    let (_, device) = counting();
    let target = start_on("127.0.0.1:0".parse().unwrap(), device);
    let mut opts = options(target.addr, "");
    // The target ends a controller not heard from for a second; the
    // keep-alives every half second hold it through three idle seconds.
    opts.keep_alive = Duration::from_secs(1);
    let client = NvmeClient::open(opts).unwrap();
    thread::sleep(Duration::from_secs(3));
    client
        .write_at(&pattern(3, 4096), 0, WriteFlags::FUA)
        .unwrap();
    assert_eq!(client.reconnects(), 0);
}

#[test]
fn request_queue_rides_out_a_restart() {
    let (_, device) = counting();
    let mut target = start_on("127.0.0.1:0".parse().unwrap(), device.clone());
    let addr = target.addr;
    let client = NvmeClient::open(options(addr, "")).unwrap();
    let block = 64 * 1024;
    let blocks = 128u64;
    let restarter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        target.stop();
        thread::sleep(Duration::from_millis(300));
        start_on(addr, device)
    });
    let mut queue = client.queue().unwrap();
    let mut done = Vec::new();
    // 16 writes in flight at a time, slowly enough that the restart falls in
    // the middle.
    for i in 0..blocks {
        while queue.in_flight() >= 16 {
            queue.complete(1, &mut done);
        }
        queue.submit(Submission {
            tag: i,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&pattern(i as u8, block)),
            offset: i * block as u64,
        });
        thread::sleep(Duration::from_millis(5));
    }
    let in_flight = queue.in_flight();
    queue.complete(in_flight, &mut done);
    assert_eq!(done.len(), blocks as usize);
    for c in &done {
        c.result.as_ref().unwrap();
    }
    let _restarted = restarter.join().unwrap();
    assert!(
        client.reconnects() >= 1,
        "the restart did not happen mid-stream"
    );
    drop(queue);
    let mut back = vec![0u8; block];
    for i in 0..blocks {
        client.read_at(&mut back, i * block as u64).unwrap();
        assert!(back == pattern(i as u8, block), "block {i} differs");
    }
}
