//! Bare TCP throughput to the target host, the baseline seed 002 measured first: the
//! slower of link and disk bounds what any protocol can reach. Measured both ways,
//! because storage writes travel to the target ("send") and reads come back from it
//! ("receive"), and the two directions of a link need not be equal.
//!
//! In order of preference: blockwire's own client against a `blockwire netserve` on
//! the target host ([`crate::netperf`]; the given `--netserve-port`, else the default
//! port if a server answers there), else `iperf3 -c` against an `iperf3 -s` the user
//! runs there (`--iperf-port`, else iperf3's own default port when iperf3 is
//! installed here), else a note saying what to run.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::child;
use crate::meter::MB;
use crate::netperf::{self, ClientConfig, Direction, Measurement};
use crate::results::{Latency, PhaseResult};

pub const NAME: &str = "network";
/// The phase of data flowing to the target host (what writes need).
pub const SEND: &str = "send";
/// The phase of data flowing from the target host (what reads need).
pub const RECEIVE: &str = "receive";

/// Where and how to measure the network.
#[derive(Debug, Clone)]
pub struct NetworkRequest {
    /// The target's host name or address (empty for a local socket: nothing to do).
    pub host: String,
    /// Port of a `blockwire netserve` on the host. Without it (and without
    /// `iperf_port`), [`netperf::DEFAULT_PORT`] is tried: refused or silent within
    /// the connect timeout means no server.
    pub netserve_port: Option<u16>,
    /// Port of an `iperf3 -s` on the host.
    pub iperf_port: Option<u16>,
    /// How long each direction runs.
    pub time: Duration,
    /// Parallel TCP streams per direction.
    pub streams: u32,
}

/// Measures both directions with the first tool that works; returns the phases
/// measured (none when skipped) and tells `note` what was used or why not.
pub fn measure(request: &NetworkRequest, note: &mut dyn FnMut(&str)) -> Vec<PhaseResult> {
    let host = &request.host;
    if host.is_empty() {
        note("network: skipped (the target is a local socket)");
        return Vec::new();
    }
    let port = request.netserve_port.or(request
        .iperf_port
        .is_none()
        .then_some(netperf::DEFAULT_PORT));
    if let Some(port) = port {
        match measure_netserve(host, port, request, note) {
            Ok(results) => {
                note(&format!(
                    "network: measured with blockwire netserve at {host}:{port}"
                ));
                return results;
            }
            // Nothing on the default port: not worth a word, the note below says
            // what to run.
            Err(e) if request.netserve_port.is_none() && e.no_server() => {}
            Err(e) => note(&format!("network: blockwire netserve: {e}")),
        }
    }
    if let Some(port) = request.iperf_port {
        return match measure_iperf3(host, port, request, note) {
            Ok(results) => results,
            Err(why) => {
                note(&format!("network: skipped ({why})"));
                Vec::new()
            }
        };
    }
    // iperf3 not installed here, or nothing at its default port: not worth a word,
    // the note below says what to run.
    if let Ok(results) = measure_iperf3(host, IPERF3_DEFAULT_PORT, request, note) {
        return results;
    }
    note(&format!(
        "network: skipped (run `blockwire netserve --listen 0.0.0.0:{}` on {host}, \
         or give --netserve-port; or run `iperf3 -s` there and give --iperf-port)",
        netperf::DEFAULT_PORT
    ));
    Vec::new()
}

/// Both directions with our own client; a direction that fails after the other
/// worked is noted and left out.
fn measure_netserve(
    host: &str,
    port: u16,
    request: &NetworkRequest,
    note: &mut dyn FnMut(&str),
) -> Result<Vec<PhaseResult>, netperf::ClientError> {
    let config = ClientConfig {
        streams: request.streams,
        duration: request.time,
        ..ClientConfig::default()
    };
    let mut results = Vec::new();
    for direction in [Direction::ClientSends, Direction::ClientReceives] {
        match netperf::measure(host, port, direction, &config) {
            Ok(measurement) => results.push(phase_of(&measurement)),
            Err(e) if results.is_empty() => return Err(e),
            Err(e) => note(&format!("network: {}: {e}", op_of(direction))),
        }
    }
    Ok(results)
}

fn op_of(direction: Direction) -> &'static str {
    match direction {
        Direction::ClientSends => SEND,
        Direction::ClientReceives => RECEIVE,
    }
}

/// A netperf measurement as a phase of the run.
pub fn phase_of(m: &Measurement) -> PhaseResult {
    let mb_per_s = m.mb_per_s();
    PhaseResult {
        workload: NAME.into(),
        op: op_of(m.direction).into(),
        block_size: m.buffer_size.into(),
        queue_depth: m.streams,
        bytes: m.bytes,
        ops: 0,
        seconds: m.seconds,
        mb_per_s,
        iops: 0.0,
        latency_us: Latency::default(),
        latency_histogram: Vec::new(),
        cpu_percent: m.cpu_percent,
        target_cpu_percent: m.server_cpu_percent,
        mb_per_s_per_cpu_percent: (m.cpu_percent > 0.0 && m.bytes > 0)
            .then(|| mb_per_s / m.cpu_percent),
    }
}

/// The port `iperf3 -s` listens on unless told otherwise.
pub const IPERF3_DEFAULT_PORT: u16 = 5201;

/// The write size given to iperf3 (`-l 1M`).
const IPERF3_WRITE_SIZE: u64 = 1 << 20;

/// Both directions with `iperf3 -c` (and `-R` for receive).
fn measure_iperf3(
    host: &str,
    port: u16,
    request: &NetworkRequest,
    note: &mut dyn FnMut(&str),
) -> Result<Vec<PhaseResult>, String> {
    let seconds = request.time.as_secs().max(1).to_string();
    let streams = request.streams.max(1).to_string();
    let mut results = Vec::new();
    for (op, reverse) in [(SEND, false), (RECEIVE, true)] {
        let mut command = Command::new("iperf3");
        command.args(["-c", host, "-p", &port.to_string(), "-t", &seconds]);
        // A host that drops the connection attempt fails in seconds, not minutes.
        command.args(["--connect-timeout", "2000"]);
        // The same 1 MiB writes as our own client, so that the two tools' figures
        // compare (iperf3's default is 128 KiB).
        command.args(["-P", &streams, "-l", "1M", "-J"]);
        if reverse {
            command.arg("-R");
        }
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        // An owned child: an interrupted bench takes its iperf3 with it.
        let output = child::Owned::spawn(&mut command).and_then(child::Owned::wait_with_output);
        let outcome = match output {
            Ok(output) => parse_iperf3(&String::from_utf8_lossy(&output.stdout), op)
                .map(|mut result| {
                    result.block_size = IPERF3_WRITE_SIZE;
                    result.queue_depth = request.streams.max(1);
                    result
                })
                .map_err(|why| format!("iperf3 to {host}:{port}: {why}")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err("iperf3 is not installed".to_string())
            }
            Err(e) => Err(format!("iperf3: {e}")),
        };
        match outcome {
            Ok(result) => results.push(result),
            Err(why) if results.is_empty() => return Err(why),
            Err(why) => note(&format!("network: {op}: {why}")),
        }
    }
    note(&format!("network: measured with iperf3 at {host}:{port}"));
    Ok(results)
}

/// Turns iperf3's `-J` report into a phase result named `op`: the receiving side's
/// throughput, this host's CPU use and the server's as iperf3 measured them.
pub fn parse_iperf3(json: &str, op: &str) -> Result<PhaseResult, String> {
    let report: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("unreadable report: {e}"))?;
    if let Some(error) = report.get("error").and_then(|e| e.as_str()) {
        return Err(error.to_string());
    }
    let end = &report["end"];
    let sum = if end["sum_received"].is_object() {
        &end["sum_received"]
    } else {
        &end["sum_sent"]
    };
    let bits_per_second = sum["bits_per_second"]
        .as_f64()
        .ok_or("no throughput in the report")?;
    let bytes = sum["bytes"].as_f64().unwrap_or(0.0) as u64;
    let seconds = sum["seconds"].as_f64().unwrap_or(0.0);
    let cpu_percent = end["cpu_utilization_percent"]["host_total"]
        .as_f64()
        .unwrap_or(0.0);
    let target_cpu_percent = end["cpu_utilization_percent"]["remote_total"].as_f64();
    let mb_per_s = bits_per_second / 8.0 / MB;
    Ok(PhaseResult {
        workload: NAME.into(),
        op: op.into(),
        block_size: 0,
        queue_depth: 1,
        bytes,
        ops: 0,
        seconds,
        mb_per_s,
        iops: 0.0,
        latency_us: Latency::default(),
        latency_histogram: Vec::new(),
        cpu_percent,
        target_cpu_percent,
        mb_per_s_per_cpu_percent: (cpu_percent > 0.0).then(|| mb_per_s / cpu_percent),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netperf::{NetServer, ServerConfig};
    use crate::workloads::test_support::closed_port;

    fn request(netserve_port: Option<u16>, iperf_port: Option<u16>) -> NetworkRequest {
        NetworkRequest {
            host: "127.0.0.1".into(),
            netserve_port,
            iperf_port,
            time: Duration::from_millis(300),
            streams: 1,
        }
    }

    #[test]
    fn reads_iperf3_json() {
        let json = r#"{"start":{},"end":{
            "sum_sent":{"seconds":10.0,"bytes":11740000000,"bits_per_second":9392000000.0},
            "sum_received":{"seconds":10.0,"bytes":11737500000,"bits_per_second":9390000000.0},
            "cpu_utilization_percent":{"host_total":12.5,"remote_total":30.0}}}"#;
        let result = parse_iperf3(json, RECEIVE).unwrap();
        assert!((result.mb_per_s - 1173.75).abs() < 0.01);
        assert_eq!(result.op, RECEIVE);
        assert_eq!(result.cpu_percent, 12.5);
        assert_eq!(result.target_cpu_percent, Some(30.0));
        assert_eq!(result.bytes, 11_737_500_000);
    }

    #[test]
    fn iperf3_errors_and_missing_servers_skip_with_what_to_run() {
        let err = parse_iperf3(r#"{"error":"unable to connect to server"}"#, SEND).unwrap_err();
        assert!(err.contains("unable to connect"));
        assert!(parse_iperf3("not json", SEND).is_err());

        let _port = crate::workloads::test_support::iperf3_default_port();
        let mut notes = Vec::new();
        let results = measure(&request(Some(closed_port()), None), &mut |n| {
            notes.push(n.to_string())
        });
        assert!(results.is_empty());
        assert!(notes[0].contains("cannot connect"), "{notes:?}");
        let last = notes.last().unwrap();
        assert!(
            last.contains("blockwire netserve") && last.contains("--iperf-port"),
            "{notes:?}"
        );

        let mut notes = Vec::new();
        let local = NetworkRequest {
            host: String::new(),
            ..request(None, None)
        };
        assert!(measure(&local, &mut |n| notes.push(n.to_string())).is_empty());
        assert!(notes[0].contains("local socket"));
    }

    #[test]
    fn our_server_gives_both_directions_with_the_targets_cpu() {
        let server = NetServer::bind("127.0.0.1:0", ServerConfig::default())
            .unwrap()
            .spawn()
            .unwrap();
        let mut notes = Vec::new();
        let results = measure(&request(Some(server.addr.port()), None), &mut |n| {
            notes.push(n.to_string())
        });
        let ops: Vec<&str> = results.iter().map(|r| r.op.as_str()).collect();
        assert_eq!(ops, [SEND, RECEIVE], "{notes:?}");
        for r in &results {
            assert_eq!(r.workload, NAME);
            assert!(r.bytes > 0 && r.mb_per_s > 0.0 && r.seconds > 0.0, "{r:?}");
            assert_eq!(r.block_size, 1 << 20);
            assert!(r.target_cpu_percent.is_some(), "{r:?}");
            assert!(r.mb_per_s_per_cpu_percent.is_some(), "{r:?}");
        }
        assert!(notes.iter().any(|n| n.contains("netserve at 127.0.0.1")));
        server.stop().unwrap();
    }
}
