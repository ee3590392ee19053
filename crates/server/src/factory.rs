//! Opening what a command names: a path (`/srv/disk.img`, `file:///srv/disk.img`), an
//! NBD URI (`nbd://host[:port]/export`, `nbd+unix:///export?socket=PATH`) or an AoE
//! URI (`aoe://eth0/e1.2`, `aoe://eth0,eth1/e1.2`) or an iSCSI URI
//! (`iscsi://[user@]host[:port]/IQN/LUN`), a Ceph RBD image
//! (`rbd:POOL[/NAMESPACE]/IMAGE[@SNAP][:id=NAME][:conf=PATH][:keyring=PATH]`), or a
//! striped volume of any of them (`stripe:CHUNK:MEMBER,MEMBER,...`).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
use blockwire_blockdev::paths::DEFAULT_RECONNECT;
use blockwire_blockdev::{Device, FileDevice, FileOptions};
use blockwire_iscsi::initiator::{IscsiClient, IscsiOptions, IscsiUri};
use blockwire_nbd::initiator::{ClientOptions, NbdClient, NbdUri};
use blockwire_rbd::{RbdDevice, RbdSpec};

use crate::open_stripe::StripeSpec;

/// Every form a device may be named in, for errors.
pub const SCHEMES: &str = "a path, file://, nbd://, nbd+unix://, nbds://, nbds+unix://, \
                           aoe://, iscsi://, rbd:POOL/IMAGE or stripe:CHUNK:MEMBER,...";

/// What a command line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Path(PathBuf),
    Nbd(NbdUri),
    Aoe(AoeUri),
    Iscsi(IscsiUri),
    /// A Ceph RBD image: `rbd:POOL[/NAMESPACE]/IMAGE[@SNAP][:KEY=VALUE]...`.
    Rbd(RbdSpec),
    /// A striped volume: `stripe:CHUNK:MEMBER,MEMBER,...` (see open_stripe.rs).
    Stripe(StripeSpec),
}

impl Target {
    pub fn parse(spec: &str) -> Result<Target> {
        if let Some(rest) = spec.strip_prefix(crate::open_stripe::PREFIX) {
            return Ok(Target::Stripe(StripeSpec::parse(rest)?));
        }
        if spec.starts_with(blockwire_rbd::PREFIX) {
            return Ok(Target::Rbd(RbdSpec::parse(spec).map_err(|e| anyhow!(e))?));
        }
        let scheme = spec
            .split("://")
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        if matches!(scheme.as_str(), "nbd" | "nbd+unix" | "nbds" | "nbds+unix") {
            let uri: NbdUri = spec.parse().map_err(|e| anyhow!("{e}"))?;
            return Ok(Target::Nbd(uri));
        }
        if spec.starts_with("aoe://") {
            let uri: AoeUri = spec.parse().map_err(|e| anyhow!("{e}"))?;
            return Ok(Target::Aoe(uri));
        }
        if spec.starts_with("iscsi://") {
            let uri: IscsiUri = spec.parse().map_err(|e| anyhow!("{e}"))?;
            if uri.target.is_none() {
                bail!("'{spec}' names no target: expected iscsi://HOST[:PORT]/IQN/LUN (`blockwire info {spec}` lists the targets)");
            }
            return Ok(Target::Iscsi(uri));
        }
        if let Some(path) = spec.strip_prefix("file://") {
            return Ok(Target::Path(PathBuf::from(path)));
        }
        if spec.contains("://") {
            bail!("'{spec}': unknown URI scheme (expected {SCHEMES})");
        }
        Ok(Target::Path(PathBuf::from(spec)))
    }
}

/// How remote targets (initiators) are opened.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Remote {
    /// NBD connections, when the server allows several.
    pub connections: usize,
    /// How long a request may wait for an answer (NBD and iSCSI default: forever;
    /// AoE: 10 s).
    pub timeout: Option<Duration>,
    /// How long NBD and iSCSI initiators keep reconnecting after a connection
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
        Target::Rbd(spec) => open_rbd(spec, read_only, remote),
        Target::Stripe(spec) => spec.open(read_only, remote),
    }
}

impl Target {
    /// Whether the target is reached over the network (an initiator).
    pub fn is_remote(&self) -> bool {
        !matches!(self, Target::Path(_))
    }
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
    Ok((open(target, false, remote)?, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_uris_are_told_apart() {
        assert_eq!(
            Target::parse("/tmp/x.img").unwrap(),
            Target::Path("/tmp/x.img".into())
        );
        assert_eq!(
            Target::parse("file:///tmp/x.img").unwrap(),
            Target::Path("/tmp/x.img".into())
        );
        assert!(matches!(
            Target::parse("nbd://127.0.0.1:10809/disk").unwrap(),
            Target::Nbd(_)
        ));
        assert!(matches!(
            Target::parse("nbd+unix:///disk?socket=/tmp/s").unwrap(),
            Target::Nbd(_)
        ));
        assert!(matches!(
            Target::parse("nbds://alice@h/disk?tls-psk-file=/k.psk").unwrap(),
            Target::Nbd(uri) if uri.tls.is_some()
        ));
        assert!(matches!(
            Target::parse("NBDS+UNIX:///disk?socket=/tmp/s").unwrap(),
            Target::Nbd(uri) if uri.tls.is_some()
        ));
        assert!(matches!(
            Target::parse("aoe://eth0,eth1/e1.2").unwrap(),
            Target::Aoe(_)
        ));
        assert!(Target::parse("aoe://eth0/1.2").is_err());
        assert!(matches!(
            Target::parse("iscsi://host/iqn.x:y/0").unwrap(),
            Target::Iscsi(_)
        ));
        assert!(Target::parse("iscsi://host").is_err());
        assert!(Target::parse("iscsi://host/iqn.x").is_err());
        assert!(matches!(
            Target::parse("rbd:pool/image@snap:id=gw").unwrap(),
            Target::Rbd(_)
        ));
        assert!(Target::parse("rbd:image-without-pool").is_err());
    }

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
}
