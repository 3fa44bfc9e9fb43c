//! The ICMP errors the switch sends itself, back to the sender of a packet
//! it will not forward: one builder for all of them.
//!
//! | error | when | module that decides |
//! |---|---|---|
//! | port unreachable (ICMP type 3 code 3, ICMPv6 type 1 code 4) | a flow rejected the packet (a Service without endpoints) | [`crate::reject`] |
//! | fragmentation needed / packet too big | the packet does not fit the tunnel | [`crate::vxlan`] |
//! | time exceeded (TTL / hop limit) | `dec_ttl` found a TTL of 0 or 1 (an `invalid_ttl` packet-in) | [`crate::engine`] (`Sink::time_exceeded`) |
//!
//! An answer is a whole Ethernet frame back to the sender: the original's
//! Ethernet header with its addresses swapped (VLAN tags kept), an IPv4 or
//! IPv6 header to the packet's source, TTL (hop limit) 64, and the ICMP
//! message quoting the start of the packet as it was received.
//!
//! ## Who is not answered
//!
//! RFC 1122 3.2.2 and RFC 4443 2.4: an ICMP error never answers an ICMP
//! error (an ICMPv6 error, also behind extension headers), a non-first
//! IPv4 fragment, a source that is not a unicast address (unspecified,
//! multicast, broadcast, loopback) or a multicast or broadcast destination
//! (a Packet Too Big may answer a multicast IPv6 destination: RFC 4443
//! 2.4 (e.3)); nor a frame from a multicast Ethernet source. A header
//! the wire layer cannot read to the end (truncated, a total length past
//! the bytes on the wire, an IPv6 extension header chain it cannot walk)
//! is not answered either. Each error adds its own rule: "fragmentation
//! needed" only for IPv4 with DF; time exceeded not for a non-first IPv6
//! fragment either (its quote names no transport header, so the sender
//! could not match it to a socket).
//!
//! ## What is quoted
//!
//! IPv4 port unreachable and fragmentation needed quote the IP header and
//! 8 bytes (RFC 792), as they always have. IPv4 time exceeded quotes as
//! much as keeps the answer within 576 bytes (RFC 1812 4.3.2.3, and what
//! a Linux router sends: `icmp_send`), since it is what a traceroute
//! through the kernel path of other pod networks shows and tools that
//! compare more than the first 8 payload bytes (e.g. `tracepath`, or
//! probes with a payload signature) still match it. IPv6 errors quote as
//! much as keeps the answer within the IPv6 minimum MTU, 1280 bytes
//! (RFC 4443 2.4 (c)).
//!
//! ## Source addresses
//!
//! IPv4: the address the caller gives ([`From4::Addr`]: the switch's
//! `--icmp-src-ip`, else its tunnel's local address), or for a reject the
//! address the packet was sent to ([`From4::Destination`]: the Service
//! answers). IPv6: the EUI-64 link-local address of the MAC the sender
//! addressed (the router it believes it talks to), which the switch can
//! always name without knowing the gateway's IPv6 address.
//!
//! ## No panic
//!
//! The packet is untrusted (a pod, or another node, wrote it): every
//! header is read through the wire layer's checked views
//! (`oxvs_pipeline::wire`), the module denies `clippy::indexing_slicing`
//! and `clippy::cast_possible_truncation`, and every function returns
//! `None` rather than panic on any input. The builders run on the
//! datapath thread for the answered packets only (the exception path);
//! nothing here is on the way of a forwarded packet.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::net::{Ipv4Addr, Ipv6Addr};

use oxvs_pipeline::wire::ethernet::{self, EthernetFrame};
use oxvs_pipeline::wire::ipv4::{self, Ipv4Packet};
use oxvs_pipeline::wire::ipv6::{self, ExtEnd, Ipv6Packet};
use oxvs_pipeline::wire::{ethertype, icmp, ip_proto};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    Icmpv4Message, Icmpv4Packet, Icmpv6Message, Icmpv6Packet, IpProtocol, Ipv4Packet as SmolIpv4,
    Ipv4Repr, Ipv6Packet as SmolIpv6, Ipv6Repr,
};

/// TTL (hop limit) of every answer.
const ANSWER_TTL: u8 = 64;
/// An ICMPv6 error must not make the packet exceed the IPv6 minimum MTU.
pub const IPV6_MIN_MTU: usize = 1280;
/// The most an IPv4 time exceeded answer takes, IP header included
/// (RFC 1812 4.3.2.3: 576 bytes).
pub const IPV4_ANSWER_MAX: usize = 576;
/// ICMP destination unreachable code 3: port unreachable.
const CODE_PORT_UNREACHABLE: u8 = 3;
/// ICMPv6 destination unreachable code 4: port unreachable (RFC 4443 3.1).
const CODE_PORT_UNREACHABLE_V6: u8 = 4;
/// ICMP/ICMPv6 time exceeded code 0: TTL (hop limit) exceeded in transit.
const CODE_TTL_EXCEEDED: u8 = 0;

/// Which error to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcmpError {
    /// Destination unreachable, port unreachable: a reject.
    PortUnreachable,
    /// IPv4 "fragmentation needed" (DF set) / ICMPv6 Packet Too Big, with
    /// the MTU that would have fitted.
    TooBig { mtu: u32 },
    /// Time exceeded in transit: IPv4 type 11 code 0, ICMPv6 type 3 code 0.
    TimeExceeded,
}

/// Where an answer comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum From4 {
    /// The address the packet was sent to, of either family (a reject
    /// answers for the Service).
    Destination,
    /// This address if the packet is IPv4 (the gateway's, or the tunnel's
    /// local address; `0.0.0.0`: IPv4 packets are not answered); an IPv6
    /// packet is answered from the EUI-64 link-local address of the MAC
    /// it was sent to.
    Addr(Ipv4Addr),
}

/// The ICMP header's first word and type-specific word.
struct Header {
    msg_type: u8,
    code: u8,
    rest: [u8; 4],
}

impl IcmpError {
    fn v4(self) -> Header {
        let (msg_type, code, rest) = match self {
            IcmpError::PortUnreachable => {
                (icmp::v4::DST_UNREACHABLE, CODE_PORT_UNREACHABLE, [0; 4])
            }
            IcmpError::TooBig { mtu } => {
                let [m0, m1] = u16::try_from(mtu).unwrap_or(u16::MAX).to_be_bytes();
                (
                    icmp::v4::DST_UNREACHABLE,
                    icmp::v4::CODE_FRAG_NEEDED,
                    [0, 0, m0, m1],
                )
            }
            IcmpError::TimeExceeded => (icmp::v4::TIME_EXCEEDED, CODE_TTL_EXCEEDED, [0; 4]),
        };
        Header {
            msg_type,
            code,
            rest,
        }
    }

    /// `None`: the error has no IPv6 form here.
    fn v6(self) -> Option<Header> {
        let (msg_type, code, rest) = match self {
            IcmpError::PortUnreachable => {
                (icmp::v6::DST_UNREACHABLE, CODE_PORT_UNREACHABLE_V6, [0; 4])
            }
            IcmpError::TooBig { mtu } => (icmp::v6::PKT_TOO_BIG, 0, mtu.to_be_bytes()),
            IcmpError::TimeExceeded => (icmp::v6::TIME_EXCEEDED, CODE_TTL_EXCEEDED, [0; 4]),
        };
        Some(Header {
            msg_type,
            code,
            rest,
        })
    }

    /// How many bytes of an IPv4 packet with header length `ihl` and
    /// total length `total` are quoted.
    fn v4_quote_len(self, ihl: usize, total: usize) -> usize {
        let most = match self {
            IcmpError::PortUnreachable | IcmpError::TooBig { .. } => ihl + 8,
            IcmpError::TimeExceeded => IPV4_ANSWER_MAX - ipv4::HEADER_LEN - icmp::HEADER_LEN,
        };
        most.min(total)
    }
}

/// The answer `err` to the frame whose first bytes are `head` and whose
/// length on the wire is `wire_len` (the switch keeps only the head of a
/// packet: [`crate::vxlan::TOO_BIG_HEAD`] bytes are enough for every
/// quote). `None` for what must not, or cannot, be answered (module doc).
pub fn answer(head: &[u8], wire_len: usize, err: IcmpError, from4: From4) -> Option<Vec<u8>> {
    if wire_len < head.len() {
        return None;
    }
    let eth = EthernetFrame::new_checked(head).ok()?;
    let [src0, ..] = eth.src_addr();
    if src0 & 1 != 0 {
        return None;
    }
    let l2 = eth.skip_vlan_tags();
    let l3 = l2.l3_offset;
    let ip_wire_len = wire_len.checked_sub(l3)?;
    let mut reply = match l2.ethertype {
        ethertype::IPV4 => answer_v4(l3, l2.payload, ip_wire_len, err, from4)?,
        ethertype::IPV6 => {
            let src = match from4 {
                From4::Destination => None,
                From4::Addr(_) => Some(link_local_of(eth.dst_addr())),
            };
            answer_v6(l3, l2.payload, ip_wire_len, err, src)?
        }
        _ => return None,
    };
    // Ethernet header: the original's (tags included), with the addresses
    // swapped.
    let hdr = reply.get_mut(..l3)?;
    hdr.copy_from_slice(head.get(..l3)?);
    hdr.get_mut(ethernet::field::DST)?
        .copy_from_slice(&eth.src_addr());
    hdr.get_mut(ethernet::field::SRC)?
        .copy_from_slice(&eth.dst_addr());
    Some(reply)
}

/// The ICMP time exceeded answering a packet a `dec_ttl` stopped (`head`
/// and `wire_len` as for [`answer`]), from `src4` if it is IPv4.
pub fn time_exceeded(head: &[u8], wire_len: usize, src4: Ipv4Addr) -> Option<Vec<u8>> {
    answer(head, wire_len, IcmpError::TimeExceeded, From4::Addr(src4))
}

/// Whether an IPv4 address may be the source of a packet that gets an
/// ICMP error.
fn unicast_source4(a: Ipv4Addr) -> bool {
    !(a.is_unspecified() || a.is_multicast() || a.is_broadcast() || a.is_loopback())
}

/// The IPv4 part of [`answer`]: a frame with `l2` bytes left for the
/// Ethernet header; `ip` is the packet's first bytes, `wire_len` bytes
/// long on the wire.
fn answer_v4(
    l2: usize,
    ip: &[u8],
    wire_len: usize,
    err: IcmpError,
    from4: From4,
) -> Option<Vec<u8>> {
    let orig = Ipv4Packet::new_checked(ip).ok()?;
    // 20 <= IHL <= total length <= bytes on the wire; the payload's bytes
    // present in `ip`.
    let (ihl, total) = (orig.header_len(), usize::from(orig.total_len()));
    if orig.version() != 4 || ihl < ipv4::HEADER_LEN || ihl > total || total > wire_len {
        return None;
    }
    let payload = ip.get(ihl..total.min(ip.len()))?;
    if orig.frag_offset() != 0 {
        return None;
    }
    if matches!(err, IcmpError::TooBig { .. }) && !orig.dont_frag() {
        return None;
    }
    let (src, dst) = (Ipv4Addr::from(orig.src()), Ipv4Addr::from(orig.dst()));
    if !unicast_source4(src) || dst.is_unspecified() || dst.is_multicast() || dst.is_broadcast() {
        return None;
    }
    // No IPv4 address to answer from (a switch whose only tunnel is over
    // IPv6 and that has no `--icmp-src-ip`): no answer.
    if matches!(from4, From4::Addr(a) if a.is_unspecified()) {
        return None;
    }
    if orig.protocol() == ip_proto::ICMP && icmp::v4::is_error(*payload.first()?) {
        return None;
    }
    let quote = ip.get(..err.v4_quote_len(ihl, total))?;
    let icmp_len = icmp::HEADER_LEN + quote.len();
    let ip_repr = Ipv4Repr {
        src_addr: match from4 {
            From4::Destination => dst,
            From4::Addr(a) => a,
        },
        dst_addr: src,
        next_header: IpProtocol::Icmp,
        payload_len: icmp_len,
        hop_limit: ANSWER_TTL,
    };
    let mut frame = vec![0u8; l2 + ip_repr.buffer_len() + icmp_len];
    let (ip_hdr, icmp_msg) = frame
        .get_mut(l2..)?
        .split_at_mut_checked(ip_repr.buffer_len())?;
    ip_repr.emit(
        &mut SmolIpv4::new_unchecked(ip_hdr),
        &ChecksumCapabilities::default(),
    );
    let h = err.v4();
    write_message(icmp_msg, &h, quote)?;
    let mut p = Icmpv4Packet::new_unchecked(icmp_msg);
    p.set_msg_type(Icmpv4Message::from(h.msg_type));
    p.set_msg_code(h.code);
    p.fill_checksum();
    Some(frame)
}

/// The IPv6 part of [`answer`] (`ip` and `wire_len` as for
/// [`answer_v4`]), from `src_addr` (`None`: the packet's destination).
fn answer_v6(
    l2: usize,
    ip: &[u8],
    wire_len: usize,
    err: IcmpError,
    src_addr: Option<Ipv6Addr>,
) -> Option<Vec<u8>> {
    let h = err.v6()?;
    let orig = Ipv6Packet::new_checked(ip).ok()?;
    let total = ipv6::HEADER_LEN + usize::from(orig.payload_len());
    if orig.version() != 6 || total > wire_len {
        return None;
    }
    let payload = ip.get(ipv6::HEADER_LEN..total.min(ip.len()))?;
    let (src, dst) = (Ipv6Addr::from(orig.src()), Ipv6Addr::from(orig.dst()));
    if src.is_unspecified() || src.is_multicast() || src.is_loopback() {
        return None;
    }
    if dst.is_unspecified() || dst.is_loopback() {
        return None;
    }
    let src_addr = src_addr.unwrap_or(dst);
    let too_big = matches!(err, IcmpError::TooBig { .. });
    if dst.is_multicast() && !too_big {
        return None;
    }
    match ipv6::walk_ext(orig.next_header(), payload).end {
        ExtEnd::Upper {
            next_header: ip_proto::ICMPV6,
            offset,
        } => {
            if payload.get(offset).is_none_or(|t| icmp::v6::is_error(*t)) {
                return None;
            }
        }
        ExtEnd::Upper { .. } => {}
        ExtEnd::LaterFragment { .. } if too_big => {}
        ExtEnd::LaterFragment { .. } | ExtEnd::Truncated { .. } | ExtEnd::TooLong { .. } => {
            return None
        }
    }
    let quote_len = total.min(IPV6_MIN_MTU - ipv6::HEADER_LEN - icmp::HEADER_LEN);
    let quote = ip.get(..quote_len)?;
    let icmp_len = icmp::HEADER_LEN + quote_len;
    let ip_repr = Ipv6Repr {
        src_addr,
        dst_addr: src,
        next_header: IpProtocol::Icmpv6,
        payload_len: icmp_len,
        hop_limit: ANSWER_TTL,
    };
    let mut frame = vec![0u8; l2 + ip_repr.buffer_len() + icmp_len];
    let (ip_hdr, icmp_msg) = frame
        .get_mut(l2..)?
        .split_at_mut_checked(ipv6::HEADER_LEN)?;
    ip_repr.emit(&mut SmolIpv6::new_unchecked(ip_hdr));
    write_message(icmp_msg, &h, quote)?;
    let mut p = Icmpv6Packet::new_unchecked(icmp_msg);
    p.set_msg_type(Icmpv6Message::from(h.msg_type));
    p.set_msg_code(h.code);
    p.fill_checksum(&src_addr, &src);
    Some(frame)
}

/// Writes the type-specific word and the quote after the 4 bytes of type,
/// code and checksum (those are the caller's, through smoltcp).
fn write_message(msg: &mut [u8], h: &Header, quote: &[u8]) -> Option<()> {
    msg.get_mut(icmp::field::REST)?.copy_from_slice(&h.rest);
    msg.get_mut(icmp::HEADER_LEN..)?.copy_from_slice(quote);
    Some(())
}

/// The EUI-64 link-local address (fe80::/64) of a MAC address.
pub fn link_local_of(mac: [u8; 6]) -> Ipv6Addr {
    let [m0, m1, m2, m3, m4, m5] = mac;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m0 ^ 0x02,
        m1,
        m2,
        0xff,
        0xfe,
        m3,
        m4,
        m5,
    ])
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::vxlan::TOO_BIG_HEAD;

    /// The pod's MAC and the gateway's (the MAC the pod addressed).
    const POD_MAC: [u8; 6] = [0x0a, 0x58, 10, 244, 0, 3];
    const GW_MAC: [u8; 6] = [0x0a, 0x58, 10, 244, 0, 1];
    const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 11);

    /// The Internet checksum of `data` (a valid message sums to 0).
    fn csum(data: &[u8]) -> u16 {
        let mut s: u32 = data
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        !(s as u16)
    }

    /// An Ethernet frame from the pod to the gateway's MAC: IPv4, `proto`,
    /// TTL 1, DF, 8 payload bytes 0x11.. then `extra` bytes of 0xee.
    fn v4_frame(src: [u8; 4], dst: [u8; 4], proto: u8, extra: usize) -> Vec<u8> {
        let total = 20 + 8 + extra;
        let mut f = vec![0u8; 14 + total];
        f[0..6].copy_from_slice(&GW_MAC);
        f[6..12].copy_from_slice(&POD_MAC);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        ip[6] = 0x40;
        ip[8] = 1;
        ip[9] = proto;
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&dst);
        let c = csum(&ip[..20]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        for (i, b) in ip[20..28].iter_mut().enumerate() {
            *b = 0x11 + i as u8;
        }
        ip[28..].fill(0xee);
        f
    }

    /// An ICMP echo request (ping -t 1) of `extra` + 8 bytes.
    fn ping4(extra: usize) -> Vec<u8> {
        let mut f = v4_frame([10, 244, 0, 3], [10, 244, 1, 7], ip_proto::ICMP, extra);
        f[34] = icmp::v4::ECHO_REQUEST;
        f
    }

    const POD6: &str = "fd00:10:244::3";
    const DST6: &str = "fd00:10:244:1::7";

    /// An IPv6 frame from the pod to the gateway's MAC, hop limit 1, next
    /// header `nh`, `payload` bytes (0x22 each, a first byte 128 = echo
    /// request for ICMPv6).
    fn v6_frame(dst: &str, nh: u8, payload: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40 + payload];
        f[0..6].copy_from_slice(&GW_MAC);
        f[6..12].copy_from_slice(&POD_MAC);
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let ip = &mut f[14..];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&(payload as u16).to_be_bytes());
        ip[6] = nh;
        ip[7] = 1;
        ip[8..24].copy_from_slice(&POD6.parse::<Ipv6Addr>().unwrap().octets());
        ip[24..40].copy_from_slice(&dst.parse::<Ipv6Addr>().unwrap().octets());
        ip[40..].fill(0x22);
        if nh == ip_proto::ICMPV6 && payload > 0 {
            ip[40] = icmp::v6::ECHO_REQUEST;
        }
        f
    }

    fn ping6(payload: usize) -> Vec<u8> {
        v6_frame(DST6, ip_proto::ICMPV6, payload)
    }

    fn te(f: &[u8]) -> Option<Vec<u8>> {
        time_exceeded(f, f.len(), NODE_IP)
    }

    #[test]
    fn ipv4_time_exceeded_is_byte_exact() {
        let f = ping4(56);
        let r = te(&f).expect("answered");
        // Ethernet: back to the pod, from the MAC it addressed.
        assert_eq!(&r[0..6], &POD_MAC);
        assert_eq!(&r[6..12], &GW_MAC);
        assert_eq!(&r[12..14], &[0x08, 0x00]);
        let ip = &r[14..34];
        assert_eq!(ip[0], 0x45);
        assert_eq!(
            usize::from(u16::from_be_bytes([ip[2], ip[3]])),
            r.len() - 14
        );
        assert_eq!(ip[8], 64, "TTL");
        assert_eq!(ip[9], ip_proto::ICMP);
        assert_eq!(csum(ip), 0, "IPv4 header checksum");
        assert_eq!(&ip[12..16], &NODE_IP.octets(), "from the node");
        assert_eq!(&ip[16..20], &[10, 244, 0, 3], "to the pod");
        let msg = &r[34..];
        assert_eq!((msg[0], msg[1]), (11, 0), "time exceeded in transit");
        assert_eq!(&msg[4..8], &[0; 4], "unused");
        assert_eq!(csum(msg), 0, "ICMP checksum");
        // The whole (small) packet is quoted, as received (TTL 1 and all).
        assert_eq!(&msg[8..], &f[14..]);
    }

    #[test]
    fn ipv4_quotes_at_most_576_bytes_in_all() {
        let f = ping4(1400);
        let r = te(&f).expect("answered");
        assert_eq!(r.len() - 14, IPV4_ANSWER_MAX);
        assert_eq!(&r[14 + 28..], &f[14..14 + IPV4_ANSWER_MAX - 28]);
        assert_eq!(csum(&r[34..]), 0);
        // Reject and too-big keep quoting the header and 8 bytes.
        let rej = answer(&f, f.len(), IcmpError::PortUnreachable, From4::Destination).unwrap();
        assert_eq!(&rej[42..], &f[14..14 + 28]);
        assert_eq!(
            &rej[26..30],
            &[10, 244, 1, 7],
            "a reject answers for the destination"
        );
        let big = answer(
            &f,
            f.len(),
            IcmpError::TooBig { mtu: 1450 },
            From4::Addr(NODE_IP),
        );
        let big = big.unwrap();
        assert_eq!(&big[42..], &f[14..14 + 28]);
        assert_eq!((big[34], big[35]), (3, 4));
        assert_eq!(&big[38..42], &[0, 0, 0x05, 0xaa], "next-hop MTU 1450");
    }

    #[test]
    fn ipv6_time_exceeded_is_byte_exact() {
        let f = ping6(64);
        let r = te(&f).expect("answered");
        assert_eq!(&r[0..6], &POD_MAC);
        assert_eq!(&r[6..12], &GW_MAC);
        assert_eq!(&r[12..14], &[0x86, 0xdd]);
        let ip = &r[14..54];
        assert_eq!(ip[0] >> 4, 6);
        let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
        assert_eq!(plen, r.len() - 54);
        assert_eq!((ip[6], ip[7]), (ip_proto::ICMPV6, 64));
        let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
        let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
        assert_eq!(
            src,
            "fe80::858:aff:fef4:1".parse::<Ipv6Addr>().unwrap(),
            "the EUI-64 link-local address of the gateway's MAC"
        );
        assert_eq!(src, link_local_of(GW_MAC));
        assert_eq!(dst, POD6.parse::<Ipv6Addr>().unwrap());
        let msg = &r[54..];
        assert_eq!((msg[0], msg[1]), (3, 0), "hop limit exceeded in transit");
        assert_eq!(&msg[4..8], &[0; 4]);
        // The checksum covers the pseudo-header.
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, ip_proto::ICMPV6]);
        pseudo.extend_from_slice(msg);
        assert_eq!(csum(&pseudo), 0, "ICMPv6 checksum");
        assert_eq!(&msg[8..], &f[14..]);
        // A large packet: as much as fits 1280 bytes.
        let big = ping6(3000);
        let r = te(&big).expect("answered");
        assert_eq!(r.len() - 14, IPV6_MIN_MTU);
        assert_eq!(&r[62..], &big[14..14 + IPV6_MIN_MTU - 48]);
    }

    #[test]
    fn ipv6_port_unreachable_answers_from_the_service() {
        // A TCP SYN to an IPv6 ClusterIP without endpoints.
        let mut f = v6_frame("fd00:10:96::30", ip_proto::TCP, 20);
        f[54 + 12] = 0x50;
        f[54 + 13] = 0x02;
        let r =
            answer(&f, f.len(), IcmpError::PortUnreachable, From4::Destination).expect("answered");
        assert_eq!((&r[0..6], &r[6..12]), (&POD_MAC[..], &GW_MAC[..]));
        let ip = &r[14..54];
        let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
        let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
        assert_eq!(
            src,
            "fd00:10:96::30".parse::<Ipv6Addr>().unwrap(),
            "from the Service"
        );
        assert_eq!(dst, POD6.parse::<Ipv6Addr>().unwrap());
        let msg = &r[54..];
        assert_eq!(
            (msg[0], msg[1]),
            (1, 4),
            "destination unreachable, port unreachable"
        );
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, ip_proto::ICMPV6]);
        pseudo.extend_from_slice(msg);
        assert_eq!(csum(&pseudo), 0, "ICMPv6 checksum");
        assert_eq!(&msg[8..], &f[14..], "the whole packet quoted");
        // Not for an ICMPv6 error, nor a later fragment.
        let mut err = v6_frame("fd00:10:96::30", ip_proto::ICMPV6, 8);
        err[54] = icmp::v6::DST_UNREACHABLE;
        let mut later = v6_frame("fd00:10:96::30", ip_proto::FRAGMENT, 24);
        later[54] = ip_proto::UDP;
        later[56..58].copy_from_slice(&(1448u16 | 1).to_be_bytes());
        for g in [err, later] {
            assert_eq!(
                answer(&g, g.len(), IcmpError::PortUnreachable, From4::Destination),
                None
            );
        }
    }

    #[test]
    fn vlan_tags_are_kept() {
        let f = ping4(8);
        let mut tagged = f[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
        tagged.extend_from_slice(&f[12..]);
        let r = te(&tagged).unwrap();
        assert_eq!(&r[12..18], &[0x81, 0x00, 0x00, 0x2a, 0x08, 0x00]);
        assert_eq!(&r[18..], &te(&f).unwrap()[14..]);
    }

    #[test]
    fn the_head_the_switch_keeps_is_enough() {
        for f in [ping4(9000), ping6(9000), ping4(60000), ping6(60000)] {
            let whole = te(&f).expect("answered");
            let head = &f[..TOO_BIG_HEAD];
            assert_eq!(time_exceeded(head, f.len(), NODE_IP), Some(whole));
            // A wire length shorter than the headers say, or than the head.
            assert_eq!(time_exceeded(head, f.len() - 1, NODE_IP), None);
            assert_eq!(time_exceeded(head, TOO_BIG_HEAD - 1, NODE_IP), None);
        }
    }

    #[test]
    fn what_must_not_be_answered_is_not() {
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        // IPv4.
        let mut f = ping4(8);
        f[34] = icmp::v4::TIME_EXCEEDED;
        cases.push(("an ICMP time exceeded", f));
        let mut f = ping4(8);
        f[34] = icmp::v4::DST_UNREACHABLE;
        cases.push(("an ICMP destination unreachable", f));
        let mut f = ping4(8);
        f[14 + 6..14 + 8].copy_from_slice(&[0x00, 0xb9]); // offset 185*8
        cases.push(("a later IPv4 fragment", f));
        let mut f = ping4(8);
        f[14 + 6..14 + 8].copy_from_slice(&[0x20, 0x01]); // MF, offset 8
        cases.push(("a middle IPv4 fragment", f));
        for (what, src, dst) in [
            ("a broadcast source", [255, 255, 255, 255], [10, 244, 1, 7]),
            ("an unspecified source", [0, 0, 0, 0], [10, 244, 1, 7]),
            ("a multicast source", [224, 0, 0, 1], [10, 244, 1, 7]),
            ("a loopback source", [127, 0, 0, 1], [10, 244, 1, 7]),
            ("a multicast destination", [10, 244, 0, 3], [239, 1, 2, 3]),
            (
                "a broadcast destination",
                [10, 244, 0, 3],
                [255, 255, 255, 255],
            ),
            ("an unspecified destination", [10, 244, 0, 3], [0, 0, 0, 0]),
        ] {
            cases.push((what, v4_frame(src, dst, ip_proto::UDP, 8)));
        }
        let mut f = ping4(8);
        f[6] |= 1;
        cases.push(("a multicast Ethernet source", f));
        let mut f = ping4(8);
        f[14] = 0x44;
        cases.push(("IHL 16", f));
        let mut f = ping4(8);
        f[14] = 0x65;
        cases.push(("IP version 6 in an IPv4 frame", f));
        let mut f = ping4(8);
        f[14 + 2..14 + 4].copy_from_slice(&900u16.to_be_bytes());
        cases.push(("a total length past the frame", f));
        let mut f = ping4(8);
        f[14 + 2..14 + 4].copy_from_slice(&16u16.to_be_bytes());
        cases.push(("a total length under the header", f));
        let mut f = ping4(8);
        f[14 + 2..14 + 4].copy_from_slice(&20u16.to_be_bytes());
        cases.push(("an ICMP message with no ICMP header", f));
        let mut f = ping4(8);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        cases.push(("ARP", f));
        // IPv6.
        let mut f = ping6(64);
        f[54] = icmp::v6::TIME_EXCEEDED;
        cases.push(("an ICMPv6 time exceeded", f));
        let mut f = ping6(64);
        f[54] = icmp::v6::PKT_TOO_BIG;
        cases.push(("an ICMPv6 packet too big", f));
        cases.push(("a multicast IPv6 destination", v6_frame("ff02::1", 17, 16)));
        cases.push((
            "a multicast IPv6 destination (global scope)",
            v6_frame("ff0e::1", ip_proto::ICMPV6, 16),
        ));
        let mut f = v6_frame(DST6, ip_proto::UDP, 16);
        f[22..38].copy_from_slice(&[0; 16]);
        cases.push(("an unspecified IPv6 source", f));
        let mut f = v6_frame(DST6, ip_proto::UDP, 16);
        f[22..38].copy_from_slice(&"ff02::2".parse::<Ipv6Addr>().unwrap().octets());
        cases.push(("a multicast IPv6 source", f));
        let mut f = v6_frame(DST6, ip_proto::UDP, 16);
        f[22..38].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
        cases.push(("a loopback IPv6 source", f));
        // An ICMPv6 error behind a hop-by-hop header.
        let mut f = v6_frame(DST6, ip_proto::HOPOPTS, 24);
        f[54] = ip_proto::ICMPV6;
        f[55] = 0;
        f[62] = icmp::v6::DST_UNREACHABLE;
        cases.push(("an ICMPv6 error behind hop-by-hop options", f));
        // A non-first fragment (offset 1448).
        let mut f = v6_frame(DST6, ip_proto::FRAGMENT, 24);
        f[54] = ip_proto::UDP;
        f[56..58].copy_from_slice(&(1448u16 | 1).to_be_bytes());
        cases.push(("a later IPv6 fragment", f));
        // A chain that cannot be walked.
        let mut f = v6_frame(DST6, ip_proto::HOPOPTS, 24);
        f[54] = ip_proto::UDP;
        f[55] = 255;
        cases.push(("an extension header past the payload", f));
        let mut f = ping6(64);
        f[18..20].copy_from_slice(&200u16.to_be_bytes());
        cases.push(("a payload length past the frame", f));
        let mut f = ping6(64);
        f[14] = 0x40;
        cases.push(("IP version 4 in an IPv6 frame", f));
        for (what, f) in cases {
            assert_eq!(te(&f), None, "{what} was answered");
        }
        // The answerable neighbours of those cases are answered (the
        // cases fail for the reason they name).
        assert!(te(&v6_frame(DST6, ip_proto::UDP, 16)).is_some());
        assert!(te(&v4_frame([10, 244, 0, 3], [10, 244, 1, 7], 17, 8)).is_some());
        let mut first = ping4(8);
        first[14 + 6] = 0x20; // MF, offset 0: the first fragment
        assert!(te(&first).is_some());
        let mut f = v6_frame(DST6, ip_proto::FRAGMENT, 24);
        f[54] = ip_proto::UDP;
        f[56..58].copy_from_slice(&1u16.to_be_bytes());
        assert!(te(&f).is_some(), "the first IPv6 fragment");
        // Packet too big still answers a later IPv6 fragment and a
        // multicast destination (RFC 4443 2.4 (e.3)); time exceeded does not.
        let mut later = v6_frame(DST6, ip_proto::FRAGMENT, 24);
        later[54] = ip_proto::UDP;
        later[56..58].copy_from_slice(&(1448u16 | 1).to_be_bytes());
        let mcast = v6_frame("ff0e::1", 17, 16);
        for f in [later, mcast] {
            let big = IcmpError::TooBig { mtu: 1280 };
            assert!(answer(&f, f.len(), big, From4::Addr(NODE_IP)).is_some());
        }
        // A reject of a multicast destination: none.
        let f = v6_frame("ff0e::1", 17, 16);
        assert_eq!(
            answer(&f, f.len(), IcmpError::PortUnreachable, From4::Destination),
            None
        );
    }

    /// Every prefix of a good frame, every wire length, and every single
    /// byte flipped: no panic, and no answer from a frame cut short.
    #[test]
    fn truncated_and_mangled_frames_never_panic() {
        let mut tagged = ping4(40)[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x2a]);
        tagged.extend_from_slice(&ping4(40)[12..]);
        let mut hbh = v6_frame(DST6, ip_proto::HOPOPTS, 40);
        hbh[54] = ip_proto::ICMPV6;
        hbh[55] = 0;
        hbh[62] = icmp::v6::ECHO_REQUEST;
        for f in [ping4(40), ping6(48), tagged, hbh] {
            assert!(te(&f).is_some());
            for n in 0..f.len() {
                assert_eq!(time_exceeded(&f[..n], n, NODE_IP), None, "cut at {n}");
                // The head is shorter than the packet on the wire.
                let _ = time_exceeded(&f[..n], f.len(), NODE_IP);
            }
            for i in 0..f.len() {
                for bit in [0x01, 0x10, 0x80] {
                    let mut g = f.clone();
                    g[i] ^= bit;
                    let _ = te(&g);
                    let _ = answer(
                        &g,
                        g.len(),
                        IcmpError::TooBig { mtu: 9000 },
                        From4::Addr(NODE_IP),
                    );
                    let _ = answer(&g, g.len(), IcmpError::PortUnreachable, From4::Destination);
                }
            }
        }
    }
}
