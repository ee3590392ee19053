//! `blockwire bench FILE --workload sweep,random` through the release binary: the
//! sweep steps through every power of two, each phase's JSON carries its latency
//! histogram, and the HTML page draws the histograms.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use blockwire_tests::{assert_success, blockwire_bin, path_str, run_bounded};

/// A safety net against a hang, not a timing assertion: with 0.1 s per measurement
/// the sweep's 12 record sizes that fit × 8 operations take ten seconds at most.
const LIMIT: Duration = Duration::from_secs(180);

/// Benchmarks an 8 MiB file in `dir`, writing `run.json` and `run.html` there (the
/// bench measures buffered by itself where the file system has no O_DIRECT).
fn bench(dir: &Path) -> Output {
    let image = dir.join("disk.img");
    let json = dir.join("run.json");
    let html = dir.join("run.html");
    let mut command = Command::new(blockwire_bin());
    command.args([
        "bench",
        path_str(&image),
        "--workload",
        "sweep,random",
        "--size",
        "8M",
        "--time",
        "0.1",
        "--random-depths",
        "1",
        "--json",
        path_str(&json),
        "--html",
        path_str(&html),
    ]);
    run_bounded(command, LIMIT)
}

#[test]
fn the_sweep_covers_every_power_of_two_and_the_page_draws_latency_histograms() {
    let dir = tempfile::tempdir().unwrap();
    let output = bench(dir.path());
    assert_success(&output);
    let json = std::fs::read_to_string(dir.path().join("run.json")).unwrap();
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let results = report["results"].as_array().unwrap();

    // Every power of two from 4 KiB up to the 8 MiB data set (16 MiB does not fit).
    let mut records: Vec<u64> = results
        .iter()
        .filter(|r| r["workload"] == "sweep")
        .map(|r| r["block_size"].as_u64().unwrap())
        .collect();
    records.dedup();
    let expected: Vec<u64> = (12..=23).map(|shift| 1u64 << shift).collect();
    assert_eq!(records, expected);

    // Each phase's histogram: bounds increasing, counts adding up to its operations.
    for result in results {
        let buckets = result["latency_histogram"]
            .as_array()
            .unwrap_or_else(|| panic!("no latency_histogram in {result}"));
        let bounds: Vec<f64> = buckets
            .iter()
            .map(|b| b["le_us"].as_f64().unwrap())
            .collect();
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{result}");
        let counted: u64 = buckets.iter().map(|b| b["count"].as_u64().unwrap()).sum();
        assert_eq!(counted, result["ops"].as_u64().unwrap(), "{result}");
    }

    // The page: a latency distribution chart for random and for the sweep.
    let html = std::fs::read_to_string(dir.path().join("run.html")).unwrap();
    assert!(html.contains("<h2>Latency distribution</h2>"));
    for title in [
        "Latency distribution: random",
        "Latency distribution: sweep write, by record size",
        "Latency distribution: sweep read, by record size",
    ] {
        assert!(html.contains(&format!("<title>{title}</title>")), "{title}");
    }
    assert_eq!(html.matches(r#"class="latency-histogram""#).count(), 3);
    assert_eq!(html.matches("<svg").count(), html.matches("</svg>").count());
    assert_eq!(
        html.matches("<path ").count(),
        html.matches("</path>").count()
    );
    assert!(!html.contains("NaN") && !html.contains("inf"));
}
