use std::sync::Arc;

use super::*;
use crate::{conformance, MemoryDevice, VolatileCache};

const SIZE: u64 = 1 << 20;

fn logged() -> (WriteLog, Device) {
    let memory = Device::from_device(MemoryDevice::new(SIZE));
    (WriteLog::new(memory.clone()), memory)
}

fn image(device: &Device) -> Vec<u8> {
    let mut out = vec![0u8; SIZE as usize];
    device.read(&mut out, 0).unwrap();
    out
}

fn with(mut base: Vec<u8>, offset: usize, data: &[u8]) -> Vec<u8> {
    base[offset..offset + data.len()].copy_from_slice(data);
    base
}

#[test]
fn passes_the_conformance_suite() {
    let memory = Device::from_device(MemoryDevice::new(16 << 20));
    conformance::run_all(&Device::from_device(WriteLog::new(memory)));
}

#[test]
fn a_flushed_write_must_survive_power_loss_and_a_later_one_may() {
    let (log, memory) = logged();
    let zero = vec![0u8; SIZE as usize];
    log.write_at(&[1; 4096], 0, WriteFlags::NONE).unwrap();
    let before_flush = log.position();
    log.flush().unwrap();
    log.write_at(&[2; 4096], 0, WriteFlags::NONE).unwrap();
    let at = log.position();
    // Either write may be there; nothing older than the flushed one.
    assert!(log
        .check(&zero, &image(&memory), at, Loss::Power, 8)
        .is_empty());
    let first = with(zero.clone(), 0, &[1; 4096]);
    assert!(log.check(&zero, &first, at, Loss::Power, 8).is_empty());
    let lost = log.check(&zero, &zero, at, Loss::Power, 8);
    assert_eq!(lost.len(), 8);
    assert_eq!((lost[0].offset, lost[0].found, lost[0].expected), (0, 0, 1));
    // Before the flush completed, losing it was allowed.
    assert!(log
        .check(&zero, &zero, before_flush, Loss::Power, 8)
        .is_empty());
}

#[test]
fn a_fua_write_is_durable_without_a_flush() {
    let (log, _) = logged();
    let zero = vec![0u8; SIZE as usize];
    log.write_at(&[7; 512], 4096, WriteFlags::FUA).unwrap();
    log.write_at(&[8; 512], 8192, WriteFlags::NONE).unwrap();
    let at = log.position();
    let violations = log.check(&zero, &zero, at, Loss::Power, 1000);
    assert_eq!(violations.len(), 512, "only the FUA write is owed");
    assert!(violations.iter().all(|v| (4096..4608).contains(&v.offset)));
}

#[test]
fn a_killed_process_owes_every_completed_write() {
    let (log, _) = logged();
    let zero = vec![0u8; SIZE as usize];
    log.write_at(&[3; 512], 0, WriteFlags::NONE).unwrap();
    let at = log.position();
    assert!(log.check(&zero, &zero, at, Loss::Power, 8).is_empty());
    assert_eq!(log.check(&zero, &zero, at, Loss::Process, 1000).len(), 512);
}

#[test]
fn trims_allow_anything_and_zeroing_allows_zeroes() {
    let (log, _) = logged();
    let zero = vec![0u8; SIZE as usize];
    log.write_at(&[5; 8192], 0, WriteFlags::FUA).unwrap();
    log.trim(0, 4096, WriteFlags::FUA).unwrap();
    log.write_zeroes(4096, 4096, ZeroFlags::default()).unwrap();
    log.flush().unwrap();
    let at = log.position();
    let garbage = with(zero.clone(), 0, &[0xee; 4096]);
    assert!(log.check(&zero, &garbage, at, Loss::Power, 8).is_empty());
    let stale = with(garbage.clone(), 4096, &[5; 4096]);
    assert_eq!(log.check(&zero, &stale, at, Loss::Power, 8).len(), 8);
}

#[test]
fn a_flush_covers_only_what_had_completed_when_it_was_issued() {
    let zero = vec![0u8; 4096];
    let write = |id, byte| Record::Issued {
        id,
        offset: 0,
        change: Change::Write(vec![byte; 4096].into()),
        fua: false,
    };
    // The write completes while the flush is in flight: not covered.
    let records = vec![
        write(0, 1),
        Record::Completed { id: 0 },
        write(1, 2),
        Record::Completed { id: 1 },
        Record::Flushed { covers: 2 },
    ];
    let first = vec![1u8; 4096];
    assert!(check_log(&records, &zero, &first, Loss::Power, 8).is_empty());
    assert_eq!(check_log(&records, &zero, &zero, Loss::Power, 8).len(), 8);
}

#[test]
fn writes_in_flight_together_may_land_in_either_order() {
    let zero = vec![0u8; 512];
    let records = vec![
        Record::Issued {
            id: 0,
            offset: 0,
            change: Change::Write(vec![1; 512].into()),
            fua: false,
        },
        Record::Issued {
            id: 1,
            offset: 0,
            change: Change::Write(vec![2; 512].into()),
            fua: true,
        },
        Record::Completed { id: 1 },
        Record::Completed { id: 0 },
    ];
    let ones = vec![1u8; 512];
    let twos = vec![2u8; 512];
    assert!(check_log(&records, &zero, &ones, Loss::Power, 8).is_empty());
    assert!(check_log(&records, &zero, &twos, Loss::Power, 8).is_empty());
    assert_eq!(check_log(&records, &zero, &zero, Loss::Power, 8).len(), 8);
}

/// Random writes with a flush every few, then a power loss: the medium must hold
/// what the log says is owed.
fn power_loss_violations(lies: bool) -> usize {
    let disk = Arc::new(if lies {
        VolatileCache::lying(SIZE)
    } else {
        VolatileCache::new(SIZE)
    });
    let log = WriteLog::new(Device::new(disk.clone()));
    let zero = vec![0u8; SIZE as usize];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for i in 0..200u64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let block = state % (SIZE / 4096);
        let flags = if i % 7 == 0 {
            WriteFlags::FUA
        } else {
            WriteFlags::NONE
        };
        log.write_at(&[(i % 251) as u8 + 1; 4096], block * 4096, flags)
            .unwrap();
        if i % 10 == 9 {
            log.flush().unwrap();
        }
    }
    let medium = disk.medium();
    log.check(&zero, &medium, log.position(), Loss::Power, usize::MAX)
        .len()
}

#[test]
fn an_honest_cache_passes_and_a_flush_that_lies_is_caught() {
    assert_eq!(power_loss_violations(false), 0);
    assert!(power_loss_violations(true) > 0);
}

/// A target may hand the device other pieces than the client wrote: two clients'
/// neighbouring writes gathered into one, or one write split in two. Durability is
/// judged byte by byte, by the latest change that reached each byte.
#[test]
fn durability_follows_bytes_through_gathered_and_split_writes() {
    let (log, _) = logged();
    let (a, b) = ([1u8; 512], [2u8; 512]);
    let mut gathered = a.to_vec();
    gathered.extend_from_slice(&b);
    log.write_at(&gathered, 0, WriteFlags::NONE).unwrap();
    assert!(!log.is_durable(0, &a), "not flushed yet");
    log.flush().unwrap();
    assert!(log.is_durable(0, &a) && log.is_durable(512, &b));
    assert!(!log.is_durable(0, &b), "other bytes than were written");

    // One client write of 1 KiB reaching the device as two halves, the second FUA
    // but the first never covered.
    let c = [3u8; 1024];
    log.write_at(&c[..512], 4096, WriteFlags::NONE).unwrap();
    log.write_at(&c[512..], 4608, WriteFlags::FUA).unwrap();
    assert!(log.is_durable(4608, &c[512..]));
    assert!(!log.is_durable(4096, &c), "half of it is not durable");
    log.flush().unwrap();
    assert!(log.is_durable(4096, &c));

    // A later trim of part of it: those bytes are no longer the write's.
    log.trim(4096, 512, WriteFlags::NONE).unwrap();
    log.flush().unwrap();
    assert!(!log.is_durable(4096, &c));
    assert!(log.is_durable(4608, &c[512..]));
}

/// An AoE initiator may send a frame again after its answer was late: the target
/// then writes the same bytes a second time, after the flush that made the first
/// durable. Those bytes are still durable; different bytes would not be.
#[test]
fn the_same_bytes_written_again_stay_durable() {
    let (log, _) = logged();
    let data = [9u8; 4096];
    log.write_at(&data, 0, WriteFlags::NONE).unwrap();
    log.flush().unwrap();
    log.write_at(&data, 0, WriteFlags::NONE).unwrap();
    assert!(log.is_durable(0, &data));
    log.write_at(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
    assert!(!log.is_durable(0, &data), "overwritten by other bytes");
}
