//! Connecting and logging in over TCP: the driver around the sans-IO
//! [`InitiatorLogin`], and SendTargets discovery (RFC 7143 Appendix C) on a
//! discovery session.

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::error::InitiatorError;
use super::login::{InitiatorLogin, LoginOptions, LoginStep, SessionParams};
use super::wire::{send_pdu, Digests, PduReader};
use crate::pdu::{text, LogoutReason, LogoutRequest, Pdu, TextRequest, RESERVED_TAG};

/// The most text one login or text response may carry (generous: §13.12 holds
/// the target to 8192 bytes until the login ends).
const LOGIN_MAX_DATA: u32 = 64 * 1024;
/// The most SendTargets text we gather over continuations.
const MAX_TEXT: usize = 1 << 20;

/// Opens a TCP connection to `address` within `timeout`.
pub fn dial(address: &str, timeout: Duration) -> Result<TcpStream, InitiatorError> {
    let io = |source| InitiatorError::Io {
        address: address.to_string(),
        source,
    };
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address to connect to");
    for addr in address.to_socket_addrs().map_err(io)? {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => {
                stream.set_nodelay(true).map_err(io)?;
                return Ok(stream);
            }
            Err(e) => last = e,
        }
    }
    Err(io(last))
}

/// Runs the login phase on `stream`; returns the session's parameters.
pub fn login(
    stream: &TcpStream,
    address: &str,
    options: LoginOptions,
    timeout: Duration,
) -> Result<SessionParams, InitiatorError> {
    let io = |source| InitiatorError::Io {
        address: address.to_string(),
        source,
    };
    let target = options
        .target_name
        .clone()
        .unwrap_or_else(|| "the discovery session".into());
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    let mut reader = PduReader::new(stream.try_clone().map_err(io)?, LOGIN_MAX_DATA);
    let mut writer = stream.try_clone().map_err(io)?;
    let mut machine = InitiatorLogin::new(options);
    let mut step = machine.start();
    loop {
        match step {
            LoginStep::Done(params) => return Ok(params),
            LoginStep::Send { request, data } => {
                let header = Pdu::LoginRequest(request).encode(data.len() as u32);
                send_pdu(&mut writer, &header, &data, Digests::default()).map_err(io)?;
            }
        }
        let protocol = |reason: String| InitiatorError::Protocol {
            address: address.to_string(),
            reason,
        };
        let (bhs, ahs) = reader
            .read_header()
            .map_err(|e| protocol(format!("during login: {e}")))?;
        let data = reader
            .read_data_vec(bhs.data_len())
            .map_err(|e| protocol(format!("during login: {e}")))?;
        let response = match Pdu::decode(&bhs, &ahs) {
            Ok(Pdu::LoginResponse(response)) => response,
            Ok(_) => {
                return Err(protocol(
                    "a PDU other than a Login Response during login".into(),
                ))
            }
            Err(e) => return Err(protocol(format!("during login: {e}"))),
        };
        step = machine
            .handle(&response, &data)
            .map_err(|source| InitiatorError::Login {
                address: address.to_string(),
                target: target.clone(),
                source,
            })?;
    }
}

/// A target SendTargets reported: its name and portals ("addr:port,tpgt").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    pub name: String,
    pub addresses: Vec<String>,
}

/// Parses a SendTargets answer (Appendix C): each TargetName followed by its
/// TargetAddress keys.
pub fn parse_send_targets(pairs: &[(String, String)]) -> Vec<DiscoveredTarget> {
    let mut found: Vec<DiscoveredTarget> = Vec::new();
    for (key, value) in pairs {
        match key.as_str() {
            "TargetName" => found.push(DiscoveredTarget {
                name: value.clone(),
                addresses: Vec::new(),
            }),
            "TargetAddress" => {
                if let Some(last) = found.last_mut() {
                    last.addresses.push(value.clone());
                }
            }
            _ => {}
        }
    }
    found
}

/// SendTargets=All on a logged-in discovery session, then logout.
pub fn send_targets(
    stream: &TcpStream,
    address: &str,
    params: &SessionParams,
) -> Result<Vec<DiscoveredTarget>, InitiatorError> {
    let io = |source| InitiatorError::Io {
        address: address.to_string(),
        source,
    };
    let protocol = |reason: String| InitiatorError::Protocol {
        address: address.to_string(),
        reason,
    };
    let digests = Digests {
        header: params.header_digest,
        data: params.data_digest,
    };
    let mut reader = PduReader::new(stream.try_clone().map_err(io)?, params.initiator_max_recv);
    reader.digests = digests;
    let mut writer = stream.try_clone().map_err(io)?;
    let mut cmd_sn = params.cmd_sn;
    let mut exp_stat_sn = params.exp_stat_sn;
    let mut request_data = text::encode(&[("SendTargets", "All")]);
    let mut ttt = RESERVED_TAG;
    let mut gathered = Vec::new();
    loop {
        let request = TextRequest {
            immediate: false,
            final_bit: true,
            continue_bit: false,
            lun: 0,
            initiator_task_tag: 1,
            target_transfer_tag: ttt,
            cmd_sn,
            exp_stat_sn,
        };
        cmd_sn = cmd_sn.wrapping_add(1);
        let header = Pdu::TextRequest(request).encode(request_data.len() as u32);
        send_pdu(&mut writer, &header, &request_data, digests).map_err(io)?;
        request_data.clear();
        let response = loop {
            let (bhs, ahs) = reader
                .read_header()
                .map_err(|e| protocol(format!("SendTargets: {e}")))?;
            let data = reader
                .read_data_vec(bhs.data_len())
                .map_err(|e| protocol(format!("SendTargets: {e}")))?;
            match Pdu::decode(&bhs, &ahs) {
                Ok(Pdu::TextResponse(response)) => break (response, data),
                // A ping while we wait is answered by nobody: discovery is short.
                Ok(Pdu::NopIn(_)) | Ok(Pdu::AsyncMessage(_)) => continue,
                Ok(Pdu::Reject(_)) => {
                    return Err(protocol("the target rejected SendTargets".into()))
                }
                Ok(_) => return Err(protocol("unexpected PDU answering SendTargets".into())),
                Err(e) => return Err(protocol(format!("SendTargets: {e}"))),
            }
        };
        let (response, data) = response;
        exp_stat_sn = response.stat_sn.wrapping_add(1);
        if gathered.len() + data.len() > MAX_TEXT {
            return Err(protocol("SendTargets answer too long".into()));
        }
        gathered.extend_from_slice(&data);
        if response.final_bit || !response.continue_bit {
            break;
        }
        // More to come: an empty request echoing the tag (§11.10.4).
        ttt = response.target_transfer_tag;
    }
    let pairs = text::parse(&gathered).map_err(|e| protocol(format!("SendTargets: {e}")))?;
    // Log out politely; a target that just closes is fine too.
    let logout = LogoutRequest {
        immediate: true,
        reason: LogoutReason::CloseSession,
        initiator_task_tag: 2,
        cid: params.cid,
        cmd_sn,
        exp_stat_sn,
    };
    let header = Pdu::LogoutRequest(logout).encode(0);
    if send_pdu(&mut writer, &header, &[], digests).is_ok() {
        let _ = reader.read_header();
    }
    Ok(parse_send_targets(&pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn send_targets_answers_group_addresses_by_name() {
        let pairs: Vec<(String, String)> = [
            ("TargetName", "iqn.a:1"),
            ("TargetAddress", "10.0.0.1:3260,1"),
            ("TargetAddress", "[::1]:3260,1"),
            ("TargetName", "iqn.a:2"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let found = parse_send_targets(&pairs);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].addresses.len(), 2);
        assert!(found[1].addresses.is_empty());
    }
}
