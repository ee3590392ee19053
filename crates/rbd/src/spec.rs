//! How an image is named: `rbd:POOL[/NAMESPACE]/IMAGE[@SNAP][:KEY=VALUE]...`, the
//! form qemu users already write, with keys `id`, `conf`, `keyring`, `timeout`
//! (seconds; 0 waits forever, as Ceph does) and `exclusive` (true/false). A `\`
//! escapes a `:`, `@` or `/` that belongs to a name or value.

use std::fmt;
use std::time::Duration;

/// The scheme prefix.
pub const PREFIX: &str = "rbd:";

/// How long a request may wait for the cluster unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A parsed `rbd:` spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    /// The RADOS namespace ("" is the default one).
    pub namespace: String,
    pub image: String,
    /// A snapshot: served read-only.
    pub snapshot: Option<String>,
    /// The cephx user without `client.` (default `admin`).
    pub id: String,
    /// The configuration file; `None`: Ceph's own search ($CEPH_CONF,
    /// /etc/ceph/ceph.conf, ...).
    pub conf: Option<String>,
    /// The keyring; `None`: what the configuration says.
    pub keyring: Option<String>,
    /// How long a cluster operation may take before it fails; `None`: forever.
    pub timeout: Option<Duration>,
    /// Take librbd's exclusive lock and keep it (no other client can write).
    pub exclusive: bool,
}

impl RbdSpec {
    /// A spec for `pool/image` with every option at its default.
    pub fn new(pool: &str, image: &str) -> RbdSpec {
        RbdSpec {
            pool: pool.into(),
            namespace: String::new(),
            image: image.into(),
            snapshot: None,
            id: "admin".into(),
            conf: None,
            keyring: None,
            timeout: Some(DEFAULT_TIMEOUT),
            exclusive: false,
        }
    }

    /// Parses what follows `rbd:`.
    pub fn parse(text: &str) -> Result<RbdSpec, String> {
        RbdSpec::parse_with(text, &[])
    }

    /// Parses what follows `rbd:`, then sets `more` (`KEY`, `VALUE` pairs given
    /// outside the spec, as a configuration file's `rbd` table does). A key given
    /// twice, in the spec or between the two, is an error rather than a silent
    /// choice of one.
    pub fn parse_with(text: &str, more: &[(&str, String)]) -> Result<RbdSpec, String> {
        let text = text.strip_prefix(PREFIX).unwrap_or(text);
        let fields = split_unescaped(text, ':');
        let (path, options) = fields.split_first().expect("split returns one field");
        let form =
            "expected rbd:POOL[/NAMESPACE]/IMAGE[@SNAP][:id=NAME][:conf=PATH][:keyring=PATH]";
        let (path, snapshot) = match split_unescaped(path, '@').as_slice() {
            [path] => (path.clone(), None),
            [path, snap] if !snap.is_empty() => (path.clone(), Some(unescape(snap))),
            _ => return Err(format!("'rbd:{text}': bad snapshot name; {form}")),
        };
        let parts: Vec<String> = split_unescaped(&path, '/')
            .iter()
            .map(|p| unescape(p))
            .collect();
        let (pool, namespace, image) = match parts.as_slice() {
            [pool, image] => (pool, String::new(), image),
            [pool, namespace, image] => (pool, namespace.clone(), image),
            _ => return Err(format!("'rbd:{text}': {form}")),
        };
        if pool.is_empty() || image.is_empty() {
            return Err(format!("'rbd:{text}': empty pool or image name; {form}"));
        }
        let mut spec = RbdSpec::new(pool, image);
        spec.namespace = namespace;
        spec.snapshot = snapshot;
        let mut given: Vec<(&str, String)> = Vec::new();
        for option in options {
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| format!("'rbd:{text}': option '{option}' is not KEY=VALUE"))?;
            given.push((key, unescape(value)));
        }
        let in_spec = given.len();
        given.extend(more.iter().cloned());
        for (index, (key, value)) in given.iter().enumerate() {
            if let Some(first) = given[..index].iter().position(|(k, _)| k == key) {
                let second = if first < in_spec && index >= in_spec {
                    "in the spec and again outside it"
                } else {
                    "twice"
                };
                return Err(format!("'rbd:{text}': option '{key}' given {second}"));
            }
            spec.set(key, value)
                .map_err(|e| format!("'rbd:{text}': {e}"))?;
        }
        if text.contains('\0') {
            return Err(format!("'rbd:{text}': NUL in the spec"));
        }
        Ok(spec)
    }

    /// Sets one option, as in the spec or the config file's export table.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "id" => self.id = value.strip_prefix("client.").unwrap_or(value).into(),
            "conf" => self.conf = Some(value.into()),
            "keyring" => self.keyring = Some(value.into()),
            "timeout" => {
                let secs: f64 = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| format!("timeout '{value}' is not seconds"))?;
                self.timeout = (secs > 0.0).then(|| Duration::from_secs_f64(secs));
            }
            "exclusive" => {
                self.exclusive = match value {
                    "true" | "1" | "yes" => true,
                    "false" | "0" | "no" => false,
                    _ => return Err(format!("exclusive '{value}' is not true or false")),
                }
            }
            _ => {
                return Err(format!(
                    "unknown option '{key}' (known: id, conf, keyring, timeout, exclusive)"
                ))
            }
        }
        Ok(())
    }

    /// `POOL[/NAMESPACE]/IMAGE[@SNAP]`, for messages.
    pub fn name(&self) -> String {
        let mut name = self.pool.clone();
        if !self.namespace.is_empty() {
            name.push('/');
            name.push_str(&self.namespace);
        }
        name.push('/');
        name.push_str(&self.image);
        if let Some(snap) = &self.snapshot {
            name.push('@');
            name.push_str(snap);
        }
        name
    }
}

impl fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rbd:{}", self.name())
    }
}

/// Splits at `sep` where it is not preceded by a backslash; escapes stay in place.
fn split_unescaped(text: &str, sep: char) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        let field = fields.last_mut().expect("at least one field");
        if c == '\\' {
            field.push(c);
            if let Some(next) = chars.next() {
                field.push(next);
            }
        } else if c == sep {
            fields.push(String::new());
        } else {
            field.push(c);
        }
    }
    fields
}

fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_image_and_defaults() {
        let spec = RbdSpec::parse("rbd:rbd/disk").unwrap();
        assert_eq!(spec, RbdSpec::new("rbd", "disk"));
        assert_eq!(spec.id, "admin");
        assert_eq!(spec.timeout, Some(DEFAULT_TIMEOUT));
        assert_eq!(spec.to_string(), "rbd:rbd/disk");
    }

    #[test]
    fn namespace_snapshot_and_options() {
        let spec = RbdSpec::parse(
            "rbd:pool/ns/img@snap1:id=gw:conf=/etc/c\\:1.conf:keyring=/k:timeout=2.5:exclusive=true",
        )
        .unwrap();
        assert_eq!(spec.pool, "pool");
        assert_eq!(spec.namespace, "ns");
        assert_eq!(spec.image, "img");
        assert_eq!(spec.snapshot.as_deref(), Some("snap1"));
        assert_eq!(spec.id, "gw");
        assert_eq!(spec.conf.as_deref(), Some("/etc/c:1.conf"));
        assert_eq!(spec.keyring.as_deref(), Some("/k"));
        assert_eq!(spec.timeout, Some(Duration::from_millis(2500)));
        assert!(spec.exclusive);
        assert_eq!(spec.name(), "pool/ns/img@snap1");
    }

    #[test]
    fn client_prefix_and_zero_timeout() {
        let spec = RbdSpec::parse("rbd:p/i:id=client.gw:timeout=0").unwrap();
        assert_eq!(spec.id, "gw");
        assert_eq!(spec.timeout, None);
    }

    #[test]
    fn options_from_outside_the_spec() {
        let more = [
            ("id", "gw".to_string()),
            ("keyring", "/etc/ceph/k:1".to_string()),
            ("timeout", "5".to_string()),
        ];
        let spec = RbdSpec::parse_with("rbd:p/i:conf=/c", &more).unwrap();
        assert_eq!(spec.id, "gw");
        assert_eq!(spec.conf.as_deref(), Some("/c"));
        assert_eq!(spec.keyring.as_deref(), Some("/etc/ceph/k:1"));
        assert_eq!(spec.timeout, Some(Duration::from_secs(5)));
        let err = RbdSpec::parse_with("rbd:p/i:id=a", &[("id", "b".into())]).unwrap_err();
        assert!(err.contains("'id' given in the spec and again"), "{err}");
        let err = RbdSpec::parse_with("rbd:p/i", &[("colour", "blue".into())]).unwrap_err();
        assert!(err.contains("unknown option 'colour'"), "{err}");
    }

    #[test]
    fn malformed_specs_say_what_is_expected() {
        for bad in [
            "rbd:image",
            "rbd:/image",
            "rbd:pool/",
            "rbd:a/b/c/d",
            "rbd:p/i@",
            "rbd:p/i:nokey",
            "rbd:p/i:colour=blue",
            "rbd:p/i:timeout=-1",
            "rbd:p/i:exclusive=maybe",
            "rbd:p/i:id=a:id=b",
        ] {
            let err = RbdSpec::parse(bad).expect_err(bad);
            assert!(err.contains("rbd:"), "{bad}: {err}");
        }
    }
}
