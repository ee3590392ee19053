//! A write-log device: a composer that records every write, trim, write-zeroes and
//! flush that passes through it, in order, as Linux's dm-log-writes does, and from
//! that log tells what the device may hold after a crash at any point of it.
//!
//! Each change is logged twice: when it is issued (with its data) and when it
//! completes, so a crash point knows which changes were done, which were under
//! way, and which had not begun. A flush is logged when it completes, with the
//! changes that had completed when it was issued: those it covers (a flush says
//! nothing about changes still in flight when it arrives).
//!
//! After a crash at log position `at`, a sector may hold:
//! - under [`Loss::Power`] (the disk lost its cache): the value of the last change to
//!   it that was durable by then — completed with FUA, or covered by a completed
//!   flush — or of any change after that one which had been issued by then;
//! - under [`Loss::Process`] (the target was killed; the page cache survived, so
//!   every completed change is there): the value of the last completed change, or
//!   of any change issued after it.
//!
//! A trimmed sector may hold anything. [`WriteLog::check`] compares an image against
//! those possibilities, sector by sector; tests use it to prove that a target never
//! acknowledges a flush or a FUA write before the device has done it.

use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::{BlockDevice, Extent, WriteFlags, ZeroFlags};
use crate::error::Result;
use crate::fast_path::FastPath;
use crate::handle::Device;
use crate::info::DeviceInfo;

/// The unit the check works in: a change covers whole sectors of it or is checked
/// byte by byte where it does not.
pub const SECTOR: u64 = 512;

/// What a change does to its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Write(Arc<[u8]>),
    /// Contents afterwards unspecified.
    Trim(u64),
    /// Zeroes afterwards.
    Zeroes(u64),
}

impl Change {
    fn len(&self) -> u64 {
        match self {
            Change::Write(data) => data.len() as u64,
            Change::Trim(len) | Change::Zeroes(len) => *len,
        }
    }
}

/// One record of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Change number `id` was issued.
    Issued {
        id: usize,
        offset: u64,
        change: Change,
        fua: bool,
    },
    /// Change `id` completed successfully.
    Completed { id: usize },
    /// A flush completed; it covers the changes completed before it was issued:
    /// those that had completed by log position `covers`.
    Flushed { covers: usize },
}

/// What a crash took away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Power: only durable changes are sure to be there.
    Power,
    /// The process: every completed change is there.
    Process,
}

/// A byte of the image that no allowed state explains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Where (bytes from the start of the device).
    pub offset: u64,
    pub found: u8,
    /// The value a durable (or completed) change left there, which the image lacks.
    pub expected: u8,
}

/// A device that logs the changes passing through it.
pub struct WriteLog {
    inner: Device,
    info: DeviceInfo,
    records: Mutex<Vec<Record>>,
    /// Changes issued so far (taken under the records' lock, so ids follow the log).
    issued: AtomicUsize,
}

impl WriteLog {
    pub fn new(inner: Device) -> WriteLog {
        let info = *inner.info();
        WriteLog {
            inner,
            info,
            records: Mutex::new(Vec::new()),
            issued: AtomicUsize::new(0),
        }
    }

    fn records(&self) -> MutexGuard<'_, Vec<Record>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the log so far.
    pub fn log(&self) -> Vec<Record> {
        self.records().clone()
    }

    /// The log's length: a crash point.
    pub fn position(&self) -> usize {
        self.records().len()
    }

    /// Logs `change` as issued, runs it, and logs its completion if it succeeded.
    fn change(
        &self,
        offset: u64,
        change: Change,
        fua: bool,
        run: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let id = {
            let mut records = self.records();
            // Changes are numbered in issue order.
            let id = self.issued.fetch_add(1, Ordering::Relaxed);
            records.push(Record::Issued {
                id,
                offset,
                change,
                fua,
            });
            id
        };
        run()?;
        self.records().push(Record::Completed { id });
        Ok(())
    }

    /// Whether a write of `data` at `offset` has completed and is durable by now:
    /// written with FUA, or covered by a completed flush.
    ///
    /// The device may have seen the write in other pieces than the client sent: a
    /// target that gathers consecutive requests into one device write (AoE's runs)
    /// or splits one into several, or that writes a retransmitted request again.
    /// So every byte is checked on its own: going back from the latest change to
    /// reach it, every change must have carried that byte, until one that completed
    /// and is durable.
    pub fn is_durable(&self, offset: u64, data: &[u8]) -> bool {
        let records = self.records();
        let durable = |id: usize, fua: bool| {
            let Some(completed) = records
                .iter()
                .position(|record| *record == Record::Completed { id })
            else {
                return false;
            };
            fua || records
                .iter()
                .any(|record| matches!(record, Record::Flushed { covers } if completed < *covers))
        };
        // Byte ranges not yet explained, as offsets.
        let mut open = vec![(offset, offset + data.len() as u64)];
        for record in records.iter().rev() {
            let Record::Issued {
                id,
                offset: at,
                change,
                fua,
            } = record
            else {
                continue;
            };
            let (start, end) = (*at, at + change.len());
            let mut still_open = Vec::with_capacity(open.len());
            for (from, to) in open {
                let (lo, hi) = (from.max(start), to.min(end));
                if lo >= hi {
                    still_open.push((from, to));
                    continue;
                }
                let Change::Write(written) = change else {
                    return false; // trimmed or zeroed since
                };
                let carried = &written[(lo - start) as usize..(hi - start) as usize];
                let wanted = &data[(lo - offset) as usize..(hi - offset) as usize];
                if carried != wanted {
                    return false;
                }
                if !durable(*id, *fua) {
                    // The same bytes again, not durable yet (an AoE frame sent
                    // twice, say): a crash leaves these bytes either way, so an
                    // earlier durable write of them still counts.
                    still_open.push((from, to));
                    continue;
                }
                if from < lo {
                    still_open.push((from, lo));
                }
                if hi < to {
                    still_open.push((hi, to));
                }
            }
            open = still_open;
            if open.is_empty() {
                return true;
            }
        }
        data.is_empty()
    }

    /// Checks `image` (the device as read after a crash at log position `at`, which
    /// held `initial` before the first change) against what the log allows under
    /// `loss`. Returns every byte no allowed state explains (at most `limit`).
    pub fn check(
        &self,
        initial: &[u8],
        image: &[u8],
        at: usize,
        loss: Loss,
        limit: usize,
    ) -> Vec<Violation> {
        let records = self.records();
        let records = &records[..at.min(records.len())];
        check_log(records, initial, image, loss, limit)
    }
}

/// A change as the check sees it.
struct Seen<'a> {
    offset: u64,
    change: &'a Change,
    fua: bool,
    /// Log positions of its issue and, if it completed, its completion.
    issued: usize,
    completed: Option<usize>,
}

/// [`WriteLog::check`] on a log prefix.
pub fn check_log(
    records: &[Record],
    initial: &[u8],
    image: &[u8],
    loss: Loss,
    limit: usize,
) -> Vec<Violation> {
    let mut changes: Vec<Seen<'_>> = Vec::new();
    // Ids need not follow the log's order (a client numbering writes on several
    // threads logs them as they go).
    let mut index_of: HashMap<usize, usize> = HashMap::new();
    // Completed-change counts at each position, for the flushes' coverage.
    let mut flushes: Vec<(usize, usize)> = Vec::new();
    for (position, record) in records.iter().enumerate() {
        match record {
            Record::Issued {
                id,
                offset,
                change,
                fua,
            } => {
                index_of.insert(*id, changes.len());
                changes.push(Seen {
                    offset: *offset,
                    change,
                    fua: *fua,
                    issued: position,
                    completed: None,
                });
            }
            Record::Completed { id } => {
                if let Some(&index) = index_of.get(id) {
                    changes[index].completed = Some(position);
                }
            }
            Record::Flushed { covers } => flushes.push((*covers, position)),
        }
    }
    let covered_by_a_flush =
        |completed: usize| flushes.iter().any(|&(covers, _)| completed < covers);
    let sure: Vec<bool> = changes
        .iter()
        .map(|seen| match (loss, seen.completed) {
            (_, None) => false,
            (Loss::Process, Some(_)) => true,
            (Loss::Power, Some(position)) => seen.fua || covered_by_a_flush(position),
        })
        .collect();
    let len = image.len().min(initial.len());
    // Which changes touch each sector, in issue order.
    let mut by_sector: Vec<Vec<usize>> = vec![Vec::new(); (len as u64).div_ceil(SECTOR) as usize];
    for (index, seen) in changes.iter().enumerate() {
        let first = seen.offset / SECTOR;
        let end = (seen.offset + seen.change.len()).div_ceil(SECTOR);
        for sector in first..end.min(by_sector.len() as u64) {
            by_sector[sector as usize].push(index);
        }
    }
    let mut violations = Vec::new();
    for byte in 0..len as u64 {
        let here = &by_sector[(byte / SECTOR) as usize];
        let over = |index: &usize| {
            let seen = &changes[*index];
            byte >= seen.offset && byte < seen.offset + seen.change.len()
        };
        // The last sure change over this byte, and the changes that may lie on top
        // of it: every other one over the byte that had not completed when it was
        // issued (changes in flight together have no order).
        let last_sure = here
            .iter()
            .rev()
            .find(|&&index| over(&index) && sure[index])
            .copied();
        let (base, since) = match last_sure {
            Some(index) => (value_of(&changes[index], byte), Some(changes[index].issued)),
            None => (Some(initial[byte as usize]), None),
        };
        let found = image[byte as usize];
        let explained = base.is_none_or(|value| value == found)
            || here.iter().any(|&index| {
                let seen = &changes[index];
                Some(index) != last_sure
                    && over(&index)
                    && since.is_none_or(|since| seen.completed.is_none_or(|done| done > since))
                    && value_of(seen, byte).is_none_or(|value| value == found)
            });
        if !explained {
            violations.push(Violation {
                offset: byte,
                found,
                expected: base.unwrap_or_default(),
            });
            if violations.len() >= limit {
                break;
            }
        }
    }
    violations
}

/// What `seen` leaves at `byte` (within its range); `None`: anything (a trim).
fn value_of(seen: &Seen<'_>, byte: u64) -> Option<u8> {
    match seen.change {
        Change::Write(data) => Some(data[(byte - seen.offset) as usize]),
        Change::Trim(_) => None,
        Change::Zeroes(_) => Some(0),
    }
}

impl BlockDevice for WriteLog {
    fn info(&self) -> DeviceInfo {
        self.info
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.change(offset, Change::Write(buf.into()), flags.fua, || {
            self.inner.write(buf, offset, flags)
        })
    }

    fn flush(&self) -> Result<()> {
        let covers = self.position();
        self.inner.flush()?;
        self.records().push(Record::Flushed { covers });
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.change(offset, Change::Trim(len), flags.fua, || {
            self.inner.trim(offset, len, flags)
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> Result<()> {
        self.change(offset, Change::Zeroes(len), flags.fua, || {
            self.inner.write_zeroes(offset, len, flags)
        })
    }

    fn extents(&self, offset: u64, len: u64, out: &mut Vec<Extent>) -> Result<()> {
        out.extend(self.inner.extents(offset, len)?);
        Ok(())
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.cache(offset, len)
    }

    fn fast_path(&self) -> Option<&dyn FastPath> {
        Some(self)
    }
}

/// A vectored write is one change in the log, as the target made it; reads take the
/// plain route.
impl FastPath for WriteLog {
    fn write_vectored_at(
        &self,
        bufs: &[IoSlice<'_>],
        offset: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        let data: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        self.change(offset, Change::Write(data.into()), flags.fua, || {
            self.inner.write_vectored(bufs, offset, flags)
        })
    }
}

#[cfg(test)]
#[path = "write_log_tests.rs"]
mod tests;
