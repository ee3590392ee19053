//! PDUs on the initiator's socket: headers with their optional digests, data
//! segments read straight into the caller's buffer, and vectored sends (RFC 7143
//! §11.2: BHS, AHS, header digest, data segment padded to 4 bytes, data digest).

use std::io::{self, BufReader, Read};
use std::net::TcpStream;

pub use crate::pdu::frame::{send_pdu, Batch, Digests};
use crate::pdu::{
    crc32c, crc32c_append, digest_value, header_digest, padded, Bhs, BHS_LEN, DIGEST_LEN,
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

    /// Whether a whole header already sits in the buffer (reading it will not
    /// wait for the network).
    pub fn header_buffered(&self) -> bool {
        self.input.buffer().len() >= BHS_LEN
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
