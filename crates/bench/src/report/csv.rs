//! The bonnie++ CSV line (format version 1.98, as bonnie++ 1.98 and 2.0x write it),
//! so that `bon_csv2txt` and `bon_csv2html` and every spreadsheet built around them
//! read our results. Throughput is in KiB/s, CPU in whole percent, latencies are
//! maxima with a unit (`us`, `ms`, `s`); a test that did not run leaves its fields
//! empty.

use crate::report::find;
use crate::results::{PhaseResult, RunReport};

/// The CSV format version bonnie++'s tools check in the first field.
pub const FORMAT_VERSION: &str = "1.98";

/// The fields of a line, in order (bonnie++'s own names).
pub const FIELDS: [&str; 50] = [
    "format_version",
    "bonnie_version",
    "name",
    "concurrency",
    "seed",
    "file_size",
    "chunk_size",
    "seeks",
    "seek_proc_count",
    "putc",
    "putc_cpu",
    "put_block",
    "put_block_cpu",
    "rewrite",
    "rewrite_cpu",
    "getc",
    "getc_cpu",
    "get_block",
    "get_block_cpu",
    "seeks_per_sec",
    "seeks_cpu",
    "num_files",
    "max_size",
    "min_size",
    "num_dirs",
    "file_chunk_size",
    "seq_create",
    "seq_create_cpu",
    "seq_stat",
    "seq_stat_cpu",
    "seq_del",
    "seq_del_cpu",
    "ran_create",
    "ran_create_cpu",
    "ran_stat",
    "ran_stat_cpu",
    "ran_del",
    "ran_del_cpu",
    "putc_latency",
    "put_block_latency",
    "rewrite_latency",
    "getc_latency",
    "get_block_latency",
    "seeks_latency",
    "seq_create_latency",
    "seq_stat_latency",
    "seq_del_latency",
    "ran_create_latency",
    "ran_stat_latency",
    "ran_del_latency",
];

/// bonnie++'s I/O chunk size; its CSV leaves the field empty for the default.
const DEFAULT_CHUNK: u64 = 8192;
const IO_OPS: [&str; 5] = ["putc", "write", "rewrite", "getc", "read"];
const FILE_OPS: [&str; 6] = [
    "seq_create",
    "seq_stat",
    "seq_delete",
    "rand_create",
    "rand_stat",
    "rand_delete",
];

/// The data set size as bonnie++ prints it: whole GiB as `NG`, else MiB as `NM`.
fn bonnie_size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB && bytes.is_multiple_of(GIB) {
        format!("{}G", bytes / GIB)
    } else {
        format!("{}M", bytes >> 20)
    }
}

/// A latency as bonnie++ prints it.
fn latency(us: f64) -> String {
    let us = us.round() as u64;
    if us < 10_000 {
        format!("{us}us")
    } else if us < 10_000_000 {
        format!("{}ms", us / 1000)
    } else {
        format!("{}s", us / 1_000_000)
    }
}

fn cpu(result: &PhaseResult) -> String {
    format!("{}", result.cpu_percent.round() as u64)
}

/// A field safe to put between commas.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c == ',' || c.is_control() { '_' } else { c })
        .collect()
}

/// The bonnie++ CSV line for a run's bonnie results, newline-terminated.
pub fn bonnie_line(report: &RunReport) -> String {
    let bonnie = |op: &str| find(report, "bonnie", op);
    let mut fields: Vec<String> = Vec::with_capacity(FIELDS.len());
    fields.push(FORMAT_VERSION.into());
    fields.push(format!("blockwire-{}", env!("CARGO_PKG_VERSION")));
    fields.push(clean(&report.label));
    fields.push("1".into());
    fields.push("0".into());
    fields.push(bonnie_size(report.config.size));
    let chunk = bonnie("write").map_or(DEFAULT_CHUNK, |r| r.block_size);
    fields.push(if chunk == DEFAULT_CHUNK {
        String::new()
    } else {
        chunk.to_string()
    });
    match bonnie("seeks") {
        Some(seeks) => {
            fields.push(seeks.ops.to_string());
            fields.push(seeks.queue_depth.to_string());
        }
        None => fields.extend([String::new(), String::new()]),
    }
    for op in IO_OPS {
        match bonnie(op) {
            Some(r) => {
                let kib_per_s = r.mb_per_s * 1e6 / 1024.0;
                fields.push(format!("{}", kib_per_s.round() as u64));
                fields.push(cpu(r));
            }
            None => fields.extend([String::new(), String::new()]),
        }
    }
    match bonnie("seeks") {
        Some(r) => {
            fields.push(format!("{:.1}", r.iops));
            fields.push(cpu(r));
        }
        None => fields.extend([String::new(), String::new()]),
    }
    // -n count:max:min:dirs:chunk; the count is in units of 1024 files.
    match bonnie("seq_create") {
        Some(r) => fields.push((r.ops / 1024).max(1).to_string()),
        None => fields.push(String::new()),
    }
    fields.extend((0..4).map(|_| String::new()));
    for op in FILE_OPS {
        match bonnie(op) {
            Some(r) => {
                fields.push(format!("{}", r.iops.round() as u64));
                fields.push(cpu(r));
            }
            None => fields.extend([String::new(), String::new()]),
        }
    }
    for op in IO_OPS.iter().chain(&["seeks"]).chain(FILE_OPS.iter()) {
        fields.push(bonnie(op).map_or_else(String::new, |r| latency(r.latency_us.max)));
    }
    debug_assert_eq!(fields.len(), FIELDS.len());
    let mut line = fields.join(",");
    line.push('\n');
    line
}

/// Splits a bonnie++ CSV line into its fields; checks the format version.
pub fn parse_line(line: &str) -> Result<Vec<String>, String> {
    let fields: Vec<String> = line
        .trim_end_matches(['\r', '\n'])
        .split(',')
        .map(str::to_string)
        .collect();
    if fields.first().map(String::as_str) != Some(FORMAT_VERSION) {
        return Err(format!("not a bonnie++ {FORMAT_VERSION} CSV line"));
    }
    if fields.len() < 21 {
        return Err(format!("only {} fields", fields.len()));
    }
    Ok(fields)
}

/// A field of a parsed line by its name in [`FIELDS`].
pub fn field<'a>(fields: &'a [String], name: &str) -> Option<&'a str> {
    let index = FIELDS.iter().position(|&f| f == name)?;
    fields.get(index).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample;

    #[test]
    fn the_line_has_bonnies_fields_in_bonnies_units() {
        let report = sample::report("nbd, mtu 9000", 1.0);
        let line = bonnie_line(&report);
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        let fields = parse_line(&line).unwrap();
        assert_eq!(fields.len(), FIELDS.len());
        assert_eq!(field(&fields, "name"), Some("nbd_ mtu 9000"));
        assert_eq!(field(&fields, "file_size"), Some("8G"));
        assert_eq!(field(&fields, "chunk_size"), Some(""));
        assert_eq!(field(&fields, "seek_proc_count"), Some("3"));
        // 550 MB/s = 537109 KiB/s.
        assert_eq!(field(&fields, "put_block"), Some("537109"));
        assert_eq!(field(&fields, "put_block_cpu"), Some("25"));
        assert_eq!(field(&fields, "get_block"), Some("1113281"));
        assert_eq!(field(&fields, "num_files"), Some("2"));
        assert_eq!(field(&fields, "seq_create"), Some("1024"));
        assert_eq!(field(&fields, "putc_latency"), Some("12ms"));
        assert_eq!(field(&fields, "ran_del_latency"), Some("12ms"));
    }

    #[test]
    fn missing_tests_leave_empty_fields() {
        let mut report = sample::report("x", 1.0);
        report
            .results
            .retain(|r| r.workload != "bonnie" || r.op == "read");
        let fields = parse_line(&bonnie_line(&report)).unwrap();
        assert_eq!(field(&fields, "putc"), Some(""));
        assert_ne!(field(&fields, "get_block"), Some(""));
        assert_eq!(field(&fields, "num_files"), Some(""));
        assert_eq!(field(&fields, "seq_create_latency"), Some(""));
        assert!(parse_line("1.97,x").is_err());
    }

    #[test]
    fn latencies_and_sizes_use_bonnies_units() {
        assert_eq!(latency(812.4), "812us");
        assert_eq!(latency(29_701.0), "29ms");
        assert_eq!(latency(12_000_000.0), "12s");
        assert_eq!(bonnie_size(64 << 20), "64M");
        assert_eq!(bonnie_size(48 << 30), "48G");
    }
}
