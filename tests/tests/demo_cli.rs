//! `blockwire demo` through the release binary: it serves an in-memory device over
//! NBD inside itself, measures it directly and through our initiator, and prints one
//! table with both figures and the NBD path's efficiency.

use std::process::Command;
use std::time::Duration;

use blockwire_tests::{assert_success, blockwire_bin, run_bounded, text};

/// Generous: the demo with a tiny data set takes seconds; this only stops a hang
/// from stalling the test run.
const LIMIT: Duration = Duration::from_secs(180);

/// A table cell as a number ("21.6%" -> 21.6), or None for "-" and non-numbers.
fn number(cell: &str) -> Option<f64> {
    cell.trim_end_matches('%').parse().ok()
}

#[test]
fn demo_prints_local_and_nbd_figures_with_the_efficiency() {
    let mut command = Command::new(blockwire_bin());
    // The smallest data set and phase time keep the run short; the figures are not
    // judged, only that every one of them was measured.
    command.args(["demo", "--size", "16M", "--time", "1"]);
    let output = run_bounded(command, LIMIT);
    assert_success(&output);
    let stdout = text(&output.stdout);
    assert!(stdout.contains("served at nbd://127.0.0.1:"), "{stdout}");

    let header = stdout
        .lines()
        .find(|l| l.starts_with("phase"))
        .unwrap_or_else(|| panic!("no table header in:\n{stdout}"));
    for column in [
        "local MB/s",
        "NBD MB/s",
        "NBD IOPS",
        "NBD/local",
        "MB/s/CPU%",
    ] {
        assert!(header.contains(column), "no {column:?} column: {header}");
    }

    // Each phase the demo runs has a row with both measurements. The last seven
    // cells are: local MB/s, NBD MB/s, NBD IOPS, NBD p99 µs, NBD/local, CPU%,
    // MB/s/CPU% (the phase label before them has spaces in it).
    for phase in [
        "sequential write",
        "sequential read",
        "random randread",
        "random randwrite",
    ] {
        let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with(phase)).collect();
        assert!(!rows.is_empty(), "no {phase:?} row in:\n{stdout}");
        for row in rows {
            let cells: Vec<&str> = row.split_whitespace().collect();
            assert!(cells.len() >= 7, "short row: {row}");
            let figures = &cells[cells.len() - 7..];
            let local = number(figures[0]).unwrap_or_else(|| panic!("local MB/s in {row}"));
            let nbd = number(figures[1]).unwrap_or_else(|| panic!("NBD MB/s in {row}"));
            assert!(local > 0.0 && nbd > 0.0, "nothing moved: {row}");
            assert!(number(figures[2]).is_some_and(|iops| iops > 0.0), "{row}");
            // The efficiency is NBD against local, as a percentage.
            let efficiency = figures[4];
            assert!(
                efficiency.ends_with('%'),
                "NBD/local not a percentage: {row}"
            );
            let expected = 100.0 * nbd / local;
            let shown = number(efficiency).unwrap();
            assert!(
                shown > 0.0 && (shown - expected).abs() <= 0.05 * expected + 0.2,
                "NBD/local {shown}% is not NBD/local MB/s ({expected:.1}%): {row}"
            );
            // "-" when no CPU time was seen in a very short phase.
            assert!(
                number(figures[6]).is_some() || figures[6] == "-",
                "MB/s/CPU% missing: {row}"
            );
        }
    }
}
