//! What a device is and what it can do: size, block sizes, limits, capabilities.

/// How well a device supports an operation. Targets advertise an operation when it is
/// native or emulated; the checked handle performs the emulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Support {
    /// Not available at all.
    #[default]
    None,
    /// Available through the handle's emulation (for example FUA as write + flush).
    Emulated,
    /// The device does it itself.
    Native,
}

impl Support {
    pub fn available(self) -> bool {
        self != Support::None
    }

    pub fn is_native(self) -> bool {
        self == Support::Native
    }
}

/// Which operations a device supports, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Making writes durable: fdatasync or a remote flush.
    pub flush: Support,
    /// Per-write durability (forced unit access).
    pub fua: Support,
    /// Discarding a range (a hint: data afterwards is unspecified).
    pub trim: Support,
    /// Zeroing a range without sending zeroes.
    pub write_zeroes: Support,
    /// Zeroing a range faster than writing zeroes (NBD's FAST_ZERO).
    pub fast_zero: Support,
    /// Reporting allocated / hole / zero extents.
    pub extents: Support,
    /// Prefetching a range into a cache.
    pub cache: Support,
}

/// Block sizes, as NBD's NBD_INFO_BLOCK_SIZE and SCSI's block limits describe them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Offsets and lengths must be multiples of this (the logical block size).
    pub minimum: u32,
    /// Requests of multiples of this size avoid read-modify-write.
    pub preferred: u32,
    /// The largest single read or write the device takes.
    pub maximum: u32,
}

/// Limits the checked handle honours by splitting requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest trim in one call.
    pub max_trim: u64,
    /// Largest write-zeroes in one call.
    pub max_write_zeroes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_trim: u64::MAX,
            max_write_zeroes: u64::MAX,
        }
    }
}

/// Everything a user of a device needs to know about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Size in bytes.
    pub size: u64,
    pub block_sizes: BlockSizes,
    pub limits: Limits,
    pub read_only: bool,
    pub capabilities: Capabilities,
    /// Seeks are expensive (a spinning disk).
    pub rotational: bool,
    /// Operations usually finish without waiting for hardware (page cache, memory):
    /// a target may run them on the connection's own thread instead of handing them
    /// to a worker.
    pub completes_inline: bool,
    /// Writes made through one handle are visible to reads through any other handle
    /// on the same device, and a flush on any of them covers all of them (NBD's
    /// CAN_MULTI_CONN).
    pub consistent_across_handles: bool,
    /// The device's request queue can wake its owner
    /// ([`RequestQueue::set_waker`](crate::RequestQueue::set_waker)), so a target may
    /// drive it from one thread per connection instead of a worker per request.
    pub queue_wakes: bool,
}

impl DeviceInfo {
    /// The default maximum transfer: 32 MiB, the NBD protocol's portable limit.
    pub const DEFAULT_MAX_TRANSFER: u32 = 32 * 1024 * 1024;

    /// Info for a simple device of `size` bytes with byte granularity.
    pub fn new(size: u64) -> DeviceInfo {
        DeviceInfo {
            size,
            block_sizes: BlockSizes {
                minimum: 1,
                preferred: 4096,
                maximum: Self::DEFAULT_MAX_TRANSFER,
            },
            limits: Limits::default(),
            read_only: false,
            capabilities: Capabilities::default(),
            rotational: false,
            completes_inline: false,
            consistent_across_handles: true,
            queue_wakes: false,
        }
    }
}
