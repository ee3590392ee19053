//! `blockwire check-config FILE`: what `serve --config FILE` would serve, and where,
//! without opening or creating anything; or the first error and the line it is on.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use blockwire_blockdev::size::{format_size, parse_size};
use clap::Args;

use crate::config::{Config, ConfigError, ExportSection, IscsiExport};
use crate::serve_iscsi::{default_iqn, DEFAULT_IQN_PREFIX, DEFAULT_LISTEN as ISCSI_LISTEN};

/// The NBD listener when [server] names none (as `serve` does).
const NBD_LISTEN: &str = "127.0.0.1:10809";

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// The configuration file (as for `blockwire serve --config FILE`).
    pub file: PathBuf,
}

pub fn run(args: CheckConfigArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    match check(&text) {
        Ok(report) => {
            println!("{}: valid", args.file.display());
            print!("{report}");
            Ok(())
        }
        Err(Located { line, message }) => match line {
            Some(line) => bail!("{}:{line}: {message}", args.file.display()),
            None => bail!("{}: {message}", args.file.display()),
        },
    }
}

/// An error and the line (1-based) it is on, when known.
#[derive(Debug)]
pub struct Located {
    pub line: Option<usize>,
    pub message: String,
}

/// The report for a configuration's text, or its first error.
pub fn check(text: &str) -> Result<String, Located> {
    let config: Config = toml::from_str(text).map_err(|e| Located {
        line: e.span().map(|span| line_at(text, span.start)),
        message: e.message().trim().to_string(),
    })?;
    config.validate().map_err(|e| locate(text, e))?;
    let mut report = String::new();
    for (index, export) in config.exports.iter().enumerate() {
        describe_export(&config, export, &mut report).map_err(|message| Located {
            line: table_line(text, "export", index),
            message,
        })?;
    }
    if let Some(listen) = &config.metrics.listen {
        report.push_str(&format!("metrics: http://{listen}/metrics\n"));
    }
    Ok(report)
}

fn locate(text: &str, error: ConfigError) -> Located {
    Located {
        line: error
            .table
            .and_then(|(table, index)| table_line(text, table, index)),
        message: error.message,
    }
}

/// The 1-based line of byte `offset`.
fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line of the `index`-th `[[table]]` (or the `[table]`) header.
fn table_line(text: &str, table: &str, index: usize) -> Option<usize> {
    let array = format!("[[{table}]]");
    let single = format!("[{table}]");
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let line = line.trim_start();
            line.starts_with(&array) || line.starts_with(&single)
        })
        .nth(index)
        .map(|(number, _)| number + 1)
}

/// Where the device comes from, as `serve` would open it, without opening it.
fn describe_source(export: &ExportSection) -> Result<String, String> {
    if let Some(volume) = &export.volume {
        return Ok(format!("volume '{volume}'"));
    }
    if let Some(memory) = &export.memory {
        let size = parse_size(memory).map_err(|e| format!("export '{}': {e}", export.name))?;
        return Ok(format!("memory, {}", format_size(size)));
    }
    if let Some(spec) = export.rbd_spec() {
        return describe_rbd(&spec?, export);
    }
    let path = export.path.as_deref().unwrap_or(Path::new(""));
    match crate::serve::remote_target(path) {
        Ok(Some(_)) => return Ok(format!("{} (a remote device)", path.display())),
        Ok(None) => {}
        Err(e) => return Err(format!("export '{}': {e:#}", export.name)),
    }
    let size = export
        .size
        .as_deref()
        .map(parse_size)
        .transpose()
        .map_err(|e| format!("export '{}': size: {e}", export.name))?;
    match (std::fs::metadata(path), size) {
        (Ok(_), _) => Ok(format!("{}", path.display())),
        (Err(_), Some(size)) if !export.read_only => Ok(format!(
            "{} (missing: would be created as a sparse file of {})",
            path.display(),
            format_size(size)
        )),
        (Err(e), _) => Err(format!(
            "export '{}': {}: {e} (give `size` to create it)",
            export.name,
            path.display()
        )),
    }
}

/// A Ceph image as `serve` would open it, without reaching the cluster: the
/// files it names must be there.
fn describe_rbd(spec: &blockwire_rbd::RbdSpec, export: &ExportSection) -> Result<String, String> {
    for (what, file) in [("conf", &spec.conf), ("keyring", &spec.keyring)] {
        if let Some(file) = file {
            if let Err(e) = std::fs::metadata(file) {
                return Err(format!("export '{}': rbd {what} {file}: {e}", export.name));
            }
        }
    }
    let conf = spec.conf.as_deref().unwrap_or("Ceph's default search");
    Ok(format!(
        "Ceph RBD image {} (user {}, conf {conf})",
        spec.name(),
        spec.id
    ))
}

fn describe_export(
    config: &Config,
    export: &ExportSection,
    out: &mut String,
) -> Result<(), String> {
    let mode = if export.read_only {
        "read-only"
    } else {
        "read-write"
    };
    out.push_str(&format!(
        "export '{}': {}, {mode}\n",
        export.name,
        describe_source(export)?
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
    if let Some(settings) = export.iscsi.as_ref().and_then(IscsiExport::settings) {
        let prefix = config
            .iscsi
            .iqn_prefix
            .as_deref()
            .unwrap_or(DEFAULT_IQN_PREFIX);
        let iqn = settings
            .iqn
            .unwrap_or_else(|| default_iqn(prefix, &export.name));
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_each_export_with_its_addresses() {
        let text =
            "[server]\nlisten = [\"0.0.0.0:10809\"]\n[metrics]\nlisten = \"127.0.0.1:9723\"\n\
                    [[export]]\nname = \"a\"\nmemory = \"1G\"\niscsi = true\n\
                    aoe = { interfaces = [\"eth1\"], shelf = 3, slot = 4 }\n";
        let report = check(text).unwrap();
        assert_eq!(
            report,
            "export 'a': memory, 1G, read-write\n  nbd://0.0.0.0:10809/a\n  aoe e3.4 on eth1\n  \
             iscsi://127.0.0.1:3260/iqn.2026-11.dev.blockwire:a/0\n\
             metrics: http://127.0.0.1:9723/metrics\n"
        );
    }

    #[test]
    fn a_syntax_error_is_given_with_its_line() {
        let error = check("[[export]]\nname = \"a\"\nmemory = 1G\n").unwrap_err();
        assert_eq!(error.line, Some(3), "{error:?}");
    }

    #[test]
    fn an_unknown_key_is_given_with_its_line() {
        let error =
            check("[[export]]\nname = \"a\"\nmemory = \"1G\"\nreadonly = true\n").unwrap_err();
        assert_eq!(error.line, Some(4), "{error:?}");
        assert!(error.message.contains("readonly"), "{error:?}");
    }

    #[test]
    fn a_senseless_export_is_given_with_the_line_of_its_table() {
        let text = "[[export]]\nname = \"a\"\nmemory = \"1G\"\n\n[[export]]\nname = \"b\"\n";
        let error = check(text).unwrap_err();
        assert_eq!(error.line, Some(5), "{error:?}");
        assert!(error.message.contains("exactly one of"), "{error:?}");
    }

    #[test]
    fn a_missing_file_without_a_size_is_an_error() {
        let text = "[[export]]\nname = \"a\"\npath = \"/nonexistent/blockwire/a.img\"\n";
        let error = check(text).unwrap_err();
        assert_eq!(error.line, Some(1), "{error:?}");
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
            error.message.contains("rbd keyring /nonexistent/k"),
            "{error:?}"
        );
        let twice = text.replace("rbd:rbd/vm", "rbd:rbd/vm:id=admin");
        let error = check(&twice).unwrap_err();
        assert!(
            error.message.contains("'id' given in the spec"),
            "{error:?}"
        );
    }
}
