//! Byte vectors for each PDU, error cases, and a round trip over random PDUs.

use proptest::prelude::*;

use super::*;
use crate::cqe::{Cqe, Status};
use crate::sqe::{SglDescriptor, Sqe};

fn plain() -> Framing {
    Framing::default()
}

fn digested() -> Framing {
    Framing {
        digests: Digests {
            header: true,
            data: true,
        },
        ..Framing::default()
    }
}

fn round_trip(pdu: &Pdu, framing: &Framing) -> Vec<u8> {
    let bytes = pdu.to_bytes(framing);
    assert_eq!(
        decode(&bytes, framing),
        Ok(Some((pdu.clone(), bytes.len())))
    );
    assert_eq!(pdu_len(&bytes, framing), Ok(bytes.len()));
    // Every proper prefix is incomplete, not an error.
    for cut in [0, 7, 8, bytes.len() - 1] {
        assert_eq!(decode(&bytes[..cut], framing), Ok(None), "cut at {cut}");
    }
    bytes
}

#[test]
fn icreq_vector() {
    let pdu = Pdu::IcReq(IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests {
            header: true,
            data: false,
        },
        maxr2t: 0,
    });
    let bytes = round_trip(&pdu, &plain());
    let mut expected = vec![0u8; 128];
    expected[..8].copy_from_slice(&[0x00, 0x00, 128, 0, 128, 0, 0, 0]);
    expected[11] = 0x01;
    assert_eq!(bytes, expected);
}

#[test]
fn icresp_vector() {
    let pdu = Pdu::IcResp(IcResp {
        pfv: 0,
        cpda: 0,
        digests: Digests {
            header: true,
            data: true,
        },
        maxh2cdata: 0x20000,
    });
    // Digests never frame ICResp, even once they are on.
    let bytes = round_trip(&pdu, &digested());
    assert_eq!(
        &bytes[..16],
        &[1, 0, 128, 0, 128, 0, 0, 0, 0, 0, 0, 3, 0, 0, 2, 0]
    );
    assert_eq!(bytes.len(), 128);
}

#[test]
fn capsule_cmd_with_in_capsule_data_vector() {
    let mut sqe = Sqe::new(crate::opcodes::io::WRITE, 0x0102);
    sqe.set_nsid(1);
    sqe.set_sgl(SglDescriptor::in_capsule(4));
    let pdu = Pdu::CapsuleCmd(CapsuleCmd {
        sqe,
        data: vec![0xaa, 0xbb, 0xcc, 0xdd],
    });
    let bytes = round_trip(&pdu, &plain());
    // hlen 72, pdo 72, plen 76.
    assert_eq!(&bytes[..8], &[0x04, 0x00, 72, 72, 76, 0, 0, 0]);
    assert_eq!(&bytes[8..16], &[0x01, 0x40, 0x02, 0x01, 1, 0, 0, 0]);
    assert_eq!(&bytes[72..], &[0xaa, 0xbb, 0xcc, 0xdd]);

    // With digests: header digest after 72 bytes, data at 76, data digest last.
    let bytes = round_trip(&pdu, &digested());
    assert_eq!(&bytes[..8], &[0x04, 0x03, 72, 76, 84, 0, 0, 0]);
    assert_eq!(&bytes[72..76], &digest::crc32c(&bytes[..72]).to_le_bytes());
    assert_eq!(
        &bytes[80..84],
        &digest::crc32c(&[0xaa, 0xbb, 0xcc, 0xdd]).to_le_bytes()
    );
}

#[test]
fn capsule_cmd_without_data_has_no_data_offset() {
    let pdu = Pdu::CapsuleCmd(CapsuleCmd {
        sqe: Sqe::new(crate::opcodes::io::FLUSH, 9),
        data: vec![],
    });
    let bytes = round_trip(&pdu, &digested());
    assert_eq!(&bytes[..8], &[0x04, 0x01, 72, 0, 76, 0, 0, 0]);
}

#[test]
fn data_alignment_pads_before_data() {
    let framing = Framing {
        send_pda: 7, // 32-byte alignment
        ..digested()
    };
    let pdu = Pdu::C2HData(C2HData {
        cccid: 1,
        offset: 0,
        last: true,
        success: true,
        data: vec![1, 2, 3, 4],
    });
    let bytes = round_trip(&pdu, &framing);
    assert_eq!(bytes[3], 32);
    assert_eq!(bytes.len(), 32 + 4 + 4);
}

#[test]
fn capsule_resp_vector() {
    let pdu = Pdu::CapsuleResp(CapsuleResp {
        cqe: Cqe {
            result: 1,
            sq_head: 0,
            sq_id: 0,
            cid: 5,
            status: Status::SUCCESS,
        },
    });
    let bytes = round_trip(&pdu, &plain());
    assert_eq!(
        bytes,
        [5, 0, 24, 0, 24, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0]
    );
}

#[test]
fn h2c_data_vector() {
    let pdu = Pdu::H2CData(H2CData {
        cccid: 3,
        ttag: 0x10,
        offset: 0x1000,
        last: true,
        data: vec![7; 8],
    });
    let bytes = round_trip(&pdu, &plain());
    assert_eq!(
        &bytes[..24],
        &[6, 0x04, 24, 24, 32, 0, 0, 0, 3, 0, 0x10, 0, 0, 0x10, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn c2h_data_vector() {
    let pdu = Pdu::C2HData(C2HData {
        cccid: 3,
        offset: 0,
        last: true,
        success: true,
        data: vec![1; 4],
    });
    let bytes = round_trip(&pdu, &plain());
    assert_eq!(&bytes[..8], &[7, 0x0c, 24, 24, 28, 0, 0, 0]);
    assert_eq!(&bytes[16..20], &[4, 0, 0, 0]);
}

#[test]
fn r2t_vector() {
    let pdu = Pdu::R2T(R2T {
        cccid: 2,
        ttag: 1,
        offset: 4096,
        length: 8192,
    });
    let bytes = round_trip(&pdu, &plain());
    assert_eq!(
        bytes,
        [9, 0, 24, 0, 24, 0, 0, 0, 2, 0, 1, 0, 0, 0x10, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn term_req_vectors() {
    for (ty, pdu) in [
        (
            2u8,
            Pdu::H2CTermReq(TermReq {
                fes: fes::HEADER_DIGEST_ERROR,
                fei: 0,
                data: vec![],
            }),
        ),
        (
            3u8,
            Pdu::C2HTermReq(TermReq {
                fes: fes::INVALID_PDU_HEADER_FIELD,
                fei: 2,
                data: vec![4, 0, 99, 0, 72, 0, 0, 0],
            }),
        ),
    ] {
        // Digests never frame a TermReq.
        let bytes = round_trip(&pdu, &digested());
        assert_eq!(bytes[0], ty);
        assert_eq!(bytes[1], 0);
        assert_eq!(bytes.len(), 24 + pdu.data().len());
        assert_eq!(&bytes[8..14], &{
            let mut f = [0u8; 6];
            f[..2].copy_from_slice(&pdu_fes(&pdu).to_le_bytes());
            f[2..].copy_from_slice(&pdu_fei(&pdu).to_le_bytes());
            f
        });
    }
}

fn pdu_fes(pdu: &Pdu) -> u16 {
    match pdu {
        Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => t.fes,
        _ => 0,
    }
}

fn pdu_fei(pdu: &Pdu) -> u32 {
    match pdu {
        Pdu::H2CTermReq(t) | Pdu::C2HTermReq(t) => t.fei,
        _ => 0,
    }
}

#[test]
fn unknown_type_is_an_invalid_field_at_zero() {
    let bytes = [0x42, 0, 24, 0, 24, 0, 0, 0];
    let err = decode(&bytes, &plain()).unwrap_err();
    assert_eq!((err.fes(), err.fei()), (fes::INVALID_PDU_HEADER_FIELD, 0));
}

#[test]
fn wrong_header_length_is_refused() {
    let mut bytes = Pdu::R2T(R2T::default()).to_bytes(&plain());
    bytes[2] = 23;
    let err = decode(&bytes, &plain()).unwrap_err();
    assert_eq!(err.fei(), 2);
}

#[test]
fn too_long_is_refused_before_reading_it() {
    let bytes = [4, 0, 72, 72, 0xff, 0xff, 0xff, 0x7f];
    assert!(matches!(
        pdu_len(&bytes, &plain()),
        Err(PduError::TooLong { .. })
    ));
}

#[test]
fn corrupted_header_digest_is_fatal() {
    let pdu = Pdu::R2T(R2T::default());
    let mut bytes = pdu.to_bytes(&digested());
    bytes[10] ^= 1;
    let err = decode(&bytes, &digested()).unwrap_err();
    assert_eq!(err, PduError::HeaderDigest);
    assert!(err.is_fatal());
    assert_eq!(err.fes(), fes::HEADER_DIGEST_ERROR);
}

#[test]
fn corrupted_data_digest_names_the_command() {
    let pdu = Pdu::H2CData(H2CData {
        cccid: 77,
        ttag: 0,
        offset: 0,
        last: true,
        data: vec![5; 16],
    });
    let mut bytes = pdu.to_bytes(&digested());
    let n = bytes.len();
    bytes[n - 6] ^= 0xff;
    let err = decode(&bytes, &digested()).unwrap_err();
    assert_eq!(err, PduError::DataDigest { cccid: 77, len: n });
    assert!(!err.is_fatal());
}

#[test]
fn digest_flag_must_match_negotiation() {
    let bytes = Pdu::R2T(R2T::default()).to_bytes(&plain());
    assert!(matches!(
        decode(&bytes, &digested()),
        Err(PduError::InvalidField { offset: 1, .. })
    ));
    let bytes = Pdu::R2T(R2T::default()).to_bytes(&digested());
    assert!(matches!(
        decode(&bytes, &plain()),
        Err(PduError::InvalidField { offset: 1, .. })
    ));
}

#[test]
fn data_length_field_must_match() {
    let mut bytes = Pdu::H2CData(H2CData {
        data: vec![0; 8],
        ..H2CData::default()
    })
    .to_bytes(&plain());
    bytes[16] = 9;
    assert!(matches!(
        decode(&bytes, &plain()),
        Err(PduError::InvalidField { offset: 16, .. })
    ));
}

#[test]
fn success_without_last_is_refused() {
    let mut bytes = Pdu::C2HData(C2HData {
        data: vec![0; 4],
        last: true,
        success: true,
        ..C2HData::default()
    })
    .to_bytes(&plain());
    bytes[1] = flags::DATA_SUCCESS;
    assert!(decode(&bytes, &plain()).is_err());
}

#[test]
fn data_offset_inside_the_header_is_refused() {
    let mut bytes = Pdu::H2CData(H2CData {
        data: vec![0; 8],
        ..H2CData::default()
    })
    .to_bytes(&plain());
    bytes[3] = 8;
    assert!(matches!(
        decode(&bytes, &plain()),
        Err(PduError::InvalidField { offset: 3, .. })
    ));
}

fn any_digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

fn any_data() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..300)
}

fn any_pdu() -> impl Strategy<Value = Pdu> {
    prop_oneof![
        (any::<u16>(), any::<u8>(), any_digests(), any::<u32>()).prop_map(
            |(pfv, hpda, digests, maxr2t)| Pdu::IcReq(IcReq {
                pfv,
                hpda,
                digests,
                maxr2t
            })
        ),
        (any::<u16>(), any::<u8>(), any_digests(), any::<u32>()).prop_map(
            |(pfv, cpda, digests, maxh2cdata)| Pdu::IcResp(IcResp {
                pfv,
                cpda,
                digests,
                maxh2cdata
            })
        ),
        (
            any::<u16>(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..152)
        )
            .prop_map(|(fes, fei, data)| Pdu::C2HTermReq(TermReq { fes, fei, data })),
        (proptest::array::uniform32(any::<u8>()), any_data()).prop_map(|(half, data)| {
            let mut raw = [0u8; 64];
            raw[..32].copy_from_slice(&half);
            raw[32..].copy_from_slice(&half);
            Pdu::CapsuleCmd(CapsuleCmd {
                sqe: Sqe(raw),
                data,
            })
        }),
        (any::<u64>(), any::<u16>(), any::<u16>(), 0u16..0x7fff).prop_map(
            |(result, cid, sq_head, status)| Pdu::CapsuleResp(CapsuleResp {
                cqe: Cqe {
                    result,
                    sq_head,
                    sq_id: 1,
                    cid,
                    status: Status(status),
                }
            })
        ),
        (
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            any_data()
        )
            .prop_map(|(cccid, ttag, offset, last, data)| Pdu::H2CData(H2CData {
                cccid,
                ttag,
                offset,
                last,
                data
            })),
        (
            any::<u16>(),
            any::<u32>(),
            any::<bool>(),
            any::<bool>(),
            any_data()
        )
            .prop_map(
                |(cccid, offset, last, success, data)| Pdu::C2HData(C2HData {
                    cccid,
                    offset,
                    last,
                    success: success && last,
                    data
                })
            ),
        (any::<u16>(), any::<u16>(), any::<u32>(), any::<u32>()).prop_map(
            |(cccid, ttag, offset, length)| Pdu::R2T(R2T {
                cccid,
                ttag,
                offset,
                length
            })
        ),
    ]
}

proptest! {
    #[test]
    fn every_pdu_round_trips(pdu in any_pdu(), digests in any_digests(), pda in 0u8..8) {
        let framing = Framing { digests, send_pda: pda, ..Framing::default() };
        let bytes = pdu.to_bytes(&framing);
        prop_assert_eq!(decode(&bytes, &framing), Ok(Some((pdu, bytes.len()))));
    }

    #[test]
    fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), digests in any_digests()) {
        let framing = Framing { digests, ..Framing::default() };
        let _ = decode(&bytes, &framing);
    }
}

#[test]
fn data_headers_decode_before_their_data() {
    for framing in [plain(), digested()] {
        let pdu = Pdu::H2CData(H2CData {
            cccid: 4,
            ttag: 9,
            offset: 512,
            last: true,
            data: vec![3; 100],
        });
        let bytes = pdu.to_bytes(&framing);
        let head = &bytes[..data_header_len(&framing)];
        let h = decode_data_header(head, &framing).unwrap();
        assert_eq!((h.cccid, h.ttag, h.offset, h.length), (4, 9, 512, 100));
        assert!(h.last && !h.success);
        assert_eq!(&bytes[h.data_at..h.data_at + 100], &[3; 100][..]);
        assert_eq!(h.data_digest, framing.digests.data);
        assert_eq!(h.plen, bytes.len());
        // Other types and corrupted headers are refused.
        let r2t = Pdu::R2T(R2T::default()).to_bytes(&framing);
        assert!(decode_data_header(&r2t, &framing).is_err());
        if framing.digests.header {
            let mut bad = head.to_vec();
            bad[12] ^= 1;
            assert_eq!(
                decode_data_header(&bad, &framing),
                Err(PduError::HeaderDigest)
            );
        }
    }
}
