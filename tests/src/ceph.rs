//! A throwaway one-node Ceph cluster for the RBD tests, made by
//! `scripts/ceph-cluster.sh` (the bring-up the RBD bench uses too): one monitor and
//! one OSD (BlueStore on a sparse file), no manager (RBD needs none), no systemd,
//! cephx on, every file in a temporary directory, on a free loopback port. Dropping
//! it stops the OSD, then the monitor, and removes the directory, also when a test
//! panics.
//!
//! Every `ceph`/`rbd` command is bounded: without a manager some commands wait
//! forever, and a test run must fail rather than stall.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::{path_str, run_bounded, text};

/// How long one `ceph`/`rbd` command may take: a safety net.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// How long the script may take to bring the cluster up, or the OSD back
/// (measured: 5-13 s on an idle machine; the script bounds each step itself).
const START_LIMIT: Duration = Duration::from_secs(300);

/// The programs a cluster needs (Debian packages ceph-mon, ceph-osd, ceph-common).
const PROGRAMS: [&str; 6] = [
    "ceph-mon",
    "ceph-osd",
    "ceph",
    "rbd",
    "monmaptool",
    "ceph-authtool",
];

/// Why no cluster can start here (a program or librbd is missing), or None.
pub fn unavailable() -> Option<String> {
    for program in PROGRAMS {
        if !crate::have(program) {
            return Some(format!(
                "{program} is not installed (Debian: ceph-mon ceph-osd ceph-common)"
            ));
        }
    }
    None
}

/// Returns early from a test, with a message, when no Ceph cluster can start here.
#[macro_export]
macro_rules! require_ceph {
    () => {
        if let Some(why) = $crate::ceph::unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// `scripts/ceph-cluster.sh` in this checkout.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ceph-cluster.sh")
}

/// A running one-node cluster with a pool for RBD images.
pub struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    /// The pool created for images (`rbd`).
    pub pool: String,
}

impl Cluster {
    /// Creates and starts a cluster with one pool, `rbd`, of size 1.
    pub fn start() -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("blockwire-ceph-")
            .tempdir()
            .expect("temporary directory for the cluster");
        let out = script_ok(&["start", path_str(dir.path())], START_LIMIT);
        let conf = PathBuf::from(text(&out.stdout).trim());
        assert!(
            conf.is_file(),
            "the script printed {conf:?}, not a ceph.conf"
        );
        Cluster {
            dir,
            conf,
            pool: "rbd".into(),
        }
    }

    /// The cluster's configuration file (`conf=` for clients).
    pub fn conf(&self) -> PathBuf {
        self.conf.clone()
    }

    /// The admin keyring (`keyring=` for clients; the conf names it too).
    pub fn keyring(&self) -> PathBuf {
        self.dir.path().join("keyring")
    }

    /// The cluster's directory (logs under `log/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `rbd:POOL/IMAGE:conf=PATH`, the spec blockwire takes for `image`.
    pub fn spec(&self, image: &str) -> String {
        format!("rbd:{}/{image}:conf={}", self.pool, path_str(&self.conf))
    }

    /// Starts the OSD again after [`stop_osd`](Self::stop_osd) and waits until it
    /// is up.
    pub fn resume_osd(&mut self) {
        script_ok(&["start-osd", path_str(self.dir.path())], START_LIMIT);
    }

    /// Stops the OSD (SIGKILL, as a crash or a pulled cable would) and tells the
    /// monitor it is down, so clients notice at once rather than after the
    /// heartbeat grace.
    pub fn stop_osd(&mut self) {
        script_ok(&["kill-osd", path_str(self.dir.path())], COMMAND_LIMIT);
    }

    /// Runs `ceph ARGS...` against this cluster (bounded), output captured.
    pub fn ceph(&self, args: &[&str]) -> Output {
        self.client("ceph", args)
    }

    /// Like [`ceph`](Self::ceph), failing the test unless it succeeded.
    pub fn ceph_ok(&self, args: &[&str]) -> Output {
        ok(self.ceph(args), "ceph", args)
    }

    /// Runs `rbd ARGS...` against this cluster (bounded), output captured.
    pub fn rbd(&self, args: &[&str]) -> Output {
        self.client("rbd", args)
    }

    /// Like [`rbd`](Self::rbd), failing the test unless it succeeded.
    pub fn rbd_ok(&self, args: &[&str]) -> Output {
        ok(self.rbd(args), "rbd", args)
    }

    /// Creates an image of `size` bytes in the pool (default features, so with
    /// the exclusive lock) and returns its name.
    pub fn create_image(&self, name: &str, size: u64) -> String {
        let image = format!("{}/{name}", self.pool);
        self.rbd_ok(&["create", "--size", &format!("{}K", size / 1024), &image]);
        name.to_string()
    }

    fn client(&self, program: &str, args: &[&str]) -> Output {
        let mut command = Command::new(program);
        command.args(["-c", path_str(&self.conf)]).args(args);
        run_bounded(command, COMMAND_LIMIT)
    }
}

impl Drop for Cluster {
    /// The OSD first, then the monitor (clients are the caller's to drop first);
    /// the directory goes with `dir`.
    fn drop(&mut self) {
        let mut command = Command::new("bash");
        command
            .arg(script())
            .args(["stop", path_str(self.dir.path())]);
        let out = run_bounded(command, COMMAND_LIMIT);
        if !out.status.success() {
            eprintln!("ceph-cluster.sh stop: {}", text(&out.stderr));
        }
    }
}

/// Runs `scripts/ceph-cluster.sh ARGS...`, failing the test unless it succeeded.
fn script_ok(args: &[&str], limit: Duration) -> Output {
    let mut command = Command::new("bash");
    command.arg(script()).args(args);
    ok(run_bounded(command, limit), "ceph-cluster.sh", args)
}

fn ok(output: Output, program: &str, args: &[&str]) -> Output {
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    output
}
