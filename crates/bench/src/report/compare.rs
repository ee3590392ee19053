//! `--compare`: several runs side by side, one row per run, in the columns the seed
//! authors tabulated by hand (Read / Write / Rewrite MB/s, seeks/s), plus CPU% and
//! throughput per CPU%.

use super::{find, maybe, TextTable};
use crate::results::{PhaseResult, RunReport};
use crate::workloads::network;

/// The headline figures of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub label: String,
    pub read: Option<f64>,
    pub write: Option<f64>,
    pub rewrite: Option<f64>,
    pub seeks: Option<f64>,
    /// CPU% over the read, write and rewrite phases (time-weighted).
    pub cpu_percent: Option<f64>,
    /// Their combined throughput per CPU%.
    pub mb_per_s_per_cpu_percent: Option<f64>,
    /// Network throughput to the target host (MB/s).
    pub network_send: Option<f64>,
    /// Network throughput from the target host (MB/s).
    pub network_receive: Option<f64>,
}

/// bonnie++'s block figure when there is one, else the dd-style one.
fn pick<'a>(report: &'a RunReport, op: &str) -> Option<&'a PhaseResult> {
    find(report, "bonnie", op).or_else(|| find(report, "sequential", op))
}

impl Summary {
    pub fn of(report: &RunReport) -> Summary {
        let read = pick(report, "read");
        let write = pick(report, "write");
        let rewrite = find(report, "bonnie", "rewrite");
        let phases: Vec<&PhaseResult> = [read, write, rewrite].into_iter().flatten().collect();
        let seconds: f64 = phases.iter().map(|p| p.seconds).sum();
        let cpu_seconds: f64 = phases.iter().map(|p| p.cpu_percent * p.seconds).sum();
        let bytes: u64 = phases.iter().map(|p| p.bytes).sum();
        let cpu_percent = (seconds > 0.0).then(|| cpu_seconds / seconds);
        let mb_per_s = bytes as f64 / 1e6 / seconds;
        Summary {
            label: report.label.clone(),
            read: read.map(|r| r.mb_per_s),
            write: write.map(|r| r.mb_per_s),
            rewrite: rewrite.map(|r| r.mb_per_s),
            seeks: find(report, "bonnie", "seeks").map(|r| r.iops),
            cpu_percent,
            mb_per_s_per_cpu_percent: cpu_percent
                .filter(|&c| c > 0.0 && bytes > 0)
                .map(|c| mb_per_s / c),
            // Reports from before both directions were measured hold one "tcp"
            // phase: iperf3's default direction, client to server, i.e. send.
            network_send: find(report, network::NAME, network::SEND)
                .or_else(|| find(report, network::NAME, "tcp"))
                .map(|r| r.mb_per_s)
                .or(report.network_mb_per_s),
            network_receive: find(report, network::NAME, network::RECEIVE).map(|r| r.mb_per_s),
        }
    }
}

/// The side-by-side table.
pub fn render(reports: &[RunReport]) -> String {
    let mut table = TextTable::new(
        &[
            "run",
            "Read MB/s",
            "Write MB/s",
            "Rewrite MB/s",
            "seeks/s",
            "bench CPU%",
            "MB/s per bench CPU%",
            "net send MB/s",
            "net receive MB/s",
        ],
        1,
    );
    for report in reports {
        let s = Summary::of(report);
        table.row(vec![
            s.label,
            maybe(s.read),
            maybe(s.write),
            maybe(s.rewrite),
            maybe(s.seeks),
            maybe(s.cpu_percent),
            maybe(s.mb_per_s_per_cpu_percent),
            maybe(s.network_send),
            maybe(s.network_receive),
        ]);
    }
    table.render()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{json, sample};

    #[test]
    fn runs_read_back_from_json_line_up() {
        let dir = tempfile::tempdir().unwrap();
        let mut reports = Vec::new();
        for (label, scale) in [("local", 1.0), ("nbd mtu 1500", 0.5)] {
            let path = dir.path().join(format!("{scale}.json"));
            json::write(&sample::report(label, scale), &path).unwrap();
            reports.push(json::read(&path).unwrap());
        }
        let text = render(&reports);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("run") && lines[0].contains("Rewrite MB/s"));
        assert!(lines[2].starts_with("local") && lines[2].contains("1140"));
        assert!(lines[3].starts_with("nbd mtu 1500") && lines[3].contains("570"));
        let s = Summary::of(&reports[0]);
        assert_eq!(s.write, Some(550.0));
        assert_eq!(s.cpu_percent, Some(25.0));
        assert!(
            (s.mb_per_s_per_cpu_percent.unwrap() - (1140.0 + 550.0 + 340.0) / 3.0 / 25.0).abs()
                < 0.5
        );
    }

    #[test]
    fn both_network_directions_line_up_and_old_tcp_phases_count_as_send() {
        let mut report = sample::report("nbd", 1.0);
        report
            .results
            .push(sample::phase("network", "send", 1 << 20, 1100.0));
        report
            .results
            .push(sample::phase("network", "receive", 1 << 20, 900.0));
        let s = Summary::of(&report);
        assert_eq!(
            (s.network_send, s.network_receive),
            (Some(1100.0), Some(900.0))
        );
        let text = render(&[report]);
        assert!(text.lines().next().unwrap().contains("net receive MB/s"));
        let row: Vec<&str> = text.lines().nth(2).unwrap().split_whitespace().collect();
        assert_eq!(row[row.len() - 2..], ["1100", "900"], "{text}");

        let mut old = sample::report("old", 1.0);
        old.results
            .push(sample::phase("network", "tcp", 1 << 20, 117.0));
        old.network_mb_per_s = Some(117.0);
        let s = Summary::of(&old);
        assert_eq!((s.network_send, s.network_receive), (Some(117.0), None));
    }

    #[test]
    fn sequential_figures_stand_in_for_missing_bonnie_ones() {
        let mut report = sample::report("dd only", 1.0);
        report.results.retain(|r| r.workload == "sequential");
        let s = Summary::of(&report);
        assert_eq!(
            (s.read, s.write, s.rewrite, s.seeks),
            (Some(1100.0), Some(500.0), None, None)
        );
    }
}
