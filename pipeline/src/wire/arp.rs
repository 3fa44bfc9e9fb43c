//! ARP and RARP (RFC 826) for Ethernet/IPv4, the only kind oxvs parses.

use super::{ethertype, mac_at, u16_at, u32_at, u8_at, Error};

/// Length of an Ethernet/IPv4 ARP packet.
pub const HEADER_LEN: usize = 28;
/// Hardware type Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;

/// Byte offsets of an Ethernet/IPv4 ARP packet.
pub mod field {
    use core::ops::Range;
    pub const HTYPE: Range<usize> = 0..2;
    pub const PTYPE: Range<usize> = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Range<usize> = 6..8;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// A checked view of a 28-byte Ethernet/IPv4 ARP packet.
#[derive(Clone, Copy, Debug)]
pub struct ArpPacket<'a> {
    header: &'a [u8; HEADER_LEN],
}

impl<'a> ArpPacket<'a> {
    /// A view of the packet at the start of `b`; [`Error::Truncated`] under
    /// 28 bytes. The hardware and protocol types are not checked: see
    /// [`is_ethernet_ipv4`](Self::is_ethernet_ipv4).
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let header = b.first_chunk::<HEADER_LEN>().ok_or(Error::Truncated)?;
        Ok(ArpPacket { header })
    }

    /// htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4: the layout the other
    /// getters assume.
    #[inline(always)]
    pub fn is_ethernet_ipv4(&self) -> bool {
        self.htype() == HTYPE_ETHERNET
            && self.ptype() == ethertype::IPV4
            && u8_at(self.header, field::HLEN) == 6
            && u8_at(self.header, field::PLEN) == 4
    }

    #[inline(always)]
    pub fn htype(&self) -> u16 {
        u16_at(self.header, field::HTYPE)
    }

    #[inline(always)]
    pub fn ptype(&self) -> u16 {
        u16_at(self.header, field::PTYPE)
    }

    /// The opcode (1 request, 2 reply, 3/4 RARP).
    #[inline(always)]
    pub fn oper(&self) -> u16 {
        u16_at(self.header, field::OPER)
    }

    /// Sender hardware address as a 48-bit integer.
    #[inline(always)]
    pub fn sha(&self) -> u64 {
        mac_at(self.header, field::SHA)
    }

    /// Sender protocol address.
    #[inline(always)]
    pub fn spa(&self) -> u32 {
        u32_at(self.header, field::SPA)
    }

    /// Target hardware address as a 48-bit integer.
    #[inline(always)]
    pub fn tha(&self) -> u64 {
        mac_at(self.header, field::THA)
    }

    /// Target protocol address.
    #[inline(always)]
    pub fn tpa(&self) -> u32 {
        u32_at(self.header, field::TPA)
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let mut b = vec![0, 1, 8, 0, 6, 4, 0, 2];
        b.extend_from_slice(&[2, 0, 0, 0, 0, 1, 10, 0, 0, 1, 2, 0, 0, 0, 0, 2, 10, 0, 0, 2]);
        let a = ArpPacket::new_checked(&b).unwrap();
        assert!(a.is_ethernet_ipv4());
        assert_eq!(
            (a.oper(), a.sha(), a.spa()),
            (2, 0x0200_0000_0001, 0x0a00_0001)
        );
        assert_eq!((a.tha(), a.tpa()), (0x0200_0000_0002, 0x0a00_0002));
        assert!(ArpPacket::new_checked(&b[..27]).is_err());
        b[4] = 8;
        assert!(!ArpPacket::new_checked(&b).unwrap().is_ethernet_ipv4());
    }
}
