//! Reports of a lab run: terminal tables ([`table`]), `--json` ([`json`]), `--csv`
//! ([`csv`]) and one self-contained HTML page with SVG charts ([`html`]).

pub mod csv;
pub mod html;
pub mod json;
pub mod table;

use crate::results::{CellResult, LabReport};

/// How much the run measured, in the same words wherever it is said (the terminal's
/// matrix and the HTML page): "6 of 6 cells measured, 12 rows (one per operation)".
pub fn count_line(report: &LabReport) -> String {
    let measured = report.measured_cells();
    let planned = report.planned_cells.max(measured);
    let rows = report.cells.len();
    let mut line = format!(
        "{measured} of {planned} cells measured, {rows} row{} (one per operation)",
        if rows == 1 { "" } else { "s" }
    );
    if planned > measured {
        line.push_str(&format!("; {} failed (see the notes)", planned - measured));
    }
    line
}

/// Whether some row's efficiency is above 100%, which the reports then explain
/// ([`OVER_100`]).
pub fn any_over_100(report: &LabReport) -> bool {
    report
        .cells
        .iter()
        .any(|r| r.efficiency.is_some_and(|e| e > 1.0))
}

/// Why an efficiency can pass 100% although each cell's link is measured with the
/// cell's own data set, as its storage moves it.
pub const OVER_100: &str = "eff above 100%: the maximum is what TCP carried over the \
channels (our netserve), and tc's shaper counts each frame from its Ethernet header on \
(not the preamble, gap or FCS): a protocol that puts more payload in a frame than \
TCP/IP does (AoE has no IP or TCP header) can carry more; unshaped, the network figure \
is what one TCP stream per channel copied, not a ceiling.";

/// A fraction as a whole percentage.
pub fn pct(fraction: f64) -> String {
    format!("{:.0}%", fraction * 100.0)
}

/// The protocol of a row, "aoe (xdp)" when AoE went through AF_XDP, "NFS (ganesha,
/// libnfs)" for NFS.
pub fn protocol(r: &CellResult) -> String {
    if r.aoe_xdp {
        format!("{} (xdp)", r.protocol)
    } else {
        r.protocol.display_name().to_string()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample::mixed;

    #[test]
    fn cells_are_counted_once_however_many_rows_they_have() {
        let report = mixed();
        assert_eq!(report.cells.len(), 16);
        // AoE sequential, AoE bonnie, AoE sequential through AF_XDP, NBD random,
        // and the AoE sequential host baseline.
        assert_eq!(report.measured_cells(), 5);
        assert_eq!(
            count_line(&report),
            "5 of 6 cells measured, 16 rows (one per operation); 1 failed (see the notes)"
        );
    }

    #[test]
    fn the_terminal_and_the_page_give_the_same_count() {
        let report = mixed();
        let terminal = table::matrix(&report);
        let page = html::page(&report);
        let line = count_line(&report);
        assert!(terminal.contains(&line), "{terminal}");
        assert!(page.contains(&line), "the page says otherwise");
        // And show every row: the terminal one line each (in two tables: the
        // matrix and the host's own), the page one table row each.
        let rows = |text: &str| {
            text.lines()
                .filter(|l| l.starts_with("aoe") || l.starts_with("nbd"))
                .count()
        };
        assert_eq!(rows(&terminal), report.cells.len(), "{terminal}");
        assert_eq!(page.matches("<tr><td>").count(), report.cells.len());
    }
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
        workload_phase("sequential", op, mb_per_s)
    }

    fn workload_phase(workload: &str, op: &str, mb_per_s: f64) -> PhaseResult {
        PhaseResult {
            workload: workload.into(),
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

    /// Cells that share a bed and differ in their workload, AF_XDP or baseline:
    /// AoE sequential and bonnie, AoE sequential through AF_XDP, NBD random, and
    /// the host baseline of the AoE sequential cell; one more cell was planned
    /// and failed. 5 cells, 16 rows.
    pub fn mixed() -> LabReport {
        let spec = |workload, aoe_xdp, baseline, protocol| CellSpec {
            protocol,
            bed: BedSpec {
                channels: 1,
                mtu: 1500,
                rate: if baseline {
                    Rate::UNLIMITED
                } else {
                    Rate(Some(1000))
                },
            },
            striped: false,
            workload,
            disk: Disk::UNTHROTTLED,
            baseline,
            aoe_xdp,
        };
        let network = NetworkBaseline {
            send_mb_per_s: 119.0,
            receive_mb_per_s: 119.0,
        };
        let mut cells = Vec::new();
        let mut add = |spec: CellSpec, phases: Vec<PhaseResult>| {
            for phase in &phases {
                cells.push(CellResult::from_phase(&spec, phase, Some(&network), None));
            }
        };
        let sequential = |w, r| {
            vec![
                workload_phase("sequential", "write", w),
                workload_phase("sequential", "read", r),
            ]
        };
        add(
            spec(LabWorkload::Sequential, false, false, Protocol::Aoe),
            sequential(112.0, 121.0),
        );
        add(
            spec(LabWorkload::Bonnie, false, false, Protocol::Aoe),
            ["putc", "write", "rewrite", "getc", "read", "seeks"]
                .iter()
                .map(|op| workload_phase("bonnie", op, 60.0))
                .collect(),
        );
        add(
            spec(LabWorkload::Sequential, true, false, Protocol::Aoe),
            sequential(100.0, 105.0),
        );
        let mut random = Vec::new();
        for op in ["randread", "randwrite"] {
            for depth in [1, 16] {
                let mut phase = workload_phase("random", op, 20.0);
                phase.queue_depth = depth;
                random.push(phase);
            }
        }
        add(
            spec(LabWorkload::Random, false, false, Protocol::Nbd),
            random,
        );
        add(
            spec(LabWorkload::Sequential, false, true, Protocol::Aoe),
            sequential(118.0, 119.0),
        );
        LabReport {
            planned_cells: 6,
            notes: vec!["iscsi sequential MTU 1500 1 Gbit 1 ch: failed: no target".into()],
            ..report()
        }
        .with_cells(cells)
    }

    impl LabReport {
        fn with_cells(mut self, cells: Vec<CellResult>) -> LabReport {
            self.cells = cells;
            self
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
            planned_cells: 5,
            cells,
            notes: vec!["nbd over 2 channels without a stripe: skipped".into()],
        }
    }
}
