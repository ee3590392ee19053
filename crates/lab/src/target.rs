//! What a cell serves and how the initiator names it: the `blockwire serve --config`
//! file for the target namespace (one export per channel, or one export on every
//! channel) and the URI the bench opens in the initiator namespace. Pure.

use std::fmt::Write;
use std::path::Path;

use crate::matrix::{CellSpec, Protocol};
use crate::netns::{interface, target_addr};

/// NBD's registered port.
pub const NBD_PORT: u16 = 10809;
/// iSCSI's registered port.
pub const ISCSI_PORT: u16 = 3260;
/// NVMe/TCP's registered port.
pub const NVME_PORT: u16 = 4420;
/// NVMe subsystem names are this, ':' and the export name (what `nvme = true`
/// gives an export).
pub const NQN_PREFIX: &str = "nqn.2026-11.dev.blockwire";
/// The netserve the network baseline measures against (the bench's default).
pub const NETSERVE_PORT: u16 = 10810;
/// AoE shelf of the lab's exports; export K is slot K.
pub const AOE_SHELF: u16 = 1;
/// The NFS export's path in ganesha's pseudo file system; export K's bytes are
/// the file `chK.img` in it.
pub const NFS_PSEUDO: &str = "/lab";
/// iSCSI target names are this, ':' and the export name.
pub const IQN_PREFIX: &str = "iqn.2026-11.dev.blockwire.lab";

/// Where the exports' bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Sparse memory in the target process.
    Memory,
    /// A sparse file per export in the run's work directory.
    File,
}

impl std::str::FromStr for Backing {
    type Err = String;

    fn from_str(text: &str) -> Result<Backing, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "memory" | "mem" => Ok(Backing::Memory),
            "file" => Ok(Backing::File),
            _ => Err(format!("'{text}': give memory or file")),
        }
    }
}

/// The name of export `k`.
pub fn export_name(k: u32) -> String {
    format!("ch{k}")
}

/// Bytes each export holds so that the cell's volume holds `size`: a stripe of N
/// exports splits it in N whole chunks each.
pub fn export_size(spec: &CellSpec, size: u64, chunk: u64) -> u64 {
    let exports = u64::from(spec.exports());
    if exports == 1 {
        return size;
    }
    size.div_ceil(exports).div_ceil(chunk) * chunk
}

/// The file that holds export `k`'s bytes in an NFS cell's exported directory.
pub fn nfs_file(k: u32) -> String {
    format!("{}.img", export_name(k))
}

/// The serve configuration for a cell. Baseline cells are served from memory
/// whatever `backing` says ("what the host itself can do"). NFS cells have none:
/// nfs-ganesha serves them (an empty string).
pub fn serve_config(
    spec: &CellSpec,
    size: u64,
    chunk: u64,
    backing: Backing,
    dir: &Path,
) -> String {
    let mut out = String::new();
    if spec.protocol == Protocol::Nfs {
        return out;
    }
    let export_size = export_size(spec, size, chunk);
    match spec.protocol {
        Protocol::Nbd => {
            let _ = writeln!(out, "[server]\nlisten = [\"0.0.0.0:{NBD_PORT}\"]\n");
        }
        Protocol::Iscsi => {
            let _ = writeln!(
                out,
                "[iscsi]\nlisten = [\"0.0.0.0:{ISCSI_PORT}\"]\niqn_prefix = \"{IQN_PREFIX}\"\n"
            );
        }
        Protocol::Nvme => {
            // The bench names each subsystem itself: no discovery listener.
            let _ = writeln!(
                out,
                "[nvme]\nlisten = [\"0.0.0.0:{NVME_PORT}\"]\ndiscovery = false\n"
            );
        }
        Protocol::Aoe | Protocol::Nfs => {}
    }
    for k in 0..spec.exports() {
        let name = export_name(k);
        let _ = writeln!(out, "[[export]]\nname = \"{name}\"");
        if backing == Backing::File && !spec.baseline {
            let path = dir.join(format!("{name}.img"));
            let _ = writeln!(
                out,
                "path = \"{}\"\nsize = \"{export_size}\"",
                path.display()
            );
        } else {
            let _ = writeln!(out, "memory = \"{export_size}\"");
        }
        let _ = writeln!(out, "nbd = {}", spec.protocol == Protocol::Nbd);
        match spec.protocol {
            Protocol::Aoe => {
                // One export per channel on its own interface; one export alone is
                // served on every channel.
                let interfaces: Vec<String> = if spec.striped {
                    vec![format!("\"{}\"", interface(k))]
                } else {
                    (0..spec.bed.channels)
                        .map(|c| format!("\"{}\"", interface(c)))
                        .collect()
                };
                let xdp = if spec.aoe_xdp {
                    ", xdp = \"generic\""
                } else {
                    ""
                };
                let _ = writeln!(
                    out,
                    "aoe = {{ interfaces = [{}], shelf = {AOE_SHELF}, slot = {k}{xdp} }}",
                    interfaces.join(", ")
                );
            }
            Protocol::Iscsi => {
                let _ = writeln!(out, "iscsi = {{ iqn = \"{IQN_PREFIX}:{name}\" }}");
            }
            Protocol::Nvme => {
                let _ = writeln!(out, "nvme = true");
            }
            Protocol::Nbd | Protocol::Nfs => {}
        }
        if let Some(rate) = spec.disk.rate_mb_per_s {
            let _ = writeln!(out, "disk_rate = {rate:?}");
        }
        if let Some(latency) = spec.disk.latency_ms {
            let _ = writeln!(out, "disk_latency = {latency:?}");
        }
        out.push('\n');
    }
    out
}

/// The URI of export `k` as the initiator reaches it over channel `k` (over every
/// channel for AoE's one-export layout).
fn member_uri(spec: &CellSpec, k: u32) -> String {
    let name = export_name(k);
    let xdp = if spec.aoe_xdp { "?xdp" } else { "" };
    match spec.protocol {
        Protocol::Nbd => format!("nbd://{}:{NBD_PORT}/{name}", target_addr(k)),
        Protocol::Iscsi => format!(
            "iscsi://{}:{ISCSI_PORT}/{IQN_PREFIX}:{name}/0",
            target_addr(k)
        ),
        Protocol::Nvme => format!(
            "nvme+tcp://{}:{NVME_PORT}/{NQN_PREFIX}:{name}",
            target_addr(k)
        ),
        Protocol::Nfs => format!("nfs://{}{NFS_PSEUDO}/{}", target_addr(k), nfs_file(k)),
        Protocol::Aoe if spec.striped || spec.bed.channels == 1 => {
            format!("aoe://{}/e{AOE_SHELF}.{k}{xdp}", interface(k))
        }
        Protocol::Aoe => {
            let interfaces: Vec<String> = (0..spec.bed.channels).map(interface).collect();
            format!("aoe://{}/e{AOE_SHELF}.{k}{xdp}", interfaces.join(","))
        }
    }
}

/// What the bench opens: the one export, or a stripe over the per-channel exports.
pub fn initiator_uri(spec: &CellSpec, chunk: u64) -> String {
    if spec.exports() == 1 {
        return member_uri(spec, 0);
    }
    let members: Vec<String> = (0..spec.exports()).map(|k| member_uri(spec, k)).collect();
    format!("stripe:{}K:{}", chunk >> 10, members.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{BedSpec, Disk, LabWorkload, Rate};

    fn spec(protocol: Protocol, channels: u32, striped: bool) -> CellSpec {
        CellSpec {
            protocol,
            bed: BedSpec {
                channels,
                mtu: 9000,
                rate: Rate(Some(1000)),
            },
            striped,
            workload: LabWorkload::Sequential,
            disk: Disk {
                rate_mb_per_s: Some(210.0),
                latency_ms: None,
            },
            baseline: false,
            aoe_xdp: false,
        }
    }

    #[test]
    fn a_striped_cell_names_one_member_per_channel() {
        let uri = initiator_uri(&spec(Protocol::Nbd, 2, true), 256 << 10);
        assert_eq!(
            uri,
            "stripe:256K:nbd://10.77.1.1:10809/ch0,nbd://10.77.2.1:10809/ch1"
        );
        let uri = initiator_uri(&spec(Protocol::Aoe, 2, true), 64 << 10);
        assert_eq!(uri, "stripe:64K:aoe://eth0/e1.0,aoe://eth1/e1.1");
        let uri = initiator_uri(&spec(Protocol::Iscsi, 1, false), 64 << 10);
        assert_eq!(
            uri,
            "iscsi://10.77.1.1:3260/iqn.2026-11.dev.blockwire.lab:ch0/0"
        );
        // One AoE export over every channel.
        let uri = initiator_uri(&spec(Protocol::Aoe, 3, false), 64 << 10);
        assert_eq!(uri, "aoe://eth0,eth1,eth2/e1.0");
        // Through AF_XDP on the initiator too.
        let xdp = CellSpec {
            aoe_xdp: true,
            ..spec(Protocol::Aoe, 2, true)
        };
        assert_eq!(
            initiator_uri(&xdp, 64 << 10),
            "stripe:64K:aoe://eth0/e1.0?xdp,aoe://eth1/e1.1?xdp"
        );
        let text = serve_config(&xdp, 64 << 20, 64 << 10, Backing::Memory, Path::new("/t"));
        assert!(text.contains("slot = 1, xdp = \"generic\" }"), "{text}");
    }

    #[test]
    fn the_serve_config_parses_and_throttles_every_export() {
        let dir = Path::new("/tmp/x");
        let text = serve_config(
            &spec(Protocol::Aoe, 4, true),
            256 << 20,
            256 << 10,
            Backing::Memory,
            dir,
        );
        assert_eq!(text.matches("[[export]]").count(), 4);
        assert_eq!(text.matches("disk_rate = 210.0").count(), 4);
        assert!(text.contains("aoe = { interfaces = [\"eth3\"], shelf = 1, slot = 3 }"));
        assert!(text.contains("memory = \"67108864\""));
        assert!(text.contains("nbd = false"));
        assert!(!text.contains("[server]"));

        let text = serve_config(
            &spec(Protocol::Iscsi, 1, false),
            100 << 20,
            1 << 20,
            Backing::File,
            dir,
        );
        assert!(text.contains("listen = [\"0.0.0.0:3260\"]"));
        assert!(text.contains("path = \"/tmp/x/ch0.img\""));
        assert!(text.contains("iscsi = { iqn = \"iqn.2026-11.dev.blockwire.lab:ch0\" }"));

        let mut baseline = spec(Protocol::Nbd, 1, false);
        baseline.baseline = true;
        baseline.disk = Disk::UNTHROTTLED;
        let text = serve_config(&baseline, 64 << 20, 1 << 20, Backing::File, dir);
        assert!(text.contains("memory = "), "{text}");
        assert!(!text.contains("disk_rate"));
        assert!(text.contains("nbd = true"));
    }

    #[test]
    fn nvme_serves_a_subsystem_per_export_and_stripes_them() {
        let striped = spec(Protocol::Nvme, 2, true);
        assert_eq!(
            initiator_uri(&striped, 256 << 10),
            "stripe:256K:nvme+tcp://10.77.1.1:4420/nqn.2026-11.dev.blockwire:ch0,\
             nvme+tcp://10.77.2.1:4420/nqn.2026-11.dev.blockwire:ch1"
        );
        let text = serve_config(
            &striped,
            64 << 20,
            256 << 10,
            Backing::Memory,
            Path::new("/t"),
        );
        assert!(
            text.starts_with("[nvme]\nlisten = [\"0.0.0.0:4420\"]\ndiscovery = false\n"),
            "{text}"
        );
        assert_eq!(text.matches("nvme = true").count(), 2, "{text}");
        assert_eq!(text.matches("nbd = false").count(), 2, "{text}");
        assert!(!text.contains("iscsi") && !text.contains("aoe"), "{text}");
    }

    #[test]
    fn exports_split_the_data_set_in_whole_chunks() {
        let four = spec(Protocol::Nbd, 4, true);
        assert_eq!(export_size(&four, 256 << 20, 256 << 10), 64 << 20);
        // 100 MiB over 3 members of 1 MiB chunks: 34 MiB each.
        let three = spec(Protocol::Nbd, 3, true);
        assert_eq!(export_size(&three, 100 << 20, 1 << 20), 34 << 20);
        assert_eq!(
            export_size(&spec(Protocol::Nbd, 1, false), 5000, 4096),
            5000
        );
    }

    #[test]
    fn an_nfs_cell_names_a_file_in_ganeshas_export_and_has_no_serve_config() {
        let nfs = spec(Protocol::Nfs, 1, false);
        assert_eq!(initiator_uri(&nfs, 1 << 20), "nfs://10.77.1.1/lab/ch0.img");
        assert_eq!(
            serve_config(&nfs, 64 << 20, 1 << 20, Backing::File, Path::new("/t")),
            ""
        );
    }
}
