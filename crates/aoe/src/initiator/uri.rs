//! AoE addresses: `aoe://IFACE/eSHELF.SLOT`, or `aoe://eth0,eth1/e1.2` for a target
//! reached over several local interfaces.
//!
//! AoE has no hosts or ports: a target is a shelf.slot pair on an Ethernet segment,
//! named `eSHELF.SLOT` as aoetools names it (`e1.2` is shelf 1, slot 2). The authority
//! part lists the local interfaces to look for it on. The broadcast addresses (shelf
//! 65535, slot 255) are refused: a URI names one target.

use std::fmt;
use std::str::FromStr;

use crate::rawsock::XdpHook;
use crate::wire::{BROADCAST_SHELF, BROADCAST_SLOT};

/// Longest interface name Linux accepts (IFNAMSIZ − 1).
const MAX_INTERFACE_NAME: usize = 15;

/// A parsed AoE URI: the local interfaces and the target's shelf.slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AoeUri {
    /// Local interfaces to reach the target through, in the order given.
    pub interfaces: Vec<String>,
    /// The target's shelf (AoE major address).
    pub shelf: u16,
    /// The target's slot (AoE minor address).
    pub slot: u8,
    /// `?xdp` (the generic hook) or `?xdp=driver`: send and receive through the
    /// AF_XDP path ([`crate::rawsock::xdp`]) instead of packet sockets alone.
    pub xdp: Option<XdpHook>,
}

/// Why a string is not a usable AoE URI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UriError {
    #[error("'{0}' is not an AoE URI (expected aoe://IFACE/eSHELF.SLOT, e.g. aoe://eth0/e1.2)")]
    NotUri(String),
    #[error("scheme '{0}' is not AoE (expected aoe://IFACE/eSHELF.SLOT)")]
    Scheme(String),
    #[error(
        "the URI names no interface (aoe://IFACE/eSHELF.SLOT, several as aoe://eth0,eth1/e1.2)"
    )]
    MissingInterface,
    #[error(
        "'{0}' is not a network interface name (1 to 15 characters, no '/', ',', ':', spaces)"
    )]
    Interface(String),
    #[error("interface '{0}' is listed twice")]
    DuplicateInterface(String),
    #[error("the URI names no target (add /eSHELF.SLOT, e.g. aoe://eth0/e1.2)")]
    MissingTarget,
    #[error("'{0}' is not an AoE target name (expected eSHELF.SLOT, e.g. e1.2)")]
    Target(String),
    #[error("shelf '{0}' is out of range (0 to 65534; 65535 is the broadcast shelf)")]
    Shelf(String),
    #[error("slot '{0}' is out of range (0 to 254; 255 is the broadcast slot)")]
    Slot(String),
    #[error("AoE URIs take no {0} ('{1}')")]
    Extra(&'static str, String),
    #[error("unknown AoE URI option '{0}' (the one there is: xdp, xdp=generic or xdp=driver)")]
    Option(String),
}

impl AoeUri {
    /// The URI of target `shelf`.`slot` on one interface.
    pub fn new(interface: impl Into<String>, shelf: u16, slot: u8) -> AoeUri {
        AoeUri {
            interfaces: vec![interface.into()],
            shelf,
            slot,
            xdp: None,
        }
    }

    /// The target's name as aoetools prints it: `e1.2`.
    pub fn target_name(&self) -> String {
        target_name(self.shelf, self.slot)
    }
}

/// `eSHELF.SLOT`.
pub fn target_name(shelf: u16, slot: u8) -> String {
    format!("e{shelf}.{slot}")
}

fn parse_interface(name: &str) -> Result<String, UriError> {
    let valid = !name.is_empty()
        && name.len() <= MAX_INTERFACE_NAME
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b"/,:%?#@".contains(&b));
    if valid {
        Ok(name.to_string())
    } else {
        Err(UriError::Interface(name.to_string()))
    }
}

/// Decimal digits only, no sign, no spaces.
fn parse_number(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `eSHELF.SLOT` → (shelf, slot).
pub(crate) fn parse_target(text: &str) -> Result<(u16, u8), UriError> {
    let bad = || UriError::Target(text.to_string());
    let rest = text.strip_prefix('e').ok_or_else(bad)?;
    let (shelf, slot) = rest.split_once('.').ok_or_else(bad)?;
    let shelf_value = parse_number(shelf).ok_or_else(bad)?;
    let slot_value = parse_number(slot).ok_or_else(bad)?;
    if shelf_value >= u64::from(BROADCAST_SHELF) {
        return Err(UriError::Shelf(shelf.to_string()));
    }
    if slot_value >= u64::from(BROADCAST_SLOT) {
        return Err(UriError::Slot(slot.to_string()));
    }
    Ok((shelf_value as u16, slot_value as u8))
}

/// The query: `xdp`, `xdp=generic` or `xdp=driver`, or nothing.
fn parse_query(query: &str) -> Result<Option<XdpHook>, UriError> {
    let mut xdp = None;
    for option in query.split('&').filter(|option| !option.is_empty()) {
        let hook = match option {
            "xdp" | "xdp=generic" => XdpHook::Generic,
            "xdp=driver" => XdpHook::Driver,
            _ => return Err(UriError::Option(option.to_string())),
        };
        if xdp.replace(hook).is_some() {
            return Err(UriError::Option(format!("{option} (given twice)")));
        }
    }
    Ok(xdp)
}

impl FromStr for AoeUri {
    type Err = UriError;

    fn from_str(text: &str) -> Result<AoeUri, UriError> {
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| UriError::NotUri(text.to_string()))?;
        if !scheme.eq_ignore_ascii_case("aoe") {
            return Err(UriError::Scheme(scheme.to_string()));
        }
        if let Some(at) = rest.find('#') {
            return Err(UriError::Extra("fragment", rest[at..].to_string()));
        }
        let (rest, xdp) = match rest.split_once('?') {
            Some((rest, query)) => (rest, parse_query(query)?),
            None => (rest, None),
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(UriError::MissingInterface);
        }
        let mut interfaces: Vec<String> = Vec::new();
        for name in authority.split(',') {
            let name = parse_interface(name)?;
            if interfaces.contains(&name) {
                return Err(UriError::DuplicateInterface(name));
            }
            interfaces.push(name);
        }
        if path.is_empty() {
            return Err(UriError::MissingTarget);
        }
        if let Some((target, extra)) = path.split_once('/') {
            if !extra.is_empty() {
                return Err(UriError::Extra(
                    "path after the target",
                    format!("/{extra}"),
                ));
            }
            // A single trailing slash is harmless: aoe://eth0/e1.2/
            let (shelf, slot) = parse_target(target)?;
            return Ok(AoeUri {
                interfaces,
                shelf,
                slot,
                xdp,
            });
        }
        let (shelf, slot) = parse_target(path)?;
        Ok(AoeUri {
            interfaces,
            shelf,
            slot,
            xdp,
        })
    }
}

impl fmt::Display for AoeUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "aoe://{}/{}",
            self.interfaces.join(","),
            self.target_name()
        )?;
        match self.xdp {
            None => Ok(()),
            Some(XdpHook::Generic) => f.write_str("?xdp"),
            Some(XdpHook::Driver) => f.write_str("?xdp=driver"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AoeUri, UriError> {
        text.parse()
    }

    #[test]
    fn the_xdp_option_picks_the_hook_and_prints_back() {
        for (text, hook, printed) in [
            (
                "aoe://eth0/e1.2?xdp",
                XdpHook::Generic,
                "aoe://eth0/e1.2?xdp",
            ),
            (
                "aoe://eth0/e1.2?xdp=generic",
                XdpHook::Generic,
                "aoe://eth0/e1.2?xdp",
            ),
            (
                "aoe://eth0,eth1/e1.2/?xdp=driver",
                XdpHook::Driver,
                "aoe://eth0,eth1/e1.2?xdp=driver",
            ),
        ] {
            let uri = parse(text).unwrap();
            assert_eq!(uri.xdp, Some(hook), "{text}");
            assert_eq!(uri.to_string(), printed);
            assert_eq!(parse(printed).unwrap(), uri);
        }
        assert_eq!(parse("aoe://eth0/e1.2").unwrap().xdp, None);
    }

    #[test]
    fn one_interface() {
        let uri = parse("aoe://eth0/e1.2").unwrap();
        assert_eq!(uri, AoeUri::new("eth0", 1, 2));
        assert_eq!(uri.to_string(), "aoe://eth0/e1.2");
        assert_eq!(uri.target_name(), "e1.2");
    }

    #[test]
    fn several_interfaces_keep_their_order() {
        let uri = parse("aoe://eth1,eth0,veth-a.3/e65534.254").unwrap();
        assert_eq!(uri.interfaces, ["eth1", "eth0", "veth-a.3"]);
        assert_eq!((uri.shelf, uri.slot), (65534, 254));
        assert_eq!(uri.to_string(), "aoe://eth1,eth0,veth-a.3/e65534.254");
    }

    #[test]
    fn display_round_trips_and_normalises() {
        for text in [
            "aoe://eth0/e0.0",
            "aoe://a,b,c/e7.9",
            "aoe://enp3s0f1/e100.15",
        ] {
            assert_eq!(parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            parse("AOE://eth0/e01.002/").unwrap().to_string(),
            "aoe://eth0/e1.2"
        );
    }

    #[test]
    fn bad_input_is_refused_with_a_reason() {
        let cases: &[(&str, UriError)] = &[
            ("eth0/e1.2", UriError::NotUri("eth0/e1.2".into())),
            ("nbd://eth0/e1.2", UriError::Scheme("nbd".into())),
            ("aoe:///e1.2", UriError::MissingInterface),
            ("aoe://eth0", UriError::MissingTarget),
            ("aoe://eth0/", UriError::MissingTarget),
            ("aoe://eth0,/e1.2", UriError::Interface("".into())),
            (
                "aoe://eth0,eth0/e1.2",
                UriError::DuplicateInterface("eth0".into()),
            ),
            (
                "aoe://averyveryverylongname/e1.2",
                UriError::Interface("averyveryverylongname".into()),
            ),
            ("aoe://eth 0/e1.2", UriError::Interface("eth 0".into())),
            ("aoe://eth0/1.2", UriError::Target("1.2".into())),
            ("aoe://eth0/e1", UriError::Target("e1".into())),
            ("aoe://eth0/e1.", UriError::Target("e1.".into())),
            ("aoe://eth0/e.2", UriError::Target("e.2".into())),
            ("aoe://eth0/e-1.2", UriError::Target("e-1.2".into())),
            ("aoe://eth0/e1.2.3", UriError::Target("e1.2.3".into())),
            ("aoe://eth0/E1.2", UriError::Target("E1.2".into())),
            ("aoe://eth0/e65535.1", UriError::Shelf("65535".into())),
            (
                "aoe://eth0/e99999999999.1",
                UriError::Target("e99999999999.1".into()),
            ),
            ("aoe://eth0/e1.255", UriError::Slot("255".into())),
            ("aoe://eth0/e1.1000", UriError::Slot("1000".into())),
            (
                "aoe://eth0/e1.2/x",
                UriError::Extra("path after the target", "/x".into()),
            ),
            ("aoe://eth0/e1.2?x=1", UriError::Option("x=1".into())),
            (
                "aoe://eth0/e1.2?xdp=fast",
                UriError::Option("xdp=fast".into()),
            ),
            (
                "aoe://eth0/e1.2?xdp&xdp=driver",
                UriError::Option("xdp=driver (given twice)".into()),
            ),
            (
                "aoe://eth0/e1.2#x",
                UriError::Extra("fragment", "#x".into()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(&parse(text).unwrap_err(), expected, "{text}");
        }
    }

    #[test]
    fn errors_read_well() {
        let text = parse("aoe://eth0").unwrap_err().to_string();
        assert!(text.contains("aoe://eth0/e1.2"), "{text}");
        let text = parse("aoe://eth0/e1.255").unwrap_err().to_string();
        assert!(text.contains("broadcast"), "{text}");
    }
}
