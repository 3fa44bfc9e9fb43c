//! Packet parsing for the tracker: a frame and its flow key into the
//! connection key, TCP segment and ICMP error payload the tracker needs, or
//! the reason the packet cannot be tracked (`+inv`). Every header is read
//! through the wire layer's checked views ([`crate::wire`]), IPv6 extension
//! headers with its one chain walk; the module denies
//! `clippy::indexing_slicing`, and nothing here panics on a malformed frame.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::net::Ipv4Addr;

use super::state::{ConnKey, TCP_MAX_WSCALE, WS_FLAG};
use crate::field::{tcp_flags as tf, Field};
use crate::key::FlowKey;
use crate::wire::icmp::{self, IcmpPacket};
use crate::wire::ipv4::{self, Ipv4Packet};
use crate::wire::ipv6::{self, ExtEnd, Ipv6Packet};
use crate::wire::tcp::{self, TcpPacket};
use crate::wire::udp::{self, SctpPacket, UdpPacket};
use crate::wire::{ethernet, ethertype, ip_proto};

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

pub(super) fn v4_mapped(a: u32) -> [u8; 16] {
    Ipv4Addr::from(a).to_ipv6_mapped().octets()
}

/// Key fields read at their width (`nw_proto` 8 bits, ports and TCP flags
/// 16, IPv4 addresses 32). The key never holds more bits in a field than
/// the field's width, so the casts lose nothing.
#[allow(
    clippy::cast_possible_truncation,
    reason = "key fields are no wider than the type read"
)]
mod key_field {
    use super::{Field, FlowKey};

    pub(super) fn u8(key: &FlowKey, f: Field) -> u8 {
        key.get(f) as u8
    }

    pub(super) fn u16(key: &FlowKey, f: Field) -> u16 {
        key.get(f) as u16
    }

    pub(super) fn u32(key: &FlowKey, f: Field) -> u32 {
        key.get(f) as u32
    }
}

/// An IPv4 header at the start of `b` as the tracker needs it: version 4,
/// IHL >= 5, the whole header (options included) in `b`.
pub(super) fn ipv4_header(b: &[u8]) -> Result<Ipv4Packet<'_>, Untrackable> {
    let ip = Ipv4Packet::new_checked(b).map_err(|_| Untrackable::Truncated)?;
    if ip.version() != 4 || ip.header_len() < ipv4::HEADER_LEN {
        return Err(Untrackable::BadHeader);
    }
    if ip.header().is_none() {
        return Err(Untrackable::Truncated);
    }
    Ok(ip)
}

/// The upper-layer protocol after the IPv6 extension headers in `ext` (the
/// bytes after the fixed header) and its offset in `ext`, by the wire
/// layer's chain walk ([`ipv6::walk_ext`]). Any Fragment header is refused
/// (atomic fragments included); a truncated chain is `Truncated`, one
/// longer than the walk's bound `BadHeader`.
pub(super) fn ipv6_upper(next: u8, ext: &[u8]) -> Result<(u8, usize), Untrackable> {
    let chain = ipv6::walk_ext(next, ext);
    if chain.fragment.is_some() {
        return Err(Untrackable::Fragment);
    }
    match chain.end {
        ExtEnd::Upper {
            next_header,
            offset,
        } => Ok((next_header, offset)),
        ExtEnd::LaterFragment { .. } => Err(Untrackable::Fragment),
        ExtEnd::Truncated { .. } => Err(Untrackable::Truncated),
        ExtEnd::TooLong { .. } => Err(Untrackable::BadHeader),
    }
}

/// The window-scale option of a TCP header (`WS_FLAG | shift`, or 0).
pub(super) fn tcp_wscale(opts: &[u8]) -> u8 {
    let mut i = 0;
    while let Some(&kind) = opts.get(i) {
        match kind {
            tcp::option::END => break,
            tcp::option::NOP => i += 1,
            _ => {
                let Some(&len) = opts.get(i + 1) else { break };
                if len < 2 {
                    break;
                }
                if kind == tcp::option::WINDOW_SCALE && len == tcp::option::WINDOW_SCALE_LEN {
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
    use icmp::v4::*;
    Some(match t {
        ECHO_REQUEST => ECHO_REPLY,
        ECHO_REPLY => ECHO_REQUEST,
        TIMESTAMP => TIMESTAMP_REPLY,
        TIMESTAMP_REPLY => TIMESTAMP,
        INFO_REQUEST => INFO_REPLY,
        INFO_REPLY => INFO_REQUEST,
        _ => return None,
    })
}

pub(super) fn icmp6_reverse_query(t: u8) -> Option<u8> {
    use icmp::v6::*;
    Some(match t {
        ECHO_REQUEST => ECHO_REPLY,
        ECHO_REPLY => ECHO_REQUEST,
        _ => return None,
    })
}

/// Parses the packet: the key comes from `key`, lengths and L4 details from
/// `frame` (see the module doc).
pub(super) fn parse(frame: &[u8], key: &FlowKey, zone: u16) -> Result<Pkt, Untrackable> {
    // The same VLAN tags the flow key extractor skipped.
    let l2 = ethernet::l2_of(frame).ok_or(Untrackable::Truncated)?;
    let ethertype = l2.ethertype;
    if u128::from(ethertype) != key.get(Field::DlType) {
        return Err(
            if ethertype == ethertype::IPV4 || ethertype == ethertype::IPV6 {
                Untrackable::KeyMismatch
            } else {
                Untrackable::NotIp
            },
        );
    }
    if key.get(Field::NwFrag) != 0 {
        return Err(Untrackable::Fragment);
    }
    let l3 = l2.payload;
    let key_proto = key_field::u8(key, Field::NwProto);
    let (v6, proto, l4, src, dst) = match ethertype {
        ethertype::IPV4 => {
            let ip = ipv4_header(l3)?;
            if ip.flags_frag() & (ipv4::FLAG_MF | ipv4::FRAG_OFFSET_MASK) != 0 {
                return Err(Untrackable::Fragment);
            }
            let (ihl, tot) = (ip.header_len(), usize::from(ip.total_len()));
            if tot < ihl {
                return Err(Untrackable::BadHeader);
            }
            // Bytes beyond the total length are Ethernet padding.
            let l4 = l3.get(ihl..tot).ok_or(Untrackable::Truncated)?;
            let src = v4_mapped(key_field::u32(key, Field::NwSrc));
            let dst = v4_mapped(key_field::u32(key, Field::NwDst));
            (false, ip.protocol(), l4, src, dst)
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(l3).map_err(|_| Untrackable::Truncated)?;
            if ip.version() != 6 {
                return Err(Untrackable::BadHeader);
            }
            if ip.payload_len() == 0 {
                // Jumbogram or empty: nothing to track.
                return Err(Untrackable::BadHeader);
            }
            let payload = ip.payload().ok_or(Untrackable::Truncated)?;
            let (proto, l4off) = ipv6_upper(ip.next_header(), payload)?;
            let l4 = payload.get(l4off..).ok_or(Untrackable::Truncated)?;
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
    let tp_src = key_field::u16(key, Field::TpSrc);
    let tp_dst = key_field::u16(key, Field::TpDst);
    let kind = match proto {
        ip_proto::TCP => {
            let t = TcpPacket::new_checked(l4).map_err(|_| Untrackable::Truncated)?;
            if t.header_len() < tcp::HEADER_LEN {
                return Err(Untrackable::BadHeader);
            }
            let opts = t.options().ok_or(Untrackable::Truncated)?;
            let payload = t.payload().ok_or(Untrackable::Truncated)?;
            if tp_src == 0 || tp_dst == 0 {
                return Err(Untrackable::ZeroPort);
            }
            ck.sport = tp_src;
            ck.dport = tp_dst;
            let flags = key_field::u16(key, Field::TcpFlags);
            PktKind::Tcp(TcpSeg {
                flags,
                seq: t.seq(),
                ack: t.ack(),
                win: t.window(),
                wscale: if flags & tf::SYN != 0 {
                    tcp_wscale(opts)
                } else {
                    0
                },
                // At most 65535: an IP length field bounds it.
                payload: u32::try_from(payload.len()).unwrap_or(u32::MAX),
            })
        }
        ip_proto::UDP | ip_proto::SCTP => {
            if proto == ip_proto::UDP {
                let u = UdpPacket::new_checked(l4).map_err(|_| Untrackable::Truncated)?;
                let ulen = usize::from(u.len());
                if ulen < udp::HEADER_LEN || ulen > l4.len() {
                    return Err(Untrackable::BadHeader);
                }
            } else {
                SctpPacket::new_checked(l4).map_err(|_| Untrackable::Truncated)?;
            }
            if tp_src == 0 || tp_dst == 0 {
                return Err(Untrackable::ZeroPort);
            }
            ck.sport = tp_src;
            ck.dport = tp_dst;
            PktKind::Other
        }
        ip_proto::ICMP if !v6 => {
            use icmp::v4::*;
            let i = IcmpPacket::new_checked(l4).map_err(|_| Untrackable::Truncated)?;
            // Type and code as the key has them (the frame's own, unless a
            // flow rewrote them).
            let (t, code) = (
                key_field::u8(key, Field::TpSrc),
                key_field::u8(key, Field::TpDst),
            );
            match t {
                ECHO_REPLY | ECHO_REQUEST | TIMESTAMP | TIMESTAMP_REPLY | INFO_REQUEST
                | INFO_REPLY => {
                    if code != 0 {
                        return Err(Untrackable::UnsupportedIcmp);
                    }
                    let id = i.ident();
                    ck.sport = id;
                    ck.dport = id;
                    ck.stype = t;
                    ck.dtype = icmp4_reverse_query(t).ok_or(Untrackable::UnsupportedIcmp)?;
                    PktKind::IcmpQuery {
                        may_start: matches!(t, ECHO_REQUEST | TIMESTAMP | INFO_REQUEST),
                    }
                }
                t if is_error(t) => {
                    ck = inner_key(i.payload(), &ck)?;
                    PktKind::Related
                }
                _ => return Err(Untrackable::UnsupportedIcmp),
            }
        }
        ip_proto::ICMPV6 if v6 => {
            use icmp::v6::*;
            let i = IcmpPacket::new_checked(l4).map_err(|_| Untrackable::Truncated)?;
            let (t, code) = (
                key_field::u8(key, Field::TpSrc),
                key_field::u8(key, Field::TpDst),
            );
            match t {
                ECHO_REQUEST | ECHO_REPLY => {
                    if code != 0 {
                        return Err(Untrackable::UnsupportedIcmp);
                    }
                    let id = i.ident();
                    ck.sport = id;
                    ck.dport = id;
                    ck.stype = t;
                    ck.dtype = icmp6_reverse_query(t).ok_or(Untrackable::UnsupportedIcmp)?;
                    PktKind::IcmpQuery {
                        may_start: t == ECHO_REQUEST,
                    }
                }
                DST_UNREACHABLE | PKT_TOO_BIG | TIME_EXCEEDED | PARAM_PROBLEM => {
                    ck = inner_key(i.payload(), &ck)?;
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
    fn bad<E>(_: E) -> Untrackable {
        Untrackable::BadInner
    }
    let (proto, l4, src, dst) = if outer.v6 {
        let ip = Ipv6Packet::new_checked(b).map_err(bad)?;
        if ip.version() != 6 {
            return Err(Untrackable::BadInner);
        }
        // The quote is usually cut short: walk what there is of it.
        let (proto, off) = ipv6_upper(ip.next_header(), ip.rest()).map_err(bad)?;
        (
            proto,
            ip.rest().get(off..).ok_or(Untrackable::BadInner)?,
            ip.src().to_be_bytes(),
            ip.dst().to_be_bytes(),
        )
    } else {
        let ip = ipv4_header(b).map_err(bad)?;
        if ip.flags_frag() & ipv4::FRAG_OFFSET_MASK != 0 {
            return Err(Untrackable::BadInner);
        }
        (
            ip.protocol(),
            b.get(ip.header_len()..).ok_or(Untrackable::BadInner)?,
            v4_mapped(ip.src()),
            v4_mapped(ip.dst()),
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
    let min = if outer.v6 && proto == ip_proto::TCP {
        tcp::HEADER_LEN
    } else {
        8
    };
    match proto {
        ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP => {
            if l4.len() < min {
                return Err(Untrackable::BadInner);
            }
            (k.sport, k.dport) = udp::ports(l4).ok_or(Untrackable::BadInner)?;
            if k.sport == 0 || k.dport == 0 {
                return Err(Untrackable::BadInner);
            }
        }
        ip_proto::ICMP | ip_proto::ICMPV6 => {
            if (proto == ip_proto::ICMPV6) != outer.v6 {
                return Err(Untrackable::BadInner);
            }
            let i = IcmpPacket::new_checked(l4).map_err(bad)?;
            let t = i.msg_type();
            let rev = if outer.v6 {
                icmp6_reverse_query(t)
            } else {
                icmp4_reverse_query(t)
            };
            let rev = rev.ok_or(Untrackable::BadInner)?;
            if i.code() != 0 {
                return Err(Untrackable::BadInner);
            }
            let id = i.ident();
            k.sport = id;
            k.dport = id;
            k.stype = t;
            k.dtype = rev;
        }
        _ => {}
    }
    Ok(k.reverse())
}
