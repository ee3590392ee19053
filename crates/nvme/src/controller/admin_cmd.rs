//! Admin commands: Identify, Get/Set Features, Get Log Page, Asynchronous Event
//! Request, Keep Alive, Abort.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::IoBuf;

use super::core::Core;
use super::ctrl::{Controller, AEC_ANA_CHANGE, AEC_DISCOVERY_CHANGE, AEC_NS_ATTR};
use super::queue::{Action, Reply};
use super::{identify, log_page};
use crate::cqe::Status;
use crate::opcodes::{admin, feature};
use crate::sqe::Sqe;

/// Executes an admin command on `controller`'s admin queue.
pub(crate) fn execute(
    core: &Core,
    controller: &Arc<Controller>,
    local: Option<SocketAddr>,
    sqe: &Sqe,
    _data: IoBuf,
    now: Instant,
) -> Action {
    let reply = match sqe.opcode() {
        admin::IDENTIFY => identify::identify(core, controller, sqe),
        admin::GET_LOG_PAGE => log_page::get_log_page(core, controller, local, sqe),
        admin::GET_FEATURES => get_features(core, controller, sqe),
        admin::SET_FEATURES => set_features(core, controller, sqe, now),
        admin::ASYNC_EVENT_REQUEST => {
            return match controller.async_event_request(sqe.cid()) {
                None => Action::Deferred,
                Some(Ok(event)) => Action::Complete(Reply::ok(u64::from(event), Vec::new())),
                Some(Err(status)) => Action::Complete(Reply::status(status)),
            }
        }
        admin::KEEP_ALIVE => Reply::ok(0, Vec::new()),
        // Nothing is ever aborted: dword 0 bit 0 set says so.
        admin::ABORT => Reply::ok(1, Vec::new()),
        _ => Reply::status(Status::INVALID_OPCODE),
    };
    Action::Complete(reply)
}

/// The events a controller may report (Identify's OAES, and what AEC accepts).
pub(crate) fn supported_events(controller: &Controller) -> u32 {
    if controller.is_discovery() {
        AEC_DISCOVERY_CHANGE
    } else {
        AEC_NS_ATTR | AEC_ANA_CHANGE
    }
}

fn queues_value(n: u16) -> u64 {
    let zero_based = u64::from(n.saturating_sub(1));
    zero_based | (zero_based << 16)
}

fn get_features(core: &Core, controller: &Controller, sqe: &Sqe) -> Reply {
    let fid = sqe.cdw(10) as u8;
    // SEL 3 asks which attributes are supported: none is saveable or namespace
    // specific, the volatile write cache and others are changeable.
    if (sqe.cdw(10) >> 8) & 0x7 == 3 {
        return Reply::ok(0b100, Vec::new());
    }
    let state = controller.lock();
    let value = match fid {
        feature::ARBITRATION
        | feature::POWER_MANAGEMENT
        | feature::ERROR_RECOVERY
        | feature::INTERRUPT_COALESCING
        | feature::WRITE_ATOMICITY => 0,
        // The threshold a host would set: 0x0157 (70 C) over temperature.
        feature::TEMPERATURE_THRESHOLD => 0x0157,
        feature::VOLATILE_WRITE_CACHE => u64::from(state.write_cache),
        feature::NUMBER_OF_QUEUES => queues_value(match state.io_queues {
            0 => core.settings.max_io_queues,
            n => n,
        }),
        feature::ASYNC_EVENT_CONFIG => u64::from(state.aec),
        feature::KEEP_ALIVE_TIMER => state.kato.as_millis() as u64,
        feature::HOST_ID => {
            let mut data = vec![0; 16];
            data.copy_from_slice(&controller.host_id);
            return Reply::ok(0, data);
        }
        _ => return Reply::status(Status::INVALID_FIELD),
    };
    Reply::ok(value, Vec::new())
}

fn set_features(core: &Core, controller: &Controller, sqe: &Sqe, now: Instant) -> Reply {
    // Bit 31 of CDW10 asks to save across resets: nothing here is saveable.
    if sqe.cdw(10) & (1 << 31) != 0 {
        return Reply::status(Status::FEATURE_NOT_SAVEABLE);
    }
    let fid = sqe.cdw(10) as u8;
    let value = sqe.cdw(11);
    let mut state = controller.lock();
    match fid {
        feature::NUMBER_OF_QUEUES => {
            // Set once, before any I/O queue connects (NVMe base 2.0 5.27.1.5).
            if !state.connected.is_empty() {
                return Reply::status(Status::COMMAND_SEQUENCE_ERROR);
            }
            if controller.is_discovery() {
                return Reply::status(Status::INVALID_FIELD);
            }
            let asked_sq = (value & 0xffff) as u16;
            let asked_cq = (value >> 16) as u16;
            if asked_sq == 0xffff || asked_cq == 0xffff {
                return Reply::status(Status::INVALID_FIELD);
            }
            let asked = asked_sq.max(asked_cq) + 1;
            state.io_queues = asked.min(core.settings.max_io_queues);
            Reply::ok(queues_value(state.io_queues), Vec::new())
        }
        feature::KEEP_ALIVE_TIMER => {
            state.kato = Duration::from_millis(u64::from(value));
            state.last_heard = now;
            Reply::ok(0, Vec::new())
        }
        feature::VOLATILE_WRITE_CACHE => {
            if controller.is_discovery() {
                return Reply::status(Status::INVALID_FIELD);
            }
            state.write_cache = value & 1 != 0;
            Reply::ok(0, Vec::new())
        }
        feature::ASYNC_EVENT_CONFIG => {
            drop(state);
            let supported = supported_events(controller);
            let mut state = controller.lock();
            state.aec = value & supported;
            Reply::ok(0, Vec::new())
        }
        feature::ARBITRATION
        | feature::POWER_MANAGEMENT
        | feature::TEMPERATURE_THRESHOLD
        | feature::ERROR_RECOVERY
        | feature::INTERRUPT_COALESCING
        | feature::WRITE_ATOMICITY => Reply::ok(0, Vec::new()),
        feature::HOST_ID => Reply::status(Status::COMMAND_SEQUENCE_ERROR),
        _ => Reply::status(Status::INVALID_FIELD),
    }
}
