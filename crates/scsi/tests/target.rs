//! The SCSI target through its public interface, on a memory device: what an iSCSI
//! target sees.

use std::sync::Arc;

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_scsi::sense::{codes, Code, Sense};
use blockwire_scsi::{
    Command, DataDirection, LogicalUnit, LunConfig, Nexus, ResetKind, Response, ScsiTarget, Status,
};
use proptest::prelude::*;

const BLOCKS: u64 = 2048;
const BS: usize = 512;

fn nexus(name: &str) -> Nexus {
    Nexus {
        initiator_port: format!("iqn.test:{name},i,0x1"),
        transport_id: name.as_bytes().to_vec(),
        relative_target_port: 1,
    }
}

fn unit_on(device: Device) -> Arc<LogicalUnit> {
    Arc::new(LogicalUnit::new(device, LunConfig::default()).unwrap())
}

fn target() -> ScsiTarget {
    let mut target = ScsiTarget::new();
    target.add_lun(
        0,
        unit_on(Device::from_device(MemoryDevice::new(BLOCKS * BS as u64))),
    );
    target
}

fn run(target: &ScsiTarget, who: &Nexus, cdb: &[u8], data: &[u8]) -> Response {
    target.execute(
        0,
        &Command {
            nexus: who,
            cdb,
            data_out: data,
        },
    )
}

fn code(response: &Response) -> Option<Code> {
    response.sense_code()
}

fn rw10(opcode: u8, lba: u32, blocks: u16, flags: u8) -> [u8; 10] {
    let l = lba.to_be_bytes();
    let n = blocks.to_be_bytes();
    [opcode, flags, l[0], l[1], l[2], l[3], 0, n[0], n[1], 0]
}

fn rw16(opcode: u8, lba: u64, blocks: u32, flags: u8) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = opcode;
    cdb[1] = flags;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    cdb
}

fn write(target: &ScsiTarget, who: &Nexus, lba: u32, data: &[u8]) -> Response {
    run(
        target,
        who,
        &rw10(0x2a, lba, (data.len() / BS) as u16, 0),
        data,
    )
}

fn read(target: &ScsiTarget, who: &Nexus, lba: u32, blocks: u16) -> Response {
    run(target, who, &rw10(0x28, lba, blocks, 0), &[])
}

#[test]
fn write_read_round_trip_with_fua() {
    let t = target();
    let a = nexus("a");
    let data: Vec<u8> = (0..4 * BS).map(|i| (i % 251) as u8).collect();
    let w = run(&t, &a, &rw10(0x2a, 10, 4, 0x08), &data);
    assert_eq!(w.status, Status::Good);
    assert_eq!(w.expected_len, 4 * BS as u64);
    let r = run(&t, &a, &rw16(0x88, 10, 4, 0x10), &[]);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.data(), &data[..]);
    assert_eq!(r.expected_len, 4 * BS as u64);
    // READ(6) and READ(12) see the same bytes.
    let r6 = run(&t, &a, &[0x08, 0, 0, 10, 1, 0], &[]);
    assert_eq!(r6.data(), &data[..BS]);
    let r12 = run(&t, &a, &[0xa8, 0, 0, 0, 0, 11, 0, 0, 0, 1, 0, 0], &[]);
    assert_eq!(r12.data(), &data[BS..2 * BS]);
}

#[test]
fn out_of_range_and_zero_blocks() {
    let t = target();
    let a = nexus("a");
    assert_eq!(
        code(&read(&t, &a, BLOCKS as u32, 1)),
        Some(codes::LBA_OUT_OF_RANGE)
    );
    assert_eq!(
        code(&read(&t, &a, BLOCKS as u32 - 1, 2)),
        Some(codes::LBA_OUT_OF_RANGE)
    );
    assert_eq!(
        code(&read(&t, &a, u32::MAX, 1)),
        Some(codes::LBA_OUT_OF_RANGE)
    );
    assert_eq!(read(&t, &a, 0, 0).status, Status::Good);
    assert_eq!(
        code(&read(&t, &a, BLOCKS as u32 + 1, 0)),
        Some(codes::LBA_OUT_OF_RANGE)
    );
    let r16 = run(&t, &a, &rw16(0x88, u64::MAX, 1, 0), &[]);
    assert_eq!(code(&r16), Some(codes::LBA_OUT_OF_RANGE));
}

#[test]
fn write_residuals() {
    let t = target();
    let a = nexus("a");
    write(&t, &a, 0, &[b'a'; 2 * BS]);
    // Two blocks asked, one sent: the one block is written.
    let r = run(&t, &a, &rw10(0x2a, 0, 2, 0), &[b'b'; BS]);
    assert_eq!(r.status, Status::Good);
    assert_eq!(r.expected_len, 2 * BS as u64);
    let back = read(&t, &a, 0, 2);
    assert!(back.data()[..BS].iter().all(|&b| b == b'b'));
    assert!(back.data()[BS..].iter().all(|&b| b == b'a'));
    // A cut block: the bytes sent are written, the rest of the block stays.
    let r = run(&t, &a, &rw10(0x2a, 0, 1, 0), &[b'c'; 200]);
    assert_eq!(r.status, Status::Good);
    let back = read(&t, &a, 0, 1);
    assert!(back.data()[..200].iter().all(|&b| b == b'c'));
    assert!(back.data()[200..].iter().all(|&b| b == b'b'));
    write(&t, &a, 0, &[b'b'; BS]);
    // More than asked: only what the CDB names is written.
    let r = run(&t, &a, &rw10(0x2a, 0, 1, 0), &[b'd'; 10000]);
    assert_eq!(r.status, Status::Good);
    assert!(read(&t, &a, 1, 1).data().iter().all(|&b| b == b'a'));
    // Nothing sent for a one-block write: GOOD, nothing written.
    assert_eq!(run(&t, &a, &rw10(0x2e, 1, 1, 0), &[]).status, Status::Good);
}

#[test]
fn read_only_lun_refuses_writes() {
    let mut t = ScsiTarget::new();
    let device = Device::from_device(MemoryDevice::new(BLOCKS * BS as u64)).read_only();
    t.add_lun(0, unit_on(device));
    let a = nexus("a");
    assert_eq!(
        code(&write(&t, &a, 0, &[1; BS])),
        Some(codes::WRITE_PROTECTED)
    );
    let ws = run(&t, &a, &rw16(0x93, 0, 1, 0), &[0; BS]);
    assert_eq!(code(&ws), Some(codes::WRITE_PROTECTED));
    assert_eq!(read(&t, &a, 0, 1).status, Status::Good);
    let ms = run(&t, &a, &[0x1a, 0x08, 0x3f, 0, 255, 0], &[]);
    assert_eq!(ms.data()[2] & 0x80, 0x80, "WP bit");
}

fn caw(t: &ScsiTarget, who: &Nexus, lba: u64, compare: &[u8], write: &[u8]) -> Response {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = (compare.len() / BS) as u8;
    let mut data = compare.to_vec();
    data.extend_from_slice(write);
    run(t, who, &cdb, &data)
}

#[test]
fn compare_and_write_miscompare_reports_the_offset() {
    let t = target();
    let a = nexus("a");
    write(&t, &a, 5, &[b'A'; BS]);
    assert_eq!(
        caw(&t, &a, 5, &[b'A'; BS], &[b'B'; BS]).status,
        Status::Good
    );
    let mut compare = [b'B'; BS];
    compare[77] = b'Z';
    let r = caw(&t, &a, 5, &compare, &[b'C'; BS]);
    assert_eq!(code(&r), Some(codes::MISCOMPARE_DURING_VERIFY));
    assert_eq!(Sense::parse_information(&r.sense), Some(77));
    assert!(read(&t, &a, 5, 1).data().iter().all(|&b| b == b'B'));
    // Data-out of the wrong size is refused.
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[13] = 1;
    assert_eq!(
        code(&run(&t, &a, &cdb, &[0; BS])),
        Some(codes::INVALID_FIELD_IN_INFORMATION_UNIT)
    );
}

#[test]
fn compare_and_write_is_atomic_under_concurrency() {
    // Many threads increment a counter in block 0 with COMPARE AND WRITE while
    // others write block 0's neighbour; no increment may be lost.
    let t = Arc::new(target());
    let threads = 4;
    let per_thread = 50;
    write(&t, &nexus("x"), 0, &[0; BS]);
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let t = t.clone();
            std::thread::spawn(move || {
                let who = nexus(&format!("n{i}"));
                let mut done = 0;
                while done < per_thread {
                    let current = read(&t, &who, 0, 1).data().to_vec();
                    let value = u64::from_be_bytes(current[..8].try_into().unwrap());
                    let mut next = current.clone();
                    next[..8].copy_from_slice(&(value + 1).to_be_bytes());
                    if caw(&t, &who, 0, &current, &next).status == Status::Good {
                        done += 1;
                    }
                    write(&t, &who, 1, &[i as u8; BS]);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let end = read(&t, &nexus("x"), 0, 1);
    let value = u64::from_be_bytes(end.data()[..8].try_into().unwrap());
    assert_eq!(value, (threads * per_thread) as u64);
}

#[test]
fn or_write_ors_and_write_same_unmap_ignores_the_pattern() {
    let t = target();
    let a = nexus("a");
    write(&t, &a, 0, &[0x0f; BS]);
    let or = run(&t, &a, &rw16(0x8b, 0, 1, 0), &[0xa0; BS]);
    assert_eq!(or.status, Status::Good, "{:?}", or);
    assert!(read(&t, &a, 0, 1).data().iter().all(|&b| b == 0xaf));
    // WRITE SAME with UNMAP deallocates whatever the block holds (LBPRZ: zeroes).
    let ws = run(&t, &a, &rw10(0x41, 0, 1, 0x08), &[0xff; BS]);
    assert_eq!(ws.status, Status::Good);
    assert!(read(&t, &a, 0, 1).data().iter().all(|&b| b == 0));
}

#[test]
fn compare_and_write_with_zero_blocks() {
    let t = target();
    let a = nexus("a");
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    assert_eq!(run(&t, &a, &cdb, &[]).status, Status::Good);
    assert!(matches!(code(&run(&t, &a, &cdb, &[0; 2 * BS])), Some(c) if c.asc == 0x24));
}

fn xcopy_params(targets: &[u64], segments: &[(u16, u16, u16, u64, u64)]) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    out[0] = 1;
    out[2..4].copy_from_slice(&((32 * targets.len()) as u16).to_be_bytes());
    out[8..12].copy_from_slice(&((28 * segments.len()) as u32).to_be_bytes());
    for &id in targets {
        let mut d = [0u8; 32];
        d[0] = 0xe4;
        d[4] = 1;
        d[5] = 3;
        d[7] = 8;
        d[8..16].copy_from_slice(&blockwire_scsi::vpd::naa(id));
        d[30] = 0x02;
        out.extend_from_slice(&d);
    }
    for &(src, dst, blocks, from, to) in segments {
        let mut d = [0u8; 28];
        d[0] = 0x02;
        d[3] = 0x18;
        d[4..6].copy_from_slice(&src.to_be_bytes());
        d[6..8].copy_from_slice(&dst.to_be_bytes());
        d[10..12].copy_from_slice(&blocks.to_be_bytes());
        d[12..20].copy_from_slice(&from.to_be_bytes());
        d[20..28].copy_from_slice(&to.to_be_bytes());
        out.extend_from_slice(&d);
    }
    out
}

fn xcopy_cdb(len: usize) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    cdb
}

#[test]
fn extended_copy_within_and_between_luns() {
    let mut t = ScsiTarget::new();
    for id in [10u64, 11] {
        let config = LunConfig {
            unique_id: id,
            ..LunConfig::default()
        };
        let device = Device::from_device(MemoryDevice::new(BLOCKS * BS as u64));
        t.add_lun(id - 10, Arc::new(LogicalUnit::new(device, config).unwrap()));
    }
    let a = nexus("a");
    let data: Vec<u8> = (0..8 * BS).map(|i| (i / 7) as u8).collect();
    write(&t, &a, 0, &data);
    // Within LUN 0: blocks 0..8 to 100..108.
    let params = xcopy_params(&[10], &[(0, 0, 8, 0, 100)]);
    let r = run(&t, &a, &xcopy_cdb(params.len()), &params);
    assert_eq!(r.status, Status::Good, "{r:?}");
    assert_eq!(read(&t, &a, 100, 8).data(), &data[..]);
    // From LUN 0 to LUN 1.
    let params = xcopy_params(&[10, 11], &[(0, 1, 8, 0, 5)]);
    assert_eq!(
        run(&t, &a, &xcopy_cdb(params.len()), &params).status,
        Status::Good
    );
    let on_lun1 = t.execute(
        1,
        &Command {
            nexus: &a,
            cdb: &rw10(0x28, 5, 8, 0),
            data_out: &[],
        },
    );
    assert_eq!(on_lun1.data(), &data[..]);
    // Unknown designator, bad index, beyond the end: COPY ABORTED, nothing copied.
    for params in [
        xcopy_params(&[99], &[(0, 0, 1, 0, 1)]),
        xcopy_params(&[10], &[(0, 1, 1, 0, 1)]),
        xcopy_params(&[10], &[(0, 0, 8, 0, 200), (0, 0, 8, 0, BLOCKS - 1)]),
    ] {
        let r = run(&t, &a, &xcopy_cdb(params.len()), &params);
        assert_eq!(code(&r).map(|c| c.key), Some(0x0a), "{r:?}");
    }
    assert!(read(&t, &a, 200, 8).data().iter().all(|&b| b == 0));
    // An empty parameter list is fine; the operating parameters are reported.
    assert_eq!(run(&t, &a, &xcopy_cdb(0), &[]).status, Status::Good);
    let mut rcr = [0u8; 16];
    rcr[0] = 0x84;
    rcr[1] = 0x03;
    rcr[13] = 255;
    let op = run(&t, &a, &rcr, &[]);
    assert_eq!(op.status, Status::Good);
    assert_eq!(&op.data()[44..46], &[0x02, 0xe4]);
    // COPY STATUS of list 1: the last copy that ran (refused ones never start).
    rcr[1] = 0x00;
    rcr[2] = 1;
    let status = run(&t, &a, &rcr, &[]);
    assert_eq!(status.status, Status::Good);
    assert_eq!(&status.data()[4..12], &[0x00, 0, 1, 0, 0, 0, 0x10, 0x00]);
    rcr[2] = 2;
    assert!(matches!(code(&run(&t, &a, &rcr, &[])), Some(c) if c.asc == 0x24));
}

#[test]
fn verify_bytchk() {
    let t = target();
    let a = nexus("a");
    let data: Vec<u8> = (0..2 * BS).map(|i| i as u8).collect();
    write(&t, &a, 3, &data);
    let verify =
        |bytchk: u8, blocks: u16, out: &[u8]| run(&t, &a, &rw10(0x2f, 3, blocks, bytchk << 1), out);
    assert_eq!(verify(1, 2, &data).status, Status::Good);
    let mut bad = data.clone();
    bad[BS + 9] ^= 1;
    let r = verify(1, 2, &bad);
    assert_eq!(code(&r), Some(codes::MISCOMPARE_DURING_VERIFY));
    assert_eq!(Sense::parse_information(&r.sense), Some(BS as u64 + 9));
    assert_eq!(verify(0, 2, &[]).status, Status::Good);
    assert!(matches!(code(&verify(2, 2, &data)), Some(c) if c.asc == 0x24));
    write(&t, &a, 3, &[7; 2 * BS]);
    assert_eq!(verify(3, 2, &[7; BS]).status, Status::Good);
    assert_eq!(
        code(&verify(3, 2, &[8; BS])),
        Some(codes::MISCOMPARE_DURING_VERIFY)
    );
}

#[test]
fn write_same_unmap_and_lba_status() {
    let t = target();
    let a = nexus("a");
    // Replicate a pattern over 300 blocks.
    let mut pattern = [0u8; BS];
    pattern[0] = 0x5a;
    let ws = run(&t, &a, &rw16(0x93, 100, 300, 0), &pattern);
    assert_eq!(ws.status, Status::Good);
    let back = read(&t, &a, 100, 300);
    assert!(back.data().chunks(BS).all(|block| block == pattern));
    // WRITE SAME(10) with UNMAP and a zero block deallocates: reads zero.
    let ws10 = run(&t, &a, &rw10(0x41, 128, 256, 0x08), &[0; BS]);
    assert_eq!(ws10.status, Status::Good);
    assert!(read(&t, &a, 128, 256).data().iter().all(|&b| b == 0));
    // Wrong data-out size.
    assert!(run(&t, &a, &rw10(0x41, 0, 1, 0), &[0; BS / 2]).status == Status::CheckCondition);
    // NUMBER OF BLOCKS 0: to the end of the medium.
    assert_eq!(
        run(&t, &a, &rw10(0x41, BLOCKS as u32 - 3, 0, 0), &pattern).status,
        Status::Good
    );
    assert!(read(&t, &a, BLOCKS as u32 - 3, 3)
        .data()
        .chunks(BS)
        .all(|b| b == pattern));
    // ANCHOR is not supported.
    assert!(
        matches!(code(&run(&t, &a, &rw10(0x41, 0, 1, 0x18), &[0; BS])), Some(c) if c.asc == 0x24)
    );

    // UNMAP a whole 64 KiB chunk (the memory device's allocation unit).
    write(&t, &a, 512, &[9; 129 * BS]);
    let mut params = vec![0u8; 24];
    params[1] = 22;
    params[3] = 16;
    params[8..16].copy_from_slice(&512u64.to_be_bytes());
    params[16..20].copy_from_slice(&128u32.to_be_bytes());
    let unmap = run(&t, &a, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &params);
    assert_eq!(unmap.status, Status::Good);
    assert!(read(&t, &a, 512, 128).data().iter().all(|&b| b == 0));
    let mut status = [0u8; 16];
    status[0] = 0x9e;
    status[1] = 0x12;
    status[2..10].copy_from_slice(&512u64.to_be_bytes());
    status[13] = 64;
    let lbas = run(&t, &a, &status, &[]);
    assert_eq!(lbas.status, Status::Good);
    let d = lbas.data();
    assert_eq!(&d[8..16], &512u64.to_be_bytes());
    assert_eq!(&d[16..20], &128u32.to_be_bytes());
    assert_eq!(d[20], 1, "deallocated");
    assert_eq!(d[36], 0, "then mapped");
    // Out of range descriptor, beyond-the-end GET LBA STATUS.
    params[8..16].copy_from_slice(&BLOCKS.to_be_bytes());
    let bad = run(&t, &a, &[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0], &params);
    assert_eq!(code(&bad), Some(codes::LBA_OUT_OF_RANGE));
    status[2..10].copy_from_slice(&BLOCKS.to_be_bytes());
    assert_eq!(
        code(&run(&t, &a, &status, &[])),
        Some(codes::LBA_OUT_OF_RANGE)
    );
    // A short parameter list.
    let short = run(&t, &a, &[0x42, 0, 0, 0, 0, 0, 0, 0, 4, 0], &params[..4]);
    assert_eq!(code(&short), Some(codes::PARAMETER_LIST_LENGTH_ERROR));
}

#[test]
fn capacity_inquiry_and_vpd() {
    let t = target();
    let a = nexus("a");
    let rc10 = run(&t, &a, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(rc10.data(), &[0, 0, 0x07, 0xff, 0, 0, 2, 0]);
    let mut rc16 = [0u8; 16];
    rc16[0] = 0x9e;
    rc16[1] = 0x10;
    rc16[13] = 32;
    let data = run(&t, &a, &rc16, &[]);
    assert_eq!(
        &data.data()[..12],
        &[0, 0, 0, 0, 0, 0, 0x07, 0xff, 0, 0, 2, 0]
    );
    assert_eq!(data.data()[14] & 0xc0, 0xc0, "LBPME and LBPRZ");
    let inq = run(&t, &a, &[0x12, 0, 0, 0, 36, 0], &[]);
    assert_eq!(inq.data().len(), 36);
    assert_eq!(inq.expected_len, 36);
    let pages = run(&t, &a, &[0x12, 1, 0, 0, 255, 0], &[]);
    assert_eq!(&pages.data()[4..], &[0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2]);
    let bad = run(&t, &a, &[0x12, 1, 0x99, 0, 255, 0], &[]);
    assert!(matches!(code(&bad), Some(c) if c.asc == 0x24));
    let unknown = run(&t, &a, &[0xc5, 0, 0, 0, 0, 0], &[]);
    assert_eq!(code(&unknown), Some(codes::INVALID_COMMAND_OPERATION_CODE));
}

#[test]
fn report_luns_and_absent_luns() {
    let t = target();
    let a = nexus("a");
    let cdb = [0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0];
    let r = t.execute(
        7,
        &Command {
            nexus: &a,
            cdb: &cdb,
            data_out: &[],
        },
    );
    assert_eq!(r.data(), &[0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let inq = t.execute(
        7,
        &Command {
            nexus: &a,
            cdb: &[0x12, 0, 0, 0, 96, 0],
            data_out: &[],
        },
    );
    assert_eq!(inq.data()[0], 0x7f);
    let tur = t.execute(
        7,
        &Command {
            nexus: &a,
            cdb: &[0, 0, 0, 0, 0, 0],
            data_out: &[],
        },
    );
    assert_eq!(code(&tur), Some(codes::LOGICAL_UNIT_NOT_SUPPORTED));
    assert_eq!(t.luns(), vec![0]);
}

#[test]
fn transfer_info() {
    let t = target();
    let info = t.transfer_info(0, &rw10(0x2a, 0, 8, 0));
    assert_eq!(info.direction, DataDirection::Out);
    assert_eq!(info.len, 8 * BS as u64);
    assert_eq!(
        t.transfer_info(0, &rw10(0x28, 0, 2, 0)).direction,
        DataDirection::In
    );
    assert_eq!(
        t.transfer_info(0, &[0, 0, 0, 0, 0, 0]).direction,
        DataDirection::None
    );
    assert_eq!(
        t.transfer_info(0, &[0xc5; 6]).direction,
        DataDirection::None
    );
}

fn pr_out(t: &ScsiTarget, who: &Nexus, action: u8, kind: u8, key: u64, sa_key: u64) -> Response {
    let mut params = [0u8; 24];
    params[..8].copy_from_slice(&key.to_be_bytes());
    params[8..16].copy_from_slice(&sa_key.to_be_bytes());
    run(t, who, &[0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0], &params)
}

#[test]
fn persistent_reservations_block_and_raise_unit_attentions() {
    let t = target();
    let (a, b) = (nexus("a"), nexus("b"));
    assert_eq!(pr_out(&t, &a, 6, 0, 0, 0xa).status, Status::Good);
    assert_eq!(pr_out(&t, &b, 6, 0, 0, 0xb).status, Status::Good);
    // Exclusive access, registrants only.
    assert_eq!(pr_out(&t, &a, 1, 6, 0xa, 0).status, Status::Good);
    assert_eq!(read(&t, &b, 0, 1).status, Status::Good);
    let c = nexus("c");
    assert_eq!(read(&t, &c, 0, 1).status, Status::ReservationConflict);
    assert_eq!(
        write(&t, &c, 0, &[0; BS]).status,
        Status::ReservationConflict
    );
    // INQUIRY and PR IN are never blocked.
    assert_eq!(
        run(&t, &c, &[0x12, 0, 0, 0, 36, 0], &[]).status,
        Status::Good
    );
    let keys = run(&t, &c, &[0x5e, 0, 0, 0, 0, 0, 0, 0x40, 0, 0], &[]);
    assert_eq!(&keys.data()[4..8], &[0, 0, 0, 16]);
    // Releasing a registrants-only reservation tells the other registrant.
    assert_eq!(pr_out(&t, &a, 2, 6, 0xa, 0).status, Status::Good);
    let ua = run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(code(&ua), Some(codes::RESERVATIONS_RELEASED));
    assert_eq!(run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]).status, Status::Good);
    // PREEMPT removes a's registration and tells it.
    assert_eq!(pr_out(&t, &b, 4, 3, 0xb, 0xa).status, Status::Good);
    let ua = run(&t, &a, &[0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(code(&ua), Some(codes::REGISTRATIONS_PREEMPTED));
    // An unregistered nexus cannot reserve.
    assert_eq!(
        pr_out(&t, &a, 1, 1, 0xa, 0).status,
        Status::ReservationConflict
    );
}

#[test]
fn reserve6_released_by_nexus_loss_and_reset() {
    let t = target();
    let (a, b) = (nexus("a"), nexus("b"));
    let reserve = [0x16, 0, 0, 0, 0, 0];
    let release = [0x17, 0, 0, 0, 0, 0];
    assert_eq!(run(&t, &a, &reserve, &[]).status, Status::Good);
    assert_eq!(
        run(&t, &b, &reserve, &[]).status,
        Status::ReservationConflict
    );
    assert_eq!(run(&t, &b, &release, &[]).status, Status::Good);
    let ms = [0x1a, 0, 0x3f, 0, 255, 0];
    assert_eq!(run(&t, &a, &ms, &[]).status, Status::Good);
    assert_eq!(run(&t, &b, &ms, &[]).status, Status::ReservationConflict);
    t.nexus_lost(&a);
    assert_eq!(run(&t, &b, &reserve, &[]).status, Status::Good);
    // a forms a new nexus; the reset then reaches it.
    assert_eq!(
        run(&t, &a, &reserve, &[]).status,
        Status::ReservationConflict
    );
    t.reset(ResetKind::LogicalUnit(0), &a);
    // The reset shows as a unit attention first, then the reservation is gone.
    assert_eq!(
        run(&t, &a, &reserve, &[]).sense_code(),
        Some(codes::BUS_DEVICE_RESET)
    );
    assert_eq!(run(&t, &a, &reserve, &[]).status, Status::Good);
    // REQUEST SENSE reports a pending unit attention as data.
    t.reset(ResetKind::TargetWarm, &a);
    let sense = run(&t, &a, &[0x03, 0, 0, 0, 252, 0], &[]);
    assert_eq!(sense.status, Status::Good);
    assert_eq!(
        Sense::parse_code(sense.data()),
        Some(codes::POWER_ON_OR_RESET)
    );
}

#[test]
fn mode_select_d_sense_and_swp() {
    let t = target();
    let a = nexus("a");
    let ms = run(&t, &a, &[0x1a, 0x08, 0x0a, 0, 255, 0], &[]);
    let mut params = vec![0u8; 4];
    params.extend_from_slice(&ms.data()[4..]);
    params[4 + 2] |= 0x04; // D_SENSE
    let sel = run(&t, &a, &[0x15, 0x10, 0, 0, params.len() as u8, 0], &params);
    assert_eq!(sel.status, Status::Good);
    let oob = read(&t, &a, BLOCKS as u32, 1);
    assert_eq!(oob.sense[0], 0x72);
    // Another nexus that had been talking to the LU hears of the change once.
    let b = nexus("b");
    assert_eq!(run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]).status, Status::Good);
    params[4 + 2] |= 0x04;
    assert_eq!(
        run(&t, &a, &[0x15, 0x10, 0, 0, params.len() as u8, 0], &params).status,
        Status::Good
    );
    assert_eq!(
        run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]).status,
        Status::Good,
        "no change, no attention"
    );
    params[4 + 2] &= !0x04;
    assert_eq!(
        run(&t, &a, &[0x15, 0x10, 0, 0, params.len() as u8, 0], &params).status,
        Status::Good
    );
    assert_eq!(
        run(&t, &b, &[0, 0, 0, 0, 0, 0], &[]).sense_code(),
        Some(codes::MODE_PARAMETERS_CHANGED)
    );
    assert_eq!(run(&t, &a, &[0, 0, 0, 0, 0, 0], &[]).status, Status::Good);
    params[4 + 2] |= 0x04;
    assert_eq!(
        run(&t, &a, &[0x15, 0x10, 0, 0, params.len() as u8, 0], &params).status,
        Status::Good
    );
    assert_eq!(oob.sense_code(), Some(codes::LBA_OUT_OF_RANGE));
    params[4 + 2] &= !0x04;
    params[4 + 4] |= 0x08; // SWP
    assert_eq!(
        run(&t, &a, &[0x15, 0x10, 0, 0, params.len() as u8, 0], &params).status,
        Status::Good
    );
    assert_eq!(code(&write(&t, &a, 0, &[0; BS])).map(|c| c.asc), Some(0x27));
    // A cut parameter list.
    let cut = run(
        &t,
        &a,
        &[0x15, 0x10, 0, 0, params.len() as u8, 0],
        &params[..6],
    );
    assert_eq!(code(&cut), Some(codes::PARAMETER_LIST_LENGTH_ERROR));
}

#[test]
fn report_supported_opcodes() {
    let t = target();
    let a = nexus("a");
    let all = run(
        &t,
        &a,
        &[0xa3, 0x0c, 0x80, 0, 0, 0, 0, 0, 0x40, 0, 0, 0],
        &[],
    );
    assert_eq!(all.status, Status::Good);
    let one = run(
        &t,
        &a,
        &[0xa3, 0x0c, 0x01, 0x2f, 0, 0, 0, 0, 1, 0, 0, 0],
        &[],
    );
    assert_eq!(one.data()[1] & 0x07, 0x03);
    assert_eq!(one.data()[5] & 0x10, 0x10, "DPO in the usage data");
}

#[test]
fn block_size_4096_and_refusals() {
    let device = Device::from_device(MemoryDevice::new(1 << 20));
    let config = LunConfig {
        block_size: 4096,
        ..LunConfig::default()
    };
    let unit = LogicalUnit::new(device.clone(), config.clone()).unwrap();
    assert_eq!(unit.num_blocks(), 256);
    for bad in [0, 1000, 256, 1 << 20] {
        let config = LunConfig {
            block_size: bad,
            ..config.clone()
        };
        assert!(LogicalUnit::new(device.clone(), config).is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn execute_never_panics(cdb in proptest::collection::vec(any::<u8>(), 0..20),
                            data in proptest::collection::vec(any::<u8>(), 0..2048),
                            lun in 0u64..2) {
        let t = target();
        let a = nexus("p");
        let _ = t.transfer_info(lun, &cdb);
        let r = t.execute(lun, &Command { nexus: &a, cdb: &cdb, data_out: &data });
        if r.status == Status::CheckCondition {
            prop_assert!(r.sense_code().is_some());
        }
    }

    #[test]
    fn known_opcodes_with_random_fields_never_panic(
        opcode in proptest::sample::select(vec![
            0x00u8, 0x03, 0x08, 0x0a, 0x12, 0x15, 0x16, 0x17, 0x1a, 0x1b, 0x1e, 0x25, 0x28,
            0x2a, 0x2e, 0x2f, 0x34, 0x35, 0x37, 0x41, 0x42, 0x55, 0x56, 0x57, 0x5a, 0x5e,
            0x5f, 0x83, 0x84, 0x88, 0x89, 0x8a, 0x8b, 0x8e, 0x8f, 0x90, 0x91, 0x93, 0x9e, 0xa0, 0xa3, 0xa8,
            0xaa, 0xae, 0xaf, 0xb7]),
        rest in proptest::collection::vec(any::<u8>(), 15),
        data in proptest::collection::vec(any::<u8>(), 0..1100)) {
        let t = target();
        let a = nexus("p");
        let mut cdb = vec![opcode];
        cdb.extend_from_slice(&rest);
        // Keep transfers small so the case stays fast.
        if matches!(opcode, 0x88 | 0x8a | 0x8b | 0x8e | 0x8f | 0x93 | 0x90 | 0x91) {
            cdb[10] = 0; cdb[11] = 0; cdb[12] = 0;
        }
        if matches!(opcode, 0xa8 | 0xaa | 0xae | 0xaf) {
            cdb[6] = 0; cdb[7] = 0; cdb[8] = 0;
        }
        let _ = t.execute(0, &Command { nexus: &a, cdb: &cdb, data_out: &data });
    }
}

/// A memory device that prefers whole 4 MiB objects, as an RBD image does.
struct Objects(MemoryDevice);

impl blockwire_blockdev::BlockDevice for Objects {
    fn info(&self) -> blockwire_blockdev::DeviceInfo {
        let mut info = self.0.info();
        info.block_sizes.minimum = 512;
        info.block_sizes.preferred = 4 << 20;
        info
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> blockwire_blockdev::Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(
        &self,
        buf: &[u8],
        offset: u64,
        flags: blockwire_blockdev::WriteFlags,
    ) -> blockwire_blockdev::Result<()> {
        self.0.write_at(buf, offset, flags)
    }
}

#[test]
fn block_limits_advertise_the_preferred_size_in_full() {
    let mut t = ScsiTarget::new();
    t.add_lun(
        0,
        unit_on(Device::from_device(Objects(MemoryDevice::new(64 << 20)))),
    );
    let page = run(&t, &nexus("a"), &[0x12, 1, 0xb0, 0, 0x40, 0], &[]);
    let data = page.data();
    assert_eq!(data[1], 0xb0);
    // 4 MiB in 512-byte blocks: 8192, not a granularity capped at 16 blocks.
    let granularity = u16::from_be_bytes([data[6], data[7]]);
    let optimal = u32::from_be_bytes([data[12], data[13], data[14], data[15]]);
    assert_eq!(granularity, 8192);
    assert_eq!(optimal, 8192);
    let maximum = u32::from_be_bytes([data[8], data[9], data[10], data[11]]);
    assert!(optimal <= maximum, "optimal {optimal} > maximum {maximum}");
}

/// A WRITE planned for a device's queue: only a plain, whole, unobstructed WRITE
/// is planned, and while it is in flight COMPARE AND WRITE waits for it.
#[test]
fn a_queued_write_is_planned_only_when_plain_and_holds_off_compare_and_write() {
    let t = Arc::new(target());
    let a = nexus("a");
    let plan = |cdb: &[u8], data: &[u8]| {
        t.plan_write(
            0,
            &Command {
                nexus: &a,
                cdb,
                data_out: data,
            },
        )
    };
    assert!(plan(&rw10(0x28, 0, 1, 0), &[0; BS]).is_none(), "a READ");
    assert!(
        plan(&rw10(0x2a, 0, 2, 0), &[0; BS]).is_none(),
        "half the data-out"
    );
    assert!(plan(&rw10(0x2a, 0, 0, 0), &[]).is_none(), "no blocks");
    assert!(
        plan(&rw10(0x2a, BLOCKS as u32, 1, 0), &[0; BS]).is_none(),
        "past the end"
    );
    assert!(plan(&rw16(0x8b, 0, 1, 0), &[0; BS]).is_none(), "ORWRITE");
    let queued = plan(&rw10(0x2a, 3, 2, 0), &[7; 2 * BS]).expect("a plain WRITE");
    assert_eq!((queued.offset, queued.len), (3 * BS as u64, 2 * BS));

    // COMPARE AND WRITE on another thread waits for the queued write to finish.
    let (t2, done) = (
        t.clone(),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let finished = done.clone();
    let caw_thread = std::thread::spawn(move || {
        let status = caw(&t2, &nexus("b"), 0, &[0; BS], &[9; BS]).status;
        finished.store(true, std::sync::atomic::Ordering::SeqCst);
        status
    });
    std::thread::sleep(std::time::Duration::from_millis(150));
    assert!(
        !done.load(std::sync::atomic::Ordering::SeqCst),
        "COMPARE AND WRITE ran while a queued write was in flight"
    );
    let response = t.finish_write(0, queued, Ok(()));
    assert_eq!(response.status, Status::Good);
    assert_eq!(caw_thread.join().unwrap(), Status::Good);

    // A read-only unit is never planned for writes.
    let mut read_only = ScsiTarget::new();
    let device = Device::from_device(MemoryDevice::new(BLOCKS * BS as u64)).read_only();
    read_only.add_lun(0, unit_on(device));
    let refused = read_only.plan_write(
        0,
        &Command {
            nexus: &a,
            cdb: &rw10(0x2a, 0, 1, 0),
            data_out: &[0; BS],
        },
    );
    assert!(refused.is_none());
}
