//! `blockwire info aoe://...`: what an AoE target says about itself (config query and
//! IDENTIFY DEVICE, per path), or with `--list` every target that answers a broadcast
//! on the URI's interfaces.

use std::time::Duration;

use anyhow::{anyhow, Result};
use blockwire_aoe::initiator::{
    discover_by_name, format_mac, AoeClient, AoeOptions, AoeUri, Found,
};
use blockwire_aoe::wire::{BROADCAST_SHELF, BROADCAST_SLOT, SECTOR_SIZE};
use blockwire_blockdev::size::format_size;
use serde_json::json;

/// How long `--list` listens for answers.
const LIST_WAIT: Duration = Duration::from_secs(1);

/// The interfaces of `aoe://IFACE[,IFACE]/...` (the target part may be absent).
fn interfaces(uri: &str) -> Result<Vec<String>> {
    let rest = uri
        .strip_prefix("aoe://")
        .ok_or_else(|| anyhow!("'{uri}' is not an aoe:// URI"))?;
    let names: Vec<String> = rest
        .split('/')
        .next()
        .unwrap_or("")
        .split(',')
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    if names.is_empty() {
        return Err(anyhow!("'{uri}' names no interface (aoe://IFACE/...)"));
    }
    Ok(names)
}

pub fn run(uri: &str, list: bool, json: bool) -> Result<()> {
    if list {
        let names = interfaces(uri)?;
        let found = discover_by_name(&names, BROADCAST_SHELF, BROADCAST_SLOT, LIST_WAIT)?;
        print!(
            "{}",
            if json {
                list_json(&found)
            } else {
                list_text(&found)
            }
        );
        return Ok(());
    }
    let uri: AoeUri = uri.parse().map_err(|e| anyhow!("{e}"))?;
    let client = AoeClient::open(&uri, AoeOptions::default()).map_err(|e| anyhow!("{e}"))?;
    print!(
        "{}",
        if json {
            details_json(&client)
        } else {
            details_text(&client)
        }
    );
    Ok(())
}

fn details_text(client: &AoeClient) -> String {
    let identity = client.identity();
    let bytes = identity.sectors * SECTOR_SIZE as u64;
    let mut out = format!("target: {}\n", client.target_name());
    for path in client.paths() {
        out += &format!(
            "  path: {} (MTU {}) -> {}\n",
            path.interface.name,
            path.interface.mtu,
            format_mac(&path.target_mac)
        );
    }
    out += &format!(
        "  size: {bytes} bytes ({}), {} sectors of 512, {}-bit LBA\n",
        format_size(bytes),
        identity.sectors,
        if identity.lba48 { 48 } else { 28 }
    );
    out += &format!("  model: {}\n", identity.model);
    out += &format!("  serial: {}\n", identity.serial);
    out += &format!(
        "  firmware: {} (AoE firmware version {:#06x})\n",
        identity.firmware,
        client.firmware_version()
    );
    out += &format!("  AoE version: {}\n", client.aoe_version());
    out += &format!(
        "  buffer count: {} (window {})\n",
        client.buffer_count(),
        client.window()
    );
    out += &format!(
        "  sectors per frame: {} (target allows {})\n",
        client.sectors_per_frame(),
        client.target_sectors_per_frame()
    );
    out += &format!("  config string: {:?}\n", client.config_string());
    out += &format!("  uri: {}\n", client.uri());
    out
}

fn details_json(client: &AoeClient) -> String {
    let identity = client.identity();
    let paths: Vec<_> = client
        .paths()
        .iter()
        .map(|p| json!({"interface": p.interface.name, "mtu": p.interface.mtu, "target_mac": format_mac(&p.target_mac)}))
        .collect();
    let value = json!({
        "target": client.target_name(),
        "shelf": client.shelf(),
        "slot": client.slot(),
        "paths": paths,
        "size": identity.sectors * SECTOR_SIZE as u64,
        "sectors": identity.sectors,
        "lba48": identity.lba48,
        "model": identity.model,
        "serial": identity.serial,
        "firmware": identity.firmware,
        "firmware_version": client.firmware_version(),
        "aoe_version": client.aoe_version(),
        "buffer_count": client.buffer_count(),
        "window": client.window(),
        "sectors_per_frame": client.sectors_per_frame(),
        "target_sectors_per_frame": client.target_sectors_per_frame(),
        "config_string": client.config_string(),
        "uri": client.uri().to_string(),
    });
    format!(
        "{}\n",
        serde_json::to_string_pretty(&value).expect("JSON of plain values")
    )
}

fn list_text(found: &[Found]) -> String {
    if found.is_empty() {
        return "no AoE targets answered\n".into();
    }
    found
        .iter()
        .map(|f| {
            format!(
                "{}\t{}\t{}\tbuffers {}\t{} sectors/frame\tconfig {:?}\n",
                f.target_name(),
                f.interface.name,
                format_mac(&f.target_mac),
                f.buffer_count,
                f.sector_count,
                f.config_text()
            )
        })
        .collect()
}

fn list_json(found: &[Found]) -> String {
    let items: Vec<_> = found
        .iter()
        .map(|f| {
            json!({
                "target": f.target_name(),
                "interface": f.interface.name,
                "target_mac": format_mac(&f.target_mac),
                "buffer_count": f.buffer_count,
                "sectors_per_frame": f.sector_count,
                "firmware_version": f.firmware_version,
                "aoe_version": f.aoe_version,
                "config_string": f.config_text(),
            })
        })
        .collect();
    format!(
        "{}\n",
        serde_json::to_string_pretty(&items).expect("JSON of plain values")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interfaces_come_from_the_authority() {
        assert_eq!(
            interfaces("aoe://eth0,eth1/e1.2").unwrap(),
            ["eth0", "eth1"]
        );
        assert_eq!(interfaces("aoe://eth0").unwrap(), ["eth0"]);
        assert!(interfaces("aoe:///e1.2").is_err());
        assert!(interfaces("nbd://x/y").is_err());
    }
}
