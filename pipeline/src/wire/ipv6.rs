//! IPv6 (RFC 8200): the fixed header, extension headers, and [`walk_ext`],
//! the one walk over an extension header chain.
//!
//! ## The chain walk ([`walk_ext`])
//!
//! Every parser that needs the upper-layer header of an IPv6 packet (the
//! flow key extractor, header rewrites, conntrack, fragment reassembly, the
//! VXLAN port's ICMPv6 check) calls [`walk_ext`], so they agree on where
//! that header is and on which packets are malformed. Its rules:
//!
//! - **Which headers.** Hop-by-Hop Options (0), Routing (43), Fragment
//!   (44), Destination Options (60) and the Authentication Header (51, whose
//!   length counts 4-byte units): the set Open vSwitch's flow extraction
//!   (`parse_ipv6_ext_hdrs`) and Linux's `ipv6_skip_exthdr` step over. Any
//!   other next header ends the chain and is the upper-layer protocol
//!   ([`ExtEnd::Upper`]). That includes **ESP** (50: what follows is
//!   encrypted), **No Next Header** (59: nothing follows; the "upper layer"
//!   is empty), Mobility, HIP and Shim6, which the flow key reports as
//!   `nw_proto` like OVS does.
//! - **Bound.** At most [`MAX_EXT_HEADERS`] (8) extension headers,
//!   Fragment headers included; a ninth ends the walk as
//!   [`ExtEnd::TooLong`]. Each header's length field allows at most 2048
//!   bytes (AH 1028), so the walk skips at most 16 KiB and reads 8 bytes of
//!   each header it steps over; it never reads past the bytes it is given
//!   (callers pass the payload the IPv6 payload length describes, clipped
//!   to what they have).
//! - **Truncation.** A header whose first 8 bytes or whose declared length
//!   are not all inside those bytes ends the walk as [`ExtEnd::Truncated`].
//! - **Fragments.** A Fragment header with a non-zero offset ends the walk
//!   ([`ExtEnd::LaterFragment`]): what follows it is fragment data, not
//!   headers. A Fragment header with offset 0 (a first fragment, or an
//!   atomic fragment, RFC 6946) is stepped over like any other, so the
//!   upper-layer header of a first fragment is found. The result records
//!   the first Fragment header ([`ExtChain::fragment`]), how many there
//!   were, and whether any had a non-zero offset/flags word
//!   ([`ExtChain::fragmented`], OVS's "this is a fragment").
//!
//! What a caller does with each ending is its own policy: the extractor
//! leaves the L3+ key fields zero on `Truncated`/`TooLong` (as OVS does for
//! a malformed chain), conntrack calls the packet untrackable, reassembly
//! drops it as malformed.

use super::{ip_proto, u128_at, u16_at, u32_at, u8_at, Error};

/// Length of the fixed header.
pub const HEADER_LEN: usize = 40;

/// Most extension headers [`walk_ext`] steps over (Fragment headers
/// included). OVS has no bound; ours keeps the per-packet cost bounded, and
/// real traffic carries one or two.
pub const MAX_EXT_HEADERS: usize = 8;

/// Every extension header is at least this long, and the Fragment header is
/// exactly this long.
pub const EXT_MIN_LEN: usize = 8;

/// Fragment header offset/flags word: the offset in bytes (13 bits of
/// 8-byte units, shifted by 3).
pub const FRAG_OFFSET_MASK: u16 = 0xfff8;
/// Fragment header offset/flags word: more fragments.
pub const FRAG_M: u16 = 0x0001;
/// The flow label bits of the first header word.
pub const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// Byte offsets of the fixed header.
pub mod field {
    use core::ops::Range;
    /// Version (4 bits), traffic class (8), flow label (20).
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
}

/// Byte offsets of an extension header (the generic layout, and the
/// Fragment header's own fields).
pub mod ext_field {
    use core::ops::Range;
    pub const NEXT_HEADER: usize = 0;
    /// Length in 8-byte units not counting the first 8 (AH: 4-byte units
    /// not counting the first 8); reserved in the Fragment header.
    pub const HDR_LEN: usize = 1;
    /// Fragment header: offset (13 bits), reserved (2), M (1).
    pub const FRAG_OFFLG: Range<usize> = 2..4;
    /// Fragment header: identification.
    pub const FRAG_IDENT: Range<usize> = 4..8;
}

/// Whether [`walk_ext`] steps over next header `n` (see the module doc).
#[inline(always)]
pub fn is_ext_header(n: u8) -> bool {
    matches!(
        n,
        ip_proto::HOPOPTS
            | ip_proto::ROUTING
            | ip_proto::FRAGMENT
            | ip_proto::DSTOPTS
            | ip_proto::AH
    )
}

/// A checked view of an IPv6 packet: the 40-byte fixed header is present;
/// the payload length is reported, not checked.
#[derive(Clone, Copy, Debug)]
pub struct Ipv6Packet<'a> {
    header: &'a [u8; HEADER_LEN],
    rest: &'a [u8],
}

impl<'a> Ipv6Packet<'a> {
    /// A view of the packet at the start of `b`; [`Error::Truncated`] under
    /// 40 bytes.
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let (header, rest) = b
            .split_first_chunk::<HEADER_LEN>()
            .ok_or(Error::Truncated)?;
        Ok(Ipv6Packet { header, rest })
    }

    /// The first header word: version, traffic class, flow label.
    #[inline(always)]
    pub fn ver_tc_flow(&self) -> u32 {
        u32_at(self.header, field::VER_TC_FLOW)
    }

    /// The version nibble (6 for IPv6; not checked by `new_checked`).
    #[inline(always)]
    pub fn version(&self) -> u8 {
        u8_at(self.header, 0) >> 4
    }

    #[inline(always)]
    pub fn traffic_class(&self) -> u8 {
        // Bits 20..28 of the first word.
        let [.., tc] = (self.ver_tc_flow() >> 20).to_be_bytes();
        tc
    }

    #[inline(always)]
    pub fn flow_label(&self) -> u32 {
        self.ver_tc_flow() & FLOW_LABEL_MASK
    }

    #[inline(always)]
    pub fn payload_len(&self) -> u16 {
        u16_at(self.header, field::PAYLOAD_LEN)
    }

    #[inline(always)]
    pub fn next_header(&self) -> u8 {
        u8_at(self.header, field::NEXT_HEADER)
    }

    #[inline(always)]
    pub fn hop_limit(&self) -> u8 {
        u8_at(self.header, field::HOP_LIMIT)
    }

    #[inline(always)]
    pub fn src(&self) -> u128 {
        u128_at(self.header, field::SRC)
    }

    #[inline(always)]
    pub fn dst(&self) -> u128 {
        u128_at(self.header, field::DST)
    }

    /// Source and destination, in wire order (32 bytes).
    #[inline(always)]
    pub fn addrs(&self) -> &'a [u8] {
        self.header
            .get(field::SRC.start..field::DST.end)
            .unwrap_or(&[])
    }

    /// The payload the payload length describes (bytes after it are link
    /// padding); `None` when it runs past the buffer. A payload length of 0
    /// (jumbogram or empty) gives an empty payload.
    #[inline(always)]
    pub fn payload(&self) -> Option<&'a [u8]> {
        self.rest.get(..usize::from(self.payload_len()))
    }

    /// Everything after the fixed header, whatever the payload length says.
    #[inline(always)]
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

/// A checked view of an extension header with the generic layout (next
/// header, length), or of a Fragment header.
#[derive(Clone, Copy, Debug)]
pub struct Ipv6ExtHeader<'a> {
    header: &'a [u8; EXT_MIN_LEN],
}

impl<'a> Ipv6ExtHeader<'a> {
    /// A view of the header at the start of `b`; [`Error::Truncated`] under
    /// 8 bytes (its declared length is not checked: see [`Self::len`]).
    #[inline(always)]
    pub fn new_checked(b: &'a [u8]) -> Result<Self, Error> {
        let header = b.first_chunk::<EXT_MIN_LEN>().ok_or(Error::Truncated)?;
        Ok(Ipv6ExtHeader { header })
    }

    #[inline(always)]
    pub fn next_header(&self) -> u8 {
        u8_at(self.header, ext_field::NEXT_HEADER)
    }

    /// The header's length in bytes when its type is `kind` (the next
    /// header value that named it): AH counts 4-byte units, the Fragment
    /// header is always 8 bytes, the others count 8-byte units.
    #[inline(always)]
    pub fn len(&self, kind: u8) -> usize {
        let n = usize::from(u8_at(self.header, ext_field::HDR_LEN));
        match kind {
            ip_proto::AH => (n + 2) * 4,
            ip_proto::FRAGMENT => EXT_MIN_LEN,
            _ => (n + 1) * 8,
        }
    }

    /// Fragment header: offset (13 bits), reserved (2), M (1).
    #[inline(always)]
    pub fn frag_offlg(&self) -> u16 {
        u16_at(self.header, ext_field::FRAG_OFFLG)
    }

    /// Fragment header: identification.
    #[inline(always)]
    pub fn frag_ident(&self) -> u32 {
        u32_at(self.header, ext_field::FRAG_IDENT)
    }
}

/// A Fragment header met by [`walk_ext`], and where it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// Offset of the Fragment header in the walked bytes.
    pub at: usize,
    /// Offset (in the walked bytes) of the extension header whose Next
    /// Header byte names this one; `None` when it is the `first` next
    /// header given to the walk (the fixed header's Next Header).
    pub named_by: Option<usize>,
    /// The Fragment header's Next Header: the first header of the
    /// fragmentable part.
    pub next_header: u8,
    /// Offset (13 bits), reserved (2), M (1).
    pub offlg: u16,
    pub ident: u32,
}

impl Fragment {
    /// The fragment's offset in bytes.
    #[inline(always)]
    pub fn offset(&self) -> u32 {
        u32::from(self.offlg & FRAG_OFFSET_MASK)
    }

    /// The M (more fragments) flag.
    #[inline(always)]
    pub fn more(&self) -> bool {
        self.offlg & FRAG_M != 0
    }

    /// Offset 0 and no M: a whole datagram in a Fragment header (RFC 6946).
    #[inline(always)]
    pub fn is_atomic(&self) -> bool {
        self.offset() == 0 && !self.more()
    }
}

/// How [`walk_ext`] ended. Offsets are from the start of the walked bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtEnd {
    /// `next_header` is not an extension header the walk steps over: the
    /// upper-layer protocol (or ESP, or No Next Header), whose header
    /// starts at `offset` (`offset <= ` the walked length; its own length
    /// is not checked).
    Upper { next_header: u8, offset: usize },
    /// A Fragment header with a non-zero offset, whose Next Header is
    /// `next_header`; its data starts at `offset`.
    LaterFragment { next_header: u8, offset: usize },
    /// The extension header at `offset` is not entirely in the walked bytes.
    Truncated { offset: usize },
    /// A ninth extension header starts at `offset`.
    TooLong { offset: usize },
}

/// The result of [`walk_ext`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtChain {
    /// Where and why the walk stopped.
    pub end: ExtEnd,
    /// Extension headers stepped over (`0..=MAX_EXT_HEADERS`; a later
    /// fragment's Fragment header counts).
    pub headers: usize,
    /// The first Fragment header stepped over.
    pub fragment: Option<Fragment>,
    /// How many Fragment headers were stepped over (RFC 8200 allows one).
    pub fragment_headers: usize,
    /// Some Fragment header had a non-zero offset/flags word (offset, M or a
    /// reserved bit): OVS's "this packet is a fragment" (`nw_frag`), which
    /// an atomic fragment is not.
    pub fragmented: bool,
}

impl ExtChain {
    /// The upper-layer protocol and its offset, when the walk reached it.
    #[inline(always)]
    pub fn upper(&self) -> Option<(u8, usize)> {
        match self.end {
            ExtEnd::Upper {
                next_header,
                offset,
            } => Some((next_header, offset)),
            _ => None,
        }
    }
}

/// Walks the extension header chain in `data` (the bytes after the fixed
/// header, normally the payload the payload length describes) starting
/// with next header `first`. The rules are in the module doc; never
/// panics, never reads outside `data`.
#[inline(always)]
pub fn walk_ext(first: u8, data: &[u8]) -> ExtChain {
    let mut chain = ExtChain {
        end: ExtEnd::Upper {
            next_header: first,
            offset: 0,
        },
        headers: 0,
        fragment: None,
        fragment_headers: 0,
        fragmented: false,
    };
    let mut next = first;
    let mut offset = 0usize;
    let mut named_by = None;
    loop {
        if !is_ext_header(next) {
            chain.end = ExtEnd::Upper {
                next_header: next,
                offset,
            };
            return chain;
        }
        if chain.headers == MAX_EXT_HEADERS {
            chain.end = ExtEnd::TooLong { offset };
            return chain;
        }
        let Some(rest) = data.get(offset..) else {
            chain.end = ExtEnd::Truncated { offset };
            return chain;
        };
        let Ok(h) = Ipv6ExtHeader::new_checked(rest) else {
            chain.end = ExtEnd::Truncated { offset };
            return chain;
        };
        let len = h.len(next);
        if len > rest.len() {
            chain.end = ExtEnd::Truncated { offset };
            return chain;
        }
        chain.headers += 1;
        if next == ip_proto::FRAGMENT {
            let f = Fragment {
                at: offset,
                named_by,
                next_header: h.next_header(),
                offlg: h.frag_offlg(),
                ident: h.frag_ident(),
            };
            chain.fragment_headers += 1;
            chain.fragment.get_or_insert(f);
            chain.fragmented |= f.offlg != 0;
            if f.offset() != 0 {
                chain.end = ExtEnd::LaterFragment {
                    next_header: f.next_header,
                    offset: offset + len,
                };
                return chain;
            }
        }
        named_by = Some(offset);
        next = h.next_header();
        offset += len;
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use ip_proto::*;

    fn opts(next: u8, units: u8) -> Vec<u8> {
        let mut h = vec![next, units];
        h.resize(usize::from(units + 1) * 8, 0);
        h
    }

    fn frag(next: u8, offlg: u16, id: u32) -> Vec<u8> {
        let mut h = vec![next, 0];
        h.extend_from_slice(&offlg.to_be_bytes());
        h.extend_from_slice(&id.to_be_bytes());
        h
    }

    #[test]
    fn fixed_header() {
        let mut b = vec![0x6a, 0xb1, 0x23, 0x45, 0, 4, UDP, 64];
        b.extend_from_slice(&1u128.to_be_bytes());
        b.extend_from_slice(&2u128.to_be_bytes());
        b.extend_from_slice(&[1, 2, 3, 4, 0xee]);
        let p = Ipv6Packet::new_checked(&b).unwrap();
        assert_eq!(
            (p.version(), p.traffic_class(), p.flow_label()),
            (6, 0xab, 0x12345)
        );
        assert_eq!(
            (p.payload_len(), p.next_header(), p.hop_limit()),
            (4, UDP, 64)
        );
        assert_eq!((p.src(), p.dst(), p.addrs().len()), (1, 2, 32));
        assert_eq!(p.payload(), Some(&[1, 2, 3, 4][..]));
        assert_eq!(p.rest().len(), 5);
        b[5] = 6;
        assert_eq!(Ipv6Packet::new_checked(&b).unwrap().payload(), None);
        assert!(Ipv6Packet::new_checked(&b[..39]).is_err());
    }

    #[test]
    fn no_extension_headers() {
        let c = walk_ext(TCP, &[0; 20]);
        assert_eq!(c.upper(), Some((TCP, 0)));
        assert_eq!((c.headers, c.fragment, c.fragmented), (0, None, false));
        // Upper layer at the very end (its own length is the caller's business).
        assert_eq!(walk_ext(UDP, &[]).upper(), Some((UDP, 0)));
    }

    #[test]
    fn steps_over_hbh_routing_dstopts_ah() {
        let mut ah = vec![DSTOPTS, 1]; // (1 + 2) * 4 = 12 bytes
        ah.resize(12, 0);
        let data = [opts(ROUTING, 0), opts(AH, 1), ah, opts(TCP, 0), vec![0; 20]].concat();
        let c = walk_ext(HOPOPTS, &data);
        assert_eq!(c.upper(), Some((TCP, 8 + 16 + 12 + 8)));
        assert_eq!(c.headers, 4);
    }

    #[test]
    fn esp_no_next_header_and_mobility_end_the_chain() {
        for upper in [ESP, NO_NEXT_HEADER, MOBILITY, 253] {
            let data = opts(upper, 0);
            assert_eq!(
                walk_ext(HOPOPTS, &data).upper(),
                Some((upper, 8)),
                "{upper}"
            );
        }
    }

    #[test]
    fn bound_is_eight_headers_fragment_included() {
        let mut data = Vec::new();
        for _ in 0..7 {
            data.extend(opts(DSTOPTS, 0));
        }
        data.extend(frag(UDP, 0x0001, 7));
        let c = walk_ext(DSTOPTS, &data);
        assert_eq!((c.upper(), c.headers), (Some((UDP, 64)), 8));
        // A ninth header is too many, whatever it is.
        let mut nine = opts(FRAGMENT, 0);
        nine.extend(&data);
        let c = walk_ext(DSTOPTS, &nine);
        assert_eq!((c.end, c.headers), (ExtEnd::TooLong { offset: 64 }, 8));
        let mut later = vec![];
        for _ in 0..8 {
            later.extend(opts(DSTOPTS, 0));
        }
        later.extend(frag(UDP, 0x0010, 7));
        assert_eq!(
            walk_ext(DSTOPTS, &later).end,
            ExtEnd::TooLong { offset: 64 }
        );
    }

    #[test]
    fn truncated_chains() {
        let data = opts(UDP, 1); // claims 16 bytes
        assert_eq!(
            walk_ext(HOPOPTS, &data[..15]).end,
            ExtEnd::Truncated { offset: 0 }
        );
        assert_eq!(walk_ext(HOPOPTS, &data).upper(), Some((UDP, 16)));
        let two = [opts(ROUTING, 0), vec![UDP, 0, 0]].concat();
        assert_eq!(walk_ext(HOPOPTS, &two).end, ExtEnd::Truncated { offset: 8 });
        assert_eq!(
            walk_ext(FRAGMENT, &[UDP, 0, 0, 1]).end,
            ExtEnd::Truncated { offset: 0 }
        );
    }

    #[test]
    fn fragments() {
        // First fragment: walked through, recorded.
        let data = [opts(FRAGMENT, 0), frag(TCP, 0x0001, 9), vec![0; 20]].concat();
        let c = walk_ext(HOPOPTS, &data);
        assert_eq!(c.upper(), Some((TCP, 16)));
        let f = c.fragment.unwrap();
        assert_eq!(
            (f.at, f.named_by, f.next_header, f.ident),
            (8, Some(0), TCP, 9)
        );
        assert!(f.more() && !f.is_atomic() && c.fragmented);
        // Later fragment: the walk stops after its header.
        let data = [frag(TCP, 0x0010, 9), vec![0; 8]].concat();
        let c = walk_ext(FRAGMENT, &data);
        assert_eq!(
            c.end,
            ExtEnd::LaterFragment {
                next_header: TCP,
                offset: 8
            }
        );
        let f = c.fragment.unwrap();
        assert_eq!((f.named_by, f.offset(), c.headers), (None, 16, 1));
        // Atomic fragment: not fragmented.
        let c = walk_ext(FRAGMENT, &frag(UDP, 0, 1));
        assert_eq!((c.upper(), c.fragmented), (Some((UDP, 8)), false));
        assert!(c.fragment.unwrap().is_atomic());
        // Two Fragment headers: the first is recorded, both counted, any
        // non-zero word makes the chain fragmented.
        let data = [frag(FRAGMENT, 0, 1), frag(UDP, 0x0001, 2)].concat();
        let c = walk_ext(FRAGMENT, &data);
        assert_eq!((c.fragment_headers, c.fragment.unwrap().ident), (2, 1));
        assert!(c.fragmented);
        assert_eq!(c.upper(), Some((UDP, 16)));
    }

    #[test]
    fn never_panics() {
        let data = [
            opts(ROUTING, 0),
            opts(AH, 0),
            vec![DSTOPTS, 1, 0, 0, 0, 0, 0, 0],
            opts(FRAGMENT, 0),
            frag(UDP, 0x0011, 3),
        ]
        .concat();
        for first in [HOPOPTS, FRAGMENT, AH] {
            for cut in 0..=data.len() {
                let c = walk_ext(first, &data[..cut]);
                assert!(c.headers <= MAX_EXT_HEADERS);
                if let Some((_, off)) = c.upper() {
                    assert!(off <= cut);
                }
            }
        }
    }
}
