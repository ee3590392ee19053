//! The SCSI the initiator speaks, as iSCSI carries it. The CDB builders, answer
//! parsers and the status/sense mapping live in [`blockwire_scsi::initiator`] beside
//! the target's decoders and encoders; this file only adds what iSCSI knows and
//! SCSI does not: a command's [`Outcome`] with its residual and Data-In count.

use blockwire_blockdev::{Error, ErrorKind, Op};
use blockwire_scsi::initiator::status;
use blockwire_scsi::Status;

use super::session::Outcome;
use crate::pdu::ResidualKind;

pub use blockwire_scsi::initiator::answers::*;
pub use blockwire_scsi::initiator::cdbs::*;

/// Whether the outcome ended GOOD.
pub fn is_good(outcome: &Outcome) -> bool {
    outcome.status == Status::Good as u8
}

/// Whether an outcome is a unit attention (worth one retry: SAM-5 5.14).
pub fn is_unit_attention(outcome: &Outcome) -> bool {
    status::is_unit_attention(outcome.status, &outcome.sense)
}

/// The error for a command that did not end GOOD.
pub fn status_error(outcome: &Outcome, op: Op, offset: u64, len: u64) -> Error {
    status::status_error(outcome.status, &outcome.sense, op, offset, len)
}

/// The result of a block read or write: GOOD and every byte moved.
pub fn check_io(outcome: &Outcome, op: Op, offset: u64, len: u64) -> Result<(), Error> {
    if !is_good(outcome) {
        return Err(status_error(outcome, op, offset, len));
    }
    if let ResidualKind::Underflow(n) | ResidualKind::Overflow(n) = outcome.residual {
        if n != 0 {
            return Err(
                Error::new(ErrorKind::Io, op, offset, len).with_detail(format!(
                    "the target moved {n} bytes less or more than asked"
                )),
            );
        }
    }
    if op == Op::Read && u64::from(outcome.received) != len {
        return Err(
            Error::new(ErrorKind::Io, op, offset, len).with_detail(format!(
                "the target sent {} of {len} bytes",
                outcome.received
            )),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_scsi::sense::{codes, Sense};

    #[test]
    fn check_condition_becomes_the_sense_tables_kind() {
        let outcome = Outcome {
            status: Status::CheckCondition as u8,
            sense: Sense::new(codes::LBA_OUT_OF_RANGE).encode(false),
            ..Outcome::default()
        };
        let error = check_io(&outcome, Op::Read, 0, 512).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::OutOfRange);
        assert!(!is_unit_attention(&outcome));
    }

    #[test]
    fn good_needs_every_byte_moved() {
        let short = Outcome {
            received: 100,
            ..Outcome::default()
        };
        assert_eq!(
            check_io(&short, Op::Read, 0, 512).unwrap_err().kind(),
            ErrorKind::Io
        );
        let residual = Outcome {
            residual: ResidualKind::Underflow(512),
            ..Outcome::default()
        };
        assert_eq!(
            check_io(&residual, Op::Write, 0, 512).unwrap_err().kind(),
            ErrorKind::Io
        );
        assert!(check_io(&Outcome::default(), Op::Write, 0, 512).is_ok());
    }
}
