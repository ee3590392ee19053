//! Helpers for tests that drive the `blockwire` release binary against real peer
//! programs: start a server on a free port, wait for it, stop it by PID, and skip a
//! test (saying why) when a peer program is missing.

pub mod aoe;
pub mod bench;
pub mod ceph;
pub mod crash;
pub mod http;
pub mod iscsi;
pub mod lab;
pub mod netns;
pub mod vm;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The release binary under test: `$BLOCKWIRE_BIN`, else `target/release/blockwire`
/// of this workspace (the test command builds it first).
pub fn blockwire_bin() -> PathBuf {
    if let Ok(path) = std::env::var("BLOCKWIRE_BIN") {
        return PathBuf::from(path);
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/blockwire");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --release` first (or set BLOCKWIRE_BIN)",
        path.display()
    );
    path
}

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

/// Command output as text (lossy), for assertions and messages.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A temporary path as `&str` (temp paths are UTF-8).
pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

/// Whether a program is on PATH.
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Returns early from a test, with a message, when a program is missing.
#[macro_export]
macro_rules! require {
    ($($program:expr),+) => {
        $(
            if !$crate::have($program) {
                eprintln!("skipped: {} is not installed", $program);
                return;
            }
        )+
    };
}

/// Fails the test with the exit status and both outputs unless `output` succeeded.
pub fn assert_success(output: &Output) {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// A `blockwire serve` (or `blockwire netserve`) process, stopped (SIGTERM, then
/// SIGKILL) when dropped.
pub struct Served {
    pub child: Child,
    /// The NBD port it announced (0 when it serves no NBD on TCP).
    pub port: u16,
    pub name: String,
    /// The iSCSI URLs it announced (`iscsi://127.0.0.1:PORT/IQN/0`), in order.
    pub iscsi: Vec<String>,
    /// The metrics endpoint it announced (`metrics: http://HOST:PORT/metrics`), as
    /// `HOST:PORT`; read by [`spawn_ready`](Self::spawn_ready) only.
    pub metrics: Option<String>,
    /// The NVMe/TCP subsystems it announced (`nvme+tcp://HOST:PORT/NQN`), in order;
    /// read by [`spawn_ready`](Self::spawn_ready) only.
    pub nvme: Vec<String>,
    /// Its NVMe/TCP discovery controller (`nvme+tcp://HOST:PORT`), if announced.
    pub nvme_discovery: Option<String>,
}

impl Served {
    /// Starts `blockwire serve ARGS... --listen 127.0.0.1:0` and waits until it
    /// announces the port the kernel gave it. `name` is the export name used in
    /// [`uri`](Self::uri). Port 0 avoids the race of picking a "free" port that a
    /// test running in parallel takes first.
    pub fn start(args: &[&str], name: &str) -> Served {
        let mut command = Command::new(blockwire_bin());
        command
            .arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"]);
        Served::spawn_announced(command, name)
    }

    /// Starts `blockwire serve --config CONFIG`; the file's `[server] listen` should
    /// be `["127.0.0.1:0"]`. `name` is the export used in [`uri`](Self::uri).
    pub fn start_config(config: &Path, name: &str) -> Served {
        let mut command = Command::new(blockwire_bin());
        command.arg("serve").arg("--config").arg(config);
        Served::spawn_announced(command, name)
    }

    /// Starts `blockwire serve ARGS... --iscsi 127.0.0.1:0` and waits until all its
    /// targets are up ("press Ctrl-C to stop"); [`iscsi_url`](Self::iscsi_url) is
    /// then the URL it announced. Add `--listen 127.0.0.1:0` to `args` to serve NBD
    /// as well ([`uri`](Self::uri)).
    pub fn start_iscsi(args: &[&str], name: &str) -> Served {
        let mut command = Command::new(blockwire_bin());
        command
            .arg("serve")
            .args(args)
            .args(["--iscsi", "127.0.0.1:0"]);
        Served::spawn_ready(command, name)
    }

    /// Starts `blockwire serve ARGS... --nvme 127.0.0.1:0 --nvme-discovery
    /// 127.0.0.1:0` and waits until all its targets are up; [`nvme`](Self::nvme)
    /// and [`nvme_discovery`](Self::nvme_discovery) then hold what it announced.
    pub fn start_nvme(args: &[&str], name: &str) -> Served {
        let mut command = Command::new(blockwire_bin());
        command.arg("serve").args(args).args([
            "--nvme",
            "127.0.0.1:0",
            "--nvme-discovery",
            "127.0.0.1:0",
        ]);
        Served::spawn_ready(command, name)
    }

    /// Starts `blockwire serve ARGS...` as given and waits until all its targets
    /// are up ("press Ctrl-C to stop").
    pub fn start_ready(args: &[&str], name: &str) -> Served {
        let mut command = Command::new(blockwire_bin());
        command.arg("serve").args(args);
        Served::spawn_ready(command, name)
    }

    /// Starts `blockwire serve --config CONFIG` and waits until all its targets are
    /// up ("press Ctrl-C to stop"), for configs that serve iSCSI or AoE.
    pub fn start_config_ready(config: &Path, name: &str) -> Served {
        let mut command = Command::new(blockwire_bin());
        command.arg("serve").arg("--config").arg(config);
        Served::spawn_ready(command, name)
    }

    /// Spawns the server and reads its announcement (`  nbd://127.0.0.1:PORT/...`)
    /// for the port; keeps draining its stdout afterwards.
    fn spawn_announced(command: Command, name: &str) -> Served {
        let (child, port) = spawn_until(command, Stdio::inherit(), nbd_port);
        Served::new(child, port, name, Vec::new())
    }

    /// Starts `blockwire serve --config CONFIG` as
    /// [`start_config_ready`](Self::start_config_ready) does, its log (stderr) going
    /// to the file `log`, for tests that read what it logged.
    pub fn start_config_logged(config: &Path, name: &str, log: &Path) -> Served {
        let mut command = Command::new(blockwire_bin());
        command.arg("serve").arg("--config").arg(config);
        Served::spawn_ready_logged(command, name, log)
    }

    /// [`spawn_ready`](Self::spawn_ready), the log (stderr) going to the file `log`.
    pub fn spawn_ready_logged(command: Command, name: &str, log: &Path) -> Served {
        let file = std::fs::File::create(log).expect("create the log file");
        Served::spawn_ready_to(command, name, Stdio::from(file))
    }

    /// Spawns `command` (a `blockwire serve ...`, possibly run through `ip netns
    /// exec`) and waits until it prints "press Ctrl-C to stop": all its targets are up.
    /// `port` is then 0 unless it also announced an NBD port.
    pub fn spawn_ready(command: Command, name: &str) -> Served {
        Served::spawn_ready_to(command, name, Stdio::inherit())
    }

    fn spawn_ready_to(command: Command, name: &str, stderr: Stdio) -> Served {
        let mut announced = Announced::default();
        let (child, announced) = spawn_until(command, stderr, move |line| {
            announced.read(line);
            line.contains("press Ctrl-C to stop")
                .then(|| std::mem::take(&mut announced))
        });
        let mut served = Served::new(child, announced.port, name, announced.iscsi);
        served.metrics = announced.metrics;
        served.nvme = announced.nvme;
        served.nvme_discovery = announced.nvme_discovery;
        served
    }

    /// Starts `blockwire netserve ARGS... --listen 127.0.0.1:0` and waits until it
    /// announces its port (`netserve: listening on 127.0.0.1:PORT ...`) and is ready.
    pub fn start_netserve(args: &[&str]) -> Served {
        let mut command = Command::new(blockwire_bin());
        command
            .arg("netserve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"]);
        let mut port = 0;
        let (child, port) = spawn_until(command, Stdio::inherit(), move |line| {
            if let Some(p) = line
                .strip_prefix("netserve: listening on 127.0.0.1:")
                .and_then(|rest| rest.split(' ').next())
                .and_then(|p| p.parse::<u16>().ok())
            {
                port = p;
            }
            line.contains("press Ctrl-C to stop").then_some(port)
        });
        Served::new(child, port, "", Vec::new())
    }

    fn new(child: Child, port: u16, name: &str, iscsi: Vec<String>) -> Served {
        Served {
            child,
            port,
            name: name.to_string(),
            iscsi,
            metrics: None,
            nvme: Vec::new(),
            nvme_discovery: None,
        }
    }

    /// `nbd://127.0.0.1:PORT/NAME`.
    pub fn uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/{}", self.port, self.name)
    }

    /// The first iSCSI URL it announced, `iscsi://127.0.0.1:PORT/IQN/0`.
    pub fn iscsi_url(&self) -> &str {
        self.iscsi
            .first()
            .expect("the server announced an iSCSI URL (was it started with --iscsi?)")
    }

    /// `127.0.0.1:PORT` of the first iSCSI URL: the portal, for discovery.
    pub fn iscsi_portal(&self) -> &str {
        let rest = &self.iscsi_url()["iscsi://".len()..];
        &rest[..rest.find('/').expect("iscsi://HOST:PORT/IQN/LUN")]
    }

    /// The port of the first iSCSI URL.
    pub fn iscsi_port(&self) -> u16 {
        let portal = self.iscsi_portal();
        portal[portal.rfind(':').expect("HOST:PORT") + 1..]
            .parse()
            .expect("a port number")
    }

    /// The target name (IQN) of the first iSCSI URL.
    pub fn iqn(&self) -> &str {
        let rest = &self.iscsi_url()["iscsi://".len()..];
        let after_portal = &rest[rest.find('/').expect("iscsi://HOST:PORT/IQN/LUN") + 1..];
        &after_portal[..after_portal.rfind('/').expect("IQN/LUN")]
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL, no goodbye (a crash: clients see their connections drop mid-stream);
    /// reaped on return.
    pub fn kill_hard(mut self) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits; returns the exit status code (None if killed).
    pub fn terminate(mut self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.pid(), libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("blockwire did not exit within 20 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What a starting `blockwire serve` announced on its standard output.
#[derive(Default)]
struct Announced {
    port: u16,
    iscsi: Vec<String>,
    metrics: Option<String>,
    nvme: Vec<String>,
    nvme_discovery: Option<String>,
}

impl Announced {
    fn read(&mut self, line: &str) {
        if let Some(p) = nbd_port(line) {
            self.port = p;
        }
        let line = line.trim();
        if let Some(url) = line.strip_prefix("iscsi://") {
            self.iscsi.push(format!("iscsi://{url}"));
        }
        if line.starts_with("nvme+tcp://") {
            self.nvme.push(line.to_string());
        }
        if let Some(uri) = line.strip_prefix("nvme discovery: ") {
            self.nvme_discovery = Some(uri.trim().to_string());
        }
        if let Some(addr) = line
            .strip_prefix("metrics: http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
        {
            self.metrics = Some(addr.to_string());
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child's PID.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The port of an announcement line `  nbd://127.0.0.1:PORT/NAME` (`nbds://` when
/// the server requires TLS).
fn nbd_port(line: &str) -> Option<u16> {
    let line = line.trim();
    line.strip_prefix("nbd://127.0.0.1:")
        .or_else(|| line.strip_prefix("nbds://127.0.0.1:"))
        .and_then(|rest| rest.split('/').next())
        .and_then(|port| port.parse::<u16>().ok())
}

/// Spawns a server, its stderr going to `stderr`, and feeds its stdout lines to
/// `ready` until that returns what the caller waits for; keeps draining its stdout
/// afterwards.
fn spawn_until<T: Send + 'static>(
    mut command: Command,
    stderr: Stdio,
    mut ready: impl FnMut(&str) -> Option<T> + Send + 'static,
) -> (Child, T) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start blockwire serve");
    let stdout = child.stdout.take().expect("piped stdout");
    let (found, announced) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(value) = ready(&line) {
                let _ = found.send(value);
            }
        }
    });
    match announced.recv_timeout(Duration::from_secs(20)) {
        Ok(value) => (child, value),
        Err(e) => {
            let _ = child.kill();
            let status = child.wait();
            panic!("{command:?} did not come up ({e}); exit status {status:?}");
        }
    }
}

/// Runs a command, panicking with its output if it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// A file of `len` bytes filled with a deterministic pattern derived from `seed`.
pub fn patterned_file(dir: &Path, name: &str, len: usize, seed: u8) -> PathBuf {
    let path = dir.join(name);
    let data: Vec<u8> = (0..len)
        .map(|i| ((i / 4096) as u8).wrapping_mul(31) ^ (i as u8).wrapping_add(seed))
        .collect();
    std::fs::write(&path, data).expect("write patterned file");
    path
}

/// A sparse file of `len` bytes.
pub fn sparse_file(dir: &Path, name: &str, len: u64) -> PathBuf {
    let path = dir.join(name);
    let file = std::fs::File::create(&path).expect("create sparse file");
    file.set_len(len).expect("size sparse file");
    path
}

/// A TCP port on loopback that was free a moment ago, for peer servers that take a
/// port number rather than a socket (nbdkit, qemu-nbd, nbd-server); another process
/// could take it in between, which on loopback in a test run is rare enough.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

/// `nbdkit -f --exit-with-parent` on 127.0.0.1:`port` (read-only with `-r`), with
/// the plugin, its arguments and any filters in `plugin`.
pub fn nbdkit(port: u16, read_only: bool, plugin: &[&str]) -> Command {
    let mut command = Command::new("nbdkit");
    command.args([
        "-f",
        "--exit-with-parent",
        "-p",
        &port.to_string(),
        "--ipaddr",
        "127.0.0.1",
    ]);
    if read_only {
        command.arg("-r");
    }
    command.args(plugin);
    command
}

/// Submits `subs` through `queue`, keeping at most `depth` in flight, and returns
/// every completion.
pub fn run_queued(
    queue: &mut dyn blockwire_blockdev::RequestQueue,
    subs: Vec<blockwire_blockdev::Submission>,
    depth: usize,
) -> Vec<blockwire_blockdev::Completion> {
    let mut pending = subs.into_iter();
    let mut done = Vec::new();
    loop {
        while queue.in_flight() < depth {
            match pending.next() {
                Some(sub) => queue.submit(sub),
                None => break,
            }
        }
        if queue.in_flight() == 0 {
            return done;
        }
        queue.complete(1, &mut done);
    }
}

/// Runs `program` with `args`, killed after `limit`; asserts it succeeded and returns
/// its standard output as text.
pub fn run_bounded_ok(program: &str, args: &[&str], limit: Duration) -> String {
    let mut command = Command::new(program);
    command.args(args);
    let output = run_bounded(command, limit);
    assert!(
        output.status.success(),
        "{program} {args:?}: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Runs `command` to completion with its output captured, killing it and failing
/// the test if it has not exited after `limit`: a hung command should fail a test
/// run, not stall it. The limit is a safety net, never a performance assertion.
pub fn run_bounded(mut command: Command, limit: Duration) -> Output {
    // Files rather than pipes: nothing has to drain them while we poll the child.
    let stdout = tempfile::tempfile().expect("temporary file for stdout");
    let stderr = tempfile::tempfile().expect("temporary file for stderr");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(stdout.try_clone().expect("clone stdout file"))
        .stderr(stderr.try_clone().expect("clone stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} did not exit within {} s; stderr:\n{}",
                limit.as_secs(),
                text(&read_all(stderr))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: read_all(stdout),
        stderr: read_all(stderr),
    }
}

/// Starts `blockwire copy SOURCE URI --verify` with small requests (so that it runs
/// long enough to be interrupted by a target restart) and `extra` arguments, in a
/// thread, bounded to 300 s.
pub fn copy_in_background(
    source: &std::path::Path,
    uri: &str,
    extra: &[&str],
) -> std::thread::JoinHandle<Output> {
    let mut command = Command::new(blockwire_bin());
    command
        .arg("copy")
        .arg(source)
        .arg(uri)
        .args([
            "--verify",
            "--quiet",
            "--request-size",
            "16K",
            "--requests",
            "2",
        ])
        .args(extra);
    std::thread::spawn(move || run_bounded(command, Duration::from_secs(300)))
}

/// A whole temporary file, from its start.
fn read_all(mut file: std::fs::File) -> Vec<u8> {
    use std::io::{Read, Seek};
    let mut bytes = Vec::new();
    file.rewind().expect("rewind output file");
    file.read_to_end(&mut bytes).expect("read output file");
    bytes
}

/// Spawns a capture (`tshark -i ... -w FILE`, built by the caller, perhaps inside a
/// network namespace) and waits until it runs: tshark says "Capturing on" once its
/// capture starts, and its capture child may still be opening the interface after
/// that, so a second more is given. Stop it with SIGINT (`kill(pid, SIGINT)`) so it
/// writes its file out.
pub fn start_capture(mut command: Command) -> Child {
    let mut tshark = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tshark");
    let stderr = tshark.stderr.take().expect("piped stderr");
    let (ready, started) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("Capturing on") {
                let _ = ready.send(());
            }
        }
    });
    started
        .recv_timeout(Duration::from_secs(20))
        .expect("tshark starts capturing");
    std::thread::sleep(Duration::from_secs(1));
    tshark
}
