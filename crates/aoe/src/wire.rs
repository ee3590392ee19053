//! The AoE version 1 wire codec (AoE specification r11), sans-IO: whole Ethernet frames
//! in, typed messages out, and back. No sockets, clocks or threads here.
//!
//! Layout of every frame (offsets in bytes):
//!
//! ```text
//!  0  destination MAC    6  source MAC    12 ethertype 0x88A2
//! 14  version(4 bits) | flags(4 bits: R response, E error)
//! 15  error   16 major (shelf, BE16)   18 minor (slot)   19 command   20 tag (BE32)
//! 24  command arguments, then data
//! ```
//!
//! Decoding is two-step so a target can answer what it can: [`Header::parse`] needs
//! only the first 24 bytes; [`Body::parse`] decodes the arguments of a known command.
//! Bodies borrow the frame; nothing is copied.

use thiserror::Error;

/// An Ethernet (MAC) address.
pub type MacAddr = [u8; 6];
/// The Ethernet broadcast address.
pub const BROADCAST: MacAddr = [0xff; 6];
/// The AoE ethertype.
pub const AOE_ETHERTYPE: u16 = 0x88a2;

/// Ethernet header: destination, source, ethertype.
pub const ETHERNET_HEADER_LEN: usize = 14;
/// Ethernet plus the AoE common header.
pub const HEADER_LEN: usize = 24;
/// Ethernet, AoE header and the 12 bytes of ATA arguments: where sector data starts.
pub const ATA_HEADER_LEN: usize = HEADER_LEN + 12;
/// Ethernet, AoE header and the 8 fixed bytes of a config query.
pub const CONFIG_HEADER_LEN: usize = HEADER_LEN + 8;
/// The Ethernet minimum frame (without FCS): shorter frames must be padded.
pub const MIN_FRAME_LEN: usize = 60;
/// The AoE protocol version this codec speaks.
pub const VERSION: u8 = 1;
/// Sector size of the AoE ATA transport: fixed by the protocol.
pub const SECTOR_SIZE: usize = 512;
/// Longest config string (AoEr11 §3.2).
pub const MAX_CONFIG_LEN: usize = 1024;
/// Shelf (major) that addresses every shelf.
pub const BROADCAST_SHELF: u16 = 0xffff;
/// Slot (minor) that addresses every slot.
pub const BROADCAST_SLOT: u8 = 0xff;

const FLAG_RESPONSE: u8 = 0x08;
const FLAG_ERROR: u8 = 0x04;

/// Sectors one ATA frame can carry on an interface of this MTU: `(MTU − 36) / 512`
/// as the specification words it (it counts the Ethernet header against the MTU, which
/// leaves 14 bytes unused but is what every target advertises), at most 255.
pub fn sectors_per_frame(mtu: usize) -> u8 {
    (mtu.saturating_sub(ATA_HEADER_LEN) / SECTOR_SIZE).min(255) as u8
}

/// AoE command codes (header byte 19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Issue an ATA command.
    Ata = 0,
    /// Query Config Information.
    QueryConfig = 1,
    /// MAC Mask List (access control).
    MacMaskList = 2,
    /// Reserve/Release.
    ReserveRelease = 3,
}

impl Command {
    /// The command for a code, if it is one this codec knows.
    pub fn from_code(code: u8) -> Option<Command> {
        match code {
            0 => Some(Command::Ata),
            1 => Some(Command::QueryConfig),
            2 => Some(Command::MacMaskList),
            3 => Some(Command::ReserveRelease),
            _ => None,
        }
    }
}

/// Errors a target reports in the header's error field (AoEr11 §2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum AoeError {
    #[error("unrecognized command code")]
    UnrecognizedCommand = 1,
    #[error("bad argument parameter")]
    BadArgument = 2,
    #[error("device unavailable")]
    DeviceUnavailable = 3,
    #[error("config string present")]
    ConfigStringPresent = 4,
    #[error("unsupported version")]
    UnsupportedVersion = 5,
    #[error("target is reserved")]
    TargetReserved = 6,
}

impl AoeError {
    /// The error for a code; `None` for 0 and codes the specification does not define.
    pub fn from_code(code: u8) -> Option<AoeError> {
        match code {
            1 => Some(AoeError::UnrecognizedCommand),
            2 => Some(AoeError::BadArgument),
            3 => Some(AoeError::DeviceUnavailable),
            4 => Some(AoeError::ConfigStringPresent),
            5 => Some(AoeError::UnsupportedVersion),
            6 => Some(AoeError::TargetReserved),
            _ => None,
        }
    }
}

/// The Ethernet and AoE common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub dst: MacAddr,
    pub src: MacAddr,
    /// Protocol version (high nibble of byte 14).
    pub version: u8,
    /// R flag: this frame is a response.
    pub response: bool,
    /// The error field (meaningful when the E flag is set); 0 when there is none.
    pub error: u8,
    /// Major address: the shelf.
    pub shelf: u16,
    /// Minor address: the slot.
    pub slot: u8,
    /// Command code (see [`Command`]); unknown codes are kept so they can be answered.
    pub command: u8,
    /// Initiator-chosen tag, echoed by the target.
    pub tag: u32,
}

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("frame too short: {len} bytes, need {needed}")]
    Truncated { len: usize, needed: usize },
    #[error("not an AoE frame (ethertype {0:#06x})")]
    NotAoe(u16),
    #[error("bad argument: {0}")]
    BadArgument(&'static str),
}

fn truncated(len: usize, needed: usize) -> FrameError {
    FrameError::Truncated { len, needed }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn mac_at(b: &[u8]) -> MacAddr {
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&b[..6]);
    mac
}

impl Header {
    /// A request header from `src` to `dst` for shelf.slot with a command and tag.
    pub fn request(
        dst: MacAddr,
        src: MacAddr,
        shelf: u16,
        slot: u8,
        command: Command,
        tag: u32,
    ) -> Header {
        Header {
            dst,
            src,
            version: VERSION,
            response: false,
            error: 0,
            shelf,
            slot,
            command: command as u8,
            tag,
        }
    }

    /// The header of the response to this request, sent from `src` (the target's MAC).
    pub fn response_to(&self, src: MacAddr) -> Header {
        Header {
            dst: self.src,
            src,
            version: VERSION,
            response: true,
            error: 0,
            ..*self
        }
    }

    /// Whether the E flag is set, with the error it carries.
    pub fn error(&self) -> Option<AoeError> {
        if self.error == 0 {
            None
        } else {
            Some(AoeError::from_code(self.error).unwrap_or(AoeError::BadArgument))
        }
    }

    /// Whether a target at `shelf`.`slot` is addressed (directly or by broadcast).
    pub fn addresses(&self, shelf: u16, slot: u8) -> bool {
        (self.shelf == shelf || self.shelf == BROADCAST_SHELF)
            && (self.slot == slot || self.slot == BROADCAST_SLOT)
    }

    /// Decodes the first 24 bytes of a frame; returns the header and the bytes after it.
    pub fn parse(frame: &[u8]) -> Result<(Header, &[u8]), FrameError> {
        if frame.len() < HEADER_LEN {
            return Err(truncated(frame.len(), HEADER_LEN));
        }
        let ethertype = be16(&frame[12..]);
        if ethertype != AOE_ETHERTYPE {
            return Err(FrameError::NotAoe(ethertype));
        }
        let flags = frame[14] & 0x0f;
        let header = Header {
            dst: mac_at(&frame[0..]),
            src: mac_at(&frame[6..]),
            version: frame[14] >> 4,
            response: flags & FLAG_RESPONSE != 0,
            error: if flags & FLAG_ERROR != 0 {
                frame[15].max(1)
            } else {
                0
            },
            shelf: be16(&frame[16..]),
            slot: frame[18],
            command: frame[19],
            tag: u32::from_be_bytes([frame[20], frame[21], frame[22], frame[23]]),
        };
        Ok((header, &frame[HEADER_LEN..]))
    }

    /// Appends the 24 header bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.dst);
        out.extend_from_slice(&self.src);
        out.extend_from_slice(&AOE_ETHERTYPE.to_be_bytes());
        let mut flags = 0;
        if self.response {
            flags |= FLAG_RESPONSE;
        }
        if self.error != 0 {
            flags |= FLAG_ERROR;
        }
        out.push((self.version << 4) | flags);
        out.push(self.error);
        out.extend_from_slice(&self.shelf.to_be_bytes());
        out.push(self.slot);
        out.push(self.command);
        out.extend_from_slice(&self.tag.to_be_bytes());
    }
}

/// ATA command codes the AoE ATA transport carries (ACS names).
pub mod ata {
    pub const READ_SECTORS: u8 = 0x20;
    pub const READ_SECTORS_EXT: u8 = 0x24;
    pub const WRITE_SECTORS: u8 = 0x30;
    pub const WRITE_SECTORS_EXT: u8 = 0x34;
    pub const CHECK_POWER_MODE: u8 = 0xe5;
    pub const FLUSH_CACHE: u8 = 0xe7;
    pub const FLUSH_CACHE_EXT: u8 = 0xea;
    pub const IDENTIFY_DEVICE: u8 = 0xec;

    /// Status register: device ready.
    pub const STATUS_DRDY: u8 = 0x40;
    /// Status register: an error occurred (see the error register).
    pub const STATUS_ERR: u8 = 0x01;
    /// Error register: command aborted.
    pub const ERROR_ABRT: u8 = 0x04;
    /// Error register: ID not found (address out of range).
    pub const ERROR_IDNF: u8 = 0x10;
    /// Error register: uncorrectable data error.
    pub const ERROR_UNC: u8 = 0x40;
    /// CHECK POWER MODE's answer in the sector count: active or idle.
    pub const POWER_ACTIVE: u8 = 0xff;
}

/// The 12 bytes of ATA arguments: the task file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtaArgs {
    /// E: LBA48 (extended) addressing.
    pub extended: bool,
    /// D: the device/head register's DEV bit.
    pub device: bool,
    /// A: asynchronous write (the target may answer before the data is stored).
    pub asynchronous: bool,
    /// W: data flows from initiator to target.
    pub write: bool,
    /// Error register (response) or features register (request).
    pub err_feature: u8,
    /// Sector count register.
    pub sector_count: u8,
    /// Command register (request) or status register (response).
    pub cmd_status: u8,
    /// Logical block address: 28 bits without `extended`, 48 bits with it.
    pub lba: u64,
}

const AFLAG_EXTENDED: u8 = 0x40;
const AFLAG_DEVICE: u8 = 0x10;
const AFLAG_ASYNC: u8 = 0x02;
const AFLAG_WRITE: u8 = 0x01;

impl AtaArgs {
    /// Decodes the arguments; returns them and the data after them (which may include
    /// Ethernet padding: slice it by the sector count).
    pub fn parse(body: &[u8]) -> Result<(AtaArgs, &[u8]), FrameError> {
        if body.len() < 12 {
            return Err(truncated(body.len() + HEADER_LEN, ATA_HEADER_LEN));
        }
        let aflags = body[0];
        let extended = aflags & AFLAG_EXTENDED != 0;
        let lba_bytes = [body[4], body[5], body[6], body[7], body[8], body[9], 0, 0];
        let mut lba = u64::from_le_bytes(lba_bytes);
        if !extended {
            // LBA28: the fourth byte's high nibble is the device register's upper bits.
            lba &= 0x0fff_ffff;
        }
        let args = AtaArgs {
            extended,
            device: aflags & AFLAG_DEVICE != 0,
            asynchronous: aflags & AFLAG_ASYNC != 0,
            write: aflags & AFLAG_WRITE != 0,
            err_feature: body[1],
            sector_count: body[2],
            cmd_status: body[3],
            lba,
        };
        Ok((args, &body[12..]))
    }

    /// Appends the 12 argument bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut aflags = 0;
        if self.extended {
            aflags |= AFLAG_EXTENDED;
        }
        if self.device {
            aflags |= AFLAG_DEVICE;
        }
        if self.asynchronous {
            aflags |= AFLAG_ASYNC;
        }
        if self.write {
            aflags |= AFLAG_WRITE;
        }
        out.extend_from_slice(&[aflags, self.err_feature, self.sector_count, self.cmd_status]);
        let lba = self.lba.to_le_bytes();
        out.extend_from_slice(&lba[..6]);
        if !self.extended {
            // LBA28: the fourth byte is the device register: LBA mode (0x40) plus the
            // two obsolete always-one bits (0xa0), as ATA hosts send it.
            let at = out.len() - 3;
            out[at] = (out[at] & 0x0f) | 0xe0;
            out[at + 1] = 0;
            out[at + 2] = 0;
        }
        out.extend_from_slice(&[0, 0]);
    }

    /// Bytes of sector data this command moves.
    pub fn data_len(&self) -> usize {
        self.sector_count as usize * SECTOR_SIZE
    }
}

/// Query Config Information sub-commands (AoEr11 §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigCommand {
    /// Read the config string.
    Read = 0,
    /// Answer only if the config string equals the one sent.
    TestExact = 1,
    /// Answer only if the config string starts with the one sent.
    TestPrefix = 2,
    /// Set the config string if it is empty (else error "config string present").
    SetIfEmpty = 3,
    /// Set the config string unconditionally.
    ForceSet = 4,
}

impl ConfigCommand {
    /// The sub-command for a code, if it is defined.
    pub fn from_code(code: u8) -> Option<ConfigCommand> {
        match code {
            0 => Some(ConfigCommand::Read),
            1 => Some(ConfigCommand::TestExact),
            2 => Some(ConfigCommand::TestPrefix),
            3 => Some(ConfigCommand::SetIfEmpty),
            4 => Some(ConfigCommand::ForceSet),
            _ => None,
        }
    }
}

/// A Query Config Information message (request or response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigQuery<'a> {
    /// Frames the target can queue (responses; 0 in requests).
    pub buffer_count: u16,
    pub firmware_version: u16,
    /// Most sectors per ATA frame the target accepts.
    pub sector_count: u8,
    /// AoE version (high nibble of byte 5).
    pub aoe_version: u8,
    /// Sub-command code (low nibble of byte 5); see [`ConfigCommand`].
    pub command: u8,
    /// The config string (at most [`MAX_CONFIG_LEN`] bytes).
    pub config: &'a [u8],
}

impl<'a> ConfigQuery<'a> {
    /// Decodes the config arguments and string.
    pub fn parse(body: &'a [u8]) -> Result<ConfigQuery<'a>, FrameError> {
        if body.len() < 8 {
            return Err(truncated(body.len() + HEADER_LEN, CONFIG_HEADER_LEN));
        }
        let len = be16(&body[6..]) as usize;
        if len > MAX_CONFIG_LEN {
            return Err(FrameError::BadArgument(
                "config string longer than 1024 bytes",
            ));
        }
        if body.len() < 8 + len {
            return Err(truncated(body.len() + HEADER_LEN, CONFIG_HEADER_LEN + len));
        }
        Ok(ConfigQuery {
            buffer_count: be16(&body[0..]),
            firmware_version: be16(&body[2..]),
            sector_count: body[4],
            aoe_version: body[5] >> 4,
            command: body[5] & 0x0f,
            config: &body[8..8 + len],
        })
    }

    /// Appends the config arguments and string to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.buffer_count.to_be_bytes());
        out.extend_from_slice(&self.firmware_version.to_be_bytes());
        out.push(self.sector_count);
        out.push((self.aoe_version << 4) | (self.command & 0x0f));
        let config = &self.config[..self.config.len().min(MAX_CONFIG_LEN)];
        out.extend_from_slice(&(config.len() as u16).to_be_bytes());
        out.extend_from_slice(config);
    }
}

/// MAC Mask List sub-commands.
pub mod mask {
    /// Read the list.
    pub const READ: u8 = 0;
    /// Apply the directives, then answer with the list.
    pub const EDIT: u8 = 1;
    /// Directive: nothing.
    pub const DIRECTIVE_NONE: u8 = 0;
    /// Directive: add the address.
    pub const DIRECTIVE_ADD: u8 = 1;
    /// Directive: delete the address.
    pub const DIRECTIVE_DELETE: u8 = 2;
    /// Mask error: unspecified.
    pub const ERROR_UNSPECIFIED: u8 = 1;
    /// Mask error: bad directive command.
    pub const ERROR_BAD_DIRECTIVE: u8 = 2;
    /// Mask error: the list is full.
    pub const ERROR_LIST_FULL: u8 = 3;
}

/// One MAC mask directive: a command and an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskDirective {
    pub command: u8,
    pub mac: MacAddr,
}

/// A MAC Mask List message (request or response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskList {
    /// Sub-command: [`mask::READ`] or [`mask::EDIT`].
    pub command: u8,
    /// Mask error (responses).
    pub error: u8,
    pub directives: Vec<MaskDirective>,
}

impl MaskList {
    /// Decodes the mask arguments and directives.
    pub fn parse(body: &[u8]) -> Result<MaskList, FrameError> {
        if body.len() < 4 {
            return Err(truncated(body.len() + HEADER_LEN, HEADER_LEN + 4));
        }
        let count = body[3] as usize;
        let needed = 4 + count * 8;
        if body.len() < needed {
            return Err(truncated(body.len() + HEADER_LEN, HEADER_LEN + needed));
        }
        let directives = body[4..needed]
            .chunks_exact(8)
            .map(|d| MaskDirective {
                command: d[1],
                mac: mac_at(&d[2..]),
            })
            .collect();
        Ok(MaskList {
            command: body[1],
            error: body[2],
            directives,
        })
    }

    /// Appends the mask arguments and directives to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let count = self.directives.len().min(255);
        out.extend_from_slice(&[0, self.command, self.error, count as u8]);
        for d in &self.directives[..count] {
            out.extend_from_slice(&[0, d.command]);
            out.extend_from_slice(&d.mac);
        }
    }
}

/// Reserve/Release sub-commands.
pub mod reserve {
    /// Read the reserve list.
    pub const READ: u8 = 0;
    /// Set the list (only if empty or the sender is on it).
    pub const SET: u8 = 1;
    /// Set the list unconditionally.
    pub const FORCE_SET: u8 = 2;
}

/// A Reserve/Release message (request or response).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveList {
    /// Sub-command: see [`reserve`].
    pub command: u8,
    pub macs: Vec<MacAddr>,
}

impl ReserveList {
    /// Decodes the reserve arguments and addresses.
    pub fn parse(body: &[u8]) -> Result<ReserveList, FrameError> {
        if body.len() < 2 {
            return Err(truncated(body.len() + HEADER_LEN, HEADER_LEN + 2));
        }
        let count = body[1] as usize;
        let needed = 2 + count * 6;
        if body.len() < needed {
            return Err(truncated(body.len() + HEADER_LEN, HEADER_LEN + needed));
        }
        Ok(ReserveList {
            command: body[0],
            macs: body[2..needed].chunks_exact(6).map(mac_at).collect(),
        })
    }

    /// Appends the reserve arguments and addresses to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let count = self.macs.len().min(255);
        out.extend_from_slice(&[self.command, count as u8]);
        for mac in &self.macs[..count] {
            out.extend_from_slice(mac);
        }
    }
}

/// The decoded arguments of a known command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body<'a> {
    /// ATA arguments and the data after them (may include padding).
    Ata(AtaArgs, &'a [u8]),
    QueryConfig(ConfigQuery<'a>),
    MacMaskList(MaskList),
    ReserveRelease(ReserveList),
}

impl<'a> Body<'a> {
    /// Decodes the bytes after the header for `command`.
    pub fn parse(command: Command, body: &'a [u8]) -> Result<Body<'a>, FrameError> {
        Ok(match command {
            Command::Ata => {
                let (args, data) = AtaArgs::parse(body)?;
                Body::Ata(args, data)
            }
            Command::QueryConfig => Body::QueryConfig(ConfigQuery::parse(body)?),
            Command::MacMaskList => Body::MacMaskList(MaskList::parse(body)?),
            Command::ReserveRelease => Body::ReserveRelease(ReserveList::parse(body)?),
        })
    }

    /// Appends the encoded arguments (and data) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Body::Ata(args, data) => {
                args.encode(out);
                out.extend_from_slice(data);
            }
            Body::QueryConfig(config) => config.encode(out),
            Body::MacMaskList(list) => list.encode(out),
            Body::ReserveRelease(list) => list.encode(out),
        }
    }
}

/// Pads a frame with zeroes to the Ethernet minimum.
pub fn pad_to_minimum(frame: &mut Vec<u8>) {
    if frame.len() < MIN_FRAME_LEN {
        frame.resize(MIN_FRAME_LEN, 0);
    }
}

/// Encodes a whole frame (header and body) into `out`, replacing its contents, padded
/// to the Ethernet minimum.
pub fn encode_frame(header: &Header, body: &Body<'_>, out: &mut Vec<u8>) {
    out.clear();
    header.encode(out);
    body.encode(out);
    pad_to_minimum(out);
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
