//! ATA over Ethernet (AoE version 1, per the AoE specification AoEr11).
//!
//! - [`wire`]: the sans-IO codec — frames in, typed messages out, and back.
//! - [`identify`]: the ATA IDENTIFY DEVICE block.
//! - [`rawsock`]: AF_PACKET sockets bound to one interface, filtered to the AoE
//!   ethertype, with batched receive and send.
pub mod identify;
pub mod rawsock;
pub mod wire;
