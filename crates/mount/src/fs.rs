//! The FUSE file system: a root directory holding one regular file whose bytes are
//! the device's. Each kernel request becomes one call on the checked device handle.

use std::cell::RefCell;
use std::ffi::{OsStr, OsString};
use std::time::{Duration, SystemTime};

use blockwire_blockdev::{Device, Error, ReadModifyWrite, WriteFlags, ZeroFlags};
use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};

use crate::attr::{file_attr, fs_stats, root_attr, Owner, FILE, ROOT};
use crate::errno::errno_for;
use crate::range::{read_len, split_at_blocks, write_len, Span};

/// How long the kernel may keep attributes and names: they never change.
const TTL: Duration = Duration::from_secs(3600);
/// The largest read or write the kernel sends in one request.
pub const MAX_REQUEST: u32 = 1 << 20;
/// Background requests (readahead, asynchronous direct I/O) the kernel keeps in
/// flight before it makes writers wait; the threads serving them are
/// [`MountOptions::threads`](crate::MountOptions::threads).
const MAX_BACKGROUND: u16 = 64;

const FALLOC_FL_KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
const FALLOC_FL_PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;
const FALLOC_FL_ZERO_RANGE: i32 = libc::FALLOC_FL_ZERO_RANGE;

thread_local! {
    /// Each FUSE thread reads into its own buffer, kept between requests.
    static READ_BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The file system of one mount.
pub struct DeviceFile {
    /// For flush and zeroing, which work on whole device blocks.
    device: Device,
    /// For reads and writes at any byte offset: the device itself, or a
    /// read-modify-write layer over it when its block size is above one byte
    /// (a FUSE write carries the caller's offset and length, not whole blocks).
    bytes: Device,
    name: OsString,
    owner: Owner,
    read_only: bool,
}

impl DeviceFile {
    /// The file system showing `device` as `name`; read-only if the device is.
    pub fn new(device: Device, name: OsString, owner: Owner) -> DeviceFile {
        let minimum = device.info().block_sizes.minimum;
        let bytes = if minimum > 1 {
            Device::from_device(ReadModifyWrite::new(device.clone(), 1))
        } else {
            device.clone()
        };
        let read_only = device.info().read_only;
        DeviceFile {
            device,
            bytes,
            name,
            owner,
            read_only,
        }
    }

    fn size(&self) -> u64 {
        self.device.size()
    }

    fn attr_of(&self, ino: INodeNo) -> Option<fuser::FileAttr> {
        match ino {
            ROOT => Some(root_attr(self.owner)),
            FILE => Some(file_attr(
                self.owner,
                self.size(),
                self.read_only,
                self.device.info().block_sizes.preferred,
            )),
            _ => None,
        }
    }

    fn failed(&self, what: &str, error: &Error) -> Errno {
        tracing::warn!("{what} failed: {error}");
        Errno::from_i32(errno_for(error))
    }

    /// Zeroes `span`: the whole blocks in it natively where the device can (and may
    /// unmap them unless `keep_allocated`), the partial blocks at its edges by
    /// writing zeroes through the read-modify-write layer.
    fn zero(&self, span: Span, keep_allocated: bool) -> Result<(), Error> {
        let block = u64::from(self.device.info().block_sizes.minimum);
        let split = split_at_blocks(span.offset, span.len, block);
        for edge in [split.head, split.tail].into_iter().flatten() {
            let zeroes = vec![0u8; edge.len as usize];
            self.bytes.write(&zeroes, edge.offset, WriteFlags::NONE)?;
        }
        if let Some(whole) = split.whole {
            let flags = ZeroFlags {
                no_hole: keep_allocated,
                ..ZeroFlags::default()
            };
            self.device.write_zeroes(whole.offset, whole.len, flags)?;
        }
        Ok(())
    }
}

impl Filesystem for DeviceFile {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large requests: a loop device's 1 MiB bios and readahead arrive whole.
        let _ = config.set_max_write(MAX_REQUEST);
        if let Err(kernel_max) = config.set_max_readahead(MAX_REQUEST) {
            let _ = config.set_max_readahead(kernel_max);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        // Direct I/O (losetup --direct-io=on) sends its requests in parallel.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, self.attr_of(FILE)) {
            (ROOT, Some(attr)) if name == self.name => {
                reply.entry(&TTL, &attr, fuser::Generation(0))
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    /// The size is the device's: truncating to anything else is refused (`dd` wants
    /// `conv=notrunc`). Times and modes are accepted and left as they are.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(attr) = self.attr_of(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match size {
            Some(size) if ino == FILE && size != attr.size => reply.error(Errno::EPERM),
            _ => reply.attr(&TTL, &attr),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE {
            return reply.error(Errno::EISDIR);
        }
        if self.read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        // Not FOPEN_DIRECT_IO: reads and writes go through the kernel's page cache of
        // this file, as they do for a block device, so readahead works and a loop
        // device in its default (buffered) mode can use the file. Writes are still
        // write-through (no FUSE_WRITEBACK_CACHE): each reaches the device before the
        // writer returns, and fsync reaches it as a flush. Not FOPEN_KEEP_CACHE: an
        // open drops cached pages, so changes made on the target by someone else
        // are seen by whoever opens the file next. PARALLEL_DIRECT_WRITES: O_DIRECT
        // writes (losetup --direct-io=on) are not serialised on the inode lock, so
        // a loop device keeps several in flight; the device takes concurrent writes
        // (the read-modify-write layer locks the blocks it merges).
        reply.opened(FileHandle(0), FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = read_len(offset, u64::from(size), self.size()) as usize;
        READ_BUFFER.with_borrow_mut(|buffer| {
            if buffer.len() < len {
                buffer.resize(len, 0);
            }
            match self.bytes.read(&mut buffer[..len], offset) {
                Ok(()) => reply.data(&buffer[..len]),
                Err(e) => reply.error(self.failed("read", &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            return reply.error(Errno::EROFS);
        }
        let Some(len) = write_len(offset, data.len() as u64, self.size()) else {
            return reply.error(Errno::ENOSPC);
        };
        let data = &data[..len as usize];
        match self.bytes.write(data, offset, WriteFlags::NONE) {
            Ok(()) => reply.written(len as u32),
            Err(e) => reply.error(self.failed("write", &e)),
        }
    }

    /// Called on every close: nothing is buffered here (writes are write-through),
    /// and a close does not promise durability, so there is nothing to send.
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    /// fsync and fdatasync become a flush of the device, so data a file system on
    /// top (through a loop device) makes durable reaches the target's stable storage.
    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _data: bool,
        reply: ReplyEmpty,
    ) {
        if self.read_only || !self.device.info().capabilities.flush.available() {
            // Nothing was written, or the device has no volatile cache to flush.
            return reply.ok();
        }
        match self.device.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.failed("flush", &e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        match self.allocate(offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(errno) => reply.error(errno),
        }
    }

    // No extended attributes: EOPNOTSUPP tells the kernel to stop asking.
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match ino {
            ROOT => reply.opened(FileHandle(0), FopenFlags::empty()),
            _ => reply.error(Errno::ENOTDIR),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (ROOT, FileType::Directory, OsStr::new(".")),
            (ROOT, FileType::Directory, OsStr::new("..")),
            (FILE, FileType::RegularFile, self.name.as_os_str()),
        ];
        for (index, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            // The offset of an entry is where the next readdir resumes.
            if reply.add(*ino, index as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let stats = fs_stats(self.size(), self.device.info().block_sizes.preferred);
        reply.statfs(
            stats.blocks,
            0,
            0,
            2,
            0,
            stats.block_size,
            255,
            stats.block_size,
        );
    }
}

impl DeviceFile {
    /// fallocate: PUNCH_HOLE and ZERO_RANGE make the range read as zeroes (a loop
    /// device turns discard and write-zeroes into these; ext4 relies on the zeroes),
    /// plain allocation is a no-op inside the device, anything else is refused.
    fn allocate(&self, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        let known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return Err(Errno::EOPNOTSUPP);
        }
        if self.read_only {
            return Err(Errno::EROFS);
        }
        let end = offset.checked_add(length).ok_or(Errno::EINVAL)?;
        let keep_size = mode & FALLOC_FL_KEEP_SIZE != 0;
        // Growing the file is impossible; with KEEP_SIZE the part past the end is
        // simply not there.
        if end > self.size() && !keep_size {
            return Err(Errno::ENOSPC);
        }
        let end = end.min(self.size());
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) == 0 || end <= offset {
            return Ok(());
        }
        let span = Span {
            offset,
            len: end - offset,
        };
        let keep_allocated = mode & FALLOC_FL_PUNCH_HOLE == 0;
        self.zero(span, keep_allocated)
            .map_err(|e| self.failed("fallocate", &e))
    }
}
