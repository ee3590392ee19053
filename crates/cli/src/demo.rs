//! `blockwire demo`: the README's first command. Serves a temporary in-memory device
//! over NBD on loopback, measures it through our NBD initiator and directly, and
//! prints the two side by side with the NBD path's efficiency.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use blockwire_bench::{bench_device, BenchConfig, PhaseResult, Workload};
use blockwire_blockdev::size::{format_size, parse_size};
use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_nbd::initiator::{ClientOptions, NbdClient, NbdUri};
use blockwire_nbd::{Export, ExportSet, NbdConfig, NbdTarget};
use clap::Args;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Size of the in-memory device and data set.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub size: u64,
    /// Seconds per random-I/O point.
    #[arg(long, default_value_t = 2)]
    pub time: u64,
    /// NBD connections of the initiator.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
}

fn config(args: &DemoArgs) -> BenchConfig {
    BenchConfig {
        workloads: vec![Workload::Sequential, Workload::Random],
        size: args.size,
        block_size: 1 << 20,
        queue_depth: 8,
        direct: false,
        phase_time: Duration::from_secs(args.time),
        random_depths: vec![1, 16],
        progress: true,
        ..BenchConfig::default()
    }
}

/// Starts our NBD target on a free loopback port in this process.
fn start_target(
    device: Device,
) -> Result<(
    SocketAddr,
    blockwire_nbd::target::ShutdownHandle,
    thread::JoinHandle<std::io::Result<()>>,
)> {
    let mut exports = ExportSet::new();
    exports
        .add(Export::new("demo", "blockwire demo", device))
        .map_err(|e| anyhow!(e))?;
    let config = NbdConfig {
        tcp: vec!["127.0.0.1:0".parse().expect("loopback address")],
        ..NbdConfig::default()
    };
    let server = NbdTarget::bind(exports, config).context("cannot start the NBD target")?;
    let addr = server.tcp_addrs()[0];
    let shutdown = server.shutdown_handle();
    let thread = thread::Builder::new()
        .name("demo-target".into())
        .spawn(move || server.run())?;
    Ok((addr, shutdown, thread))
}

fn label(result: &PhaseResult) -> String {
    format!(
        "{} {} {} QD{}",
        result.workload,
        result.op,
        format_size(result.block_size),
        result.queue_depth
    )
}

fn table(local: &[PhaseResult], remote: &[PhaseResult]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<32} {:>12} {:>12} {:>10} {:>12} {:>10} {:>8} {:>9}\n",
        "phase",
        "local MB/s",
        "NBD MB/s",
        "NBD IOPS",
        "NBD p99 µs",
        "NBD/local",
        "CPU%",
        "MB/s/CPU%"
    ));
    for nbd in remote {
        let Some(direct) = local.iter().find(|l| label(l) == label(nbd)) else {
            continue;
        };
        let efficiency = if direct.mb_per_s > 0.0 {
            format!("{:.1}%", 100.0 * nbd.mb_per_s / direct.mb_per_s)
        } else {
            "-".into()
        };
        let per_cpu = nbd
            .mb_per_s_per_cpu_percent
            .map_or("-".into(), |v| format!("{v:.1}"));
        out.push_str(&format!(
            "{:<32} {:>12.1} {:>12.1} {:>10.0} {:>12.0} {:>10} {:>8.0} {:>9}\n",
            label(nbd),
            direct.mb_per_s,
            nbd.mb_per_s,
            nbd.iops,
            nbd.latency_us.p99,
            efficiency,
            nbd.cpu_percent,
            per_cpu
        ));
    }
    out
}

pub fn run(args: DemoArgs) -> Result<()> {
    let config = config(&args);
    let device = Device::from_device(MemoryDevice::new(args.size));
    // Allocate every chunk first, so neither measurement pays for first touches.
    let fill = vec![0x5au8; 1 << 20];
    for offset in (0..args.size).step_by(fill.len()) {
        let len = (args.size - offset).min(fill.len() as u64) as usize;
        device
            .write(&fill[..len], offset, blockwire_blockdev::WriteFlags::NONE)
            .map_err(|e| anyhow!("{e}"))?;
    }
    let (addr, shutdown, target) = start_target(device.clone())?;
    let uri: NbdUri = format!("nbd://{addr}/demo")
        .parse()
        .map_err(|e| anyhow!("{e}"))?;
    println!(
        "blockwire demo: a {} in-memory device, served at {uri} and measured two ways",
        format_size(args.size)
    );

    println!("\n[1/2] directly, through the block-device layer");
    let local = bench_device(&device, &config).map_err(|e| anyhow!("local bench: {e}"))?;

    println!("\n[2/2] over NBD on loopback, through blockwire's initiator");
    let options = ClientOptions {
        connections: args.connections,
        ..ClientOptions::default()
    };
    let client = NbdClient::connect(&uri, options).map_err(|e| anyhow!("{e}"))?;
    let remote_device = Device::new(Arc::new(client));
    let remote = bench_device(&remote_device, &config).map_err(|e| anyhow!("NBD bench: {e}"))?;
    drop(remote_device);
    shutdown.shutdown();
    target
        .join()
        .map_err(|_| anyhow!("the demo target panicked"))?
        .context("the demo target failed")?;

    println!("\n{}", table(&local, &remote));
    println!(
        "NBD/local is the efficiency of the network path against the device itself. CPU% is\n\
         this whole process (initiator and target both run in it), 100% = one core.\n\
         Measure your own storage: blockwire bench PATH|nbd://HOST/EXPORT|aoe://IFACE/eSHELF.SLOT"
    );
    Ok(())
}
