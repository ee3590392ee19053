//! Identify: the controller, the namespace, the active namespace list and the
//! namespace identification descriptors (4096 bytes each).

use super::admin_cmd::supported_events;
use super::core::Core;
use super::ctrl::{Controller, MAX_AERS};
use super::fabrics_cmd::{KAS, VERSION};
use super::health::ERROR_LOG_ENTRIES;
use super::queue::Reply;
use super::subsystem::{Subsystem, NSID};
use crate::cqe::Status;
use crate::opcodes::cns;
use crate::sqe::Sqe;

/// Length of every Identify data structure.
pub const IDENTIFY_LEN: usize = 4096;
/// The one ANA group every namespace is in.
pub const ANA_GROUP: u32 = 1;

pub(crate) fn identify(core: &Core, controller: &Controller, sqe: &Sqe) -> Reply {
    let cns_value = sqe.cdw(10) as u8;
    let csi = (sqe.cdw(11) >> 24) as u8;
    let subsystem = controller.subsystem();
    let data = match cns_value {
        cns::CONTROLLER => identify_controller(core, controller, subsystem.as_deref()),
        _ if controller.is_discovery() => return Reply::status(Status::INVALID_FIELD),
        cns::NAMESPACE => match check_nsid(sqe.nsid()) {
            Ok(()) => identify_namespace(subsystem.as_deref()),
            Err(status) => return Reply::status(status),
        },
        cns::ACTIVE_NAMESPACES | cns::CS_ACTIVE_NAMESPACES => {
            if cns_value == cns::CS_ACTIVE_NAMESPACES && csi != 0 {
                return Reply::status(Status::INVALID_FIELD);
            }
            let mut data = vec![0; IDENTIFY_LEN];
            if subsystem.is_some() && sqe.nsid() < NSID {
                data[0..4].copy_from_slice(&NSID.to_le_bytes());
            }
            data
        }
        cns::NS_DESCRIPTORS => match (check_nsid(sqe.nsid()), &subsystem) {
            (Ok(()), Some(s)) => ns_descriptors(s),
            (Ok(()), None) => return Reply::status(Status::INVALID_NAMESPACE),
            (Err(status), _) => return Reply::status(status),
        },
        // The NVM command set's own structures: nothing beyond the defaults (no
        // limits on Verify, Write Zeroes or DSM sizes), so all zeroes.
        cns::CS_NAMESPACE | cns::CS_CONTROLLER if csi == 0 => vec![0; IDENTIFY_LEN],
        _ => return Reply::status(Status::INVALID_FIELD),
    };
    Reply::ok(0, data)
}

fn check_nsid(nsid: u32) -> Result<(), Status> {
    if nsid == NSID {
        Ok(())
    } else {
        Err(Status::INVALID_NAMESPACE)
    }
}

/// Writes `text` space-padded into `field` (ASCII fields of Identify).
fn put_ascii(field: &mut [u8], text: &str) {
    field.fill(b' ');
    let n = text.len().min(field.len());
    field[..n].copy_from_slice(&text.as_bytes()[..n]);
}

fn put_u16(data: &mut [u8], at: usize, v: u16) {
    data[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(data: &mut [u8], at: usize, v: u32) {
    data[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(data: &mut [u8], at: usize, v: u64) {
    data[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Identify Controller (NVMe base 2.0 figure 275; fabrics fields at 1792).
fn identify_controller(
    core: &Core,
    controller: &Controller,
    subsystem: Option<&Subsystem>,
) -> Vec<u8> {
    let settings = &core.settings;
    let mut d = vec![0u8; IDENTIFY_LEN];
    let discovery = controller.is_discovery();
    let serial = subsystem.map(Subsystem::serial).unwrap_or_default();
    put_ascii(&mut d[4..24], &serial);
    put_ascii(&mut d[24..64], &settings.model);
    put_ascii(&mut d[64..72], &settings.firmware);
    d[72] = 6; // RAB: arbitration burst, as nvmet
    if !discovery {
        // CMIC: more than one controller may connect, ANA reporting.
        d[76] = (1 << 1) | (1 << 3);
        d[77] = settings.mdts;
    }
    put_u16(&mut d, 78, controller.cntlid);
    put_u32(&mut d, 80, VERSION);
    put_u32(&mut d, 92, supported_events(controller));
    // CNTRLTYPE: 1 I/O controller, 2 discovery controller.
    d[111] = if discovery { 2 } else { 1 };
    d[258] = 3; // ACL: four Aborts (0's based); none is ever honoured
    d[259] = (MAX_AERS - 1) as u8; // AERL
    d[260] = 1 << 3; // FRMW: activation without reset (firmware slot 1 read-only)
                     // LPA: commands supported and effects, extended data (NUMDU, offsets).
    d[261] = if discovery {
        1 << 2
    } else {
        (1 << 1) | (1 << 2)
    };
    d[262] = (ERROR_LOG_ENTRIES - 1) as u8; // ELPE (0's based)
    put_u16(&mut d, 320, KAS);
    if !discovery {
        d[343] = 10; // ANATT: seconds
        d[344] = (1 << 0) | (1 << 6); // ANACAP: optimized; group ID never changes
        put_u32(&mut d, 345, 1); // ANAGRPMAX
        put_u32(&mut d, 349, 1); // NANAGRPID
    }
    d[512] = 0x66; // SQES: 64 bytes
    d[513] = 0x44; // CQES: 16 bytes
    put_u16(&mut d, 514, settings.queue_size);
    if let Some(s) = subsystem {
        put_u32(&mut d, 516, NSID); // NN
                                    // ONCS: Compare, Dataset Management, Write Zeroes.
        let mut oncs = 1 << 0;
        if s.device.info().capabilities.trim.available() {
            oncs |= 1 << 2;
        }
        if s.device.info().capabilities.write_zeroes.available() {
            oncs |= 1 << 3;
        }
        put_u16(&mut d, 520, oncs);
        // VWC: present when the device has a cache to flush; bits 2:1 = 11b: a
        // Flush to every namespace (NSID FFFFFFFFh) is supported.
        d[525] = u8::from(s.device.info().capabilities.flush.available()) | (0b11 << 1);
        put_u32(&mut d, 540, NSID); // MNAN
    } else if !discovery {
        put_u32(&mut d, 516, NSID);
    }
    // SGLS: SGLs supported (no alignment), offsets for in-capsule data.
    put_u32(&mut d, 536, 1 | (1 << 20));
    let subnqn = if discovery {
        crate::fabrics::DISCOVERY_NQN
    } else {
        controller.subnqn.as_str()
    };
    let n = subnqn.len().min(255);
    d[768..768 + n].copy_from_slice(&subnqn.as_bytes()[..n]);
    // IOCCSZ and IORCSZ in 16-byte units: the SQE plus in-capsule data, the CQE.
    put_u32(&mut d, 1792, (64 + settings.inline_data_size) / 16);
    put_u32(&mut d, 1796, 1);
    put_u16(&mut d, 1800, 0); // ICDOFF
    d[1802] = 0; // FCATT: dynamic controller model
    d[1803] = 1; // MSDBD: one SGL data block descriptor
    put_u16(&mut d, 1804, 1); // OFCS: Disconnect supported
    d
}

/// Identify Namespace. A namespace a reload removed reads as all zeroes (not
/// active).
fn identify_namespace(subsystem: Option<&Subsystem>) -> Vec<u8> {
    let mut d = vec![0u8; IDENTIFY_LEN];
    let Some(s) = subsystem else {
        return d;
    };
    let blocks = s.blocks();
    let info = s.device.info();
    put_u64(&mut d, 0, blocks); // NSZE
    put_u64(&mut d, 8, blocks); // NCAP
    put_u64(&mut d, 16, blocks); // NUSE
                                 // NSFEAT: thin provisioning when it trims; bit 4: NPWG/NPWA/NOWS are valid.
    d[24] = u8::from(info.capabilities.trim.available()) | (1 << 4);
    d[25] = 0; // NLBAF: one format
    d[26] = 0; // FLBAS: format 0
    d[30] = 1; // NMIC: may be shared by several controllers
               // DLFEAT: deallocated blocks read as zeroes when trim punches holes (memory
               // and files do; a remote device may not say), write zeroes may deallocate.
    if info.capabilities.trim.available() {
        d[33] = (1 << 3) | 0b001;
    }
    let block = u64::from(s.block_size());
    let preferred = (u64::from(info.block_sizes.preferred) / block).max(1);
    let preferred = preferred.min(u64::from(u16::MAX) + 1) as u16;
    put_u16(&mut d, 64, preferred - 1); // NPWG
    put_u16(&mut d, 66, preferred - 1); // NPWA
    put_u16(&mut d, 68, preferred - 1); // NPDG
    put_u16(&mut d, 70, preferred - 1); // NPDA
    put_u16(&mut d, 72, preferred - 1); // NOWS
    put_u32(&mut d, 92, ANA_GROUP); // ANAGRPID
    d[99] = u8::from(info.read_only); // NSATTR: write protected
    d[104..120].copy_from_slice(&s.nguid());
    // LBA format 0: no metadata, LBADS = log2(block size), best performance.
    d[128 + 2] = s.block_size().trailing_zeros() as u8;
    d
}

/// Namespace identification descriptors: NGUID, UUID and the command set (NVM).
fn ns_descriptors(s: &Subsystem) -> Vec<u8> {
    let mut d = vec![0u8; IDENTIFY_LEN];
    let mut at = 0;
    let mut put = |nidt: u8, id: &[u8]| {
        d[at] = nidt;
        d[at + 1] = id.len() as u8;
        d[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    };
    put(2, &s.nguid());
    put(3, &s.uuid());
    put(4, &[0]);
    d
}
