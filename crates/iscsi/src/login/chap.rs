//! CHAP as iSCSI uses it (RFC 7143 §12.1.3, RFC 1994): algorithms, the response
//! hash, binary value encodings (§6.1: "0x" hex, "0b" base64) and a constant-time
//! comparison.

use md5::{Digest, Md5};
use sha2::Sha256;

/// The CHAP_A algorithms we support, by their IANA PPP code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChapAlgorithm {
    /// CHAP_A=5.
    Md5,
    /// CHAP_A=7 (RFC 7143 §12.1.3 allows the IANA CHAP algorithm registry).
    Sha256,
}

impl ChapAlgorithm {
    pub fn from_code(code: u64) -> Option<ChapAlgorithm> {
        match code {
            5 => Some(ChapAlgorithm::Md5),
            7 => Some(ChapAlgorithm::Sha256),
            _ => None,
        }
    }

    pub fn code(self) -> u8 {
        match self {
            ChapAlgorithm::Md5 => 5,
            ChapAlgorithm::Sha256 => 7,
        }
    }

    /// Length of the response hash, which is also the challenge length we send.
    pub fn digest_len(self) -> usize {
        match self {
            ChapAlgorithm::Md5 => 16,
            ChapAlgorithm::Sha256 => 32,
        }
    }
}

/// The CHAP response H(identifier || secret || challenge) (RFC 1994 §4.1).
pub fn chap_response(algorithm: ChapAlgorithm, id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
    match algorithm {
        ChapAlgorithm::Md5 => {
            let mut hash = Md5::new();
            hash.update([id]);
            hash.update(secret);
            hash.update(challenge);
            hash.finalize().to_vec()
        }
        ChapAlgorithm::Sha256 => {
            let mut hash = Sha256::new();
            hash.update([id]);
            hash.update(secret);
            hash.update(challenge);
            hash.finalize().to_vec()
        }
    }
}

/// Encodes binary data as a hex constant ("0x" and lowercase digits).
pub(crate) fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 + bytes.len() * 2);
    out.push_str("0x");
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 15)]));
    }
    out
}

/// Decodes a binary value: "0x"/"0X" hex (an odd digit count has an implied
/// leading zero) or "0b"/"0B" base64 (§6.1). None if malformed or empty.
pub(crate) fn decode_binary(value: &str) -> Option<Vec<u8>> {
    let (prefix, rest) = (value.get(..2)?, value.get(2..)?);
    let bytes = match prefix {
        "0x" | "0X" => decode_hex(rest)?,
        "0b" | "0B" => decode_base64(rest)?,
        _ => return None,
    };
    (!bytes.is_empty()).then_some(bytes)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn decode_hex(digits: &str) -> Option<Vec<u8>> {
    let digits = digits.as_bytes();
    let mut out = Vec::with_capacity(digits.len() / 2 + 1);
    let (head, tail) = digits.split_at(digits.len() % 2);
    if let [single] = head {
        out.push(hex_digit(*single)?);
    }
    for pair in tail.chunks_exact(2) {
        out.push(hex_digit(pair[0])? << 4 | hex_digit(pair[1])?);
    }
    Some(out)
}

fn base64_digit(c: u8) -> Option<u32> {
    match c {
        b'A'..=b'Z' => Some(u32::from(c - b'A')),
        b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
        b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Standard base64 (RFC 4648 §4) with optional '=' padding.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=').as_bytes();
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = acc << 6 | base64_digit(c)?;
        }
        acc <<= 6 * (4 - chunk.len() as u32);
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// Compares two byte strings in time that depends only on their lengths, so a
/// wrong CHAP response does not reveal how many leading bytes were right.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_encodings() {
        assert_eq!(encode_hex(&[0x01, 0xab, 0xff]), "0x01abff");
        assert_eq!(decode_binary("0x01abff"), Some(vec![0x01, 0xab, 0xff]));
        assert_eq!(decode_binary("0X1ABFF"), Some(vec![0x01, 0xab, 0xff]));
        assert_eq!(decode_binary("0bAav/"), Some(vec![0x01, 0xab, 0xff]));
        assert_eq!(decode_binary("0baGVsbG8="), Some(b"hello".to_vec()));
        assert_eq!(decode_binary("0BaGVsbG8"), Some(b"hello".to_vec()));
        assert_eq!(decode_binary("0x"), None);
        assert_eq!(decode_binary("0xzz"), None);
        assert_eq!(decode_binary("0b!!!!"), None);
        assert_eq!(decode_binary("0bA"), None);
        assert_eq!(decode_binary("1234"), None);
        assert_eq!(decode_binary("0"), None);
        assert_eq!(decode_binary("0xé"), None);
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn algorithm_codes() {
        assert_eq!(ChapAlgorithm::from_code(5), Some(ChapAlgorithm::Md5));
        assert_eq!(ChapAlgorithm::from_code(7), Some(ChapAlgorithm::Sha256));
        assert_eq!(ChapAlgorithm::from_code(6), None);
        assert_eq!(ChapAlgorithm::Sha256.code(), 7);
    }
}
