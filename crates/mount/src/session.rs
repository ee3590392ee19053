//! Mounting: checks on the directory, the FUSE session and its threads, and the
//! unmount that ends it.

use std::ffi::{CString, OsString};
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime};

use blockwire_blockdev::Device;
use fuser::{Config, MountOption, Session, SessionUnmounter};

use crate::attr::Owner;
use crate::fs::DeviceFile;

/// How a device is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// The file's name in the mount directory.
    pub name: String,
    /// Refuse writes (the device is opened read-only too).
    pub read_only: bool,
    /// Threads serving FUSE requests: as many requests reach the device at once.
    pub threads: usize,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            name: "disk".to_string(),
            read_only: false,
            threads: 8,
        }
    }
}

/// Why a mount did not happen.
#[derive(Debug)]
pub enum MountError {
    /// The directory is missing, not a directory, or not empty.
    Directory(PathBuf, String),
    /// The file name is unusable.
    Name(String),
    /// The kernel or fusermount refused.
    Fuse(PathBuf, io::Error),
}

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MountError::Directory(dir, why) => write!(f, "{}: {why}", dir.display()),
            MountError::Name(why) => f.write_str(why),
            MountError::Fuse(dir, e) => {
                write!(f, "cannot mount on {}: {e}", dir.display())?;
                if !Path::new("/dev/fuse").exists() {
                    write!(f, " (/dev/fuse is missing: modprobe fuse)")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for MountError {}

/// Checks that `name` is one plain file name.
pub fn check_name(name: &str) -> Result<(), MountError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(MountError::Name(format!(
            "'{name}' is not a file name (no '/', not empty, not . or ..)"
        )));
    }
    Ok(())
}

/// Checks that `dir` is an existing, empty directory: mounting over files would
/// hide them.
pub fn check_directory(dir: &Path) -> Result<(), MountError> {
    let refuse = |why: &str| Err(MountError::Directory(dir.to_path_buf(), why.to_string()));
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return refuse("no such directory"),
        Err(e) => return refuse(&e.to_string()),
        Ok(meta) if !meta.is_dir() => return refuse("not a directory"),
        Ok(_) => {}
    }
    match std::fs::read_dir(dir) {
        Err(e) => refuse(&e.to_string()),
        Ok(mut entries) => match entries.next() {
            Some(_) => refuse("not empty (mounting would hide what is in it)"),
            None => Ok(()),
        },
    }
}

/// A mounted device. The mount lasts until [`Unmounter::unmount`] (or `fusermount
/// -u`, `umount`) ends it; [`wait`](Mounted::wait) returns then.
pub struct Mounted {
    dir: PathBuf,
    file: PathBuf,
    session: thread::JoinHandle<io::Result<()>>,
    fuser_mount: Arc<Mutex<Option<SessionUnmounter>>>,
}

impl Mounted {
    /// The device file, `DIR/NAME`.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// What ends the mount, for another thread (a signal handler's).
    pub fn unmounter(&self) -> Unmounter {
        Unmounter {
            dir: self.dir.clone(),
            fuser_mount: self.fuser_mount.clone(),
        }
    }

    /// Blocks until the file system is unmounted and its threads are done.
    pub fn wait(self) -> io::Result<()> {
        self.session
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("a FUSE thread panicked")))
    }
}

/// Mounts `device` as one file in `dir`, served by `options.threads` threads.
pub fn mount(device: Device, dir: &Path, options: &MountOptions) -> Result<Mounted, MountError> {
    check_name(&options.name)?;
    check_directory(dir)?;
    let dir = dir
        .canonicalize()
        .map_err(|e| MountError::Directory(dir.to_path_buf(), e.to_string()))?;
    let device = if options.read_only {
        device.read_only()
    } else {
        device
    };
    let owner = Owner {
        // SAFETY: geteuid and getegid cannot fail and touch no memory.
        uid: unsafe { libc::geteuid() },
        // SAFETY: as above.
        gid: unsafe { libc::getegid() },
        since: SystemTime::now(),
    };
    let read_only = device.info().read_only;
    let filesystem = DeviceFile::new(device, OsString::from(&options.name), owner);
    let mut mount_options = vec![
        MountOption::FSName("blockwire".to_string()),
        MountOption::Subtype("blockwire".to_string()),
        // The kernel checks the file's mode (0600, 0400 read-only) for every user.
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::NoExec,
        MountOption::NoAtime,
    ];
    mount_options.push(if read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.n_threads = Some(options.threads.max(1));
    // One /dev/fuse descriptor per thread: no thread waits on another's read.
    config.clone_fd = true;
    let fuse_error = |e| MountError::Fuse(dir.clone(), e);
    let mut session = Session::new(filesystem, &dir, &config).map_err(fuse_error)?;
    let fuser_mount = session.unmount_callable();
    let session = thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || session.run())
        .map_err(fuse_error)?;
    Ok(Mounted {
        file: dir.join(&options.name),
        dir,
        session,
        fuser_mount: Arc::new(Mutex::new(Some(fuser_mount))),
    })
}

/// Ends a mount from any thread.
#[derive(Debug, Clone)]
pub struct Unmounter {
    dir: PathBuf,
    /// fuser's handle: it unmounts once and is spent, even when that failed (and
    /// then answers every later call with a success that unmounted nothing).
    fuser_mount: Arc<Mutex<Option<SessionUnmounter>>>,
}

/// Why an unmount did not happen.
#[derive(Debug)]
pub enum UnmountError {
    /// Something still has the file open: a loop device, most likely.
    Busy(PathBuf),
    Failed(PathBuf, String),
}

impl fmt::Display for UnmountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnmountError::Busy(dir) => write!(
                f,
                "{} is busy: something still uses the file (a loop device? see \
                 `losetup -j FILE`, then `losetup -d`)",
                dir.display()
            ),
            UnmountError::Failed(dir, why) => {
                write!(f, "cannot unmount {}: {why}", dir.display())
            }
        }
    }
}

impl std::error::Error for UnmountError {}

/// How long an unmount keeps trying while the mount is busy: a loop device just
/// detached lets go of the file a moment later.
const BUSY_RETRIES: u32 = 5;
const BUSY_PAUSE: Duration = Duration::from_millis(100);

impl Unmounter {
    /// Unmounts, never lazily: a mount still in use stays, and its users keep
    /// working (a lazy unmount would cut a loop device off from its data).
    pub fn unmount(&self) -> Result<(), UnmountError> {
        // fuser's handle first: once it has unmounted, the session's end does not try
        // again (and warn). As root it is umount(2); as a user, `fusermount -u -z`.
        let fuser_mount = self
            .fuser_mount
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(mut fuser_mount) = fuser_mount {
            match fuser_mount.unmount() {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(()),
                Err(e) => return Err(UnmountError::Failed(self.dir.clone(), e.to_string())),
            }
        }
        // Busy. Its handle is spent; try again ourselves for a moment (a loop device
        // just detached lets go of the file a little later).
        let path = CString::new(self.dir.as_os_str().as_bytes())
            .map_err(|e| UnmountError::Failed(self.dir.clone(), e.to_string()))?;
        for attempt in 0..=BUSY_RETRIES {
            // SAFETY: umount2 reads a NUL-terminated path that lives across the call.
            let result = unsafe { libc::umount2(path.as_ptr(), 0) };
            if result == 0 {
                return Ok(());
            }
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                // Not root: the setuid helper unmounts what the user mounted.
                Some(libc::EPERM) => return self.fusermount(),
                // Not mounted (any more): already done.
                Some(libc::EINVAL) => return Ok(()),
                Some(libc::EBUSY) if attempt < BUSY_RETRIES => thread::sleep(BUSY_PAUSE),
                Some(libc::EBUSY) => return Err(UnmountError::Busy(self.dir.clone())),
                _ => return Err(UnmountError::Failed(self.dir.clone(), error.to_string())),
            }
        }
        Err(UnmountError::Busy(self.dir.clone()))
    }

    fn fusermount(&self) -> Result<(), UnmountError> {
        let output = Command::new("fusermount")
            .arg("-u")
            .arg("--")
            .arg(&self.dir)
            .output()
            .map_err(|e| UnmountError::Failed(self.dir.clone(), format!("fusermount: {e}")))?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("busy") {
            return Err(UnmountError::Busy(self.dir.clone()));
        }
        Err(UnmountError::Failed(
            self.dir.clone(),
            stderr.trim().to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_file_names() {
        assert!(check_name("disk").is_ok());
        assert!(check_name("vm-1.img").is_ok());
        for bad in ["", ".", "..", "a/b", "/disk", "nul\0"] {
            assert!(check_name(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn the_directory_must_exist_be_one_and_be_empty() {
        let dir = tempfile_dir();
        assert!(check_directory(&dir).is_ok());
        let missing = dir.join("missing");
        let err = check_directory(&missing).unwrap_err().to_string();
        assert!(err.contains("no such directory"), "{err}");
        let file = dir.join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = check_directory(&file).unwrap_err().to_string();
        assert!(err.contains("not a directory"), "{err}");
        let err = check_directory(&dir).unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "blockwire-mount-test-{}-{:?}",
            std::process::id(),
            thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
