//! What serve uses where the configuration and the flags are silent: listen
//! addresses, target names, where CHAP secrets may come from. The validation, the
//! orchestration and `check-config` read them here, so they always agree.

/// NBD's port registered with IANA, on loopback only (safe by default).
pub const NBD_LISTEN: &str = "127.0.0.1:10809";
/// iSCSI's port registered with IANA, on loopback only.
pub const ISCSI_LISTEN: &str = "127.0.0.1:3260";
/// NVMe/TCP's I/O port registered with IANA, on loopback only.
pub const NVME_LISTEN: &str = "127.0.0.1:4420";
/// The port of an NVMe/TCP address given without one.
pub const NVME_PORT: u16 = 4420;
/// The port of NVMe/TCP's discovery controller (IANA), beside each I/O address.
pub const NVME_DISCOVERY_PORT: u16 = 8009;
/// Target names are this prefix, ':' and the export name unless told otherwise.
pub const DEFAULT_IQN_PREFIX: &str = "iqn.2026-11.dev.blockwire";
/// Environment variable that may hold the CHAP secret instead of a file.
pub const CHAP_SECRET_ENV: &str = "BLOCKWIRE_CHAP_SECRET";
/// Environment variable that may hold the mutual CHAP secret instead of a file.
pub const MUTUAL_CHAP_SECRET_ENV: &str = "BLOCKWIRE_MUTUAL_CHAP_SECRET";

/// The default target name of an export: the prefix, ':' and the export name in
/// the characters an IQN allows (RFC 3722: lower case letters, digits, '.', '-',
/// ':').
pub fn default_iqn(prefix: &str, export: &str) -> String {
    let name: String = export
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.' | '-' | ':') => c,
            _ => '-',
        })
        .collect();
    format!("{prefix}:{name}")
}

/// The default subsystem NQN of an export (`nqn.2026-11.dev.blockwire:NAME`).
pub fn default_nqn(export: &str) -> String {
    blockwire_nvme::default_nqn(export)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_iqns_keep_only_what_an_iqn_allows() {
        assert_eq!(
            default_iqn(DEFAULT_IQN_PREFIX, "Disk_0.img"),
            "iqn.2026-11.dev.blockwire:disk-0.img"
        );
        assert_eq!(default_iqn("iqn.x", "a b:c"), "iqn.x:a-b:c");
    }
}
