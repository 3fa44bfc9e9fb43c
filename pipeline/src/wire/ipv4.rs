//! IPv4 (RFC 791).

use super::{u16_at, u32_at, u8_at, Error};

/// Length of a header without options (IHL 5).
pub const HEADER_LEN: usize = 20;
/// Longest header (IHL 15).
pub const MAX_HEADER_LEN: usize = 60;

/// Flags/fragment-offset word: the reserved ("evil") bit.
pub const FLAG_RESERVED: u16 = 0x8000;
/// Flags/fragment-offset word: don't fragment.
pub const FLAG_DF: u16 = 0x4000;
/// Flags/fragment-offset word: more fragments.
pub const FLAG_MF: u16 = 0x2000;
/// Flags/fragment-offset word: the offset, in 8-byte units.
pub const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// Byte offsets of the IPv4 header.
pub mod field {
    use core::ops::Range;
    /// Version (4 bits) and IHL (4 bits, in 4-byte words).
    pub const VER_IHL: usize = 0;
    /// DSCP and ECN.
    pub const TOS: usize = 1;
    pub const TOTAL_LEN: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    /// Flags (3 bits) and fragment offset (13).
    pub const FLAGS_FRAG: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// A checked view of an IPv4 packet: the 20-byte fixed header is present;
/// IHL and total length are reported, not checked (see the module doc of
/// [`crate::wire`]).
#[derive(Clone, Copy, Debug)]
pub struct Ipv4Packet<'a> {
    header: &'a [u8; HEADER_LEN],
    buffer: &'a [u8],
}

impl<'a> Ipv4Packet<'a> {
    /// A view of the packet at the start of `b`; [`Error::Truncated`] under
    /// 20 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let header = b.first_chunk::<HEADER_LEN>().ok_or(Error::Truncated)?;
        Ok(Ipv4Packet { header, buffer: b })
    }

    /// The version nibble (4 for IPv4; not checked by `new_checked`).
    #[inline(always)]
    pub fn version(&self) -> u8 {
        u8_at(self.header, field::VER_IHL) >> 4
    }

    /// The header length in bytes (IHL * 4; options included), 0..=60.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        usize::from(u8_at(self.header, field::VER_IHL) & 0x0f) * 4
    }

    /// DSCP and ECN.
    #[inline(always)]
    pub fn tos(&self) -> u8 {
        u8_at(self.header, field::TOS)
    }

    /// The total length field (header and payload).
    #[inline(always)]
    pub fn total_len(&self) -> u16 {
        u16_at(self.header, field::TOTAL_LEN)
    }

    #[inline(always)]
    pub fn ident(&self) -> u16 {
        u16_at(self.header, field::IDENT)
    }

    /// The flags/fragment-offset word ([`FLAG_DF`], [`FLAG_MF`],
    /// [`FRAG_OFFSET_MASK`]).
    #[inline(always)]
    pub fn flags_frag(&self) -> u16 {
        u16_at(self.header, field::FLAGS_FRAG)
    }

    #[inline(always)]
    pub fn dont_frag(&self) -> bool {
        self.flags_frag() & FLAG_DF != 0
    }

    #[inline(always)]
    pub fn more_frags(&self) -> bool {
        self.flags_frag() & FLAG_MF != 0
    }

    /// The fragment offset in bytes (a multiple of 8).
    #[inline(always)]
    pub fn frag_offset(&self) -> u32 {
        u32::from(self.flags_frag() & FRAG_OFFSET_MASK) * 8
    }

    #[inline(always)]
    pub fn ttl(&self) -> u8 {
        u8_at(self.header, field::TTL)
    }

    #[inline(always)]
    pub fn protocol(&self) -> u8 {
        u8_at(self.header, field::PROTOCOL)
    }

    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        u16_at(self.header, field::CHECKSUM)
    }

    #[inline(always)]
    pub fn src(&self) -> u32 {
        u32_at(self.header, field::SRC)
    }

    #[inline(always)]
    pub fn dst(&self) -> u32 {
        u32_at(self.header, field::DST)
    }

    /// Source and destination, in wire order (8 bytes).
    #[inline(always)]
    pub fn addrs(&self) -> &'a [u8] {
        self.header
            .get(field::SRC.start..field::DST.end)
            .unwrap_or(&[])
    }

    /// The header with its options (`header_len` bytes); `None` when IHL is
    /// below 5 or the options run past the buffer.
    #[inline(always)]
    pub fn header(&self) -> Option<&'a [u8]> {
        let ihl = self.header_len();
        if ihl < HEADER_LEN {
            return None;
        }
        self.buffer.get(..ihl)
    }

    /// The payload the length fields describe, bytes `header_len..total_len`
    /// (bytes past the total length are link padding and not included);
    /// `None` unless `20 <= header_len <= total_len <= buffer length`.
    #[inline(always)]
    pub fn payload(&self) -> Option<&'a [u8]> {
        let ihl = self.header_len();
        if ihl < HEADER_LEN {
            return None;
        }
        self.buffer.get(ihl..usize::from(self.total_len()))
    }

    /// The whole buffer the view was made over.
    #[inline(always)]
    pub fn buffer(&self) -> &'a [u8] {
        self.buffer
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    const UDP4: [u8; 28] = [
        0x45, 0xb8, 0x00, 0x1c, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0xab, 0xcd, 10, 0, 0, 1, 10, 0,
        0, 2, 0, 53, 0, 54, 0, 8, 0, 0,
    ];

    #[test]
    fn fields() {
        let p = Ipv4Packet::new_checked(&UDP4).unwrap();
        assert_eq!((p.version(), p.header_len(), p.tos()), (4, 20, 0xb8));
        assert_eq!(
            (p.total_len(), p.ident(), p.ttl(), p.protocol()),
            (28, 0x1234, 64, 17)
        );
        assert!(p.dont_frag() && !p.more_frags());
        assert_eq!((p.frag_offset(), p.checksum()), (0, 0xabcd));
        assert_eq!((p.src(), p.dst()), (0x0a00_0001, 0x0a00_0002));
        assert_eq!(p.addrs(), &UDP4[12..20]);
        assert_eq!(p.header(), Some(&UDP4[..20]));
        assert_eq!(p.payload(), Some(&UDP4[20..]));
        assert!(Ipv4Packet::new_checked(&UDP4[..19]).is_err());
    }

    #[test]
    fn inconsistent_lengths_give_no_payload() {
        let mut b = UDP4;
        b[3] = 29; // total length beyond the buffer
        assert_eq!(Ipv4Packet::new_checked(&b).unwrap().payload(), None);
        b[3] = 19; // total length below the header
        assert_eq!(Ipv4Packet::new_checked(&b).unwrap().payload(), None);
        b[3] = 28;
        b[0] = 0x44; // IHL 4
        let p = Ipv4Packet::new_checked(&b).unwrap();
        assert_eq!((p.header(), p.payload()), (None, None));
        b[0] = 0x4f; // IHL 15: options past the buffer
        assert_eq!(Ipv4Packet::new_checked(&b).unwrap().header(), None);
    }
}
