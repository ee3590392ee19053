//! The operational keys of RFC 7143 §13 and the rule each is settled by: list
//! choice, declaration, minimum/maximum, boolean AND/OR.

use super::TargetLimits;

/// Which digest (HeaderDigest or DataDigest, §13.1) the target allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestChoice {
    /// Only None.
    NoneOnly,
    /// Only CRC32C: an initiator that offers no CRC32C gets Reject (and no digest).
    Crc32cOnly,
    /// Either; the first value of the initiator's list wins.
    Either,
}

impl DigestChoice {
    fn allows(self, crc32c: bool) -> bool {
        match self {
            DigestChoice::NoneOnly => !crc32c,
            DigestChoice::Crc32cOnly => crc32c,
            DigestChoice::Either => true,
        }
    }
}

/// The smallest and largest value of a data length key (§13.12 to §13.14).
pub(super) const MIN_DATA_LENGTH: u32 = 512;
pub(super) const MAX_DATA_LENGTH: u32 = (1 << 24) - 1;
/// The MaxRecvDataSegmentLength a side that declares none is held to (§13.12).
pub(super) const DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH: u32 = 8192;

/// Operational parameter values, starting at the RFC defaults and updated as keys
/// are negotiated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Params {
    pub header_digest: bool,
    pub data_digest: bool,
    pub initiator_max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub default_time2wait: u16,
    pub default_time2retain: u16,
    pub error_recovery_level: u8,
    pub max_connections: u32,
}

impl Default for Params {
    /// The defaults of §13 for a key nobody offered.
    fn default() -> Self {
        Params {
            header_digest: false,
            data_digest: false,
            initiator_max_recv_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            default_time2wait: 2,
            default_time2retain: 20,
            error_recovery_level: 0,
            max_connections: 1,
        }
    }
}

/// What one received key comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Answer the key with this value.
    Answer(String),
    /// The login fails with this status.
    Fail(u16, String),
}

/// How a key name is classified (§12, §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyClass {
    /// InitiatorName, InitiatorAlias, TargetName, SessionType: they name the session.
    Identity,
    /// AuthMethod and the CHAP_ keys: the security stage's.
    Security,
    /// A login-time operational key this module negotiates.
    Operational,
    /// A key only the target sends (TargetAlias, TargetAddress,
    /// TargetPortalGroupTag) or one for the full feature phase only (SendTargets).
    NotHere,
    /// Anything else, X- and X# extension keys included.
    Unknown,
}

pub(super) fn classify(key: &str) -> KeyClass {
    match key {
        "InitiatorName" | "InitiatorAlias" | "TargetName" | "SessionType" => KeyClass::Identity,
        "AuthMethod" | "CHAP_A" | "CHAP_I" | "CHAP_C" | "CHAP_N" | "CHAP_R" => KeyClass::Security,
        "HeaderDigest"
        | "DataDigest"
        | "MaxRecvDataSegmentLength"
        | "MaxBurstLength"
        | "FirstBurstLength"
        | "InitialR2T"
        | "ImmediateData"
        | "MaxOutstandingR2T"
        | "DataPDUInOrder"
        | "DataSequenceInOrder"
        | "DefaultTime2Wait"
        | "DefaultTime2Retain"
        | "ErrorRecoveryLevel"
        | "MaxConnections"
        | "OFMarker"
        | "IFMarker"
        | "OFMarkInt"
        | "IFMarkInt"
        | "TaskReporting"
        | "iSCSIProtocolLevel"
        | "RDMAExtensions"
        | "InitiatorRecvDataSegmentLength"
        | "TargetRecvDataSegmentLength" => KeyClass::Operational,
        "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" | "SendTargets" => {
            KeyClass::NotHere
        }
        _ => KeyClass::Unknown,
    }
}

/// Parses a numerical value: decimal or "0x" hex (§6.1); None when malformed or
/// beyond u64.
pub(crate) fn parse_number(value: &str) -> Option<u64> {
    let (digits, radix) = match value.get(..2) {
        Some("0x" | "0X") => (&value[2..], 16),
        _ => (value, 10),
    };
    if digits.is_empty() || !digits.bytes().all(|b| (b as char).is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn yes_no(value: bool) -> String {
    if value { "Yes" } else { "No" }.to_string()
}

fn reject() -> Outcome {
    Outcome::Answer("Reject".to_string())
}

/// A number in `min..=max`, or None (the answer is then Reject and the key keeps
/// its current value).
fn number_in(value: &str, min: u32, max: u32) -> Option<u32> {
    parse_number(value)
        .filter(|&n| n >= u64::from(min) && n <= u64::from(max))
        .map(|n| n as u32)
}

/// Settles one operational key the initiator offered, updating `params`.
/// `limits.max_recv_data_segment_length` is answered as our own declaration.
pub(super) fn negotiate(
    params: &mut Params,
    limits: &TargetLimits,
    discovery: bool,
    key: &str,
    value: &str,
) -> Outcome {
    // Session-wide data-transfer keys mean nothing to a discovery session (§13).
    let irrelevant_in_discovery = matches!(
        key,
        "MaxBurstLength"
            | "FirstBurstLength"
            | "InitialR2T"
            | "ImmediateData"
            | "MaxOutstandingR2T"
            | "DataPDUInOrder"
            | "DataSequenceInOrder"
            | "MaxConnections"
    );
    if discovery && irrelevant_in_discovery {
        return Outcome::Answer("Irrelevant".to_string());
    }
    match key {
        "HeaderDigest" | "DataDigest" => {
            let choice = if key == "HeaderDigest" {
                limits.header_digest
            } else {
                limits.data_digest
            };
            // The first value of the initiator's list we allow; values we do not
            // know are skipped (§6.2.2).
            let chosen = value.split(',').find_map(|item| match item {
                "None" if choice.allows(false) => Some(false),
                "CRC32C" if choice.allows(true) => Some(true),
                _ => None,
            });
            let Some(crc32c) = chosen else {
                return reject();
            };
            if key == "HeaderDigest" {
                params.header_digest = crc32c;
            } else {
                params.data_digest = crc32c;
            }
            Outcome::Answer(if crc32c { "CRC32C" } else { "None" }.to_string())
        }
        "MaxRecvDataSegmentLength" => {
            // Declarative both ways (§13.12): the initiator's is what we may send it,
            // ours (answered here) what it may send us. A peer that cannot take
            // 512 bytes is broken; one declaring more than 2^24-1 is held to it.
            match parse_number(value) {
                Some(n) if n >= u64::from(MIN_DATA_LENGTH) => {
                    params.initiator_max_recv_data_segment_length =
                        n.min(u64::from(MAX_DATA_LENGTH)) as u32;
                    Outcome::Answer(declared_max_recv(limits).to_string())
                }
                _ => Outcome::Fail(
                    super::status::INITIATOR_ERROR,
                    format!("MaxRecvDataSegmentLength={value} is not a length we can honour"),
                ),
            }
        }
        "MaxBurstLength" => {
            let Some(offer) = number_in(value, MIN_DATA_LENGTH, MAX_DATA_LENGTH) else {
                return reject();
            };
            params.max_burst_length = offer.min(limits.max_burst_length.max(MIN_DATA_LENGTH));
            Outcome::Answer(params.max_burst_length.to_string())
        }
        "FirstBurstLength" => {
            let Some(offer) = number_in(value, MIN_DATA_LENGTH, MAX_DATA_LENGTH) else {
                return reject();
            };
            // FirstBurstLength may not exceed MaxBurstLength (§13.14); the caller
            // lowers it again if a later MaxBurstLength is smaller.
            params.first_burst_length = offer
                .min(limits.first_burst_length.max(MIN_DATA_LENGTH))
                .min(params.max_burst_length);
            Outcome::Answer(params.first_burst_length.to_string())
        }
        "InitialR2T" => {
            let Some(offer) = parse_bool(value) else {
                return reject();
            };
            params.initial_r2t = offer || limits.initial_r2t;
            Outcome::Answer(yes_no(params.initial_r2t))
        }
        "ImmediateData" => {
            let Some(offer) = parse_bool(value) else {
                return reject();
            };
            params.immediate_data = offer && limits.immediate_data;
            Outcome::Answer(yes_no(params.immediate_data))
        }
        "MaxOutstandingR2T" => {
            let Some(offer) = number_in(value, 1, 65_535) else {
                return reject();
            };
            params.max_outstanding_r2t = offer.min(limits.max_outstanding_r2t.max(1));
            Outcome::Answer(params.max_outstanding_r2t.to_string())
        }
        "DataPDUInOrder" | "DataSequenceInOrder" => {
            // OR functions; we only handle data in order, so the result is Yes.
            if parse_bool(value).is_none() {
                return reject();
            }
            Outcome::Answer(yes_no(true))
        }
        "DefaultTime2Wait" => {
            let Some(offer) = number_in(value, 0, 3600) else {
                return reject();
            };
            params.default_time2wait = (offer as u16).max(limits.default_time2wait.min(3600));
            Outcome::Answer(params.default_time2wait.to_string())
        }
        "DefaultTime2Retain" => {
            let Some(offer) = number_in(value, 0, 3600) else {
                return reject();
            };
            params.default_time2retain = (offer as u16).min(limits.default_time2retain);
            Outcome::Answer(params.default_time2retain.to_string())
        }
        "ErrorRecoveryLevel" => {
            // We implement level 0 only (session recovery).
            if number_in(value, 0, 2).is_none() {
                return reject();
            }
            params.error_recovery_level = 0;
            Outcome::Answer("0".to_string())
        }
        "MaxConnections" => {
            let Some(offer) = number_in(value, 1, 65_535) else {
                return reject();
            };
            params.max_connections = offer.min(limits.max_connections.max(1));
            Outcome::Answer(params.max_connections.to_string())
        }
        // Markers are gone from RFC 7143 (§13 and Appendix of RFC 7143 changes):
        // an AND that we answer No, and intervals that are then irrelevant.
        "OFMarker" | "IFMarker" => match parse_bool(value) {
            Some(_) => Outcome::Answer(yes_no(false)),
            None => reject(),
        },
        "OFMarkInt" | "IFMarkInt" => Outcome::Answer("Irrelevant".to_string()),
        // RFC 7143 §13.23: we implement the RFC 3720 task semantics.
        "TaskReporting" => Outcome::Answer("RFC3720".to_string()),
        // RFC 7144 §2.1: a minimum function; we implement RFC 7143 (level 1).
        "iSCSIProtocolLevel" => match number_in(value, 0, 31) {
            Some(offer) => Outcome::Answer(offer.min(1).to_string()),
            None => reject(),
        },
        // iSER (RFC 7145) is not ours: an AND we answer No, and its lengths then
        // irrelevant.
        "RDMAExtensions" => match parse_bool(value) {
            Some(_) => Outcome::Answer(yes_no(false)),
            None => reject(),
        },
        "InitiatorRecvDataSegmentLength" | "TargetRecvDataSegmentLength" => {
            Outcome::Answer("Irrelevant".to_string())
        }
        _ => Outcome::Answer("NotUnderstood".to_string()),
    }
}

/// The MaxRecvDataSegmentLength we declare, held to the key's range.
pub(super) fn declared_max_recv(limits: &TargetLimits) -> u32 {
    limits
        .max_recv_data_segment_length
        .clamp(MIN_DATA_LENGTH, MAX_DATA_LENGTH)
}
