//! TCP (RFC 9293).

use super::{u16_at, u32_at, u8_at, Error};

/// Length of a header without options.
pub const HEADER_LEN: usize = 20;
/// The flag bits of the data-offset/flags word: the 8 classic flags, NS and
/// the 3 reserved bits (OVS's `tcp_flags` keeps all 12).
pub const FLAGS_MASK: u16 = 0x0fff;

/// Option kinds the parsers look at.
pub mod option {
    pub const END: u8 = 0;
    pub const NOP: u8 = 1;
    pub const WINDOW_SCALE: u8 = 3;
    /// Length of the window-scale option (kind, length, shift).
    pub const WINDOW_SCALE_LEN: u8 = 3;
}

/// Byte offsets of the TCP header.
pub mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const ACK: Range<usize> = 8..12;
    /// Data offset (4 bits, in 4-byte words), reserved (3), NS, flags (8).
    pub const OFF_FLAGS: Range<usize> = 12..14;
    /// The byte holding the data offset in its high nibble.
    pub const DATA_OFFSET: usize = 12;
    pub const WINDOW: Range<usize> = 14..16;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const URGENT: Range<usize> = 18..20;
}

/// A checked view of a TCP segment: the 20-byte fixed header is present;
/// the data offset is reported, not checked.
#[derive(Clone, Copy, Debug)]
pub struct TcpPacket<'a> {
    header: &'a [u8; HEADER_LEN],
    buffer: &'a [u8],
}

impl<'a> TcpPacket<'a> {
    /// A view of the segment at the start of `b`; [`Error::Truncated`]
    /// under 20 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let header = b.first_chunk::<HEADER_LEN>().ok_or(Error::Truncated)?;
        Ok(TcpPacket { header, buffer: b })
    }

    #[inline(always)]
    pub fn src_port(&self) -> u16 {
        u16_at(self.header, field::SRC_PORT)
    }

    #[inline(always)]
    pub fn dst_port(&self) -> u16 {
        u16_at(self.header, field::DST_PORT)
    }

    #[inline(always)]
    pub fn seq(&self) -> u32 {
        u32_at(self.header, field::SEQ)
    }

    #[inline(always)]
    pub fn ack(&self) -> u32 {
        u32_at(self.header, field::ACK)
    }

    /// The header length in bytes (data offset * 4; options included), 0..=60.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        usize::from(u8_at(self.header, field::DATA_OFFSET) >> 4) * 4
    }

    /// The 12 flag bits ([`FLAGS_MASK`]).
    #[inline(always)]
    pub fn flags(&self) -> u16 {
        u16_at(self.header, field::OFF_FLAGS) & FLAGS_MASK
    }

    #[inline(always)]
    pub fn window(&self) -> u16 {
        u16_at(self.header, field::WINDOW)
    }

    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        u16_at(self.header, field::CHECKSUM)
    }

    /// The options, bytes `20..header_len`; `None` when the data offset is
    /// below 5 or the options run past the buffer.
    #[inline(always)]
    pub fn options(&self) -> Option<&'a [u8]> {
        self.buffer.get(HEADER_LEN..self.header_len())
    }

    /// The bytes after the header (`None` as for [`options`](Self::options)).
    #[inline(always)]
    pub fn payload(&self) -> Option<&'a [u8]> {
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return None;
        }
        self.buffer.get(hl..)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let mut b = vec![
            0x30, 0x39, 0, 80, 0, 0, 0, 1, 0, 0, 0, 2, 0x61, 0x12, 0xff, 0xff, 0xab, 0xcd, 0, 0,
        ];
        b.extend_from_slice(&[1, 3, 3, 7, b'x']);
        let t = TcpPacket::new_checked(&b).unwrap();
        assert_eq!(
            (t.src_port(), t.dst_port(), t.seq(), t.ack()),
            (12345, 80, 1, 2)
        );
        assert_eq!(
            (t.header_len(), t.flags(), t.window(), t.checksum()),
            (24, 0x112, 0xffff, 0xabcd)
        );
        assert_eq!(
            (t.options(), t.payload()),
            (Some(&[1, 3, 3, 7][..]), Some(&b"x"[..]))
        );
        b[12] = 0x40;
        let t = TcpPacket::new_checked(&b).unwrap();
        assert_eq!((t.options(), t.payload()), (None, None));
        b[12] = 0x70; // 28 bytes of header in 25
        assert_eq!(TcpPacket::new_checked(&b).unwrap().options(), None);
        assert!(TcpPacket::new_checked(&b[..19]).is_err());
    }
}
