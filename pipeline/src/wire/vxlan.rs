//! VXLAN (RFC 7348): the 8-byte header after the outer UDP header.

use super::{u8_at, Error};

/// Length of the VXLAN header.
pub const HEADER_LEN: usize = 8;
/// The IANA VXLAN UDP port.
pub const UDP_PORT: u16 = 4789;
/// The I flag: the VNI is valid.
pub const FLAG_I: u8 = 0x08;
/// The VNI's bits (24).
pub const VNI_MASK: u32 = 0x00ff_ffff;

/// Byte offsets of the VXLAN header.
pub mod field {
    use core::ops::Range;
    pub const FLAGS: usize = 0;
    pub const RESERVED1: Range<usize> = 1..4;
    pub const VNI: Range<usize> = 4..7;
    pub const RESERVED2: usize = 7;
}

/// A checked view of a VXLAN header and the inner frame after it.
#[derive(Clone, Copy, Debug)]
pub struct VxlanHeader<'a> {
    header: &'a [u8; HEADER_LEN],
    payload: &'a [u8],
}

impl<'a> VxlanHeader<'a> {
    /// A view of the header at the start of `b` (a UDP payload);
    /// [`Error::Truncated`] under 8 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let (header, payload) = b
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(Error::Truncated)?;
        Ok(VxlanHeader { header, payload })
    }

    #[inline(always)]
    pub fn flags(&self) -> u8 {
        u8_at(self.header, field::FLAGS)
    }

    /// The 24-bit VXLAN network identifier.
    #[inline(always)]
    pub fn vni(&self) -> u32 {
        match self.header.get(field::VNI) {
            Some(&[a, b, c]) => u32::from_be_bytes([0, a, b, c]),
            _ => 0,
        }
    }

    /// Only the I flag set and every reserved bit zero: a plain RFC 7348
    /// header (what Linux's `vxlan` accepts when no extension, GBP or GPE,
    /// is configured).
    #[inline(always)]
    pub fn is_plain(&self) -> bool {
        self.flags() == FLAG_I
            && self.header.get(field::RESERVED1) == Some(&[0, 0, 0][..])
            && u8_at(self.header, field::RESERVED2) == 0
    }

    /// The inner Ethernet frame.
    #[inline(always)]
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
}

/// The header for `vni` (low 24 bits): I flag, VNI, everything else zero.
pub fn header(vni: u32) -> [u8; HEADER_LEN] {
    let [_, a, b, c] = (vni & VNI_MASK).to_be_bytes();
    [FLAG_I, 0, 0, 0, a, b, c, 0]
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_validation() {
        let mut b = header(0x0100_002a).to_vec();
        assert_eq!(b, [0x08, 0, 0, 0, 0, 0, 0x2a, 0]);
        b.push(0xee);
        let v = VxlanHeader::new_checked(&b).unwrap();
        assert_eq!(
            (v.vni(), v.is_plain(), v.payload()),
            (42, true, &[0xee][..])
        );
        for (i, bit) in [(0, 0x80), (1, 1), (3, 1), (7, 1)] {
            let mut bad = b.clone();
            bad[i] |= bit;
            assert!(
                !VxlanHeader::new_checked(&bad).unwrap().is_plain(),
                "byte {i}"
            );
        }
        assert!(VxlanHeader::new_checked(&b[..7]).is_err());
    }
}
