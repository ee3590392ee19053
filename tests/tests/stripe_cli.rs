//! Striped volumes from the command line: `blockwire copy --verify` and `bench` on
//! `stripe:CHUNK:MEMBER,...` of two files and of two `blockwire serve` NBD exports,
//! `serve` of a stripe as a gateway read back through NBD, a `[[volume]]` in a
//! config file, the throttle's `--disk-rate`, and one-line errors for bad members.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use blockwire_tests::{
    assert_success, blockwire_bin, path_str, patterned_file, run_bounded, sparse_file, text,
    Served, MIB,
};

const LIMIT: Duration = Duration::from_secs(180);

fn blockwire(args: &[&str]) -> Output {
    let mut command = Command::new(blockwire_bin());
    command.args(args);
    run_bounded(command, LIMIT)
}

fn copy_verify(from: &str, to: &str) {
    let output = blockwire(&["copy", from, to, "--verify", "--quiet"]);
    assert_success(&output);
    assert!(
        text(&output.stdout).contains("verified"),
        "{}",
        text(&output.stdout)
    );
}

/// `stripe:CHUNK:A,B`.
fn stripe(chunk: &str, members: &[&str]) -> String {
    format!("stripe:{chunk}:{}", members.join(","))
}

/// Sequential and random rows of a bench report on `target`, each having moved data.
fn bench_runs_on(target: &str, dir: &Path) {
    let json = dir.join("bench.json");
    let output = blockwire(&[
        "bench",
        target,
        "--workload",
        "sequential,random",
        "--size",
        "16M",
        "--time",
        "0.2",
        "--random-depths",
        "1,4",
        "--json",
        path_str(&json),
    ]);
    assert_success(&output);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().expect("results");
    for (workload, op) in [("sequential", "write"), ("sequential", "read")] {
        let row = results
            .iter()
            .find(|r| r["workload"] == workload && r["op"] == op)
            .unwrap_or_else(|| panic!("no {workload} {op} in {report}"));
        assert!(row["bytes"].as_u64().is_some_and(|b| b > 0), "{row}");
    }
    assert!(
        results.iter().any(|r| r["workload"] == "random"),
        "{report}"
    );
}

#[test]
fn copy_and_bench_on_a_stripe_of_two_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = sparse_file(dir.path(), "a.img", 8 * MIB);
    let b = sparse_file(dir.path(), "b.img", 8 * MIB);
    let source = patterned_file(dir.path(), "source.img", 16 << 20, 3);
    let volume = stripe("64K", &[path_str(&a), path_str(&b)]);
    copy_verify(path_str(&source), &volume);
    // Chunk 0 on a, chunk 1 on b, chunk 2 at 64 KiB on a.
    let original = std::fs::read(&source).unwrap();
    let on_a = std::fs::read(&a).unwrap();
    let on_b = std::fs::read(&b).unwrap();
    let k = 64 << 10;
    assert!(on_a[..k] == original[..k], "chunk 0 is not on member 0");
    assert!(
        on_b[..k] == original[k..2 * k],
        "chunk 1 is not on member 1"
    );
    assert!(
        on_a[k..2 * k] == original[2 * k..3 * k],
        "chunk 2 is not on member 0"
    );
    let back = dir.path().join("back.img");
    copy_verify(&volume, path_str(&back));
    assert!(
        std::fs::read(&back).unwrap() == original,
        "read back differs"
    );

    let info = blockwire(&["info", &volume]);
    assert_success(&info);
    assert!(
        text(&info.stdout).contains("size: 16777216"),
        "{}",
        text(&info.stdout)
    );

    bench_runs_on(&volume, dir.path());
}

#[test]
fn copy_and_bench_on_a_stripe_of_two_nbd_exports_and_serve_it_as_a_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let a = sparse_file(dir.path(), "a.img", 16 * MIB);
    let b = sparse_file(dir.path(), "b.img", 16 * MIB);
    let served_a = Served::start(&[path_str(&a), "--name", "a"], "a");
    let served_b = Served::start(&[path_str(&b), "--name", "b"], "b");
    let volume = stripe("1M", &[&served_a.uri(), &served_b.uri()]);

    let source = patterned_file(dir.path(), "source.img", 32 << 20, 5);
    copy_verify(path_str(&source), &volume);
    bench_runs_on(&volume, dir.path());
    // The bench overwrote the volume: put the pattern back, then read it through
    // a gateway that serves the stripe over NBD.
    copy_verify(path_str(&source), &volume);
    let gateway = Served::start(&[&volume, "--name", "vol"], "vol");
    let back = dir.path().join("back.img");
    copy_verify(&gateway.uri(), path_str(&back));
    assert!(
        std::fs::read(&back).unwrap() == std::fs::read(&source).unwrap(),
        "the gateway served different bytes"
    );
    // A write through the gateway lands on the members, chunk by chunk.
    let other = patterned_file(dir.path(), "other.img", 32 << 20, 77);
    copy_verify(path_str(&other), &gateway.uri());
    assert_eq!(gateway.terminate(), Some(0));
    assert_eq!(served_a.terminate(), Some(0));
    assert_eq!(served_b.terminate(), Some(0));
    let other = std::fs::read(&other).unwrap();
    let on_b = std::fs::read(&b).unwrap();
    assert!(
        on_b[..MIB as usize] == other[MIB as usize..2 * MIB as usize],
        "chunk 1 of the gateway's volume is not on member 1"
    );
}

#[test]
fn a_config_volume_is_served_and_throttled() {
    let dir = tempfile::tempdir().unwrap();
    let a = sparse_file(dir.path(), "a.img", 4 * MIB);
    let b = sparse_file(dir.path(), "b.img", 4 * MIB);
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n\n\
             [[volume]]\nname = \"wide\"\nchunk = \"128K\"\nmembers = [\"{}\", \"{}\"]\n\n\
             [[export]]\nname = \"slow\"\nvolume = \"wide\"\ndisk_rate = 40\ndisk_latency = 1\n",
            path_str(&a),
            path_str(&b)
        ),
    )
    .unwrap();
    let served = Served::start_config(&config, "slow");
    let source = patterned_file(dir.path(), "source.img", 8 << 20, 11);
    let started = Instant::now();
    copy_verify(path_str(&source), &served.uri());
    // 8 MB written and 8 MB read back by --verify, at 40 MB/s: at least 0.4 s less
    // the bucket's 20 ms burst.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(350), "{elapsed:?}");
    assert_eq!(served.terminate(), Some(0));
    let original = std::fs::read(&source).unwrap();
    let k = 128 << 10;
    assert!(std::fs::read(&b).unwrap()[..k] == original[k..2 * k]);
}

#[test]
fn serve_disk_rate_slows_an_export_down() {
    let dir = tempfile::tempdir().unwrap();
    let disk = patterned_file(dir.path(), "disk.img", 8 << 20, 1);
    let served = Served::start(
        &[path_str(&disk), "--name", "disk", "--disk-rate", "40"],
        "disk",
    );
    let back = dir.path().join("back.img");
    let started = Instant::now();
    copy_verify(&served.uri(), path_str(&back));
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(350), "{elapsed:?}");
}

#[test]
fn bad_members_are_named_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let a = sparse_file(dir.path(), "a.img", 4 * MIB);
    let small = sparse_file(dir.path(), "small.img", 32 << 10);
    let back = dir.path().join("back.img");
    let port = blockwire_tests::free_port();
    let cases = [
        (
            stripe("64K", &[path_str(&a), &format!("nbd://127.0.0.1:{port}/x")]),
            format!("stripe member 1 (nbd://127.0.0.1:{port}/x)"),
        ),
        (
            stripe("64K", &[path_str(&a), path_str(&small)]),
            "is smaller than one chunk".to_string(),
        ),
        (
            stripe(
                "64K",
                &[
                    path_str(&a),
                    &dir.path().join("missing.img").display().to_string(),
                ],
            ),
            "stripe member 1".to_string(),
        ),
        (
            "stripe:a.img,b.img".to_string(),
            "stripe:CHUNK:MEMBER".to_string(),
        ),
    ];
    for (volume, expect) in cases {
        let output = blockwire(&["copy", &volume, path_str(&back), "--quiet"]);
        assert!(!output.status.success(), "{volume} worked");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(&expect), "{volume}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{volume}: {stderr}");
    }
}
