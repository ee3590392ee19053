//! The AoE target's frame handling on arbitrary batches of frames against a small
//! memory device: it must never panic, and every answer it sends must be a response
//! frame of at least the Ethernet minimum that our own decoder accepts.
#![no_main]

use blockwire_aoe::target::{TargetConfig, TargetHarness};
use blockwire_aoe::wire::{Header, MIN_FRAME_LEN};
use blockwire_blockdev::{Device, MemoryDevice};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];

fn target() -> &'static TargetHarness {
    static TARGET: OnceLock<TargetHarness> = OnceLock::new();
    TARGET.get_or_init(|| {
        let device = Device::from_device(MemoryDevice::new(1 << 20));
        TargetHarness::new(device, &TargetConfig::new(1, 1, vec![]), MAC, 1500)
            .expect("harness")
    })
}

fuzz_target!(|data: &[u8]| {
    // Frames separated by 0xfe bytes, each aimed at the target's address
    // so most of them get past addressing.
    let frames: Vec<Vec<u8>> = data
        .split(|&b| b == 0xfe)
        .map(|piece| {
            let mut frame = MAC.to_vec();
            frame.extend_from_slice(&[2, 0, 0, 0, 0, 2, 0x88, 0xa2]);
            frame.extend_from_slice(piece);
            frame
        })
        .collect();
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    for answer in target().handle(&refs) {
        assert!(answer.len() >= MIN_FRAME_LEN);
        let (header, _) = Header::parse(&answer).expect("answers decode");
        assert!(header.response);
    }
});
