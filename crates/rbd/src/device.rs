//! An RBD image as a [`BlockDevice`]: every operation is one librbd asynchronous
//! call (FUA is write + flush, trim is discard, write-zeroes is
//! `rbd_aio_write_zeroes`), finished by the image's poller. The synchronous methods
//! submit and wait; [`FastPath::queue`] keeps many requests in flight from one
//! thread.

use std::io::IoSlice;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use blockwire_blockdev::{
    BlockDevice, BlockSizes, Capabilities, DeviceInfo, Error, Extent, ExtentState, FastPath, IoBuf,
    Limits, Op, RequestQueue, Result, Support, WriteFlags, ZeroFlags,
};
use crossbeam_channel::RecvTimeoutError;

use crate::errors::{request_error, OpenError, Stage};
use crate::ffi::{AioKind, EventFd, Snapshot, Stat};
use crate::poller::{overdue, Pending, Poller, Reply, Request, Shared};
use crate::queue::RbdQueue;
use crate::spec::RbdSpec;

/// How long past the cluster timeout we wait before giving up on an answer
/// ourselves: librados fails the request first; this only guards against a librbd
/// path that waits without its timeout.
const GRACE: Duration = Duration::from_secs(5);

/// What `info` shows about an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    pub stat: Stat,
    /// RBD_FEATURE_* bits.
    pub features: u64,
    pub snapshots: Vec<Snapshot>,
}

impl Description {
    /// The names of the feature bits set, as `rbd info` spells them.
    pub fn feature_names(&self) -> Vec<&'static str> {
        crate::features::names(self.features)
    }

    /// Whether librbd passes a lock between writers (see docs/ceph.md).
    pub fn has_exclusive_lock(&self) -> bool {
        self.features & crate::features::EXCLUSIVE_LOCK != 0
    }
}

/// Every image this process opened and has not dropped, for [`close_all`].
static OPEN_IMAGES: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// Closes every RBD image this process still has open, whoever holds it, so a
/// server that stops gives back librbd's exclusive lock and watch before it exits
/// (an exiting process closes nothing: the next writer, a restarted gateway
/// included, would wait for the cluster to time the dead watch out). Later
/// requests to those images fail. Call it once nothing serves them any more.
pub fn close_all() {
    let open = std::mem::take(&mut *OPEN_IMAGES.lock().unwrap_or_else(|e| e.into_inner()));
    for shared in open.iter().filter_map(Weak::upgrade) {
        shared.close();
    }
}

/// An open RBD image.
pub struct RbdDevice {
    shared: Arc<Shared>,
    info: DeviceInfo,
    description: Description,
    /// Our own deadline for an answer; `None`: wait as long as librbd does.
    deadline: Option<Duration>,
    // Declared last: dropped after every other field, stopping the poller before
    // the image closes (the poller holds its own reference to it).
    _poller: Poller,
}

impl RbdDevice {
    /// Connects and opens the image `spec` names; read-only for a snapshot or when
    /// `read_only`.
    pub fn open(spec: &RbdSpec, read_only: bool) -> std::result::Result<RbdDevice, OpenError> {
        let label = spec.to_string();
        let image = crate::open::open_image::<Pending>(spec, read_only)?;
        let query = |e| OpenError::from_call(&label, Stage::Query, e, "query");
        let stat = image.stat().map_err(query)?;
        let features = image.features().map_err(query)?;
        let snapshots = image.snapshots().map_err(query)?;
        let events = EventFd::new().map_err(|e| OpenError::new(&label, format!("eventfd: {e}")))?;
        let shared = Arc::new(Shared::new(image, spec.name(), events));
        {
            let mut open = OPEN_IMAGES.lock().unwrap_or_else(|e| e.into_inner());
            open.retain(|weak| weak.strong_count() > 0);
            open.push(Arc::downgrade(&shared));
        }
        let poller = Poller::start(shared.clone())
            .map_err(|e| OpenError::new(&label, format!("poller: {e}")))?;
        let read_only = read_only || spec.snapshot.is_some();
        let info = device_info(&stat, read_only);
        Ok(RbdDevice {
            shared,
            info,
            description: Description {
                stat,
                features,
                snapshots,
            },
            deadline: spec.timeout.map(|t| t + GRACE),
            _poller: poller,
        })
    }

    /// Size, object size, features and snapshots, as read at open.
    pub fn description(&self) -> &Description {
        &self.description
    }

    /// `POOL/IMAGE[@SNAP]`.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Starts one request and waits for its answer.
    fn run(
        &self,
        kind: AioKind,
        buf: Option<IoBuf>,
        op: Op,
        (offset, len): (u64, u64),
        then_flush: bool,
    ) -> (Result<()>, Option<IoBuf>) {
        let (to, answer) = crossbeam_channel::bounded(1);
        let pending = Pending {
            op,
            offset,
            len,
            then_flush,
            reply: Reply::Waiter(to),
        };
        self.shared.submit(Box::new(Request {
            kind,
            buf,
            state: pending,
        }));
        let received = match self.deadline {
            Some(deadline) => answer.recv_timeout(deadline),
            None => answer.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(answer) => answer,
            // The request stays librbd's; its buffer goes when it finishes.
            Err(_) => {
                let secs = self.deadline.unwrap_or_default().as_secs_f64();
                (Err(overdue(op, offset, len, &self.shared.name, secs)), None)
            }
        }
    }

    fn write_buf(&self, buf: IoBuf, offset: u64, flags: WriteFlags) -> Result<()> {
        let len = buf.len() as u64;
        let kind = AioKind::Write { offset };
        self.run(kind, Some(buf), Op::Write, (offset, len), flags.fua)
            .0
    }
}

fn device_info(stat: &Stat, read_only: bool) -> DeviceInfo {
    let mut info = DeviceInfo::new(stat.size);
    info.block_sizes = BlockSizes {
        minimum: 512,
        // The object size: requests of whole objects touch one OSD each and never
        // read-modify-write (NBD block size info, SCSI optimal transfer length).
        preferred: stat.object_size.clamp(4096, 1 << 30) as u32,
        maximum: DeviceInfo::DEFAULT_MAX_TRANSFER,
    };
    info.limits = Limits::default();
    info.read_only = read_only;
    info.capabilities = Capabilities {
        flush: Support::Native,
        // Write + rbd_aio_flush, chained by the poller (see poller.rs).
        fua: Support::Native,
        trim: Support::Native,
        write_zeroes: Support::Native,
        fast_zero: Support::Native,
        extents: Support::Native,
        cache: Support::None,
    };
    info.completes_inline = false;
    // One librbd image handle behind every connection: writes through one are seen
    // by all, and a flush covers them all.
    info.consistent_across_handles = true;
    // The poller wakes a queue's owner (see queue.rs).
    info.queue_wakes = true;
    info
}

impl BlockDevice for RbdDevice {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        let kind = AioKind::Read { offset };
        // An owned buffer: if the cluster stops answering we return, and librbd may
        // still fill this buffer later; it must not be the caller's.
        let (result, back) = self.run(
            kind,
            Some(IoBuf::new(buf.len())),
            Op::Read,
            (offset, len),
            false,
        );
        result?;
        let back = back.expect("a finished read hands its buffer back");
        buf.copy_from_slice(&back);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.write_buf(IoBuf::from_slice(buf), offset, flags)
    }

    fn flush(&self) -> Result<()> {
        self.run(AioKind::Flush, None, Op::Flush, (0, 0), false).0
    }

    /// `rbd_aio_discard`. librbd skips discards smaller than or unaligned to its
    /// discard granularity (64 KiB), so a trimmed range may keep its data: trim is
    /// a hint here, and zero-after-trim is not promised.
    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        let kind = AioKind::Discard { offset, len };
        self.run(kind, None, Op::Trim, (offset, len), flags.fua).0
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let kind = AioKind::WriteZeroes { offset, len };
        self.run(kind, None, Op::WriteZeroes, (offset, len), flags.fua)
            .0
    }

    /// Allocated objects (`rbd_diff_iterate2` since creation, whole objects) as
    /// data, the rest as holes.
    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        let mut allocated = self
            .shared
            .image
            .allocated(offset, len)
            .map_err(|e| request_error(e, &self.shared.name, Op::Extents, offset, len))?;
        allocated.sort_unstable();
        let end = offset + len;
        let mut at = offset;
        let push = |out: &mut Vec<Extent>, from: u64, to: u64, state| {
            if to <= from {
                return;
            }
            match out.last_mut() {
                Some(last) if last.state == state && last.end() == from => last.len += to - from,
                _ => out.push(Extent {
                    offset: from,
                    len: to - from,
                    state,
                }),
            }
        };
        let first = out.len();
        for (start, length) in allocated {
            let (start, stop) = (start.max(at), (start + length).min(end));
            if stop <= at {
                continue;
            }
            push(out, at, start, ExtentState::Hole);
            push(out, start, stop, ExtentState::Data);
            at = stop;
        }
        push(out, at, end, ExtentState::Hole);
        if out.len() == first {
            return Err(Error::new(
                blockwire_blockdev::ErrorKind::InvalidArgument,
                Op::Extents,
                offset,
                len,
            ));
        }
        Ok(())
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

/// One librbd write for a vectored write (gathered into one buffer), and librbd's
/// own asynchronous requests as the request queue.
impl FastPath for RbdDevice {
    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        let total = bufs.iter().map(|b| b.len()).sum();
        let mut gathered = IoBuf::new(total);
        let mut at = 0;
        for buf in bufs {
            gathered[at..at + buf.len()].copy_from_slice(buf);
            at += buf.len();
        }
        self.write_buf(gathered, offset, flags)
    }

    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        Some(Box::new(RbdQueue::new(&self.shared, self.deadline)))
    }
}
