//! Ethernet II headers, 802.1Q/802.1ad VLAN tags and 802.2 LLC/SNAP.

use super::{ethertype, mac_at, u16_at, Error};

/// Length of the Ethernet header (no tags, no FCS).
pub const HEADER_LEN: usize = 14;

/// Most VLAN tags [`EthernetFrame::skip_vlan_tags`] skips before the
/// ethertype (OVS `FLOW_MAX_VLAN_HEADERS`).
pub const MAX_VLAN_TAGS: usize = 2;

/// Byte offsets of the Ethernet header.
pub mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: Range<usize> = 12..14;
}

/// Whether `t` is a VLAN tag's TPID (802.1Q or 802.1ad).
#[inline(always)]
pub fn is_vlan_tpid(t: u16) -> bool {
    t == ethertype::VLAN || t == ethertype::QINQ
}

/// A checked view of an Ethernet frame.
#[derive(Clone, Copy, Debug)]
pub struct EthernetFrame<'a> {
    header: &'a [u8; HEADER_LEN],
    payload: &'a [u8],
}

/// An Ethernet frame's link layer as the rest of the stack sees it: the
/// ethertype after the VLAN tags, where the L3 header starts, and the tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L2<'a> {
    /// The ethertype after the skipped tags. A TPID when a tag is cut short
    /// (its TCI and inner ethertype are not both in the frame) or when a
    /// tag follows [`MAX_VLAN_TAGS`] tags.
    pub ethertype: u16,
    /// VLAN tags skipped, `0..=MAX_VLAN_TAGS`.
    pub tags: usize,
    /// The TCI of the outermost skipped tag.
    pub outer_tci: Option<u16>,
    /// Offset of the L3 header from the frame's start: `14 + 4 * tags`.
    pub l3_offset: usize,
    /// The bytes from `l3_offset` on.
    pub payload: &'a [u8],
}

impl<'a> EthernetFrame<'a> {
    /// A view of `frame`; [`Error::Truncated`] if it is shorter than 14 bytes.
    #[inline(always)]
    pub fn new_checked(frame: &'a [u8]) -> Result<Self, Error> {
        let (header, payload) = frame
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(Error::Truncated)?;
        Ok(EthernetFrame { header, payload })
    }

    /// Destination MAC address as a 48-bit integer.
    #[inline(always)]
    pub fn dst(&self) -> u64 {
        mac_at(self.header, field::DST)
    }

    /// Source MAC address as a 48-bit integer.
    #[inline(always)]
    pub fn src(&self) -> u64 {
        mac_at(self.header, field::SRC)
    }

    /// Destination MAC address.
    #[inline(always)]
    pub fn dst_addr(&self) -> [u8; 6] {
        super::bytes_at(self.header, field::DST)
    }

    /// Source MAC address.
    #[inline(always)]
    pub fn src_addr(&self) -> [u8; 6] {
        super::bytes_at(self.header, field::SRC)
    }

    /// The type field: an ethertype, a TPID, or (below [`ethertype::MIN`])
    /// an 802.3 length.
    #[inline(always)]
    pub fn ethertype(&self) -> u16 {
        u16_at(self.header, field::ETHERTYPE)
    }

    /// The bytes after the 14-byte header.
    #[inline(always)]
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }

    /// Skips up to [`MAX_VLAN_TAGS`] 802.1Q/802.1ad tags, as OVS's
    /// `parse_vlan` does: a tag is taken only when its TCI and the next
    /// ethertype are both in the frame, otherwise the TPID stays the
    /// ethertype; a third tag is not skipped either (its TPID is the
    /// ethertype).
    #[inline(always)]
    pub fn skip_vlan_tags(&self) -> L2<'a> {
        let mut l2 = L2 {
            ethertype: self.ethertype(),
            tags: 0,
            outer_tci: None,
            l3_offset: HEADER_LEN,
            payload: self.payload,
        };
        // A constant trip count: the compiler unrolls it (this runs per
        // packet in the key extractor).
        for i in 0..MAX_VLAN_TAGS {
            if !is_vlan_tpid(l2.ethertype) {
                break;
            }
            let Ok(tag) = VlanTag::new_checked(l2.payload) else {
                break;
            };
            if i == 0 {
                l2.outer_tci = Some(tag.tci());
            }
            l2.ethertype = tag.ethertype();
            l2.payload = tag.payload();
            l2.l3_offset += vlan::HEADER_LEN;
            l2.tags += 1;
        }
        l2
    }
}

/// The link layer of `frame`: [`EthernetFrame::skip_vlan_tags`], or `None`
/// for a frame shorter than an Ethernet header.
#[inline(always)]
pub fn l2_of(frame: &[u8]) -> Option<L2<'_>> {
    EthernetFrame::new_checked(frame)
        .ok()
        .map(|f| f.skip_vlan_tags())
}

/// An 802.1Q/802.1ad tag *after* its TPID (the TPID sits in the type field
/// before it): TCI, then the next ethertype.
pub mod vlan {
    /// TCI + inner ethertype.
    pub const HEADER_LEN: usize = 4;

    pub mod field {
        use core::ops::Range;
        pub const TCI: Range<usize> = 0..2;
        pub const ETHERTYPE: Range<usize> = 2..4;
    }
}

/// A checked view of a VLAN tag after its TPID.
#[derive(Clone, Copy, Debug)]
pub struct VlanTag<'a> {
    header: &'a [u8; vlan::HEADER_LEN],
    payload: &'a [u8],
}

impl<'a> VlanTag<'a> {
    /// A view of the tag at the start of `b`; [`Error::Truncated`] under 4 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let (header, payload) = b
            .split_first_chunk::<{ vlan::HEADER_LEN }>()
            .ok_or(Error::Truncated)?;
        Ok(VlanTag { header, payload })
    }

    /// Priority (3 bits), DEI (1), VLAN id (12).
    #[inline(always)]
    pub fn tci(&self) -> u16 {
        u16_at(self.header, vlan::field::TCI)
    }

    /// The ethertype (or next TPID) after the tag.
    #[inline(always)]
    pub fn ethertype(&self) -> u16 {
        u16_at(self.header, vlan::field::ETHERTYPE)
    }

    /// The bytes after the tag.
    #[inline(always)]
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
}

/// An 802.2 LLC header followed by a SNAP header (an 802.3 frame that still
/// carries an ethertype).
pub mod llc_snap {
    /// LLC (3) + SNAP (5).
    pub const HEADER_LEN: usize = 8;
    /// DSAP, SSAP, control and OUI of SNAP with the Ethernet OUI: the SNAP
    /// protocol id is an ethertype.
    pub const ETHERNET_PREFIX: [u8; 6] = [0xaa, 0xaa, 0x03, 0x00, 0x00, 0x00];

    pub mod field {
        use core::ops::Range;
        /// DSAP, SSAP, control, OUI.
        pub const PREFIX: Range<usize> = 0..6;
        pub const ETHERTYPE: Range<usize> = 6..8;
    }
}

/// A checked view of an LLC/SNAP header.
#[derive(Clone, Copy, Debug)]
pub struct LlcSnap<'a> {
    header: &'a [u8; llc_snap::HEADER_LEN],
    payload: &'a [u8],
}

impl<'a> LlcSnap<'a> {
    /// A view of the header at the start of `b`; [`Error::Truncated`] under 8 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let (header, payload) = b
            .split_first_chunk::<{ llc_snap::HEADER_LEN }>()
            .ok_or(Error::Truncated)?;
        Ok(LlcSnap { header, payload })
    }

    /// Whether the LLC/SNAP prefix is `aa aa 03 00 00 00` (SNAP with the
    /// Ethernet OUI: [`ethertype`](Self::ethertype) is an ethertype).
    #[inline(always)]
    pub fn is_ethernet_oui(&self) -> bool {
        self.header.get(llc_snap::field::PREFIX) == Some(&llc_snap::ETHERNET_PREFIX[..])
    }

    /// The SNAP protocol id.
    #[inline(always)]
    pub fn ethertype(&self) -> u16 {
        u16_at(self.header, llc_snap::field::ETHERTYPE)
    }

    /// The bytes after the header.
    #[inline(always)]
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    const MACS: [u8; 12] = [2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];

    fn frame(rest: &[u8]) -> Vec<u8> {
        let mut f = MACS.to_vec();
        f.extend_from_slice(rest);
        f
    }

    #[test]
    fn header_fields() {
        let f = frame(&[0x08, 0x00, 0x45]);
        let e = EthernetFrame::new_checked(&f).unwrap();
        assert_eq!((e.dst(), e.src()), (0x0200_0000_0002, 0x0200_0000_0001));
        assert_eq!(
            (e.dst_addr(), e.src_addr()),
            ([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1])
        );
        assert_eq!(e.ethertype(), ethertype::IPV4);
        assert_eq!(e.payload(), &[0x45]);
        assert_eq!(
            EthernetFrame::new_checked(&f[..13]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn vlan_tags() {
        // Two tags, then IPv4.
        let f = frame(&[
            0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x00, 0x05, 0x08, 0x00, 0x45,
        ]);
        let l2 = l2_of(&f).unwrap();
        assert_eq!(
            (
                l2.ethertype,
                l2.tags,
                l2.outer_tci,
                l2.l3_offset,
                l2.payload
            ),
            (ethertype::IPV4, 2, Some(0x64), 22, &[0x45][..])
        );
        // A third tag is the ethertype.
        let f = frame(&[0x81, 0, 0, 1, 0x81, 0, 0, 2, 0x81, 0, 0, 3, 0x08, 0x00]);
        let l2 = l2_of(&f).unwrap();
        assert_eq!(
            (l2.ethertype, l2.tags, l2.l3_offset),
            (ethertype::VLAN, 2, 22)
        );
        // A tag cut short is not taken.
        let f = frame(&[0x81, 0x00, 0xa0, 0x0a, 0x08]);
        let l2 = l2_of(&f).unwrap();
        assert_eq!(
            (l2.ethertype, l2.tags, l2.outer_tci, l2.l3_offset),
            (ethertype::VLAN, 0, None, 14)
        );
        assert!(l2_of(&f[..13]).is_none());
    }

    #[test]
    fn llc_snap() {
        let b = [0xaa, 0xaa, 0x03, 0, 0, 0, 0x08, 0x00, 0x45];
        let s = LlcSnap::new_checked(&b).unwrap();
        assert!(s.is_ethernet_oui());
        assert_eq!((s.ethertype(), s.payload()), (ethertype::IPV4, &[0x45][..]));
        let other = [0xaa, 0xaa, 0x03, 0, 0, 0x0c, 0x08, 0x00];
        assert!(!LlcSnap::new_checked(&other).unwrap().is_ethernet_oui());
        assert!(LlcSnap::new_checked(&b[..7]).is_err());
    }
}
