//! `blockwire info URI`: what an NBD server says about an export, its list of
//! exports (`--list`), or the export's allocation map (`--map`, as `nbdinfo --map`
//! prints it); `--json` for machines.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use blockwire_blockdev::Device;
use blockwire_nbd::initiator::{list_exports, ClientOptions, ExportDetails, NbdClient, NbdUri};
use clap::Args;

use crate::info_format::{allocation_map, human, json_string, map_json, map_text};

mod nfs;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// The export: nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH or
    /// aoe://IFACE[,IFACE]/eSHELF.SLOT (with --list, aoe://IFACE is enough) or
    /// iscsi://[USER@]HOST[:PORT]/IQN/LUN (iscsi://HOST[:PORT] lists the targets)
    /// or nvme+tcp://HOST[:PORT]/NQN[/NSID] (nvme+tcp://HOST[:PORT] lists the
    /// subsystems of the discovery controller, port 8009 by default)
    /// or a striped volume, stripe:CHUNK:MEMBER,MEMBER,... (its members and layout)
    /// or a Ceph RBD image, rbd:POOL/IMAGE[@SNAP][:conf=PATH] (size, object size,
    /// features, snapshots)
    /// or a file on an NFS server, nfs://SERVER[:PORT]/EXPORT/FILE (size, block
    /// sizes, operations, server, NFS version).
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
    if args.uri.to_ascii_lowercase().starts_with("nvme+tcp://") {
        return crate::info_nvme::run(&args.uri, args.map, args.json);
    }
    if args.uri.starts_with(blockwire_rbd::PREFIX) {
        return crate::info_rbd::run(&args.uri, args.list, args.map, args.json);
    }
    if args.uri.starts_with(blockwire_server::device_spec::PREFIX) {
        return crate::info_stripe::run(&args.uri, args.list, args.map, args.json);
    }
    if args
        .uri
        .split_once("://")
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("nfs"))
    {
        return nfs::run(&args.uri, args.list, args.map, args.json);
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
             nbds+unix://, aoe://, iscsi://, nvme+tcp://, nfs://, rbd:POOL/IMAGE or \
             stripe:CHUNK:MEMBER,...)",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_lists_are_json() {
        assert_eq!(list_json(&[]), "[]\n");
        assert_eq!(
            list_json(&[("a\"b".into(), String::new())]),
            "[\n  {\"name\": \"a\\\"b\", \"description\": \"\"}\n]\n"
        );
    }
}
