//! Frame builders for harnesses and their seeds: Ethernet + IPv4/IPv6 +
//! TCP/UDP/ICMP, with correct lengths and IPv4 header checksums (L4
//! checksums are left 0: nothing fuzzed here verifies them).

pub const ETH_IPV4: u16 = 0x0800;
pub const ETH_IPV6: u16 = 0x86dd;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;

/// TCP flag bits.
pub mod tcp {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
}

/// An IP address of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Addr {
    V4([u8; 4]),
    V6([u8; 16]),
}

/// The Ethernet header in front of everything built here.
pub fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// The ones' complement sum of `data`, folded (the IPv4 header checksum).
pub fn checksum(data: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in data.chunks(2) {
        let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
        s += u32::from(w);
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// IPv4 header fields beyond addresses and protocol.
#[derive(Clone, Copy, Debug)]
pub struct V4Opts {
    pub ttl: u8,
    pub ident: u16,
    /// Flags and fragment offset (DF = 0x4000, MF = 0x2000, offset in 8-byte units).
    pub frag: u16,
}

impl Default for V4Opts {
    fn default() -> Self {
        V4Opts {
            ttl: 64,
            ident: 1,
            frag: 0,
        }
    }
}

/// An IPv4 packet (20-byte header) carrying `payload`.
pub fn ipv4_packet(src: [u8; 4], dst: [u8; 4], proto: u8, o: V4Opts, payload: &[u8]) -> Vec<u8> {
    let total = (20 + payload.len()).min(usize::from(u16::MAX)) as u16;
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&total.to_be_bytes());
    h[4..6].copy_from_slice(&o.ident.to_be_bytes());
    h[6..8].copy_from_slice(&o.frag.to_be_bytes());
    h[8] = o.ttl;
    h[9] = proto;
    h[12..16].copy_from_slice(&src);
    h[16..20].copy_from_slice(&dst);
    let c = checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    let mut p = h.to_vec();
    p.extend_from_slice(payload);
    p
}

/// An IPv6 packet (no extension headers) carrying `payload`.
pub fn ipv6_packet(src: [u8; 16], dst: [u8; 16], next: u8, hop: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&(payload.len().min(usize::from(u16::MAX)) as u16).to_be_bytes());
    p.push(next);
    p.push(hop);
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(payload);
    p
}

/// A frame from `src` to `dst` of either family (both must be the same).
pub fn ip_frame(src: Addr, dst: Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let (mut f, ip) = match (src, dst) {
        (Addr::V4(s), Addr::V4(d)) => (
            eth(MAC_B, MAC_A, ETH_IPV4),
            ipv4_packet(s, d, proto, V4Opts::default(), l4),
        ),
        (Addr::V6(s), Addr::V6(d)) => (
            eth(MAC_B, MAC_A, ETH_IPV6),
            ipv6_packet(s, d, proto, 64, l4),
        ),
        _ => return Vec::new(),
    };
    f.extend_from_slice(&ip);
    f
}

pub const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
pub const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

/// A TCP segment (header + options padded to 4 bytes + data).
#[allow(clippy::too_many_arguments)]
pub fn tcp_segment(
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    options: &[u8],
    data: &[u8],
) -> Vec<u8> {
    let opt_len = options.len().min(40).div_ceil(4) * 4;
    let mut s = Vec::with_capacity(20 + opt_len + data.len());
    s.extend_from_slice(&sport.to_be_bytes());
    s.extend_from_slice(&dport.to_be_bytes());
    s.extend_from_slice(&seq.to_be_bytes());
    s.extend_from_slice(&ack.to_be_bytes());
    s.push((((20 + opt_len) / 4) as u8) << 4);
    s.push(flags);
    s.extend_from_slice(&window.to_be_bytes());
    s.extend_from_slice(&[0, 0, 0, 0]);
    let mut opts = options[..options.len().min(40)].to_vec();
    opts.resize(opt_len, 0);
    s.extend_from_slice(&opts);
    s.extend_from_slice(data);
    s
}

/// A UDP datagram.
pub fn udp_datagram(sport: u16, dport: u16, data: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(8 + data.len());
    s.extend_from_slice(&sport.to_be_bytes());
    s.extend_from_slice(&dport.to_be_bytes());
    s.extend_from_slice(&((8 + data.len()).min(usize::from(u16::MAX)) as u16).to_be_bytes());
    s.extend_from_slice(&[0, 0]);
    s.extend_from_slice(data);
    s
}

/// An ICMP or ICMPv6 message: type, code, 4 bytes of "rest of header", data.
pub fn icmp_message(ty: u8, code: u8, rest: [u8; 4], data: &[u8]) -> Vec<u8> {
    let mut s = vec![ty, code, 0, 0];
    s.extend_from_slice(&rest);
    s.extend_from_slice(data);
    s
}
