//! Presets that rebuild the seeds' beds (`--seed 000`, `--seed 003`).

use crate::matrix::{Disk, LabWorkload, Layouts, Matrix, Protocol, Rate};
use crate::published::{Seed, SEED_000_LOCAL_DISK, SEED_003_DISK_MB_PER_S};

/// The matrix of a seed's bed.
///
/// - Seed 003: four independent gigabit channels, one export per channel behind a
///   210 MB/s disk (§5.4: four 70 MB/s disks in RAID-5), striped on the initiator
///   (§3.3), MTU 1500 and 9000 (§3.4), AoE vs iSCSI, and NBD and NVMe/TCP (which
///   the paper predates: our figure only) beside them; block
///   throughput. One channel is measured too, so the report shows how striping
///   scales.
/// - Seed 000: one link at 1 and 10 Gbit, MTU 1500 / 4132 / 4608 / 9000, AoE vs
///   NBD, bonnie's block read / write / rewrite, behind a 256 MB/s disk (the 4-disk
///   RAID0's write rate; the throttle has one rate for reads and writes, and the
///   stricter of the published 288/256 is taken).
pub fn matrix(seed: Seed) -> Matrix {
    match seed {
        Seed::S003 => Matrix {
            protocols: vec![
                Protocol::Aoe,
                Protocol::Iscsi,
                Protocol::Nbd,
                Protocol::Nvme,
            ],
            mtus: vec![1500, 9000],
            rates: vec![Rate(Some(1000))],
            channels: vec![1, 4],
            layouts: Layouts::Striped,
            workloads: vec![LabWorkload::Sequential],
            disk: Disk {
                rate_mb_per_s: Some(SEED_003_DISK_MB_PER_S),
                latency_ms: None,
            },
            baseline: false,
            aoe_xdp: false,
        },
        Seed::S000 => Matrix {
            protocols: vec![Protocol::Aoe, Protocol::Nbd],
            mtus: vec![1500, 4132, 4608, 9000],
            rates: vec![Rate(Some(1000)), Rate(Some(10_000))],
            channels: vec![1],
            layouts: Layouts::Single,
            workloads: vec![LabWorkload::Bonnie],
            disk: Disk {
                rate_mb_per_s: Some(SEED_000_LOCAL_DISK.1),
                latency_ms: None,
            },
            baseline: false,
            aoe_xdp: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_003_is_four_striped_gigabit_channels_at_two_mtus() {
        let matrix = matrix(Seed::S003);
        assert!(matrix.validate().is_ok());
        let expansion = matrix.expand();
        let four: Vec<_> = expansion
            .beds
            .iter()
            .filter(|b| b.bed.channels == 4)
            .collect();
        assert_eq!(four.len(), 2);
        assert_eq!(
            four.iter().map(|b| b.bed.mtu).collect::<Vec<_>>(),
            [1500, 9000]
        );
        for plan in four {
            assert_eq!(plan.bed.rate, Rate(Some(1000)));
            assert_eq!(plan.cells.len(), 4);
            assert!(plan
                .cells
                .iter()
                .all(|c| c.striped && c.exports() == 4 && c.disk.rate_mb_per_s == Some(210.0)));
        }
        assert_eq!(expansion.cell_count(), 16);
        assert!(expansion
            .beds
            .iter()
            .all(|b| b.cells.iter().any(|c| c.protocol == Protocol::Nvme)));
    }

    #[test]
    fn seed_000_sweeps_four_mtus_at_two_speeds_on_one_link() {
        let expansion = matrix(Seed::S000).expand();
        assert_eq!(expansion.beds.len(), 8);
        assert_eq!(expansion.cell_count(), 16);
        assert!(expansion.beds.iter().all(|b| b.bed.channels == 1));
        assert!(expansion
            .beds
            .iter()
            .flat_map(|b| &b.cells)
            .all(|c| c.workload == LabWorkload::Bonnie && c.disk.rate_mb_per_s == Some(256.0)));
    }
}
