//! The AoE target acknowledges a FLUSH CACHE, and a write our initiator sends as
//! FUA (a write, then a flush), only once its device has made them durable: our
//! target over a write-log device on a disk with a volatile cache, driven by our
//! initiator across a veth pair between two network namespaces (as root), through
//! the acknowledgement trial of `blockwire_blockdev::durability`. The target's
//! gathered runs, its workers and its inline path are all in play: four writers at
//! once, stamped blocks, a flush every few writes.

mod initiator_lab;

use std::sync::Arc;

use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
use blockwire_aoe::target::{AoeTarget, TargetConfig};
use blockwire_blockdev::durability::{acknowledgements, Trial};
use blockwire_blockdev::{Device, VolatileCache, WriteLog};
use initiator_lab::Lab;

const SHELF: u16 = 5;
const SLOT: u8 = 6;
const SIZE: u64 = 16 << 20;

#[test]
fn flushes_and_fua_writes_are_acknowledged_only_once_durable() {
    if let Some(reason) = initiator_lab::unavailable() {
        eprintln!("skipped: {reason}");
        return;
    }
    let lab = Lab::new("d", 1, 9000);
    let disk = Arc::new(VolatileCache::new(SIZE));
    let log = Arc::new(WriteLog::new(Device::new(disk.clone())));
    let target = {
        let device = Device::new(log.clone());
        lab.spawn_target_thread(move || {
            AoeTarget::start(device, TargetConfig::new(SHELF, SLOT, vec!["tgt0".into()]))
                .expect("start the AoE target")
        })
        .join()
        .expect("the target thread")
    };
    let uri = AoeUri::new("ini0", SHELF, SLOT);
    let client = lab.in_initiator(|| {
        AoeClient::open(&uri, AoeOptions::default()).expect("open the AoE target")
    });
    let client = Arc::new(client);
    let device = Device::new(client.clone());
    let medium = |offset, len| disk.medium_range(offset, len);
    let (fua, flushes) = acknowledgements(&device, &log, &medium, Trial::default())
        // Retransmitted frames are written again; the stats say whether any were.
        .unwrap_or_else(|e| panic!("{e} (initiator: {:?})", client.stats()));
    // Four threads of 64 writes: every fifth FUA, a flush after every eighth.
    assert_eq!((fua, flushes), (52, 32));
    drop(device);
    drop(client);
    drop(target);
}
