use std::io::IoSlice;
use std::sync::Arc;

use super::*;
use crate::conformance::{self, pattern};
use crate::device::ExtentState;
use crate::memory::MemoryDevice;

fn memory_members(count: usize, size: u64) -> Vec<Device> {
    (0..count)
        .map(|_| Device::from_device(MemoryDevice::new(size)))
        .collect()
}

fn stripe(members: Vec<Device>, chunk: u64) -> Device {
    Device::from_device(Stripe::new(members, chunk).unwrap())
}

/// A memory device with a chosen minimum block size, and a flush that can fail.
struct Shaped {
    inner: MemoryDevice,
    minimum: u32,
    flush_fails: bool,
}

impl Shaped {
    fn device(size: u64, minimum: u32, flush_fails: bool) -> Device {
        Device::new(Arc::new(Shaped {
            inner: MemoryDevice::new(size),
            minimum,
            flush_fails,
        }))
    }
}

impl BlockDevice for Shaped {
    fn info(&self) -> DeviceInfo {
        let mut info = self.inner.info();
        info.capabilities = crate::info::Capabilities {
            flush: Support::Native,
            ..Default::default()
        };
        info.block_sizes.minimum = self.minimum;
        info.block_sizes.preferred = info.block_sizes.preferred.max(self.minimum);
        info
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.inner.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        if self.flush_fails {
            return Err(Error::new(ErrorKind::Io, Op::Flush, 0, 0));
        }
        Ok(())
    }
}

#[test]
fn passes_the_conformance_suite_on_memory_members() {
    for members in [2, 3, 4] {
        for chunk in [4 << 10, 64 << 10, 1 << 20] {
            let device = stripe(memory_members(members, 4 << 20), chunk);
            assert_eq!(device.size(), members as u64 * (4 << 20));
            // Memory members allocate in 64 KiB units: zeroes in smaller pieces stay
            // allocated on them and are reported as data (correct, if less precise).
            let expect = conformance::Expect {
                zeroed_reported_as_zero: chunk >= 64 << 10,
            };
            conformance::run_all_expecting(&device, expect);
        }
    }
}

#[test]
fn passes_the_read_only_suite() {
    let device = stripe(memory_members(3, 2 << 20), 64 << 10);
    conformance::run_read_only(&device.read_only(), &device);
}

#[test]
fn data_lands_on_the_member_the_layout_names() {
    let members = memory_members(3, 1 << 20);
    let volume = stripe(members.clone(), 4096);
    // Straddles chunk and row boundaries at both ends.
    let (offset, len) = (4096 * 2 + 512, 4096 * 7 + 1024);
    let data = pattern(1, offset, len);
    volume.write(&data, offset, WriteFlags::NONE).unwrap();
    let layout = Layout::new(3, 4096).unwrap();
    for piece in layout.pieces(offset, len as u64) {
        let mut got = vec![0u8; piece.len as usize];
        members[piece.member]
            .read(&mut got, piece.member_offset)
            .unwrap();
        let at = (piece.offset - offset) as usize;
        assert_eq!(got, data[at..at + piece.len as usize], "{piece:?}");
    }
    let mut back = vec![0u8; len];
    volume.read(&mut back, offset).unwrap();
    assert_eq!(back, data);
}

#[test]
fn vectored_writes_split_across_buffers_and_chunks() {
    let volume = stripe(memory_members(2, 1 << 20), 4096);
    let a = pattern(2, 0, 3000);
    let b = pattern(3, 0, 6000);
    let c = pattern(4, 0, 100);
    let bufs = [IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)];
    volume.write_vectored(&bufs, 1000, WriteFlags::FUA).unwrap();
    let mut back = vec![0u8; 9100];
    volume.read(&mut back, 1000).unwrap();
    assert_eq!(back, [a, b, c].concat());
}

#[test]
fn size_is_members_times_the_smallest_rounded_to_the_chunk() {
    let members = vec![
        Device::from_device(MemoryDevice::new(5 << 20)),
        Device::from_device(MemoryDevice::new((3 << 20) + (512 << 10))),
    ];
    let volume = Stripe::new(members, 1 << 20).unwrap();
    assert_eq!(volume.info().size, 6 << 20);
    assert_eq!(volume.member_size(), 3 << 20);
}

#[test]
fn block_sizes_take_the_strictest_member() {
    let members = vec![
        Shaped::device(1 << 20, 512, false),
        Shaped::device(1 << 20, 4096, false),
    ];
    let volume = Stripe::new(members, 64 << 10).unwrap();
    assert_eq!(volume.info().block_sizes.minimum, 4096);
}

#[test]
fn mismatched_members_are_refused_by_name() {
    let names = || vec!["a.img".to_string(), "b.img".to_string()];
    let odd = vec![
        Shaped::device(1 << 20, 4096, false),
        Shaped::device(1 << 20, 1536, false),
    ];
    let err = Stripe::with_names(odd, names(), 12288).unwrap_err();
    assert!(matches!(err, StripeError::BlockSizes { .. }), "{err}");
    assert!(
        err.to_string().contains("b.img has 1536-byte blocks"),
        "{err}"
    );

    let misaligned = vec![
        Shaped::device(1 << 20, 512, false),
        Shaped::device(1 << 20, 4096, false),
    ];
    let err = Stripe::with_names(misaligned, names(), 6144).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the chunk size 6144 is not a multiple of b.img's block size 4096"
    );

    let small = vec![
        Device::from_device(MemoryDevice::new(1 << 20)),
        Device::from_device(MemoryDevice::new(32 << 10)),
    ];
    let err = Stripe::with_names(small, names(), 64 << 10).unwrap_err();
    assert_eq!(
        err.to_string(),
        "b.img (32768 bytes) is smaller than one chunk (65536 bytes)"
    );
    assert_eq!(
        Stripe::new(Vec::new(), 4096).unwrap_err(),
        StripeError::NoMembers
    );
    assert_eq!(
        Stripe::new(memory_members(1, 8192), 0).unwrap_err(),
        StripeError::ZeroChunk
    );
}

#[test]
fn flush_fails_when_one_member_fails_and_names_it() {
    let members = vec![
        Shaped::device(1 << 20, 512, false),
        Shaped::device(1 << 20, 512, true),
        Shaped::device(1 << 20, 512, false),
    ];
    let names = vec!["m0".into(), "nbd://h/m1".into(), "m2".into()];
    let volume = Device::from_device(Stripe::with_names(members, names, 4096).unwrap());
    let err = volume.flush().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io);
    assert!(
        err.to_string().contains("stripe member nbd://h/m1"),
        "{err}"
    );
    let healthy = stripe(
        vec![
            Shaped::device(1 << 20, 512, false),
            Shaped::device(1 << 20, 512, false),
        ],
        4096,
    );
    healthy.flush().unwrap();
}

#[test]
fn a_failing_member_write_names_the_member() {
    let members = vec![
        Device::from_device(MemoryDevice::new(1 << 20)),
        Device::from_device(MemoryDevice::new(1 << 20)).read_only(),
    ];
    let volume = Stripe::new(members, 4096).unwrap();
    assert!(
        volume.info().read_only,
        "one read-only member makes it read-only"
    );
    let err = volume
        .write_at(&[1u8; 8192], 0, WriteFlags::NONE)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ReadOnly);
    assert!(err.to_string().contains("stripe member member 1"), "{err}");
}

#[test]
fn extents_merge_across_members_in_volume_order() {
    let chunk = 64 << 10;
    let volume = stripe(memory_members(2, 1 << 20), chunk);
    let all = volume.extents(0, volume.size()).unwrap();
    assert_eq!(
        all,
        vec![Extent {
            offset: 0,
            len: 2 << 20,
            state: ExtentState::Hole
        }]
    );
    // Chunks 0 (member 0) and 1 (member 1) and 5 (member 1, row 2).
    volume
        .write(&vec![7u8; 2 * chunk as usize], 0, WriteFlags::NONE)
        .unwrap();
    volume
        .write(&vec![7u8; chunk as usize], 5 * chunk, WriteFlags::NONE)
        .unwrap();
    let got = volume
        .extents(chunk / 2, volume.size() - chunk / 2)
        .unwrap();
    let extent = |offset, len, state| Extent { offset, len, state };
    assert_eq!(
        got,
        vec![
            extent(chunk / 2, 2 * chunk - chunk / 2, ExtentState::Data),
            extent(2 * chunk, 3 * chunk, ExtentState::Hole),
            extent(5 * chunk, chunk, ExtentState::Data),
            extent(6 * chunk, (2 << 20) - 6 * chunk, ExtentState::Hole),
        ]
    );
    assert!(volume.is_hole(2 * chunk, 3 * chunk).unwrap());
    assert!(!volume.is_hole(chunk, 2 * chunk).unwrap());
}

#[test]
fn capabilities_are_the_intersection_of_the_members() {
    let members = vec![
        Device::from_device(MemoryDevice::new(1 << 20)),
        Shaped::device(1 << 20, 512, false),
    ];
    let info = Stripe::new(members, 4096).unwrap().info();
    // Shaped has no native trim, zeroing or extents; both flush natively.
    assert!(info.capabilities.flush.is_native());
    assert!(!info.capabilities.trim.available());
    assert!(!info.capabilities.extents.available());
    assert!(!info.capabilities.fast_zero.available());
    // Zeroing is available on every member (Shaped's through its handle).
    assert!(info.capabilities.write_zeroes.is_native());
    assert!(info.consistent_across_handles);
}

#[test]
fn trim_and_zeroes_reach_every_member_span() {
    let members = memory_members(3, 1 << 20);
    let volume = stripe(members.clone(), 4096);
    let data = pattern(9, 0, 64 << 10);
    volume.write(&data, 0, WriteFlags::NONE).unwrap();
    volume
        .write_zeroes(1024 * 3, 40 << 10, ZeroFlags::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut back = vec![0u8; 64 << 10];
    volume.read(&mut back, 0).unwrap();
    let mut expect = data.clone();
    expect[3072..3072 + (40 << 10)].fill(0);
    assert_eq!(back, expect);
    // 3 x 64 KiB: every member's span is one whole 64 KiB memory chunk.
    volume.trim(0, 192 << 10, WriteFlags::NONE).unwrap();
    for member in &members {
        assert!(member.is_hole(0, 64 << 10).unwrap());
    }
}
