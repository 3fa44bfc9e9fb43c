//! Packet parsing for the tracker: a frame and its flow key into the
//! connection key, TCP segment and ICMP error payload the tracker needs, or
//! the reason the packet cannot be tracked (`+inv`). Every read is bounds
//! checked; nothing here panics on a malformed frame.

use std::net::Ipv4Addr;

use super::state::{ConnKey, TCP_MAX_WSCALE, WS_FLAG};
use super::{
    ETH_TYPE_IPV4, ETH_TYPE_IPV6, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_SCTP, IPPROTO_TCP,
    IPPROTO_UDP,
};
use crate::field::{tcp_flags as tf, Field};
use crate::key::FlowKey;

/// Why a packet could not be tracked (kept for debugging; every one is `+inv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Untrackable {
    NotIp,
    KeyMismatch,
    Truncated,
    BadHeader,
    Fragment,
    ZeroPort,
    UnsupportedIcmp,
    BadInner,
}

/// What the TCP state machine needs from a segment.
#[derive(Clone, Copy, Debug)]
pub(super) struct TcpSeg {
    pub(super) flags: u16,
    pub(super) seq: u32,
    pub(super) ack: u32,
    pub(super) win: u16,
    /// `WS_FLAG | shift` if the segment carries a window-scale option.
    pub(super) wscale: u8,
    pub(super) payload: u32,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum PktKind {
    Tcp(TcpSeg),
    /// ICMP/ICMPv6 query message (`may_start`: a request, which may create a
    /// connection).
    IcmpQuery {
        may_start: bool,
    },
    /// ICMP error; the packet's key is the reversed embedded header.
    Related,
    /// UDP, SCTP, other protocols.
    Other,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Pkt {
    pub(super) key: ConnKey,
    pub(super) kind: PktKind,
}

pub(super) fn be16(b: &[u8], off: usize) -> Option<u16> {
    let s: [u8; 2] = b.get(off..off.checked_add(2)?)?.try_into().ok()?;
    Some(u16::from_be_bytes(s))
}

pub(super) fn be32(b: &[u8], off: usize) -> Option<u32> {
    let s: [u8; 4] = b.get(off..off.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_be_bytes(s))
}

pub(super) fn byte(b: &[u8], off: usize) -> Option<u8> {
    b.get(off).copied()
}

pub(super) fn addr16(b: &[u8], off: usize) -> Option<[u8; 16]> {
    b.get(off..off.checked_add(16)?)?.try_into().ok()
}

pub(super) fn v4_mapped(a: u32) -> [u8; 16] {
    Ipv4Addr::from(a).to_ipv6_mapped().octets()
}

/// An IPv4 header at the start of `b`: (header length, protocol, src, dst,
/// total length, fragment offset/flags word).
pub(super) fn ipv4_header(b: &[u8]) -> Result<(usize, u8, u32, u32, usize, u16), Untrackable> {
    let vihl = byte(b, 0).ok_or(Untrackable::Truncated)?;
    if vihl >> 4 != 4 {
        return Err(Untrackable::BadHeader);
    }
    let ihl = usize::from(vihl & 0x0f) * 4;
    if ihl < 20 {
        return Err(Untrackable::BadHeader);
    }
    if b.len() < ihl {
        return Err(Untrackable::Truncated);
    }
    let tot = usize::from(be16(b, 2).ok_or(Untrackable::Truncated)?);
    let frag = be16(b, 6).ok_or(Untrackable::Truncated)?;
    let proto = byte(b, 9).ok_or(Untrackable::Truncated)?;
    let src = be32(b, 12).ok_or(Untrackable::Truncated)?;
    let dst = be32(b, 16).ok_or(Untrackable::Truncated)?;
    Ok((ihl, proto, src, dst, tot, frag))
}

/// Skips IPv6 extension headers starting at `off` with next header `next`;
/// returns the upper-layer protocol and its offset. Fragments are refused.
pub(super) fn ipv6_upper(
    b: &[u8],
    mut next: u8,
    mut off: usize,
) -> Result<(u8, usize), Untrackable> {
    loop {
        let len = match next {
            // Hop-by-hop, routing, destination options.
            0 | 43 | 60 => (usize::from(byte(b, off + 1).ok_or(Untrackable::Truncated)?) + 1) * 8,
            // Authentication header.
            51 => (usize::from(byte(b, off + 1).ok_or(Untrackable::Truncated)?) + 2) * 4,
            44 => return Err(Untrackable::Fragment),
            _ => return Ok((next, off)),
        };
        next = byte(b, off).ok_or(Untrackable::Truncated)?;
        off += len;
        if off > b.len() {
            return Err(Untrackable::Truncated);
        }
    }
}

/// The window-scale option of a TCP header (`WS_FLAG | shift`, or 0).
pub(super) fn tcp_wscale(opts: &[u8]) -> u8 {
    let mut i = 0;
    while let Some(&kind) = opts.get(i) {
        match kind {
            0 => break,
            1 => i += 1,
            _ => {
                let Some(&len) = opts.get(i + 1) else { break };
                if len < 2 {
                    break;
                }
                if kind == 3 && len == 3 {
                    if let Some(&shift) = opts.get(i + 2) {
                        return WS_FLAG | shift.min(TCP_MAX_WSCALE);
                    }
                }
                i += usize::from(len);
            }
        }
    }
    0
}

pub(super) fn icmp4_reverse_query(t: u8) -> Option<u8> {
    Some(match t {
        8 => 0,
        0 => 8,
        13 => 14,
        14 => 13,
        15 => 16,
        16 => 15,
        _ => return None,
    })
}

pub(super) fn icmp6_reverse_query(t: u8) -> Option<u8> {
    Some(match t {
        128 => 129,
        129 => 128,
        _ => return None,
    })
}

/// Parses the packet: the key comes from `key`, lengths and L4 details from
/// `frame` (see the module doc).
pub(super) fn parse(frame: &[u8], key: &FlowKey, zone: u16) -> Result<Pkt, Untrackable> {
    let mut ethertype = be16(frame, 12).ok_or(Untrackable::Truncated)?;
    let mut off = 14;
    while matches!(ethertype, 0x8100 | 0x88a8 | 0x9100) {
        ethertype = be16(frame, off + 2).ok_or(Untrackable::Truncated)?;
        off += 4;
    }
    if u128::from(ethertype) != key.get(Field::DlType) {
        return Err(
            if ethertype == ETH_TYPE_IPV4 || ethertype == ETH_TYPE_IPV6 {
                Untrackable::KeyMismatch
            } else {
                Untrackable::NotIp
            },
        );
    }
    if key.get(Field::NwFrag) != 0 {
        return Err(Untrackable::Fragment);
    }
    let l3 = frame.get(off..).ok_or(Untrackable::Truncated)?;
    let key_proto = key.get(Field::NwProto) as u8;
    let (v6, proto, l4, src, dst) = match ethertype {
        ETH_TYPE_IPV4 => {
            let (ihl, proto, _, _, tot, frag) = ipv4_header(l3)?;
            if frag & 0x3fff != 0 {
                return Err(Untrackable::Fragment);
            }
            if tot < ihl {
                return Err(Untrackable::BadHeader);
            }
            // Bytes beyond the total length are Ethernet padding.
            let l4 = l3.get(ihl..tot).ok_or(Untrackable::Truncated)?;
            let src = v4_mapped(key.get(Field::NwSrc) as u32);
            let dst = v4_mapped(key.get(Field::NwDst) as u32);
            (false, proto, l4, src, dst)
        }
        ETH_TYPE_IPV6 => {
            if byte(l3, 0).ok_or(Untrackable::Truncated)? >> 4 != 6 {
                return Err(Untrackable::BadHeader);
            }
            let plen = usize::from(be16(l3, 4).ok_or(Untrackable::Truncated)?);
            if plen == 0 {
                // Jumbogram or empty: nothing to track.
                return Err(Untrackable::BadHeader);
            }
            let ip = l3.get(..40 + plen).ok_or(Untrackable::Truncated)?;
            let next = byte(ip, 6).ok_or(Untrackable::Truncated)?;
            let (proto, l4off) = ipv6_upper(ip, next, 40)?;
            let l4 = ip.get(l4off..).ok_or(Untrackable::Truncated)?;
            let src = key.get(Field::Ipv6Src).to_be_bytes();
            let dst = key.get(Field::Ipv6Dst).to_be_bytes();
            (true, proto, l4, src, dst)
        }
        _ => return Err(Untrackable::NotIp),
    };
    if proto != key_proto {
        return Err(Untrackable::KeyMismatch);
    }
    let mut ck = ConnKey {
        src,
        dst,
        sport: 0,
        dport: 0,
        zone,
        v6,
        proto,
        stype: 0,
        dtype: 0,
    };
    let tp_src = key.get(Field::TpSrc) as u16;
    let tp_dst = key.get(Field::TpDst) as u16;
    let kind = match proto {
        IPPROTO_TCP => {
            let doff = usize::from(byte(l4, 12).ok_or(Untrackable::Truncated)? >> 4) * 4;
            if doff < 20 {
                return Err(Untrackable::BadHeader);
            }
            let opts = l4.get(20..doff).ok_or(Untrackable::Truncated)?;
            if tp_src == 0 || tp_dst == 0 {
                return Err(Untrackable::ZeroPort);
            }
            ck.sport = tp_src;
            ck.dport = tp_dst;
            let flags = key.get(Field::TcpFlags) as u16;
            PktKind::Tcp(TcpSeg {
                flags,
                seq: be32(l4, 4).ok_or(Untrackable::Truncated)?,
                ack: be32(l4, 8).ok_or(Untrackable::Truncated)?,
                win: be16(l4, 14).ok_or(Untrackable::Truncated)?,
                wscale: if flags & tf::SYN != 0 {
                    tcp_wscale(opts)
                } else {
                    0
                },
                payload: (l4.len() - doff) as u32,
            })
        }
        IPPROTO_UDP | IPPROTO_SCTP => {
            let min = if proto == IPPROTO_UDP { 8 } else { 12 };
            if l4.len() < min {
                return Err(Untrackable::Truncated);
            }
            if proto == IPPROTO_UDP {
                let ulen = usize::from(be16(l4, 4).ok_or(Untrackable::Truncated)?);
                if ulen < 8 || ulen > l4.len() {
                    return Err(Untrackable::BadHeader);
                }
            }
            if tp_src == 0 || tp_dst == 0 {
                return Err(Untrackable::ZeroPort);
            }
            ck.sport = tp_src;
            ck.dport = tp_dst;
            PktKind::Other
        }
        IPPROTO_ICMP if !v6 => {
            if l4.len() < 8 {
                return Err(Untrackable::Truncated);
            }
            let (t, code) = (tp_src as u8, tp_dst as u8);
            match t {
                0 | 8 | 13 | 14 | 15 | 16 => {
                    if code != 0 {
                        return Err(Untrackable::UnsupportedIcmp);
                    }
                    let id = be16(l4, 4).ok_or(Untrackable::Truncated)?;
                    ck.sport = id;
                    ck.dport = id;
                    ck.stype = t;
                    ck.dtype = icmp4_reverse_query(t).ok_or(Untrackable::UnsupportedIcmp)?;
                    PktKind::IcmpQuery {
                        may_start: matches!(t, 8 | 13 | 15),
                    }
                }
                3 | 4 | 5 | 11 | 12 => {
                    ck = inner_key(l4.get(8..).ok_or(Untrackable::Truncated)?, &ck)?;
                    PktKind::Related
                }
                _ => return Err(Untrackable::UnsupportedIcmp),
            }
        }
        IPPROTO_ICMPV6 if v6 => {
            if l4.len() < 8 {
                return Err(Untrackable::Truncated);
            }
            let (t, code) = (tp_src as u8, tp_dst as u8);
            match t {
                128 | 129 => {
                    if code != 0 {
                        return Err(Untrackable::UnsupportedIcmp);
                    }
                    let id = be16(l4, 4).ok_or(Untrackable::Truncated)?;
                    ck.sport = id;
                    ck.dport = id;
                    ck.stype = t;
                    ck.dtype = icmp6_reverse_query(t).ok_or(Untrackable::UnsupportedIcmp)?;
                    PktKind::IcmpQuery {
                        may_start: t == 128,
                    }
                }
                1..=4 => {
                    ck = inner_key(l4.get(8..).ok_or(Untrackable::Truncated)?, &ck)?;
                    PktKind::Related
                }
                _ => return Err(Untrackable::UnsupportedIcmp),
            }
        }
        _ => PktKind::Other,
    };
    Ok(Pkt { key: ck, kind })
}

/// The key of the connection an ICMP error is about: the embedded header's
/// tuple, reversed (the error travels back towards the embedded packet's
/// sender, which must be the error's destination). `outer` gives the zone,
/// family and the error's destination.
pub(super) fn inner_key(b: &[u8], outer: &ConnKey) -> Result<ConnKey, Untrackable> {
    let bad = |_| Untrackable::BadInner;
    let (proto, l4, src, dst) = if outer.v6 {
        if byte(b, 0).ok_or(Untrackable::BadInner)? >> 4 != 6 {
            return Err(Untrackable::BadInner);
        }
        let next = byte(b, 6).ok_or(Untrackable::BadInner)?;
        let src = addr16(b, 8).ok_or(Untrackable::BadInner)?;
        let dst = addr16(b, 24).ok_or(Untrackable::BadInner)?;
        let (proto, off) = ipv6_upper(b, next, 40).map_err(bad)?;
        (proto, b.get(off..).ok_or(Untrackable::BadInner)?, src, dst)
    } else {
        let (ihl, proto, src, dst, _, frag) = ipv4_header(b).map_err(bad)?;
        if frag & 0x1fff != 0 {
            return Err(Untrackable::BadInner);
        }
        (
            proto,
            b.get(ihl..).ok_or(Untrackable::BadInner)?,
            v4_mapped(src),
            v4_mapped(dst),
        )
    };
    if src != outer.dst {
        return Err(Untrackable::BadInner);
    }
    let mut k = ConnKey {
        src,
        dst,
        sport: 0,
        dport: 0,
        zone: outer.zone,
        v6: outer.v6,
        proto,
        stype: 0,
        dtype: 0,
    };
    // The embedded L4 header: at least the 8 bytes an ICMPv4 error must
    // carry; IPv6 errors carry more, and OVS wants a whole TCP header there.
    let min = if outer.v6 && proto == IPPROTO_TCP {
        20
    } else {
        8
    };
    match proto {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP => {
            if l4.len() < min {
                return Err(Untrackable::BadInner);
            }
            k.sport = be16(l4, 0).ok_or(Untrackable::BadInner)?;
            k.dport = be16(l4, 2).ok_or(Untrackable::BadInner)?;
            if k.sport == 0 || k.dport == 0 {
                return Err(Untrackable::BadInner);
            }
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            if (proto == IPPROTO_ICMPV6) != outer.v6 || l4.len() < 8 {
                return Err(Untrackable::BadInner);
            }
            let t = byte(l4, 0).ok_or(Untrackable::BadInner)?;
            let code = byte(l4, 1).ok_or(Untrackable::BadInner)?;
            let rev = if outer.v6 {
                icmp6_reverse_query(t)
            } else {
                icmp4_reverse_query(t)
            };
            let rev = rev.ok_or(Untrackable::BadInner)?;
            if code != 0 {
                return Err(Untrackable::BadInner);
            }
            let id = be16(l4, 4).ok_or(Untrackable::BadInner)?;
            k.sport = id;
            k.dport = id;
            k.stype = t;
            k.dtype = rev;
        }
        _ => {}
    }
    Ok(k.reverse())
}
