//! `blockwire netserve`: the TCP throughput server the bench's network baseline
//! measures against (`blockwire bench ... --netserve-port`), run on the target host
//! until SIGINT or SIGTERM. `blockwire serve --netserve` runs the same server
//! beside the exports.

use anyhow::{Context, Result};
use blockwire_bench::netperf;
use blockwire_server::netserve::{announce, bind};
use blockwire_server::stop_signals;
use clap::Args;

#[derive(Args, Debug)]
pub struct NetserveArgs {
    /// TCP address to listen on. Default 127.0.0.1:10810 (loopback, as every
    /// blockwire listener; give the target host's address, or 0.0.0.0:10810, for a
    /// bench on another host).
    #[arg(long, value_name = "HOST:PORT")]
    pub listen: Option<String>,
}

pub fn run(args: NetserveArgs) -> Result<()> {
    // Installed first, so a signal during start-up still stops cleanly.
    let signals = stop_signals::install()?;
    let listen = args
        .listen
        .unwrap_or_else(|| format!("127.0.0.1:{}", netperf::DEFAULT_PORT));
    let server = bind(&listen)?;
    announce(&server)?;
    let handle = server.shutdown_handle();
    stop_signals::on_first(signals, move || handle.shutdown())?;
    println!("press Ctrl-C to stop");
    server.run().context("netserve failed")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_port_is_the_one_the_help_and_docs_name() {
        // --listen's and bench --netserve-port's help, docs/bench.md and README say
        // 10810 in words.
        assert_eq!(blockwire_bench::netperf::DEFAULT_PORT, 10810);
    }
}
