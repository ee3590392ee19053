//! `serve --metrics` under a real Prometheus (Debian's `prometheus`, started here on
//! its own storage, scraping every second): the scrapes succeed, the query API
//! returns our series, and after a known workload — 64 MiB written through NBD, 32
//! MiB read through AoE — the counters say exactly that; a scrape during the load
//! never sees a counter go down. Needs root (AoE runs between two namespaces) and
//! `prometheus`.

use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_aoe::initiator::{AoeClient, AoeOptions, AoeUri};
use blockwire_blockdev::{Device, WriteFlags};
use blockwire_tests::aoe::{SHELF, SLOT};
use blockwire_tests::http::{get, query_encode, samples};
use blockwire_tests::netns::VethLab;
use blockwire_tests::{blockwire_bin, path_str, require, require_root, sparse_file, Served, MIB};

/// Prometheus's port inside the target namespace, whose loopback is ours alone.
const PROMETHEUS: &str = "127.0.0.1:9090";

/// A Prometheus process, killed (by its PID) when dropped.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts Prometheus in `ns`, storing into `dir`, scraping `target` every second.
fn start_prometheus(lab: &VethLab, ns: &str, dir: &Path, target: &str) -> Prometheus {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
             scrape_configs:\n  - job_name: blockwire\n    static_configs:\n      \
             - targets: ['{target}']\n"
        ),
    )
    .unwrap();
    let child = lab
        .command_in(ns, "prometheus")
        .arg(format!("--config.file={}", path_str(&config)))
        .arg(format!(
            "--storage.tsdb.path={}",
            path_str(&dir.join("data"))
        ))
        .arg(format!("--web.listen-address={PROMETHEUS}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start prometheus");
    Prometheus(child)
}

/// The value of an instant query that returns one series, if it does yet.
fn query_one(query: &str) -> Option<f64> {
    let (status, body) = get(
        PROMETHEUS,
        &format!("/api/v1/query?query={}", query_encode(query)),
    )
    .ok()?;
    if status != 200 {
        return None;
    }
    let json: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = json["data"]["result"].as_array()?;
    if result.len() != 1 {
        return None;
    }
    result[0]["value"][1].as_str()?.parse().ok()
}

/// Waits until Prometheus's answer to `query` is `expected` (it scrapes every
/// second), failing with the last answer after 20 s.
fn wait_for(query: &str, expected: f64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    while Instant::now() < deadline {
        last = query_one(query);
        if last == Some(expected) {
            return;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("Prometheus answers {query} with {last:?}, not {expected}");
}

/// The series of our endpoint's exposition.
fn scrape(addr: &str) -> Vec<(String, f64)> {
    let (status, body) = get(addr, "/metrics").expect("scrape the endpoint");
    assert_eq!(status, 200, "{body}");
    samples(&body)
}

fn value(samples: &[(String, f64)], series: &str) -> Option<f64> {
    samples.iter().find(|(s, _)| s == series).map(|&(_, v)| v)
}

/// Every counter of `before` (totals, histogram buckets, counts and sums) is at
/// least as large in `after`.
fn assert_monotonic(before: &[(String, f64)], after: &[(String, f64)]) {
    let mut compared = 0;
    for (series, old) in before {
        let name = series.split('{').next().unwrap();
        let counter = ["_total", "_bucket", "_count", "_sum"]
            .iter()
            .any(|suffix| name.ends_with(suffix));
        if !counter {
            continue;
        }
        let new = value(after, series).unwrap_or_else(|| panic!("{series} vanished"));
        assert!(new >= *old, "{series} went down from {old} to {new}");
        compared += 1;
    }
    assert!(compared > 10, "only {compared} counters to compare");
}

#[test]
fn prometheus_scrapes_exact_counts_of_nbd_writes_and_aoe_reads() {
    require_root!();
    require!("prometheus");
    let dir = tempfile::tempdir().unwrap();
    let file = sparse_file(dir.path(), "disk.img", 64 * MIB);
    let socket = dir.path().join("nbd.sock");
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nsocket = [\"{}\"]\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n\
             [[export]]\nname = \"disk\"\npath = \"{}\"\n\
             aoe = {{ interfaces = [\"eth0\"], shelf = {SHELF}, slot = {SLOT} }}\n",
            path_str(&socket),
            path_str(&file)
        ),
    )
    .unwrap();
    let tag = format!("pm{}", std::process::id() % 100000);
    let lab = VethLab::new(&tag, 1, 1500).unwrap();
    let mut command = lab.command_in(lab.target_ns(), blockwire_bin());
    command.arg("serve").arg("--config").arg(&config);
    let served = Served::spawn_ready(command, "disk");
    let endpoint = served.metrics.clone().expect("serve announces its metrics");
    let _prometheus = start_prometheus(&lab, lab.target_ns(), dir.path(), &endpoint);

    // Prometheus reaches the endpoint and reads it without error.
    lab.run_in(lab.target_ns(), || {
        wait_for("up{job=\"blockwire\"}", 1.0);
        wait_for("blockwire_build_info{version=\"0.1.0\"}", 1.0);
        let (_, targets) = get(PROMETHEUS, "/api/v1/targets").unwrap();
        let targets: serde_json::Value = serde_json::from_str(&targets).unwrap();
        let target = &targets["data"]["activeTargets"][0];
        assert_eq!(target["health"], "up", "{target}");
        assert_eq!(target["lastError"], "", "{target}");
    });

    // 64 MiB written through NBD, in 1 MiB requests; a scrape half-way through.
    let nbd_uri = format!("nbd+unix:///disk?socket={}", path_str(&socket));
    let nbd = blockwire_nbd::client::NbdClient::connect(
        &nbd_uri.parse().unwrap(),
        blockwire_nbd::client::ClientOptions::default(),
    )
    .expect("connect over NBD");
    let nbd = Device::new(Arc::new(nbd));
    let chunk: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();
    let mut during = Vec::new();
    for i in 0..64 {
        nbd.write(&chunk, i * MIB, WriteFlags::NONE).unwrap();
        if i == 32 {
            during = lab.run_in(lab.target_ns(), || scrape(&endpoint));
        }
    }
    let opened = lab.run_in(lab.target_ns(), || scrape(&endpoint));
    assert_monotonic(&during, &opened);
    assert_eq!(
        value(
            &opened,
            "blockwire_connections_open{export=\"disk\",protocol=\"nbd\"}"
        ),
        Some(1.0)
    );
    drop(nbd);

    // 32 MiB read through AoE, from the other namespace.
    let uri: AoeUri = format!("aoe://eth0/e{SHELF}.{SLOT}").parse().unwrap();
    let aoe = lab.run_in(lab.initiator_ns(), || {
        AoeClient::open(&uri, AoeOptions::default()).expect("open the AoE export")
    });
    let client = Arc::new(aoe);
    let frame_bytes = u64::from(client.sectors_per_frame()) * 512;
    let aoe = Device::new(client.clone());
    let mut back = vec![0u8; MIB as usize];
    for i in 0..32 {
        aoe.read(&mut back, i * MIB).unwrap();
        assert!(back == chunk, "AoE reads back what NBD wrote at {i} MiB");
    }
    drop(aoe);
    // A frame the initiator sent again (its answer late on a busy machine) is read
    // again by the target and counted again: the count is exact only without them.
    let retransmits = client.stats().retransmits;
    drop(client);

    let after = lab.run_in(lab.target_ns(), || scrape(&endpoint));
    assert_monotonic(&opened, &after);
    lab.run_in(lab.target_ns(), || {
        wait_for(
            "blockwire_written_bytes_total{export=\"disk\",protocol=\"nbd\"}",
            (64 * MIB) as f64,
        );
        let aoe_read = "blockwire_read_bytes_total{export=\"disk\",protocol=\"aoe\"}";
        if retransmits == 0 {
            wait_for(aoe_read, (32 * MIB) as f64);
        } else {
            eprintln!("the AoE initiator retransmitted {retransmits} frames");
            let most = 32 * MIB + retransmits * frame_bytes;
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let read = query_one(aoe_read).unwrap_or(0.0);
                if read >= (32 * MIB) as f64 && read <= most as f64 {
                    break;
                }
                assert!(Instant::now() < deadline, "{aoe_read} is {read}");
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        wait_for(
            "blockwire_requests_total{export=\"disk\",protocol=\"nbd\",operation=\"write\"}",
            64.0,
        );
        wait_for(
            "blockwire_read_bytes_total{export=\"disk\",protocol=\"nbd\"}",
            0.0,
        );
        wait_for(
            "blockwire_written_bytes_total{export=\"disk\",protocol=\"aoe\"}",
            0.0,
        );
        wait_for(
            "blockwire_connections_accepted_total{export=\"disk\",protocol=\"nbd\"}",
            1.0,
        );
        wait_for(
            "blockwire_connections_open{export=\"disk\",protocol=\"nbd\"}",
            0.0,
        );
        wait_for(
            "blockwire_requests_in_flight{export=\"disk\",protocol=\"aoe\"}",
            0.0,
        );
        wait_for(
            "sum(blockwire_request_duration_seconds_count{export=\"disk\",protocol=\"nbd\",operation=\"write\"})",
            64.0,
        );
        assert!(query_one("process_resident_memory_bytes").unwrap() > 0.0);
        assert!(query_one("process_open_fds").unwrap() > 0.0);
        assert!(query_one("process_threads").unwrap() > 1.0);
        assert!(query_one("blockwire_uptime_seconds_total").unwrap() > 0.0);
    });
    assert_eq!(served.terminate(), Some(0));
}

/// Waits until the endpoint's `series` is `expected`, failing after 10 s.
fn wait_series(endpoint: &str, series: &str, expected: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = value(&scrape(endpoint), series);
        if now == Some(expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{series} is {now:?}, not {expected}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn iscsi_sessions_and_refused_nbd_connections_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        "[server]\nlisten = [\"127.0.0.1:0\"]\nmax_connections = 1\n\n\
         [iscsi]\nlisten = [\"127.0.0.1:0\"]\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n\
         [[export]]\nname = \"disk\"\nmemory = \"16M\"\niscsi = true\n",
    )
    .unwrap();
    let served = Served::start_config_ready(&config, "disk");
    let endpoint = served.metrics.clone().expect("serve announces its metrics");
    let iscsi = |series: &str| format!("{series}{{export=\"disk\",protocol=\"iscsi\"}}");
    // Served over iSCSI, with no session yet: the series are there, at zero.
    wait_series(&endpoint, &iscsi("blockwire_connections_open"), 0.0);

    let uri: blockwire_iscsi::initiator::IscsiUri = served.iscsi_url().parse().unwrap();
    let client =
        blockwire_iscsi::initiator::IscsiClient::connect(&uri, Default::default()).expect("log in");
    let device = Device::new(Arc::new(client));
    device
        .write(&vec![7u8; MIB as usize], 0, WriteFlags::NONE)
        .unwrap();
    wait_series(&endpoint, &iscsi("blockwire_connections_open"), 1.0);
    wait_series(
        &endpoint,
        &iscsi("blockwire_written_bytes_total"),
        MIB as f64,
    );
    drop(device);
    wait_series(&endpoint, &iscsi("blockwire_connections_open"), 0.0);
    wait_series(
        &endpoint,
        &iscsi("blockwire_connections_accepted_total"),
        1.0,
    );

    // One NBD connection held in its handshake; the next is over max_connections.
    let _first = std::net::TcpStream::connect(("127.0.0.1", served.port)).unwrap();
    let _second = std::net::TcpStream::connect(("127.0.0.1", served.port)).unwrap();
    wait_series(
        &endpoint,
        "blockwire_connections_refused_total{protocol=\"nbd\",limit=\"max_connections\"}",
        1.0,
    );
}
