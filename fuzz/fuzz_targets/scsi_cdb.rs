//! The SCSI disk on arbitrary command sequences: CDBs and data-out from two I_T
//! nexuses against two small memory logical units (512-byte and 4 KiB blocks), so
//! reservations, unit attentions and mode changes carry from one command to the
//! next. Nothing may panic, and every answer must be consistent: sense data exactly
//! when the status is CHECK CONDITION.
#![no_main]

use std::sync::Arc;

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_scsi::{Command, LogicalUnit, LunConfig, Nexus, ScsiTarget, Status};
use libfuzzer_sys::fuzz_target;

fn target() -> ScsiTarget {
    let mut target = ScsiTarget::new();
    for (lun, block_size) in [(0u64, 512u32), (1, 4096)] {
        let device = Device::from_device(MemoryDevice::new(256 * 1024));
        let config = LunConfig {
            block_size,
            ..LunConfig::default()
        };
        let unit = LogicalUnit::new(device, config).expect("logical unit");
        target.add_lun(lun, Arc::new(unit));
    }
    target
}

fn nexus(port: u8) -> Nexus {
    Nexus {
        initiator_port: format!("iqn.fuzz:{port},i,0x1"),
        transport_id: vec![0x05, 0, 0, 16, b'i', b'q', b'n', b'.', b'f', b'u', b'z', b'z', port, 0, 0, 0, 0, 0, 0, 0],
        relative_target_port: 1,
    }
}

fuzz_target!(|data: &[u8]| {
    let target = target();
    let nexuses = [nexus(b'a'), nexus(b'b')];
    // Each command: one control byte (bit 0 nexus, bit 1 LUN, bits 2-3 a CDB length
    // of 6, 10, 12 or 16, bits 4-7 a data-out length in 512-byte steps), then the
    // CDB, then the data-out.
    let mut rest = data;
    while let Some((&control, tail)) = rest.split_first() {
        let cdb_len = [6, 10, 12, 16][usize::from(control >> 2 & 3)];
        let data_len = usize::from(control >> 4) * 512;
        let Some(cdb) = tail.get(..cdb_len) else {
            return;
        };
        let data_out = &tail[cdb_len..(cdb_len + data_len).min(tail.len())];
        rest = &tail[cdb_len + data_out.len()..];
        let lun = u64::from(control >> 1 & 1);
        let command = Command {
            nexus: &nexuses[usize::from(control & 1)],
            cdb,
            data_out,
        };
        let _ = target.transfer_info(lun, cdb);
        let _ = target.write_completes_inline(lun, cdb);
        let response = match target.try_execute_cached(lun, &command) {
            Some(response) => response,
            None => target.execute(lun, &command),
        };
        assert_eq!(
            response.status == Status::CheckCondition,
            !response.sense.is_empty(),
            "sense data goes with CHECK CONDITION and nothing else"
        );
    }
});
