//! The initiator's threads and sockets against a misbehaving fake target over a veth
//! pair: requests and answers lost, answers duplicated and delayed past later ones.
//! The device conformance suite must still pass, through retransmissions.
//!
//! Needs root (namespaces, raw sockets); skipped with a message otherwise.

mod initiator_lab;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_aoe::identify::Identity;
use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
use blockwire_aoe::rawsock::{Interface, RawSocket, RecvBatch};
use blockwire_aoe::wire::{
    ata, encode_frame, sectors_per_frame, AtaArgs, Body, Command, ConfigQuery, Header, SECTOR_SIZE,
};
use blockwire_blockdev::conformance;
use blockwire_blockdev::Device;
use initiator_lab::Lab;

const SHELF: u16 = 3;
const SLOT: u8 = 4;
const SECTORS: u64 = 16 << 11; // 16 MiB

/// Misbehaviour, in frames per thousand.
#[derive(Clone, Copy)]
struct Faults {
    lose_request: u64,
    lose_answer: u64,
    duplicate: u64,
    delay: u64,
}

struct Rng(u64);

impl Rng {
    fn per_mille(&mut self, chance: u64) -> bool {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % 1000 < chance
    }
}

/// What the fake target saw and did.
#[derive(Debug, Default)]
struct Counts {
    requests: u64,
    lost: u64,
    duplicated: u64,
    delayed: u64,
}

/// A memory disk served as SHELF.SLOT the way vblade answers, with faults.
fn serve(interface: &str, faults: Faults, stop: Arc<AtomicBool>) -> Counts {
    let interface = Interface::lookup(interface).unwrap();
    let socket = RawSocket::open(&interface, 4 << 20).unwrap();
    let per_frame = sectors_per_frame(interface.mtu);
    let identity = Identity {
        sectors: SECTORS,
        lba48: true,
        model: "fake lossy target".into(),
        serial: "lossy".into(),
        firmware: "1".into(),
    }
    .encode();
    let mut disk = vec![0u8; SECTORS as usize * SECTOR_SIZE];
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut counts = Counts::default();
    let mut batch = RecvBatch::new(64, interface.mtu + 64);
    let mut delayed: Vec<Vec<u8>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let received = socket
            .recv_batch(&mut batch, Some(Duration::from_millis(5)))
            .unwrap();
        let mut answers: Vec<Vec<u8>> = Vec::new();
        for i in 0..received {
            let frame = batch.frame(i);
            let Ok((header, body)) = Header::parse(frame) else {
                continue;
            };
            if header.response || !header.addresses(SHELF, SLOT) {
                continue;
            }
            let mut reply = header.response_to(interface.mac);
            reply.shelf = SHELF;
            reply.slot = SLOT;
            let mut answer = Vec::new();
            if header.command == Command::QueryConfig as u8 {
                let config = ConfigQuery {
                    buffer_count: 64,
                    firmware_version: 1,
                    sector_count: per_frame,
                    aoe_version: 1,
                    command: 0,
                    config: b"",
                };
                encode_frame(&reply, &Body::QueryConfig(config), &mut answer);
                answers.push(answer);
                continue;
            }
            if header.command != Command::Ata as u8 {
                continue;
            }
            counts.requests += 1;
            if rng.per_mille(faults.lose_request) {
                counts.lost += 1;
                continue;
            }
            let (mut args, data) = AtaArgs::parse(body).unwrap();
            let start = args.lba as usize * SECTOR_SIZE;
            let len = usize::from(args.sector_count) * SECTOR_SIZE;
            let mut payload: &[u8] = &[];
            args.cmd_status = match args.cmd_status {
                ata::IDENTIFY_DEVICE => {
                    payload = &identity;
                    ata::STATUS_DRDY
                }
                ata::FLUSH_CACHE | ata::FLUSH_CACHE_EXT => ata::STATUS_DRDY,
                ata::READ_SECTORS_EXT | ata::WRITE_SECTORS_EXT if start + len > disk.len() => {
                    args.err_feature = ata::ERROR_IDNF;
                    ata::STATUS_DRDY | ata::STATUS_ERR
                }
                ata::READ_SECTORS_EXT => {
                    payload = &disk[start..start + len];
                    ata::STATUS_DRDY
                }
                ata::WRITE_SECTORS_EXT => {
                    disk[start..start + len].copy_from_slice(&data[..len]);
                    ata::STATUS_DRDY
                }
                _ => {
                    args.err_feature = ata::ERROR_ABRT;
                    ata::STATUS_DRDY | ata::STATUS_ERR
                }
            };
            args.sector_count = 0;
            encode_frame(&reply, &Body::Ata(args, payload), &mut answer);
            if rng.per_mille(faults.lose_answer) {
                counts.lost += 1;
            } else if rng.per_mille(faults.delay) {
                counts.delayed += 1;
                delayed.push(answer);
            } else {
                if rng.per_mille(faults.duplicate) {
                    counts.duplicated += 1;
                    answers.push(answer.clone());
                }
                answers.push(answer);
            }
        }
        // Answers held back last round now arrive after this round's.
        if received > 0 || answers.is_empty() {
            answers.append(&mut delayed);
        }
        if !answers.is_empty() {
            let frames: Vec<&[u8]> = answers.iter().map(Vec::as_slice).collect();
            socket.send_batch(&frames).unwrap();
        }
    }
    counts
}

#[test]
fn conformance_through_loss_duplicates_and_reordering() {
    if let Some(reason) = initiator_lab::unavailable() {
        eprintln!("skipped: {reason}");
        return;
    }
    let lab = Lab::new("l", 1, 1500);
    let stop = Arc::new(AtomicBool::new(false));
    let faults = Faults {
        lose_request: 20,
        lose_answer: 20,
        duplicate: 20,
        delay: 20,
    };
    let target = {
        let stop = stop.clone();
        lab.spawn_target_thread(move || serve("tgt0", faults, stop))
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let uri = AoeUri::new("ini0", SHELF, SLOT);
        let client = lab.in_initiator(|| {
            // The first config query or IDENTIFY may be lost too: retry the open.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match AoeClient::open(&uri, AoeOptions::default()) {
                    Ok(client) => break client,
                    Err(e) if Instant::now() < deadline => eprintln!("retrying: {e}"),
                    Err(e) => panic!("open {uri}: {e}"),
                }
            }
        });
        assert_eq!(client.identity().model, "fake lossy target");
        assert_eq!(client.window(), 64);
        let client = Arc::new(client);
        let device = Device::new(client.clone());
        let start = Instant::now();
        conformance::run_all(&device);
        let stats = client.stats();
        eprintln!(
            "conformance in {:?} through a lossy link: {stats:?}",
            start.elapsed()
        );
        assert!(stats.retransmits > 50, "{stats:?}");
        assert!(stats.ignored > 50, "{stats:?}");
        assert_eq!(stats.timeouts, 0);
    }));
    stop.store(true, Ordering::Relaxed);
    let counts = target.join().unwrap();
    eprintln!("fake target: {counts:?}");
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    assert!(counts.lost > 0 && counts.duplicated > 0 && counts.delayed > 0);
}
