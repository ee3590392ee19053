//! What a device description names, parsed but not opened: a path
//! (`/srv/disk.img`, `file:///srv/disk.img`), an NBD URI (`nbd://host[:port]/export`,
//! `nbd+unix:///export?socket=PATH`), an AoE URI (`aoe://eth0/e1.2`,
//! `aoe://eth0,eth1/e1.2`), an iSCSI URI (`iscsi://[user@]host[:port]/IQN/LUN`), an
//! NVMe/TCP URI (`nvme+tcp://host[:port]/NQN[/NSID]`), a file on an NFS server
//! (`nfs://server[:port]/EXPORT/FILE[?version=3|4]`), a Ceph
//! RBD image (`rbd:POOL[/NAMESPACE]/IMAGE[@SNAP][:id=NAME][:conf=PATH][:keyring=PATH]`)
//! or a striped volume of any of them (`stripe:CHUNK:MEMBER,MEMBER,...`).
//!
//! Striped volumes: `stripe:CHUNK:MEMBER,MEMBER,...`, where each
//! MEMBER is anything a command can open (a path, file://, nbd://, nbd+unix://,
//! aoe://, iscsi://) and CHUNK a size (64K, 1M). A `[[volume]]` table in the config
//! file names the same thing.
//!
//! Members are split on commas. AoE's own interface list (`aoe://eth0,eth1/e1.2`) is
//! the one place a member holds a comma: a piece that follows an `aoe://` member
//! still missing its `/eSHELF.SLOT` belongs to that member.
//!
//! Parsing sits below the validation (which checks an export's `path` the way serve
//! will read it) and below the factory (which opens what is parsed here).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use blockwire_aoe::initiator::AoeUri;
use blockwire_blockdev::size::{format_size, parse_size};
use blockwire_iscsi::initiator::IscsiUri;
use blockwire_nbd::initiator::NbdUri;
use blockwire_nfs::NfsUrl;
use blockwire_nvme::initiator::NvmeOptions;
use blockwire_rbd::RbdSpec;

/// Every form a device may be named in, for errors.
pub const SCHEMES: &str = "a path, file://, nbd://, nbd+unix://, nbds://, nbds+unix://, \
                           aoe://, iscsi://, nvme+tcp://, nfs://, rbd:POOL/IMAGE or \
                           stripe:CHUNK:MEMBER,...";

/// What a command line names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Path(PathBuf),
    Nbd(NbdUri),
    Aoe(AoeUri),
    Iscsi(IscsiUri),
    /// One namespace of an NVMe/TCP subsystem: `nvme+tcp://HOST[:PORT]/NQN[/NSID]`.
    Nvme(NvmeOptions),
    /// A Ceph RBD image: `rbd:POOL[/NAMESPACE]/IMAGE[@SNAP][:KEY=VALUE]...`.
    Rbd(RbdSpec),
    /// A file on an NFS server: `nfs://SERVER[:PORT]/EXPORT/FILE[?OPTIONS]`.
    Nfs(NfsUrl),
    /// A striped volume: `stripe:CHUNK:MEMBER,MEMBER,...` (see stripe_spec.rs).
    Stripe(StripeSpec),
}

impl Target {
    pub fn parse(spec: &str) -> Result<Target> {
        if let Some(rest) = spec.strip_prefix(PREFIX) {
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
        if scheme == "nvme+tcp" {
            let options = NvmeOptions::parse(spec).map_err(|e| anyhow!("{e}"))?;
            if options.is_discovery() {
                bail!("'{spec}' names no subsystem: expected nvme+tcp://HOST[:PORT]/NQN[/NSID] (`blockwire info {spec}` lists the subsystems)");
            }
            return Ok(Target::Nvme(options));
        }
        if scheme == blockwire_nfs::SCHEME {
            return Ok(Target::Nfs(NfsUrl::parse(spec).map_err(|e| anyhow!(e))?));
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

impl Target {
    /// Whether the target is reached over the network (an initiator).
    pub fn is_remote(&self) -> bool {
        !matches!(self, Target::Path(_))
    }
}

/// The remote target a PATH argument names, if it is a URI (nbd://, aoe://, iscsi://)
/// or a striped volume.
pub fn remote_target(path: &Path) -> Result<Option<Target>> {
    match path.to_str() {
        Some(text) if text.starts_with(PREFIX) || text.starts_with(blockwire_rbd::PREFIX) => {
            Ok(Some(Target::parse(text)?))
        }
        Some(text) if text.contains("://") && !text.starts_with("file://") => {
            Ok(Some(Target::parse(text)?).filter(Target::is_remote))
        }
        _ => Ok(None),
    }
}

/// The prefix that names a striped volume.
pub const PREFIX: &str = "stripe:";

/// A striped volume as named: chunk size and members, each as typed and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeSpec {
    pub chunk: u64,
    pub members: Vec<(String, Target)>,
}

impl StripeSpec {
    /// Parses what follows `stripe:`: `CHUNK:MEMBER,MEMBER,...`.
    pub fn parse(rest: &str) -> Result<StripeSpec> {
        let usage = "expected stripe:CHUNK:MEMBER,MEMBER,... (e.g. stripe:64K:a.img,b.img)";
        let Some((chunk, members)) = rest.split_once(':') else {
            bail!("'{PREFIX}{rest}': {usage}");
        };
        let chunk = parse_size(chunk).map_err(|e| anyhow!("stripe chunk size: {e}; {usage}"))?;
        let texts = split_members(members);
        if texts.is_empty() {
            bail!("'{PREFIX}{rest}' names no members; {usage}");
        }
        StripeSpec::from_members(chunk, &texts)
    }

    /// A spec from a chunk size and members as typed (a `[[volume]]` table).
    pub fn from_members(chunk: u64, members: &[String]) -> Result<StripeSpec> {
        let members = members
            .iter()
            .enumerate()
            .map(|(i, text)| {
                if text.starts_with(PREFIX) {
                    bail!("stripe member {i} ('{text}') is itself a stripe; nest volumes in a config file instead");
                }
                let target = Target::parse(text)
                    .with_context(|| format!("stripe member {i} ('{text}')"))?;
                Ok((text.clone(), target))
            })
            .collect::<Result<Vec<_>>>()?;
        if members.is_empty() {
            bail!("a stripe needs at least one member");
        }
        Ok(StripeSpec {
            chunk: chunk_checked(chunk)?,
            members,
        })
    }

    /// `stripe:64K:a,b` as the user would write it.
    pub fn describe(&self) -> String {
        let members: Vec<&str> = self.members.iter().map(|(t, _)| t.as_str()).collect();
        format!("{PREFIX}{}:{}", format_size(self.chunk), members.join(","))
    }
}

fn chunk_checked(chunk: u64) -> Result<u64> {
    if chunk == 0 {
        bail!("stripe chunk size must be above zero");
    }
    Ok(chunk)
}

/// Splits a member list on commas, keeping AoE interface lists together.
fn split_members(list: &str) -> Vec<String> {
    let mut members: Vec<String> = Vec::new();
    for piece in list.split(',') {
        match members.last_mut() {
            Some(last) if aoe_lacks_address(last) => {
                last.push(',');
                last.push_str(piece);
            }
            _ => members.push(piece.to_string()),
        }
    }
    members.retain(|m| !m.is_empty());
    members
}

/// `aoe://eth0` (no `/eSHELF.SLOT` yet): the next comma is in its interface list.
fn aoe_lacks_address(member: &str) -> bool {
    member
        .strip_prefix("aoe://")
        .is_some_and(|rest| !rest.contains('/'))
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
            Target::parse("nvme+tcp://host/nqn.2026-11.dev.blockwire:a").unwrap(),
            Target::Nvme(o) if o.port == 4420 && o.nsid == 1
        ));
        assert!(matches!(
            Target::parse("nvme+tcp://[::1]:4421/nqn.2026-11.x:a/2").unwrap(),
            Target::Nvme(o) if o.port == 4421 && o.nsid == 2 && o.host == "::1"
        ));
        let discovery = Target::parse("nvme+tcp://host").unwrap_err();
        assert!(format!("{discovery}").contains("names no subsystem"));
        assert!(Target::parse("nvme+tcp://host/nqn.x/0").is_err());
        assert!(matches!(
            Target::parse("rbd:pool/image@snap:id=gw").unwrap(),
            Target::Rbd(_)
        ));
        assert!(Target::parse("rbd:image-without-pool").is_err());
    }

    #[test]
    fn only_uris_and_volumes_are_remote_paths() {
        assert!(remote_target(Path::new("/srv/a.img")).unwrap().is_none());
        assert!(remote_target(Path::new("file:///srv/a.img"))
            .unwrap()
            .is_none());
        assert!(matches!(
            remote_target(Path::new("nbd://h/x")).unwrap(),
            Some(Target::Nbd(_))
        ));
        assert!(matches!(
            remote_target(Path::new("stripe:64K:a,b")).unwrap(),
            Some(Target::Stripe(_))
        ));
        assert!(remote_target(Path::new("bogus://x")).is_err());
    }

    #[test]
    fn parses_chunk_and_members() {
        let spec = StripeSpec::parse("64K:/tmp/a.img,nbd://h:10809/b,file:///c").unwrap();
        assert_eq!(spec.chunk, 64 << 10);
        assert_eq!(spec.members.len(), 3);
        assert_eq!(spec.members[0].1, Target::Path("/tmp/a.img".into()));
        assert!(matches!(spec.members[1].1, Target::Nbd(_)));
        assert_eq!(
            spec.describe(),
            "stripe:64K:/tmp/a.img,nbd://h:10809/b,file:///c"
        );
    }

    #[test]
    fn aoe_interface_lists_stay_in_one_member() {
        let members = split_members("aoe://eth0,eth1/e1.2,aoe://eth2/e1.3,x.img");
        assert_eq!(
            members,
            ["aoe://eth0,eth1/e1.2", "aoe://eth2/e1.3", "x.img"]
        );
    }

    #[test]
    fn bad_specs_say_what_is_expected() {
        for bad in ["64K", "zz:a,b", "0:a,b", "64K:", "64K:a,stripe:4K:b"] {
            let err = StripeSpec::parse(bad).unwrap_err();
            assert!(format!("{err:#}").contains("stripe"), "{bad}: {err:#}");
        }
        let err = StripeSpec::parse("64K:a,bogus://x").unwrap_err();
        assert!(format!("{err:#}").contains("stripe member 1"), "{err:#}");
    }
}
