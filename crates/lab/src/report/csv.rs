//! `--csv`: one line per row of the report, with a header line; numbers bare,
//! missing values empty.

use std::fmt::Write;

use crate::results::{CellResult, LabReport};

pub const HEADER: &str = "protocol,mtu,channels,striped,rate_mbit,disk_mb_per_s,baseline,aoe_xdp,\
workload,op,block_size,queue_depth,mb_per_s,iops,network_mb_per_s,max_mb_per_s,efficiency,\
initiator_cpu_pct,target_cpu_pct,mb_per_s_per_cpu_pct,published_mb_per_s,published_source";

fn opt<T: ToString>(value: Option<T>) -> String {
    value.map(|v| v.to_string()).unwrap_or_default()
}

fn round(value: f64) -> String {
    format!("{}", (value * 1000.0).round() / 1000.0)
}

/// A CSV field, quoted when it holds a comma or a quote.
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

fn line(r: &CellResult) -> String {
    [
        r.protocol.to_string(),
        r.mtu.to_string(),
        r.channels.to_string(),
        r.striped.to_string(),
        opt(r.rate_mbit),
        opt(r.disk_mb_per_s),
        r.baseline.to_string(),
        r.aoe_xdp.to_string(),
        field(&r.workload),
        field(&r.op),
        r.block_size.to_string(),
        r.queue_depth.to_string(),
        round(r.mb_per_s),
        round(r.iops),
        opt(r.network_mb_per_s.map(round)),
        opt(r.max_mb_per_s.map(round)),
        opt(r.efficiency.map(round)),
        round(r.initiator_cpu_pct),
        opt(r.target_cpu_pct.map(round)),
        opt(r.mb_per_s_per_cpu_pct.map(round)),
        opt(r.published.as_ref().map(|p| p.mb_per_s)),
        field(r.published.as_ref().map_or("", |p| p.source.as_str())),
    ]
    .join(",")
}

pub fn render(report: &LabReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{HEADER}");
    for r in &report.cells {
        let _ = writeln!(out, "{}", line(r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample::report;

    #[test]
    fn one_line_per_row_with_as_many_fields_as_the_header() {
        let report = report();
        let text = render(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), report.cells.len() + 1);
        let columns = HEADER.split(',').count();
        for line in &lines[1..] {
            // The published source is quoted: it holds a comma.
            let unquoted = line.split('"').step_by(2).collect::<String>();
            assert_eq!(unquoted.split(',').count(), columns, "{line}");
        }
        assert!(lines[1].starts_with("aoe,9000,4,true,1000,210,false,false,sequential,write,"));
        assert!(lines[1].contains("\"seed 003"), "{}", lines[1]);
    }
}
