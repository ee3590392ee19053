//! A start is all or nothing: [`start`] turns a [`Plan`] into bound listeners and
//! running targets, printing nothing, and whatever it started is dropped (closed)
//! if any part fails. Announcing and running them is [`crate::serve_run`]'s.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use blockwire_bench::netperf::NetServer;
use blockwire_blockdev::Device;
use blockwire_iscsi::IscsiTarget;
use blockwire_nbd::NbdTarget;
use blockwire_nvme::NvmeTarget;

use crate::metrics::MetricsEndpoint;
use crate::netserve;
use crate::serve_aoe::ServedAoe;
use crate::serve_iscsi;
use crate::serve_metrics::{self, Meters};
use crate::serve_nbd::resolve;
use crate::serve_nvme;
use crate::serve_plan::{Loaded, Plan};
use crate::serve_tls;

/// What a start bound and opened, announced only once all of it is there.
pub struct Started {
    /// The NBD target, its Unix sockets, and whether it requires TLS.
    pub server: Option<(NbdTarget, Vec<PathBuf>, bool)>,
    /// The NBD target's TLS, as announced.
    pub tls: Option<String>,
    /// The AoE targets, by export name.
    pub targets: Vec<(String, ServedAoe)>,
    pub iscsi: Option<IscsiTarget>,
    /// The devices served over iSCSI (flushed once the target has stopped).
    pub iscsi_devices: Vec<Device>,
    pub nvme: Option<NvmeTarget>,
    /// The devices served over NVMe/TCP (flushed once the target has stopped).
    pub nvme_devices: Vec<Device>,
    pub metrics: Option<MetricsEndpoint>,
    pub meters: Option<Meters>,
    pub netserve: Option<NetServer>,
    /// With a configuration file: what a reload starts from.
    pub file: Option<Loaded>,
}

/// Validates, opens every device, binds every listener and starts every target,
/// printing nothing. `metrics` overrides the plan's Prometheus address;
/// `netserve` also answers the bench's network test there.
pub fn start(plan: Plan, metrics: Option<&str>, netserve: Option<&str>) -> Result<Started> {
    let (plan, metrics, meters) = match metrics.or(plan.metrics.as_deref()) {
        Some(listen) => {
            let addr = resolve(listen)?[0];
            let (plan, endpoint, meters) = serve_metrics::instrument(plan, addr)?;
            (plan, Some(endpoint), Some(meters))
        }
        None => (plan, None, None),
    };
    let netserve = netserve.map(netserve::bind).transpose()?;
    let mut tls = None;
    let server = match plan.nbd {
        Some((exports, config, sockets)) => {
            let tls_required = config
                .tls
                .as_ref()
                .is_some_and(|tls| tls.mode() == blockwire_nbd::tls::TlsMode::Require);
            tls = config.tls.as_deref().map(serve_tls::describe);
            let server = NbdTarget::bind(exports, config)
                .map_err(|e| busy_hint(e, "NBD", "--listen", "[server] listen"))?;
            Some((server, sockets, tls_required))
        }
        None => None,
    };
    let iscsi_devices = plan
        .iscsi
        .iter()
        .flat_map(|p| p.exports.iter().map(|e| e.device.clone()))
        .collect();
    let iscsi = plan
        .iscsi
        .map(|plan| {
            serve_iscsi::bind(plan).map_err(|e| busy_hint(e, "iSCSI", "--iscsi", "[iscsi] listen"))
        })
        .transpose()?;
    let nvme_devices = plan
        .nvme
        .iter()
        .flat_map(|p| p.exports.iter().map(|e| e.device.clone()))
        .collect();
    let nvme = plan
        .nvme
        .map(|plan| {
            serve_nvme::bind(plan).map_err(|e| busy_hint(e, "NVMe/TCP", "--nvme", "[nvme] listen"))
        })
        .transpose()?;
    let mut targets = Vec::new();
    for (name, device, config) in plan.aoe {
        let target = ServedAoe::start(&name, device, config)?;
        targets.push((name, target));
    }
    Ok(Started {
        server,
        tls,
        targets,
        iscsi,
        iscsi_devices,
        nvme,
        nvme_devices,
        metrics,
        meters,
        netserve,
        file: plan.file,
    })
}

/// A listener that cannot bind because another program holds its address, with
/// how to choose another.
pub fn busy_hint(
    error: impl Into<anyhow::Error>,
    protocol: &str,
    flag: &str,
    key: &str,
) -> anyhow::Error {
    let error = error.into();
    let busy = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    });
    if busy {
        anyhow!("{error:#} (another program listens there: give {protocol} another address with {flag} HOST:PORT, or {key} in a config file)")
    } else {
        error
    }
}
