//! Where the initiator's builders and parsers meet the target's decoders and
//! encoders: every CDB we send decodes to what we meant, and every answer the target
//! builds parses back to what it said.

use std::sync::Arc;

use blockwire_blockdev::{Device, MemoryDevice, Op};

use super::{answers, cdbs, status};
use crate::cdb::{self, Cdb, Rw};
use crate::inquiry::{self, DISK, NO_LUN};
use crate::sense::codes;
use crate::target::encode_lun;
use crate::vpd::{self, BlockFacts};
use crate::{Command, LogicalUnit, LunConfig, Nexus, Response, ScsiTarget, Status};

const BLOCKS: u64 = 4096;

fn nexus() -> Nexus {
    Nexus {
        initiator_port: "iqn.2026-11.dev.blockwire:test,i,0x1".into(),
        transport_id: Vec::new(),
        relative_target_port: 1,
    }
}

fn facts(unmap: bool) -> BlockFacts {
    BlockFacts {
        max_transfer_blocks: 65536,
        optimal_transfer_blocks: 8,
        max_compare_and_write_blocks: 255,
        max_unmap_blocks: 0x1000,
        max_unmap_descriptors: 16,
        unmap_granularity: 8,
        max_write_same_blocks: 1 << 21,
        unmap,
        lbprz: true,
        rotational: false,
    }
}

fn target() -> ScsiTarget {
    let device = Device::from_device(MemoryDevice::new(BLOCKS * 512));
    let unit = LogicalUnit::new(device, LunConfig::default()).unwrap();
    let mut target = ScsiTarget::new();
    target.add_lun(0, Arc::new(unit));
    target.add_lun(0x102, target.lun(0).unwrap().clone());
    target
}

fn run(target: &ScsiTarget, cdb: &[u8], data_out: &[u8]) -> Response {
    target.execute(
        0,
        &Command {
            nexus: &nexus(),
            cdb,
            data_out,
        },
    )
}

#[test]
fn block_cdbs_decode_to_what_was_built() {
    let rw = |lba, blocks, fua| Rw {
        lba,
        blocks,
        fua,
        dpo: false,
    };
    let lba = 0x0102_0304_0506_0708;
    assert_eq!(
        cdb::decode(&cdbs::read16(lba, 77)),
        Ok(Cdb::Read(rw(lba, 77, false)))
    );
    assert_eq!(
        cdb::decode(&cdbs::write16(lba, 9, true)),
        Ok(Cdb::Write(rw(lba, 9, true)))
    );
    assert_eq!(
        cdb::decode(&cdbs::write_same16(5, 6, true)),
        Ok(Cdb::WriteSame {
            lba: 5,
            blocks: 6,
            unmap: true,
            ndob: false
        })
    );
    let whole = Cdb::SynchronizeCache { lba: 0, blocks: 0 };
    assert_eq!(cdb::decode(&cdbs::synchronize_cache16()), Ok(whole));
    assert_eq!(cdb::decode(&cdbs::synchronize_cache10()), Ok(whole));
    assert_eq!(
        cdb::decode(&cdbs::unmap(24)),
        Ok(Cdb::Unmap { param_len: 24 })
    );
    assert_eq!(
        cdb::decode(&cdbs::get_lba_status(12, 4096)),
        Ok(Cdb::GetLbaStatus {
            lba: 12,
            alloc: 4096
        })
    );
}

#[test]
fn inquiry_cdbs_decode_to_what_was_built() {
    assert_eq!(
        cdb::decode(&cdbs::inquiry(Some(vpd::BLOCK_LIMITS), 64)),
        Ok(Cdb::Inquiry {
            evpd: true,
            page: vpd::BLOCK_LIMITS,
            alloc: 64
        })
    );
    assert_eq!(
        cdb::decode(&cdbs::inquiry(None, 96)),
        Ok(Cdb::Inquiry {
            evpd: false,
            page: 0,
            alloc: 96
        })
    );
    assert_eq!(
        cdb::decode(&cdbs::read_capacity16()),
        Ok(Cdb::ReadCapacity16 { alloc: 32 })
    );
    assert_eq!(
        cdb::decode(&cdbs::report_luns(1024)),
        Ok(Cdb::ReportLuns {
            select: 0,
            alloc: 1024
        })
    );
    assert_eq!(
        cdb::decode(&cdbs::test_unit_ready()),
        Ok(Cdb::TestUnitReady)
    );
    assert_eq!(
        cdb::decode(&cdbs::report_supported_opcode(0x9e, Some(0x12))),
        Ok(Cdb::ReportSupportedOpcodes {
            rctd: false,
            options: 3,
            opcode: 0x9e,
            action: 0x12,
            alloc: 64
        })
    );
}

#[test]
fn vpd_pages_parse_back_to_the_facts_they_encode() {
    let config = LunConfig::default();
    for unmap in [false, true] {
        let facts = facts(unmap);
        let limits = vpd::vpd_page(vpd::BLOCK_LIMITS, &config, &facts, &nexus()).unwrap();
        let limits = answers::parse_block_limits(&limits).unwrap();
        assert_eq!(limits.max_transfer_blocks, facts.max_transfer_blocks);
        assert_eq!(
            limits.optimal_transfer_blocks,
            facts.optimal_transfer_blocks
        );
        assert_eq!(
            u32::from(limits.optimal_granularity_blocks),
            facts.optimal_transfer_blocks
        );
        assert_eq!(limits.max_write_same_blocks, facts.max_write_same_blocks);
        let unmap_blocks = if unmap { facts.max_unmap_blocks } else { 0 };
        assert_eq!(limits.max_unmap_blocks, unmap_blocks);

        let page = vpd::LOGICAL_BLOCK_PROVISIONING;
        let provisioning = vpd::vpd_page(page, &config, &facts, &nexus()).unwrap();
        let provisioning = answers::parse_provisioning(&provisioning).unwrap();
        assert_eq!(provisioning.unmap, unmap);
        assert_eq!(provisioning.write_same_unmap, unmap);
    }
    let supported = vpd::vpd_page(vpd::SUPPORTED_PAGES, &config, &facts(true), &nexus());
    let supported = answers::parse_supported_pages(&supported.unwrap());
    assert!(supported.contains(&vpd::BLOCK_LIMITS));
    assert!(supported.contains(&vpd::LOGICAL_BLOCK_PROVISIONING));
}

#[test]
fn standard_inquiry_parses_back() {
    let config = LunConfig::default();
    let disk = answers::parse_inquiry(&inquiry::standard(&config, DISK)).unwrap();
    assert_eq!(disk.device_type, DISK);
    assert!(!disk.not_present && !disk.removable);
    assert_eq!(disk.vendor, config.vendor);
    assert_eq!(disk.product, config.product);
    assert_eq!(disk.revision, config.revision);
    let absent = answers::parse_inquiry(&inquiry::standard(&config, NO_LUN)).unwrap();
    assert!(absent.not_present);
}

#[test]
fn encoded_luns_parse_back() {
    let luns = [0u64, 1, 255, 256, 0x3fff];
    let mut data = ((luns.len() * 8) as u32).to_be_bytes().to_vec();
    data.extend_from_slice(&[0; 4]);
    for lun in luns {
        data.extend_from_slice(&encode_lun(lun));
    }
    assert_eq!(answers::parse_report_luns(&data), luns);
}

#[test]
fn a_target_answers_what_the_initiator_asks() {
    let target = target();
    let capacity = run(&target, &cdbs::read_capacity16(), &[]);
    assert_eq!(capacity.status, Status::Good);
    let capacity = answers::parse_capacity(&capacity.data_in).unwrap();
    assert_eq!((capacity.blocks, capacity.block_size), (BLOCKS, 512));

    let luns = run(&target, &cdbs::report_luns(1024), &[]);
    assert_eq!(answers::parse_report_luns(&luns.data_in), vec![0, 0x102]);

    let write = run(&target, &cdbs::write16(8, 2, false), &[0xaa; 1024]);
    assert_eq!(write.status, Status::Good);
    let read = run(&target, &cdbs::read16(8, 2), &[]);
    assert_eq!(&read.data_in[..], &[0xaa; 1024][..]);

    let supported = run(
        &target,
        &cdbs::report_supported_opcode(cdb::op::READ_16, None),
        &[],
    );
    assert!(answers::opcode_supported(&supported.data_in));
    let unknown = run(&target, &cdbs::report_supported_opcode(0xff, None), &[]);
    assert!(!answers::opcode_supported(&unknown.data_in));
}

#[test]
fn a_target_refusal_becomes_the_error_kind_it_encodes() {
    let target = target();
    let beyond = run(&target, &cdbs::read16(BLOCKS, 1), &[]);
    assert_eq!(beyond.status, Status::CheckCondition);
    let error = status::status_error(beyond.status as u8, &beyond.sense, Op::Read, 0, 512);
    assert_eq!(
        error.kind(),
        crate::errors::error_kind_for_sense(
            codes::LBA_OUT_OF_RANGE.key,
            codes::LBA_OUT_OF_RANGE.asc,
            codes::LBA_OUT_OF_RANGE.ascq
        )
    );
    assert_eq!(error.kind(), blockwire_blockdev::ErrorKind::OutOfRange);
}
