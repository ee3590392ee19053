//! One queue (one NVMe/TCP connection) as the controller sees it: before Connect,
//! the admin queue of a controller, or one of its I/O queues. Commands go in with
//! their data; what comes out is a completion now, device work to run, or nothing
//! yet (an Asynchronous Event Request).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use blockwire_blockdev::IoBuf;

use super::core::Core;
use super::ctrl::Controller;
use super::health::CommandError;
use super::io_cmd::{self, IoCommand};
use super::{admin_cmd, fabrics_cmd};
use crate::cqe::{Cqe, Status};
use crate::opcodes::{admin, fctype};
use crate::sqe::Sqe;

/// A completion and the data that goes to the host with it.
#[derive(Debug)]
pub struct Reply {
    pub cqe: Cqe,
    /// Controller-to-host data (Identify, Get Log Page, Read, ...): a read's
    /// buffer goes from the device to the socket uncopied.
    pub data: IoBuf,
}

impl Reply {
    pub(crate) fn status(status: Status) -> Reply {
        Reply {
            cqe: Cqe::new(0, status),
            data: IoBuf::new(0),
        }
    }

    /// A success; `data` is a small admin answer (copied once into an [`IoBuf`]).
    pub(crate) fn ok(result: u64, data: Vec<u8>) -> Reply {
        Reply {
            cqe: Cqe {
                result,
                ..Cqe::default()
            },
            data: IoBuf::from(data),
        }
    }
}

/// What became of a submitted command.
#[derive(Debug)]
pub enum Action {
    /// Answered: send this completion (and data).
    Complete(Reply),
    /// Device work: run [`IoCommand::execute`] where the request engine says; it
    /// returns the completion.
    Io(IoCommand),
    /// Answered later through the controller's notifier (an Asynchronous Event
    /// Request).
    Deferred,
}

enum Role {
    Unconnected,
    Admin(Arc<Controller>),
    Io(Arc<Controller>, u16),
}

/// One queue's state.
pub struct Queue {
    core: Arc<Core>,
    /// The address the host reached (discovery reports it for wildcard listeners).
    local: Option<SocketAddr>,
    /// Whether this queue came in on the discovery listener.
    discovery_port: bool,
    role: Role,
    /// Submission queue size (entries), from Connect.
    sq_size: u16,
    sq_head: u16,
    sq_flow_control_disabled: bool,
}

impl Queue {
    /// A queue that has not connected yet. `discovery_port`: it arrived on the
    /// discovery listener, where only the discovery subsystem is offered.
    pub fn new(core: Arc<Core>, local: Option<SocketAddr>, discovery_port: bool) -> Queue {
        Queue {
            core,
            local,
            discovery_port,
            role: Role::Unconnected,
            sq_size: 1,
            sq_head: 0,
            sq_flow_control_disabled: false,
        }
    }

    pub fn core(&self) -> &Arc<Core> {
        &self.core
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    pub fn is_discovery_port(&self) -> bool {
        self.discovery_port
    }

    /// The controller, once connected.
    pub fn controller(&self) -> Option<&Arc<Controller>> {
        match &self.role {
            Role::Unconnected => None,
            Role::Admin(c) | Role::Io(c, _) => Some(c),
        }
    }

    /// The queue ID, once connected (0: admin).
    pub fn qid(&self) -> Option<u16> {
        match &self.role {
            Role::Unconnected => None,
            Role::Admin(_) => Some(0),
            Role::Io(_, qid) => Some(*qid),
        }
    }

    /// Submission queue entries the host may have outstanding.
    pub fn sq_size(&self) -> u16 {
        self.sq_size
    }

    /// Whether the host disabled SQ flow control at Connect: only then may a read's
    /// last C2HData stand for its completion (the SUCCESS flag, NVMe/TCP 3.6.2.8).
    pub fn sq_flow_control_disabled(&self) -> bool {
        self.sq_flow_control_disabled
    }

    /// Whether the queue must end now: its controller died (admin queue gone,
    /// keep-alive expired) or, for an admin queue, its keep-alive ran out.
    pub fn must_close(&self, now: Instant) -> bool {
        match &self.role {
            Role::Unconnected => false,
            Role::Admin(c) | Role::Io(c, _) => c.keep_alive_expired(now),
        }
    }

    /// Executes `sqe`, with the data the host sent for it (a transport's
    /// [`IoBuf`] goes on to the device uncopied; a `Vec` is copied into one).
    pub fn submit(&mut self, sqe: &Sqe, data: impl Into<IoBuf>, now: Instant) -> Action {
        let action = self.dispatch(sqe, data.into(), now);
        self.sq_head = (self.sq_head + 1) % self.sq_size.max(1);
        match action {
            Action::Complete(mut reply) => {
                self.fill(&mut reply.cqe, sqe.cid());
                self.record_failure(sqe, &reply.cqe);
                Action::Complete(reply)
            }
            Action::Io(mut io) => {
                self.fill(&mut io.cqe, sqe.cid());
                Action::Io(io)
            }
            Action::Deferred => Action::Deferred,
        }
    }

    /// Puts a failed completion of `sqe` in the controller's error log (nothing
    /// before Connect, when there is no controller). The transport calls it for
    /// the commands it refuses itself.
    pub fn record_failure(&self, sqe: &Sqe, cqe: &Cqe) {
        if cqe.status.is_success() {
            return;
        }
        let (controller, io_queue) = match &self.role {
            Role::Unconnected => return,
            Role::Admin(c) => (c, false),
            Role::Io(c, _) => (c, true),
        };
        let lba = if io_queue && io_cmd::has_lba(sqe.opcode()) {
            sqe.cdw10_11()
        } else {
            0
        };
        controller.record_error(CommandError {
            sqid: cqe.sq_id,
            cid: cqe.cid,
            status: cqe.status,
            lba,
            nsid: sqe.nsid(),
        });
    }

    fn fill(&self, cqe: &mut Cqe, cid: u16) {
        cqe.cid = cid;
        cqe.sq_head = self.sq_head;
        cqe.sq_id = self.qid().unwrap_or(0);
    }

    fn dispatch(&mut self, sqe: &Sqe, data: IoBuf, now: Instant) -> Action {
        if sqe.fuse() != 0 {
            return Action::Complete(Reply::status(Status::INVALID_FIELD));
        }
        if sqe.opcode() == admin::FABRICS {
            return Action::Complete(self.fabrics(sqe, data, now));
        }
        match &self.role {
            Role::Unconnected => Action::Complete(Reply::status(Status::COMMAND_SEQUENCE_ERROR)),
            Role::Admin(controller) => {
                let controller = controller.clone();
                controller.heard(now);
                admin_cmd::execute(&self.core, &controller, self.local, sqe, data, now)
            }
            Role::Io(controller, _) => match io_cmd::parse(controller, sqe, data) {
                Ok(io) => Action::Io(io),
                Err(status) => Action::Complete(Reply::status(status)),
            },
        }
    }

    fn fabrics(&mut self, sqe: &Sqe, data: IoBuf, now: Instant) -> Reply {
        match (sqe.fctype(), &self.role) {
            (fctype::CONNECT, Role::Unconnected) => {
                match fabrics_cmd::connect(&self.core, sqe, &data, self.discovery_port, now) {
                    Ok(connected) => {
                        self.sq_size = connected.sq_size;
                        self.sq_flow_control_disabled = connected.sq_flow_control_disabled;
                        self.role = match connected.qid {
                            0 => Role::Admin(connected.controller.clone()),
                            qid => Role::Io(connected.controller.clone(), qid),
                        };
                        Reply::ok(u64::from(connected.controller.cntlid), Vec::new())
                    }
                    Err(reply) => reply,
                }
            }
            (fctype::CONNECT, _) => Reply::status(Status::COMMAND_SEQUENCE_ERROR),
            (_, Role::Unconnected) => Reply::status(Status::COMMAND_SEQUENCE_ERROR),
            (fctype::PROPERTY_GET | fctype::PROPERTY_SET, Role::Admin(controller)) => {
                let controller = controller.clone();
                controller.heard(now);
                fabrics_cmd::property(&self.core, &controller, sqe)
            }
            (fctype::DISCONNECT, _) => Reply::ok(0, Vec::new()),
            _ => Reply::status(Status::INVALID_OPCODE),
        }
    }
}

impl Drop for Queue {
    /// An admin queue takes its controller with it; an I/O queue frees its ID.
    fn drop(&mut self) {
        match &self.role {
            Role::Unconnected => {}
            Role::Admin(controller) => {
                controller.kill();
                self.core.remove_controller(controller.cntlid);
            }
            Role::Io(controller, qid) => {
                controller.lock().connected.remove(qid);
            }
        }
    }
}
