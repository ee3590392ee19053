//! `--json`: the [`RunReport`] as JSON, and reading it back for `--compare`.

use std::path::Path;

use crate::error::{Error, Result};
use crate::results::RunReport;

pub fn to_string(report: &RunReport) -> String {
    serde_json::to_string_pretty(report).expect("a report always serialises")
}

pub fn from_str(text: &str) -> Result<RunReport, serde_json::Error> {
    serde_json::from_str(text)
}

pub fn write(report: &RunReport, path: &Path) -> Result<()> {
    let mut text = to_string(report);
    text.push('\n');
    std::fs::write(path, text).map_err(|e| Error::io_at("cannot write", path, e))
}

pub fn read(path: &Path) -> Result<RunReport> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io_at("cannot read", path, e))?;
    from_str(&text).map_err(|e| {
        Error::Report(format!(
            "{} is not a blockwire bench report: {e}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample;

    #[test]
    fn reports_round_trip_through_a_file() {
        let report = sample::report("local", 1.0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        write(&report, &path).unwrap();
        assert_eq!(read(&path).unwrap(), report);
        let value: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let first = &value["results"][0];
        for key in [
            "workload",
            "op",
            "mb_per_s",
            "iops",
            "latency_us",
            "cpu_percent",
        ] {
            assert!(!first[key].is_null(), "{key}");
        }
        assert!(first["latency_us"]["p999"].is_number());
    }

    #[test]
    fn other_json_is_refused_with_the_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.json");
        std::fs::write(&path, "{\"hello\": 1}").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(
            err.contains("other.json is not a blockwire bench report"),
            "{err}"
        );
    }
}
