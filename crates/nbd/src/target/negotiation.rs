//! The fixed newstyle handshake as a state machine without I/O: option requests in,
//! option replies out, and at the end either a closed connection or a [`Session`].

use std::sync::Arc;

use blockwire_blockdev::DeviceInfo;

use super::export::{Export, ExportSet};
use super::session::Session;
use crate::wire::*;

/// The metadata context ID we hand out for `base:allocation`.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Why a handshake cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error(
        "client does not speak fixed newstyle (client flags {0:#x}); only fixed newstyle is served"
    )]
    NotFixedNewstyle(u32),
    #[error("client sent unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
}

/// What the connection does after an option.
#[derive(Debug)]
pub enum Step {
    /// Read the next option.
    Continue,
    /// Close the connection (after sending what was produced).
    Close,
    /// Enter the transmission phase.
    Transmission(Session),
    /// Run the TLS handshake (after sending the NBD_REP_ACK produced), then go on
    /// reading options inside TLS ([`Negotiation::tls_started`]).
    StartTls,
}

/// Where a connection stands with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TlsState {
    /// Not offered: NBD_OPT_STARTTLS is unsupported.
    Unavailable,
    /// Offered; `required` refuses every other option until it is up.
    Offered { required: bool },
    /// Negotiated: everything since travels inside TLS.
    Active,
}

/// Negotiation state for one connection.
pub struct Negotiation {
    exports: Arc<ExportSet>,
    no_zeroes: bool,
    structured: bool,
    /// NBD_OPT_EXTENDED_HEADERS was acknowledged; it takes precedence over
    /// structured replies.
    extended: bool,
    /// The export the last SET_META_CONTEXT named, if it selected base:allocation.
    base_allocation_for: Option<Arc<Export>>,
    tls: TlsState,
}

/// The transmission flags for a device, given what was negotiated.
///
/// `chunked`: structured replies or extended headers were negotiated (DF is only
/// meaningful then). NBD_FLAG_BLOCK_STATUS_PAYLOAD is never set: we do not serve the
/// payload form of NBD_CMD_BLOCK_STATUS, one context being all we have.
pub fn transmission_flags(info: &DeviceInfo, chunked: bool) -> u16 {
    let caps = &info.capabilities;
    let mut flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_CACHE;
    let mut set = |condition: bool, flag: u16| {
        if condition {
            flags |= flag;
        }
    };
    set(info.read_only, NBD_FLAG_READ_ONLY);
    set(caps.flush.available(), NBD_FLAG_SEND_FLUSH);
    set(caps.fua.available(), NBD_FLAG_SEND_FUA);
    set(info.rotational, NBD_FLAG_ROTATIONAL);
    set(caps.trim.available(), NBD_FLAG_SEND_TRIM);
    set(caps.write_zeroes.available(), NBD_FLAG_SEND_WRITE_ZEROES);
    set(
        caps.write_zeroes.available() && caps.fast_zero.available(),
        NBD_FLAG_SEND_FAST_ZERO,
    );
    set(chunked, NBD_FLAG_SEND_DF);
    set(info.consistent_across_handles, NBD_FLAG_CAN_MULTI_CONN);
    flags
}

impl Negotiation {
    /// Starts a negotiation after the client sent its flags.
    pub fn start(
        exports: Arc<ExportSet>,
        client_flags: u32,
    ) -> Result<Negotiation, HandshakeError> {
        if client_flags & NBD_FLAG_C_FIXED_NEWSTYLE == 0 {
            return Err(HandshakeError::NotFixedNewstyle(client_flags));
        }
        if client_flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0 {
            return Err(HandshakeError::UnknownClientFlags(client_flags));
        }
        Ok(Negotiation {
            exports,
            no_zeroes: client_flags & NBD_FLAG_C_NO_ZEROES != 0,
            structured: false,
            extended: false,
            base_allocation_for: None,
            tls: TlsState::Unavailable,
        })
    }

    /// Offers NBD_OPT_STARTTLS; with `required`, every option but STARTTLS and
    /// ABORT is refused with NBD_REP_ERR_TLS_REQD until TLS is up.
    pub fn offer_tls(&mut self, required: bool) {
        self.tls = TlsState::Offered { required };
    }

    /// The TLS handshake succeeded: options from now on arrive inside TLS.
    pub fn tls_started(&mut self) {
        self.tls = TlsState::Active;
    }

    /// Whether TLS is up.
    pub fn tls_active(&self) -> bool {
        self.tls == TlsState::Active
    }

    /// FORCEDTLS (proto.md): refuses `option` before TLS; `None` lets it through.
    fn refuse_before_tls(&self, option: u32, out: &mut Vec<u8>) -> Option<Step> {
        if self.tls != (TlsState::Offered { required: true })
            || matches!(option, NBD_OPT_STARTTLS | NBD_OPT_ABORT)
        {
            return None;
        }
        if option == NBD_OPT_EXPORT_NAME {
            // It has no error reply: the only refusal is to close.
            tracing::warn!("client asked for an export before TLS (NBD_OPT_EXPORT_NAME); closing");
            return Some(Step::Close);
        }
        let message = b"TLS is required: send NBD_OPT_STARTTLS first";
        encode_option_reply(out, option, NBD_REP_ERR_TLS_REQD, message);
        Some(Step::Continue)
    }

    fn start_tls(&mut self, out: &mut Vec<u8>) -> Step {
        match self.tls {
            TlsState::Unavailable => {
                let message = b"TLS is not enabled on this server";
                encode_option_reply(out, NBD_OPT_STARTTLS, NBD_REP_ERR_UNSUP, message);
                Step::Continue
            }
            TlsState::Active => {
                let message = b"TLS is already running";
                encode_option_reply(out, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID, message);
                Step::Continue
            }
            TlsState::Offered { .. } => {
                // What was haggled in plain text may have been tampered with; the
                // client negotiates again inside TLS.
                self.structured = false;
                self.extended = false;
                self.base_allocation_for = None;
                encode_option_reply(out, NBD_OPT_STARTTLS, NBD_REP_ACK, &[]);
                Step::StartTls
            }
        }
    }

    /// Handles one option request, appending the replies to `out`.
    pub fn handle(&mut self, option: u32, data: &[u8], out: &mut Vec<u8>) -> Step {
        if let Some(step) = self.refuse_before_tls(option, out) {
            return step;
        }
        let parsed = match ClientOption::parse(option, data) {
            Ok(parsed) => parsed,
            Err(e) if option == NBD_OPT_EXPORT_NAME => {
                tracing::warn!("NBD_OPT_EXPORT_NAME rejected: {e}");
                return Step::Close;
            }
            Err(e) => {
                encode_option_reply(out, option, NBD_REP_ERR_INVALID, e.to_string().as_bytes());
                return Step::Continue;
            }
        };
        match parsed {
            ClientOption::ExportName(_) if self.extended => {
                // proto.md: a client that negotiated extended headers MUST NOT use
                // NBD_OPT_EXPORT_NAME, whose answer cannot carry an error.
                tracing::warn!("NBD_OPT_EXPORT_NAME after extended headers; closing");
                Step::Close
            }
            ClientOption::ExportName(name) => self.export_name(&name, out),
            ClientOption::Abort => {
                encode_option_reply(out, option, NBD_REP_ACK, &[]);
                Step::Close
            }
            ClientOption::List => {
                for export in self.exports.iter() {
                    let payload = rep_server_payload(&export.name, &export.description);
                    encode_option_reply(out, option, NBD_REP_SERVER, &payload);
                }
                encode_option_reply(out, option, NBD_REP_ACK, &[]);
                Step::Continue
            }
            ClientOption::StartTls => self.start_tls(out),
            ClientOption::StructuredReply if self.extended => {
                // Extended headers stay; the protocol's answer to a downgrade.
                let message = b"extended headers are already in use";
                encode_option_reply(out, option, NBD_REP_ERR_EXT_HEADER_REQD, message);
                Step::Continue
            }
            ClientOption::StructuredReply => {
                self.structured = true;
                encode_option_reply(out, option, NBD_REP_ACK, &[]);
                Step::Continue
            }
            ClientOption::ExtendedHeaders => {
                self.extended = true;
                encode_option_reply(out, option, NBD_REP_ACK, &[]);
                Step::Continue
            }
            ClientOption::Info { name, requests } => {
                self.info_or_go(option, &name, &requests, out);
                Step::Continue
            }
            ClientOption::Go { name, requests } => {
                match self.info_or_go(option, &name, &requests, out) {
                    Some(export) => {
                        let mut session = self.session(export);
                        // Asking for the block sizes is the client's promise to keep
                        // to them (proto.md, "Size constraints").
                        session.set_sizes_negotiated(requests.contains(&NBD_INFO_BLOCK_SIZE));
                        Step::Transmission(session)
                    }
                    None => Step::Continue,
                }
            }
            ClientOption::ListMetaContext { name, queries } => {
                self.meta_context(option, &name, &queries, false, out);
                Step::Continue
            }
            ClientOption::SetMetaContext { name, queries } => {
                self.base_allocation_for = None;
                self.meta_context(option, &name, &queries, true, out);
                Step::Continue
            }
            ClientOption::Unknown(code) => {
                let message = format!("option {code} is not supported");
                encode_option_reply(out, code, NBD_REP_ERR_UNSUP, message.as_bytes());
                Step::Continue
            }
        }
    }

    /// How transmission will be framed, as negotiated so far.
    fn framing(&self) -> Framing {
        if self.extended {
            Framing::Extended
        } else if self.structured {
            Framing::Structured
        } else {
            Framing::Simple
        }
    }

    fn session(&self, export: Arc<Export>) -> Session {
        let base_allocation = self
            .base_allocation_for
            .as_ref()
            .is_some_and(|selected| Arc::ptr_eq(selected, &export))
            .then_some(BASE_ALLOCATION_ID);
        let framing = self.framing();
        let flags = transmission_flags(export.device.info(), framing.chunked());
        Session::new(export, framing, base_allocation, flags)
    }

    fn export_name(&self, name: &str, out: &mut Vec<u8>) -> Step {
        let Some(export) = self.exports.find(name).cloned() else {
            tracing::warn!("client asked for unknown export '{name}' (NBD_OPT_EXPORT_NAME)");
            return Step::Close;
        };
        let mut session = self.session(export.clone());
        // NBD_OPT_EXPORT_NAME has no way to learn block sizes.
        session.set_sizes_negotiated(false);
        encode_export_name_reply(out, export.device.size(), session.flags(), self.no_zeroes);
        Step::Transmission(session)
    }

    /// Answers INFO or GO; returns the export when the answer was a success.
    fn info_or_go(
        &self,
        option: u32,
        name: &str,
        requests: &[u16],
        out: &mut Vec<u8>,
    ) -> Option<Arc<Export>> {
        let Some(export) = self.exports.find(name).cloned() else {
            let message = format!("export '{name}' does not exist");
            encode_option_reply(out, option, NBD_REP_ERR_UNKNOWN, message.as_bytes());
            return None;
        };
        let info = export.device.info();
        let flags = transmission_flags(info, self.framing().chunked());
        encode_option_reply(
            out,
            option,
            NBD_REP_INFO,
            &info_export_payload(info.size, flags),
        );
        let sizes = info.block_sizes;
        let block_payload = info_block_size_payload(sizes.minimum, sizes.preferred, sizes.maximum);
        encode_option_reply(out, option, NBD_REP_INFO, &block_payload);
        if requests.contains(&NBD_INFO_NAME) {
            let payload = info_string_payload(NBD_INFO_NAME, &export.name);
            encode_option_reply(out, option, NBD_REP_INFO, &payload);
        }
        if requests.contains(&NBD_INFO_DESCRIPTION) && !export.description.is_empty() {
            let payload = info_string_payload(NBD_INFO_DESCRIPTION, &export.description);
            encode_option_reply(out, option, NBD_REP_INFO, &payload);
        }
        // A client that ignores block sizes would send requests we must refuse; the
        // protocol lets us insist it asks when our minimum is above one byte.
        if option == NBD_OPT_GO && sizes.minimum > 1 && !requests.contains(&NBD_INFO_BLOCK_SIZE) {
            let message = format!("this export needs {}-byte aligned requests", sizes.minimum);
            encode_option_reply(out, option, NBD_REP_ERR_BLOCK_SIZE_REQD, message.as_bytes());
            return None;
        }
        encode_option_reply(out, option, NBD_REP_ACK, &[]);
        Some(export)
    }

    fn meta_context(
        &mut self,
        option: u32,
        name: &str,
        queries: &[String],
        select: bool,
        out: &mut Vec<u8>,
    ) {
        if !self.framing().chunked() {
            let message = b"negotiate structured replies or extended headers first";
            encode_option_reply(out, option, NBD_REP_ERR_INVALID, message);
            return;
        }
        let Some(export) = self.exports.find(name).cloned() else {
            let message = format!("export '{name}' does not exist");
            encode_option_reply(out, option, NBD_REP_ERR_UNKNOWN, message.as_bytes());
            return;
        };
        let matches = |query: &str| {
            if select {
                query == BASE_ALLOCATION
            } else {
                // Listing accepts the namespace alone as a wildcard.
                query == BASE_ALLOCATION || query == "base:"
            }
        };
        let wanted = if queries.is_empty() {
            !select
        } else {
            queries.iter().any(|q| matches(q))
        };
        if wanted {
            let id = if select { BASE_ALLOCATION_ID } else { 0 };
            let payload = rep_meta_context_payload(id, BASE_ALLOCATION);
            encode_option_reply(out, option, NBD_REP_META_CONTEXT, &payload);
            if select {
                self.base_allocation_for = Some(export);
            }
        }
        encode_option_reply(out, option, NBD_REP_ACK, &[]);
    }
}

#[cfg(test)]
#[path = "negotiation_tests.rs"]
mod tests;
