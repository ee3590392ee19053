//! A mistake in a configuration, said once and shown two ways: in a file as
//! `FILE:LINE: export 'NAME': KEY: what is wrong (what is allowed)`, and on the
//! command line with the flag that set the key (`--shelf: ...`). `check-config`,
//! `serve --config`, `serve PATH` and reload all report through this.

use std::path::Path;

/// The table a mistake is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Server,
    Iscsi,
    Metrics,
    Nvme,
    /// The `index`-th `[[export]]`.
    Export(usize),
    /// The `index`-th `[[volume]]`.
    Volume(usize),
}

/// What would mend a mistake: a key to set (in a file) or a flag to give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fix {
    /// The key, as in [`ConfigError::key`].
    pub key: &'static str,
    /// Its value as TOML writes it (`"10G"`, `true`); `None` for a placeholder.
    pub value: Option<&'static str>,
    /// What it does, after the key (`to create it as a sparse file`).
    pub why: &'static str,
}

/// A configuration that does not make sense, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub table: Option<Table>,
    /// The key at fault, dotted for inline tables (`aoe.shelf`).
    pub key: Option<&'static str>,
    /// What is wrong, and in brackets what is allowed.
    pub message: String,
    pub fix: Option<Fix>,
}

impl ConfigError {
    pub fn new(table: Option<Table>, key: Option<&'static str>, message: String) -> ConfigError {
        ConfigError {
            table,
            key,
            message,
            fix: None,
        }
    }

    /// The same mistake, with what would mend it.
    pub fn with_fix(
        mut self,
        key: &'static str,
        value: Option<&'static str>,
        why: &'static str,
    ) -> Self {
        self.fix = Some(Fix { key, value, why });
        self
    }

    /// `FILE:LINE: export 'NAME': KEY: message (fix)`, the line found in `text`.
    pub fn in_file(&self, file: &Path, text: &str) -> String {
        let line = self.line(text);
        let mut out = match line {
            Some(line) => format!("{}:{line}: ", file.display()),
            None => format!("{}: ", file.display()),
        };
        match self.table {
            Some(Table::Export(index)) => {
                let name = table_name(text, "export", index).unwrap_or_else(|| "?".into());
                out.push_str(&format!("export '{name}': "));
            }
            Some(Table::Volume(index)) => {
                let name = table_name(text, "volume", index).unwrap_or_else(|| "?".into());
                out.push_str(&format!("volume '{name}': "));
            }
            Some(Table::Server) => out.push_str("[server] "),
            Some(Table::Iscsi) => out.push_str("[iscsi] "),
            Some(Table::Metrics) => out.push_str("[metrics] "),
            Some(Table::Nvme) => out.push_str("[nvme] "),
            None => {}
        }
        if let Some(key) = self.key {
            out.push_str(&format!("{key}: "));
        }
        out.push_str(&self.message);
        if let Some(fix) = &self.fix {
            let value = fix.value.unwrap_or("...");
            out.push_str(&format!("; set {} = {value} {}", fix.key, fix.why));
        }
        out
    }

    /// `--flag: message (fix)`, naming flags by `flag_of` (a key without a flag is
    /// named as the key).
    pub fn on_command_line(
        &self,
        flag_of: impl Fn(Option<Table>, &str) -> Option<&'static str>,
    ) -> String {
        let mut out = String::new();
        if let Some(key) = self.key {
            out.push_str(flag_of(self.table, key).unwrap_or(key));
            out.push_str(": ");
        }
        out.push_str(&self.message);
        if let Some(fix) = &self.fix {
            let flag = flag_of(self.table, fix.key).unwrap_or(fix.key);
            match fix.value {
                Some("true") => out.push_str(&format!("; give {flag} {}", fix.why)),
                Some(value) => {
                    let value = value.trim_matches('"');
                    out.push_str(&format!("; give {flag} {value} {}", fix.why));
                }
                None => out.push_str(&format!("; give {flag} {}", fix.why)),
            }
        }
        out
    }

    /// The line of the key in its table, else of the table's header.
    fn line(&self, text: &str) -> Option<usize> {
        let (header, end) = match self.table? {
            Table::Server => table_span(text, "server", 0)?,
            Table::Iscsi => table_span(text, "iscsi", 0)?,
            Table::Metrics => table_span(text, "metrics", 0)?,
            Table::Nvme => table_span(text, "nvme", 0)?,
            Table::Export(index) => table_span(text, "export", index)?,
            Table::Volume(index) => table_span(text, "volume", index)?,
        };
        let key = self.key.map(|key| key.split('.').next().unwrap_or(key));
        let found = key.and_then(|key| {
            text.lines()
                .enumerate()
                .take(end)
                .skip(header)
                .find(|(_, line)| key_of(line) == Some(key))
                .map(|(number, _)| number + 1)
        });
        Some(found.unwrap_or(header))
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(key) = self.key {
            write!(f, "{key}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The key a `KEY = VALUE` line sets.
fn key_of(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty() && !key.starts_with('#') && !key.starts_with('[')).then_some(key)
}

/// Whether a line is a table header (`[x]` or `[[x]]`).
fn is_header(line: &str) -> bool {
    line.trim_start().starts_with('[')
}

/// The header's line (1-based) of the `index`-th `[[table]]` (or the `[table]`), and
/// the line where the table ends (exclusive, 0-based: the next header).
fn table_span(text: &str, table: &str, index: usize) -> Option<(usize, usize)> {
    let array = format!("[[{table}]]");
    let single = format!("[{table}]");
    let lines: Vec<&str> = text.lines().collect();
    let header = lines
        .iter()
        .enumerate()
        .filter(|(_, line)| {
            let line = line.trim_start();
            line.starts_with(&array) || line.starts_with(&single)
        })
        .nth(index)
        .map(|(number, _)| number)?;
    let end = lines[header + 1..]
        .iter()
        .position(|line| is_header(line))
        .map_or(lines.len(), |offset| header + 1 + offset);
    Some((header + 1, end))
}

/// The `name = "..."` of the `index`-th `[[table]]`, read from the text (so a file
/// that does not parse still names its export).
fn table_name(text: &str, table: &str, index: usize) -> Option<String> {
    let (header, end) = table_span(text, table, index)?;
    text.lines()
        .take(end)
        .skip(header)
        .find(|line| key_of(line) == Some("name"))
        .and_then(|line| line.split_once('='))
        .map(|(_, value)| value.trim().trim_matches('"').to_string())
}

/// The table that holds line `line` (1-based), for a parse error.
fn table_at(text: &str, line: usize) -> Option<Table> {
    let mut counts: [usize; 2] = [0, 0];
    let mut current = None;
    for text_line in text.lines().take(line) {
        let trimmed = text_line.trim_start();
        if !trimmed.starts_with('[') {
            continue;
        }
        current = if trimmed.starts_with("[[export]]") {
            counts[0] += 1;
            Some(Table::Export(counts[0] - 1))
        } else if trimmed.starts_with("[[volume]]") {
            counts[1] += 1;
            Some(Table::Volume(counts[1] - 1))
        } else if trimmed.starts_with("[server]") {
            Some(Table::Server)
        } else if trimmed.starts_with("[iscsi]") {
            Some(Table::Iscsi)
        } else if trimmed.starts_with("[metrics]") {
            Some(Table::Metrics)
        } else if trimmed.starts_with("[nvme]") {
            Some(Table::Nvme)
        } else {
            None
        };
    }
    current
}

/// A TOML or type error from parsing, said as a person would: its line, the table
/// and key, and the types named as values (no Rust type names).
pub fn parse_error(file: &Path, text: &str, error: &toml::de::Error) -> String {
    let line = error
        .span()
        .map(|span| text[..span.start.min(text.len())].matches('\n').count() + 1);
    let message = plain_message(error.message().trim());
    let Some(line) = line else {
        return format!("{}: {message}", file.display());
    };
    let mut out = format!("{}:{line}: ", file.display());
    match table_at(text, line) {
        Some(Table::Export(index)) => {
            if let Some(name) = table_name(text, "export", index) {
                out.push_str(&format!("export '{name}': "));
            }
        }
        Some(Table::Volume(index)) => {
            if let Some(name) = table_name(text, "volume", index) {
                out.push_str(&format!("volume '{name}': "));
            }
        }
        Some(Table::Server) => out.push_str("[server] "),
        Some(Table::Iscsi) => out.push_str("[iscsi] "),
        Some(Table::Metrics) => out.push_str("[metrics] "),
        Some(Table::Nvme) => out.push_str("[nvme] "),
        None => {}
    }
    let key = text
        .lines()
        .nth(line - 1)
        .and_then(key_of)
        .filter(|key| !message.contains(&format!("'{key}'")));
    if let Some(key) = key {
        out.push_str(&format!("{key}: "));
    }
    out.push_str(&message);
    out
}

/// serde's wording without Rust's types and Markdown's backticks.
fn plain_message(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown field ") {
        // "unknown field `readonly`, expected one of `name`, `path`"
        let (field, allowed) = rest.split_once(", expected").unwrap_or((rest, ""));
        let field = field.trim_matches('`');
        let allowed = allowed
            .trim()
            .trim_start_matches("one of ")
            .replace('`', "");
        let hint = if allowed.is_empty() {
            String::new()
        } else {
            format!(" (allowed: {allowed})")
        };
        return format!("unknown key '{field}'{hint}");
    }
    let replacements = [
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        (
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        ),
        ("expected u64", "expected a whole number of 0 or more"),
        ("expected usize", "expected a whole number of 0 or more"),
        ("expected f64", "expected a number"),
        (
            "expected a sequence",
            "expected a list such as [\"a\", \"b\"]",
        ),
        (
            "expected a string or a list of strings",
            "expected a string or a list of strings",
        ),
        ("missing field", "missing key"),
        (
            "data did not match any variant of untagged enum IscsiExport",
            "expected true, false or a table such as { iqn = \"...\" }",
        ),
    ];
    let mut message = message.to_string();
    for (from, to) in replacements {
        message = message.replace(from, to);
    }
    message.replace('`', "'")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[server]\nlisten = [\"127.0.0.1:1\"]\n\n[[export]]\nname = \"a\"\nmemory = \"1G\"\n\n\
                        [[export]]\nname = \"b\"\nmemory = \"1G\"\naoe = { interfaces = [\"eth0\"], shelf = 65535, slot = 1 }\n";

    #[test]
    fn a_mistake_in_a_file_names_its_line_export_and_key() {
        let error = ConfigError::new(
            Some(Table::Export(1)),
            Some("aoe.shelf"),
            "65535 is the broadcast shelf (0-65534)".into(),
        );
        assert_eq!(
            error.in_file(Path::new("x.toml"), TEXT),
            "x.toml:11: export 'b': aoe.shelf: 65535 is the broadcast shelf (0-65534)"
        );
        assert_eq!(
            error.on_command_line(|_, key| (key == "aoe.shelf").then_some("--shelf")),
            "--shelf: 65535 is the broadcast shelf (0-65534)"
        );
    }

    #[test]
    fn a_fix_is_a_key_in_a_file_and_a_flag_on_the_command_line() {
        let error = ConfigError::new(
            Some(Table::Export(0)),
            Some("path"),
            "x.img does not exist".into(),
        )
        .with_fix("size", Some("\"SIZE\""), "to create it as a sparse file");
        assert_eq!(
            error.in_file(Path::new("c.toml"), TEXT),
            "c.toml:4: export 'a': path: x.img does not exist; set size = \"SIZE\" to create it as a sparse file"
        );
        let flags = |_: Option<Table>, key: &str| match key {
            "size" => Some("--size"),
            "path" => Some("PATH"),
            _ => None,
        };
        assert_eq!(
            error.on_command_line(flags),
            "PATH: x.img does not exist; give --size SIZE to create it as a sparse file"
        );
    }

    #[test]
    fn parse_errors_have_no_rust_types_and_name_the_key() {
        let text = "[[export]]\nname = \"a\"\nmemory = \"1G\"\naoe = { interfaces = [\"e\"], shelf = \"one\", slot = 1 }\n";
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Aoe {
            interfaces: Vec<String>,
            shelf: u16,
            slot: u8,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Export {
            name: String,
            memory: String,
            aoe: Aoe,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct File {
            export: Vec<Export>,
        }
        let error = toml::from_str::<File>(text).unwrap_err();
        let said = parse_error(Path::new("c.toml"), text, &error);
        assert!(said.starts_with("c.toml:4: export 'a': aoe: "), "{said}");
        assert!(said.contains("0 to 65535"), "{said}");
        assert!(!said.contains("u16") && !said.contains('`'), "{said}");
    }

    #[test]
    fn unknown_keys_list_the_allowed_ones_in_one_line() {
        assert_eq!(
            plain_message("unknown field `readonly`, expected one of `name`, `path`"),
            "unknown key 'readonly' (allowed: name, path)"
        );
    }
}
