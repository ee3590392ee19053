//! `blockwire info rbd:POOL/IMAGE[@SNAP]`: what librbd says about an image — size,
//! object size, features, snapshots — and a word on the exclusive lock, since two
//! writers through two gateways make librbd pass it back and forth; `--map` for its
//! allocated objects.

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use blockwire_blockdev::Device;
use blockwire_rbd::{Description, RbdDevice, RbdSpec};

use crate::info_format::{allocation_map, human, map_json, map_text};

pub fn run(spec: &str, list: bool, map: bool, json: bool) -> Result<()> {
    if list {
        bail!("--list lists a server's exports; `rbd ls POOL` lists a pool's images");
    }
    let spec = RbdSpec::parse(spec).map_err(|e| anyhow!(e))?;
    // Read-only: info never takes the lock from a gateway that writes.
    let image = RbdDevice::open(&spec, true).map_err(|e| anyhow!("{e}"))?;
    let description = image.description().clone();
    let device = Device::new(Arc::new(image));
    let text = if map {
        let extents = allocation_map(&device)?;
        if json {
            map_json(&extents)
        } else {
            map_text(&extents)
        }
    } else if json {
        details_json(&spec, &description)
    } else {
        details_text(&spec, &description)
    };
    print!("{text}");
    Ok(())
}

fn details_text(spec: &RbdSpec, description: &Description) -> String {
    let stat = &description.stat;
    let mut out = String::new();
    let _ = writeln!(out, "image: {spec}");
    let _ = writeln!(out, "size: {} ({})", stat.size, human(stat.size));
    let _ = writeln!(
        out,
        "object size: {} ({} objects), the preferred I/O size",
        human(stat.object_size),
        stat.objects
    );
    let _ = writeln!(out, "features: {}", description.feature_names().join(", "));
    let names: Vec<&str> = description
        .snapshots
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    let _ = writeln!(
        out,
        "snapshots: {}",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    );
    if spec.snapshot.is_some() {
        let _ = writeln!(out, "read-only: yes (a snapshot)");
    }
    if description.has_exclusive_lock() {
        let _ = writeln!(
            out,
            "note: exclusive-lock is on: one writer at a time; writers through two \
             gateways make librbd pass the lock back and forth (slow, not wrong); \
             serve with :exclusive=true to keep it"
        );
    }
    out
}

fn details_json(spec: &RbdSpec, description: &Description) -> String {
    let stat = &description.stat;
    let snapshots: Vec<serde_json::Value> = description
        .snapshots
        .iter()
        .map(|s| serde_json::json!({ "name": s.name, "id": s.id, "size": s.size }))
        .collect();
    let value = serde_json::json!({
        "image": spec.to_string(),
        "size": stat.size,
        "object_size": stat.object_size,
        "objects": stat.objects,
        "features": description.feature_names(),
        "exclusive_lock": description.has_exclusive_lock(),
        "snapshots": snapshots,
        "read_only": spec.snapshot.is_some(),
    });
    format!("{value:#}\n")
}
