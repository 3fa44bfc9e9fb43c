//! Coalescing received inner TCP segments (userspace GRO).
//!
//! A TCP stream from another node arrives as a train of tunnel-MTU
//! segments (cut by the other switch's TSO, or by the sender's kernel).
//! Delivered one by one, each costs a pipeline pass, a TX descriptor and
//! a socket buffer in the receiving pod. When the node's pods take large
//! frames, consecutive segments of one flow are merged into one frame of
//! up to `max_len` bytes, in place in the port's receive buffer (each
//! payload moved left behind the previous one), the way the kernel's
//! `tcp_gro_receive` merges:
//!
//! - same tunnel (VNI and source), same Ethernet header (no VLAN tag);
//! - IPv4 without options or fragmentation and with DF, same TOS, TTL,
//!   addresses; or IPv6 with TCP right after the fixed header (no
//!   extension header), same traffic class, flow label, hop limit,
//!   addresses (what the kernel's `ipv6_gro_receive` compares);
//! - same TCP ports, acknowledgement, window and options (byte for
//!   byte); flags ACK, with PSH allowed on the last segment merged;
//! - each segment's sequence number follows the previous one's end, and
//!   every segment but the last carries as much payload as the first.
//!
//! - every segment's TCP checksum verifies (a complete one: the frames
//!   crossed a wire, and a piece corrupted on the way must not be hidden
//!   under a checksum computed for the whole).
//!
//! The merged frame has the first segment's headers with the IP length
//! rewritten (IPv4: total length and header checksum; IPv6: payload
//! length) and PSH if the last had it. The families differ only in the IP
//! header ([`Family`]). Its TCP checksum is computed from the pieces'
//! payload sums, taken while verifying them (each byte-swapped when its
//! payload lands at an odd offset), so the merged frame is not read
//! again; it and every segment whose checksum verified are marked
//! `verified`, and the engine does not sum them again. A segment whose
//! checksum does not verify (a kernel peer over a veth underlay leaves it
//! partial; or it was corrupted) is not merged, and the engine completes
//! or drops it (`checksum::verify_or_complete_l4`). The frames are
//! untrusted: every length is checked, nothing indexes unchecked, and a
//! frame that does not qualify is left exactly as received.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use oxvs_pipeline::checksum;
use oxvs_pipeline::field::tcp_flags;
use oxvs_pipeline::wire::{ethertype, ip_proto, ipv4, ipv6, tcp};

use super::RxDesc;

const ETH: usize = 14;
/// PSH in the TCP header's 14th byte (the low byte of the flags word).
const PSH_LOW_BYTE: u8 = 0x08;
const _: () = assert!(tcp_flags::PSH == PSH_LOW_BYTE as u16);

/// The IP header's part in a merge, the only thing the families do not
/// share: which header qualifies, which of its bytes must be equal, and
/// its length field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// IPv4 without options, DF, not a fragment.
    V4,
    /// IPv6 whose next header is TCP.
    V6,
}

impl Family {
    /// The IP header's length (fixed: no IPv4 options, no IPv6 extension
    /// headers).
    const fn ip_hl(self) -> usize {
        match self {
            Family::V4 => ipv4::HEADER_LEN,
            Family::V6 => ipv6::HEADER_LEN,
        }
    }

    /// The longest frame whose IP length field can say its length.
    const fn max_frame(self) -> usize {
        match self {
            Family::V4 => ETH + 0xffff,
            Family::V6 => ETH + ipv6::HEADER_LEN + 0xffff,
        }
    }

    /// The family of `frame` (untagged Ethernet) if its IP header is one
    /// this module merges and its length field gives the frame's length
    /// exactly; a header check only, as every received frame pays it.
    fn of(frame: &[u8]) -> Option<Family> {
        let ethertype = frame.get(12..ETH)?;
        if ethertype == ethertype::IPV4.to_be_bytes() {
            let ip = frame.get(ETH..ETH + ipv4::HEADER_LEN)?;
            let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
            let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]);
            (*ip.first()? == 0x45
                && *ip.get(ipv4::field::PROTOCOL)? == ip_proto::TCP
                && frag == ipv4::FLAG_DF
                && ETH + total == frame.len())
            .then_some(Family::V4)
        } else if ethertype == ethertype::IPV6.to_be_bytes() {
            let ip = frame.get(ETH..ETH + ipv6::HEADER_LEN)?;
            let payload = usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]));
            (*ip.first()? >> 4 == 6
                && *ip.get(ipv6::field::NEXT_HEADER)? == ip_proto::TCP
                && ETH + ipv6::HEADER_LEN + payload == frame.len())
            .then_some(Family::V6)
        } else {
            None
        }
    }

    /// The frame byte ranges of the Ethernet and IP headers that two
    /// segments must share (the ethertype included, so families never
    /// mix): IPv4 version..TOS, TTL, protocol, addresses; IPv6 version,
    /// traffic class, flow label, next header, hop limit, addresses.
    const fn same_ranges(self) -> &'static [(usize, usize)] {
        match self {
            Family::V4 => &[(0, ETH + 2), (ETH + 8, ETH + 10), (ETH + 12, ETH + 20)],
            Family::V6 => &[(0, ETH + 4), (ETH + 6, ETH + 40)],
        }
    }

    /// Writes the IP length of a merged frame (`frame`, its whole length)
    /// into its IP header, and IPv4's header checksum.
    fn fix_length(self, frame: &mut [u8]) -> Option<()> {
        let ip_len = frame.len().checked_sub(ETH)?;
        let ip = frame.get_mut(ETH..ETH + self.ip_hl())?;
        match self {
            Family::V4 => {
                let total = u16::try_from(ip_len).ok()?;
                ip.get_mut(ipv4::field::TOTAL_LEN)?
                    .copy_from_slice(&total.to_be_bytes());
                ip.get_mut(ipv4::field::CHECKSUM)?.copy_from_slice(&[0, 0]);
                let c = checksum::checksum(ip, 0);
                ip.get_mut(ipv4::field::CHECKSUM)?
                    .copy_from_slice(&c.to_be_bytes());
            }
            Family::V6 => {
                let payload = u16::try_from(ip_len.checked_sub(ipv6::HEADER_LEN)?).ok()?;
                ip.get_mut(ipv6::field::PAYLOAD_LEN)?
                    .copy_from_slice(&payload.to_be_bytes());
            }
        }
        Some(())
    }
}

/// What decides whether two segments merge (everything else in the
/// headers is per segment: IP length, IPv4 identification and checksum;
/// TCP sequence number, checksum, PSH).
#[derive(Clone, Copy, Debug)]
struct Seg {
    family: Family,
    /// TCP header length.
    tcp_hl: usize,
    payload: usize,
    /// `payload` (below 64 KiB) for sequence arithmetic.
    payload32: u32,
    seq: u32,
    flags: u16,
}

impl Seg {
    /// Where the TCP header starts in the frame.
    fn l4(&self) -> usize {
        ETH + self.family.ip_hl()
    }

    /// The headers' length: where the payload starts.
    fn headers(&self) -> usize {
        self.l4() + self.tcp_hl
    }
}

/// The segment in `frame` if it is one this module merges.
fn seg(frame: &[u8]) -> Option<Seg> {
    let family = Family::of(frame)?;
    let l4 = ETH + family.ip_hl();
    let t = frame.get(l4..)?;
    let tcp_hl = usize::from(*t.get(tcp::field::DATA_OFFSET)? >> 4) * 4;
    let payload = t.len().checked_sub(tcp_hl)?;
    let flags =
        u16::from_be_bytes([*t.get(tcp::field::OFF_FLAGS.start)?, *t.get(13)?]) & tcp::FLAGS_MASK;
    if tcp_hl < tcp::HEADER_LEN || payload == 0 || flags & !(tcp_flags::ACK | tcp_flags::PSH) != 0 {
        return None;
    }
    if flags & tcp_flags::ACK == 0 {
        return None;
    }
    let s = t.get(tcp::field::SEQ)?;
    Some(Seg {
        family,
        tcp_hl,
        payload,
        payload32: u32::try_from(payload).ok()?,
        seq: u32::from_be_bytes([*s.first()?, *s.get(1)?, *s.get(2)?, *s.get(3)?]),
        flags,
    })
}

/// The one's complement sum of the pseudo-header of a TCP segment of
/// `l4_len` bytes in `frame` (the addresses from its IP header).
fn pseudo_sum(frame: &[u8], family: Family, l4_len: usize) -> Option<u64> {
    let addrs = match family {
        Family::V4 => frame.get(ETH + 12..ETH + 20)?,
        Family::V6 => frame.get(ETH + 8..ETH + 40)?,
    };
    Some(checksum::ones_sum(
        addrs,
        u64::from(ip_proto::TCP) + l4_len as u64,
    ))
}

/// The sum of segment `s`'s payload in `frame` if its TCP checksum
/// verifies (pseudo-header, header and payload sum to 0xffff): one pass
/// over the payload.
fn verified_payload_sum(frame: &[u8], s: &Seg) -> Option<u64> {
    let l4 = frame.get(s.l4()..)?;
    let header = l4.get(..s.tcp_hl)?;
    let payload = l4.get(s.tcp_hl..)?;
    let sum = checksum::ones_sum(payload, 0);
    let all = checksum::ones_sum(header, pseudo_sum(frame, s.family, l4.len())?) + sum;
    (checksum::fold(all) == 0xffff).then_some(sum)
}

/// `sum` (of bytes that start at an odd offset of the sum they join) as a
/// sum of big-endian words there: byte-swapped (RFC 1071 2(B)).
fn at_offset(sum: u64, offset: usize) -> u64 {
    if offset.is_multiple_of(2) {
        sum
    } else {
        u64::from(checksum::fold(sum).swap_bytes())
    }
}

/// Writes the TCP checksum of merged frame `frame` (headers already
/// fixed) from `payload_sum`, the sum of its whole payload.
fn write_checksum(frame: &mut [u8], first: &Seg, payload_sum: u64) -> Option<()> {
    let l4 = first.l4();
    let pseudo = pseudo_sum(frame, first.family, frame.len().checked_sub(l4)?)?;
    let field = l4 + tcp::field::CHECKSUM.start;
    frame.get_mut(field..field + 2)?.copy_from_slice(&[0, 0]);
    let header = frame.get(l4..l4 + first.tcp_hl)?;
    let c = !checksum::fold(checksum::ones_sum(header, pseudo) + payload_sum);
    frame
        .get_mut(field..field + 2)?
        .copy_from_slice(&c.to_be_bytes());
    Some(())
}

/// Whether `b`'s headers match `a`'s (segment `first`) where they must
/// (see [`Seg`] and [`Family::same_ranges`]).
fn same_flow(a: &[u8], b: &[u8], first: &Seg) -> bool {
    let l4 = first.l4();
    // TCP ports; acknowledgement; (data offset, not flags); window;
    // options.
    let tcp: [(usize, usize); 5] = [
        (l4, l4 + 4),
        (l4 + 8, l4 + 12),
        (l4 + 12, l4 + 13),
        (l4 + 14, l4 + 16),
        (l4 + tcp::HEADER_LEN, l4 + first.tcp_hl),
    ];
    first
        .family
        .same_ranges()
        .iter()
        .chain(tcp.iter())
        .all(|&(s, e)| matches!((a.get(s..e), b.get(s..e)), (Some(x), Some(y)) if x == y))
}

/// Merges runs of consecutive segments in `descs` (frames of `buf`, in
/// buffer order, not overlapping) into frames of at most `max_len` bytes;
/// `descs` then lists the frames that remain. Returns how many segments
/// were merged into others.
pub(super) fn coalesce(buf: &mut [u8], descs: &mut Vec<RxDesc>, max_len: usize) -> usize {
    let n = descs.len();
    let mut out = 0;
    let mut merged = 0;
    let mut i = 0;
    while i < n {
        let Some(&head) = descs.get(i) else { break };
        let mut j = i + 1;
        let first = buf.get(head.off..head.off + head.len).and_then(|f| {
            let s = seg(f)?;
            Some((s, verified_payload_sum(f, &s)?))
        });
        if let Some((first, head_sum)) = first {
            let mut payload_sum = head_sum;
            let hdrs = first.headers();
            let max_len = max_len.min(first.family.max_frame());
            let mut end = head.off + head.len;
            let mut len = head.len;
            let mut next_seq = first.seq.wrapping_add(first.payload32);
            let mut last_full = first.flags & tcp_flags::PSH == 0;
            let mut psh = false;
            while let (true, Some(&d)) = (last_full, descs.get(j)) {
                if d.meta.tun_id != head.meta.tun_id || d.meta.src != head.meta.src {
                    break;
                }
                let (Some(a), Some(b)) = (
                    buf.get(head.off..head.off + hdrs),
                    buf.get(d.off..d.off + d.len),
                ) else {
                    break;
                };
                let Some(s) = seg(b) else { break };
                if s.family != first.family
                    || s.tcp_hl != first.tcp_hl
                    || s.seq != next_seq
                    || s.payload > first.payload
                    || len + s.payload > max_len
                    || !same_flow(a, b, &first)
                {
                    break;
                }
                let Some(sum) = verified_payload_sum(b, &s) else {
                    break;
                };
                // Where this payload lands in the merged one.
                payload_sum += at_offset(sum, len - hdrs);
                // `end` <= d.off: the payload moves left, over bytes
                // already consumed.
                buf.copy_within(d.off + hdrs..d.off + d.len, end);
                end += s.payload;
                len += s.payload;
                next_seq = next_seq.wrapping_add(s.payload32);
                last_full = s.payload == first.payload && s.flags & tcp_flags::PSH == 0;
                psh = s.flags & tcp_flags::PSH != 0;
                merged += 1;
                j += 1;
            }
            let mut verified = true;
            if j > i + 1 {
                let frame = buf.get_mut(head.off..head.off + len);
                verified = frame.is_some_and(|f| {
                    fix_headers(f, &first, psh).is_some()
                        && write_checksum(f, &first, payload_sum).is_some()
                });
            }
            if let Some(o) = descs.get_mut(out) {
                *o = RxDesc {
                    len,
                    verified,
                    ..head
                };
            }
        } else if let Some(o) = descs.get_mut(out) {
            *o = head;
        }
        out += 1;
        i = j;
    }
    descs.truncate(out);
    merged
}

/// The IP length (and IPv4 header checksum) of a merged frame; PSH if the
/// last segment had it.
fn fix_headers(frame: &mut [u8], first: &Seg, psh: bool) -> Option<()> {
    first.family.fix_length(frame)?;
    if psh {
        *frame.get_mut(first.l4() + 13)? |= PSH_LOW_BYTE;
    }
    Some(())
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::super::tso::TcpCut;
    use super::super::VXLAN_HLEN;
    use super::*;
    use oxvs_pipeline::datapath::TunnelMeta;

    /// A DF IPv4 TCP frame with 12 bytes of options and a payload pattern.
    fn frame(payload: usize, seq: u32, flags: u16) -> Vec<u8> {
        let total = 20 + 32 + payload;
        let mut f = vec![0u8; 14 + total];
        f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&(total as u16).to_be_bytes());
        f[20] = 0x40;
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 1, 2]);
        f[30..34].copy_from_slice(&[10, 0, 0, 1]);
        let c = checksum::checksum(&f[14..34], 0);
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f[34..36].copy_from_slice(&5201u16.to_be_bytes());
        f[36..38].copy_from_slice(&40000u16.to_be_bytes());
        f[38..42].copy_from_slice(&seq.to_be_bytes());
        f[42..46].copy_from_slice(&9u32.to_be_bytes());
        f[46..48].copy_from_slice(&((8u16 << 12) | flags).to_be_bytes());
        f[48..50].copy_from_slice(&1000u16.to_be_bytes());
        f[54..66].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9]);
        for (i, b) in f[66..].iter_mut().enumerate() {
            *b = (seq as usize + i) as u8;
        }
        // As it crossed the wire: its TCP checksum complete.
        checksum::complete_l4(&mut f);
        f
    }

    const META: TunnelMeta = TunnelMeta {
        tun_id: 7,
        src: std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)),
        dst: std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)),
    };

    /// Frames laid out as a receive buffer of VXLAN datagrams.
    fn layout(frames: &[Vec<u8>]) -> (Vec<u8>, Vec<RxDesc>) {
        let mut buf = Vec::new();
        let mut descs = Vec::new();
        for f in frames {
            buf.extend_from_slice(&[8, 0, 0, 0, 0, 0, 7, 0]);
            descs.push(RxDesc {
                off: buf.len(),
                len: f.len(),
                meta: META,
                verified: false,
            });
            buf.extend_from_slice(f);
        }
        (buf, descs)
    }

    fn frames_of(buf: &[u8], descs: &[RxDesc]) -> Vec<Vec<u8>> {
        descs
            .iter()
            .map(|d| buf[d.off..d.off + d.len].to_vec())
            .collect()
    }

    #[test]
    fn the_pieces_of_a_cut_segment_merge_back_into_it() {
        let orig = frame(60_000, 0xffff_0000, tcp_flags::ACK | tcp_flags::PSH);
        let cut = TcpCut::of(&orig, 1450).unwrap();
        let mut dgrams = vec![0u8; cut.pieces() * cut.datagram_len()];
        let n = cut.write(&orig, 7, 0, 100, &mut dgrams).unwrap();
        let pieces: Vec<Vec<u8>> = dgrams[..n]
            .chunks(cut.datagram_len())
            .map(|d| d[VXLAN_HLEN..].to_vec())
            .collect();
        let (mut buf, mut descs) = layout(&pieces);
        let merged = coalesce(&mut buf, &mut descs, 65_549);
        assert_eq!(merged, pieces.len() - 1);
        let out = frames_of(&buf, &descs);
        assert_eq!(out.len(), 1);
        let m = &out[0];
        assert_eq!(m.len(), orig.len());
        // Headers as the first piece's, with the whole length; PSH kept.
        assert_eq!(&m[..18], &orig[..18]);
        assert_eq!(checksum::checksum(&m[14..34], 0), 0, "IPv4 checksum");
        assert_eq!(&m[34..46], &orig[34..46], "ports, seq, ack");
        assert_eq!(m[47] & 0x3f, (tcp_flags::ACK | tcp_flags::PSH) as u8);
        assert_eq!(&m[48..50], &orig[48..50]);
        assert_eq!(&m[54..], &orig[54..], "options and payload");
        // The TCP checksum, computed from the pieces' sums, is the
        // original's, and the frame is marked as verified.
        assert_eq!(&m[50..52], &orig[50..52], "TCP checksum");
        assert!(descs[0].verified);
    }

    #[test]
    fn a_corrupted_piece_is_not_merged_and_the_rest_merge_around_it() {
        // Odd payload sizes, so pieces land at odd offsets too.
        let orig = frame(20_001, 77, tcp_flags::ACK);
        let cut = TcpCut::of(&orig, 1451).unwrap();
        let mut dgrams = vec![0u8; cut.pieces() * cut.datagram_len()];
        let n = cut.write(&orig, 7, 0, 100, &mut dgrams).unwrap();
        let mut pieces: Vec<Vec<u8>> = dgrams[..n]
            .chunks(cut.datagram_len())
            .map(|d| d[VXLAN_HLEN..].to_vec())
            .collect();
        assert!(pieces.len() > 8);
        // One bit flipped on the wire in the fourth piece's payload.
        let last = pieces[3].len() - 1;
        pieces[3][last] ^= 0x04;
        let (mut buf, mut descs) = layout(&pieces);
        let merged = coalesce(&mut buf, &mut descs, 65_549);
        assert_eq!(merged, pieces.len() - 3, "3 runs: 0..3, the bad one, 4..");
        let out = frames_of(&buf, &descs);
        assert_eq!(out.len(), 3);
        assert_eq!(out[1], pieces[3], "the corrupted piece is left as it came");
        assert!(!descs[1].verified);
        assert_eq!(
            checksum::verify_or_complete_l4(&mut out[1].clone()),
            checksum::Completion::Bad,
            "and the engine drops it"
        );
        for k in [0, 2] {
            assert!(descs[k].verified);
            assert_eq!(
                checksum::verify_or_complete_l4(&mut out[k].clone()),
                checksum::Completion::Valid,
                "merged run {k}: its computed checksum verifies"
            );
        }
    }

    #[test]
    fn merges_stop_where_the_kernel_would() {
        let p = 1000;
        let a = |seq: u32, flags: u16| frame(p, seq, flags);
        let ack = tcp_flags::ACK;
        // Run 1: three in order (the third with PSH ends it).
        // Then a gap, another flow, a short one ending a run, a SYN.
        let mut other = a(5000, ack);
        other[34..36].copy_from_slice(&5202u16.to_be_bytes());
        let frames = vec![
            a(1000, ack),
            a(2000, ack),
            a(3000, ack | tcp_flags::PSH),
            a(4000, ack), // follows a PSH: new run
            a(5500, ack), // gap: new run
            other,        // another flow
            a(6000, ack), // back to the first flow: new run
            frame(300, 7000, ack),
            a(7300, ack), // after a short one: new run
            a(8300, ack | tcp_flags::SYN),
        ];
        let (mut buf, mut descs) = layout(&frames);
        coalesce(&mut buf, &mut descs, 65_549);
        let lens: Vec<usize> = descs.iter().map(|d| d.len).collect();
        let h = 14 + 20 + 32;
        assert_eq!(
            lens,
            vec![
                h + 3000,
                h + 1000,
                h + 1000,
                h + 1000,
                h + 1300,
                h + 1000,
                h + 1000
            ]
        );
    }

    #[test]
    fn merges_respect_the_size_limit_and_the_tunnel() {
        let frames: Vec<Vec<u8>> = (0..10)
            .map(|k| frame(1000, 1000 * k, tcp_flags::ACK))
            .collect();
        let (mut buf, mut descs) = layout(&frames);
        coalesce(&mut buf, &mut descs, 66 + 4000);
        let lens: Vec<usize> = descs.iter().map(|d| d.len).collect();
        assert_eq!(lens, vec![66 + 4000, 66 + 4000, 66 + 2000]);
        // Another VNI does not merge.
        let (mut buf, mut descs) = layout(&frames[..2]);
        descs[1].meta.tun_id = 8;
        coalesce(&mut buf, &mut descs, 65_549);
        assert_eq!(descs.len(), 2);
        // Nothing merges under one segment's worth.
        let (mut buf, mut descs) = layout(&frames);
        let before = buf.clone();
        assert_eq!(coalesce(&mut buf, &mut descs, 1514), 0);
        assert_eq!(buf, before);
        assert_eq!(descs.len(), 10);
    }

    #[test]
    fn garbage_is_left_as_received() {
        let good = frame(1000, 0, tcp_flags::ACK);
        let mut frames = vec![good.clone()];
        for n in [0, 13, 20, 33, 40, 60, 66] {
            frames.push(good[..n].to_vec());
        }
        let mut bad_len = frame(1000, 1000, tcp_flags::ACK);
        bad_len[16..18].copy_from_slice(&60000u16.to_be_bytes());
        frames.push(bad_len);
        let mut bad_off = frame(1000, 1000, tcp_flags::ACK);
        bad_off[46] = 0xf0;
        frames.push(bad_off);
        let (mut buf, mut descs) = layout(&frames);
        let before = buf.clone();
        assert_eq!(coalesce(&mut buf, &mut descs, 65_549), 0);
        assert_eq!(buf, before);
        assert_eq!(descs.len(), frames.len());
    }

    /// An IPv6 TCP frame (traffic class 0xb8, flow label 0x12345, hop
    /// limit 61) with 12 bytes of options and a payload pattern.
    fn frame6(payload: usize, seq: u32, flags: u16) -> Vec<u8> {
        let plen = 32 + payload;
        let mut f = vec![0u8; 14 + 40 + plen];
        f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14..18].copy_from_slice(&0x6b81_2345u32.to_be_bytes());
        f[18..20].copy_from_slice(&(plen as u16).to_be_bytes());
        f[20] = 6;
        f[21] = 61;
        f[22..38].copy_from_slice(&"fd00:20::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        f[38..54].copy_from_slice(&"fd00:20::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        f[54..56].copy_from_slice(&5201u16.to_be_bytes());
        f[56..58].copy_from_slice(&40000u16.to_be_bytes());
        f[58..62].copy_from_slice(&seq.to_be_bytes());
        f[62..66].copy_from_slice(&9u32.to_be_bytes());
        f[66..68].copy_from_slice(&((8u16 << 12) | flags).to_be_bytes());
        f[68..70].copy_from_slice(&1000u16.to_be_bytes());
        f[74..86].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9]);
        for (i, b) in f[86..].iter_mut().enumerate() {
            *b = (seq as usize + i) as u8;
        }
        checksum::complete_l4(&mut f);
        f
    }

    /// RFC 1071 written out, independent of `checksum`.
    fn naive_fold(b: &[u8], mut s: u64) -> u64 {
        for c in b.chunks(2) {
            s += (u64::from(c[0]) << 8) | u64::from(*c.get(1).unwrap_or(&0));
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }

    #[test]
    fn ipv6_pieces_of_a_cut_segment_merge_back_into_it() {
        let orig = frame6(60_000, 0xffff_0000, tcp_flags::ACK | tcp_flags::PSH);
        let cut = TcpCut::of(&orig, 1450).unwrap();
        let mut dgrams = vec![0u8; cut.pieces() * cut.datagram_len()];
        let n = cut.write(&orig, 7, 0, 100, &mut dgrams).unwrap();
        let pieces: Vec<Vec<u8>> = dgrams[..n]
            .chunks(cut.datagram_len())
            .map(|d| d[VXLAN_HLEN..].to_vec())
            .collect();
        let (mut buf, mut descs) = layout(&pieces);
        let merged = coalesce(&mut buf, &mut descs, 65_549);
        assert_eq!(merged, pieces.len() - 1);
        let out = frames_of(&buf, &descs);
        assert_eq!(out.len(), 1);
        let m = &out[0];
        assert_eq!(m.len(), orig.len());
        // The first piece's headers with the whole payload length; PSH
        // kept; options and payload the original's.
        assert_eq!(
            &m[..20],
            &orig[..20],
            "Ethernet, flow label, payload length"
        );
        assert_eq!(&m[20..66], &orig[20..66], "addresses, ports, seq, ack");
        assert_eq!(m[67] & 0x3f, (tcp_flags::ACK | tcp_flags::PSH) as u8);
        assert_eq!(&m[68..70], &orig[68..70]);
        assert_eq!(&m[74..], &orig[74..], "options and payload");
        // The checksum computed from the pieces' sums verifies over the
        // IPv6 pseudo-header, computed independently.
        assert!(descs[0].verified);
        let plen = m.len() - 54;
        let pseudo = naive_fold(&m[22..54], plen as u64 + 6);
        assert_eq!(naive_fold(&m[54..], pseudo), 0xffff);
    }

    #[test]
    fn ipv6_merges_stop_where_the_kernel_would() {
        let p = 1000;
        let ack = tcp_flags::ACK;
        let a = |seq: u32| frame6(p, seq, ack);
        let with = |seq: u32, at: usize, v: u8| {
            let mut f = a(seq);
            f[at] = v;
            f
        };
        let frames = vec![
            a(1000),
            a(2000),
            a(3000),              // run of three
            with(4000, 16, 0x99), // another flow label: new run
            with(5000, 14, 0x6c), // another traffic class: new run
            with(6000, 21, 60),   // another hop limit: new run
            with(7000, 53, 7),    // another source address: new run
            a(8000),              // back to the first: new run
            frame(p, 9000, ack),  // IPv4 after IPv6: new run
        ];
        let (mut buf, mut descs) = layout(&frames);
        let merged = coalesce(&mut buf, &mut descs, 65_549);
        let lens: Vec<usize> = descs.iter().map(|d| d.len).collect();
        let h = 14 + 40 + 32;
        assert_eq!(
            lens,
            vec![
                h + 3000,
                h + 1000,
                h + 1000,
                h + 1000,
                h + 1000,
                h + 1000,
                66 + 1000
            ]
        );
        assert_eq!(merged, 2);
        // The merged frame's payload length says its length.
        let m = frames_of(&buf, &descs).remove(0);
        assert_eq!(
            usize::from(u16::from_be_bytes([m[18], m[19]])),
            m.len() - 54
        );
        // An extension header (hop-by-hop) or another next header: never
        // merged, left as received.
        for nh in [0, 60, 17] {
            let frames: Vec<Vec<u8>> = (0..3).map(|k| with(1000 * k, 20, nh)).collect();
            let (mut buf, mut descs) = layout(&frames);
            let before = buf.clone();
            assert_eq!(
                coalesce(&mut buf, &mut descs, 65_549),
                0,
                "next header {nh}"
            );
            assert_eq!(buf, before);
        }
    }

    #[test]
    fn ipv6_merges_respect_the_size_limit() {
        let frames: Vec<Vec<u8>> = (0..10)
            .map(|k| frame6(1000, 1000 * k, tcp_flags::ACK))
            .collect();
        let (mut buf, mut descs) = layout(&frames);
        coalesce(&mut buf, &mut descs, 86 + 4000);
        let lens: Vec<usize> = descs.iter().map(|d| d.len).collect();
        assert_eq!(lens, vec![86 + 4000, 86 + 4000, 86 + 2000]);
    }

    #[test]
    fn ipv6_garbage_is_left_as_received() {
        let good = frame6(1000, 0, tcp_flags::ACK);
        let mut frames = vec![good.clone()];
        // Every truncation of the next segment.
        for n in 0..good.len() {
            let mut f = frame6(1000, 1000, tcp_flags::ACK);
            f.truncate(n);
            frames.push(f);
        }
        // Payload lengths longer and shorter than the frame, 0, below
        // the TCP header; data offsets beyond the payload and below 5.
        for plen in [60_000u16, 1031, 0, 19] {
            let mut f = frame6(1000, 1000, tcp_flags::ACK);
            f[18..20].copy_from_slice(&plen.to_be_bytes());
            frames.push(f);
        }
        for off in [0xf0u8, 0x40, 0x00] {
            let mut f = frame6(1000, 1000, tcp_flags::ACK);
            f[66] = off;
            frames.push(f);
        }
        let mut v4 = frame6(1000, 1000, tcp_flags::ACK);
        v4[14] = 0x4b;
        frames.push(v4);
        let (mut buf, mut descs) = layout(&frames);
        let before = buf.clone();
        assert_eq!(coalesce(&mut buf, &mut descs, 65_549), 0);
        assert_eq!(buf, before);
        assert_eq!(descs.len(), frames.len());
    }

    /// Trains of segments of both families with random header bytes
    /// changed and random truncations: never a panic, every segment
    /// accounted for, and every merged frame's IP length its length.
    #[test]
    fn mangled_trains_merge_right_or_not_at_all() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rand = move |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let mut merges = 0;
        for round in 0..3000 {
            let v6 = round % 2 == 1;
            let mut frames: Vec<Vec<u8>> = (0..8)
                .map(|k| {
                    let flags = tcp_flags::ACK;
                    if v6 {
                        frame6(500, 500 * k, flags)
                    } else {
                        frame(500, 500 * k, flags)
                    }
                })
                .collect();
            for _ in 0..rand(4) {
                let f = &mut frames[rand(8)];
                let (at, v) = (rand(90), rand(256) as u8);
                if let Some(b) = f.get_mut(at) {
                    *b = v;
                }
                if rand(4) == 0 {
                    let n = rand(f.len() + 1);
                    f.truncate(n);
                }
            }
            let (mut buf, mut descs) = layout(&frames);
            let merged = coalesce(&mut buf, &mut descs, 14 + 40 + 32 + 500 * (1 + rand(8)));
            merges += merged;
            assert_eq!(descs.len() + merged, frames.len());
            for (d, mut f) in descs.iter().zip(frames_of(&buf, &descs)) {
                if frames.iter().all(|o| o.len() != d.len) {
                    assert!(Family::of(&f).is_some(), "round {round}: {f:?}");
                }
                // Whatever was merged (or passed as verified) verifies: a
                // mangled segment never hides in a merged frame.
                if d.verified {
                    assert_eq!(
                        checksum::verify_or_complete_l4(&mut f),
                        checksum::Completion::Valid,
                        "round {round}"
                    );
                }
            }
        }
        assert!(merges > 1000, "only {merges} merges");
    }
}
