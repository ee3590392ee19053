//! Striped volumes on the command line: `stripe:CHUNK:MEMBER,MEMBER,...`, where each
//! MEMBER is anything a command can open (a path, file://, nbd://, nbd+unix://,
//! aoe://, iscsi://) and CHUNK a size (64K, 1M). A `[[volume]]` table in the config
//! file names the same thing.
//!
//! Members are split on commas. AoE's own interface list (`aoe://eth0,eth1/e1.2`) is
//! the one place a member holds a comma: a piece that follows an `aoe://` member
//! still missing its `/eSHELF.SLOT` belongs to that member.

use std::sync::Arc;
use std::thread;

use anyhow::{anyhow, bail, Context, Result};
use blockwire_blockdev::size::{format_size, parse_size};
use blockwire_blockdev::{Device, Stripe};

use crate::open::{open, Remote, Target};

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
