//! blockwire.toml(5), generated from the configuration's own types: schemars turns
//! the serde structs of [`blockwire_server::config`] and their doc comments into a schema, and
//! this walks it into a manual page. The keys and their meaning are written once,
//! in `config.rs`; the example is the one the Debian package installs.

use roff::{bold, italic, roman, Roff};
use serde_json::{Map, Value};

use blockwire_server::config::Config;

/// The example configuration (installed as /etc/blockwire/blockwire.toml).
pub const EXAMPLE: &str = include_str!("../../../packaging/blockwire.toml");

/// The page, in roff.
pub fn render() -> String {
    let schema = schemars::schema_for!(Config);
    let root = schema.as_value();
    let empty = Map::new();
    let defs = root
        .get("$defs")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut page = Roff::new();
    page.control(
        "TH",
        [
            "BLOCKWIRE.TOML",
            "5",
            "",
            &format!("blockwire {}", env!("CARGO_PKG_VERSION")),
        ],
    );
    page.control("SH", ["NAME"]);
    page.text([roman(
        "blockwire.toml - the exports, listeners and limits of blockwire serve",
    )]);
    page.control("SH", ["SYNOPSIS"]);
    page.text([bold("blockwire serve --config"), roman(" "), italic("FILE")]);
    page.control("SH", ["DESCRIPTION"]);
    page.text([roman(
        "A TOML file. Each [[export]] table is one export, served over NBD, AoE, \
         iSCSI and NVMe/TCP in any combination; the other tables set what the exports share. \
         Unknown keys are errors. blockwire check-config FILE shows what a file would \
         serve, or its first error and the line it is on.",
    )]);
    let mut nested: Vec<(String, String)> = Vec::new();
    if let Some(properties) = root.get("properties").and_then(Value::as_object) {
        for (key, property) in properties {
            let (heading, def) = match property.get("type").and_then(Value::as_str) {
                Some("array") => (format!("[[{key}]]"), reference(&property["items"])),
                _ => (format!("[{key}]"), reference(property)),
            };
            page.control("SH", [heading.as_str()]);
            if let Some(text) = description(property) {
                page.text(marked_up(text));
            }
            if let Some(def) = def.and_then(|name| defs.get(&name)) {
                keys(&mut page, def, defs, &heading, &mut nested);
            }
        }
    }
    // Inline tables (an export's aoe = { ... }), after the tables that hold them.
    let mut done = Vec::new();
    while let Some((heading, def)) = nested.pop() {
        if done.contains(&def) {
            continue;
        }
        done.push(def.clone());
        page.control("SH", [heading.as_str()]);
        if let Some(schema) = defs.get(&def) {
            if let Some(text) = description(schema) {
                page.text(marked_up(text));
            }
            keys(&mut page, schema, defs, &heading, &mut nested);
        }
    }
    page.control("SH", ["EXAMPLE"]);
    page.control("nf", []);
    for line in EXAMPLE.lines() {
        page.text([roman(line)]);
    }
    page.control("fi", []);
    page.control("SH", ["SEE ALSO"]);
    page.text([roman(
        "blockwire(1), blockwire-serve(1), blockwire-check-config(1), systemd.service(5)",
    )]);
    page.render()
}

/// The keys of a table: one tagged paragraph per key, its type and meaning.
fn keys(
    page: &mut Roff,
    table: &Value,
    defs: &Map<String, Value>,
    heading: &str,
    nested: &mut Vec<(String, String)>,
) {
    let Some(properties) = table.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: Vec<&str> = table
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (key, property) in properties {
        let kind = type_name(property, defs, key, heading, nested);
        page.control("TP", []);
        let mut tag = vec![bold(key.as_str()), roman(" ("), italic(kind)];
        if required.contains(&key.as_str()) {
            tag.push(roman(", required"));
        }
        tag.push(roman(")"));
        page.text(tag);
        page.text(marked_up(description(property).unwrap_or("(undocumented)")));
    }
}

/// A doc comment's text with its `code` spans in bold, as manual pages set
/// literals, and no backtick left.
fn marked_up(text: &str) -> Vec<roff::Inline> {
    text.split('`')
        .enumerate()
        .filter(|(_, piece)| !piece.is_empty())
        .map(|(index, piece)| {
            if index % 2 == 1 {
                bold(piece)
            } else {
                roman(piece)
            }
        })
        .collect()
}

/// The definition a schema refers to (`{"$ref": "#/$defs/NAME"}`), also through
/// an optional's `anyOf [ref, null]`.
fn reference(schema: &Value) -> Option<String> {
    if let Some(path) = schema.get("$ref").and_then(Value::as_str) {
        return path.rsplit('/').next().map(str::to_string);
    }
    schema
        .get("anyOf")
        .and_then(Value::as_array)?
        .iter()
        .find_map(reference)
}

fn description(schema: &Value) -> Option<&str> {
    schema.get("description").and_then(Value::as_str)
}

/// A reader's name for a value's type: "string", "array of strings", "table", ...
fn type_name(
    schema: &Value,
    defs: &Map<String, Value>,
    key: &str,
    heading: &str,
    nested: &mut Vec<(String, String)>,
) -> String {
    if let Some(def) = schema.get("$ref").and_then(Value::as_str) {
        let name = def.rsplit('/').next().unwrap_or(def).to_string();
        let target = defs.get(&name).cloned().unwrap_or(Value::Null);
        if target.get("type").and_then(Value::as_str) == Some("object") {
            // A table of its own (an export's aoe = { ... }): described after.
            let section = format!("{key} = {{ ... }} in {heading}");
            let kind = format!("inline table, see {section}");
            nested.push((section, name));
            return kind;
        }
        return type_name(&target, defs, key, heading, nested);
    }
    if let Some(options) = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
    {
        let names: Vec<String> = options
            .iter()
            .filter(|o| o.get("type").and_then(Value::as_str) != Some("null"))
            .map(|o| type_name(o, defs, key, heading, nested))
            .collect();
        return names.join(" or ");
    }
    if let Some(value) = schema.get("const") {
        return value.to_string();
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let names: Vec<String> = values.iter().map(Value::to_string).collect();
        return names.join(" or ");
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many
            .iter()
            .filter_map(Value::as_str)
            .filter(|&t| t != "null")
            .collect(),
        _ => Vec::new(),
    };
    match types.first().copied() {
        Some("array") => {
            let items = type_name(&schema["items"], defs, key, heading, nested);
            format!("array of {items}s")
        }
        Some("object") => "inline table".to_string(),
        Some("integer") => "integer".to_string(),
        Some("number") => "number".to_string(),
        Some("boolean") => "boolean".to_string(),
        Some("string") => "string".to_string(),
        _ => "value".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_every_table_is_on_the_page() {
        let page = render();
        for key in [
            "[server]",
            "[[export]]",
            "[[volume]]",
            "[iscsi]",
            "[metrics]",
            "[nvme]",
            "discovery_listen",
            "nqn",
            "hosts",
            "max_handshakes_per_address",
            "max_connections_per_address",
            "send_timeout",
            "write_behind",
            "config_string",
            "buffer_count",
            "initiators",
            "iqn_prefix",
            "disk_latency",
            "keyring",
            "exclusive",
        ] {
            assert!(
                page.contains(key),
                "{key} is missing from blockwire.toml(5)"
            );
        }
        assert!(!page.contains("(undocumented)"), "a key has no doc comment");
        assert!(!page.contains('`'), "a literal backtick on the page");
    }

    #[test]
    fn the_example_is_a_valid_configuration() {
        let config: Config = toml::from_str(EXAMPLE).unwrap();
        config.validate().unwrap();
    }
}
