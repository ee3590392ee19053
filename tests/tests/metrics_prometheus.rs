//! `serve --metrics` under a real Prometheus (Debian's `prometheus`, started here on
//! its own storage, scraping every second): the scrapes succeed, the query API
//! returns our series, and after a known workload — 64 MiB written through NBD, 32
//! MiB read through AoE — the counters say exactly that; a scrape during the load
//! never sees a counter go down; every latency histogram is cumulative once (its
//! `+Inf` bucket is its `_count`), and the median Prometheus computes from it lies
//! among the latencies the client measured. Needs root (AoE runs between two
//! namespaces) and `prometheus`.

use std::collections::HashMap;
use std::io::Read;
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

/// The upper bounds of the latency buckets (`LATENCY_BOUNDS` of the metrics code).
const BOUNDS: [f64; 19] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The lower edge of the bucket holding `seconds`.
fn bucket_floor(seconds: f64) -> f64 {
    BOUNDS
        .iter()
        .copied()
        .take_while(|&bound| bound < seconds)
        .last()
        .unwrap_or(0.0)
}

/// The upper edge of the bucket holding `seconds`.
fn bucket_ceil(seconds: f64) -> f64 {
    BOUNDS
        .iter()
        .copied()
        .find(|&bound| bound >= seconds)
        .unwrap_or(f64::INFINITY)
}

/// Issue 31: every histogram of the exposition is cumulative once — its buckets
/// never fall and its `+Inf` bucket equals its `_count` (buckets were cumulated
/// twice: after 288 writes, `+Inf` said 5176). Returns the histograms checked.
fn assert_histograms_consistent(samples: &[(String, f64)]) -> usize {
    // Series (labels without `le`) -> buckets in exposition order.
    let mut buckets: HashMap<String, Vec<(String, f64)>> = HashMap::new();
    for (series, value) in samples {
        let Some((name, labels)) = series.split_once("_bucket{") else {
            continue;
        };
        // Our label values hold no commas.
        let (le, others): (Vec<&str>, Vec<&str>) = labels
            .trim_end_matches('}')
            .split(',')
            .partition(|label| label.starts_with("le="));
        let le = le
            .first()
            .unwrap_or_else(|| panic!("no le in {series}"))
            .trim_start_matches("le=");
        let labels = others.join(",");
        buckets
            .entry(format!("{name}_count{{{labels}}}"))
            .or_default()
            .push((le.trim_matches('"').to_string(), *value));
    }
    for (count_series, buckets) in &buckets {
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "the buckets of {count_series} fall: {buckets:?}"
        );
        let (le, inf) = buckets.last().unwrap();
        assert_eq!(le, "+Inf", "the last bucket of {count_series}");
        let count =
            value(samples, count_series).unwrap_or_else(|| panic!("{count_series} is missing"));
        assert_eq!(
            *inf, count,
            "le=\"+Inf\" of {count_series} is not its count: {buckets:?}"
        );
    }
    buckets.len()
}

/// The per-request delay of the `slow` export (`disk_latency`, in ms): it makes the
/// target's latency of a request most of the client's, so the two can be compared.
const SLOW_DELAY_MS: u64 = 3;

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
             aoe = {{ interfaces = [\"eth0\"], shelf = {SHELF}, slot = {SLOT} }}\n\n\
             [[export]]\nname = \"slow\"\nmemory = \"16M\"\ndisk_latency = {SLOW_DELAY_MS}\n",
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
    let nbd = blockwire_nbd::initiator::NbdClient::connect(
        &nbd_uri.parse().unwrap(),
        blockwire_nbd::initiator::ClientOptions::default(),
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

    // 64 writes of 64 KiB to the slow export, each timed by the client.
    let slow_uri = format!("nbd+unix:///slow?socket={}", path_str(&socket));
    let slow = blockwire_nbd::initiator::NbdClient::connect(
        &slow_uri.parse().unwrap(),
        blockwire_nbd::initiator::ClientOptions::default(),
    )
    .expect("connect to the slow export");
    let slow = Device::new(Arc::new(slow));
    let mut latencies = Vec::new();
    for i in 0..64u64 {
        let started = Instant::now();
        slow.write(&chunk[..64 << 10], i << 16, WriteFlags::NONE)
            .unwrap();
        latencies.push(started.elapsed().as_secs_f64());
    }
    drop(slow);
    let fastest = latencies.iter().copied().fold(f64::INFINITY, f64::min);
    let slowest = latencies.iter().copied().fold(0.0, f64::max);

    let after = lab.run_in(lab.target_ns(), || scrape(&endpoint));
    assert_monotonic(&opened, &after);
    assert!(
        assert_histograms_consistent(&after) >= 3,
        "the NBD writes, the slow writes and the AoE reads each have a histogram"
    );
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
        // The slow writes as Prometheus sees them: their +Inf bucket is their count,
        // and the median it estimates lies among what the client measured. The
        // target's latency of a request is part of the client's and at least the
        // delay, so it lies between the lower edge of the bucket of the smaller of
        // the delay and the fastest write, and the upper edge of the slowest's.
        let slow_writes = "{export=\"slow\",protocol=\"nbd\",operation=\"write\"}";
        wait_for(
            &format!("blockwire_request_duration_seconds_count{slow_writes}"),
            64.0,
        );
        wait_for(
            &format!(
                "blockwire_request_duration_seconds_bucket{}",
                slow_writes.replace('}', ",le=\"+Inf\"}")
            ),
            64.0,
        );
        let median = query_one(&format!(
            "histogram_quantile(0.5, sum by (le) \
             (blockwire_request_duration_seconds_bucket{slow_writes}))"
        ))
        .expect("a median of the slow writes");
        eprintln!("slow writes: the client measured {fastest}..{slowest} s, the median is {median} s");
        let delay = SLOW_DELAY_MS as f64 / 1000.0;
        let (low, high) = (bucket_floor(fastest.min(delay)), bucket_ceil(slowest));
        assert!(
            low <= median && median <= high,
            "median {median} s is not within [{low}, {high}] s; the client measured \
             {fastest}..{slowest} s"
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

    // One NBD connection held in its handshake: the next one is over
    // max_connections, and closes it to take its place (issue 31).
    let mut first = std::net::TcpStream::connect(("127.0.0.1", served.port)).unwrap();
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut greeting = [0u8; 18];
    first.read_exact(&mut greeting).expect("a greeting");
    let second = std::net::TcpStream::connect(("127.0.0.1", served.port)).unwrap();
    let mut rest = Vec::new();
    let _ = first.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the unfinished handshake was closed");
    wait_series(
        &endpoint,
        "blockwire_connections_refused_total{protocol=\"nbd\",limit=\"max_connections_evicted\"}",
        1.0,
    );
    drop((first, second));

    // A client in transmission is never closed to make room: the next is refused.
    let nbd = loop {
        // The one closed above may still hold its slot for a moment.
        match blockwire_nbd::initiator::NbdClient::connect(
            &served.uri().parse().unwrap(),
            blockwire_nbd::initiator::ClientOptions::default(),
        ) {
            Ok(client) => break client,
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let refused = "blockwire_connections_refused_total{protocol=\"nbd\",limit=\"max_connections\"}";
    let refused_before = value(&scrape(&endpoint), refused).unwrap_or(0.0);
    let mut third = std::net::TcpStream::connect(("127.0.0.1", served.port)).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut nothing = Vec::new();
    let _ = third.read_to_end(&mut nothing);
    assert!(
        nothing.is_empty(),
        "a connection over max_connections was greeted"
    );
    wait_series(&endpoint, refused, refused_before + 1.0);
    drop(nbd);
}
