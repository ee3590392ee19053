//! Text Requests in the full feature phase (RFC 7143 §6.1, §11.10, Appendix C):
//! SendTargets for discovery and normal sessions; every other key is refused.

use std::collections::HashSet;

use super::keys::{self, KeyClass};
use super::{LoginConfig, Negotiated, SessionType, TargetEntry};
use crate::pdu::text::{self, TextError};

/// Why a Text Request's data cannot be answered; the driver answers the PDU with a
/// Reject (reason "protocol error").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextAnswerError {
    #[error("text request: {0}")]
    Malformed(#[from] TextError),
    #[error("key {0} appears twice in one text request")]
    DuplicateKey(String),
}

/// Answers a Text Request's keys in the full feature phase.
///
/// - `SendTargets=All` (discovery sessions): every target the initiator may log in
///   to, each as `TargetName=` followed by a `TargetAddress=` per portal.
/// - `SendTargets=<name>`: that target, if the initiator may see it (else nothing).
/// - `SendTargets=` (empty; normal sessions): the session's own target.
/// - Login-only keys are answered Reject, anything else NotUnderstood.
///
/// Returns the whole text data segment; the driver splits it into Text Responses of
/// at most the initiator's MaxRecvDataSegmentLength, setting C and a target transfer
/// tag on all but the last (§11.11.2).
pub fn answer_text(
    config: &LoginConfig,
    negotiated: &Negotiated,
    request_data: &[u8],
) -> Result<Vec<u8>, TextAnswerError> {
    let pairs = text::parse(request_data)?;
    let mut in_request = HashSet::new();
    for (key, _) in &pairs {
        if !in_request.insert(key.as_str()) {
            return Err(TextAnswerError::DuplicateKey(key.clone()));
        }
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for (key, value) in &pairs {
        match key.as_str() {
            "SendTargets" => send_targets(config, negotiated, value, &mut out),
            _ => {
                let answer = match keys::classify(key) {
                    // Keys settled at login stay settled (§13: "Use: LO / IO").
                    KeyClass::Identity
                    | KeyClass::Security
                    | KeyClass::Operational
                    | KeyClass::NotHere => "Reject",
                    KeyClass::Unknown => "NotUnderstood",
                };
                out.push((key.clone(), answer.to_string()));
            }
        }
    }
    Ok(text::encode(&out))
}

fn send_targets(
    config: &LoginConfig,
    negotiated: &Negotiated,
    value: &str,
    out: &mut Vec<(String, String)>,
) {
    let initiator = negotiated.initiator_name.as_str();
    match (value, negotiated.session_type) {
        // All targets is for discovery sessions only (Appendix C).
        ("All", SessionType::Normal) => out.push(("SendTargets".into(), "Reject".into())),
        ("All", SessionType::Discovery) => {
            for target in config.targets.iter().filter(|t| t.allows(initiator)) {
                describe(config, target, out);
            }
        }
        ("", SessionType::Normal) => {
            if let Some(target) = negotiated
                .target_name
                .as_deref()
                .and_then(|name| config.target(name))
            {
                describe(config, target, out);
            }
        }
        ("", SessionType::Discovery) => out.push(("SendTargets".into(), "Reject".into())),
        (name, _) => {
            if let Some(target) = config.target(name).filter(|t| t.allows(initiator)) {
                describe(config, target, out);
            }
        }
    }
}

fn describe(config: &LoginConfig, target: &TargetEntry, out: &mut Vec<(String, String)>) {
    out.push(("TargetName".into(), target.name.clone()));
    for portal in &config.portals {
        out.push(("TargetAddress".into(), portal.clone()));
    }
}
