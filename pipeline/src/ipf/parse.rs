//! Parsing one fragment for the reassembler: the checks of the module doc's
//! "Drop reasons" that need only the fragment itself. Every header is read
//! through the wire layer's checked views ([`crate::wire`]); IPv6 extension
//! headers with its one chain walk ([`ipv6::walk_ext`]). The module denies
//! `clippy::indexing_slicing`: nothing here panics on a malformed frame.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use super::{checksum, DgramKey, IpfConfig, IpfDrop};
use crate::field::Field;
use crate::key::FlowKey;
use crate::wire::ipv4::Ipv4Packet;
use crate::wire::ipv6::{self, ExtEnd, Ipv6Packet};
use crate::wire::{ethernet, ethertype, icmp, ip_proto, tcp, udp};

/// A parsed fragment. Offsets are from the start of the frame.
#[derive(Clone, Copy, Debug)]
pub(super) struct Parsed {
    pub(super) key: DgramKey,
    /// The L3 header.
    pub(super) l3: u32,
    /// The fragment's data (after the IPv4 header, or the IPv6 Fragment
    /// header).
    pub(super) data: u32,
    /// IPv6: the Next Header byte that names the Fragment header.
    pub(super) nh_at: u32,
    /// What the reassembled length field counts besides the data: IPv4 IHL,
    /// IPv6 unfragmentable extension header bytes.
    pub(super) base: u32,
    pub(super) start: u32,
    pub(super) end: u32,
    pub(super) more: bool,
}

/// A length or offset as `u32`: every one here is bounded by a 16-bit IP
/// length field (or by the frame), so the error is for show.
fn len32(n: usize) -> Result<u32, IpfDrop> {
    u32::try_from(n).map_err(|_| IpfDrop::Malformed)
}

/// Smallest L4 header a first fragment must hold (0: unchecked).
fn l4_min(proto: u8) -> usize {
    match proto {
        ip_proto::TCP => tcp::HEADER_LEN,
        ip_proto::UDP => udp::HEADER_LEN,
        ip_proto::ICMP | ip_proto::ICMPV6 => icmp::HEADER_LEN,
        ip_proto::SCTP => udp::sctp::HEADER_LEN,
        _ => 0,
    }
}

/// Parses and checks one fragment (see the module doc for the checks).
pub(super) fn parse(
    frame: &[u8],
    key: &FlowKey,
    zone: u16,
    cfg: &IpfConfig,
) -> Result<Parsed, IpfDrop> {
    use IpfDrop::Malformed;

    // The same VLAN tags the flow key extractor skipped.
    let l2 = ethernet::l2_of(frame).ok_or(Malformed)?;
    if key.get(Field::DlType) != u128::from(l2.ethertype) {
        return Err(Malformed);
    }
    let ip = l2.payload;
    let mut p = match l2.ethertype {
        ethertype::IPV4 => parse_ipv4(ip, zone, cfg)?,
        ethertype::IPV6 => parse_ipv6(ip, zone)?,
        _ => return Err(IpfDrop::NotAFragment),
    };
    let l3 = len32(l2.l3_offset)?;
    p.l3 = l3;
    p.data += l3;
    p.nh_at += l3;

    let payload = (p.end - p.start) as usize;
    if p.more && (!payload.is_multiple_of(8) || payload < cfg.min_frag_payload.max(8)) {
        return Err(IpfDrop::TooSmall);
    }
    if payload == 0 {
        return Err(Malformed);
    }
    Ok(p)
}

/// Parses an IPv4 fragment; offsets in the result are relative to `ip`.
fn parse_ipv4(ip: &[u8], zone: u16, cfg: &IpfConfig) -> Result<Parsed, IpfDrop> {
    use IpfDrop::Malformed;

    let h = Ipv4Packet::new_checked(ip).map_err(|_| Malformed)?;
    if h.version() != 4 {
        return Err(Malformed);
    }
    // IHL >= 5 and IHL <= total length <= bytes present.
    let payload = h.payload().ok_or(Malformed)?.len();
    let header = h.header().ok_or(Malformed)?;
    let ihl = header.len();
    let more = h.more_frags();
    let start = h.frag_offset();
    if !more && start == 0 {
        return Err(IpfDrop::NotAFragment);
    }
    if cfg.verify_ipv4_checksum && checksum(header) != 0 {
        return Err(IpfDrop::BadChecksum);
    }
    if h.dont_frag() {
        return Err(Malformed);
    }
    let proto = h.protocol();
    if (start == 0 && payload < l4_min(proto)) || (start == 8 && proto == ip_proto::TCP) {
        return Err(IpfDrop::TinyFirstFragment);
    }
    Ok(Parsed {
        key: DgramKey {
            src: u128::from(h.src()),
            dst: u128::from(h.dst()),
            id: u32::from(h.ident()),
            zone,
            proto,
            ipv6: false,
        },
        l3: 0,
        data: len32(ihl)?,
        nh_at: 0,
        base: len32(ihl)?,
        start,
        end: start + len32(payload)?,
        more,
    })
}

/// Parses an IPv6 fragment; offsets in the result are relative to `ip`.
fn parse_ipv6(ip: &[u8], zone: u16) -> Result<Parsed, IpfDrop> {
    use IpfDrop::Malformed;

    let h = Ipv6Packet::new_checked(ip).map_err(|_| Malformed)?;
    if h.version() != 6 {
        return Err(Malformed);
    }
    let payload = h.payload().ok_or(Malformed)?;

    // One walk: the unfragmentable part up to the Fragment header, and in
    // a first fragment on through the fragmentable part's headers.
    let chain = ipv6::walk_ext(h.next_header(), payload);
    let Some(frag) = chain.fragment else {
        return Err(match chain.end {
            // The chain ended without a Fragment header.
            ExtEnd::Upper { .. } => IpfDrop::NotAFragment,
            // Cut short, or longer than the bound, before one.
            _ => Malformed,
        });
    };
    let start = frag.offset();
    let more = frag.more();
    if frag.is_atomic() {
        // An atomic fragment (RFC 6946) is a whole datagram.
        return Err(IpfDrop::NotAFragment);
    }
    let data = frag.at + ipv6::EXT_MIN_LEN;
    let frag_data = payload.get(data..).ok_or(Malformed)?;

    if start == 0 {
        // RFC 7112: the first fragment holds the whole extension header
        // chain and the upper-layer header; one Fragment header only.
        if chain.fragment_headers > 1 {
            return Err(Malformed);
        }
        match chain.end {
            ExtEnd::Upper {
                next_header,
                offset,
            } => {
                let l4 = payload.get(offset..).map_or(0, <[u8]>::len);
                if l4 < l4_min(next_header) {
                    return Err(IpfDrop::TinyFirstFragment);
                }
            }
            ExtEnd::Truncated { .. } => return Err(IpfDrop::TinyFirstFragment),
            ExtEnd::LaterFragment { .. } | ExtEnd::TooLong { .. } => return Err(Malformed),
        }
    } else if start == 8 && frag.next_header == ip_proto::TCP {
        return Err(IpfDrop::TinyFirstFragment);
    }

    let fixed = ipv6::HEADER_LEN;
    Ok(Parsed {
        key: DgramKey {
            src: h.src(),
            dst: h.dst(),
            id: frag.ident,
            zone,
            proto: frag.next_header,
            ipv6: true,
        },
        l3: 0,
        data: len32(fixed + data)?,
        nh_at: len32(
            frag.named_by
                .map_or(ipv6::field::NEXT_HEADER, |at| fixed + at),
        )?,
        base: len32(frag.at)?,
        start,
        end: start + len32(frag_data.len())?,
        more,
    })
}
