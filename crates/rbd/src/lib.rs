//! A Ceph RBD image as a blockwire device: how blockwire reaches past one host, by
//! fronting the distributed store users already run.
//!
//! librados and librbd are loaded at run time ([`ffi`], the crate's only `unsafe`),
//! so the build needs no Ceph headers and the binary runs without Ceph installed.
//! Every request is one librbd asynchronous call; one poller thread per image takes
//! the completions from an eventfd (see `poller.rs`), and a [`FastPath::queue`]
//! keeps many requests in flight from one thread.
//!
//! [`FastPath::queue`]: blockwire_blockdev::FastPath::queue

mod device;
mod errors;
pub mod features;
mod ffi;
mod open;
mod poller;
mod queue;
mod spec;

pub use device::{close_all, Description, RbdDevice};
pub use errors::OpenError;
pub use ffi::{check_loadable, rbd_version, Snapshot, Stat, LIBRADOS, LIBRBD};
pub use queue::RbdQueue;
pub use spec::{RbdSpec, DEFAULT_TIMEOUT, PREFIX};
