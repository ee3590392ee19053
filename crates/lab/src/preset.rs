//! Presets that rebuild the seeds' beds (`--seed 000` to `--seed 004`), and the
//! quick defaults each runs with when no flag says otherwise.

use std::time::Duration;

use crate::matrix::{Disk, LabWorkload, Layouts, Matrix, Protocol, Rate};
use crate::published::{Seed, SEED_000_LOCAL_DISK, SEED_003_DISK_MB_PER_S};
use crate::target::Backing;

/// How a preset runs when no flag says otherwise: sized so that each preset's
/// whole matrix runs in a few minutes on a 2-core machine (`--size` and `--time`
/// make a real run).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    /// Data set per cell, bytes.
    pub size: u64,
    /// Seconds per timed phase (each sweep measurement's cap, bonnie's seeks).
    pub time: Duration,
    /// Request size of the sequential workload (the bench's 1 MiB when None).
    pub block_size: Option<u64>,
    /// Requests in flight of the sequential workload (the bench's 16 when None).
    pub queue_depth: Option<u32>,
    pub backing: Backing,
}

/// The quick defaults of a preset.
///
/// - 001: `dd oflag=direct bs=4M` is one 4 MiB request at a time, each waited for
///   (O_DIRECT, no page cache): the bench's sequential workload at 4 MiB, QD1.
/// - 002 and 004 put NFS beside the block protocols "on the same storage": every
///   export is a file in the cell's directory, as ganesha's is (`--backing file`).
/// - 002's sweep is 13 record sizes × 8 operations, each capped at `time`.
pub fn defaults(seed: Seed) -> Defaults {
    let base = Defaults {
        size: 256 << 20,
        time: Duration::from_secs(1),
        block_size: None,
        queue_depth: None,
        backing: Backing::Memory,
    };
    match seed {
        Seed::S000 => Defaults {
            size: 128 << 20,
            ..base
        },
        Seed::S001 => Defaults {
            block_size: Some(4 << 20),
            queue_depth: Some(1),
            ..base
        },
        Seed::S002 => Defaults {
            time: Duration::from_millis(250),
            backing: Backing::File,
            ..base
        },
        Seed::S003 => base,
        Seed::S004 => Defaults {
            size: 128 << 20,
            backing: Backing::File,
            ..base
        },
    }
}

/// The matrix of a seed's bed.
///
/// - Seed 001: one gigabit link at MTU 1500 and 9000 (the seed measured iperf at
///   both, and ran dd with jumbo frames), AoE vs iSCSI, dd-style writes and reads
///   of the raw device; no disk throttle (the seed's LVM volume on a RAID was not
///   what limited 13 or 50 MB/s).
/// - Seed 002: one 10 Gbit link at MTU 1500 (the seed's network kept the default
///   frame size), NFS (ganesha, async as the seed's export) vs iSCSI, NBD and AoE,
///   the record-size sweep; disks unthrottled (NFS's cannot be, and the seed's
///   reads came from the server's cache at 1140 MB/s).
/// - Seed 004: 10 Gbit and 1 Gbit at MTU 1500, NFS vs NBD, iSCSI and AoE on the
///   same storage (files in the cell's directory), a large sequential write and
///   read and bonnie; unthrottled, so NFS and the block protocols see the same
///   disk.
/// - Seed 003: four independent gigabit channels, one export per channel behind a
///   210 MB/s disk (§5.4: four 70 MB/s disks in RAID-5), striped on the initiator
///   (§3.3), MTU 1500 and 9000 (§3.4), AoE vs iSCSI, and NBD and NVMe/TCP (which
///   the paper predates: our figure only) beside them. Block throughput on every
///   bed; one channel is measured too, so the report shows how striping scales.
///   bonnie (the paper's own tool: bonnie++ -f on ext4 over the striped mount, and
///   the bench's request-level bonnie beside) runs on the four-channel beds only:
///   every bonnie figure of the paper is four channels striped, and bonnie on the
///   one-channel beds too would double the run for rows with nothing beside them.
///   (The paper's file system was XFS; ours is ext4, as on the other seeds.)
/// - Seed 000: one link at 1 and 10 Gbit, MTU 1500 / 4132 / 4608 / 9000, AoE vs
///   NBD, bonnie's block read / write / rewrite (bonnie++ -f on ext4 as the seed
///   ran it, and the bench's request-level bonnie beside), behind a 256 MB/s disk (the 4-disk
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
            workloads: vec![
                LabWorkload::Sequential,
                LabWorkload::BonnieFs,
                LabWorkload::Bonnie,
            ],
            disk: Disk {
                rate_mb_per_s: Some(SEED_003_DISK_MB_PER_S),
                latency_ms: None,
            },
            baseline: false,
            aoe_xdp: false,
            bonnie_widest_only: true,
        },
        Seed::S000 => Matrix {
            protocols: vec![Protocol::Aoe, Protocol::Nbd],
            mtus: vec![1500, 4132, 4608, 9000],
            rates: vec![Rate(Some(1000)), Rate(Some(10_000))],
            channels: vec![1],
            layouts: Layouts::Single,
            workloads: vec![LabWorkload::BonnieFs, LabWorkload::Bonnie],
            disk: Disk {
                rate_mb_per_s: Some(SEED_000_LOCAL_DISK.1),
                latency_ms: None,
            },
            baseline: false,
            aoe_xdp: false,
            bonnie_widest_only: false,
        },
        Seed::S001 => Matrix {
            protocols: vec![Protocol::Aoe, Protocol::Iscsi],
            mtus: vec![1500, 9000],
            rates: vec![Rate(Some(1000))],
            channels: vec![1],
            layouts: Layouts::Single,
            workloads: vec![LabWorkload::Sequential],
            disk: Disk::UNTHROTTLED,
            baseline: false,
            aoe_xdp: false,
            bonnie_widest_only: false,
        },
        Seed::S002 => Matrix {
            protocols: vec![Protocol::Nfs, Protocol::Iscsi, Protocol::Nbd, Protocol::Aoe],
            mtus: vec![1500],
            rates: vec![Rate(Some(10_000))],
            channels: vec![1],
            layouts: Layouts::Single,
            workloads: vec![LabWorkload::Sweep],
            disk: Disk::UNTHROTTLED,
            baseline: false,
            aoe_xdp: false,
            bonnie_widest_only: false,
        },
        Seed::S004 => Matrix {
            protocols: vec![Protocol::Nfs, Protocol::Nbd, Protocol::Iscsi, Protocol::Aoe],
            mtus: vec![1500],
            rates: vec![Rate(Some(10_000)), Rate(Some(1000))],
            channels: vec![1],
            layouts: Layouts::Single,
            workloads: vec![
                LabWorkload::Sequential,
                LabWorkload::BonnieFs,
                LabWorkload::Bonnie,
            ],
            disk: Disk::UNTHROTTLED,
            baseline: false,
            aoe_xdp: false,
            bonnie_widest_only: false,
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
            // Each protocol: block throughput, bonnie++ on ext4, request-level bonnie.
            assert_eq!(plan.cells.len(), 12);
            assert!(plan
                .cells
                .iter()
                .all(|c| c.striped && c.exports() == 4 && c.disk.rate_mb_per_s == Some(210.0)));
            for protocol in [Protocol::Aoe, Protocol::Iscsi] {
                let workloads: Vec<LabWorkload> = plan
                    .cells
                    .iter()
                    .filter(|c| c.protocol == protocol)
                    .map(|c| c.workload)
                    .collect();
                assert_eq!(
                    workloads,
                    [
                        LabWorkload::Sequential,
                        LabWorkload::BonnieFs,
                        LabWorkload::Bonnie
                    ]
                );
            }
        }
        // One channel: block throughput only, for the striping table.
        assert!(expansion
            .beds
            .iter()
            .filter(|b| b.bed.channels == 1)
            .flat_map(|b| &b.cells)
            .all(|c| c.workload == LabWorkload::Sequential));
        assert_eq!(expansion.cell_count(), 32);
        assert!(expansion
            .beds
            .iter()
            .all(|b| b.cells.iter().any(|c| c.protocol == Protocol::Nvme)));
    }

    #[test]
    fn seed_000_sweeps_four_mtus_at_two_speeds_on_one_link() {
        let expansion = matrix(Seed::S000).expand();
        assert_eq!(expansion.beds.len(), 8);
        assert_eq!(expansion.cell_count(), 32);
        assert!(expansion.beds.iter().all(|b| b.bed.channels == 1));
        assert!(expansion
            .beds
            .iter()
            .flat_map(|b| &b.cells)
            .all(
                |c| matches!(c.workload, LabWorkload::Bonnie | LabWorkload::BonnieFs)
                    && c.disk.rate_mb_per_s == Some(256.0)
            ));
    }

    #[test]
    fn seed_001_is_aoe_and_iscsi_on_one_gigabit_link_with_dd_requests() {
        let expansion = matrix(Seed::S001).expand();
        let beds: Vec<(u32, Rate)> = expansion
            .beds
            .iter()
            .map(|b| (b.bed.mtu, b.bed.rate))
            .collect();
        assert_eq!(beds, [(1500, Rate(Some(1000))), (9000, Rate(Some(1000)))]);
        assert!(expansion.beds.iter().all(|b| {
            b.cells.iter().map(|c| c.protocol).collect::<Vec<_>>()
                == [Protocol::Aoe, Protocol::Iscsi]
        }));
        let quick = defaults(Seed::S001);
        assert_eq!(
            (quick.block_size, quick.queue_depth),
            (Some(4 << 20), Some(1))
        );
    }

    #[test]
    fn seed_002_sweeps_nfs_and_the_block_protocols_over_10_gbit() {
        let expansion = matrix(Seed::S002).expand();
        assert_eq!(expansion.beds.len(), 1);
        assert_eq!(expansion.beds[0].bed.rate, Rate(Some(10_000)));
        assert_eq!(expansion.beds[0].bed.mtu, 1500);
        let cells = &expansion.beds[0].cells;
        assert_eq!(cells[0].protocol, Protocol::Nfs, "NFS first, as the seed");
        assert_eq!(cells.len(), 4);
        assert!(cells
            .iter()
            .all(|c| c.workload == LabWorkload::Sweep && c.disk == Disk::UNTHROTTLED));
        assert!(expansion.skipped.is_empty(), "{:?}", expansion.skipped);
        assert_eq!(defaults(Seed::S002).backing, Backing::File);
    }

    #[test]
    fn seed_004_puts_nfs_beside_the_block_protocols_at_10_and_1_gbit() {
        let expansion = matrix(Seed::S004).expand();
        let rates: Vec<Rate> = expansion.beds.iter().map(|b| b.bed.rate).collect();
        assert_eq!(rates, [Rate(Some(10_000)), Rate(Some(1000))]);
        for plan in &expansion.beds {
            let nfs = plan.cells.iter().filter(|c| c.protocol == Protocol::Nfs);
            assert_eq!(
                nfs.count(),
                2,
                "a sequential and a bonnie cell: no bonnie++ on NFS"
            );
            assert_eq!(plan.cells.len(), 11);
        }
        assert!(expansion
            .skipped
            .iter()
            .any(|n| n.contains("no NFS client in this kernel")));
        assert_eq!(defaults(Seed::S004).backing, Backing::File);
    }
}
