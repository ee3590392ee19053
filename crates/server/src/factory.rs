//! The device factory: the one place where a description becomes a device. What
//! [`crate::device_spec`] parsed (a path, an NBD, AoE or iSCSI URI, a file on an NFS
//! server, a Ceph RBD image, a striped volume) is opened here for bench, copy, info
//! and serve alike; serve's files (created sparse on request, never resized) too.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use blockwire_aoe::initiator::{AoeClient, AoeOptions};
use blockwire_blockdev::paths::DEFAULT_RECONNECT;
use blockwire_blockdev::size::format_size;
use blockwire_blockdev::{Device, FileDevice, FileOptions, MemoryDevice, Stripe};
use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions};
use blockwire_nbd::initiator::{ClientOptions, NbdClient};
use blockwire_nfs::{NfsFile, NfsOptions, NfsUrl};
use blockwire_nvme::initiator::NvmeClient;
use blockwire_rbd::{RbdDevice, RbdSpec};

use crate::created_files::CreatedFiles;
use crate::device_spec::StripeSpec;
use crate::device_spec::Target;

/// How remote targets (initiators) are opened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Remote {
    /// NBD connections, when the server allows several.
    pub connections: usize,
    /// How long a request may wait for an answer (NBD and iSCSI default: forever;
    /// AoE: 10 s).
    pub timeout: Option<Duration>,
    /// How long NBD, iSCSI and NVMe/TCP initiators keep reconnecting after a connection
    /// drops, then replaying what had no answer; `None`: fail at once. (AoE
    /// retransmits instead, for as long as `timeout`.)
    pub reconnect: Option<Duration>,
}

impl Default for Remote {
    fn default() -> Self {
        Remote {
            connections: 1,
            timeout: None,
            reconnect: Some(DEFAULT_RECONNECT),
        }
    }
}

/// `--reconnect SECS` as the command line has it: `None` when not given (the
/// default, 30 s), `Some(None)` for 0 (off).
pub fn reconnect_setting(flag: Option<Duration>) -> Option<Duration> {
    match flag {
        None => Some(DEFAULT_RECONNECT),
        Some(limit) if limit.is_zero() => None,
        Some(limit) => Some(limit),
    }
}

/// Parses `--reconnect SECS`: seconds (fractions allowed), 0 for off.
pub fn parse_reconnect(text: &str) -> std::result::Result<Duration, String> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    parse_timeout(text)
}

/// Parses `--timeout SECS` (fractions allowed, above zero).
pub fn parse_timeout(text: &str) -> std::result::Result<Duration, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number of seconds"))?;
    if !(secs > 0.0 && secs.is_finite()) {
        return Err(format!("the timeout must be above zero, not '{text}'"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Opens a target for reading (and writing unless `read_only`).
pub fn open(target: &Target, read_only: bool, remote: Remote) -> Result<Device> {
    match target {
        Target::Path(path) => open_path(path, read_only),
        Target::Nbd(uri) => {
            let options = ClientOptions {
                connections: remote.connections,
                request_timeout: remote.timeout,
                reconnect: remote.reconnect,
                ..ClientOptions::default()
            };
            let client = NbdClient::connect(uri, options).map_err(|e| anyhow!("{e}"))?;
            let device = Device::new(Arc::new(client));
            if !read_only && device.info().read_only {
                bail!("{uri} is a read-only export");
            }
            Ok(device)
        }
        Target::Aoe(uri) => {
            let mut options = AoeOptions::default();
            if let Some(timeout) = remote.timeout {
                options.timeout = timeout;
            }
            let client = AoeClient::open(uri, options).map_err(|e| anyhow!("{e}"))?;
            Ok(Device::new(Arc::new(client)))
        }
        Target::Iscsi(uri) => {
            // The URI's ?reconnect=SECS, if any, overrides `remote.reconnect`.
            let options = IscsiOptions {
                request_timeout: remote.timeout,
                reconnect: remote.reconnect,
                ..IscsiOptions::default()
            };
            let client = IscsiClient::connect(uri, options).map_err(|e| anyhow!("{e}"))?;
            let device = Device::new(Arc::new(client));
            if !read_only && device.info().read_only {
                bail!("{uri} is a read-only logical unit");
            }
            Ok(device)
        }
        Target::Nvme(options) => {
            let mut options = options.clone();
            options.reconnect = remote.reconnect;
            let name = options.to_string();
            let client = NvmeClient::open(options).map_err(|e| anyhow!("{name}: {e}"))?;
            let device = Device::new(Arc::new(client));
            if !read_only && device.info().read_only {
                bail!("{name} is a read-only namespace");
            }
            Ok(device)
        }
        Target::Rbd(spec) => open_rbd(spec, read_only, remote),
        Target::Nfs(url) => open_nfs(url, read_only, remote, None),
        Target::Stripe(spec) => spec.open(read_only, remote),
    }
}

/// Like [`open`], creating a file target that does not exist as `size` bytes when
/// a size is given (the bench's `--size`), as the bench does with a local path.
pub fn open_sized(
    target: &Target,
    read_only: bool,
    remote: Remote,
    size: Option<u64>,
) -> Result<Device> {
    match target {
        Target::Nfs(url) if !read_only => open_nfs(url, false, remote, size),
        _ => open(target, read_only, remote),
    }
}

/// Opens a file on an NFS server. Connections: the URL's `connections=`, else
/// `--connections` when above one, else the crate's default (4). `--timeout` is
/// each RPC's timeout (default 30 s). A missing file is created only with a size.
fn open_nfs(url: &NfsUrl, read_only: bool, remote: Remote, size: Option<u64>) -> Result<Device> {
    let file = open_nfs_file(url, read_only, remote, size)?;
    Ok(Device::new(Arc::new(file)))
}

fn open_nfs_file(
    url: &NfsUrl,
    read_only: bool,
    remote: Remote,
    size: Option<u64>,
) -> Result<NfsFile> {
    let mut url = url.clone();
    if url.connections.is_none() && remote.connections > 1 {
        url.connections = Some(remote.connections.min(blockwire_nfs::MAX_CONNECTIONS));
    }
    let options = NfsOptions {
        read_only,
        create_size: size,
        timeout: remote.timeout,
    };
    let file = NfsFile::open(&url, options).map_err(|e| anyhow!("{e}"))?;
    if !read_only && file.read_only_by_server() {
        bail!("{}: the server allows reading only", file.url());
    }
    Ok(file)
}

/// Opens an RBD image; `--timeout` overrides the spec's (default 30 s).
fn open_rbd(spec: &RbdSpec, read_only: bool, remote: Remote) -> Result<Device> {
    let mut spec = spec.clone();
    if let Some(timeout) = remote.timeout {
        spec.timeout = Some(timeout);
    }
    let device = RbdDevice::open(&spec, read_only).map_err(|e| anyhow!("{e}"))?;
    Ok(Device::new(Arc::new(device)))
}

fn open_path(path: &Path, read_only: bool) -> Result<Device> {
    let options = FileOptions {
        read_only,
        ..FileOptions::default()
    };
    let device = FileDevice::open(path, options).map_err(|e| anyhow!("{e}"))?;
    Ok(Device::from_device(device))
}

/// Creates `path` as a sparse file of `size` bytes; fails if it exists (never
/// overwrites).
pub fn create_sparse(path: &Path, size: u64) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.set_len(size)
        .with_context(|| format!("cannot size {} to {size} bytes", path.display()))
}

/// Opens a copy destination. A path that does not exist is created as a sparse file
/// of `size` bytes; the flag says whether the device is known to read as zeroes.
pub fn open_destination(target: &Target, size: u64, remote: Remote) -> Result<(Device, bool)> {
    if let Target::Path(path) = target {
        if !path.exists() {
            create_sparse(path, size)?;
            return Ok((open_path(path, false)?, true));
        }
    }
    if let Target::Nfs(url) = target {
        // Created (sparse, by truncation) when missing, and then known to read as
        // zeroes; an existing file is written as it is.
        let file = open_nfs_file(url, false, remote, Some(size))?;
        let created = file.created();
        return Ok((Device::new(Arc::new(file)), created));
    }
    Ok((open(target, false, remote)?, false))
}

impl StripeSpec {
    /// Opens every member at once (remote members connect in parallel) and builds
    /// the volume. An unreachable member is named in the error.
    pub fn open(&self, read_only: bool, remote: Remote) -> Result<Device> {
        Ok(Device::new(Arc::new(self.open_stripe(read_only, remote)?)))
    }

    /// Like [`open`](Self::open), keeping the stripe's own view (its members).
    pub fn open_stripe(&self, read_only: bool, remote: Remote) -> Result<Stripe> {
        let opened: Vec<Result<Device>> = thread::scope(|scope| {
            let handles: Vec<_> = self
                .members
                .iter()
                .map(|(_, target)| scope.spawn(move || open(target, read_only, remote)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("panicked"))))
                .collect()
        });
        let mut devices = Vec::with_capacity(opened.len());
        for (i, (result, (text, _))) in opened.into_iter().zip(&self.members).enumerate() {
            devices.push(result.with_context(|| format!("stripe member {i} ({text})"))?);
        }
        let names = self.members.iter().map(|(text, _)| text.clone()).collect();
        Stripe::with_names(devices, names, self.chunk)
            .map_err(|e| anyhow!("cannot stripe {}: {e}", self.describe()))
    }
}

/// What an export's device is made from, as a config table or serve's flags
/// name it (a `[[volume]]` is opened by [`crate::volumes`], which shares it).
#[derive(Debug, Clone)]
pub enum Source {
    /// A file or block device; created as a sparse file of `size` bytes if it does
    /// not exist and a size is given.
    File {
        path: PathBuf,
        size: Option<u64>,
        options: FileOptions,
    },
    /// A sparse in-memory device of this many bytes.
    Memory(u64),
    /// What [`Target::parse`] reads other than a path: a remote target (through
    /// an initiator), a Ceph RBD image, a striped volume.
    Remote(Box<Target>, Remote),
}

impl Source {
    /// A `path` as serve reads it: a URI, `rbd:` or `stripe:` names a remote
    /// device ([`crate::device_spec::remote_target`]), anything else a file.
    pub fn from_path(path: &Path, size: Option<u64>, options: FileOptions) -> Result<Source> {
        Ok(match crate::device_spec::remote_target(path)? {
            Some(target) => Source::Remote(Box::new(target), Remote::default()),
            None => Source::File {
                path: path.to_path_buf(),
                size,
                options,
            },
        })
    }
}

/// Opens (or creates, noted in `created`) the device `source` describes, refusing
/// writes when `read_only`.
pub fn open_source(source: &Source, read_only: bool, created: &CreatedFiles) -> Result<Device> {
    let device = match source {
        Source::File {
            path,
            size,
            options,
        } => {
            let options = FileOptions {
                read_only: options.read_only || read_only,
                ..*options
            };
            return open_or_create(path, *size, options, created);
        }
        Source::Memory(size) => Device::from_device(MemoryDevice::new(*size)),
        Source::Remote(target, remote) => open(target, read_only, *remote)?,
    };
    Ok(if read_only {
        device.read_only()
    } else {
        device
    })
}

/// Opens `path`, creating a sparse file of `size` bytes if it does not exist.
/// Refuses to resize an existing file.
pub fn open_or_create(
    path: &Path,
    size: Option<u64>,
    options: FileOptions,
    created: &CreatedFiles,
) -> Result<Device> {
    match (path.exists(), size) {
        (false, None) => bail!("{} does not exist", path.display()),
        (false, Some(size)) => {
            if options.read_only {
                bail!(
                    "{} does not exist; refusing to create a read-only export",
                    path.display()
                );
            }
            create_sparse(path, size)?;
            created.add(path);
            tracing::info!(
                "created sparse file {} of {}",
                path.display(),
                format_size(size)
            );
        }
        (true, _) => {}
    }
    let device = FileDevice::open(path, options).map_err(|e| open_error(path, &e, options))?;
    if let Some(size) = size {
        let actual = blockwire_blockdev::BlockDevice::info(&device).size;
        if actual != size {
            bail!(
                "{} exists with {actual} bytes but --size says {size}; blockwire never resizes or overwrites an existing file",
                path.display()
            );
        }
    }
    Ok(Device::from_device(device))
}

/// Why a file could not be opened, in one line naming it, with the likely fix.
fn open_error(
    path: &Path,
    error: &blockwire_blockdev::Error,
    options: FileOptions,
) -> anyhow::Error {
    let io = std::error::Error::source(error).and_then(|s| s.downcast_ref::<std::io::Error>());
    let cause = match io {
        Some(io) => crate::config_validate::io_text(io),
        None => error.to_string(),
    };
    let refused = io.and_then(std::io::Error::raw_os_error);
    let hint = match refused {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) if !options.read_only => {
            " (to serve it read-only: --read-only, or read_only = true in a config file)"
        }
        Some(libc::EINVAL) if options.direct => {
            " (this file system refuses O_DIRECT: serve it without --direct / direct = true)"
        }
        _ => "",
    };
    anyhow!("cannot open {}: {cause}{hint}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_is_on_by_default_and_zero_turns_it_off() {
        assert_eq!(reconnect_setting(None), Some(DEFAULT_RECONNECT));
        let off = parse_reconnect("0").unwrap();
        assert_eq!(reconnect_setting(Some(off)), None);
        let five = parse_reconnect("5").unwrap();
        assert_eq!(reconnect_setting(Some(five)), Some(Duration::from_secs(5)));
        assert!(parse_reconnect("-1").is_err());
        assert!(parse_reconnect("never").is_err());
    }

    #[test]
    fn timeouts_are_positive_seconds() {
        assert_eq!(parse_timeout("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_timeout("0").is_err());
        assert!(parse_timeout("-2").is_err());
        assert!(parse_timeout("soon").is_err());
    }

    #[test]
    fn sources_open_as_described() {
        let dir = tempfile::tempdir().unwrap();
        let created = CreatedFiles::default();
        let memory = open_source(&Source::Memory(1 << 20), true, &created).unwrap();
        assert_eq!(memory.size(), 1 << 20);
        assert!(memory.info().read_only);

        let path = dir.path().join("new.img");
        let file = Source::from_path(&path, Some(2 << 20), FileOptions::default()).unwrap();
        assert!(matches!(file, Source::File { .. }));
        let device = open_source(&file, false, &created).unwrap();
        assert_eq!(device.size(), 2 << 20);
        assert!(!device.info().read_only);
        // Created for this start, so removed if the start fails.
        created.remove_all();
        assert!(!path.exists());

        let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
        std::fs::File::create(&a).unwrap().set_len(1 << 20).unwrap();
        std::fs::File::create(&b).unwrap().set_len(1 << 20).unwrap();
        let spec = format!("stripe:64K:{},{}", a.display(), b.display());
        let stripe = Source::from_path(Path::new(&spec), None, FileOptions::default()).unwrap();
        assert!(matches!(&stripe, Source::Remote(t, _) if matches!(**t, Target::Stripe(_))));
        let volume = open_source(&stripe, false, &created).unwrap();
        assert_eq!(volume.size(), 2 << 20);
    }

    #[test]
    fn a_missing_file_without_a_size_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing.img");
        let source = Source::from_path(&path, None, FileOptions::default()).unwrap();
        let error = open_source(&source, false, &CreatedFiles::default()).unwrap_err();
        assert!(format!("{error:#}").contains("does not exist"), "{error:#}");
        assert!(!path.exists());
    }
}
