//! # The Internet checksum, and completing the L4 checksums pods leave partial
//!
//! One implementation of RFC 1071's one's complement sum for the whole
//! project (header rewrites, fragment reassembly, the switch's composed
//! packets), and [`complete_l4`], which the switch runs on frames from
//! ports whose kernel may have left the TCP/UDP checksum for the device to
//! finish.
//!
//! ## Why the switch completes checksums
//!
//! A pod's kernel with TX checksum offload on (the default on a veth) hands
//! TCP and UDP packets to the device with `CHECKSUM_PARTIAL`: the checksum
//! field holds only the pseudo-header sum, and the device is trusted to
//! fold in the L4 header and payload. A kernel device that forwards the skb
//! keeps that promise (`ip_summed` travels with it), but AF_XDP sees bare
//! bytes: the promise is lost, and the receiving kernel (a pod, the host
//! behind the gateway, a kernel VXLAN peer) drops the segment as corrupt.
//! Turning offload off in every pod (what oxvs did first) also turns off the
//! pod's GSO, so its TCP stack builds one MTU-sized skb per segment; the
//! Linux bridge keeps GSO, which is much of its TCP lead.
//!
//! So the switch is the device: [`complete_l4`] recomputes the TCP/UDP
//! checksum of every unfragmented IPv4 or IPv6 (no extension headers)
//! packet from such a port (on receive; or, by default, the switch
//! finishes it on each output: [`l4_fix`] computes the same value into
//! the output's copy, and [`partial_l4`] gives the terms on which a
//! kernel that can finish it is asked to), and fills in the
//! CRC32c of SCTP packets whose checksum field is 0 (a veth offers SCTP
//! CRC offload too, and the kernel then leaves the field zeroed; a real
//! CRC32c is 0 once in 2^32, and checking the others would cost a CRC per
//! packet). The switch cannot
//! tell a partial checksum from a complete one (AF_XDP carries no skb
//! metadata), so it always recomputes: a complete checksum is rewritten
//! with the same value, a wrong one is corrected, exactly as a NIC does
//! for a packet handed to it with offload. That holds for frames that
//! crossed memory only (pods, the gateway). Frames from a tunnel crossed
//! a wire, where a checksum that fails means corruption:
//! [`verify_or_complete_l4`] keeps one that verifies, completes one that
//! is partial (the field holds exactly the pseudo-header's sum, what a
//! kernel peer over a veth leaves) and refuses the rest, which the switch
//! drops. Left alone:
//!
//! - IPv4 UDP with checksum 0 ("no checksum", RFC 768; a partial checksum
//!   is never 0, as it holds a non-zero pseudo-header sum);
//! - fragments (the checksum covers the whole datagram; the kernel never
//!   offloads the checksum of a datagram it fragments);
//! - IPv6 with extension headers (a routing header changes the
//!   pseudo-header's destination; pods do not offload them);
//! - anything whose lengths do not add up (IPv4 header length, total
//!   length or IPv6 payload length outside the frame, a TCP segment
//!   shorter than its header, a UDP length that disagrees with the IP
//!   length): such a frame is passed on untouched, as it was received.
//!
//! ## Speed
//!
//! The sum runs over 32-bit words in native byte order into a 64-bit
//! accumulator (no carry is lost below 2^32 words) and is byte-swapped once
//! at the end: the one's complement sum is independent of byte order
//! (RFC 1071 section 2(B)), and the loop vectorises.
//! `bench/benches/checksum.rs` measures it.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use crate::wire::ethernet;
use crate::wire::ip_proto;
use crate::wire::ipv4::{self, Ipv4Packet};
use crate::wire::ipv6::{self, Ipv6Packet};
use crate::wire::udp::sctp;
use crate::wire::{ethertype, tcp, udp};

/// One's complement sum of `data` as big-endian 16-bit words (odd length
/// padded with a zero byte), added to `initial`, not inverted and not
/// folded. The value is congruent (mod 0xffff) to the plain sum of the
/// words, which is all [`fold`] needs.
#[inline]
pub fn ones_sum(data: &[u8], initial: u64) -> u64 {
    let (words, rest) = data.as_chunks::<4>();
    let mut native = 0u64;
    for w in words {
        native += u64::from(u32::from_ne_bytes(*w));
    }
    // The sum of native-order 16-bit words, byte-swapped, is the sum of
    // big-endian words (RFC 1071 2(B)).
    let mut sum = initial + u64::from(u16::from_be(fold(native)));
    let (pairs, last) = rest.as_chunks::<2>();
    for p in pairs {
        sum += u64::from(u16::from_be_bytes(*p));
    }
    if let [b] = last {
        sum += u64::from(*b) << 8;
    }
    sum
}

/// Folds a one's complement sum to 16 bits (end-around carry).
#[inline]
pub fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[allow(clippy::cast_possible_truncation, reason = "the loop leaves 16 bits")]
    let folded = sum as u16;
    folded
}

/// The Internet checksum (RFC 1071) of `data` plus `initial` (a partial
/// one's complement sum, e.g. of a pseudo-header). Over a header that
/// already holds a correct checksum it is 0.
#[inline]
pub fn checksum(data: &[u8], initial: u64) -> u16 {
    !fold(ones_sum(data, initial))
}

/// Incremental checksum update (RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')`)
/// for replacing the bytes `old` by `new` (same even length, at an even
/// offset of the checksummed area).
pub fn checksum_update(csum: u16, old: &[u8], new: &[u8]) -> u16 {
    let mut sum = u64::from(!csum);
    for w in old.as_chunks::<2>().0 {
        sum += u64::from(!u16::from_be_bytes(*w));
    }
    sum = ones_sum(new, sum);
    !fold(sum)
}

/// What [`complete_l4`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The TCP or UDP checksum was recomputed and written (or an SCTP
    /// packet's zeroed CRC32c filled in).
    Written,
    /// Not an unfragmented TCP/UDP packet this covers (see the module doc),
    /// or IPv4 UDP without a checksum: the frame is unchanged.
    NotApplicable,
    /// A TCP/UDP packet whose lengths do not add up: unchanged.
    Malformed,
    /// ([`verify_or_complete_l4`]) A complete checksum that verifies:
    /// unchanged.
    Valid,
    /// ([`verify_or_complete_l4`]) Neither a checksum that verifies nor a
    /// partial one: the packet was corrupted on its way (unchanged; the
    /// caller drops it).
    Bad,
}

/// Where the L4 checksum of a frame goes and what it covers.
struct L4Span {
    /// Start of the L4 header in the frame.
    start: usize,
    /// End of the L4 data (the IP length, not the frame's: padding excluded).
    end: usize,
    /// Offset of the checksum field in the frame.
    field: usize,
    /// The pseudo-header's one's complement sum.
    pseudo: u64,
    /// The L4 protocol (TCP, UDP or SCTP).
    proto: u8,
}

/// Recomputes the TCP/UDP checksum of `frame` (Ethernet, up to two VLAN
/// tags) in place; see the module doc for what is covered and why. Never
/// panics; reads and writes only inside `frame`.
pub fn complete_l4(frame: &mut [u8]) -> Completion {
    let span = match l4_span(frame) {
        Ok(s) => s,
        Err(c) => return c,
    };
    let Some(field) = frame.get_mut(span.field..span.field + 2) else {
        return Completion::Malformed;
    };
    if span.proto == ip_proto::SCTP {
        // The field is already 0 (else `l4_span` left the packet alone).
        let Some(l4) = frame.get(span.start..span.end) else {
            return Completion::Malformed;
        };
        let crc = crate::packet::crc32c(l4);
        if let Some(field) = frame.get_mut(span.field..span.field + 4) {
            field.copy_from_slice(&crc.to_le_bytes());
        }
        return Completion::Written;
    }
    field.copy_from_slice(&[0, 0]);
    let Some(l4) = frame.get(span.start..span.end) else {
        return Completion::Malformed;
    };
    let mut c = checksum(l4, span.pseudo);
    if c == 0 && span.proto == ip_proto::UDP {
        // UDP sends a computed 0 as all ones (0 means "none").
        c = 0xffff;
    }
    if let Some(field) = frame.get_mut(span.field..span.field + 2) {
        field.copy_from_slice(&c.to_be_bytes());
    }
    Completion::Written
}

/// As [`complete_l4`], for frames that crossed a wire (the switch's VXLAN
/// tunnels) and so may have been corrupted on the way: a TCP/UDP checksum
/// that verifies is left as it is ([`Completion::Valid`]); a partial one
/// (the field holds the pseudo-header's folded sum, what a kernel peer
/// sending over a veth underlay leaves: its skb kept `CHECKSUM_PARTIAL`)
/// is completed ([`Completion::Written`]); anything else is
/// [`Completion::Bad`] and left alone for the caller to drop, as a NIC
/// drops a frame whose checksum fails. [`complete_l4`] would correct it,
/// delivering corrupted data under a checksum made to fit. One pass over
/// the L4 bytes, as [`complete_l4`]; SCTP as there.
pub fn verify_or_complete_l4(frame: &mut [u8]) -> Completion {
    let span = match l4_span(frame) {
        Ok(s) if s.proto == ip_proto::SCTP => return complete_l4(frame),
        Ok(s) => s,
        Err(c) => return c,
    };
    let (Some(l4), Some(&[f0, f1])) = (
        frame.get(span.start..span.end),
        frame.get(span.field..span.field + 2),
    ) else {
        return Completion::Malformed;
    };
    let field = u16::from_be_bytes([f0, f1]);
    if field == 0 && span.proto == ip_proto::UDP {
        // IPv6 UDP without a checksum (`udp6zerocsumtx`, nested tunnels;
        // never a partial one, which holds a non-zero sum): the receiver
        // decides (`udp6zerocsumrx`), as it would off a wire.
        return Completion::NotApplicable;
    }
    // Over the field as it is: 0 if it is the complete checksum.
    let c = checksum(l4, span.pseudo);
    if c == 0 {
        return Completion::Valid;
    }
    // Partial: the field is the pseudo-header's sum (mod 0xffff).
    if (u32::from(field) + 0xffff - u32::from(fold(span.pseudo))) % 0xffff != 0 {
        return Completion::Bad;
    }
    // The sum without the field (adding its complement subtracts it).
    let mut c = !fold(u64::from(!c) + u64::from(!field));
    if c == 0 && span.proto == ip_proto::UDP {
        c = 0xffff;
    }
    if let Some(f) = frame.get_mut(span.field..span.field + 2) {
        f.copy_from_slice(&c.to_be_bytes());
    }
    Completion::Written
}

/// The checksum [`complete_l4`] would write into a frame, and where:
/// [`l4_fix`] computes it without touching the frame, for outputs that
/// copy the frame anyway and write it into their copy
/// ([`L4Fix::apply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L4Fix {
    /// Offset of the checksum field in the frame.
    pub at: usize,
    bytes: [u8; 4],
    len: u8,
}

impl L4Fix {
    /// The field's bytes: 2 for TCP and UDP, 4 for SCTP's CRC32c.
    pub fn bytes(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or_default()
    }

    /// Writes the field into `frame` (the frame it was computed from, or
    /// a copy). False, and nothing written, if it does not fit.
    pub fn apply(&self, frame: &mut [u8]) -> bool {
        let b = self.bytes();
        match frame.get_mut(self.at..self.at + b.len()) {
            Some(f) => {
                f.copy_from_slice(b);
                true
            }
            None => false,
        }
    }
}

/// What [`complete_l4`] would write into `frame` (the same value, one
/// pass over the L4 bytes), without writing it. `None` where it would
/// leave the frame unchanged.
pub fn l4_fix(frame: &[u8]) -> Option<L4Fix> {
    let span = l4_span(frame).ok()?;
    let l4 = frame.get(span.start..span.end)?;
    let at = span.field - span.start;
    if span.proto == ip_proto::SCTP {
        // The field is 0 (else `l4_span` refused the packet): the CRC
        // over the packet as it is.
        let crc = crate::packet::crc32c(l4).to_le_bytes();
        return Some(L4Fix {
            at: span.field,
            bytes: crc,
            len: 4,
        });
    }
    // The sum around the field (it starts at an even offset of the L4
    // header, so both parts keep their word alignment).
    let before = l4.get(..at)?;
    let after = l4.get(at + 2..)?;
    let mut c = checksum(after, ones_sum(before, span.pseudo));
    if c == 0 && span.proto == ip_proto::UDP {
        c = 0xffff;
    }
    let [a, b] = c.to_be_bytes();
    Some(L4Fix {
        at: span.field,
        bytes: [a, b, 0, 0],
        len: 2,
    })
}

/// A TCP or UDP checksum left for a device to finish, in the terms of
/// the kernel's `CHECKSUM_PARTIAL` (and of AF_XDP's TX metadata checksum
/// request): the field holds the pseudo-header's folded sum, and the
/// device sums from `start` to the end and stores the result in the
/// field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartialL4 {
    /// Where the sum starts (the L4 header), from the frame's start.
    pub start: usize,
    /// Offset of the checksum field in the frame.
    pub field: usize,
    /// What the field must hold: the pseudo-header's sum, folded, not
    /// inverted.
    pub pseudo: u16,
    /// Where the L4 data ends (the IP length's end). A device sums to the
    /// end of the frame: where bytes follow (padding), only a sum
    /// computed here ([`l4_fix`]) is right.
    pub end: usize,
}

impl PartialL4 {
    /// Writes the pseudo-header sum into the field of `frame` (the frame
    /// it was computed from, or a copy). False, and nothing written, if
    /// it does not fit.
    pub fn apply(&self, frame: &mut [u8]) -> bool {
        match frame.get_mut(self.field..self.field + 2) {
            Some(f) => {
                f.copy_from_slice(&self.pseudo.to_be_bytes());
                true
            }
            None => false,
        }
    }
}

/// How a device would be asked to finish `frame`'s TCP/UDP checksum
/// instead of [`complete_l4`] finishing it: what it covers, without a
/// pass over the payload. `None` for what [`complete_l4`] leaves alone
/// (see the module doc) and for SCTP (a CRC32c, which this request does
/// not cover).
pub fn partial_l4(frame: &[u8]) -> Option<PartialL4> {
    let span = l4_span(frame).ok()?;
    if span.proto == ip_proto::SCTP {
        return None;
    }
    Some(PartialL4 {
        start: span.start,
        field: span.field,
        pseudo: fold(span.pseudo),
        end: span.end,
    })
}

/// Finds the L4 span of an unfragmented TCP/UDP packet.
fn l4_span(frame: &[u8]) -> Result<L4Span, Completion> {
    let l2 = ethernet::l2_of(frame).ok_or(Completion::NotApplicable)?;
    let l3 = l2.l3_offset;
    let (proto, start, end, pseudo) = match l2.ethertype {
        ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(l2.payload).map_err(|_| Completion::NotApplicable)?;
            if ip.version() != 4 {
                return Err(Completion::NotApplicable);
            }
            let proto = ip.protocol();
            if !matches!(proto, ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP) {
                return Err(Completion::NotApplicable);
            }
            if ip.more_frags() || ip.frag_offset() != 0 {
                return Err(Completion::NotApplicable);
            }
            let ihl = ip.header_len();
            let total = usize::from(ip.total_len());
            if ihl < ipv4::HEADER_LEN || total < ihl || total > l2.payload.len() {
                return Err(Completion::Malformed);
            }
            let l4_len = total - ihl;
            let pseudo = ones_sum(ip.addrs(), u64::from(proto) + l4_len as u64);
            (proto, l3 + ihl, l3 + total, pseudo)
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(l2.payload).map_err(|_| Completion::NotApplicable)?;
            if ip.version() != 6 {
                return Err(Completion::NotApplicable);
            }
            let proto = ip.next_header();
            if !matches!(proto, ip_proto::TCP | ip_proto::UDP | ip_proto::SCTP) {
                return Err(Completion::NotApplicable);
            }
            let l4_len = usize::from(ip.payload_len());
            if ipv6::HEADER_LEN + l4_len > l2.payload.len() {
                return Err(Completion::Malformed);
            }
            let pseudo = ones_sum(ip.addrs(), u64::from(proto) + l4_len as u64);
            let start = l3 + ipv6::HEADER_LEN;
            (proto, start, start + l4_len, pseudo)
        }
        _ => return Err(Completion::NotApplicable),
    };
    let l4 = frame.get(start..end).ok_or(Completion::Malformed)?;
    let field = if proto == ip_proto::SCTP {
        let crc = l4.get(sctp::field::CHECKSUM).ok_or(Completion::Malformed)?;
        if crc != [0, 0, 0, 0] {
            return Err(Completion::NotApplicable);
        }
        start + sctp::field::CHECKSUM.start
    } else if proto == ip_proto::TCP {
        let h = tcp::TcpPacket::new_checked(l4).map_err(|_| Completion::Malformed)?;
        if h.header_len() < tcp::HEADER_LEN || h.header_len() > l4.len() {
            return Err(Completion::Malformed);
        }
        start + tcp::field::CHECKSUM.start
    } else {
        let h = udp::UdpPacket::new_checked(l4).map_err(|_| Completion::Malformed)?;
        if usize::from(h.len()) != l4.len() {
            return Err(Completion::Malformed);
        }
        let ipv4 = l2.ethertype == ethertype::IPV4;
        if ipv4 && h.checksum() == 0 {
            return Err(Completion::NotApplicable);
        }
        start + udp::field::CHECKSUM.start
    };
    Ok(L4Span {
        start,
        end,
        field,
        pseudo,
        proto,
    })
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    /// The plain RFC 1071 sum, 16 bits at a time: the reference.
    fn reference_sum(data: &[u8], initial: u64) -> u16 {
        let mut s = initial;
        for c in data.chunks(2) {
            s += u64::from(c[0]) << 8 | u64::from(*c.get(1).unwrap_or(&0));
        }
        fold(s)
    }

    fn lcg(seed: &mut u64) -> u8 {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (*seed >> 56) as u8
    }

    #[test]
    fn fast_sum_agrees_with_the_reference_for_every_length_and_alignment() {
        let mut seed = 7;
        let buf: Vec<u8> = (0..2100).map(|_| lcg(&mut seed)).collect();
        for start in 0..4 {
            for len in 0..300 {
                let d = &buf[start..start + len];
                assert_eq!(fold(ones_sum(d, 0)), reference_sum(d, 0), "{start} {len}");
                assert_eq!(fold(ones_sum(d, 0x1_2345)), reference_sum(d, 0x1_2345));
            }
        }
        let all = [0xffu8; 2048];
        assert_eq!(fold(ones_sum(&all, 0)), reference_sum(&all, 0));
        assert_eq!(fold(ones_sum(&[], 0)), 0);
        assert_eq!(fold(ones_sum(&[0; 64], 0)), 0);
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(ones_sum(&d, 0)), 0xddf2);
        assert_eq!(checksum(&d, 0), !0xddf2);
    }

    /// Ethernet + IPv4 (+ `vlan` tags) + TCP or UDP with `payload`, the
    /// L4 checksum left as the kernel leaves it with offload (the
    /// pseudo-header sum, not inverted).
    fn frame_v4(proto: u8, payload: &[u8], vlan: usize) -> (Vec<u8>, usize) {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
        for _ in 0..vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let l3 = f.len();
        let l4_hdr = if proto == ip_proto::TCP { 20 } else { 8 };
        let total = 20 + l4_hdr + payload.len();
        f.extend_from_slice(&[
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            1,
            0x40,
            0,
            64,
            proto,
            0,
            0,
        ]);
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        let l4 = f.len();
        if proto == ip_proto::TCP {
            f.extend_from_slice(&[
                0x30, 0x39, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0,
            ]);
        } else {
            let ul = 8 + payload.len();
            f.extend_from_slice(&[0x30, 0x39, 0x00, 0x35, (ul >> 8) as u8, ul as u8, 0, 0]);
        }
        f.extend_from_slice(payload);
        let pseudo = fold(ones_sum(
            &f[l3 + 12..l3 + 20],
            u64::from(proto) + (total - 20) as u64,
        ));
        let field = l4 + if proto == ip_proto::TCP { 16 } else { 6 };
        f[field..field + 2].copy_from_slice(&pseudo.to_be_bytes());
        let _ = l3;
        (f, l4)
    }

    fn valid(f: &[u8], l3: usize, l4: usize, proto: u8, v6: bool) -> bool {
        let (addrs, len) = if v6 {
            (&f[l3 + 8..l3 + 40], f.len() - l4)
        } else {
            let total = usize::from(u16::from_be_bytes([f[l3 + 2], f[l3 + 3]]));
            (&f[l3 + 12..l3 + 20], l3 + total - l4)
        };
        let pseudo = ones_sum(addrs, u64::from(proto) + len as u64);
        checksum(&f[l4..l4 + len], pseudo) == 0
    }

    #[test]
    fn partial_tcp_and_udp_checksums_are_completed() {
        for proto in [ip_proto::TCP, ip_proto::UDP] {
            for vlan in 0..=2 {
                for len in [0, 1, 2, 3, 100, 1399, 1448] {
                    let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                    let (mut f, l4) = frame_v4(proto, &payload, vlan);
                    let l3 = 14 + 4 * vlan;
                    assert!(!valid(&f, l3, l4, proto, false) || len == 0);
                    assert_eq!(complete_l4(&mut f), Completion::Written);
                    assert!(valid(&f, l3, l4, proto, false), "{proto} {vlan} {len}");
                    // Idempotent on a complete checksum.
                    let before = f.clone();
                    assert_eq!(complete_l4(&mut f), Completion::Written);
                    assert_eq!(f, before);
                }
            }
        }
    }

    #[test]
    fn a_fix_is_what_complete_l4_writes_and_a_partial_one_what_the_kernel_leaves() {
        for proto in [ip_proto::TCP, ip_proto::UDP] {
            for vlan in 0..=2 {
                for len in [0, 1, 2, 3, 100, 1399, 1448, 9000] {
                    let payload: Vec<u8> = (0..len).map(|i| (i * 11 + 1) as u8).collect();
                    let (partial, l4) = frame_v4(proto, &payload, vlan);
                    let field = l4 + if proto == ip_proto::TCP { 16 } else { 6 };
                    let mut full = partial.clone();
                    complete_l4(&mut full);
                    // Computed from the partial frame or the complete one,
                    // or with garbage in the field: the same bytes.
                    let mut garbage = partial.clone();
                    garbage[field..field + 2].copy_from_slice(&[0xde, 0xad]);
                    for from in [&partial, &full, &garbage] {
                        let fix = l4_fix(from).unwrap();
                        assert_eq!(fix.at, field);
                        let mut copy = from.clone();
                        assert!(fix.apply(&mut copy));
                        assert_eq!(copy, full, "{proto} {vlan} {len}");
                    }
                    // The partial terms: what the kernel left in the field.
                    let p = partial_l4(&full).unwrap();
                    assert_eq!((p.start, p.field, p.end), (l4, field, full.len()));
                    let mut back = full.clone();
                    assert!(p.apply(&mut back));
                    assert_eq!(back, partial);
                    assert!(!p.apply(&mut back[..field + 1].to_vec()));
                }
            }
        }
        // Nothing to do where complete_l4 does nothing.
        let (mut f, _) = frame_v4(ip_proto::UDP, &[9; 30], 0);
        f[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
        assert_eq!((l4_fix(&f), partial_l4(&f)), (None, None));
        let (mut frag, _) = frame_v4(ip_proto::TCP, &[9; 30], 0);
        frag[14 + 6] |= 0x20;
        assert_eq!((l4_fix(&frag), partial_l4(&frag)), (None, None));
        assert_eq!((l4_fix(&[0; 10]), partial_l4(&[0; 10])), (None, None));
    }

    #[test]
    fn from_a_wire_a_valid_checksum_is_kept_a_partial_one_completed_a_bad_one_refused() {
        for proto in [ip_proto::TCP, ip_proto::UDP] {
            for len in [0, 1, 3, 100, 1399, 1448] {
                let payload: Vec<u8> = (0..len).map(|i| (i * 13 + 5) as u8).collect();
                let (partial, l4) = frame_v4(proto, &payload, 1);
                let l3 = 18;
                // Partial (a kernel peer over a veth): completed.
                let mut f = partial.clone();
                assert_eq!(verify_or_complete_l4(&mut f), Completion::Written);
                assert!(valid(&f, l3, l4, proto, false), "{proto} {len}");
                let mut full = partial.clone();
                complete_l4(&mut full);
                assert_eq!(f, full, "the same checksum as complete_l4's");
                // Complete and right: kept.
                assert_eq!(verify_or_complete_l4(&mut f), Completion::Valid);
                assert_eq!(f, full);
                // One bit flipped on the way, in the payload or a header
                // the checksum covers: refused, not corrected.
                for at in [l4 + 1, f.len() - 1, l3 + 13] {
                    let mut bad = full.clone();
                    bad[at] ^= 0x10;
                    assert_eq!(
                        verify_or_complete_l4(&mut bad),
                        Completion::Bad,
                        "{proto} {len} byte {at}"
                    );
                    let mut corrupt = full.clone();
                    corrupt[at] ^= 0x10;
                    assert_eq!(bad, corrupt, "a refused frame is left as it came");
                }
                // A wrong checksum field (not the pseudo-header's sum).
                let mut bad = full.clone();
                let field = l4 + if proto == ip_proto::TCP { 16 } else { 6 };
                bad[field] ^= 0x01;
                assert_eq!(verify_or_complete_l4(&mut bad), Completion::Bad);
            }
        }
        // IPv4 UDP without a checksum: nothing to verify.
        let (mut f, _) = frame_v4(ip_proto::UDP, &[9; 30], 0);
        f[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
        assert_eq!(verify_or_complete_l4(&mut f), Completion::NotApplicable);
        // Nor IPv6 UDP with a zero checksum (the receiver decides).
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x86, 0xdd];
        f.extend_from_slice(&[0x60, 0, 0, 0, 0, 38, ip_proto::UDP, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f.extend_from_slice(&[0x30, 0x39, 0x12, 0xb5, 0, 38, 0, 0]);
        f.extend_from_slice(&[9; 30]);
        let before = f.clone();
        assert_eq!(verify_or_complete_l4(&mut f), Completion::NotApplicable);
        assert_eq!(f, before);
    }

    #[test]
    fn ethernet_padding_is_not_summed() {
        let (mut f, l4) = frame_v4(ip_proto::UDP, &[1, 2, 3], 0);
        f.extend_from_slice(&[0xaa; 20]);
        assert_eq!(complete_l4(&mut f), Completion::Written);
        let end = f.len() - 20;
        assert!(valid(&f[..end], 14, l4, ip_proto::UDP, false));
    }

    #[test]
    fn ipv4_udp_without_checksum_and_fragments_are_left_alone() {
        let (mut f, _) = frame_v4(ip_proto::UDP, &[9; 30], 0);
        f[14 + 20 + 6..14 + 20 + 8].copy_from_slice(&[0, 0]);
        let before = f.clone();
        assert_eq!(complete_l4(&mut f), Completion::NotApplicable);
        assert_eq!(f, before);

        for flags in [[0x20, 0x00], [0x00, 0x10], [0x20, 0x10]] {
            let (mut f, _) = frame_v4(ip_proto::TCP, &[9; 30], 0);
            f[14 + 6..14 + 8].copy_from_slice(&flags);
            let before = f.clone();
            assert_eq!(complete_l4(&mut f), Completion::NotApplicable);
            assert_eq!(f, before);
        }
    }

    #[test]
    fn udp_checksum_computed_as_zero_is_sent_as_ones() {
        // Find a payload whose checksum comes out 0.
        for x in 0..=u16::MAX {
            let (mut f, l4) = frame_v4(ip_proto::UDP, &x.to_be_bytes(), 0);
            assert_eq!(complete_l4(&mut f), Completion::Written);
            if f[l4 + 6..l4 + 8] == [0xff, 0xff] {
                // The sum is zero either way: 0xffff is a valid encoding.
                assert!(valid(&f, 14, l4, ip_proto::UDP, false));
                // Completing it from a wire writes the same, and then
                // verifies it.
                let (mut g, _) = frame_v4(ip_proto::UDP, &x.to_be_bytes(), 0);
                assert_eq!(verify_or_complete_l4(&mut g), Completion::Written);
                assert_eq!(g, f);
                assert_eq!(verify_or_complete_l4(&mut g), Completion::Valid);
                return;
            }
            assert_ne!(f[l4 + 6..l4 + 8], [0, 0]);
        }
        panic!("no payload gave a zero checksum");
    }

    #[test]
    fn lengths_that_do_not_add_up_leave_the_frame_alone() {
        let (f, _) = frame_v4(ip_proto::TCP, &[5; 40], 0);
        // Total length past the frame.
        let mut g = f.clone();
        g[16..18].copy_from_slice(&2000u16.to_be_bytes());
        assert_eq!(complete_l4(&mut g.clone()), Completion::Malformed);
        // IHL below 5, IHL past total.
        for ihl in [0x44u8, 0x4f] {
            let mut g = f.clone();
            g[14] = ihl;
            let before = g.clone();
            assert_eq!(complete_l4(&mut g), Completion::Malformed);
            assert_eq!(g, before);
        }
        // TCP data offset past the segment.
        let mut g = f.clone();
        g[14 + 20 + 12] = 0xf0;
        g.truncate(14 + 20 + 40);
        g[16..18].copy_from_slice(&60u16.to_be_bytes());
        assert_eq!(complete_l4(&mut g), Completion::Malformed);
        // UDP length disagreeing with the IP length.
        let (mut u, l4) = frame_v4(ip_proto::UDP, &[5; 40], 0);
        u[l4 + 4..l4 + 6].copy_from_slice(&20u16.to_be_bytes());
        let before = u.clone();
        assert_eq!(complete_l4(&mut u), Completion::Malformed);
        assert_eq!(u, before);
        // Every truncation of a valid frame: no panic, never Written past the end.
        let (f, _) = frame_v4(ip_proto::UDP, &[5; 40], 1);
        for n in 0..f.len() {
            let mut g = f[..n].to_vec();
            let _ = complete_l4(&mut g);
        }
        // Not IP, ICMP.
        let mut arp = f.clone();
        arp[16..18].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(complete_l4(&mut arp), Completion::NotApplicable);
        let (mut icmp, _) = frame_v4(ip_proto::UDP, &[5; 40], 0);
        icmp[14 + 9] = ip_proto::ICMP;
        assert_eq!(complete_l4(&mut icmp), Completion::NotApplicable);
    }

    #[test]
    fn ipv6_tcp_is_completed_and_extension_headers_are_left_alone() {
        let payload = [0x42u8; 333];
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x86, 0xdd];
        let plen = 20 + payload.len();
        f.extend_from_slice(&[
            0x60,
            0,
            0,
            0,
            (plen >> 8) as u8,
            plen as u8,
            ip_proto::TCP,
            64,
        ]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f.extend_from_slice(&[
            0x30, 0x39, 0x00, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0xab, 0xcd, 0,
            0,
        ]);
        f.extend_from_slice(&payload);
        assert_eq!(complete_l4(&mut f), Completion::Written);
        assert!(valid(&f, 14, 54, ip_proto::TCP, true));
        let mut h = f.clone();
        h[14 + 6] = ip_proto::HOPOPTS;
        let before = h.clone();
        assert_eq!(complete_l4(&mut h), Completion::NotApplicable);
        assert_eq!(h, before);
    }

    #[test]
    fn sctp_crc_left_zero_is_filled_and_a_set_one_is_left_alone() {
        // Ethernet + IPv4 + SCTP common header + a 16-byte chunk.
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
        let total: u16 = 20 + 12 + 16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&[
            0,
            1,
            0x40,
            0,
            64,
            ip_proto::SCTP,
            0,
            0,
            10,
            0,
            0,
            1,
            10,
            0,
            0,
            2,
        ]);
        f.extend_from_slice(&[0x0b, 0xb8, 0x0b, 0xb8, 1, 2, 3, 4, 0, 0, 0, 0]);
        f.extend_from_slice(&[0, 3, 0, 16, 9, 9, 9, 9, 8, 8, 8, 8, 7, 7, 7, 7]);
        assert_eq!(complete_l4(&mut f), Completion::Written);
        let l4 = 14 + 20;
        let stored = u32::from_le_bytes(f[l4 + 8..l4 + 12].try_into().unwrap());
        let mut z = f[l4..].to_vec();
        z[8..12].fill(0);
        assert_eq!(stored, crate::packet::crc32c(&z));
        // A set CRC (right or wrong) is not checked.
        f[l4 + 8] ^= 0xff;
        let before = f.clone();
        assert_eq!(complete_l4(&mut f), Completion::NotApplicable);
        assert_eq!(f, before);
    }
}
