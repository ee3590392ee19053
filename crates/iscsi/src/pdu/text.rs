//! Text key=value pairs (RFC 7143 §6.1): the data segment of Login and Text PDUs.
//! Each pair is `key=value` followed by a NUL byte; keys are at most 63 bytes and
//! values at most 255 bytes, except binary CHAP values, which may run to 8192.

/// Longest key name (§6.1).
pub const MAX_KEY_LEN: usize = 63;
/// Longest ordinary value (§6.1).
pub const MAX_VALUE_LEN: usize = 255;
/// Longest value of a key that carries large binary data (CHAP_C, CHAP_R; §6.1).
pub const MAX_LARGE_VALUE_LEN: usize = 8192;

/// Why a text segment is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("a text pair has no '='")]
    MissingEquals,
    #[error("a key is empty")]
    EmptyKey,
    #[error("key '{0}...' is longer than 63 bytes")]
    KeyTooLong(String),
    #[error("the value of '{0}' is too long")]
    ValueTooLong(String),
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("key '{0}' has a character not allowed in key names")]
    BadKeyCharacter(String),
}

fn value_limit(key: &str) -> usize {
    match key {
        "CHAP_C" | "CHAP_R" => MAX_LARGE_VALUE_LEN,
        // SendTargets answers and TargetAddress lists may be long but arrive from
        // the target; the initiator's own keys stay within 255.
        _ => MAX_VALUE_LEN,
    }
}

/// Splits a text segment into its pairs, in order. Trailing NUL padding is ignored;
/// a final pair without its NUL is accepted (some initiators omit it).
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    let mut pairs = Vec::new();
    for item in data.split(|&b| b == 0) {
        if item.is_empty() {
            continue;
        }
        let text = std::str::from_utf8(item).map_err(|_| TextError::NotUtf8)?;
        let (key, value) = text.split_once('=').ok_or(TextError::MissingEquals)?;
        if key.is_empty() {
            return Err(TextError::EmptyKey);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(TextError::KeyTooLong(key.chars().take(16).collect()));
        }
        // Key names use letters, digits, '.', '-', '+', '@', '_', and '#' in the
        // X# extension keys of §13.5.2 (§6.1).
        if !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-+@_#".contains(&b))
        {
            return Err(TextError::BadKeyCharacter(key.chars().take(16).collect()));
        }
        if value.len() > value_limit(key) {
            return Err(TextError::ValueTooLong(key.to_string()));
        }
        pairs.push((key.to_string(), value.to_string()));
    }
    Ok(pairs)
}

/// Encodes pairs as a text segment (each pair NUL-terminated).
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, value) in pairs {
        out.extend_from_slice(key.as_ref().as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_ref().as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip() {
        let pairs = vec![
            (
                "InitiatorName".to_string(),
                "iqn.2026-11.test:a".to_string(),
            ),
            ("SessionType".to_string(), "Normal".to_string()),
            ("AuthMethod".to_string(), "CHAP,None".to_string()),
        ];
        let bytes = encode(&pairs);
        assert_eq!(
            &bytes[..],
            &b"InitiatorName=iqn.2026-11.test:a\0SessionType=Normal\0AuthMethod=CHAP,None\0"[..]
        );
        assert_eq!(parse(&bytes).unwrap(), pairs);
    }

    #[test]
    fn padding_and_a_missing_last_nul_are_accepted() {
        assert_eq!(
            parse(b"A=1\0B=\0\0\0").unwrap(),
            vec![("A".into(), "1".into()), ("B".into(), String::new())]
        );
        assert_eq!(parse(b"A=1").unwrap(), vec![("A".into(), "1".into())]);
    }

    #[test]
    fn bad_text_is_refused() {
        assert_eq!(parse(b"NoEquals\0"), Err(TextError::MissingEquals));
        assert_eq!(parse(b"=1\0"), Err(TextError::EmptyKey));
        assert_eq!(parse(b"A=\xff\0"), Err(TextError::NotUtf8));
        assert_eq!(
            parse(b"Bad Key=1\0"),
            Err(TextError::BadKeyCharacter("Bad Key".into()))
        );
        let long_key = format!("{}=1", "K".repeat(64));
        assert!(matches!(
            parse(long_key.as_bytes()),
            Err(TextError::KeyTooLong(_))
        ));
        let long_value = format!("A={}", "v".repeat(256));
        assert_eq!(
            parse(long_value.as_bytes()),
            Err(TextError::ValueTooLong("A".into()))
        );
        let chap = format!("CHAP_R=0x{}", "ab".repeat(1000));
        assert!(parse(chap.as_bytes()).is_ok());
        assert_eq!(
            parse(b"X#example.com=1\0").unwrap(),
            vec![("X#example.com".into(), "1".into())]
        );
    }
}
