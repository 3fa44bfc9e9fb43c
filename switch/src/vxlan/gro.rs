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
//! - same tunnel (VNI and source), same Ethernet header, IPv4 without
//!   options or fragmentation and with DF, same TOS, TTL, addresses;
//! - same TCP ports, acknowledgement, window and options (byte for
//!   byte); flags ACK, with PSH allowed on the last segment merged;
//! - each segment's sequence number follows the previous one's end, and
//!   every segment but the last carries as much payload as the first.
//!
//! The merged frame has the first segment's headers with the IPv4 total
//! length and header checksum rewritten and PSH if the last had it. Its
//! TCP checksum is **not** computed here: the engine completes the TCP
//! checksum of every tunnelled frame anyway (`checksum::complete_l4`: a
//! kernel peer over a veth underlay leaves it partial), so coalescing is
//! only enabled with that completion on. The frames are untrusted: every
//! length is checked, nothing indexes unchecked, and a frame that does
//! not qualify is left exactly as received.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use oxvs_pipeline::checksum;
use oxvs_pipeline::field::tcp_flags;
use oxvs_pipeline::wire::{ethertype, ip_proto, ipv4, tcp};

use super::RxDesc;

const ETH: usize = 14;
const IP: usize = ipv4::HEADER_LEN;
/// PSH in the TCP header's 14th byte (the low byte of the flags word).
const PSH_LOW_BYTE: u8 = 0x08;
const _: () = assert!(tcp_flags::PSH == PSH_LOW_BYTE as u16);

/// What decides whether two segments merge (everything else in the
/// headers is per segment: IPv4 length, identification, checksum; TCP
/// sequence number, checksum, PSH).
#[derive(Clone, Copy, Debug)]
struct Seg {
    /// TCP header length.
    tcp_hl: usize,
    payload: usize,
    /// `payload` (below 64 KiB) for sequence arithmetic.
    payload32: u32,
    seq: u32,
    flags: u16,
}

/// The segment in `frame` if it is one this module merges.
fn seg(frame: &[u8]) -> Option<Seg> {
    let eth = frame.get(..ETH)?;
    if eth.get(12..14)? != ethertype::IPV4.to_be_bytes() {
        return None;
    }
    let ip = frame.get(ETH..ETH + IP)?;
    let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
    let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]);
    if *ip.first()? != 0x45
        || *ip.get(9)? != ip_proto::TCP
        || frag & !ipv4::FLAG_DF != 0
        || frag & ipv4::FLAG_DF == 0
        || ETH + total != frame.len()
    {
        return None;
    }
    let t = frame.get(ETH + IP..)?;
    let tcp_hl = usize::from(*t.get(tcp::field::DATA_OFFSET)? >> 4) * 4;
    let payload = (total).checked_sub(IP + tcp_hl)?;
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
        tcp_hl,
        payload,
        payload32: u32::try_from(payload).ok()?,
        seq: u32::from_be_bytes([*s.first()?, *s.get(1)?, *s.get(2)?, *s.get(3)?]),
        flags,
    })
}

/// Whether `b`'s headers match `a`'s where they must (see [`Seg`]).
fn same_flow(a: &[u8], b: &[u8], tcp_hl: usize) -> bool {
    // Ethernet; IPv4 version..TOS; TTL, protocol; addresses; TCP ports;
    // acknowledgement; (data offset, not flags); window; options.
    let ranges: [(usize, usize); 8] = [
        (0, ETH + 2),
        (ETH + 8, ETH + 10),
        (ETH + 12, ETH + IP),
        (ETH + IP, ETH + IP + 4),
        (ETH + IP + 8, ETH + IP + 12),
        (ETH + IP + 12, ETH + IP + 13),
        (ETH + IP + 14, ETH + IP + 16),
        (ETH + IP + tcp::HEADER_LEN, ETH + IP + tcp_hl),
    ];
    ranges
        .iter()
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
        let first = buf.get(head.off..head.off + head.len).and_then(seg);
        if let Some(first) = first {
            let hdrs = ETH + IP + first.tcp_hl;
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
                if s.tcp_hl != first.tcp_hl
                    || s.seq != next_seq
                    || s.payload > first.payload
                    || len + s.payload > max_len
                    || !same_flow(a, b, first.tcp_hl)
                {
                    break;
                }
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
            if j > i + 1 {
                fix_headers(buf.get_mut(head.off..head.off + len), psh);
            }
            if let Some(o) = descs.get_mut(out) {
                *o = RxDesc { len, ..head };
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

/// IPv4 total length and header checksum of a merged frame; PSH if the
/// last segment had it.
fn fix_headers(frame: Option<&mut [u8]>, psh: bool) {
    let Some(frame) = frame else { return };
    let Ok(total) = u16::try_from(frame.len() - ETH) else {
        return;
    };
    let Some(ip) = frame.get_mut(ETH..ETH + IP) else {
        return;
    };
    if let Some(l) = ip.get_mut(2..4) {
        l.copy_from_slice(&total.to_be_bytes());
    }
    if let Some(c) = ip.get_mut(10..12) {
        c.copy_from_slice(&[0, 0]);
    }
    let c = checksum::checksum(ip, 0);
    if let Some(f) = ip.get_mut(10..12) {
        f.copy_from_slice(&c.to_be_bytes());
    }
    if psh {
        if let Some(f) = frame.get_mut(ETH + IP + 13) {
            *f |= PSH_LOW_BYTE;
        }
    }
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
        f
    }

    const META: TunnelMeta = TunnelMeta {
        tun_id: 7,
        src: 0x0a00_0002,
        dst: 0x0a00_0001,
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
        // The engine's completion makes the TCP checksum the original's.
        let mut done = m.clone();
        checksum::complete_l4(&mut done);
        let mut want = orig.clone();
        checksum::complete_l4(&mut want);
        assert_eq!(&done[50..52], &want[50..52]);
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
}
