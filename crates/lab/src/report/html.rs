//! `--html`: one self-contained page: the facts of the run, charts (MB/s by MTU per
//! protocol, as seed 000 tabulates; efficiency bars against the maximum, as seed
//! 003's tables), the seed's tables beside ours, and the whole matrix.

use std::fmt::Write;
use std::path::Path;

use blockwire_bench::report::svg::{escape, grouped_bars, line_chart, Series};
use blockwire_bench::report::{maybe, number};

use super::{
    any_over_100, count_line, layout, link, pct, protocol, published_text, table, OVER_100,
};
use crate::published::Seed;
use crate::results::{CellResult, LabReport};

const STYLE: &str = "body{font-family:sans-serif;margin:2em;max-width:1100px}\
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}\
td:nth-child(-n+6),th{text-align:left}th{background:#f3f3f3}pre{background:#f8f8f8;padding:1em;overflow-x:auto}\
figure{margin:1em 0}svg{display:block;width:100%;height:auto}svg text{font-family:sans-serif;font-size:12px}";

/// The rows one chart of MB/s by MTU holds: the same workload, operation, link,
/// layout, and host baseline or not; within it, one line per protocol, whose
/// points differ in MTU only.
fn mtu_line_key(r: &CellResult) -> (String, String, Option<u64>, u32, bool, bool) {
    (
        r.workload.clone(),
        r.op.clone(),
        r.rate_mbit,
        r.channels,
        r.striped,
        r.baseline,
    )
}

/// Whether a row is a point of the MTU and efficiency charts: streaming ops, but
/// not the record-size sweep's, whose record sizes have [`sweep_charts`] of their own.
fn charted_by_mtu(r: &CellResult) -> bool {
    r.efficiency.is_some() && r.workload != "sweep"
}

/// MB/s by record size (log scale), one line per protocol, one chart per sweep
/// operation and link: seed 002's iozone plot.
fn sweep_charts(report: &LabReport) -> Vec<String> {
    let sweep: Vec<&CellResult> = report
        .cells
        .iter()
        .filter(|r| r.workload == "sweep" && r.block_size > 0)
        .collect();
    let mut groups: Vec<(String, Option<u64>, bool)> = Vec::new();
    for r in &sweep {
        let key = (r.op.clone(), r.rate_mbit, r.baseline);
        if !groups.contains(&key) {
            groups.push(key);
        }
    }
    groups
        .into_iter()
        .map(|(op, rate, baseline)| {
            let rows: Vec<&&CellResult> = sweep
                .iter()
                .filter(|r| r.op == op && r.rate_mbit == rate && r.baseline == baseline)
                .collect();
            let mut names: Vec<String> = Vec::new();
            for r in &rows {
                if !names.contains(&protocol(r)) {
                    names.push(protocol(r));
                }
            }
            let series: Vec<Series> = names
                .into_iter()
                .map(|name| {
                    let mut points: Vec<(f64, f64)> = rows
                        .iter()
                        .filter(|r| protocol(r) == name)
                        .map(|r| ((r.block_size as f64).log2(), r.mb_per_s))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series { name, points }
                })
                .collect();
            let title = format!(
                "sweep {op}: MB/s by record size, {}{}",
                link(rows[0]),
                if baseline { ", host baseline" } else { "" }
            );
            line_chart(&title, "record size", "MB/s", "MB/s", &series, |x| {
                table::block_text(2f64.powf(x).round() as u64)
            })
        })
        .collect()
}

/// MB/s by MTU, one line per protocol: one chart per workload, operation, link and
/// layout (bonnie's block write and the sequential write are charts of their own,
/// not two points of one line).
fn mtu_charts(report: &LabReport) -> Vec<String> {
    let mut groups: Vec<(String, String, Option<u64>, u32, bool, bool)> = Vec::new();
    for r in report.cells.iter().filter(|r| charted_by_mtu(r)) {
        let key = mtu_line_key(r);
        if !groups.contains(&key) {
            groups.push(key);
        }
    }
    groups
        .into_iter()
        .map(|key| {
            let rows: Vec<&CellResult> = report
                .cells
                .iter()
                .filter(|r| charted_by_mtu(r) && mtu_line_key(r) == key)
                .collect();
            let (workload, op, .., baseline) = key;
            let mut names: Vec<String> = Vec::new();
            for r in &rows {
                if !names.contains(&protocol(r)) {
                    names.push(protocol(r));
                }
            }
            let series: Vec<Series> = names
                .into_iter()
                .map(|name| {
                    let mut points: Vec<(f64, f64)> = rows
                        .iter()
                        .filter(|r| protocol(r) == name)
                        .map(|r| (f64::from(r.mtu), r.mb_per_s))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series { name, points }
                })
                .collect();
            let sample = rows[0];
            let title = format!(
                "{workload} {op}: MB/s by MTU, {}, {}{}",
                link(sample),
                layout(sample),
                if baseline { ", host baseline" } else { "" }
            );
            line_chart(&title, "MTU (bytes)", "MB/s", "MB/s", &series, |x| {
                format!("{x:.0}")
            })
        })
        .collect()
}

/// Efficiency against the maximum, one group per cell, one bar per operation (and
/// the seed's published efficiency beside, where it gave one).
/// A cell's group in the efficiency chart: every part of the cell, so two cells
/// never share a group.
fn efficiency_label(r: &CellResult) -> String {
    format!(
        "{} {} {} {} {}{}",
        protocol(r),
        r.workload,
        r.mtu,
        link(r),
        layout(r),
        if r.baseline { " host" } else { "" }
    )
}

fn efficiency_chart(report: &LabReport) -> Option<String> {
    let rows: Vec<&CellResult> = report.cells.iter().filter(|r| charted_by_mtu(r)).collect();
    if rows.is_empty() {
        return None;
    }
    let mut ops: Vec<String> = Vec::new();
    for r in &rows {
        if !ops.contains(&r.op) {
            ops.push(r.op.clone());
        }
    }
    let with_paper = rows
        .iter()
        .any(|r| r.published.as_ref().is_some_and(|p| p.efficiency.is_some()));
    let mut series = ops.clone();
    if with_paper {
        series.push("paper".into());
    }
    // One group per cell: every part of the cell in its label, so that two cells
    // (a sequential and a bonnie one, AoE with and without AF_XDP) never share a
    // group and overwrite each other's bars.
    let mut groups: Vec<(String, Vec<f64>)> = Vec::new();
    for r in &rows {
        let label = efficiency_label(r);
        let index = match groups.iter().position(|g| g.0 == label) {
            Some(index) => index,
            None => {
                groups.push((label, vec![0.0; series.len()]));
                groups.len() - 1
            }
        };
        let op = ops.iter().position(|o| *o == r.op).unwrap_or(0);
        groups[index].1[op] = r.efficiency.unwrap_or(0.0) * 100.0;
        if let Some(paper) = r.published.as_ref().and_then(|p| p.efficiency) {
            let last = series.len() - 1;
            groups[index].1[last] = paper * 100.0;
        }
    }
    Some(grouped_bars(
        "Efficiency: MB/s against the maximum (slower of channels and disks)",
        "% of max",
        "% of max",
        &groups,
        &series,
        false,
    ))
}

fn matrix_table(out: &mut String, report: &LabReport) {
    out.push_str("<table><tr>");
    for header in [
        "protocol",
        "MTU",
        "link",
        "layout",
        "workload",
        "op",
        "bs",
        "QD",
        "MB/s",
        "IOPS",
        "net MB/s",
        "max MB/s",
        "eff",
        "initiator CPU%",
        "target CPU%",
        "MB/s per initiator CPU%",
        "paper MB/s",
    ] {
        let _ = write!(out, "<th>{header}</th>");
    }
    out.push_str("</tr>");
    for r in &report.cells {
        let cells = [
            protocol(r),
            r.mtu.to_string(),
            link(r) + if r.baseline { " (host)" } else { "" },
            layout(r),
            r.workload.clone(),
            r.op.clone(),
            table::block_text(r.block_size),
            r.queue_depth.to_string(),
            number(r.mb_per_s),
            number(r.iops),
            maybe(r.network_mb_per_s),
            maybe(r.max_mb_per_s),
            r.efficiency.map_or("-".into(), pct),
            number(r.initiator_cpu_pct),
            maybe(r.target_cpu_pct),
            maybe(r.mb_per_s_per_cpu_pct),
            published_text(r),
        ];
        out.push_str("<tr>");
        for cell in cells {
            let _ = write!(out, "<td>{}</td>", escape(&cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// The whole page.
pub fn page(report: &LabReport) -> String {
    let seed = report.seed.as_deref().and_then(|s| Seed::parse(s).ok());
    let title = match seed {
        Some(seed) => format!("blockwire lab: seed {} rebuilt", seed.name()),
        None => "blockwire lab".to_string(),
    };
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title><style>{STYLE}</style></head><body><h1>{t}</h1>",
        t = escape(&title)
    );
    let _ = write!(
        out,
        "<p>{} on {} ({} CPUs, kernel {}); data set {} MiB per cell, {} s per timed phase, stripe chunk {} KiB.</p>",
        escape(&count_line(report)),
        escape(&report.machine.hostname),
        report.machine.cpus,
        escape(&report.machine.kernel),
        report.size >> 20,
        report.phase_seconds,
        report.chunk >> 10,
    );
    // The figures first: the matrix, then the seed's tables; the charts below show
    // their shape.
    out.push_str("<h2>Matrix</h2>");
    matrix_table(&mut out, report);
    if any_over_100(report) {
        let _ = write!(out, "<p>{}</p>", escape(OVER_100));
    }
    if let Some(seed) = seed {
        let _ = write!(
            out,
            "<h2>The seed's tables beside ours</h2><pre>{}</pre>",
            escape(&table::seed_tables(report, seed))
        );
    } else {
        let scaling = table::scaling(report);
        if !scaling.is_empty() {
            let _ = write!(out, "<h2>Striping</h2><pre>{}</pre>", escape(&scaling));
        }
    }
    let mut charts = mtu_charts(report);
    charts.extend(sweep_charts(report));
    charts.extend(efficiency_chart(report));
    if !charts.is_empty() {
        out.push_str("<h2>Charts</h2>");
        for chart in charts {
            let _ = write!(out, "<figure>{chart}</figure>");
        }
    }
    if !report.notes.is_empty() {
        out.push_str("<h2>Notes</h2><ul>");
        for note in &report.notes {
            let _ = write!(out, "<li>{}</li>", escape(note));
        }
        out.push_str("</ul>");
    }
    out.push_str("<p>MB = 10<sup>6</sup> bytes. net: the channels' measured aggregate (our netserve, all channels at once, each moving its share of the cell's data set) in the operation's direction; max: the slower of that and the throttled disks; eff = MB/s / max. CPU% is user + system time, 100 = one core; the initiator is the bench process, the target the serve process; MB/s per initiator CPU% divides the throughput by the initiator's CPU%.</p></body></html>\n");
    out
}

pub fn write(report: &LabReport, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, page(report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample::{mixed, report};

    #[test]
    fn every_cell_gets_its_own_bars_and_lines() {
        let report = mixed();
        let page = page(&report);
        // A chart of MB/s by MTU per workload and operation: sequential write and
        // read, bonnie's five streaming ops, the baseline's write and read; and the
        // efficiency bars.
        assert_eq!(page.matches("<svg").count(), 2 + 5 + 2 + 1, "{page}");
        assert!(page.contains("<title>bonnie write: MB/s by MTU, 1 Gbit, 1 ch</title>"));
        // Each row with an efficiency has its bar, under its own cell's label
        // (before: bonnie's write overwrote the sequential write's, AF_XDP the
        // packet socket's).
        for r in report.cells.iter().filter(|r| r.efficiency.is_some()) {
            let label = efficiency_label(r);
            let bar = format!(
                "<title>{}, {}: {} % of max</title>",
                escape(&label),
                r.op,
                number(r.efficiency.unwrap() * 100.0)
            );
            assert!(page.contains(&bar), "{bar} missing");
        }
    }

    #[test]
    fn a_sweep_is_plotted_by_record_size_not_by_mtu() {
        let mut report = report();
        let base = report.cells[0].clone();
        report.cells.clear();
        for (k, op) in [(0u32, "write"), (1, "write"), (0, "read")] {
            report.cells.push(CellResult {
                workload: "sweep".into(),
                op: op.into(),
                block_size: 4096 << (4 * k),
                ..base.clone()
            });
        }
        let page = page(&report);
        assert!(
            page.contains("<title>sweep write: MB/s by record size, 1 Gbit</title>"),
            "{page}"
        );
        assert!(page.contains("sweep read: MB/s by record size"));
        assert!(
            !page.contains("by MTU"),
            "one point per record size, not per MTU"
        );
        assert!(page.contains(">64K</text>"), "record sizes on the axis");
        assert!(page.contains("<td>64K</td>"), "the matrix's bs column");
    }

    #[test]
    fn efficiencies_above_100_percent_are_explained_in_both_outputs() {
        let over = mixed();
        assert!(over.cells.iter().any(|r| r.efficiency.unwrap_or(0.0) > 1.0));
        assert!(page(&over).contains(&escape(OVER_100)));
        assert!(table::matrix(&over).contains(OVER_100));
        let under = report();
        assert!(!page(&under).contains("eff above 100%"));
        assert!(!table::matrix(&under).contains("eff above 100%"));
    }

    #[test]
    fn the_matrix_comes_before_the_charts() {
        let page = page(&report());
        let matrix = page.find("<h2>Matrix</h2>").unwrap();
        assert!(matrix < page.find("<svg").unwrap());
        assert!(page.contains("<th>MB/s per initiator CPU%</th>"));
    }

    #[test]
    fn the_page_holds_charts_tables_and_the_seed_beside_ours() {
        let page = page(&report());
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.trim_end().ends_with("</html>"));
        // MB/s by MTU for each op and layout, and the efficiency bars.
        assert_eq!(page.matches("<svg").count(), 5, "{page}");
        assert!(page.contains("write: MB/s by MTU, 1 Gbit, 4 ch striped"));
        assert!(page.contains("Efficiency"));
        assert!(page.contains("Table 2: CPU usage efficiency at MTU 9000"));
        assert!(page.contains("≤283"), "the paper's AoE peak");
        // Self-contained: no scripts, no links out.
        assert!(!page.contains("<script") && !page.contains("src=") && !page.contains("href="));
    }
}
