//! The terminal table printed at the end of a run.

use blockwire_blockdev::size::format_size;

use super::{figure_cells, number, TextTable};
use crate::results::RunReport;

/// The run's summary lines and one row per phase.
pub fn render(report: &RunReport) -> String {
    let mut out = String::new();
    let config = &report.config;
    out.push_str(&format!("target: {}", report.target));
    if report.label != report.target {
        out.push_str(&format!(" ({})", report.label));
    }
    out.push('\n');
    if config.size > 0 {
        out.push_str(&format!(
            "data set {}, {} I/O, on {} ({} CPUs, {} RAM)\n",
            format_size(config.size),
            if config.direct { "direct" } else { "buffered" },
            report.machine.hostname,
            report.machine.cpus,
            format_size(report.machine.memory_bytes >> 20 << 20),
        ));
    }
    if let Some(network) = report.network_mb_per_s {
        out.push_str(&format!("network: {} MB/s\n", number(network)));
    }
    for warning in &report.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    if report.results.is_empty() {
        out.push_str("nothing was measured\n");
        return out;
    }
    // Against the link: how much of what the network carries the storage delivers
    // (the seeds' "efficiency against the theoretical maximum", link side).
    let link = report.network_mb_per_s.filter(|mb| *mb > 0.0);
    let mut columns = vec![
        "workload",
        "op",
        "block",
        "qd",
        "MB/s",
        "IOPS",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "max us",
        "CPU%",
        "tgt CPU%",
        "MB/s/CPU%",
    ];
    if link.is_some() {
        columns.push("% of link");
    }
    let mut table = TextTable::new(&columns, 2);
    for r in &report.results {
        let mut row = vec![r.workload.clone(), r.op.clone()];
        row.extend(figure_cells(r));
        if let Some(link) = link {
            row.push(if r.workload != "network" && r.bytes > 0 {
                format!("{:.0}%", 100.0 * r.mb_per_s / link)
            } else {
                "-".into()
            });
        }
        table.row(row);
    }
    out.push('\n');
    out.push_str(&table.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample;

    #[test]
    fn one_row_per_phase_with_aligned_columns() {
        let report = sample::report("nfs", 1.0);
        let text = render(&report);
        assert!(text.starts_with("target: /mnt/nfs (nfs)\n"));
        assert!(text.contains("data set 8G, direct I/O"));
        assert!(text.contains("network: 1174 MB/s"));
        assert!(text.contains("% of link"));
        let lines: Vec<&str> = text.lines().collect();
        let header = lines
            .iter()
            .position(|l| l.starts_with("workload"))
            .unwrap();
        assert_eq!(lines.len() - header - 2, report.results.len());
        let width = lines[header + 2].len();
        assert!(lines[header + 2..].iter().all(|l| l.len() <= width + 2));
        assert!(text.contains("seq_create"));
    }

    #[test]
    fn storage_rows_show_their_share_of_the_link() {
        let mut report = sample::report("nfs", 1.0);
        report.network_mb_per_s = Some(200.0);
        let row = report
            .results
            .iter()
            .position(|r| r.workload != "network" && r.bytes > 0)
            .unwrap();
        report.results[row].mb_per_s = 150.0;
        let text = render(&report);
        let line = text
            .lines()
            .find(|l| l.contains(&report.results[row].op) && l.contains("150"))
            .unwrap();
        assert!(line.trim_end().ends_with("75%"), "{line}");
        report.network_mb_per_s = None;
        assert!(!render(&report).contains("% of link"));
    }
}
