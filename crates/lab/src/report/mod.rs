//! Reports of a lab run: terminal tables ([`table`]), `--json` ([`json`]), `--csv`
//! ([`csv`]) and one self-contained HTML page with SVG charts ([`html`]).

pub mod csv;
pub mod html;
pub mod json;
pub mod table;

use crate::results::CellResult;

/// A fraction as a whole percentage.
pub fn pct(fraction: f64) -> String {
    format!("{:.0}%", fraction * 100.0)
}

/// The protocol of a row, "aoe (xdp)" when AoE went through AF_XDP.
pub fn protocol(r: &CellResult) -> String {
    if r.aoe_xdp {
        format!("{} (xdp)", r.protocol)
    } else {
        r.protocol.to_string()
    }
}

/// The link of a row: "1 Gbit", "200 Mbit", "unlimited".
pub fn link(r: &CellResult) -> String {
    crate::matrix::Rate(r.rate_mbit).to_string()
}

/// The layout of a row: "1 ch", "4 ch striped", "2 ch one export".
pub fn layout(r: &CellResult) -> String {
    match (r.channels, r.striped) {
        (1, _) => "1 ch".into(),
        (n, true) => format!("{n} ch striped"),
        (n, false) => format!("{n} ch one export"),
    }
}

/// The seed's figure for a row as the seed writes it, or "-".
pub fn published_text(r: &CellResult) -> String {
    r.published
        .as_ref()
        .map_or_else(|| "-".into(), |p| p.text.clone())
}

/// A small report for the renderers' tests: AoE and iSCSI on four striped gigabit
/// channels at MTU 1500 and 9000, and AoE on one channel, as a seed 003 run makes.
#[cfg(test)]
pub(crate) mod sample {
    use blockwire_bench::{Latency, Machine, PhaseResult};

    use crate::matrix::{BedSpec, CellSpec, Disk, LabWorkload, Protocol, Rate};
    use crate::published::Seed;
    use crate::results::{CellResult, LabReport, NetworkBaseline};

    fn phase(op: &str, mb_per_s: f64) -> PhaseResult {
        PhaseResult {
            workload: "sequential".into(),
            op: op.into(),
            block_size: 1 << 20,
            queue_depth: 16,
            bytes: 256 << 20,
            ops: 256,
            seconds: 256.0 / mb_per_s,
            mb_per_s,
            iops: mb_per_s,
            latency_us: Latency::default(),
            latency_histogram: Vec::new(),
            cpu_percent: 40.0,
            target_cpu_percent: Some(30.0),
            mb_per_s_per_cpu_percent: None,
        }
    }

    pub fn report() -> LabReport {
        let mut cells = Vec::new();
        for (protocol, channels, mtu, write, read) in [
            (Protocol::Aoe, 4, 9000, 460.0, 455.0),
            (Protocol::Aoe, 4, 1500, 300.0, 420.0),
            (Protocol::Iscsi, 4, 9000, 450.0, 440.0),
            (Protocol::Iscsi, 4, 1500, 430.0, 435.0),
            (Protocol::Aoe, 1, 9000, 118.0, 117.0),
        ] {
            let spec = CellSpec {
                protocol,
                bed: BedSpec {
                    channels,
                    mtu,
                    rate: Rate(Some(1000)),
                },
                striped: channels > 1,
                workload: LabWorkload::Sequential,
                disk: Disk {
                    rate_mb_per_s: Some(210.0),
                    latency_ms: None,
                },
                baseline: false,
                aoe_xdp: false,
            };
            let network = NetworkBaseline {
                send_mb_per_s: 119.0 * f64::from(channels),
                receive_mb_per_s: 119.0 * f64::from(channels),
            };
            for (op, mb) in [("write", write), ("read", read)] {
                cells.push(CellResult::from_phase(
                    &spec,
                    &phase(op, mb),
                    Some(&network),
                    Some(Seed::S003),
                ));
            }
        }
        LabReport {
            seed: Some("003".into()),
            size: 256 << 20,
            phase_seconds: 1.0,
            chunk: 256 << 10,
            machine: Machine {
                hostname: "lab".into(),
                cpus: 2,
                memory_bytes: 1 << 34,
                kernel: "6.1".into(),
            },
            cells,
            notes: vec!["nbd over 2 channels without a stripe: skipped".into()],
        }
    }
}
