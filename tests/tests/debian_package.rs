//! The Debian package: scripts/build-deb.sh builds it, lintian finds no error in it,
//! its Depends names the libraries the binary links (libc6, libssl), and its
//! maintainer scripts do what dh_installsystemd's do: enable and start the service on
//! install, restart it on upgrade, stop it on remove, take the enable state back on
//! purge.
//!
//! The scripts are run twice over. Once as they are, from the package's control
//! archive, with `deb-systemd-helper`, `deb-systemd-invoke` and `systemctl` replaced
//! by stubs that log their arguments and systemd pretended to be running, for every
//! way dpkg calls them: no root needed, nothing on the machine touched. Once for
//! real: `dpkg -i` installs the binary, service, conffile, manual pages and
//! completions where Debian wants them, the installed service passes `systemd-analyze
//! verify` and is enabled as `deb-systemd-helper` records it (which works with or
//! without a running systemd); a reinstall keeps it enabled, and one after the
//! administrator disabled it keeps it disabled; `dpkg -r` keeps the conffile and the
//! enable state and masks the unit; and `dpkg -P` (of a disabled service, and of an
//! enabled one) leaves neither conffile nor enable state nor mask behind, but leaves
//! a file of the administrator's own in /etc/blockwire alone.
//!
//! The real one needs root, dpkg, deb-systemd-helper, lintian and cargo-deb. It is
//! skipped (saying so) when dpkg knows a blockwire package here already (installed,
//! or removed with its configuration kept) or a blockwire unit is set up in
//! /etc/systemd/system, so as not to replace or purge someone's installation. On a
//! machine where systemd runs, the unit is masked for this boot (`systemctl mask
//! --runtime`) while the test runs, so that installing does not start a real
//! service on ports other tests may use. Whatever happens, the test purges the
//! package it installed and removes what it created.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use blockwire_tests::{assert_success, have, path_str, require, text};

const PACKAGE: &str = "blockwire";
const UNIT: &str = "blockwire.service";

/// A file of the administrator's own next to the conffile (a CHAP secret, say): purge
/// must leave it.
const OWN_FILE: &str = "/etc/blockwire/debian-package-test-own-file";

/// Where deb-systemd-helper and systemd keep what says a unit is enabled or masked.
const STATE_DIRS: [&str; 3] = [
    "/etc/systemd/system",
    "/var/lib/systemd/deb-systemd-helper-enabled",
    "/var/lib/systemd/deb-systemd-helper-masked",
];

/// Purges the package, removes the test's own file and unmasks the unit when
/// dropped, so a failed test leaves no installation behind.
struct Installed {
    masked_for_this_boot: bool,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = dpkg(&["-P", PACKAGE]);
        let _ = fs::remove_file(OWN_FILE);
        let _ = fs::remove_dir("/etc/blockwire");
        if self.masked_for_this_boot {
            let _ = Command::new("systemctl")
                .args(["unmask", "--runtime", UNIT])
                .output();
        }
    }
}

/// dpkg, waiting (up to 10 minutes) while another dpkg or apt holds its lock.
fn dpkg(args: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let output = Command::new("dpkg").args(args).output().unwrap();
        let locked = !output.status.success() && text(&output.stderr).contains("lock");
        if !locked || Instant::now() > deadline {
            return output;
        }
        std::thread::sleep(Duration::from_secs(5));
    }
}

/// The package's state as dpkg-query says it (`install ok installed`, `deinstall ok
/// config-files`, ...), or "" when dpkg does not know it.
fn status() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .map(|o| text(&o.stdout))
        .unwrap_or_default()
}

fn installed() -> bool {
    status().contains("install ok installed")
}

/// Every file, directory or link named blockwire* under the enable and mask state
/// directories (not following links).
fn unit_state() -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with(PACKAGE) {
                found.push(path.clone());
            }
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                walk(&path, found);
            }
        }
    }
    let mut found = Vec::new();
    for dir in STATE_DIRS {
        walk(Path::new(dir), &mut found);
    }
    found
}

/// deb-systemd-helper, as the package's maintainer scripts call it (it refuses to run
/// unless dpkg's environment names the package).
fn helper(args: &[&str]) -> Output {
    Command::new("deb-systemd-helper")
        .args(args)
        .env("DPKG_MAINTSCRIPT_PACKAGE", PACKAGE)
        .output()
        .unwrap()
}

fn is_enabled() -> bool {
    helper(&["is-enabled", UNIT]).status.success()
}

/// The package scripts/build-deb.sh builds, once for every test here.
fn deb() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(build_deb)
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

/// Runs the maintainer scripts of the package the way dpkg would, with the helpers
/// they call replaced by stubs that log their arguments.
struct Scripts {
    dir: tempfile::TempDir,
}

impl Scripts {
    fn extract(deb: &Path) -> Scripts {
        let dir = tempfile::tempdir().unwrap();
        let control = dir.path().join("control");
        assert_success(
            &Command::new("dpkg-deb")
                .arg("--control")
                .arg(deb)
                .arg(&control)
                .output()
                .unwrap(),
        );
        let stubs = dir.path().join("stubs");
        fs::create_dir(&stubs).unwrap();
        let log = dir.path().join("log");
        // `was-enabled` answers as $WAS_ENABLED says (deb-systemd-helper answers yes
        // for a unit it has no state of, as on a first install).
        let stub = format!(
            "#!/bin/sh\necho \"$(basename \"$0\") $*\" >>'{}'\n\
             case \"$*\" in *was-enabled*) [ \"${{WAS_ENABLED:-yes}}\" = yes ];; esac\n",
            log.display()
        );
        for name in ["deb-systemd-helper", "deb-systemd-invoke", "systemctl"] {
            let path = stubs.join(name);
            fs::write(&path, &stub).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        fs::create_dir(dir.path().join("systemd-running")).unwrap();
        Scripts { dir }
    }

    fn text(&self, script: &str) -> String {
        fs::read_to_string(self.dir.path().join("control").join(script))
            .unwrap_or_else(|e| panic!("no {script} in the package's control archive: {e}"))
    }

    /// `script args...` as dpkg runs it, with systemd running or not and
    /// deb-systemd-helper's `was-enabled` answering `was_enabled`: what the helpers
    /// were asked, one call a line.
    fn run(&self, script: &str, args: &[&str], systemd: bool, was_enabled: bool) -> String {
        let mut body = self.text(script);
        // The snippets check for a running systemd and for deb-systemd-helper (which
        // may be gone by postrm) at fixed paths: point those at the test's own.
        let running = self.dir.path().join(if systemd {
            "systemd-running"
        } else {
            "systemd-not-running"
        });
        body = body.replace("/run/systemd/system", path_str(&running));
        let stubs = self.dir.path().join("stubs");
        body = body.replace(
            "/usr/bin/deb-systemd-helper",
            path_str(&stubs.join("deb-systemd-helper")),
        );
        let path = self.dir.path().join(format!("{script}.run"));
        fs::write(&path, body).unwrap();
        let log = self.dir.path().join("log");
        let _ = fs::remove_file(&log);
        let output = Command::new("sh")
            .arg(&path)
            .args(args)
            .env(
                "PATH",
                format!("{}:{}", stubs.display(), std::env::var("PATH").unwrap()),
            )
            .env("WAS_ENABLED", if was_enabled { "yes" } else { "no" })
            .output()
            .unwrap();
        assert_success(&output);
        fs::read_to_string(&log).unwrap_or_default()
    }
}

fn assert_calls(log: &str, expected: &[&str], not: &[&str], case: &str) {
    for call in expected {
        assert!(
            log.lines().any(|l| l == *call),
            "{case}: no `{call}` in the calls:\n{log}"
        );
    }
    for call in not {
        assert!(
            !log.lines().any(|l| l.starts_with(call)),
            "{case}: `{call}...` should not be called:\n{log}"
        );
    }
}

#[test]
fn the_maintainer_scripts_enable_start_restart_stop_and_purge_the_service() {
    require!("dpkg-deb", "cargo-deb");
    let scripts = Scripts::extract(deb());

    for script in ["postinst", "prerm", "postrm"] {
        let path = scripts.dir.path().join("control").join(script);
        let body = scripts.text(script);
        assert!(body.starts_with("#!/bin/sh\n"), "{script}:\n{body}");
        assert!(body.lines().any(|l| l == "set -e"), "{script}:\n{body}");
        assert!(
            !body.contains("#DEBHELPER#"),
            "{script} still has the token:\n{body}"
        );
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755, "{script}");
    }
    assert!(scripts
        .text("postinst")
        .contains("deb-systemd-helper enable blockwire.service"));
    assert!(scripts
        .text("postrm")
        .contains("deb-systemd-helper purge blockwire.service"));

    let enable = "deb-systemd-helper enable blockwire.service";
    let start = "deb-systemd-invoke start blockwire.service";
    let restart = "deb-systemd-invoke restart blockwire.service";
    let stop = "deb-systemd-invoke stop blockwire.service";
    let invoke = "deb-systemd-invoke";

    // First install.
    let log = scripts.run("postinst", &["configure", ""], true, true);
    assert_calls(
        &log,
        &[
            "deb-systemd-helper unmask blockwire.service",
            enable,
            "systemctl --system daemon-reload",
            start,
        ],
        &[restart],
        "install",
    );
    // First install with no systemd running (a container, a chroot): enabled, for
    // when it boots, and nothing started.
    let log = scripts.run("postinst", &["configure", ""], false, true);
    assert_calls(
        &log,
        &[enable],
        &[invoke, "systemctl"],
        "install, no systemd",
    );
    // Upgrade: the old prerm leaves the service running, the new postinst restarts it.
    let log = scripts.run("prerm", &["upgrade", "99.0.0"], true, true);
    assert_calls(&log, &[], &[invoke], "upgrade, old prerm");
    let log = scripts.run("postrm", &["upgrade", "99.0.0"], true, true);
    assert_calls(
        &log,
        &[],
        &[
            invoke,
            "deb-systemd-helper purge",
            "deb-systemd-helper mask",
        ],
        "upgrade, old postrm",
    );
    let log = scripts.run("postinst", &["configure", "0.0.1"], true, true);
    assert_calls(&log, &[enable, restart], &[start], "upgrade");
    // Upgrade after the administrator disabled it: not enabled again (and
    // deb-systemd-invoke does not start a disabled unit).
    let log = scripts.run("postinst", &["configure", "0.0.1"], true, false);
    assert_calls(
        &log,
        &["deb-systemd-helper update-state blockwire.service", restart],
        &[enable],
        "upgrade, disabled",
    );
    // Remove: stopped while the binary is there, then masked; the enable state stays.
    let log = scripts.run("prerm", &["remove"], true, true);
    assert_calls(&log, &[stop], &[], "remove, prerm");
    let log = scripts.run("postrm", &["remove"], true, true);
    assert_calls(
        &log,
        &["deb-systemd-helper mask blockwire.service"],
        &["deb-systemd-helper purge", invoke],
        "remove, postrm",
    );
    // Purge: the enable state and the mask go.
    let log = scripts.run("postrm", &["purge"], true, true);
    assert_calls(
        &log,
        &[
            "deb-systemd-helper purge blockwire.service",
            "deb-systemd-helper unmask blockwire.service",
        ],
        &[invoke],
        "purge",
    );
    let log = scripts.run("postrm", &["purge"], false, true);
    assert_calls(
        &log,
        &["deb-systemd-helper purge blockwire.service"],
        &["systemctl"],
        "purge, no systemd",
    );
}

#[test]
fn the_package_installs_enables_lints_clean_and_purges_cleanly() {
    blockwire_tests::require_root!();
    require!(
        "dpkg",
        "dpkg-deb",
        "deb-systemd-helper",
        "lintian",
        "cargo-deb",
        "man"
    );
    let known = status();
    if !known.is_empty() && !known.contains("not-installed") {
        eprintln!(
            "skipped: dpkg knows a blockwire package on this machine already ({known}); \
             if a run of this test left it, `dpkg -P blockwire`"
        );
        return;
    }
    let before = unit_state();
    if !before.is_empty() {
        eprintln!("skipped: a blockwire unit is set up on this machine already: {before:?}");
        return;
    }
    let deb = deb();
    let name = deb.file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("blockwire_") && name.ends_with("_amd64.deb"),
        "{name}"
    );

    let contents = text(
        &Command::new("dpkg-deb")
            .arg("--contents")
            .arg(deb)
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

    // Depends, as dpkg-shlibdeps computes it from the libraries the binary links.
    let depends = Command::new("dpkg-deb")
        .arg("--field")
        .arg(deb)
        .arg("Depends")
        .output()
        .unwrap();
    assert_success(&depends);
    let depends = text(&depends.stdout);
    for library in ["libc6 (>= ", "libssl"] {
        assert!(
            depends.contains(library),
            "Depends has no {library}: {depends:?}"
        );
    }
    assert!(!depends.contains('$'), "{depends}");

    let lint = Command::new("lintian")
        .args(["--fail-on", "error"])
        .arg(deb)
        .output()
        .unwrap();
    let report = text(&lint.stdout);
    assert!(lint.status.success(), "lintian errors:\n{report}");
    assert!(!report.lines().any(|l| l.starts_with("E:")), "{report}");
    eprintln!("lintian:\n{report}");

    let systemd_running = Path::new("/run/systemd/system").is_dir();
    let _cleanup = Installed {
        masked_for_this_boot: systemd_running,
    };
    if systemd_running {
        assert_success(
            &Command::new("systemctl")
                .args(["mask", "--runtime", UNIT])
                .output()
                .unwrap(),
        );
    }
    let install = dpkg(&["-i", path_str(deb)]);
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
    if have("systemd-analyze") {
        let verify = Command::new("systemd-analyze")
            .args(["verify", &unit])
            .output()
            .unwrap();
        assert_success(&verify);
    }

    // Enabled: the WantedBy link, and deb-systemd-helper's record of it for purge.
    assert!(
        is_enabled(),
        "not enabled after install; unit state: {:?}",
        unit_state()
    );
    let wants = Path::new("/etc/systemd/system/multi-user.target.wants/blockwire.service");
    assert_eq!(
        fs::canonicalize(wants).ok(),
        fs::canonicalize(&unit).ok(),
        "{} is not a link to the unit",
        wants.display()
    );
    assert!(
        Path::new("/var/lib/systemd/deb-systemd-helper-enabled/blockwire.service.dsh-also")
            .exists()
    );

    // Reinstalled (an upgrade to dpkg and the scripts): still enabled.
    assert_success(&dpkg(&["-i", path_str(deb)]));
    assert!(
        is_enabled(),
        "not enabled after reinstall: {:?}",
        unit_state()
    );
    // Disabled by the administrator, then reinstalled: stays disabled. (systemctl
    // disable works on the unit files with or without a running systemd.)
    if have("systemctl") {
        assert_success(
            &Command::new("systemctl")
                .args(["disable", UNIT])
                .output()
                .unwrap(),
        );
    } else {
        assert_success(&helper(&["disable", UNIT]));
    }
    assert!(!is_enabled());
    assert_success(&dpkg(&["-i", path_str(deb)]));
    assert!(
        !is_enabled(),
        "a reinstall enabled what the administrator disabled: {:?}",
        unit_state()
    );
    // Purged while disabled: no state left.
    assert_success(&dpkg(&["-P", PACKAGE]));
    assert_purged();

    // Installed afresh: enabled again.
    assert_success(&dpkg(&["-i", path_str(deb)]));
    assert!(
        is_enabled(),
        "not enabled when installed after a purge: {:?}",
        unit_state()
    );
    fs::write(OWN_FILE, "the administrator's\n").unwrap();

    let remove = dpkg(&["-r", PACKAGE]);
    assert_success(&remove);
    assert!(!Path::new("/usr/bin/blockwire").exists());
    assert!(!Path::new("/usr/share/man/man5/blockwire.toml.5.gz").exists());
    assert!(!Path::new(&unit).exists());
    // Removed, the conffile stays until purged, and so does the enable state; the
    // unit is masked meanwhile.
    assert!(Path::new("/etc/blockwire/blockwire.toml").exists());
    assert!(
        Path::new("/var/lib/systemd/deb-systemd-helper-enabled/blockwire.service.dsh-also")
            .exists()
    );
    assert_eq!(
        fs::read_link("/etc/systemd/system/blockwire.service").ok(),
        Some(PathBuf::from("/dev/null")),
        "not masked after remove: {:?}",
        unit_state()
    );

    // Purged while enabled: no state left, and the administrator's own file stays.
    let purge = dpkg(&["-P", PACKAGE]);
    assert_success(&purge);
    assert_purged();
    assert_eq!(
        fs::read_to_string(OWN_FILE).unwrap(),
        "the administrator's\n",
        "purge deleted a file that was not the package's"
    );
    fs::remove_file(OWN_FILE).unwrap();
    // Nothing else of the package's was left in the directory.
    fs::remove_dir("/etc/blockwire").unwrap();
}

/// After `dpkg -P`: dpkg has forgotten the package, the conffile is gone, and no
/// enable state, link or mask of the unit is left.
fn assert_purged() {
    let known = status();
    assert!(
        known.is_empty() || known.contains("not-installed"),
        "{known}"
    );
    assert!(!is_enabled());
    assert_eq!(
        unit_state(),
        Vec::<PathBuf>::new(),
        "enable or mask state left behind by purge"
    );
    assert!(!Path::new("/etc/blockwire/blockwire.toml").exists());
}
