//! NVMe over TCP (NVMe-oF 1.1 TCP transport, NVMe base 2.0, NVM command set).
//!
//! Laid out as Linux's nvmet is: a sans-IO codec every side shares ([`pdu`] for
//! the transport's PDUs; [`Sqe`], [`Cqe`] and [`fabrics`] for the commands they
//! carry), a controller that executes commands with no socket in it, and a TCP
//! transport that only moves capsules and data.

pub mod controller;
pub mod cqe;
mod data_read;
pub mod fabrics;
pub mod initiator;
pub mod opcodes;
pub mod pdu;
pub mod sqe;
pub mod target;

pub use controller::{default_nqn, Subsystem};
pub use cqe::{Cqe, Status};
pub use fabrics::{Connect, ConnectData, PropertyCommand, DISCOVERY_NQN, DYNAMIC_CNTLID};
pub use pdu::{decode, pdu_len, Digests, Framing, Pdu, PduError};
pub use sqe::{Direction, SglDescriptor, Sqe};
pub use target::{NvmeConfig, NvmeTarget, ReloadHandle, ShutdownHandle};
