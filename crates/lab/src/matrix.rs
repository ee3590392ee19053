//! The experiment matrix: protocol × MTU × link rate × channels × layout × workload,
//! expanded into beds (what the network looks like) and the cells measured on each.
//! Pure: nothing here touches the system.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A protocol the lab serves and reads back: the block protocols with our own target
/// and initiator, and NFS with nfs-ganesha as the server and our libnfs client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Nbd,
    Aoe,
    Iscsi,
    /// NVMe over TCP (NVMe-oF's TCP transport).
    Nvme,
    /// NFSv3: nfs-ganesha (FSAL_VFS over the cell's directory) in the target
    /// namespace, `blockwire bench nfs://` (libnfs, userspace) in the initiator's.
    Nfs,
}

impl Protocol {
    /// The block protocols: the default list. NFS is measured when asked for by
    /// name (or by a preset), since it needs nfs-ganesha and rpcbind.
    pub const ALL: [Protocol; 4] = [
        Protocol::Nbd,
        Protocol::Aoe,
        Protocol::Iscsi,
        Protocol::Nvme,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Nbd => "nbd",
            Protocol::Aoe => "aoe",
            Protocol::Iscsi => "iscsi",
            Protocol::Nvme => "nvme",
            Protocol::Nfs => "nfs",
        }
    }

    /// How reports name it: NFS says which server and client, since this host's
    /// kernel has neither and both ends are userspace.
    pub fn display_name(self) -> &'static str {
        match self {
            Protocol::Nfs => "NFS (ganesha, libnfs)",
            other => other.name(),
        }
    }

    /// Whether one export can be reached over several channels at once without a
    /// stripe: AoE's initiator spreads one target over several interfaces (the AoE
    /// spec's multipath); NBD, iSCSI and NVMe/TCP connect to one address.
    pub fn multipath(self) -> bool {
        self == Protocol::Aoe
    }
}

impl FromStr for Protocol {
    type Err = String;

    fn from_str(text: &str) -> Result<Protocol, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "nbd" => Ok(Protocol::Nbd),
            "aoe" => Ok(Protocol::Aoe),
            "iscsi" => Ok(Protocol::Iscsi),
            "nvme" | "nvme-tcp" | "nvme+tcp" => Ok(Protocol::Nvme),
            "nfs" | "nfs3" => Ok(Protocol::Nfs),
            _ => Err(format!(
                "unknown protocol '{text}' (choose from nbd, aoe, iscsi, nvme, nfs)"
            )),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A storage workload of the lab: which `blockwire bench` workload runs in a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LabWorkload {
    /// dd-style write then read of the data set in 1 MiB requests.
    Sequential,
    /// bonnie++'s set: per-character, block write / rewrite / read, seeks.
    Bonnie,
    /// 4 KiB random reads and writes over a queue-depth sweep.
    Random,
    /// iozone-style record-size sweep, 4 KiB to 16 MiB, one request at a time
    /// (seed 002).
    Sweep,
    /// Debian's `bonnie++ -f` on ext4 over `blockwire mount` (a loop device on the
    /// FUSE file), as the seeds ran bonnie: [`crate::fs_bonnie`].
    BonnieFs,
}

impl LabWorkload {
    pub const ALL: [LabWorkload; 5] = [
        LabWorkload::Sequential,
        LabWorkload::Bonnie,
        LabWorkload::Random,
        LabWorkload::Sweep,
        LabWorkload::BonnieFs,
    ];

    /// The name `blockwire bench --workload` takes, and the JSON's `workload`
    /// (`bonnie-fs` runs bonnie++ itself, not the bench).
    pub fn name(self) -> &'static str {
        match self {
            LabWorkload::Sequential => "sequential",
            LabWorkload::Bonnie => "bonnie",
            LabWorkload::Random => "random",
            LabWorkload::Sweep => "sweep",
            LabWorkload::BonnieFs => crate::fs_bonnie::WORKLOAD,
        }
    }
}

impl FromStr for LabWorkload {
    type Err = String;

    fn from_str(text: &str) -> Result<LabWorkload, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "sequential" | "seq" | "dd" => Ok(LabWorkload::Sequential),
            "bonnie" | "bonnie++" => Ok(LabWorkload::Bonnie),
            "random" | "rand" => Ok(LabWorkload::Random),
            "sweep" | "iozone" => Ok(LabWorkload::Sweep),
            "bonnie-fs" | "bonniefs" | "fs-bonnie" => Ok(LabWorkload::BonnieFs),
            _ => Err(format!(
                "unknown workload '{text}' (choose from sequential, bonnie, random, sweep, \
                 bonnie-fs)"
            )),
        }
    }
}

impl fmt::Display for LabWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A link rate in Mbit/s (10^6 bits); `None` leaves the veth unshaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Rate(pub Option<u64>);

impl Rate {
    pub const UNLIMITED: Rate = Rate(None);

    pub fn mbit(self) -> Option<u64> {
        self.0
    }

    /// The rate in MB/s (10^6 bytes), when limited.
    pub fn mb_per_s(self) -> Option<f64> {
        self.0.map(|mbit| mbit as f64 / 8.0)
    }
}

/// Parses `1g`, `10gbit`, `200m`, `200mbit`, `500` (Mbit), `none`/`unlimited`.
impl FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Rate, String> {
        let lower = text.trim().to_ascii_lowercase();
        if matches!(lower.as_str(), "none" | "unlimited" | "off" | "0") {
            return Ok(Rate::UNLIMITED);
        }
        let number_end = lower
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(lower.len());
        let (number, unit) = lower.split_at(number_end);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("'{text}' is not a rate (e.g. 1g, 10g, 200m, none)"))?;
        let scale = match unit.trim_end_matches("bit").trim_end_matches("bps") {
            "" | "m" => 1.0,
            "g" => 1000.0,
            "k" => 0.001,
            _ => return Err(format!("'{text}': unknown unit (use k, m or g, in bits)")),
        };
        let mbit = (value * scale).round();
        if !(1.0..=400_000.0).contains(&mbit) {
            return Err(format!("'{text}': give between 1 Mbit and 400 Gbit"));
        }
        Ok(Rate(Some(mbit as u64)))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => f.write_str("unlimited"),
            Some(mbit) if mbit >= 1000 && mbit % 1000 == 0 => write!(f, "{} Gbit", mbit / 1000),
            Some(mbit) => write!(f, "{mbit} Mbit"),
        }
    }
}

/// Whether cells on several channels stripe one export per channel, reach one
/// export over every channel, or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layouts {
    Striped,
    Single,
    Both,
}

impl FromStr for Layouts {
    type Err = String;

    fn from_str(text: &str) -> Result<Layouts, String> {
        match text.trim().to_ascii_lowercase().as_str() {
            "yes" | "true" | "on" | "striped" => Ok(Layouts::Striped),
            "no" | "false" | "off" | "single" => Ok(Layouts::Single),
            "both" => Ok(Layouts::Both),
            _ => Err(format!("'{text}': give yes, no or both")),
        }
    }
}

impl Layouts {
    fn choices(self) -> &'static [bool] {
        match self {
            Layouts::Striped => &[true],
            Layouts::Single => &[false],
            Layouts::Both => &[true, false],
        }
    }
}

/// The disks behind the exports: a throttle (MB/s for reads and writes together,
/// 10^6 bytes) and a per-request latency, or neither.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Disk {
    pub rate_mb_per_s: Option<f64>,
    pub latency_ms: Option<f64>,
}

impl Disk {
    pub const UNTHROTTLED: Disk = Disk {
        rate_mb_per_s: None,
        latency_ms: None,
    };
}

/// The network between the two namespaces: `channels` veth pairs, each at `mtu` and
/// shaped to `rate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BedSpec {
    pub channels: u32,
    pub mtu: u32,
    pub rate: Rate,
}

impl fmt::Display for BedSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} × {} at MTU {}", self.channels, self.rate, self.mtu)
    }
}

/// One measured configuration: a protocol over a bed, one layout, one workload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CellSpec {
    pub protocol: Protocol,
    pub bed: BedSpec,
    /// One export per channel, striped (RAID-0) on the initiator, as seed 003; else
    /// one export (reached over every channel where the protocol can).
    pub striped: bool,
    pub workload: LabWorkload,
    pub disk: Disk,
    /// The host's own figure: served from memory, unthrottled and unshaped.
    pub baseline: bool,
    /// AoE through AF_XDP on both sides (`serve --aoe-xdp`, `aoe://...?xdp`).
    #[serde(default)]
    pub aoe_xdp: bool,
}

impl CellSpec {
    /// Exports the target serves for this cell.
    pub fn exports(&self) -> u32 {
        if self.striped {
            self.bed.channels
        } else {
            1
        }
    }

    /// A short name for progress lines and chart labels.
    pub fn label(&self) -> String {
        let layout = match (self.bed.channels, self.striped) {
            (1, _) => "1 ch".to_string(),
            (n, true) => format!("{n} ch striped"),
            (n, false) => format!("{n} ch one export"),
        };
        let base = if self.baseline { ", host baseline" } else { "" };
        let xdp = if self.aoe_xdp { " (AF_XDP)" } else { "" };
        format!(
            "{}{xdp} {} MTU {} {} {}{base}",
            self.protocol, self.workload, self.bed.mtu, self.bed.rate, layout
        )
    }
}

/// What to measure, as the flags (or a preset) give it.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub protocols: Vec<Protocol>,
    pub mtus: Vec<u32>,
    pub rates: Vec<Rate>,
    pub channels: Vec<u32>,
    pub layouts: Layouts,
    pub workloads: Vec<LabWorkload>,
    pub disk: Disk,
    /// Also measure every cell served from memory with no disk throttle and no link
    /// shaping ("what the host itself can do").
    pub baseline: bool,
    /// Move AoE frames through AF_XDP on both sides where the MTU allows
    /// ([`AOE_XDP_MAX_MTU`]) and the link is unshaped: frames an AF_XDP socket sends
    /// leave through the driver directly, skipping the qdisc, so tc cannot shape them
    /// (measured: 462 MB/s over a "1 Gbit" veth). Other cells keep the packet socket.
    pub aoe_xdp: bool,
    /// Run the bonnie workloads (`bonnie-fs`, `bonnie`) only on the beds with the
    /// most channels (seed 003: the paper's bonnie figures are all four channels
    /// striped, and bonnie++ on ext4 on every bed would double the run for rows no
    /// figure stands beside).
    pub bonnie_widest_only: bool,
}

/// The largest MTU AoE's AF_XDP path takes (docs/aoe.md: a frame must fit a 4 KiB
/// chunk behind the kernel's 256 bytes of headroom).
pub const AOE_XDP_MAX_MTU: u32 = 3822;

impl Default for Matrix {
    fn default() -> Matrix {
        Matrix {
            protocols: Protocol::ALL.to_vec(),
            mtus: vec![1500, 9000],
            rates: vec![Rate(Some(1000))],
            channels: vec![1],
            layouts: Layouts::Striped,
            workloads: vec![LabWorkload::Sequential],
            disk: Disk::UNTHROTTLED,
            baseline: false,
            aoe_xdp: false,
            bonnie_widest_only: false,
        }
    }
}

/// The beds to build, in order, each with the cells measured on it.
#[derive(Debug, Clone, PartialEq)]
pub struct BedPlan {
    pub bed: BedSpec,
    pub cells: Vec<CellSpec>,
}

/// The expanded matrix: beds with their cells, and notes on combinations left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Expansion {
    pub beds: Vec<BedPlan>,
    pub skipped: Vec<String>,
}

impl Expansion {
    pub fn cell_count(&self) -> usize {
        self.beds.iter().map(|b| b.cells.len()).sum()
    }
}

/// The MTUs a veth takes that also carry every protocol: AoE needs one 512-byte
/// sector plus its 36-byte header (548); Linux's veth allows up to 65535.
pub const MTU_RANGE: std::ops::RangeInclusive<u32> = 576..=65535;
/// Channels a bed may have (one /24 per channel under 10.77.0.0/16).
pub const MAX_CHANNELS: u32 = 64;

impl Matrix {
    /// Checks the lists are usable: nothing empty, values in range.
    pub fn validate(&self) -> Result<(), String> {
        if self.protocols.is_empty() {
            return Err("no protocol to measure".into());
        }
        if self.mtus.is_empty() || self.rates.is_empty() || self.channels.is_empty() {
            return Err("give at least one MTU, rate and channel count".into());
        }
        if self.workloads.is_empty() {
            return Err("no workload to run".into());
        }
        if let Some(mtu) = self.mtus.iter().find(|m| !MTU_RANGE.contains(m)) {
            return Err(format!(
                "MTU {mtu} is out of range ({}-{})",
                MTU_RANGE.start(),
                MTU_RANGE.end()
            ));
        }
        if let Some(n) = self.channels.iter().find(|&&n| n == 0 || n > MAX_CHANNELS) {
            return Err(format!("{n} channels: give 1 to {MAX_CHANNELS}"));
        }
        if let Some(rate) = self.disk.rate_mb_per_s.filter(|r| r.is_nan() || *r <= 0.0) {
            return Err(format!("disk rate {rate} MB/s must be above 0"));
        }
        Ok(())
    }

    /// Expands the matrix. Beds come in rate, MTU, channel order (so a reader sees
    /// one link speed at a time, as the seeds tabulate); on each bed the cells run
    /// protocol by protocol. Combinations that cannot be built are left out with a
    /// note: one export over several channels needs a protocol that reaches one
    /// target over several links (AoE).
    pub fn expand(&self) -> Expansion {
        let mut beds: Vec<BedPlan> = Vec::new();
        let mut skipped = Vec::new();
        if self.aoe_xdp
            && self.protocols.contains(&Protocol::Aoe)
            && self.mtus.iter().any(|&m| m > AOE_XDP_MAX_MTU)
        {
            skipped.push(format!(
                "AoE over AF_XDP takes an MTU up to {AOE_XDP_MAX_MTU}: larger MTUs use the packet socket"
            ));
        }
        if self.aoe_xdp
            && self.protocols.contains(&Protocol::Aoe)
            && (self.rates.iter().any(|r| r.0.is_some()))
        {
            skipped.push(
                "AoE over AF_XDP on shaped links: the packet socket instead (AF_XDP frames \
                 skip the qdisc, so tc cannot shape them; unshaped and --baseline cells use it)"
                    .to_string(),
            );
        }
        if self.protocols.contains(&Protocol::Nfs) {
            if self.disk != Disk::UNTHROTTLED {
                skipped.push(
                    "NFS cells: ganesha serves the cell's directory on the host's file system \
                     directly; the disk throttle applies to the block exports only (their \
                     maximum is the disks, NFS's the link)"
                        .to_string(),
                );
            }
            if self.workloads.contains(&LabWorkload::BonnieFs) {
                skipped.push(format!(
                    "nfs bonnie-fs: {}",
                    crate::fs_bonnie::NFS_NOT_AVAILABLE
                ));
            }
            if self.channels.iter().any(|&n| n > 1) {
                skipped.push(
                    "nfs over several channels: skipped (one ganesha on one address; NFS \
                     cells run on one channel)"
                        .to_string(),
                );
            }
        }
        let widest = self.channels.iter().copied().max().unwrap_or(1);
        let bonnie = |w: &LabWorkload| matches!(w, LabWorkload::Bonnie | LabWorkload::BonnieFs);
        if self.bonnie_widest_only
            && self.workloads.iter().any(bonnie)
            && self.channels.iter().any(|&n| n < widest)
        {
            skipped.push(format!(
                "bonnie on fewer than {widest} channels: skipped (bonnie runs on the beds \
                 with the most channels only)"
            ));
        }
        let mut runs = vec![false];
        if self.baseline {
            runs.push(true);
        }
        for &baseline in &runs {
            let rates: Vec<Rate> = if baseline {
                vec![Rate::UNLIMITED]
            } else {
                dedup(&self.rates)
            };
            for &rate in &rates {
                for &mtu in &dedup(&self.mtus) {
                    for &channels in &dedup(&self.channels) {
                        let bed = BedSpec {
                            channels,
                            mtu,
                            rate,
                        };
                        let mut cells = Vec::new();
                        for &protocol in &dedup(&self.protocols) {
                            let layouts: &[bool] = if channels == 1 {
                                &[false]
                            } else {
                                self.layouts.choices()
                            };
                            if protocol == Protocol::Nfs && channels > 1 {
                                continue;
                            }
                            for &striped in layouts {
                                if !striped && channels > 1 && !protocol.multipath() {
                                    let note = format!(
                                        "{protocol} over {channels} channels without a stripe: \
                                         skipped ({protocol} reaches one export over one address; \
                                         use --striped yes)"
                                    );
                                    if !skipped.contains(&note) {
                                        skipped.push(note);
                                    }
                                    continue;
                                }
                                for &workload in &dedup(&self.workloads) {
                                    if protocol == Protocol::Nfs
                                        && workload == LabWorkload::BonnieFs
                                    {
                                        continue;
                                    }
                                    if self.bonnie_widest_only
                                        && channels < widest
                                        && bonnie(&workload)
                                    {
                                        continue;
                                    }
                                    cells.push(CellSpec {
                                        protocol,
                                        bed,
                                        striped,
                                        workload,
                                        disk: if baseline || protocol == Protocol::Nfs {
                                            Disk::UNTHROTTLED
                                        } else {
                                            self.disk
                                        },
                                        baseline,
                                        aoe_xdp: self.aoe_xdp
                                            && protocol == Protocol::Aoe
                                            && mtu <= AOE_XDP_MAX_MTU
                                            && rate == Rate::UNLIMITED,
                                    });
                                }
                            }
                        }
                        if cells.is_empty() {
                            continue;
                        }
                        match beds.iter_mut().find(|b| b.bed == bed) {
                            Some(plan) => plan.cells.extend(cells),
                            None => beds.push(BedPlan { bed, cells }),
                        }
                    }
                }
            }
        }
        Expansion { beds, skipped }
    }
}

/// The items of `list` in their first order, each once.
fn dedup<T: PartialEq + Copy>(list: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(list.len());
    for &item in list {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// Parses a comma-separated list with `parse` for each item.
pub fn parse_list<T>(
    text: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let items: Vec<T> = text
        .split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(parse)
        .collect::<Result<_, _>>()?;
    if items.is_empty() {
        return Err(format!("'{text}' names nothing"));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_bits() {
        assert_eq!("1g".parse::<Rate>().unwrap(), Rate(Some(1000)));
        assert_eq!("10gbit".parse::<Rate>().unwrap(), Rate(Some(10_000)));
        assert_eq!("200m".parse::<Rate>().unwrap(), Rate(Some(200)));
        assert_eq!("200mbit".parse::<Rate>().unwrap(), Rate(Some(200)));
        assert_eq!("2.5G".parse::<Rate>().unwrap(), Rate(Some(2500)));
        assert_eq!("500".parse::<Rate>().unwrap(), Rate(Some(500)));
        assert_eq!("none".parse::<Rate>().unwrap(), Rate::UNLIMITED);
        assert!("fast".parse::<Rate>().is_err());
        assert!("1t".parse::<Rate>().is_err());
        assert_eq!(Rate(Some(1000)).to_string(), "1 Gbit");
        assert_eq!(Rate(Some(200)).to_string(), "200 Mbit");
        assert_eq!(Rate(Some(1000)).mb_per_s(), Some(125.0));
    }

    #[test]
    fn lists_parse_and_reject_unknown_names() {
        let protocols = parse_list("aoe, iscsi", str::parse::<Protocol>).unwrap();
        assert_eq!(protocols, [Protocol::Aoe, Protocol::Iscsi]);
        assert!(parse_list("aoe,fc", str::parse::<Protocol>)
            .unwrap_err()
            .contains("fc"));
        assert!(parse_list(" , ", str::parse::<Protocol>).is_err());
        let workloads = parse_list("seq,bonnie", str::parse::<LabWorkload>).unwrap();
        assert_eq!(workloads, [LabWorkload::Sequential, LabWorkload::Bonnie]);
    }

    #[test]
    fn nvme_is_planned_like_the_other_one_address_protocols() {
        for name in ["nvme", "NVMe-TCP", "nvme+tcp"] {
            assert_eq!(name.parse::<Protocol>(), Ok(Protocol::Nvme), "{name}");
        }
        assert_eq!(Protocol::Nvme.to_string(), "nvme");
        assert!(Protocol::ALL.contains(&Protocol::Nvme));
        assert!(Matrix::default().protocols.contains(&Protocol::Nvme));
        let matrix = Matrix {
            protocols: vec![Protocol::Nvme],
            channels: vec![1, 2],
            layouts: Layouts::Both,
            workloads: vec![LabWorkload::Sequential, LabWorkload::Random],
            mtus: vec![9000],
            aoe_xdp: true,
            ..Matrix::default()
        };
        let expansion = matrix.expand();
        let cells: Vec<&CellSpec> = expansion.beds.iter().flat_map(|b| &b.cells).collect();
        // One channel: both workloads; two: only striped (one address per export).
        assert_eq!(cells.len(), 4, "{cells:?}");
        assert!(cells
            .iter()
            .all(|c| c.protocol == Protocol::Nvme && !c.aoe_xdp));
        assert!(cells
            .iter()
            .filter(|c| c.bed.channels == 2)
            .all(|c| c.striped));
        assert!(
            expansion
                .skipped
                .iter()
                .any(|n| n.starts_with("nvme over 2 channels without a stripe")),
            "{:?}",
            expansion.skipped
        );
    }

    #[test]
    fn the_matrix_expands_into_beds_in_rate_mtu_channel_order() {
        let matrix = Matrix {
            protocols: vec![Protocol::Aoe, Protocol::Nbd],
            mtus: vec![1500, 9000],
            rates: vec![Rate(Some(1000)), Rate(Some(10_000))],
            channels: vec![1, 4],
            layouts: Layouts::Striped,
            workloads: vec![LabWorkload::Sequential],
            disk: Disk::UNTHROTTLED,
            baseline: false,
            aoe_xdp: false,
            bonnie_widest_only: false,
        };
        let expansion = matrix.expand();
        assert!(expansion.skipped.is_empty());
        let beds: Vec<(u64, u32, u32)> = expansion
            .beds
            .iter()
            .map(|b| (b.bed.rate.0.unwrap(), b.bed.mtu, b.bed.channels))
            .collect();
        assert_eq!(
            beds,
            [
                (1000, 1500, 1),
                (1000, 1500, 4),
                (1000, 9000, 1),
                (1000, 9000, 4),
                (10_000, 1500, 1),
                (10_000, 1500, 4),
                (10_000, 9000, 1),
                (10_000, 9000, 4),
            ]
        );
        assert_eq!(expansion.cell_count(), 16);
        let first = &expansion.beds[1].cells;
        assert_eq!(first[0].protocol, Protocol::Aoe);
        assert!(first.iter().all(|c| c.striped && c.exports() == 4));
        // One channel is never "striped".
        assert!(expansion.beds[0].cells.iter().all(|c| !c.striped));
    }

    #[test]
    fn one_export_over_several_channels_is_aoe_only() {
        let matrix = Matrix {
            channels: vec![2],
            layouts: Layouts::Both,
            mtus: vec![9000],
            ..Matrix::default()
        };
        let expansion = matrix.expand();
        let cells = &expansion.beds[0].cells;
        let layouts: Vec<(Protocol, bool)> =
            cells.iter().map(|c| (c.protocol, c.striped)).collect();
        assert_eq!(
            layouts,
            [
                (Protocol::Nbd, true),
                (Protocol::Aoe, true),
                (Protocol::Aoe, false),
                (Protocol::Iscsi, true),
                (Protocol::Nvme, true),
            ]
        );
        assert_eq!(expansion.skipped.len(), 3, "{:?}", expansion.skipped);
        assert!(expansion.skipped[0].contains("nbd"));
        assert_eq!(cells[2].exports(), 1);
    }

    #[test]
    fn the_baseline_adds_unshaped_unthrottled_beds() {
        let matrix = Matrix {
            protocols: vec![Protocol::Nbd],
            mtus: vec![1500],
            rates: vec![Rate(Some(1000)), Rate(Some(200))],
            disk: Disk {
                rate_mb_per_s: Some(70.0),
                latency_ms: None,
            },
            baseline: true,
            ..Matrix::default()
        };
        let expansion = matrix.expand();
        assert_eq!(expansion.beds.len(), 3);
        let last = &expansion.beds[2];
        assert_eq!(last.bed.rate, Rate::UNLIMITED);
        assert!(last
            .cells
            .iter()
            .all(|c| c.baseline && c.disk == Disk::UNTHROTTLED));
        assert!(expansion.beds[0]
            .cells
            .iter()
            .all(|c| !c.baseline && c.disk.rate_mb_per_s == Some(70.0)));
    }

    #[test]
    fn af_xdp_is_for_aoe_cells_up_to_its_mtu() {
        let matrix = Matrix {
            aoe_xdp: true,
            rates: vec![Rate::UNLIMITED],
            ..Matrix::default()
        };
        let expansion = matrix.expand();
        let xdp: Vec<(Protocol, u32)> = expansion
            .beds
            .iter()
            .flat_map(|b| &b.cells)
            .filter(|c| c.aoe_xdp)
            .map(|c| (c.protocol, c.bed.mtu))
            .collect();
        assert_eq!(xdp, [(Protocol::Aoe, 1500)]);
        assert!(
            expansion.skipped[0].contains("3822"),
            "{:?}",
            expansion.skipped
        );
        // Shaped links: tc cannot shape AF_XDP's frames; only the baseline uses it.
        let matrix = Matrix {
            aoe_xdp: true,
            baseline: true,
            mtus: vec![1500],
            ..Matrix::default()
        };
        let expansion = matrix.expand();
        let xdp: Vec<(bool, bool)> = expansion
            .beds
            .iter()
            .flat_map(|b| &b.cells)
            .filter(|c| c.protocol == Protocol::Aoe)
            .map(|c| (c.baseline, c.aoe_xdp))
            .collect();
        assert_eq!(xdp, [(false, false), (true, true)]);
        assert!(
            expansion.skipped[0].contains("qdisc"),
            "{:?}",
            expansion.skipped
        );
    }

    #[test]
    fn bad_matrices_are_refused_with_a_reason() {
        let mut matrix = Matrix::default();
        assert!(matrix.validate().is_ok());
        matrix.mtus = vec![100];
        assert!(matrix.validate().unwrap_err().contains("MTU 100"));
        matrix.mtus = vec![1500];
        matrix.channels = vec![0];
        assert!(matrix.validate().unwrap_err().contains("0 channels"));
        matrix.channels = vec![2];
        matrix.protocols.clear();
        assert!(matrix.validate().is_err());
    }

    #[test]
    fn duplicates_in_lists_measure_once() {
        let matrix = Matrix {
            protocols: vec![Protocol::Nbd, Protocol::Nbd],
            mtus: vec![1500, 1500],
            ..Matrix::default()
        };
        assert_eq!(matrix.expand().cell_count(), 1);
    }

    #[test]
    fn nfs_runs_on_one_channel_unthrottled_with_a_note() {
        assert_eq!("NFS".parse::<Protocol>(), Ok(Protocol::Nfs));
        assert!(!Protocol::ALL.contains(&Protocol::Nfs), "asked for by name");
        assert_eq!(Protocol::Nfs.display_name(), "NFS (ganesha, libnfs)");
        assert_eq!(Protocol::Nbd.display_name(), "nbd");
        let matrix = Matrix {
            protocols: vec![Protocol::Nfs, Protocol::Nbd],
            mtus: vec![1500],
            channels: vec![1, 2],
            disk: Disk {
                rate_mb_per_s: Some(100.0),
                latency_ms: None,
            },
            ..Matrix::default()
        };
        let expansion = matrix.expand();
        let cells: Vec<(Protocol, u32, Option<f64>)> = expansion
            .beds
            .iter()
            .flat_map(|b| &b.cells)
            .map(|c| (c.protocol, c.bed.channels, c.disk.rate_mb_per_s))
            .collect();
        assert_eq!(
            cells,
            [
                (Protocol::Nfs, 1, None),
                (Protocol::Nbd, 1, Some(100.0)),
                (Protocol::Nbd, 2, Some(100.0)),
            ]
        );
        assert!(expansion
            .skipped
            .iter()
            .any(|n| n.contains("block exports only")));
        assert!(expansion
            .skipped
            .iter()
            .any(|n| n.starts_with("nfs over several")));
        assert_eq!("iozone".parse::<LabWorkload>(), Ok(LabWorkload::Sweep));
    }

    #[test]
    fn bonnie_on_a_file_system_is_for_the_block_protocols() {
        assert_eq!(
            "bonnie-fs".parse::<LabWorkload>(),
            Ok(LabWorkload::BonnieFs)
        );
        assert_eq!(LabWorkload::BonnieFs.name(), "bonnie-fs");
        let matrix = Matrix {
            protocols: vec![Protocol::Nfs, Protocol::Iscsi],
            mtus: vec![1500],
            workloads: vec![LabWorkload::Bonnie, LabWorkload::BonnieFs],
            ..Matrix::default()
        };
        let expansion = matrix.expand();
        let cells: Vec<(Protocol, LabWorkload)> = expansion.beds[0]
            .cells
            .iter()
            .map(|c| (c.protocol, c.workload))
            .collect();
        assert_eq!(
            cells,
            [
                (Protocol::Nfs, LabWorkload::Bonnie),
                (Protocol::Iscsi, LabWorkload::Bonnie),
                (Protocol::Iscsi, LabWorkload::BonnieFs),
            ]
        );
        assert!(
            expansion
                .skipped
                .iter()
                .any(|n| n.contains("no NFS client in this kernel")),
            "{:?}",
            expansion.skipped
        );
    }

    #[test]
    fn bonnie_can_be_kept_to_the_beds_with_the_most_channels() {
        let matrix = Matrix {
            protocols: vec![Protocol::Nbd],
            mtus: vec![1500],
            channels: vec![1, 2],
            workloads: vec![
                LabWorkload::Sequential,
                LabWorkload::BonnieFs,
                LabWorkload::Bonnie,
            ],
            bonnie_widest_only: true,
            ..Matrix::default()
        };
        let expansion = matrix.expand();
        let per_bed: Vec<(u32, Vec<LabWorkload>)> = expansion
            .beds
            .iter()
            .map(|b| (b.bed.channels, b.cells.iter().map(|c| c.workload).collect()))
            .collect();
        assert_eq!(
            per_bed,
            [
                (1, vec![LabWorkload::Sequential]),
                (
                    2,
                    vec![
                        LabWorkload::Sequential,
                        LabWorkload::BonnieFs,
                        LabWorkload::Bonnie
                    ]
                ),
            ]
        );
        assert!(expansion
            .skipped
            .iter()
            .any(|n| n.starts_with("bonnie on fewer than 2 channels")));
        // Without the flag every bed has every workload.
        let all = Matrix {
            bonnie_widest_only: false,
            ..matrix
        };
        assert_eq!(all.expand().cell_count(), 6);
    }
}
