//! The target's TLS credentials and policy.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use openssl::ex_data::Index;
use openssl::ssl::{
    Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslVerifyMode, SslVersion,
};
use openssl::x509::X509Name;

use super::{
    file_error, handshake, handshake_failure, one_line, use_identity, PskFile, TlsError, TlsMode,
    TlsSession, CA_CERT, SERVER_CERT, SERVER_KEY,
};

/// Where the target's credentials come from (`--tls-certificates`, `--tls-psk`,
/// `--tls-verify-peer`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetTlsSettings {
    /// Off, offered or required.
    pub mode: TlsMode,
    /// A directory with `server-cert.pem`, `server-key.pem` and, to check client
    /// certificates, `ca-cert.pem`.
    pub certificates: Option<PathBuf>,
    /// A `username:hexkey` file.
    pub psk_file: Option<PathBuf>,
    /// Require a client certificate signed by the directory's `ca-cert.pem`.
    pub verify_peer: bool,
}

/// The PSK identity a client named, kept on its session for the failure message.
#[derive(Debug, Clone)]
struct OfferedIdentity {
    name: String,
    known: bool,
}

fn identity_index() -> Index<Ssl, OfferedIdentity> {
    static INDEX: OnceLock<Index<Ssl, OfferedIdentity>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL has room for an ex_data index"))
}

/// A target's TLS: its policy and a context every connection's session is made from.
pub struct TargetTls {
    mode: TlsMode,
    context: SslContext,
    psk_path: Option<PathBuf>,
    summary: String,
}

impl std::fmt::Debug for TargetTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetTls")
            .field("mode", &self.mode)
            .field("summary", &self.summary)
            .finish()
    }
}

/// `path` if it is a readable file, else an error naming it.
fn existing(path: PathBuf) -> Result<PathBuf, TlsError> {
    match std::fs::File::open(&path) {
        Ok(_) => Ok(path),
        Err(e) => Err(TlsError::File {
            path,
            reason: e.to_string(),
        }),
    }
}

impl TargetTls {
    /// Loads and checks every file `settings` names; `None` when TLS is off. An
    /// error is one line naming the file at fault.
    pub fn load(settings: &TargetTlsSettings) -> Result<Option<TargetTls>, TlsError> {
        if settings.mode == TlsMode::Off {
            if settings.certificates.is_some() || settings.psk_file.is_some() {
                return Err(TlsError::Config(
                    "TLS credentials are given but TLS is off (use --tls on or --tls require)"
                        .into(),
                ));
            }
            return Ok(None);
        }
        if settings.certificates.is_none() && settings.psk_file.is_none() {
            return Err(TlsError::Config(
                "TLS needs credentials: --tls-certificates DIR and/or --tls-psk FILE".into(),
            ));
        }
        if settings.verify_peer && settings.certificates.is_none() {
            return Err(TlsError::Config(
                "--tls-verify-peer checks client certificates against DIR/ca-cert.pem: \
                 give --tls-certificates DIR"
                    .into(),
            ));
        }
        let setup = |e: openssl::error::ErrorStack| TlsError::Config(one_line(&e));
        let mut builder = SslContextBuilder::new(SslMethod::tls_server()).map_err(setup)?;
        // proto.md: TLS 1.2 at least; older versions only by a configuration change.
        builder
            .set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(setup)?;
        // A connection lives as long as its client; resumption would only cost a
        // message per handshake.
        builder.set_num_tickets(0).map_err(setup)?;
        // OpenSSL refuses to run a handshake that checks client certificates without
        // one (even when a key, not a certificate, then authenticates the client).
        builder
            .set_session_id_context(b"blockwire-nbd")
            .map_err(setup)?;
        // AES-GCM first, and our order rather than the client's: with AES
        // instructions it seals faster than ChaCha20 (openssl speed, 16 KiB
        // records: 4.4 against 3.7 GB/s here), and GnuTLS clients list ChaCha20 first.
        // SHA-256 suites lead because an external PSK is bound to SHA-256.
        builder
            .set_ciphersuites(
                "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256",
            )
            .map_err(setup)?;
        // Renegotiation (TLS 1.2) would run a handshake in the middle of transmission,
        // whose messages the memory-driven session only sends with the next reply;
        // nothing NBD needs, and a classic way to make a server work for nothing.
        builder.set_options(SslOptions::CIPHER_SERVER_PREFERENCE | SslOptions::NO_RENEGOTIATION);
        let mut parts = Vec::new();
        if let Some(dir) = &settings.certificates {
            load_certificates(&mut builder, dir, settings.verify_peer)?;
            parts.push(format!("certificates from {}", dir.display()));
            if settings.verify_peer {
                parts.push("client certificates required".into());
            }
        }
        let mut psk_path = None;
        if let Some(path) = &settings.psk_file {
            let keys = PskFile::load(path)?;
            builder.set_psk_server_callback(move |ssl, identity, out| {
                let name = String::from_utf8_lossy(identity.unwrap_or_default()).into_owned();
                let key = keys.key(&name).filter(|key| key.len() <= out.len());
                ssl.set_ex_data(
                    identity_index(),
                    OfferedIdentity {
                        name,
                        known: key.is_some(),
                    },
                );
                Ok(match key {
                    Some(key) => {
                        out[..key.len()].copy_from_slice(key);
                        key.len()
                    }
                    // Zero: no key, the handshake fails (unless certificates serve).
                    None => 0,
                })
            });
            parts.push(format!("pre-shared keys from {}", path.display()));
            psk_path = Some(path.clone());
        }
        Ok(Some(TargetTls {
            mode: settings.mode,
            context: builder.build(),
            psk_path,
            summary: parts.join(", "),
        }))
    }

    /// Whether TLS is offered or required.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// What the target uses, for its start-up message.
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// Runs the server side of the handshake over `socket` (right after the
    /// NBD_REP_ACK to NBD_OPT_STARTTLS).
    pub fn accept<S: Read + Write>(&self, socket: &mut S) -> Result<TlsSession, TlsError> {
        let mut ssl = Ssl::new(&self.context)
            .map_err(|e| TlsError::Handshake(format!("cannot start TLS: {}", one_line(&e))))?;
        ssl.set_accept_state();
        handshake(ssl, socket, |ssl, error| {
            let mut line = handshake_failure(ssl, error);
            if let Some(offered) = ssl.ex_data(identity_index()) {
                let file = self
                    .psk_path
                    .as_deref()
                    .map_or(String::new(), |p| p.display().to_string());
                if offered.known && line.contains("binder") {
                    // The key proof (the PSK binder) did not match.
                    line.push_str(&format!(
                        " (PSK identity '{}': the client's key differs from {file}'s)",
                        offered.name
                    ));
                } else if offered.known {
                    line.push_str(&format!(" (PSK identity '{}')", offered.name));
                } else {
                    line.push_str(&format!(
                        " (PSK identity '{}' is not in {file})",
                        offered.name
                    ));
                }
            }
            line
        })
    }
}

fn load_certificates(
    builder: &mut SslContextBuilder,
    dir: &Path,
    verify_peer: bool,
) -> Result<(), TlsError> {
    if !dir.is_dir() {
        return Err(TlsError::File {
            path: dir.to_path_buf(),
            reason: format!(
                "is not a directory (expected one holding {SERVER_CERT}, {SERVER_KEY} and {CA_CERT})"
            ),
        });
    }
    let cert = existing(dir.join(SERVER_CERT))?;
    let key = existing(dir.join(SERVER_KEY))?;
    use_identity(builder, &cert, &key)?;
    let ca = dir.join(CA_CERT);
    if verify_peer {
        let ca = existing(ca)?;
        builder.set_ca_file(&ca).map_err(|e| file_error(&ca, &e))?;
        let names = X509Name::load_client_ca_file(&ca).map_err(|e| file_error(&ca, &e))?;
        builder.set_client_ca_list(names);
        builder.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    }
    Ok(())
}
