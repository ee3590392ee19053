//! `blockwire info URI`: what an NBD server says about an export, its list of
//! exports (`--list`), or the export's allocation map (`--map`, as `nbdinfo --map`
//! prints it); `--json` for machines.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use blockwire_blockdev::size::format_size;
use blockwire_blockdev::{Device, Extent};
use blockwire_nbd::initiator::{
    allocation_type, list_exports, ClientOptions, ExportDetails, NbdClient, NbdUri,
};
use clap::Args;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// The export: nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH or
    /// aoe://IFACE[,IFACE]/eSHELF.SLOT (with --list, aoe://IFACE is enough) or
    /// iscsi://[USER@]HOST[:PORT]/IQN/LUN (iscsi://HOST[:PORT] lists the targets)
    /// or a striped volume, stripe:CHUNK:MEMBER,MEMBER,... (its members and layout)
    /// or a Ceph RBD image, rbd:POOL/IMAGE[@SNAP][:conf=PATH] (size, object size,
    /// features, snapshots).
    pub uri: String,

    /// List the server's exports with their descriptions (the URI's export name is
    /// ignored); for aoe://, every target that answers on the interfaces.
    #[arg(long, conflicts_with = "map")]
    pub list: bool,

    /// Print the allocation map: offset, length, type (0 data, 2 zero, 3 hole,zero).
    #[arg(long)]
    pub map: bool,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InfoArgs) -> Result<()> {
    if args.uri.starts_with("iscsi://") {
        if args.map {
            return crate::info_iscsi::map(&args.uri, args.json);
        }
        return crate::info_iscsi::run(&args.uri, args.json);
    }
    if args.uri.starts_with(blockwire_rbd::PREFIX) {
        return crate::info_rbd::run(&args.uri, args.list, args.map, args.json);
    }
    if args.uri.starts_with(blockwire_server::device_spec::PREFIX) {
        return crate::info_stripe::run(&args.uri, args.list, args.map, args.json);
    }
    if args.uri.starts_with("aoe://") {
        if args.map {
            bail!("--map needs NBD's block status; AoE has no allocation map");
        }
        return crate::info_aoe::run(&args.uri, args.list, args.json);
    }
    let scheme = args.uri.split("://").next().unwrap_or_default();
    if !args.uri.contains("://")
        || !matches!(
            scheme.to_ascii_lowercase().as_str(),
            "nbd" | "nbd+unix" | "nbds" | "nbds+unix"
        )
    {
        bail!(
            "'{}': not a URI blockwire info reads (expected nbd://, nbd+unix://, nbds://, \
             nbds+unix://, aoe://, iscsi://, rbd:POOL/IMAGE or stripe:CHUNK:MEMBER,...)",
            args.uri
        );
    }
    let uri: NbdUri = args.uri.parse().map_err(|e| anyhow!("{e}"))?;
    let text = if args.list {
        let exports = list_exports(&uri).map_err(|e| anyhow!("{e}"))?;
        if args.json {
            list_json(&exports)
        } else {
            list_text(&exports)
        }
    } else {
        let options = ClientOptions {
            connections: 1,
            ..ClientOptions::default()
        };
        let client = NbdClient::connect(&uri, options).map_err(|e| anyhow!("{e}"))?;
        let details = client.details().clone();
        if args.map {
            if !details.base_allocation() {
                bail!("{uri}: the server does not support metadata context \"base:allocation\"");
            }
            let extents = allocation_map(&Device::new(Arc::new(client)))?;
            if args.json {
                map_json(&extents)
            } else {
                map_text(&extents)
            }
        } else if args.json {
            details_json(&uri, &details)
        } else {
            details_text(&uri, &details)
        }
    };
    print!("{text}");
    Ok(())
}

/// The whole export's extents, asking again from wherever each answer stopped;
/// neighbours of the same type are merged.
pub(crate) fn allocation_map(device: &Device) -> Result<Vec<Extent>> {
    let size = device.size();
    let mut map: Vec<Extent> = Vec::new();
    let mut offset = 0;
    while offset < size {
        let page = device
            .extents(offset, size - offset)
            .map_err(|e| anyhow!("block status: {e}"))?;
        let Some(last) = page.last() else {
            bail!("block status at offset {offset} returned no extents");
        };
        offset = last.end();
        for extent in page {
            match map.last_mut() {
                Some(prev) if prev.state == extent.state && prev.end() == extent.offset => {
                    prev.len += extent.len
                }
                _ => map.push(extent),
            }
        }
    }
    Ok(map)
}

/// `64M` for exact sizes, else one decimal (`20.0M`).
pub(crate) fn human(bytes: u64) -> String {
    let exact = format_size(bytes);
    if exact != bytes.to_string() || bytes < 1024 {
        return exact;
    }
    let units = [("P", 50), ("T", 40), ("G", 30), ("M", 20), ("K", 10)];
    let (unit, shift) = units
        .into_iter()
        .find(|(_, shift)| bytes >= 1u64 << shift)
        .unwrap();
    format!("{:.1}{unit}", bytes as f64 / (1u64 << shift) as f64)
}

fn handshake(details: &ExportDetails) -> &'static str {
    if details.used_go {
        "fixed newstyle (NBD_OPT_GO)"
    } else {
        "newstyle (NBD_OPT_EXPORT_NAME)"
    }
}

fn yes_no(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

fn details_text(uri: &NbdUri, details: &ExportDetails) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "export: {:?}", details.name);
    if let Some(description) = &details.description {
        let _ = writeln!(out, "description: {description}");
    }
    let _ = writeln!(out, "size: {} ({})", details.size, human(details.size));
    match details.advertised_block_sizes {
        Some(sizes) => {
            let _ = writeln!(
                out,
                "block sizes: minimum {}, preferred {}, maximum {}",
                sizes.minimum, sizes.preferred, sizes.maximum
            );
        }
        None => {
            let _ = writeln!(out, "block sizes: not advertised");
        }
    }
    let words = details.flag_words();
    let flags = if words.is_empty() {
        "none".to_string()
    } else {
        words.join(" ")
    };
    let _ = writeln!(out, "flags: {flags}");
    let _ = writeln!(out, "structured replies: {}", yes_no(details.structured));
    let _ = writeln!(
        out,
        "extended headers: {}",
        yes_no(details.extended_headers)
    );
    let contexts = if details.contexts.is_empty() {
        "none".to_string()
    } else {
        details.contexts.join(" ")
    };
    let _ = writeln!(out, "contexts: {contexts}");
    let _ = writeln!(out, "handshake: {}", handshake(details));
    let _ = writeln!(out, "uri: {uri}");
    out
}

fn list_text(exports: &[(String, String)]) -> String {
    let mut out = String::new();
    for (name, description) in exports {
        if description.is_empty() {
            let _ = writeln!(out, "{name:?}");
        } else {
            let _ = writeln!(out, "{name:?}\t{description}");
        }
    }
    out
}

/// One line per extent, in `nbdinfo --map`'s columns.
pub(crate) fn map_text(extents: &[Extent]) -> String {
    let mut out = String::new();
    for extent in extents {
        let (kind, words) = allocation_type(extent.state);
        let _ = writeln!(
            out,
            "{:>10}  {:>10}  {:>3}  {words}",
            extent.offset, extent.len, kind
        );
    }
    out
}

/// A JSON string literal.
pub(crate) fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_strings<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(json_string).collect();
    format!("[{}]", items.join(", "))
}

fn details_json(uri: &NbdUri, details: &ExportDetails) -> String {
    let block_sizes = match details.advertised_block_sizes {
        Some(sizes) => format!(
            "{{\"minimum\": {}, \"preferred\": {}, \"maximum\": {}}}",
            sizes.minimum, sizes.preferred, sizes.maximum
        ),
        None => "null".into(),
    };
    let description = details
        .description
        .as_deref()
        .map_or("null".into(), json_string);
    let fields = [
        ("export", json_string(&details.name)),
        ("description", description),
        ("size", details.size.to_string()),
        ("size_human", json_string(&human(details.size))),
        ("block_sizes", block_sizes),
        ("flags", json_strings(details.flag_words())),
        ("transmission_flags", details.flags.to_string()),
        ("read_only", details.read_only().to_string()),
        ("structured", details.structured.to_string()),
        ("extended_headers", details.extended_headers.to_string()),
        (
            "contexts",
            json_strings(details.contexts.iter().map(String::as_str)),
        ),
        ("handshake", json_string(handshake(details))),
        ("uri", json_string(&uri.to_string())),
    ];
    let body: Vec<String> = fields
        .iter()
        .map(|(key, value)| format!("  {}: {value}", json_string(key)))
        .collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

fn list_json(exports: &[(String, String)]) -> String {
    let items: Vec<String> = exports
        .iter()
        .map(|(name, description)| {
            format!(
                "  {{\"name\": {}, \"description\": {}}}",
                json_string(name),
                json_string(description)
            )
        })
        .collect();
    if items.is_empty() {
        return "[]\n".into();
    }
    format!("[\n{}\n]\n", items.join(",\n"))
}

pub(crate) fn map_json(extents: &[Extent]) -> String {
    let items: Vec<String> = extents
        .iter()
        .map(|extent| {
            let (kind, words) = allocation_type(extent.state);
            format!(
                "  {{\"offset\": {}, \"length\": {}, \"type\": {kind}, \"description\": {}}}",
                extent.offset,
                extent.len,
                json_string(words)
            )
        })
        .collect();
    if items.is_empty() {
        return "[]\n".into();
    }
    format!("[\n{}\n]\n", items.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_blockdev::ExtentState;

    fn extent(offset: u64, len: u64, state: ExtentState) -> Extent {
        Extent { offset, len, state }
    }

    #[test]
    fn map_lines_use_nbdinfo_columns() {
        let text = map_text(&[
            extent(0, 3145728, ExtentState::Hole),
            extent(3145728, 2097152, ExtentState::Data),
            extent(5242880, 4096, ExtentState::Zero),
        ]);
        assert_eq!(
            text,
            "         0     3145728    3  hole,zero\n   3145728     2097152    0  data\n   5242880        4096    2  zero\n"
        );
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
        assert_eq!(
            map_json(&[extent(0, 512, ExtentState::Data)]),
            "[\n  {\"offset\": 0, \"length\": 512, \"type\": 0, \"description\": \"data\"}\n]\n"
        );
        assert_eq!(list_json(&[]), "[]\n");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(64 << 20), "64M");
        assert_eq!(human((20 << 20) + 512), "20.0M");
        assert_eq!(human(1000), "1000");
        assert_eq!(human(0), "0");
    }
}
