//! Running what a start bound: the announcement (each export's URIs, once every
//! part is up), the signal handlers (SIGINT/SIGTERM stop, SIGHUP reloads, SIGUSR1
//! logs a status line), systemd's notifications, and the final flushes on the way
//! out.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Context, Result};
use blockwire_nbd::NbdTarget;

use crate::netserve;
use crate::reload_apply::Live;
use crate::serve_aoe::ServedAoe;
use crate::serve_iscsi;
use crate::serve_nbd;
use crate::serve_nvme;
use crate::serve_reload;
use crate::serve_start::Started;
use crate::serve_status;
use crate::service;
use crate::stop_signals;

/// Announces and serves `started` until SIGINT or SIGTERM; `config` is the file a
/// SIGHUP re-reads (none: serving the flags, nothing to reload).
pub fn run(started: Started, config: Option<PathBuf>) -> Result<()> {
    let Started {
        server,
        tls,
        mut targets,
        iscsi,
        mut iscsi_devices,
        nvme,
        mut nvme_devices,
        metrics,
        meters,
        netserve,
        file,
    } = started;
    // Installed before the announcement, so a client's first request and a signal
    // right after it are handled.
    let mut signals = stop_signals::install()?;
    let reloader = serve_reload::install(config)?;
    if let Some(line) = &tls {
        println!("{line}");
    }
    let server = server.map(|(server, sockets, tls_required)| {
        serve_nbd::announce(&server, &sockets, tls_required);
        server
    });
    for (name, target) in &targets {
        target.announce(name);
    }
    let iscsi = match iscsi {
        Some(target) => {
            serve_iscsi::announce(&target);
            let handles = (target.shutdown_handle(), target.reload_handle());
            let thread = std::thread::Builder::new()
                .name("iscsi".into())
                .spawn(move || target.run())?;
            Some((handles, thread))
        }
        None => None,
    };
    let nvme = match nvme {
        Some(target) => {
            serve_nvme::announce(&target);
            let handles = (target.shutdown_handle(), target.reload_handle());
            let thread = std::thread::Builder::new()
                .name("nvme".into())
                .spawn(move || target.run())?;
            Some((handles, thread))
        }
        None => None,
    };
    if let Some(metrics) = &metrics {
        println!("metrics: http://{}/metrics", metrics.addr());
    }
    if let Some(netserve) = &netserve {
        netserve::announce(netserve)?;
    }
    let iscsi_stop = iscsi.as_ref().map(|((handle, _), _)| handle.clone());
    let nvme_stop = nvme.as_ref().map(|((handle, _), _)| handle.clone());
    let live = file.map(|loaded| {
        let live = Live::new(
            loaded,
            server.as_ref().map(NbdTarget::reload_handle),
            iscsi.as_ref().map(|((_, reload), _)| reload.clone()),
            std::mem::take(&mut targets),
            meters,
        )
        .with_nvme(nvme.as_ref().map(|((_, reload), _)| reload.clone()));
        Arc::new(Mutex::new(live))
    });
    reloader.start(live.clone())?;
    let netserve = match netserve {
        Some(server) => Some(server.spawn()?),
        None => None,
    };
    // AoE targets: those of the configuration (a reload may change them), or the
    // one of the flags.
    let aoe_count: Option<Box<dyn Fn() -> usize + Send>> = match &live {
        Some(live) => {
            let live = live.clone();
            Some(Box::new(move || {
                live.lock().unwrap_or_else(|e| e.into_inner()).aoe_targets()
            }))
        }
        None if !targets.is_empty() => {
            let count = targets.len();
            Some(Box::new(move || count))
        }
        None => None,
    };
    serve_status::watch(serve_status::Served {
        nbd: server.as_ref().map(NbdTarget::shutdown_handle),
        iscsi: iscsi_stop.clone(),
        nvme: nvme_stop.clone(),
        aoe: aoe_count,
    })?;
    println!("press Ctrl-C to stop");
    service::ready();

    let result = match server {
        Some(server) => {
            let handle = server.shutdown_handle();
            stop_signals::on_first(signals, move || {
                if let Some(iscsi) = iscsi_stop {
                    iscsi.shutdown();
                }
                if let Some(nvme) = nvme_stop {
                    nvme.shutdown();
                }
                handle.shutdown()
            })?;
            server.run().context("server failed")
        }
        None => {
            stop_signals::wait(&mut signals);
            if let Some(iscsi) = iscsi_stop {
                iscsi.shutdown();
            }
            if let Some(nvme) = nvme_stop {
                nvme.shutdown();
            }
            Ok(())
        }
    };
    service::stopping();
    let targets: Vec<ServedAoe> = match &live {
        // What is served now, after any reload; none is applied from here on.
        Some(live) => {
            let mut live = live.lock().unwrap_or_else(|e| e.into_inner());
            let (aoe, iscsi) = live.shut_down();
            iscsi_devices = iscsi;
            nvme_devices = live.nvme_devices();
            aoe
        }
        None => targets.into_iter().map(|(_, target)| target).collect(),
    };
    if let Some((_, thread)) = iscsi {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("iSCSI target failed: {e}"),
            Err(_) => tracing::error!("iSCSI target panicked"),
        }
        for device in &iscsi_devices {
            if !device.info().read_only && device.info().capabilities.flush.available() {
                device
                    .flush()
                    .map_err(|e| anyhow!("iSCSI export: final flush failed: {e}"))?;
            }
        }
    }
    if let Some((_, thread)) = nvme {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!("NVMe/TCP target failed: {e}"),
            Err(_) => tracing::error!("NVMe/TCP target panicked"),
        }
        for device in &nvme_devices {
            if !device.info().read_only && device.info().capabilities.flush.available() {
                device
                    .flush()
                    .map_err(|e| anyhow!("NVMe/TCP export: final flush failed: {e}"))?;
            }
        }
    }
    if let Some(netserve) = netserve {
        netserve.stop().context("netserve failed")?;
    }
    if let Some(metrics) = metrics {
        metrics.stop();
    }
    for target in targets {
        target
            .stop()
            .map_err(|e| anyhow!("AoE target: final flush failed: {e}"))?;
    }
    result
}
