//! `blockwire info nvme+tcp://...`: with a subsystem NQN, what its controller and
//! namespace say about themselves; with only a host (`nvme+tcp://host[:port]`, port
//! 8009 by default), the discovery log: every subsystem with its address, as
//! `nvme discover` lists them.

use anyhow::{anyhow, bail, Result};
use blockwire_blockdev::BlockDevice;
use blockwire_nvme::initiator::{discover, DiscoveryEntry, NvmeClient, NvmeOptions};
use serde_json::json;

use crate::info_format::human;

/// The discovery log's subsystem type of an NVM subsystem.
const SUBTYPE_NVM: u8 = 2;

pub fn run(uri: &str, map: bool, json: bool) -> Result<()> {
    if map {
        bail!("--map needs NBD's block status; NVMe/TCP has no allocation map");
    }
    let options = NvmeOptions::parse(uri).map_err(|e| anyhow!("{e}"))?;
    if options.is_discovery() {
        let entries = discover(&options).map_err(|e| anyhow!("{e}"))?;
        print!(
            "{}",
            if json {
                list_json(&entries)
            } else {
                list_text(&options, &entries)
            }
        );
        return Ok(());
    }
    let client = NvmeClient::open(options).map_err(|e| anyhow!("{e}"))?;
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

fn kind(entry: &DiscoveryEntry) -> &'static str {
    match entry.subtype {
        1 => "referral",
        SUBTYPE_NVM => "nvm",
        3 => "discovery",
        _ => "other",
    }
}

fn list_text(options: &NvmeOptions, entries: &[DiscoveryEntry]) -> String {
    let mut out = format!(
        "discovery controller nvme+tcp://{}: {} entr{}\n",
        options.address(),
        entries.len(),
        if entries.len() == 1 { "y" } else { "ies" }
    );
    for entry in entries {
        let uri = if entry.subtype == SUBTYPE_NVM {
            entry.uri()
        } else {
            format!("{} ({})", entry.subnqn, kind(entry))
        };
        out += &format!("  {uri}\n");
    }
    out
}

fn list_json(entries: &[DiscoveryEntry]) -> String {
    let list: Vec<_> = entries
        .iter()
        .map(|e| {
            json!({
                "subnqn": e.subnqn,
                "type": kind(e),
                "traddr": e.traddr,
                "trsvcid": e.trsvcid,
                "portid": e.portid,
                "uri": (e.subtype == SUBTYPE_NVM).then(|| e.uri()),
            })
        })
        .collect();
    format!(
        "{}\n",
        serde_json::to_string_pretty(&json!({ "subsystems": list })).unwrap_or_default()
    )
}

fn yes(value: bool) -> &'static str {
    if value {
        "yes"
    } else {
        "no"
    }
}

fn details_text(client: &NvmeClient) -> String {
    let controller = client.controller();
    let namespace = client.namespace();
    let info = client.info();
    let size = namespace.size();
    let mut out = format!("uri: {}\n", client.options());
    out += &format!(
        "controller: {} (serial {}, firmware {}, cntlid {})\n",
        controller.model, controller.serial, controller.firmware, controller.cntlid
    );
    out += &format!("size: {size} ({})\n", human(size));
    out += &format!(
        "block size: {} (maximum transfer {})\n",
        namespace.block_size, info.block_sizes.maximum
    );
    out += &format!(
        "read-only: {}, volatile write cache: {}, deallocate: {}, write zeroes: {}\n",
        yes(namespace.write_protected),
        yes(controller.volatile_write_cache),
        yes(controller.supports_deallocate()),
        yes(controller.supports_write_zeroes())
    );
    let options = client.options();
    out += &format!(
        "queues: {} I/O, digests header {} data {}, host {}\n",
        client.io_queues(),
        yes(options.header_digest),
        yes(options.data_digest),
        options.hostnqn
    );
    out
}

fn details_json(client: &NvmeClient) -> String {
    let controller = client.controller();
    let namespace = client.namespace();
    let options = client.options();
    let value = json!({
        "uri": options.to_string(),
        "model": controller.model,
        "serial": controller.serial,
        "firmware": controller.firmware,
        "cntlid": controller.cntlid,
        "size": namespace.size(),
        "block_size": namespace.block_size,
        "maximum_transfer": client.info().block_sizes.maximum,
        "read_only": namespace.write_protected,
        "volatile_write_cache": controller.volatile_write_cache,
        "deallocate": controller.supports_deallocate(),
        "write_zeroes": controller.supports_write_zeroes(),
        "io_queues": client.io_queues(),
        "header_digest": options.header_digest,
        "data_digest": options.data_digest,
        "hostnqn": options.hostnqn,
    });
    format!(
        "{}\n",
        serde_json::to_string_pretty(&value).unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(subtype: u8, subnqn: &str) -> DiscoveryEntry {
        DiscoveryEntry {
            trtype: 3,
            adrfam: 1,
            subtype,
            portid: 1,
            cntlid: 0xffff,
            trsvcid: "4420".into(),
            traddr: "127.0.0.1".into(),
            subnqn: subnqn.into(),
        }
    }

    #[test]
    fn the_discovery_log_lists_each_subsystem_as_a_uri() {
        let options = NvmeOptions::parse("nvme+tcp://127.0.0.1").unwrap();
        let text = list_text(
            &options,
            &[
                entry(2, "nqn.2026-11.dev.blockwire:a"),
                entry(3, "nqn.2014-08.org.nvmexpress.discovery"),
            ],
        );
        assert_eq!(
            text,
            "discovery controller nvme+tcp://127.0.0.1:8009: 2 entries\n  \
             nvme+tcp://127.0.0.1:4420/nqn.2026-11.dev.blockwire:a\n  \
             nqn.2014-08.org.nvmexpress.discovery (discovery)\n"
        );
        let json = list_json(&[entry(2, "nqn.2026-11.dev.blockwire:a")]);
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            value["subsystems"][0]["uri"],
            "nvme+tcp://127.0.0.1:4420/nqn.2026-11.dev.blockwire:a"
        );
    }
}
