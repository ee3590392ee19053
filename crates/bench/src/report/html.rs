//! `--html`: one self-contained page (inline CSS and SVG, nothing fetched) with the
//! run's facts, charts and the full results table.

use std::fmt::Write;
use std::path::Path;

use blockwire_blockdev::size::format_size;

use super::svg::{escape, grouped_bars, histogram, line_chart, Bins, Series};
use super::{cpu_owner, figure_cells, network_summary};
use crate::error::{Error, Result};
use crate::meter::bucket_low_us;
use crate::results::{PhaseResult, RunReport};
use crate::workloads::sweep;

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;margin:1em 0}\
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th{background:#eef}td.l,th.l{text-align:left}\
.warn{color:#a40}figure{margin:1.5em 0}svg{display:block;width:100%;height:auto}\
.note{font-size:90%;color:#444}";

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
                "ops/s",
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
            "µs",
            &groups,
            &series,
            true,
        )
    })
}

/// A latency tick: 1 µs, 10 µs, 100 µs, 1 ms, … 1 s; 100 ns below a microsecond.
fn latency_tick(us: f64) -> String {
    let (value, unit) = if us >= 1e6 {
        (us / 1e6, "s")
    } else if us >= 1e3 {
        (us / 1e3, "ms")
    } else if us >= 1.0 {
        (us, "µs")
    } else {
        (us * 1e3, "ns")
    };
    // Powers of ten come out whole; round off what dividing left behind.
    let rounded = (value * 1000.0).round() / 1000.0;
    format!("{} {unit}", super::svg::tick(rounded))
}

/// A phase's histogram as chart bins: each bucket from its lower bound to `le_us`,
/// as high as its share of the phase's operations (in percent).
fn bins(r: &PhaseResult) -> Vec<(f64, f64, f64)> {
    let total: u64 = r.latency_histogram.iter().map(|b| b.count).sum();
    if total == 0 {
        return Vec::new();
    }
    r.latency_histogram
        .iter()
        .map(|b| {
            (
                bucket_low_us(b.le_us),
                b.le_us,
                100.0 * b.count as f64 / total as f64,
            )
        })
        .collect()
}

/// A phase's latency percentiles for a tooltip: "p50 40 µs, p99 250 µs, p99.9
/// 900 µs, max 12.5 ms".
fn percentiles(r: &PhaseResult) -> String {
    let l = r.latency_us;
    [
        ("p50", l.p50),
        ("p99", l.p99),
        ("p99.9", l.p999),
        ("max", l.max),
    ]
    .iter()
    .map(|(name, us)| format!("{name} {}", latency_tick(*us)))
    .collect::<Vec<_>>()
    .join(", ")
}

/// Latency distributions as small multiples: one chart per group of phases small
/// enough to tell apart (sequential; bonnie's block tests; bonnie's file tests;
/// random at every depth), each phase one outline. The sweep's 104 phases would
/// make a tangle, and its latency is mostly record size over throughput (the sweep
/// chart), so it gets two charts, write and read, one outline per record size;
/// the other sweep operations' histograms are in the JSON.
fn latency_histograms(report: &RunReport) -> Vec<String> {
    let with_histogram = |r: &&PhaseResult| !r.latency_histogram.is_empty();
    let mut groups: Vec<(String, Vec<&PhaseResult>, bool)> = Vec::new();
    for workload in ["sequential", "bonnie", "random"] {
        let phases: Vec<&PhaseResult> = report
            .results
            .iter()
            .filter(|r| r.workload == workload)
            .filter(with_histogram)
            .collect();
        if workload == "bonnie" {
            let (io, files): (Vec<&PhaseResult>, Vec<&PhaseResult>) =
                phases.into_iter().partition(|r| r.bytes > 0);
            groups.push(("bonnie".into(), io, false));
            groups.push(("bonnie: file operations".into(), files, false));
        } else {
            groups.push((workload.into(), phases, false));
        }
    }
    for op in ["write", "read"] {
        let phases = report
            .results
            .iter()
            .filter(|r| r.workload == sweep::NAME && r.op == op)
            .filter(with_histogram)
            .collect();
        groups.push((format!("sweep {op}, by record size"), phases, true));
    }
    groups
        .into_iter()
        .filter(|(_, phases, _)| !phases.is_empty())
        .map(|(name, phases, by_record)| {
            let series: Vec<Bins> = phases
                .iter()
                .map(|r| Bins {
                    name: if by_record {
                        format_size(r.block_size)
                    } else {
                        phase_label(r)
                    },
                    detail: percentiles(r),
                    bins: bins(r),
                })
                .collect();
            histogram(
                &format!("Latency distribution: {name}"),
                "latency per operation (log scale)",
                "% of operations per bucket",
                &series,
                latency_tick,
            )
        })
        .collect()
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
    let owner = cpu_owner(report);
    let _ = write!(
        out,
        "<table><tr><th class=\"l\">workload</th><th class=\"l\">op</th><th>block</th><th>qd</th><th>MB/s</th><th>IOPS</th><th>p50 µs</th><th>p99 µs</th><th>p99.9 µs</th><th>max µs</th><th>{owner} CPU%</th><th>target CPU%</th><th>MB/s per {owner} CPU%</th></tr>"
    );
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
    // The figures first: the table is what a reader looks up; the charts below
    // show their shape.
    out.push_str("<h2>Results</h2>");
    results_table(&mut out, report);
    let _ = write!(out, "<p class=\"note\">{}</p>", legend(report));
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
    let histograms = latency_histograms(report);
    if !histograms.is_empty() {
        out.push_str("<h2>Latency distribution</h2><p>Each outline is one phase: the share of its operations in each latency bucket, four buckets per doubling, on a log scale. A wide or two-humped shape, or a long tail to the right, is what the percentiles alone hide.</p>");
        for chart in histograms {
            let _ = write!(out, "<figure>{chart}</figure>");
        }
    }
    out.push_str("</body></html>\n");
    out
}

/// What the table's columns mean, whose CPU above all.
fn legend(report: &RunReport) -> String {
    let owner = cpu_owner(report);
    let whose = if owner == "initiator" {
        "the bench process, which holds the initiator"
    } else {
        "the bench process"
    };
    format!(
        "MB = 10<sup>6</sup> bytes. CPU% is user + system time, 100 = one core: {owner} CPU% \
         of {whose}; target CPU% of the target's process, when the bench could see it \
         (--target-pid, the target's netserve, or the process listening on its socket). \
         MB/s per {owner} CPU% divides the throughput by the {owner}'s CPU%."
    )
}

pub fn write(report: &RunReport, path: &Path) -> Result<()> {
    std::fs::write(path, page(report)).map_err(|e| Error::io_at("cannot write", path, e))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::meter::Recorder;
    use crate::report::sample;
    use crate::report::svg::{check_well_formed, HISTOGRAM_CLASS};

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
        check_well_formed(&page).unwrap();
    }

    #[test]
    fn the_results_table_comes_before_the_first_chart() {
        let report = with_histograms(sample::report("order", 1.0));
        let page = page(&report);
        let table = page.find("<h2>Results</h2>").expect("a results table");
        let first_chart = page.find("<svg").expect("charts");
        assert!(table < first_chart, "the table comes after a chart");
        assert!(page[table..first_chart].contains("<table><tr><th class=\"l\">workload"));
        // Every chart takes the page's width.
        assert_eq!(
            page.matches("<svg").count(),
            page.matches(r#" width="100%" preserveAspectRatio"#).count()
        );
        check_well_formed(&page).unwrap();
    }

    #[test]
    fn tooltips_carry_units_and_percentiles() {
        let page = page(&with_histograms(sample::report("tips", 1.0)));
        // Latency bars: the percentile and µs.
        assert!(
            page.contains("<title>sequential write 1M, p99: 250 µs</title>"),
            "{page}"
        );
        // Throughput bars and sweep points: MB/s.
        assert!(page.contains("<title>write 1M: 500 MB/s</title>"), "{page}");
        assert!(page.contains(" at 4K: "), "{page}");
        assert!(page.contains("<title>random: IOPS</title>"));
        // Histogram outlines: the phase's percentiles.
        assert!(
            page.contains(
                "<title>randread 4K qd4: p50 40 µs, p99 250 µs, p99.9 900 µs, max 12.5 ms</title>"
            ),
            "{page}"
        );
    }

    #[test]
    fn the_cpu_columns_say_whose_cpu() {
        let local = page(&sample::report("local", 1.0));
        assert!(
            local.contains("<th>bench CPU%</th><th>target CPU%</th><th>MB/s per bench CPU%</th>")
        );
        let mut report = sample::report("remote", 1.0);
        report.target = "iscsi://10.0.0.2/iqn.2026-11.x:y/0".into();
        let remote = page(&report);
        assert!(
            remote.contains(
                "<th>initiator CPU%</th><th>target CPU%</th><th>MB/s per initiator CPU%</th>"
            ),
            "{remote}"
        );
        assert!(remote.contains("initiator CPU% of the bench process, which holds the initiator"));
        assert!(!remote.contains(">MB/s per CPU%<"));
    }

    /// The sample report with a latency histogram in every phase that has
    /// operations, as the meter makes them: 900 near 40 µs, 99 at 250 µs, one at
    /// 12.5 ms.
    fn with_histograms(mut report: RunReport) -> RunReport {
        let mut recorder = Recorder::new();
        for (us, times) in [(38, 410), (41, 490), (250, 99), (12_500, 1)] {
            for _ in 0..times {
                recorder.record(Duration::from_micros(us));
            }
        }
        for r in report.results.iter_mut().filter(|r| r.ops > 0) {
            r.latency_histogram = recorder.buckets();
        }
        report
    }

    /// Every `<svg>` element of a page with `class`.
    fn charts_of<'a>(page: &'a str, class: &str) -> Vec<&'a str> {
        let opening = format!(r#"<svg xmlns="http://www.w3.org/2000/svg" class="{class}""#);
        page.match_indices(&opening)
            .map(|(at, _)| {
                let end = page[at..].find("</svg>").unwrap() + "</svg>".len();
                &page[at..at + end]
            })
            .collect()
    }

    #[test]
    fn neighbouring_buckets_touch_in_the_chart() {
        let mut phase = sample::report("bins", 1.0).results.remove(0);
        // 1220's bucket starts at 1020 exactly, though 1220 / 2^(1/4) is 1025.9.
        phase.latency_histogram = [1020.0, 1220.0, 1450.0]
            .into_iter()
            .map(|le_us| crate::results::HistogramBucket { le_us, count: 1 })
            .collect();
        let bins = bins(&phase);
        for pair in bins.windows(2) {
            assert_eq!(pair[0].1, pair[1].0, "{bins:?}");
        }
    }

    #[test]
    fn latency_histograms_are_drawn_per_workload_as_well_formed_svg() {
        let report = with_histograms(sample::report("hist <1>", 1.0));
        let page = page(&report);
        assert!(page.contains("<h2>Latency distribution</h2>"));
        let charts = charts_of(&page, HISTOGRAM_CLASS);
        let titles = [
            "sequential",
            "bonnie",
            "bonnie: file operations",
            "random",
            "sweep write, by record size",
            "sweep read, by record size",
        ];
        assert_eq!(charts.len(), titles.len(), "{page}");
        for (chart, title) in charts.iter().zip(titles) {
            check_well_formed(chart).unwrap_or_else(|e| panic!("{e}: {chart}"));
            let expected = format!("<title>Latency distribution: {}</title>", escape(title));
            assert!(chart.contains(&expected), "{expected}");
            // Log-scale ticks around 38 µs .. 12.5 ms.
            for tick in [">10 µs<", ">100 µs<", ">1 ms<", ">100 ms<"] {
                assert!(chart.contains(tick), "{tick} in {title}");
            }
        }
        // One outline per phase: random has two depths, the sweep three records.
        assert_eq!(charts[3].matches("<path ").count(), 2);
        assert!(charts[3].contains("<title>randread 4K qd4: p50 40 µs, "));
        assert_eq!(charts[4].matches("<path ").count(), 3);
        assert!(charts[4].contains(">64K</text>"), "{}", charts[4]);
        // 49% of the operations sit in one bucket, (38.1, 45.3] µs: the y axis
        // ends at a nice 50%.
        assert!(charts[0].contains(">50</text>"));
        // The percentile bars are still there, and the whole page is well-formed.
        assert!(page.contains("Latency percentiles"));
        check_well_formed(&page).unwrap();
    }

    #[test]
    fn reports_without_histograms_draw_none() {
        let page = page(&sample::report("old", 1.0));
        assert!(charts_of(&page, HISTOGRAM_CLASS).is_empty());
        assert!(!page.contains("Latency distribution"));
    }

    #[test]
    fn latency_ticks_read_in_their_unit() {
        assert_eq!(latency_tick(0.1), "100 ns");
        assert_eq!(latency_tick(1.0), "1 µs");
        assert_eq!(latency_tick(100.0), "100 µs");
        assert_eq!(latency_tick(1000.0), "1 ms");
        assert_eq!(latency_tick(1e7), "10 s");
    }
}
