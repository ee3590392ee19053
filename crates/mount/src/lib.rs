//! `blockwire mount`: any device blockwire can open, exposed as one file through FUSE.
//!
//! The mount directory holds one regular file (`disk` unless named otherwise) whose
//! bytes are the device's: reads, writes, fsync (a device flush) and fallocate
//! (zeroing) go through the checked [`Device`](blockwire_blockdev::Device) handle.
//! A loop device over that file gives the kernel a block device, so any file system
//! can live on any target blockwire reaches (nbdfuse's model). FUSE is spoken
//! directly over /dev/fuse (fuser without libfuse); mounting as a user goes through
//! the setuid `fusermount`.

pub mod attr;
pub mod errno;
mod fs;
pub mod range;
mod session;

pub use fs::{DeviceFile, MAX_REQUEST};
pub use session::{
    check_directory, check_name, mount, MountError, MountOptions, Mounted, UnmountError, Unmounter,
};
