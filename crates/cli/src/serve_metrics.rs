//! Metrics for `blockwire serve`: every export's device is wrapped in a counting
//! layer per protocol, each target is given a connection meter, and the endpoint
//! Prometheus scrapes is started before anything is announced.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use blockwire_blockdev::SessionMeter;
use blockwire_nbd::{Export, ExportSet};

use crate::metrics::{Metrics, MetricsEndpoint, Protocol};
use crate::serve::Plan;

/// `plan` with every request and connection counted, and the endpoint serving the
/// counts at `addr`.
pub fn instrument(mut plan: Plan, addr: SocketAddr) -> Result<(Plan, MetricsEndpoint)> {
    let metrics = Metrics::new();
    if let Some((exports, config, _)) = &mut plan.nbd {
        let sessions = metrics.sessions(Protocol::Nbd, HashMap::new());
        *exports = metered_exports(exports, &metrics, &sessions)?;
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
        iscsi.sessions = Some(sessions as Arc<dyn SessionMeter>);
    }
    let endpoint = MetricsEndpoint::start(addr, Arc::new(metrics))?;
    println!("metrics: http://{}/metrics", endpoint.addr());
    Ok((plan, endpoint))
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
