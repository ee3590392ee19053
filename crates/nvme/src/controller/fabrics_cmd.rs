//! Fabrics commands: Connect (admin and I/O queues, dynamic controller IDs) and
//! Property Get/Set (CAP, VS, CC, CSTS).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::core::Core;
use super::ctrl::{cc, csts, Controller, ControllerKind};
use super::queue::Reply;
use crate::cqe::{Cqe, Status};
use crate::fabrics::{Connect, ConnectData, PropertyCommand, DISCOVERY_NQN, DYNAMIC_CNTLID};
use crate::opcodes::property;
use crate::sqe::Sqe;

/// The version the controllers report: NVMe base specification 2.0.
pub const VERSION: u32 = 0x0002_0000;
/// Admin queue entries a host may use, at most.
pub const ADMIN_QUEUE_SIZE: u16 = 32;
/// Keep-alive granularity (KAS) in units of 100 ms: one second, as Linux nvmet.
pub const KAS: u16 = 10;

/// Where a refused Connect's bad parameter is: bit 16 set for the data, the byte
/// offset below (the Connect completion's dword 0).
fn bad_data_field(offset: u32) -> u64 {
    u64::from((1 << 16) | offset)
}

fn refuse(status: Status, result: u64) -> Reply {
    Reply {
        cqe: Cqe {
            result,
            status,
            ..Cqe::default()
        },
        data: blockwire_blockdev::IoBuf::new(0),
    }
}

/// A queue that connected.
pub(crate) struct Connected {
    pub controller: Arc<Controller>,
    pub qid: u16,
    pub sq_size: u16,
    /// The host disabled SQ flow control (CATTR bit 2).
    pub sq_flow_control_disabled: bool,
}

/// Connect: creates a controller (queue 0) or joins one (I/O queues).
pub(crate) fn connect(
    core: &Core,
    sqe: &Sqe,
    data: &[u8],
    discovery_port: bool,
    now: Instant,
) -> Result<Connected, Reply> {
    let Some(cmd) = Connect::from_sqe(sqe) else {
        return Err(Reply::status(Status::INVALID_FIELD));
    };
    let data = ConnectData::parse(data).map_err(|e| {
        tracing::debug!("NVMe Connect refused: {e}");
        refuse(Status::CONNECT_INVALID_PARAMETERS, bad_data_field(256))
    })?;
    if cmd.recfmt != 0 {
        // Incompatible Format.
        return Err(refuse(Status::new(1, 0x80, true), 0));
    }
    let sq_size = u32::from(cmd.sqsize) + 1;
    let max = if cmd.qid == 0 {
        u32::from(ADMIN_QUEUE_SIZE)
    } else {
        u32::from(core.settings.queue_size)
    };
    if cmd.sqsize == 0 || sq_size > max {
        return Err(refuse(Status::CONNECT_INVALID_PARAMETERS, 44));
    }
    let discovery = data.subnqn == DISCOVERY_NQN;
    // The discovery listener offers only discovery (nvmet's discovery port does
    // the same); an I/O listener serves both.
    if discovery_port && !discovery {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            bad_data_field(256),
        ));
    }
    let subsystem = if discovery {
        None
    } else {
        match core.subsystem(&data.subnqn) {
            Some(s) => Some(s),
            None => {
                tracing::info!(subnqn = %data.subnqn, "NVMe Connect to an unknown subsystem");
                return Err(refuse(
                    Status::CONNECT_INVALID_PARAMETERS,
                    bad_data_field(256),
                ));
            }
        }
    };
    if let Some(s) = &subsystem {
        if !s.allows(&data.hostnqn) {
            tracing::warn!(hostnqn = %data.hostnqn, subnqn = %s.nqn, "NVMe host not allowed");
            return Err(refuse(Status::CONNECT_INVALID_HOST, bad_data_field(512)));
        }
    }
    if cmd.qid == 0 {
        if data.cntlid != DYNAMIC_CNTLID {
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                bad_data_field(16),
            ));
        }
        let kind = if discovery {
            ControllerKind::Discovery
        } else {
            ControllerKind::Nvm
        };
        let kato = Duration::from_millis(u64::from(cmd.kato));
        let controller = core
            .add_controller(|cntlid| Controller::new(cntlid, kind, subsystem, &data, kato, now))
            .ok_or_else(|| refuse(Status::CONTROLLER_BUSY, 0))?;
        tracing::info!(
            cntlid = controller.cntlid,
            hostnqn = %data.hostnqn,
            subnqn = %data.subnqn,
            "NVMe controller connected"
        );
        return Ok(Connected {
            controller,
            qid: 0,
            sq_size: sq_size as u16,
            sq_flow_control_disabled: cmd.cattr & (1 << 2) != 0,
        });
    }
    // An I/O queue joins the controller its admin queue made.
    let controller = match core.controller(data.cntlid) {
        Some(c) if c.subnqn == data.subnqn && c.hostnqn == data.hostnqn && !c.is_dead() => c,
        _ => {
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                bad_data_field(16),
            ))
        }
    };
    if controller.is_discovery() {
        return Err(refuse(Status::CONNECT_INVALID_PARAMETERS, 42));
    }
    {
        let mut state = controller.lock();
        if state.csts & csts::RDY == 0 {
            return Err(Reply::status(Status::COMMAND_SEQUENCE_ERROR));
        }
        let granted = match state.io_queues {
            0 => core.settings.max_io_queues,
            n => n,
        };
        if cmd.qid > granted || !state.connected.insert(cmd.qid) {
            return Err(refuse(Status::CONNECT_INVALID_PARAMETERS, 42));
        }
    }
    Ok(Connected {
        controller,
        qid: cmd.qid,
        sq_size: sq_size as u16,
        sq_flow_control_disabled: cmd.cattr & (1 << 2) != 0,
    })
}

/// CAP: MQES, timeout 7.5 s, the NVM command set, 4 KiB pages.
pub(crate) fn capabilities(core: &Core) -> u64 {
    let mqes = u64::from(core.settings.queue_size.max(2) - 1);
    mqes | (15 << 24) | (1 << 37)
}

/// Property Get and Set.
pub(crate) fn property(core: &Core, controller: &Controller, sqe: &Sqe) -> Reply {
    let Some(cmd) = PropertyCommand::from_sqe(sqe) else {
        return Reply::status(Status::INVALID_FIELD);
    };
    match cmd {
        PropertyCommand::Get {
            offset,
            eight_bytes,
        } => {
            let state = controller.lock();
            let value = match (offset, eight_bytes) {
                (property::CAP, true) => capabilities(core),
                (property::VS, false) => u64::from(VERSION),
                (property::CC, false) => u64::from(state.cc),
                (property::CSTS, false) => u64::from(state.csts),
                _ => return Reply::status(Status::INVALID_FIELD),
            };
            Reply::ok(value, Vec::new())
        }
        PropertyCommand::Set {
            offset: property::CC,
            eight_bytes: false,
            value,
        } => {
            set_cc(controller, value as u32);
            Reply::ok(0, Vec::new())
        }
        PropertyCommand::Set { .. } => Reply::status(Status::INVALID_FIELD),
    }
}

/// Applies a new CC: enabling makes the controller ready (CSTS.RDY) unless the
/// queue entry sizes or page size are ones it does not use, which is a fatal
/// status (CSTS.CFS); clearing EN resets it; a shutdown notification completes
/// at once (nothing is cached here that a flush would not cover).
fn set_cc(controller: &Controller, new: u32) {
    let mut state = controller.lock();
    let old = state.cc;
    state.cc = new;
    if new & cc::EN != 0 && old & cc::EN == 0 {
        if cc::iosqes(new) != 6 || cc::iocqes(new) != 4 || cc::mps(new) != 0 {
            state.csts |= csts::CFS;
        } else {
            state.csts |= csts::RDY;
        }
    }
    if new & cc::EN == 0 && old & cc::EN != 0 {
        state.csts &= !(csts::RDY | csts::CFS);
    }
    if new & cc::SHN_MASK != 0 && old & cc::SHN_MASK == 0 {
        state.csts = (state.csts & !csts::SHST_MASK) | csts::SHST_COMPLETE;
    }
    if new & cc::SHN_MASK == 0 && old & cc::SHN_MASK != 0 {
        state.csts &= !csts::SHST_MASK;
    }
}
