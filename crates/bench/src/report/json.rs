//! `--json`: the [`RunReport`] as JSON, and reading it back for `--compare`.

use std::path::Path;

use crate::error::{Error, Result};
use crate::results::RunReport;

/// The report as pretty JSON. Each result also carries `link_percent`, its share of
/// the network baseline (the table's "% of link"; null without a baseline). It is
/// derived, so it is written here rather than stored, and ignored when read back.
pub fn to_string(report: &RunReport) -> String {
    let mut value = serde_json::to_value(report).expect("a report always serialises");
    if let Some(results) = value["results"].as_array_mut() {
        for (object, phase) in results.iter_mut().zip(&report.results) {
            if let Some(object) = object.as_object_mut() {
                object.insert(
                    "link_percent".into(),
                    super::link_percent(report, phase).into(),
                );
            }
        }
    }
    serde_json::to_string_pretty(&value).expect("a JSON value always prints")
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
    use std::time::Duration;

    use super::*;
    use crate::meter::Recorder;
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
    fn keys_come_out_in_the_order_of_the_fields() {
        let value: serde_json::Value =
            serde_json::from_str(&to_string(&sample::report("local", 1.0))).unwrap();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        assert_eq!(keys(&value)[..3], ["target", "label", "config"]);
        let result = keys(&value["results"][0]);
        assert_eq!(result[..3], ["workload", "op", "block_size"]);
        // The derived figure comes last.
        assert_eq!(result.last().unwrap(), "link_percent");
        assert_eq!(
            keys(&value["results"][0]["latency_us"]),
            ["p50", "p99", "p999", "max"]
        );
    }

    #[test]
    fn results_carry_their_share_of_the_link() {
        let mut report = sample::report("nfs", 1.0);
        report.network_mb_per_s = Some(200.0);
        report.results.retain(|r| r.workload != "network");
        let row = report.results.iter().position(|r| r.bytes > 0).unwrap();
        report.results[row].mb_per_s = 150.0;
        let value: serde_json::Value = serde_json::from_str(&to_string(&report)).unwrap();
        assert_eq!(value["results"][row]["link_percent"], 75.0);
        // Phases that move no data (bonnie's file tests) have no share.
        let empty = report.results.iter().position(|r| r.bytes == 0).unwrap();
        assert!(value["results"][empty]["link_percent"].is_null());
        // Without a baseline every share is null, and the key is still there.
        report.network_mb_per_s = None;
        let value: serde_json::Value = serde_json::from_str(&to_string(&report)).unwrap();
        for result in value["results"].as_array().unwrap() {
            let share = result.get("link_percent").expect("link_percent key");
            assert!(share.is_null(), "{result}");
        }
        // The derived figure does not get in the way of reading a report back.
        assert_eq!(from_str(&to_string(&report)).unwrap(), report);
    }

    #[test]
    fn latency_histograms_round_trip_and_are_left_out_when_empty() {
        let mut report = sample::report("local", 1.0);
        let mut recorder = Recorder::new();
        for us in [3, 3, 4, 250] {
            recorder.record(Duration::from_micros(us));
        }
        report.results[0].latency_histogram = recorder.buckets();
        let text = to_string(&report);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let buckets = value["results"][0]["latency_histogram"].as_array().unwrap();
        assert_eq!(buckets.len(), 3, "{buckets:?}");
        assert_eq!(buckets[0]["le_us"], 3.36);
        assert_eq!(buckets[0]["count"], 2);
        assert_eq!(buckets[2]["le_us"], 256.0);
        // Phases without one (network, old reports) carry no key at all.
        assert!(value["results"][1].get("latency_histogram").is_none());
        assert_eq!(from_str(&text).unwrap(), report);
    }

    #[test]
    fn reports_from_before_latency_histograms_still_load() {
        // A phase as reports had it before `latency_histogram` (and `link_percent`,
        // which is derived and ignored when read).
        let old = r#"{
          "target": "/mnt/old", "label": "old",
          "config": {"workloads": ["random"], "size": 1073741824,
                     "block_size": 1048576, "queue_depth": 1, "direct": true},
          "machine": {"hostname": "h", "cpus": 2, "memory_bytes": 4294967296,
                      "kernel": "6.1.0"},
          "network_mb_per_s": null,
          "results": [{
            "workload": "random", "op": "randread", "block_size": 4096,
            "queue_depth": 1, "bytes": 4096000, "ops": 1000, "seconds": 1.0,
            "mb_per_s": 4.096, "iops": 1000.0,
            "latency_us": {"p50": 40.0, "p99": 250.0, "p999": 900.0, "max": 1200.0},
            "cpu_percent": 12.0, "target_cpu_percent": null,
            "mb_per_s_per_cpu_percent": 0.34
          }],
          "warnings": []
        }"#;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        std::fs::write(&path, old).unwrap();
        let report = read(&path).unwrap();
        assert_eq!(report.results.len(), 1);
        assert!(report.results[0].latency_histogram.is_empty());
        assert_eq!(report.results[0].latency_us.p99, 250.0);
        // Written again, it looks as it did: still no histogram key.
        assert!(!to_string(&report).contains("latency_histogram"));
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
