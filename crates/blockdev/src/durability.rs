//! The acknowledgement trial: proves through a client that a target acknowledges a
//! FUA write or a flush only after the device below it has made the data durable.
//!
//! The target serves a [`WriteLog`] over a [`VolatileCache`]: the log says what the
//! target asked of the device and when, the cache's medium what a power loss would
//! leave. Client threads write blocks of their own (no two writes overlap), some
//! with FUA, and flush every few writes. When a FUA write is acknowledged, the log
//! must show it completed as FUA and the medium must hold it; when a flush is
//! acknowledged, every write the same thread had acknowledged before sending the
//! flush must be durable in the log and on the medium. A target that answers a
//! flush before its device's flush has returned fails here.
//!
//! [`VolatileCache`]: crate::volatile_cache::VolatileCache

use std::thread;

use crate::conformance::pattern;
use crate::device::WriteFlags;
use crate::handle::Device;
use crate::write_log::WriteLog;

/// How the trial writes.
#[derive(Debug, Clone, Copy)]
pub struct Trial {
    pub threads: usize,
    /// Writes per thread.
    pub writes: usize,
    /// Bytes per write (a multiple of the device's block size).
    pub block: usize,
    /// Every this many writes is FUA.
    pub fua_every: usize,
    /// A flush after every this many writes.
    pub flush_every: usize,
}

impl Default for Trial {
    fn default() -> Trial {
        Trial {
            threads: 4,
            writes: 64,
            block: 4096,
            fua_every: 5,
            flush_every: 8,
        }
    }
}

/// Runs the trial through `client`; `medium(offset, len)` reads what a power loss
/// would leave. Returns the acknowledged FUA writes and flushes checked, or the
/// first broken promise.
pub fn acknowledgements(
    client: &Device,
    log: &WriteLog,
    medium: &(dyn Fn(u64, usize) -> Vec<u8> + Sync),
    trial: Trial,
) -> Result<(usize, usize), String> {
    let needed = (trial.threads * trial.writes * trial.block) as u64;
    if client.size() < needed {
        return Err(format!(
            "the trial needs {needed} bytes, the device has {}",
            client.size()
        ));
    }
    thread::scope(|scope| {
        let workers: Vec<_> = (0..trial.threads)
            .map(|t| scope.spawn(move || one_thread(client, log, medium, trial, t)))
            .collect();
        let mut checked = (0, 0);
        for worker in workers {
            let (fua, flushes) = worker.join().expect("trial thread")?;
            checked.0 += fua;
            checked.1 += flushes;
        }
        Ok(checked)
    })
}

fn one_thread(
    client: &Device,
    log: &WriteLog,
    medium: &(dyn Fn(u64, usize) -> Vec<u8> + Sync),
    trial: Trial,
    thread: usize,
) -> Result<(usize, usize), String> {
    let durable = |offset: u64, data: &[u8], what: &str| -> Result<(), String> {
        if !log.is_durable(offset, data) {
            return Err(format!(
                "{what}: the write at {offset} was acknowledged as durable, but the \
                 target had not made the device write it durably yet"
            ));
        }
        if medium(offset, data.len()) != data {
            return Err(format!(
                "{what}: the write at {offset} is not on the medium after its acknowledgement"
            ));
        }
        Ok(())
    };
    let mut acknowledged: Vec<(u64, Vec<u8>)> = Vec::new();
    let (mut fua_checked, mut flushes_checked) = (0, 0);
    for i in 0..trial.writes {
        let offset = ((i * trial.threads + thread) * trial.block) as u64;
        let data = pattern((thread * trial.writes + i) as u64 + 1, offset, trial.block);
        let fua = i % trial.fua_every == 0;
        let flags = if fua {
            WriteFlags::FUA
        } else {
            WriteFlags::NONE
        };
        client
            .write(&data, offset, flags)
            .map_err(|e| format!("write at {offset}: {e}"))?;
        if fua {
            durable(offset, &data, "FUA write")?;
            fua_checked += 1;
        }
        acknowledged.push((offset, data));
        if (i + 1) % trial.flush_every == 0 {
            client.flush().map_err(|e| format!("flush: {e}"))?;
            for (offset, data) in acknowledged.drain(..) {
                durable(offset, &data, "flush")?;
            }
            flushes_checked += 1;
        }
    }
    Ok((fua_checked, flushes_checked))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::volatile_cache::VolatileCache;

    fn run(disk: VolatileCache) -> Result<(usize, usize), String> {
        let disk = Arc::new(disk);
        let log = Arc::new(WriteLog::new(Device::new(disk.clone())));
        let client = Device::new(log.clone());
        acknowledgements(
            &client,
            &log,
            &|offset, len| disk.medium_range(offset, len),
            Trial::default(),
        )
    }

    #[test]
    fn an_honest_device_keeps_every_promise() {
        let (fua, flushes) = run(VolatileCache::new(4 << 20)).unwrap();
        assert_eq!(fua, 4 * 13);
        assert_eq!(flushes, 4 * 8);
    }

    #[test]
    fn a_device_that_only_pretends_is_caught() {
        let err = run(VolatileCache::lying(4 << 20)).unwrap_err();
        assert!(err.contains("not on the medium"), "{err}");
    }
}
