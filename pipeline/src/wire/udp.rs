//! UDP (RFC 768) and SCTP's common header (RFC 9260): both start with the
//! source and destination ports.

use super::{u16_at, u32_at, Error};

/// Length of the UDP header.
pub const HEADER_LEN: usize = 8;

/// Byte offsets of the UDP header.
pub mod field {
    use core::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    /// Header and payload.
    pub const LEN: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// SCTP's common header.
pub mod sctp {
    /// Length of the common header.
    pub const HEADER_LEN: usize = 12;

    /// Byte offsets of the common header.
    pub mod field {
        use core::ops::Range;
        pub const SRC_PORT: Range<usize> = 0..2;
        pub const DST_PORT: Range<usize> = 2..4;
        pub const VERIFICATION_TAG: Range<usize> = 4..8;
        /// CRC32c, stored little-endian.
        pub const CHECKSUM: Range<usize> = 8..12;
    }
}

/// The source and destination ports at the start of a TCP, UDP or SCTP
/// header (all three start with them); `None` under 4 bytes.
#[inline(always)]
pub fn ports(b: &[u8]) -> Option<(u16, u16)> {
    let p = b.first_chunk::<4>()?;
    Some((u16_at(p, field::SRC_PORT), u16_at(p, field::DST_PORT)))
}

/// A checked view of a UDP datagram: the 8-byte header is present; the
/// length field is reported, not checked.
#[derive(Clone, Copy, Debug)]
pub struct UdpPacket<'a> {
    header: &'a [u8; HEADER_LEN],
    payload: &'a [u8],
}

impl<'a> UdpPacket<'a> {
    /// A view of the datagram at the start of `b`; [`Error::Truncated`]
    /// under 8 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let (header, payload) = b
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(Error::Truncated)?;
        Ok(UdpPacket { header, payload })
    }

    #[inline(always)]
    pub fn src_port(&self) -> u16 {
        u16_at(self.header, field::SRC_PORT)
    }

    #[inline(always)]
    pub fn dst_port(&self) -> u16 {
        u16_at(self.header, field::DST_PORT)
    }

    /// The length field (header included).
    #[inline(always)]
    pub fn len(&self) -> u16 {
        u16_at(self.header, field::LEN)
    }

    /// Whether the length field says 0 (never valid: it counts the header).
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        u16_at(self.header, field::CHECKSUM)
    }

    /// The bytes after the header (whatever the length field says).
    #[inline(always)]
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
}

/// A checked view of an SCTP packet's common header.
#[derive(Clone, Copy, Debug)]
pub struct SctpPacket<'a> {
    header: &'a [u8; sctp::HEADER_LEN],
}

impl<'a> SctpPacket<'a> {
    /// A view of the packet at the start of `b`; [`Error::Truncated`]
    /// under 12 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let header = b
            .first_chunk::<{ sctp::HEADER_LEN }>()
            .ok_or(Error::Truncated)?;
        Ok(SctpPacket { header })
    }

    #[inline(always)]
    pub fn src_port(&self) -> u16 {
        u16_at(self.header, sctp::field::SRC_PORT)
    }

    #[inline(always)]
    pub fn dst_port(&self) -> u16 {
        u16_at(self.header, sctp::field::DST_PORT)
    }

    #[inline(always)]
    pub fn verification_tag(&self) -> u32 {
        u32_at(self.header, sctp::field::VERIFICATION_TAG)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn udp_and_sctp() {
        let b = [0, 53, 0xd4, 0x31, 0, 9, 0xab, 0xcd, b'x', 0, 0, 7];
        let u = UdpPacket::new_checked(&b).unwrap();
        assert_eq!(
            (u.src_port(), u.dst_port(), u.len(), u.checksum()),
            (53, 54321, 9, 0xabcd)
        );
        assert!(!u.is_empty());
        assert_eq!(u.payload(), &b[8..]);
        assert!(UdpPacket::new_checked(&b[..7]).is_err());
        let s = SctpPacket::new_checked(&b).unwrap();
        assert_eq!(
            (s.src_port(), s.dst_port(), s.verification_tag()),
            (53, 54321, 0x0009_abcd)
        );
        assert!(SctpPacket::new_checked(&b[..11]).is_err());
        assert_eq!(ports(&b[..4]), Some((53, 54321)));
        assert_eq!(ports(&b[..3]), None);
    }
}
