//! The initiator's side of the fixed newstyle handshake (proto.md, "Fixed newstyle
//! negotiation"), over any byte stream: options out, option replies in, through the
//! sans-IO codec in [`crate::wire`].
//!
//! Order: client flags (FIXED_NEWSTYLE, NO_ZEROES when offered), then
//! NBD_OPT_EXTENDED_HEADERS, else (refused) NBD_OPT_STRUCTURED_REPLY,
//! NBD_OPT_SET_META_CONTEXT `base:allocation` (only with either), and NBD_OPT_GO
//! asking for NBD_INFO_BLOCK_SIZE, NAME and DESCRIPTION. A server without GO
//! (NBD_REP_ERR_UNSUP) gets NBD_OPT_EXPORT_NAME, as the protocol asks clients to fall
//! back — unless it acknowledged extended headers, after which it must know GO.

use std::io::{self, Read, Write};

use blockwire_blockdev::BlockSizes;

use super::details::ExportDetails;
use super::error::{reply_name, ClientError};
use crate::wire::*;

/// Option replies larger than this are not believed (the longest legitimate one, a
/// NBD_REP_SERVER, holds two 4 KiB strings).
const MAX_OPTION_REPLY: u32 = 1 << 20;

/// What the initiator asks for during negotiation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wanted {
    pub structured: bool,
    /// Ask for extended headers first (they supersede structured replies).
    pub extended: bool,
    pub base_allocation: bool,
}

/// Upgrades a stream to TLS once the server acknowledged NBD_OPT_STARTTLS.
pub(crate) type StartTls<'a, S> = &'a mut dyn FnMut(&mut S) -> Result<(), ClientError>;

/// The client side of option haggling over one stream.
struct Haggle<'a, S> {
    stream: &'a mut S,
    address: &'a str,
    /// The server's handshake flags, once the greeting is read.
    handshake_flags: u16,
    /// The option the last request was, for messages.
    last_option: &'static str,
}

fn option_name(option: u32) -> &'static str {
    match option {
        NBD_OPT_EXPORT_NAME => "NBD_OPT_EXPORT_NAME",
        NBD_OPT_ABORT => "NBD_OPT_ABORT",
        NBD_OPT_LIST => "NBD_OPT_LIST",
        NBD_OPT_GO => "NBD_OPT_GO",
        NBD_OPT_STRUCTURED_REPLY => "NBD_OPT_STRUCTURED_REPLY",
        NBD_OPT_EXTENDED_HEADERS => "NBD_OPT_EXTENDED_HEADERS",
        NBD_OPT_SET_META_CONTEXT => "NBD_OPT_SET_META_CONTEXT",
        NBD_OPT_STARTTLS => "NBD_OPT_STARTTLS",
        _ => "an option",
    }
}

fn option_code(option: &ClientOption) -> u32 {
    match option {
        ClientOption::ExportName(_) => NBD_OPT_EXPORT_NAME,
        ClientOption::Abort => NBD_OPT_ABORT,
        ClientOption::List => NBD_OPT_LIST,
        ClientOption::StartTls => NBD_OPT_STARTTLS,
        ClientOption::Info { .. } => NBD_OPT_INFO,
        ClientOption::Go { .. } => NBD_OPT_GO,
        ClientOption::StructuredReply => NBD_OPT_STRUCTURED_REPLY,
        ClientOption::ExtendedHeaders => NBD_OPT_EXTENDED_HEADERS,
        ClientOption::ListMetaContext { .. } => NBD_OPT_LIST_META_CONTEXT,
        ClientOption::SetMetaContext { .. } => NBD_OPT_SET_META_CONTEXT,
        ClientOption::Unknown(code) => *code,
    }
}

impl<S: Read + Write> Haggle<'_, S> {
    fn io_error(&self, e: io::Error) -> ClientError {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ClientError::Closed {
                address: self.address.to_string(),
                context: format!(" (waiting for the reply to {})", self.last_option),
            }
        } else if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            ClientError::Io {
                address: self.address.to_string(),
                source: io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer to {} in time", self.last_option),
                ),
            }
        } else {
            ClientError::Io {
                address: self.address.to_string(),
                source: e,
            }
        }
    }

    fn protocol(&self, reason: impl Into<String>) -> ClientError {
        ClientError::Protocol {
            address: self.address.to_string(),
            reason: reason.into(),
        }
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), ClientError> {
        self.stream.read_exact(buf).map_err(|e| self.io_error(e))
    }

    fn write_all(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.stream.write_all(bytes).map_err(|e| self.io_error(e))
    }

    /// Reads the greeting; returns the server's handshake flags.
    fn greeting(&mut self) -> Result<u16, ClientError> {
        let flags = self.read_greeting()?;
        self.handshake_flags = flags;
        Ok(flags)
    }

    fn read_greeting(&mut self) -> Result<u16, ClientError> {
        let mut bytes = [0u8; GREETING_LEN];
        self.stream.read_exact(&mut bytes).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                ClientError::Closed {
                    address: self.address.to_string(),
                    context: " before sending the NBD greeting".into(),
                }
            } else {
                self.io_error(e)
            }
        })?;
        match decode_greeting(&bytes) {
            Ok(flags) => Ok(flags),
            Err(WireError::BadMagic {
                found: CLISERV_MAGIC,
                ..
            }) => Err(ClientError::Oldstyle {
                address: self.address.to_string(),
            }),
            Err(e) => Err(ClientError::NotNbd {
                address: self.address.to_string(),
                reason: format!("greeting has {e}"),
            }),
        }
    }

    /// Sends our client flags: fixed newstyle (when the server offers it) and no
    /// zeroes (when the server offers it).
    fn client_flags(&mut self, handshake_flags: u16) -> Result<(), ClientError> {
        let mut flags = 0;
        if handshake_flags & NBD_FLAG_FIXED_NEWSTYLE != 0 {
            flags |= NBD_FLAG_C_FIXED_NEWSTYLE;
        }
        if handshake_flags & NBD_FLAG_NO_ZEROES != 0 {
            flags |= NBD_FLAG_C_NO_ZEROES;
        }
        self.write_all(&flags.to_be_bytes())
    }

    fn send(&mut self, option: &ClientOption) -> Result<(), ClientError> {
        let mut out = Vec::with_capacity(64);
        option.encode(&mut out);
        self.last_option = option_name(option_code(option));
        self.write_all(&out)
    }

    /// Reads one option reply to `option`: its type and payload.
    fn reply(&mut self, option: u32) -> Result<(u32, Vec<u8>), ClientError> {
        let mut bytes = [0u8; OPTION_REPLY_HEADER_LEN];
        self.read_exact(&mut bytes)?;
        let header = OptionReplyHeader::decode(&bytes)
            .map_err(|e| self.protocol(format!("option reply has {e}")))?;
        if header.option != option {
            return Err(self.protocol(format!(
                "reply to option {} while waiting for {}",
                header.option,
                option_name(option)
            )));
        }
        if header.len > MAX_OPTION_REPLY {
            return Err(self.protocol(format!(
                "option reply of {} bytes to {}",
                header.len,
                option_name(option)
            )));
        }
        let mut payload = vec![0u8; header.len as usize];
        self.read_exact(&mut payload)?;
        Ok((header.reply, payload))
    }

    /// A reply type that has no business answering `option`.
    fn unexpected(&self, option: u32, reply: u32) -> ClientError {
        self.protocol(format!(
            "{} answered with {} ({reply:#x})",
            option_name(option),
            reply_name(reply)
        ))
    }

    /// Ends the negotiation politely (proto.md: a client terminates the session
    /// with a soft disconnect); the server's answer, if any, does not matter.
    fn abort(&mut self) {
        let mut out = Vec::new();
        ClientOption::Abort.encode(&mut out);
        if self.stream.write_all(&out).is_ok() {
            let mut header = [0u8; OPTION_REPLY_HEADER_LEN];
            let _ = self.stream.read_exact(&mut header);
        }
    }

    fn refused(&mut self, what: String, reply: u32, payload: &[u8]) -> ClientError {
        self.abort();
        ClientError::refused(self.address, what, reply, &String::from_utf8_lossy(payload))
    }

    /// NBD_OPT_STARTTLS, then `upgrade` runs the TLS handshake on the stream. Sent
    /// first, so every other option travels inside TLS (proto.md); a server that
    /// refuses TLS ends the negotiation, since the URI asked for it.
    fn start_tls(&mut self, upgrade: StartTls<'_, S>) -> Result<(), ClientError> {
        if self.handshake_flags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
            return Err(ClientError::Unsupported {
                address: self.address.to_string(),
                what: "TLS".into(),
            });
        }
        self.send(&ClientOption::StartTls)?;
        let (reply, payload) = self.reply(NBD_OPT_STARTTLS)?;
        match reply {
            NBD_REP_ACK => upgrade(self.stream),
            error if error & NBD_REP_FLAG_ERROR != 0 => {
                Err(self.refused("TLS (NBD_OPT_STARTTLS)".into(), error, &payload))
            }
            other => Err(self.unexpected(NBD_OPT_STARTTLS, other)),
        }
    }

    /// NBD_OPT_STRUCTURED_REPLY; true when the server agreed.
    fn structured_reply(&mut self) -> Result<bool, ClientError> {
        self.send(&ClientOption::StructuredReply)?;
        let (reply, payload) = self.reply(NBD_OPT_STRUCTURED_REPLY)?;
        match reply {
            NBD_REP_ACK => Ok(true),
            error if error & NBD_REP_FLAG_ERROR != 0 => {
                tracing::debug!(
                    "{}: no structured replies: {} {}",
                    self.address,
                    reply_name(error),
                    String::from_utf8_lossy(&payload)
                );
                Ok(false)
            }
            other => Err(self.unexpected(NBD_OPT_STRUCTURED_REPLY, other)),
        }
    }

    /// NBD_OPT_EXTENDED_HEADERS; true when the server agreed. Any refusal (servers
    /// that predate the option answer NBD_REP_ERR_UNSUP) leaves compact headers.
    fn extended_headers(&mut self) -> Result<bool, ClientError> {
        self.send(&ClientOption::ExtendedHeaders)?;
        let (reply, payload) = self.reply(NBD_OPT_EXTENDED_HEADERS)?;
        match reply {
            NBD_REP_ACK => Ok(true),
            error if error & NBD_REP_FLAG_ERROR != 0 => {
                tracing::debug!(
                    "{}: no extended headers: {} {}",
                    self.address,
                    reply_name(error),
                    String::from_utf8_lossy(&payload)
                );
                Ok(false)
            }
            other => Err(self.unexpected(NBD_OPT_EXTENDED_HEADERS, other)),
        }
    }

    /// NBD_OPT_SET_META_CONTEXT for `base:allocation`; the id the server gave it.
    fn base_allocation(&mut self, export: &str) -> Result<Option<u32>, ClientError> {
        self.send(&ClientOption::SetMetaContext {
            name: export.to_string(),
            queries: vec![BASE_ALLOCATION.to_string()],
        })?;
        let mut id = None;
        loop {
            let (reply, payload) = self.reply(NBD_OPT_SET_META_CONTEXT)?;
            match reply {
                NBD_REP_META_CONTEXT => {
                    let (context, name) = decode_rep_meta_context(&payload)
                        .map_err(|e| self.protocol(format!("NBD_REP_META_CONTEXT: {e}")))?;
                    // Contexts we did not ask for are ignored.
                    if name == BASE_ALLOCATION {
                        id = Some(context);
                    }
                }
                NBD_REP_ACK => return Ok(id),
                error if error & NBD_REP_FLAG_ERROR != 0 => {
                    // The protocol says to disregard contexts sent before an error.
                    tracing::debug!(
                        "{}: no base:allocation: {} {}",
                        self.address,
                        reply_name(error),
                        String::from_utf8_lossy(&payload)
                    );
                    return Ok(None);
                }
                other => return Err(self.unexpected(NBD_OPT_SET_META_CONTEXT, other)),
            }
        }
    }

    /// NBD_OPT_GO. `Ok(false)` when the server does not know GO.
    fn go(&mut self, export: &str, details: &mut ExportDetails) -> Result<bool, ClientError> {
        self.send(&ClientOption::Go {
            name: export.to_string(),
            requests: vec![NBD_INFO_BLOCK_SIZE, NBD_INFO_NAME, NBD_INFO_DESCRIPTION],
        })?;
        let mut export_info = false;
        loop {
            let (reply, payload) = self.reply(NBD_OPT_GO)?;
            match reply {
                NBD_REP_INFO => {
                    let info = InfoReply::decode(&payload)
                        .map_err(|e| self.protocol(format!("NBD_REP_INFO: {e}")))?;
                    match info {
                        InfoReply::Export { size, flags } => {
                            details.size = size;
                            details.flags = checked_flags(flags);
                            export_info = true;
                        }
                        InfoReply::Name(name) => details.name = name,
                        InfoReply::Description(text) => details.description = Some(text),
                        InfoReply::BlockSize {
                            minimum,
                            preferred,
                            maximum,
                        } => {
                            if !minimum.is_power_of_two() || minimum > 65536 {
                                return Err(self.protocol(format!(
                                    "minimum block size {minimum} is not a power of two up to 64 KiB"
                                )));
                            }
                            details.advertised_block_sizes = Some(BlockSizes {
                                minimum,
                                preferred,
                                maximum,
                            });
                        }
                        // The protocol asks clients to ignore what they do not know.
                        InfoReply::Unknown(_) => {}
                    }
                }
                NBD_REP_ACK if export_info => return Ok(true),
                NBD_REP_ACK => {
                    return Err(self.protocol("NBD_OPT_GO succeeded without NBD_INFO_EXPORT"))
                }
                NBD_REP_ERR_UNSUP => return Ok(false),
                error if error & NBD_REP_FLAG_ERROR != 0 => {
                    return Err(self.refused(format!("export '{export}'"), error, &payload))
                }
                other => return Err(self.unexpected(NBD_OPT_GO, other)),
            }
        }
    }

    /// NBD_OPT_EXPORT_NAME: the server answers with size and flags, or hangs up when
    /// it will not serve the export.
    fn export_name(
        &mut self,
        export: &str,
        no_zeroes: bool,
        details: &mut ExportDetails,
    ) -> Result<(), ClientError> {
        self.send(&ClientOption::ExportName(export.to_string()))?;
        let mut reply = [0u8; 10];
        self.stream.read_exact(&mut reply).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                ClientError::Closed {
                    address: self.address.to_string(),
                    context: format!(
                        " after NBD_OPT_EXPORT_NAME: it does not serve export '{export}'"
                    ),
                }
            } else {
                self.io_error(e)
            }
        })?;
        if !no_zeroes {
            let mut zeroes = [0u8; 124];
            self.read_exact(&mut zeroes)?;
        }
        details.size = u64::from_be_bytes(reply[..8].try_into().unwrap());
        details.flags = checked_flags(u16::from_be_bytes([reply[8], reply[9]]));
        details.used_go = false;
        Ok(())
    }
}

/// Transmission flags without NBD_FLAG_HAS_FLAGS carry no meaning (proto.md,
/// "Transmission flags"); treat them as "nothing advertised".
fn checked_flags(flags: u16) -> u16 {
    if flags & NBD_FLAG_HAS_FLAGS == 0 {
        0
    } else {
        flags
    }
}

/// Negotiates `export` on a fresh connection and leaves it in transmission.
#[cfg(test)]
pub(crate) fn negotiate<S: Read + Write>(
    stream: &mut S,
    address: &str,
    export: &str,
    wanted: Wanted,
) -> Result<ExportDetails, ClientError> {
    negotiate_secure(stream, address, export, wanted, None)
}

/// Negotiates `export` on a fresh connection and leaves it in transmission; with
/// `starttls`, inside TLS (NBD_OPT_STARTTLS first).
pub(crate) fn negotiate_secure<S: Read + Write>(
    stream: &mut S,
    address: &str,
    export: &str,
    wanted: Wanted,
    starttls: Option<StartTls<'_, S>>,
) -> Result<ExportDetails, ClientError> {
    let mut haggle = Haggle {
        stream,
        address,
        handshake_flags: 0,
        last_option: "the greeting",
    };
    let handshake_flags = haggle.greeting()?;
    haggle.client_flags(handshake_flags)?;
    if let Some(upgrade) = starttls {
        haggle.start_tls(upgrade)?;
    }
    let no_zeroes = handshake_flags & NBD_FLAG_NO_ZEROES != 0;
    let mut details = ExportDetails {
        name: export.to_string(),
        description: None,
        size: 0,
        flags: 0,
        advertised_block_sizes: None,
        structured: false,
        extended_headers: false,
        contexts: Vec::new(),
        used_go: true,
        handshake_flags,
        base_allocation_id: None,
    };
    if handshake_flags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        // Plain newstyle: NBD_OPT_EXPORT_NAME is the only option there is.
        haggle.export_name(export, no_zeroes, &mut details)?;
        return Ok(details);
    }
    if wanted.extended {
        details.extended_headers = haggle.extended_headers()?;
        details.structured = details.extended_headers;
    }
    if wanted.structured && !details.extended_headers {
        details.structured = haggle.structured_reply()?;
    }
    if details.structured && wanted.base_allocation {
        details.base_allocation_id = haggle.base_allocation(export)?;
        if details.base_allocation_id.is_some() {
            details.contexts.push(BASE_ALLOCATION.to_string());
        }
    }
    if !haggle.go(export, &mut details)? {
        if details.extended_headers {
            // proto.md: a server that acknowledged extended headers MUST NOT fail
            // GO with NBD_REP_ERR_UNSUP, and EXPORT_NAME is off limits now.
            return Err(haggle.protocol(
                "NBD_OPT_GO refused as unsupported after extended headers were acknowledged",
            ));
        }
        tracing::debug!("{address} does not know NBD_OPT_GO; using NBD_OPT_EXPORT_NAME");
        haggle.export_name(export, no_zeroes, &mut details)?;
    }
    Ok(details)
}

/// Lists the server's exports (name, description) with NBD_OPT_LIST, then ends
/// with NBD_OPT_ABORT.
pub(crate) fn list<S: Read + Write>(
    stream: &mut S,
    address: &str,
    starttls: Option<StartTls<'_, S>>,
) -> Result<Vec<(String, String)>, ClientError> {
    let mut haggle = Haggle {
        stream,
        address,
        handshake_flags: 0,
        last_option: "the greeting",
    };
    let handshake_flags = haggle.greeting()?;
    haggle.client_flags(handshake_flags)?;
    if handshake_flags & NBD_FLAG_FIXED_NEWSTYLE == 0 {
        return Err(ClientError::Unsupported {
            address: address.to_string(),
            what: "listing exports".into(),
        });
    }
    if let Some(upgrade) = starttls {
        haggle.start_tls(upgrade)?;
    }
    haggle.send(&ClientOption::List)?;
    let mut exports = Vec::new();
    loop {
        let (reply, payload) = haggle.reply(NBD_OPT_LIST)?;
        match reply {
            NBD_REP_SERVER => {
                let entry = decode_rep_server(&payload)
                    .map_err(|e| haggle.protocol(format!("NBD_REP_SERVER: {e}")))?;
                exports.push(entry);
            }
            NBD_REP_ACK => break,
            error if error & NBD_REP_FLAG_ERROR != 0 => {
                return Err(haggle.refused("to list exports".into(), error, &payload))
            }
            other => return Err(haggle.unexpected(NBD_OPT_LIST, other)),
        }
    }
    haggle.abort();
    Ok(exports)
}

#[cfg(test)]
#[path = "handshake_tests.rs"]
mod tests;
