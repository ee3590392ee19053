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

    /// Lets reads on the socket (a clone shares its options) wait without limit.
    pub fn clear_read_timeout(&self) -> std::io::Result<()> {
        let stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        stream.set_read_timeout(None)
    }

    /// Sends `pdus` in one write.
    pub fn send(&self, pdus: &[Pdu]) -> std::io::Result<()> {
        let mut out = Vec::with_capacity(pdus.iter().map(|p| p.data().len() + 96).sum());
        for pdu in pdus {
            pdu.encode(&self.framing, &mut out);
        }
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let sent = stream.write_all(&out);
        end_on_error(&stream, sent)
    }

    /// Sends a C2HData PDU (its data not copied) and whatever PDUs follow it, in
    /// one vectored write.
    fn send_data(&self, data_pdu: &Pdu, then: &[Pdu]) -> std::io::Result<()> {
        let mut head = Vec::with_capacity(32);
        let digest = data_pdu.encode_head(&self.framing, &mut head);
        let mut tail = Vec::with_capacity(32);
        if let Some(digest) = digest {
            tail.extend_from_slice(&digest);
        }
        for pdu in then {
            pdu.encode(&self.framing, &mut tail);
        }
        let parts = [head.as_slice(), data_pdu.data(), tail.as_slice()];
        let mut stream = self.stream.lock().unwrap_or_else(|e| e.into_inner());
        let sent = write_all_vectored(&mut *stream, &parts);
        end_on_error(&stream, sent)
    }

    /// Sends a completion: for a successful command with data for the host,
    /// C2HData first (at most `transfer_len` bytes, what the host's SGL asked
    /// for), standing for the completion too when the host disabled SQ flow
    /// control.
    pub fn reply(&self, reply: Reply, transfer_len: u32, sq_flow_control_disabled: bool) {
        let Reply { cqe, mut data } = reply;
        let resp = Pdu::CapsuleResp(CapsuleResp { cqe });
        let sent = if cqe.status.is_success() && !data.is_empty() && transfer_len > 0 {
            data.truncate(transfer_len as usize);
            let success = sq_flow_control_disabled && cqe.result == 0;
            let data_pdu = Pdu::C2HData(C2HData {
                cccid: cqe.cid,
                offset: 0,
                last: true,
                success,
                data,
            });
            let then: &[Pdu] = if success {
                &[]
            } else {
                std::slice::from_ref(&resp)
            };
            self.send_data(&data_pdu, then)
        } else {
            self.send(std::slice::from_ref(&resp))
        };
        if let Err(e) = sent {
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

/// A send that failed or timed out (a host that stopped reading) leaves a PDU
/// half-sent: the connection cannot go on, so it ends here and its reader sees the
/// end.
fn end_on_error(stream: &TcpStream, sent: std::io::Result<()>) -> std::io::Result<()> {
    if sent.is_err() {
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }
    sent
}

/// Writes every byte of `parts`, in order, with as few system calls as the socket
/// allows.
fn write_all_vectored(out: &mut impl Write, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut part = 0;
    let mut offset = 0;
    while part < parts.len() {
        let slices: Vec<std::io::IoSlice<'_>> = std::iter::once(&parts[part][offset..])
            .chain(parts[part + 1..].iter().copied())
            .filter(|p| !p.is_empty())
            .map(std::io::IoSlice::new)
            .collect();
        if slices.is_empty() {
            return Ok(());
        }
        let mut written = match out.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while part < parts.len() && written >= parts[part].len() - offset {
            written -= parts[part].len() - offset;
            part += 1;
            offset = 0;
        }
        offset += written;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::write_all_vectored;
    use std::io::Write;

    /// A writer that takes at most `step` bytes per call.
    struct Trickle {
        out: Vec<u8>,
        step: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.step);
            self.out.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn vectored_writes_survive_short_writes() {
        let parts: [&[u8]; 4] = [b"head", b"", b"the data", b"tail"];
        for step in 1..20 {
            let mut w = Trickle {
                out: Vec::new(),
                step,
            };
            write_all_vectored(&mut w, &parts).unwrap();
            assert_eq!(w.out, b"headthe datatail");
        }
    }
}
