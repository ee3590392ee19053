//! NVMe/TCP through the command line (issue 33): `blockwire serve --nvme` and
//! `[nvme]` configs, read and written by our own initiator through `blockwire info`
//! and `blockwire copy` (`nvme+tcp://` URIs), discovery, one export over NBD, iSCSI
//! and NVMe/TCP at once, `check-config` refusals and a reload that adds a subsystem.
//! Every listener takes port 0; the ports come from the announcement.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use blockwire_tests::{blockwire_bin, path_str, patterned_file, sparse_file, text, Served, MIB};

/// SIGTERM; the server must exit 0 (its final flush done).
fn stop(served: Served) {
    assert_eq!(
        served.terminate(),
        Some(0),
        "blockwire serve did not exit 0"
    );
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
    let served = Served::start_nvme(&[path_str(&disk), "--name", "disk"], "disk");
    assert!(served.port == 0, "--nvme alone serves no NBD");
    assert_eq!(served.nvme.len(), 1, "{:?}", served.nvme);
    let uri = served.nvme[0].clone();
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

    let discovery = served
        .nvme_discovery
        .clone()
        .expect("a discovery announcement");
    let listed = blockwire_ok(&["info", &discovery]);
    assert!(listed.contains(&uri), "{listed}");

    stop(served);
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
    let served = Served::start_config_ready(&config, "shared");
    assert_ne!(served.port, 0, "NBD announced");
    assert!(served.nvme_discovery.is_none(), "discovery = false");
    let nvme = served.nvme[0].clone();

    // NVMe/TCP writes, NBD reads, through our initiators.
    let source = patterned_file(dir.path(), "source.img", (8 * MIB) as usize, 11);
    blockwire_ok(&["copy", "--quiet", path_str(&source), &nvme]);
    let back = dir.path().join("back.img");
    blockwire_ok(&["copy", "--quiet", &served.uri(), path_str(&back)]);
    assert_same_bytes(&source, &back, (8 * MIB) as usize);
    stop(served);
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
    let served = Served::start_config_ready(&config, "a");
    let discovery = served
        .nvme_discovery
        .clone()
        .expect("a discovery announcement");
    let a = served.nvme[0].clone();
    let port_prefix = &a[..a.rfind('/').unwrap()];
    let listed = blockwire_ok(&["info", &discovery]);
    assert!(listed.contains(&a) && !listed.contains(":b"), "{listed}");

    std::fs::write(
        &config,
        format!("{head}[[export]]\nname = \"b\"\nmemory = \"2M\"\nnbd = false\nnvme = true\n"),
    )
    .unwrap();
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(served.pid(), libc::SIGHUP) };
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
    stop(served);
}

/// `serve FILE --nvme` on free ports, discovery included.
fn serve_nvme_file(disk: &Path, name: &str, extra: &[&str]) -> Served {
    let mut args = vec![path_str(disk), "--name", name];
    args.extend_from_slice(extra);
    Served::start_nvme(&args, name)
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
    let (a_uri, b_uri) = (a.nvme[0].clone(), b.nvme[0].clone());

    // A gateway: a's namespace served again over NBD.
    let gateway = Served::start_ready(&[&a_uri, "--name", "gw", "--listen", "127.0.0.1:0"], "gw");
    let source = patterned_file(dir.path(), "source.img", (4 * MIB) as usize, 3);
    blockwire_ok(&["copy", "--quiet", path_str(&source), &gateway.uri()]);
    stop(gateway);
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
    stop(a);
    stop(b);
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

/// `serve --nvme disk.img`: --nvme's value is optional, but a file is not an
/// address; the error says how to write it, on NVMe/TCP's port, not NBD's.
#[test]
fn a_file_after_nvme_is_not_taken_for_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", MIB);
    let error = blockwire_err(&["serve", "--nvme", path_str(&disk)]);
    assert!(
        error.contains("is a file's path, not an address"),
        "{error}"
    );
    assert!(
        error.contains(&format!("blockwire serve {} --nvme", path_str(&disk))),
        "{error}"
    );
    assert!(
        error.contains("4420") && !error.contains("10809"),
        "{error}"
    );
    let bad = blockwire_err(&["serve", path_str(&disk), "--nvme", "not an address"]);
    assert!(
        bad.contains("is not HOST[:PORT]") && bad.contains("4420"),
        "{bad}"
    );
}

/// Two targets on one host: the second cannot have the first's discovery port
/// (hosts look for discovery on 8009, so it does not move elsewhere on its own);
/// it fails in one line naming the flags that choose another address or none,
/// and with --no-nvme-discovery it serves, discovery answered on its I/O port.
#[test]
fn a_second_target_on_a_taken_discovery_port_says_how_to_choose_another() {
    let dir = tempfile::tempdir().unwrap();
    let (a_disk, b_disk) = (
        sparse_file(dir.path(), "a.img", MIB),
        sparse_file(dir.path(), "b.img", MIB),
    );
    let first = serve_nvme_file(&a_disk, "a", &[]);
    let taken = first.nvme_discovery.clone().expect("a discovery address");
    let taken = taken
        .trim_start_matches("nvme+tcp://")
        .trim_end_matches('/');
    let output = Command::new(blockwire_bin())
        .args(["serve", path_str(&b_disk), "--name", "b"])
        .args(["--nvme", "127.0.0.1:0", "--nvme-discovery", taken])
        .output()
        .expect("run blockwire serve");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "{}", text(&output.stdout));
    let error = text(&output.stderr);
    assert_eq!(error.trim().lines().count(), 1, "{error}");
    assert!(error.contains(&format!("discovery on {taken}")), "{error}");
    assert!(error.contains("--nvme-discovery HOST:PORT"), "{error}");
    assert!(error.contains("--no-nvme-discovery"), "{error}");

    let second = Served::start_ready(
        &[
            path_str(&b_disk),
            "--name",
            "b",
            "--nvme",
            "127.0.0.1:0",
            "--no-nvme-discovery",
        ],
        "b",
    );
    assert_eq!(second.nvme.len(), 1, "{:?}", second.nvme);
    assert!(
        second.nvme_discovery.is_none(),
        "{:?}",
        second.nvme_discovery
    );
    let uri = second.nvme[0].clone();
    let info = blockwire_ok(&["info", &uri]);
    assert!(info.contains(&format!("size: {MIB}")), "{info}");
    // The I/O port answers discovery: its log lists the subsystem.
    let io_port = uri.rsplit_once('/').unwrap().0;
    let listed = blockwire_ok(&["info", io_port]);
    assert!(listed.contains(&uri), "{listed}");
    stop(second);
    stop(first);
}

#[test]
fn bench_measures_an_nvme_namespace_like_any_target() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "bench.img", 32 * MIB);
    let served = serve_nvme_file(&disk, "bench", &[]);
    let uri = served.nvme[0].clone();
    blockwire_tests::bench::quick_bench_moves_data(&uri, dir.path(), "0.2", "1,4");
    stop(served);
}
