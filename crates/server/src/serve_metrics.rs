//! Metrics for `blockwire serve`: every export's device is wrapped in a counting
//! layer per protocol, each target is given a connection meter, and the endpoint
//! Prometheus scrapes is started before anything is announced.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use blockwire_blockdev::SessionMeter;
use blockwire_nbd::{Export, ExportSet};

use crate::metrics::{Metrics, MetricsEndpoint, Protocol, ProtocolSessions};
use crate::serve_plan::Plan;

/// The counters a reload hands the exports it adds to.
#[derive(Clone)]
pub struct Meters {
    pub metrics: Arc<Metrics>,
    /// The NBD target's connection meter, if NBD is served.
    pub nbd: Option<Arc<ProtocolSessions>>,
    /// The iSCSI target's session meter, if iSCSI is served.
    pub iscsi: Option<Arc<ProtocolSessions>>,
    /// The NVMe/TCP target's connection meter, if NVMe/TCP is served.
    pub nvme: Option<Arc<ProtocolSessions>>,
}

/// `plan` with every request and connection counted, the endpoint serving the
/// counts at `addr`, and the meters.
pub fn instrument(mut plan: Plan, addr: SocketAddr) -> Result<(Plan, MetricsEndpoint, Meters)> {
    let metrics = Arc::new(Metrics::new());
    let mut meters = Meters {
        metrics: metrics.clone(),
        nbd: None,
        iscsi: None,
        nvme: None,
    };
    if let Some((exports, config, _)) = &mut plan.nbd {
        let sessions = metrics.sessions(Protocol::Nbd, HashMap::new());
        *exports = metered_exports(exports, &metrics, &sessions)?;
        meters.nbd = Some(sessions.clone());
        config.sessions = Some(sessions as Arc<dyn SessionMeter>);
    }
    for (name, device, _) in &mut plan.aoe {
        *device = metrics.metered(device, name, Protocol::Aoe);
    }
    if let Some(iscsi) = &mut plan.iscsi {
        let names = iscsi
            .exports
            .iter()
            .map(|e| (e.iqn.clone(), e.name.clone()))
            .collect();
        let sessions = metrics.sessions(Protocol::Iscsi, names);
        for export in &mut iscsi.exports {
            export.device = metrics.metered(&export.device, &export.name, Protocol::Iscsi);
            sessions.serve_export(&export.iqn);
        }
        meters.iscsi = Some(sessions.clone());
        iscsi.sessions = Some(sessions as Arc<dyn SessionMeter>);
    }
    if let Some(nvme) = &mut plan.nvme {
        // The target reports connections by export name.
        let sessions = metrics.sessions(Protocol::Nvme, HashMap::new());
        for export in &mut nvme.exports {
            export.device = metrics.metered(&export.device, &export.name, Protocol::Nvme);
            sessions.serve_export(&export.name);
        }
        meters.nvme = Some(sessions.clone());
        nvme.sessions = Some(sessions as Arc<dyn SessionMeter>);
    }
    let endpoint = MetricsEndpoint::start(addr, metrics)?;
    Ok((plan, endpoint, meters))
}

/// The same exports, each device counted, the same one the default.
fn metered_exports(
    exports: &ExportSet,
    metrics: &Metrics,
    sessions: &crate::metrics::ProtocolSessions,
) -> Result<ExportSet> {
    let mut metered = ExportSet::new();
    for export in exports.iter() {
        let device = metrics.metered(&export.device, &export.name, Protocol::Nbd);
        sessions.serve_export(&export.name);
        metered
            .add(Export::new(&export.name, &export.description, device))
            .map_err(|e| anyhow!(e))?;
    }
    if let Some(default) = exports.default_export() {
        metered.set_default(&default.name).map_err(|e| anyhow!(e))?;
    }
    Ok(metered)
}
