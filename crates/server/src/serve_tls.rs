//! `serve`'s TLS flags and `[server]` keys for the NBD target: the policy and the
//! credentials, loaded and checked at start-up.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Result};
use blockwire_nbd::tls::{TargetTls, TargetTlsSettings, TlsMode};
use clap::Args;

use blockwire_server::config::ServerSection;

/// TLS for the NBD target (NBD_OPT_STARTTLS).
#[derive(Args, Debug, Default)]
pub struct TlsArgs {
    /// NBD: TLS for clients: off, on (clients choose) or require (every option but
    /// NBD_OPT_STARTTLS is refused with NBD_REP_ERR_TLS_REQD until TLS is up).
    #[arg(long, help_heading = "TLS (NBD)", value_name = "MODE", value_parser = mode_parser())]
    pub tls: Option<TlsMode>,

    /// NBD: the directory with server-cert.pem, server-key.pem and (for
    /// --tls-verify-peer) ca-cert.pem, as qemu and nbdkit lay it out.
    #[arg(long, help_heading = "TLS (NBD)", value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,

    /// NBD: pre-shared keys, a file of USERNAME:HEXKEY lines (psktool's format).
    #[arg(long, help_heading = "TLS (NBD)", value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,

    /// NBD: require client certificates signed by DIR/ca-cert.pem.
    #[arg(long, help_heading = "TLS (NBD)")]
    pub tls_verify_peer: bool,
}

/// `--tls MODE`: its values listed, so help and shell completions offer them.
fn mode_parser() -> impl clap::builder::TypedValueParser<Value = TlsMode> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(["off", "on", "require"])
        .map(|text| text.parse::<TlsMode>().expect("one of the listed modes"))
}

impl TlsArgs {
    /// Whether any TLS flag was given (they then take the config file's place).
    fn given(&self) -> bool {
        self.tls.is_some()
            || self.tls_certificates.is_some()
            || self.tls_psk.is_some()
            || self.tls_verify_peer
    }

    fn settings(&self) -> TargetTlsSettings {
        TargetTlsSettings {
            mode: self.tls.unwrap_or(default_mode(
                self.tls_certificates.is_some() || self.tls_psk.is_some(),
            )),
            certificates: self.tls_certificates.clone(),
            psk_file: self.tls_psk.clone(),
            verify_peer: self.tls_verify_peer,
        }
    }
}

/// Credentials without a mode turn TLS on, as nbdkit does not (it needs --tls):
/// here giving a key or a certificate directory is taken as asking for TLS.
fn default_mode(credentials: bool) -> TlsMode {
    if credentials {
        TlsMode::On
    } else {
        TlsMode::Off
    }
}

fn settings_from_section(section: &ServerSection) -> Result<TargetTlsSettings> {
    let credentials = section.tls_certificates.is_some() || section.tls_psk.is_some();
    let mode = match section.tls.as_deref() {
        Some(text) => text
            .parse()
            .map_err(|e: String| anyhow!("[server] tls: {e}"))?,
        None => default_mode(credentials),
    };
    Ok(TargetTlsSettings {
        mode,
        certificates: section.tls_certificates.clone(),
        psk_file: section.tls_psk.clone(),
        verify_peer: section.tls_verify_peer,
    })
}

/// The target's TLS from the flags, else from `[server]`; `None` when off. Errors
/// in the files are one line naming the file.
pub fn target_tls(
    args: &TlsArgs,
    section: Option<&ServerSection>,
) -> Result<Option<Arc<TargetTls>>> {
    let settings = match section {
        Some(section) if !args.given() => settings_from_section(section)?,
        _ => args.settings(),
    };
    let tls = TargetTls::load(&settings).map_err(|e| anyhow!("TLS: {e}"))?;
    Ok(tls.map(Arc::new))
}

/// What the target's TLS is, for the start-up announcement.
pub fn describe(tls: &TargetTls) -> String {
    let mode = match tls.mode() {
        TlsMode::Require => "required",
        _ => "offered",
    };
    format!("NBD TLS {mode}: {}", tls.summary())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(text: &str) -> ServerSection {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn credentials_alone_turn_tls_on_and_modes_are_checked() {
        let on = settings_from_section(&section("tls_psk = \"/k.psk\"")).unwrap();
        assert_eq!(on.mode, TlsMode::On);
        let off = settings_from_section(&section("")).unwrap();
        assert_eq!(off.mode, TlsMode::Off);
        let required = settings_from_section(&section("tls = \"require\"")).unwrap();
        assert_eq!(required.mode, TlsMode::Require);
        let err = settings_from_section(&section("tls = \"maybe\"")).unwrap_err();
        assert!(err.to_string().contains("'maybe'"), "{err}");
        let args = TlsArgs {
            tls_certificates: Some("/pki".into()),
            ..TlsArgs::default()
        };
        assert_eq!(args.settings().mode, TlsMode::On);
        assert!(args.given());
        assert!(!TlsArgs::default().given());
    }
}
