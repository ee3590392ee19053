//! Get Log Page: error information, SMART / health, firmware slots, commands
//! supported and effects, changed namespaces, ANA, and discovery.

use std::net::SocketAddr;

use super::core::Core;
use super::ctrl::Controller;
use super::identify::ANA_GROUP;
use super::queue::Reply;
use super::subsystem::NSID;
use crate::cqe::Status;
use crate::opcodes::{admin, io, log};
use crate::sqe::Sqe;

/// Length of the discovery log page header and of each of its entries.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

pub(crate) fn get_log_page(
    core: &Core,
    controller: &Controller,
    local: Option<SocketAddr>,
    sqe: &Sqe,
) -> Reply {
    let cdw10 = sqe.cdw(10);
    let lid = cdw10 as u8;
    let lsp = ((cdw10 >> 8) & 0xf) as u8;
    let retain = cdw10 & (1 << 15) != 0;
    let numd = (u64::from(sqe.cdw(11) & 0xffff) << 16) | u64::from(cdw10 >> 16);
    let len = ((numd + 1) * 4) as usize;
    let offset = sqe.cdw_pair(12);
    if len > core.settings.max_transfer() as usize || !offset.is_multiple_of(4) {
        return Reply::status(Status::INVALID_FIELD);
    }
    let page = match (lid, controller.is_discovery()) {
        (log::DISCOVERY, true) => discovery_log(core, controller, local),
        (_, true) => return Reply::status(Status::INVALID_LOG_PAGE),
        (log::ERROR, false) => controller.errors().page(),
        (log::SMART, false) => smart_log(controller),
        (log::FIRMWARE_SLOT, false) => firmware_log(core),
        (log::COMMANDS_EFFECTS, false) => commands_effects(),
        (log::CHANGED_NAMESPACES, false) => {
            let mut page = vec![0; 4096];
            for (i, nsid) in controller.changed_namespaces(retain).iter().enumerate() {
                page[i * 4..i * 4 + 4].copy_from_slice(&nsid.to_le_bytes());
            }
            page
        }
        (log::ANA, false) => ana_log(controller, lsp & 1 != 0),
        _ => return Reply::status(Status::INVALID_LOG_PAGE),
    };
    // The host asks for a window: bytes past the page read as zeroes.
    let mut data = vec![0; len];
    if let Ok(start) = usize::try_from(offset) {
        if start < page.len() {
            let n = (page.len() - start).min(len);
            data[..n].copy_from_slice(&page[start..start + n]);
        } else {
            return Reply::status(Status::INVALID_FIELD);
        }
    }
    Reply::ok(0, data)
}

/// SMART / Health (512 bytes): healthy; the namespace's reads and writes (all
/// hosts, as Linux nvmet reports a block device's); this controller's error
/// count. No temperature: there is no sensor behind an export, and as nvmet
/// does the composite temperature stays 0 (with no thresholds in Identify
/// Controller, hosts raise no temperature warning).
fn smart_log(controller: &Controller) -> Vec<u8> {
    let mut d = vec![0u8; 512];
    d[3] = 100; // available spare
    d[4] = 10; // its threshold
    let put = |d: &mut [u8], at: usize, v: u64| d[at..at + 8].copy_from_slice(&v.to_le_bytes());
    if let Some(subsystem) = controller.subsystem() {
        let (read, written) = subsystem.stats.data_units();
        let (reads, writes) = subsystem.stats.commands();
        put(&mut d, 32, read);
        put(&mut d, 48, written);
        put(&mut d, 64, reads);
        put(&mut d, 80, writes);
    }
    let errors = controller.errors();
    put(&mut d, 160, errors.media_errors());
    put(&mut d, 176, errors.count());
    d
}

/// Firmware slot information: slot 1 active, holding this version.
fn firmware_log(core: &Core) -> Vec<u8> {
    let mut d = vec![0u8; 512];
    d[0] = 1;
    let fw = core.settings.firmware.as_bytes();
    let mut slot = [b' '; 8];
    slot[..fw.len().min(8)].copy_from_slice(&fw[..fw.len().min(8)]);
    d[8..16].copy_from_slice(&slot);
    d
}

/// Commands Supported and Effects: each supported command marked supported (bit
/// 0), with "changes the namespace's content" (bit 1) for writes.
fn commands_effects() -> Vec<u8> {
    let mut d = vec![0u8; 4096];
    let mut mark = |base: usize, opcode: u8, effects: u32| {
        let at = base + usize::from(opcode) * 4;
        d[at..at + 4].copy_from_slice(&(1 | effects).to_le_bytes());
    };
    for opcode in [
        admin::GET_LOG_PAGE,
        admin::IDENTIFY,
        admin::ABORT,
        admin::SET_FEATURES,
        admin::GET_FEATURES,
        admin::ASYNC_EVENT_REQUEST,
        admin::KEEP_ALIVE,
    ] {
        mark(0, opcode, 0);
    }
    for (opcode, changes) in [
        (io::FLUSH, false),
        (io::WRITE, true),
        (io::READ, false),
        (io::COMPARE, false),
        (io::WRITE_ZEROES, true),
        (io::DATASET_MANAGEMENT, true),
    ] {
        mark(1024, opcode, if changes { 1 << 1 } else { 0 });
    }
    d
}

/// ANA: one group, optimized, holding the namespace (none once a reload removed
/// it). `groups_only` (LSP bit 0) leaves out the NSID lists.
fn ana_log(controller: &Controller, groups_only: bool) -> Vec<u8> {
    let active = controller.subsystem().is_some();
    let nsids: &[u32] = if active && !groups_only { &[NSID] } else { &[] };
    let mut d = vec![0u8; 16 + 32 + 4 * nsids.len()];
    d[0..8].copy_from_slice(&1u64.to_le_bytes()); // change count
    d[8..10].copy_from_slice(&1u16.to_le_bytes()); // one group descriptor
    let g = &mut d[16..];
    g[0..4].copy_from_slice(&ANA_GROUP.to_le_bytes());
    g[4..8].copy_from_slice(&(nsids.len() as u32).to_le_bytes());
    g[8..16].copy_from_slice(&1u64.to_le_bytes());
    g[16] = 0x01; // optimized
    for (i, nsid) in nsids.iter().enumerate() {
        g[32 + i * 4..36 + i * 4].copy_from_slice(&nsid.to_le_bytes());
    }
    d
}

/// The discovery log page: one entry per subsystem the host may use and per I/O
/// port (NVMe-oF 1.1 figure "Discovery Log Page Entry").
fn discovery_log(core: &Core, controller: &Controller, local: Option<SocketAddr>) -> Vec<u8> {
    let subsystems: Vec<_> = core
        .subsystems()
        .into_iter()
        .filter(|s| s.allows(&controller.hostnqn))
        .collect();
    let ports = core.ports();
    let advertised = core.advertised();
    let mut entries = Vec::new();
    for s in &subsystems {
        for (portid, port) in ports.iter().enumerate() {
            let addr = match advertised {
                Some(ip) => SocketAddr::new(ip, port.port()),
                None => reported(*port, local),
            };
            entries.push(discovery_entry(&s.nqn, portid as u16 + 1, addr));
        }
    }
    let mut d = vec![0u8; DISCOVERY_RECORD_LEN * (1 + entries.len())];
    d[0..8].copy_from_slice(&core.genctr().to_le_bytes());
    d[8..16].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    for (i, entry) in entries.iter().enumerate() {
        let at = DISCOVERY_RECORD_LEN * (i + 1);
        d[at..at + DISCOVERY_RECORD_LEN].copy_from_slice(entry);
    }
    d
}

/// The address a host should use for `port`: a wildcard listener is reported
/// by the address the host reached discovery on.
fn reported(port: SocketAddr, local: Option<SocketAddr>) -> SocketAddr {
    match local {
        Some(local) if port.ip().is_unspecified() => SocketAddr::new(local.ip(), port.port()),
        _ => port,
    }
}

fn discovery_entry(nqn: &str, portid: u16, addr: SocketAddr) -> [u8; DISCOVERY_RECORD_LEN] {
    let mut e = [0u8; DISCOVERY_RECORD_LEN];
    e[0] = 3; // TRTYPE: TCP
    e[1] = if addr.is_ipv4() { 1 } else { 2 }; // ADRFAM
    e[2] = 2; // SUBTYPE: NVM subsystem
    e[3] = 0; // TREQ: secure channel not specified
    e[4..6].copy_from_slice(&portid.to_le_bytes());
    e[6..8].copy_from_slice(&0xffffu16.to_le_bytes()); // dynamic controllers
    e[8..10].copy_from_slice(&32u16.to_le_bytes()); // ASQSZ
                                                    // Strings NUL-padded, as Linux nvmet writes them (nvme-cli strips both).
    let field = |e: &mut [u8], at: usize, len: usize, text: &str| {
        let n = text.len().min(len - 1);
        e[at..at + n].copy_from_slice(&text.as_bytes()[..n]);
    };
    field(&mut e, 32, 32, &addr.port().to_string());
    field(&mut e, 256, 256, nqn);
    field(&mut e, 512, 256, &addr.ip().to_string());
    // TSAS for TCP: SECTYPE 0, no security.
    e
}
