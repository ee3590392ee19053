//! SIGUSR1 for `serve`: one log line with the process's resident memory, threads,
//! open files, NBD, iSCSI and NVMe/TCP connections and AoE targets, so an operator can look at
//! a server under load without a metrics endpoint (`kill -USR1 PID`, or `systemctl
//! kill -s USR1`).

use anyhow::{Context, Result};
use blockwire_nbd::target::ShutdownHandle;
use signal_hook::iterator::Signals;

use crate::metrics::process::{open_fds, resident_bytes, threads};

/// What the status line counts besides the process: each target that runs.
#[derive(Default)]
pub struct Served {
    pub nbd: Option<ShutdownHandle>,
    pub iscsi: Option<blockwire_iscsi::ShutdownHandle>,
    pub nvme: Option<blockwire_nvme::ShutdownHandle>,
    /// AoE targets serving now (reload adds and removes them).
    pub aoe: Option<Box<dyn Fn() -> usize + Send>>,
}

/// The status line: what /proc says of this process, and each target's count.
pub fn line(served: &Served) -> String {
    let figure = |value: Option<i64>| value.map_or("?".to_string(), |v| v.to_string());
    let memory = resident_bytes().map_or("?".to_string(), |bytes| {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    });
    let mut line = format!(
        "status: resident memory {memory}, {} threads, {} open files",
        figure(threads()),
        figure(open_fds())
    );
    if let Some(nbd) = &served.nbd {
        line.push_str(&format!(", {} NBD connections", nbd.open_connections()));
    }
    if let Some(iscsi) = &served.iscsi {
        line.push_str(&format!(", {} iSCSI connections", iscsi.open_connections()));
    }
    if let Some(nvme) = &served.nvme {
        line.push_str(&format!(
            ", {} NVMe/TCP connections",
            nvme.open_connections()
        ));
    }
    if let Some(aoe) = &served.aoe {
        line.push_str(&format!(", {} AoE targets", aoe()));
    }
    line
}

/// Logs [`line()`] on every SIGUSR1, on a thread of its own, for as long as the
/// process runs.
pub fn watch(served: Served) -> Result<()> {
    let mut signals =
        Signals::new([signal_hook::consts::SIGUSR1]).context("cannot handle SIGUSR1")?;
    std::thread::Builder::new()
        .name("status".into())
        .spawn(move || {
            for _ in signals.forever() {
                tracing::info!("{}", line(&served));
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_counts_what_is_served() {
        assert!(!line(&Served::default()).contains("AoE"));
        let served = Served {
            aoe: Some(Box::new(|| 2)),
            ..Served::default()
        };
        let said = line(&served);
        assert!(said.starts_with("status: resident memory "), "{said}");
        assert!(said.ends_with(", 2 AoE targets"), "{said}");
    }

    #[test]
    fn the_line_counts_nvme_connections() {
        let device =
            blockwire_blockdev::Device::from_device(blockwire_blockdev::MemoryDevice::new(1 << 20));
        let subsystem = std::sync::Arc::new(blockwire_nvme::Subsystem::new("a", device));
        let config = blockwire_nvme::NvmeConfig::new(vec!["127.0.0.1:0".parse().unwrap()]);
        let target = blockwire_nvme::NvmeTarget::bind(config, vec![subsystem]).unwrap();
        let served = Served {
            nvme: Some(target.shutdown_handle()),
            ..Served::default()
        };
        let said = line(&served);
        assert!(said.ends_with(", 0 NVMe/TCP connections"), "{said}");
    }
}
