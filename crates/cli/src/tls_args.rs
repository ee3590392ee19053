//! `serve`'s TLS flags for the NBD target; what they mean (and the `[server]` keys
//! they override) is decided by `blockwire_server::serve_tls`.

use std::path::PathBuf;

use blockwire_nbd::tls::{TargetTlsSettings, TlsMode};
use blockwire_server::serve_tls::default_mode;
use clap::Args;

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

    /// The settings the flags give, or `None` when none was given (the config
    /// file's `[server]` keys then apply).
    pub fn settings(&self) -> Option<TargetTlsSettings> {
        if !self.given() {
            return None;
        }
        Some(TargetTlsSettings {
            mode: self.tls.unwrap_or(default_mode(
                self.tls_certificates.is_some() || self.tls_psk.is_some(),
            )),
            certificates: self.tls_certificates.clone(),
            psk_file: self.tls_psk.clone(),
            verify_peer: self.tls_verify_peer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_alone_turn_tls_on_and_no_flag_leaves_the_file_in_charge() {
        let args = TlsArgs {
            tls_certificates: Some("/pki".into()),
            ..TlsArgs::default()
        };
        assert_eq!(args.settings().unwrap().mode, TlsMode::On);
        assert!(TlsArgs::default().settings().is_none());
    }
}
