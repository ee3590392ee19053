//! PDUs on the initiator's socket: headers with their optional digests, data
//! segments read straight into the caller's buffer, and vectored sends (RFC 7143
//! §11.2: BHS, AHS, header digest, data segment padded to 4 bytes, data digest).

use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::TcpStream;

use crate::pdu::{
    crc32c, crc32c_append, data_digest, digest_bytes, digest_value, header_digest, padded, Bhs,
    Header, BHS_LEN, DIGEST_LEN,
};

/// Why reading a PDU failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("the target closed the connection")]
    Closed,
    /// Nothing arrived for the read timeout, between PDUs.
    #[error("the connection was idle")]
    Idle,
    #[error("header digest mismatch")]
    HeaderDigest,
    #[error("data digest mismatch")]
    DataDigest,
    #[error("data segment of {len} bytes exceeds the {max} we declared")]
    SegmentTooLong { len: u32, max: u32 },
}

/// Digest settings of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// The receive half of a connection.
pub struct PduReader {
    input: BufReader<TcpStream>,
    pub digests: Digests,
    /// The most data one PDU may carry (our MaxRecvDataSegmentLength).
    pub max_data: u32,
}

impl PduReader {
    pub fn new(stream: TcpStream, max_data: u32) -> PduReader {
        PduReader {
            input: BufReader::with_capacity(64 * 1024, stream),
            digests: Digests::default(),
            max_data,
        }
    }

    /// The next header (BHS and AHS). A clean end of stream between PDUs is
    /// [`WireError::Closed`].
    pub fn read_header(&mut self) -> Result<(Bhs, Vec<u8>), WireError> {
        let mut bhs = Bhs::default();
        let mut filled = 0;
        while filled < BHS_LEN {
            match self.input.read(&mut bhs.0[filled..]) {
                Ok(0) if filled == 0 => return Err(WireError::Closed),
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if filled == 0
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                {
                    return Err(WireError::Idle)
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut ahs = vec![0u8; bhs.ahs_len()];
        self.input.read_exact(&mut ahs)?;
        if self.digests.header {
            let mut digest = [0u8; DIGEST_LEN];
            self.input.read_exact(&mut digest)?;
            if digest_value(digest) != header_digest(&bhs, &ahs) {
                return Err(WireError::HeaderDigest);
            }
        }
        if bhs.data_len() > self.max_data {
            return Err(WireError::SegmentTooLong {
                len: bhs.data_len(),
                max: self.max_data,
            });
        }
        Ok((bhs, ahs))
    }

    /// Reads a data segment of exactly `buf.len()` bytes into `buf`, then its padding
    /// and digest.
    pub fn read_data(&mut self, buf: &mut [u8]) -> Result<(), WireError> {
        self.input.read_exact(buf)?;
        let pad_len = padded(buf.len()) - buf.len();
        let mut pad = [0u8; 3];
        self.input.read_exact(&mut pad[..pad_len])?;
        if self.digests.data && !buf.is_empty() {
            let mut digest = [0u8; DIGEST_LEN];
            self.input.read_exact(&mut digest)?;
            if digest_value(digest) != crc32c_append(crc32c(buf), &pad[..pad_len]) {
                return Err(WireError::DataDigest);
            }
        }
        Ok(())
    }

    /// Reads a data segment of `len` bytes into a new vector.
    pub fn read_data_vec(&mut self, len: u32) -> Result<Vec<u8>, WireError> {
        let mut data = vec![0u8; len as usize];
        self.read_data(&mut data)?;
        Ok(data)
    }
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

    /// Adds a PDU.
    pub fn push(&mut self, header: &Header, data: &'a [u8], digests: Digests) {
        self.scratch.extend_from_slice(&header.bhs.0);
        self.scratch.extend_from_slice(&header.ahs);
        if digests.header {
            let digest = header_digest(&header.bhs, &header.ahs);
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
