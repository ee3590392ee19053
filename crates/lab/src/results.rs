//! A lab run's figures: one [`CellResult`] per measured operation of a cell, with the
//! network baseline of its channels, the theoretical maximum and the efficiency
//! against it (seed 003 §5.4), and both sides' CPU (seed 003 Tables 1-2). Pure.

use blockwire_bench::PhaseResult;
use serde::{Deserialize, Serialize};

use crate::matrix::{CellSpec, Protocol};
use crate::published::{self, CellKey, Published, Seed};

/// The network baseline of a cell's channels: each direction summed over the
/// channels, measured at the same time on all of them.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct NetworkBaseline {
    /// Initiator to target (what writes need), MB/s.
    pub send_mb_per_s: f64,
    /// Target to initiator (what reads need), MB/s.
    pub receive_mb_per_s: f64,
}

/// Which way an operation's data crosses the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// To the target: writes.
    Send,
    /// From the target: reads.
    Receive,
    /// Both ways, each block once (bonnie's rewrite reads and writes back).
    Both,
}

/// The direction of a bench operation, and whether it streams (so that a bandwidth
/// maximum means something for it). Random I/O and seeks are counted in operations:
/// their MB/s is not held against the link.
pub fn direction_of(op: &str) -> (Direction, bool) {
    match op {
        "write" | "putc" => (Direction::Send, true),
        "read" | "getc" | "reread" => (Direction::Receive, true),
        "rewrite" => (Direction::Both, true),
        "randwrite" => (Direction::Send, false),
        _ => (Direction::Receive, false),
    }
}

impl NetworkBaseline {
    /// What the channels carry for an operation going `direction`. A rewrite moves
    /// each block both ways, and a channel carries both at once (a veth pair, each
    /// end's egress shaped by its own tbf): the initiator sends one block back
    /// while it reads the next, so the slower direction bounds it, not the two
    /// in turn (1 / (1/send + 1/receive) was passed by 60%: NBD rewrote at 96
    /// MB/s over 120 MB/s each way).
    pub fn for_direction(&self, direction: Direction) -> f64 {
        match direction {
            Direction::Send => self.send_mb_per_s,
            Direction::Receive => self.receive_mb_per_s,
            Direction::Both => self.send_mb_per_s.min(self.receive_mb_per_s),
        }
    }
}

/// The rate of two stages one after the other: each byte pays both.
fn serial(a: f64, b: f64) -> f64 {
    if a <= 0.0 || b <= 0.0 {
        0.0
    } else {
        1.0 / (1.0 / a + 1.0 / b)
    }
}

/// The theoretical maximum of a streaming operation (seed 003 §5.4: "the maximum
/// speed of the slowest component"): the channels' measured aggregate in its
/// direction, and, when the exports are throttled disks, their rate times the
/// number of exports (a rewrite pays the disk twice: read, then write).
pub fn theoretical_max(
    network_mb_per_s: f64,
    disk_mb_per_s: Option<f64>,
    exports: u32,
    direction: Direction,
) -> f64 {
    let disks = disk_mb_per_s.map(|rate| {
        let total = rate * f64::from(exports.max(1));
        if direction == Direction::Both {
            serial(total, total)
        } else {
            total
        }
    });
    match disks {
        Some(disks) if network_mb_per_s > 0.0 => network_mb_per_s.min(disks),
        Some(disks) => disks,
        None => network_mb_per_s,
    }
}

/// One measured operation of a cell: the row of `--json`'s `cells`, of the CSV and
/// of the tables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    pub protocol: Protocol,
    pub mtu: u32,
    pub channels: u32,
    pub striped: bool,
    /// The link shaping in Mbit/s, null when unshaped.
    pub rate_mbit: Option<u64>,
    /// The exports' disk throttle in MB/s, null when unthrottled.
    pub disk_mb_per_s: Option<f64>,
    /// Served from memory with no throttle and no shaping: the host's own figure.
    pub baseline: bool,
    /// AoE frames went through AF_XDP on both sides.
    #[serde(default)]
    pub aoe_xdp: bool,
    /// sequential, bonnie, random
    pub workload: String,
    /// The bench's operation: read, write, rewrite, randread, seeks, ...
    pub op: String,
    pub block_size: u64,
    pub queue_depth: u32,
    pub mb_per_s: f64,
    pub iops: f64,
    /// The cell's channels' measured aggregate in this operation's direction.
    pub network_mb_per_s: Option<f64>,
    /// The theoretical maximum used: the slower of the channels and the disks;
    /// null for operations counted in IOPS (random I/O, seeks).
    pub max_mb_per_s: Option<f64>,
    /// `mb_per_s / max_mb_per_s`.
    pub efficiency: Option<f64>,
    /// CPU% of the initiator (the bench process; 100 = one core).
    pub initiator_cpu_pct: f64,
    /// CPU% of the target process.
    pub target_cpu_pct: Option<f64>,
    /// Throughput per initiator CPU% (seed 003 Tables 1-2).
    pub mb_per_s_per_cpu_pct: Option<f64>,
    /// The seed's figure for this cell, when a preset ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<PublishedFigure>,
}

/// A seed's figure as stored in a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PublishedFigure {
    /// The figure's value (a range's middle).
    pub mb_per_s: f64,
    /// As the seed writes it ("≤227", "6-10", "23").
    pub text: String,
    pub cpu_pct: Option<f64>,
    pub mb_per_s_per_cpu_pct: Option<f64>,
    /// The target's CPU% as the seed writes it ("15-20"), where it gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_cpu_text: Option<String>,
    pub efficiency: Option<f64>,
    pub source: String,
}

impl From<Published> for PublishedFigure {
    fn from(p: Published) -> PublishedFigure {
        PublishedFigure {
            mb_per_s: p.mb_per_s.value(),
            text: p.mb_per_s.text(),
            cpu_pct: p.cpu_pct,
            mb_per_s_per_cpu_pct: p.mb_per_s_per_cpu_pct,
            target_cpu_text: p.target_cpu_pct.map(|f| f.text()),
            efficiency: p.efficiency,
            source: p.source.to_string(),
        }
    }
}

impl CellResult {
    /// The row for one phase of a cell's bench run.
    pub fn from_phase(
        spec: &CellSpec,
        phase: &PhaseResult,
        network: Option<&NetworkBaseline>,
        seed: Option<Seed>,
    ) -> CellResult {
        let (direction, streams) = direction_of(&phase.op);
        let network_mb_per_s = network.map(|n| n.for_direction(direction));
        let max = streams
            .then(|| {
                theoretical_max(
                    network_mb_per_s.unwrap_or(0.0),
                    spec.disk.rate_mb_per_s,
                    spec.exports(),
                    direction,
                )
            })
            .filter(|&m| m > 0.0);
        let key = CellKey {
            protocol: spec.protocol,
            mtu: spec.bed.mtu,
            rate_mbit: spec.bed.rate.mbit(),
            channels: spec.bed.channels,
            striped: spec.striped,
            workload: &phase.workload,
            op: &phase.op,
            block_size: phase.block_size,
        };
        let published = seed
            .filter(|_| !spec.baseline)
            .and_then(|seed| published::lookup(seed, &key))
            .map(PublishedFigure::from);
        CellResult {
            protocol: spec.protocol,
            mtu: spec.bed.mtu,
            channels: spec.bed.channels,
            striped: spec.striped,
            rate_mbit: spec.bed.rate.mbit(),
            disk_mb_per_s: spec.disk.rate_mb_per_s,
            baseline: spec.baseline,
            aoe_xdp: spec.aoe_xdp,
            workload: phase.workload.clone(),
            op: phase.op.clone(),
            block_size: phase.block_size,
            queue_depth: phase.queue_depth,
            mb_per_s: phase.mb_per_s,
            iops: phase.iops,
            network_mb_per_s,
            max_mb_per_s: max,
            efficiency: max.map(|m| phase.mb_per_s / m),
            initiator_cpu_pct: phase.cpu_percent,
            target_cpu_pct: phase.target_cpu_percent,
            mb_per_s_per_cpu_pct: (phase.cpu_percent > 0.0)
                .then(|| phase.mb_per_s / phase.cpu_percent),
            published,
        }
    }

    /// Whether `other` is the same configuration (all but the figures).
    pub fn same_cell(&self, other: &CellResult) -> bool {
        self.protocol == other.protocol
            && self.mtu == other.mtu
            && self.channels == other.channels
            && self.striped == other.striped
            && self.rate_mbit == other.rate_mbit
            && self.baseline == other.baseline
            && self.aoe_xdp == other.aoe_xdp
            && self.workload == other.workload
    }
}

impl LabReport {
    /// The cells measured: the rows grouped by the configuration they were measured
    /// in ([`CellResult::same_cell`]), each cell counted once however many
    /// operations it has.
    pub fn measured_cells(&self) -> usize {
        let mut cells: Vec<&CellResult> = Vec::new();
        for row in &self.cells {
            if !cells.iter().any(|cell| cell.same_cell(row)) {
                cells.push(row);
            }
        }
        cells.len()
    }
}

/// A whole lab run, as `--json` writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabReport {
    /// The preset, when one ran ("000", "003").
    pub seed: Option<String>,
    /// Data set per cell in bytes, and seconds per timed phase.
    pub size: u64,
    pub phase_seconds: f64,
    /// The stripe's chunk size in bytes.
    pub chunk: u64,
    pub machine: blockwire_bench::Machine,
    /// One entry per measured operation of each cell (a row; a cell has one per
    /// operation its workload ran).
    pub cells: Vec<CellResult>,
    /// The cells the matrix asked for, measured or not (0 in reports from before
    /// it was recorded).
    #[serde(default)]
    pub planned_cells: usize,
    /// Cells that failed, and matrix combinations left out, with the reason.
    pub notes: Vec<String>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::matrix::{BedSpec, Disk, LabWorkload, Rate};
    use blockwire_bench::Latency;

    pub(crate) fn phase(workload: &str, op: &str, mb_per_s: f64, cpu: f64) -> PhaseResult {
        PhaseResult {
            workload: workload.into(),
            op: op.into(),
            block_size: 1 << 20,
            queue_depth: 16,
            bytes: 1 << 30,
            ops: 1024,
            seconds: 1.0,
            mb_per_s,
            iops: mb_per_s,
            latency_us: Latency::default(),
            latency_histogram: Vec::new(),
            cpu_percent: cpu,
            target_cpu_percent: Some(cpu / 2.0),
            mb_per_s_per_cpu_percent: None,
        }
    }

    fn spec(protocol: Protocol, channels: u32, disk: Option<f64>) -> CellSpec {
        CellSpec {
            protocol,
            bed: BedSpec {
                channels,
                mtu: 9000,
                rate: Rate(Some(1000)),
            },
            striped: channels > 1,
            workload: LabWorkload::Sequential,
            disk: Disk {
                rate_mb_per_s: disk,
                latency_ms: None,
            },
            baseline: false,
            aoe_xdp: false,
        }
    }

    #[test]
    fn the_maximum_is_the_slower_of_channels_and_disks() {
        // Seed 003 §5.4: four links (~400 MB/s) against 4 × 210 MB/s of disks.
        assert_eq!(
            theoretical_max(400.0, Some(210.0), 4, Direction::Send),
            400.0
        );
        // One 70 MB/s disk behind a gigabit link: the disk.
        assert_eq!(
            theoretical_max(117.0, Some(70.0), 1, Direction::Receive),
            70.0
        );
        assert_eq!(theoretical_max(117.0, None, 1, Direction::Receive), 117.0);
        // A rewrite reads then writes each block: half a disk's rate.
        assert_eq!(
            theoretical_max(1000.0, Some(100.0), 1, Direction::Both),
            50.0
        );
        // The channels carry both directions at once: a rewrite's ceiling is the
        // slower one.
        let network = NetworkBaseline {
            send_mb_per_s: 100.0,
            receive_mb_per_s: 90.0,
        };
        assert_eq!(network.for_direction(Direction::Both), 90.0);
        assert_eq!(network.for_direction(Direction::Send), 100.0);
    }

    #[test]
    fn a_phase_becomes_a_row_with_efficiency_and_cpu_efficiency() {
        let network = NetworkBaseline {
            send_mb_per_s: 470.0,
            receive_mb_per_s: 460.0,
        };
        let spec = spec(Protocol::Aoe, 4, Some(210.0));
        let row = CellResult::from_phase(
            &spec,
            &phase("sequential", "read", 437.0, 50.0),
            Some(&network),
            Some(Seed::S003),
        );
        assert_eq!(row.network_mb_per_s, Some(460.0));
        assert_eq!(row.max_mb_per_s, Some(460.0));
        assert!((row.efficiency.unwrap() - 0.95).abs() < 1e-9);
        assert_eq!(row.mb_per_s_per_cpu_pct, Some(437.0 / 50.0));
        assert_eq!(row.target_cpu_pct, Some(25.0));
        assert_eq!(row.rate_mbit, Some(1000));
        let published = row.published.unwrap();
        assert_eq!(published.mb_per_s, 283.0);
        assert_eq!(published.text, "≤283");

        // Writes use the other direction.
        let row = CellResult::from_phase(
            &spec,
            &phase("sequential", "write", 235.0, 0.0),
            Some(&network),
            None,
        );
        assert_eq!(row.max_mb_per_s, Some(470.0));
        assert_eq!(row.mb_per_s_per_cpu_pct, None, "no CPU measured");
        assert!(row.published.is_none());
    }

    #[test]
    fn random_io_gets_no_bandwidth_efficiency() {
        let spec = spec(Protocol::Nbd, 1, None);
        let network = NetworkBaseline {
            send_mb_per_s: 117.0,
            receive_mb_per_s: 117.0,
        };
        let row = CellResult::from_phase(
            &spec,
            &phase("random", "randread", 20.0, 30.0),
            Some(&network),
            None,
        );
        assert_eq!(row.network_mb_per_s, Some(117.0));
        assert_eq!((row.max_mb_per_s, row.efficiency), (None, None));
    }

    #[test]
    fn without_a_network_figure_the_disks_are_the_maximum() {
        let spec = spec(Protocol::Iscsi, 2, Some(25.0));
        let row =
            CellResult::from_phase(&spec, &phase("sequential", "write", 45.0, 10.0), None, None);
        assert_eq!(row.network_mb_per_s, None);
        assert_eq!(row.max_mb_per_s, Some(50.0));
        assert!((row.efficiency.unwrap() - 0.9).abs() < 1e-9);
    }

    #[test]
    fn rows_serialize_with_the_documented_fields() {
        let spec = CellSpec {
            bed: BedSpec {
                channels: 1,
                mtu: 1500,
                rate: Rate::UNLIMITED,
            },
            ..spec(Protocol::Nbd, 1, None)
        };
        let row = CellResult::from_phase(
            &spec,
            &phase("sequential", "write", 100.0, 20.0),
            None,
            None,
        );
        let json = serde_json::to_value(&row).unwrap();
        for field in [
            "protocol",
            "mtu",
            "channels",
            "striped",
            "rate_mbit",
            "workload",
            "op",
            "mb_per_s",
            "network_mb_per_s",
            "max_mb_per_s",
            "efficiency",
            "initiator_cpu_pct",
            "target_cpu_pct",
        ] {
            assert!(json.get(field).is_some(), "{field} missing in {json}");
        }
        assert!(json["rate_mbit"].is_null());
        assert_eq!(json["protocol"], "nbd");
    }
}
