//! The NBD wire format, without I/O.
//!
//! Constants keep the names of the protocol document. Decoders take byte slices and
//! either return a message, report that more bytes are needed, or reject the input
//! with a [`WireError`]; encoders append to a `Vec<u8>`. Integers are big-endian.

use thiserror::Error;

// Handshake magics.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253; // oldstyle greeting
pub const NBD_OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

// Handshake flags (server) and client flags.
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_LIST: u32 = 3;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_INFO: u32 = 6;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_SERVER: u32 = 2;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;
pub const NBD_REP_ERR_EXT_HEADER_REQD: u32 = NBD_REP_FLAG_ERROR | 10;

// Information types for NBD_OPT_INFO / NBD_OPT_GO.
pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_NAME: u16 = 1;
pub const NBD_INFO_DESCRIPTION: u16 = 2;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;
pub const NBD_FLAG_BLOCK_STATUS_PAYLOAD: u16 = 1 << 12;

// Transmission magics.
pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const NBD_EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
pub const NBD_EXTENDED_REPLY_MAGIC: u32 = 0x6e8a_278c;

// Commands.
pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_CACHE: u16 = 5;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const NBD_CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// Structured reply flags and types.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const NBD_REPLY_TYPE_BLOCK_STATUS_EXT: u16 = 6;
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

// Error values.
pub const NBD_EPERM: u32 = 1;
pub const NBD_EIO: u32 = 5;
pub const NBD_ENOMEM: u32 = 12;
pub const NBD_EINVAL: u32 = 22;
pub const NBD_ENOSPC: u32 = 28;
pub const NBD_EOVERFLOW: u32 = 75;
pub const NBD_ENOTSUP: u32 = 95;
pub const NBD_ESHUTDOWN: u32 = 108;

// `base:allocation` status flags.
pub const NBD_STATE_HOLE: u32 = 1 << 0;
pub const NBD_STATE_ZERO: u32 = 1 << 1;

/// The one metadata context we serve.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// Longest string (export name, description, query, message) the protocol allows.
pub const MAX_STRING: usize = 4096;

/// Size of the server greeting: NBDMAGIC, IHAVEOPT, handshake flags.
pub const GREETING_LEN: usize = 18;
/// Size of an option request header: IHAVEOPT, option, length.
pub const OPTION_HEADER_LEN: usize = 16;
/// Size of an option reply header: magic, option, type, length.
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
/// Size of a compact transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Size of an extended transmission request header (NBD_OPT_EXTENDED_HEADERS).
pub const EXTENDED_REQUEST_LEN: usize = 32;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Size of a structured reply chunk header.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Size of an extended reply chunk header (NBD_OPT_EXTENDED_HEADERS).
pub const EXTENDED_REPLY_LEN: usize = 32;

/// Input that is not valid NBD.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("bad magic {found:#x} (expected {expected:#x})")]
    BadMagic { expected: u64, found: u64 },
    #[error("option {option} data is malformed: {reason}")]
    MalformedOption { option: u32, reason: &'static str },
    #[error("string is not valid UTF-8 or too long")]
    BadString,
    #[error("message is malformed: {0}")]
    Malformed(&'static str),
}

/// A cursor over a byte slice that reads big-endian integers and refuses to run past
/// the end.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes }
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_be_bytes(b.try_into().unwrap()))
    }

    fn remaining(&self) -> usize {
        self.bytes.len()
    }
}

fn string(bytes: &[u8]) -> Result<String, WireError> {
    if bytes.len() > MAX_STRING || bytes.contains(&0) {
        return Err(WireError::BadString);
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| WireError::BadString)
}

// ---------------------------------------------------------------- handshake

/// Appends the fixed newstyle greeting.
pub fn encode_greeting(out: &mut Vec<u8>, handshake_flags: u16) {
    out.extend_from_slice(&NBDMAGIC.to_be_bytes());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&handshake_flags.to_be_bytes());
}

/// Decodes the server greeting (client side); returns the handshake flags.
pub fn decode_greeting(bytes: &[u8; GREETING_LEN]) -> Result<u16, WireError> {
    let mut r = Reader::new(bytes);
    let magic = r.u64().unwrap();
    if magic != NBDMAGIC {
        return Err(WireError::BadMagic {
            expected: NBDMAGIC,
            found: magic,
        });
    }
    let second = r.u64().unwrap();
    if second != IHAVEOPT {
        // CLISERV_MAGIC here means an oldstyle server.
        return Err(WireError::BadMagic {
            expected: IHAVEOPT,
            found: second,
        });
    }
    Ok(r.u16().unwrap())
}

/// An option request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    pub fn decode(bytes: &[u8; OPTION_HEADER_LEN]) -> Result<OptionHeader, WireError> {
        let mut r = Reader::new(bytes);
        let magic = r.u64().unwrap();
        if magic != IHAVEOPT {
            return Err(WireError::BadMagic {
                expected: IHAVEOPT,
                found: magic,
            });
        }
        Ok(OptionHeader {
            option: r.u32().unwrap(),
            len: r.u32().unwrap(),
        })
    }

    /// Appends a whole option request: header and `data`.
    pub fn encode(out: &mut Vec<u8>, option: u32, data: &[u8]) {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
    }
}

/// An option request from a client, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(String),
    Abort,
    List,
    StartTls,
    Info {
        name: String,
        requests: Vec<u16>,
    },
    Go {
        name: String,
        requests: Vec<u16>,
    },
    StructuredReply,
    ExtendedHeaders,
    ListMetaContext {
        name: String,
        queries: Vec<String>,
    },
    SetMetaContext {
        name: String,
        queries: Vec<String>,
    },
    /// An option this codec does not know; answered with NBD_REP_ERR_UNSUP.
    Unknown(u32),
}

impl ClientOption {
    /// Parses the data of option `option`. Options that must carry no data but do
    /// are reported as malformed (the server answers NBD_REP_ERR_INVALID).
    pub fn parse(option: u32, data: &[u8]) -> Result<ClientOption, WireError> {
        let malformed = |reason| WireError::MalformedOption { option, reason };
        let no_data = |value: ClientOption| {
            if data.is_empty() {
                Ok(value)
            } else {
                Err(malformed("unexpected data"))
            }
        };
        match option {
            NBD_OPT_EXPORT_NAME => Ok(ClientOption::ExportName(string(data)?)),
            // The spec asks servers to ignore data sent with ABORT.
            NBD_OPT_ABORT => Ok(ClientOption::Abort),
            NBD_OPT_LIST => no_data(ClientOption::List),
            NBD_OPT_STARTTLS => no_data(ClientOption::StartTls),
            NBD_OPT_STRUCTURED_REPLY => no_data(ClientOption::StructuredReply),
            NBD_OPT_EXTENDED_HEADERS => no_data(ClientOption::ExtendedHeaders),
            NBD_OPT_INFO | NBD_OPT_GO => {
                let mut r = Reader::new(data);
                let name_len = r.u32().ok_or(malformed("too short"))? as usize;
                let name = string(r.take(name_len).ok_or(malformed("name runs past data"))?)?;
                let count = r.u16().ok_or(malformed("missing request count"))? as usize;
                if r.remaining() != count * 2 {
                    return Err(malformed("request count does not match length"));
                }
                let requests = (0..count).map(|_| r.u16().unwrap()).collect();
                Ok(if option == NBD_OPT_GO {
                    ClientOption::Go { name, requests }
                } else {
                    ClientOption::Info { name, requests }
                })
            }
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
                let mut r = Reader::new(data);
                let name_len = r.u32().ok_or(malformed("too short"))? as usize;
                let name = string(r.take(name_len).ok_or(malformed("name runs past data"))?)?;
                let count = r.u32().ok_or(malformed("missing query count"))?;
                let mut queries = Vec::new();
                for _ in 0..count {
                    let len = r.u32().ok_or(malformed("query count exceeds data"))? as usize;
                    let query = r.take(len).ok_or(malformed("query runs past data"))?;
                    queries.push(string(query)?);
                }
                if r.remaining() != 0 {
                    return Err(malformed("trailing bytes"));
                }
                Ok(if option == NBD_OPT_SET_META_CONTEXT {
                    ClientOption::SetMetaContext { name, queries }
                } else {
                    ClientOption::ListMetaContext { name, queries }
                })
            }
            other => Ok(ClientOption::Unknown(other)),
        }
    }

    /// Appends this option as a client sends it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut data = Vec::new();
        let code = match self {
            ClientOption::ExportName(name) => {
                data.extend_from_slice(name.as_bytes());
                NBD_OPT_EXPORT_NAME
            }
            ClientOption::Abort => NBD_OPT_ABORT,
            ClientOption::List => NBD_OPT_LIST,
            ClientOption::StartTls => NBD_OPT_STARTTLS,
            ClientOption::StructuredReply => NBD_OPT_STRUCTURED_REPLY,
            ClientOption::ExtendedHeaders => NBD_OPT_EXTENDED_HEADERS,
            ClientOption::Info { name, requests } | ClientOption::Go { name, requests } => {
                data.extend_from_slice(&(name.len() as u32).to_be_bytes());
                data.extend_from_slice(name.as_bytes());
                data.extend_from_slice(&(requests.len() as u16).to_be_bytes());
                for request in requests {
                    data.extend_from_slice(&request.to_be_bytes());
                }
                if matches!(self, ClientOption::Go { .. }) {
                    NBD_OPT_GO
                } else {
                    NBD_OPT_INFO
                }
            }
            ClientOption::ListMetaContext { name, queries }
            | ClientOption::SetMetaContext { name, queries } => {
                data.extend_from_slice(&(name.len() as u32).to_be_bytes());
                data.extend_from_slice(name.as_bytes());
                data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
                for query in queries {
                    data.extend_from_slice(&(query.len() as u32).to_be_bytes());
                    data.extend_from_slice(query.as_bytes());
                }
                if matches!(self, ClientOption::SetMetaContext { .. }) {
                    NBD_OPT_SET_META_CONTEXT
                } else {
                    NBD_OPT_LIST_META_CONTEXT
                }
            }
            ClientOption::Unknown(code) => *code,
        };
        OptionHeader::encode(out, code, &data);
    }
}

/// Appends an option reply: header and payload.
pub fn encode_option_reply(out: &mut Vec<u8>, option: u32, reply: u32, payload: &[u8]) {
    out.extend_from_slice(&NBD_OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// An option reply header (client side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply: u32,
    pub len: u32,
}

impl OptionReplyHeader {
    pub fn decode(bytes: &[u8; OPTION_REPLY_HEADER_LEN]) -> Result<Self, WireError> {
        let mut r = Reader::new(bytes);
        let magic = r.u64().unwrap();
        if magic != NBD_OPT_REPLY_MAGIC {
            return Err(WireError::BadMagic {
                expected: NBD_OPT_REPLY_MAGIC,
                found: magic,
            });
        }
        Ok(OptionReplyHeader {
            option: r.u32().unwrap(),
            reply: r.u32().unwrap(),
            len: r.u32().unwrap(),
        })
    }
}

/// Payload of NBD_REP_SERVER: an export name and its description.
pub fn rep_server_payload(name: &str, description: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len() + description.len());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.as_bytes());
    out
}

/// Payload of NBD_REP_META_CONTEXT.
pub fn rep_meta_context_payload(id: u32, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// Decodes an NBD_REP_SERVER payload (client side): the export name and the free
/// text after it (a description "suitable for direct display", so decoded lossily).
pub fn decode_rep_server(payload: &[u8]) -> Result<(String, String), WireError> {
    let mut r = Reader::new(payload);
    let malformed = WireError::Malformed("NBD_REP_SERVER name runs past the payload");
    let len = r.u32().ok_or(malformed.clone())? as usize;
    let name = string(r.take(len).ok_or(malformed)?)?;
    let description = String::from_utf8_lossy(r.take(r.remaining()).unwrap()).into_owned();
    Ok((name, description))
}

/// Decodes an NBD_REP_META_CONTEXT payload (client side): context id and name.
pub fn decode_rep_meta_context(payload: &[u8]) -> Result<(u32, String), WireError> {
    let mut r = Reader::new(payload);
    let id = r
        .u32()
        .ok_or(WireError::Malformed("NBD_REP_META_CONTEXT too short"))?;
    Ok((id, string(r.take(r.remaining()).unwrap())?))
}

/// Payload of NBD_REP_INFO / NBD_INFO_EXPORT.
pub fn info_export_payload(size: u64, transmission_flags: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    out
}

/// Payload of NBD_REP_INFO / NBD_INFO_NAME or NBD_INFO_DESCRIPTION.
pub fn info_string_payload(info: u16, text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + text.len());
    out.extend_from_slice(&info.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// Payload of NBD_REP_INFO / NBD_INFO_BLOCK_SIZE.
pub fn info_block_size_payload(minimum: u32, preferred: u32, maximum: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(14);
    out.extend_from_slice(&NBD_INFO_BLOCK_SIZE.to_be_bytes());
    out.extend_from_slice(&minimum.to_be_bytes());
    out.extend_from_slice(&preferred.to_be_bytes());
    out.extend_from_slice(&maximum.to_be_bytes());
    out
}

/// What an NBD_REP_INFO payload says (client side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InfoReply {
    Export {
        size: u64,
        flags: u16,
    },
    Name(String),
    Description(String),
    BlockSize {
        minimum: u32,
        preferred: u32,
        maximum: u32,
    },
    Unknown(u16),
}

impl InfoReply {
    pub fn decode(payload: &[u8]) -> Result<InfoReply, WireError> {
        let mut r = Reader::new(payload);
        let short = WireError::Malformed("NBD_REP_INFO too short");
        let info = r.u16().ok_or(short.clone())?;
        Ok(match info {
            NBD_INFO_EXPORT if r.remaining() == 10 => InfoReply::Export {
                size: r.u64().unwrap(),
                flags: r.u16().unwrap(),
            },
            NBD_INFO_NAME => InfoReply::Name(string(r.take(r.remaining()).unwrap())?),
            NBD_INFO_DESCRIPTION => InfoReply::Description(string(r.take(r.remaining()).unwrap())?),
            NBD_INFO_BLOCK_SIZE if r.remaining() == 12 => InfoReply::BlockSize {
                minimum: r.u32().unwrap(),
                preferred: r.u32().unwrap(),
                maximum: r.u32().unwrap(),
            },
            NBD_INFO_EXPORT | NBD_INFO_BLOCK_SIZE => return Err(short),
            other => InfoReply::Unknown(other),
        })
    }
}

/// The reply to NBD_OPT_EXPORT_NAME: size, flags and (unless the client negotiated
/// NO_ZEROES) 124 bytes of zeroes.
pub fn encode_export_name_reply(out: &mut Vec<u8>, size: u64, flags: u16, no_zeroes: bool) {
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        out.extend_from_slice(&[0u8; 124]);
    }
}

// ------------------------------------------------------------- transmission

/// How transmission messages are framed on a connection, as negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Framing {
    /// Neither structured replies nor extended headers: compact requests, simple
    /// replies.
    #[default]
    Simple,
    /// NBD_OPT_STRUCTURED_REPLY: compact requests, 20-byte reply chunks (simple
    /// replies still allowed where there is no payload).
    Structured,
    /// NBD_OPT_EXTENDED_HEADERS: 32-byte requests with 64-bit lengths, and 32-byte
    /// reply chunks for every reply (proto.md, extension-ext-header).
    Extended,
}

impl Framing {
    /// Whether replies come as chunks (structured or extended).
    pub fn chunked(self) -> bool {
        self != Framing::Simple
    }

    /// Size of a request header.
    pub fn request_len(self) -> usize {
        match self {
            Framing::Extended => EXTENDED_REQUEST_LEN,
            _ => REQUEST_LEN,
        }
    }
}

/// A transmission request header. `len` is the 32-bit length of a compact header or
/// the 64-bit one of an extended header: a payload length when the request carries
/// a payload (NBD_CMD_WRITE; with extended headers, any request with
/// NBD_CMD_FLAG_PAYLOAD_LEN), else an effect length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u64,
}

impl Request {
    /// Decodes a compact request header.
    pub fn decode(bytes: &[u8; REQUEST_LEN]) -> Result<Request, WireError> {
        let mut r = Reader::new(bytes);
        let magic = r.u32().unwrap();
        if magic != NBD_REQUEST_MAGIC {
            return Err(WireError::BadMagic {
                expected: NBD_REQUEST_MAGIC.into(),
                found: magic.into(),
            });
        }
        Ok(Request {
            flags: r.u16().unwrap(),
            command: r.u16().unwrap(),
            cookie: r.u64().unwrap(),
            offset: r.u64().unwrap(),
            len: r.u32().unwrap().into(),
        })
    }

    /// Decodes an extended request header.
    pub fn decode_extended(bytes: &[u8; EXTENDED_REQUEST_LEN]) -> Result<Request, WireError> {
        let mut r = Reader::new(bytes);
        let magic = r.u32().unwrap();
        if magic != NBD_EXTENDED_REQUEST_MAGIC {
            return Err(WireError::BadMagic {
                expected: NBD_EXTENDED_REQUEST_MAGIC.into(),
                found: magic.into(),
            });
        }
        Ok(Request {
            flags: r.u16().unwrap(),
            command: r.u16().unwrap(),
            cookie: r.u64().unwrap(),
            offset: r.u64().unwrap(),
            len: r.u64().unwrap(),
        })
    }

    /// Decodes a request header framed as `framing` says; `bytes` must hold exactly
    /// [`Framing::request_len`] bytes.
    pub fn decode_framed(framing: Framing, bytes: &[u8]) -> Result<Request, WireError> {
        let short = WireError::Malformed("request header of the wrong size");
        match framing {
            Framing::Extended => Request::decode_extended(bytes.try_into().map_err(|_| short)?),
            _ => Request::decode(bytes.try_into().map_err(|_| short)?),
        }
    }

    /// Appends a compact request header. A compact header has 32 bits of length;
    /// callers keep `len` within them (a larger one would be cut).
    pub fn encode(&self, out: &mut Vec<u8>) {
        debug_assert!(
            self.len <= u64::from(u32::MAX),
            "compact request of {} bytes",
            self.len
        );
        out.extend_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.command.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&(self.len as u32).to_be_bytes());
    }

    /// Appends an extended request header.
    pub fn encode_extended(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&NBD_EXTENDED_REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.command.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }

    /// Appends the header framed as `framing` says.
    pub fn encode_framed(&self, framing: Framing, out: &mut Vec<u8>) {
        match framing {
            Framing::Extended => self.encode_extended(out),
            _ => self.encode(out),
        }
    }
}

/// Appends a simple reply header (data for a successful simple read follows it).
pub fn encode_simple_reply(out: &mut Vec<u8>, error: u32, cookie: u64) {
    out.extend_from_slice(&NBD_SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// How the chunks of one reply are framed: the cookie every chunk repeats, and with
/// extended headers the request's offset, which every extended chunk header repeats
/// too (proto.md, "Extended reply chunk message").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkFrame {
    pub cookie: u64,
    /// `Some(request offset)`: 32-byte extended headers; `None`: 20-byte structured.
    pub extended: Option<u64>,
}

fn done_flag(done: bool) -> u16 {
    if done {
        NBD_REPLY_FLAG_DONE
    } else {
        0
    }
}

impl ChunkFrame {
    /// Structured reply chunks for `cookie`.
    pub fn structured(cookie: u64) -> ChunkFrame {
        ChunkFrame {
            cookie,
            extended: None,
        }
    }

    /// Extended reply chunks for the request `cookie` at `request_offset`.
    pub fn extended(cookie: u64, request_offset: u64) -> ChunkFrame {
        ChunkFrame {
            cookie,
            extended: Some(request_offset),
        }
    }

    /// Size of one chunk header.
    pub fn header_len(&self) -> usize {
        if self.extended.is_some() {
            EXTENDED_REPLY_LEN
        } else {
            CHUNK_HEADER_LEN
        }
    }

    /// Appends a chunk header for a payload of `len` bytes. Structured chunks carry
    /// 32 bits of length; every payload we build fits.
    pub fn header(&self, out: &mut Vec<u8>, flags: u16, kind: u16, len: u64) {
        match self.extended {
            Some(request_offset) => {
                out.extend_from_slice(&NBD_EXTENDED_REPLY_MAGIC.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                out.extend_from_slice(&kind.to_be_bytes());
                out.extend_from_slice(&self.cookie.to_be_bytes());
                out.extend_from_slice(&request_offset.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
            }
            None => {
                debug_assert!(len <= u64::from(u32::MAX));
                out.extend_from_slice(&NBD_STRUCTURED_REPLY_MAGIC.to_be_bytes());
                out.extend_from_slice(&flags.to_be_bytes());
                out.extend_from_slice(&kind.to_be_bytes());
                out.extend_from_slice(&self.cookie.to_be_bytes());
                out.extend_from_slice(&(len as u32).to_be_bytes());
            }
        }
    }

    /// Appends the header and offset of an OFFSET_DATA chunk; `data_len` bytes of
    /// data must follow.
    pub fn offset_data_header(&self, out: &mut Vec<u8>, offset: u64, data_len: u32, done: bool) {
        let len = u64::from(data_len) + 8;
        self.header(out, done_flag(done), NBD_REPLY_TYPE_OFFSET_DATA, len);
        out.extend_from_slice(&offset.to_be_bytes());
    }

    /// Appends an OFFSET_HOLE chunk.
    pub fn offset_hole(&self, out: &mut Vec<u8>, offset: u64, len: u32, done: bool) {
        self.header(out, done_flag(done), NBD_REPLY_TYPE_OFFSET_HOLE, 12);
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
    }

    /// Appends a status chunk for one context: `(length, status flags)`
    /// descriptors. Extended framing sends NBD_REPLY_TYPE_BLOCK_STATUS_EXT (64-bit
    /// lengths and flags, and a descriptor count), as the protocol requires there;
    /// structured framing sends NBD_REPLY_TYPE_BLOCK_STATUS, whose lengths are 32
    /// bits: the caller keeps them within.
    pub fn block_status(
        &self,
        out: &mut Vec<u8>,
        context: u32,
        descriptors: &[(u64, u32)],
        done: bool,
    ) {
        let count = descriptors.len() as u64;
        if self.extended.is_some() {
            let kind = NBD_REPLY_TYPE_BLOCK_STATUS_EXT;
            self.header(out, done_flag(done), kind, 8 + 16 * count);
            out.extend_from_slice(&context.to_be_bytes());
            out.extend_from_slice(&(count as u32).to_be_bytes());
            for &(length, status) in descriptors {
                out.extend_from_slice(&length.to_be_bytes());
                out.extend_from_slice(&u64::from(status).to_be_bytes());
            }
        } else {
            let kind = NBD_REPLY_TYPE_BLOCK_STATUS;
            self.header(out, done_flag(done), kind, 4 + 8 * count);
            out.extend_from_slice(&context.to_be_bytes());
            for &(length, status) in descriptors {
                debug_assert!(length <= u64::from(u32::MAX));
                out.extend_from_slice(&(length as u32).to_be_bytes());
                out.extend_from_slice(&status.to_be_bytes());
            }
        }
    }

    /// Appends a final ERROR chunk with a human-readable message (cut to 512 bytes).
    pub fn error(&self, out: &mut Vec<u8>, error: u32, message: &str) {
        let message = truncate_utf8(message, 512);
        let len = 6 + message.len() as u64;
        self.header(out, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, len);
        out.extend_from_slice(&error.to_be_bytes());
        out.extend_from_slice(&(message.len() as u16).to_be_bytes());
        out.extend_from_slice(message.as_bytes());
    }

    /// Appends a final NONE chunk (success without payload).
    pub fn none(&self, out: &mut Vec<u8>) {
        self.header(out, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0);
    }
}

/// Appends a structured reply chunk header for a payload of `len` bytes.
pub fn encode_chunk_header(out: &mut Vec<u8>, flags: u16, kind: u16, cookie: u64, len: u32) {
    ChunkFrame::structured(cookie).header(out, flags, kind, len.into());
}

/// Appends the header and offset of a structured OFFSET_DATA chunk; `data_len`
/// bytes of data must follow.
pub fn encode_offset_data_header(
    out: &mut Vec<u8>,
    cookie: u64,
    offset: u64,
    data_len: u32,
    done: bool,
) {
    ChunkFrame::structured(cookie).offset_data_header(out, offset, data_len, done);
}

/// Appends a structured OFFSET_HOLE chunk.
pub fn encode_offset_hole(out: &mut Vec<u8>, cookie: u64, offset: u64, len: u32, done: bool) {
    ChunkFrame::structured(cookie).offset_hole(out, offset, len, done);
}

/// Appends a BLOCK_STATUS chunk: `(length, status flags)` descriptors for one context.
pub fn encode_block_status(
    out: &mut Vec<u8>,
    cookie: u64,
    context: u32,
    descriptors: &[(u32, u32)],
    done: bool,
) {
    let wide: Vec<(u64, u32)> = descriptors
        .iter()
        .map(|&(length, status)| (length.into(), status))
        .collect();
    ChunkFrame::structured(cookie).block_status(out, context, &wide, done);
}

/// Appends a final structured ERROR chunk with a human-readable message.
pub fn encode_error_chunk(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    ChunkFrame::structured(cookie).error(out, error, message);
}

/// Appends a final structured NONE chunk (success without payload).
pub fn encode_none_chunk(out: &mut Vec<u8>, cookie: u64) {
    ChunkFrame::structured(cookie).none(out);
}

fn truncate_utf8(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A reply header as a client reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyHeader {
    Simple {
        error: u32,
        cookie: u64,
    },
    Chunk {
        flags: u16,
        kind: u16,
        cookie: u64,
        len: u32,
    },
    /// An extended reply chunk: `offset` repeats the request's offset.
    Extended {
        flags: u16,
        kind: u16,
        cookie: u64,
        offset: u64,
        len: u64,
    },
}

impl ReplyHeader {
    /// Decodes a reply header from the front of `bytes`. `Ok(None)` means more bytes
    /// are needed; otherwise returns the header and how many bytes it took.
    pub fn decode(bytes: &[u8]) -> Result<Option<(ReplyHeader, usize)>, WireError> {
        let mut r = Reader::new(bytes);
        let Some(magic) = r.u32() else {
            return Ok(None);
        };
        match magic {
            NBD_SIMPLE_REPLY_MAGIC => {
                if bytes.len() < SIMPLE_REPLY_LEN {
                    return Ok(None);
                }
                let error = r.u32().unwrap();
                let cookie = r.u64().unwrap();
                Ok(Some((
                    ReplyHeader::Simple { error, cookie },
                    SIMPLE_REPLY_LEN,
                )))
            }
            NBD_STRUCTURED_REPLY_MAGIC => {
                if bytes.len() < CHUNK_HEADER_LEN {
                    return Ok(None);
                }
                let header = ReplyHeader::Chunk {
                    flags: r.u16().unwrap(),
                    kind: r.u16().unwrap(),
                    cookie: r.u64().unwrap(),
                    len: r.u32().unwrap(),
                };
                Ok(Some((header, CHUNK_HEADER_LEN)))
            }
            NBD_EXTENDED_REPLY_MAGIC => {
                if bytes.len() < EXTENDED_REPLY_LEN {
                    return Ok(None);
                }
                let header = ReplyHeader::Extended {
                    flags: r.u16().unwrap(),
                    kind: r.u16().unwrap(),
                    cookie: r.u64().unwrap(),
                    offset: r.u64().unwrap(),
                    len: r.u64().unwrap(),
                };
                Ok(Some((header, EXTENDED_REPLY_LEN)))
            }
            found => Err(WireError::BadMagic {
                expected: NBD_SIMPLE_REPLY_MAGIC.into(),
                found: found.into(),
            }),
        }
    }

    /// The cookie of the request this answers.
    pub fn cookie(&self) -> u64 {
        match *self {
            ReplyHeader::Simple { cookie, .. }
            | ReplyHeader::Chunk { cookie, .. }
            | ReplyHeader::Extended { cookie, .. } => cookie,
        }
    }
}

/// The payload of an error chunk (client side): error value and message.
pub fn decode_error_payload(payload: &[u8]) -> Result<(u32, String), WireError> {
    let mut r = Reader::new(payload);
    let short = WireError::Malformed("error chunk too short");
    let error = r.u32().ok_or(short.clone())?;
    let len = r.u16().ok_or(short.clone())? as usize;
    let message = r.take(len).ok_or(short)?;
    Ok((error, String::from_utf8_lossy(message).into_owned()))
}

/// The descriptors of a BLOCK_STATUS payload (client side).
pub fn decode_block_status(payload: &[u8]) -> Result<(u32, Vec<(u32, u32)>), WireError> {
    if payload.len() < 12 || !(payload.len() - 4).is_multiple_of(8) {
        return Err(WireError::Malformed("block status length"));
    }
    let mut r = Reader::new(payload);
    let context = r.u32().unwrap();
    let mut descriptors = Vec::with_capacity((payload.len() - 4) / 8);
    while r.remaining() > 0 {
        descriptors.push((r.u32().unwrap(), r.u32().unwrap()));
    }
    Ok((context, descriptors))
}

/// The descriptors of a BLOCK_STATUS_EXT payload (client side): context id and
/// `(length, status flags)` pairs. The count field must match the payload.
pub fn decode_block_status_ext(payload: &[u8]) -> Result<(u32, Vec<(u64, u64)>), WireError> {
    if payload.len() < 24 || !(payload.len() - 8).is_multiple_of(16) {
        return Err(WireError::Malformed("extended block status length"));
    }
    let mut r = Reader::new(payload);
    let context = r.u32().unwrap();
    let count = r.u32().unwrap() as usize;
    if count != (payload.len() - 8) / 16 {
        return Err(WireError::Malformed(
            "extended block status count does not match its length",
        ));
    }
    let mut descriptors = Vec::with_capacity(count);
    while r.remaining() > 0 {
        descriptors.push((r.u64().unwrap(), r.u64().unwrap()));
    }
    Ok((context, descriptors))
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
