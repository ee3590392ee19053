//! `blockwire info iscsi://...`: with a target and LUN, what the logical unit says
//! about itself and what the login settled; with only a portal
//! (`iscsi://host[:port]`), SendTargets discovery: every target with its portals and
//! logical units (type, size, vendor strings), as `iscsi-ls -s` lists them.

use std::sync::Arc;

use anyhow::{anyhow, Result};
use blockwire_blockdev::Device;
use blockwire_iscsi::initiator::{
    device_type_name, discover, inventory, IscsiClient, IscsiOptions, IscsiUri, LunSummary,
};
use serde_json::json;

use crate::info_format::{allocation_map, human, map_json, map_text};

pub fn run(uri: &str, json: bool) -> Result<()> {
    let uri: IscsiUri = uri.parse().map_err(|e| anyhow!("{e}"))?;
    let options = IscsiOptions::default();
    if uri.target.is_none() {
        return list(&uri, &options, json);
    }
    let client = IscsiClient::connect(&uri, options).map_err(|e| anyhow!("{e}"))?;
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

/// `--map`: the allocation map from GET LBA STATUS.
pub fn map(uri: &str, json: bool) -> Result<()> {
    let uri: IscsiUri = uri.parse().map_err(|e| anyhow!("{e}"))?;
    let client = IscsiClient::connect(&uri, IscsiOptions::default()).map_err(|e| anyhow!("{e}"))?;
    if !client.details().get_lba_status {
        return Err(anyhow!(
            "{uri}: the logical unit does not report GET LBA STATUS (no provisioning)"
        ));
    }
    let extents = allocation_map(&Device::new(Arc::new(client)))?;
    print!(
        "{}",
        if json {
            map_json(&extents)
        } else {
            map_text(&extents)
        }
    );
    Ok(())
}

fn list(uri: &IscsiUri, options: &IscsiOptions, json: bool) -> Result<()> {
    let targets = discover(uri, options).map_err(|e| anyhow!("{e}"))?;
    let mut described = Vec::new();
    for target in &targets {
        let mut target_uri = uri.clone();
        target_uri.target = Some(target.name.clone());
        // A target we may not log in to is still listed, with the reason.
        let luns = inventory(&target_uri, options).map_err(|e| e.to_string());
        described.push((target, luns));
    }
    if json {
        let items: Vec<_> = described
            .iter()
            .map(|(target, luns)| {
                let mut item = json!({
                    "target": target.name,
                    "portals": target.addresses,
                });
                match luns {
                    Ok(luns) => item["luns"] = luns.iter().map(lun_json).collect(),
                    Err(e) => item["error"] = json!(e),
                }
                item
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&items)?);
        return Ok(());
    }
    if described.is_empty() {
        println!("no targets");
    }
    for (target, luns) in &described {
        println!("Target: {}", target.name);
        for portal in &target.addresses {
            println!("  Portal: {portal}");
        }
        match luns {
            Ok(luns) => {
                for lun in luns {
                    println!("  {}", lun_text(lun));
                }
            }
            Err(e) => println!("  (cannot list logical units: {e})"),
        }
    }
    Ok(())
}

fn lun_text(lun: &LunSummary) -> String {
    let inquiry = &lun.inquiry;
    let mut line = format!(
        "Lun:{} Type:{} ({} {} {})",
        lun.lun,
        device_type_name(inquiry.device_type),
        inquiry.vendor,
        inquiry.product,
        inquiry.revision
    );
    if let Some((blocks, block_size)) = lun.capacity {
        let size = blocks.saturating_mul(u64::from(block_size));
        line += &format!(
            " Size:{} ({size} bytes, {block_size}-byte blocks)",
            human(size)
        );
    }
    line
}

fn lun_json(lun: &LunSummary) -> serde_json::Value {
    let inquiry = &lun.inquiry;
    json!({
        "lun": lun.lun,
        "type": device_type_name(inquiry.device_type),
        "vendor": inquiry.vendor,
        "product": inquiry.product,
        "revision": inquiry.revision,
        "size": lun.capacity.map(|(blocks, bs)| blocks.saturating_mul(u64::from(bs))),
        "block_size": lun.capacity.map(|(_, bs)| bs),
    })
}

fn details_text(client: &IscsiClient) -> String {
    let details = client.details();
    let capacity = &details.capacity;
    let size = capacity
        .blocks
        .saturating_mul(u64::from(capacity.block_size));
    let info = blockwire_blockdev::BlockDevice::info(client);
    let mut out = format!("uri: {}\n", client.uri());
    let inquiry = &details.inquiry;
    out += &format!(
        "device: {} {} {} ({})\n",
        inquiry.vendor,
        inquiry.product,
        inquiry.revision,
        device_type_name(inquiry.device_type)
    );
    out += &format!("size: {size} ({})\n", human(size));
    out += &format!(
        "block size: {} (preferred {}, maximum transfer {})\n",
        capacity.block_size, info.block_sizes.preferred, info.block_sizes.maximum
    );
    let yes = |b: bool| if b { "yes" } else { "no" };
    out += &format!(
        "thin provisioning: {} (unmap {}, write same with unmap {}, unmapped reads zero {})\n",
        yes(capacity.provisioning),
        yes(details.provisioning.unmap),
        yes(details.provisioning.write_same_unmap),
        yes(capacity.reads_zero)
    );
    out += &format!(
        "write same: {}, get lba status: {}\n",
        yes(details.write_same),
        yes(details.get_lba_status)
    );
    if let Some(params) = client.session_params(0) {
        out += &format!(
            "session: {} session(s), TSIH {:#06x}, digests header {} data {}, \
             immediate data {}, initial R2T {}, first burst {}, max burst {}, \
             target max PDU data {}\n",
            client.sessions(),
            params.tsih,
            yes(params.header_digest),
            yes(params.data_digest),
            yes(params.immediate_data),
            yes(params.initial_r2t),
            params.first_burst_length,
            params.max_burst_length,
            params.target_max_recv
        );
        if let Some(alias) = &params.target_alias {
            out += &format!("target alias: {alias}\n");
        }
    }
    out
}

fn details_json(client: &IscsiClient) -> String {
    let details = client.details();
    let capacity = &details.capacity;
    let info = blockwire_blockdev::BlockDevice::info(client);
    let params = client.session_params(0);
    let value = json!({
        "uri": client.uri().to_string(),
        "vendor": details.inquiry.vendor,
        "product": details.inquiry.product,
        "revision": details.inquiry.revision,
        "type": device_type_name(details.inquiry.device_type),
        "size": capacity.blocks.saturating_mul(u64::from(capacity.block_size)),
        "block_size": capacity.block_size,
        "preferred_block_size": info.block_sizes.preferred,
        "maximum_transfer": info.block_sizes.maximum,
        "thin_provisioning": capacity.provisioning,
        "unmap": details.provisioning.unmap,
        "write_same": details.write_same,
        "get_lba_status": details.get_lba_status,
        "sessions": client.sessions(),
        "header_digest": params.as_ref().map(|p| p.header_digest),
        "data_digest": params.as_ref().map(|p| p.data_digest),
        "immediate_data": params.as_ref().map(|p| p.immediate_data),
        "initial_r2t": params.as_ref().map(|p| p.initial_r2t),
        "first_burst_length": params.as_ref().map(|p| p.first_burst_length),
        "max_burst_length": params.as_ref().map(|p| p.max_burst_length),
    });
    format!(
        "{}\n",
        serde_json::to_string_pretty(&value).unwrap_or_default()
    )
}
