//! NVMe/TCP through the command line (issue 33): `blockwire serve --nvme` and
//! `[nvme]` configs, read and written by our own initiator through `blockwire info`
//! and `blockwire copy` (`nvme+tcp://` URIs), discovery, one export over NBD, iSCSI
//! and NVMe/TCP at once, `check-config` refusals and a reload that adds a subsystem.
//! Every listener takes port 0; the ports come from the announcement.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use blockwire_tests::{blockwire_bin, path_str, patterned_file, sparse_file, text, MIB};

/// A `blockwire serve` with what it announced, stopped (SIGTERM) when dropped.
struct NvmeServed {
    child: Child,
    /// `nvme+tcp://127.0.0.1:PORT/NQN` lines, in order.
    subsystems: Vec<String>,
    /// `nvme+tcp://127.0.0.1:DPORT` of the discovery controller.
    discovery: Option<String>,
    /// `nbd://127.0.0.1:PORT/NAME` lines.
    nbd: Vec<String>,
    /// `HOST:PORT` of the metrics endpoint.
    metrics: Option<String>,
}

impl NvmeServed {
    /// Runs `blockwire serve ARGS...` until it says "press Ctrl-C to stop".
    fn start(args: &[&str]) -> NvmeServed {
        let mut child = Command::new(blockwire_bin())
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start blockwire serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let (send, announced) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("press Ctrl-C to stop") {
                    let _ = send.send(std::mem::take(&mut lines));
                }
                lines.push(line.trim().to_string());
            }
        });
        let lines: Vec<String> = match announced.recv_timeout(Duration::from_secs(20)) {
            Ok(lines) => lines,
            Err(e) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("blockwire serve {args:?} did not come up ({e}); exit status {status:?}");
            }
        };
        NvmeServed {
            child,
            subsystems: lines
                .iter()
                .filter(|l| l.starts_with("nvme+tcp://"))
                .cloned()
                .collect(),
            discovery: lines
                .iter()
                .find_map(|l| l.strip_prefix("nvme discovery: "))
                .map(str::to_string),
            nbd: lines
                .iter()
                .filter(|l| l.starts_with("nbd://"))
                .cloned()
                .collect(),
            metrics: lines.iter().find_map(|l| {
                l.strip_prefix("metrics: http://")
                    .and_then(|rest| rest.strip_suffix("/metrics"))
                    .map(str::to_string)
            }),
        }
    }

    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's PID.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// SIGTERM; the server must exit 0.
    fn stop(mut self) {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert_eq!(status.code(), Some(0), "blockwire serve exited {status}");
                return;
            }
            assert!(Instant::now() < deadline, "no exit within 20 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NvmeServed {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `blockwire ARGS...`: its stdout, or a panic with its stderr.
fn blockwire_ok(args: &[&str]) -> String {
    let output = Command::new(blockwire_bin())
        .args(args)
        .output()
        .expect("run blockwire");
    assert!(
        output.status.success(),
        "blockwire {args:?} failed: {}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// `blockwire ARGS...` that must fail: its stderr.
fn blockwire_err(args: &[&str]) -> String {
    let output = Command::new(blockwire_bin())
        .args(args)
        .output()
        .expect("run blockwire");
    assert!(
        !output.status.success(),
        "blockwire {args:?} succeeded: {}",
        text(&output.stdout)
    );
    text(&output.stderr)
}

fn assert_same_bytes(a: &Path, b: &Path, len: usize) {
    let (a, b) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert!(a.len() >= len && b.len() >= len);
    assert!(a[..len] == b[..len], "the bytes differ");
}

#[test]
fn serve_nvme_then_info_copy_and_discovery_through_our_initiator() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 4 * MIB);
    let served = NvmeServed::start(&[
        path_str(&disk),
        "--name",
        "disk",
        "--nvme",
        "127.0.0.1:0",
        "--nvme-discovery",
        "127.0.0.1:0",
    ]);
    assert!(served.nbd.is_empty(), "--nvme alone serves no NBD");
    assert_eq!(served.subsystems.len(), 1, "{:?}", served.subsystems);
    let uri = served.subsystems[0].clone();
    assert!(uri.ends_with("/nqn.2026-11.dev.blockwire:disk"), "{uri}");

    let info = blockwire_ok(&["info", &uri]);
    assert!(info.contains(&format!("size: {}", 4 * MIB)), "{info}");
    assert!(info.contains("block size: 512"), "{info}");

    // In and out again.
    let source = patterned_file(dir.path(), "source.img", (4 * MIB) as usize, 5);
    blockwire_ok(&["copy", "--quiet", path_str(&source), &uri]);
    let back = dir.path().join("back.img");
    blockwire_ok(&["copy", "--quiet", &uri, path_str(&back)]);
    assert_same_bytes(&source, &back, (4 * MIB) as usize);

    let discovery = served.discovery.clone().expect("a discovery announcement");
    let listed = blockwire_ok(&["info", &discovery]);
    assert!(listed.contains(&uri), "{listed}");

    served.stop();
    // The final flush put the bytes in the file.
    assert_same_bytes(&source, &disk, (4 * MIB) as usize);
}

#[test]
fn one_export_over_nbd_iscsi_and_nvme_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "shared.img", 8 * MIB);
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[iscsi]\nlisten = \"127.0.0.1:0\"\n\
             [nvme]\nlisten = \"127.0.0.1:0\"\ndiscovery = false\n\
             [[export]]\nname = \"shared\"\npath = \"{}\"\niscsi = true\nnvme = true\n",
            disk.display()
        ),
    )
    .unwrap();
    let served = NvmeServed::start(&["--config", path_str(&config)]);
    assert_eq!(served.nbd.len(), 1);
    assert!(served.discovery.is_none(), "discovery = false");
    let nvme = served.subsystems[0].clone();

    // NVMe/TCP writes, NBD reads, through our initiators.
    let source = patterned_file(dir.path(), "source.img", (8 * MIB) as usize, 11);
    blockwire_ok(&["copy", "--quiet", path_str(&source), &nvme]);
    let back = dir.path().join("back.img");
    blockwire_ok(&["copy", "--quiet", &served.nbd[0], path_str(&back)]);
    assert_same_bytes(&source, &back, (8 * MIB) as usize);
    served.stop();
}

#[test]
fn check_config_refuses_a_bad_or_shared_nqn_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "[[export]]\nname = \"a\"\nmemory = \"1M\"\nnvme = { nqn = \"iqn.2026-11.x:a\" }\n",
    )
    .unwrap();
    let error = blockwire_err(&["check-config", path_str(&config)]);
    let line = error.trim();
    assert!(!line.contains('\n'), "{error}");
    assert!(
        line.contains(&format!(
            "{}:4: export 'a': nvme.nqn: 'iqn.2026-11.x:a' is not an NQN",
            config.display()
        )),
        "{error}"
    );
    std::fs::write(
        &config,
        "[[export]]\nname = \"a\"\nmemory = \"1M\"\nnvme = { nqn = \"nqn.2026-11.x:t\" }\n\
         [[export]]\nname = \"b\"\nmemory = \"1M\"\nnvme = { nqn = \"nqn.2026-11.x:t\" }\n",
    )
    .unwrap();
    let error = blockwire_err(&["check-config", path_str(&config)]);
    assert!(
        error.trim().contains(&format!(
            "{}:8: export 'b': nvme: NVMe subsystem nqn.2026-11.x:t is already export 'a'",
            config.display()
        )),
        "{error}"
    );
    // The flags are checked by the same validation, naming the flag.
    let error = blockwire_err(&["serve", "--nvme", "127.0.0.1:0", "--nqn", "nqn.bad"]);
    assert!(error.contains("--nqn: 'nqn.bad' is not an NQN"), "{error}");
    // A good file lists its subsystems.
    std::fs::write(
        &config,
        "[nvme]\nlisten = \"127.0.0.1\"\n[[export]]\nname = \"a\"\nmemory = \"1M\"\nnvme = true\n",
    )
    .unwrap();
    let report = blockwire_ok(&["check-config", path_str(&config)]);
    assert!(
        report.contains("nvme+tcp://127.0.0.1:4420/nqn.2026-11.dev.blockwire:a"),
        "{report}"
    );
    assert!(
        report.contains("nvme discovery: nvme+tcp://127.0.0.1:8009"),
        "{report}"
    );
}

#[test]
fn a_reload_adds_a_second_exports_subsystem() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("serve.toml");
    let head = "[nvme]\nlisten = \"127.0.0.1:0\"\ndiscovery_listen = \"127.0.0.1:0\"\n\
                [[export]]\nname = \"a\"\nmemory = \"1M\"\nnbd = false\nnvme = true\n";
    std::fs::write(&config, head).unwrap();
    let served = NvmeServed::start(&["--config", path_str(&config)]);
    let discovery = served.discovery.clone().expect("a discovery announcement");
    let a = served.subsystems[0].clone();
    let port_prefix = &a[..a.rfind('/').unwrap()];
    let listed = blockwire_ok(&["info", &discovery]);
    assert!(listed.contains(&a) && !listed.contains(":b"), "{listed}");

    std::fs::write(
        &config,
        format!("{head}[[export]]\nname = \"b\"\nmemory = \"2M\"\nnbd = false\nnvme = true\n"),
    )
    .unwrap();
    served.signal(libc::SIGHUP);
    let b = format!("{port_prefix}/nqn.2026-11.dev.blockwire:b");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let listed = blockwire_ok(&["info", &discovery]);
        if listed.contains(&b) {
            assert!(listed.contains(&a), "{listed}");
            break;
        }
        assert!(Instant::now() < deadline, "b never listed: {listed}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let info = blockwire_ok(&["info", &b]);
    assert!(info.contains(&format!("size: {}", 2 * MIB)), "{info}");
    served.stop();
}

/// `serve FILE --nvme` on free ports, discovery included.
fn serve_nvme_file(disk: &Path, name: &str, extra: &[&str]) -> NvmeServed {
    let mut args = vec![
        path_str(disk),
        "--name",
        name,
        "--nvme",
        "127.0.0.1:0",
        "--nvme-discovery",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    NvmeServed::start(&args)
}

#[test]
fn nvme_namespaces_serve_again_as_a_gateway_and_stripe_with_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let (a_disk, b_disk) = (
        sparse_file(dir.path(), "a.img", 4 * MIB),
        sparse_file(dir.path(), "b.img", 4 * MIB),
    );
    let a = serve_nvme_file(&a_disk, "a", &["--metrics", "127.0.0.1:0"]);
    let b = serve_nvme_file(&b_disk, "b", &[]);
    let (a_uri, b_uri) = (a.subsystems[0].clone(), b.subsystems[0].clone());

    // A gateway: a's namespace served again over NBD.
    let gateway = NvmeServed::start(&[&a_uri, "--name", "gw", "--listen", "127.0.0.1:0"]);
    let source = patterned_file(dir.path(), "source.img", (4 * MIB) as usize, 3);
    blockwire_ok(&["copy", "--quiet", path_str(&source), &gateway.nbd[0]]);
    gateway.stop();
    let back = dir.path().join("back.img");
    blockwire_ok(&["copy", "--quiet", &a_uri, path_str(&back)]);
    assert_same_bytes(&source, &back, (4 * MIB) as usize);

    // Counted with protocol="nvme".
    let (status, body) =
        blockwire_tests::http::get(a.metrics.as_deref().expect("metrics announced"), "/metrics")
            .unwrap();
    assert_eq!(status, 200);
    let written = body.lines().find(|l| {
        l.starts_with("blockwire_written_bytes_total")
            && l.contains("export=\"a\"")
            && l.contains("protocol=\"nvme\"")
    });
    let written: f64 = written
        .unwrap_or_else(|| panic!("no nvme written bytes for a:\n{body}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(written >= (4 * MIB) as f64, "{written}");

    // A stripe over both namespaces.
    let stripe = format!("stripe:64K:{a_uri},{b_uri}");
    let double = patterned_file(dir.path(), "double.img", (8 * MIB) as usize, 4);
    blockwire_ok(&["copy", "--quiet", path_str(&double), &stripe, "--verify"]);
    let striped_back = dir.path().join("striped.img");
    blockwire_ok(&["copy", "--quiet", &stripe, path_str(&striped_back)]);
    assert_same_bytes(&double, &striped_back, (8 * MIB) as usize);
    a.stop();
    b.stop();
}

#[test]
fn a_busy_nvme_port_names_its_flag_and_starts_nothing() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = format!("127.0.0.1:{}", holder.local_addr().unwrap().port());
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", MIB);
    let output = Command::new(blockwire_bin())
        .args([
            "serve",
            path_str(&disk),
            "--listen",
            "127.0.0.1:0",
            "--nvme",
            &busy,
            "--nvme-discovery",
            "127.0.0.1:0",
        ])
        .output()
        .expect("run blockwire serve");
    assert_eq!(output.status.code(), Some(1));
    // Nothing was announced: the NBD listener bound first was closed again.
    assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    let error = text(&output.stderr);
    assert!(
        error.contains(&format!("cannot listen on {busy}")),
        "{error}"
    );
    assert!(
        error.contains("give NVMe/TCP another address with --nvme HOST:PORT, or [nvme] listen"),
        "{error}"
    );
}

#[test]
fn bench_measures_an_nvme_namespace_like_any_target() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "bench.img", 32 * MIB);
    let served = serve_nvme_file(&disk, "bench", &[]);
    let uri = served.subsystems[0].clone();
    let json = dir.path().join("bench.json");
    blockwire_ok(&[
        "bench",
        &uri,
        "--workload",
        "sequential,random",
        "--size",
        "16M",
        "--time",
        "0.2",
        "--random-depths",
        "1,4",
        "--json",
        path_str(&json),
    ]);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["results"].as_array().expect("results");
    for (workload, op) in [
        ("sequential", "write"),
        ("sequential", "read"),
        ("random", "randread"),
        ("random", "randwrite"),
    ] {
        assert!(
            rows.iter().any(|r| r["workload"] == workload
                && r["op"] == op
                && r["bytes"].as_u64().is_some_and(|b| b > 0)),
            "no {workload} {op} that moved data in {report}"
        );
    }
    served.stop();
}
