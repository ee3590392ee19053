//! Sending PDUs: headers, digests and padding encoded into one scratch buffer, data
//! sent from where it lies, several PDUs in one vectored write (RFC 7143 §11.2: BHS,
//! AHS, header digest, data segment padded to 4 bytes, data digest). Shared by the
//! target's writer and the initiator.

use std::io::{self, IoSlice, Write};

use super::{data_digest, digest_bytes, header_digest, padded, Bhs, Header};

/// Digest settings of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// Encodes PDUs for one vectored write: headers, digests and padding go into a
/// scratch buffer, data is sent from where it lies.
#[derive(Default)]
pub struct Batch<'a> {
    scratch: Vec<u8>,
    /// Per PDU: where its header run ends in `scratch`, its data, where its
    /// trailer (padding and data digest) ends.
    parts: Vec<(usize, &'a [u8], usize)>,
}

impl<'a> Batch<'a> {
    pub fn new() -> Batch<'a> {
        Batch::default()
    }

    /// A batch that encodes into `scratch` (cleared), so a writer can keep one
    /// buffer across sends; [`into_scratch`](Self::into_scratch) hands it back.
    pub fn reusing(mut scratch: Vec<u8>) -> Batch<'a> {
        scratch.clear();
        Batch {
            scratch,
            parts: Vec::new(),
        }
    }

    /// The scratch buffer, for the next batch.
    pub fn into_scratch(self) -> Vec<u8> {
        self.scratch
    }

    /// Adds a PDU.
    pub fn push(&mut self, header: &Header, data: &'a [u8], digests: Digests) {
        self.push_parts(&header.bhs, &header.ahs, data, digests);
    }

    /// Adds a PDU given as its BHS and AHS.
    pub fn push_parts(&mut self, bhs: &Bhs, ahs: &[u8], data: &'a [u8], digests: Digests) {
        self.scratch.extend_from_slice(&bhs.0);
        self.scratch.extend_from_slice(ahs);
        if digests.header {
            let digest = header_digest(bhs, ahs);
            self.scratch.extend_from_slice(&digest_bytes(digest));
        }
        let head_end = self.scratch.len();
        let pad = padded(data.len()) - data.len();
        self.scratch.extend_from_slice(&[0u8; 3][..pad]);
        if digests.data && !data.is_empty() {
            self.scratch
                .extend_from_slice(&digest_bytes(data_digest(data)));
        }
        self.parts.push((head_end, data, self.scratch.len()));
    }

    /// Writes every PDU in order.
    pub fn send(&self, stream: &mut impl Write) -> io::Result<()> {
        let mut slices = Vec::with_capacity(self.parts.len() * 3);
        let mut start = 0;
        for &(head_end, data, tail_end) in &self.parts {
            slices.push(IoSlice::new(&self.scratch[start..head_end]));
            if !data.is_empty() {
                slices.push(IoSlice::new(data));
            }
            if tail_end > head_end {
                slices.push(IoSlice::new(&self.scratch[head_end..tail_end]));
            }
            start = tail_end;
        }
        write_all_vectored(stream, &mut slices)
    }
}

/// Writes every slice, in order (writev may take part of them).
fn write_all_vectored(stream: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> io::Result<()> {
    // Linux takes at most IOV_MAX (1024) slices per call.
    const IOV_MAX: usize = 1024;
    while !slices.is_empty() {
        let take = slices.len().min(IOV_MAX);
        match stream.write_vectored(&slices[..take]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sends one PDU.
pub fn send_pdu(
    stream: &mut impl Write,
    header: &Header,
    data: &[u8],
    digests: Digests,
) -> io::Result<()> {
    let mut batch = Batch::new();
    batch.push(header, data, digests);
    batch.send(stream)
}
