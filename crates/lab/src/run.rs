//! Running the matrix: for each bed, build it; for each cell, start our target in
//! the target namespace, measure the channels (our netserve, both ways, every
//! channel at once), run `blockwire bench` through our initiator in the initiator
//! namespace, stop the target, and turn the bench's phases into rows.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use blockwire_bench::netperf::{self, ClientConfig, Direction};

use crate::bed::{self, Bed};
use crate::cleanup;
use crate::fs_bonnie;
use crate::matrix::{CellSpec, LabWorkload, Matrix, Protocol};
use crate::netns;
use crate::nfs_server::{NfsServer, NfsServerConfig};
use crate::published::Seed;
use crate::results::{CellResult, LabReport, NetworkBaseline};
use crate::target::{self, Backing};

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "needs root (CAP_NET_ADMIN) to build network namespaces and veth links; run it as root"
    )]
    NotPermitted,
    #[error("{0} is not installed (the lab builds its bed with iproute2's ip and tc)")]
    MissingTool(&'static str),
    #[error("invalid matrix: {0}")]
    Matrix(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// The `blockwire` binary to run as target and initiator.
    pub binary: PathBuf,
    pub matrix: Matrix,
    /// The preset, whose published figures go beside ours.
    pub seed: Option<Seed>,
    /// Data set per cell in bytes.
    pub size: u64,
    /// Seconds per timed phase: each random-I/O point, bonnie's seeks. (Each
    /// network direction moves the data set instead: [`measure_network`].)
    pub time: Duration,
    /// Stripe chunk in bytes.
    pub chunk: u64,
    /// Requests in flight for the sequential workload (the bench's default when None).
    pub queue_depth: Option<u32>,
    /// Request size of the sequential workload (the bench's 1 MiB when None).
    pub block_size: Option<u64>,
    /// Queue depths of the random workload (the bench's default when empty).
    pub random_depths: Vec<u32>,
    pub backing: Backing,
    /// Longest a cell's bench may take before it is stopped and the cell fails;
    /// also the bound of each direction of its network baseline.
    pub cell_timeout: Duration,
}

/// What the caller hears while the run goes on.
pub enum Event<'a> {
    /// Something to tell the user (skipped combinations, a failed cell).
    Note(&'a str),
    /// A bed was built.
    Bed { bed: &'a Bed },
    /// A cell starts: `index` of `total` (1-based).
    CellStart {
        index: usize,
        total: usize,
        spec: &'a CellSpec,
    },
    /// A cell's network baseline is in.
    Network { baseline: &'a NetworkBaseline },
    /// A cell is done, with its rows.
    CellDone {
        index: usize,
        total: usize,
        rows: &'a [CellResult],
    },
}

/// Checks this process may build beds and has the tools.
pub fn preflight() -> Result<(), Error> {
    if !netns::have_net_admin() {
        return Err(Error::NotPermitted);
    }
    for tool in ["ip", "tc"] {
        let mut command = std::process::Command::new(tool);
        let found = blockwire_bench::child::die_with_parent(&mut command)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Err(Error::MissingTool(tool));
        }
    }
    Ok(())
}

/// Runs the whole matrix. Installs nothing itself: the caller installs
/// [`cleanup::install_signal_handler`] first so Ctrl-C tears the bed down.
pub fn run(options: &LabOptions, events: &mut dyn FnMut(Event<'_>)) -> Result<LabReport, Error> {
    options.matrix.validate().map_err(Error::Matrix)?;
    preflight()?;
    let expansion = options.matrix.expand();
    let mut notes = expansion.skipped.clone();
    for note in &expansion.skipped {
        events(Event::Note(note));
    }
    let work = WorkDir::new()?;
    let total = expansion.cell_count();
    let mut index = 0;
    let mut cells = Vec::new();
    for plan in &expansion.beds {
        let bed = match Bed::build(plan.bed) {
            Ok(bed) => bed,
            Err(e) => {
                let note = format!("bed {}: cannot build: {e}", plan.bed);
                events(Event::Note(&note));
                notes.push(note);
                index += plan.cells.len();
                continue;
            }
        };
        events(Event::Bed { bed: &bed });
        for spec in &plan.cells {
            index += 1;
            events(Event::CellStart { index, total, spec });
            match run_cell(&bed, spec, options, work.path(), index, events, &mut notes) {
                Ok(rows) => {
                    events(Event::CellDone {
                        index,
                        total,
                        rows: &rows,
                    });
                    cells.extend(rows);
                }
                Err(why) => {
                    let note = format!("{}: failed: {why}", spec.label());
                    events(Event::Note(&note));
                    notes.push(note);
                }
            }
        }
    }
    Ok(LabReport {
        seed: options.seed.map(|s| s.name().to_string()),
        size: options.size,
        phase_seconds: options.time.as_secs_f64(),
        chunk: options.chunk,
        machine: blockwire_bench::machine::this_machine(),
        cells,
        planned_cells: total,
        notes,
    })
}

/// The run's scratch directory (configs, logs, bench JSON, file-backed exports),
/// removed on drop and by the signal handler.
struct WorkDir(Option<tempfile::TempDir>);

impl WorkDir {
    fn new() -> std::io::Result<WorkDir> {
        let mut registry = cleanup::lock();
        let dir = tempfile::Builder::new()
            .prefix(&bed::namespace_prefix())
            .tempdir()?;
        registry.add_dir(dir.path().to_path_buf());
        Ok(WorkDir(Some(dir)))
    }

    fn path(&self) -> &Path {
        self.0.as_ref().map(|d| d.path()).unwrap_or(Path::new("/"))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            cleanup::lock().remove_dir(dir.path());
            let _ = dir.close();
        }
    }
}

/// A cell's directory under the work directory, removed when the cell ends (the
/// work directory's removal covers a signal).
struct CellDir(PathBuf);

impl CellDir {
    fn new(path: PathBuf) -> std::io::Result<CellDir> {
        std::fs::create_dir(&path)?;
        Ok(CellDir(path))
    }
}

impl Drop for CellDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process registered for teardown; stopped (and unregistered) on drop,
/// and sent SIGTERM by the kernel should the lab end without either (SIGKILL).
struct Guarded {
    child: Child,
    log: PathBuf,
}

impl Guarded {
    fn spawn(mut command: std::process::Command, log: PathBuf) -> std::io::Result<Guarded> {
        let file = std::fs::File::create(&log)?;
        command.stdin(Stdio::null()).stderr(file);
        // Spawned from the run's own thread, which outlives every cell.
        blockwire_bench::child::die_with_parent(&mut command);
        let mut registry = cleanup::lock();
        let child = command.spawn()?;
        registry.add_child(child.id());
        Ok(Guarded { child, log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last lines of its log, for an error message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(4)..].join(" | ")
    }

    /// Waits for it to end, up to `limit`; `None` when it is still running.
    fn wait_for(&mut self, limit: Duration) -> std::io::Result<Option<std::process::ExitStatus>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                cleanup::lock().remove_child(self.child.id());
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let pid = self.child.id();
        let mut registry = cleanup::lock();
        if let Ok(None) = self.child.try_wait() {
            cleanup::stop_process(pid, Duration::from_secs(5));
        }
        registry.remove_child(pid);
    }
}

/// The line `blockwire serve` prints once every listener is up.
const READY: &str = "press Ctrl-C to stop";

/// Our target with its netserve (`blockwire serve --config --netserve`), or for an
/// NFS cell, whose exports ganesha serves, our netserve alone.
fn start_target(
    bed: &Bed,
    spec: &CellSpec,
    options: &LabOptions,
    dir: &Path,
) -> std::io::Result<Guarded> {
    let mut command = netns::command_in(bed.target_ns(), &options.binary);
    let netserve = format!("0.0.0.0:{}", target::NETSERVE_PORT);
    if spec.protocol == Protocol::Nfs {
        command.arg("netserve").arg("--listen").arg(netserve);
    } else {
        let config = dir.join("serve.toml");
        std::fs::write(
            &config,
            target::serve_config(
                spec,
                device_size(spec, options.size),
                options.chunk,
                options.backing,
                dir,
            ),
        )?;
        command
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .arg("--netserve")
            .arg(netserve);
    }
    command.stdout(Stdio::piped());
    let mut target = Guarded::spawn(command, dir.join("target.log"))?;
    let stdout = target.child.stdout.take().expect("stdout is piped");
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Reads to the end, so the target never blocks on a full pipe.
        let mut told = false;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if !told && line.contains(READY) {
                let _ = ready_tx.send(());
                told = true;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if ready_rx.recv_timeout(Duration::from_millis(50)).is_ok() {
            return Ok(target);
        }
        if let Some(status) = target.child.try_wait()? {
            return Err(std::io::Error::other(format!(
                "the target exited ({status}) before it was up: {}",
                target.log_tail()
            )));
        }
        if Instant::now() >= deadline {
            return Err(std::io::Error::other(format!(
                "the target was not up within 20 s: {}",
                target.log_tail()
            )));
        }
    }
}

/// Bytes each channel's stream moves in the network baseline of a cell whose data
/// set is `size`: the channel's share of it, as the storage moves it (a stripe
/// puts size / N on each of its N members; AoE spreads one export's frames over
/// the channels alike).
pub fn network_bytes_per_channel(size: u64, channels: u32) -> u64 {
    size.div_ceil(u64::from(channels.max(1))).max(1)
}

/// Measures each direction on all of the bed's channels at once (a barrier starts
/// them together) and sums them, as seed 003 ran concurrent netperfs (§3.3). Each
/// channel moves `bytes_per_channel`, the cell's own data set: the link is measured
/// over as many bytes as the storage will move, so that what a short transfer gains
/// or loses (tbf's bucket, TCP's slow start) weighs the same in both; `limit`
/// bounds the time a direction may take.
pub fn measure_network(
    bed: &Bed,
    bytes_per_channel: u64,
    limit: Duration,
) -> std::io::Result<NetworkBaseline> {
    let channels = bed.spec.channels;
    let config = ClientConfig {
        duration: limit,
        byte_limit: Some(bytes_per_channel),
        connect_timeout: Duration::from_secs(3),
        ..ClientConfig::default()
    };
    let mut sums = [0.0f64; 2];
    for (slot, direction) in [Direction::ClientSends, Direction::ClientReceives]
        .into_iter()
        .enumerate()
    {
        let barrier = Arc::new(Barrier::new(channels as usize));
        let results = bed.in_initiator(|| {
            std::thread::scope(|scope| {
                let handles: Vec<_> = (0..channels)
                    .map(|k| {
                        let barrier = Arc::clone(&barrier);
                        let config = config.clone();
                        // Threads started here inherit the initiator namespace.
                        scope.spawn(move || {
                            barrier.wait();
                            netperf::measure(
                                &netns::target_addr(k),
                                target::NETSERVE_PORT,
                                direction,
                                &config,
                            )
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a netperf thread panicked"))
                    .collect::<Vec<_>>()
            })
        })?;
        for (k, result) in results.into_iter().enumerate() {
            let measured = result
                .map_err(|e| std::io::Error::other(format!("network test on channel {k}: {e}")))?;
            sums[slot] += measured.mb_per_s();
        }
    }
    Ok(NetworkBaseline {
        send_mb_per_s: sums[0],
        receive_mb_per_s: sums[1],
    })
}

/// The size of a cell's volume: the data set, or for bonnie++ on ext4 a device
/// that holds the data set and the file system's own blocks.
pub fn device_size(spec: &CellSpec, size: u64) -> u64 {
    match spec.workload {
        LabWorkload::BonnieFs => fs_bonnie::sizes(size).device_bytes,
        _ => size,
    }
}

/// Runs [`fs_bonnie::SCRIPT`] in the initiator namespace against the cell's
/// volume and reads its rows (the notes say which figures bonnie could not time).
fn run_fs_bonnie(
    bed: &Bed,
    spec: &CellSpec,
    options: &LabOptions,
    target_pid: u32,
    dir: &Path,
) -> std::io::Result<(Vec<blockwire_bench::PhaseResult>, Vec<String>)> {
    let work = dir.join("bonnie");
    std::fs::create_dir(&work)?;
    let sizes = fs_bonnie::sizes(options.size);
    let cgroup_name = work
        .parent()
        .and_then(|p| p.file_name())
        .map(|cell| format!("{}{}", bed::namespace_prefix(), cell.to_string_lossy()))
        .unwrap_or_else(|| format!("{}bonnie", bed::namespace_prefix()));
    let cgroup = fs_bonnie::this_memory_cgroup(&cgroup_name);
    let mut notes = Vec::new();
    if cgroup.is_none() {
        notes.push(format!(
            "{}: no memory cgroup could be made: bonnie++ -D instead (its writing pass \
             O_DIRECT; its rewrite and read may be answered by the page cache)",
            fs_bonnie::LABEL
        ));
    }
    let (mut command, _namespace) = private_mounts_in(bed.initiator_ns(), "sh")?;
    command
        .arg("-c")
        .arg(fs_bonnie::SCRIPT)
        .arg("sh")
        .arg(target::initiator_uri(spec, options.chunk))
        .arg(&work)
        .arg(sizes.data_mib.to_string())
        .arg(sizes.ram_mib.to_string())
        .arg(&options.binary)
        .arg(target_pid.to_string())
        .arg(cgroup.as_ref().map_or(Path::new(""), |c| c.0.as_path()))
        .arg(cgroup.as_ref().map_or("", |c| c.1))
        .stdout(Stdio::null());
    let mut script = Guarded::spawn(command, dir.join("bonnie.log"))?;
    match script.wait_for(options.cell_timeout)? {
        None => {
            return Err(std::io::Error::other(format!(
                "bonnie++ did not finish within {} s: {}",
                options.cell_timeout.as_secs(),
                script.log_tail()
            )))
        }
        Some(status) if !status.success() => {
            return Err(std::io::Error::other(format!(
                "{} failed ({status}): {}",
                fs_bonnie::LABEL,
                script.log_tail()
            )))
        }
        Some(_) => {}
    }
    let (rows, more) = fs_bonnie::read_outcome(&work, sizes).map_err(std::io::Error::other)?;
    notes.extend(more);
    Ok((rows, notes))
}

/// A command that runs `program` in network namespace `ns` and a mount namespace
/// of its own, as `ip netns exec` does, but keeping this host's /sys (which `ip
/// netns exec` mounts afresh, hiding the cgroup hierarchies bonnie's memory limit
/// needs): the FUSE mount, the loop device's ext4 and anything else the program
/// mounts stay private to it and end with it. The namespace file must stay open
/// until the command is spawned: it is returned with it.
fn private_mounts_in(
    ns: &str,
    program: &str,
) -> std::io::Result<(std::process::Command, std::fs::File)> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let file = std::fs::File::open(Path::new("/run/netns").join(ns))?;
    let fd = file.as_raw_fd();
    let mut command = std::process::Command::new(program);
    // SAFETY: between fork and exec only async-signal-safe system calls run
    // (setns, unshare, mount), on a descriptor the parent holds open.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) < 0 || libc::unshare(libc::CLONE_NEWNS) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Mounts made here must not reach the host's namespace.
            let root = c"/";
            let rc = libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            );
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok((command, file))
}

/// An NFS cell's server: nfs-ganesha in the target namespace on channel 0's
/// address, exporting the cell's `export` directory, which holds one file of the
/// data set's size (created here, sparse, as a file-backed export starts).
fn start_nfs(bed: &Bed, options: &LabOptions, dir: &Path) -> std::io::Result<NfsServer> {
    let export_dir = dir.join("export");
    std::fs::create_dir(&export_dir)?;
    let file = std::fs::File::create(export_dir.join(target::nfs_file(0)))?;
    file.set_len(options.size)?;
    drop(file);
    let listen = netns::target_addr(0)
        .parse()
        .map_err(|e| std::io::Error::other(format!("channel 0's address: {e}")))?;
    NfsServer::start(&NfsServerConfig {
        netns: Some(bed.target_ns().to_string()),
        listen,
        export_dir,
        pseudo: target::NFS_PSEUDO.to_string(),
        state_dir: dir.join("ganesha"),
    })
    .map_err(|e| std::io::Error::other(format!("nfs-ganesha: {e}")))
}

fn bench_command(
    bed: &Bed,
    spec: &CellSpec,
    options: &LabOptions,
    uri: &str,
    target_pid: u32,
    json: &Path,
) -> std::process::Command {
    let mut command = netns::command_in(bed.initiator_ns(), &options.binary);
    command
        .arg("bench")
        .arg(uri)
        .args(["--workload", spec.workload.name()])
        .args(["--size", &options.size.to_string()])
        .args(["--time", &format!("{}", options.time.as_secs_f64())])
        .args(["--target-pid", &target_pid.to_string()])
        .args(["--label", &spec.label()])
        // The exports are the lab's own, fresh for this cell.
        .arg("--force")
        .arg("--json")
        .arg(json)
        .stdout(Stdio::null());
    if let Some(depth) = options.queue_depth {
        command.args(["--queue-depth", &depth.to_string()]);
    }
    if let Some(block) = options.block_size {
        command.args(["--block-size", &block.to_string()]);
    }
    if spec.workload == LabWorkload::Random && !options.random_depths.is_empty() {
        let depths: Vec<String> = options.random_depths.iter().map(u32::to_string).collect();
        command.args(["--random-depths", &depths.join(",")]);
    }
    command
}

fn run_cell(
    bed: &Bed,
    spec: &CellSpec,
    options: &LabOptions,
    dir: &Path,
    index: usize,
    events: &mut dyn FnMut(Event<'_>),
    notes: &mut Vec<String>,
) -> std::io::Result<Vec<CellResult>> {
    // The cell's own directory: its file-backed exports start empty and go with it.
    let cell_dir = CellDir::new(dir.join(format!("cell-{index}")))?;
    let target = start_target(bed, spec, options, &cell_dir.0)?;
    // Declared after the netserve, so dropped (stopped) before it.
    let nfs = match spec.protocol {
        Protocol::Nfs => Some(start_nfs(bed, options, &cell_dir.0)?),
        _ => None,
    };
    let network = measure_network(
        bed,
        network_bytes_per_channel(options.size, bed.spec.channels),
        options.cell_timeout,
    )?;
    events(Event::Network { baseline: &network });
    if spec.workload == LabWorkload::BonnieFs {
        let (phases, cell_notes) = run_fs_bonnie(bed, spec, options, target.pid(), &cell_dir.0)?;
        drop(target);
        for note in cell_notes {
            let note = format!("{}: {note}", spec.label());
            events(Event::Note(&note));
            notes.push(note);
        }
        return Ok(phases
            .iter()
            .map(|phase| CellResult::from_phase(spec, phase, Some(&network), options.seed))
            .collect());
    }
    let json = dir.join(format!("cell-{index}.json"));
    // The target's CPU: our serve, or ganesha (the first of the NFS server's PIDs).
    let (uri, target_pid) = match &nfs {
        Some(server) => (server.url(&target::nfs_file(0)), server.pids()[0]),
        None => (target::initiator_uri(spec, options.chunk), target.pid()),
    };
    let command = bench_command(bed, spec, options, &uri, target_pid, &json);
    let mut bench = Guarded::spawn(command, dir.join(format!("cell-{index}-bench.log")))?;
    let status = bench.wait_for(options.cell_timeout)?;
    match status {
        None => {
            return Err(std::io::Error::other(format!(
                "the bench did not finish within {} s: {}",
                options.cell_timeout.as_secs(),
                bench.log_tail()
            )))
        }
        Some(status) if !status.success() => {
            return Err(std::io::Error::other(format!(
                "the bench failed ({status}): {}",
                bench.log_tail()
            )))
        }
        Some(_) => {}
    }
    drop(bench);
    drop(nfs);
    drop(target);
    let report = blockwire_bench::report::json::read(&json)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(report
        .results
        .iter()
        .filter(|phase| phase.workload != "network")
        .map(|phase| CellResult::from_phase(spec, phase, Some(&network), options.seed))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_channel_moves_its_share_of_the_data_set() {
        assert_eq!(network_bytes_per_channel(256 << 20, 1), 256 << 20);
        assert_eq!(network_bytes_per_channel(256 << 20, 4), 64 << 20);
        // Rounded up: the channels together move at least the data set.
        assert_eq!(network_bytes_per_channel(100, 3), 34);
        assert_eq!(network_bytes_per_channel(0, 2), 1);
    }
}
