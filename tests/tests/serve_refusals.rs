//! A refused start, as an operator meets it: `check-config` and `serve` refuse the
//! same files with the same line, a start that fails leaves nothing behind and
//! prints nothing that looks like success, and each mistake is one line naming
//! its place.

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use blockwire_tests::{blockwire_bin, path_str, run_bounded, text};

/// What a command printed, and whether it succeeded.
struct Said {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn blockwire(args: &[&str]) -> Said {
    let mut command = std::process::Command::new(blockwire_bin());
    command.args(args);
    let output = run_bounded(command, Duration::from_secs(20));
    Said {
        ok: output.status.success(),
        stdout: text(&output.stdout),
        stderr: text(&output.stderr),
    }
}

/// The error line of a refusal (the last line of stderr, `blockwire: ` dropped).
fn refusal(said: &Said) -> String {
    assert!(!said.ok, "expected a refusal; stdout:\n{}", said.stdout);
    let line = said.stderr.lines().last().unwrap_or_default();
    line.strip_prefix("blockwire: ").unwrap_or(line).to_string()
}

/// `serve --config` and `check-config` refuse `config` with the same line, and
/// serve announced nothing.
fn both_refuse(config: &Path) -> String {
    let checked = refusal(&blockwire(&["check-config", path_str(config)]));
    let served = blockwire(&["serve", "--config", path_str(config)]);
    assert_eq!(refusal(&served), checked, "serve and check-config differ");
    assert!(
        !served.stdout.contains("://"),
        "a refused start announced an address:\n{}",
        served.stdout
    );
    checked
}

#[test]
fn what_serve_refuses_check_config_refuses_in_the_same_words() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[[export]]\nname = \"a\"\nmemory = \"1M\"\niscsi = { iqn = \"iqn.2026-11.t:x\" }\n\
             [[export]]\nname = \"b\"\nmemory = \"1M\"\niscsi = { iqn = \"iqn.2026-11.t:x\" }\n",
            ":8: export 'b': iscsi: iSCSI target iqn.2026-11.t:x is already export 'a'",
        ),
        (
            "[[export]]\nname = \"a\"\nmemory = \"1M\"\naoe = { interfaces = [\"lo\"], shelf = 1, slot = 2 }\n\
             [[export]]\nname = \"b\"\nmemory = \"1M\"\naoe = { interfaces = [\"lo\"], shelf = 1, slot = 2 }\n",
            ":8: export 'b': aoe: e1.2 on lo is already export 'a'",
        ),
        (
            "[[export]]\nname = \"a\"\nmemory = \"1M\"\naoe = { interfaces = [\"lo\"], shelf = 65535, slot = 255 }\n",
            ":4: export 'a': aoe.shelf: 65535 is AoE's broadcast shelf",
        ),
        (
            "[iscsi]\nchap_user = \"u\"\nchap_secret_file = \"/nonexistent/blockwire-chap\"\n\
             [[export]]\nname = \"a\"\nmemory = \"1M\"\niscsi = true\n",
            ":3: [iscsi] chap_secret_file: cannot read /nonexistent/blockwire-chap",
        ),
        (
            "[server]\ntls_psk = \"/nonexistent/blockwire.psk\"\n[[export]]\nname = \"a\"\nmemory = \"1M\"\n",
            ":2: [server] tls_psk: cannot read /nonexistent/blockwire.psk",
        ),
        (
            "[metrics]\nlisten = \"127.0.0.1:10809\"\n[[export]]\nname = \"a\"\nmemory = \"1M\"\n",
            ":2: [metrics] listen: 127.0.0.1:10809 is also NBD's default",
        ),
        (
            "[server]\nlisten = \"127.0.0.1:10809\"\n[[export]]\nname = \"a\"\nmemory = \"10Q\"\n",
            ":5: export 'a': memory: '10Q' has an unknown suffix 'Q' (a number of bytes with an optional suffix K, M, G, T or P",
        ),
        (
            "[[export]]\nname = \"a\"\nmemory = \"1M\"\nreadonly = true\n",
            ":4: export 'a': unknown key 'readonly' (allowed: name, ",
        ),
        (
            "[server]\nmax_connections = \"many\"\n[[export]]\nname = \"a\"\nmemory = \"1M\"\n",
            ":2: [server] max_connections: invalid type: string \"many\", expected a whole number",
        ),
    ];
    for (index, (config, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("case{index}.toml"));
        std::fs::write(&path, config).unwrap();
        let said = both_refuse(&path);
        let expected = format!("{}{expected}", path.display());
        assert!(said.starts_with(&expected), "{said}\nexpected: {expected}…");
        assert!(!said.contains('`'), "{said}");
    }
}

#[test]
fn a_refused_start_creates_nothing_and_removes_what_it_made() {
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.img");
    let second = dir.path().join("missing.img");
    // The second export is bad: the first export's file is never created.
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n\
             [[export]]\nname = \"a\"\npath = \"{}\"\nsize = \"1M\"\n\
             [[export]]\nname = \"b\"\npath = \"{}\"\n",
            first.display(),
            second.display()
        ),
    )
    .unwrap();
    let said = refusal(&blockwire(&["serve", "--config", path_str(&config)]));
    assert!(said.contains("export 'b': path: "), "{said}");
    assert!(said.contains("set size = \"SIZE\""), "{said}");
    assert!(
        !first.exists(),
        "a refused start created {}",
        first.display()
    );

    // A busy port is found only when binding: the file made before is removed.
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let served = blockwire(&[
        "serve",
        path_str(&first),
        "--size",
        "1M",
        "--listen",
        &listen,
    ]);
    let said = refusal(&served);
    assert!(said.contains("another program listens there"), "{said}");
    assert!(!served.stdout.contains("nbd://"), "{}", served.stdout);
    assert!(!first.exists(), "a refused start left {}", first.display());
}

#[test]
fn flags_are_checked_by_the_same_rules_and_named_as_flags() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("x.img");
    let said = refusal(&blockwire(&["serve", path_str(&missing)]));
    assert!(
        said.ends_with("does not exist; give --size SIZE to create it as a sparse file"),
        "{said}"
    );
    let said = refusal(&blockwire(&[
        "serve", "--aoe", "lo", "--shelf", "65535", "--slot", "1",
    ]));
    assert!(
        said.starts_with("--shelf: 65535 is AoE's broadcast shelf (0-65534)"),
        "{said}"
    );
    let said = refusal(&blockwire(&[
        "serve",
        "--listen",
        "127.0.0.1:10809",
        "--metrics",
        "127.0.0.1:10809",
    ]));
    assert!(
        said.starts_with("--metrics: 127.0.0.1:10809 is also"),
        "{said}"
    );
}
