//! Session sequencing, sans-IO (RFC 7143 §4.2.2): the command window (CmdSN against
//! ExpCmdSN and MaxCmdSN), StatSN acknowledgement, and the checks each Data-In and
//! R2T must pass against its command. Serial number arithmetic is RFC 1982's, as
//! §4.2.2.1 asks: the numbers wrap at 2^32.

use crate::pdu::ResidualKind;

/// `a < b` in 32-bit serial number arithmetic (RFC 1982 §3.2).
pub fn serial_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < 1 << 31
}

/// `a <= b` in serial number arithmetic.
pub fn serial_le(a: u32, b: u32) -> bool {
    a == b || serial_lt(a, b)
}

/// The command window and the status numbers of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The CmdSN of the next non-immediate command.
    pub cmd_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    /// The StatSN we expect next: acknowledges every status before it.
    pub exp_stat_sn: u32,
}

impl Window {
    pub fn new(cmd_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32, exp_stat_sn: u32) -> Window {
        Window {
            cmd_sn,
            exp_cmd_sn,
            max_cmd_sn,
            exp_stat_sn,
        }
    }

    /// Whether a non-immediate command may be sent now: its CmdSN must not pass
    /// MaxCmdSN (§4.2.2.1; MaxCmdSN = ExpCmdSN - 1 closes the window).
    pub fn open(&self) -> bool {
        serial_le(self.cmd_sn, self.max_cmd_sn)
    }

    /// Takes the CmdSN for a non-immediate command.
    pub fn take(&mut self) -> u32 {
        let cmd_sn = self.cmd_sn;
        self.cmd_sn = self.cmd_sn.wrapping_add(1);
        cmd_sn
    }

    /// Applies ExpCmdSN and MaxCmdSN from a target PDU. §4.2.2.1: values that
    /// would shrink the window below what was already granted, or with MaxCmdSN
    /// more than one behind ExpCmdSN, are stale (PDUs may pass each other on a
    /// multi-connection session) and ignored. Returns whether the window grew.
    pub fn update(&mut self, exp_cmd_sn: u32, max_cmd_sn: u32) -> bool {
        if serial_lt(max_cmd_sn, exp_cmd_sn.wrapping_sub(1)) {
            return false;
        }
        let mut grew = false;
        if serial_lt(self.exp_cmd_sn, exp_cmd_sn) {
            self.exp_cmd_sn = exp_cmd_sn;
        }
        if serial_lt(self.max_cmd_sn, max_cmd_sn) {
            self.max_cmd_sn = max_cmd_sn;
            grew = true;
        }
        grew
    }

    /// Acknowledges a status numbered `stat_sn`.
    pub fn status(&mut self, stat_sn: u32) {
        let next = stat_sn.wrapping_add(1);
        if serial_lt(self.exp_stat_sn, next) {
            self.exp_stat_sn = next;
        }
    }
}

/// Why a data PDU does not fit its command: a protocol error that ends the
/// connection (§7.1.4 at ErrorRecoveryLevel 0).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    #[error("Data-In for task {itt:#x} at {offset}+{len} runs past its {expected}-byte buffer")]
    DataInRange {
        itt: u32,
        offset: u32,
        len: u32,
        expected: u32,
    },
    #[error("Data-In for task {0:#x}, which reads nothing")]
    DataInForWrite(u32),
    #[error("R2T for task {itt:#x} asks for {offset}+{len} of its {expected}-byte write")]
    R2tRange {
        itt: u32,
        offset: u32,
        len: u32,
        expected: u32,
    },
    #[error("R2T for task {0:#x}, which writes nothing")]
    R2tForRead(u32),
}

/// Checks a Data-In's range against a read of `expected` bytes.
pub fn check_data_in(
    itt: u32,
    offset: u32,
    len: u32,
    expected: Option<u32>,
) -> Result<(), SequenceError> {
    let expected = expected.ok_or(SequenceError::DataInForWrite(itt))?;
    if u64::from(offset) + u64::from(len) > u64::from(expected) {
        return Err(SequenceError::DataInRange {
            itt,
            offset,
            len,
            expected,
        });
    }
    Ok(())
}

/// Checks an R2T's range against a write of `expected` bytes. An empty R2T is a
/// protocol error too (§11.8.4: DesiredDataTransferLength is not 0).
pub fn check_r2t(
    itt: u32,
    offset: u32,
    len: u32,
    expected: Option<u32>,
) -> Result<(), SequenceError> {
    let expected = expected.ok_or(SequenceError::R2tForRead(itt))?;
    if len == 0 || u64::from(offset) + u64::from(len) > u64::from(expected) {
        return Err(SequenceError::R2tRange {
            itt,
            offset,
            len,
            expected,
        });
    }
    Ok(())
}

/// How a command's data-out is split before any R2T (§4.2.5.2): immediate data in
/// the command PDU, then unsolicited Data-Out PDUs, both within FirstBurstLength.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsolicited {
    /// Bytes in the SCSI Command PDU itself.
    pub immediate: u32,
    /// Bytes in unsolicited Data-Out PDUs after it.
    pub data_out: u32,
}

/// The unsolicited part of a write of `len` bytes.
pub fn unsolicited(
    len: u32,
    immediate_data: bool,
    initial_r2t: bool,
    first_burst: u32,
    target_max_recv: u32,
) -> Unsolicited {
    let burst = len.min(first_burst);
    let immediate = if immediate_data {
        burst.min(target_max_recv)
    } else {
        0
    };
    let data_out = if initial_r2t { 0 } else { burst - immediate };
    Unsolicited {
        immediate,
        data_out,
    }
}

/// Splits `offset..offset+len` into Data-Out PDUs of at most `max` bytes:
/// (offset, len, final).
pub fn data_out_pieces(offset: u32, len: u32, max: u32) -> impl Iterator<Item = (u32, u32, bool)> {
    let max = max.max(1);
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let piece = (end - at).min(max);
        let item = (at, piece, at + piece == end);
        at += piece;
        Some(item)
    })
}

/// What a finished command reports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// SCSI status (0 GOOD, 2 CHECK CONDITION, ...).
    pub status: u8,
    /// Sense data with CHECK CONDITION.
    pub sense: Vec<u8>,
    pub residual: ResidualKind,
    /// Data-In bytes received.
    pub received: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_numbers_wrap() {
        assert!(serial_lt(1, 2));
        assert!(serial_lt(u32::MAX, 0));
        assert!(!serial_lt(0, u32::MAX));
        assert!(serial_le(5, 5));
    }

    #[test]
    fn the_window_opens_and_closes() {
        let mut window = Window::new(10, 10, 11, 0);
        assert!(window.open());
        assert_eq!(window.take(), 10);
        assert_eq!(window.take(), 11);
        assert!(!window.open());
        // A stale update (smaller MaxCmdSN) changes nothing.
        assert!(!window.update(10, 10));
        // MaxCmdSN more than one behind ExpCmdSN is invalid and ignored.
        assert!(!window.update(20, 5));
        assert!(window.update(12, 20));
        assert!(window.open());
        // Wrapping at 2^32.
        let mut window = Window::new(u32::MAX, u32::MAX, 0, 0);
        assert_eq!(window.take(), u32::MAX);
        assert!(window.open());
        assert_eq!(window.take(), 0);
        assert!(!window.open());
        // MaxCmdSN = ExpCmdSN - 1: a zero window, valid (§4.2.2.1).
        let mut window = Window::new(5, 5, 4, 0);
        assert!(!window.open());
        assert!(window.update(5, 6));
        assert!(window.open());
    }

    #[test]
    fn status_numbers_only_advance() {
        let mut window = Window::new(0, 0, 0, 7);
        window.status(7);
        assert_eq!(window.exp_stat_sn, 8);
        window.status(3);
        assert_eq!(window.exp_stat_sn, 8);
    }

    #[test]
    fn data_ranges_are_checked() {
        assert!(check_data_in(1, 0, 512, Some(512)).is_ok());
        assert!(check_data_in(1, 512, 1, Some(512)).is_err());
        assert!(check_data_in(1, u32::MAX, 2, Some(512)).is_err());
        assert!(check_data_in(1, 0, 0, None).is_err());
        assert!(check_r2t(1, 0, 512, Some(4096)).is_ok());
        assert!(check_r2t(1, 4096, 1, Some(4096)).is_err());
        assert!(check_r2t(1, 0, 0, Some(4096)).is_err());
        assert!(check_r2t(1, 0, 1, None).is_err());
    }

    #[test]
    fn unsolicited_data_stays_within_the_first_burst() {
        let u = unsolicited(1 << 20, true, false, 256 << 10, 64 << 10);
        assert_eq!(u.immediate, 64 << 10);
        assert_eq!(u.data_out, 192 << 10);
        let u = unsolicited(4096, true, true, 65536, 8192);
        assert_eq!((u.immediate, u.data_out), (4096, 0));
        let u = unsolicited(1 << 20, false, true, 65536, 8192);
        assert_eq!((u.immediate, u.data_out), (0, 0));
        let u = unsolicited(100_000, false, false, 65536, 8192);
        assert_eq!((u.immediate, u.data_out), (0, 65536));
        let pieces: Vec<_> = data_out_pieces(100, 20_000, 8192).collect();
        assert_eq!(
            pieces,
            vec![(100, 8192, false), (8292, 8192, false), (16484, 3616, true)]
        );
        assert_eq!(data_out_pieces(0, 0, 8192).count(), 0);
    }
}
