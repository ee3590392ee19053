//! Measuring: workloads that drive any [`blockwire_blockdev::Device`] (or a file system
//! directory), meters for throughput, latency and CPU, and reports.
//!
//! - [`bench_device`] runs the storage workloads on any `Device` (a file, a block
//!   device, memory, and later an initiator);
//! - [`run`] does a whole run from what the user typed: opens the target
//!   ([`target`]), picks the workloads that fit it, measures the network when the
//!   target is remote, and returns a [`RunReport`];
//! - [`report`] turns reports into a terminal table, a bonnie++ CSV line, JSON, HTML,
//!   and side-by-side comparisons.

pub mod child;
pub mod config;
pub mod error;
pub mod machine;
pub mod meter;
pub mod netperf;
pub mod progress;
pub mod report;
pub mod results;
pub mod target;
pub mod target_cpu;
pub mod workloads;

use std::time::Duration;

use blockwire_blockdev::size::format_size;
use blockwire_blockdev::Device;

pub use config::{BenchConfig, Workload};
pub use error::{Error, Result};
pub use results::{Latency, Machine, PhaseResult, RunConfig, RunReport};
pub use target::{OpenRequest, OpenedTarget, TargetKind, TargetSpec};
pub use target_cpu::TargetCpu;

use workloads::{bonnie, files, network, random, sequential, sweep, Ctx};

/// Runs the storage workloads of `config` on `device`, over its first `config.size`
/// bytes. Every workload writes, so a read-only device is refused.
pub fn bench_device(device: &Device, config: &BenchConfig) -> Result<Vec<PhaseResult>> {
    run_storage(device, config, None, true)
}

/// Like [`bench_device`] on an opened path target: on a directory the bonnie file
/// tests run too, and per-character tests stream through the test file.
pub fn bench_target(target: &OpenedTarget, config: &BenchConfig) -> Result<Vec<PhaseResult>> {
    run_storage(&target.device, config, Some(target), target.holds_data)
}

fn run_storage(
    device: &Device,
    config: &BenchConfig,
    target: Option<&OpenedTarget>,
    holds_data: bool,
) -> Result<Vec<PhaseResult>> {
    let storage = [
        Workload::Sequential,
        Workload::Bonnie,
        Workload::Sweep,
        Workload::Random,
    ];
    if !storage.iter().any(|&w| config.wants(w)) {
        return Ok(Vec::new());
    }
    if device.info().read_only {
        return Err(Error::target(
            "the device is read-only; the write tests need write access",
        ));
    }
    let align = u64::from(device.info().block_sizes.minimum).max(1);
    let region = config.size.min(device.size()) / align * align;
    if region < target::MIN_SIZE {
        return Err(Error::target(format!(
            "the device is too small ({} bytes; at least {} needed)",
            device.size(),
            format_size(target::MIN_SIZE)
        )));
    }
    if config.wants(Workload::Sequential) && !config.block_size.is_multiple_of(align) {
        return Err(Error::target(format!(
            "--block-size {} is not a multiple of the device's block size {align}",
            config.block_size
        )));
    }
    let file = target.and_then(|t| t.file.as_deref());
    let ctx = Ctx::new(device, config, region, file, holds_data);
    if config.wants(Workload::Sequential) {
        sequential::run(&ctx)?;
    }
    if config.wants(Workload::Bonnie) {
        bonnie::run(&ctx)?;
        if let Some(dir) = target.and_then(|t| t.dir.as_deref()) {
            files::run(&ctx, dir)?;
        }
    }
    if config.wants(Workload::Sweep) {
        sweep::run(&ctx)?;
    }
    if config.wants(Workload::Random) {
        random::run(&ctx)?;
    }
    Ok(ctx.into_results())
}

/// A whole run, as the user asked for it.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// Path or URI, as typed.
    pub target: String,
    /// Label for comparisons (default: the target).
    pub label: Option<String>,
    /// `config.size` is ignored; the data set comes from `size` and the target.
    pub config: BenchConfig,
    pub size: Option<u64>,
    pub force: bool,
    /// `--direct` was given: a path whose file system has no O_DIRECT is an error
    /// instead of being measured buffered (with a note), as it is by default.
    pub require_direct: bool,
    /// Port of a `blockwire netserve` on the target host, for the network baseline;
    /// `None` tries [`netperf::DEFAULT_PORT`] unless `iperf_port` is given.
    pub netserve_port: Option<u16>,
    /// Port of an `iperf3 -s` on the target host, used when no netserve answers.
    pub iperf_port: Option<u16>,
    /// Parallel TCP streams of the network baseline (at least 1).
    pub network_streams: u32,
    /// The remote target opened as a device (an initiator), when the caller could:
    /// the storage workloads then run on it. `None` skips them with a note.
    pub remote_device: Option<Device>,
}

/// Runs everything `request` asks for. `note` receives what the user should know
/// before and while it runs (files created, skipped workloads, cache warnings).
///
/// A URI whose scheme the bench does not speak is refused before anything is sent
/// ([`TargetSpec::check`]).
pub fn run(request: &RunRequest, note: &mut dyn FnMut(&str)) -> Result<RunReport> {
    let spec = TargetSpec::parse(&request.target);
    spec.check()?;
    let machine = machine::this_machine();
    let mut config = request.config.clone();
    let mut warnings = Vec::new();
    let mut results = Vec::new();
    let mut ran = Vec::new();
    let mut network_mb_per_s = None;
    let storage: Vec<Workload> = [
        Workload::Sequential,
        Workload::Bonnie,
        Workload::Sweep,
        Workload::Random,
    ]
    .into_iter()
    .filter(|&w| config.wants(w))
    .collect();

    match spec {
        TargetSpec::Remote(remote) => {
            if config.wants(Workload::Network) && remote.scheme == "aoe" {
                note("network: skipped (AoE is layer 2: there is no IP host for a TCP test)");
            } else if config.wants(Workload::Network) && remote.scheme == "rbd" {
                note("network: skipped (librbd talks to every OSD of the cluster: there is no one host)");
            } else if config.wants(Workload::Network) && remote.scheme == "stripe" {
                note("network: skipped (a stripe has one host per member: measure each member's URI)");
            } else if config.wants(Workload::Network) {
                let network = network::NetworkRequest {
                    host: remote.host.clone(),
                    netserve_port: request.netserve_port,
                    iperf_port: request.iperf_port,
                    time: config.phase_time.max(Duration::from_secs(1)),
                    streams: request.network_streams.max(1),
                };
                let measured = network::measure(&network, note);
                if !measured.is_empty() {
                    // The slower direction: what the link carries both ways.
                    network_mb_per_s = measured.iter().map(|r| r.mb_per_s).reduce(f64::min);
                    results.extend(measured);
                    ran.push(Workload::Network);
                }
            }
            match &request.remote_device {
                Some(device) if !storage.is_empty() => {
                    config.size = remote_size(device, request, &remote.uri)?;
                    if remote.scheme == "nfs" {
                        file_level_notes(&storage, note);
                    }
                    if config.target_cpu.is_none() {
                        match target_cpu::discover(&remote, request.netserve_port) {
                            Some((source, line)) => {
                                note(&line);
                                config.target_cpu = Some(source);
                            }
                            None if remote.scheme == "rbd" => note(
                                "target CPU: librbd runs in this process (its CPU is the client's)",
                            ),
                            None if remote.scheme == "nfs" => note(
                                "target CPU: not seen (the NFS server is not on this host's \
                                 loopback: give --target-pid with its PID, ganesha.nfsd's)",
                            ),
                            None if remote.scheme == "aoe" || remote.scheme == "stripe" => note(
                                "target CPU: not seen (give --target-pid on the target's host)",
                            ),
                            None => note(
                                "target CPU: not seen (give --target-pid on the target's \
                                 host, or serve with blockwire serve --netserve)",
                            ),
                        }
                    }
                    config.workloads = storage.clone();
                    results.extend(bench_device(device, &config)?);
                    ran.extend(storage);
                }
                None if !storage.is_empty() => {
                    config.size = 0;
                    let why = if remote.scheme == "tcp" {
                        "host:port names no device".to_string()
                    } else {
                        format!(
                            "no {} initiator here; storage workloads need a device",
                            remote.scheme
                        )
                    };
                    note(&format!("{}: skipped ({why})", names(&storage)));
                }
                _ => config.size = 0,
            }
        }
        TargetSpec::Path(path) => {
            if config.wants(Workload::Network) && !config.workloads.is_empty() {
                note("network: skipped (the target is a local path)");
            }
            if storage.is_empty() {
                config.size = 0;
            } else {
                let opened = target::open(
                    &path,
                    &OpenRequest {
                        size: request.size,
                        direct: config.direct,
                        require_direct: request.require_direct,
                        force: request.force,
                        writes: true,
                    },
                )?;
                for text in &opened.notes {
                    note(text);
                }
                config.size = opened.size;
                config.direct = opened.direct;
                let twice_ram = machine.memory_bytes * 2;
                if !config.direct && opened.size < twice_ram {
                    let warning = format!(
                        "buffered I/O with a data set of {} (less than twice the RAM, {}): \
                         the page cache will inflate the results",
                        format_size(opened.size >> 20 << 20),
                        format_size(twice_ram >> 20 << 20)
                    );
                    note(&format!("warning: {warning}"));
                    warnings.push(warning);
                }
                config.workloads = storage.clone();
                results.extend(bench_target(&opened, &config)?);
                ran.extend(storage);
            }
        }
    }

    Ok(RunReport {
        target: request.target.clone(),
        label: request
            .label
            .clone()
            .unwrap_or_else(|| request.target.clone()),
        config: RunConfig {
            workloads: ran.iter().map(|w| w.name().to_string()).collect(),
            size: config.size,
            block_size: config.block_size,
            queue_depth: config.queue_depth,
            direct: config.direct,
        },
        machine,
        network_mb_per_s,
        results,
        warnings,
    })
}

/// What a file-level target (`nfs://`, one file on a server) cannot be measured
/// on, said once: it is no block device, and names no directory.
fn file_level_notes(storage: &[Workload], note: &mut dyn FnMut(&str)) {
    note("nfs: a file on an NFS server, not a block device: reads, writes and COMMIT are measured; there is no trim and no allocation map");
    if storage.contains(&Workload::Bonnie) {
        note("bonnie: file create/stat/delete tests skipped (nfs:// names one file, not a directory)");
    }
}

/// The data set on a remote device: `--size` (which must fit) or up to 1 GiB; a
/// device that holds a file system is refused without `--force`.
fn remote_size(device: &Device, request: &RunRequest, uri: &str) -> Result<u64> {
    if !request.force {
        let probe = (device.size() as usize).min(128 << 10);
        let align = device.info().block_sizes.minimum.max(1) as usize;
        let mut head = blockwire_blockdev::IoBuf::new(probe / align * align);
        device
            .read(&mut head, 0)
            .map_err(|e| Error::device("probing for a file system", e))?;
        if let Some(what) = target::magic_signature(&head) {
            return Err(Error::target(format!(
                "{uri} holds {what}; refusing to overwrite it (use --force)"
            )));
        }
    }
    match request.size {
        Some(size) if size > device.size() => Err(Error::target(format!(
            "{uri} is {} bytes, smaller than --size {size}",
            device.size()
        ))),
        Some(size) => Ok(size),
        None => Ok(target::DIRECT_DEFAULT_SIZE.min(device.size())),
    }
}

fn names(workloads: &[Workload]) -> String {
    workloads
        .iter()
        .map(|w| w.name())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::test_support::{closed_port, memory, tiny_config};

    #[test]
    fn every_workload_runs_on_a_memory_device() {
        let device = memory(8 << 20);
        let config = tiny_config();
        let results = bench_device(&device, &config).unwrap();
        for workload in ["sequential", "bonnie", "sweep", "random"] {
            assert!(results.iter().any(|r| r.workload == workload), "{workload}");
        }
        // A device has no directory: no file tests.
        assert!(!results.iter().any(|r| r.op.contains("create")));
    }

    #[test]
    fn read_only_and_tiny_devices_are_refused() {
        let config = tiny_config();
        let err = bench_device(&memory(8 << 20).read_only(), &config).unwrap_err();
        assert!(err.to_string().contains("read-only"), "{err}");
        let err = bench_device(&memory(4096), &config).unwrap_err();
        assert!(err.to_string().contains("too small"), "{err}");
    }

    #[test]
    fn a_run_on_a_directory_cleans_up_and_reports() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = tiny_config();
        config.workloads = vec![Workload::Sequential, Workload::Bonnie];
        let request = RunRequest {
            target: dir.path().display().to_string(),
            label: Some("tmp".into()),
            config,
            size: Some(2 << 20),
            force: false,
            require_direct: false,
            netserve_port: None,
            iperf_port: None,
            network_streams: 1,
            remote_device: None,
        };
        let mut notes = Vec::new();
        let report = run(&request, &mut |n| notes.push(n.to_string())).unwrap();
        assert_eq!(report.label, "tmp");
        assert_eq!(report.config.size, 2 << 20);
        assert_eq!(report.config.workloads, ["sequential", "bonnie"]);
        assert!(report.results.iter().any(|r| r.op == "seq_create"));
        // Buffered with a small data set: warned.
        assert_eq!(report.warnings.len(), 1);
        assert!(notes.iter().any(|n| n.starts_with("warning: buffered")));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn remote_targets_skip_storage_workloads_with_a_note() {
        let _port = crate::workloads::test_support::iperf3_default_port();
        let request = RunRequest {
            target: "nbd://localhost:10809/x".into(),
            label: None,
            config: tiny_config(),
            size: None,
            force: false,
            require_direct: false,
            // Not the default port, which a netserve on this machine might hold.
            netserve_port: Some(closed_port()),
            iperf_port: None,
            network_streams: 1,
            remote_device: None,
        };
        let mut notes = Vec::new();
        let report = run(&request, &mut |n| notes.push(n.to_string())).unwrap();
        assert!(report.results.is_empty());
        assert_eq!(report.config.size, 0);
        assert!(
            notes.iter().any(|n| n.contains("no nbd initiator")),
            "{notes:?}"
        );
        assert!(
            notes.iter().any(|n| n.contains("--iperf-port")),
            "{notes:?}"
        );
    }

    #[test]
    fn a_scheme_the_bench_does_not_speak_is_refused_before_anything_is_sent() {
        // Where the network test would connect first.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let request = RunRequest {
            target: "smb://127.0.0.1/share".into(),
            netserve_port: Some(listener.local_addr().unwrap().port()),
            ..network_only(None, Duration::from_millis(300), 1)
        };
        let mut notes = Vec::new();
        let err = run(&request, &mut |n| notes.push(n.to_string()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not speak smb://") && err.contains("nbd://, "),
            "{err}"
        );
        assert!(err.contains("iscsi://") && !err.contains('\n'), "{err}");
        assert!(notes.is_empty(), "{notes:?}");
        let accepted = listener.accept();
        assert!(
            matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the bench connected: {accepted:?}"
        );
    }

    /// A run of the network workload alone against 127.0.0.1.
    fn network_only(netserve_port: Option<u16>, time: Duration, streams: u32) -> RunRequest {
        let mut config = tiny_config();
        config.workloads = vec![Workload::Network];
        config.phase_time = time;
        RunRequest {
            target: "nbd://127.0.0.1:10809/x".into(),
            label: None,
            config,
            size: None,
            force: false,
            require_direct: false,
            netserve_port,
            iperf_port: None,
            network_streams: streams,
            remote_device: None,
        }
    }

    #[test]
    fn the_network_baseline_measures_both_directions_against_our_server() {
        let server = netperf::NetServer::bind("127.0.0.1:0", Default::default())
            .unwrap()
            .spawn()
            .unwrap();
        let request = network_only(Some(server.addr.port()), Duration::from_millis(300), 2);
        let report = run(&request, &mut |_| {}).unwrap();
        assert_eq!(report.config.workloads, ["network"]);
        let ops: Vec<&str> = report.results.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(ops, ["send", "receive"]);
        assert!(report.results.iter().all(|r| r.queue_depth == 2));
        let slower = report
            .results
            .iter()
            .map(|r| r.mb_per_s)
            .fold(f64::INFINITY, f64::min);
        assert_eq!(report.network_mb_per_s, Some(slower));
        server.stop().unwrap();
    }

    #[test]
    fn without_a_netserve_an_iperf3_on_its_default_port_is_used() {
        use std::process::{Command, Stdio};
        let _port = crate::workloads::test_support::iperf3_default_port();
        let port = network::IPERF3_DEFAULT_PORT;
        if Command::new("iperf3").arg("--version").output().is_err() {
            eprintln!("skipped: iperf3 is not installed");
            return;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
            eprintln!("skipped: port {port} is taken");
            return;
        }
        let mut server = Command::new("iperf3")
            .args(["-s", "--bind", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Up once the port is taken. Not by connecting: iperf3 takes a connection
        // as a test's control channel, and one that says nothing keeps it busy long
        // enough to turn the real client away.
        let up = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            std::net::TcpListener::bind(("127.0.0.1", port)).is_err()
        });
        // No netserve answers, and no --iperf-port is given.
        let request = network_only(Some(closed_port()), Duration::from_secs(1), 1);
        let mut notes = Vec::new();
        let report = run(&request, &mut |n| notes.push(n.to_string()));
        let _ = server.kill();
        let _ = server.wait();
        assert!(up, "iperf3 -s did not come up");
        let report = report.unwrap();
        assert!(
            notes
                .iter()
                .any(|n| n.contains(&format!("measured with iperf3 at 127.0.0.1:{port}"))),
            "{notes:?}"
        );
        let ops: Vec<&str> = report.results.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(ops, ["send", "receive"]);
        assert!(report.results.iter().all(|r| r.mb_per_s > 0.0));
    }

    #[test]
    fn a_remote_device_given_by_the_caller_is_measured() {
        let mut config = tiny_config();
        config.workloads = vec![Workload::Sequential, Workload::Random];
        let device = memory(8 << 20);
        let mut request = RunRequest {
            target: "nbd://localhost/x".into(),
            label: None,
            config,
            size: Some(2 << 20),
            force: false,
            require_direct: false,
            netserve_port: None,
            iperf_port: None,
            network_streams: 1,
            remote_device: Some(device.clone()),
        };
        let report = run(&request, &mut |_| {}).unwrap();
        assert_eq!(report.config.size, 2 << 20);
        assert_eq!(report.config.workloads, ["sequential", "random"]);
        assert!(report.results.iter().any(|r| r.op == "randread"));

        // Something that looks like a file system is left alone.
        let mut head = vec![0u8; 4096];
        head[..4].copy_from_slice(b"XFSB");
        device.write(&head, 0, Default::default()).unwrap();
        let err = run(&request, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("refusing to overwrite"), "{err}");
        request.force = true;
        assert!(run(&request, &mut |_| {}).is_ok());
    }
}
