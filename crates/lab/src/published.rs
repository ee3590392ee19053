//! The seeds' published figures, copied from the texts in `shared/seeds/`, so a
//! report can print them beside ours cell by cell. Each figure says where it comes
//! from.

use serde::Serialize;

use crate::matrix::Protocol;

/// Which seed's bed a preset rebuilds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Seed {
    /// Seed 000: AoE (vblade) vs NBD (nbd-server), one link at 1 and 10 Gbit,
    /// MTU 1500/4132/4608/9000, bonnie++ block read/write/rewrite on a 4-disk RAID0.
    S000,
    /// Seed 003 (Gerdelan, Johnson, Messom): iSCSI vs AoE over four gigabit channels
    /// striped with RAID-0 on the initiator, MTU 1500 and 9000.
    S003,
}

impl Seed {
    pub fn parse(text: &str) -> Result<Seed, String> {
        match text.trim() {
            "000" | "0" => Ok(Seed::S000),
            "003" | "3" => Ok(Seed::S003),
            _ => Err(format!("no preset for seed '{text}' (choose 000 or 003)")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Seed::S000 => "000",
            Seed::S003 => "003",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Seed::S000 => "seed 000: AoE and NBD performance tests (Aatrokoski, 2007)",
            Seed::S003 => {
                "seed 003: Gerdelan, Johnson, Messom, Performance Analysis of Virtualised \
                 Head Nodes Utilising Cost-Effective Network Attached Storage"
            }
        }
    }
}

/// A published throughput: one figure, a peak ("up to"), or a range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Figure {
    Exact {
        mb_per_s: f64,
    },
    UpTo {
        mb_per_s: f64,
    },
    Range {
        low: f64,
        high: f64,
    },
    /// Operations per second (seed 003's random seeks), not MB/s.
    PerSecond {
        ops: f64,
    },
}

impl Figure {
    /// The figure to compute ratios with: the value, or a range's middle.
    pub fn value(self) -> f64 {
        match self {
            Figure::Exact { mb_per_s } | Figure::UpTo { mb_per_s } => mb_per_s,
            Figure::Range { low, high } => (low + high) / 2.0,
            Figure::PerSecond { ops } => ops,
        }
    }

    pub fn text(self) -> String {
        match self {
            Figure::Exact { mb_per_s } => format!("{mb_per_s}"),
            Figure::UpTo { mb_per_s } => format!("≤{mb_per_s}"),
            Figure::Range { low, high } => format!("{low}-{high}"),
            Figure::PerSecond { ops } => format!("{ops}/s"),
        }
    }
}

/// What a seed reports for one of our cells.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Published {
    pub mb_per_s: Figure,
    /// CPU% during the operation, where the seed gives it (seed 003: the head node,
    /// i.e. the initiator).
    pub cpu_pct: Option<f64>,
    /// Throughput per CPU% as the seed tabulates it.
    pub mb_per_s_per_cpu_pct: Option<f64>,
    /// Throughput against the seed's theoretical maximum.
    pub efficiency: Option<f64>,
    /// Where in the seed the figure is.
    pub source: &'static str,
}

/// What the lookup needs to know about one measured cell.
#[derive(Debug, Clone, Copy)]
pub struct CellKey<'a> {
    pub protocol: Protocol,
    pub mtu: u32,
    pub rate_mbit: Option<u64>,
    pub channels: u32,
    pub striped: bool,
    pub workload: &'a str,
    pub op: &'a str,
}

/// Seed 000's local disk (4-disk RAID0): read, write, rewrite MB/s
/// ("Local disk | N/A | 288 | 256 | 106").
pub const SEED_000_LOCAL_DISK: (f64, f64, f64) = (288.0, 256.0, 106.0);

/// Seed 000, "AoE results, 4-disk RAID0": (Gbit, MTU, read, write, rewrite).
const SEED_000_AOE: [(u64, u32, f64, f64, f64); 6] = [
    (1, 1500, 47.0, 23.0, 23.0),
    (1, 4132, 106.0, 114.0, 51.0),
    (1, 9000, 107.0, 120.0, 54.0),
    (10, 1500, 100.0, 24.0, 53.0),
    (10, 4132, 231.0, 248.0, 112.0),
    (10, 9000, 257.0, 82.0, 113.0),
];

/// Seed 000, "NBD results, 4-disk RAID0": (Gbit, MTU, read, write, rewrite).
const SEED_000_NBD: [(u64, u32, f64, f64, f64); 6] = [
    (1, 1500, 71.0, 106.0, 39.0),
    (1, 4608, 106.0, 119.0, 53.0),
    (1, 9000, 109.0, 121.0, 54.0),
    (10, 1500, 109.0, 193.0, 66.0),
    (10, 4608, 113.0, 120.0, 61.0),
    (10, 9000, 117.0, 216.0, 69.0),
];

/// Seed 003's theoretical maximum: four gigabit links, "about 400 Megabytes per
/// second" (§5.4).
pub const SEED_003_MAX_MB_PER_S: f64 = 400.0;

/// Seed 003's concurrent netperf over the four channels: 3.8 Gbit/s, 480 MB/s as
/// the paper writes it (§3.3).
pub const SEED_003_NETWORK_MB_PER_S: f64 = 480.0;

/// Seed 003's disk behind each channel: a software RAID-5 of four 70 MB/s disks,
/// 3 × 70 = 210 MB/s (§5.4).
pub const SEED_003_DISK_MB_PER_S: f64 = 210.0;

/// The seed's figure for a cell, if it published one.
pub fn lookup(seed: Seed, key: &CellKey<'_>) -> Option<Published> {
    match seed {
        Seed::S000 => seed_000(key),
        Seed::S003 => seed_003(key),
    }
}

fn seed_000(key: &CellKey<'_>) -> Option<Published> {
    if key.channels != 1 {
        return None;
    }
    let gbit = match key.rate_mbit {
        Some(1000) => 1,
        Some(10_000) => 10,
        _ => return None,
    };
    let (table, source) = match key.protocol {
        Protocol::Aoe => (&SEED_000_AOE, "seed 000, AoE results, 4-disk RAID0"),
        Protocol::Nbd => (&SEED_000_NBD, "seed 000, NBD results, 4-disk RAID0"),
        // The seeds predate NVMe/TCP (and seed 000 measured no iSCSI).
        Protocol::Iscsi | Protocol::Nvme => return None,
    };
    let row = table.iter().find(|r| r.0 == gbit && r.1 == key.mtu)?;
    // bonnie++ -f: block read, block write, rewrite. Our sequential read/write are
    // the same large-block streams without the file system.
    let value = match (key.workload, key.op) {
        ("bonnie" | "sequential", "read") => row.2,
        ("bonnie" | "sequential", "write") => row.3,
        ("bonnie", "rewrite") => row.4,
        _ => return None,
    };
    Some(Published {
        mb_per_s: Figure::Exact { mb_per_s: value },
        cpu_pct: None,
        mb_per_s_per_cpu_pct: None,
        efficiency: None,
        source,
    })
}

fn seed_003(key: &CellKey<'_>) -> Option<Published> {
    // The paper's figures are all four channels striped on the head node.
    if key.channels != 4 || !key.striped || key.rate_mbit != Some(1000) {
        return None;
    }
    let block = match (key.workload, key.op) {
        ("sequential" | "bonnie", "read" | "write") => key.op,
        ("bonnie", "seeks") => "seeks",
        _ => return None,
    };
    let table = |peak: f64, cpu: f64, per_cpu: f64, source| Published {
        mb_per_s: Figure::UpTo { mb_per_s: peak },
        cpu_pct: Some(cpu),
        mb_per_s_per_cpu_pct: Some(per_cpu),
        efficiency: None,
        source,
    };
    match (key.protocol, key.mtu, block) {
        (Protocol::Iscsi, 1500, "read" | "write") => {
            Some(table(194.0, 14.0, 14.0, "seed 003, §4.1 and Table 1"))
        }
        (Protocol::Iscsi, 9000, "read" | "write") => Some(Published {
            efficiency: Some(0.56),
            ..table(227.0, 30.0, 7.5, "seed 003, §4.1, Table 2 and §5.4")
        }),
        (Protocol::Aoe, 1500, "read") => {
            Some(table(195.0, 23.0, 8.5, "seed 003, §4.2 and Table 1"))
        }
        (Protocol::Aoe, 1500, "write") => Some(Published {
            mb_per_s: Figure::Range {
                low: 6.0,
                high: 10.0,
            },
            cpu_pct: None,
            mb_per_s_per_cpu_pct: None,
            efficiency: None,
            source: "seed 003, §4.2 (block writes at MTU 1500)",
        }),
        (Protocol::Aoe, 9000, "read" | "write") => Some(Published {
            efficiency: Some(0.70),
            ..table(283.0, 23.0, 12.0, "seed 003, §4.2, Table 2 and §5.4")
        }),
        // Random seeks per second, not MB/s: reported in the seeks column.
        (Protocol::Iscsi, 1500, "seeks") => Some(Published {
            mb_per_s: Figure::PerSecond { ops: 405.2 },
            cpu_pct: None,
            mb_per_s_per_cpu_pct: None,
            efficiency: None,
            source: "seed 003, §4.1 (random seeks per second)",
        }),
        (Protocol::Iscsi, 9000, "seeks") => Some(Published {
            mb_per_s: Figure::PerSecond { ops: 436.2 },
            cpu_pct: None,
            mb_per_s_per_cpu_pct: None,
            efficiency: None,
            source: "seed 003, §4.1 (random seeks per second)",
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(
        protocol: Protocol,
        mtu: u32,
        gbit: u64,
        channels: u32,
        op: &'static str,
    ) -> CellKey<'static> {
        CellKey {
            protocol,
            mtu,
            rate_mbit: Some(gbit * 1000),
            channels,
            striped: channels > 1,
            workload: "bonnie",
            op,
        }
    }

    #[test]
    fn seed_000_tables_are_copied_cell_by_cell() {
        let aoe = |gbit, mtu, op| {
            lookup(Seed::S000, &key(Protocol::Aoe, mtu, gbit, 1, op)).map(|p| p.mb_per_s.value())
        };
        // AoE writes collapse at MTU 1500 (23 MB/s on a gigabit link).
        assert_eq!(aoe(1, 1500, "write"), Some(23.0));
        assert_eq!(aoe(10, 4132, "write"), Some(248.0));
        assert_eq!(aoe(10, 9000, "rewrite"), Some(113.0));
        assert_eq!(aoe(10, 4608, "read"), None, "AoE ran at 4132, not 4608");
        let nbd = |gbit, mtu, op| {
            lookup(Seed::S000, &key(Protocol::Nbd, mtu, gbit, 1, op)).map(|p| p.mb_per_s.value())
        };
        assert_eq!(nbd(10, 9000, "read"), Some(117.0));
        assert_eq!(nbd(1, 4608, "rewrite"), Some(53.0));
        assert_eq!(nbd(1, 4132, "read"), None);
        assert!(lookup(Seed::S000, &key(Protocol::Iscsi, 1500, 1, 1, "read")).is_none());
        assert!(lookup(Seed::S000, &key(Protocol::Nbd, 1500, 1, 4, "read")).is_none());
    }

    #[test]
    fn seed_003_gives_tables_1_and_2_for_four_striped_gigabit_channels() {
        let p = lookup(Seed::S003, &key(Protocol::Aoe, 9000, 1, 4, "write")).unwrap();
        assert_eq!(p.mb_per_s.value(), 283.0);
        assert_eq!(p.cpu_pct, Some(23.0));
        assert_eq!(p.mb_per_s_per_cpu_pct, Some(12.0));
        assert_eq!(p.efficiency, Some(0.70));
        let p = lookup(Seed::S003, &key(Protocol::Iscsi, 9000, 1, 4, "read")).unwrap();
        assert_eq!((p.mb_per_s.value(), p.efficiency), (227.0, Some(0.56)));
        // The paper's efficiencies are its peaks over its 400 MB/s maximum.
        assert!((227.0 / SEED_003_MAX_MB_PER_S - 0.56).abs() < 0.01);
        assert!((283.0 / SEED_003_MAX_MB_PER_S - 0.70).abs() < 0.01);
        let p = lookup(Seed::S003, &key(Protocol::Aoe, 1500, 1, 4, "write")).unwrap();
        assert_eq!(p.mb_per_s.text(), "6-10");
        let seeks = lookup(Seed::S003, &key(Protocol::Iscsi, 1500, 1, 4, "seeks")).unwrap();
        assert_eq!(seeks.mb_per_s.text(), "405.2/s");
        assert!(lookup(Seed::S003, &key(Protocol::Aoe, 9000, 1, 1, "write")).is_none());
        assert!(lookup(Seed::S003, &key(Protocol::Nbd, 9000, 1, 4, "write")).is_none());
    }
}
