//! Byte-exact vectors for every PDU type, both ways.

use super::*;

fn hex(text: &str) -> Vec<u8> {
    let clean: String = text.split_whitespace().collect();
    (0..clean.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&clean[i..i + 2], 16).unwrap())
        .collect()
}

fn bhs(text: &str) -> Bhs {
    Bhs(hex(text).try_into().expect("48 bytes"))
}

/// Decodes `wire`, compares with `pdu`, and encodes `pdu` back to `wire`.
fn both_ways(wire: &Bhs, ahs: &[u8], pdu: Pdu) {
    assert_eq!(Pdu::decode(wire, ahs).unwrap(), pdu);
    let header = pdu.encode(wire.data_len());
    assert_eq!(header.bhs, *wire);
    assert_eq!(header.ahs, ahs);
}

#[test]
fn scsi_command_read10() {
    // A READ(10) of 8 blocks at LBA 0x20 on LUN 0, 4096 bytes expected, simple task.
    let wire = bhs(
        "41 c1 0000 00 000000 0000000000000000 00000011 00001000 00000005 00000007
                    28 00 00000020 00 0008 00 000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::ScsiCommand(ScsiCommand {
            immediate: true,
            final_bit: true,
            read: true,
            write: false,
            attribute: TaskAttribute::Simple,
            lun: 0,
            initiator_task_tag: 0x11,
            expected_data_transfer_length: 4096,
            cmd_sn: 5,
            exp_stat_sn: 7,
            cdb: hex("28 00 00000020 00 0008 00 000000000000"),
            bidi_read_length: None,
        }),
    );
}

#[test]
fn scsi_command_with_extended_cdb() {
    let mut cdb: Vec<u8> = (1..=32).collect();
    cdb[0] = 0x7f;
    let command = ScsiCommand {
        final_bit: true,
        write: true,
        attribute: TaskAttribute::Ordered,
        lun: 0x0001_0000_0000_0000,
        initiator_task_tag: 1,
        expected_data_transfer_length: 512,
        cdb: cdb.clone(),
        ..ScsiCommand::default()
    };
    let header = Pdu::ScsiCommand(command.clone()).encode(512);
    // 16 extra bytes + reserved byte = AHSLength 17, padded to 20 bytes.
    assert_eq!(&header.ahs[..4], &[0, 17, 1, 0]);
    assert_eq!(header.ahs.len(), 20);
    assert_eq!(header.bhs.ahs_len(), 20);
    assert_eq!(
        Pdu::decode(&header.bhs, &header.ahs).unwrap(),
        Pdu::ScsiCommand(command)
    );
}

#[test]
fn malformed_ahs_is_refused() {
    let mut wire = bhs(
        "01 80 0000 01 000000 0000000000000000 00000001 00000000 00000000 00000000
                        00000000000000000000000000000000",
    );
    assert!(matches!(
        Pdu::decode(&wire, &[0, 9, 1, 0]),
        Err(PduError::BadAhs(_))
    ));
    assert!(matches!(
        Pdu::decode(&wire, &[0, 3, 9, 0]),
        Err(PduError::BadAhs(_))
    ));
    assert!(matches!(Pdu::decode(&wire, &[]), Err(PduError::BadAhs(_))));
    wire.0[0] = 0x1f;
    wire.0[4] = 0;
    assert_eq!(Pdu::decode(&wire, &[]), Err(PduError::UnknownOpcode(0x1f)));
}

#[test]
fn login_request_and_response() {
    let wire = bhs(
        "43 87 00 00 00 00002a 400001370000 0000 00000000 0001 0000 00000001 00000000
                    00000000000000000000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::LoginRequest(LoginRequest {
            transit: true,
            continue_bit: false,
            current_stage: 1,
            next_stage: 3,
            version_max: 0,
            version_min: 0,
            isid: 0x4000_0137_0000,
            tsih: 0,
            initiator_task_tag: 0,
            cid: 1,
            cmd_sn: 1,
            exp_stat_sn: 0,
        }),
    );
    let wire = bhs(
        "23 87 00 00 00 000010 400001370000 0005 00000000 00000000 00000000 00000001
                    00000020 0000 0000 0000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::LoginResponse(LoginResponse {
            transit: true,
            current_stage: 1,
            next_stage: 3,
            isid: 0x4000_0137_0000,
            tsih: 5,
            exp_cmd_sn: 1,
            max_cmd_sn: 0x20,
            ..LoginResponse::default()
        }),
    );
}

#[test]
fn data_in_with_status_and_underflow() {
    let wire = bhs(
        "25 83 00 00 00 000200 0000000000000000 00000011 ffffffff 00000009 00000006
                    00000025 00000000 00000000 00000e00",
    );
    both_ways(
        &wire,
        &[],
        Pdu::DataIn(DataIn {
            final_bit: true,
            status: Some(0),
            residual: ResidualKind::Underflow(0xe00),
            initiator_task_tag: 0x11,
            target_transfer_tag: RESERVED_TAG,
            stat_sn: 9,
            exp_cmd_sn: 6,
            max_cmd_sn: 0x25,
            ..DataIn::default()
        }),
    );
}

#[test]
fn scsi_response_with_overflow() {
    let wire = bhs(
        "21 84 00 02 00 000014 0000000000000000 00000003 00000000 0000000a 00000004
                    00000023 00000000 00000000 00000200",
    );
    both_ways(
        &wire,
        &[],
        Pdu::ScsiResponse(ScsiResponse {
            status: 2,
            residual: ResidualKind::Overflow(0x200),
            initiator_task_tag: 3,
            stat_sn: 10,
            exp_cmd_sn: 4,
            max_cmd_sn: 0x23,
            ..ScsiResponse::default()
        }),
    );
    assert_eq!(ResidualKind::of(4096, 512), ResidualKind::Overflow(3584));
    assert_eq!(ResidualKind::of(512, 4096), ResidualKind::Underflow(3584));
    assert_eq!(ResidualKind::of(512, 512), ResidualKind::None);
}

#[test]
fn r2t_and_data_out() {
    let wire = bhs(
        "31 80 0000 00 000000 0000000000000000 00000004 00000007 00000002 00000003
                    00000040 00000001 00010000 00040000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::R2t(R2t {
            initiator_task_tag: 4,
            target_transfer_tag: 7,
            stat_sn: 2,
            exp_cmd_sn: 3,
            max_cmd_sn: 0x40,
            r2t_sn: 1,
            buffer_offset: 0x10000,
            desired_data_transfer_length: 0x40000,
            ..R2t::default()
        }),
    );
    let wire = bhs(
        "05 80 0000 00 002000 0000000000000000 00000004 00000007 00000000 00000002
                    00000000 00000003 00010000 00000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::DataOut(DataOut {
            final_bit: true,
            initiator_task_tag: 4,
            target_transfer_tag: 7,
            exp_stat_sn: 2,
            data_sn: 3,
            buffer_offset: 0x10000,
            ..DataOut::default()
        }),
    );
}

#[test]
fn nops_tmf_text_logout_async_reject() {
    let wire = bhs(
        "40 80 0000 00 000000 0000000000000000 00000009 ffffffff 00000003 00000002
                    00000000000000000000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::NopOut(NopOut {
            immediate: true,
            initiator_task_tag: 9,
            target_transfer_tag: RESERVED_TAG,
            cmd_sn: 3,
            exp_stat_sn: 2,
            ..NopOut::default()
        }),
    );
    let wire = bhs(
        "20 80 0000 00 000000 0000000000000000 ffffffff 00000001 00000005 00000006
                    00000030 000000000000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::NopIn(NopIn {
            initiator_task_tag: RESERVED_TAG,
            target_transfer_tag: 1,
            stat_sn: 5,
            exp_cmd_sn: 6,
            max_cmd_sn: 0x30,
            ..NopIn::default()
        }),
    );
    let wire = bhs(
        "02 81 0000 00 000000 0000000000000000 00000010 0000000c 00000004 00000003
                    00000002 00000000 0000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::TaskMgmtRequest(TaskMgmtRequest {
            function: TaskFunction::AbortTask,
            initiator_task_tag: 0x10,
            referenced_task_tag: 0xc,
            cmd_sn: 4,
            exp_stat_sn: 3,
            ref_cmd_sn: 2,
            ..TaskMgmtRequest::default()
        }),
    );
    let wire = bhs(
        "22 80 05 00 00 000000 0000000000000000 00000010 00000000 00000003 00000005
                    00000024 000000000000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::TaskMgmtResponse(TaskMgmtResponse {
            response: 5,
            initiator_task_tag: 0x10,
            stat_sn: 3,
            exp_cmd_sn: 5,
            max_cmd_sn: 0x24,
        }),
    );
    let wire = bhs(
        "44 80 0000 00 000010 0000000000000000 00000002 ffffffff 00000001 00000001
                    00000000000000000000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::TextRequest(TextRequest {
            immediate: true,
            final_bit: true,
            initiator_task_tag: 2,
            target_transfer_tag: RESERVED_TAG,
            cmd_sn: 1,
            exp_stat_sn: 1,
            ..TextRequest::default()
        }),
    );
    let wire = bhs(
        "24 80 0000 00 000030 0000000000000000 00000002 ffffffff 00000001 00000002
                    00000021 000000000000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::TextResponse(TextResponse {
            final_bit: true,
            initiator_task_tag: 2,
            target_transfer_tag: RESERVED_TAG,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 0x21,
            ..TextResponse::default()
        }),
    );
    let wire = bhs(
        "46 80 0000 00 000000 0000000000000000 00000007 0001 0000 00000009 00000008
                    00000000000000000000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::LogoutRequest(LogoutRequest {
            immediate: true,
            reason: LogoutReason::CloseSession,
            initiator_task_tag: 7,
            cid: 1,
            cmd_sn: 9,
            exp_stat_sn: 8,
        }),
    );
    let wire = bhs(
        "26 80 00 00 00 000000 0000000000000000 00000007 00000000 00000008 0000000a
                    00000029 00000000 0002 0014 00000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::LogoutResponse(LogoutResponse {
            response: 0,
            initiator_task_tag: 7,
            stat_sn: 8,
            exp_cmd_sn: 10,
            max_cmd_sn: 0x29,
            time2wait: 2,
            time2retain: 20,
        }),
    );
    let wire = bhs(
        "32 80 0000 00 000000 0000000000000000 ffffffff 00000000 00000004 00000005
                    00000024 01 00 0000 0000 0002 00000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::AsyncMessage(AsyncMessage {
            stat_sn: 4,
            exp_cmd_sn: 5,
            max_cmd_sn: 0x24,
            event: AsyncMessage::REQUEST_LOGOUT,
            parameter3: 2,
            ..AsyncMessage::default()
        }),
    );
    let wire = bhs(
        "3f 80 09 00 00 000030 0000000000000000 ffffffff 00000000 00000004 00000005
                    00000024 00000000 0000000000000000",
    );
    both_ways(
        &wire,
        &[],
        Pdu::Reject(Reject {
            reason: RejectReason::InvalidPduField,
            stat_sn: 4,
            exp_cmd_sn: 5,
            max_cmd_sn: 0x24,
            data_sn: 0,
        }),
    );
}

#[test]
fn snack_decodes() {
    let wire = bhs(
        "10 81 0000 00 000000 0000000000000000 00000001 ffffffff 00000000 00000002
                    0000000000000000 00000003 00000004",
    );
    both_ways(
        &wire,
        &[],
        Pdu::Snack(Snack {
            kind: 1,
            initiator_task_tag: 1,
            target_transfer_tag: RESERVED_TAG,
            exp_stat_sn: 2,
            beg_run: 3,
            run_length: 4,
            ..Snack::default()
        }),
    );
}
