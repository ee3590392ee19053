//! Terminal tables: the whole matrix, then the seeds' own tables with our figures
//! beside theirs (seed 003's Tables 1-2, seed 000's read/write/rewrite by speed and
//! MTU), how striping scales, and the host's own figures.

use std::fmt::Write;

use blockwire_bench::report::{maybe, number, TextTable};

use super::{any_over_100, count_line, layout, link, pct, protocol, published_text, OVER_100};
use crate::matrix::Protocol;
use crate::published::{self, Seed, SEED_003_MAX_MB_PER_S};
use crate::results::{CellResult, LabReport, NetworkBaseline};

/// One line per finished cell, for progress while the run goes on.
pub fn progress_line(index: usize, total: usize, label: &str, rows: &[CellResult]) -> String {
    // Every row: a random cell has no efficiency, and a line with none of its
    // figures would say nothing.
    let figures: Vec<String> = rows
        .iter()
        .map(|r| match r.efficiency {
            Some(eff) => format!("{} {} MB/s ({})", r.op, number(r.mb_per_s), pct(eff)),
            None if r.op.starts_with("rand") => {
                format!("{} QD{} {} IOPS", r.op, r.queue_depth, number(r.iops))
            }
            None => format!("{} {} IOPS", r.op, number(r.iops)),
        })
        .collect();
    format!("[{index}/{total}] {label}: {}", figures.join(", "))
}

/// The network line of a cell in progress.
pub fn network_line(baseline: &NetworkBaseline) -> String {
    format!(
        "    network: {} MB/s to the target, {} MB/s back",
        number(baseline.send_mb_per_s),
        number(baseline.receive_mb_per_s)
    )
}

/// The matrix table's columns.
const HEADERS: [&str; 16] = [
    "protocol",
    "MTU",
    "link",
    "layout",
    "workload",
    "op",
    "QD",
    "MB/s",
    "IOPS",
    "net",
    "max",
    "eff",
    "ini CPU%",
    "tgt CPU%",
    "MB/s/ini CPU%",
    "paper",
];

/// Every row, as measured.
pub fn matrix(report: &LabReport) -> String {
    let mut table = TextTable::new(&HEADERS, 6);
    for r in report.cells.iter().filter(|r| !r.baseline) {
        table.row(row_cells(r));
    }
    let mut out = table.render();
    let baseline: Vec<&CellResult> = report.cells.iter().filter(|r| r.baseline).collect();
    if !baseline.is_empty() {
        out.push_str(
            "\nThe host itself (served from memory, no disk throttle, no link shaping):\n",
        );
        let mut table = TextTable::new(&HEADERS[..HEADERS.len() - 1], 6);
        for r in baseline {
            table.row(row_cells(r));
        }
        out.push_str(&table.render());
    }
    out.push_str(&count_line(report));
    out.push_str(".\n");
    out.push_str(
        "MB = 10^6 bytes. IOPS for ops counted in operations (random I/O, seeks). net: the \
         channels' measured aggregate in the op's direction, each channel moving its share \
         of the cell's data set; max: the slower of it and the disks; eff = MB/s / max. \
         CPU% of one core: ini the bench (initiator) process, tgt the serve (target) \
         process; MB/s/ini CPU% per initiator CPU%.\n",
    );
    if any_over_100(report) {
        out.push_str(OVER_100);
        out.push('\n');
    }
    out
}

fn row_cells(r: &CellResult) -> Vec<String> {
    vec![
        protocol(r),
        r.mtu.to_string(),
        link(r),
        layout(r),
        r.workload.clone(),
        r.op.clone(),
        r.queue_depth.to_string(),
        number(r.mb_per_s),
        if r.efficiency.is_none() {
            number(r.iops)
        } else {
            "-".into()
        },
        maybe(r.network_mb_per_s),
        maybe(r.max_mb_per_s),
        r.efficiency.map_or("-".into(), pct),
        number(r.initiator_cpu_pct),
        maybe(r.target_cpu_pct),
        maybe(r.mb_per_s_per_cpu_pct),
        published_text(r),
    ]
}

/// The seed's tables with ours beside them.
pub fn seed_tables(report: &LabReport, seed: Seed) -> String {
    match seed {
        Seed::S003 => seed_003(report),
        Seed::S000 => seed_000(report),
    }
}

/// The row of `protocol` at `mtu` with the highest streaming throughput on four
/// striped gigabit channels: the paper's "peak block throughput".
pub fn seed_003_peak(report: &LabReport, protocol: Protocol, mtu: u32) -> Option<&CellResult> {
    report
        .cells
        .iter()
        .filter(|r| {
            !r.baseline
                && r.protocol == protocol
                && r.mtu == mtu
                && r.channels == 4
                && r.striped
                && r.rate_mbit == Some(1000)
                && matches!(r.op.as_str(), "read" | "write")
                && matches!(r.workload.as_str(), "sequential" | "bonnie")
        })
        .max_by(|a, b| a.mb_per_s.total_cmp(&b.mb_per_s))
}

fn seed_003(report: &LabReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", Seed::S003.title());
    for (number_, mtu) in [(1, 1500), (2, 9000)] {
        let _ = writeln!(
            out,
            "\nTable {number_}: CPU usage efficiency at MTU {mtu} (four 1 Gbit channels, striped)"
        );
        let mut table = TextTable::new(
            &[
                "protocol",
                "peak MB/s",
                "ini CPU%",
                "MB/s/ini CPU%",
                "of max",
                "paper MB/s",
                "paper CPU%",
                "paper MB/s/CPU%",
                "paper of 400",
            ],
            1,
        );
        // NVMe/TCP has no paper figure: its row is ours alone.
        for protocol in [
            Protocol::Iscsi,
            Protocol::Aoe,
            Protocol::Nbd,
            Protocol::Nvme,
        ] {
            let ours = seed_003_peak(report, protocol, mtu);
            let key_op = ours.map_or("read", |r| r.op.as_str());
            let paper = published::lookup(
                Seed::S003,
                &published::CellKey {
                    protocol,
                    mtu,
                    rate_mbit: Some(1000),
                    channels: 4,
                    striped: true,
                    workload: "sequential",
                    op: key_op,
                },
            );
            if ours.is_none() && paper.is_none() {
                continue;
            }
            let paper_eff = paper
                .and_then(|p| p.efficiency)
                .or_else(|| paper.map(|p| p.mb_per_s.value() / SEED_003_MAX_MB_PER_S));
            table.row(vec![
                protocol.to_string(),
                ours.map_or("-".into(), |r| format!("{} ({})", number(r.mb_per_s), r.op)),
                ours.map_or("-".into(), |r| number(r.initiator_cpu_pct)),
                maybe(ours.and_then(|r| r.mb_per_s_per_cpu_pct)),
                ours.and_then(|r| r.efficiency).map_or("-".into(), pct),
                paper.map_or("-".into(), |p| p.mb_per_s.text()),
                maybe(paper.and_then(|p| p.cpu_pct)),
                maybe(paper.and_then(|p| p.mb_per_s_per_cpu_pct)),
                paper_eff.map_or("-".into(), pct),
            ]);
        }
        out.push_str(&table.render());
    }
    out.push_str(
        "paper: seed 003 §4.1-4.2, Tables 1-2, §5.4 (efficiency against ~400 MB/s); AoE wrote \
         6-10 MB/s at MTU 1500 (§4.2). Ours: CPU% of the initiator, as the paper's head node; \
         of max: against the channels' measured aggregate and the 210 MB/s disks.\n",
    );
    out.push_str(&scaling(report));
    out
}

/// How each protocol's streaming throughput scales from one channel to the most
/// channels measured (the goal: 4 channels ≥ 3.8× one).
pub fn scaling(report: &LabReport) -> String {
    let mut table = TextTable::new(&["protocol", "MTU", "op", "1 ch MB/s", "N ch MB/s", "×"], 3);
    let mut any = false;
    for one in report
        .cells
        .iter()
        .filter(|r| r.channels == 1 && !r.baseline && r.efficiency.is_some())
    {
        let most = report
            .cells
            .iter()
            .filter(|r| {
                r.channels > 1
                    && r.striped
                    && r.protocol == one.protocol
                    && r.mtu == one.mtu
                    && r.rate_mbit == one.rate_mbit
                    && r.workload == one.workload
                    && r.op == one.op
                    && !r.baseline
            })
            .max_by_key(|r| r.channels);
        if let Some(most) = most {
            any = true;
            table.row(vec![
                one.protocol.to_string(),
                one.mtu.to_string(),
                one.op.clone(),
                number(one.mb_per_s),
                format!("{} ({} ch)", number(most.mb_per_s), most.channels),
                format!("{:.2}", most.mb_per_s / one.mb_per_s.max(f64::MIN_POSITIVE)),
            ]);
        }
    }
    if !any {
        return String::new();
    }
    format!(
        "\nStriping: one channel against the most channels\n{}",
        table.render()
    )
}

fn seed_000(report: &LabReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", Seed::S000.title());
    let (read, write, rewrite) = published::SEED_000_LOCAL_DISK;
    let _ = writeln!(
        out,
        "paper's local disk (4-disk RAID0): read {read}, write {write}, rewrite {rewrite} MB/s"
    );
    for protocol in [
        Protocol::Aoe,
        Protocol::Nbd,
        Protocol::Iscsi,
        Protocol::Nvme,
    ] {
        let rows: Vec<&CellResult> = report
            .cells
            .iter()
            .filter(|r| r.protocol == protocol && r.channels == 1 && !r.baseline)
            .collect();
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{} results", protocol.name().to_uppercase());
        let mut table = TextTable::new(
            &[
                "speed",
                "MTU",
                "read",
                "write",
                "rewrite",
                "paper read",
                "paper write",
                "paper rewrite",
            ],
            2,
        );
        let mut beds: Vec<(Option<u64>, u32)> = rows.iter().map(|r| (r.rate_mbit, r.mtu)).collect();
        beds.dedup();
        for (rate, mtu) in beds {
            let find = |op: &str| {
                rows.iter()
                    .filter(|r| r.rate_mbit == rate && r.mtu == mtu && r.op == op)
                    .find(|r| r.workload == "bonnie")
                    .or_else(|| {
                        rows.iter()
                            .find(|r| r.rate_mbit == rate && r.mtu == mtu && r.op == op)
                    })
                    .copied()
            };
            let ours = |op: &str| find(op).map_or("-".into(), |r| number(r.mb_per_s));
            let paper = |op: &str| find(op).map_or("-".into(), published_text);
            table.row(vec![
                crate::matrix::Rate(rate).to_string(),
                mtu.to_string(),
                ours("read"),
                ours("write"),
                ours("rewrite"),
                paper("read"),
                paper("write"),
                paper("rewrite"),
            ]);
        }
        out.push_str(&table.render());
    }
    out.push_str(
        "paper: seed 000, AoE and NBD results, 4-disk RAID0 (bonnie++ -f, vblade 14 and \
         nbd-server). AoE ran at 4132, NBD at 4608: the other's cell has no paper figure.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample::report;

    #[test]
    fn the_matrix_has_a_line_per_row() {
        let report = report();
        let text = matrix(&report);
        // Header, rule, rows, the count, footnote.
        assert_eq!(text.lines().count(), report.cells.len() + 4, "{text}");
        assert!(
            text.contains("5 of 5 cells measured, 10 rows (one per operation).\n"),
            "{text}"
        );
        assert!(text.lines().next().unwrap().starts_with("protocol  MTU"));
        assert!(text.contains("≤283"), "{text}");
    }

    #[test]
    fn seed_003_tables_put_the_paper_beside_our_peaks() {
        let text = seed_tables(&report(), Seed::S003);
        assert!(
            text.contains("Table 1: CPU usage efficiency at MTU 1500"),
            "{text}"
        );
        let aoe_9000 = text
            .lines()
            .skip_while(|l| !l.starts_with("Table 2"))
            .find(|l| l.starts_with("aoe"))
            .unwrap();
        // Our peak (the write, 460 MB/s, 97% of 476) beside the paper's 283, 70%.
        for figure in ["460 (write)", "97%", "≤283", "23.0", "12.0", "70%"] {
            assert!(aoe_9000.contains(figure), "{figure} in {aoe_9000}");
        }
        // 118 MB/s on one channel, 460 on four.
        let scaling = scaling(&report());
        assert!(
            scaling
                .lines()
                .any(|l| l.starts_with("aoe") && l.ends_with("3.90")),
            "{scaling}"
        );
    }

    #[test]
    fn seed_003_tables_give_nvme_a_row_of_our_figures_alone() {
        let mut report = report();
        // NVMe/TCP 10 MB/s above iSCSI at MTU 9000 on four channels.
        let nvme: Vec<CellResult> = report
            .cells
            .iter()
            .filter(|r| r.protocol == Protocol::Iscsi && r.mtu == 9000)
            .cloned()
            .map(|mut r| {
                r.protocol = Protocol::Nvme;
                r.mb_per_s += 10.0;
                r
            })
            .collect();
        report.cells.extend(nvme);
        let text = seed_tables(&report, Seed::S003);
        let row = text
            .lines()
            .skip_while(|l| !l.starts_with("Table 2"))
            .find(|l| l.starts_with("nvme"))
            .unwrap_or_else(|| panic!("no nvme row in Table 2:\n{text}"));
        assert!(row.contains("460 (write)"), "{row}");
        // No paper figures: its last four columns are dashes.
        let columns: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(columns[columns.len() - 4..], ["-", "-", "-", "-"], "{row}");
        // MTU 1500 measured no NVMe/TCP and the paper has none: no row.
        let mut table_1 = text
            .lines()
            .skip_while(|l| !l.starts_with("Table 1"))
            .take_while(|l| !l.starts_with("Table 2"));
        assert!(!table_1.any(|l| l.starts_with("nvme")), "{text}");
    }

    #[test]
    fn progress_lines_show_each_streaming_op_with_its_efficiency() {
        let report = report();
        let line = progress_line(3, 12, "aoe sequential MTU 9000", &report.cells[..2]);
        assert_eq!(
            line,
            "[3/12] aoe sequential MTU 9000: write 460 MB/s (97%), read 455 MB/s (96%)"
        );
    }
}
