//! A tiny NVMe/TCP host written from the crate's codec, for the target's tests.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use blockwire_nvme::fabrics::{Connect, ConnectData, PropertyCommand, DYNAMIC_CNTLID};
use blockwire_nvme::opcodes::{admin, cns, io, property};
use blockwire_nvme::pdu::{
    self, CapsuleCmd, Digests, Framing, H2CData, IcReq, Pdu, COMMON_HEADER_LEN,
};
use blockwire_nvme::{Cqe, SglDescriptor, Sqe};

pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:blockwire-test-host";
/// What the target offers for in-capsule data.
pub const INLINE: usize = 16 * 1024;

/// One queue's connection.
pub struct Host {
    pub stream: TcpStream,
    pub framing: Framing,
    pub maxh2cdata: u32,
    next_cid: u16,
}

/// A completion and any data that came before it.
#[derive(Debug)]
pub struct Done {
    pub cqe: Cqe,
    pub data: Vec<u8>,
}

impl Host {
    /// Connects and exchanges ICReq/ICResp.
    pub fn connect(addr: SocketAddr, digests: Digests) -> Host {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut host = Host {
            stream,
            framing: Framing::default(),
            maxh2cdata: 0,
            next_cid: 1,
        };
        host.send(&Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        }));
        match host.recv().expect("ICResp") {
            Pdu::IcResp(resp) => {
                assert_eq!(resp.digests, digests);
                host.maxh2cdata = resp.maxh2cdata;
            }
            other => panic!("expected ICResp, got {other:?}"),
        }
        host.framing = Framing {
            digests,
            send_pda: 0,
            max_pdu_len: 4 << 20,
        };
        host
    }

    pub fn send(&mut self, pdu: &Pdu) {
        let bytes = pdu.to_bytes(&self.framing);
        self.stream.write_all(&bytes).expect("send");
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// The next PDU, or None when the target closed the connection.
    pub fn recv(&mut self) -> Option<Pdu> {
        let mut buf = vec![0; COMMON_HEADER_LEN];
        self.stream.read_exact(&mut buf).ok()?;
        let plen = pdu::pdu_len(&buf, &self.framing).expect("valid header");
        buf.resize(plen, 0);
        self.stream.read_exact(&mut buf[COMMON_HEADER_LEN..]).ok()?;
        let (pdu, used) = pdu::decode(&buf, &self.framing)
            .expect("valid PDU")
            .expect("complete");
        assert_eq!(used, plen);
        Some(pdu)
    }

    pub fn cid(&mut self) -> u16 {
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        self.next_cid
    }

    /// Sends a command (its data in the capsule when small enough, else by R2T)
    /// without waiting.
    pub fn submit(&mut self, mut sqe: Sqe, data: &[u8], read_len: u32) {
        if !data.is_empty() && data.len() <= INLINE {
            sqe.set_sgl(SglDescriptor::in_capsule(data.len() as u32));
            self.send(&Pdu::CapsuleCmd(CapsuleCmd {
                sqe,
                data: data.to_vec(),
            }));
        } else {
            let len = if data.is_empty() {
                read_len
            } else {
                data.len() as u32
            };
            sqe.set_sgl(SglDescriptor::transport(len));
            self.send(&Pdu::CapsuleCmd(CapsuleCmd {
                sqe,
                data: Vec::new(),
            }));
        }
    }

    /// Answers an R2T from `data`, in H2CData PDUs of at most MAXH2CDATA.
    pub fn answer_r2t(&mut self, r2t: &pdu::R2T, data: &[u8]) {
        let end = (r2t.offset + r2t.length) as usize;
        let mut at = r2t.offset as usize;
        while at < end {
            let n = (end - at).min(self.maxh2cdata as usize);
            self.send(&Pdu::H2CData(H2CData {
                cccid: r2t.cccid,
                ttag: r2t.ttag,
                offset: at as u32,
                last: at + n == end,
                data: data[at..at + n].to_vec(),
            }));
            at += n;
        }
    }

    /// Runs one command to completion: sends its data on R2T, collects C2HData.
    pub fn run(&mut self, sqe: Sqe, data: &[u8], read_len: u32) -> Done {
        let cid = sqe.cid();
        self.submit(sqe, data, read_len);
        let mut received = Vec::new();
        loop {
            match self.recv().expect("connection open") {
                Pdu::R2T(r2t) => {
                    assert_eq!(r2t.cccid, cid);
                    self.answer_r2t(&r2t, data);
                }
                Pdu::C2HData(d) => {
                    assert_eq!(d.cccid, cid);
                    assert_eq!(d.offset as usize, received.len());
                    received.extend_from_slice(&d.data);
                    if d.success {
                        return Done {
                            cqe: Cqe::new(cid, blockwire_nvme::Status::SUCCESS),
                            data: received,
                        };
                    }
                }
                Pdu::CapsuleResp(resp) => {
                    assert_eq!(resp.cqe.cid, cid);
                    return Done {
                        cqe: resp.cqe,
                        data: received,
                    };
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// Connect on this queue; returns the completion (dword 0: controller ID).
    pub fn fabrics_connect(&mut self, subnqn: &str, qid: u16, cntlid: u16, kato: u32) -> Cqe {
        self.fabrics_connect_with(subnqn, qid, cntlid, kato, 0)
    }

    /// Connect with connect attributes (bit 2: SQ flow control disabled).
    pub fn fabrics_connect_with(
        &mut self,
        subnqn: &str,
        qid: u16,
        cntlid: u16,
        kato: u32,
        cattr: u8,
    ) -> Cqe {
        let cid = self.cid();
        let sqe = Connect {
            cid,
            recfmt: 0,
            qid,
            sqsize: if qid == 0 { 31 } else { 127 },
            cattr,
            kato,
        }
        .to_sqe();
        let data = ConnectData {
            host_id: [0x42; 16],
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: HOSTNQN.into(),
        }
        .to_bytes();
        self.run(sqe, &data, 0).cqe
    }

    pub fn property(&mut self, cmd: PropertyCommand) -> Cqe {
        let cid = self.cid();
        self.run(cmd.to_sqe(cid), &[], 0).cqe
    }

    /// Admin queue: connect, enable, wait ready. Returns the controller ID.
    pub fn admin(addr: SocketAddr, subnqn: &str, digests: Digests) -> (Host, u16) {
        let mut host = Host::connect(addr, digests);
        let cqe = host.fabrics_connect(subnqn, 0, DYNAMIC_CNTLID, 30_000);
        assert!(cqe.status.is_success(), "connect: {:?}", cqe.status);
        let cntlid = cqe.result as u16;
        let set = host.property(PropertyCommand::Set {
            offset: property::CC,
            eight_bytes: false,
            value: 0x0046_0001,
        });
        assert!(set.status.is_success());
        let csts = host.property(PropertyCommand::Get {
            offset: property::CSTS,
            eight_bytes: false,
        });
        assert_eq!(csts.result & 1, 1, "CSTS.RDY");
        (host, cntlid)
    }

    /// An I/O queue of controller `cntlid`.
    pub fn io_queue(
        addr: SocketAddr,
        subnqn: &str,
        cntlid: u16,
        qid: u16,
        digests: Digests,
    ) -> Host {
        let mut host = Host::connect(addr, digests);
        let cqe = host.fabrics_connect(subnqn, qid, cntlid, 0);
        assert!(cqe.status.is_success(), "I/O connect: {:?}", cqe.status);
        host
    }

    pub fn identify(&mut self, cns_value: u8, nsid: u32) -> Done {
        let cid = self.cid();
        let mut sqe = Sqe::new(admin::IDENTIFY, cid);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, u32::from(cns_value));
        self.run(sqe, &[], 4096)
    }

    pub fn identify_controller(&mut self) -> Vec<u8> {
        let done = self.identify(cns::CONTROLLER, 0);
        assert!(done.cqe.status.is_success());
        done.data
    }

    pub fn get_log_page(&mut self, lid: u8, len: u32) -> Done {
        let cid = self.cid();
        let mut sqe = Sqe::new(admin::GET_LOG_PAGE, cid);
        let numd = len / 4 - 1;
        sqe.set_cdw(10, u32::from(lid) | ((numd & 0xffff) << 16));
        sqe.set_cdw(11, numd >> 16);
        self.run(sqe, &[], len)
    }

    pub fn rw_sqe(&mut self, opcode: u8, slba: u64, blocks: u32, fua: bool) -> Sqe {
        let cid = self.cid();
        let mut sqe = Sqe::new(opcode, cid);
        sqe.set_nsid(1);
        sqe.set_cdw10_11(slba);
        sqe.set_cdw(12, (blocks - 1) | if fua { 1 << 30 } else { 0 });
        sqe
    }

    pub fn write(&mut self, slba: u64, data: &[u8], fua: bool) -> Cqe {
        let sqe = self.rw_sqe(io::WRITE, slba, (data.len() / 512) as u32, fua);
        self.run(sqe, data, 0).cqe
    }

    pub fn read(&mut self, slba: u64, blocks: u32) -> Done {
        let sqe = self.rw_sqe(io::READ, slba, blocks, false);
        self.run(sqe, &[], blocks * 512)
    }

    pub fn compare(&mut self, slba: u64, data: &[u8]) -> Cqe {
        let sqe = self.rw_sqe(io::COMPARE, slba, (data.len() / 512) as u32, false);
        self.run(sqe, data, 0).cqe
    }

    pub fn flush(&mut self) -> Cqe {
        let cid = self.cid();
        let mut sqe = Sqe::new(io::FLUSH, cid);
        sqe.set_nsid(1);
        self.run(sqe, &[], 0).cqe
    }
}
