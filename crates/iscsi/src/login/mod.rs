//! The target side of iSCSI login and text negotiation (RFC 7143 §6, §12, §13),
//! sans-IO: a Login Request's header and text in, the Login Response to send out.
//!
//! [`LoginMachine`] runs one connection's login phase: C-bit continuation, stage
//! transitions (security → operational → full feature), target lookup and access
//! control, CHAP (MD5 and SHA-256, one-way and mutual) and the operational keys.
//! [`answer_text`] answers Text Requests in the full feature phase (SendTargets).
//!
//! The connection driver owns the socket and the session table. Its duties:
//! - Read each Login Request's header and data segment (at most 8192 bytes during
//!   login, §13.12) and pass them to [`LoginMachine::handle`]; send what it returns.
//!   Close the connection after a `Fail`; a login that ends no other way within the
//!   driver's login timeout should be closed too.
//! - On `Complete`, settle the session: `negotiated.tsih == 0` asks for a new session,
//!   so give it a fresh non-zero TSIH; if a session with the same initiator name and
//!   ISID exists, that is session reinstatement (§6.3.5): close the old session's
//!   connections and drop its tasks first. A non-zero TSIH names an existing session
//!   to add a connection to; with MaxConnections=1 and ErrorRecoveryLevel=0 refuse it
//!   with [`failure_response`] and `status::SESSION_DOES_NOT_EXIST` (unknown TSIH) or
//!   `status::TOO_MANY_CONNECTIONS`. Write the TSIH into `response.tsih` before
//!   sending.
//! - Use `Negotiated`: digests from the next PDU after the final response on,
//!   `stat_sn` and `exp_cmd_sn` to continue the sequence numbers,
//!   `initiator_max_recv_data_segment_length` to size Data-In and Text Responses.
//! - For Text Requests in the full feature phase, gather C-bit continued requests,
//!   then call [`answer_text`] and send its answer in Text Responses of at most the
//!   initiator's MaxRecvDataSegmentLength: all but the last with C set and a target
//!   transfer tag the initiator echoes in an empty Text Request for the next piece;
//!   the last with F set and TTT 0xffffffff. An error from `answer_text` is answered
//!   with a Reject PDU (reason 0x04, protocol error).
//!
//! Keys the initiator does not offer keep their RFC defaults (MaxBurstLength 256 KiB,
//! FirstBurstLength 64 KiB, InitialR2T Yes, ...) even when [`TargetLimits`] is
//! stricter: the target never offers keys itself, since libiscsi answers a
//! response without T by sending all its keys again. Keep the limits at or above
//! those defaults.

mod chap;
mod keys;
mod machine;
mod text;

#[cfg(test)]
mod tests;

pub use chap::{chap_response, ChapAlgorithm};
// For the initiator's side of CHAP and key negotiation (crate::initiator::login).
pub(crate) use chap::{constant_time_eq, decode_binary, encode_hex};
pub(crate) use keys::parse_number;
pub use keys::DigestChoice;
pub use machine::{failure_response, LoginMachine};
pub use text::{answer_text, TextAnswerError};

use crate::pdu::LoginResponse;

/// Login status codes (class << 8 | detail; RFC 7143 §11.13.5).
pub mod status {
    pub const SUCCESS: u16 = 0x0000;
    /// Initiator error (a protocol violation with no more specific code).
    pub const INITIATOR_ERROR: u16 = 0x0200;
    pub const AUTHENTICATION_FAILURE: u16 = 0x0201;
    pub const AUTHORIZATION_FAILURE: u16 = 0x0202;
    pub const TARGET_NOT_FOUND: u16 = 0x0203;
    pub const TARGET_REMOVED: u16 = 0x0204;
    pub const UNSUPPORTED_VERSION: u16 = 0x0205;
    pub const TOO_MANY_CONNECTIONS: u16 = 0x0206;
    pub const MISSING_PARAMETER: u16 = 0x0207;
    pub const CANT_INCLUDE_IN_SESSION: u16 = 0x0208;
    pub const SESSION_TYPE_NOT_SUPPORTED: u16 = 0x0209;
    pub const SESSION_DOES_NOT_EXIST: u16 = 0x020a;
    pub const INVALID_DURING_LOGIN: u16 = 0x020b;
    pub const TARGET_ERROR: u16 = 0x0300;
    pub const SERVICE_UNAVAILABLE: u16 = 0x0301;
    pub const OUT_OF_RESOURCES: u16 = 0x0302;
}

/// Stage numbers of the CSG/NSG fields (§11.12.3).
pub mod stage {
    pub const SECURITY: u8 = 0;
    pub const OPERATIONAL: u8 = 1;
    pub const FULL_FEATURE: u8 = 3;
}

/// What the login phase needs to know about the targets this server offers.
#[derive(Debug, Clone, Default)]
pub struct LoginConfig {
    pub targets: Vec<TargetEntry>,
    /// CHAP the initiator must pass for discovery sessions (None: no authentication).
    pub discovery_chap: Option<ChapConfig>,
    pub limits: TargetLimits,
    /// Portals SendTargets reports, e.g. "127.0.0.1:3260,1" ("addr:port,tpgt"; IPv6
    /// in brackets).
    pub portals: Vec<String>,
}

impl LoginConfig {
    /// The target named `name` (iSCSI names compare case-insensitively, §4.2.7.1).
    pub fn target(&self, name: &str) -> Option<&TargetEntry> {
        self.targets
            .iter()
            .find(|target| target.name.eq_ignore_ascii_case(name))
    }
}

/// One target as login and discovery see it.
#[derive(Debug, Clone, Default)]
pub struct TargetEntry {
    /// The target's iSCSI name (an IQN).
    pub name: String,
    pub alias: Option<String>,
    /// The tag of the portal group the target is reached through (usually 1).
    pub portal_group_tag: u16,
    /// Initiator names allowed to log in (empty: everyone).
    pub allowed_initiators: Vec<String>,
    pub chap: Option<ChapConfig>,
}

impl TargetEntry {
    /// Whether `initiator` may log in to this target or see it in SendTargets.
    pub fn allows(&self, initiator: &str) -> bool {
        self.allowed_initiators.is_empty()
            || self
                .allowed_initiators
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(initiator))
    }
}

/// CHAP credentials (RFC 7143 §12.1.3). Debug output hides the secrets.
#[derive(Clone, Default)]
pub struct ChapConfig {
    /// The name the initiator must send as CHAP_N.
    pub user: String,
    pub secret: Vec<u8>,
    /// For mutual CHAP: the name and secret the target answers the initiator's
    /// challenge with.
    pub mutual: Option<(String, Vec<u8>)>,
}

impl std::fmt::Debug for ChapConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapConfig")
            .field("user", &self.user)
            .field("secret", &"<hidden>")
            .field(
                "mutual",
                &self.mutual.as_ref().map(|(user, _)| (user, "<hidden>")),
            )
            .finish()
    }
}

/// What the target offers and accepts: its side of each negotiation (§13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLimits {
    /// The most data we accept in one PDU, declared to the initiator
    /// (512..=16777215). Default 256 KiB.
    pub max_recv_data_segment_length: u32,
    /// Upper bound of MaxBurstLength (a minimum function). Default 16 MiB less 1 KiB,
    /// the largest multiple of 1 KiB the key's 24-bit range allows.
    pub max_burst_length: u32,
    /// Upper bound of FirstBurstLength (a minimum function). Default 256 KiB.
    pub first_burst_length: u32,
    /// Upper bound of MaxOutstandingR2T (a minimum function). Default 8.
    pub max_outstanding_r2t: u32,
    /// Upper bound of MaxConnections. Default 1 (no multi-connection sessions).
    pub max_connections: u32,
    /// Whether we accept immediate data (ImmediateData is an AND). Default true.
    pub immediate_data: bool,
    /// Whether we insist on an R2T before any data (InitialR2T is an OR). Default
    /// false: we accept unsolicited data.
    pub initial_r2t: bool,
    /// Which header digests we allow. Default: either, the initiator's order wins.
    pub header_digest: DigestChoice,
    /// Which data digests we allow. Default: either, the initiator's order wins.
    pub data_digest: DigestChoice,
    /// Our DefaultTime2Wait (a maximum function). Default 2 (the RFC default).
    pub default_time2wait: u16,
    /// Our DefaultTime2Retain (a minimum function). Default 20 (the RFC default).
    pub default_time2retain: u16,
    /// The command window we grant: MaxCmdSN - ExpCmdSN + 1. Default 128.
    pub cmd_window: u32,
}

impl Default for TargetLimits {
    fn default() -> Self {
        TargetLimits {
            max_recv_data_segment_length: 256 * 1024,
            max_burst_length: 16 * 1024 * 1024 - 1024,
            first_burst_length: 256 * 1024,
            max_outstanding_r2t: 8,
            max_connections: 1,
            immediate_data: true,
            initial_r2t: false,
            header_digest: DigestChoice::Either,
            data_digest: DigestChoice::Either,
            default_time2wait: 2,
            default_time2retain: 20,
            cmd_window: 128,
        }
    }
}

/// What to do after one Login Request.
#[derive(Debug, Clone)]
pub enum LoginStep {
    /// Send this response (with this text data), then read the next Login Request.
    Continue {
        response: LoginResponse,
        data: Vec<u8>,
    },
    /// Send this response; the connection enters the full feature phase with these
    /// parameters. The driver sets `response.tsih` (a new session's TSIH, or the
    /// reinstated one) before sending.
    Complete {
        response: LoginResponse,
        data: Vec<u8>,
        negotiated: Negotiated,
    },
    /// Send this response (its status says why) and close the connection. `reason`
    /// is for the log.
    Fail {
        response: LoginResponse,
        data: Vec<u8>,
        reason: String,
    },
}

/// SessionType (§13.21).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionType {
    Normal,
    Discovery,
}

/// The parameters a login settled, for the full feature phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// The target's configured name; None for discovery sessions.
    pub target_name: Option<String>,
    pub isid: u64,
    /// As the initiator sent it: 0 asks for a new session.
    pub tsih: u16,
    pub cid: u16,
    pub header_digest: bool,
    pub data_digest: bool,
    /// The most data the *initiator* accepts in one PDU from us (its declared
    /// MaxRecvDataSegmentLength; 8192 if it declared none).
    pub initiator_max_recv_data_segment_length: u32,
    /// The most we accept in one PDU from the initiator (what we declared; 8192 if
    /// the login never reached the operational stage).
    pub target_max_recv_data_segment_length: u32,
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
    /// StatSN the next target PDU of this connection carries.
    pub stat_sn: u32,
    /// The next expected CmdSN.
    pub exp_cmd_sn: u32,
}
