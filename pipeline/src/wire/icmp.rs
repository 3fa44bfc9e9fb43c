//! ICMP (RFC 792), ICMPv6 (RFC 4443) and IGMP: all start with type and code
//! and have an 8-byte minimal header.

use super::{u16_at, u32_at, u8_at, Error};

/// The minimal header: type, code, checksum and 4 bytes whose meaning
/// depends on the type (echo id and sequence, next-hop MTU, pointer...).
pub const HEADER_LEN: usize = 8;

/// ICMPv4 message types.
pub mod v4 {
    pub const ECHO_REPLY: u8 = 0;
    pub const DST_UNREACHABLE: u8 = 3;
    pub const SOURCE_QUENCH: u8 = 4;
    pub const REDIRECT: u8 = 5;
    pub const ECHO_REQUEST: u8 = 8;
    pub const TIME_EXCEEDED: u8 = 11;
    pub const PARAM_PROBLEM: u8 = 12;
    pub const TIMESTAMP: u8 = 13;
    pub const TIMESTAMP_REPLY: u8 = 14;
    pub const INFO_REQUEST: u8 = 15;
    pub const INFO_REPLY: u8 = 16;
    /// Destination unreachable code: fragmentation needed and DF set.
    pub const CODE_FRAG_NEEDED: u8 = 4;

    /// Whether `t` is an error message (one that quotes the packet it is
    /// about and must never be answered with another error).
    #[inline(always)]
    pub fn is_error(t: u8) -> bool {
        matches!(
            t,
            DST_UNREACHABLE | SOURCE_QUENCH | REDIRECT | TIME_EXCEEDED | PARAM_PROBLEM
        )
    }
}

/// ICMPv6 message types.
pub mod v6 {
    pub const DST_UNREACHABLE: u8 = 1;
    pub const PKT_TOO_BIG: u8 = 2;
    pub const TIME_EXCEEDED: u8 = 3;
    pub const PARAM_PROBLEM: u8 = 4;
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;

    /// Whether `t` is an error message (RFC 4443 2.1: types 0..=127).
    #[inline(always)]
    pub fn is_error(t: u8) -> bool {
        t < 128
    }
}

/// Byte offsets of the minimal header.
pub mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    /// Echo and timestamp messages: identifier.
    pub const IDENT: Range<usize> = 4..6;
    /// Echo and timestamp messages: sequence number.
    pub const SEQ: Range<usize> = 6..8;
    /// The type-specific word (ICMPv6 Packet Too Big: the MTU; ICMPv4
    /// fragmentation needed: unused (2) and next-hop MTU (2)).
    pub const REST: Range<usize> = 4..8;
    /// ICMPv4 fragmentation needed: the next-hop MTU.
    pub const NEXT_HOP_MTU: Range<usize> = 6..8;
}

/// A checked view of an ICMP, ICMPv6 or IGMP message: the 8-byte minimal
/// header is present.
#[derive(Clone, Copy, Debug)]
pub struct IcmpPacket<'a> {
    header: &'a [u8; HEADER_LEN],
    payload: &'a [u8],
}

impl<'a> IcmpPacket<'a> {
    /// A view of the message at the start of `b`; [`Error::Truncated`]
    /// under 8 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let (header, payload) = b
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(Error::Truncated)?;
        Ok(IcmpPacket { header, payload })
    }

    #[inline(always)]
    pub fn msg_type(&self) -> u8 {
        u8_at(self.header, field::TYPE)
    }

    #[inline(always)]
    pub fn code(&self) -> u8 {
        u8_at(self.header, field::CODE)
    }

    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        u16_at(self.header, field::CHECKSUM)
    }

    /// Echo/timestamp identifier.
    #[inline(always)]
    pub fn ident(&self) -> u16 {
        u16_at(self.header, field::IDENT)
    }

    /// Echo/timestamp sequence number.
    #[inline(always)]
    pub fn seq(&self) -> u16 {
        u16_at(self.header, field::SEQ)
    }

    /// The type-specific word (bytes 4..8).
    #[inline(always)]
    pub fn rest_of_header(&self) -> u32 {
        u32_at(self.header, field::REST)
    }

    /// The bytes after the minimal header (an error's quoted packet).
    #[inline(always)]
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let b = [8, 0, 0xf7, 0xfe, 0, 1, 0, 2, 0x45];
        let i = IcmpPacket::new_checked(&b).unwrap();
        assert_eq!((i.msg_type(), i.code(), i.checksum()), (8, 0, 0xf7fe));
        assert_eq!(
            (i.ident(), i.seq(), i.rest_of_header()),
            (1, 2, 0x0001_0002)
        );
        assert_eq!(i.payload(), &[0x45]);
        assert!(IcmpPacket::new_checked(&b[..7]).is_err());
        assert!(v4::is_error(v4::TIME_EXCEEDED) && !v4::is_error(v4::ECHO_REQUEST));
        assert!(v6::is_error(v6::PKT_TOO_BIG) && !v6::is_error(v6::ECHO_REPLY));
    }
}
