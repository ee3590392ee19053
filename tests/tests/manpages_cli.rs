//! The manual pages, shell completions and `check-config` of the release binary:
//! every page renders under `man --warnings` with no warning, bash completes
//! subcommands and flags, and `check-config` says what would be served or gives the
//! first error with its line.

use std::process::Command;

use blockwire_tests::{assert_success, blockwire_bin, path_str, require, text};

/// `blockwire manpages DIR`: the paths it wrote, one a line.
fn write_pages(dir: &std::path::Path) -> String {
    let output = Command::new(blockwire_bin())
        .arg("manpages")
        .arg(dir)
        .output()
        .unwrap();
    assert_success(&output);
    text(&output.stdout)
}

#[test]
fn every_manual_page_renders_without_a_warning() {
    require!("man");
    let dir = tempfile::tempdir().unwrap();
    let pages = write_pages(dir.path());
    for name in [
        "blockwire.1",
        "blockwire-serve.1",
        "blockwire-check-config.1",
        "blockwire-completions.1",
        "blockwire.toml.5",
    ] {
        assert!(pages.contains(name), "{name} not written: {pages}");
    }
    for page in pages.lines() {
        let output = Command::new("man")
            .args(["--warnings", "-l", page])
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "0")
            .output()
            .unwrap();
        assert_success(&output);
        assert_eq!(text(&output.stderr), "", "{page} has warnings");
        assert!(output.stdout.len() > 200, "{page} renders almost nothing");
    }
    let serve = std::fs::read_to_string(dir.path().join("blockwire-serve.1")).unwrap();
    assert!(serve.contains("metrics"), "serve's page lists --metrics");
}

/// What bash completes after `source <(blockwire completions bash)` for `line`.
fn bash_completes(line: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    let script = format!(
        "source <('{bin}' completions bash)\n\
         COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT={point}\n\
         _blockwire blockwire '{current}' '{previous}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        bin = blockwire_bin().display(),
        words = words
            .iter()
            .map(|w| format!("'{w}'"))
            .collect::<Vec<_>>()
            .join(" "),
        cword = words.len() - 1,
        point = line.len(),
        current = words[words.len() - 1],
        previous = words[words.len() - 2],
    );
    let output = Command::new("bash").arg("-c").arg(script).output().unwrap();
    assert_success(&output);
    text(&output.stdout)
}

#[test]
fn bash_completes_subcommands_and_flags() {
    require!("bash");
    let subcommands = bash_completes("blockwire ");
    for name in ["serve", "check-config", "completions", "manpages", "bench"] {
        assert!(
            subcommands.lines().any(|l| l == name),
            "no {name}: {subcommands}"
        );
    }
    assert_eq!(bash_completes("blockwire check-c").trim(), "check-config");
    let flags = bash_completes("blockwire serve --met");
    assert_eq!(flags.trim(), "--metrics");
    let shells = bash_completes("blockwire completions ");
    assert!(shells.lines().any(|l| l == "zsh"), "{shells}");
}

#[test]
fn completions_for_zsh_and_fish_name_the_subcommands() {
    for shell in ["zsh", "fish"] {
        let output = Command::new(blockwire_bin())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_success(&output);
        assert!(text(&output.stdout).contains("check-config"), "{shell}");
    }
}

#[test]
fn check_config_shows_what_would_be_served_where() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ok.toml");
    let image = dir.path().join("missing.img");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = [\"127.0.0.1:10809\"]\n[metrics]\nlisten = \"127.0.0.1:9723\"\n\
             [[export]]\nname = \"disk\"\npath = \"{}\"\nsize = \"1G\"\niscsi = true\n",
            path_str(&image)
        ),
    )
    .unwrap();
    let output = Command::new(blockwire_bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    assert_success(&output);
    let report = text(&output.stdout);
    assert!(report.contains("valid"), "{report}");
    assert!(report.contains("nbd://127.0.0.1:10809/disk"), "{report}");
    assert!(
        report.contains("iscsi://127.0.0.1:3260/iqn.2026-11.dev.blockwire:disk/0"),
        "{report}"
    );
    assert!(report.contains("would be created"), "{report}");
    assert!(
        report.contains("metrics: http://127.0.0.1:9723/metrics"),
        "{report}"
    );
    assert!(!image.exists(), "check-config created the file");
}

#[test]
fn check_config_gives_the_first_error_and_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(
        &config,
        "[[export]]\nname = \"a\"\nmemory = \"1G\"\n\n[[export]]\nname = \"b\"\nmemory = \"1G\"\nnbd = false\n",
    )
    .unwrap();
    let output = Command::new(blockwire_bin())
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let error = text(&output.stderr);
    assert!(
        error.contains(&format!("{}:8: export 'b': nbd: ", path_str(&config))),
        "the line of the key at fault: {error}"
    );
    assert!(error.contains("served by no protocol"), "{error}");
}

#[test]
fn pages_have_signals_exit_status_and_examples_and_no_literal_backticks() {
    require!("man");
    let dir = tempfile::tempdir().unwrap();
    write_pages(dir.path());
    let render = |page: &str| {
        let output = Command::new("man")
            .args(["-l", path_str(&dir.path().join(page))])
            .env("MANWIDTH", "100")
            .env("MAN_KEEP_FORMATTING", "0")
            .output()
            .unwrap();
        assert_success(&output);
        // man overstrikes bold text when it writes to a pipe: X, backspace, X.
        let mut plain = String::new();
        for c in text(&output.stdout).chars() {
            if c == '\u{8}' {
                plain.pop();
            } else {
                plain.push(c);
            }
        }
        plain
    };
    let serve = render("blockwire-serve.1");
    for section in [
        "SIGNALS",
        "EXIT STATUS",
        "EXAMPLES",
        "SIGHUP",
        "SIGUSR1",
        "SIGTERM",
    ] {
        assert!(
            serve.contains(section),
            "blockwire-serve(1) lacks {section}"
        );
    }
    let copy = render("blockwire-copy.1");
    assert!(
        copy.contains("EXIT STATUS") && copy.contains("EXAMPLES"),
        "{copy}"
    );
    let toml = std::fs::read_to_string(dir.path().join("blockwire.toml.5")).unwrap();
    assert!(
        !toml.contains('`'),
        "a literal backtick in blockwire.toml(5)"
    );
}

#[test]
fn serve_help_groups_flags_by_protocol() {
    let output = Command::new(blockwire_bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert_success(&output);
    let help = text(&output.stdout);
    // Headings are lines without indentation that end in a colon.
    let mut headings = Vec::new();
    let mut offset = 0;
    for line in help.split_inclusive('\n') {
        if !line.starts_with(' ') && line.trim_end().ends_with(':') {
            headings.push((line.trim_end().trim_end_matches(':').to_string(), offset));
        }
        offset += line.len();
    }
    for (name, flag) in [
        ("NBD", "--listen"),
        ("AoE", "--shelf"),
        ("iSCSI", "--chap-user"),
        ("TLS (NBD)", "--tls-psk"),
        ("Limits", "--workers"),
        ("Service", "--metrics"),
    ] {
        let index = headings
            .iter()
            .position(|(heading, _)| heading == name)
            .unwrap_or_else(|| panic!("no {name} heading:\n{help}"));
        let start = headings[index].1;
        let end = headings.get(index + 1).map_or(help.len(), |(_, at)| *at);
        let flag_at = help.find(&format!("  {flag} ")).unwrap();
        assert!(
            (start..end).contains(&flag_at),
            "{flag} is not under {name}:\n{help}"
        );
    }
}

#[test]
fn completions_offer_the_allowed_values_of_enumerated_flags() {
    require!("bash");
    let modes = bash_completes("blockwire serve --tls ");
    for mode in ["off", "on", "require"] {
        assert!(modes.lines().any(|l| l == mode), "no {mode}: {modes}");
    }
    let formats = bash_completes("blockwire serve --log-format ");
    assert!(formats.lines().any(|l| l == "json"), "{formats}");
}

#[test]
fn info_of_an_unknown_scheme_lists_every_scheme() {
    let output = Command::new(blockwire_bin())
        .args(["info", "foo://host/x"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let error = text(&output.stderr);
    for scheme in ["nbd://", "aoe://", "iscsi://", "rbd:", "stripe:"] {
        assert!(error.contains(scheme), "{error}");
    }
}
