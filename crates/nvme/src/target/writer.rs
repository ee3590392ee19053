//! The sending half of a connection: PDUs framed with the negotiated digests and
//! alignment, written whole under one lock so that answers from the connection
//! thread, workers and asynchronous events never interleave.

use std::io::Write;
use std::net::TcpStream;
use std::sync::Mutex;

use crate::controller::Reply;
use crate::cqe::Cqe;
use crate::pdu::{C2HData, CapsuleResp, Framing, Pdu};

pub(crate) struct Writer {
    stream: Mutex<TcpStream>,
    framing: Framing,
}

impl Writer {
    pub fn new(stream: TcpStream, framing: Framing) -> Writer {
        Writer {
            stream: Mutex::new(stream),
            framing,
        }
    }

    /// Sends `pdus` in one write.
    pub fn send(&self, pdus: &[Pdu]) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(pdus.iter().map(|p| p.data().len() + 96).sum());
        for pdu in pdus {
            pdu.encode(&self.framing, &mut out);
        }
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        stream.write_all(&out)
    }

    /// Sends a completion: for a successful command with data for the host,
    /// C2HData first (at most `transfer_len` bytes, what the host's SGL asked
    /// for), standing for the completion too when the host disabled SQ flow
    /// control.
    pub fn reply(&self, reply: Reply, transfer_len: u32, sq_flow_control_disabled: bool) {
        let Reply { cqe, mut data } = reply;
        let mut pdus = Vec::with_capacity(2);
        if cqe.status.is_success() && !data.is_empty() && transfer_len > 0 {
            data.truncate(transfer_len as usize);
            let success = sq_flow_control_disabled && cqe.result == 0;
            pdus.push(Pdu::C2HData(C2HData {
                cccid: cqe.cid,
                offset: 0,
                last: true,
                success,
                data,
            }));
            if success {
                let _ = self.send(&pdus);
                return;
            }
        }
        pdus.push(Pdu::CapsuleResp(CapsuleResp { cqe }));
        if let Err(e) = self.send(&pdus) {
            tracing::debug!("NVMe/TCP: cannot send a completion: {e}");
        }
    }

    /// Sends a completion with no data.
    pub fn complete(&self, cqe: Cqe) {
        if let Err(e) = self.send(&[Pdu::CapsuleResp(CapsuleResp { cqe })]) {
            tracing::debug!("NVMe/TCP: cannot send a completion: {e}");
        }
    }
}
