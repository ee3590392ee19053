//! The Debian package: scripts/build-deb.sh builds it, lintian finds no error in it,
//! `dpkg -i` installs the binary, service, conffile, manual pages and completions
//! where Debian wants them, the installed service passes `systemd-analyze verify`,
//! and `dpkg -r` then `dpkg -P` leave nothing behind. Needs root, dpkg, lintian and
//! cargo-deb; skipped (saying so) when blockwire is already installed here, so as
//! not to replace someone's installation.

use std::path::{Path, PathBuf};
use std::process::Command;

use blockwire_tests::{assert_success, have, require, text};

const PACKAGE: &str = "blockwire";

/// Purges the package when dropped, so a failed test leaves no installation behind.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["-P", PACKAGE]).output();
    }
}

fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .map(|o| text(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn build_deb() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new("bash")
        .arg(root.join("scripts/build-deb.sh"))
        .output()
        .unwrap();
    assert_success(&output);
    let stdout = text(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default().trim();
    let path = if Path::new(last).is_absolute() {
        PathBuf::from(last)
    } else {
        root.join(last)
    };
    assert!(
        path.extension().and_then(|e| e.to_str()) == Some("deb") && path.exists(),
        "no .deb: {stdout}"
    );
    path
}

#[test]
fn the_package_installs_lints_clean_and_removes_cleanly() {
    blockwire_tests::require_root!();
    require!("dpkg", "lintian", "cargo-deb", "man");
    if installed() {
        eprintln!("skipped: a blockwire package is installed on this machine already");
        return;
    }
    let deb = build_deb();
    let name = deb.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("blockwire_") && name.ends_with("_amd64.deb"),
        "{name}"
    );

    let contents = text(
        &Command::new("dpkg-deb")
            .arg("--contents")
            .arg(&deb)
            .output()
            .unwrap()
            .stdout,
    );
    for path in [
        "./usr/bin/blockwire",
        "./etc/blockwire/blockwire.toml",
        "blockwire.service",
        "./usr/share/man/man1/blockwire.1.gz",
        "./usr/share/man/man1/blockwire-serve.1.gz",
        "./usr/share/man/man5/blockwire.toml.5.gz",
        "./usr/share/bash-completion/completions/blockwire",
        "./usr/share/zsh/vendor-completions/_blockwire",
        "./usr/share/fish/vendor_completions.d/blockwire.fish",
        "./usr/share/doc/blockwire/copyright",
    ] {
        assert!(
            contents.contains(path),
            "{path} is not in the package:\n{contents}"
        );
    }

    let lint = Command::new("lintian")
        .args(["--fail-on", "error"])
        .arg(&deb)
        .output()
        .unwrap();
    let report = text(&lint.stdout);
    assert!(lint.status.success(), "lintian errors:\n{report}");
    assert!(!report.lines().any(|l| l.starts_with("E:")), "{report}");
    eprintln!("lintian:\n{report}");

    let _cleanup = Installed;
    let install = Command::new("dpkg").arg("-i").arg(&deb).output().unwrap();
    assert_success(&install);
    assert!(installed());
    let version = Command::new("/usr/bin/blockwire")
        .arg("--version")
        .output()
        .unwrap();
    assert_success(&version);
    assert!(text(&version.stdout).starts_with("blockwire "));
    let conffiles = Command::new("dpkg-query")
        .args(["-W", "-f=${Conffiles}", PACKAGE])
        .output()
        .unwrap();
    assert!(
        text(&conffiles.stdout).contains("/etc/blockwire/blockwire.toml"),
        "the example configuration is a conffile: {}",
        text(&conffiles.stdout)
    );
    assert_success(
        &Command::new("/usr/bin/blockwire")
            .args(["check-config", "/etc/blockwire/blockwire.toml"])
            .output()
            .unwrap(),
    );
    let page = Command::new("man")
        .args(["--warnings", "blockwire.toml"])
        .env("MANWIDTH", "80")
        .output()
        .unwrap();
    assert_success(&page);
    assert_eq!(text(&page.stderr), "");
    if have("systemd-analyze") {
        let unit = text(
            &Command::new("dpkg")
                .args(["-L", PACKAGE])
                .output()
                .unwrap()
                .stdout,
        )
        .lines()
        .find(|l| l.ends_with("/blockwire.service"))
        .expect("the unit is installed")
        .to_string();
        let verify = Command::new("systemd-analyze")
            .args(["verify", &unit])
            .output()
            .unwrap();
        assert_success(&verify);
    }

    let remove = Command::new("dpkg").args(["-r", PACKAGE]).output().unwrap();
    assert_success(&remove);
    assert!(!Path::new("/usr/bin/blockwire").exists());
    assert!(!Path::new("/usr/share/man/man5/blockwire.toml.5.gz").exists());
    // Removed, the conffile stays until purged.
    assert!(Path::new("/etc/blockwire/blockwire.toml").exists());
    let purge = Command::new("dpkg").args(["-P", PACKAGE]).output().unwrap();
    assert_success(&purge);
    assert!(!Path::new("/etc/blockwire").exists());
}
