//! The AoE target's frame handling on arbitrary batches of frames against a small
//! memory device: it must never panic, and every answer it sends must be a response
//! frame of at least the Ethernet minimum that our own decoder accepts.
//!
//! The first byte picks the device: one that completes inline (the page cache's
//! path) or one that completes only on workers (the direct-I/O path, where runs of
//! frames are gathered into one device request and may be held from one batch into
//! the next). Then come frames, each a two-byte big-endian length and that many
//! bytes after the Ethernet addresses and type; a length with its top bit set ends
//! the batch as well as the frame, so runs can span batches.
#![no_main]

use std::sync::OnceLock;

use blockwire_aoe::target::{TargetConfig, TargetHarness};
use blockwire_aoe::wire::{Header, MIN_FRAME_LEN};
use blockwire_blockdev::{BlockDevice, Device, DeviceInfo, MemoryDevice, Result, WriteFlags};
use libfuzzer_sys::fuzz_target;

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const BATCH_END: u16 = 0x8000;

/// A memory device that says it may block, so the target hands its I/O to workers.
struct OnWorkers(MemoryDevice);

impl BlockDevice for OnWorkers {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            completes_inline: false,
            ..self.0.info()
        }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.0.write_at(buf, offset, flags)
    }
}

fn targets() -> &'static [TargetHarness; 2] {
    static TARGETS: OnceLock<[TargetHarness; 2]> = OnceLock::new();
    TARGETS.get_or_init(|| {
        let config = TargetConfig::new(1, 1, vec![]);
        let make = |device| TargetHarness::new(device, &config, MAC, 1500).expect("harness");
        [
            make(Device::from_device(MemoryDevice::new(1 << 20))),
            make(Device::from_device(OnWorkers(MemoryDevice::new(1 << 20)))),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, mut rest)) = data.split_first() else {
        return;
    };
    let mut batches: Vec<Vec<Vec<u8>>> = vec![Vec::new()];
    while let Some((length, tail)) = rest.split_first_chunk::<2>() {
        let length = u16::from_be_bytes(*length);
        let take = usize::from(length & !BATCH_END).min(tail.len());
        // Aimed at the target's address, so most frames get past addressing.
        let mut frame = MAC.to_vec();
        frame.extend_from_slice(&[2, 0, 0, 0, 0, 2, 0x88, 0xa2]);
        frame.extend_from_slice(&tail[..take]);
        batches.last_mut().expect("a batch").push(frame);
        if length & BATCH_END != 0 {
            batches.push(Vec::new());
        }
        rest = &tail[take..];
    }
    let frames: Vec<Vec<&[u8]>> = batches
        .iter()
        .map(|batch| batch.iter().map(Vec::as_slice).collect())
        .collect();
    let batches: Vec<&[&[u8]]> = frames.iter().map(Vec::as_slice).collect();
    let target = &targets()[usize::from(choice & 1)];
    for answer in target.handle_batches(&batches) {
        assert!(answer.len() >= MIN_FRAME_LEN);
        let (header, _) = Header::parse(&answer).expect("answers decode");
        assert!(header.response);
    }
});
