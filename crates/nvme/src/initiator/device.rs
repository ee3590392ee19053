//! The initiator as a [`BlockDevice`]: one namespace of an NVMe/TCP subsystem,
//! its commands spread over several I/O queues. Any number of threads may call
//! it at once; a request that loses its connection is sent again once the
//! association is re-established (see recovery.rs).

use std::sync::{Arc, Mutex, RwLock};

use blockwire_blockdev::{
    BlockDevice, BlockSizes, Capabilities, DeviceInfo, Error, ErrorKind, FastPath, IoBuf, Limits,
    Op, RequestQueue, Result, Support, WriteFlags, ZeroFlags,
};

use super::commands::{self, ControllerIdentity, NamespaceIdentity};
use super::connection::{Lost, Payload};
use super::error::InitiatorError;
use super::options::NvmeOptions;
use super::queue::NvmeQueue;
use super::recovery::Recovery;
use super::session::Session;
use super::status::error_for;
use crate::cqe::Cqe;
use crate::sqe::Sqe;

/// One namespace of an NVMe/TCP subsystem as a block device.
pub struct NvmeClient {
    pub(crate) options: NvmeOptions,
    pub(crate) session: RwLock<Arc<Session>>,
    pub(crate) recovery: Mutex<Recovery>,
    info: DeviceInfo,
    controller: ControllerIdentity,
    namespace: NamespaceIdentity,
}

impl std::fmt::Debug for NvmeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmeClient")
            .field("uri", &self.options.to_string())
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl NvmeClient {
    /// Connects to the namespace an `nvme+tcp://HOST[:PORT]/SUBNQN[/NSID]` URI
    /// names.
    pub fn open_uri(uri: &str) -> std::result::Result<NvmeClient, InitiatorError> {
        NvmeClient::open(NvmeOptions::parse(uri)?)
    }

    /// Connects to the namespace `options` name: the admin queue, then
    /// `options.queues` I/O queues.
    pub fn open(options: NvmeOptions) -> std::result::Result<NvmeClient, InitiatorError> {
        if options.is_discovery() {
            return Err(InitiatorError::Uri {
                uri: options.to_string(),
                reason: "names a discovery controller, not a namespace".into(),
            });
        }
        let session = Session::connect(&options)?;
        let namespace = session
            .namespace
            .expect("an I/O controller has a namespace");
        let controller = session.controller.clone();
        let info = device_info(&controller, &namespace, session.max_transfer);
        Ok(NvmeClient {
            options,
            session: RwLock::new(Arc::new(session)),
            recovery: Mutex::new(Recovery::default()),
            info,
            controller,
            namespace,
        })
    }

    /// What Identify Controller said at connect.
    pub fn controller(&self) -> &ControllerIdentity {
        &self.controller
    }

    /// What Identify Namespace said at connect.
    pub fn namespace(&self) -> &NamespaceIdentity {
        &self.namespace
    }

    pub fn options(&self) -> &NvmeOptions {
        &self.options
    }

    /// I/O queues (TCP connections) in use now.
    pub fn io_queues(&self) -> usize {
        self.current().io.len()
    }

    pub(crate) fn current(&self) -> Arc<Session> {
        self.session
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn block_size(&self) -> u64 {
        u64::from(self.namespace.block_size)
    }

    pub(crate) fn max_transfer(&self) -> usize {
        self.info.block_sizes.maximum as usize
    }

    /// Checks that `offset..offset+len` is whole blocks on the namespace.
    pub(crate) fn check(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        let bs = self.block_size();
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(Error::new(ErrorKind::Misaligned, op, offset, len));
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(Error::new(ErrorKind::OutOfRange, op, offset, len)),
        }
    }

    /// Runs one command on an I/O queue of `session`, waiting for its answer.
    fn exec(
        &self,
        session: &Session,
        sqe: Sqe,
        payload: Payload,
        op: Op,
        offset: u64,
        len: u64,
    ) -> Result<Payload> {
        match session.pick().call(sqe, payload, None) {
            (Ok(cqe), payload) => outcome(cqe, op, offset, len).map(|()| payload),
            (Err(Lost), _) => Err(disconnected(op, offset, len)),
        }
    }

    /// Runs `attempt` on the current association, and again on a new one when
    /// the connection was lost (within the reconnect deadline).
    fn retrying<T>(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        mut attempt: impl FnMut(&Session) -> Result<T>,
    ) -> Result<T> {
        let mut session = self.current();
        let start = std::time::Instant::now();
        loop {
            match attempt(&session) {
                // A target that accepts the new association and drops it again
                // does not keep the request going past the deadline.
                Err(e)
                    if e.kind() == ErrorKind::Disconnected
                        && self.options.reconnect.is_some_and(|d| start.elapsed() < d) =>
                {
                    session = self
                        .recover(&session)
                        .map_err(|detail| disconnected(op, offset, len).with_detail(detail))?;
                }
                other => return other,
            }
        }
    }

    fn lba(&self, offset: u64) -> u64 {
        offset / self.block_size()
    }

    fn blocks(&self, len: usize) -> u32 {
        (len as u64 / self.block_size()) as u32
    }
}

/// A lost connection as a block device error.
pub(crate) fn disconnected(op: Op, offset: u64, len: u64) -> Error {
    Error::new(ErrorKind::Disconnected, op, offset, len)
}

/// A completion's status as a result.
pub(crate) fn outcome(cqe: Cqe, op: Op, offset: u64, len: u64) -> Result<()> {
    if cqe.status.is_success() {
        Ok(())
    } else {
        Err(error_for(cqe.status, op, offset, len))
    }
}

/// What the block device layer needs to know, from Identify.
fn device_info(c: &ControllerIdentity, ns: &NamespaceIdentity, max_transfer: u32) -> DeviceInfo {
    let native = |yes: bool| if yes { Support::Native } else { Support::None };
    let mut info = DeviceInfo::new(ns.size());
    // One command's data at most, whole blocks of it.
    let maximum = (max_transfer / ns.block_size).max(1) * ns.block_size;
    info.block_sizes = BlockSizes {
        minimum: ns.block_size,
        preferred: ns.block_size.max(4096),
        maximum,
    };
    let bs = u64::from(ns.block_size);
    info.limits = Limits {
        max_trim: commands::DSM_MAX_BLOCKS * bs * commands::DSM_MAX_RANGES as u64,
        max_write_zeroes: u64::from(commands::MAX_BLOCKS) * bs,
    };
    info.read_only = ns.write_protected;
    info.capabilities = Capabilities {
        flush: Support::Native,
        fua: Support::Native,
        trim: native(c.supports_deallocate()),
        write_zeroes: native(c.supports_write_zeroes()),
        ..Capabilities::default()
    };
    info.queue_wakes = true;
    info
}

impl BlockDevice for NvmeClient {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(Op::Read, offset, buf.len() as u64)?;
        let max = self.max_transfer();
        let mut at = offset;
        for chunk in buf.chunks_mut(max) {
            let len = chunk.len() as u64;
            let sqe = commands::read(self.options.nsid, self.lba(at), self.blocks(chunk.len()));
            let data = self.retrying(Op::Read, at, len, |s| {
                self.exec(
                    s,
                    sqe,
                    Payload::Io(IoBuf::new(chunk.len())),
                    Op::Read,
                    at,
                    len,
                )
            })?;
            chunk.copy_from_slice(data.as_slice());
            at += len;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.check(Op::Write, offset, buf.len() as u64)?;
        if self.info.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                Op::Write,
                offset,
                buf.len() as u64,
            ));
        }
        let mut at = offset;
        for chunk in buf.chunks(self.max_transfer()) {
            let len = chunk.len() as u64;
            let sqe = commands::write(
                self.options.nsid,
                self.lba(at),
                self.blocks(chunk.len()),
                flags.fua,
            );
            self.retrying(Op::Write, at, len, |s| {
                self.exec(
                    s,
                    sqe,
                    Payload::Io(IoBuf::from_slice(chunk)),
                    Op::Write,
                    at,
                    len,
                )
            })?;
            at += len;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        let sqe = commands::flush(self.options.nsid);
        self.retrying(Op::Flush, 0, 0, |s| {
            self.exec(s, sqe, Payload::None, Op::Flush, 0, 0)
                .map(|_| ())
        })
    }

    fn trim(&self, offset: u64, len: u64, _flags: WriteFlags) -> Result<()> {
        if !self.controller.supports_deallocate() {
            return Err(Error::new(ErrorKind::Unsupported, Op::Trim, offset, len));
        }
        self.check(Op::Trim, offset, len)?;
        let bs = self.block_size();
        let mut ranges = Vec::new();
        let (mut lba, mut left) = (offset / bs, len / bs);
        while left > 0 {
            let n = left.min(commands::DSM_MAX_BLOCKS);
            ranges.push((lba, n as u32));
            lba += n;
            left -= n;
        }
        for group in ranges.chunks(commands::DSM_MAX_RANGES) {
            let (sqe, data) = commands::deallocate(self.options.nsid, group);
            self.retrying(Op::Trim, offset, len, |s| {
                self.exec(s, sqe, Payload::Owned(data.clone()), Op::Trim, offset, len)
                    .map(|_| ())
            })?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        // Write Zeroes promises zeroes, not speed: a fast-only request is refused.
        if !self.controller.supports_write_zeroes() || flags.fast {
            return Err(Error::new(
                ErrorKind::Unsupported,
                Op::WriteZeroes,
                offset,
                len,
            ));
        }
        self.check(Op::WriteZeroes, offset, len)?;
        let bs = self.block_size();
        let (mut lba, mut left) = (offset / bs, len / bs);
        while left > 0 {
            let n = left.min(u64::from(commands::MAX_BLOCKS));
            let sqe =
                commands::write_zeroes(self.options.nsid, lba, n as u32, flags.fua, !flags.no_hole);
            let (at, bytes) = (lba * bs, n * bs);
            self.retrying(Op::WriteZeroes, at, bytes, |s| {
                self.exec(s, sqe, Payload::None, Op::WriteZeroes, at, bytes)
                    .map(|_| ())
            })?;
            lba += n;
            left -= n;
        }
        Ok(())
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

impl NvmeClient {
    /// A queue that keeps many reads and writes in flight from one thread over this
    /// client's connections; the device's [`FastPath::queue`], callable without the
    /// trait.
    pub fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        Some(Box::new(NvmeQueue::new(self)))
    }
}

/// The request queue is this client's one fast path.
impl FastPath for NvmeClient {
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        NvmeClient::queue(self)
    }
}
