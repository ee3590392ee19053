//! The terminal table printed at the end of a run.

use blockwire_blockdev::size::format_size;

use super::{cpu_owner, figure_cells, link_percent, network_summary, TextTable};
use crate::results::RunReport;
use crate::workloads::network;

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
    if let Some(network) = network_summary(report) {
        out.push_str(&format!("network: {network}\n"));
    }
    for warning in &report.warnings {
        out.push_str(&format!("warning: {warning}\n"));
    }
    if report.results.is_empty() {
        out.push_str("nothing was measured\n");
        return out;
    }
    // Against the link: how much of what the network carries the storage delivers
    // (the seeds' "efficiency against the theoretical maximum", link side), in the
    // direction each phase's data travels.
    let link = report.network_mb_per_s.is_some_and(|mb| mb > 0.0)
        && report
            .results
            .iter()
            .any(|r| r.workload != network::NAME && r.bytes > 0);
    // Whose CPU: "ini" (the bench process holds the initiator) or "bench".
    let owner = match cpu_owner(report) {
        "initiator" => "ini",
        other => other,
    };
    let cpu = format!("{owner} CPU%");
    let per_cpu = format!("MB/s/{owner} CPU%");
    let mut columns = vec![
        "workload", "op", "block", "qd", "MB/s", "IOPS", "p50 us", "p99 us", "p99.9 us", "max us",
        &cpu, "tgt CPU%", &per_cpu,
    ];
    if link {
        columns.push("% of link");
    }
    let mut table = TextTable::new(&columns, 2);
    for r in &report.results {
        let mut row = vec![r.workload.clone(), r.op.clone()];
        row.extend(figure_cells(r));
        if link {
            row.push(link_percent(report, r).map_or("-".into(), |p| format!("{p:.0}%")));
        }
        table.row(row);
    }
    out.push('\n');
    out.push_str(&table.render());
    let whose = if owner == "ini" {
        "ini: this bench process, which holds the initiator"
    } else {
        "bench: this bench process"
    };
    out.push_str(&format!(
        "CPU% is user + system time, 100 = one core; {whose}; tgt: the target's process.\n"
    ));
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
        // Header, rule, a row per phase, the CPU legend.
        assert_eq!(lines.len() - header - 3, report.results.len());
        assert!(lines[header].contains("bench CPU%") && lines[header].contains("MB/s/bench CPU%"));
        assert!(text.ends_with("tgt: the target's process.\n"), "{text}");
        let width = lines[header + 2].len();
        let rows = &lines[header + 2..lines.len() - 1];
        assert!(rows.iter().all(|l| l.len() <= width + 2));
        assert!(text.contains("seq_create"));
    }

    #[test]
    fn a_remote_runs_cpu_is_the_initiators() {
        let mut report = sample::report("nbd", 1.0);
        report.target = "nbd://10.0.0.2/disk".into();
        let text = render(&report);
        let header = text.lines().find(|l| l.starts_with("workload")).unwrap();
        assert!(
            header.contains(" ini CPU%") && header.contains("MB/s/ini CPU%"),
            "{header}"
        );
        assert!(text.contains("ini: this bench process, which holds the initiator"));
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

    #[test]
    fn writes_are_held_against_send_and_reads_against_receive() {
        let mut report = sample::report("nbd", 1.0);
        report.results.retain(|r| r.workload != "sweep");
        report
            .results
            .push(sample::phase("network", "send", 1 << 20, 1000.0));
        report
            .results
            .push(sample::phase("network", "receive", 1 << 20, 400.0));
        report.network_mb_per_s = Some(400.0);
        let text = render(&report);
        assert!(
            text.contains("network: send 1000 MB/s, receive 400 MB/s"),
            "{text}"
        );
        let row = |workload: &str, op: &str| {
            text.lines()
                .find(|l| {
                    let mut words = l.split_whitespace();
                    words.next() == Some(workload) && words.next() == Some(op)
                })
                .unwrap()
                .trim_end()
                .to_string()
        };
        // sequential write 500 MB/s against send 1000; read 1100 against receive 400.
        assert!(row("sequential", "write").ends_with(" 50%"), "{text}");
        assert!(row("sequential", "read").ends_with(" 275%"), "{text}");
        // bonnie's rewrite reads and writes: the slower direction (400).
        assert!(row("bonnie", "rewrite").ends_with(" 85%"), "{text}");
        assert!(row("network", "send").ends_with(" -"), "{text}");
    }
}
