//! The initiator as a [`BlockDevice`]: an NBD export reached over one or more
//! connections.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::Duration;

use blockwire_blockdev::{
    BlockDevice, DeviceInfo, Error, ErrorKind, Extent, ExtentState, FastPath, Op, RequestQueue,
    Result, WriteFlags, ZeroFlags,
};

use super::connection::Connection;
use super::details::{ExportDetails, MAX_EFFECT_LEN};
use super::error::ClientError;
use super::handshake::{self, Wanted};
use super::queue::NbdQueue;
use super::reconnect::{self, Recovery};
use super::reply::Outcome;
use super::socket::{address_of, connect_and, Socket};
use super::uri::NbdUri;
use crate::wire::*;
pub use blockwire_blockdev::paths::DEFAULT_RECONNECT;

/// How an initiator connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientOptions {
    /// Connections to open. More than one is only used when the server advertises
    /// NBD_FLAG_CAN_MULTI_CONN (otherwise writes on one connection need not be
    /// visible on another, nor covered by a flush on another).
    pub connections: usize,
    /// Ask for structured replies (and with them `base:allocation`).
    pub structured: bool,
    /// Ask for extended headers (NBD_OPT_EXTENDED_HEADERS) before structured
    /// replies, which they supersede; a server that refuses them gets structured
    /// replies instead. Only asked for along with `structured`.
    pub extended_headers: bool,
    /// Ask for the `base:allocation` metadata context (block status).
    pub base_allocation: bool,
    /// How long the server may take to answer each handshake message.
    pub handshake_timeout: Duration,
    /// How long a request may wait for its reply; then the connection is closed and
    /// every request on it fails with a timed-out error. `None` waits forever (a slow
    /// flush is not a dead server).
    pub request_timeout: Option<Duration>,
    /// How long to keep reconnecting after a connection drops (the server closed
    /// it, restarted, or said it was shutting down); the requests it had not
    /// answered are then sent again. `None` fails them at once. See reconnect.rs.
    pub reconnect: Option<Duration>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connections: 1,
            structured: true,
            extended_headers: true,
            base_allocation: true,
            handshake_timeout: Duration::from_secs(30),
            request_timeout: None,
            reconnect: Some(DEFAULT_RECONNECT),
        }
    }
}

/// An NBD export as a block device. Any number of threads may call it at once; each
/// request travels on the least-loaded connection and replies complete in any
/// order.
pub struct NbdClient {
    uri: NbdUri,
    pub(crate) options: ClientOptions,
    pub(crate) address: String,
    pub(crate) details: ExportDetails,
    info: DeviceInfo,
    /// The connections in use; a reconnect puts a new one in place of a dropped one.
    connections: Vec<RwLock<Arc<Connection>>>,
    next: AtomicUsize,
    /// One reconnect at a time, and whether reconnecting has failed for good.
    pub(crate) recovery: Mutex<Recovery>,
}

impl std::fmt::Debug for NbdClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdClient")
            .field("uri", &self.uri.to_string())
            .field("connections", &self.connections.len())
            .field("details", &self.details)
            .finish()
    }
}

/// Connects one socket and negotiates the export.
pub(crate) fn open(
    uri: &NbdUri,
    options: &ClientOptions,
) -> Result<(Socket, ExportDetails), ClientError> {
    let wanted = Wanted {
        structured: options.structured,
        extended: options.structured && options.extended_headers,
        base_allocation: options.base_allocation,
    };
    let (socket, details) = connect_and(
        uri,
        options.handshake_timeout,
        |socket, address, starttls| {
            handshake::negotiate_secure(socket, address, &uri.export, wanted, starttls)
        },
    )?;
    socket
        .set_read_timeout(None)
        .map_err(|source| ClientError::Io {
            address: address_of(uri),
            source,
        })?;
    Ok((socket, details))
}

/// What every connection of one device must agree on (and a reconnected one with
/// the connection it replaces).
pub(crate) fn differs(first: &ExportDetails, other: &ExportDetails) -> Option<String> {
    if first.size != other.size {
        return Some(format!("size {} instead of {}", other.size, first.size));
    }
    if first.flags != other.flags {
        return Some(format!(
            "flags {:#x} instead of {:#x}",
            other.flags, first.flags
        ));
    }
    if first.block_sizes() != other.block_sizes()
        || first.structured != other.structured
        || first.extended_headers != other.extended_headers
        || first.base_allocation() != other.base_allocation()
    {
        return Some("different block sizes or negotiated options".into());
    }
    None
}

impl NbdClient {
    /// Connects to the export a URI names and negotiates it; with
    /// `options.connections > 1` and a server that allows it, opens that many
    /// connections.
    pub fn connect(uri: &NbdUri, options: ClientOptions) -> Result<NbdClient, ClientError> {
        let address = address_of(uri);
        let start_failed = |source| ClientError::Io {
            address: address.clone(),
            source,
        };
        let (socket, details) = open(uri, &options)?;
        let mut connections =
            vec![
                Connection::start(socket, &details, &address, 0, options.request_timeout)
                    .map_err(start_failed)?,
            ];
        let wanted = options.connections.max(1);
        if wanted > 1 && !details.has(NBD_FLAG_CAN_MULTI_CONN) {
            tracing::warn!(
                "{address} does not advertise multi-conn for export '{}'; using one connection instead of {wanted}",
                details.name
            );
        } else {
            for index in 1..wanted {
                let (socket, other) = open(uri, &options)?;
                if let Some(reason) = differs(&details, &other) {
                    return Err(ClientError::Mismatch {
                        address,
                        index,
                        reason,
                    });
                }
                connections.push(
                    Connection::start(socket, &other, &address, index, options.request_timeout)
                        .map_err(start_failed)?,
                );
            }
        }
        tracing::debug!(
            "connected to {uri}: {} bytes, flags {:#x}, {} connection(s)",
            details.size,
            details.flags,
            connections.len()
        );
        Ok(NbdClient {
            uri: uri.clone(),
            options,
            address,
            info: details.device_info(),
            details,
            connections: connections
                .into_iter()
                .map(|connection| RwLock::new(Arc::new(connection)))
                .collect(),
            next: AtomicUsize::new(0),
            recovery: Mutex::new(Recovery::default()),
        })
    }

    /// What the handshake learned about the export.
    pub fn details(&self) -> &ExportDetails {
        &self.details
    }

    pub fn uri(&self) -> &NbdUri {
        &self.uri
    }

    /// Connections in use.
    pub fn connections(&self) -> usize {
        self.connections.len()
    }

    /// The least-loaded live connection; ties go round-robin.
    pub(crate) fn pick(&self) -> Arc<Connection> {
        // Looked at through the locks, without taking a reference to each: only
        // the chosen connection is cloned (one reference-count change per request).
        let index = blockwire_blockdev::paths::least_loaded(
            self.connections.len(),
            &self.next,
            |i| self.current(i).alive(),
            |i| self.current(i).in_flight(),
        );
        self.connection(index)
    }

    /// Connection `index` as it is now, borrowed while the guard lives.
    fn current(&self, index: usize) -> RwLockReadGuard<'_, Arc<Connection>> {
        self.connections[index]
            .read()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Connection `index` as it is now.
    pub(crate) fn connection(&self, index: usize) -> Arc<Connection> {
        self.current(index).clone()
    }

    /// Puts `connection` in place of connection `index` (a reconnect).
    pub(crate) fn replace_connection(&self, index: usize, connection: Connection) {
        let old = std::mem::replace(
            &mut *self.connections[index]
                .write()
                .unwrap_or_else(|e| e.into_inner()),
            Arc::new(connection),
        );
        // Whoever holds the old one last closes it (a request queue may have it).
        drop(old);
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        op: Op,
        command: u16,
        flags: u16,
        offset: u64,
        len: u64,
        payload: &[u8],
        read_into: Option<&mut [u8]>,
    ) -> Result<Outcome> {
        let wire_len = u32::try_from(len).map_err(|_| {
            Error::new(ErrorKind::TooLarge, op, offset, len)
                .with_detail("NBD requests are at most 4 GiB - 1")
        })?;
        let mut read_into = read_into;
        let mut replays = 0;
        loop {
            let connection = self.pick();
            let result = connection.request(
                op,
                command,
                flags,
                offset,
                wire_len,
                payload,
                read_into.as_deref_mut(),
            );
            match result {
                // The request had no answer: once a new connection is in place of
                // the dropped one, send it again.
                Err(error) if reconnect::worth_it(&error) => {
                    reconnect::recover(self, &connection, error, replays)?;
                    replays += 1;
                }
                result => return result,
            }
        }
    }

    /// Runs a command without payload over `offset..offset+len` in pieces the
    /// protocol's 32-bit length can carry.
    fn in_pieces(&self, op: Op, command: u16, flags: u16, offset: u64, len: u64) -> Result<()> {
        let step = self.effect_max();
        let mut done = 0;
        while done < len {
            let piece = (len - done).min(step);
            self.request(op, command, flags, offset + done, piece, &[], None)?;
            done += piece;
        }
        Ok(())
    }

    /// Largest length for commands without payload, aligned to the minimum block.
    fn effect_max(&self) -> u64 {
        let minimum = u64::from(self.info.block_sizes.minimum);
        MAX_EFFECT_LEN / minimum * minimum
    }
}

pub(crate) fn fua(flags: WriteFlags) -> u16 {
    if flags.fua {
        NBD_CMD_FLAG_FUA
    } else {
        0
    }
}

/// `base:allocation` flags as an extent state (proto.md, "`base:allocation`
/// metadata context"). A hole that does not read as zeroes has undefined contents:
/// data, as far as a reader is concerned.
fn extent_state(status: u32) -> ExtentState {
    match status & (NBD_STATE_HOLE | NBD_STATE_ZERO) {
        s if s == NBD_STATE_HOLE | NBD_STATE_ZERO => ExtentState::Hole,
        NBD_STATE_ZERO => ExtentState::Zero,
        _ => ExtentState::Data,
    }
}

/// The `base:allocation` status flags of an extent state and the words `nbdinfo
/// --map` prints for them: 0 "data", 2 "zero", 3 "hole,zero".
pub fn allocation_type(state: ExtentState) -> (u32, &'static str) {
    match state {
        ExtentState::Data => (0, "data"),
        ExtentState::Zero => (NBD_STATE_ZERO, "zero"),
        ExtentState::Hole => (NBD_STATE_HOLE | NBD_STATE_ZERO, "hole,zero"),
    }
}

impl BlockDevice for NbdClient {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len() as u64;
        self.request(Op::Read, NBD_CMD_READ, 0, offset, len, &[], Some(buf))
            .map(drop)
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len() as u64;
        self.request(Op::Write, NBD_CMD_WRITE, fua(flags), offset, len, buf, None)
            .map(drop)
    }

    fn flush(&self) -> Result<()> {
        if !self.details.has(NBD_FLAG_SEND_FLUSH) {
            return Err(Error::new(ErrorKind::Unsupported, Op::Flush, 0, 0));
        }
        // With several connections the server promised (CAN_MULTI_CONN) that a
        // flush on one covers writes completed on all.
        self.request(Op::Flush, NBD_CMD_FLUSH, 0, 0, 0, &[], None)
            .map(drop)
    }

    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        if !self.details.has(NBD_FLAG_SEND_TRIM) {
            return Err(Error::new(ErrorKind::Unsupported, Op::Trim, offset, len));
        }
        self.in_pieces(Op::Trim, NBD_CMD_TRIM, fua(flags), offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        let unsupported = || Error::new(ErrorKind::Unsupported, Op::WriteZeroes, offset, len);
        if !self.details.has(NBD_FLAG_SEND_WRITE_ZEROES) {
            return Err(unsupported());
        }
        let mut command_flags = fua(WriteFlags { fua: flags.fua });
        if flags.no_hole {
            command_flags |= NBD_CMD_FLAG_NO_HOLE;
        }
        if flags.fast {
            if !self.details.has(NBD_FLAG_SEND_FAST_ZERO) {
                return Err(unsupported());
            }
            command_flags |= NBD_CMD_FLAG_FAST_ZERO;
        }
        self.in_pieces(
            Op::WriteZeroes,
            NBD_CMD_WRITE_ZEROES,
            command_flags,
            offset,
            len,
        )
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        if !self.details.base_allocation() {
            return Err(Error::new(ErrorKind::Unsupported, Op::Extents, offset, len)
                .with_detail("base:allocation was not negotiated"));
        }
        if len == 0 {
            return Ok(());
        }
        // The server may answer for less than asked; the caller asks again.
        let asked = len.min(self.effect_max());
        let outcome = self.request(
            Op::Extents,
            NBD_CMD_BLOCK_STATUS,
            0,
            offset,
            asked,
            &[],
            None,
        )?;
        let Outcome::Extents(descriptors) = outcome else {
            unreachable!("block status completes with extents")
        };
        let mut at = offset;
        for (length, status) in descriptors {
            out.push(Extent {
                offset: at,
                len: length,
                state: extent_state(status),
            });
            at = at.saturating_add(length);
            if at >= offset + len {
                break;
            }
        }
        Ok(())
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        if !self.details.has(NBD_FLAG_SEND_CACHE) {
            return Err(Error::new(ErrorKind::Unsupported, Op::Cache, offset, len));
        }
        self.in_pieces(Op::Cache, NBD_CMD_CACHE, 0, offset, len)
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

impl NbdClient {
    /// A queue that keeps many reads and writes in flight from one thread over this
    /// client's connections (the device's [`FastPath::queue`], callable without the
    /// trait); `None` if the kernel refuses the eventfd it needs.
    pub fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        NbdQueue::new(self).map(|queue| Box::new(queue) as Box<dyn RequestQueue + '_>)
    }
}

/// The request queue is this client's one fast path.
impl FastPath for NbdClient {
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        NbdClient::queue(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_flags_map_to_extent_states() {
        assert_eq!(extent_state(0), ExtentState::Data);
        assert_eq!(extent_state(NBD_STATE_ZERO), ExtentState::Zero);
        assert_eq!(
            extent_state(NBD_STATE_HOLE | NBD_STATE_ZERO),
            ExtentState::Hole
        );
        // A hole of unknown contents is data to a reader; unknown bits are ignored.
        assert_eq!(extent_state(NBD_STATE_HOLE), ExtentState::Data);
        assert_eq!(extent_state(0xf0 | NBD_STATE_ZERO), ExtentState::Zero);
        for state in [ExtentState::Data, ExtentState::Zero, ExtentState::Hole] {
            assert_eq!(extent_state(allocation_type(state).0), state);
        }
        assert_eq!(allocation_type(ExtentState::Hole), (3, "hole,zero"));
    }
}
