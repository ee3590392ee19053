//! The target's sans-IO full feature phase on arbitrary sequences of PDUs, data
//! digest errors, clock jumps and task completions, against a SCSI target with a
//! small memory logical unit. Nothing may panic; every PDU queued must encode and
//! fit what the initiator accepts; the data-out held stays within its bound; and a
//! phase that ended stays ended and takes nothing more.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockwire_blockdev::{Device, MemoryDevice};
use blockwire_iscsi::login::{LoginConfig, Negotiated, SessionType};
use blockwire_iscsi::pdu::{Bhs, Pdu, BHS_LEN};
use blockwire_iscsi::target::full_feature::{
    FullFeature, SegmentRead, Timers, Work, MAX_PENDING_DATA,
};
use blockwire_iscsi::target::initiator_port;
use blockwire_iscsi::target::tasks::Tasks;
use blockwire_scsi::{Command, LogicalUnit, LunConfig, Nexus, ScsiTarget};
use libfuzzer_sys::fuzz_target;

/// Opcodes an initiator sends, picked by the low bits of each record's control byte.
const OPCODES: [u8; 6] = [0x01, 0x05, 0x02, 0x00, 0x04, 0x06];
/// The most data one fuzzed PDU carries (what the phase was told it accepts).
const MAX_SEGMENT: usize = 8192;

fn negotiated(control: u8) -> Negotiated {
    Negotiated {
        session_type: if control & 0x80 != 0 {
            SessionType::Discovery
        } else {
            SessionType::Normal
        },
        initiator_name: "iqn.fuzz:i".into(),
        initiator_alias: None,
        target_name: Some("iqn.fuzz:t".into()),
        isid: 1,
        tsih: 1,
        cid: 1,
        header_digest: false,
        data_digest: true,
        initiator_max_recv_data_segment_length: 1024,
        target_max_recv_data_segment_length: MAX_SEGMENT as u32,
        max_burst_length: 4096 << (control & 3),
        first_burst_length: 2048 << (control >> 2 & 3),
        initial_r2t: control & 0x10 != 0,
        immediate_data: control & 0x20 != 0,
        max_outstanding_r2t: 1 + u32::from(control >> 6 & 1) * 3,
        data_pdu_in_order: true,
        data_sequence_in_order: true,
        default_time2wait: 2,
        default_time2retain: 20,
        error_recovery_level: 0,
        max_connections: 1,
        stat_sn: 0,
        exp_cmd_sn: 0,
    }
}

fn scsi_target() -> Arc<ScsiTarget> {
    let mut target = ScsiTarget::new();
    let device = Device::from_device(MemoryDevice::new(256 * 1024));
    let unit = LogicalUnit::new(device, LunConfig::default()).expect("logical unit");
    target.add_lun(0, Arc::new(unit));
    Arc::new(target)
}

fuzz_target!(|input: &[u8]| {
    let Some((&setup, mut rest)) = input.split_first() else {
        return;
    };
    let negotiated = negotiated(setup);
    let discovery = negotiated.session_type == SessionType::Discovery;
    let scsi = (!discovery).then(scsi_target);
    let nexus = Nexus {
        initiator_port: initiator_port("iqn.fuzz:i", 1),
        transport_id: Vec::new(),
        relative_target_port: 1,
    };
    let tasks = Arc::new(Tasks::new(0, 8));
    let timers = Timers {
        nop_interval: Duration::from_secs(5),
        nop_timeout: Duration::from_secs(5),
    };
    let start = Instant::now();
    let mut now = start;
    let mut phase = FullFeature::new(
        negotiated,
        Arc::new(LoginConfig::default()),
        scsi.clone(),
        tasks,
        timers,
        now,
    );
    // Each record: a control byte, then for a PDU its 48-byte header and its data
    // segment (the header's length, cut to what is left and to MAX_SEGMENT).
    while let Some((&control, tail)) = rest.split_first() {
        rest = tail;
        let ended = phase.ending().is_some();
        match control & 7 {
            7 => {
                now += Duration::from_millis(u64::from(control >> 3) * 500);
                phase.handle_timeout(now);
            }
            kind => {
                if rest.len() < BHS_LEN {
                    return;
                }
                let mut bhs = Bhs::default();
                bhs.0.copy_from_slice(&rest[..BHS_LEN]);
                rest = &rest[BHS_LEN..];
                if let Some(&opcode) = OPCODES.get(usize::from(kind)) {
                    bhs.0[0] = (bhs.0[0] & 0x40) | opcode;
                }
                // No AHS: the header says none, as the reader would hand over.
                bhs.0[4] = 0;
                let len = (bhs.data_len() as usize).min(rest.len()).min(MAX_SEGMENT);
                bhs.0[5..8].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
                let (data, tail) = rest.split_at(len);
                rest = tail;
                if control & 0x08 != 0 {
                    // The segment arrived with a bad data digest.
                    let _ = phase.handle_header(now, &bhs, &[]);
                    let _ = phase.segment_buffer();
                    phase.handle_segment(now, SegmentRead::DigestError);
                } else {
                    phase.handle_pdu(now, &bhs, &[], data);
                }
            }
        }
        let (_, held) = phase.pending();
        assert!(held <= MAX_PENDING_DATA, "{held} bytes of data-out held");
        // As the driver does: send what is queued, run the work, until neither is left.
        let (mut sent, mut worked) = (0, 0);
        loop {
            while let Some(transmit) = phase.poll_transmit() {
                sent += 1;
                let header = transmit.pdu.encode(transmit.data.len() as u32);
                assert!(Pdu::decode(&header.bhs, &header.ahs).is_ok());
                assert!(
                    transmit.data.len() <= 1024,
                    "more than the initiator accepts"
                );
            }
            let Some(work) = phase.poll_work() else {
                break;
            };
            worked += 1;
            match work {
                Work::Execute(job) => {
                    let scsi = scsi.as_ref().expect("commands only in normal sessions");
                    if job.early.is_none() {
                        let data_out = match &job.data {
                            Some((buf, received)) => &buf[..*received as usize],
                            None => &[][..],
                        };
                        let _ = scsi.execute_decoded(
                            &job.decoded,
                            &Command {
                                nexus: &nexus,
                                cdb: &job.cdb,
                                data_out,
                            },
                        );
                    }
                }
                Work::Quiesce { reset, .. } => {
                    if let (Some(kind), Some(scsi)) = (reset, &scsi) {
                        scsi.reset(kind, &nexus);
                    }
                    phase.quiesced();
                }
            }
        }
        if ended {
            assert_eq!((sent, worked), (0, 0), "an ended phase took more");
            assert!(phase.next_timeout().is_none());
        }
    }
});
