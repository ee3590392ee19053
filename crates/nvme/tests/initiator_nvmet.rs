//! The initiator against Linux's own NVMe/TCP target (nvmet-tcp), the peer it is
//! judged by. Needs a running nvmet: boot the judge VM with a guest script that
//! exports a file (scripts/vm/judges/nvmet-target.sh's `nvmet_export NQN FILE 64
//! 0.0.0.0 4420`) and qemu forwarding a host port to the guest's 4420
//! (`BLOCKWIRE_VM_NETDEV=hostfwd=tcp:127.0.0.1:PORT-:4420 scripts/vm/boot.sh ...`),
//! then run
//! `BLOCKWIRE_NVMET=127.0.0.1:PORT BLOCKWIRE_NVMET_NQN=NQN cargo test -p
//! blockwire-nvme --test initiator_nvmet -- --ignored --test-threads 1`
//! (`rides_out_a_restart` also needs the restart trigger it describes).

use std::sync::Arc;
use std::time::Duration;

use blockwire_blockdev::{
    BlockDevice, Device, ErrorKind, IoBuf, QueuedCommand, QueuedOp, Submission, WriteFlags,
    ZeroFlags,
};
use blockwire_nvme::initiator::{discover, NvmeClient, NvmeOptions};

fn target() -> (String, String) {
    let addr = std::env::var("BLOCKWIRE_NVMET").expect("BLOCKWIRE_NVMET=HOST:PORT of an nvmet");
    let nqn = std::env::var("BLOCKWIRE_NVMET_NQN").expect("BLOCKWIRE_NVMET_NQN");
    (addr, nqn)
}

fn open(query: &str) -> NvmeClient {
    let (addr, nqn) = target();
    let mut options = NvmeOptions::parse(&format!("nvme+tcp://{addr}/{nqn}{query}")).unwrap();
    // TCG guests are slow to answer.
    options.setup_timeout = Duration::from_secs(30);
    NvmeClient::open(options).unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[2] ^ seed)
        .collect()
}

fn write_read(client: &NvmeClient, seed: u8) {
    let data = pattern(seed, 1 << 20);
    client.write_at(&data[..4096], 0, WriteFlags::NONE).unwrap();
    client
        .write_at(&data[4096..], 4096, WriteFlags::FUA)
        .unwrap();
    let mut back = vec![0u8; 1 << 20];
    client.read_at(&mut back, 0).unwrap();
    assert!(back == data, "1 MiB read back differs");
}

#[test]
#[ignore = "needs Linux nvmet-tcp (see the file's comment)"]
fn identify_write_read_flush_trim_zeroes() {
    let client = open("?queues=2");
    let info = client.info();
    eprintln!(
        "nvmet: {:?}, {:?}, {} queues, max transfer {}",
        client.controller(),
        client.namespace(),
        client.io_queues(),
        info.block_sizes.maximum
    );
    assert_eq!(info.size, 64 << 20);
    assert_eq!(client.controller().model, "Linux");
    write_read(&client, 1);
    client.flush().unwrap();
    if info.capabilities.trim.available() {
        client.trim(0, 65536, WriteFlags::NONE).unwrap();
    }
    // nvmet on a file system without zero-range fallocate (the guest's tmpfs)
    // answers Write Zeroes with "not supported": the device handle then writes
    // zeroes itself, as it does for any device that declines.
    match client.write_zeroes(65536, 65536, ZeroFlags::default()) {
        Ok(()) => {}
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}"),
    }
    let device = Device::new(Arc::new(client));
    device
        .write_zeroes(65536, 65536, ZeroFlags::default())
        .unwrap();
    let mut back = vec![1u8; 65536];
    device.read(&mut back, 65536).unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

#[test]
#[ignore = "needs Linux nvmet-tcp (see the file's comment)"]
fn digests() {
    write_read(&open("?hdr_digest=1&data_digest=1&queues=1"), 2);
    write_read(&open("?hdr_digest=1&queues=1"), 3);
}

#[test]
#[ignore = "needs Linux nvmet-tcp (see the file's comment)"]
fn request_queue() {
    let client = open("?queues=2");
    let mut queue = client.queue().unwrap();
    let block = 128 * 1024;
    for i in 0..32u64 {
        queue.submit(Submission {
            tag: i,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&pattern(i as u8, block)),
            offset: i * block as u64,
        });
    }
    queue.submit_command(99, QueuedCommand::Flush).unwrap();
    let mut done = Vec::new();
    while done.len() < 33 {
        queue.complete(1, &mut done);
    }
    for c in done.drain(..) {
        c.result.unwrap();
    }
    for i in 0..32u64 {
        queue.submit(Submission {
            tag: i,
            op: QueuedOp::Read,
            buf: IoBuf::new(block),
            offset: i * block as u64,
        });
    }
    while done.len() < 32 {
        queue.complete(1, &mut done);
    }
    for c in done {
        c.result.unwrap();
        assert!(c.buf[..] == pattern(c.tag as u8, block)[..]);
    }
}

#[test]
#[ignore = "needs Linux nvmet-tcp (see the file's comment)"]
fn discovery() {
    let (addr, nqn) = target();
    let mut options = NvmeOptions::parse(&format!("nvme+tcp://{addr}/")).unwrap();
    options.setup_timeout = Duration::from_secs(30);
    let entries = discover(&options).unwrap();
    eprintln!("{entries:#?}");
    assert!(entries.iter().any(|e| e.subnqn == nqn), "{entries:?}");
}

/// With BLOCKWIRE_NVMET_RESTART=HOST:PORT, a connection to which makes the guest
/// take the subsystem off its port for a few seconds (nvmet_port_off, then
/// nvmet_port_on), as a target restart.
#[test]
#[ignore = "needs Linux nvmet-tcp and a restart trigger (see the file's comment)"]
fn rides_out_a_restart() {
    let trigger = std::env::var("BLOCKWIRE_NVMET_RESTART").expect("BLOCKWIRE_NVMET_RESTART");
    let client = Arc::new(open("?queues=2"));
    let chunk = 256 * 1024;
    let chunks = 64u64;
    let writer = {
        let client = client.clone();
        std::thread::spawn(move || {
            for i in 0..chunks {
                client
                    .write_at(&pattern(i as u8, chunk), i * chunk as u64, WriteFlags::NONE)
                    .unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    drop(std::net::TcpStream::connect(trigger).unwrap());
    writer.join().expect("writes ride out the restart");
    assert!(client.reconnects() >= 1, "the target never went away");
    let mut back = vec![0u8; chunk];
    for i in 0..chunks {
        client.read_at(&mut back, i * chunk as u64).unwrap();
        assert!(back == pattern(i as u8, chunk), "chunk {i} differs");
    }
}
