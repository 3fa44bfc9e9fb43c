//! The bytes the VXLAN port reads and writes, apart from the sockets:
//! outer IPv4 + UDP + VXLAN headers (encapsulation, whole or in
//! fragments), outer IPv6 + UDP + VXLAN headers (whole: with the UDP
//! checksum IPv6 requires, RFC 8200 8.1, and a flow label from the inner
//! flow's hash, RFC 6438), the VXLAN header check on receive, what the inner frame
//! decides (DF, the flow hash behind the UDP source port), and the ICMP
//! "too big" answers (built by [`crate::icmp_error`]).
//!
//! Inner frames are untrusted (a pod wrote them), and so are received
//! datagrams. Every header is read through the wire layer's checked views
//! (`oxvs_pipeline::wire`: the same VLAN tag walk as the flow key, the same
//! IPv6 extension header walk as conntrack); the module denies
//! `clippy::indexing_slicing` and `clippy::cast_possible_truncation`, so
//! nothing here panics on any input.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::net::{Ipv4Addr, Ipv6Addr};

use oxvs_pipeline::checksum;
use oxvs_pipeline::wire::ethernet::{self, L2};
use oxvs_pipeline::wire::ipv4::{self, Ipv4Packet};
use oxvs_pipeline::wire::ipv6::Ipv6Packet;
use oxvs_pipeline::wire::vxlan::VxlanHeader;
use oxvs_pipeline::wire::{ethertype, ip_proto, vxlan};
use smoltcp::wire::{IpProtocol, Ipv4Packet as SmolIpv4};

use crate::icmp_error::{self, From4, IcmpError};

use super::{ETH_HLEN, IPV4_HLEN, IPV6_HLEN, OUTER6_LEN, OUTER_LEN, TX_SLOT, UDP_HLEN, VXLAN_HLEN};

/// UDP source port range (RFC 7348 section 5: dynamic/private ports).
pub(super) const SRC_PORT_MIN: u16 = 49152;
pub(super) const OUTER_TTL: u8 = 64;
/// The bytes of a frame [`icmp_too_big_reply_head`] (and every answer of
/// [`crate::icmp_error`]) needs at most: two VLAN tags, and the 1232 bytes
/// an ICMPv6 error quotes (an ICMPv4 one quotes at most 548).
pub const TOO_BIG_HEAD: usize = 1536;

/// A length that fits a 16-bit length field: the callers have checked it
/// (`send` refuses outer packets over 65535 bytes; fragments are smaller).
#[allow(
    clippy::cast_possible_truncation,
    reason = "callers check the length against 65535"
)]
fn len16(n: usize) -> u16 {
    debug_assert!(n <= usize::from(u16::MAX));
    n as u16
}

/// The outer headers of one encapsulated packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OuterHeader {
    pub(super) src: Ipv4Addr,
    pub(super) dst: Ipv4Addr,
    pub(super) src_port: u16,
    pub(super) dst_port: u16,
    /// 24 bits.
    pub(super) vni: u32,
    pub(super) ident: u16,
    pub(super) df: bool,
}

impl OuterHeader {
    /// Writes outer IPv4 + UDP + VXLAN and `inner` into `slot`; returns the
    /// outer packet's length (0 when it does not fit `slot`). The caller
    /// checked that it fits 65535 bytes.
    pub(super) fn encapsulate(&self, inner: &[u8], slot: &mut [u8]) -> usize {
        let total = OUTER_LEN + inner.len();
        let Some((ip, rest)) = slot
            .get_mut(..total)
            .and_then(|out| out.split_first_chunk_mut::<IPV4_HLEN>())
        else {
            return 0;
        };
        let Some((udp_vxlan, payload)) = rest.split_first_chunk_mut::<{ UDP_HLEN + VXLAN_HLEN }>()
        else {
            return 0;
        };
        self.write_ipv4(ip, total, false, 0, self.df);
        *udp_vxlan = udp_vxlan_header(
            self.src_port,
            self.dst_port,
            UDP_HLEN + VXLAN_HLEN + inner.len(),
            self.vni,
        );
        // `payload` is exactly `inner.len()` bytes: `out` is `total` long.
        payload.copy_from_slice(inner);
        total
    }

    /// Writes a 20-byte IPv4 header (no options, TTL 64, checksum filled).
    fn write_ipv4(
        &self,
        out: &mut [u8; IPV4_HLEN],
        total: usize,
        more: bool,
        offset: usize,
        df: bool,
    ) {
        let mut p = SmolIpv4::new_unchecked(out.as_mut_slice());
        p.set_version(4);
        p.set_header_len(20);
        p.set_dscp(0);
        p.set_ecn(0);
        p.set_total_len(len16(total));
        p.set_ident(self.ident);
        p.clear_flags();
        p.set_dont_frag(df);
        p.set_more_frags(more);
        p.set_frag_offset(len16(offset));
        p.set_hop_limit(OUTER_TTL);
        p.set_next_header(IpProtocol::Udp);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.fill_checksum();
    }
}

/// The outer headers of one packet encapsulated in IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OuterHeader6 {
    pub(super) src: Ipv6Addr,
    pub(super) dst: Ipv6Addr,
    pub(super) src_port: u16,
    pub(super) dst_port: u16,
    /// 24 bits.
    pub(super) vni: u32,
    /// 20 bits (RFC 6438: from the inner flow, for the underlay's ECMP).
    pub(super) flow_label: u32,
}

impl OuterHeader6 {
    /// Writes outer IPv6 + UDP + VXLAN and `inner` into `slot`; returns the
    /// outer packet's length (0 when it does not fit `slot`). The caller
    /// checked that the UDP length fits 65535 bytes. The UDP checksum is
    /// computed (IPv6 forbids a zero one, RFC 8200 8.1, unless the
    /// receiver opted in with `udp6zerocsumrx`, which the kernel's
    /// `vxlan` device does not by default). No extension headers, hop
    /// limit 64, traffic class 0.
    pub(super) fn encapsulate(&self, inner: &[u8], slot: &mut [u8]) -> usize {
        let total = OUTER6_LEN + inner.len();
        let udp_len = UDP_HLEN + VXLAN_HLEN + inner.len();
        let Some((ip, rest)) = slot
            .get_mut(..total)
            .and_then(|out| out.split_first_chunk_mut::<IPV6_HLEN>())
        else {
            return 0;
        };
        let Some((udp_vxlan, payload)) = rest.split_first_chunk_mut::<{ UDP_HLEN + VXLAN_HLEN }>()
        else {
            return 0;
        };
        let label = self.flow_label & 0x000f_ffff;
        let [_, l1, l2, l3] = (0x6000_0000 | label).to_be_bytes();
        let [p0, p1] = len16(udp_len).to_be_bytes();
        let mut h = [0u8; IPV6_HLEN];
        let (fixed, addrs) = h.split_at_mut(8);
        fixed.copy_from_slice(&[0x60, l1, l2, l3, p0, p1, ip_proto::UDP, OUTER_TTL]);
        let (s, d) = addrs.split_at_mut(16);
        s.copy_from_slice(&self.src.octets());
        d.copy_from_slice(&self.dst.octets());
        *ip = h;
        *udp_vxlan = udp_vxlan_header(self.src_port, self.dst_port, udp_len, self.vni);
        payload.copy_from_slice(inner);
        // Checksum: pseudo-header (addresses, upper-layer length, next
        // header), UDP header with a zero checksum, payload.
        let pseudo = udp6_pseudo_sum(&self.src, &self.dst, udp_len);
        let sum = checksum::ones_sum(payload, checksum::ones_sum(udp_vxlan, pseudo));
        let csum = match !checksum::fold(sum) {
            // RFC 8200 8.1: a computed 0 is sent as 0xffff.
            0 => 0xffff,
            c => c,
        };
        let [c0, c1] = csum.to_be_bytes();
        if let Some(c) = udp_vxlan.get_mut(6..8) {
            c.copy_from_slice(&[c0, c1]);
        }
        total
    }
}

/// The one's complement sum of the IPv6 pseudo-header of a UDP datagram
/// of `udp_len` bytes (RFC 8200 8.1).
pub(super) fn udp6_pseudo_sum(src: &Ipv6Addr, dst: &Ipv6Addr, udp_len: usize) -> u64 {
    let mut sum = checksum::ones_sum(&src.octets(), 0);
    sum = checksum::ones_sum(&dst.octets(), sum);
    sum + (udp_len as u64 >> 16) + (udp_len as u64 & 0xffff) + u64::from(ip_proto::UDP)
}

/// The UDP header (checksum 0, RFC 7348) and VXLAN header (I flag, `vni`).
fn udp_vxlan_header(
    src_port: u16,
    dst_port: u16,
    udp_len: usize,
    vni: u32,
) -> [u8; UDP_HLEN + VXLAN_HLEN] {
    let [s0, s1] = src_port.to_be_bytes();
    let [d0, d1] = dst_port.to_be_bytes();
    let [l0, l1] = len16(udp_len).to_be_bytes();
    let [v0, v1, v2, v3, v4, v5, v6, v7] = vxlan::header(vni);
    [s0, s1, d0, d1, l0, l1, 0, 0, v0, v1, v2, v3, v4, v5, v6, v7]
}

/// Validates a VXLAN UDP payload; returns the VNI and the inner frame's
/// length (the frame starts at byte 8). `None` when it is too short for the
/// header and an Ethernet header, lacks the I flag, or has a reserved bit set.
pub(super) fn parse_vxlan(datagram: &[u8]) -> Option<(u32, usize)> {
    let h = VxlanHeader::new_checked(datagram).ok()?;
    let inner = h.payload().len();
    (inner >= ETH_HLEN && h.is_plain()).then_some((h.vni(), inner))
}

/// How many IPv4 fragments carry `payload` bytes of IP payload under `mtu`.
pub(super) fn fragment_count(payload: usize, mtu: usize) -> usize {
    let per = fragment_payload(mtu);
    payload.div_ceil(per)
}

/// IP payload bytes per fragment: a multiple of 8 (mtu is at least 576).
fn fragment_payload(mtu: usize) -> usize {
    (mtu.saturating_sub(IPV4_HLEN) / 8 * 8).max(8)
}

/// Writes the outer packet for `inner` as IPv4 fragments of at most `mtu`
/// bytes, one per `TX_SLOT` of `area` (DF clear, shared identification);
/// their lengths go to `lens`. Returns the number of fragments.
pub(super) fn encapsulate_fragments(
    hdr: &OuterHeader,
    inner: &[u8],
    mtu: usize,
    area: &mut [u8],
    lens: &mut [usize],
) -> usize {
    let total = UDP_HLEN + VXLAN_HLEN + inner.len();
    let head = udp_vxlan_header(hdr.src_port, hdr.dst_port, total, hdr.vni);
    let per = fragment_payload(mtu);
    let mut count = 0;
    for ((k, slot), len_out) in area
        .chunks_exact_mut(TX_SLOT)
        .enumerate()
        .zip(lens.iter_mut())
    {
        let off = k * per;
        if off >= total {
            break;
        }
        let len = per.min(total - off);
        let Some((ip, rest)) = slot.split_first_chunk_mut::<IPV4_HLEN>() else {
            break;
        };
        let Some(data) = rest.get_mut(..len) else {
            break;
        };
        hdr.write_ipv4(ip, IPV4_HLEN + len, off + len < total, off, false);
        copy_concat(data, &head, inner, off);
        *len_out = IPV4_HLEN + len;
        count += 1;
    }
    count
}

/// Fills `dst` with bytes `off..off + dst.len()` of `head ++ tail` (as far
/// as they exist).
fn copy_concat(dst: &mut [u8], head: &[u8], tail: &[u8], off: usize) {
    let from_head = head.get(off..).unwrap_or_default();
    let n = from_head.len().min(dst.len());
    let Some((d_head, d_tail)) = dst.split_at_mut_checked(n) else {
        return;
    };
    if let Some(src) = from_head.get(..n) {
        d_head.copy_from_slice(src);
    }
    let tail_off = (off + n).saturating_sub(head.len());
    if let Some(src) = tail.get(tail_off..tail_off + d_tail.len()) {
        d_tail.copy_from_slice(src);
    }
}

/// Whether the inner frame may be carried in fragments: not for IPv4 with
/// DF, nor IPv6 (whose senders do their own path MTU discovery); yes for
/// IPv4 without DF (or without a readable header) and non-IP frames. Also
/// decides the outer DF bit (copied from the inner packet, like Linux
/// `vxlan ... df inherit`).
pub(super) fn may_fragment(frame: &[u8]) -> bool {
    match ethernet::l2_of(frame) {
        Some(L2 {
            ethertype: ethertype::IPV4,
            payload,
            ..
        }) => Ipv4Packet::new_checked(payload).map_or(true, |ip| !ip.dont_frag()),
        Some(L2 {
            ethertype: ethertype::IPV6,
            ..
        }) => false,
        _ => true,
    }
}

/// The outer UDP source port for an inner frame: a hash of its flow (IP
/// addresses, protocol, L4 ports; MACs and ethertype for non-IP) scaled
/// into 49152..=65535. All fragments of an inner flow get the same port.
pub(crate) fn source_port(frame: &[u8]) -> u16 {
    source_port_of_hash(flow_hash(frame))
}

/// [`source_port`] from the inner flow's hash.
pub(super) fn source_port_of_hash(hash: u32) -> u16 {
    let h = u64::from(hash);
    // `h < 2^32`, so the product shifted right by 32 is below the range's
    // size (16384): it fits.
    let scaled = (h * u64::from(u16::MAX - SRC_PORT_MIN + 1)) >> 32;
    SRC_PORT_MIN + u16::try_from(scaled).unwrap_or(0)
}

fn has_ports(proto: u8) -> bool {
    matches!(
        proto,
        ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP | ip_proto::UDPLITE
    )
}

/// The hash of the inner frame's flow behind [`source_port`] (and the
/// outer IPv6 flow label).
pub(super) fn flow_hash(frame: &[u8]) -> u32 {
    let mut h = FlowHasher(0x9e37_79b9);
    match ethernet::l2_of(frame) {
        Some(L2 {
            ethertype: ethertype::IPV4,
            payload,
            ..
        }) => {
            if let Ok(ip) = Ipv4Packet::new_checked(payload) {
                let proto = ip.protocol();
                h.bytes(ip.addrs());
                h.word(u32::from(proto));
                let frag = ip.flags_frag() & (ipv4::FLAG_MF | ipv4::FRAG_OFFSET_MASK);
                let ihl = ip.header_len();
                if frag == 0 && has_ports(proto) {
                    if let Some(ports) = payload.get(ihl..ihl + 4) {
                        h.bytes(ports);
                    }
                }
                return h.finish();
            }
        }
        Some(L2 {
            ethertype: ethertype::IPV6,
            payload,
            ..
        }) => {
            if let Ok(ip) = Ipv6Packet::new_checked(payload) {
                // Ports only right after the fixed header: a flow's packets
                // all carry the same extension headers, if any.
                let nh = ip.next_header();
                h.bytes(ip.addrs());
                h.word(u32::from(nh));
                if has_ports(nh) {
                    if let Some(ports) = ip.rest().get(..4) {
                        h.bytes(ports);
                    }
                }
                return h.finish();
            }
        }
        _ => {}
    }
    h.bytes(frame.get(..ETH_HLEN).unwrap_or(frame));
    h.finish()
}

/// A small multiplicative hash (not cryptographic: the source port only
/// spreads flows over ECMP paths).
struct FlowHasher(u32);

impl FlowHasher {
    fn word(&mut self, w: u32) {
        self.0 = (self.0 ^ w).wrapping_mul(0x85eb_ca6b).rotate_left(13);
    }
    fn bytes(&mut self, b: &[u8]) {
        let (words, rem) = b.as_chunks::<4>();
        for w in words {
            self.word(u32::from_be_bytes(*w));
        }
        let mut last = [0u8; 4];
        if let Some(l) = last.get_mut(..rem.len()) {
            l.copy_from_slice(rem);
        }
        // `rem` has at most 3 bytes.
        let rem_len = u32::try_from(rem.len()).unwrap_or(0);
        self.word(u32::from_be_bytes(last) ^ (rem_len << 24));
    }
    /// murmur3's finalizer: every input bit affects every output bit.
    fn finish(&self) -> u32 {
        let mut x = self.0;
        x ^= x >> 16;
        x = x.wrapping_mul(0x85eb_ca6b);
        x ^= x >> 13;
        x = x.wrapping_mul(0xc2b2_ae35);
        x ^ (x >> 16)
    }
}

/// Builds the answer to a sender whose packet did not fit the tunnel: a
/// complete Ethernet frame back to it (Ethernet source/destination = the
/// original's destination/source, VLAN tags kept), made by the switch's
/// one ICMP error builder ([`crate::icmp_error`], which says who is not
/// answered and what is quoted).
///
/// - IPv4: ICMP type 3 code 4 "fragmentation needed", next-hop MTU = `mtu`
///   (the inner MTU, underlay − 50, as [`super::TxError::TooBig`] reports
///   it), quoting the original IP header + 8 bytes, from `src_ip` (the
///   gateway's address), TTL 64; only for packets with DF.
/// - IPv6: ICMPv6 Packet Too Big with MTU = `mtu`, quoting as much of the
///   original as keeps the reply within 1280 bytes. The source is the
///   EUI-64 link-local address of the MAC the sender addressed (the
///   original Ethernet destination: the router it believes it talks to),
///   since `src_ip` is IPv4; hosts accept a Packet Too Big from any source
///   as long as the quote matches their packet. A multicast destination
///   and a non-first fragment are answered too (RFC 4443 2.4 (e.3)).
pub fn icmp_too_big_reply(original_frame: &[u8], mtu: u32, src_ip: Ipv4Addr) -> Option<Vec<u8>> {
    icmp_too_big_reply_head(original_frame, original_frame.len(), mtu, src_ip)
}

/// [`icmp_too_big_reply`] from the first bytes of the frame (`head`) and
/// its length on the wire (`wire_len`): the reply only needs the headers
/// and what it quotes, so the switch keeps [`TOO_BIG_HEAD`] bytes of each
/// packet rather than the whole (up to 64 KiB) frame. The length fields
/// are checked against `wire_len`; an IPv6 extension header chain that
/// runs past `head` is not answered.
pub fn icmp_too_big_reply_head(
    head: &[u8],
    wire_len: usize,
    mtu: u32,
    src_ip: Ipv4Addr,
) -> Option<Vec<u8>> {
    icmp_error::answer(
        head,
        wire_len,
        IcmpError::TooBig { mtu },
        From4::Addr(src_ip),
    )
}
