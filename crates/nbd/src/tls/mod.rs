//! TLS for NBD (proto.md, "TLS support"): `NBD_OPT_STARTTLS`, then the rest of the
//! handshake and the whole transmission phase inside TLS.
//!
//! - [`TargetTls`]: the target's credentials (an X.509 certificate directory in the
//!   layout qemu and nbdkit use, a PSK file, or both) and its policy
//!   ([`TlsMode`]);
//! - [`InitiatorTls`]: the initiator's, as libnbd's URI parameters spell them;
//! - [`PskFile`]: `username:hexkey` files (psktool's format);
//! - [`TlsSession`] and [`TlsStream`]: a session usable from a reading and a writing
//!   thread at once (engine.rs says how).
//!
//! Built on OpenSSL: GnuTLS peers (qemu, nbdkit, libnbd) negotiate TLS 1.3 with an
//! external pre-shared key, which OpenSSL's PSK callbacks serve and rustls does not
//! implement (docs/nbd.md, "TLS").

mod engine;
mod initiator;
mod psk;
mod target;

use std::path::PathBuf;

pub use engine::{handshake, TlsSession, TlsStream};
pub use initiator::{InitiatorTls, InitiatorTlsSettings};
pub use psk::PskFile;
pub use target::{TargetTls, TargetTlsSettings};

/// Whether a target offers or insists on TLS (`--tls off|on|require`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// No TLS: NBD_OPT_STARTTLS is refused with NBD_REP_ERR_UNSUP.
    #[default]
    Off,
    /// Clients may upgrade with NBD_OPT_STARTTLS, or stay in plain text.
    On,
    /// Every option but NBD_OPT_STARTTLS (and NBD_OPT_ABORT) is refused with
    /// NBD_REP_ERR_TLS_REQD until TLS is up (proto.md's FORCEDTLS).
    Require,
}

impl std::str::FromStr for TlsMode {
    type Err = String;

    fn from_str(text: &str) -> Result<TlsMode, String> {
        match text {
            "off" => Ok(TlsMode::Off),
            "on" => Ok(TlsMode::On),
            "require" => Ok(TlsMode::Require),
            other => Err(format!("'{other}' is not a TLS mode (off, on or require)")),
        }
    }
}

/// Why TLS could not be set up, or why a handshake failed. One line, naming the
/// file at fault where there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A credential file that cannot be used, and why.
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    /// Settings that do not fit together, or OpenSSL refusing them.
    #[error("{0}")]
    Config(String),
    /// The handshake with the peer failed.
    #[error("TLS handshake failed: {0}")]
    Handshake(String),
}

// The files of a certificate directory, in qemu's and nbdkit's layout.
/// The CA that signs the other side's certificate.
pub const CA_CERT: &str = "ca-cert.pem";
/// The target's certificate (and chain).
pub const SERVER_CERT: &str = "server-cert.pem";
/// The target's private key.
pub const SERVER_KEY: &str = "server-key.pem";
/// The initiator's certificate, shown when the target asks for one.
pub const CLIENT_CERT: &str = "client-cert.pem";
/// The initiator's private key.
pub const CLIENT_KEY: &str = "client-key.pem";

/// A credential file OpenSSL refused, with its one-line reason.
fn file_error(path: &std::path::Path, errors: &openssl::error::ErrorStack) -> TlsError {
    TlsError::File {
        path: path.to_path_buf(),
        reason: one_line(errors),
    }
}

/// Shows `cert` (with any chain) and proves it with `key`, checking that they are a
/// pair: the same for a target and for an initiator asked for its certificate.
fn use_identity(
    builder: &mut openssl::ssl::SslContextBuilder,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<(), TlsError> {
    builder
        .set_certificate_chain_file(cert)
        .map_err(|e| file_error(cert, &e))?;
    builder
        .set_private_key_file(key, openssl::ssl::SslFiletype::PEM)
        .map_err(|e| file_error(key, &e))?;
    builder.check_private_key().map_err(|_| TlsError::File {
        path: key.to_path_buf(),
        reason: format!("is not the key of {}", cert.display()),
    })
}

/// Turns OpenSSL's error stack into one line.
fn one_line(errors: &openssl::error::ErrorStack) -> String {
    let reasons: Vec<String> = errors
        .errors()
        .iter()
        .map(|e| e.reason().unwrap_or("unknown error").to_string())
        .collect();
    if reasons.is_empty() {
        "unknown OpenSSL error".into()
    } else {
        reasons.join("; ")
    }
}

/// One line for a failed handshake: OpenSSL's reasons, and the certificate check's
/// verdict when it failed.
fn handshake_failure(ssl: &openssl::ssl::SslRef, error: &openssl::ssl::Error) -> String {
    let mut line = match error.ssl_error() {
        Some(stack) => one_line(stack),
        None => match error.io_error() {
            Some(e) => e.to_string(),
            None => format!("{error}"),
        },
    };
    let verdict = ssl.verify_result();
    if verdict != openssl::x509::X509VerifyResult::OK {
        line.push_str(&format!(" (peer certificate: {})", verdict.error_string()));
    }
    line
}

#[cfg(test)]
mod tests;
