//! The Prometheus metrics of `blockwire serve` (`--metrics HOST:PORT`, `[metrics]`):
//! per export and protocol the requests, bytes, errors, requests in flight, latency
//! and connections; per process memory, threads, open files and uptime.
//!
//! Everything is registered once in a prometheus-client [`Registry`] and encoded by
//! it. The data path only touches atomics: each export's [`ExportIo`] resolves its
//! label sets when it is made (or at an operation's first use), never per request.

mod histogram;
mod http;
mod io;
mod labels;
pub mod process;
mod sessions;

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Context, Result};
use blockwire_blockdev::{Device, Metered};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

pub use histogram::LatencyHistogram;
pub use http::MetricsEndpoint;
pub use io::ExportIo;
pub use labels::Protocol;
pub use sessions::ProtocolSessions;

use labels::{BuildLabels, ErrorLabels, ExportLabels, OperationLabels, RefusalLabels};

/// The metric families shared by every export and protocol.
#[derive(Default)]
struct Families {
    requests: Family<OperationLabels, Counter>,
    latency: Family<OperationLabels, LatencyHistogram>,
    read_bytes: Family<ExportLabels, Counter>,
    written_bytes: Family<ExportLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    in_flight: Family<ExportLabels, Gauge>,
    connections_open: Family<ExportLabels, Gauge>,
    connections_accepted: Family<ExportLabels, Counter>,
    connections_refused: Family<RefusalLabels, Counter>,
}

/// The registry of one `serve` process and the families behind it.
pub struct Metrics {
    registry: Registry,
    families: Arc<Families>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let families = Arc::new(Families::default());
        let mut registry = Registry::default();
        let f = &families;
        registry.register(
            "blockwire_requests",
            "Requests answered, by operation",
            f.requests.clone(),
        );
        registry.register_with_unit(
            "blockwire_request_duration",
            "Time from a request reaching the export to its answer, by operation",
            Unit::Seconds,
            f.latency.clone(),
        );
        registry.register_with_unit(
            "blockwire_read",
            "Bytes read by clients",
            Unit::Bytes,
            f.read_bytes.clone(),
        );
        registry.register_with_unit(
            "blockwire_written",
            "Bytes written by clients",
            Unit::Bytes,
            f.written_bytes.clone(),
        );
        registry.register(
            "blockwire_errors",
            "Requests that failed, by blockwire's protocol-neutral error kind",
            f.errors.clone(),
        );
        registry.register(
            "blockwire_requests_in_flight",
            "Requests started and not yet answered",
            f.in_flight.clone(),
        );
        registry.register(
            "blockwire_connections_open",
            "Connections (NBD) or sessions (iSCSI) serving the export now",
            f.connections_open.clone(),
        );
        registry.register(
            "blockwire_connections_accepted",
            "Connections (NBD) or sessions (iSCSI) that began serving the export",
            f.connections_accepted.clone(),
        );
        registry.register(
            "blockwire_connections_refused",
            "Connections closed by a configured limit before choosing an export: refused at \
             once, or (a limit ending in _evicted) an unfinished handshake closed to make room",
            f.connections_refused.clone(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        registry.register(
            "blockwire_build_info",
            "The blockwire version serving (always 1)",
            build,
        );
        registry.register_collector(Box::new(process::ProcessCollector::new()));
        Metrics { registry, families }
    }

    /// A meter for the requests of `export` over `protocol`.
    pub fn export_io(&self, export: &str, protocol: Protocol) -> ExportIo {
        ExportIo::new(self.families.clone(), export, protocol)
    }

    /// `device` as served for `export` over `protocol`: every request counted.
    pub fn metered(&self, device: &Device, export: &str, protocol: Protocol) -> Device {
        Metered::wrap(device.clone(), self.export_io(export, protocol))
    }

    /// The connection meter of one protocol's target; `exports` maps the names the
    /// target reports to export names where they differ (iSCSI: IQN to export).
    pub fn sessions(
        &self,
        protocol: Protocol,
        exports: HashMap<String, String>,
    ) -> Arc<ProtocolSessions> {
        Arc::new(ProtocolSessions::new(
            self.families.clone(),
            protocol,
            exports,
        ))
    }

    /// The exposition, in the OpenMetrics text format.
    pub fn encode(&self) -> Result<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .context("cannot encode the metrics")?;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockwire_blockdev::{MemoryDevice, SessionMeter, WriteFlags};

    fn line<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
    }

    #[test]
    fn counts_an_export_per_protocol_under_the_conventional_names() {
        let metrics = Metrics::new();
        let device = Device::from_device(MemoryDevice::new(1 << 20));
        let nbd = metrics.metered(&device, "disk", Protocol::Nbd);
        let aoe = metrics.metered(&device, "disk", Protocol::Aoe);
        nbd.write(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
        nbd.write(&[1u8; 4096], 4096, WriteFlags::NONE).unwrap();
        let mut buf = [0u8; 512];
        aoe.read(&mut buf, 0).unwrap();
        let text = metrics.encode().unwrap();
        let labels = |protocol: &str| format!("{{export=\"disk\",protocol=\"{protocol}\"}}");
        assert_eq!(
            line(
                &text,
                &format!("blockwire_written_bytes_total{}", labels("nbd"))
            ),
            Some(&*format!(
                "blockwire_written_bytes_total{} 8192",
                labels("nbd")
            ))
        );
        assert!(line(
            &text,
            &format!("blockwire_read_bytes_total{}", labels("aoe"))
        )
        .unwrap()
        .ends_with(" 512"));
        assert!(text.contains(
            "blockwire_requests_total{export=\"disk\",protocol=\"nbd\",operation=\"write\"} 2"
        ));
        assert!(text.contains(
            "blockwire_request_duration_seconds_count{export=\"disk\",protocol=\"aoe\",operation=\"read\"} 1"
        ));
        assert!(text.contains("# TYPE blockwire_request_duration_seconds histogram"));
        assert!(text.contains("blockwire_build_info{version=\""));
        assert!(text.contains("process_resident_memory_bytes "));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn counts_connections_by_export_and_refusals_by_limit() {
        let metrics = Metrics::new();
        let names = HashMap::from([("iqn.x:disk".to_string(), "disk".to_string())]);
        let sessions = metrics.sessions(Protocol::Iscsi, names);
        sessions.opened("iqn.x:disk");
        sessions.opened("iqn.x:disk");
        sessions.closed("iqn.x:disk");
        sessions.refused("max_connections");
        let text = metrics.encode().unwrap();
        assert!(text.contains("blockwire_connections_open{export=\"disk\",protocol=\"iscsi\"} 1"));
        assert!(text.contains(
            "blockwire_connections_accepted_total{export=\"disk\",protocol=\"iscsi\"} 2"
        ));
        assert!(text.contains(
            "blockwire_connections_refused_total{protocol=\"iscsi\",limit=\"max_connections\"} 1"
        ));
    }
}
