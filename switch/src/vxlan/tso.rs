//! Segmentation of large inner TCP frames for the tunnel (userspace TSO).
//!
//! A pod on a node with large frames (multi-buffer AF_XDP, MTU up to
//! 65535) sends TCP segments far larger than the tunnel's inner MTU
//! (underlay − 50). Instead of refusing them with "fragmentation needed"
//! (IPv6: "packet too big"), the tunnel port cuts such a segment the way a
//! NIC's TSO (or the kernel's software GSO) cuts a super-frame: every
//! piece carries a copy of the Ethernet, IP and TCP headers (options
//! included), with
//!
//! - the IP length rewritten: IPv4's total length, with the
//!   identification incremented per piece (as Linux's TSO does) and the
//!   header checksum recomputed; IPv6's payload length (no header
//!   checksum; flow label, traffic class and hop limit copied);
//! - TCP sequence number advanced by the bytes before the piece; FIN and
//!   PSH only on the last piece, CWR only on the first; the checksum
//!   computed over the family's pseudo-header, header and piece (the
//!   original one is ignored: the engine has completed a partial one on
//!   receive, and a piece needs its own anyway).
//!
//! The two families differ only in the IP header ([`Family`]: its length,
//! its length field, its pseudo-header); the TCP side and the pieces are
//! one code path.
//!
//! Every piece but the last carries `mss` bytes of payload, so the VXLAN
//! datagrams are all the same length but the last: what a UDP socket's
//! generic segmentation offload (`UDP_SEGMENT`) needs to send them all with
//! one `sendmsg`, as one buffer the kernel passes down its stack once.
//!
//! Only plain TCP data segments are cut: IPv4 not a fragment, IPv6 with
//! TCP right after the fixed header (an extension header chain would have
//! to be repeated and, for fragments or routing headers, rewritten: the
//! kernel's GSO does not take those either); no SYN, RST or URG (a SYN
//! with data, or urgent data, is sent as the kernel would not cut it
//! either); Ethernet with at most the wire layer's VLAN tags. Everything
//! else keeps the tunnel's MTU rules (`send`'s "too big" or outer
//! fragmentation). Frames come from pods: every length is checked,
//! nothing here indexes or truncates unchecked.

#![deny(clippy::indexing_slicing, clippy::cast_possible_truncation)]

use oxvs_pipeline::checksum;
use oxvs_pipeline::field::tcp_flags;
use oxvs_pipeline::wire::ethernet::{self, L2};
use oxvs_pipeline::wire::ipv4::{self, Ipv4Packet};
use oxvs_pipeline::wire::ipv6::{self, Ipv6Packet};
use oxvs_pipeline::wire::tcp::{self, TcpPacket};
use oxvs_pipeline::wire::{ethertype, ip_proto};

use super::VXLAN_HLEN;

/// The IP header's part in a cut, the only thing the families do not
/// share: which header carries TCP, how long it is, what its length field
/// counts, and the pseudo-header the TCP checksum covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    /// IPv4, options allowed, not a fragment: total length (header
    /// included), identification and header checksum per piece.
    V4,
    /// IPv6 with TCP as the fixed header's next header: payload length
    /// (header excluded) per piece, nothing else.
    V6,
}

/// An inner IP packet carrying TCP that [`TcpCut`] may cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IpTcp {
    family: Family,
    /// IP header length (IPv4 options included; 40 for IPv6).
    hl: usize,
    /// The IP packet's length as its header says (header included), within
    /// the frame.
    len: usize,
}

impl Family {
    /// The TCP packet in `l3` (an Ethernet payload of type `ethertype`),
    /// if it is one this module cuts (module doc) and its length field
    /// fits `l3`.
    fn tcp_packet(ethertype: u16, l3: &[u8]) -> Option<IpTcp> {
        match ethertype {
            ethertype::IPV4 => Self::v4_tcp(l3),
            ethertype::IPV6 => Self::v6_tcp(l3),
            _ => None,
        }
    }

    /// IPv4: TCP, a valid header length, not a fragment.
    fn v4_tcp(l3: &[u8]) -> Option<IpTcp> {
        let ip = Ipv4Packet::new_checked(l3).ok()?;
        let hl = ip.header_len();
        let len = usize::from(ip.total_len());
        let unfragmented = ip.flags_frag() & (ipv4::FLAG_MF | ipv4::FRAG_OFFSET_MASK) == 0;
        (ip.version() == 4
            && ip.protocol() == ip_proto::TCP
            && hl >= ipv4::HEADER_LEN
            && len <= l3.len()
            && unfragmented)
            .then_some(IpTcp {
                family: Family::V4,
                hl,
                len,
            })
    }

    /// IPv6: TCP directly after the fixed header (no extension header).
    /// A payload length of 0 (a jumbogram) leaves no TCP header: refused
    /// by the caller.
    fn v6_tcp(l3: &[u8]) -> Option<IpTcp> {
        let ip = Ipv6Packet::new_checked(l3).ok()?;
        let len = ipv6::HEADER_LEN + usize::from(ip.payload_len());
        (ip.version() == 6 && ip.next_header() == ip_proto::TCP && len <= l3.len()).then_some(
            IpTcp {
                family: Family::V6,
                hl: ipv6::HEADER_LEN,
                len,
            },
        )
    }

    /// The pseudo-header's sum without the TCP length (added per piece):
    /// the addresses of the IP header `iph`, and the protocol.
    fn pseudo(self, iph: &[u8]) -> Option<u64> {
        let addrs = match self {
            Family::V4 => Ipv4Packet::new_checked(iph).ok()?.addrs(),
            Family::V6 => Ipv6Packet::new_checked(iph).ok()?.addrs(),
        };
        Some(checksum::ones_sum(addrs, u64::from(ip_proto::TCP)))
    }

    /// Rewrites piece `k`'s IP header `iph` (a copy of the original's)
    /// for an IP packet of `ip_len` bytes.
    fn write_header(self, iph: &mut [u8], ip_len: u16, k: usize) -> Option<()> {
        match self {
            Family::V4 => {
                put16(iph, ipv4::field::TOTAL_LEN.start, ip_len)?;
                let ident = get16(iph, ipv4::field::IDENT.start)?;
                let k16 = u16::try_from(k & 0xffff).ok()?;
                put16(iph, ipv4::field::IDENT.start, ident.wrapping_add(k16))?;
                put16(iph, ipv4::field::CHECKSUM.start, 0)?;
                let c = checksum::checksum(iph, 0);
                put16(iph, ipv4::field::CHECKSUM.start, c)
            }
            Family::V6 => {
                let payload = ip_len.checked_sub(u16::try_from(ipv6::HEADER_LEN).ok()?)?;
                put16(iph, ipv6::field::PAYLOAD_LEN.start, payload)
            }
        }
    }
}

/// How one large TCP frame is cut (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct TcpCut {
    family: Family,
    /// Where the IP header starts (Ethernet header and VLAN tags).
    l3: usize,
    ip_hl: usize,
    tcp_hl: usize,
    /// TCP payload bytes in the frame.
    payload: usize,
    /// Payload bytes per piece.
    mss: usize,
}

impl TcpCut {
    /// How to cut `frame` so that every piece fits `inner_mtu` (the inner
    /// MTU of the tunnel, which counts a 14-byte inner Ethernet header:
    /// each VLAN tag the frame carries takes its 4 bytes from the IP
    /// packet's room); `None` if it is not a TCP data segment this module
    /// cuts (module doc) or already fits.
    pub(super) fn of(frame: &[u8], inner_mtu: usize) -> Option<TcpCut> {
        let L2 {
            ethertype,
            l3_offset,
            payload: l3,
            ..
        } = ethernet::l2_of(frame)?;
        let ip = Family::tcp_packet(ethertype, l3)?;
        let room = inner_mtu.checked_sub(l3_offset.checked_sub(ethernet::HEADER_LEN)?)?;
        if ip.len <= room {
            return None;
        }
        let seg = TcpPacket::new_checked(l3.get(ip.hl..ip.len)?).ok()?;
        let tcp_hl = seg.header_len();
        if tcp_hl < tcp::HEADER_LEN
            || seg.flags() & (tcp_flags::SYN | tcp_flags::RST | tcp_flags::URG) != 0
        {
            return None;
        }
        let payload = ip.len.checked_sub(ip.hl + tcp_hl).filter(|p| *p > 0)?;
        let mss = room.checked_sub(ip.hl + tcp_hl).filter(|m| *m >= 64)?;
        Some(TcpCut {
            family: ip.family,
            l3: l3_offset,
            ip_hl: ip.hl,
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
        let pseudo = self.family.pseudo(head.get(self.l3..)?)?;
        let seg = TcpPacket::new_checked(head.get(self.l3 + self.ip_hl..)?).ok()?;
        let (seq, flags) = (seg.seq(), seg.flags());
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
            let ip_len = u16::try_from(self.ip_hl + self.tcp_hl + piece.len()).ok()?;
            self.family.write_header(iph, ip_len, k)?;
            let piece_seq = seq.wrapping_add(u32::try_from(start).ok()?);
            let tcp_len = u64::try_from(self.tcp_hl + piece.len()).ok()?;
            let piece_flags = flags_of_piece(flags, k, last);
            write_tcp(tcph, p, piece_seq, piece_flags, pseudo + tcp_len)?;
            at += VXLAN_HLEN + inner;
        }
        Some(at)
    }
}

/// The bytes `frame`'s VLAN tags add to its Ethernet header (0 for an
/// untagged or unparsable frame): what the IP packet loses of the
/// tunnel's inner MTU.
pub(super) fn tag_bytes(frame: &[u8]) -> usize {
    ethernet::l2_of(frame).map_or(0, |l2| l2.l3_offset.saturating_sub(ethernet::HEADER_LEN))
}

/// The flags of piece `k` of `0..=last`: FIN and PSH end the segment, so
/// only its last piece has them; CWR answers one congestion signal, so
/// only the first has it (as Linux's `tcp_gso_segment`).
fn flags_of_piece(flags: u16, k: usize, last: usize) -> u16 {
    let mut f = flags;
    if k != last {
        f &= !(tcp_flags::FIN | tcp_flags::PSH);
    }
    if k != 0 {
        f &= !tcp_flags::CWR;
    }
    f
}

/// Rewrites a piece's TCP header `tcph` (a copy of the original's):
/// sequence number, flags, and the checksum over `pseudo` (the
/// pseudo-header's sum, TCP length included), the header and `payload`.
fn write_tcp(tcph: &mut [u8], payload: &[u8], seq: u32, flags: u16, pseudo: u64) -> Option<()> {
    put32(tcph, tcp::field::SEQ.start, seq)?;
    let word = get16(tcph, tcp::field::OFF_FLAGS.start)?;
    put16(
        tcph,
        tcp::field::OFF_FLAGS.start,
        (word & !tcp::FLAGS_MASK) | flags,
    )?;
    put16(tcph, tcp::field::CHECKSUM.start, 0)?;
    let sum = checksum::ones_sum(tcph, pseudo);
    put16(
        tcph,
        tcp::field::CHECKSUM.start,
        checksum::checksum(payload, sum),
    )
}

/// Whether `frame` is IPv4 carrying TCP, or IPv6 with TCP right after the
/// fixed header (whose flow then leaves from a TSO socket, segmented or
/// not, so that all its packets share one outer source port). A header
/// check only: every frame sent through a port with TSO pays it.
pub(super) fn is_tcp(frame: &[u8]) -> bool {
    match ethernet::l2_of(frame) {
        Some(L2 {
            ethertype: ethertype::IPV4,
            payload,
            ..
        }) => Ipv4Packet::new_checked(payload).is_ok_and(|ip| ip.protocol() == ip_proto::TCP),
        Some(L2 {
            ethertype: ethertype::IPV6,
            payload,
            ..
        }) => Ipv6Packet::new_checked(payload).is_ok_and(|ip| ip.next_header() == ip_proto::TCP),
        _ => false,
    }
}

fn vxlan_header(vni: u32) -> [u8; VXLAN_HLEN] {
    let v = (vni & 0x00ff_ffff) << 8;
    let [a, b, c, d] = v.to_be_bytes();
    [0x08, 0, 0, 0, a, b, c, d]
}

fn get16(b: &[u8], at: usize) -> Option<u16> {
    let &[x, y] = b.get(at..at + 2)? else {
        return None;
    };
    Some(u16::from_be_bytes([x, y]))
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

    /// An Ethernet + IPv6 + TCP frame (traffic class 0xb8, flow label
    /// 0x12345, hop limit 61) with `opts` TCP option bytes and `payload`
    /// bytes of a pattern; the TCP checksum left 0 (TSO ignores it).
    fn tcp6_frame(payload: usize, opts: usize, flags: u16) -> Vec<u8> {
        let tcp_hl = 20 + opts;
        let plen = tcp_hl + payload;
        let mut f = vec![0u8; 14 + 40 + plen];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let ip = &mut f[14..54];
        ip[..4].copy_from_slice(&0x6b81_2345u32.to_be_bytes());
        ip[4..6].copy_from_slice(&(plen as u16).to_be_bytes());
        ip[6] = 6;
        ip[7] = 61;
        ip[8..24].copy_from_slice(&"fd00:20::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
        ip[24..40].copy_from_slice(&"fd00:20::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        let t = &mut f[54..54 + tcp_hl];
        t[0..2].copy_from_slice(&40000u16.to_be_bytes());
        t[2..4].copy_from_slice(&5201u16.to_be_bytes());
        t[4..8].copy_from_slice(&0xffff_f000u32.to_be_bytes());
        t[8..12].copy_from_slice(&77u32.to_be_bytes());
        t[12..14].copy_from_slice(&((((tcp_hl / 4) as u16) << 12) | flags).to_be_bytes());
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        for (i, b) in t[20..].iter_mut().enumerate() {
            *b = if i % 4 == 0 { 1 } else { 8 };
        }
        for (i, b) in f[54 + tcp_hl..].iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        f
    }

    /// RFC 1071 written out, independent of `checksum`: 16-bit big-endian
    /// words summed, an odd byte padded.
    fn naive_sum(b: &[u8]) -> u64 {
        b.chunks(2)
            .map(|c| (u64::from(c[0]) << 8) | u64::from(*c.get(1).unwrap_or(&0)))
            .sum()
    }

    fn naive_fold(mut s: u64) -> u64 {
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }

    /// Whether the TCP checksum of an IPv6 frame (no VLAN tag) verifies
    /// over the IPv6 pseudo-header (RFC 8200 8.1: addresses, upper-layer
    /// length, next header).
    fn tcp6_ok(inner: &[u8]) -> bool {
        let ip = &inner[14..];
        let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
        let sum = naive_sum(&ip[8..40]) + plen as u64 + 6 + naive_sum(&ip[40..40 + plen]);
        naive_fold(sum) == 0xffff
    }

    #[test]
    fn ipv6_pieces_put_back_together_are_the_segment() {
        let frame = tcp6_frame(65_000, 12, tcp_flags::ACK | tcp_flags::PSH | tcp_flags::FIN);
        let cut = TcpCut::of(&frame, 1450).expect("cut");
        assert_eq!(cut.family, Family::V6);
        assert_eq!(cut.mss, 1450 - 40 - 32);
        let n = cut.pieces();
        assert_eq!(n, 65_000usize.div_ceil(1378));
        let mut out = vec![0u8; n * cut.datagram_len()];
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
            assert!(inner.len() - 14 <= 1450, "piece {k} over the MTU");
            assert_eq!(&inner[..14], &frame[..14]);
            assert_eq!(&inner[14..18], &frame[14..18], "traffic class, flow label");
            let plen = usize::from(u16::from_be_bytes([inner[18], inner[19]]));
            assert_eq!(plen, inner.len() - 54, "piece {k} payload length");
            assert_eq!(
                &inner[20..54],
                &frame[20..54],
                "next header, hop limit, addresses"
            );
            assert!(tcp6_ok(inner), "piece {k} TCP checksum");
            let t = &inner[54..];
            assert_eq!(&t[..4], &frame[54..58], "ports");
            let seq = u32::from_be_bytes([t[4], t[5], t[6], t[7]]);
            assert_eq!(seq, 0xffff_f000u32.wrapping_add((k * 1378) as u32));
            assert_eq!(&t[8..12], &frame[62..66], "acknowledgement");
            let flags = u16::from_be_bytes([t[12], t[13]]) & 0xfff;
            let want = if k + 1 == n {
                tcp_flags::ACK | tcp_flags::PSH | tcp_flags::FIN
            } else {
                tcp_flags::ACK
            };
            assert_eq!(flags, want, "piece {k} flags");
            assert_eq!(t[12] >> 4, 8, "data offset");
            assert_eq!(&t[14..16], &frame[68..70], "window");
            assert_eq!(&t[20..32], &frame[74..86], "options copied");
            payload.extend_from_slice(&t[32..]);
        }
        assert_eq!(at, a + b);
        assert_eq!(payload, frame[54 + 32..]);
    }

    #[test]
    fn ipv6_behind_a_vlan_tag_is_cut_with_the_tag() {
        let plain = tcp6_frame(3000, 0, tcp_flags::ACK);
        let mut tagged = plain[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64]);
        tagged.extend_from_slice(&plain[12..]);
        let cut = TcpCut::of(&tagged, 1280).expect("cut");
        let mut out = vec![0u8; cut.pieces() * cut.datagram_len()];
        let n = cut.write(&tagged, 1, 0, 10, &mut out).unwrap();
        for d in out[..n].chunks(cut.datagram_len()) {
            let inner = &d[8..];
            assert_eq!(&inner[..18], &tagged[..18]);
            let untagged: Vec<u8> = [&inner[..12], &inner[16..]].concat();
            assert!(tcp6_ok(&untagged));
            // The whole inner frame, tag included, fits the tunnel.
            assert!(inner.len() <= 1280 + 14, "{}", inner.len());
        }
    }

    /// A tagged IPv4 segment: every piece's outer packet fits the underlay
    /// MTU with the tag counted (they were 4 bytes over, and the kernel
    /// refused the whole send), and a segment that fits only without its
    /// tag is cut too.
    #[test]
    fn ipv4_behind_a_vlan_tag_fits_with_the_tag() {
        let tag = |plain: &[u8]| -> Vec<u8> {
            let mut tagged = plain[..12].to_vec();
            tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64]);
            tagged.extend_from_slice(&plain[12..]);
            tagged
        };
        let tagged = tag(&tcp_frame(4000, 0, tcp_flags::ACK));
        let cut = TcpCut::of(&tagged, 1500 - 50).expect("cut");
        assert!(
            20 + 8 + cut.datagram_len() <= 1500,
            "{}",
            cut.datagram_len()
        );
        let mut out = vec![0u8; cut.pieces() * cut.datagram_len()];
        let n = cut.write(&tagged, 1, 0, 10, &mut out).unwrap();
        let mut payload = 0;
        for d in out[..n].chunks(cut.datagram_len()) {
            let untagged: Vec<u8> = [&d[8..8 + 12], &d[8 + 16..]].concat();
            assert!(tcp_ok(&untagged));
            payload += untagged.len() - 14 - 40;
        }
        assert_eq!(payload, 4000);
        // IP packet 1448 bytes: fits 1450 untagged, not with the tag.
        let edge = tag(&tcp_frame(1408, 0, tcp_flags::ACK));
        let untagged: Vec<u8> = [&edge[..12], &edge[16..]].concat();
        assert!(TcpCut::of(&untagged, 1450).is_none());
        let cut = TcpCut::of(&edge, 1450).expect("cut with the tag counted");
        assert!(cut.datagram_len() - 8 <= 1450 + 14);
    }

    #[test]
    fn cwr_only_on_the_first_piece_of_either_family() {
        let frames = [
            (tcp_frame(5000, 0, tcp_flags::ACK | tcp_flags::CWR), 34),
            (tcp6_frame(5000, 0, tcp_flags::ACK | tcp_flags::CWR), 54),
        ];
        for (frame, l4) in frames {
            let cut = TcpCut::of(&frame, 1500).unwrap();
            let mut out = vec![0u8; cut.pieces() * cut.datagram_len()];
            cut.write(&frame, 1, 0, 10, &mut out).unwrap();
            let flags = |k: usize| {
                let t = &out[k * cut.datagram_len() + 8 + l4..];
                u16::from_be_bytes([t[12], t[13]]) & 0xfff
            };
            assert_eq!(flags(0), tcp_flags::ACK | tcp_flags::CWR);
            assert_eq!(flags(1), tcp_flags::ACK);
            assert_eq!(flags(3), tcp_flags::ACK);
        }
    }

    /// What TSO leaves to the tunnel's "packet too big": extension
    /// headers, other upper layers, SYN/RST/URG, lengths that do not add
    /// up; and no truncation panics.
    #[test]
    fn ipv6_what_is_not_cut() {
        let big = tcp6_frame(4000, 0, tcp_flags::ACK);
        assert!(TcpCut::of(&big, 1450).is_some());
        assert!(TcpCut::of(&big, 9000).is_none(), "fits already");
        for f in [tcp_flags::SYN, tcp_flags::RST, tcp_flags::URG] {
            assert!(TcpCut::of(&tcp6_frame(4000, 0, f), 1450).is_none());
        }
        // Extension headers (hop-by-hop, routing, fragment, destination
        // options) and UDP in the next header field.
        for nh in [0, 43, 44, 60, 17] {
            let mut f = big.clone();
            f[20] = nh;
            assert!(TcpCut::of(&f, 1450).is_none(), "next header {nh}");
        }
        // Not version 6.
        let mut v = big.clone();
        v[14] = 0x4b;
        assert!(TcpCut::of(&v, 1450).is_none());
        // A payload length beyond the frame; 0 (a jumbogram); shorter
        // than the TCP header; a data offset beyond the payload.
        for plen in [4021u16, 0, 19] {
            let mut f = big.clone();
            f[18..20].copy_from_slice(&plen.to_be_bytes());
            assert!(TcpCut::of(&f, 1450).is_none(), "payload length {plen}");
        }
        let mut off = big.clone();
        off[66] = 0x40;
        assert!(TcpCut::of(&off, 1450).is_none());
        // No payload, or an MTU leaving no room.
        assert!(TcpCut::of(&tcp6_frame(0, 40, tcp_flags::ACK), 90).is_none());
        assert!(TcpCut::of(&big, 100).is_none());
        // A payload length shorter than the frame (padding) cuts what
        // the length says.
        let mut padded = big.clone();
        padded.extend_from_slice(&[0xee; 30]);
        let cut = TcpCut::of(&padded, 1450).unwrap();
        assert_eq!(cut.payload, 4000);
        for n in 0..big.len().min(160) {
            assert!(TcpCut::of(&big[..n], 60).is_none());
            assert!(TcpCut::of(&big[..n], 100).is_none());
        }
    }

    #[test]
    fn tcp_flows_are_told_by_a_header_check() {
        assert!(is_tcp(&tcp_frame(10, 0, tcp_flags::ACK)));
        assert!(is_tcp(&tcp6_frame(10, 0, tcp_flags::ACK)));
        let mut hbh = tcp6_frame(10, 0, tcp_flags::ACK);
        hbh[20] = 0;
        assert!(!is_tcp(&hbh));
        let mut udp = tcp6_frame(10, 0, tcp_flags::ACK);
        udp[20] = 17;
        assert!(!is_tcp(&udp));
        // Shorter than the IPv6 header.
        for n in 0..54 {
            assert!(!is_tcp(&tcp6_frame(10, 0, tcp_flags::ACK)[..n]));
        }
    }

    /// A small deterministic generator (xorshift) for the fuzz test.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Whether the TCP checksum of an untagged IPv4 or IPv6 piece
    /// verifies, computed without `checksum` (and the IPv4 header's).
    fn piece_ok(inner: &[u8]) -> bool {
        if inner[12..14] == [0x86, 0xdd] {
            return tcp6_ok(inner);
        }
        let ip = &inner[14..];
        let hl = usize::from(ip[0] & 15) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let sum = naive_sum(&ip[12..20]) + 6 + (total - hl) as u64 + naive_sum(&ip[hl..total]);
        naive_fold(naive_sum(&ip[..hl])) == 0xffff && naive_fold(sum) == 0xffff
    }

    /// Frames of both families with random header bytes, lengths and
    /// MTUs: never a panic; whatever is cut comes out as whole pieces
    /// within the MTU with valid checksums and the original payload, and
    /// a buffer too short for them is refused.
    #[test]
    fn mangled_frames_are_cut_right_or_not_at_all() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let bases = [
            tcp_frame(3000, 12, tcp_flags::ACK),
            tcp6_frame(3000, 12, tcp_flags::ACK),
        ];
        let mut cuts = 0;
        for round in 0..20_000 {
            let mut f = bases[round % 2].clone();
            for _ in 0..rng.below(3) {
                let at = rng.below(90);
                f[at] = rng.next() as u8;
            }
            if rng.below(4) == 0 {
                f.truncate(rng.below(f.len() + 1));
            }
            let mtu = [60, 100, 576, 1280, 1450, 9000][rng.below(6)];
            let Some(cut) = TcpCut::of(&f, mtu) else {
                continue;
            };
            cuts += 1;
            let mut out = vec![0u8; cut.pieces() * cut.datagram_len()];
            assert!(cut
                .write(&f, 5, 0, cut.pieces(), &mut out[..cut.datagram_len() - 1])
                .is_none());
            let n = cut.write(&f, 5, 0, cut.pieces(), &mut out).expect("write");
            let mut payload = Vec::new();
            for (k, d) in out[..n].chunks(cut.datagram_len()).enumerate() {
                let inner = &d[8..];
                assert!(inner.len() - cut.l3 <= mtu, "piece {k} over {mtu}");
                assert!(piece_ok(inner), "round {round} piece {k}");
                payload.extend_from_slice(&inner[cut.headers()..]);
            }
            let start = cut.headers();
            assert_eq!(payload, f[start..start + cut.payload], "round {round}");
        }
        assert!(cuts > 1000, "only {cuts} frames cut");
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
