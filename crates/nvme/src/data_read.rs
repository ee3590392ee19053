//! Reading a PDU's data from a buffered socket, shared by target and initiator.

use std::io::{BufRead, BufReader, Read};

/// Data at least this long is read past the reader's buffer, straight from the
/// socket into the command's buffer; shorter data comes through the buffer, whose
/// one read also brings the PDUs behind it.
const DIRECT_READ_MIN: usize = 64 * 1024;

/// Capacity of the buffered reader each end reads PDUs through. One refill brings
/// up to this much of what follows a header, and a large PDU's data that came in
/// with it is copied out of the buffer once more: kept to the size past which
/// data is read directly, so a 1 MiB read or write pays that copy on at most
/// 64 KiB of it (a 256 KiB buffer cost a quarter of each megabyte), while a
/// refill still brings a dozen 4 KiB answers at once.
pub(crate) const READ_BUFFER: usize = DIRECT_READ_MIN;

/// Reads exactly `data.len()` bytes of PDU data (H2CData on the target, C2HData on
/// the initiator): what the reader holds first, then, for large data, the rest
/// straight from the socket (BufReader would pass a tail shorter than its capacity
/// through its own buffer: a copy more).
pub(crate) fn read_data<R: Read>(
    reader: &mut BufReader<R>,
    data: &mut [u8],
) -> std::io::Result<()> {
    if data.len() < DIRECT_READ_MIN {
        return reader.read_exact(data);
    }
    let held = reader.buffer().len().min(data.len());
    data[..held].copy_from_slice(&reader.buffer()[..held]);
    reader.consume(held);
    reader.get_mut().read_exact(&mut data[held..])
}

#[cfg(test)]
mod tests {
    use super::read_data;
    use std::io::{BufReader, Read};

    /// A source that hands out at most `step` bytes per read, as a socket does.
    struct Chunks {
        bytes: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.step).min(self.bytes.len() - self.at);
            buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    /// Large data read past the buffer and small data read through it both
    /// come out whole, and what follows them stays readable.
    #[test]
    fn data_reads_take_exactly_their_bytes() {
        let bytes: Vec<u8> = (0..400_000u32).map(|i| (i % 249) as u8).collect();
        for (len, step) in [
            (300_000, 7000),
            (300_000, 1 << 20),
            (1000, 300),
            (65_536, 4096),
        ] {
            let source = Chunks {
                bytes: bytes.clone(),
                at: 0,
                step,
            };
            let mut reader = BufReader::with_capacity(32 * 1024, source);
            let mut head = [0u8; 24];
            reader.read_exact(&mut head).unwrap();
            let mut data = vec![0u8; len];
            read_data(&mut reader, &mut data).unwrap();
            assert_eq!(data, &bytes[24..24 + len], "{len} bytes, {step} per read");
            let mut next = [0u8; 16];
            reader.read_exact(&mut next).unwrap();
            assert_eq!(next, &bytes[24 + len..24 + len + 16]);
        }
    }
}
