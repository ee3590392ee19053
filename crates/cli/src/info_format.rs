//! What every `blockwire info` prints the same way, whatever the protocol: a
//! device's allocation map (text in `nbdinfo --map`'s columns, or JSON), sizes for
//! people, JSON strings.

use std::fmt::Write as _;

use anyhow::{anyhow, bail, Result};
use blockwire_blockdev::size::format_size;
use blockwire_blockdev::{Device, Extent};
use blockwire_nbd::initiator::allocation_type;

/// The whole export's extents, asking again from wherever each answer stopped;
/// neighbours of the same type are merged.
pub fn allocation_map(device: &Device) -> Result<Vec<Extent>> {
    let size = device.size();
    let mut map: Vec<Extent> = Vec::new();
    let mut offset = 0;
    while offset < size {
        let page = device
            .extents(offset, size - offset)
            .map_err(|e| anyhow!("block status: {e}"))?;
        let Some(last) = page.last() else {
            bail!("block status at offset {offset} returned no extents");
        };
        offset = last.end();
        for extent in page {
            match map.last_mut() {
                Some(prev) if prev.state == extent.state && prev.end() == extent.offset => {
                    prev.len += extent.len
                }
                _ => map.push(extent),
            }
        }
    }
    Ok(map)
}

/// `64M` for exact sizes, else one decimal (`20.0M`).
pub fn human(bytes: u64) -> String {
    let exact = format_size(bytes);
    if exact != bytes.to_string() || bytes < 1024 {
        return exact;
    }
    let units = [("P", 50), ("T", 40), ("G", 30), ("M", 20), ("K", 10)];
    let (unit, shift) = units
        .into_iter()
        .find(|(_, shift)| bytes >= 1u64 << shift)
        .unwrap();
    format!("{:.1}{unit}", bytes as f64 / (1u64 << shift) as f64)
}

/// One line per extent, in `nbdinfo --map`'s columns.
pub fn map_text(extents: &[Extent]) -> String {
    let mut out = String::new();
    for extent in extents {
        let (kind, words) = allocation_type(extent.state);
        let _ = writeln!(
            out,
            "{:>10}  {:>10}  {:>3}  {words}",
            extent.offset, extent.len, kind
        );
    }
    out
}

/// A JSON string literal.
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The allocation map as a JSON array.
pub fn map_json(extents: &[Extent]) -> String {
    let items: Vec<String> = extents
        .iter()
        .map(|extent| {
            let (kind, words) = allocation_type(extent.state);
            format!(
                "  {{\"offset\": {}, \"length\": {}, \"type\": {kind}, \"description\": {}}}",
                extent.offset,
                extent.len,
                json_string(words)
            )
        })
        .collect();
    if items.is_empty() {
        return "[]\n".into();
    }
    format!("[\n{}\n]\n", items.join(",\n"))
}

#[cfg(test)]
mod tests {
    use blockwire_blockdev::ExtentState;

    use super::*;

    fn extent(offset: u64, len: u64, state: ExtentState) -> Extent {
        Extent { offset, len, state }
    }

    #[test]
    fn map_lines_use_nbdinfo_columns() {
        let text = map_text(&[
            extent(0, 3145728, ExtentState::Hole),
            extent(3145728, 2097152, ExtentState::Data),
            extent(5242880, 4096, ExtentState::Zero),
        ]);
        assert_eq!(
            text,
            "         0     3145728    3  hole,zero\n   3145728     2097152    0  data\n   5242880        4096    2  zero\n"
        );
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\u0001é\"");
        assert_eq!(
            map_json(&[extent(0, 512, ExtentState::Data)]),
            "[\n  {\"offset\": 0, \"length\": 512, \"type\": 0, \"description\": \"data\"}\n]\n"
        );
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(64 << 20), "64M");
        assert_eq!(human((20 << 20) + 512), "20.0M");
        assert_eq!(human(1000), "1000");
        assert_eq!(human(0), "0");
    }
}
