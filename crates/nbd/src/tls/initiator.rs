//! The initiator's TLS credentials, from an `nbds://` URI's parameters.

use std::io::{Read, Write};
use std::net::IpAddr;
use std::path::PathBuf;

use openssl::ssl::{
    Ssl, SslContext, SslContextBuilder, SslMethod, SslOptions, SslVerifyMode, SslVersion,
};

use super::{
    file_error, handshake, handshake_failure, one_line, use_identity, PskFile, TlsError,
    TlsSession, CA_CERT, CLIENT_CERT, CLIENT_KEY,
};

/// What an `nbds://` URI asks for (libnbd's parameters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitiatorTlsSettings {
    /// `tls-certificates=DIR`: `ca-cert.pem` to check the server, and
    /// `client-cert.pem` and `client-key.pem` to show it, when present. Without it
    /// (and without a PSK file) the system's trusted CAs check the server.
    pub certificates: Option<PathBuf>,
    /// `tls-psk-file=FILE`: authenticate with a pre-shared key instead.
    pub psk_file: Option<PathBuf>,
    /// The PSK identity (`nbds://USER@host/...` or `tls-username=`); default the
    /// login name, as libnbd does.
    pub username: Option<String>,
    /// `tls-verify-peer=false` skips checking the server's certificate.
    pub verify_peer: bool,
    /// `tls-hostname=`: the name the server's certificate must carry (default the
    /// URI's host).
    pub hostname: Option<String>,
}

impl Default for InitiatorTlsSettings {
    fn default() -> Self {
        InitiatorTlsSettings {
            certificates: None,
            psk_file: None,
            username: None,
            verify_peer: true,
            hostname: None,
        }
    }
}

/// Credentials ready for connecting (loaded once per device, used by every
/// connection and reconnect).
pub struct InitiatorTls {
    context: SslContext,
    /// Checked against the server's certificate.
    expected_host: Option<String>,
    /// The PSK identity, when a key authenticates.
    psk_identity: Option<String>,
}

impl std::fmt::Debug for InitiatorTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitiatorTls")
            .field("expected_host", &self.expected_host)
            .field("psk_identity", &self.psk_identity)
            .finish()
    }
}

fn login_name() -> Option<String> {
    ["USER", "LOGNAME"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|name| !name.is_empty()))
}

impl InitiatorTls {
    /// Loads the credentials `settings` names for a server at `host` (`None` for a
    /// Unix socket, where only `tls-hostname` names the certificate to expect).
    pub fn load(
        settings: &InitiatorTlsSettings,
        host: Option<&str>,
    ) -> Result<InitiatorTls, TlsError> {
        let setup = |e: openssl::error::ErrorStack| TlsError::Config(one_line(&e));
        let mut builder = SslContextBuilder::new(SslMethod::tls_client()).map_err(setup)?;
        builder
            .set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(setup)?;
        // No TLS 1.2 renegotiation: see the target's context.
        builder.set_options(SslOptions::NO_RENEGOTIATION);
        let mut psk_identity = None;
        if let Some(path) = &settings.psk_file {
            let keys = PskFile::load(path)?;
            let Some(identity) = settings.username.clone().or_else(login_name) else {
                return Err(TlsError::Config(
                    "no PSK user name: give it as nbds://USER@HOST/... or tls-username=USER".into(),
                ));
            };
            let Some(key) = keys.key(&identity).map(<[u8]>::to_vec) else {
                return Err(TlsError::File {
                    path: path.clone(),
                    reason: format!("has no key for user '{identity}'"),
                });
            };
            let name = identity.clone();
            builder.set_psk_client_callback(move |_ssl, _hint, identity_out, key_out| {
                let name = name.as_bytes();
                // The identity goes out as a NUL-terminated C string.
                if name.len() >= identity_out.len() || key.len() > key_out.len() {
                    return Ok(0);
                }
                identity_out[..name.len()].copy_from_slice(name);
                identity_out[name.len()] = 0;
                key_out[..key.len()].copy_from_slice(&key);
                Ok(key.len())
            });
            // The key authenticates both ends; no certificate is exchanged.
            builder.set_verify(SslVerifyMode::NONE);
            psk_identity = Some(identity);
        } else {
            load_certificates(&mut builder, settings)?;
        }
        let expected_host = match (&settings.hostname, host) {
            _ if psk_identity.is_some() || !settings.verify_peer => None,
            (Some(name), _) => Some(name.clone()),
            (None, host) => host.map(str::to_string),
        };
        Ok(InitiatorTls {
            context: builder.build(),
            expected_host,
            psk_identity,
        })
    }

    /// Runs the client side of the handshake over `socket` (right after the
    /// server's NBD_REP_ACK to NBD_OPT_STARTTLS).
    pub fn connect<S: Read + Write>(&self, socket: &mut S) -> Result<TlsSession, TlsError> {
        let start = |e: openssl::error::ErrorStack| {
            TlsError::Handshake(format!("cannot start TLS: {}", one_line(&e)))
        };
        let mut ssl = Ssl::new(&self.context).map_err(start)?;
        ssl.set_connect_state();
        if let Some(host) = &self.expected_host {
            match host.parse::<IpAddr>() {
                Ok(ip) => ssl.param_mut().set_ip(ip).map_err(start)?,
                Err(_) => {
                    ssl.set_hostname(host).map_err(start)?;
                    ssl.param_mut().set_host(host).map_err(start)?;
                }
            }
        }
        let session = handshake(ssl, socket, |ssl, error| {
            let mut line = handshake_failure(ssl, error);
            if let Some(identity) = &self.psk_identity {
                line.push_str(&format!(
                    " (PSK identity '{identity}': does the server hold the same key?)"
                ));
            }
            line
        })?;
        if self.psk_identity.is_some() && session.peer_certified() {
            // The server skipped our key and showed a certificate nobody checked.
            return Err(TlsError::Handshake(
                "the server did not accept our pre-shared key (it sent a certificate instead)"
                    .into(),
            ));
        }
        Ok(session)
    }

    /// The PSK identity used, if a key authenticates.
    pub fn psk_identity(&self) -> Option<&str> {
        self.psk_identity.as_deref()
    }
}

fn load_certificates(
    builder: &mut SslContextBuilder,
    settings: &InitiatorTlsSettings,
) -> Result<(), TlsError> {
    match &settings.certificates {
        Some(dir) => {
            if !dir.is_dir() {
                return Err(TlsError::File {
                    path: dir.clone(),
                    reason: format!("is not a directory (expected one holding {CA_CERT})"),
                });
            }
            let ca = dir.join(CA_CERT);
            if ca.exists() {
                builder.set_ca_file(&ca).map_err(|e| file_error(&ca, &e))?;
            } else if settings.verify_peer {
                return Err(TlsError::File {
                    path: ca,
                    reason: "is missing: it checks the server's certificate".into(),
                });
            }
            let (cert, key) = (dir.join(CLIENT_CERT), dir.join(CLIENT_KEY));
            if cert.exists() {
                use_identity(builder, &cert, &key)?;
            }
        }
        None => builder
            .set_default_verify_paths()
            .map_err(|e| TlsError::Config(one_line(&e)))?,
    }
    builder.set_verify(if settings.verify_peer {
        SslVerifyMode::PEER
    } else {
        SslVerifyMode::NONE
    });
    Ok(())
}
