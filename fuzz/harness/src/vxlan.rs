//! `vxlan_rx` and `vxlan_tx`: the VXLAN tunnel port of `oxvs-switchd`
//! (`switch/src/vxlan.rs`), driven through a real [`VxlanPort`] on
//! 127.0.0.1 whose sockets never reach past loopback.
//!
//! **Receive.** The input is a batch of UDP payloads (raw, or a VXLAN header
//! with a fuzzed VNI in front of fuzzed bytes). They are sent to the port's
//! RX socket and read back with [`VxlanPort::recv_batch`], as the datapath
//! thread does; every inner frame it yields then goes through the example
//! Antrea-like pipeline on the tunnel port with its tunnel metadata.
//! Checked: every yielded frame is exactly the payload after the 8-byte
//! header of a datagram that was sent (in order), whose header has the I
//! flag and no reserved bit, with `tun_id` its VNI and `tun_src` the sender;
//! and every datagram is counted once, in `rx_packets` or `rx_errors`.
//!
//! **Send (fragmentation and "too big").** The input is one inner frame
//! (IPv4 with or without DF, IPv6, ARP, VLAN-tagged, or raw bytes), an
//! underlay MTU and tunnel metadata, given to [`VxlanPort::send`]; what it
//! queued is inspected and discarded, never flushed. Checked: each outer
//! packet fits the MTU and has a valid IPv4 header from the local address
//! to `tun_dst`; a single packet carries UDP + VXLAN (VNI = low 24 bits of
//! `tun_id`) + the inner frame; fragments have one identification,
//! contiguous 8-byte-aligned offsets, MF on all but the last, DF clear, and
//! reassemble to the same; DF is set on the outer packet of an IPv6 inner
//! packet. A refusal as too big reports the inner MTU (underlay − 50), and
//! [`icmp_too_big_reply`] to the frame is then checked: addresses swapped,
//! valid checksums, the right type/code/MTU, a quote that is a prefix of
//! the original packet, an IPv6 answer within 1280 bytes; a DF IPv4 TCP
//! packet between unicast addresses always gets one. The ICMP time
//! exceeded the switch would send for the frame (`icmp_error`, the same
//! builder) is checked the same way, with its type and its 576-byte bound
//! for IPv4.
//!
//! **IPv6 underlay.** A second port on `::1` (IPv6 `local_ip`): a receive
//! input whose first byte has bit 7 set goes to it (checked as above, with
//! `tun_src`/`tun_dst` = `::1`), and a send input whose destination
//! selector byte is `0xfe` sends to an IPv6 `tun_ipv6_dst` through it.
//! Checked there: one outer packet within the MTU, IPv6 with payload
//! length, next header UDP, hop limit 64, `::1` to the destination, a
//! valid (never zero) UDP checksum over the IPv6 pseudo-header, the VXLAN
//! header and the inner frame intact; a refusal as too big reports
//! underlay − 70. Selector `0xfd` sends an IPv6 destination to the IPv4
//! port, which refuses it ([`TxError::WrongFamily`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::{Mutex, OnceLock};

use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink, TunnelMeta};
use oxvs_pipeline::xlate::XlateEnv;
use oxvs_switch::icmp_error;
use oxvs_switch::vxlan::{
    fuzzing, icmp_too_big_reply, TxError, VxlanPort, VXLAN6_OVERHEAD, VXLAN_OVERHEAD,
};

use crate::frames::{self, V4Opts};
use crate::input::Input;

const LOCAL: Ipv4Addr = Ipv4Addr::LOCALHOST;
const LOCAL6: Ipv6Addr = Ipv6Addr::LOCALHOST;
/// The IPv6 tunnel destination of `vxlan_tx` inputs.
const REMOTE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x168, 77, 0, 0, 0, 12);
/// The tunnel port in `examples/antrea-like.flows`.
const TUNNEL_OFPORT: u32 = 2;
const MAX_DATAGRAMS: usize = 32;

struct Ports {
    port: VxlanPort,
    sender: UdpSocket,
    to: SocketAddr,
}

fn open_ports(local: IpAddr) -> Mutex<Ports> {
    // Port 0: the kernel picks a free one; nothing else sends to it.
    let port = VxlanPort::open(local, 0, Some(1500)).expect("open a VXLAN port on loopback");
    let to = fuzzing::rx_addr(&port).expect("the RX socket's address");
    let sender = UdpSocket::bind((local, 0)).expect("bind the sender");
    Mutex::new(Ports { port, sender, to })
}

fn ports(v6: bool) -> &'static Mutex<Ports> {
    static P4: OnceLock<Mutex<Ports>> = OnceLock::new();
    static P6: OnceLock<Mutex<Ports>> = OnceLock::new();
    if v6 {
        P6.get_or_init(|| open_ports(IpAddr::V6(LOCAL6)))
    } else {
        P4.get_or_init(|| open_ports(IpAddr::V4(LOCAL)))
    }
}

/// The IPv4 port, or with `v6` the IPv6 one.
fn lock(v6: bool) -> std::sync::MutexGuard<'static, Ports> {
    ports(v6).lock().unwrap_or_else(|e| e.into_inner())
}

/// Datagrams the port has taken off its socket so far.
fn received(port: &VxlanPort) -> u64 {
    let s = port.stats();
    s.rx_packets + s.rx_errors
}

/// Reads and drops whatever is left on the RX socket.
fn drain(port: &mut VxlanPort) {
    loop {
        let before = received(port);
        port.recv_batch(64);
        if received(port) == before {
            return;
        }
    }
}

pub fn run_rx(data: &[u8]) {
    let v6 = data.first().is_some_and(|b| b & 0x80 != 0);
    let local = if v6 {
        IpAddr::V6(LOCAL6)
    } else {
        IpAddr::V4(LOCAL)
    };
    let mut i = Input::new(data);
    let mut datagrams: Vec<Vec<u8>> = Vec::new();
    while !i.is_empty() && datagrams.len() < MAX_DATAGRAMS {
        let mode = i.u8();
        let d = if mode & 1 == 0 {
            i.long_bytes().to_vec()
        } else {
            let vni = i.u32() & 0x00ff_ffff;
            let mut d = vec![0x08, 0, 0, 0];
            d.extend_from_slice(&(vni << 8).to_be_bytes());
            if mode & 2 != 0 {
                // A plausible inner frame: towards a local pod.
                let l4 = frames::udp_datagram(i.u16(), 53, i.short_bytes());
                let mut f = frames::eth(
                    [0x0a, 0x58, 0x0a, 0xf4, 0, 4],
                    [0x0a, 0x58, 0x0a, 0xf4, 1, 7],
                    frames::ETH_IPV4,
                );
                f.extend_from_slice(&frames::ipv4_packet(
                    [10, 244, 1, 7],
                    [10, 244, 0, 4],
                    frames::PROTO_UDP,
                    V4Opts::default(),
                    &l4,
                ));
                d.extend_from_slice(&f);
            } else {
                d.extend_from_slice(i.long_bytes());
            }
            if mode & 4 != 0 {
                // Damage one header byte.
                let k = i.below(8);
                d[k] ^= i.u8() | 1;
            }
            d
        };
        datagrams.push(d);
    }

    let mut g = lock(v6);
    let Ports { port, sender, to } = &mut *g;
    drain(port);
    let before = port.stats();
    for d in &datagrams {
        sender.send_to(d, *to).expect("send over loopback");
    }
    // Loopback delivers synchronously; read until every datagram is in.
    let mut yielded: Vec<(Vec<u8>, TunnelMeta)> = Vec::new();
    let start = received(port);
    let mut seen = 0u64;
    for spin in 0..1000 {
        if spin >= 10 {
            // Loopback normally delivers within `send_to`; under load the
            // kernel may defer it: wait (at most 0.2 s in all).
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        port.recv_batch(64);
        yielded.extend(port.rx_packets().map(|(f, m, _)| (f.to_vec(), m)));
        seen = received(port) - start;
        if seen >= datagrams.len() as u64 {
            break;
        }
    }
    assert_eq!(seen, datagrams.len() as u64, "every datagram counted once");
    let after = port.stats();
    assert_eq!(after.rx_packets - before.rx_packets, yielded.len() as u64);
    drop(g);

    // Each yielded frame is a datagram's payload, in order. (Datagrams
    // may carry the same payload behind different headers: a well-formed
    // header is preferred when matching, and the count of well-formed
    // headers bounds what may be accepted.)
    let well_formed = |d: &[u8]| d.len() >= 22 && d[0] == 0x08 && d[1..4] == [0, 0, 0] && d[7] == 0;
    assert!(
        yielded.len() <= datagrams.iter().filter(|d| well_formed(d)).count(),
        "more frames than well-formed datagrams"
    );
    let mut next = 0;
    for (frame, meta) in &yielded {
        let carries = |d: &Vec<u8>| d.len() >= 8 && &d[8..] == frame.as_slice();
        let k = datagrams[next..]
            .iter()
            .position(|d| carries(d) && well_formed(d))
            .or_else(|| datagrams[next..].iter().position(carries))
            .unwrap_or_else(|| panic!("yielded a frame that no datagram carried"));
        let d = &datagrams[next + k];
        next += k + 1;
        assert!(
            d[0] & 0x08 != 0,
            "accepted without the I flag: {:02x?}",
            &d[..8]
        );
        assert_eq!(
            d[0] & !0x08,
            0,
            "accepted with reserved flags: {:02x?}",
            &d[..8]
        );
        assert_eq!(&d[1..4], &[0, 0, 0], "accepted with reserved bits");
        assert_eq!(d[7], 0, "accepted with a reserved last byte");
        assert!(frame.len() >= 14, "accepted a frame shorter than Ethernet");
        assert_eq!(
            meta.tun_id,
            u64::from(u32::from_be_bytes([0, d[4], d[5], d[6]]))
        );
        assert_eq!(meta.src, local);
        assert_eq!(meta.dst, local);
    }

    // Into the pipeline, as the datapath thread does.
    let mut dp = Datapath::new(
        crate::common::antrea_pipeline(),
        XlateEnv::with_ports(vec![1, 2, 3, 4, 5]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::new(CtConfig::default());
    let mut batch: Vec<DpPacket<Vec<u8>>> = yielded
        .iter()
        .map(|(f, m)| {
            let mut p = DpPacket::from_frame(f, TUNNEL_OFPORT);
            p.tunnel = Some(*m);
            p
        })
        .collect();
    let mut sink = RecordingSink::default();
    dp.process_batch(&mut batch, &mut ct, 1_000_000, &mut sink);
    for (port, _, _) in &sink.outputs {
        assert!((1..=5).contains(port), "output to port {port}");
    }
}

/// The inner frame of a `vxlan_tx` input.
fn inner_frame(i: &mut Input<'_>) -> (Vec<u8>, bool) {
    let kind = i.u8();
    let len = match i.u8() % 4 {
        0 => i.below(128),
        1 => 1400 + i.below(200),
        2 => i.below(9200),
        _ => usize::from(i.u16()),
    };
    let payload = vec![0xa5; len];
    let vlan = |f: &mut Vec<u8>, i: &mut Input<'_>| {
        for _ in 0..(kind >> 5) % 3 {
            let tpid: u16 = if i.bool() { 0x8100 } else { 0x88a8 };
            let tag = [(tpid >> 8) as u8, tpid as u8, 0, i.u8()];
            f.splice(12..12, tag);
        }
    };
    let src = *i.pick(&[
        [10, 244, 0, 3],
        [0, 0, 0, 0],
        [224, 0, 0, 1],
        [127, 0, 0, 1],
    ]);
    let dst = *i.pick(&[[10, 244, 1, 7], [255, 255, 255, 255], [239, 1, 1, 1]]);
    let unicast = src == [10, 244, 0, 3] && dst == [10, 244, 1, 7];
    match kind % 6 {
        0 | 1 => {
            let df = kind.is_multiple_of(6);
            let proto = *i.pick(&[frames::PROTO_TCP, frames::PROTO_UDP, frames::PROTO_ICMP]);
            let l4 = match proto {
                frames::PROTO_TCP => frames::tcp_segment(40000, 80, 1, 0, 0x10, 500, &[], &payload),
                frames::PROTO_UDP => frames::udp_datagram(40000, 53, &payload),
                _ => frames::icmp_message(*i.pick(&[8, 3, 11, 0]), 0, [0; 4], &payload),
            };
            let o = V4Opts {
                ttl: 64,
                ident: i.u16(),
                frag: if df { 0x4000 } else { 0 }
                    | if i.u8() == 0xff { i.u16() & 0x3fff } else { 0 },
            };
            let mut f = frames::eth(frames::MAC_B, frames::MAC_A, frames::ETH_IPV4);
            f.extend_from_slice(&frames::ipv4_packet(src, dst, proto, o, &l4));
            vlan(&mut f, i);
            let must_answer = df
                && proto == frames::PROTO_TCP
                && unicast
                && o.frag & 0x1fff == 0
                && kind >> 5 == 0;
            (f, must_answer)
        }
        2 => {
            let mut s = [0u8; 16];
            s[0] = *i.pick(&[0xfd, 0xff, 0]);
            s[15] = 1;
            let mut d = [0u8; 16];
            d[0] = 0xfd;
            d[15] = 2;
            let next = *i.pick(&[frames::PROTO_TCP, frames::PROTO_ICMPV6, 0, 44]);
            let l4 = match next {
                frames::PROTO_ICMPV6 => {
                    frames::icmp_message(*i.pick(&[128, 1, 2, 135]), 0, [0; 4], &payload)
                }
                0 | 44 => {
                    let mut h = vec![frames::PROTO_ICMPV6, 0, 0, i.u8(), 0, 0, 0, 0];
                    h.extend_from_slice(&frames::icmp_message(
                        *i.pick(&[128, 1]),
                        0,
                        [0; 4],
                        &payload,
                    ));
                    h
                }
                _ => frames::tcp_segment(40000, 80, 1, 0, 0x10, 500, &[], &payload),
            };
            let mut f = frames::eth(frames::MAC_B, frames::MAC_A, frames::ETH_IPV6);
            f.extend_from_slice(&frames::ipv6_packet(s, d, next, 64, &l4));
            vlan(&mut f, i);
            (f, false)
        }
        3 => {
            let mut f = frames::eth([0xff; 6], frames::MAC_A, 0x0806);
            f.extend_from_slice(&payload);
            (f, false)
        }
        _ => (i.rest().to_vec(), false),
    }
}

pub fn run_tx(data: &[u8]) {
    let mut i = Input::new(data);
    let mtu = match i.u8() % 5 {
        0 => 1500,
        1 => 576,
        2 => 9000,
        3 => 65535,
        _ => 576 + u32::from(i.u16()),
    };
    let tun_id = if i.bool() {
        u64::from(i.u32()) << 8 | u64::from(i.u8())
    } else {
        42
    };
    let src = i.u32();
    // Destination: none (0), IPv6 (0xfe), IPv6 to the IPv4 port (0xfd),
    // else IPv4.
    let dst_kind = i.u8();
    let meta = match dst_kind {
        0 => TunnelMeta::v4(tun_id, src, 0),
        0xfd | 0xfe => TunnelMeta::v6(tun_id, Ipv6Addr::from(u128::from(src)), REMOTE6),
        _ => TunnelMeta::v4(tun_id, src, u32::from(Ipv4Addr::new(192, 168, 77, 12))),
    };
    let v6 = dst_kind == 0xfe;
    let overhead = if v6 { VXLAN6_OVERHEAD } else { VXLAN_OVERHEAD };
    let (inner, must_answer) = inner_frame(&mut i);

    let mut g = lock(v6);
    let port = &mut g.port;
    fuzzing::discard_queued(port);
    fuzzing::set_underlay_mtu(port, mtu);
    let mtu = port.underlay_mtu();
    let result = port.send(&inner, meta);
    let queued: Vec<Vec<u8>> = fuzzing::queued(port).iter().map(|p| p.to_vec()).collect();
    fuzzing::discard_queued(port);
    drop(g);

    match result {
        Ok(()) => {
            assert!(!meta.dst.is_unspecified());
            assert_ne!(dst_kind, 0xfd, "an IPv6 destination through the IPv4 port");
            if v6 {
                check_encapsulation6(&inner, &queued, mtu, meta);
            } else {
                check_encapsulation(&inner, &queued, mtu, meta);
            }
        }
        Err(TxError::NoDestination) => {
            assert!(meta.dst.is_unspecified());
            assert!(queued.is_empty());
        }
        Err(TxError::WrongFamily) => {
            assert_eq!(dst_kind, 0xfd);
            assert!(queued.is_empty());
        }
        Err(TxError::TooBig { mtu: inner_mtu }) => {
            assert!(queued.is_empty());
            assert!(
                inner_mtu + overhead <= mtu,
                "inner MTU {inner_mtu} for underlay {mtu}"
            );
            let src_ip = Ipv4Addr::new(10, 244, 0, 1);
            let reply = icmp_too_big_reply(&inner, inner_mtu, src_ip);
            if must_answer {
                assert!(reply.is_some(), "no ICMP answer to a DF TCP packet");
            }
            if let Some(r) = reply {
                check_icmp_error(&inner, &r, Answer::TooBig(inner_mtu), src_ip);
            }
        }
    }
    // Any frame: cut as the tunnel's TSO cuts it, each piece a whole TCP
    // segment within the MTU with valid checksums, and merged back as its
    // GRO merges, the same payload in the same order.
    let inner_mtu = (mtu - overhead) as usize;
    if let Some(fuzzing::Roundtrip { pieces, merged }) =
        fuzzing::tso_gro_roundtrip_any(&inner, inner_mtu, 65_549)
    {
        let whole = tcp_payload(&inner).expect("a frame TSO cuts has a TCP payload");
        let mut again = Vec::new();
        for p in &pieces {
            let (ip, payload) = tcp_payload_at(p).expect("a piece is TCP");
            assert!(p.len() - ip <= inner_mtu, "a piece over the inner MTU");
            assert_tcp_checksums(p, ip, "piece");
            again.extend_from_slice(payload);
        }
        assert_eq!(again, whole, "pieces carry the payload");
        let mut again = Vec::new();
        for m in &merged {
            let (ip, payload) = tcp_payload_at(m).expect("a merged frame is TCP");
            again.extend_from_slice(payload);
            // Its TCP checksum, computed from the pieces' sums, verifies.
            assert_tcp_checksums(m, ip, "merged frame");
        }
        assert_eq!(again, whole, "merged frames carry the payload");
        assert!(merged.len() <= pieces.len());
    }
    // Any frame, whatever the send did: the reply is well-formed or absent.
    let m = 1000 + u32::from(i.u8());
    if let Some(r) = icmp_too_big_reply(&inner, m, Ipv4Addr::new(10, 244, 0, 1)) {
        check_icmp_error(&inner, &r, Answer::TooBig(m), Ipv4Addr::new(10, 244, 0, 1));
    }
    // And so is the time exceeded a `dec_ttl` exception gets (the same
    // builder, `oxvs_switch::icmp_error`).
    let node = Ipv4Addr::new(192, 168, 77, 11);
    if let Some(r) = icmp_error::time_exceeded(&inner, inner.len(), node) {
        check_icmp_error(&inner, &r, Answer::TimeExceeded, node);
    }
}

/// Which ICMP error [`check_icmp_error`] checks.
#[derive(Clone, Copy)]
enum Answer {
    /// Fragmentation needed / packet too big with this MTU.
    TooBig(u32),
    /// Time exceeded in transit.
    TimeExceeded,
}

/// The TCP payload of an IPv4 frame (after any VLAN tags).
fn tcp_payload(frame: &[u8]) -> Option<Vec<u8>> {
    tcp_payload_at(frame).map(|(_, p)| p.to_vec())
}

/// Where the IP header starts, and the TCP payload (bounded by the IPv4
/// total length or the IPv6 payload length; IPv6 without extension
/// headers), of a frame with up to two VLAN tags.
fn tcp_payload_at(frame: &[u8]) -> Option<(usize, &[u8])> {
    let (ip, et) = l3(frame)?;
    let (hl, total) = match et {
        0x86dd => (40, 40 + usize::from(be16(frame.get(ip..ip + 6)?, 4))),
        _ => (
            usize::from(*frame.get(ip)? & 15) * 4,
            usize::from(be16(frame.get(ip..ip + 4)?, 2)),
        ),
    };
    let thl = usize::from(*frame.get(ip + hl + 12)? >> 4) * 4;
    Some((ip, frame.get(ip + hl + thl..ip + total)?))
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// L3 offset and ethertype through up to two VLAN tags.
fn l3(frame: &[u8]) -> Option<(usize, u16)> {
    let mut off = 12;
    for _ in 0..3 {
        let et = be16(frame.get(off..off + 2)?, 0);
        if et != 0x8100 && et != 0x88a8 {
            return Some((off + 2, et));
        }
        off += 4;
    }
    None
}

fn check_encapsulation(inner: &[u8], queued: &[Vec<u8>], mtu: u32, meta: TunnelMeta) {
    assert!(!queued.is_empty(), "send succeeded but queued nothing");
    let mut ident = None;
    let mut payload = Vec::new();
    for (k, p) in queued.iter().enumerate() {
        assert!(
            p.len() <= mtu as usize,
            "outer packet {} > MTU {mtu}",
            p.len()
        );
        assert!(p.len() >= 20);
        assert_eq!(p[0], 0x45);
        assert_eq!(usize::from(be16(p, 2)), p.len(), "total length");
        assert_eq!(frames::checksum(&p[..20]), 0, "outer IPv4 checksum");
        assert_eq!(p[8], 64, "TTL");
        assert_eq!(p[9], frames::PROTO_UDP);
        assert_eq!(&p[12..16], &LOCAL.octets());
        assert_eq!(
            IpAddr::from(<[u8; 4]>::try_from(&p[16..20]).unwrap()),
            meta.dst
        );
        let id = be16(p, 4);
        assert_eq!(
            *ident.get_or_insert(id),
            id,
            "fragments share the identification"
        );
        let ff = be16(p, 6);
        let (df, mf, off) = (
            ff & 0x4000 != 0,
            ff & 0x2000 != 0,
            usize::from(ff & 0x1fff) * 8,
        );
        assert_eq!(off, payload.len(), "fragment offsets are contiguous");
        assert_eq!(mf, k + 1 < queued.len(), "MF on all but the last");
        if queued.len() > 1 {
            assert!(!df, "a fragment with DF");
            if mf {
                assert_eq!((p.len() - 20) % 8, 0);
            }
        }
        if let Some((_, 0x86dd)) = l3(inner) {
            assert!(
                df && queued.len() == 1,
                "an IPv6 inner packet must go whole with DF"
            );
        }
        payload.extend_from_slice(&p[20..]);
    }
    assert_eq!(payload.len(), 16 + inner.len());
    let sport = be16(&payload, 0);
    assert!(sport >= 49152, "source port {sport}");
    assert_eq!(usize::from(be16(&payload, 4)), payload.len(), "UDP length");
    assert_eq!(&payload[8..12], &[0x08, 0, 0, 0]);
    assert_eq!(
        u32::from_be_bytes([0, payload[12], payload[13], payload[14]]),
        (meta.tun_id & 0x00ff_ffff) as u32
    );
    assert_eq!(payload[15], 0);
    assert_eq!(&payload[16..], inner, "the inner frame, intact");
}

/// An IPv6-underlay send: one whole outer packet (never fragments).
fn check_encapsulation6(inner: &[u8], queued: &[Vec<u8>], mtu: u32, meta: TunnelMeta) {
    assert_eq!(queued.len(), 1, "IPv6 outer packets are never fragmented");
    let p = &queued[0];
    assert!(
        p.len() <= mtu as usize,
        "outer packet {} > MTU {mtu}",
        p.len()
    );
    assert_eq!(p.len(), 40 + 16 + inner.len());
    assert_eq!(p[0] >> 4, 6);
    assert_eq!(usize::from(be16(p, 4)), p.len() - 40, "payload length");
    assert_eq!(p[6], frames::PROTO_UDP, "no extension header");
    assert_eq!(p[7], 64, "hop limit");
    assert_eq!(&p[8..24], &LOCAL6.octets());
    assert_eq!(
        IpAddr::from(<[u8; 16]>::try_from(&p[24..40]).unwrap()),
        meta.dst
    );
    let udp = &p[40..];
    assert!(be16(udp, 0) >= 49152, "source port");
    assert_eq!(usize::from(be16(udp, 4)), udp.len(), "UDP length");
    assert_ne!(be16(udp, 6), 0, "a zero UDP checksum over IPv6");
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&p[8..40]);
    pseudo.extend_from_slice(&(udp.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, frames::PROTO_UDP]);
    assert_eq!(fold(ones(&pseudo) + ones(udp)), 0xffff, "UDP checksum");
    assert_eq!(&udp[8..12], &[0x08, 0, 0, 0]);
    assert_eq!(
        u32::from_be_bytes([0, udp[12], udp[13], udp[14]]),
        (meta.tun_id & 0x00ff_ffff) as u32
    );
    assert_eq!(udp[15], 0);
    assert_eq!(&udp[16..], inner, "the inner frame, intact");
}

/// Asserts that the TCP segment whose IP header starts at `ip` in
/// `frame` has checksums that verify: IPv4's header checksum, and the TCP
/// checksum over the family's pseudo-header (IPv6: the addresses, the
/// upper-layer length and next header 6). `what` names the frame.
fn assert_tcp_checksums(frame: &[u8], ip: usize, what: &str) {
    let (hl, total, pseudo) = match l3(frame).map(|(_, et)| et) {
        Some(0x86dd) => {
            let total = 40 + be16(frame, ip + 4) as usize;
            (
                40,
                total,
                ones(&frame[ip + 8..ip + 40]) + 6 + (total - 40) as u32,
            )
        }
        _ => {
            let total = be16(frame, ip + 2) as usize;
            let hl = usize::from(frame[ip] & 15) * 4;
            assert_eq!(
                fold(ones(&frame[ip..ip + hl])),
                0xffff,
                "{what}: IPv4 checksum"
            );
            (
                hl,
                total,
                ones(&frame[ip + 12..ip + 20]) + 6 + (total - hl) as u32,
            )
        }
    };
    assert_eq!(
        fold(pseudo + ones(&frame[ip + hl..ip + total])),
        0xffff,
        "{what}: TCP checksum"
    );
}

fn ones(data: &[u8]) -> u32 {
    data.chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn check_icmp_error(orig: &[u8], reply: &[u8], kind: Answer, src_ip: Ipv4Addr) {
    let (off, et) = l3(orig).expect("answered a frame without an L3 header");
    assert_eq!(l3(reply), Some((off, et)), "the reply keeps the L2 header");
    assert_eq!(&reply[0..6], &orig[6..12]);
    assert_eq!(&reply[6..12], &orig[0..6]);
    assert_eq!(&reply[12..off], &orig[12..off], "VLAN tags kept");
    let ip = &reply[off..];
    let oip = &orig[off..];
    match et {
        0x0800 => {
            assert_eq!(ip[0], 0x45);
            assert_eq!(usize::from(be16(ip, 2)), ip.len());
            assert_eq!(frames::checksum(&ip[..20]), 0, "IPv4 checksum");
            assert_eq!(ip[9], frames::PROTO_ICMP);
            assert_eq!(&ip[12..16], &src_ip.octets());
            assert_eq!(&ip[16..20], &oip[12..16], "sent back to the source");
            let icmp = &ip[20..];
            match kind {
                Answer::TooBig(mtu) => {
                    assert_eq!((icmp[0], icmp[1]), (3, 4));
                    assert_eq!(u32::from(be16(icmp, 6)), mtu.min(65535));
                }
                Answer::TimeExceeded => {
                    assert_eq!((icmp[0], icmp[1]), (11, 0));
                    assert_eq!(&icmp[4..8], &[0; 4]);
                    assert!(ip.len() <= 576, "an ICMP time exceeded over 576 bytes");
                }
            }
            assert_eq!(fold(ones(icmp)), 0xffff, "ICMP checksum");
            let quote = &icmp[8..];
            assert!(oip.starts_with(quote), "the quote is the original's start");
            assert!(quote.len() >= 20);
        }
        0x86dd => {
            assert_eq!(ip[0] >> 4, 6);
            assert!(ip.len() <= 1280, "ICMPv6 error over the minimum MTU");
            assert_eq!(usize::from(be16(ip, 4)) + 40, ip.len());
            assert_eq!(ip[6], frames::PROTO_ICMPV6);
            assert_eq!(&ip[24..40], &oip[8..24], "sent back to the source");
            let icmp = &ip[40..];
            let (ty, rest) = match kind {
                Answer::TooBig(mtu) => (2, mtu),
                Answer::TimeExceeded => (3, 0),
            };
            assert_eq!((icmp[0], icmp[1]), (ty, 0));
            assert_eq!(
                u32::from_be_bytes([icmp[4], icmp[5], icmp[6], icmp[7]]),
                rest
            );
            let mut pseudo = Vec::new();
            pseudo.extend_from_slice(&ip[8..40]);
            pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, frames::PROTO_ICMPV6]);
            assert_eq!(fold(ones(&pseudo) + ones(icmp)), 0xffff, "ICMPv6 checksum");
            assert!(
                oip.starts_with(&icmp[8..]),
                "the quote is the original's start"
            );
        }
        _ => panic!("answered ethertype {et:#06x}"),
    }
}
