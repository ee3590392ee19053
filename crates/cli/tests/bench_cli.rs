//! `blockwire bench` end to end: the built binary on a temporary directory with tiny
//! sizes and times; its JSON, bonnie++ CSV (checked with bonnie++'s own
//! bon_csv2txt/bon_csv2html when installed) and HTML; `--compare`; bad input.

use std::path::Path;
use std::process::{Command, Output, Stdio};

fn blockwire(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run blockwire")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A file of `len` bytes (a hole) named `name` in `dir`.
fn sparse_file(dir: &Path, name: &str, len: u64) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path).unwrap().set_len(len).unwrap();
    path
}

/// Runs a quick bench of `dir` (direct I/O where the file system has it: the bench
/// falls back to buffered by itself where it has not).
fn quick_bench(dir: &Path, out: &Path) -> Output {
    let path = |name: &str| out.join(name).display().to_string();
    let pid = std::process::id().to_string();
    blockwire(&[
        "bench",
        &dir.display().to_string(),
        "--size",
        "8M",
        "--time",
        "0.1",
        "--files",
        "1",
        "--label",
        "tiny run",
        "--target-pid",
        &pid,
        "--json",
        &path("run.json"),
        "--csv",
        &path("run.csv"),
        "--html",
        &path("run.html"),
    ])
}

#[test]
fn bench_a_directory_and_write_every_report() {
    let scratch = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let output = quick_bench(scratch.path(), out.path());
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("target: "), "{stdout}");
    assert!(
        stdout.contains("MB/s") && stdout.contains("seq_create"),
        "{stdout}"
    );
    // The test file and the file-test directory are gone.
    assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);

    // JSON: the run, the machine and one entry per phase with every figure.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("run.json")).unwrap())
            .unwrap();
    assert_eq!(json["label"], "tiny run");
    assert_eq!(json["config"]["size"], 8 << 20);
    for key in ["workloads", "block_size", "queue_depth", "direct"] {
        assert!(!json["config"][key].is_null(), "config.{key}");
    }
    for key in ["hostname", "cpus", "memory_bytes", "kernel"] {
        assert!(!json["machine"][key].is_null(), "machine.{key}");
    }
    let results = json["results"].as_array().unwrap();
    let mut with_efficiency = 0;
    for workload in ["sequential", "bonnie", "sweep", "random"] {
        assert!(
            results.iter().any(|r| r["workload"] == workload),
            "{workload}"
        );
    }
    for result in results {
        for key in [
            "workload",
            "op",
            "block_size",
            "queue_depth",
            "bytes",
            "ops",
            "seconds",
            "mb_per_s",
            "iops",
            "cpu_percent",
        ] {
            assert!(!result[key].is_null(), "{key} in {result}");
        }
        for key in ["p50", "p99", "p999", "max"] {
            assert!(result["latency_us"][key].is_number(), "latency_us.{key}");
        }
        // --target-pid was this test process, so its CPU was seen.
        assert!(result["target_cpu_percent"].is_number(), "{result}");
        // The efficiency figure is a number wherever CPU time and data were measured
        // (file create/stat/delete move no data), and it is MB/s per CPU%.
        let cpu = result["cpu_percent"].as_f64().unwrap();
        let per_cpu = &result["mb_per_s_per_cpu_percent"];
        if cpu > 0.0 && result["bytes"].as_u64().unwrap() > 0 {
            let per_cpu = per_cpu
                .as_f64()
                .unwrap_or_else(|| panic!("no MB/s per CPU% in {result}"));
            let expected = result["mb_per_s"].as_f64().unwrap() / cpu;
            assert!(
                (per_cpu - expected).abs() <= 1e-6 * expected.abs().max(1.0),
                "{result}"
            );
            with_efficiency += 1;
        } else {
            assert!(per_cpu.is_null(), "{result}");
        }
    }
    assert!(with_efficiency > 0, "no phase had its efficiency measured");

    // CSV: one bonnie++ 1.98 line that bonnie++'s own tools accept.
    let csv = std::fs::read_to_string(out.path().join("run.csv")).unwrap();
    assert!(
        csv.starts_with("1.98,") && csv.lines().count() == 1,
        "{csv}"
    );
    check_with_bonnie_tools(&csv);

    // The sweep: every power of two from 4 KiB up to the 8 MiB data set (16 MiB
    // does not fit).
    let mut records: Vec<u64> = results
        .iter()
        .filter(|r| r["workload"] == "sweep")
        .map(|r| r["block_size"].as_u64().unwrap())
        .collect();
    records.dedup();
    let expected: Vec<u64> = (12..=23).map(|shift| 1u64 << shift).collect();
    assert_eq!(records, expected);
    // Per-request latency histograms: bounds increasing, counts adding up to the
    // phase's operations.
    for result in results
        .iter()
        .filter(|r| r["workload"] == "sweep" || r["workload"] == "random")
    {
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

    // HTML: self-contained, with charts, latency distributions among them.
    let html = std::fs::read_to_string(out.path().join("run.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg"));
    assert!(html.contains("Record-size sweep"));
    assert!(html.contains("<h2>Latency distribution</h2>"));
    for title in [
        "random",
        "sweep write, by record size",
        "sweep read, by record size",
    ] {
        let title = format!("<title>Latency distribution: {title}</title>");
        assert!(html.contains(&title), "{title}");
    }
    assert!(!html.contains("NaN") && !html.contains(">inf<"));

    // --compare reads the JSON back and lines the runs up.
    let json_path = out.path().join("run.json").display().to_string();
    let compared = blockwire(&["bench", "--compare", &json_path, &json_path]);
    assert!(compared.status.success(), "{}", text(&compared.stderr));
    let table = text(&compared.stdout);
    assert!(
        table.contains("Read MB/s") && table.contains("seeks/s"),
        "{table}"
    );
    assert_eq!(table.matches("tiny run").count(), 2, "{table}");
}

fn check_with_bonnie_tools(csv: &str) {
    let run = |tool: &str| {
        let mut child = match Command::new(tool)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(child) => child,
            Err(_) => return None,
        };
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(csv.as_bytes())
            .unwrap();
        Some(child.wait_with_output().unwrap())
    };
    let Some(txt) = run("bon_csv2txt") else {
        eprintln!("skipped: bon_csv2txt is not installed (apt-get install bonnie++)");
        return;
    };
    let (stdout, stderr) = (text(&txt.stdout), text(&txt.stderr));
    assert!(
        txt.status.success() && stderr.is_empty(),
        "bon_csv2txt: {stderr}"
    );
    assert!(
        stdout.contains("Sequential Output") && stdout.contains("tiny run"),
        "{stdout}"
    );
    assert!(stdout.contains("Sequential Create"), "{stdout}");
    if let Some(page) = run("bon_csv2html") {
        let (stdout, stderr) = (text(&page.stdout), text(&page.stderr));
        assert!(page.status.success(), "bon_csv2html: {stderr}");
        assert!(!stdout.contains("Can't process") && !stderr.contains("Can't process"));
        assert!(stdout.contains("tiny run"), "{stdout}");
    }
}

/// Runs a bench that must fail: exit 1 and one line on stderr naming the problem.
fn refused(args: &[&str], expected: &str) {
    let output = blockwire(args);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(expected),
        "{args:?}: expected '{expected}' in {stderr}"
    );
}

#[test]
fn bad_targets_are_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img").display().to_string();
    refused(&["bench", &missing], "does not exist (give --size");
    let nowhere = dir.path().join("no/dir/x.img").display().to_string();
    refused(
        &["bench", &nowhere, "--size", "8M"],
        "neither does its directory",
    );
    let here = dir.path().display().to_string();
    refused(&["bench", &here, "--size", "1P"], "does not fit");
    let small = dir.path().join("small.img");
    std::fs::write(&small, [7u8; 4096]).unwrap();
    refused(&["bench", &small.display().to_string()], "too small");
    let other = dir.path().join("other.json");
    std::fs::write(&other, "[]").unwrap();
    refused(
        &["bench", "--compare", &other.display().to_string()],
        "is not a blockwire bench report",
    );
    // Nothing was created along the way.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 2, "{left:?}");
}

#[test]
fn a_read_only_file_is_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "ro.img", 16 << 20);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o444)).unwrap();
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut command = if root {
        // Root writes through file permissions; an unprivileged user (nobody) sees
        // the file as read-only, and needs to reach it through the directory.
        if Command::new("setpriv").arg("--version").output().is_err() {
            eprintln!("skipped: running as root and setpriv is not installed");
            return;
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut command = Command::new("setpriv");
        command.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        command.arg(env!("CARGO_BIN_EXE_blockwire"));
        command
    } else {
        Command::new(env!("CARGO_BIN_EXE_blockwire"))
    };
    let output = command
        .args(["bench", "--workload", "sequential", "--buffered"])
        .arg(&image)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    if root && stderr.starts_with("setpriv:") {
        eprintln!("skipped: cannot run the binary as nobody: {stderr}");
        return;
    }
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("is read-only") && stderr.contains("the write tests need write access"),
        "{stderr}"
    );
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 16 << 20);
}

/// A ramfs mounted on a temporary directory (a file system without O_DIRECT),
/// unmounted when dropped.
struct Ramfs(tempfile::TempDir);

impl Ramfs {
    /// `None` when not root or the mount fails (said on stderr).
    fn mount() -> Option<Ramfs> {
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a ramfs needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "ramfs", "ramfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a ramfs");
            return None;
        }
        Some(Ramfs(dir))
    }
}

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn a_file_system_without_direct_io_is_measured_buffered_unless_direct_is_required() {
    let Some(ramfs) = Ramfs::mount() else {
        return;
    };
    // A file of the user's, made beforehand.
    let image = sparse_file(ramfs.0.path(), "bench.img", 8 << 20)
        .display()
        .to_string();
    let json = ramfs.0.path().join("run.json");
    let output = blockwire(&[
        "bench",
        &image,
        "--size",
        "8M",
        "--workload",
        "sequential",
        "--json",
        &json.display().to_string(),
    ]);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("no direct I/O (O_DIRECT); measuring buffered"),
        "{stderr}"
    );
    // The report says what was measured: buffered, and warned about the cache.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["config"]["direct"], false, "{report}");
    assert!(
        report["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("page cache")),
        "{report}"
    );
    // Asked for explicitly, direct I/O that cannot be had is an error.
    refused(
        &["bench", &image, "--size", "8M", "--direct"],
        "direct I/O (O_DIRECT) is not supported here; use --buffered",
    );
    // ramfs reports no size at all, which is no limit: a test file is created
    // there like anywhere else, and removed afterwards.
    let created = ramfs.0.path().join("created.img");
    let output = blockwire(&[
        "bench",
        &created.display().to_string(),
        "--size",
        "8M",
        "--workload",
        "sequential",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(!created.exists(), "the test file was left behind");
}

#[test]
fn a_file_system_image_needs_force() {
    let dir = tempfile::tempdir().unwrap();
    let image = sparse_file(dir.path(), "ext4.img", 8 << 20);
    let made = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&image)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("skipped: mkfs.ext4 is not installed");
        return;
    }
    let before = std::fs::read(&image).unwrap();
    refused(
        &[
            "bench",
            &image.display().to_string(),
            "--workload",
            "sequential",
        ],
        "refusing to overwrite it (use --force)",
    );
    assert_eq!(
        std::fs::read(&image).unwrap(),
        before,
        "the image was touched"
    );
}

#[test]
fn an_interrupted_run_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_blockwire"))
        .args([
            "bench",
            "--workload",
            "random",
            "--size",
            "16M",
            "--time",
            "30",
            "--buffered",
        ])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while std::fs::read_dir(dir.path()).unwrap().count() == 0 {
        assert!(started.elapsed().as_secs() < 20, "no test file appeared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Let it get into the timed phase, then stop it as Ctrl-C would.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("removed "));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
