//! Human sizes: `4096`, `512K`, `64M`, `4G`, `1T`, `1GiB`, `100MB` (binary multiples).

/// What a size may be, for error messages.
const ALLOWED: &str = "a number of bytes with an optional suffix K, M, G, T or P, e.g. 64M";

/// Parses a size with an optional binary suffix (K, M, G, T, P; `iB`/`B` accepted).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    if number.is_empty() {
        return Err(format!("'{text}' is not a size ({ALLOWED})"));
    }
    let value: u64 = number
        .parse()
        .map_err(|_| format!("'{text}' is too large"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        "P" | "PB" | "PIB" => 50,
        other => {
            return Err(format!(
                "'{text}' has an unknown suffix '{other}' ({ALLOWED})"
            ))
        }
    };
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// Formats a byte count with the largest binary unit that divides it exactly.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 5] = [("P", 50), ("T", 40), ("G", 30), ("M", 20), ("K", 10)];
    for (unit, shift) in UNITS {
        let scale = 1u64 << shift;
        if bytes >= scale && bytes.is_multiple_of(scale) {
            return format!("{}{}", bytes / scale, unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999P").is_err());
    }

    #[test]
    fn formats_exact_units() {
        assert_eq!(format_size(4 << 30), "4G");
        assert_eq!(format_size(1536), "1536");
        assert_eq!(format_size(3 << 20), "3M");
    }
}
