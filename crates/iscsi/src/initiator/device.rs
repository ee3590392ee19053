//! The initiator as a [`BlockDevice`]: one logical unit of an iSCSI target, reached
//! over one or more sessions (`?sessions=N`), each request on the least-loaded one.
//!
//! What the device can do comes from the logical unit itself (SBC-3): READ
//! CAPACITY (16) for size, block size and provisioning; the Block Limits VPD page
//! for the largest transfer, UNMAP and WRITE SAME; the Logical Block Provisioning
//! page for UNMAP and WRITE SAME with UNMAP; REPORT SUPPORTED OPERATION CODES for
//! WRITE SAME (16), GET LBA STATUS and SYNCHRONIZE CACHE (16). Anything the unit
//! does not say it supports is left to the checked handle to emulate.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use blockwire_blockdev::{
    BlockDevice, BlockSizes, Capabilities, DeviceInfo, Error, ErrorKind, Extent, ExtentState,
    FastPath, Limits, Op, RequestQueue, Result, Support, WriteFlags, ZeroFlags,
};

use super::connect::{dial, login};
use super::connection::{Command, Connection, Timing};
use super::error::InitiatorError;
use super::login::{Credentials, LoginOptions};
use super::queue::IscsiQueue;
use super::recovery::Recovery;
use super::scsi::{self, BlockLimits, Capacity, Inquiry, Provisioning};
use super::session::Outcome;
use super::uri::{IscsiUri, SECRET_ENV, TARGET_SECRET_ENV};

/// Our iSCSI name when the URI names none (RFC 7143 §4.2.7.2 "iqn." form).
pub const DEFAULT_INITIATOR_NAME: &str = "iqn.2026-11.dev.blockwire:initiator";
/// The largest read or write we send as one command, whatever the unit allows.
const MAX_TRANSFER: u32 = 16 * 1024 * 1024;
/// Unit attentions a command is retried through (a fresh session usually has one:
/// power on or reset, SAM-5 5.14).
const UNIT_ATTENTION_RETRIES: usize = 5;

/// How an initiator connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiOptions {
    /// How long connecting and each login step may take.
    pub login_timeout: Duration,
    /// How long to keep reconnecting (session reinstatement, then a replay of the
    /// commands without status) after a connection drops; `None` fails them at
    /// once. The URI's `?reconnect=SECS` overrides it.
    pub reconnect: Option<Duration>,
    /// Idle time before a NOP-Out ping; a ping unanswered as long again ends the
    /// connection (which a reconnect may then restore).
    pub nop_interval: Duration,
    /// A command without status this long fails with a timeout, as does every
    /// other on its session, which closes; `None` waits (a slow unit is not a
    /// dead one, and pings catch dead connections).
    pub request_timeout: Option<Duration>,
}

pub use blockwire_blockdev::paths::DEFAULT_RECONNECT;

impl Default for IscsiOptions {
    fn default() -> Self {
        IscsiOptions {
            login_timeout: Duration::from_secs(15),
            reconnect: Some(DEFAULT_RECONNECT),
            nop_interval: super::connection::DEFAULT_NOP_INTERVAL,
            request_timeout: None,
        }
    }
}

/// What the logical unit told us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LunDetails {
    pub inquiry: Inquiry,
    pub capacity: Capacity,
    pub limits: BlockLimits,
    pub provisioning: Provisioning,
    pub write_same: bool,
    pub get_lba_status: bool,
    /// The Device Identification page and capacity, which a reconnect must find
    /// again (recovery.rs).
    pub identity: Vec<u8>,
}

/// One iSCSI logical unit as a block device.
pub struct IscsiClient {
    uri: IscsiUri,
    sessions: Vec<Connection>,
    next: AtomicUsize,
    details: LunDetails,
    info: DeviceInfo,
    /// SYNCHRONIZE CACHE (16) was refused: use the 10-byte form.
    flush10: AtomicBool,
}

impl std::fmt::Debug for IscsiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IscsiClient")
            .field("uri", &self.uri.to_string())
            .field("sessions", &self.sessions.len())
            .finish()
    }
}

fn read_secret_file(path: &str) -> std::result::Result<Vec<u8>, InitiatorError> {
    let text = std::fs::read(path)
        .map_err(|e| InitiatorError::Credentials(format!("cannot read secret file {path}: {e}")))?;
    // A trailing newline is the editor's, not the secret's.
    let end = text
        .iter()
        .rposition(|&b| b != b'\n' && b != b'\r')
        .map_or(0, |i| i + 1);
    Ok(text[..end].to_vec())
}

/// The CHAP credentials a URI asks for: the secret from the URI, a file, or the
/// environment, in that order.
pub fn credentials(uri: &IscsiUri) -> std::result::Result<Option<Credentials>, InitiatorError> {
    let Some(user) = &uri.user else {
        return Ok(None);
    };
    let secret = if let Some(password) = &uri.password {
        password.as_bytes().to_vec()
    } else if let Some(path) = &uri.secret_file {
        read_secret_file(path)?
    } else if let Ok(secret) = std::env::var(SECRET_ENV) {
        secret.into_bytes()
    } else {
        return Err(InitiatorError::Credentials(format!(
            "{uri}: CHAP user {user} needs a secret: {SECRET_ENV}=..., ?secret-file=PATH or user%secret@"
        )));
    };
    let target_secret = match (&uri.target_secret_file, std::env::var(TARGET_SECRET_ENV)) {
        (Some(path), _) => Some(read_secret_file(path)?),
        (None, Ok(secret)) => Some(secret.into_bytes()),
        (None, Err(_)) => None,
    };
    if uri.target_user.is_some() && target_secret.is_none() {
        return Err(InitiatorError::Credentials(format!(
            "{uri}: mutual CHAP needs the target's secret: {TARGET_SECRET_ENV}=... or ?target-secret-file=PATH"
        )));
    }
    Ok(Some(Credentials {
        user: user.clone(),
        secret,
        mutual: target_secret.map(|secret| (uri.target_user.clone(), secret)),
    }))
}

/// The connection's timing from the options.
pub(crate) fn timing(options: &IscsiOptions) -> Timing {
    Timing {
        nop_interval: options.nop_interval,
        request_timeout: options.request_timeout,
    }
}

/// An ISID of the "random" type (§11.12.5: T = 10b), so that two initiators on one
/// host never reinstate each other's sessions; `index` tells our sessions apart.
fn random_isid(index: u16) -> u64 {
    let mut random = [0u8; 3];
    if getrandom::getrandom(&mut random).is_err() {
        random = (std::process::id() as u32).to_be_bytes()[1..]
            .try_into()
            .unwrap_or([0; 3]);
    }
    let random = u64::from(random[0]) << 16 | u64::from(random[1]) << 8 | u64::from(random[2]);
    0x80 << 40 | random << 16 | u64::from(index)
}

impl IscsiClient {
    /// Logs in to the logical unit a URI names and learns what it can do.
    pub fn connect(
        uri: &IscsiUri,
        options: IscsiOptions,
    ) -> std::result::Result<IscsiClient, InitiatorError> {
        let address = uri.address();
        let Some(target) = uri.target.clone() else {
            return Err(InitiatorError::Device {
                address,
                detail: "the URI names no target (iscsi://HOST[:PORT]/IQN/LUN)".into(),
            });
        };
        let chap = credentials(uri)?;
        let reconnect = match uri.reconnect {
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
            None => options.reconnect.filter(|limit| !limit.is_zero()),
        };
        let mut sessions = Vec::with_capacity(uri.sessions);
        for index in 0..uri.sessions {
            let stream = dial(&address, options.login_timeout)?;
            let login_options = LoginOptions {
                initiator_name: uri
                    .initiator
                    .clone()
                    .unwrap_or_else(|| DEFAULT_INITIATOR_NAME.to_string()),
                target_name: Some(target.clone()),
                isid: random_isid(index as u16),
                tsih: 0,
                cid: 0,
                cmd_sn: 1,
                chap: chap.clone(),
                digests: uri.digest,
            };
            let params = login(
                &stream,
                &address,
                login_options.clone(),
                options.login_timeout,
            )?;
            tracing::debug!("{uri}: session {index} logged in: {params:?}");
            let name = format!("session {index} to {address}");
            // Reinstatement: the same ISID with TSIH 0 (§6.3.5).
            let recovery = reconnect.map(|limit| Recovery {
                address: address.clone(),
                login: login_options,
                limit,
                lun_field: crate::target::encode_lun(uri.lun),
                // Several attempts fit in the limit: a target process that is
                // still dying (a thread in uninterruptible I/O keeps its listening
                // socket open) takes connections it never answers.
                login_timeout: options
                    .login_timeout
                    .min((limit / 4).max(Duration::from_secs(1))),
            });
            let connection =
                Connection::start(stream, params, uri.lun, name, recovery, timing(&options))
                    .map_err(|source| InitiatorError::Io {
                        address: address.clone(),
                        source,
                    })?;
            sessions.push(connection);
        }
        let details = probe(&sessions[0], uri)?;
        for session in &sessions {
            session.set_identity(details.identity.clone());
        }
        let info = device_info(&details);
        Ok(IscsiClient {
            uri: uri.clone(),
            sessions,
            next: AtomicUsize::new(0),
            details,
            info,
            flush10: AtomicBool::new(false),
        })
    }

    pub fn uri(&self) -> &IscsiUri {
        &self.uri
    }

    /// What the logical unit reported.
    pub fn details(&self) -> &LunDetails {
        &self.details
    }

    /// Sessions in use.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// What session `index` negotiated.
    pub fn session_params(&self, index: usize) -> Option<super::login::SessionParams> {
        self.sessions.get(index).map(Connection::params)
    }

    /// The least-loaded live session; ties go round-robin.
    pub(crate) fn pick(&self) -> &Connection {
        &self.sessions[self.pick_index()]
    }

    /// Session `index`.
    pub(crate) fn session(&self, index: usize) -> &Connection {
        &self.sessions[index]
    }

    /// The index of [`pick`](Self::pick)'s session: the least loaded live one.
    pub(crate) fn pick_index(&self) -> usize {
        let sessions = &self.sessions;
        blockwire_blockdev::paths::least_loaded(
            sessions.len(),
            &self.next,
            |i| sessions[i].alive(),
            |i| sessions[i].in_flight(),
        )
    }

    pub(crate) fn block_size(&self) -> u64 {
        u64::from(self.details.capacity.block_size)
    }

    /// Runs a command, retrying through unit attentions; GOOD or an error.
    fn run(
        &self,
        command: &Command<'_>,
        read: Option<&mut [u8]>,
        write: Option<&[u8]>,
    ) -> Result<Outcome> {
        run_on(self.pick(), command, read, write)
    }

    fn blocks(&self, op: Op, offset: u64, len: u64) -> Result<(u64, u32)> {
        let bs = self.block_size();
        let blocks = u32::try_from(len / bs).map_err(|_| {
            Error::new(ErrorKind::TooLarge, op, offset, len)
                .with_detail("more than 2^32 - 1 blocks in one command")
        })?;
        Ok((offset / bs, blocks))
    }
}

/// Runs a command on `connection`, retrying through unit attentions.
fn run_on(
    connection: &Connection,
    command: &Command<'_>,
    mut read: Option<&mut [u8]>,
    write: Option<&[u8]>,
) -> Result<Outcome> {
    let mut attempts = 0;
    loop {
        let outcome = connection.execute(command, read.as_deref_mut(), write)?;
        if scsi::is_unit_attention(&outcome) && attempts < UNIT_ATTENTION_RETRIES {
            attempts += 1;
            continue;
        }
        if !scsi::is_good(&outcome) {
            return Err(scsi::status_error(
                &outcome,
                command.op,
                command.offset,
                command.len,
            ));
        }
        return Ok(outcome);
    }
}

/// An inquiry-type command returning up to `len` bytes; the bytes received.
pub(crate) fn fetch(connection: &Connection, cdb: &[u8], len: usize) -> Result<Vec<u8>> {
    fetch_from(connection, None, cdb, len)
}

/// [`fetch`] from logical unit `lun` (the session's when `None`).
pub(crate) fn fetch_from(
    connection: &Connection,
    lun: Option<u64>,
    cdb: &[u8],
    len: usize,
) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let command = Command {
        cdb,
        op: Op::Open,
        offset: 0,
        len: 0,
    };
    let mut attempts = 0;
    let outcome = loop {
        let outcome = match lun {
            Some(lun) => connection.execute_on(
                crate::target::encode_lun(lun),
                &command,
                Some(&mut buf),
                None,
            )?,
            None => connection.execute(&command, Some(&mut buf), None)?,
        };
        if scsi::is_unit_attention(&outcome) && attempts < UNIT_ATTENTION_RETRIES {
            attempts += 1;
            continue;
        }
        if !scsi::is_good(&outcome) {
            return Err(scsi::status_error(&outcome, Op::Open, 0, 0));
        }
        break outcome;
    };
    buf.truncate(outcome.received as usize);
    Ok(buf)
}

/// Whether the unit reports `opcode` (with `service_action`) as supported; `None`
/// when it cannot say.
fn supports(connection: &Connection, opcode: u8, service_action: Option<u16>) -> Option<bool> {
    let cdb = scsi::report_supported_opcode(opcode, service_action);
    fetch(connection, &cdb, 64)
        .ok()
        .map(|answer| scsi::opcode_supported(&answer))
}

/// Asks the logical unit what it is and what it can do.
fn probe(
    connection: &Connection,
    uri: &IscsiUri,
) -> std::result::Result<LunDetails, InitiatorError> {
    let failed = |what: &str, e: Error| InitiatorError::Device {
        address: uri.address(),
        detail: format!("{uri}: {what}: {e}"),
    };
    let ready = Command {
        cdb: &scsi::test_unit_ready(),
        op: Op::Open,
        offset: 0,
        len: 0,
    };
    // A unit that is not ready yet says so later, on I/O; only unit attentions
    // matter here (run_on retries through them).
    let _ = run_on(connection, &ready, None, None);
    let inquiry = fetch(connection, &scsi::inquiry(None, 96), 96)
        .map_err(|e| failed("INQUIRY", e))
        .and_then(|data| {
            scsi::parse_inquiry(&data).ok_or_else(|| InitiatorError::Device {
                address: uri.address(),
                detail: format!("{uri}: short INQUIRY data"),
            })
        })?;
    if inquiry.not_present {
        return Err(InitiatorError::Device {
            address: uri.address(),
            detail: format!("{uri}: no logical unit {} on this target", uri.lun),
        });
    }
    if inquiry.device_type != 0 {
        return Err(InitiatorError::Device {
            address: uri.address(),
            detail: format!(
                "{uri}: LUN {} is a {} device, not a disk",
                uri.lun,
                scsi::device_type_name(inquiry.device_type)
            ),
        });
    }
    let capacity_data = fetch(connection, &scsi::read_capacity16(), 32)
        .map_err(|e| failed("READ CAPACITY (16)", e))?;
    let capacity = scsi::parse_capacity(&capacity_data).ok_or_else(|| InitiatorError::Device {
        address: uri.address(),
        detail: format!("{uri}: malformed READ CAPACITY (16) data"),
    })?;
    // Without a Device Identification page, the capacity alone identifies it.
    let device_id = fetch(connection, &scsi::inquiry(Some(0x83), 255), 255).unwrap_or_default();
    let identity = super::recovery::identity(&device_id, &capacity_data);
    let pages = fetch(connection, &scsi::inquiry(Some(0), 255), 255)
        .map(|data| scsi::parse_supported_pages(&data))
        .unwrap_or_default();
    let limits = if pages.contains(&0xb0) {
        fetch(connection, &scsi::inquiry(Some(0xb0), 64), 64)
            .ok()
            .and_then(|page| scsi::parse_block_limits(&page))
            .unwrap_or_default()
    } else {
        BlockLimits::default()
    };
    let provisioning = if pages.contains(&0xb2) && capacity.provisioning {
        fetch(connection, &scsi::inquiry(Some(0xb2), 64), 64)
            .ok()
            .and_then(|page| scsi::parse_provisioning(&page))
            .unwrap_or_default()
    } else {
        Provisioning::default()
    };
    use blockwire_scsi::cdb::op;
    let write_same = supports(connection, op::WRITE_SAME_16, None).unwrap_or(false);
    let get_lba_status = capacity.provisioning
        && supports(
            connection,
            op::SERVICE_ACTION_IN_16,
            Some(op::SA_GET_LBA_STATUS),
        )
        .unwrap_or(true);
    Ok(LunDetails {
        inquiry,
        capacity,
        limits,
        provisioning,
        write_same,
        get_lba_status,
        identity,
    })
}

fn native(yes: bool) -> Support {
    if yes {
        Support::Native
    } else {
        Support::None
    }
}

/// The device's info from what the unit said.
fn device_info(details: &LunDetails) -> DeviceInfo {
    let bs = details.capacity.block_size;
    let limits = &details.limits;
    let max_blocks = match limits.max_transfer_blocks {
        0 => u32::MAX,
        n => n,
    };
    let maximum = (u64::from(max_blocks) * u64::from(bs)).min(u64::from(MAX_TRANSFER)) as u32;
    let maximum = (maximum / bs).max(1) * bs;
    // In u64: a large block size and exponent from the network must not overflow.
    let physical = (u64::from(bs) << details.capacity.physical_exponent.min(16))
        .min(u64::from(maximum)) as u32;
    let optimal = u32::from(limits.optimal_granularity_blocks).saturating_mul(bs);
    let preferred = physical.max(optimal).max(4096.max(bs)).min(maximum);
    let blocks_to_bytes = |blocks: u64| blocks.saturating_mul(u64::from(bs));
    // One UNMAP descriptor and one WRITE SAME (16) carry at most 2^32 - 1 blocks.
    let max_u32_blocks = blocks_to_bytes(u64::from(u32::MAX));
    let max_trim = match limits.max_unmap_blocks {
        0 => max_u32_blocks,
        n => blocks_to_bytes(u64::from(n)),
    };
    let max_write_zeroes = match limits.max_write_same_blocks {
        0 => blocks_to_bytes(1 << 16),
        n => blocks_to_bytes(n),
    }
    .min(max_u32_blocks);
    let mut info = DeviceInfo::new(details.capacity.blocks.saturating_mul(u64::from(bs)));
    info.block_sizes = BlockSizes {
        minimum: bs,
        preferred,
        maximum,
    };
    info.limits = Limits {
        max_trim,
        max_write_zeroes,
    };
    info.capabilities = Capabilities {
        flush: Support::Native,
        fua: Support::Native,
        trim: native(details.provisioning.unmap),
        write_zeroes: native(details.write_same),
        fast_zero: Support::None,
        extents: native(details.get_lba_status),
        cache: Support::None,
    };
    // Other initiators may write the unit meanwhile; but our own sessions see
    // one another's writes (one logical unit) and a flush covers them all.
    info.consistent_across_handles = true;
    info
}

impl BlockDevice for IscsiClient {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len() as u64;
        let (lba, blocks) = self.blocks(Op::Read, offset, len)?;
        let cdb = scsi::read16(lba, blocks);
        let command = Command {
            cdb: &cdb,
            op: Op::Read,
            offset,
            len,
        };
        let outcome = self.run(&command, Some(buf), None)?;
        scsi::check_io(&outcome, Op::Read, offset, len)
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let len = buf.len() as u64;
        let (lba, blocks) = self.blocks(Op::Write, offset, len)?;
        let cdb = scsi::write16(lba, blocks, flags.fua);
        let command = Command {
            cdb: &cdb,
            op: Op::Write,
            offset,
            len,
        };
        let outcome = self.run(&command, None, Some(buf))?;
        scsi::check_io(&outcome, Op::Write, offset, len)
    }

    fn flush(&self) -> Result<()> {
        let command16 = scsi::synchronize_cache16();
        let command10 = scsi::synchronize_cache10();
        let use10 = self.flush10.load(Ordering::Relaxed);
        let command = Command {
            cdb: if use10 {
                &command10[..]
            } else {
                &command16[..]
            },
            op: Op::Flush,
            offset: 0,
            len: 0,
        };
        // With several sessions, a flush on each covers writes completed on any
        // (the unit's cache is one, but a write may still be in flight on another
        // session's connection: it is not completed, so it need not be covered).
        match self.run(&command, None, None) {
            Err(e) if e.kind() == ErrorKind::Unsupported && !use10 => {
                self.flush10.store(true, Ordering::Relaxed);
                self.flush()
            }
            other => other.map(drop),
        }
    }

    fn trim(&self, offset: u64, len: u64, _flags: WriteFlags) -> Result<()> {
        if !self.details.provisioning.unmap {
            return Err(Error::new(ErrorKind::Unsupported, Op::Trim, offset, len));
        }
        let (lba, blocks) = self.blocks(Op::Trim, offset, len)?;
        if blocks == 0 {
            return Ok(());
        }
        let list = scsi::unmap_list(lba, blocks);
        let cdb = scsi::unmap(list.len() as u16);
        let command = Command {
            cdb: &cdb,
            op: Op::Trim,
            offset,
            len,
        };
        self.run(&command, None, Some(&list)).map(drop)
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        if !self.details.write_same || flags.fast {
            return Err(Error::new(
                ErrorKind::Unsupported,
                Op::WriteZeroes,
                offset,
                len,
            ));
        }
        let (lba, blocks) = self.blocks(Op::WriteZeroes, offset, len)?;
        if blocks == 0 {
            return Ok(());
        }
        // Unmapping is allowed when the range need not stay allocated and unmapped
        // blocks read as zeroes (SBC-3 4.7.3.4: LBPRZ).
        let unmap = !flags.no_hole
            && self.details.provisioning.write_same_unmap
            && self.details.capacity.reads_zero;
        let cdb = scsi::write_same16(lba, blocks, unmap);
        let zero = vec![0u8; self.block_size() as usize];
        let command = Command {
            cdb: &cdb,
            op: Op::WriteZeroes,
            offset,
            len,
        };
        self.run(&command, None, Some(&zero))?;
        if flags.fua {
            self.flush()?;
        }
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        if !self.details.get_lba_status {
            return Err(Error::new(ErrorKind::Unsupported, Op::Extents, offset, len));
        }
        if len == 0 {
            return Ok(());
        }
        let bs = self.block_size();
        let cdb = scsi::get_lba_status(offset / bs, 4096);
        let mut buf = vec![0u8; 4096];
        let command = Command {
            cdb: &cdb,
            op: Op::Extents,
            offset,
            len,
        };
        let outcome = self.run(&command, Some(&mut buf), None)?;
        buf.truncate(outcome.received as usize);
        let end = offset + len;
        let mut at = offset;
        for scsi::LbaStatus {
            lba,
            blocks,
            provisioning,
        } in scsi::parse_lba_status(&buf)
        {
            let start = lba.saturating_mul(bs);
            let stop = start.saturating_add(u64::from(blocks).saturating_mul(bs));
            // Descriptors must continue where the last one ended (SBC-3 5.6.2).
            if start > at || stop <= at {
                break;
            }
            let state = match provisioning {
                0 => ExtentState::Data,
                _ if self.details.capacity.reads_zero => ExtentState::Hole,
                _ => ExtentState::Data,
            };
            out.push(Extent {
                offset: at,
                len: stop - at,
                state,
            });
            at = stop;
            if at >= end {
                break;
            }
        }
        if at == offset {
            // Nothing usable: call the range data, which is always true.
            out.push(Extent {
                offset,
                len,
                state: ExtentState::Data,
            });
        }
        Ok(())
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

/// The request queue is this client's one fast path.
impl FastPath for IscsiClient {
    fn queue(&self) -> Option<Box<dyn RequestQueue + '_>> {
        Some(Box::new(IscsiQueue::new(self)))
    }
}

/// Shared by the queue: a command for a block read or write.
pub(crate) fn io_cdb(
    client: &IscsiClient,
    write: Option<WriteFlags>,
    offset: u64,
    len: u64,
) -> Result<[u8; 16]> {
    let op = if write.is_some() { Op::Write } else { Op::Read };
    let (lba, blocks) = client.blocks(op, offset, len)?;
    Ok(match write {
        Some(flags) => scsi::write16(lba, blocks, flags.fua),
        None => scsi::read16(lba, blocks),
    })
}
