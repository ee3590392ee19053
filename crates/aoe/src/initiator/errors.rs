//! The one table from what an AoE target answers (ATA status and error registers, AoE
//! error codes) and what the initiator sees (timeouts, closing) to our neutral error
//! kinds.

use std::time::Duration;

use blockwire_blockdev::{Error, ErrorKind, Op};

use super::session::Fault;
use crate::wire::{ata, AoeError};

/// ATA error register: media changed, media change requested, no media (removable
/// devices; a virtual disk that went away).
const ERROR_MC: u8 = 0x20;
const ERROR_MCR: u8 = 0x08;
const ERROR_NM: u8 = 0x02;
/// ATA status register: device fault.
const STATUS_DF: u8 = 0x20;

/// The kind of a failed ATA command, from its status and error registers.
pub fn ata_error_kind(status: u8, error: u8) -> ErrorKind {
    if error & ata::ERROR_IDNF != 0 {
        // ID not found: the address is beyond the device.
        ErrorKind::OutOfRange
    } else if error & (ERROR_NM | ERROR_MC | ERROR_MCR) != 0 {
        ErrorKind::Disconnected
    } else {
        // UNC (uncorrectable data), ABRT (aborted: failed or refused), DF (device
        // fault) and anything else: the medium failed the command.
        let _ = status;
        ErrorKind::Io
    }
}

/// The kind of an AoE error code (AoEr11 §2.4).
pub fn aoe_error_kind(code: u8) -> ErrorKind {
    match AoeError::from_code(code) {
        Some(AoeError::UnrecognizedCommand) | Some(AoeError::UnsupportedVersion) => {
            ErrorKind::Unsupported
        }
        Some(AoeError::BadArgument) | Some(AoeError::ConfigStringPresent) => {
            ErrorKind::InvalidArgument
        }
        Some(AoeError::DeviceUnavailable) => ErrorKind::Disconnected,
        // Reserved for other initiators: neither read-only nor missing, just refused.
        Some(AoeError::TargetReserved) | None => ErrorKind::Io,
    }
}

/// The kind of a failed request.
pub fn fault_kind(fault: &Fault) -> ErrorKind {
    match fault {
        Fault::Ata { status, error } => ata_error_kind(*status, *error),
        Fault::Aoe { code } => aoe_error_kind(*code),
        Fault::Malformed(_) => ErrorKind::Io,
        Fault::TimedOut { .. } => ErrorKind::TimedOut,
        Fault::Closed => ErrorKind::Disconnected,
        // The device opened is gone; what answers in its place is not used.
        Fault::Changed(_) => ErrorKind::Disconnected,
    }
}

fn ata_error_names(error: u8) -> String {
    let names: Vec<&str> = [
        (ata::ERROR_UNC, "UNC: uncorrectable data"),
        (ERROR_MC, "MC: media changed"),
        (ata::ERROR_IDNF, "IDNF: address not found"),
        (ERROR_MCR, "MCR: media change requested"),
        (ata::ERROR_ABRT, "ABRT: command aborted"),
        (ERROR_NM, "NM: no media"),
    ]
    .iter()
    .filter(|(bit, _)| error & bit != 0)
    .map(|(_, name)| *name)
    .collect();
    if names.is_empty() {
        "no error bits".to_string()
    } else {
        names.join(", ")
    }
}

fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// What went wrong, for people; `target` names the target and its paths.
pub fn fault_detail(fault: &Fault, target: &str) -> String {
    match fault {
        Fault::Ata { status, error } => {
            let fault = if status & STATUS_DF != 0 {
                ", device fault"
            } else {
                ""
            };
            format!(
                "{target} failed the ATA command: status {status:#04x}{fault}, error {error:#04x} ({})",
                ata_error_names(*error)
            )
        }
        Fault::Aoe { code } => match AoeError::from_code(*code) {
            Some(AoeError::TargetReserved) => {
                format!("{target} is reserved for other initiators (AoE error 6)")
            }
            Some(error) => format!("{target} answered AoE error {code}: {error}"),
            None => format!("{target} answered unknown AoE error {code}"),
        },
        Fault::Malformed(what) => format!("{target} sent a malformed answer: {what}"),
        Fault::TimedOut {
            waited,
            retransmits,
            silent,
        } => {
            let scope = if *silent {
                "answered nothing at all"
            } else {
                "did not answer this request"
            };
            format!(
                "{target} {scope} for {} ({retransmits} retransmissions)",
                seconds(*waited)
            )
        }
        Fault::Closed => format!("the initiator for {target} was closed"),
        Fault::Changed(what) => {
            format!("{target} is not the device opened any more: {what}; not using it")
        }
    }
}

/// The device error for a failed request of `op` on `offset..offset+len`.
pub fn device_error(fault: &Fault, op: Op, offset: u64, len: u64, target: &str) -> Error {
    Error::new(fault_kind(fault), op, offset, len).with_detail(fault_detail(fault, target))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ata_errors() {
        let err = ata::STATUS_DRDY | ata::STATUS_ERR;
        assert_eq!(ata_error_kind(err, ata::ERROR_IDNF), ErrorKind::OutOfRange);
        assert_eq!(
            ata_error_kind(err, ata::ERROR_IDNF | ata::ERROR_ABRT),
            ErrorKind::OutOfRange
        );
        assert_eq!(ata_error_kind(err, ata::ERROR_ABRT), ErrorKind::Io);
        assert_eq!(ata_error_kind(err, ata::ERROR_UNC), ErrorKind::Io);
        assert_eq!(ata_error_kind(err, 0), ErrorKind::Io);
        assert_eq!(ata_error_kind(STATUS_DF, 0), ErrorKind::Io);
        assert_eq!(ata_error_kind(err, ERROR_NM), ErrorKind::Disconnected);
    }

    #[test]
    fn aoe_errors() {
        let cases = [
            (1, ErrorKind::Unsupported),
            (2, ErrorKind::InvalidArgument),
            (3, ErrorKind::Disconnected),
            (4, ErrorKind::InvalidArgument),
            (5, ErrorKind::Unsupported),
            (6, ErrorKind::Io),
            (200, ErrorKind::Io),
        ];
        for (code, kind) in cases {
            assert_eq!(aoe_error_kind(code), kind, "code {code}");
        }
    }

    #[test]
    fn faults_map_to_kinds_with_readable_details() {
        let target = "e1.2 (02:00:00:00:00:aa via veth0)";
        let timed_out = Fault::TimedOut {
            waited: Duration::from_millis(10_020),
            retransmits: 12,
            silent: true,
        };
        assert_eq!(fault_kind(&timed_out), ErrorKind::TimedOut);
        let error = device_error(&timed_out, Op::Read, 4096, 1024, target);
        assert_eq!(error.kind(), ErrorKind::TimedOut);
        let text = error.to_string();
        assert!(
            text.contains("e1.2 (02:00:00:00:00:aa via veth0)"),
            "{text}"
        );
        assert!(
            text.contains("10.0 s") && text.contains("12 retransmissions"),
            "{text}"
        );

        assert_eq!(fault_kind(&Fault::Closed), ErrorKind::Disconnected);
        let changed =
            Fault::Changed("the target now answering at 02:00:00:00:00:bb has 8 sectors".into());
        assert_eq!(fault_kind(&changed), ErrorKind::Disconnected);
        let text = fault_detail(&changed, "e1.2");
        assert!(
            text.contains("e1.2 is not the device opened") && text.contains("has 8 sectors"),
            "{text}"
        );
        assert_eq!(fault_kind(&Fault::Malformed("x".into())), ErrorKind::Io);
        let idnf = Fault::Ata {
            status: 0x41,
            error: ata::ERROR_IDNF,
        };
        assert_eq!(fault_kind(&idnf), ErrorKind::OutOfRange);
        let text = fault_detail(&idnf, "e1.2");
        assert!(
            text.contains("status 0x41") && text.contains("IDNF"),
            "{text}"
        );
        let text = fault_detail(&Fault::Aoe { code: 3 }, "e1.2");
        assert!(text.contains("device unavailable"), "{text}");
        assert!(fault_detail(&Fault::Aoe { code: 6 }, "e1.2").contains("reserved"));
    }
}
