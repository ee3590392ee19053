//! The request meter of one export over one protocol.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use blockwire_blockdev::{ErrorKind, IoMeter, Op};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::labels::{error_label, operation_label, ErrorLabels, ExportLabels, OperationLabels};
use super::{Families, LatencyHistogram, Protocol};

/// Every [`Op`] a request can be, for the per-operation meters.
const OPS: [Op; 8] = [
    Op::Open,
    Op::Read,
    Op::Write,
    Op::Flush,
    Op::Trim,
    Op::WriteZeroes,
    Op::Extents,
    Op::Cache,
];

/// The counter and histogram of one operation.
struct OperationMeters {
    requests: Counter,
    latency: LatencyHistogram,
}

/// Counts the requests of one export over one protocol into the shared families.
/// Each series is looked up once (the families' lock) and then only added to.
pub struct ExportIo {
    families: Arc<Families>,
    labels: ExportLabels,
    in_flight: Gauge,
    read_bytes: Counter,
    written_bytes: Counter,
    /// By position in [`OPS`], made at the operation's first request so an export
    /// shows only the operations its clients use.
    operations: [OnceLock<OperationMeters>; OPS.len()],
}

impl ExportIo {
    pub(super) fn new(families: Arc<Families>, export: &str, protocol: Protocol) -> ExportIo {
        let labels = ExportLabels {
            export: export.to_string(),
            protocol: protocol.label(),
        };
        ExportIo {
            in_flight: families.in_flight.get_or_create_owned(&labels),
            read_bytes: families.read_bytes.get_or_create_owned(&labels),
            written_bytes: families.written_bytes.get_or_create_owned(&labels),
            operations: std::array::from_fn(|_| OnceLock::new()),
            families,
            labels,
        }
    }

    fn operation(&self, op: Op) -> &OperationMeters {
        let index = OPS.iter().position(|&o| o == op).unwrap_or(0);
        self.operations[index].get_or_init(|| {
            let labels = OperationLabels {
                export: self.labels.export.clone(),
                protocol: self.labels.protocol,
                operation: operation_label(op),
            };
            OperationMeters {
                requests: self.families.requests.get_or_create_owned(&labels),
                latency: self.families.latency.get_or_create_owned(&labels),
            }
        })
    }
}

impl IoMeter for ExportIo {
    fn started(&self) {
        self.in_flight.inc();
    }

    fn finished(&self, op: Op, bytes: u64, elapsed: Duration, error: Option<ErrorKind>) {
        self.in_flight.dec();
        let meters = self.operation(op);
        meters.requests.inc();
        meters.latency.observe(elapsed);
        match op {
            Op::Read if bytes > 0 => {
                self.read_bytes.inc_by(bytes);
            }
            Op::Write if bytes > 0 => {
                self.written_bytes.inc_by(bytes);
            }
            _ => {}
        }
        if let Some(kind) = error {
            // Errors are rare: a look-up in the family (a read lock) is fine here.
            let labels = ErrorLabels {
                export: self.labels.export.clone(),
                protocol: self.labels.protocol,
                kind: error_label(kind),
            };
            self.families.errors.get_or_create(&labels).inc();
        }
    }
}
