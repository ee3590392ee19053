//! One conformance suite that every device must pass: backends, composers and, through
//! a loopback to our own targets, initiators. Each case panics with a message naming
//! the case and what differed, so it can be called from any `#[test]`.
//!
//! Needs a writable device of at least 4 MiB whose current contents do not matter.

use std::sync::Arc;
use std::thread;

use crate::device::{WriteFlags, ZeroFlags};
use crate::error::ErrorKind;
use crate::handle::Device;

/// A deterministic, position-dependent pattern, so misplaced data is detected.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = (offset + i)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(seed.wrapping_mul(0xD1B5_4A32_D192_ED03));
            (x >> 56) as u8 ^ (x >> 13) as u8
        })
        .collect()
}

fn read_back(device: &Device, offset: u64, len: usize, case: &str) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    device
        .read(&mut buf, offset)
        .unwrap_or_else(|e| panic!("{case}: read {len} bytes at {offset}: {e}"));
    buf
}

fn assert_zero(device: &Device, offset: u64, len: usize, case: &str) {
    let data = read_back(device, offset, len, case);
    if let Some(pos) = data.iter().position(|&b| b != 0) {
        panic!(
            "{case}: byte {} reads {:#x}, expected zero",
            offset + pos as u64,
            data[pos]
        );
    }
}

fn write_pattern(device: &Device, seed: u64, offset: u64, len: usize, case: &str) -> Vec<u8> {
    let data = pattern(seed, offset, len);
    device
        .write(&data, offset, WriteFlags::NONE)
        .unwrap_or_else(|e| panic!("{case}: write {len} bytes at {offset}: {e}"));
    data
}

fn block(device: &Device) -> u64 {
    u64::from(device.info().block_sizes.minimum.max(512))
}

/// What a device promises beyond correctness, where devices differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// A range made zero is reported as zero by block status. Always safe to leave
    /// false (data is a correct answer); a stripe whose chunks are smaller than its
    /// members' allocation unit answers data for zeroes inside that unit.
    pub zeroed_reported_as_zero: bool,
}

impl Default for Expect {
    fn default() -> Self {
        Expect {
            zeroed_reported_as_zero: true,
        }
    }
}

/// Runs every case on a writable device.
pub fn run_all(device: &Device) {
    run_all_expecting(device, Expect::default());
}

/// Runs every case on a writable device that promises what `expect` says.
pub fn run_all_expecting(device: &Device, expect: Expect) {
    assert!(!device.info().read_only, "conformance: device is read-only");
    assert!(
        device.size() >= 4 << 20,
        "conformance: device smaller than 4 MiB"
    );
    write_read_verify(device);
    straddling(device);
    boundaries(device);
    beyond_end(device);
    misaligned(device);
    fua_and_flush(device);
    trim(device);
    write_zeroes(device);
    extents_expecting(device, expect);
    concurrent_writers(device);
}

/// Patterns of several sizes at several offsets read back exactly.
pub fn write_read_verify(device: &Device) {
    let bs = block(device);
    let max = u64::from(device.info().block_sizes.maximum);
    for (i, (offset, len)) in [
        (0, bs),
        (bs, 8 * bs),
        (64 * 1024, 64 * 1024),
        (bs * 3, 1 << 20),
    ]
    .into_iter()
    .enumerate()
    {
        let case = "write_read_verify";
        let data = write_pattern(device, i as u64, offset, len as usize, case);
        assert!(
            read_back(device, offset, len as usize, case) == data,
            "{case}: data differs at {offset}+{len}"
        );
    }
    // One request larger than the device's maximum transfer is split by the handle.
    let len = (max + 2 * bs).min(device.size() / 2 / bs * bs);
    let data = write_pattern(device, 99, 0, len as usize, "split");
    assert!(
        read_back(device, 0, len as usize, "split") == data,
        "split: data differs"
    );
}

/// Writes that straddle the boundaries composers split at (4 KiB to 2 MiB: a
/// stripe's chunks, an inner device's blocks) land exactly where they were aimed,
/// and leave their neighbours alone.
pub fn straddling(device: &Device) {
    let case = "straddling";
    let bs = block(device);
    let window = 128 * 1024u64;
    for boundary in [4096u64, 65536, 1 << 20, 2 << 20] {
        let start = boundary.saturating_sub(window / 2);
        if boundary < 3 * bs || start + window > device.size() {
            continue;
        }
        let mut model = write_pattern(device, boundary, start, window as usize, case);
        let writes = [
            (boundary - bs, 2 * bs),
            (boundary - 3 * bs, 5 * bs),
            (start + bs, window - 2 * bs),
        ];
        for (i, (offset, len)) in writes.into_iter().enumerate() {
            let seed = boundary + 1 + i as u64;
            let data = write_pattern(device, seed, offset, len as usize, case);
            let at = (offset - start) as usize;
            model[at..at + len as usize].copy_from_slice(&data);
            let back = read_back(device, start, window as usize, case);
            if let Some(pos) = back.iter().zip(&model).position(|(a, b)| a != b) {
                panic!(
                    "{case}: after writing {len} bytes at {offset}, byte {} differs",
                    start + pos as u64
                );
            }
            // Reads that straddle the boundary alone.
            let (offset, len) = (boundary - bs, 2 * bs as usize);
            let at = (offset - start) as usize;
            assert!(
                read_back(device, offset, len, case) == model[at..at + len],
                "{case}: read of {len} bytes at {offset} differs"
            );
        }
    }
}

/// The first and last blocks work; a zero-length request is harmless.
pub fn boundaries(device: &Device) {
    let bs = block(device);
    let size = device.size();
    let last = size / bs * bs - bs;
    let case = "boundaries";
    let data = write_pattern(device, 7, last, bs as usize, case);
    assert!(
        read_back(device, last, bs as usize, case) == data,
        "{case}: last block differs"
    );
    let data = write_pattern(device, 8, 0, bs as usize, case);
    assert!(
        read_back(device, 0, bs as usize, case) == data,
        "{case}: first block differs"
    );
    device
        .read(&mut [], size)
        .unwrap_or_else(|e| panic!("{case}: empty read at the end: {e}"));
}

/// Requests past the end fail with OutOfRange and change nothing.
pub fn beyond_end(device: &Device) {
    let bs = block(device);
    let size = device.size();
    let last = size / bs * bs - bs;
    let before = read_back(device, last, bs as usize, "beyond_end");
    let mut buf = vec![0u8; 2 * bs as usize];
    let kind = |r: crate::Result<()>| {
        r.expect_err("beyond_end: request past the end succeeded")
            .kind()
    };
    assert_eq!(kind(device.read(&mut buf, last)), ErrorKind::OutOfRange);
    assert_eq!(
        kind(device.write(&buf, last, WriteFlags::NONE)),
        ErrorKind::OutOfRange
    );
    assert_eq!(
        kind(device.write(&buf, u64::MAX - bs + 1, WriteFlags::NONE)),
        ErrorKind::OutOfRange
    );
    assert_eq!(
        kind(device.trim(last, 2 * bs, WriteFlags::NONE)),
        ErrorKind::OutOfRange
    );
    assert_eq!(
        kind(device.write_zeroes(last, 2 * bs, ZeroFlags::default())),
        ErrorKind::OutOfRange
    );
    assert_eq!(
        device
            .extents(size, bs)
            .expect_err("extents past end")
            .kind(),
        ErrorKind::OutOfRange
    );
    assert!(
        read_back(device, last, bs as usize, "beyond_end") == before,
        "beyond_end: a failed write changed data"
    );
}

/// With a minimum block size above one, unaligned requests fail with Misaligned.
pub fn misaligned(device: &Device) {
    let minimum = u64::from(device.info().block_sizes.minimum);
    if minimum == 1 {
        return;
    }
    let mut buf = vec![0u8; minimum as usize];
    let err = device
        .read(&mut buf, 1)
        .expect_err("misaligned read succeeded");
    assert_eq!(err.kind(), ErrorKind::Misaligned);
    let err = device
        .write(&buf[..minimum as usize - 1], 0, WriteFlags::NONE)
        .expect_err("misaligned write succeeded");
    assert_eq!(err.kind(), ErrorKind::Misaligned);
}

/// FUA writes and flushes succeed and the data reads back.
pub fn fua_and_flush(device: &Device) {
    let bs = block(device);
    let case = "fua_and_flush";
    let data = pattern(21, 5 * bs, 4 * bs as usize);
    if device.info().capabilities.fua.available() {
        device
            .write(&data, 5 * bs, WriteFlags::FUA)
            .unwrap_or_else(|e| panic!("{case}: FUA write: {e}"));
        assert!(
            read_back(device, 5 * bs, data.len(), case) == data,
            "{case}: FUA data differs"
        );
    }
    if device.info().capabilities.flush.available() {
        device
            .flush()
            .unwrap_or_else(|e| panic!("{case}: flush: {e}"));
    }
}

/// Trim succeeds; a native trim leaves the range reading zeroes, neighbours intact.
pub fn trim(device: &Device) {
    let case = "trim";
    let bs = 64 * 1024;
    let start = 1 << 20;
    let data = write_pattern(device, 3, start, 3 * bs as usize, case);
    device
        .trim(start + bs, bs, WriteFlags::NONE)
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    if device.info().capabilities.trim.is_native() {
        assert_zero(device, start + bs, bs as usize, case);
    }
    let head = read_back(device, start, bs as usize, case);
    let tail = read_back(device, start + 2 * bs, bs as usize, case);
    assert!(
        head == data[..bs as usize],
        "{case}: data before the trimmed range changed"
    );
    assert!(
        tail == data[2 * bs as usize..],
        "{case}: data after the trimmed range changed"
    );
}

/// Write-zeroes in every flavour reads back zeroes; a refused fast zero changes
/// nothing.
pub fn write_zeroes(device: &Device) {
    let case = "write_zeroes";
    let start = 2 << 20;
    let len = 128 * 1024u64;
    let flavours = [
        ZeroFlags::default(),
        ZeroFlags {
            no_hole: true,
            ..ZeroFlags::default()
        },
        ZeroFlags {
            fua: true,
            ..ZeroFlags::default()
        },
    ];
    let bs = block(device);
    for flags in flavours {
        write_pattern(device, 4, start, len as usize, case);
        device
            .write_zeroes(start + bs, len - 2 * bs, flags)
            .unwrap_or_else(|e| panic!("{case} {flags:?}: {e}"));
        assert_zero(device, start + bs, (len - 2 * bs) as usize, case);
        let head = read_back(device, start, bs as usize, case);
        assert!(
            head == pattern(4, start, bs as usize),
            "{case}: bytes before the range changed"
        );
        let tail = read_back(device, start + len - bs, bs as usize, case);
        assert!(
            tail == pattern(4, start + len - bs, bs as usize),
            "{case}: bytes after the range changed"
        );
    }
    let data = write_pattern(device, 5, start, len as usize, case);
    let fast = ZeroFlags {
        fast: true,
        ..ZeroFlags::default()
    };
    match device.write_zeroes(start, len, fast) {
        Ok(()) => assert_zero(device, start, len as usize, case),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            assert!(
                read_back(device, start, len as usize, case) == data,
                "{case}: refused fast zero changed data"
            );
        }
        Err(e) => panic!("{case}: fast zero: {e}"),
    }
}

/// Extents cover the range exactly; after a trim or zeroing the range reads as zero.
pub fn extents(device: &Device) {
    extents_expecting(device, Expect::default());
}

/// [`extents`], with what the device promises about zeroed ranges.
pub fn extents_expecting(device: &Device, expect: Expect) {
    let case = "extents";
    let start = 3 << 20;
    let len = 512 * 1024u64;
    write_pattern(device, 6, start, len as usize, case);
    device
        .write_zeroes(start + 128 * 1024, 256 * 1024, ZeroFlags::default())
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let list = device
        .extents(start, len)
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert!(!list.is_empty(), "{case}: no extents");
    assert_eq!(
        list[0].offset, start,
        "{case}: first extent does not start at the offset"
    );
    for pair in list.windows(2) {
        assert_eq!(
            pair[0].end(),
            pair[1].offset,
            "{case}: gap or overlap in {list:?}"
        );
    }
    assert!(
        list.last().unwrap().end() <= start + len,
        "{case}: extents run past the range"
    );
    if device.info().capabilities.extents.is_native() {
        let zeroed = start + 128 * 1024..start + 384 * 1024;
        let reported_zero = list
            .iter()
            .filter(|e| e.state.reads_zero())
            .any(|e| e.offset <= zeroed.start && e.end() >= zeroed.end);
        let data_covers = list
            .iter()
            .filter(|e| !e.state.reads_zero())
            .any(|e| e.offset <= start && e.end() > start);
        assert!(
            data_covers,
            "{case}: written data not reported as data: {list:?}"
        );
        for extent in list.iter().filter(|e| e.state.reads_zero()) {
            assert_zero(device, extent.offset, extent.len as usize, case);
        }
        // Devices may report zeroed ranges as data (always safe), but ours do not.
        assert!(
            reported_zero || !expect.zeroed_reported_as_zero,
            "{case}: zeroed range not reported as zero: {list:?}"
        );
    }
}

/// Several threads write disjoint ranges at once; each reads back its own data.
pub fn concurrent_writers(device: &Device) {
    let case = "concurrent_writers";
    let threads = 8u64;
    let each = 128 * 1024u64;
    let device = Arc::new(device.clone());
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let device = device.clone();
            thread::spawn(move || {
                for round in 0..8u64 {
                    let offset = t * each + (round % 2) * (threads * each);
                    write_pattern(&device, t * 100 + round, offset, each as usize, case);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("writer thread panicked");
    }
    for t in 0..threads {
        for half in 0..2u64 {
            let offset = t * each + half * threads * each;
            let last_round = 6 + half;
            let expect = pattern(t * 100 + last_round, offset, each as usize);
            assert!(
                read_back(&device, offset, each as usize, case) == expect,
                "{case}: thread {t} range {half} differs"
            );
        }
    }
}

/// Runs the read-only cases: `read_only` must refuse every write and leave data as
/// `writable` (a writable view of the same storage) shows it.
pub fn run_read_only(read_only: &Device, writable: &Device) {
    let case = "read_only";
    assert!(
        read_only.info().read_only,
        "{case}: device does not say it is read-only"
    );
    let data = write_pattern(writable, 11, 0, 64 * 1024, case);
    writable.flush().ok();
    assert!(
        read_back(read_only, 0, data.len(), case) == data,
        "{case}: reads differ"
    );
    let attempts = [
        read_only.write(&[0xAA; 4096], 0, WriteFlags::NONE),
        read_only.trim(0, 4096, WriteFlags::NONE),
        read_only.write_zeroes(0, 4096, ZeroFlags::default()),
    ];
    for attempt in attempts {
        let err = attempt.expect_err("read_only: a write succeeded");
        assert_eq!(err.kind(), ErrorKind::ReadOnly);
    }
    assert!(
        read_back(writable, 0, data.len(), case) == data,
        "{case}: refused writes changed data"
    );
    assert!(!read_only.info().capabilities.trim.available());
    assert!(!read_only.info().capabilities.write_zeroes.available());
}
