//! # The wire layer: header formats, checked views, one IPv6 chain walk
//!
//! Every parser of untrusted frames in oxvs reads headers through this
//! module: the flow key extractor ([`crate::extract`]), header rewrites
//! ([`crate::packet`]), conntrack's packet parser, fragment reassembly
//! ([`crate::ipf`]) and the switch's VXLAN port. Each ethertype, protocol
//! number and byte offset is written down once, here.
//!
//! The layout follows smoltcp's `src/wire/`:
//!
//! - **Numbers.** [`ethertype`] (IPv4, ARP, RARP, IPv6, the 802.1Q and
//!   802.1ad TPIDs) and [`ip_proto`] (IP protocol numbers, which include the
//!   IPv6 extension header numbers: one number space).
//! - **One module per header** ([`ethernet`] with VLAN tags and LLC/SNAP,
//!   [`arp`], [`ipv4`], [`ipv6`] with its extension headers, [`tcp`],
//!   [`udp`] (UDP and SCTP), [`icmp`] (ICMP, ICMPv6, IGMP), [`vxlan`]), each
//!   with `HEADER_LEN`, a `pub mod field` of byte offsets as named ranges
//!   relative to the header's first byte (the writers in [`crate::packet`]
//!   and the switch use them too), and a **view**: a struct over `&[u8]`
//!   whose `new_checked` returns [`Error::Truncated`] when the buffer is
//!   shorter than the header's fixed part, and whose getters read named
//!   offsets.
//! - **One IPv6 extension header walk**, [`ipv6::walk_ext`], with one bound
//!   ([`ipv6::MAX_EXT_HEADERS`]) and one answer for fragments, ESP, No Next
//!   Header and truncated chains; and one VLAN tag walk,
//!   [`ethernet::EthernetFrame::skip_vlan_tags`] (at most
//!   [`ethernet::MAX_VLAN_TAGS`]).
//!
//! ## What a view checks, and what it leaves to the caller
//!
//! `new_checked` checks exactly one thing: the fixed-size header is inside
//! the buffer. Length fields (IPv4 IHL and total length, IPv6 payload
//! length, TCP data offset, UDP length) are *reported*, not enforced: what
//! to do with an inconsistent one differs between callers (the extractor
//! gives up on an IPv4 packet longer than the frame, header rewrites still
//! write the fields that are there, conntrack calls it untrackable), so the
//! variable parts come from getters that return `Option`.
//!
//! ## No-panic contract
//!
//! Nothing here panics on any input: the module denies
//! `clippy::indexing_slicing`. A view holds its fixed header as an array
//! reference (`&[u8; HEADER_LEN]`), so after the one length check in
//! `new_checked` every getter reads a constant range of an array: the
//! compiler resolves the bounds statically and the getters compile to plain
//! loads (the key extractor runs on them per packet; `bench/benches/extract.rs`
//! measures it). Variable parts use `get`.
//!
//! Views are read-only and `Copy`; nothing here allocates.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use core::ops::Range;

pub mod arp;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod nd;
pub mod tcp;
pub mod udp;
pub mod vxlan;

/// Why a view could not be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer is shorter than the header's fixed part.
    #[error("buffer too short for the header")]
    Truncated,
}

/// Ethertypes (the Ethernet type field, and the TPID of a VLAN tag).
pub mod ethertype {
    /// Smallest value that is an ethertype; below it the field is an 802.3
    /// length.
    pub const MIN: u16 = 0x0600;
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const RARP: u16 = 0x8035;
    pub const IPV6: u16 = 0x86dd;
    /// 802.1Q customer VLAN tag (C-tag).
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad service VLAN tag (S-tag, "QinQ").
    pub const QINQ: u16 = 0x88a8;
}

/// IP protocol numbers (IPv4 protocol, IPv6 next header). IPv6 extension
/// headers share the number space; [`ipv6::is_ext_header`] says which of
/// them the chain walk steps over.
pub mod ip_proto {
    /// IPv6 Hop-by-Hop Options (extension header).
    pub const HOPOPTS: u8 = 0;
    pub const ICMP: u8 = 1;
    pub const IGMP: u8 = 2;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const DCCP: u8 = 33;
    /// IPv6 Routing header (extension header).
    pub const ROUTING: u8 = 43;
    /// IPv6 Fragment header (extension header).
    pub const FRAGMENT: u8 = 44;
    /// Encapsulating Security Payload: what follows is encrypted, so an
    /// extension header chain ends here.
    pub const ESP: u8 = 50;
    /// Authentication Header (extension header; its length is in 4-byte
    /// units).
    pub const AH: u8 = 51;
    pub const ICMPV6: u8 = 58;
    /// IPv6 No Next Header: nothing follows.
    pub const NO_NEXT_HEADER: u8 = 59;
    /// IPv6 Destination Options (extension header).
    pub const DSTOPTS: u8 = 60;
    pub const SCTP: u8 = 132;
    /// Mobility header (RFC 6275). An extension header by IANA's list, but
    /// like OVS and Linux conntrack the walk treats it as the upper layer.
    pub const MOBILITY: u8 = 135;
    pub const UDPLITE: u8 = 136;
}

// ---------------------------------------------------------------------------
// Checked reads. Views pass their fixed-size header arrays and constant
// ranges, so after inlining the `get` calls are resolved at compile time; the
// zero fallbacks are dead code that exists so that no read can panic.

#[inline(always)]
fn u8_at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

#[inline(always)]
fn u16_at(b: &[u8], r: Range<usize>) -> u16 {
    match b.get(r) {
        Some(&[x, y]) => u16::from_be_bytes([x, y]),
        _ => 0,
    }
}

#[inline(always)]
fn u32_at(b: &[u8], r: Range<usize>) -> u32 {
    match b.get(r) {
        Some(&[x0, x1, x2, x3]) => u32::from_be_bytes([x0, x1, x2, x3]),
        _ => 0,
    }
}

/// A 6-byte MAC address as a 48-bit big-endian integer (the flow key's form).
#[inline(always)]
fn mac_at(b: &[u8], r: Range<usize>) -> u64 {
    match b.get(r) {
        Some(&[x0, x1, x2, x3, x4, x5]) => u64::from_be_bytes([0, 0, x0, x1, x2, x3, x4, x5]),
        _ => 0,
    }
}

#[inline(always)]
fn bytes_at<const N: usize>(b: &[u8], r: Range<usize>) -> [u8; N] {
    match b.get(r).and_then(|s| <[u8; N]>::try_from(s).ok()) {
        Some(a) => a,
        None => [0; N],
    }
}

#[inline(always)]
fn u128_at(b: &[u8], r: Range<usize>) -> u128 {
    u128::from_be_bytes(bytes_at::<16>(b, r))
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn reads_out_of_range_are_zero() {
        let b = [1u8, 2, 3];
        assert_eq!(u8_at(&b, 3), 0);
        assert_eq!(u16_at(&b, 1..3), 0x0203);
        assert_eq!(u16_at(&b, 2..4), 0);
        assert_eq!(u32_at(&b, 0..4), 0);
        assert_eq!(mac_at(&b, 0..6), 0);
        assert_eq!(u128_at(&b, 0..16), 0);
        assert_eq!(bytes_at::<2>(&b, 0..2), [1, 2]);
    }
}
