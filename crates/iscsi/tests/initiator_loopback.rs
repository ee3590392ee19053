//! Our initiator against our own target, in one process: the device conformance
//! suite through iSCSI (with and without digests, one and two sessions), a request
//! queue keeping many commands in flight, CHAP right and wrong, discovery, and a
//! target that shuts down under a connected initiator.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use blockwire_blockdev::conformance::{self, pattern};
use blockwire_blockdev::{
    Device, ErrorKind, IoBuf, MemoryDevice, QueuedOp, Submission, WriteFlags,
};
use blockwire_iscsi::initiator::{discover, IscsiClient, IscsiOptions, IscsiUri};
use blockwire_iscsi::login::ChapConfig;
use blockwire_iscsi::{IscsiConfig, IscsiTarget, ShutdownHandle, TargetDefinition};
use blockwire_scsi::{LogicalUnit, LunConfig, ScsiTarget};

const IQN: &str = "iqn.2026-11.dev.blockwire:loopback";
const SIZE: u64 = 16 << 20;

struct Running {
    addr: SocketAddr,
    stop: ShutdownHandle,
    thread: Option<thread::JoinHandle<()>>,
    memory: Device,
}

impl Running {
    fn uri(&self) -> IscsiUri {
        IscsiUri::new("127.0.0.1", self.addr.port(), IQN, 0)
    }

    fn stop(&mut self) {
        self.stop.shutdown();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

fn start(block_size: u32, chap: Option<ChapConfig>) -> Running {
    start_on(
        Device::from_device(MemoryDevice::new(SIZE)),
        block_size,
        chap,
    )
}

/// Our target serving `memory` as LUN 0.
fn start_on(memory: Device, block_size: u32, chap: Option<ChapConfig>) -> Running {
    let unit = LogicalUnit::new(
        memory.clone(),
        LunConfig {
            block_size,
            vendor: "BLKWIRE".into(),
            product: "loopback".into(),
            revision: "0.1".into(),
            serial: "1".into(),
            unique_id: 1,
            target_name: IQN.into(),
        },
    )
    .expect("logical unit");
    let mut scsi = ScsiTarget::new();
    scsi.add_lun(0, Arc::new(unit));
    let mut config = IscsiConfig::new(
        vec!["127.0.0.1:0".parse().unwrap()],
        vec![TargetDefinition {
            name: IQN.into(),
            alias: Some("loop".into()),
            scsi: Arc::new(scsi),
            allowed_initiators: Vec::new(),
            chap,
        }],
    );
    config.workers = 4;
    config.shutdown_grace = Duration::from_secs(2);
    let target = IscsiTarget::bind(config).expect("bind");
    let addr = target.local_addrs()[0];
    let stop = target.shutdown_handle();
    let thread = thread::spawn(move || target.run().expect("run"));
    Running {
        addr,
        stop,
        thread: Some(thread),
        memory,
    }
}

fn open(uri: &IscsiUri) -> Device {
    let client = IscsiClient::connect(uri, IscsiOptions::default()).expect("connect");
    Device::new(Arc::new(client))
}

#[test]
fn conformance_through_the_initiator() {
    let target = start(512, None);
    let device = open(&target.uri());
    let info = device.info();
    assert_eq!(info.size, SIZE);
    assert_eq!(info.block_sizes.minimum, 512);
    // Our target offers UNMAP, WRITE SAME and GET LBA STATUS on a memory device:
    // the initiator uses them rather than the handle's emulation.
    let caps = info.capabilities;
    assert!(caps.flush.is_native() && caps.fua.is_native(), "{caps:?}");
    assert!(caps.trim.is_native(), "{caps:?}");
    assert!(caps.write_zeroes.is_native(), "{caps:?}");
    assert!(caps.extents.is_native(), "{caps:?}");
    conformance::run_all(&device);
}

#[test]
fn conformance_with_digests_4k_blocks_and_two_sessions() {
    let target = start(4096, None);
    let mut uri = target.uri();
    uri.digest = true;
    uri.sessions = 2;
    let client = IscsiClient::connect(&uri, IscsiOptions::default()).expect("connect");
    assert!(client.session_params(0).unwrap().header_digest);
    assert!(client.session_params(1).unwrap().data_digest);
    assert_eq!(client.sessions(), 2);
    let device = Device::new(Arc::new(client));
    assert_eq!(device.info().block_sizes.minimum, 4096);
    conformance::run_all(&device);
}

#[test]
fn a_queue_keeps_many_commands_in_flight() {
    let target = start(512, None);
    let device = open(&target.uri());
    let mut queue = device.queue().expect("the initiator has a request queue");
    const LEN: usize = 64 * 1024;
    // Writes, then reads of the same ranges, 32 at a time.
    for i in 0..32u64 {
        queue.submit(Submission {
            tag: i,
            op: QueuedOp::Write(WriteFlags::NONE),
            buf: IoBuf::from_slice(&pattern(7, i * LEN as u64, LEN)),
            offset: i * LEN as u64,
        });
    }
    let mut done = Vec::new();
    while done.len() < 32 {
        queue.complete(1, &mut done);
    }
    assert!(done.iter().all(|c| c.result.is_ok()));
    for i in 0..32u64 {
        queue.submit(Submission {
            tag: 100 + i,
            op: QueuedOp::Read,
            buf: IoBuf::new(LEN),
            offset: i * LEN as u64,
        });
    }
    let mut done = Vec::new();
    while done.len() < 32 {
        queue.complete(32 - done.len(), &mut done);
    }
    for completion in &done {
        assert!(completion.result.is_ok(), "{:?}", completion.result);
        let i = completion.tag - 100;
        assert_eq!(&completion.buf[..], &pattern(7, i * LEN as u64, LEN)[..]);
    }
    // And the target's memory holds it.
    let mut back = vec![0u8; LEN];
    target.memory.read(&mut back, 5 * LEN as u64).unwrap();
    assert_eq!(back, pattern(7, 5 * LEN as u64, LEN));
}

fn chap(mutual: bool) -> ChapConfig {
    ChapConfig {
        user: "alice".into(),
        secret: b"alice-secret-1234".to_vec(),
        mutual: mutual.then(|| ("tgt".to_string(), b"target-secret-987".to_vec())),
    }
}

#[test]
fn chap_right_and_wrong_secrets() {
    let target = start(512, Some(chap(false)));
    let mut uri = target.uri();
    // No credentials: the target needs CHAP.
    let error = IscsiClient::connect(&uri, IscsiOptions::default()).unwrap_err();
    assert!(error.to_string().contains("(0x0201)"), "{error}");
    uri.user = Some("alice".into());
    uri.password = Some("wrong".into());
    let error = IscsiClient::connect(&uri, IscsiOptions::default()).unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("authentication failure (0x0201)"),
        "{message}"
    );
    assert!(!message.contains('\n'));
    uri.password = Some("alice-secret-1234".into());
    let device = open(&uri);
    device.write(&[5u8; 512], 0, WriteFlags::NONE).unwrap();
}

#[test]
fn mutual_chap_checks_the_target() {
    let target = start(512, Some(chap(true)));
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "alice-secret-1234\n").unwrap();
    let target_secret = dir.path().join("target-secret");
    std::fs::write(&target_secret, "target-secret-987").unwrap();
    let mut uri = target.uri();
    uri.user = Some("alice".into());
    uri.secret_file = Some(secret.display().to_string());
    uri.target_user = Some("tgt".into());
    uri.target_secret_file = Some(target_secret.display().to_string());
    let device = open(&uri);
    let mut block = vec![0u8; 512];
    device.read(&mut block, 0).unwrap();
    // A target that does not know our expected secret fails mutual CHAP.
    std::fs::write(&target_secret, "something-else").unwrap();
    let error = IscsiClient::connect(&uri, IscsiOptions::default()).unwrap_err();
    assert!(error.to_string().contains("mutual CHAP"), "{error}");
}

#[test]
fn discovery_lists_the_target() {
    let target = start(512, None);
    let mut uri = target.uri();
    uri.target = None;
    let found = discover(&uri, &IscsiOptions::default()).expect("discover");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].name, IQN);
    assert!(!found[0].addresses.is_empty());
}

#[test]
fn a_target_shutdown_fails_requests_cleanly() {
    let mut target = start(512, None);
    let device = open(&target.uri());
    device.write(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
    target.stop();
    let mut block = vec![0u8; 4096];
    let error = device.read(&mut block, 0).unwrap_err();
    assert!(
        matches!(
            error.kind(),
            ErrorKind::Disconnected | ErrorKind::ShuttingDown
        ),
        "{error}"
    );
}

#[test]
fn our_target_answers_idle_pings() {
    let target = start(512, None);
    let options = IscsiOptions {
        nop_interval: Duration::from_millis(50),
        ..IscsiOptions::default()
    };
    let client = IscsiClient::connect(&target.uri(), options).expect("connect");
    let device = Device::new(Arc::new(client));
    // Many intervals of silence: each ping is answered, the connection stays.
    thread::sleep(Duration::from_millis(500));
    device.write(&[3u8; 512], 0, WriteFlags::NONE).unwrap();
}

#[test]
fn fua_writes_and_flushes_are_acknowledged_only_once_durable() {
    use blockwire_blockdev::durability::{acknowledgements, Trial};
    use blockwire_blockdev::{VolatileCache, WriteLog};
    let disk = Arc::new(VolatileCache::new(SIZE));
    let log = Arc::new(WriteLog::new(Device::new(disk.clone())));
    let target = start_on(Device::new(log.clone()), 512, None);
    let client = open(&target.uri());
    // The initiator sends FUA and SYNCHRONIZE CACHE: the target runs them on the
    // device before it answers.
    assert!(client.info().capabilities.fua.is_native());
    let medium = |offset, len| disk.medium_range(offset, len);
    let (fua, flushes) = acknowledgements(&client, &log, &medium, Trial::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((fua, flushes), (52, 32));
}
