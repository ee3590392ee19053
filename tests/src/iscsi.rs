//! Helpers for iSCSI tests: Debian's tgtd as a reference target on a free port,
//! libiscsi's conformance suite (`iscsi-test-cu`) run and counted, and the bounded
//! runs of the libiscsi and qemu programs the tests drive.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::{free_port, path_str, run_bounded, text};

/// How long one peer program (iscsi-inq, qemu-img on a few MiB, ...) may take before
/// the test calls it hung: a safety net, never a performance assertion.
pub const TOOL_LIMIT: Duration = Duration::from_secs(120);

/// How long the whole conformance suite may take (about 20 s against tgtd).
pub const CONFORMANCE_LIMIT: Duration = Duration::from_secs(600);

/// Runs `program ARGS...` to completion (bounded by [`TOOL_LIMIT`]), output captured.
pub fn tool(program: &str, args: &[&str]) -> Output {
    let mut command = Command::new(program);
    command.args(args);
    run_bounded(command, TOOL_LIMIT)
}

/// Like [`tool`], failing the test with both outputs unless the program succeeded.
pub fn tool_ok(program: &str, args: &[&str]) -> Output {
    let output = tool(program, args);
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    output
}

/// Why qemu-img and qemu-io cannot open `iscsi://` URLs here, or None when they can.
/// Debian ships qemu's iSCSI driver in qemu-block-extra; `qemu-img --help` lists it
/// either way, so this asks qemu-img to open a closed port and looks at the error.
pub fn qemu_iscsi_unavailable() -> Option<String> {
    for program in ["qemu-img", "qemu-io"] {
        if !crate::have(program) {
            return Some(format!("{program} is not installed (package qemu-utils)"));
        }
    }
    let url = format!(
        "iscsi://127.0.0.1:{}/iqn.2026-11.dev.blockwire:none/0",
        free_port()
    );
    let stderr = text(&tool("qemu-img", &["info", &url]).stderr);
    if stderr.contains("Unable to load module") || stderr.contains("Unknown protocol") {
        return Some("qemu has no iSCSI block driver (package qemu-block-extra)".into());
    }
    None
}

/// Returns early from a test, saying why, when qemu cannot open `iscsi://` URLs.
#[macro_export]
macro_rules! require_qemu_iscsi {
    () => {
        if let Some(reason) = $crate::iscsi::qemu_iscsi_unavailable() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

/// Why tgtd cannot run here (not installed, not root), or None when it can.
pub fn tgtd_unavailable() -> Option<String> {
    for program in ["tgtd", "tgtadm"] {
        if !crate::have(program) {
            return Some(format!("{program} is not installed (package tgt)"));
        }
    }
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("tgtd needs root (its control socket lives in /var/run/tgtd)".into());
    }
    None
}

/// Returns early from a test, saying why, when tgtd cannot run here.
#[macro_export]
macro_rules! require_tgtd {
    () => {
        if let Some(reason) = $crate::iscsi::tgtd_unavailable() {
            eprintln!("skipped: {reason}");
            return;
        }
    };
}

/// What backs a tgtd logical unit.
pub enum Backing<'a> {
    /// A file, read and written with pread/pwrite (tgtd's `rdwr` store).
    File(&'a Path),
    /// Nothing: reads return zeroes, writes are dropped (tgtd's `null` store, 1 TiB),
    /// the ceiling of what an initiator can do against tgtd.
    Null,
}

/// Debian's tgtd, the reference target, on 127.0.0.1 and a free port, in the
/// foreground. Its management socket is `/var/run/tgtd/socket.N` for a control port
/// N of its own, so it never meets a system tgtd or another test's. Stopped by PID
/// when dropped.
pub struct Tgtd {
    child: Child,
    control_port: u16,
    /// The iSCSI portal's port on 127.0.0.1.
    pub port: u16,
    log: tempfile::NamedTempFile,
    next_tid: u32,
}

/// Distinct control ports for the tgtd instances of one test process.
static INSTANCES: AtomicU32 = AtomicU32::new(0);

impl Tgtd {
    /// Starts tgtd and waits until its portal accepts connections and `tgtadm`
    /// reaches it; retries with other ports when one is taken.
    pub fn start() -> Tgtd {
        let mut last_error = String::new();
        for _ in 0..8 {
            let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
            // A number of this process and instance, below 32768 (tgtd refuses
            // larger ones); tgtd also refuses one whose lock
            // another tgtd holds, and we then try the next.
            let control_port =
                (10_000 + (std::process::id() * 17 + instance * 7919) % 22_000) as u16;
            match Tgtd::try_start(control_port, free_port()) {
                Ok(tgtd) => return tgtd,
                Err(e) => last_error = e,
            }
        }
        panic!("tgtd did not start: {last_error}");
    }

    fn try_start(control_port: u16, port: u16) -> Result<Tgtd, String> {
        let log = tempfile::NamedTempFile::new().expect("tgtd log file");
        let child = Command::new("tgtd")
            .args([
                "-f",
                "-C",
                &control_port.to_string(),
                "--iscsi",
                &format!("portal=127.0.0.1:{port}"),
            ])
            .stdin(Stdio::null())
            .stdout(log.reopen().expect("reopen tgtd log"))
            .stderr(log.reopen().expect("reopen tgtd log"))
            .spawn()
            .map_err(|e| format!("cannot run tgtd: {e}"))?;
        let mut tgtd = Tgtd {
            child,
            control_port,
            port,
            log,
            next_tid: 1,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = tgtd.child.try_wait() {
                return Err(format!("tgtd exited ({status}): {}", tgtd.log_text()));
            }
            // tgtd keeps running without a portal it could not bind.
            if tgtd.log_text().contains("failed to create/bind to portal") {
                return Err(format!("port {port} taken: {}", tgtd.log_text()));
            }
            let managed = tgtd
                .tgtadm_output(&["--mode", "target", "--op", "show"])
                .status
                .success();
            if managed && TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(tgtd);
            }
            if Instant::now() > deadline {
                return Err(format!("tgtd did not come up: {}", tgtd.log_text()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What tgtd has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read(self.log.path())
            .map(|bytes| text(&bytes))
            .unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// `tgtadm -C N --lld iscsi ARGS...`, output captured.
    fn tgtadm_output(&self, args: &[&str]) -> Output {
        let mut command = Command::new("tgtadm");
        command
            .args(["-C", &self.control_port.to_string(), "--lld", "iscsi"])
            .args(args);
        run_bounded(command, TOOL_LIMIT)
    }

    /// `tgtadm -C N --lld iscsi ARGS...`, failing the test unless it succeeds.
    pub fn tgtadm(&self, args: &[&str]) {
        let output = self.tgtadm_output(args);
        assert!(
            output.status.success(),
            "tgtadm {args:?} failed ({}): {}{}\ntgtd log:\n{}",
            output.status,
            text(&output.stdout),
            text(&output.stderr),
            self.log_text()
        );
    }

    /// Adds a target `iqn.2026-11.dev.blockwire.test:tgt-NAME` with `backing` as its
    /// LUN 1 (tgtd's LUN 0 is its controller), open to every initiator; returns its
    /// URL, `iscsi://127.0.0.1:PORT/IQN/1`.
    pub fn add_target(&mut self, name: &str, backing: Backing<'_>) -> String {
        let tid = self.next_tid.to_string();
        self.next_tid += 1;
        let iqn = format!("iqn.2026-11.dev.blockwire.test:tgt-{name}");
        self.tgtadm(&[
            "--mode",
            "target",
            "--op",
            "new",
            "--tid",
            &tid,
            "--targetname",
            &iqn,
        ]);
        let mut lun = vec![
            "--mode",
            "logicalunit",
            "--op",
            "new",
            "--tid",
            &tid,
            "--lun",
        ];
        match backing {
            Backing::File(path) => lun.extend(["1", "--backing-store", path_str(path)]),
            Backing::Null => lun.extend(["1", "--bstype", "null", "--backing-store", "/dev/null"]),
        }
        self.tgtadm(&lun);
        self.tgtadm(&[
            "--mode",
            "target",
            "--op",
            "bind",
            "--tid",
            &tid,
            "--initiator-address",
            "ALL",
        ]);
        format!("iscsi://127.0.0.1:{}/{iqn}/1", self.port)
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child's PID.
            unsafe { libc::kill(self.pid(), libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // tgtd lingers while initiators are logged in; its stores write through
            // (pwrite), so nothing is lost by killing it.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // Its management socket and lock file, which tgtd leaves behind.
        for suffix in ["", ".lock"] {
            let _ = std::fs::remove_file(format!(
                "/var/run/tgtd/socket.{}{suffix}",
                self.control_port
            ));
        }
    }
}

/// The outcome of one run of libiscsi's conformance suite.
#[derive(Debug, Default, Clone)]
pub struct ConformanceCounts {
    /// Tests that passed without a skip notice.
    pub passed: usize,
    pub failed: usize,
    /// Tests that passed but printed `[SKIPPED]`: the target lacks what they test
    /// (an optional command, thin provisioning, removable media, ...), wholly or in
    /// part; CUnit counts them as passed.
    pub skipped: usize,
    /// `Suite.Test: message` for each failed test (and for a run that did not
    /// finish or a suite that could not start).
    pub failures: Vec<String>,
    /// Everything the suite printed.
    pub output: String,
}

impl ConformanceCounts {
    /// "222 passed, 8 failed, 45 skipped".
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }

    /// Fails the test, naming `who`, unless nothing failed and more than `at_least`
    /// tests passed.
    pub fn assert_clean(&self, who: &str, at_least: usize) {
        assert!(
            self.failures.is_empty(),
            "{who}: {}; failures:\n{}\n\nfull output:\n{}",
            self.summary(),
            self.failures.join("\n"),
            self.output
        );
        assert!(
            self.passed > at_least,
            "{who}: only {} tests passed:\n{}",
            self.passed,
            self.output
        );
    }
}

/// Runs `iscsi-test-cu --dataloss --test=ALL URL` (every test, destructive ones
/// too: the LUN's data is overwritten) and counts the results.
pub fn run_conformance(url: &str) -> ConformanceCounts {
    run_conformance_tests(url, "ALL")
}

/// Runs the conformance tests selected by `test` (a family, `FAMILY.SUITE` or
/// `FAMILY.SUITE.TEST`, as `iscsi-test-cu --list` names them) and counts them.
pub fn run_conformance_tests(url: &str, test: &str) -> ConformanceCounts {
    let mut command = Command::new("iscsi-test-cu");
    // Verbose mode (the default) names each test before its result, so skip notices
    // can be told apart from passes; errors only warn ("ignore"), so all tests run.
    command.args(["--dataloss", &format!("--test={test}"), url]);
    let output = run_bounded(command, CONFORMANCE_LIMIT);
    let mut printed = text(&output.stdout);
    printed.push_str(&text(&output.stderr));
    let mut counts = parse_conformance(&printed);
    // It exits 1 when a test failed; otherwise a failure is its own.
    if !output.status.success() && counts.failed == 0 {
        counts.failures.push(format!(
            "iscsi-test-cu exited with {} (URL {url})",
            output.status
        ));
    }
    counts
}

/// Counts the tests in the verbose output of `iscsi-test-cu`: lines `Suite: NAME`,
/// then for each test `  Test: NAME ...`, the messages it logs (`[SKIPPED] ...`,
/// `[FAILED] ...`), and `passed` or `FAILED` followed by the failed assertions;
/// closed by CUnit's "Run Summary", which must agree.
pub fn parse_conformance(output: &str) -> ConformanceCounts {
    struct Current {
        name: String,
        skipped: bool,
        messages: Vec<String>,
        failed: bool,
    }
    let mut counts = ConformanceCounts {
        output: output.to_string(),
        ..ConformanceCounts::default()
    };
    let mut suite = String::new();
    let mut current: Option<Current> = None;
    let mut summary: Option<(usize, usize)> = None;
    let mut suites_failed = 0;
    let finish = |test: Current, counts: &mut ConformanceCounts| {
        if test.failed {
            counts.failed += 1;
            counts
                .failures
                .push(format!("{}: {}", test.name, test.messages.join(" | ")));
        } else if test.skipped {
            counts.skipped += 1;
        } else {
            counts.passed += 1;
        }
    };
    let mut lines = output.lines();
    while let Some(line) = lines.next() {
        if let Some(name) = line.strip_prefix("Suite: ") {
            if let Some(test) = current.take() {
                finish(test, &mut counts);
            }
            suite = name.trim().to_string();
            continue;
        }
        if line.starts_with("Run Summary:") {
            if let Some(test) = current.take() {
                finish(test, &mut counts);
            }
            for row in lines.by_ref() {
                let fields: Vec<&str> = row.split_whitespace().collect();
                // suites  Total Ran n/a Failed Inactive
                // tests   Total Ran Passed Failed Inactive
                match fields.as_slice() {
                    ["suites", _, _, _, failed, _] => suites_failed = failed.parse().unwrap_or(0),
                    ["tests", _, _, passed, failed, _] => {
                        summary = passed.parse().ok().zip(failed.parse().ok());
                    }
                    _ => {}
                }
            }
            break;
        }
        if line.contains("Suite initialization failed") || line.contains("Suite cleanup failed") {
            counts.failures.push(format!("{suite}: {}", line.trim()));
            continue;
        }
        let body = match line.strip_prefix("  Test: ") {
            Some(rest) => {
                if let Some(test) = current.take() {
                    finish(test, &mut counts);
                }
                let (name, rest) = rest.split_once(" ...").unwrap_or((rest, ""));
                current = Some(Current {
                    name: format!("{suite}.{}", name.trim()),
                    skipped: false,
                    messages: Vec::new(),
                    failed: false,
                });
                rest
            }
            None => line,
        };
        let Some(test) = current.as_mut() else {
            continue;
        };
        let body = body.trim();
        if body.starts_with("FAILED") {
            test.failed = true;
        } else if body.starts_with("passed") {
            // Its result; CUnit prints nothing more for a passed test.
            let test = current.take().expect("a current test");
            finish(test, &mut counts);
        } else if body.contains("[SKIPPED]") {
            test.skipped = true;
        } else if body.contains("[FAILED]") || (test.failed && !body.is_empty()) {
            // The test's own message, or an assertion CUnit lists after FAILED.
            test.messages.push(body.to_string());
        }
    }
    if let Some(test) = current.take() {
        finish(test, &mut counts);
    }
    match summary {
        None => counts
            .failures
            .push("the suite did not finish (no CUnit Run Summary)".to_string()),
        Some((passed, failed)) => {
            if passed != counts.passed + counts.skipped || failed != counts.failed {
                counts.failures.push(format!(
                    "CUnit counted {passed} passed and {failed} failed, the parser {} and {}",
                    counts.passed + counts.skipped,
                    counts.failed
                ));
            }
        }
    }
    if suites_failed > 0 {
        counts.failures.push(format!(
            "{suites_failed} suites failed to start or clean up"
        ));
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Abridged from a run against tgtd 1.0.85.
    const SAMPLE: &str = "


     CUnit - A unit testing framework for C - Version 2.1-3
     http://cunit.sourceforge.net/


Suite: CompareAndWrite
  Test: Simple ...    [SKIPPED] COMPAREANDWRITE is not implemented.
    [SKIPPED] COMPAREANDWRITE is not implemented.
passed
Suite: GetLBAStatus
  Test: Simple ...passed
  Test: BeyondEol ...    [FAILED] GET_LBA_STATUS successful but should have failed with ILLEGAL_REQUEST(0x05)/LBA_OUT_OF_RANGE(0x2100)
FAILED
    1. test_get_lba_status_beyond_eol.c:38  - CU_ASSERT_EQUAL(_r,0)
  Test: UnmapSingle ...    [SKIPPED] Logical unit is fully provisioned. Skipping test
passed
Suite: ModeSense6
  Test: Control ...    [WARNING] BUSY_TIMEOUT_PERIOD is undefined.
passed
Suite: ReadOnly
  Test: ReadOnlySBC ...    [SKIPPED] UNMAP is not implemented.
    [FAILED] WRITESAME10 failed with wrong sense.

FAILED
    1. test_readonly_sbc.c:63  - CU_ASSERT_EQUAL(_r,0)

Run Summary:    Type  Total    Ran Passed Failed Inactive
              suites      4      4    n/a      0        0
               tests      6      6      4      2        0
             asserts     13     13     11      2      n/a

Elapsed time =    0.001 seconds
Tests completed with return value: 0
";

    #[test]
    fn counts_passes_skips_and_failures() {
        let counts = parse_conformance(SAMPLE);
        assert_eq!(counts.summary(), "2 passed, 2 failed, 2 skipped");
        assert_eq!(counts.failures.len(), 2, "{:?}", counts.failures);
        assert!(counts.failures[0].starts_with("GetLBAStatus.BeyondEol: [FAILED] GET_LBA"));
        assert!(counts.failures[0].contains("test_get_lba_status_beyond_eol.c:38"));
        assert!(counts.failures[1].starts_with("ReadOnly.ReadOnlySBC: [FAILED] WRITESAME10"));
    }

    #[test]
    fn a_run_without_its_summary_is_a_failure() {
        let cut = &SAMPLE[..SAMPLE.find("Suite: ModeSense6").unwrap()];
        let counts = parse_conformance(cut);
        assert!(
            counts.failures.iter().any(|f| f.contains("did not finish")),
            "{:?}",
            counts.failures
        );
    }

    #[test]
    fn a_summary_that_disagrees_is_a_failure() {
        let changed = SAMPLE.replace(
            "tests      6      6      4      2",
            "tests      7      7      5      2",
        );
        let counts = parse_conformance(&changed);
        assert!(counts
            .failures
            .iter()
            .any(|f| f.contains("CUnit counted 5")));
    }
}
