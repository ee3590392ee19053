//! The bench's network test beside the exports (`serve --netserve`, and
//! `blockwire netserve` alone): bind the TCP throughput server and say where.

use anyhow::{Context, Result};
use blockwire_bench::netperf::{NetServer, ServerConfig};

/// Binds a netperf server on `addr`.
pub fn bind(addr: &str) -> Result<NetServer> {
    NetServer::bind(addr, ServerConfig::default())
        .with_context(|| format!("netserve: cannot listen on {addr}"))
}

/// Says where a bound netperf server listens.
pub fn announce(server: &NetServer) -> Result<()> {
    let local = server.local_addr()?;
    println!(
        "netserve: listening on {local} (measure with: blockwire bench ... --netserve-port {})",
        local.port()
    );
    Ok(())
}
