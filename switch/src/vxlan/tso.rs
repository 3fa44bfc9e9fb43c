//! Segmentation of large inner TCP frames for the tunnel (userspace TSO).
//!
//! A pod on a node with large frames (multi-buffer AF_XDP, MTU up to
//! 65535) sends TCP segments far larger than the tunnel's inner MTU
//! (underlay − 50). Instead of refusing them with "fragmentation needed",
//! the tunnel port cuts such a segment the way a NIC's TSO (or the
//! kernel's software GSO) cuts a super-frame: every piece carries a copy of
//! the Ethernet, IPv4 and TCP headers (options included), with
//!
//! - IPv4 total length and header checksum rewritten, the identification
//!   incremented per piece (as Linux's TSO does);
//! - TCP sequence number advanced by the bytes before the piece; FIN and
//!   PSH only on the last piece, CWR only on the first; the checksum
//!   computed over the pseudo-header, header and piece (the original one
//!   is ignored: the engine has completed a partial one on receive, and a
//!   piece needs its own anyway).
//!
//! Every piece but the last carries `mss` bytes of payload, so the VXLAN
//! datagrams are all the same length but the last: what a UDP socket's
//! generic segmentation offload (`UDP_SEGMENT`) needs to send them all with
//! one `sendmsg`, as one buffer the kernel passes down its stack once.
//!
//! Only plain IPv4 TCP data segments are cut: not a fragment, no SYN, RST
//! or URG (a SYN with data, or urgent data, is sent as the kernel would
//! not cut it either), Ethernet with at most the wire layer's VLAN tags.
//! Everything else keeps the tunnel's MTU rules (`send`'s "too big" or
//! outer fragmentation). Frames come from pods: every length is checked,
//! nothing here indexes or truncates unchecked.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use oxvs_pipeline::checksum;
use oxvs_pipeline::field::tcp_flags;
use oxvs_pipeline::wire::ethernet::{self, L2};
use oxvs_pipeline::wire::ipv4::{self, Ipv4Packet};
use oxvs_pipeline::wire::tcp::{self, TcpPacket};
use oxvs_pipeline::wire::{ethertype, ip_proto};

use super::VXLAN_HLEN;

/// How one large IPv4 TCP frame is cut (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TcpCut {
    /// Where the IPv4 header starts (Ethernet header and VLAN tags).
    l3: usize,
    ip_hl: usize,
    tcp_hl: usize,
    /// TCP payload bytes in the frame.
    payload: usize,
    /// Payload bytes per piece.
    mss: usize,
}

impl TcpCut {
    /// How to cut `frame` so that every piece's IP packet fits `inner_mtu`;
    /// `None` if it is not a TCP data segment this module cuts (module doc)
    /// or already fits.
    pub(super) fn of(frame: &[u8], inner_mtu: usize) -> Option<TcpCut> {
        let L2 {
            ethertype: ethertype::IPV4,
            l3_offset,
            payload: l3,
            ..
        } = ethernet::l2_of(frame)?
        else {
            return None;
        };
        let ip = Ipv4Packet::new_checked(l3).ok()?;
        let ip_hl = ip.header_len();
        let total = usize::from(ip.total_len());
        if ip.version() != 4
            || ip.protocol() != ip_proto::TCP
            || ip_hl < ipv4::HEADER_LEN
            || total > l3.len()
            || ip.flags_frag() & (ipv4::FLAG_MF | ipv4::FRAG_OFFSET_MASK) != 0
            || total <= inner_mtu
        {
            return None;
        }
        let seg = TcpPacket::new_checked(l3.get(ip_hl..total)?).ok()?;
        let tcp_hl = seg.header_len();
        if tcp_hl < tcp::HEADER_LEN
            || seg.flags() & (tcp_flags::SYN | tcp_flags::RST | tcp_flags::URG) != 0
        {
            return None;
        }
        let payload = total.checked_sub(ip_hl + tcp_hl).filter(|p| *p > 0)?;
        let mss = inner_mtu.checked_sub(ip_hl + tcp_hl).filter(|m| *m >= 64)?;
        Some(TcpCut {
            l3: l3_offset,
            ip_hl,
            tcp_hl,
            payload,
            mss,
        })
    }

    /// How many pieces.
    pub(super) fn pieces(&self) -> usize {
        self.payload.div_ceil(self.mss)
    }

    /// The headers every piece repeats.
    fn headers(&self) -> usize {
        self.l3 + self.ip_hl + self.tcp_hl
    }

    /// The length of a full piece's VXLAN datagram payload (VXLAN header +
    /// inner frame): the segment size for `UDP_SEGMENT`.
    pub(super) fn datagram_len(&self) -> usize {
        VXLAN_HLEN + self.headers() + self.mss
    }

    /// The inner frame length of piece `k`.
    #[cfg(test)]
    pub(super) fn inner_len(&self, k: usize) -> usize {
        let start = k.saturating_mul(self.mss).min(self.payload);
        self.headers() + self.mss.min(self.payload - start)
    }

    /// Writes pieces `first..first + count` back to back into `out`, each
    /// as a VXLAN header (`vni`) and its inner frame; returns the bytes
    /// written, or `None` (nothing usable in `out`) if they do not fit or
    /// `frame` is not the frame this cut was made for.
    pub(super) fn write(
        &self,
        frame: &[u8],
        vni: u32,
        first: usize,
        count: usize,
        out: &mut [u8],
    ) -> Option<usize> {
        let hdrs = self.headers();
        let head = frame.get(..hdrs)?;
        let body = frame.get(hdrs..hdrs + self.payload)?;
        let ip = Ipv4Packet::new_checked(head.get(self.l3..)?).ok()?;
        let ident = ip.ident();
        let pseudo = checksum::ones_sum(ip.addrs(), u64::from(ip_proto::TCP));
        let seg = TcpPacket::new_checked(head.get(self.l3 + self.ip_hl..)?).ok()?;
        let seq = seg.seq();
        let flags = seg.flags();
        let last = self.pieces().checked_sub(1)?;
        let mut at = 0;
        for k in first..first.checked_add(count)?.min(last + 1) {
            let start = k.checked_mul(self.mss)?;
            let piece = body.get(start..(start + self.mss).min(self.payload))?;
            let inner = hdrs + piece.len();
            let dgram = out.get_mut(at..at + VXLAN_HLEN + inner)?;
            let (vx, dgram) = dgram.split_at_mut_checked(VXLAN_HLEN)?;
            vx.copy_from_slice(&vxlan_header(vni));
            let (h, p) = dgram.split_at_mut_checked(hdrs)?;
            h.copy_from_slice(head);
            p.copy_from_slice(piece);
            let (_, l3) = h.split_at_mut_checked(self.l3)?;
            let (iph, tcph) = l3.split_at_mut_checked(self.ip_hl)?;
            // IPv4: length, identification, checksum.
            let ip_len = u16::try_from(self.ip_hl + self.tcp_hl + piece.len()).ok()?;
            put16(iph, ipv4::field::TOTAL_LEN.start, ip_len)?;
            let k16 = u16::try_from(k & 0xffff).ok()?;
            put16(iph, ipv4::field::IDENT.start, ident.wrapping_add(k16))?;
            put16(iph, ipv4::field::CHECKSUM.start, 0)?;
            let c = checksum::checksum(iph, 0);
            put16(iph, ipv4::field::CHECKSUM.start, c)?;
            // TCP: sequence, flags, checksum.
            let off = u32::try_from(start).ok()?;
            put32(tcph, tcp::field::SEQ.start, seq.wrapping_add(off))?;
            let mut f = flags;
            if k != last {
                f &= !(tcp_flags::FIN | tcp_flags::PSH);
            }
            if k != 0 {
                f &= !tcp_flags::CWR;
            }
            let off_flags = tcph.get(tcp::field::OFF_FLAGS)?;
            let word = u16::from_be_bytes([*off_flags.first()?, *off_flags.get(1)?]);
            put16(
                tcph,
                tcp::field::OFF_FLAGS.start,
                (word & !tcp::FLAGS_MASK) | f,
            )?;
            put16(tcph, tcp::field::CHECKSUM.start, 0)?;
            let l4_len = u64::from(ip_len) - u64::try_from(self.ip_hl).ok()?;
            let sum = checksum::ones_sum(tcph, pseudo + l4_len);
            let c = checksum::checksum(p, sum);
            put16(tcph, tcp::field::CHECKSUM.start, c)?;
            at += VXLAN_HLEN + inner;
        }
        Some(at)
    }
}

/// Whether `frame` is IPv4 carrying TCP (whose flow then leaves from a
/// TSO socket, segmented or not).
pub(super) fn is_ipv4_tcp(frame: &[u8]) -> bool {
    matches!(
        ethernet::l2_of(frame),
        Some(L2 { ethertype: ethertype::IPV4, payload, .. })
            if Ipv4Packet::new_checked(payload).is_ok_and(|ip| ip.protocol() == ip_proto::TCP)
    )
}

fn vxlan_header(vni: u32) -> [u8; VXLAN_HLEN] {
    let v = (vni & 0x00ff_ffff) << 8;
    let [a, b, c, d] = v.to_be_bytes();
    [0x08, 0, 0, 0, a, b, c, d]
}

fn put16(b: &mut [u8], at: usize, v: u16) -> Option<()> {
    b.get_mut(at..at + 2)?.copy_from_slice(&v.to_be_bytes());
    Some(())
}

fn put32(b: &mut [u8], at: usize, v: u32) -> Option<()> {
    b.get_mut(at..at + 4)?.copy_from_slice(&v.to_be_bytes());
    Some(())
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    /// An Ethernet + IPv4 (DF) + TCP frame with `opts` TCP option bytes
    /// and `payload` bytes of a pattern; checksums valid.
    fn tcp_frame(payload: usize, opts: usize, flags: u16) -> Vec<u8> {
        let tcp_hl = 20 + opts;
        let total = 20 + tcp_hl + payload;
        let mut f = vec![0u8; 14 + total];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let ip = &mut f[14..34];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0xfffeu16.to_be_bytes());
        ip[6] = 0x40;
        ip[8] = 64;
        ip[9] = 6;
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 1, 2]);
        let c = checksum::checksum(ip, 0);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let t = &mut f[34..34 + tcp_hl];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&5201u16.to_be_bytes());
        t[4..8].copy_from_slice(&0xffff_f000u32.to_be_bytes());
        t[8..12].copy_from_slice(&77u32.to_be_bytes());
        t[12..14].copy_from_slice(&((((tcp_hl / 4) as u16) << 12) | flags).to_be_bytes());
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        for (i, b) in t[20..].iter_mut().enumerate() {
            *b = if i % 4 == 0 { 1 } else { 8 };
        }
        for (i, b) in f[34 + tcp_hl..].iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        f
    }

    fn tcp_ok(inner: &[u8]) -> bool {
        let ip = &inner[14..];
        let hl = usize::from(ip[0] & 15) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let pseudo = checksum::ones_sum(&ip[12..20], 6 + (total - hl) as u64);
        checksum::checksum(&ip[..hl], 0) == 0 && checksum::checksum(&ip[hl..total], pseudo) == 0
    }

    #[test]
    fn pieces_put_back_together_are_the_segment() {
        let frame = tcp_frame(65_000, 12, tcp_flags::ACK | tcp_flags::PSH | tcp_flags::FIN);
        let cut = TcpCut::of(&frame, 1450).expect("cut");
        assert_eq!(cut.mss, 1450 - 20 - 32);
        let n = cut.pieces();
        assert_eq!(n, 65_000usize.div_ceil(1398));
        let mut out = vec![0u8; n * cut.datagram_len()];
        // In two sends, as the port does (a UDP GSO send is below 64 KiB).
        let a = cut.write(&frame, 42, 0, 30, &mut out).unwrap();
        let b = cut.write(&frame, 42, 30, 100, &mut out[a..]).unwrap();
        let mut payload = Vec::new();
        let mut at = 0;
        for k in 0..n {
            let len = VXLAN_HLEN + cut.inner_len(k);
            assert!(k + 1 == n || len == cut.datagram_len(), "piece {k}: {len}");
            let d = &out[at..at + len];
            at += len;
            assert_eq!(&d[..8], &[0x08, 0, 0, 0, 0, 0, 42, 0]);
            let inner = &d[8..];
            assert!(inner.len() - 14 - 20 <= 1450);
            assert!(tcp_ok(inner), "piece {k} checksums");
            assert_eq!(&inner[..14], &frame[..14]);
            let id = u16::from_be_bytes([inner[18], inner[19]]);
            assert_eq!(id, 0xfffeu16.wrapping_add(k as u16));
            assert_eq!(inner[20], 0x40, "DF kept");
            let t = &inner[34..];
            let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
            assert_eq!(seq, 0xffff_f000u32.wrapping_add((k * 1398) as u32));
            let flags = u16::from_be_bytes([t[12], t[13]]) & 0xfff;
            let want = if k + 1 == n {
                tcp_flags::ACK | tcp_flags::PSH | tcp_flags::FIN
            } else {
                tcp_flags::ACK
            };
            assert_eq!(flags, want, "piece {k} flags");
            assert_eq!(&t[20..32], &frame[54..66], "options copied");
            payload.extend_from_slice(&t[32..]);
        }
        assert_eq!(at, a + b);
        assert_eq!(payload, frame[34 + 32..]);
    }

    #[test]
    fn cwr_only_on_the_first_piece() {
        let frame = tcp_frame(5000, 0, tcp_flags::ACK | tcp_flags::CWR);
        let cut = TcpCut::of(&frame, 1500).unwrap();
        let mut out = vec![0u8; cut.pieces() * cut.datagram_len()];
        cut.write(&frame, 1, 0, 10, &mut out).unwrap();
        let flags = |k: usize| {
            let t = &out[k * cut.datagram_len() + 8 + 34..];
            u16::from_be_bytes([t[12], t[13]]) & 0xfff
        };
        assert_eq!(flags(0), tcp_flags::ACK | tcp_flags::CWR);
        assert_eq!(flags(1), tcp_flags::ACK);
        assert_eq!(flags(3), tcp_flags::ACK);
    }

    #[test]
    fn what_is_not_cut() {
        let big = tcp_frame(4000, 0, tcp_flags::ACK);
        assert!(TcpCut::of(&big, 1450).is_some());
        // Fits already.
        assert!(TcpCut::of(&big, 9000).is_none());
        // SYN, RST, URG.
        for f in [tcp_flags::SYN, tcp_flags::RST, tcp_flags::URG] {
            assert!(TcpCut::of(&tcp_frame(4000, 0, f), 1450).is_none());
        }
        // A fragment.
        let mut frag = big.clone();
        frag[20] |= 0x20;
        assert!(TcpCut::of(&frag, 1450).is_none());
        // UDP.
        let mut udp = big.clone();
        udp[23] = 17;
        assert!(TcpCut::of(&udp, 1450).is_none());
        // A total length beyond the frame, a data offset beyond it.
        let mut long = big.clone();
        long[16..18].copy_from_slice(&9000u16.to_be_bytes());
        assert!(TcpCut::of(&long, 1450).is_none());
        let mut off = big.clone();
        off[46] = 0x40;
        assert!(TcpCut::of(&off, 1450).is_none());
        // No payload, or an MTU leaving no room.
        assert!(TcpCut::of(&tcp_frame(0, 40, tcp_flags::ACK), 70).is_none());
        assert!(TcpCut::of(&big, 80).is_none());
        // Truncated and garbage frames never panic.
        for n in 0..big.len().min(120) {
            let _ = TcpCut::of(&big[..n], 60);
        }
    }

    #[test]
    fn write_refuses_a_short_buffer_or_another_frame() {
        let frame = tcp_frame(4000, 0, tcp_flags::ACK);
        let cut = TcpCut::of(&frame, 1450).unwrap();
        let mut out = vec![0u8; cut.datagram_len()];
        assert!(cut.write(&frame, 1, 0, 2, &mut out).is_none());
        assert!(cut.write(&frame[..3000], 1, 0, 1, &mut out).is_none());
        assert_eq!(
            cut.write(&frame, 1, 0, 1, &mut out),
            Some(cut.datagram_len())
        );
    }
}
