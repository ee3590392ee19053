//! The flags every command that opens a URI shares: how long an initiator waits for
//! a silent target, and how long it keeps reconnecting to a restarting one.

use std::time::Duration;

use blockwire_server::factory::{parse_reconnect, parse_timeout, reconnect_setting, Remote};
use clap::Args;

#[derive(Args, Debug, Clone, Copy)]
pub struct RemoteArgs {
    /// Fail a request a remote target leaves unanswered this many seconds (default:
    /// NBD, iSCSI and NVMe/TCP wait, AoE gives up after 10; rbd and nfs: 30).
    #[arg(long, value_name = "SECS", value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// Keep reconnecting this many seconds when an NBD, iSCSI or NVMe/TCP connection
    /// drops (a target restart), then send again what had no answer; requests wait
    /// meanwhile and fail only when it gives up. 0 fails at once. Default 30.
    #[arg(long, value_name = "SECS", value_parser = parse_reconnect)]
    pub reconnect: Option<Duration>,
}

impl RemoteArgs {
    /// What the device factory needs to open a URI with `connections` connections.
    pub fn remote(&self, connections: usize) -> Remote {
        Remote {
            connections,
            timeout: self.timeout,
            reconnect: reconnect_setting(self.reconnect),
        }
    }
}
