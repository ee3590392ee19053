//! What the Error Information and SMART / Health log pages report: a
//! controller's recent command errors (a small ring, newest first, as NVMe base
//! 2.0 "Error Information Log Entry" lays them out) and a namespace's I/O
//! counts, kept for as long as the target serves the namespace.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cqe::{sct, Status};

/// Error log entries a controller keeps (Identify Controller ELPE is this - 1).
pub const ERROR_LOG_ENTRIES: usize = 64;
/// Bytes in one error log entry.
pub const ERROR_ENTRY_LEN: usize = 64;

/// A command that completed with an error, as the error log records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandError {
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
    /// The first LBA of the command's range (0 when it has none).
    pub lba: u64,
    /// The namespace the command named (0 when none).
    pub nsid: u32,
}

/// A controller's error log: the lifetime count and the latest entries.
#[derive(Debug, Default)]
pub struct ErrorLog {
    count: u64,
    media: u64,
    recent: VecDeque<(u64, CommandError)>,
}

impl ErrorLog {
    /// Records `error` as the next entry; the oldest goes when the ring is full.
    pub fn record(&mut self, error: CommandError) {
        // The count is never 0 for a real entry (0 marks an empty one).
        self.count += 1;
        if error.status.sct() == sct::MEDIA {
            self.media += 1;
        }
        if self.recent.len() == ERROR_LOG_ENTRIES {
            self.recent.pop_back();
        }
        self.recent.push_front((self.count, error));
    }

    /// Errors recorded since the controller was created.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Of those, media and data integrity errors (SMART's "Media and Data
    /// Integrity Errors").
    pub fn media_errors(&self) -> u64 {
        self.media
    }

    /// The log page: [`ERROR_LOG_ENTRIES`] entries, newest first; unused entries
    /// are zeroes (an error count of 0 means "no entry").
    pub fn page(&self) -> Vec<u8> {
        let mut page = vec![0u8; ERROR_LOG_ENTRIES * ERROR_ENTRY_LEN];
        for (entry, (count, error)) in page.chunks_exact_mut(ERROR_ENTRY_LEN).zip(&self.recent) {
            entry[0..8].copy_from_slice(&count.to_le_bytes());
            entry[8..10].copy_from_slice(&error.sqid.to_le_bytes());
            entry[10..12].copy_from_slice(&error.cid.to_le_bytes());
            // The status field as in a completion: phase tag in bit 0.
            entry[12..14].copy_from_slice(&(error.status.0 << 1).to_le_bytes());
            // Parameter Error Location: not known.
            entry[14..16].copy_from_slice(&0xffffu16.to_le_bytes());
            entry[16..24].copy_from_slice(&error.lba.to_le_bytes());
            entry[24..28].copy_from_slice(&error.nsid.to_le_bytes());
            entry[29] = 3; // Transport Type: TCP
        }
        page
    }
}

/// A namespace's reads and writes, for the SMART / Health log page.
#[derive(Debug, Default)]
pub struct IoStats {
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
    read_commands: AtomicU64,
    write_commands: AtomicU64,
}

impl IoStats {
    /// One read of `bytes` served.
    pub fn read(&self, bytes: u64) {
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.read_commands.fetch_add(1, Ordering::Relaxed);
    }

    /// One write of `bytes` done.
    pub fn wrote(&self, bytes: u64) {
        self.written_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.write_commands.fetch_add(1, Ordering::Relaxed);
    }

    /// Data Units Read and Written: thousands of 512-byte units, rounded up.
    pub fn data_units(&self) -> (u64, u64) {
        let units = |bytes: &AtomicU64| bytes.load(Ordering::Relaxed).div_ceil(512_000);
        (units(&self.read_bytes), units(&self.written_bytes))
    }

    /// Host Read and Write Commands.
    pub fn commands(&self) -> (u64, u64) {
        (
            self.read_commands.load(Ordering::Relaxed),
            self.write_commands.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(cid: u16) -> CommandError {
        CommandError {
            sqid: 1,
            cid,
            status: Status::LBA_OUT_OF_RANGE,
            lba: 0x1_0000_0000 + u64::from(cid),
            nsid: 1,
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_entries_first_and_counts_them_all() {
        let mut log = ErrorLog::default();
        assert!(log.page().iter().all(|&b| b == 0));
        for cid in 0..ERROR_LOG_ENTRIES as u16 + 5 {
            log.record(error(cid));
        }
        assert_eq!(log.count(), ERROR_LOG_ENTRIES as u64 + 5);
        let page = log.page();
        assert_eq!(page.len(), ERROR_LOG_ENTRIES * ERROR_ENTRY_LEN);
        let newest = &page[..ERROR_ENTRY_LEN];
        assert_eq!(
            u64::from_le_bytes(newest[0..8].try_into().unwrap()),
            log.count()
        );
        assert_eq!(u16::from_le_bytes([newest[8], newest[9]]), 1);
        let last_cid = ERROR_LOG_ENTRIES as u16 + 4;
        assert_eq!(u16::from_le_bytes([newest[10], newest[11]]), last_cid);
        let status = u16::from_le_bytes([newest[12], newest[13]]);
        assert_eq!(status >> 1, Status::LBA_OUT_OF_RANGE.0);
        assert_eq!(
            u64::from_le_bytes(newest[16..24].try_into().unwrap()),
            0x1_0000_0000 + u64::from(last_cid)
        );
        assert_eq!(u32::from_le_bytes(newest[24..28].try_into().unwrap()), 1);
        let oldest = &page[(ERROR_LOG_ENTRIES - 1) * ERROR_ENTRY_LEN..];
        assert_eq!(u64::from_le_bytes(oldest[0..8].try_into().unwrap()), 6);
        assert_eq!(log.media_errors(), 0);
        log.record(CommandError {
            status: Status::new(sct::MEDIA, 0x81, false),
            ..error(1)
        });
        assert_eq!(log.media_errors(), 1);
    }

    #[test]
    fn data_units_are_thousands_of_sectors_rounded_up() {
        let stats = IoStats::default();
        assert_eq!(stats.data_units(), (0, 0));
        stats.read(512);
        stats.wrote(512_000);
        stats.wrote(512_001);
        assert_eq!(stats.data_units(), (1, 3));
        assert_eq!(stats.commands(), (1, 2));
    }
}
