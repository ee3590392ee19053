//! `--json`: the [`LabReport`], with its `cells` array.

use std::path::Path;

use crate::results::LabReport;

pub fn to_string(report: &LabReport) -> String {
    let mut text = serde_json::to_string_pretty(report).expect("a report always serialises");
    text.push('\n');
    text
}

pub fn from_str(text: &str) -> Result<LabReport, serde_json::Error> {
    serde_json::from_str(text)
}

pub fn write(report: &LabReport, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, to_string(report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample::report;

    #[test]
    fn a_report_reads_back_as_written() {
        let report = report();
        let text = to_string(&report);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["cells"].as_array().unwrap().len(), report.cells.len());
        assert_eq!(value["cells"][0]["protocol"], "aoe");
        let back = from_str(&text).unwrap();
        assert_eq!(back.cells.len(), report.cells.len());
        for (read, written) in back.cells.iter().zip(&report.cells) {
            assert!(read.same_cell(written) && read.op == written.op);
            let (a, b) = (read.efficiency.unwrap(), written.efficiency.unwrap());
            assert!((a - b).abs() < 1e-12, "{a} {b}");
            assert_eq!(read.published.is_some(), written.published.is_some());
        }
    }
}
