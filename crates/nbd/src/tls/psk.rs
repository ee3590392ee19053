//! Pre-shared key files in the format nbdkit, qemu (`tls-creds-psk`) and libnbd read,
//! as written by GnuTLS's `psktool`: one `username:hexkey` per line.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::TlsError;

/// Longest key accepted, in bytes. OpenSSL's PSK callbacks have room for 256
/// (`PSK_MAX_PSK_LEN`); psktool writes 32.
pub const MAX_KEY_LEN: usize = 256;
/// Longest identity accepted, in bytes (OpenSSL's `PSK_MAX_IDENTITY_LEN`).
pub const MAX_IDENTITY_LEN: usize = 128;

/// The keys of a PSK file, by identity (user name).
#[derive(Clone)]
pub struct PskFile {
    path: PathBuf,
    keys: HashMap<String, Vec<u8>>,
}

// Keys stay out of logs and panic messages.
impl fmt::Debug for PskFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PskFile")
            .field("path", &self.path)
            .field("identities", &self.keys.len())
            .finish()
    }
}

impl PskFile {
    /// Reads and checks `path`; an error names the file and the first bad line.
    pub fn load(path: &Path) -> Result<PskFile, TlsError> {
        let text = std::fs::read_to_string(path).map_err(|e| TlsError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        PskFile::parse(path, &text)
    }

    /// Parses the text of a PSK file read from `path` (named in errors).
    pub fn parse(path: &Path, text: &str) -> Result<PskFile, TlsError> {
        let bad = |line: usize, reason: String| TlsError::File {
            path: path.to_path_buf(),
            reason: format!("line {line}: {reason}"),
        };
        let mut keys = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((identity, hex)) = line.split_once(':') else {
                return Err(bad(number, "expected USERNAME:HEXKEY".into()));
            };
            if identity.is_empty() || identity.len() > MAX_IDENTITY_LEN {
                return Err(bad(
                    number,
                    format!("the user name must be 1 to {MAX_IDENTITY_LEN} bytes"),
                ));
            }
            let key = decode_hex(hex.trim())
                .ok_or_else(|| bad(number, "the key is not an even number of hex digits".into()))?;
            if key.is_empty() || key.len() > MAX_KEY_LEN {
                return Err(bad(
                    number,
                    format!("the key must be 1 to {MAX_KEY_LEN} bytes"),
                ));
            }
            if keys.insert(identity.to_string(), key).is_some() {
                return Err(bad(number, format!("user '{identity}' appears twice")));
            }
        }
        if keys.is_empty() {
            return Err(TlsError::File {
                path: path.to_path_buf(),
                reason: "holds no USERNAME:HEXKEY line".into(),
            });
        }
        Ok(PskFile {
            path: path.to_path_buf(),
            keys,
        })
    }

    /// The key of `identity`, if the file has it.
    pub fn key(&self, identity: &str) -> Option<&[u8]> {
        self.keys.get(identity).map(Vec::as_slice)
    }

    /// The file the keys came from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let pairs = text.as_bytes().chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return None;
    }
    let digit = |byte: u8| (byte as char).to_digit(16).map(|d| d as u8);
    pairs
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PskFile, String> {
        PskFile::parse(Path::new("/etc/keys.psk"), text).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_psktool_lines() {
        let file =
            parse("alice:0123456789abcdefABCDEF0123456789\n\n# comment\nbob:ff00\r\n").unwrap();
        assert_eq!(
            file.key("alice").unwrap(),
            [
                0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45,
                0x67, 0x89
            ]
        );
        assert_eq!(file.key("bob").unwrap(), [0xff, 0x00]);
        assert!(file.key("carol").is_none());
        // No key in the debug form.
        assert!(!format!("{file:?}").contains("ff00"));
    }

    #[test]
    fn bad_lines_are_named_with_the_file() {
        for (text, expected) in [
            ("alice", "line 1: expected USERNAME:HEXKEY"),
            (
                "alice:abc",
                "line 1: the key is not an even number of hex digits",
            ),
            (
                "ok:00\nalice:zz",
                "line 2: the key is not an even number of hex digits",
            ),
            (":00", "line 1: the user name must be"),
            ("alice:", "line 1: the key must be 1 to"),
            ("a:00\na:01", "line 2: user 'a' appears twice"),
            ("# nothing\n", "holds no USERNAME:HEXKEY line"),
        ] {
            let message = parse(text).unwrap_err();
            assert!(message.contains("/etc/keys.psk"), "{message}");
            assert!(message.contains(expected), "{text:?}: {message}");
        }
        let long_key = format!("a:{}", "00".repeat(MAX_KEY_LEN + 1));
        assert!(parse(&long_key).unwrap_err().contains("the key must be"));
    }
}
