//! `blockwire info stripe:CHUNK:MEMBER,...`: what a striped volume would be — its
//! size, block sizes and capabilities from its members — and each member; `--map`
//! for its allocation.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{bail, Result};
use blockwire_blockdev::size::format_size;
use blockwire_blockdev::{Capabilities, Device, Stripe};

use crate::info_format::{allocation_map, human, map_json, map_text};
use blockwire_server::device_spec::Target;
use blockwire_server::factory::Remote;

pub fn run(spec: &str, list: bool, map: bool, json: bool) -> Result<()> {
    if list {
        bail!("--list lists a server's exports; a stripe names its members itself");
    }
    let Target::Stripe(parsed) = Target::parse(spec)? else {
        bail!("'{spec}' is not a stripe:CHUNK:MEMBER,... volume");
    };
    let stripe = parsed.open_stripe(true, Remote::default())?;
    let summary = Summary::of(&stripe);
    // The volume as users see it: through the checked handle, with its emulations.
    let device = Device::new(Arc::new(stripe));
    let text = if map {
        let extents = allocation_map(&device)?;
        if json {
            map_json(&extents)
        } else {
            map_text(&extents)
        }
    } else if json {
        details_json(&parsed.describe(), &summary, &device)
    } else {
        details_text(&parsed.describe(), &summary, &device)
    };
    print!("{text}");
    Ok(())
}

/// What the volume is made of.
struct Summary {
    chunk: u64,
    member_size: u64,
    /// Name as given, size, minimum block size.
    members: Vec<(String, u64, u32)>,
}

impl Summary {
    fn of(stripe: &Stripe) -> Summary {
        Summary {
            chunk: stripe.layout().chunk(),
            member_size: stripe.member_size(),
            members: stripe
                .members()
                .iter()
                .zip(stripe.member_names())
                .map(|(m, name)| (name.clone(), m.size(), m.info().block_sizes.minimum))
                .collect(),
        }
    }
}

/// The operations a device offers, as words.
fn capability_words(caps: &Capabilities) -> Vec<&'static str> {
    [
        ("flush", caps.flush.available()),
        ("fua", caps.fua.available()),
        ("trim", caps.trim.available()),
        ("zero", caps.write_zeroes.available()),
        ("fast-zero", caps.fast_zero.available()),
        ("extents", caps.extents.available()),
        ("cache", caps.cache.available()),
    ]
    .into_iter()
    .filter_map(|(word, yes)| yes.then_some(word))
    .collect()
}

fn details_text(spec: &str, summary: &Summary, device: &Device) -> String {
    let info = device.info();
    let mut out = String::new();
    let _ = writeln!(out, "volume: {spec}");
    let _ = writeln!(out, "size: {} ({})", info.size, human(info.size));
    let _ = writeln!(
        out,
        "stripe: {} members, chunk {}, {} of each member used",
        summary.members.len(),
        format_size(summary.chunk),
        human(summary.member_size)
    );
    let sizes = info.block_sizes;
    let _ = writeln!(
        out,
        "block sizes: minimum {}, preferred {}, maximum {}",
        sizes.minimum, sizes.preferred, sizes.maximum
    );
    let _ = writeln!(
        out,
        "read-only: {}",
        if info.read_only { "yes" } else { "no" }
    );
    let _ = writeln!(
        out,
        "operations: {}",
        capability_words(&info.capabilities).join(" ")
    );
    for (i, (name, size, block)) in summary.members.iter().enumerate() {
        let _ = writeln!(
            out,
            "member {i}: {name}: {size} ({}), block size {block}",
            human(*size)
        );
    }
    out
}

fn details_json(spec: &str, summary: &Summary, device: &Device) -> String {
    let info = device.info();
    let members: Vec<serde_json::Value> = summary
        .members
        .iter()
        .map(|(name, size, block)| {
            serde_json::json!({
                "uri": name,
                "size": size,
                "block_size_minimum": block,
            })
        })
        .collect();
    let value = serde_json::json!({
        "volume": spec,
        "size": info.size,
        "chunk": summary.chunk,
        "member_size": summary.member_size,
        "block_size_minimum": info.block_sizes.minimum,
        "block_size_preferred": info.block_sizes.preferred,
        "block_size_maximum": info.block_sizes.maximum,
        "read_only": info.read_only,
        "operations": capability_words(&info.capabilities),
        "members": members,
    });
    format!("{value:#}\n")
}
