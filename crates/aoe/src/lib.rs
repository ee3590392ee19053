//! ATA over Ethernet (AoE version 1, per the AoE specification AoEr11).
//!
//! - [`target`]: serves a device as shelf.slot on one or more interfaces.
//! - [`wire`]: the sans-IO codec — frames in, typed messages out, and back.
//! - [`identify`]: the ATA IDENTIFY DEVICE block.
//! - [`rawsock`]: AF_PACKET sockets bound to one interface, filtered to the AoE
//!   ethertype, with batched receive and send.
//! - [`initiator`]: an AoE target as a block device.
//! - [`probe`]: whether another target already answers an address, asked before
//!   serving it.
pub mod identify;
pub mod initiator;
pub mod probe;
pub mod rawsock;
pub mod target;
pub mod wire;
