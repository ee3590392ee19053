//! The file backend: a regular file or a block device, with positioned I/O.
//!
//! - reads and writes with pread/pwrite (no shared file offset, so no lock);
//! - cached reads without blocking via preadv2(RWF_NOWAIT), so a target can serve them
//!   on the connection's own thread;
//! - FUA as pwritev2(RWF_DSYNC), flush as fdatasync;
//! - trim by punching holes (BLKDISCARD on block devices), write-zeroes by fallocate;
//! - extents from SEEK_DATA / SEEK_HOLE;
//! - optional O_DIRECT, with the minimum block size raised to the device's.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use crate::buffer::{IoBuf, ALIGNMENT};

/// Most buffers one preadv/pwritev takes (IOV_MAX on Linux).
const MAX_IOVECS: usize = 1024;
use crate::device::{write_each, BlockDevice, Extent, ExtentState, WriteFlags, ZeroFlags};
use crate::error::{Error, ErrorKind, Op, Result};
use crate::fast_path::FastPath;
use crate::info::{Capabilities, DeviceInfo, Support};
use crate::mapping::{FileMapping, MappedRange};
use crate::write_behind::{WriteBehind, DEFAULT_WRITE_BEHIND};

// Block-device ioctls from <linux/fs.h>.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// cachestat(2), Linux 6.5+; the same number on every architecture.
const SYS_CACHESTAT: libc::c_long = 451;
const PAGE: u64 = 4096;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Most extents one extents call collects.
const MAX_EXTENTS_PER_CALL: usize = 4096;

/// How to open a file device.
#[derive(Debug, Clone, Copy)]
pub struct FileOptions {
    /// Open read-only; every write is refused.
    pub read_only: bool,
    /// Bypass the page cache (O_DIRECT).
    pub direct: bool,
    /// Start writeback of each sequential stream of buffered writes every this many
    /// bytes, so that a flush after it finds little left to write (see
    /// [`write_behind`](crate::write_behind)); 0 leaves writeback to the kernel.
    pub write_behind: u64,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            read_only: false,
            direct: false,
            write_behind: DEFAULT_WRITE_BEHIND,
        }
    }
}

/// A regular file or block device.
pub struct FileDevice {
    file: File,
    path: PathBuf,
    block_device: bool,
    direct: bool,
    info: DeviceInfo,
    /// Cleared when the kernel or file system rejects RWF_NOWAIT.
    nowait_works: AtomicBool,
    /// Cleared when the kernel or file system rejects RWF_DSYNC.
    dsync_works: AtomicBool,
    /// Cleared when the kernel has no cachestat(2).
    cachestat_works: AtomicBool,
    /// The file lives in memory (tmpfs, ramfs): every page is resident, so a read
    /// never waits for a disk and needs no cachestat(2) first. (tmpfs refuses
    /// RWF_NOWAIT, so without this every small cached read paid that extra call.)
    in_memory: bool,
    /// Buffered writable files only.
    write_behind: Option<WriteBehind>,
    /// Made at the first read that wants it; `None` inside when the file cannot be
    /// mapped (then reads copy as before).
    mapping: OnceLock<Option<FileMapping>>,
}

impl FileDevice {
    /// Opens an existing file or block device.
    pub fn open(path: impl AsRef<Path>, options: FileOptions) -> Result<FileDevice> {
        let path = path.as_ref().to_path_buf();
        let open_error = |e: io::Error| {
            Error::from_io(e, Op::Open, 0, 0).with_detail(path.display().to_string())
        };
        let mut open = OpenOptions::new();
        open.read(true).write(!options.read_only);
        if options.direct {
            open.custom_flags(libc::O_DIRECT);
        }
        let file = open.open(&path).map_err(open_error)?;
        let metadata = file.metadata().map_err(open_error)?;
        let block_device = metadata.file_type().is_block_device();
        if !block_device && !metadata.is_file() {
            return Err(
                Error::new(ErrorKind::InvalidArgument, Op::Open, 0, 0).with_detail(format!(
                    "{} is neither a regular file nor a block device",
                    path.display()
                )),
            );
        }
        let (size, logical_block) = if block_device {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) };
            if rc < 0 {
                return Err(open_error(io::Error::last_os_error()));
            }
            let mut sector: libc::c_int = 512;
            // SAFETY: BLKSSZGET writes one int through the pointer.
            unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut sector) };
            (size, sector.max(512) as u32)
        } else {
            (metadata.len(), 512)
        };

        let mut info = DeviceInfo::new(size);
        info.read_only = options.read_only;
        info.completes_inline = !options.direct;
        if options.direct {
            // O_DIRECT needs offsets and lengths aligned to what the file system or
            // device says (statx's DIO alignment, or the logical block size); a page
            // where it says nothing.
            let alignment = if block_device {
                Some(logical_block)
            } else {
                dio_offset_alignment(&file)
            };
            info.block_sizes.minimum = alignment
                .filter(|a| a.is_power_of_two() && *a <= ALIGNMENT as u32)
                .unwrap_or(ALIGNMENT as u32);
        } else if block_device {
            info.block_sizes.minimum = 1;
        }
        info.block_sizes.preferred = info.block_sizes.minimum.max(4096);
        info.capabilities = Capabilities {
            flush: Support::Native,
            fua: Support::Native,
            trim: Support::Native,
            write_zeroes: Support::Native,
            // On a block device fallocate may fall back to writing zeroes itself.
            fast_zero: if block_device {
                Support::None
            } else {
                Support::Native
            },
            extents: if block_device {
                Support::None
            } else {
                Support::Native
            },
            cache: Support::Native,
        };
        let write_behind = if options.write_behind > 0 && !options.read_only && !options.direct {
            let clone = file.try_clone().map_err(open_error)?;
            Some(WriteBehind::start(clone, options.write_behind).map_err(open_error)?)
        } else {
            None
        };
        let in_memory = !block_device && !options.direct && lives_in_memory(&file);
        Ok(FileDevice {
            file,
            path,
            block_device,
            direct: options.direct,
            info,
            nowait_works: AtomicBool::new(true),
            dsync_works: AtomicBool::new(true),
            cachestat_works: AtomicBool::new(!options.direct),
            in_memory,
            write_behind,
            mapping: OnceLock::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn fd(&self) -> libc::c_int {
        self.file.as_raw_fd()
    }

    /// O_DIRECT needs an aligned buffer address too; copy through one if not.
    fn needs_bounce(&self, buf: &[u8]) -> bool {
        self.direct && !(buf.as_ptr() as usize).is_multiple_of(ALIGNMENT)
    }

    fn pread_all(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if self.needs_bounce(buf) {
            let mut bounce = IoBuf::new(buf.len());
            self.pread_all(&mut bounce, offset)?;
            buf.copy_from_slice(&bounce);
            return Ok(());
        }
        let len = buf.len() as u64;
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    return Err(
                        Error::new(ErrorKind::Io, Op::Read, offset, len).with_detail(format!(
                            "{} ended early (was it truncated?)",
                            self.path.display()
                        )),
                    )
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::from_io(e, Op::Read, offset, len)),
            }
        }
        Ok(())
    }

    fn pwrite_all(&self, buf: &[u8], offset: u64, op: Op) -> Result<()> {
        if self.needs_bounce(buf) {
            return self.pwrite_all(&IoBuf::from_slice(buf), offset, op);
        }
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| Error::from_io(e, op, offset, buf.len() as u64))?;
        self.wrote(offset, buf.len() as u64);
        Ok(())
    }

    /// `try_read` where RWF_NOWAIT is refused (tmpfs, for one): when cachestat(2) says
    /// every page of the range is in memory, a plain read will not wait for a disk.
    /// A page evicted in between only makes this one read wait.
    fn read_if_cached(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        offset: u64,
        total: usize,
    ) -> Result<bool> {
        if self.cached_file(offset, total as u64).is_none() {
            return Ok(false);
        }
        // Anything short or failed is left to a worker's ordinary read.
        Ok(self.preadv2(bufs, offset, 0) == total as isize)
    }

    /// One `preadv2` into `bufs` (at most MAX_IOVECS of them) at `offset`; the raw
    /// result, with errno set when it is negative.
    fn preadv2(&self, bufs: &mut [IoSliceMut<'_>], offset: u64, flags: libc::c_int) -> isize {
        // SAFETY: IoSliceMut is ABI-compatible with iovec (std guarantees it on Unix);
        // every buffer outlives the call.
        unsafe {
            libc::preadv2(
                self.fd(),
                bufs.as_ptr() as *const libc::iovec,
                bufs.len() as libc::c_int,
                offset as i64,
                flags,
            )
        }
    }

    /// Tells write-behind about a buffered write that is done.
    fn wrote(&self, offset: u64, len: u64) {
        if let Some(behind) = &self.write_behind {
            behind.wrote(offset, len);
        }
    }

    /// Pages of the range that are dirty in the page cache (not yet being written
    /// back), when the kernel can tell (cachestat(2), Linux 6.5).
    pub fn dirty_pages(&self, offset: u64, len: u64) -> Option<u64> {
        self.cachestat(offset, len).map(|stat| stat.nr_dirty)
    }

    /// Whether every page of the range is in the page cache (cachestat(2); `false`
    /// where the kernel cannot tell).
    fn all_cached(&self, offset: u64, len: u64) -> bool {
        if self.in_memory {
            return true;
        }
        let pages = (offset + len).div_ceil(PAGE) - offset / PAGE;
        self.cachestat(offset, len)
            .is_some_and(|stat| stat.nr_cache >= pages)
    }

    /// The page cache's state for the pages that hold the range.
    fn cachestat(&self, offset: u64, len: u64) -> Option<Cachestat> {
        if len == 0 || !self.cachestat_works.load(Ordering::Relaxed) {
            return None;
        }
        let first = offset / PAGE;
        let pages = (offset + len).div_ceil(PAGE) - first;
        let range = CachestatRange {
            off: first * PAGE,
            len: pages * PAGE,
        };
        let mut stat = Cachestat::default();
        // SAFETY: cachestat reads `range` and writes `stat`, both live for the call.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                self.fd(),
                &range as *const CachestatRange,
                &mut stat as *mut Cachestat,
                0,
            )
        };
        if rc != 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                self.cachestat_works.store(false, Ordering::Relaxed);
            }
            return None;
        }
        Some(stat)
    }

    /// One pwritev2 with RWF_DSYNC: data and the metadata to find it are durable on
    /// return, without a separate fdatasync of the whole file.
    fn pwrite_dsync(&self, buf: &[u8], offset: u64) -> Result<()> {
        if self.needs_bounce(buf) {
            return self.pwrite_dsync(&IoBuf::from_slice(buf), offset);
        }
        let len = buf.len() as u64;
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &buf[done..];
            let iov = libc::iovec {
                iov_base: rest.as_ptr() as *mut libc::c_void,
                iov_len: rest.len(),
            };
            // SAFETY: iov points into `buf`, which outlives the call.
            let n = unsafe {
                libc::pwritev2(
                    self.fd(),
                    &iov,
                    1,
                    (offset + done as u64) as i64,
                    libc::RWF_DSYNC,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) if done == 0 => {
                        self.dsync_works.store(false, Ordering::Relaxed);
                        self.pwrite_all(buf, offset, Op::Write)?;
                        return self.sync(Op::Write, offset, len);
                    }
                    _ => return Err(Error::from_io(err, Op::Write, offset, len)),
                }
            }
            done += n as usize;
        }
        Ok(())
    }

    fn sync(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::from_io(e, op, offset, len))
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64, op: Op) -> Result<()> {
        loop {
            // SAFETY: plain syscall on an fd we own.
            let rc = unsafe { libc::fallocate(self.fd(), mode, offset as i64, len as i64) };
            if rc == 0 {
                return Ok(());
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(Error::from_io(err, op, offset, len));
            }
        }
    }

    fn discard_block_range(&self, offset: u64, len: u64) -> Result<()> {
        // BLKDISCARD wants whole logical blocks: round inwards, trim is only a hint.
        let sector = 4096u64;
        let start = offset.div_ceil(sector) * sector;
        let end = (offset + len) / sector * sector;
        if end <= start {
            return Ok(());
        }
        let range: [u64; 2] = [start, end - start];
        // SAFETY: BLKDISCARD reads two u64 through the pointer.
        let rc = unsafe { libc::ioctl(self.fd(), BLKDISCARD, range.as_ptr()) };
        if rc < 0 {
            return Err(Error::from_io(
                io::Error::last_os_error(),
                Op::Trim,
                offset,
                len,
            ));
        }
        Ok(())
    }

    fn seek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        // SAFETY: plain syscall; the shared file offset is unused by positioned I/O.
        let at = unsafe { libc::lseek(self.fd(), offset as i64, whence) };
        if at >= 0 {
            return Ok(Some(at as u64));
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(err)
        }
    }
}

/// The offset alignment direct I/O on this file needs (statx STATX_DIOALIGN, Linux
/// 6.1+), if the kernel and file system report it.
fn dio_offset_alignment(file: &File) -> Option<u32> {
    // SAFETY: statx is plain data; all zeroes is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an empty path with AT_EMPTY_PATH asks about the open descriptor; the
    // kernel writes at most size_of::<statx>() bytes into `stx`.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    (rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0)
        .then_some(stx.stx_dio_offset_align)
}

/// ramfs's statfs type (linux/magic.h); the libc crate does not name it.
const RAMFS_MAGIC: libc::__fsword_t = 0x858458f6;

/// Whether `file` is on a file system that keeps everything in memory (tmpfs, ramfs).
/// A tmpfs page may be in swap; reading it then waits, which is slow but correct.
fn lives_in_memory(file: &File) -> bool {
    // SAFETY: statfs is plain data, for which all zeroes is a valid value.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs fills `stat`, alive for the call, for an open descriptor.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut stat) };
    rc == 0 && matches!(stat.f_type, libc::TMPFS_MAGIC | RAMFS_MAGIC)
}

impl BlockDevice for FileDevice {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.pread_all(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        if flags.fua {
            if self.dsync_works.load(Ordering::Relaxed) {
                return self.pwrite_dsync(buf, offset);
            }
            self.pwrite_all(buf, offset, Op::Write)?;
            return self.sync(Op::Write, offset, buf.len() as u64);
        }
        self.pwrite_all(buf, offset, Op::Write)
    }

    fn flush(&self) -> Result<()> {
        self.sync(Op::Flush, 0, 0)
    }

    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        if self.block_device {
            self.discard_block_range(offset, len)?;
        } else {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            self.fallocate(mode, offset, len, Op::Trim)?;
        }
        if flags.fua {
            self.sync(Op::Trim, offset, len)?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let zero_range = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
        let result = if flags.no_hole {
            self.fallocate(zero_range, offset, len, Op::WriteZeroes)
        } else {
            // A hole reads as zeroes and costs no space; fall back to ZERO_RANGE on
            // file systems that cannot punch.
            self.fallocate(punch, offset, len, Op::WriteZeroes)
                .or_else(|e| match e.kind() {
                    ErrorKind::Unsupported => {
                        self.fallocate(zero_range, offset, len, Op::WriteZeroes)
                    }
                    _ => Err(e),
                })
        };
        result?;
        if flags.fua {
            self.sync(Op::WriteZeroes, offset, len)?;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        let end = offset + len;
        let size = self.info.size;
        let seek_error = |e: io::Error| Error::from_io(e, Op::Extents, offset, len);
        let mut at = offset;
        while at < end && out.len() < MAX_EXTENTS_PER_CALL {
            let data = self.seek(at, libc::SEEK_DATA).map_err(seek_error)?;
            match data {
                None => {
                    out.push(Extent {
                        offset: at,
                        len: size.max(end) - at,
                        state: ExtentState::Hole,
                    });
                    break;
                }
                Some(data) if data > at => {
                    let stop = data.min(size.max(end));
                    out.push(Extent {
                        offset: at,
                        len: stop - at,
                        state: ExtentState::Hole,
                    });
                    at = stop;
                }
                Some(_) => {
                    let hole = self
                        .seek(at, libc::SEEK_HOLE)
                        .map_err(seek_error)?
                        .unwrap_or(size)
                        .max(at + 1);
                    out.push(Extent {
                        offset: at,
                        len: hole - at,
                        state: ExtentState::Data,
                    });
                    at = hole;
                }
            }
        }
        Ok(())
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        // SAFETY: plain syscall; advice only.
        let rc = unsafe {
            libc::posix_fadvise(
                self.fd(),
                offset as i64,
                len as i64,
                libc::POSIX_FADV_WILLNEED,
            )
        };
        if rc != 0 {
            return Err(Error::from_io(
                io::Error::from_raw_os_error(rc),
                Op::Cache,
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

impl FastPath for FileDevice {
    fn try_read_at(&self, buf: &mut [u8], offset: u64) -> Result<bool> {
        self.try_read_vectored_at(&mut [IoSliceMut::new(buf)], offset)
    }

    fn try_read_vectored_at(&self, bufs: &mut [IoSliceMut<'_>], offset: u64) -> Result<bool> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if self.direct || bufs.len() > MAX_IOVECS {
            return Ok(false);
        }
        if self.in_memory {
            // Anything short or failed is left to a worker's ordinary read.
            return Ok(self.preadv2(bufs, offset, 0) == total as isize);
        }
        if !self.nowait_works.load(Ordering::Relaxed) {
            return self.read_if_cached(bufs, offset, total);
        }
        let n = self.preadv2(bufs, offset, libc::RWF_NOWAIT);
        if n >= 0 && n as usize == total {
            return Ok(true);
        }
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => {}
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {
                    self.nowait_works.store(false, Ordering::Relaxed);
                    return self.read_if_cached(bufs, offset, total);
                }
                _ => return Err(Error::from_io(err, Op::Read, offset, total as u64)),
            }
        }
        // A short read: part of the range is not cached. Let a worker read it all.
        Ok(false)
    }

    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        if self.direct || flags.fua || bufs.len() > MAX_IOVECS {
            // Alignment bounces and durable writes have their own paths.
            return write_each(self, bufs, offset, flags);
        }
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        let mut iovecs: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        let mut first = 0;
        let mut done = 0u64;
        while done < total {
            let pending = &iovecs[first..];
            // SAFETY: the iovecs point into `bufs`, which outlive the call.
            let n = unsafe {
                libc::pwritev(
                    self.fd(),
                    pending.as_ptr(),
                    pending.len() as libc::c_int,
                    (offset + done) as i64,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::from_io(err, Op::Write, offset, total));
            }
            if n == 0 {
                return Err(Error::new(ErrorKind::NoSpace, Op::Write, offset, total)
                    .with_detail("pwritev wrote nothing"));
            }
            done += n as u64;
            // Step past what was written, trimming a partly written buffer.
            let mut left = n as usize;
            while left > 0 && first < iovecs.len() {
                let iov = &mut iovecs[first];
                if left >= iov.iov_len {
                    left -= iov.iov_len;
                    first += 1;
                } else {
                    // SAFETY: stays within the same buffer.
                    iov.iov_base =
                        unsafe { (iov.iov_base as *mut u8).add(left) } as *mut libc::c_void;
                    iov.iov_len -= left;
                    left = 0;
                }
            }
        }
        self.wrote(offset, total);
        Ok(())
    }

    fn cached_file(&self, offset: u64, len: u64) -> Option<std::os::fd::RawFd> {
        self.all_cached(offset, len).then_some(self.fd())
    }

    fn mapped_cached(&self, offset: u64, len: u64) -> Option<MappedRange> {
        // O_DIRECT exports promise reads from the device, not the page cache.
        if self.direct || !self.all_cached(offset, len) {
            return None;
        }
        let mapping = self.mapping.get_or_init(|| {
            FileMapping::map(self.fd(), self.info.size)
                .inspect_err(|e| {
                    tracing::debug!(
                        "{}: reads copy, it cannot be mapped: {e}",
                        self.path.display()
                    )
                })
                .ok()
        });
        mapping.as_ref()?.range(offset, usize::try_from(len).ok()?)
    }

    fn is_hole(&self, offset: u64, len: u64) -> Option<bool> {
        // One SEEK_DATA answers it. An extent query adds a SEEK_HOLE, which on tmpfs
        // walks every page up to the next hole: to the end of a dense file, on every
        // read, under the inode lock.
        match self.seek(offset, libc::SEEK_DATA) {
            Ok(None) => Some(true),
            Ok(Some(data)) => Some(data >= offset + len),
            Err(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{conformance, Device};

    fn sparse_file(size: u64) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(size).unwrap();
        file
    }

    #[test]
    fn passes_the_conformance_suite() {
        let file = sparse_file(16 << 20);
        let device = FileDevice::open(file.path(), FileOptions::default()).unwrap();
        conformance::run_all(&Device::from_device(device));
    }

    #[test]
    fn passes_the_conformance_suite_with_direct_io() {
        let file = sparse_file(16 << 20);
        let options = FileOptions {
            direct: true,
            ..FileOptions::default()
        };
        match FileDevice::open(file.path(), options) {
            Ok(device) => conformance::run_all(&Device::from_device(device)),
            // tmpfs has no O_DIRECT; nothing to test there.
            Err(e) if e.kind() == ErrorKind::InvalidArgument => {
                eprintln!(
                    "skipped: O_DIRECT not supported for {}",
                    file.path().display()
                )
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn passes_the_read_only_suite() {
        let file = sparse_file(16 << 20);
        let writable =
            Device::from_device(FileDevice::open(file.path(), FileOptions::default()).unwrap());
        let options = FileOptions {
            read_only: true,
            ..FileOptions::default()
        };
        let read_only = Device::from_device(FileDevice::open(file.path(), options).unwrap());
        conformance::run_read_only(&read_only, &writable);
    }

    #[test]
    fn cached_ranges_offer_their_file() {
        let file = sparse_file(1 << 20);
        let device = FileDevice::open(file.path(), FileOptions::default()).unwrap();
        device.write_at(&[5u8; 65536], 0, WriteFlags::NONE).unwrap();
        // Just written through the page cache, so resident; only a kernel without
        // cachestat(2) makes no offer.
        let offer = device.cached_file(0, 65536);
        if device.cachestat_works.load(Ordering::Relaxed) {
            assert_eq!(offer, Some(device.fd()));
        } else {
            assert_eq!(offer, None);
        }
        let direct = FileOptions {
            direct: true,
            ..FileOptions::default()
        };
        if let Ok(direct) = FileDevice::open(file.path(), direct) {
            assert_eq!(direct.cached_file(0, 65536), None);
        }
    }

    #[test]
    fn files_in_memory_read_inline_without_asking_the_page_cache() {
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            eprintln!("no /dev/shm here");
            return;
        };
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![3u8; 64 * 1024]).unwrap();
        let device = FileDevice::open(&path, FileOptions::default()).unwrap();
        assert_eq!(device.in_memory, lives_in_memory(&device.file));
        if !device.in_memory {
            eprintln!("/dev/shm is not tmpfs here");
            return;
        }
        // Even with cachestat(2) unavailable, a read of a tmpfs file runs inline.
        device.cachestat_works.store(false, Ordering::Relaxed);
        let mut buf = vec![0u8; 4096];
        assert!(device.try_read_at(&mut buf, 8192).unwrap());
        assert_eq!(buf, vec![3u8; 4096]);
        assert_eq!(device.cached_file(0, 65536), Some(device.fd()));
        // Past the end a read is short, and left to the ordinary path.
        assert!(!device.try_read_at(&mut buf, 62 * 1024).unwrap());
        let direct = FileDevice::open(
            &path,
            FileOptions {
                direct: true,
                ..FileOptions::default()
            },
        );
        if let Ok(direct) = direct {
            assert!(!direct.in_memory);
        }
    }

    #[test]
    fn is_hole_is_true_only_for_ranges_with_no_data() {
        let file = sparse_file(4 << 20);
        let device = FileDevice::open(file.path(), FileOptions::default()).unwrap();
        device
            .write_at(&[9u8; 65536], 1 << 20, WriteFlags::NONE)
            .unwrap();
        // SEEK_DATA granularity is the file system's block; 64 KiB apart is plenty.
        assert_eq!(device.is_hole(0, 512 << 10), Some(true));
        assert_eq!(device.is_hole(1 << 20, 65536), Some(false));
        assert_eq!(
            device.is_hole(512 << 10, 1 << 20),
            Some(false),
            "ends in data"
        );
        assert_eq!(
            device.is_hole(2 << 20, 2 << 20),
            Some(true),
            "runs to the end"
        );
        let handle = Device::from_device(device);
        assert!(handle.is_hole(0, 512 << 10).unwrap());
        assert!(!handle.is_hole((1 << 20) + 4096, 4096).unwrap());
    }

    /// tmpfs refuses RWF_NOWAIT; cached reads must still finish without a worker.
    #[test]
    fn cached_reads_finish_inline_where_nowait_is_refused() {
        let Ok(file) = tempfile::NamedTempFile::new_in("/dev/shm") else {
            eprintln!("skipped: no /dev/shm");
            return;
        };
        file.as_file().set_len(1 << 20).unwrap();
        let device = FileDevice::open(file.path(), FileOptions::default()).unwrap();
        device
            .write_at(&[7u8; 65536], 8192, WriteFlags::NONE)
            .unwrap();
        let mut back = vec![0u8; 65536];
        // Twice: the first call may be the one that learns RWF_NOWAIT is refused.
        for _ in 0..2 {
            back.fill(0);
            let done = device.try_read_at(&mut back, 8192).unwrap();
            if device.cachestat_works.load(Ordering::Relaxed) {
                assert!(done, "a resident range is read inline");
                assert!(back.iter().all(|&b| b == 7));
            } else {
                eprintln!("skipped: no cachestat(2), residency unknown");
            }
        }
    }

    #[test]
    fn vectored_writes_and_cached_vectored_reads() {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(1 << 20).unwrap();
        let device = FileDevice::open(file.path(), FileOptions::default()).unwrap();
        let parts: Vec<Vec<u8>> = (0..5u8)
            .map(|i| vec![i + 1; 1024 + usize::from(i)])
            .collect();
        let slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        device
            .write_vectored_at(&slices, 4096, WriteFlags::default())
            .unwrap();
        let expected: Vec<u8> = parts.concat();
        let mut back = vec![0u8; expected.len()];
        device.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, expected);

        let mut a = vec![0u8; 1000];
        let mut b = vec![0u8; expected.len() - 1000];
        let mut bufs = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)];
        // Just written through the page cache: a non-blocking read succeeds (or the
        // kernel does not support RWF_NOWAIT on this file system, and says so).
        if device.try_read_vectored_at(&mut bufs, 4096).unwrap() {
            assert_eq!([a, b].concat(), expected);
        }
    }

    /// Dirty pages of the first `len` bytes, polled until they fall to `at_most` or
    /// five seconds pass; `None` without cachestat(2).
    fn dirty_after_waiting(device: &FileDevice, len: u64, at_most: u64) -> Option<u64> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let dirty = device.dirty_pages(0, len)?;
            if dirty <= at_most || std::time::Instant::now() >= deadline {
                return Some(dirty);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn sequential_writes_are_written_behind_without_a_flush() {
        const LEN: u64 = 32 << 20;
        let behind_file = sparse_file(LEN);
        let kernel_file = sparse_file(LEN);
        let behind = FileDevice::open(
            behind_file.path(),
            FileOptions {
                write_behind: 4 << 20,
                ..FileOptions::default()
            },
        )
        .unwrap();
        let kernel = FileDevice::open(
            kernel_file.path(),
            FileOptions {
                write_behind: 0,
                ..FileOptions::default()
            },
        )
        .unwrap();
        let block = vec![0x5au8; 1 << 20];
        for n in 0..LEN >> 20 {
            behind.write_at(&block, n << 20, WriteFlags::NONE).unwrap();
            kernel.write_at(&block, n << 20, WriteFlags::NONE).unwrap();
        }
        let pages = LEN / PAGE;
        // Written behind: everything but the last stream piece (4 MiB = 1024 pages)
        // goes to writeback.
        let Some(dirty) = dirty_after_waiting(&behind, LEN, 1024) else {
            eprintln!("skipped: no cachestat(2) on this kernel");
            return;
        };
        // Left alone, the kernel keeps its pages dirty for its 30 s expiry (unless a
        // flusher happened to run: then the comparison says nothing).
        let kernel_dirty = kernel.dirty_pages(0, LEN).unwrap();
        if kernel_dirty < pages / 2 {
            eprintln!("skipped: the kernel wrote back on its own ({kernel_dirty} dirty)");
            return;
        }
        assert!(dirty <= 1024, "{dirty} of {pages} pages still dirty");
        assert_eq!(behind.write_behind.as_ref().unwrap().threshold(), 4 << 20);
        assert!(kernel.write_behind.is_none());
    }

    #[test]
    fn refuses_directories() {
        let dir = tempfile::tempdir().unwrap();
        let err = FileDevice::open(dir.path(), FileOptions::default());
        assert!(err.is_err());
    }

    #[test]
    fn a_sparse_file_reports_one_hole() {
        let file = sparse_file(1 << 20);
        let device = FileDevice::open(file.path(), FileOptions::default()).unwrap();
        let mut out = Vec::new();
        device.extents(0, 1 << 20, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].state, ExtentState::Hole);
    }
}
