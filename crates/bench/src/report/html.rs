//! `--html`: one self-contained page (inline CSS and SVG, nothing fetched) with the
//! run's facts, charts and the full results table.

use std::fmt::Write;
use std::path::Path;

use blockwire_blockdev::size::format_size;

use super::svg::{escape, grouped_bars, line_chart, Series};
use super::{figure_cells, network_summary};
use crate::error::{Error, Result};
use crate::results::{PhaseResult, RunReport};
use crate::workloads::sweep;

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:1em 0}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#eef}td.l,th.l{text-align:left}\
.warn{color:#a40}figure{margin:1.5em 0}";

fn phase_label(r: &PhaseResult) -> String {
    let mut label = r.op.clone();
    if r.block_size > 1 && r.workload != "bonnie" {
        label.push(' ');
        label.push_str(&format_size(r.block_size));
    }
    if r.queue_depth > 1 {
        let _ = write!(label, " qd{}", r.queue_depth);
    }
    label
}

/// The sweep as seed 002 plots it: MB/s by record size, one line per operation.
fn sweep_chart(report: &RunReport) -> Option<String> {
    let series: Vec<Series> = sweep::OPS
        .iter()
        .map(|op| Series {
            name: op.to_string(),
            points: report
                .results
                .iter()
                .filter(|r| r.workload == sweep::NAME && r.op == *op)
                .map(|r| (r.block_size as f64, r.mb_per_s))
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    (!series.is_empty()).then(|| {
        line_chart(
            "Record-size sweep: throughput",
            "record size",
            "MB/s",
            &series,
            |x| format_size(x as u64),
        )
    })
}

/// One bar chart per workload: MB/s per phase (IOPS for random I/O, operations per
/// second for bonnie's file tests).
fn workload_charts(report: &RunReport) -> Vec<String> {
    let mut charts = Vec::new();
    for workload in ["network", "sequential", "bonnie", "random"] {
        let phases: Vec<&PhaseResult> = report
            .results
            .iter()
            .filter(|r| r.workload == workload)
            .collect();
        let moving: Vec<&PhaseResult> = phases.iter().copied().filter(|r| r.bytes > 0).collect();
        if workload == "random" && !phases.is_empty() {
            let groups = phases
                .iter()
                .map(|r| (phase_label(r), vec![r.iops]))
                .collect::<Vec<_>>();
            charts.push(grouped_bars(
                "random: IOPS",
                "IOPS",
                &groups,
                &["IOPS".into()],
                false,
            ));
            continue;
        }
        if !moving.is_empty() {
            let groups = moving
                .iter()
                .map(|r| (phase_label(r), vec![r.mb_per_s]))
                .collect::<Vec<_>>();
            let title = format!("{workload}: throughput");
            charts.push(grouped_bars(
                &title,
                "MB/s",
                &groups,
                &["MB/s".into()],
                false,
            ));
        }
        let files: Vec<&PhaseResult> = phases
            .iter()
            .copied()
            .filter(|r| r.bytes == 0 && workload == "bonnie")
            .collect();
        if !files.is_empty() {
            let groups = files
                .iter()
                .map(|r| (phase_label(r), vec![r.iops]))
                .collect::<Vec<_>>();
            charts.push(grouped_bars(
                "bonnie: file operations",
                "per second",
                &groups,
                &["ops/s".into()],
                false,
            ));
        }
    }
    charts
}

/// Latency percentiles of every phase but the sweep's, on a log axis.
fn latency_chart(report: &RunReport) -> Option<String> {
    let groups: Vec<(String, Vec<f64>)> = report
        .results
        .iter()
        .filter(|r| r.workload != sweep::NAME && r.workload != "network" && r.ops > 0)
        .map(|r| {
            let l = r.latency_us;
            (
                format!("{} {}", r.workload, phase_label(r)),
                vec![l.p50, l.p99, l.p999, l.max],
            )
        })
        .collect();
    let series = ["p50", "p99", "p99.9", "max"].map(String::from);
    (!groups.is_empty()).then(|| {
        grouped_bars(
            "Latency percentiles",
            "microseconds (log)",
            &groups,
            &series,
            true,
        )
    })
}

fn facts(out: &mut String, report: &RunReport) {
    let c = &report.config;
    let m = &report.machine;
    let rows = [
        ("target", report.target.clone()),
        ("workloads", c.workloads.join(", ")),
        ("data set", format_size(c.size)),
        (
            "I/O",
            if c.direct {
                "direct (page cache bypassed)".into()
            } else {
                "buffered".to_string()
            },
        ),
        (
            "block size / queue depth",
            format!("{} / {}", format_size(c.block_size), c.queue_depth),
        ),
        (
            "machine",
            format!(
                "{} — {} CPUs, {} RAM, Linux {}",
                m.hostname,
                m.cpus,
                format_size(m.memory_bytes >> 20 << 20),
                m.kernel
            ),
        ),
        (
            "network",
            network_summary(report).unwrap_or_else(|| "-".into()),
        ),
    ];
    out.push_str("<table>");
    for (key, value) in rows {
        let _ = write!(
            out,
            "<tr><th class=\"l\">{}</th><td class=\"l\">{}</td></tr>",
            escape(key),
            escape(&value)
        );
    }
    out.push_str("</table>");
    for warning in &report.warnings {
        let _ = write!(out, "<p class=\"warn\">warning: {}</p>", escape(warning));
    }
}

fn results_table(out: &mut String, report: &RunReport) {
    out.push_str("<table><tr><th class=\"l\">workload</th><th class=\"l\">op</th><th>block</th><th>qd</th><th>MB/s</th><th>IOPS</th><th>p50 µs</th><th>p99 µs</th><th>p99.9 µs</th><th>max µs</th><th>CPU%</th><th>target CPU%</th><th>MB/s per CPU%</th></tr>");
    for r in &report.results {
        let cells = figure_cells(r);
        let _ = write!(
            out,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td>",
            escape(&r.workload),
            escape(&r.op)
        );
        for cell in cells {
            let _ = write!(out, "<td>{}</td>", escape(&cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// The whole page.
pub fn page(report: &RunReport) -> String {
    let mut out = String::new();
    let title = format!("blockwire bench: {}", report.label);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1>",
        t = escape(&title)
    );
    facts(&mut out, report);
    let mut charts: Vec<String> = Vec::new();
    charts.extend(sweep_chart(report));
    charts.extend(workload_charts(report));
    charts.extend(latency_chart(report));
    if !charts.is_empty() {
        out.push_str("<h2>Charts</h2>");
        for chart in charts {
            let _ = write!(out, "<figure>{chart}</figure>");
        }
    }
    out.push_str("<h2>Results</h2>");
    results_table(&mut out, report);
    out.push_str("<p>MB = 10<sup>6</sup> bytes. CPU% is user + system time of the benchmark process (100 = one core).</p></body></html>\n");
    out
}

pub fn write(report: &RunReport, path: &Path) -> Result<()> {
    std::fs::write(path, page(report)).map_err(|e| Error::io_at("cannot write", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample;

    #[test]
    fn the_page_is_self_contained_with_charts_and_every_phase() {
        let report = sample::report("aoe <mtu 9000>", 1.0);
        let page = page(&report);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.contains("<title>blockwire bench: aoe &lt;mtu 9000&gt;</title>"));
        // No external resources.
        assert!(!page.contains("src=") && !page.contains("href="));
        assert!(page.contains("Record-size sweep"));
        assert!(page.contains("Latency percentiles"));
        assert!(page.contains("bonnie: file operations"));
        assert_eq!(page.matches("<svg").count(), page.matches("</svg>").count());
        assert!(page.matches("<svg").count() >= 5);
        // One table row per phase plus the header.
        let rows = page.matches("<tr><td class=\"l\">").count();
        assert_eq!(rows, report.results.len());
        assert!(page.contains("warning: a &lt;warning&gt; &amp; more"));
        assert!(!page.contains("NaN") && !page.contains("inf"));
    }
}
