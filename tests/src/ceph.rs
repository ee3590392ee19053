//! A throwaway one-node Ceph cluster for the RBD tests: one monitor and one OSD
//! (BlueStore on a sparse file), no manager (RBD needs none), no systemd, cephx on,
//! every file in a temporary directory, on a free loopback port. Dropping it stops
//! the OSD, then the monitor, and removes the directory, also when a test panics.
//!
//! Every `ceph`/`rbd` command is bounded: without a manager some commands wait
//! forever, and a test run must fail rather than stall.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, path_str, run_bounded, text};

/// How long one `ceph`/`rbd`/`ceph-osd --mkfs` command may take: a safety net.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// How long the daemons may take to come up (measured: 3-8 s on an idle machine).
const START_LIMIT: Duration = Duration::from_secs(120);

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

/// A running one-node cluster with a pool for RBD images.
pub struct Cluster {
    dir: tempfile::TempDir,
    mon: Option<Child>,
    osd: Option<Child>,
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
        let mut cluster = Cluster {
            dir,
            mon: None,
            osd: None,
            pool: "rbd".into(),
        };
        cluster.write_config();
        cluster.start_mon();
        cluster.start_osd();
        cluster.ceph_ok(&["osd", "pool", "create", "rbd", "8", "8"]);
        cluster.ceph_ok(&["osd", "pool", "application", "enable", "rbd", "rbd"]);
        cluster
    }

    /// The cluster's configuration file (`conf=` for clients).
    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("ceph.conf")
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
        format!("rbd:{}/{image}:conf={}", self.pool, path_str(&self.conf()))
    }

    fn path(&self, name: &str) -> String {
        path_str(&self.dir.path().join(name)).to_string()
    }

    fn write_config(&self) {
        let root = self.dir.path();
        for sub in ["mon/ceph-a", "osd/ceph-0", "run", "log"] {
            fs::create_dir_all(root.join(sub)).expect("cluster directory");
        }
        let port = free_port();
        let fsid = uuid();
        let d = path_str(root);
        let mut conf = String::new();
        // Everything under the temporary directory; msgr2 only, on loopback.
        // BlueStore on a sparse 10 GiB file with a small cache; pools of size 1.
        let _ = write!(
            conf,
            "[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{port}
public addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/keyring
run dir = {d}/run
admin socket = {d}/run/$name.asok
log file = {d}/log/$name.log
pid file = {d}/run/$name.pid
mon data = {d}/mon/$cluster-$id
osd data = {d}/osd/$cluster-$id
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
osd crush chooseleaf type = 0
osd objectstore = bluestore
bluestore block path = {d}/osd/block
bluestore block create = true
bluestore block size = 10737418240
bluestore block db create = false
bluestore block wal create = false
bluestore cache autotune = false
bluestore cache size = 134217728
osd memory target = 939524096
[osd]
keyring = {d}/osd/$cluster-$id/keyring
"
        );
        fs::write(root.join("ceph.conf"), conf).expect("write ceph.conf");
        let mon_keyring = self.path("mon.keyring");
        let keyring = self.path("keyring");
        tool_ok(
            "ceph-authtool",
            &[
                "--create-keyring",
                &mon_keyring,
                "--gen-key",
                "-n",
                "mon.",
                "--cap",
                "mon",
                "allow *",
            ],
        );
        tool_ok(
            "ceph-authtool",
            &[
                "--create-keyring",
                &keyring,
                "--gen-key",
                "-n",
                "client.admin",
                "--cap",
                "mon",
                "allow *",
                "--cap",
                "osd",
                "allow *",
                "--cap",
                "mgr",
                "allow *",
            ],
        );
        tool_ok(
            "ceph-authtool",
            &[&mon_keyring, "--import-keyring", &keyring],
        );
        tool_ok(
            "monmaptool",
            &[
                "--create",
                "--addv",
                "a",
                &format!("[v2:127.0.0.1:{port}]"),
                "--fsid",
                &fsid,
                &self.path("monmap"),
            ],
        );
    }

    fn daemon(&self, program: &str, args: &[&str]) -> Child {
        let log = fs::File::create(self.dir.path().join(format!("log/{program}.out")))
            .expect("daemon output file");
        Command::new(program)
            .args(["-c", &self.path("ceph.conf")])
            .args(args)
            .arg("-f")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
    }

    fn start_mon(&mut self) {
        let conf = self.path("ceph.conf");
        tool_ok(
            "ceph-mon",
            &[
                "-c",
                &conf,
                "--mkfs",
                "-i",
                "a",
                "--monmap",
                &self.path("monmap"),
                "--keyring",
                &self.path("mon.keyring"),
            ],
        );
        self.mon = Some(self.daemon("ceph-mon", &["-i", "a"]));
        self.wait_for("the monitor", |cluster| {
            cluster
                .ceph(&["--connect-timeout", "5", "mon", "stat"])
                .status
                .success()
        });
    }

    fn start_osd(&mut self) {
        let osd_uuid = uuid();
        let secret = text(&tool_ok("ceph-authtool", &["--gen-print-key"]).stdout)
            .trim()
            .to_string();
        let json = self.dir.path().join("osd-secret.json");
        fs::write(&json, format!("{{\"cephx_secret\": \"{secret}\"}}")).expect("osd secret");
        let id = text(
            &self
                .ceph_ok(&["osd", "new", &osd_uuid, "-i", path_str(&json)])
                .stdout,
        );
        assert_eq!(id.trim(), "0", "the first OSD is osd.0");
        tool_ok(
            "ceph-authtool",
            &[
                "--create-keyring",
                &self.path("osd/ceph-0/keyring"),
                "--name",
                "osd.0",
                "--add-key",
                &secret,
            ],
        );
        tool_ok(
            "ceph-osd",
            &[
                "-c",
                &self.path("ceph.conf"),
                "-i",
                "0",
                "--mkfs",
                "--osd-uuid",
                &osd_uuid,
            ],
        );
        self.resume_osd();
    }

    /// Starts the OSD again after [`stop_osd`](Self::stop_osd) and waits until it
    /// is up.
    pub fn resume_osd(&mut self) {
        assert!(self.osd.is_none(), "the OSD is running already");
        self.osd = Some(self.daemon("ceph-osd", &["-i", "0"]));
        self.wait_for("the OSD", |cluster| {
            let out = cluster.ceph(&["osd", "stat", "--format", "json"]);
            // {"epoch":..,"num_osds":1,"num_up_osds":1,...}
            out.status.success() && text(&out.stdout).contains("\"num_up_osds\":1")
        });
    }

    /// Stops the OSD (SIGKILL, as a crash or a pulled cable would) and tells the
    /// monitor it is down, so clients notice at once rather than after the
    /// heartbeat grace.
    pub fn stop_osd(&mut self) {
        if let Some(mut osd) = self.osd.take() {
            let _ = osd.kill();
            let _ = osd.wait();
        }
        self.ceph_ok(&["osd", "down", "0"]);
    }

    fn wait_for(&mut self, what: &str, mut ready: impl FnMut(&Cluster) -> bool) {
        let deadline = Instant::now() + START_LIMIT;
        while !ready(self) {
            assert!(
                Instant::now() < deadline,
                "{what} did not come up within {} s; logs in {}",
                START_LIMIT.as_secs(),
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
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
        command.args(["-c", &self.path("ceph.conf")]).args(args);
        run_bounded(command, COMMAND_LIMIT)
    }
}

impl Drop for Cluster {
    /// The OSD first, then the monitor (clients are the caller's to drop first).
    fn drop(&mut self) {
        for child in [self.osd.take(), self.mon.take()].into_iter().flatten() {
            let mut child = child;
            // SAFETY: kill(2) on the PID of our own child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
    }
}

fn tool_ok(program: &str, args: &[&str]) -> Output {
    let mut command = Command::new(program);
    command.args(args);
    ok(run_bounded(command, COMMAND_LIMIT), program, args)
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

/// A random UUID from the kernel.
fn uuid() -> String {
    fs::read_to_string("/proc/sys/kernel/random/uuid")
        .expect("read a UUID from the kernel")
        .trim()
        .to_string()
}
