//! Serves one file over NVMe/TCP until killed: the target alone, for trying it with
//! the kernel's host (`nvme connect`) before `blockwire serve --nvme` is wired.
//!
//! usage: nvme_serve FILE [LISTEN [DISCOVERY_LISTEN [NQN [ADVERTISED_IP]]]]
//! (defaults 127.0.0.1:4420, 127.0.0.1:8009, nqn.2026-11.dev.blockwire:FILE-NAME,
//! the listeners' own addresses)

use std::net::SocketAddr;
use std::sync::Arc;

use blockwire_blockdev::{Device, FileDevice, FileOptions};
use blockwire_nvme::{NvmeConfig, NvmeTarget, Subsystem};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: nvme_serve FILE [LISTEN [DISCOVERY [NQN]]]")?;
    let listen: SocketAddr = args.get(1).map_or("127.0.0.1:4420", |s| s).parse()?;
    let discovery: SocketAddr = args.get(2).map_or("127.0.0.1:8009", |s| s).parse()?;
    let name = std::path::Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("disk")
        .to_owned();
    let device = Device::from_device(FileDevice::open(path, FileOptions::default())?);
    let mut subsystem = Subsystem::new(&name, device);
    if let Some(nqn) = args.get(3) {
        subsystem = subsystem.with_nqn(nqn.clone());
    }
    let mut config = NvmeConfig::new(vec![listen]);
    config.discovery_listen = vec![discovery];
    config.advertised = args.get(4).map(|ip| ip.parse()).transpose()?;
    let target = NvmeTarget::bind(config, vec![Arc::new(subsystem)])?;
    for nqn in target.subsystem_nqns() {
        println!(
            "nvme subsystem {nqn} on {:?}, discovery on {:?}",
            target.local_addrs(),
            target.discovery_addrs()
        );
    }
    target.run()?;
    Ok(())
}
