//! Bare TCP throughput to the target host, the baseline seed 002 measured first: the
//! slower of link and disk bounds what any protocol can reach. For now this drives
//! `iperf3 -c` against an `iperf3 -s` the user runs on the target host; without
//! iperf3 or a server port the phase is skipped with a note.

use std::process::Command;
use std::time::Duration;

use crate::meter::MB;
use crate::results::{Latency, PhaseResult};

pub const NAME: &str = "network";

/// Either a measurement or why there is none.
#[derive(Debug)]
pub enum Outcome {
    Measured(PhaseResult),
    Skipped(String),
}

/// Measures TCP throughput to `host` with iperf3 for `time`, if an iperf3 server
/// port was given and iperf3 is installed.
pub fn measure(host: &str, port: Option<u16>, time: Duration) -> Outcome {
    if host.is_empty() {
        return Outcome::Skipped("network: skipped (the target is a local socket)".into());
    }
    let Some(port) = port else {
        return Outcome::Skipped(format!(
            "network: skipped (run `iperf3 -s` on {host} and give --iperf-port)"
        ));
    };
    let seconds = time.as_secs().max(1).to_string();
    let output = Command::new("iperf3")
        .args(["-c", host, "-p", &port.to_string(), "-t", &seconds, "-J"])
        .output();
    let output = match output {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Outcome::Skipped("network: skipped (iperf3 is not installed)".into())
        }
        Err(e) => return Outcome::Skipped(format!("network: skipped (iperf3: {e})")),
    };
    match parse_iperf3(&String::from_utf8_lossy(&output.stdout)) {
        Ok(result) => Outcome::Measured(result),
        Err(why) => Outcome::Skipped(format!("network: skipped (iperf3 to {host}:{port}: {why})")),
    }
}

/// Turns iperf3's `-J` report into a phase result: received throughput, and the
/// sender's CPU use as iperf3 measured it.
pub fn parse_iperf3(json: &str) -> Result<PhaseResult, String> {
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
        op: "tcp".into(),
        block_size: 0,
        queue_depth: 1,
        bytes,
        ops: 0,
        seconds,
        mb_per_s,
        iops: 0.0,
        latency_us: Latency::default(),
        cpu_percent,
        target_cpu_percent,
        mb_per_s_per_cpu_percent: (cpu_percent > 0.0).then(|| mb_per_s / cpu_percent),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_iperf3_json() {
        let json = r#"{"start":{},"end":{
            "sum_sent":{"seconds":10.0,"bytes":11740000000,"bits_per_second":9392000000.0},
            "sum_received":{"seconds":10.0,"bytes":11737500000,"bits_per_second":9390000000.0},
            "cpu_utilization_percent":{"host_total":12.5,"remote_total":30.0}}}"#;
        let result = parse_iperf3(json).unwrap();
        assert!((result.mb_per_s - 1173.75).abs() < 0.01);
        assert_eq!(result.cpu_percent, 12.5);
        assert_eq!(result.target_cpu_percent, Some(30.0));
        assert_eq!(result.bytes, 11_737_500_000);
    }

    #[test]
    fn iperf3_errors_and_missing_ports_skip() {
        let err = parse_iperf3(r#"{"error":"unable to connect to server"}"#).unwrap_err();
        assert!(err.contains("unable to connect"));
        assert!(parse_iperf3("not json").is_err());
        match measure("localhost", None, Duration::from_secs(1)) {
            Outcome::Skipped(note) => assert!(note.contains("--iperf-port")),
            Outcome::Measured(_) => panic!("measured without a port"),
        }
    }
}
