//! Riding out a target restart (session recovery at ErrorRecoveryLevel 0, RFC 7143
//! §6.3.5 and §7.1.4.3): when a connection drops, log in again with the same ISID
//! and TSIH 0 — session reinstatement, which makes the target drop whatever is left
//! of the old session — check that the logical unit is the same one (its device
//! identifier and capacity), and hand the new socket to the connection, which
//! re-sends every command that had no status.
//!
//! The check runs its commands synchronously on the fresh socket before the
//! connection's reader takes it over: nothing else is in flight then.

use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::connect::{dial, login};
use super::connection::{lock, Link, Pending, Shared};
use super::error::InitiatorError;
use super::login::{LoginOptions, SessionParams};
use super::reader::End;
use super::scsi;
use super::session::Window;
use super::wire::{send_pdu, Digests, PduReader};
use crate::pdu::{Pdu, ScsiCommand, TaskAttribute, RESERVED_TAG};

/// How to log in again.
#[derive(Debug, Clone)]
pub(crate) struct Recovery {
    pub address: String,
    pub login: LoginOptions,
    /// How long to keep trying after a connection drops.
    pub limit: Duration,
    pub lun_field: u64,
    pub login_timeout: Duration,
}

/// Why an attempt failed.
pub(crate) enum Attempt {
    /// Worth another try (the target is not back yet).
    Retry(String),
    /// Never worth replaying (a different logical unit answers).
    Fatal(String),
}

/// Unit attentions the identity check reads through (a reinstated session has one).
const UNIT_ATTENTION_RETRIES: usize = 5;

/// The bytes that identify a logical unit: its Device Identification VPD page
/// (83h) and READ CAPACITY (16)'s block count and size.
pub(crate) fn identity(device_id: &[u8], capacity: &[u8]) -> Vec<u8> {
    let mut out = device_id.to_vec();
    out.extend_from_slice(capacity.get(..12).unwrap_or(capacity));
    out
}

/// One reconnection attempt: dial, log in (reinstating the session), and compare
/// the unit's identity with `expected`. Returns the socket and the parameters, with
/// CmdSN and ExpStatSN past the check's commands.
pub(crate) fn attempt(
    recovery: &Recovery,
    expected: Option<&[u8]>,
) -> Result<(TcpStream, SessionParams), Attempt> {
    let retry = |e: InitiatorError| Attempt::Retry(e.to_string());
    let stream = dial(&recovery.address, recovery.login_timeout).map_err(retry)?;
    let mut params = login(
        &stream,
        &recovery.address,
        recovery.login.clone(),
        recovery.login_timeout,
    )
    // A refusal now (a target still starting up may not know its targets yet) is
    // tried again until the limit.
    .map_err(retry)?;
    if let Some(expected) = expected {
        let mut check =
            Check::new(&stream, &mut params, recovery.lun_field).map_err(Attempt::Retry)?;
        let device_id = check
            .fetch(&scsi::inquiry(Some(0x83), 255), 255)
            .map_err(Attempt::Retry)?;
        let capacity = check
            .fetch(&scsi::read_capacity16(), 32)
            .map_err(Attempt::Retry)?;
        if identity(&device_id, &capacity) != expected {
            return Err(Attempt::Fatal(
                "the logical unit's identity (device identifier or capacity) changed \
                 across the reconnect; not replaying"
                    .into(),
            ));
        }
    }
    Ok((stream, params))
}

/// Synchronous commands on a fresh session.
struct Check<'a> {
    reader: PduReader,
    writer: TcpStream,
    digests: Digests,
    params: &'a mut SessionParams,
    lun_field: u64,
}

impl<'a> Check<'a> {
    fn new(
        stream: &TcpStream,
        params: &'a mut SessionParams,
        lun_field: u64,
    ) -> Result<Check<'a>, String> {
        let digests = Digests {
            header: params.header_digest,
            data: params.data_digest,
        };
        let mut reader = PduReader::new(
            stream.try_clone().map_err(|e| e.to_string())?,
            params.initiator_max_recv,
        );
        reader.digests = digests;
        Ok(Check {
            reader,
            writer: stream.try_clone().map_err(|e| e.to_string())?,
            digests,
            params,
            lun_field,
        })
    }

    /// Runs a command reading up to `len` bytes, through unit attentions.
    fn fetch(&mut self, cdb: &[u8], len: usize) -> Result<Vec<u8>, String> {
        for _ in 0..=UNIT_ATTENTION_RETRIES {
            let (status, sense, data) = self.once(cdb, len)?;
            let outcome = super::session::Outcome {
                status,
                sense,
                ..Default::default()
            };
            if scsi::is_unit_attention(&outcome) {
                continue;
            }
            if status != blockwire_scsi::Status::Good as u8 {
                return Err(format!("status {status:#04x} to the identity check"));
            }
            return Ok(data);
        }
        Err("unit attentions do not stop".into())
    }

    fn once(&mut self, cdb: &[u8], len: usize) -> Result<(u8, Vec<u8>, Vec<u8>), String> {
        let itt = 1;
        let command = ScsiCommand {
            final_bit: true,
            read: true,
            attribute: TaskAttribute::Simple,
            lun: self.lun_field,
            initiator_task_tag: itt,
            expected_data_transfer_length: len as u32,
            cmd_sn: self.params.cmd_sn,
            exp_stat_sn: self.params.exp_stat_sn,
            cdb: cdb.to_vec(),
            ..ScsiCommand::default()
        };
        self.params.cmd_sn = self.params.cmd_sn.wrapping_add(1);
        let header = Pdu::ScsiCommand(command).encode(0);
        send_pdu(&mut self.writer, &header, &[], self.digests).map_err(|e| e.to_string())?;
        let mut data = vec![0u8; len];
        let mut received = 0usize;
        loop {
            let (bhs, ahs) = self.reader.read_header().map_err(|e| e.to_string())?;
            let seg = bhs.data_len() as usize;
            match Pdu::decode(&bhs, &ahs).map_err(|e| e.to_string())? {
                Pdu::DataIn(d) if d.initiator_task_tag == itt => {
                    let at = d.buffer_offset as usize;
                    let end = at.checked_add(seg).filter(|&e| e <= len).ok_or_else(|| {
                        "Data-In beyond the buffer during the identity check".to_string()
                    })?;
                    self.reader
                        .read_data(&mut data[at..end])
                        .map_err(|e| e.to_string())?;
                    received = received.max(end);
                    if let Some(status) = d.status {
                        self.params.exp_stat_sn = d.stat_sn.wrapping_add(1);
                        data.truncate(received);
                        return Ok((status, Vec::new(), data));
                    }
                }
                Pdu::ScsiResponse(r) if r.initiator_task_tag == itt => {
                    let body = self
                        .reader
                        .read_data_vec(seg as u32)
                        .map_err(|e| e.to_string())?;
                    self.params.exp_stat_sn = r.stat_sn.wrapping_add(1);
                    let sense = body.get(2..).map(<[u8]>::to_vec).unwrap_or_default();
                    data.truncate(received);
                    return Ok((r.status, sense, data));
                }
                Pdu::NopIn(n) if n.target_transfer_tag != RESERVED_TAG => {
                    // Too early for pings to matter; the connection answers later ones.
                    self.reader
                        .read_data_vec(seg as u32)
                        .map_err(|e| e.to_string())?;
                }
                _ => {
                    self.reader
                        .read_data_vec(seg as u32)
                        .map_err(|e| e.to_string())?;
                }
            }
        }
    }
}

/// Longest pause between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Reconnects after the connection dropped (recovery.rs), with backoff, for up to
/// the recovery limit; installs the new socket and replays every command without
/// status. Returns the new socket's reader.
pub(super) fn recover(shared: &Arc<Shared>, end: &End) -> Result<PduReader, String> {
    let recovery = shared.recovery.as_ref().expect("recovery enabled");
    shared.broken.store(true, Ordering::Release);
    shared.shutdown();
    tracing::warn!(
        "{}: connection lost ({end}); reconnecting for up to {:?}",
        shared.name,
        recovery.limit
    );
    let expected = lock(&shared.identity).clone();
    let deadline = Instant::now() + recovery.limit;
    let mut delay = Duration::from_millis(50);
    let (stream, params) = loop {
        if shared.dropping.load(Ordering::Acquire) {
            return Err("closed by the initiator while reconnecting".into());
        }
        match attempt(recovery, expected.as_deref()) {
            Ok(fresh) => break fresh,
            Err(Attempt::Fatal(reason)) => return Err(reason),
            Err(Attempt::Retry(reason)) => {
                if Instant::now() + delay > deadline {
                    return Err(format!(
                        "the connection dropped ({end}) and reconnecting failed for {:?}: {reason}",
                        recovery.limit
                    ));
                }
                tracing::debug!("{}: reconnecting: {reason}", shared.name);
                thread::sleep(delay);
                delay = (delay * 2).min(MAX_BACKOFF);
            }
        }
    };
    let digests = Digests {
        header: params.header_digest,
        data: params.data_digest,
    };
    stream
        .set_read_timeout(Some(shared.tick))
        .map_err(|e| e.to_string())?;
    let control = stream.try_clone().map_err(|e| e.to_string())?;
    let mut reader = PduReader::new(
        stream.try_clone().map_err(|e| e.to_string())?,
        params.initiator_max_recv,
    );
    reader.digests = digests;
    let replay: Vec<Pending> = {
        // Under the writer lock: no sender sends on the old link meanwhile, and
        // every command registered so far is either in the replay or sent by its
        // own thread after `broken` clears (each task is claimed once).
        let mut link = lock(&shared.writer);
        *lock(&shared.control) = control;
        *lock(&shared.window) = Window::new(
            params.cmd_sn,
            params.exp_cmd_sn,
            params.max_cmd_sn,
            params.exp_stat_sn,
        );
        *link = Link {
            stream,
            params,
            digests,
        };
        let tasks = lock(&shared.tasks);
        let mut replay: Vec<Pending> = tasks
            .map
            .iter()
            .map(|(&itt, task)| {
                task.reset_for_replay();
                Pending {
                    itt,
                    task: task.clone(),
                }
            })
            .collect();
        // Oldest first (tags count up from 1; a wrap merely reorders).
        replay.sort_by_key(|p| p.itt);
        shared.broken.store(false, Ordering::Release);
        replay
    };
    shared.window_moved.notify_all();
    tracing::info!(
        "{}: reconnected; re-sending {} command(s)",
        shared.name,
        replay.len()
    );
    if !replay.is_empty() {
        // Sent from another thread: this one must read the answers meanwhile, or a
        // large replay could fill both sockets and stall.
        let sender = shared.clone();
        let mut replay = replay;
        thread::Builder::new()
            .name("iscsi-replay".into())
            .spawn(move || sender.send_pending(&mut replay))
            .map_err(|e| format!("cannot start the replay: {e}"))?;
    }
    Ok(reader)
}
