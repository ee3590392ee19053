//! TLS for serve's NBD target from the flags or the `[server]` keys: the policy and
//! the credentials, loaded and checked at start-up.

use std::sync::Arc;

use crate::config::ServerSection;
use anyhow::{anyhow, Result};
use blockwire_nbd::tls::{TargetTls, TargetTlsSettings, TlsMode};

/// Credentials without a mode turn TLS on, as nbdkit does not (it needs --tls):
/// here giving a key or a certificate directory is taken as asking for TLS.
pub fn default_mode(credentials: bool) -> TlsMode {
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

/// The target's TLS from the flags (`flags`, when any was given), else from
/// `[server]`, else off; `None` when off. Errors in the files are one line naming
/// the file.
pub fn target_tls(
    flags: Option<TargetTlsSettings>,
    section: Option<&ServerSection>,
) -> Result<Option<Arc<TargetTls>>> {
    let settings = match (flags, section) {
        (Some(flags), _) => flags,
        (None, Some(section)) => settings_from_section(section)?,
        (None, None) => TargetTlsSettings {
            mode: TlsMode::Off,
            certificates: None,
            psk_file: None,
            verify_peer: false,
        },
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
        assert_eq!(default_mode(true), TlsMode::On);
        assert!(target_tls(None, None).unwrap().is_none());
    }
}
