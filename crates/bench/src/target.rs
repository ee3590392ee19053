//! What is measured: a file, a block device or a directory given as a path, or a
//! remote target given as a URI.
//!
//! A path is opened as a [`Device`] through [`FileDevice`]: a file or block device
//! directly, a directory through a test file created inside it (and removed
//! afterwards). A URI names a remote host; once blockwire has initiators, opening
//! one yields a `Device` too and the same workloads run on it
//! ([`crate::bench_device`] takes any `Device`).
//!
//! Safety rules: nothing is written that the user did not name; a device or file
//! that holds a file system or partition table is refused without `--force`; a file
//! that does not exist is created only when a size is given.

use std::fs::{self, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use blockwire_blockdev::size::format_size;
use blockwire_blockdev::{Device, ErrorKind, FileDevice, FileOptions};

use crate::error::{Error, Result};
use crate::machine;

/// Files and directories the bench created and has not removed yet, so that an
/// interrupted run can still clean up ([`remove_created`]).
static CREATED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());

pub(crate) fn track(path: &Path) {
    CREATED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(path.to_path_buf());
}

pub(crate) fn untrack(path: &Path) {
    CREATED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| p != path);
}

/// Removes every test file and directory the bench created and still holds. For a
/// signal handler: a run stopped by SIGINT leaves nothing behind.
pub fn remove_created() -> Vec<PathBuf> {
    let created: Vec<PathBuf> =
        std::mem::take(&mut *CREATED.lock().unwrap_or_else(|e| e.into_inner()));
    for path in &created {
        let _ = if path.is_dir() {
            fs::remove_dir_all(path)
        } else {
            fs::remove_file(path)
        };
    }
    created
}

/// The smallest data set worth measuring.
pub const MIN_SIZE: u64 = 1 << 20;
/// Default data set with direct I/O, where the page cache plays no part.
pub const DIRECT_DEFAULT_SIZE: u64 = 1 << 30;

/// A target as the user named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A file, block device or directory.
    Path(PathBuf),
    /// A remote target: `nbd://host[:port]/export`, `iscsi://…`, `aoe://…` or a bare
    /// `host:port`.
    Remote(RemoteTarget),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteTarget {
    pub uri: String,
    pub scheme: String,
    /// The host, without a `user@` in front (an iSCSI CHAP name, an NBD TLS
    /// username).
    pub host: String,
    pub port: Option<u16>,
}

impl RemoteTarget {
    /// The TCP port the target listens on: the URI's, else the protocol's registered
    /// port (NBD 10809, iSCSI 3260); `None` for a target with no TCP port (AoE, a
    /// Unix socket, a stripe, RBD).
    pub fn tcp_port(&self) -> Option<u16> {
        if self.host.is_empty() {
            return None;
        }
        self.port.or(match self.scheme.as_str() {
            "nbd" | "nbds" => Some(NBD_PORT),
            "iscsi" => Some(ISCSI_PORT),
            "nvme+tcp" => Some(NVME_TCP_PORT),
            "nfs" => Some(NFS_PORT),
            _ => None,
        })
    }
}

/// NBD's registered port, the one `nbd://host/export` means.
pub const NBD_PORT: u16 = 10809;
/// iSCSI's registered port, the one `iscsi://host/IQN/LUN` means (RFC 7143 §13.1).
pub const ISCSI_PORT: u16 = 3260;
/// NVMe/TCP's I/O port, the one `nvme+tcp://host/NQN` means (IANA, NVMe/TCP transport 1.0).
pub const NVME_TCP_PORT: u16 = 4420;

/// NFS's registered port, where NFSv4 (and, with our ganesha, NFSv3) is served:
/// the port whose listener is the NFS server on this host.
pub const NFS_PORT: u16 = 2049;

/// The `scheme://` forms the bench measures; `stripe:`, `rbd:` and a bare `host:port`
/// besides.
pub const URI_SCHEMES: [&str; 9] = [
    "file",
    "nbd",
    "nbd+unix",
    "nbds",
    "nbds+unix",
    "aoe",
    "iscsi",
    "nvme+tcp",
    "nfs",
];

/// What the bench takes, in the words of the line that refuses anything else.
pub const ACCEPTED: &str = "a path, file://, nbd://, nbd+unix://, nbds://, nbds+unix://, \
aoe://, iscsi://, nvme+tcp://, nfs://, stripe:CHUNK:URI,... or rbd:POOL/IMAGE to measure, or HOST:PORT for the \
network alone";

impl TargetSpec {
    /// Tells paths from URIs: `file:///p` and anything that exists or contains a
    /// slash without a scheme is a path; `scheme://…` and `host:port` are remote.
    pub fn parse(text: &str) -> TargetSpec {
        // A striped volume (`stripe:CHUNK:MEMBER,...`) is opened by the caller and
        // measured as a device; it has no one host.
        if text.starts_with("stripe:") {
            return TargetSpec::Remote(RemoteTarget {
                uri: text.to_string(),
                scheme: "stripe".into(),
                host: String::new(),
                port: None,
            });
        }
        // A Ceph RBD image (`rbd:POOL/IMAGE...`) is opened by the caller through
        // librbd, which talks to the whole cluster: no one host either.
        if text.starts_with("rbd:") {
            return TargetSpec::Remote(RemoteTarget {
                uri: text.to_string(),
                scheme: "rbd".into(),
                host: String::new(),
                port: None,
            });
        }
        if let Some(path) = text.strip_prefix("file://") {
            return TargetSpec::Path(PathBuf::from(path));
        }
        if let Some((scheme, rest)) = text.split_once("://") {
            let authority = rest.split(['/', '?']).next().unwrap_or("");
            let (host, port) = split_host_port(authority);
            return TargetSpec::Remote(RemoteTarget {
                uri: text.to_string(),
                scheme: scheme.to_ascii_lowercase(),
                host,
                port,
            });
        }
        let (host, port) = split_host_port(text);
        if port.is_some() && !text.contains('/') && !Path::new(text).exists() {
            return TargetSpec::Remote(RemoteTarget {
                uri: text.to_string(),
                scheme: "tcp".into(),
                host,
                port,
            });
        }
        TargetSpec::Path(PathBuf::from(text))
    }

    /// Refuses a target whose URI scheme the bench does not speak, in one line
    /// naming what it takes: before anything is opened or sent, so that a scheme
    /// blockwire has no initiator for is not mistaken for a host to measure.
    pub fn check(&self) -> Result<()> {
        let TargetSpec::Remote(remote) = self else {
            return Ok(());
        };
        let known = match remote.scheme.as_str() {
            // Set by `parse` for the forms without "://" of their own.
            "stripe" | "rbd" => remote.uri.starts_with(&format!("{}:", remote.scheme)),
            "tcp" => !remote.uri.contains("://"),
            scheme => URI_SCHEMES.contains(&scheme),
        };
        if known {
            return Ok(());
        }
        Err(Error::target(format!(
            "{}: blockwire bench does not speak {}://; it takes {ACCEPTED}",
            remote.uri, remote.scheme
        )))
    }
}

/// `host`, `host:port`, `[v6]:port`, with or without `user@` -> (host, port).
fn split_host_port(authority: &str) -> (String, Option<u16>) {
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if let Some(rest) = authority.strip_prefix('[') {
        if let Some((host, after)) = rest.split_once(']') {
            let port = after.strip_prefix(':').and_then(|p| p.parse().ok());
            return (host.to_string(), port);
        }
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(port) => (host.to_string(), Some(port)),
            Err(_) => (authority.to_string(), None),
        },
        _ => (authority.to_string(), None),
    }
}

/// What kind of path the target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    File,
    BlockDevice,
    Directory,
}

/// How to open a path target.
#[derive(Debug, Clone, Copy)]
pub struct OpenRequest {
    /// Data set size; `None` for the default.
    pub size: Option<u64>,
    /// Bypass the page cache where the file system allows it; where it does not,
    /// fall back to buffered I/O with a note, unless `require_direct`.
    pub direct: bool,
    /// `--direct` was given: a file system without O_DIRECT is an error.
    pub require_direct: bool,
    /// Write even to a device or file that holds a file system.
    pub force: bool,
    /// Whether the workloads write (they all do but the network test).
    pub writes: bool,
}

/// An opened path target. Dropping it removes the test file it created.
pub struct OpenedTarget {
    pub device: Device,
    pub kind: TargetKind,
    /// The data set in bytes (a multiple of 4 KiB, at most the device's size).
    pub size: u64,
    /// On a directory target: the directory (bonnie's file tests run there).
    pub dir: Option<PathBuf>,
    /// The file behind `device` when there is one (bonnie's per-character tests
    /// stream through it).
    pub file: Option<PathBuf>,
    /// Whether the target already holds data (false for a file created here).
    pub holds_data: bool,
    /// Whether I/O bypasses the page cache: as asked, unless the file system had
    /// no O_DIRECT and the bench fell back to buffered I/O (see `notes`).
    pub direct: bool,
    /// What the user should be told (a file created, a size capped, ...).
    pub notes: Vec<String>,
    remove: Option<PathBuf>,
}

impl Drop for OpenedTarget {
    fn drop(&mut self) {
        if let Some(path) = &self.remove {
            untrack(path);
            if let Err(e) = fs::remove_file(path) {
                tracing::warn!("could not remove {}: {e}", path.display());
            }
        }
    }
}

/// The default data set: with the page cache in play, twice the RAM (seed 002's
/// rule), otherwise 1 GiB.
pub fn default_size(direct: bool) -> u64 {
    if direct {
        DIRECT_DEFAULT_SIZE
    } else {
        (machine::memory_bytes() * 2).max(DIRECT_DEFAULT_SIZE)
    }
}

fn round_down(size: u64) -> u64 {
    size / 4096 * 4096
}

/// Opens a path target for measuring.
pub fn open(path: &Path, request: &OpenRequest) -> Result<OpenedTarget> {
    let shown = path.display();
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => open_directory(path, request),
        Ok(meta) if meta.is_file() || meta.file_type().is_block_device() => {
            let kind = if meta.is_file() {
                TargetKind::File
            } else {
                TargetKind::BlockDevice
            };
            open_existing(path, kind, request)
        }
        Ok(_) => Err(Error::target(format!(
            "{shown} is neither a file, a block device nor a directory"
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_file(path, request),
        Err(e) => Err(Error::io_at("cannot examine", path, e)),
    }
}

/// Opens the file or device; returns it and whether its I/O is direct.
fn open_device(
    path: &Path,
    request: &OpenRequest,
    notes: &mut Vec<String>,
) -> Result<(Device, bool)> {
    // A plain file, as other tools measure it: writeback left to the kernel.
    let options = FileOptions {
        read_only: !request.writes,
        direct: request.direct,
        write_behind: 0,
    };
    let shown = path.display();
    let failed = |e: blockwire_blockdev::Error| match e.kind() {
        ErrorKind::ReadOnly => Error::target(format!(
            "{shown} is read-only ({e}); the write tests need write access"
        )),
        _ => Error::target(format!("cannot open {shown}: {e}")),
    };
    match FileDevice::open(path, options) {
        Ok(device) => Ok((Device::from_device(device), request.direct)),
        Err(e) if e.kind() == ErrorKind::InvalidArgument && request.direct => {
            if request.require_direct {
                return Err(Error::target(format!(
                    "{shown}: direct I/O (O_DIRECT) is not supported here; use --buffered"
                )));
            }
            // Direct where possible (the default): this file system has no
            // O_DIRECT, so measure through the page cache and say so.
            let buffered = FileOptions {
                direct: false,
                ..options
            };
            let device = FileDevice::open(path, buffered).map_err(failed)?;
            notes.push(format!(
                "{shown}: the file system has no direct I/O (O_DIRECT); measuring \
                 buffered, through the page cache"
            ));
            Ok((Device::from_device(device), false))
        }
        Err(e) => Err(failed(e)),
    }
}

fn open_existing(path: &Path, kind: TargetKind, request: &OpenRequest) -> Result<OpenedTarget> {
    let shown = path.display();
    if request.writes && !request.force {
        if let Some(what) = filesystem_signature(path) {
            return Err(Error::target(format!(
                "{shown} holds {what}; refusing to overwrite it (use --force)"
            )));
        }
    }
    let mut notes = Vec::new();
    let (device, direct) = open_device(path, request, &mut notes)?;
    let available = round_down(device.size());
    if available < MIN_SIZE {
        return Err(Error::target(format!(
            "{shown} is too small ({} bytes; at least {} needed)",
            device.size(),
            format_size(MIN_SIZE)
        )));
    }
    let size = match request.size {
        Some(size) if size > device.size() => {
            return Err(Error::target(format!(
                "{shown} is {} bytes, smaller than --size {size}",
                device.size()
            )))
        }
        Some(size) => round_down(size),
        None => default_size(request.direct).min(available),
    };
    check_min(size)?;
    Ok(OpenedTarget {
        device,
        kind,
        size,
        dir: None,
        file: (kind == TargetKind::File).then(|| path.to_path_buf()),
        holds_data: true,
        direct,
        notes,
        remove: None,
    })
}

fn check_min(size: u64) -> Result<()> {
    if size < MIN_SIZE {
        return Err(Error::target(format!(
            "--size {size} is too small (at least {} needed)",
            format_size(MIN_SIZE)
        )));
    }
    Ok(())
}

/// Checks the free space of `dir` for a data set; a default size is capped to 90%
/// of it, an explicit one must fit.
fn fit_in(dir: &Path, request: &OpenRequest, notes: &mut Vec<String>) -> Result<u64> {
    let shown = dir.display();
    let free = machine::free_bytes(dir).map_err(|e| Error::io_at("cannot examine", dir, e))?;
    if free < MIN_SIZE {
        return Err(Error::target(format!(
            "{shown} has no space left ({free} bytes free)"
        )));
    }
    let size = match request.size {
        Some(size) if size > free => {
            return Err(Error::target(format!(
                "{shown} has {} free; --size {} does not fit",
                format_size(round_down(free)),
                format_size(size)
            )))
        }
        Some(size) => round_down(size),
        None => {
            let wanted = default_size(request.direct);
            let cap = round_down(free / 10 * 9);
            if wanted > cap {
                notes.push(format!(
                    "data set capped at {} by the free space in {shown}",
                    format_size(cap >> 20 << 20)
                ));
                cap >> 20 << 20
            } else {
                wanted
            }
        }
    };
    check_min(size)?;
    Ok(size)
}

fn new_test_file(path: &Path, size: u64) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM) => Error::target(format!(
                "cannot create {}: {e} (the write tests need write access)",
                path.display()
            )),
            _ => Error::io_at("cannot create", path, e),
        })?;
    track(path);
    file.set_len(size).map_err(|e| {
        untrack(path);
        let _ = fs::remove_file(path);
        Error::io_at("cannot size", path, e)
    })
}

/// Removes a test file whose device could not be opened.
fn discard(path: &Path) {
    untrack(path);
    let _ = fs::remove_file(path);
}

fn open_directory(dir: &Path, request: &OpenRequest) -> Result<OpenedTarget> {
    let mut notes = Vec::new();
    let size = fit_in(dir, request, &mut notes)?;
    let file = dir.join(format!("blockwire-bench.{}.tmp", std::process::id()));
    new_test_file(&file, size)?;
    let (device, direct) = match open_device(&file, request, &mut notes) {
        Ok(opened) => opened,
        Err(e) => {
            discard(&file);
            return Err(e);
        }
    };
    Ok(OpenedTarget {
        device,
        kind: TargetKind::Directory,
        size,
        dir: Some(dir.to_path_buf()),
        file: Some(file.clone()),
        holds_data: false,
        direct,
        notes,
        remove: Some(file),
    })
}

fn create_file(path: &Path, request: &OpenRequest) -> Result<OpenedTarget> {
    let shown = path.display();
    if request.size.is_none() {
        return Err(Error::target(format!(
            "{shown} does not exist (give --size to create it)"
        )));
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return Err(Error::target(format!(
            "{shown} does not exist and neither does its directory {}",
            parent.display()
        )));
    }
    let mut notes = Vec::new();
    let size = fit_in(parent, request, &mut notes)?;
    new_test_file(path, size)?;
    notes.push(format!(
        "created {shown} ({}) for the benchmark; it is removed afterwards",
        format_size(size)
    ));
    let (device, direct) = match open_device(path, request, &mut notes) {
        Ok(opened) => opened,
        Err(e) => {
            discard(path);
            return Err(e);
        }
    };
    Ok(OpenedTarget {
        device,
        kind: TargetKind::File,
        size,
        dir: None,
        file: Some(path.to_path_buf()),
        holds_data: false,
        direct,
        notes,
        remove: Some(path.to_path_buf()),
    })
}

/// What `path` holds, if it looks like a file system, swap, volume or partition
/// table: asks `blkid -p` when installed, else looks for common magic numbers.
pub fn filesystem_signature(path: &Path) -> Option<String> {
    if let Some(answer) = blkid_probe(path) {
        return answer;
    }
    let mut head = vec![0u8; PROBE_BYTES];
    let mut file = fs::File::open(path).ok()?;
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => filled += n,
        }
    }
    head.truncate(filled);
    magic_signature(&head).map(str::to_string)
}

/// Bytes read for the magic-number check: btrfs's superblock sits at 64 KiB.
const PROBE_BYTES: usize = 128 << 10;

/// `Some(answer)` when blkid ran; `None` when it is missing or failed.
fn blkid_probe(path: &Path) -> Option<Option<String>> {
    let mut command = Command::new("blkid");
    command.args(["-p", "-o", "export"]).arg(path);
    command.stdout(Stdio::piped()).stderr(Stdio::null());
    let output = crate::child::Owned::spawn(&mut command)
        .and_then(crate::child::Owned::wait_with_output)
        .ok()?;
    match output.status.code() {
        // 2: nothing found.
        Some(2) => Some(None),
        Some(0) => {
            let text = String::from_utf8_lossy(&output.stdout);
            let value = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(str::to_string)
            };
            let what = match (value("TYPE="), value("PTTYPE=")) {
                (Some(fs), _) => format!("data blkid recognises as {fs}"),
                (None, Some(pt)) => format!("a partition table ({pt})"),
                _ => "a signature blkid recognises".to_string(),
            };
            Some(Some(what))
        }
        // 8: several signatures that contradict each other: still not empty.
        Some(8) => Some(Some("ambivalent signatures (blkid -p)".to_string())),
        _ => None,
    }
}

/// Looks for the magic numbers of common file systems, swap, LVM and partition
/// tables in the first bytes of a device.
pub fn magic_signature(head: &[u8]) -> Option<&'static str> {
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    if at(0, b"XFSB") {
        return Some("an XFS file system");
    }
    if at(1080, &[0x53, 0xEF]) {
        return Some("an ext2/3/4 file system");
    }
    if at(65600, b"_BHRfS_M") {
        return Some("a btrfs file system");
    }
    if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        return Some("swap space");
    }
    if at(512, b"LABELONE") || at(536, b"LVM2 001") {
        return Some("an LVM physical volume");
    }
    if at(512, b"EFI PART") {
        return Some("a GPT partition table");
    }
    if at(510, &[0x55, 0xAA]) {
        return Some("a boot sector or MBR partition table");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(size: Option<u64>) -> OpenRequest {
        OpenRequest {
            size,
            require_direct: false,
            direct: false,
            force: false,
            writes: true,
        }
    }

    #[test]
    fn uris_and_paths_are_told_apart() {
        assert_eq!(
            TargetSpec::parse("/tmp/x"),
            TargetSpec::Path("/tmp/x".into())
        );
        assert_eq!(
            TargetSpec::parse("file:///srv/disk.img"),
            TargetSpec::Path("/srv/disk.img".into())
        );
        match TargetSpec::parse("nbd://10.0.0.2:10809/disk") {
            TargetSpec::Remote(r) => {
                assert_eq!(
                    (r.scheme.as_str(), r.host.as_str(), r.port),
                    ("nbd", "10.0.0.2", Some(10809))
                )
            }
            other => panic!("{other:?}"),
        }
        match TargetSpec::parse("storage-host:5201") {
            TargetSpec::Remote(r) => {
                assert_eq!((r.host.as_str(), r.port), ("storage-host", Some(5201)))
            }
            other => panic!("{other:?}"),
        }
        match TargetSpec::parse("nbd://[::1]/e") {
            TargetSpec::Remote(r) => assert_eq!((r.host.as_str(), r.port), ("::1", None)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_schemes_the_bench_speaks_pass_the_check() {
        for text in [
            "/tmp/x",
            "file:///srv/disk.img",
            "nbd://h/e",
            "NBD://h/e",
            "nbd+unix:///e?socket=/s",
            "nbds://alice@h/e",
            "aoe://eth0/e1.1",
            "iscsi://h/iqn.2026-11.x:y/0",
            "stripe:64K:nbd://a/e,nbd://b/e",
            "rbd:pool/image",
            "nfs://h/e/f?version=4",
            "storage-host:5201",
        ] {
            assert!(TargetSpec::parse(text).check().is_ok(), "{text}");
        }
        for text in ["http://h/", "tcp://h:5201", "smb://h/share"] {
            let err = TargetSpec::parse(text).check().unwrap_err().to_string();
            let scheme = text.split("://").next().unwrap();
            assert!(
                err.starts_with(text) && err.contains(&format!("does not speak {scheme}://")),
                "{err}"
            );
            assert!(err.contains(ACCEPTED), "{err}");
        }
    }

    #[test]
    fn magic_numbers_are_recognised() {
        let mut head = vec![0u8; PROBE_BYTES];
        assert_eq!(magic_signature(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xEF;
        assert!(magic_signature(&head).unwrap().contains("ext"));
        let mut head = vec![0u8; PROBE_BYTES];
        head[..4].copy_from_slice(b"XFSB");
        assert!(magic_signature(&head).unwrap().contains("XFS"));
        let mut head = vec![0u8; PROBE_BYTES];
        head[65600..65608].copy_from_slice(b"_BHRfS_M");
        assert!(magic_signature(&head).unwrap().contains("btrfs"));
        let mut head = vec![0u8; PROBE_BYTES];
        head[4086..4096].copy_from_slice(b"SWAPSPACE2");
        assert!(magic_signature(&head).unwrap().contains("swap"));
        // A short device cannot hold a btrfs superblock.
        assert_eq!(magic_signature(&[0u8; 100]), None);
    }

    #[test]
    fn an_rbd_image_is_remote_with_no_one_host() {
        match TargetSpec::parse("rbd:rbd/vm1:conf=/etc/ceph/ceph.conf") {
            TargetSpec::Remote(remote) => {
                assert_eq!(remote.scheme, "rbd");
                assert!(remote.host.is_empty());
            }
            other => panic!("rbd: parsed as {other:?}"),
        }
    }

    #[test]
    fn a_directory_gets_a_test_file_that_is_removed_afterwards() {
        let dir = tempfile::tempdir().unwrap();
        let target = open(dir.path(), &request(Some(2 << 20))).unwrap();
        assert_eq!(target.kind, TargetKind::Directory);
        assert_eq!(target.size, 2 << 20);
        assert!(!target.holds_data);
        let file = target.file.clone().unwrap();
        assert!(file.exists());
        assert!(CREATED.lock().unwrap().contains(&file));
        drop(target);
        assert!(!file.exists());
        assert!(!CREATED.lock().unwrap().contains(&file));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn missing_files_need_a_size_and_are_created_with_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let err = open(&path, &request(None)).err().unwrap().to_string();
        assert!(err.contains("does not exist (give --size"), "{err}");
        let target = open(&path, &request(Some(1 << 20))).unwrap();
        assert!(target.notes[0].contains("created"));
        assert!(path.exists());
        drop(target);
        assert!(!path.exists());
        let err = open(&dir.path().join("no/such/disk"), &request(Some(1 << 20)))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("neither does its directory"), "{err}");
    }

    #[test]
    fn bad_sizes_are_refused_with_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        fs::write(&small, vec![1u8; 8192]).unwrap();
        let err = open(&small, &request(None)).err().unwrap().to_string();
        assert!(err.contains("too small"), "{err}");

        let file = dir.path().join("file");
        fs::File::create(&file).unwrap().set_len(4 << 20).unwrap();
        let err = open(&file, &request(Some(8 << 20)))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("smaller than --size"), "{err}");

        let err = open(dir.path(), &request(Some(1 << 60)))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("does not fit"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn files_holding_a_file_system_need_force() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        fs::File::create(&image).unwrap().set_len(4 << 20).unwrap();
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image)
            .status()
            .is_ok_and(|s| s.success());
        if !made {
            if blkid_probe(&image).is_some() {
                eprintln!("skipped: mkfs.ext4 is missing and blkid ignores bare magic numbers");
                return;
            }
            let mut bytes = vec![0u8; 4 << 20];
            bytes[1080] = 0x53;
            bytes[1081] = 0xEF;
            fs::write(&image, &bytes).unwrap();
        }
        let err = open(&image, &request(None)).err().unwrap().to_string();
        assert!(
            err.contains("refusing to overwrite") && err.contains("--force"),
            "{err}"
        );
        let forced = OpenRequest {
            force: true,
            ..request(None)
        };
        assert_eq!(open(&image, &forced).unwrap().size, 4 << 20);
    }
}
