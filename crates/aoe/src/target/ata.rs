//! What a target does with one ATA command (pure decisions, no I/O), and how device
//! errors become ATA status and error registers.

use blockwire_blockdev::ErrorKind;

use crate::wire::{ata, AoeError, AtaArgs, SECTOR_SIZE};

/// The action an ATA request asks for, after every check a target makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtaAction {
    /// Read `len` bytes at `offset` into the response.
    Read { offset: u64, len: usize },
    /// Write the first `len` bytes of the frame's data at `offset`.
    Write { offset: u64, len: usize },
    /// Make every completed write durable.
    Flush,
    /// Answer with the IDENTIFY DEVICE block.
    Identify,
    /// Answer "active or idle".
    CheckPowerMode,
    /// Answer with the ATA error register set (status ERR).
    Fail { error: u8 },
    /// Answer with an AoE-level error in the header.
    Reject(AoeError),
}

/// Where a target stands for the checks: its size, frame capacity and mode.
#[derive(Debug, Clone, Copy)]
pub struct AtaLimits {
    /// Device size in 512-byte sectors.
    pub sectors: u64,
    /// Most sectors one frame may carry on the receiving interface.
    pub max_sectors: u8,
    /// Writes are refused.
    pub read_only: bool,
}

/// Decides what an ATA request does. `data_len` is the number of bytes after the ATA
/// arguments in the frame (which may include Ethernet padding).
pub fn classify(args: &AtaArgs, data_len: usize, limits: &AtaLimits) -> AtaAction {
    let transfer = |write: bool| {
        if args.sector_count > limits.max_sectors {
            return AtaAction::Reject(AoeError::BadArgument);
        }
        let count = u64::from(args.sector_count);
        if args.lba.saturating_add(count) > limits.sectors {
            return AtaAction::Fail {
                error: ata::ERROR_IDNF | ata::ERROR_ABRT,
            };
        }
        let offset = args.lba * SECTOR_SIZE as u64;
        let len = args.data_len();
        if !write {
            return AtaAction::Read { offset, len };
        }
        if limits.read_only {
            return AtaAction::Fail {
                error: ata::ERROR_ABRT,
            };
        }
        if data_len < len {
            // The frame does not carry the sectors it announces.
            return AtaAction::Reject(AoeError::BadArgument);
        }
        AtaAction::Write { offset, len }
    };
    match args.cmd_status {
        ata::READ_SECTORS | ata::READ_SECTORS_EXT => transfer(false),
        ata::WRITE_SECTORS | ata::WRITE_SECTORS_EXT => transfer(true),
        ata::FLUSH_CACHE | ata::FLUSH_CACHE_EXT => AtaAction::Flush,
        ata::IDENTIFY_DEVICE => AtaAction::Identify,
        ata::CHECK_POWER_MODE => AtaAction::CheckPowerMode,
        _ => AtaAction::Fail {
            error: ata::ERROR_ABRT,
        },
    }
}

/// The ATA error register for a failed device operation: the one table between
/// blockdev's neutral errors and ATA.
pub fn ata_error(kind: ErrorKind, write: bool) -> u8 {
    match kind {
        ErrorKind::OutOfRange => ata::ERROR_IDNF | ata::ERROR_ABRT,
        ErrorKind::Io if !write => ata::ERROR_UNC,
        _ => ata::ERROR_ABRT,
    }
}

/// The response arguments for a request: the same task file with the status (and
/// error) registers filled in.
pub fn response_args(request: &AtaArgs, error: Option<u8>) -> AtaArgs {
    let mut args = *request;
    match error {
        None => {
            args.cmd_status = ata::STATUS_DRDY;
            args.err_feature = 0;
        }
        Some(error) => {
            args.cmd_status = ata::STATUS_DRDY | ata::STATUS_ERR;
            args.err_feature = error;
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: AtaLimits = AtaLimits {
        sectors: 100,
        max_sectors: 2,
        read_only: false,
    };

    fn args(cmd: u8, lba: u64, count: u8) -> AtaArgs {
        AtaArgs {
            extended: true,
            write: cmd == ata::WRITE_SECTORS_EXT,
            sector_count: count,
            cmd_status: cmd,
            lba,
            ..AtaArgs::default()
        }
    }

    #[test]
    fn reads_and_writes_map_to_byte_ranges() {
        assert_eq!(
            classify(&args(ata::READ_SECTORS_EXT, 10, 2), 0, &LIMITS),
            AtaAction::Read {
                offset: 5120,
                len: 1024
            }
        );
        assert_eq!(
            classify(&args(ata::WRITE_SECTORS_EXT, 98, 2), 1024, &LIMITS),
            AtaAction::Write {
                offset: 98 * 512,
                len: 1024
            }
        );
    }

    #[test]
    fn out_of_range_oversized_and_short_requests_are_refused() {
        assert_eq!(
            classify(&args(ata::READ_SECTORS_EXT, 99, 2), 0, &LIMITS),
            AtaAction::Fail {
                error: ata::ERROR_IDNF | ata::ERROR_ABRT
            }
        );
        assert_eq!(
            classify(&args(ata::READ_SECTORS_EXT, u64::MAX >> 16, 2), 0, &LIMITS),
            AtaAction::Fail {
                error: ata::ERROR_IDNF | ata::ERROR_ABRT
            }
        );
        assert_eq!(
            classify(&args(ata::READ_SECTORS_EXT, 0, 3), 0, &LIMITS),
            AtaAction::Reject(AoeError::BadArgument)
        );
        assert_eq!(
            classify(&args(ata::WRITE_SECTORS_EXT, 0, 2), 1000, &LIMITS),
            AtaAction::Reject(AoeError::BadArgument)
        );
    }

    #[test]
    fn read_only_targets_abort_writes() {
        let limits = AtaLimits {
            read_only: true,
            ..LIMITS
        };
        assert_eq!(
            classify(&args(ata::WRITE_SECTORS_EXT, 0, 1), 512, &limits),
            AtaAction::Fail {
                error: ata::ERROR_ABRT
            }
        );
    }

    #[test]
    fn other_commands() {
        assert_eq!(
            classify(&args(ata::FLUSH_CACHE_EXT, 0, 0), 0, &LIMITS),
            AtaAction::Flush
        );
        assert_eq!(
            classify(&args(ata::IDENTIFY_DEVICE, 0, 1), 0, &LIMITS),
            AtaAction::Identify
        );
        assert_eq!(
            classify(&args(ata::CHECK_POWER_MODE, 0, 0), 0, &LIMITS),
            AtaAction::CheckPowerMode
        );
        assert_eq!(
            classify(&args(0xc8, 0, 1), 0, &LIMITS),
            AtaAction::Fail {
                error: ata::ERROR_ABRT
            }
        );
    }

    #[test]
    fn errors_set_err_status() {
        let ok = response_args(&args(ata::READ_SECTORS_EXT, 1, 1), None);
        assert_eq!(ok.cmd_status, ata::STATUS_DRDY);
        let failed = response_args(
            &args(ata::READ_SECTORS_EXT, 1, 1),
            Some(ata_error(ErrorKind::Io, false)),
        );
        assert_eq!(failed.cmd_status, ata::STATUS_DRDY | ata::STATUS_ERR);
        assert_eq!(failed.err_feature, ata::ERROR_UNC);
    }
}
