//! `blockwire check-config FILE`: what `serve --config FILE` would serve, and where,
//! without opening or creating anything; or the first error and the line it is on.

use std::path::{Path, PathBuf};

use anyhow::Result;
use blockwire_blockdev::size::{format_size, parse_size};
use clap::Args;

use blockwire_server::config::{Config, ExportSection};
use blockwire_server::config_validate::{
    export_iqn, export_nqn, nvme_discovery_listen, nvme_listen, ISCSI_LISTEN, NBD_LISTEN,
};

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// The configuration file (as for `blockwire serve --config FILE`).
    pub file: PathBuf,
}

/// Loads the file as `serve --config` does (the same validation, the same errors)
/// and says what it would serve.
pub fn run(args: CheckConfigArgs) -> Result<()> {
    let config = Config::load(&args.file)?;
    println!("{}: valid", args.file.display());
    print!("{}", describe(&config));
    Ok(())
}

/// What a valid configuration serves, and where.
pub fn describe(config: &Config) -> String {
    let mut report = String::new();
    for export in &config.exports {
        describe_export(config, export, &mut report);
    }
    let nvme = config.exports.iter().any(|e| e.nvme_settings().is_some());
    if nvme {
        for addr in nvme_discovery_listen(&config.nvme) {
            report.push_str(&format!("nvme discovery: nvme+tcp://{addr}\n"));
        }
    }
    if let Some(listen) = &config.metrics.listen {
        report.push_str(&format!("metrics: http://{listen}/metrics\n"));
    }
    report
}

/// Where the device comes from, as `serve` would open it, without opening it.
fn describe_source(export: &ExportSection) -> String {
    if let Some(volume) = &export.volume {
        return format!("volume '{volume}'");
    }
    if let Some(memory) = &export.memory {
        let size = parse_size(memory).unwrap_or_default();
        return format!("memory, {}", format_size(size));
    }
    if let Some(Ok(spec)) = export.rbd_spec() {
        let conf = spec.conf.as_deref().unwrap_or("Ceph's default search");
        return format!(
            "Ceph RBD image {} (user {}, conf {conf})",
            spec.name(),
            spec.id
        );
    }
    let path = export.path.as_deref().unwrap_or(Path::new(""));
    if let Ok(Some(_)) = blockwire_server::device_spec::remote_target(path) {
        return format!("{} (a remote device)", path.display());
    }
    match export.size.as_deref().map(parse_size) {
        Some(Ok(size)) if !path.exists() => format!(
            "{} (missing: would be created as a sparse file of {})",
            path.display(),
            format_size(size)
        ),
        _ => format!("{}", path.display()),
    }
}

fn describe_export(config: &Config, export: &ExportSection, out: &mut String) {
    let mode = if export.read_only {
        "read-only"
    } else {
        "read-write"
    };
    out.push_str(&format!(
        "export '{}': {}, {mode}\n",
        export.name,
        describe_source(export)
    ));
    if export.nbd {
        let server = &config.server;
        let defaults = [NBD_LISTEN.to_string()];
        let listen = if server.listen.is_empty() && server.socket.is_empty() {
            &defaults[..]
        } else {
            &server.listen[..]
        };
        for addr in listen {
            out.push_str(&format!("  nbd://{addr}/{}\n", export.name));
        }
        for socket in &server.socket {
            out.push_str(&format!(
                "  nbd+unix:///{}?socket={}\n",
                export.name,
                socket.display()
            ));
        }
    }
    if let Some(aoe) = &export.aoe {
        out.push_str(&format!(
            "  aoe e{}.{} on {}\n",
            aoe.shelf,
            aoe.slot,
            aoe.interfaces.join(", ")
        ));
    }
    if let Some(iqn) = export_iqn(config, export) {
        let defaults = [ISCSI_LISTEN.to_string()];
        let listen = if config.iscsi.listen.is_empty() {
            &defaults[..]
        } else {
            &config.iscsi.listen[..]
        };
        for addr in listen {
            out.push_str(&format!("  iscsi://{addr}/{iqn}/0\n"));
        }
    }
    if let Some(nqn) = export_nqn(export) {
        for addr in nvme_listen(&config.nvme) {
            out.push_str(&format!("  nvme+tcp://{addr}/{nqn}\n"));
        }
        let hosts = export.nvme_settings().map(|s| s.hosts).unwrap_or_default();
        if !hosts.is_empty() {
            out.push_str(&format!("    hosts: {}\n", hosts.join(", ")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `check-config` says of `text`: the report, or the error line with the
    /// file's name replaced by `c.toml`.
    fn check(text: &str) -> Result<String, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(&path)
            .map(|config| describe(&config))
            .map_err(|e| format!("{e:#}").replace(&path.display().to_string(), "c.toml"))
    }

    #[test]
    fn reports_each_export_with_its_addresses() {
        let text =
            "[server]\nlisten = [\"0.0.0.0:10809\"]\n[metrics]\nlisten = \"127.0.0.1:9723\"\n\
                    [[export]]\nname = \"a\"\nmemory = \"1G\"\niscsi = true\n\
                    aoe = { interfaces = [\"lo\"], shelf = 3, slot = 4 }\n";
        let report = check(text).unwrap();
        assert_eq!(
            report,
            "export 'a': memory, 1G, read-write\n  nbd://0.0.0.0:10809/a\n  aoe e3.4 on lo\n  \
             iscsi://127.0.0.1:3260/iqn.2026-11.dev.blockwire:a/0\n\
             metrics: http://127.0.0.1:9723/metrics\n"
        );
    }

    #[test]
    fn reports_nvme_subsystems_and_the_discovery_port() {
        let text = "[nvme]\nlisten = \"0.0.0.0\"\n\
                    [[export]]\nname = \"a\"\nmemory = \"1G\"\nnbd = false\nnvme = true\n\
                    [[export]]\nname = \"b\"\nmemory = \"1G\"\nnbd = false\n\
                    nvme = { nqn = \"nqn.2026-11.com.example:b\", hosts = [\"nqn.2026-11.com.example:h\"] }\n";
        let report = check(text).unwrap();
        assert_eq!(
            report,
            "export 'a': memory, 1G, read-write\n  \
             nvme+tcp://0.0.0.0:4420/nqn.2026-11.dev.blockwire:a\n\
             export 'b': memory, 1G, read-write\n  \
             nvme+tcp://0.0.0.0:4420/nqn.2026-11.com.example:b\n    \
             hosts: nqn.2026-11.com.example:h\n\
             nvme discovery: nvme+tcp://0.0.0.0:8009\n"
        );
    }

    #[test]
    fn a_bad_or_shared_nqn_is_one_line_with_its_line() {
        let error =
            check("[[export]]\nname = \"a\"\nmemory = \"1G\"\nnvme = { nqn = \"nqn.x\" }\n")
                .unwrap_err();
        assert!(
            error.starts_with("c.toml:4: export 'a': nvme.nqn: 'nqn.x' is not an NQN"),
            "{error}"
        );
        let error = check(
            "[[export]]\nname = \"a\"\nmemory = \"1G\"\nnvme = { nqn = \"nqn.2026-11.x:t\" }\n\
             [[export]]\nname = \"b\"\nmemory = \"1G\"\nnvme = { nqn = \"nqn.2026-11.x:t\" }\n",
        )
        .unwrap_err();
        assert!(
            error.starts_with(
                "c.toml:8: export 'b': nvme: NVMe subsystem nqn.2026-11.x:t is already export 'a'"
            ),
            "{error}"
        );
        assert!(!error.contains('\n'), "{error}");
    }

    #[test]
    fn a_syntax_error_is_given_with_its_line() {
        let error = check("[[export]]\nname = \"a\"\nmemory = 1G\n").unwrap_err();
        assert!(error.starts_with("c.toml:3: export 'a': "), "{error}");
    }

    #[test]
    fn an_unknown_key_is_one_line_with_its_line_and_the_allowed_keys() {
        let error =
            check("[[export]]\nname = \"a\"\nmemory = \"1G\"\nreadonly = true\n").unwrap_err();
        assert!(
            error.starts_with("c.toml:4: export 'a': unknown key 'readonly' (allowed: name, "),
            "{error}"
        );
        assert!(!error.contains('\n') && !error.contains('`'), "{error}");
    }

    #[test]
    fn a_single_listen_address_is_a_list_of_one() {
        let report = check(
            "[server]\nlisten = \"127.0.0.1:10811\"\n[[export]]\nname = \"a\"\nmemory = \"1M\"\n",
        )
        .unwrap();
        assert!(report.contains("nbd://127.0.0.1:10811/a"), "{report}");
    }

    #[test]
    fn wrong_types_are_said_without_rust_type_names() {
        let error =
            check("[server]\nworkers = \"many\"\n[[export]]\nname = \"a\"\nmemory = \"1M\"\n")
                .unwrap_err();
        assert!(error.starts_with("c.toml:2: [server] workers: "), "{error}");
        assert!(!error.contains("usize"), "{error}");
        let error = check("[[export]]\nname = \"a\"\nmemory = \"10Q\"\n").unwrap_err();
        assert!(
            error.starts_with("c.toml:3: export 'a': memory: '10Q'"),
            "{error}"
        );
        assert!(error.contains("K, M, G, T or P"), "{error}");
    }

    #[test]
    fn a_senseless_export_is_given_with_the_line_of_its_table() {
        let text = "[[export]]\nname = \"a\"\nmemory = \"1G\"\n\n[[export]]\nname = \"b\"\n";
        let error = check(text).unwrap_err();
        assert_eq!(
            error,
            "c.toml:5: export 'b': give exactly one of path, memory or volume"
        );
    }

    #[test]
    fn a_missing_file_without_a_size_is_an_error_that_names_the_key() {
        let text = "[[export]]\nname = \"a\"\npath = \"/nonexistent-blockwire-a.img\"\n";
        let error = check(text).unwrap_err();
        assert_eq!(
            error,
            "c.toml:3: export 'a': path: /nonexistent-blockwire-a.img does not exist; \
             set size = \"SIZE\" to create it as a sparse file"
        );
        let text = format!("{text}size = \"1G\"\n");
        assert!(check(&text).unwrap().contains("would be created"));
    }

    #[test]
    fn remote_and_rbd_paths_are_checked_without_being_opened() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("ceph.conf");
        std::fs::write(&conf, "[global]\n").unwrap();
        let text = format!(
            "[[export]]\nname = \"vm\"\npath = \"rbd:rbd/vm\"\n\
             rbd = {{ id = \"gw\", conf = \"{}\" }}\n\
             [[export]]\nname = \"far\"\npath = \"nbd://127.0.0.1:1/x\"\n",
            conf.display()
        );
        let report = check(&text).unwrap();
        assert!(
            report.contains(&format!(
                "Ceph RBD image rbd/vm (user gw, conf {})",
                conf.display()
            )),
            "{report}"
        );
        assert!(
            report.contains("nbd://127.0.0.1:1/x (a remote device)"),
            "{report}"
        );
        // A missing keyring, and a key given twice, are errors before any cluster.
        let missing = text.replace("id = \"gw\"", "keyring = \"/nonexistent/k\"");
        let error = check(&missing).unwrap_err();
        assert!(
            error.contains("rbd: keyring: cannot read /nonexistent/k"),
            "{error}"
        );
        let twice = text.replace("rbd:rbd/vm", "rbd:rbd/vm:id=admin");
        let error = check(&twice).unwrap_err();
        assert!(error.contains("'id' given in the spec"), "{error}");
    }

    #[test]
    fn what_serve_refuses_check_config_refuses() {
        let two_iqns = "[[export]]\nname = \"a\"\nmemory = \"1M\"\niscsi = { iqn = \"iqn.2026-11.x:t\" }\n\
                        [[export]]\nname = \"b\"\nmemory = \"1M\"\niscsi = { iqn = \"iqn.2026-11.x:t\" }\n";
        let error = check(two_iqns).unwrap_err();
        assert!(
            error.starts_with("c.toml:8: export 'b': iscsi: "),
            "{error}"
        );
        let broadcast = "[[export]]\nname = \"a\"\nmemory = \"1M\"\n\
                         aoe = { interfaces = [\"lo\"], shelf = 65535, slot = 255 }\n";
        assert!(check(broadcast).unwrap_err().contains("aoe.shelf: 65535"));
        let metrics_on_nbd = "[metrics]\nlisten = \"127.0.0.1:10809\"\n\
                              [[export]]\nname = \"a\"\nmemory = \"1M\"\n";
        let error = check(metrics_on_nbd).unwrap_err();
        assert!(
            error.starts_with("c.toml:2: [metrics] listen: 127.0.0.1:10809 is also NBD's default"),
            "{error}"
        );
        let chap = "[iscsi]\nchap_user = \"u\"\nchap_secret_file = \"/nonexistent/s\"\n\
                    [[export]]\nname = \"a\"\nmemory = \"1M\"\niscsi = true\n";
        let error = check(chap).unwrap_err();
        assert!(
            error.starts_with("c.toml:3: [iscsi] chap_secret_file: cannot read /nonexistent/s"),
            "{error}"
        );
    }
}
