//! The attributes of the two inodes: the root directory and the device file.

use std::time::SystemTime;

use fuser::{FileAttr, FileType, INodeNo};

/// The root directory's inode (FUSE fixes it at 1).
pub const ROOT: INodeNo = INodeNo::ROOT;
/// The device file's inode.
pub const FILE: INodeNo = INodeNo(2);

/// What the attributes are built from; fixed for the life of a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    /// When the file system was mounted: every timestamp.
    pub since: SystemTime,
}

/// The device file: a regular file of the device's size, 0600 (0400 read-only),
/// all of it allocated as far as `stat` can tell (`st_blocks` counts 512-byte units).
pub fn file_attr(owner: Owner, size: u64, read_only: bool, preferred: u32) -> FileAttr {
    FileAttr {
        ino: FILE,
        size,
        blocks: size.div_ceil(512),
        atime: owner.since,
        mtime: owner.since,
        ctime: owner.since,
        crtime: owner.since,
        kind: FileType::RegularFile,
        perm: if read_only { 0o400 } else { 0o600 },
        nlink: 1,
        uid: owner.uid,
        gid: owner.gid,
        rdev: 0,
        blksize: io_size(preferred),
        flags: 0,
    }
}

/// The root directory: holds the one file and nothing else.
pub fn root_attr(owner: Owner) -> FileAttr {
    FileAttr {
        ino: ROOT,
        size: 0,
        blocks: 0,
        atime: owner.since,
        mtime: owner.since,
        ctime: owner.since,
        crtime: owner.since,
        kind: FileType::Directory,
        perm: 0o700,
        nlink: 2,
        uid: owner.uid,
        gid: owner.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// `st_blksize`, the I/O size tools such as `cp` and `dd` pick: the device's
/// preferred size, kept within what a FUSE request carries.
pub fn io_size(preferred: u32) -> u32 {
    preferred.clamp(4096, 1 << 20)
}

/// `statfs` in blocks of [`io_size`]: the device's whole size, all of it used (the
/// file never grows, so no space is free).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    pub blocks: u64,
    pub block_size: u32,
}

pub fn fs_stats(size: u64, preferred: u32) -> FsStats {
    let block_size = io_size(preferred);
    FsStats {
        blocks: size.div_ceil(u64::from(block_size)),
        block_size,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner {
        Owner {
            uid: 1000,
            gid: 100,
            since: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn the_file_has_the_device_size_and_its_mode() {
        let attr = file_attr(owner(), 10 * 1024 * 1024 + 1, false, 4096);
        assert_eq!(attr.ino, FILE);
        assert_eq!(attr.size, 10 * 1024 * 1024 + 1);
        assert_eq!(attr.blocks, 20 * 1024 + 1);
        assert_eq!(attr.kind, FileType::RegularFile);
        assert_eq!(attr.perm, 0o600);
        assert_eq!((attr.uid, attr.gid), (1000, 100));
        assert_eq!(file_attr(owner(), 512, true, 4096).perm, 0o400);
    }

    #[test]
    fn the_root_is_a_private_directory() {
        let attr = root_attr(owner());
        assert_eq!(attr.ino, ROOT);
        assert_eq!(attr.kind, FileType::Directory);
        assert_eq!(attr.perm, 0o700);
        assert_eq!(attr.nlink, 2);
    }

    #[test]
    fn io_size_stays_within_one_request() {
        assert_eq!(io_size(512), 4096);
        assert_eq!(io_size(65536), 65536);
        assert_eq!(io_size(64 << 20), 1 << 20);
    }

    #[test]
    fn statfs_counts_the_whole_device() {
        let stats = fs_stats(1 << 30, 4096);
        assert_eq!(stats.blocks, 1 << 18);
        assert_eq!(stats.block_size, 4096);
        assert_eq!(fs_stats(4097, 4096).blocks, 2);
    }
}
