//! Reports made from [`RunReport`]s: a terminal table, a bonnie++ CSV line, JSON, a
//! self-contained HTML page with SVG charts, and side-by-side comparisons.

pub mod compare;
pub mod csv;
pub mod html;
pub mod json;
pub mod svg;
pub mod table;

use crate::results::{PhaseResult, RunReport};
use crate::workloads::network;

/// The first result of `workload`/`op` in a report.
pub fn find<'a>(report: &'a RunReport, workload: &str, op: &str) -> Option<&'a PhaseResult> {
    report
        .results
        .iter()
        .find(|r| r.workload == workload && r.op == op)
}

/// The network's throughput in the direction `phase`'s data travels: storage
/// writes go to the target (the network's "send"), reads come back ("receive").
/// Phases that move data both ways (bonnie's rewrite and seeks), runs that measured
/// one direction, and reports from before both were measured get the slower
/// direction, `network_mb_per_s`.
pub fn link_for(report: &RunReport, phase: &PhaseResult) -> Option<f64> {
    let op = phase.op.as_str();
    let both_ways = phase.workload == "bonnie" && matches!(op, "rewrite" | "seeks");
    let direction = if both_ways {
        None
    } else if op.contains("write") || op == "putc" {
        Some(network::SEND)
    } else if op.contains("read") || op == "getc" {
        Some(network::RECEIVE)
    } else {
        None
    };
    direction
        .and_then(|op| find(report, network::NAME, op))
        .map(|r| r.mb_per_s)
        .or(report.network_mb_per_s)
        .filter(|mb| *mb > 0.0)
}

/// How much of the link a storage phase used, in percent of the network's
/// throughput in its direction ([`link_for`]): the table's "% of link" and the
/// JSON's `link_percent`. None for network phases, phases that moved no data, and
/// runs without a network baseline.
pub fn link_percent(report: &RunReport, phase: &PhaseResult) -> Option<f64> {
    if phase.workload == network::NAME || phase.bytes == 0 {
        return None;
    }
    link_for(report, phase).map(|link| 100.0 * phase.mb_per_s / link)
}

/// The network figures of a run in a few words: "send 1174 MB/s, receive 1103
/// MB/s" when both directions were measured, else the one figure there is.
pub fn network_summary(report: &RunReport) -> Option<String> {
    let send = find(report, network::NAME, network::SEND);
    let receive = find(report, network::NAME, network::RECEIVE);
    match (send, receive) {
        (Some(send), Some(receive)) => Some(format!(
            "send {} MB/s, receive {} MB/s",
            number(send.mb_per_s),
            number(receive.mb_per_s)
        )),
        _ => report
            .network_mb_per_s
            .map(|mb| format!("{} MB/s", number(mb))),
    }
}

/// Whose CPU the bench's own CPU% is: "initiator" when the target is remote (the
/// bench process holds blockwire's initiator, and its CPU is the initiator side's),
/// else "bench" (the process reading and writing a local path). The target's CPU
/// is the other column.
pub fn cpu_owner(report: &RunReport) -> &'static str {
    match crate::target::TargetSpec::parse(&report.target) {
        crate::target::TargetSpec::Remote(_) => "initiator",
        crate::target::TargetSpec::Path(_) => "bench",
    }
}

/// A plain text table: a header row, a rule, rows; the first `left` columns are
/// left-aligned, the rest right-aligned (numbers).
pub struct TextTable {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    left: usize,
}

impl TextTable {
    pub fn new(headers: &[&str], left: usize) -> TextTable {
        TextTable {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            left,
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (index, cell) in row.iter().enumerate().take(columns) {
                widths[index] = widths[index].max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (index, width) in widths.iter().enumerate() {
                let cell = cells.get(index).map(String::as_str).unwrap_or("");
                if index > 0 {
                    out.push_str("  ");
                }
                if index < self.left {
                    out.push_str(&format!("{cell:<width$}"));
                } else {
                    out.push_str(&format!("{cell:>width$}"));
                }
            }
            out.trim_end().to_string()
        };
        let mut out = line(&self.headers);
        out.push('\n');
        let total: usize = widths.iter().sum::<usize>() + 2 * (columns.saturating_sub(1));
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }
}

/// A number with a precision that suits its size: 0.123, 12.3, 1234.
pub fn number(value: f64) -> String {
    if value == 0.0 {
        "0".into()
    } else if value.abs() < 1.0 {
        format!("{value:.3}")
    } else if value.abs() < 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// An optional number, or "-".
pub fn maybe(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), number)
}

/// Block size for display ("-" for none, "1" for per-character).
/// The figures of one phase as the table and the HTML page show them: block size,
/// queue depth, MB/s (or "-" for phases that move no data), IOPS, latency p50, p99,
/// p99.9 and max, CPU%, target CPU%, MB/s per CPU%.
pub(crate) fn figure_cells(r: &PhaseResult) -> [String; 11] {
    [
        block(r.block_size),
        r.queue_depth.to_string(),
        if r.bytes > 0 {
            number(r.mb_per_s)
        } else {
            "-".into()
        },
        number(r.iops),
        number(r.latency_us.p50),
        number(r.latency_us.p99),
        number(r.latency_us.p999),
        number(r.latency_us.max),
        number(r.cpu_percent),
        maybe(r.target_cpu_percent),
        maybe(r.mb_per_s_per_cpu_percent),
    ]
}

pub(crate) fn block(bytes: u64) -> String {
    match bytes {
        0 => "-".into(),
        _ => blockwire_blockdev::size::format_size(bytes),
    }
}

#[cfg(test)]
pub(crate) mod sample {
    //! A made-up report with every kind of phase, for report tests.
    use crate::results::*;

    pub fn phase(workload: &str, op: &str, block_size: u64, mb_per_s: f64) -> PhaseResult {
        let seconds = 2.0;
        let bytes = (mb_per_s * 1e6 * seconds) as u64;
        let ops = if block_size == 0 {
            2048
        } else {
            bytes / block_size.max(1)
        };
        PhaseResult {
            workload: workload.into(),
            op: op.into(),
            block_size,
            queue_depth: if op == "seeks" { 3 } else { 1 },
            bytes: if block_size == 0 { 0 } else { bytes },
            ops,
            seconds,
            mb_per_s: if block_size == 0 { 0.0 } else { mb_per_s },
            iops: ops as f64 / seconds,
            latency_us: Latency {
                p50: 40.0,
                p99: 250.0,
                p999: 900.0,
                max: 12_500.0,
            },
            latency_histogram: Vec::new(),
            cpu_percent: 25.0,
            target_cpu_percent: Some(10.0),
            mb_per_s_per_cpu_percent: Some(mb_per_s / 25.0),
        }
    }

    pub fn report(label: &str, scale: f64) -> RunReport {
        let mut results = vec![
            phase("sequential", "write", 1 << 20, 500.0 * scale),
            phase("sequential", "read", 1 << 20, 1100.0 * scale),
            phase("bonnie", "putc", 1, 90.0 * scale),
            phase("bonnie", "write", 8192, 550.0 * scale),
            phase("bonnie", "rewrite", 8192, 340.0 * scale),
            phase("bonnie", "getc", 1, 120.0 * scale),
            phase("bonnie", "read", 8192, 1140.0 * scale),
            phase("bonnie", "seeks", 8192, 3.0 * scale),
        ];
        for op in [
            "seq_create",
            "seq_stat",
            "seq_delete",
            "rand_create",
            "rand_stat",
            "rand_delete",
        ] {
            results.push(phase("bonnie", op, 0, 0.0));
        }
        for record in [4096u64, 65536, 1 << 20] {
            for (index, op) in crate::workloads::sweep::OPS.iter().enumerate() {
                let speed = (record as f64).log2() * 40.0 * scale + index as f64 * 10.0;
                results.push(phase("sweep", op, record, speed));
            }
        }
        for depth in [1, 4] {
            let mut point = phase("random", "randread", 4096, 20.0 * f64::from(depth) * scale);
            point.queue_depth = depth;
            results.push(point);
        }
        RunReport {
            target: format!("/mnt/{label}"),
            label: label.into(),
            config: RunConfig {
                workloads: vec![
                    "sequential".into(),
                    "bonnie".into(),
                    "sweep".into(),
                    "random".into(),
                ],
                size: 8 << 30,
                block_size: 1 << 20,
                queue_depth: 1,
                direct: true,
            },
            machine: Machine {
                hostname: "initiator".into(),
                cpus: 8,
                memory_bytes: 4 << 30,
                kernel: "6.1.0".into(),
            },
            network_mb_per_s: Some(1173.8),
            results,
            warnings: vec!["a <warning> & more".into()],
        }
    }
}
