//! What a handshake learned about an export: the facts `blockwire info` prints and
//! the device's info is derived from.

use blockwire_blockdev::{BlockSizes, Capabilities, DeviceInfo, Limits, Support};

use crate::wire::*;

/// Largest trim, write-zeroes or block-status request sent at once: the length field
/// is 32 bits; 2 GiB is aligned to every minimum block size the protocol allows.
pub(crate) const MAX_EFFECT_LEN: u64 = 1 << 31;

/// The transmission flags a user may care about, with the words `blockwire info`
/// prints for them.
pub const FLAG_WORDS: &[(u16, &str)] = &[
    (NBD_FLAG_READ_ONLY, "read-only"),
    (NBD_FLAG_SEND_FLUSH, "flush"),
    (NBD_FLAG_SEND_FUA, "fua"),
    (NBD_FLAG_ROTATIONAL, "rotational"),
    (NBD_FLAG_SEND_TRIM, "trim"),
    (NBD_FLAG_SEND_WRITE_ZEROES, "zero"),
    (NBD_FLAG_SEND_FAST_ZERO, "fast-zero"),
    (NBD_FLAG_CAN_MULTI_CONN, "multi-conn"),
    (NBD_FLAG_SEND_CACHE, "cache"),
    (NBD_FLAG_SEND_DF, "df"),
];

/// An export as negotiated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportDetails {
    /// The server's canonical name (NBD_INFO_NAME), else the name asked for.
    pub name: String,
    /// NBD_INFO_DESCRIPTION, if the server sent one.
    pub description: Option<String>,
    /// Size in bytes.
    pub size: u64,
    /// Transmission flags (NBD_FLAG_*).
    pub flags: u16,
    /// NBD_INFO_BLOCK_SIZE exactly as advertised; `None` when the server sent none
    /// (the protocol's defaults then apply: see [`ExportDetails::block_sizes`]).
    pub advertised_block_sizes: Option<BlockSizes>,
    /// Replies come in chunks: structured replies or extended headers were
    /// negotiated.
    pub structured: bool,
    /// Extended headers were negotiated (NBD_OPT_EXTENDED_HEADERS): 32-byte request
    /// and reply headers, 64-bit block status descriptors.
    pub extended_headers: bool,
    /// The metadata contexts selected (at most `base:allocation`).
    pub contexts: Vec<String>,
    /// The export was selected with NBD_OPT_GO (false: the NBD_OPT_EXPORT_NAME
    /// fallback for servers without GO).
    pub used_go: bool,
    /// The server's handshake flags.
    pub handshake_flags: u16,
    /// The id the server gave `base:allocation`, if it was selected.
    pub(crate) base_allocation_id: Option<u32>,
}

impl ExportDetails {
    pub fn read_only(&self) -> bool {
        self.flags & NBD_FLAG_READ_ONLY != 0
    }

    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// How requests and replies are framed on the connection.
    pub fn framing(&self) -> Framing {
        if self.extended_headers {
            Framing::Extended
        } else if self.structured {
            Framing::Structured
        } else {
            Framing::Simple
        }
    }

    /// Whether `base:allocation` was negotiated, so block status is available.
    pub fn base_allocation(&self) -> bool {
        self.base_allocation_id.is_some()
    }

    /// The advertised transmission flags as words ("flush", "fua", ...).
    pub fn flag_words(&self) -> Vec<&'static str> {
        FLAG_WORDS
            .iter()
            .filter(|(flag, _)| self.has(*flag))
            .map(|(_, word)| *word)
            .collect()
    }

    /// The block sizes requests must honour: the advertised ones (maximum capped at
    /// 32 MiB and rounded down to the minimum), else the protocol's defaults
    /// (proto.md, "Size constraints").
    pub fn block_sizes(&self) -> BlockSizes {
        let cap = DeviceInfo::DEFAULT_MAX_TRANSFER;
        match self.advertised_block_sizes {
            Some(sizes) => {
                let minimum = sizes.minimum.max(1);
                let maximum = sizes.maximum.min(cap).max(minimum);
                BlockSizes {
                    minimum,
                    preferred: sizes.preferred.max(minimum),
                    maximum: maximum / minimum * minimum,
                }
            }
            None => BlockSizes {
                minimum: 1,
                preferred: 4096,
                maximum: cap,
            },
        }
    }

    /// What the device built on this export reports.
    pub fn device_info(&self) -> DeviceInfo {
        let native = |flag: u16| {
            if self.has(flag) {
                Support::Native
            } else {
                Support::None
            }
        };
        let writable = !self.read_only();
        let capabilities = Capabilities {
            flush: native(NBD_FLAG_SEND_FLUSH),
            fua: native(NBD_FLAG_SEND_FUA),
            trim: if writable {
                native(NBD_FLAG_SEND_TRIM)
            } else {
                Support::None
            },
            write_zeroes: if writable {
                native(NBD_FLAG_SEND_WRITE_ZEROES)
            } else {
                Support::None
            },
            fast_zero: if writable && self.has(NBD_FLAG_SEND_WRITE_ZEROES) {
                native(NBD_FLAG_SEND_FAST_ZERO)
            } else {
                Support::None
            },
            extents: if self.base_allocation() {
                Support::Native
            } else {
                Support::None
            },
            cache: native(NBD_FLAG_SEND_CACHE),
        };
        let block_sizes = self.block_sizes();
        let effect_max =
            MAX_EFFECT_LEN / u64::from(block_sizes.minimum) * u64::from(block_sizes.minimum);
        DeviceInfo {
            size: self.size,
            block_sizes,
            limits: Limits {
                max_trim: effect_max,
                max_write_zeroes: effect_max,
            },
            read_only: self.read_only(),
            capabilities,
            rotational: self.has(NBD_FLAG_ROTATIONAL),
            // Every request waits for a network round trip.
            completes_inline: false,
            consistent_across_handles: self.has(NBD_FLAG_CAN_MULTI_CONN),
            queue_wakes: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details(flags: u16, sizes: Option<(u32, u32, u32)>) -> ExportDetails {
        ExportDetails {
            name: "disk".into(),
            description: None,
            size: 1 << 30,
            flags: NBD_FLAG_HAS_FLAGS | flags,
            advertised_block_sizes: sizes.map(|(minimum, preferred, maximum)| BlockSizes {
                minimum,
                preferred,
                maximum,
            }),
            structured: true,
            extended_headers: false,
            contexts: vec![],
            used_go: true,
            handshake_flags: NBD_FLAG_FIXED_NEWSTYLE,
            base_allocation_id: None,
        }
    }

    #[test]
    fn flags_map_to_native_capabilities() {
        let all = NBD_FLAG_SEND_FLUSH
            | NBD_FLAG_SEND_FUA
            | NBD_FLAG_SEND_TRIM
            | NBD_FLAG_SEND_WRITE_ZEROES
            | NBD_FLAG_SEND_FAST_ZERO
            | NBD_FLAG_CAN_MULTI_CONN
            | NBD_FLAG_SEND_CACHE;
        let info = details(all, None).device_info();
        let caps = info.capabilities;
        for support in [
            caps.flush,
            caps.fua,
            caps.trim,
            caps.write_zeroes,
            caps.fast_zero,
            caps.cache,
        ] {
            assert_eq!(support, Support::Native);
        }
        assert_eq!(caps.extents, Support::None);
        assert!(info.consistent_across_handles && !info.read_only && !info.completes_inline);

        let none = details(0, None).device_info();
        assert_eq!(none.capabilities, Capabilities::default());
        assert!(!none.consistent_across_handles);

        let read_only = details(all | NBD_FLAG_READ_ONLY, None).device_info();
        assert!(read_only.read_only);
        assert_eq!(read_only.capabilities.trim, Support::None);
        assert_eq!(read_only.capabilities.write_zeroes, Support::None);
    }

    #[test]
    fn block_sizes_are_honoured_and_capped() {
        let sizes = details(0, Some((512, 4096, u32::MAX))).block_sizes();
        assert_eq!(
            sizes,
            BlockSizes {
                minimum: 512,
                preferred: 4096,
                maximum: 32 << 20
            }
        );
        let sizes = details(0, Some((4096, 65536, 1 << 20))).block_sizes();
        assert_eq!(sizes.maximum, 1 << 20);
        // A maximum that is not a multiple of the minimum is rounded down.
        let sizes = details(0, Some((4096, 4096, 10_000))).block_sizes();
        assert_eq!(sizes.maximum, 8192);
        let defaults = details(0, None).block_sizes();
        assert_eq!((defaults.minimum, defaults.maximum), (1, 32 << 20));
        let limits = details(0, Some((4096, 4096, 1 << 20))).device_info().limits;
        assert_eq!(limits.max_trim, 1 << 31);
    }

    #[test]
    fn flag_words_follow_the_flags() {
        let d = details(
            NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_DF,
            None,
        );
        assert_eq!(d.flag_words(), vec!["read-only", "flush", "df"]);
    }
}
