//! The block-device core of blockwire.
//!
//! Everything that stores, moves or measures bytes meets here: backends (a file or
//! block device, sparse memory), composers (read-only, stripe, throttle, ...) and
//! initiators all implement [`BlockDevice`]; the ones with fast paths (cached reads,
//! hole answers, vectored writes, a request queue) also implement [`FastPath`]. Users
//! never call a device directly: they go through the checked [`Device`] handle, which
//! validates every request, splits it by the device's limits and emulates what the
//! device cannot do natively, so backends and protocol targets both stay small.

pub mod admission;
pub mod buffer;
pub mod channel_waker;
pub mod conformance;
pub mod copy;
pub mod device;
pub mod durability;
pub mod error;
pub mod fast_path;
pub mod file;
pub mod handle;
pub mod info;
pub mod mapping;
pub mod memory;
pub mod meter;
pub mod metered;
mod metered_queue;
pub mod paths;
pub mod queue;
#[cfg(test)]
mod queue_passthrough_tests;
pub mod read_only;
pub mod rmw;
pub mod size;
pub mod stripe;
pub mod throttle;
pub mod volatile_cache;
pub mod workers;
pub mod write_behind;
pub mod write_log;

pub use buffer::IoBuf;
pub use device::{BlockDevice, Extent, ExtentState, WriteFlags, ZeroFlags};
pub use error::{Error, ErrorKind, Op, Result};
pub use fast_path::FastPath;
pub use file::{FileDevice, FileOptions};
pub use handle::Device;
pub use info::{BlockSizes, Capabilities, DeviceInfo, Limits, Support};
pub use mapping::MappedRange;
pub use memory::MemoryDevice;
pub use meter::{IoMeter, OpenSession, SessionMeter};
pub use metered::Metered;
pub use queue::{Completion, QueuedCommand, QueuedOp, RequestQueue, Submission};
pub use read_only::ReadOnly;
pub use rmw::ReadModifyWrite;
pub use stripe::{Stripe, StripeError};
pub use throttle::{Throttle, ThrottleConfig};
pub use volatile_cache::VolatileCache;
pub use write_log::{Loss, WriteLog};
