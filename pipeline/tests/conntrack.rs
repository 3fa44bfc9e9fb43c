//! Connection tracker tests: real frames built byte by byte, keys built with
//! `FlowKey::set` from the same parameters (the extractor is written in
//! parallel), and the `ct_state` answers OVS gives for them.

mod common;

use oxvs_pipeline::conntrack::{Conntrack, CtConfig, CtParams, CtTimeouts, CtVerdict, TcpState};
use oxvs_pipeline::field::{ct_state, tcp_flags as tf, write_flags, Field};
use oxvs_pipeline::key::FlowKey;
use proptest::prelude::*;

use common::csum16;

const SEC: u64 = 1_000_000_000;

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const R: [u8; 4] = [10, 0, 0, 254];
const A6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const B6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

// ---------------------------------------------------------------------------
// Frame builders
// ---------------------------------------------------------------------------

/// A frame and the key the extractor would give it.
#[derive(Clone, Debug)]
struct Pkt {
    frame: Vec<u8>,
    key: FlowKey,
}

fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let tot = (20 + l4.len()) as u16;
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&tot.to_be_bytes());
    h.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    let c = csum16(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(l4);
    h
}

fn ipv6(src: [u8; 16], dst: [u8; 16], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    h.extend_from_slice(&[proto, 64]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h.extend_from_slice(l4);
    h
}

#[allow(clippy::too_many_arguments)]
fn tcp_hdr(
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u16,
    win: u16,
    opts: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    assert_eq!(opts.len() % 4, 0);
    let doff = ((20 + opts.len()) / 4) as u16;
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&ack.to_be_bytes());
    h.extend_from_slice(&((doff << 12) | (flags & 0x1ff)).to_be_bytes());
    h.extend_from_slice(&win.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 0]);
    h.extend_from_slice(opts);
    h.extend_from_slice(payload);
    h
}

fn udp_hdr(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(payload);
    h
}

fn icmp_hdr(icmp_type: u8, code: u8, rest: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut h = vec![icmp_type, code, 0, 0];
    h.extend_from_slice(&rest);
    h.extend_from_slice(payload);
    let c = csum16(&h);
    h[2..4].copy_from_slice(&c.to_be_bytes());
    h
}

fn key4(src: [u8; 4], dst: [u8; 4], proto: u8, tp_src: u16, tp_dst: u16, flags: u16) -> FlowKey {
    let mut k = FlowKey::ZERO;
    k.set(Field::InPort, 1);
    k.set(Field::DlType, 0x0800);
    k.set(Field::NwSrc, u32::from_be_bytes(src).into());
    k.set(Field::NwDst, u32::from_be_bytes(dst).into());
    k.set(Field::NwProto, proto.into());
    k.set(Field::NwTtl, 64);
    k.set(Field::TpSrc, tp_src.into());
    k.set(Field::TpDst, tp_dst.into());
    k.set(Field::TcpFlags, flags.into());
    k
}

fn key6(src: [u8; 16], dst: [u8; 16], proto: u8, tp_src: u16, tp_dst: u16, flags: u16) -> FlowKey {
    let mut k = FlowKey::ZERO;
    k.set(Field::InPort, 1);
    k.set(Field::DlType, 0x86dd);
    k.set(Field::Ipv6Src, u128::from_be_bytes(src));
    k.set(Field::Ipv6Dst, u128::from_be_bytes(dst));
    k.set(Field::NwProto, proto.into());
    k.set(Field::NwTtl, 64);
    k.set(Field::TpSrc, tp_src.into());
    k.set(Field::TpDst, tp_dst.into());
    k.set(Field::TcpFlags, flags.into());
    k
}

/// A TCP segment `src:sport -> dst:dport` with `len` bytes of payload.
#[allow(clippy::too_many_arguments)]
fn tcp4(
    src: [u8; 4],
    sport: u16,
    dst: [u8; 4],
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u16,
    len: usize,
) -> Pkt {
    tcp4_opt(src, sport, dst, dport, seq, ack, flags, 8192, &[], len)
}

#[allow(clippy::too_many_arguments)]
fn tcp4_opt(
    src: [u8; 4],
    sport: u16,
    dst: [u8; 4],
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u16,
    win: u16,
    opts: &[u8],
    len: usize,
) -> Pkt {
    let l4 = tcp_hdr(sport, dport, seq, ack, flags, win, opts, &vec![0xab; len]);
    Pkt {
        frame: eth(0x0800, &ipv4(src, dst, 6, &l4)),
        key: key4(src, dst, 6, sport, dport, flags),
    }
}

#[allow(clippy::too_many_arguments)]
fn tcp6(
    src: [u8; 16],
    sport: u16,
    dst: [u8; 16],
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u16,
    len: usize,
) -> Pkt {
    let l4 = tcp_hdr(sport, dport, seq, ack, flags, 8192, &[], &vec![0xcd; len]);
    Pkt {
        frame: eth(0x86dd, &ipv6(src, dst, 6, &l4)),
        key: key6(src, dst, 6, sport, dport, flags),
    }
}

fn udp4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Pkt {
    let l4 = udp_hdr(sport, dport, b"hello");
    Pkt {
        frame: eth(0x0800, &ipv4(src, dst, 17, &l4)),
        key: key4(src, dst, 17, sport, dport, 0),
    }
}

fn icmp4(
    src: [u8; 4],
    dst: [u8; 4],
    icmp_type: u8,
    code: u8,
    rest: [u8; 4],
    payload: &[u8],
) -> Pkt {
    let l4 = icmp_hdr(icmp_type, code, rest, payload);
    Pkt {
        frame: eth(0x0800, &ipv4(src, dst, 1, &l4)),
        key: key4(src, dst, 1, icmp_type.into(), code.into(), 0),
    }
}

fn echo4(src: [u8; 4], dst: [u8; 4], icmp_type: u8, id: u16) -> Pkt {
    let mut rest = [0u8; 4];
    rest[..2].copy_from_slice(&id.to_be_bytes());
    rest[3] = 1;
    icmp4(src, dst, icmp_type, 0, rest, b"ping")
}

fn icmp6(
    src: [u8; 16],
    dst: [u8; 16],
    icmp_type: u8,
    code: u8,
    rest: [u8; 4],
    payload: &[u8],
) -> Pkt {
    let l4 = icmp_hdr(icmp_type, code, rest, payload);
    Pkt {
        frame: eth(0x86dd, &ipv6(src, dst, 58, &l4)),
        key: key6(src, dst, 58, icmp_type.into(), code.into(), 0),
    }
}

/// The IP packet inside a frame (what an ICMP error quotes).
fn ip_of(p: &Pkt) -> Vec<u8> {
    p.frame[14..].to_vec()
}

// ---------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------

fn commit(zone: u16) -> CtParams {
    CtParams {
        zone,
        commit: true,
        ..Default::default()
    }
}

fn track(zone: u16) -> CtParams {
    CtParams {
        zone,
        ..Default::default()
    }
}

/// `ct_state` as flow text (`+est+rpl+trk`), for readable assertions.
fn st(v: &CtVerdict) -> String {
    let names = ct_state::NAMES.map(|(n, b)| (n, u128::from(b)));
    let mut s = String::new();
    write_flags(&mut s, &names, v.state.into(), v.state.into());
    s
}

struct T {
    ct: Conntrack,
    now: u64,
}

impl T {
    fn new() -> T {
        T::with(CtConfig::default())
    }
    fn with(cfg: CtConfig) -> T {
        T {
            ct: Conntrack::new(cfg),
            now: 1_000 * SEC,
        }
    }
    fn run(&mut self, p: &Pkt, params: CtParams) -> CtVerdict {
        self.ct.execute(&p.frame, &p.key, &params, self.now)
    }
    fn state(&mut self, p: &Pkt, params: CtParams) -> String {
        let v = self.run(p, params);
        st(&v)
    }
    fn dump(&self) -> Vec<String> {
        self.ct.entries().iter().map(|e| e.to_string()).collect()
    }
}

const ISN_A: u32 = 1_000;
const ISN_B: u32 = 5_000_000;

/// SYN (committed), SYN-ACK, ACK between A:1234 and B:80; checks the states.
fn handshake(t: &mut T, zone: u16) {
    let syn = tcp4(A, 1234, B, 80, ISN_A, 0, tf::SYN, 0);
    assert_eq!(t.state(&syn, commit(zone)), "+new+trk");
    let synack = tcp4(B, 80, A, 1234, ISN_B, ISN_A + 1, tf::SYN | tf::ACK, 0);
    assert_eq!(t.state(&synack, track(zone)), "+est+rpl+trk");
    let ack = tcp4(A, 1234, B, 80, ISN_A + 1, ISN_B + 1, tf::ACK, 0);
    assert_eq!(t.state(&ack, track(zone)), "+est+trk");
}

// ---------------------------------------------------------------------------
// TCP
// ---------------------------------------------------------------------------

#[test]
fn tcp_handshake_and_data() {
    let mut t = T::new();
    handshake(&mut t, 5);
    assert_eq!(
        t.dump(),
        ["tcp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=1234,dport=80),reply=(src=10.0.0.2,dst=10.0.0.1,sport=80,dport=1234),zone=5,protoinfo=(state=ESTABLISHED)"]
    );
    let e = t.ct.entries()[0];
    assert_eq!(
        e.tcp_states,
        Some((TcpState::Established, TcpState::Established))
    );

    // Data both ways.
    let d1 = tcp4(A, 1234, B, 80, ISN_A + 1, ISN_B + 1, tf::ACK | tf::PSH, 100);
    assert_eq!(t.state(&d1, track(5)), "+est+trk");
    let d2 = tcp4(
        B,
        80,
        A,
        1234,
        ISN_B + 1,
        ISN_A + 101,
        tf::ACK | tf::PSH,
        500,
    );
    assert_eq!(t.state(&d2, track(5)), "+est+rpl+trk");
    let d3 = tcp4(A, 1234, B, 80, ISN_A + 101, ISN_B + 501, tf::ACK, 0);
    assert_eq!(t.state(&d3, track(5)), "+est+trk");
    // Retransmission of data already seen: within the window, fine.
    assert_eq!(t.state(&d1, track(5)), "+est+trk");
    assert_eq!(t.state(&d2, track(5)), "+est+rpl+trk");
    assert_eq!(t.ct.stats().invalid_total, 0);
    assert_eq!(t.ct.len(), 1);
}

#[test]
fn tcp_syn_states_before_reply() {
    let mut t = T::new();
    let syn = tcp4(A, 1234, B, 80, ISN_A, 0, tf::SYN, 0);
    // Uncommitted: +new, nothing stored; again +new.
    assert_eq!(t.state(&syn, track(0)), "+new+trk");
    assert_eq!(t.state(&syn, track(0)), "+new+trk");
    assert_eq!(t.ct.len(), 0);
    // A SYN-ACK cannot start a connection.
    let synack = tcp4(B, 80, A, 1234, ISN_B, ISN_A + 1, tf::SYN | tf::ACK, 0);
    assert_eq!(t.state(&synack, commit(0)), "+inv+trk");
    assert_eq!(t.ct.len(), 0);
    // Committed, then retransmitted before any reply: still +new.
    assert_eq!(t.state(&syn, commit(0)), "+new+trk");
    assert_eq!(t.state(&syn, track(0)), "+new+trk");
    assert_eq!(t.dump(), ["tcp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=1234,dport=80),reply=(src=10.0.0.2,dst=10.0.0.1,sport=80,dport=1234),protoinfo=(state=SYN_SENT)"]);
    assert_eq!(t.state(&synack, track(0)), "+est+rpl+trk");
}

#[test]
fn tcp_out_of_window_and_bad_flags_are_invalid() {
    let mut t = T::new();
    handshake(&mut t, 0);
    // Far beyond what B allowed A to send.
    let far = tcp4(
        A,
        1234,
        B,
        80,
        ISN_A + 1 + 10_000_000,
        ISN_B + 1,
        tf::ACK,
        10,
    );
    assert_eq!(t.state(&far, track(0)), "+inv+trk");
    // Far behind (more than a window back).
    let old = tcp4(
        A,
        1234,
        B,
        80,
        ISN_A.wrapping_sub(3_000_000),
        ISN_B + 1,
        tf::ACK,
        10,
    );
    assert_eq!(t.state(&old, track(0)), "+inv+trk");
    // Acking data B never sent.
    let bad_ack = tcp4(A, 1234, B, 80, ISN_A + 1, ISN_B + 2_000_000, tf::ACK, 0);
    assert_eq!(t.state(&bad_ack, track(0)), "+inv+trk");
    // Illegal flag combinations.
    for flags in [
        tf::SYN | tf::FIN,
        tf::SYN | tf::RST | tf::ACK,
        0,
        tf::FIN,
        tf::PSH,
    ] {
        let p = tcp4(A, 1234, B, 80, ISN_A + 1, ISN_B + 1, flags, 0);
        assert_eq!(t.state(&p, track(0)), "+inv+trk", "flags {flags:#x}");
    }
    // The connection is unharmed.
    let ok = tcp4(A, 1234, B, 80, ISN_A + 1, ISN_B + 1, tf::ACK, 10);
    assert_eq!(t.state(&ok, track(0)), "+est+trk");
    assert_eq!(t.ct.stats().invalid_total, 8);
}

#[test]
fn tcp_window_scaling() {
    // B advertises 1000 << 6 = 64000 bytes: a segment 50000 bytes ahead fits.
    let run = |scale: bool| -> String {
        let mut t = T::new();
        let ws: &[u8] = if scale { &[1, 3, 3, 6] } else { &[] };
        let syn = tcp4_opt(A, 1234, B, 80, ISN_A, 0, tf::SYN, 1000, ws, 0);
        assert_eq!(t.state(&syn, commit(0)), "+new+trk");
        let synack = tcp4_opt(
            B,
            80,
            A,
            1234,
            ISN_B,
            ISN_A + 1,
            tf::SYN | tf::ACK,
            1000,
            ws,
            0,
        );
        assert_eq!(t.state(&synack, track(0)), "+est+rpl+trk");
        let ack = tcp4_opt(A, 1234, B, 80, ISN_A + 1, ISN_B + 1, tf::ACK, 1000, &[], 0);
        assert_eq!(t.state(&ack, track(0)), "+est+trk");
        // B's first scaled window advertisement.
        let upd = tcp4_opt(B, 80, A, 1234, ISN_B + 1, ISN_A + 1, tf::ACK, 1000, &[], 0);
        assert_eq!(t.state(&upd, track(0)), "+est+rpl+trk");
        let ahead = tcp4_opt(
            A,
            1234,
            B,
            80,
            ISN_A + 1 + 50_000,
            ISN_B + 1,
            tf::ACK,
            1000,
            &[],
            100,
        );
        t.state(&ahead, track(0))
    };
    assert_eq!(run(true), "+est+trk");
    assert_eq!(run(false), "+inv+trk");
}

#[test]
fn tcp_synless_first_packet() {
    let mid = tcp4(A, 1234, B, 80, ISN_A, ISN_B, tf::ACK, 10);
    let mut t = T::new();
    assert_eq!(t.state(&mid, commit(0)), "+inv+trk");
    assert_eq!(t.ct.len(), 0);

    let mut t = T::with(CtConfig {
        tcp_loose: true,
        ..Default::default()
    });
    assert_eq!(t.state(&mid, commit(0)), "+new+trk");
    assert_eq!(t.ct.len(), 1);
    let back = tcp4(B, 80, A, 1234, ISN_B, ISN_A + 10, tf::ACK, 20);
    assert_eq!(t.state(&back, track(0)), "+est+rpl+trk");
    let more = tcp4(A, 1234, B, 80, ISN_A + 10, ISN_B + 20, tf::ACK, 10);
    assert_eq!(t.state(&more, track(0)), "+est+trk");
    // Even loose, a SYN-ACK cannot start a connection.
    let synack = tcp4(A, 999, B, 80, ISN_A, ISN_B, tf::SYN | tf::ACK, 0);
    assert_eq!(t.state(&synack, commit(0)), "+inv+trk");
}

/// What a switch restart (or `flush-conntrack`) looks like to a loose
/// tracker: a bulk stream both ways, window scaling negotiated (shift 7
/// both ways) in a handshake the tracker never saw, windows of 64 KiB and
/// 512 KiB, sequence numbers wrapping. Picked up from A's next segment, the
/// connection must stay `+est` (`+rpl` from B) for every segment after,
/// never `+inv`.
#[test]
fn tcp_loose_pickup_keeps_a_scaled_stream_going_both_ways() {
    let mut t = T::with(CtConfig {
        tcp_loose: true,
        ..Default::default()
    });
    const MSS: usize = 1448;
    // Windows as carried in the header: 512 << 7 = 64 KiB (A), 4000 << 7 =
    // 500 KiB (B).
    let (win_a, win_b) = (512u16, 4000u16);
    let (mut sa, mut sb) = (u32::MAX - 300_000, u32::MAX - 40_000);
    let mut acked_by_a = sb;
    let seg = |from_a: bool, seq: u32, ack: u32, len: usize| {
        if from_a {
            tcp4_opt(A, 40000, B, 5201, seq, ack, tf::ACK, win_a, &[], len)
        } else {
            tcp4_opt(B, 5201, A, 40000, seq, ack, tf::ACK, win_b, &[], len)
        }
    };
    // The first segment the tracker sees: A's data, mid-stream.
    assert_eq!(t.state(&seg(true, sa, sb, MSS), commit(0)), "+new+trk");
    sa = sa.wrapping_add(MSS as u32);
    let mut states = std::collections::BTreeMap::<String, usize>::new();
    let mut sent = (0usize, 0usize);
    for round in 0..60 {
        // A fills B's real window (500 KiB) minus what is in flight.
        let mut burst = 0;
        while burst + MSS <= 500 * 1024 {
            let s = t.state(&seg(true, sa, acked_by_a, MSS), track(0));
            *states.entry(format!("A {s}")).or_default() += 1;
            sa = sa.wrapping_add(MSS as u32);
            burst += MSS;
            sent.0 += MSS;
            // B acks every other segment; every 10th ack carries data.
            if burst % (2 * MSS) == 0 {
                let acked_by_b = sa;
                let len = if burst % (20 * MSS) == 0 { 1000 } else { 0 };
                let s = t.state(&seg(false, sb, acked_by_b, len), track(0));
                *states.entry(format!("B {s}")).or_default() += 1;
                sb = sb.wrapping_add(len as u32);
                sent.1 += len;
            }
        }
        // A acks B's data (a pure ack), at the end of each round.
        acked_by_a = sb;
        let s = t.state(&seg(true, sa, acked_by_a, 0), track(0));
        *states.entry(format!("A {s}")).or_default() += 1;
        assert!(
            states
                .keys()
                .all(|k| !k.contains("inv") && !k.contains("new")),
            "round {round}: {states:?}"
        );
    }
    assert_eq!(states.len(), 2, "{states:?}");
    assert!(states["A +est+trk"] > 10_000 && states["B +est+rpl+trk"] > 5_000);
    assert!(sent.0 > 30_000_000 && sent.1 > 1_000_000, "{sent:?}");
    assert_eq!(t.ct.len(), 1);
    assert_eq!(
        t.ct.entries()[0].tcp_states,
        Some((TcpState::Established, TcpState::Established))
    );
}

/// The switch was down while A's data kept arriving at B up to 1 MB past
/// what A knows was acked (B's acks were lost). A's retransmission is
/// picked up; B's acks for data the tracker never saw, and B's own data
/// carrying them, are `+est+rpl`, not `+inv`, also before A sends anything
/// new; then A's new data and a FIN teardown both ways.
#[test]
fn tcp_loose_pickup_when_the_receiver_is_ahead() {
    let mut t = T::with(CtConfig {
        tcp_loose: true,
        ..Default::default()
    });
    let (una, sb) = (77_000u32, 9_000_000u32);
    let ahead = una + 1_000_000;
    let a = |seq, ack, flags, len| tcp4_opt(A, 40000, B, 80, seq, ack, flags, 1024, &[], len);
    let b = |seq, ack, flags, len| tcp4_opt(B, 80, A, 40000, seq, ack, flags, 2048, &[], len);
    assert_eq!(t.state(&a(una, sb, tf::ACK, 1448), commit(0)), "+new+trk");
    for (i, len) in [0, 0, 500, 0].into_iter().enumerate() {
        let seq = sb + if i == 3 { 500 } else { 0 };
        assert_eq!(
            t.state(&b(seq, ahead, tf::ACK, len), track(0)),
            "+est+rpl+trk",
            "B's packet {i}"
        );
    }
    let mut sa = ahead;
    for _ in 0..50 {
        assert_eq!(
            t.state(&a(sa, sb + 500, tf::ACK, 1448), track(0)),
            "+est+trk"
        );
        sa += 1448;
        assert_eq!(
            t.state(&b(sb + 500, sa, tf::ACK, 0), track(0)),
            "+est+rpl+trk"
        );
    }
    assert_eq!(
        t.state(&a(sa, sb + 500, tf::FIN | tf::ACK, 0), track(0)),
        "+est+trk"
    );
    assert_eq!(
        t.state(&b(sb + 500, sa + 1, tf::FIN | tf::ACK, 0), track(0)),
        "+est+rpl+trk"
    );
    assert_eq!(
        t.state(&a(sa + 1, sb + 501, tf::ACK, 0), track(0)),
        "+est+trk"
    );
    assert_eq!(
        t.ct.entries()[0].tcp_states,
        Some((TcpState::FinWait2, TcpState::FinWait2))
    );
    // Still a tracker: a segment far outside every window is invalid.
    let wild = a(sa.wrapping_add(0x8000_0000), sb + 501, tf::ACK, 100);
    assert_eq!(t.state(&wild, track(0)), "+inv+trk");
}

/// Picked up while the other side is silent (its packets dropped
/// elsewhere, e.g. by a policy on its node): A keeps sending a few MB with
/// no answer, then retransmits from well before the segment that was picked
/// up (B had acked less than the tracker saw); B's acks then come back.
/// Nothing is `+inv`. (The tracker once gave A's segments only an unscaled
/// window past the first one and compared A's acks with a zero position
/// for B: such a stream stalled for good after 64 KB.)
#[test]
fn tcp_loose_pickup_while_the_other_side_is_silent() {
    let mut t = T::with(CtConfig {
        tcp_loose: true,
        ..Default::default()
    });
    for isn_b in [5u32, 0x9000_0000, u32::MAX - 1000] {
        t.ct.flush(None);
        let first = 3_000_000_000u32;
        let a = |seq: u32, len| tcp4_opt(A, 40000, B, 80, seq, isn_b, tf::ACK, 1024, &[], len);
        assert_eq!(t.state(&a(first, 1448), commit(0)), "+new+trk");
        let mut seq = first.wrapping_add(1448);
        for _ in 0..2000 {
            assert_eq!(
                t.state(&a(seq, 1448), track(0)),
                "+est+trk",
                "isn_b {isn_b:#x}"
            );
            seq = seq.wrapping_add(1448);
        }
        // Retransmissions from 100 KB before the pickup point.
        let una = first.wrapping_sub(100_000);
        for i in 0..10u32 {
            let r = a(una.wrapping_add(i * 1448), 1448);
            assert_eq!(t.state(&r, track(0)), "+est+trk", "retransmission {i}");
        }
        // B answers at last (acking the retransmissions), then the stream.
        let mut acked = una.wrapping_add(10 * 1448);
        let b = |ack| tcp4_opt(B, 80, A, 40000, isn_b, ack, tf::ACK, 2048, &[], 0);
        assert_eq!(t.state(&b(acked), track(0)), "+est+rpl+trk");
        for _ in 0..100 {
            assert_eq!(t.state(&a(acked, 1448), track(0)), "+est+trk");
            acked = acked.wrapping_add(1448);
            assert_eq!(t.state(&b(acked), track(0)), "+est+rpl+trk");
        }
    }
}

/// Picked up from the reply side (B's data first): the connection is
/// tracked with B as its original direction, and stays `+est` both ways.
#[test]
fn tcp_loose_pickup_from_the_server_side() {
    let mut t = T::with(CtConfig {
        tcp_loose: true,
        ..Default::default()
    });
    let mut sb = 3_000_000u32;
    let sa = 12_345u32;
    let b = |seq, ack, len| tcp4_opt(B, 80, A, 40000, seq, ack, tf::ACK, 2048, &[], len);
    let a = |seq, ack| tcp4_opt(A, 40000, B, 80, seq, ack, tf::ACK, 512, &[], 0);
    assert_eq!(t.state(&b(sb, sa, 1448), commit(0)), "+new+trk");
    sb += 1448;
    for _ in 0..100 {
        assert_eq!(t.state(&a(sa, sb), track(0)), "+est+rpl+trk");
        for _ in 0..20 {
            assert_eq!(t.state(&b(sb, sa, 1448), track(0)), "+est+trk");
            sb += 1448;
        }
    }
    assert_eq!(
        t.dump(),
        ["tcp,orig=(src=10.0.0.2,dst=10.0.0.1,sport=80,dport=40000),reply=(src=10.0.0.1,dst=10.0.0.2,sport=40000,dport=80),protoinfo=(state=ESTABLISHED)"]
    );
}

#[test]
fn tcp_rst_closes() {
    let mut t = T::new();
    handshake(&mut t, 0);
    let rst = tcp4(B, 80, A, 1234, ISN_B + 1, 0, tf::RST, 0);
    assert_eq!(t.state(&rst, track(0)), "+est+rpl+trk");
    let e = t.ct.entries()[0];
    assert_eq!(e.tcp_state, Some(TcpState::TimeWait));
    // Closed connections time out after tcp_close (30 s).
    assert_eq!(e.expiration_ns, t.now + 30 * SEC);
    // A new SYN on the tuple starts over.
    let syn = tcp4(A, 1234, B, 80, ISN_A + 77_777, 0, tf::SYN, 0);
    assert_eq!(t.state(&syn, commit(0)), "+new+trk");
    assert_eq!(t.ct.len(), 1);
    assert_eq!(t.ct.entries()[0].tcp_state, Some(TcpState::SynSent));
}

#[test]
fn tcp_rst_with_wrong_seq_is_invalid() {
    let mut t = T::new();
    handshake(&mut t, 0);
    let rst = tcp4(B, 80, A, 1234, ISN_B + 1000, 0, tf::RST, 0);
    assert_eq!(t.state(&rst, track(0)), "+inv+trk");
    assert_eq!(t.ct.entries()[0].tcp_state, Some(TcpState::Established));
}

#[test]
fn tcp_fin_teardown_then_reuse() {
    let mut t = T::new();
    handshake(&mut t, 0);
    let fin_a = tcp4(A, 1234, B, 80, ISN_A + 1, ISN_B + 1, tf::FIN | tf::ACK, 0);
    assert_eq!(t.state(&fin_a, track(0)), "+est+trk");
    assert_eq!(t.ct.entries()[0].tcp_state, Some(TcpState::Closing));
    // One side closing: tcp_fin_wait (15 min, OVS default).
    assert_eq!(t.ct.entries()[0].expiration_ns, t.now + 15 * 60 * SEC);
    let ack_b = tcp4(B, 80, A, 1234, ISN_B + 1, ISN_A + 2, tf::ACK, 0);
    assert_eq!(t.state(&ack_b, track(0)), "+est+rpl+trk");
    let fin_b = tcp4(B, 80, A, 1234, ISN_B + 1, ISN_A + 2, tf::FIN | tf::ACK, 0);
    assert_eq!(t.state(&fin_b, track(0)), "+est+rpl+trk");
    let ack_a = tcp4(A, 1234, B, 80, ISN_A + 2, ISN_B + 2, tf::ACK, 0);
    assert_eq!(t.state(&ack_a, track(0)), "+est+trk");
    let e = t.ct.entries()[0];
    assert_eq!(e.tcp_states, Some((TcpState::FinWait2, TcpState::FinWait2)));
    assert_eq!(e.tcp_state, Some(TcpState::TimeWait));
    assert!(t.dump()[0].ends_with("protoinfo=(state=TIME_WAIT)"));

    // Same tuple, new connection, even from the other side.
    t.now += SEC;
    let syn = tcp4(B, 80, A, 1234, 42, 0, tf::SYN, 0);
    assert_eq!(t.state(&syn, commit(0)), "+new+trk");
    assert_eq!(t.ct.len(), 1);
    assert_eq!(
        t.dump(),
        ["tcp,orig=(src=10.0.0.2,dst=10.0.0.1,sport=80,dport=1234),reply=(src=10.0.0.1,dst=10.0.0.2,sport=1234,dport=80),protoinfo=(state=SYN_SENT)"]
    );
    let synack = tcp4(A, 1234, B, 80, 9, 43, tf::SYN | tf::ACK, 0);
    assert_eq!(t.state(&synack, track(0)), "+est+rpl+trk");
}

#[test]
fn tcp_over_ipv6() {
    let mut t = T::new();
    let syn = tcp6(A6, 40000, B6, 443, ISN_A, 0, tf::SYN, 0);
    assert_eq!(t.state(&syn, commit(0)), "+new+trk");
    let synack = tcp6(B6, 443, A6, 40000, ISN_B, ISN_A + 1, tf::SYN | tf::ACK, 0);
    assert_eq!(t.state(&synack, track(0)), "+est+rpl+trk");
    let ack = tcp6(A6, 40000, B6, 443, ISN_A + 1, ISN_B + 1, tf::ACK, 200);
    assert_eq!(t.state(&ack, track(0)), "+est+trk");
    let far = tcp6(
        A6,
        40000,
        B6,
        443,
        ISN_A + 50_000_000,
        ISN_B + 1,
        tf::ACK,
        200,
    );
    assert_eq!(t.state(&far, track(0)), "+inv+trk");
    assert_eq!(
        t.dump(),
        ["tcp,orig=(src=2001:db8::1,dst=2001:db8::2,sport=40000,dport=443),reply=(src=2001:db8::2,dst=2001:db8::1,sport=443,dport=40000),protoinfo=(state=ESTABLISHED)"]
    );
}

// ---------------------------------------------------------------------------
// UDP, ICMP
// ---------------------------------------------------------------------------

#[test]
fn udp_request_reply() {
    let mut t = T::new();
    let req = udp4(A, 5353, B, 53);
    let rsp = udp4(B, 53, A, 5353);
    assert_eq!(t.state(&req, commit(0)), "+new+trk");
    assert_eq!(t.state(&req, commit(0)), "+new+trk");
    assert_eq!(t.state(&rsp, commit(0)), "+est+rpl+trk");
    assert_eq!(t.state(&req, commit(0)), "+est+trk");
    assert_eq!(t.state(&rsp, track(0)), "+est+rpl+trk");
    assert_eq!(
        t.dump(),
        ["udp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=5353,dport=53),reply=(src=10.0.0.2,dst=10.0.0.1,sport=53,dport=5353)"]
    );
    assert_eq!(t.ct.stats().committed_total, 1);
}

#[test]
fn uncommitted_packets_leave_no_state() {
    let mut t = T::new();
    let req = udp4(A, 5353, B, 53);
    let rsp = udp4(B, 53, A, 5353);
    assert_eq!(t.state(&req, track(0)), "+new+trk");
    assert_eq!(t.state(&rsp, track(0)), "+new+trk");
    assert_eq!(t.state(&req, track(0)), "+new+trk");
    assert!(t.ct.is_empty());
    assert_eq!(t.ct.stats().committed_total, 0);
}

#[test]
fn zones_isolate() {
    let mut t = T::new();
    let req = udp4(A, 5353, B, 53);
    let rsp = udp4(B, 53, A, 5353);
    assert_eq!(t.state(&req, commit(1)), "+new+trk");
    assert_eq!(t.state(&rsp, track(2)), "+new+trk");
    assert_eq!(t.state(&rsp, track(1)), "+est+rpl+trk");
    let v = t.run(&rsp, track(2));
    assert_eq!(v.zone, 2);
    assert_eq!(t.state(&req, commit(2)), "+new+trk");
    assert_eq!(t.ct.len(), 2);
}

#[test]
fn icmp_echo() {
    let mut t = T::new();
    let req = echo4(A, B, 8, 77);
    let rep = echo4(B, A, 0, 77);
    // A reply cannot start a connection.
    assert_eq!(t.state(&rep, commit(0)), "+inv+trk");
    assert_eq!(t.state(&req, commit(0)), "+new+trk");
    assert_eq!(t.state(&req, track(0)), "+new+trk");
    assert_eq!(t.state(&rep, track(0)), "+est+rpl+trk");
    assert_eq!(t.state(&req, track(0)), "+est+trk");
    // Another id is another connection.
    assert_eq!(t.state(&echo4(B, A, 0, 78), track(0)), "+inv+trk");
    assert_eq!(t.state(&echo4(A, B, 8, 78), track(0)), "+new+trk");
    assert_eq!(
        t.dump(),
        ["icmp,orig=(src=10.0.0.1,dst=10.0.0.2,id=77,type=8,code=0),reply=(src=10.0.0.2,dst=10.0.0.1,id=77,type=0,code=0)"]
    );
    // Echo with a nonzero code is not tracked.
    let mut rest = [0u8; 4];
    rest[..2].copy_from_slice(&77u16.to_be_bytes());
    assert_eq!(t.state(&icmp4(A, B, 8, 1, rest, b""), track(0)), "+inv+trk");
}

#[test]
fn icmpv6_echo_and_neighbour_discovery() {
    let mut t = T::new();
    let mut rest = [0u8; 4];
    rest[..2].copy_from_slice(&9u16.to_be_bytes());
    let req = icmp6(A6, B6, 128, 0, rest, b"ping");
    let rep = icmp6(B6, A6, 129, 0, rest, b"ping");
    assert_eq!(t.state(&req, commit(0)), "+new+trk");
    assert_eq!(t.state(&rep, track(0)), "+est+rpl+trk");
    assert_eq!(
        t.dump(),
        ["icmpv6,orig=(src=2001:db8::1,dst=2001:db8::2,id=9,type=128,code=0),reply=(src=2001:db8::2,dst=2001:db8::1,id=9,type=129,code=0)"]
    );
    // Neighbour solicitation: not trackable (as in OVS userspace).
    let ns = icmp6(A6, B6, 135, 0, [0; 4], &B6);
    assert_eq!(t.state(&ns, commit(0)), "+inv+trk");
}

#[test]
fn icmp_errors_are_related() {
    let mut t = T::new();
    let req = udp4(A, 5353, B, 53);
    assert_eq!(t.state(&req, commit(0)), "+new+trk");
    // B answers A's datagram with port unreachable: reply direction.
    let unreach = icmp4(B, A, 3, 3, [0; 4], &ip_of(&req));
    assert_eq!(t.state(&unreach, track(0)), "+rel+rpl+trk");
    // A router on the way says time exceeded (only 8 bytes of L4 quoted).
    let quoted = &ip_of(&req)[..28];
    let ttl = icmp4(R, A, 11, 0, [0; 4], quoted);
    assert_eq!(t.state(&ttl, track(0)), "+rel+rpl+trk");
    // An error about a reply-direction packet travels in the original direction.
    let rsp = udp4(B, 53, A, 5353);
    let back = icmp4(A, B, 3, 3, [0; 4], &ip_of(&rsp));
    assert_eq!(t.state(&back, track(0)), "+rel+trk");
    // Related packets do not establish the connection.
    assert_eq!(t.state(&req, track(0)), "+new+trk");

    // An error about a connection nobody tracks.
    let other = udp4(A, 5354, B, 53);
    let unrelated = icmp4(B, A, 3, 3, [0; 4], &ip_of(&other));
    assert_eq!(t.state(&unrelated, commit(0)), "+inv+trk");
    // The quoted packet's source must be the error's destination.
    let spoofed = icmp4(B, R, 3, 3, [0; 4], &ip_of(&req));
    assert_eq!(t.state(&spoofed, track(0)), "+inv+trk");
    // Truncated quote (no room for the ports).
    let short = icmp4(B, A, 3, 3, [0; 4], &ip_of(&req)[..24]);
    assert_eq!(t.state(&short, track(0)), "+inv+trk");
    assert_eq!(t.ct.len(), 1);

    // TCP: need frag for a tracked connection carries its mark.
    let syn = tcp4(A, 1234, B, 80, ISN_A, 0, tf::SYN, 0);
    let p = CtParams {
        mark: Some((7, u32::MAX)),
        ..commit(0)
    };
    assert_eq!(t.state(&syn, p), "+new+trk");
    let frag_needed = icmp4(R, A, 3, 4, [0, 0, 5, 0xdc], &ip_of(&syn));
    let v = t.run(&frag_needed, track(0));
    assert_eq!(st(&v), "+rel+rpl+trk");
    assert_eq!(v.mark, 7);
}

#[test]
fn icmpv6_packet_too_big_is_related() {
    let mut t = T::new();
    let syn = tcp6(A6, 40000, B6, 443, ISN_A, 0, tf::SYN, 0);
    assert_eq!(t.state(&syn, commit(0)), "+new+trk");
    let ack = tcp6(A6, 40000, B6, 443, ISN_A + 1, 0, tf::ACK, 1400);
    let ptb = icmp6(
        B6,
        A6,
        2,
        0,
        1280u32.to_be_bytes(),
        &ip_of(&ack)[..40 + 20 + 16],
    );
    assert_eq!(t.state(&ptb, track(0)), "+rel+rpl+trk");
    // Quote too short for a TCP header.
    let short = icmp6(B6, A6, 2, 0, 1280u32.to_be_bytes(), &ip_of(&ack)[..40 + 8]);
    assert_eq!(t.state(&short, track(0)), "+inv+trk");
}

// ---------------------------------------------------------------------------
// Timeouts, bounds, mark/label, force, flush
// ---------------------------------------------------------------------------

#[test]
fn timeouts_expire_after_not_before() {
    let mut t = T::new();
    let t0 = t.now;
    let req = udp4(A, 5353, B, 53);
    assert_eq!(t.state(&req, commit(0)), "+new+trk");
    assert_eq!(t.ct.expire(t0 + 60 * SEC - 1), 0);
    assert_eq!(t.ct.expire(t0 + 60 * SEC), 1);
    assert!(t.ct.is_empty());
    assert_eq!(t.ct.stats().expired_total, 1);

    // Lazily: an expired connection is absent on lookup.
    assert_eq!(t.state(&req, commit(0)), "+new+trk");
    let rsp = udp4(B, 53, A, 5353);
    assert_eq!(t.state(&rsp, track(0)), "+est+rpl+trk");
    // Bidirectional UDP: udp_multiple (30 s).
    t.now += 30 * SEC - 1;
    assert_eq!(t.state(&rsp, track(0)), "+est+rpl+trk");
    t.now += 30 * SEC;
    assert_eq!(t.state(&rsp, track(0)), "+new+trk");
    assert!(t.ct.is_empty());
    assert_eq!(t.ct.stats().expired_total, 2);

    // TCP: SYN_SENT 30 s, ESTABLISHED one day.
    let mut t = T::new();
    let t0 = t.now;
    let syn = tcp4(A, 1234, B, 80, ISN_A, 0, tf::SYN, 0);
    t.run(&syn, commit(0));
    assert_eq!(t.ct.expire(t0 + 30 * SEC - 1), 0);
    assert_eq!(t.ct.expire(t0 + 30 * SEC), 1);
    handshake(&mut t, 0);
    assert_eq!(t.ct.expire(t0 + 86_400 * SEC - 1), 0);
    assert_eq!(t.ct.expire(t0 + 86_400 * SEC), 1);

    // Configurable.
    let cfg = CtConfig {
        timeouts: CtTimeouts {
            icmp_first: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut t = T::with(cfg);
    let t0 = t.now;
    t.run(&echo4(A, B, 8, 1), commit(0));
    assert_eq!(t.ct.expire(t0 + 2 * SEC - 1), 0);
    assert_eq!(t.ct.expire(t0 + 2 * SEC), 1);
}

#[test]
fn expire_some_bounds_work() {
    let mut t = T::new();
    for port in 1..=10 {
        t.run(&udp4(A, port, B, 53), commit(0));
    }
    let later = t.now + 61 * SEC;
    assert_eq!(t.ct.expire_some(later, 3), 3);
    assert_eq!(t.ct.len(), 7);
    assert_eq!(t.ct.expire_some(later, 3), 3);
    assert_eq!(t.ct.expire_some(later, 100), 4);
    assert!(t.ct.is_empty());
}

#[test]
fn table_full() {
    let mut t = T::with(CtConfig {
        max_entries: 3,
        ..Default::default()
    });
    // Three connections that have seen replies (assured: never dropped
    // early).
    for port in 1..=3 {
        assert_eq!(t.state(&udp4(A, port, B, 53), commit(0)), "+new+trk");
        assert_eq!(t.state(&udp4(B, 53, A, port), track(0)), "+est+rpl+trk");
    }
    for port in 4..=6 {
        assert_eq!(t.state(&udp4(A, port, B, 53), commit(0)), "+inv+trk");
    }
    assert_eq!(t.ct.len(), 3);
    let s = t.ct.stats();
    assert_eq!(
        (
            s.entries,
            s.table_full_total,
            s.invalid_total,
            s.committed_total,
            s.early_drop_total
        ),
        (3, 3, 3, 3, 0)
    );
    // Existing connections still work, uncommitted new ones are still +new.
    assert_eq!(t.state(&udp4(B, 53, A, 1), track(0)), "+est+rpl+trk");
    assert_eq!(t.state(&udp4(A, 9, B, 53), track(0)), "+new+trk");
    // Once the old ones expire, commits succeed again.
    t.now += 61 * SEC;
    assert_eq!(t.state(&udp4(A, 7, B, 53), commit(0)), "+new+trk");
    assert!(t.ct.len() <= 3);
}

#[test]
fn mark_and_label() {
    let mut t = T::new();
    let req = udp4(A, 5353, B, 53);
    let rsp = udp4(B, 53, A, 5353);
    // Uncommitted: zeros even if a mark is asked for.
    let v = t.run(
        &req,
        CtParams {
            mark: Some((1, u32::MAX)),
            ..track(3)
        },
    );
    assert_eq!((v.mark, v.label, v.zone), (0, 0, 3));

    let p = CtParams {
        mark: Some((0x12, 0xff)),
        label: Some((0xaa << 64, u128::MAX)),
        ..commit(3)
    };
    let v = t.run(&req, p);
    assert_eq!((v.mark, v.label), (0x12, 0xaa << 64));
    // Both directions see them.
    let v = t.run(&rsp, track(3));
    assert_eq!(
        (st(&v).as_str(), v.mark, v.label),
        ("+est+rpl+trk", 0x12, 0xaa << 64)
    );
    // Masked update on an existing connection.
    let p = CtParams {
        mark: Some((0x300, 0xf00)),
        label: Some((0x5, 0xf)),
        ..commit(3)
    };
    let v = t.run(&rsp, p);
    assert_eq!((v.mark, v.label), (0x312, (0xaa << 64) | 5));
    let p = CtParams {
        mark: Some((0, 0xf)),
        ..commit(3)
    };
    assert_eq!(t.run(&req, p).mark, 0x310);
    // Without commit nothing changes.
    let p = CtParams {
        mark: Some((0, u32::MAX)),
        ..track(3)
    };
    assert_eq!(t.run(&req, p).mark, 0x310);
    assert_eq!(
        t.dump(),
        ["udp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=5353,dport=53),reply=(src=10.0.0.2,dst=10.0.0.1,sport=53,dport=5353),zone=3,mark=784,labels=0xaa0000000000000005"]
    );
}

#[test]
fn force_commit() {
    let mut t = T::new();
    let req = udp4(A, 5353, B, 53);
    let rsp = udp4(B, 53, A, 5353);
    let p = CtParams {
        mark: Some((9, u32::MAX)),
        ..commit(0)
    };
    t.run(&req, p);
    // Forced in the original direction: the connection stays.
    let force = CtParams {
        force: true,
        ..commit(0)
    };
    let v = t.run(&req, force);
    assert_eq!((st(&v).as_str(), v.mark), ("+new+trk", 9));
    // Forced in the reply direction: deleted and recommitted the other way.
    let v = t.run(&rsp, force);
    assert_eq!((st(&v).as_str(), v.mark), ("+new+trk", 0));
    assert_eq!(t.ct.len(), 1);
    assert_eq!(
        t.dump(),
        ["udp,orig=(src=10.0.0.2,dst=10.0.0.1,sport=53,dport=5353),reply=(src=10.0.0.1,dst=10.0.0.2,sport=5353,dport=53)"]
    );
    assert_eq!(t.state(&req, track(0)), "+est+rpl+trk");
}

#[test]
fn flush_by_zone() {
    let mut t = T::new();
    for zone in [1u16, 1, 2, 3] {
        let port = 1000 + t.ct.len() as u16;
        t.run(&udp4(A, port, B, 53), commit(zone));
    }
    assert_eq!(t.ct.len(), 4);
    assert_eq!(t.ct.flush(Some(1)), 2);
    assert_eq!(t.ct.len(), 2);
    assert!(t.ct.entries().iter().all(|e| e.zone != 1));
    assert_eq!(t.ct.flush(Some(7)), 0);
    assert_eq!(t.ct.flush(None), 2);
    assert!(t.ct.is_empty());
    // Slots are reused.
    t.run(&udp4(A, 1, B, 53), commit(1));
    assert_eq!(t.ct.len(), 1);
}

#[test]
fn compact_storage() {
    let bytes = Conntrack::bytes_per_entry();
    println!("bytes per connection: {bytes}");
    assert!(bytes <= 200, "{bytes}");
}

// ---------------------------------------------------------------------------
// Malformed input
// ---------------------------------------------------------------------------

#[test]
fn malformed_frames_are_invalid() {
    let mut t = T::new();
    let syn = tcp4(A, 1234, B, 80, ISN_A, 0, tf::SYN, 0);
    // Every truncation of a valid frame.
    for n in 0..syn.frame.len() {
        assert_eq!(
            t.state(
                &Pkt {
                    frame: syn.frame[..n].to_vec(),
                    ..syn.clone()
                },
                commit(0)
            ),
            "+inv+trk",
            "len {n}"
        );
    }
    // Key and frame disagree.
    let mut k = syn.key;
    k.set(Field::NwProto, 17);
    assert_eq!(
        t.state(
            &Pkt {
                key: k,
                ..syn.clone()
            },
            commit(0)
        ),
        "+inv+trk"
    );
    // Not IP.
    let arp = Pkt {
        frame: eth(0x0806, &[0; 28]),
        key: FlowKey::ZERO,
    };
    assert_eq!(t.state(&arp, commit(0)), "+inv+trk");
    // Fragments (no reassembly).
    let mut frag = udp4(A, 1, B, 2);
    frag.frame[14 + 6] = 0x20; // MF
    assert_eq!(t.state(&frag, commit(0)), "+inv+trk");
    let mut later = udp4(A, 1, B, 2);
    later.key.set(Field::NwFrag, 3);
    assert_eq!(t.state(&later, commit(0)), "+inv+trk");
    // Port zero.
    assert_eq!(t.state(&udp4(A, 0, B, 53), commit(0)), "+inv+trk");
    // Bad IHL / data offset / UDP length.
    let mut bad = udp4(A, 1, B, 2);
    bad.frame[14] = 0x44;
    assert_eq!(t.state(&bad, commit(0)), "+inv+trk");
    let mut bad = syn.clone();
    bad.frame[14 + 20 + 12] = 0x40;
    assert_eq!(t.state(&bad, commit(0)), "+inv+trk");
    let mut bad = udp4(A, 1, B, 2);
    bad.frame[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&100u16.to_be_bytes());
    assert_eq!(t.state(&bad, commit(0)), "+inv+trk");
    assert!(t.ct.is_empty());
    // Ethernet padding after the IP packet is fine; VLAN tags are skipped.
    let mut padded = udp4(A, 1, B, 2);
    padded.frame.extend_from_slice(&[0; 20]);
    assert_eq!(t.state(&padded, commit(0)), "+new+trk");
    let mut tagged = udp4(A, 3, B, 2);
    tagged.frame.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
    assert_eq!(t.state(&tagged, commit(0)), "+new+trk");
}

fn key_strategy() -> impl Strategy<Value = FlowKey> {
    (
        prop_oneof![Just(0x0800u16), Just(0x86ddu16), any::<u16>()],
        prop_oneof![Just(6u8), Just(17u8), Just(1u8), Just(58u8), any::<u8>()],
        any::<u32>(),
        any::<u32>(),
        any::<u16>(),
        any::<u16>(),
        any::<u16>(),
        prop_oneof![Just(0u8), any::<u8>()],
    )
        .prop_map(|(dl_type, proto, src, dst, sp, dp, flags, frag)| {
            let mut k = key4(src.to_be_bytes(), dst.to_be_bytes(), proto, sp, dp, flags);
            k.set(Field::DlType, dl_type.into());
            k.set(Field::NwFrag, frag.into());
            k
        })
}

proptest! {
    #[test]
    fn random_bytes_never_panic(frame in proptest::collection::vec(any::<u8>(), 0..200), key in key_strategy(),
                                commit in any::<bool>(), force in any::<bool>()) {
        let mut ct = Conntrack::new(CtConfig { max_entries: 4, ..Default::default() });
        let p = CtParams { zone: 1, commit, force, mark: Some((1, 1)), label: None, nat: None };
        for i in 0..3 {
            let v = ct.execute(&frame, &key, &p, i * SEC);
            prop_assert!(v.state & ct_state::TRK != 0);
            prop_assert!(ct.len() <= 4);
        }
        for e in ct.entries() {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn mutated_frames_never_panic(pos in 0usize..120, val in any::<u8>(), cut in 0usize..130, which in 0usize..5) {
        let req = udp4(A, 5353, B, 53);
        let seed = [
            tcp4(A, 1234, B, 80, ISN_A, 0, tf::SYN, 10),
            udp4(A, 5353, B, 53),
            icmp4(B, A, 3, 3, [0; 4], &ip_of(&req)),
            icmp6(B6, A6, 1, 4, [0; 4], &ip_of(&tcp6(A6, 1, B6, 2, 0, 0, tf::SYN, 0))),
            tcp6(A6, 40000, B6, 443, ISN_A, 0, tf::SYN, 0),
        ];
        let mut p = seed[which].clone();
        if pos < p.frame.len() {
            p.frame[pos] = val;
        }
        p.frame.truncate(cut);
        let mut ct = Conntrack::new(CtConfig::default());
        ct.execute(&req.frame, &req.key, &commit(0), 0);
        let v = ct.execute(&p.frame, &p.key, &commit(0), 1);
        prop_assert!(v.state & ct_state::TRK != 0);
    }
}

#[test]
fn other_protocols_and_errors_about_pings() {
    let mut t = T::new();
    // GRE: a pseudo-connection on addresses only.
    let gre = |src, dst| Pkt {
        frame: eth(0x0800, &ipv4(src, dst, 47, &[0, 0, 0x65, 0x58, 1, 2, 3, 4])),
        key: key4(src, dst, 47, 0, 0, 0),
    };
    assert_eq!(t.state(&gre(A, B), commit(0)), "+new+trk");
    assert_eq!(t.state(&gre(B, A), commit(0)), "+est+rpl+trk");
    assert_eq!(
        t.dump(),
        ["47,orig=(src=10.0.0.1,dst=10.0.0.2,sport=0,dport=0),reply=(src=10.0.0.2,dst=10.0.0.1,sport=0,dport=0)"]
    );
    // Host unreachable about a tracked ping.
    let req = echo4(A, B, 8, 5);
    assert_eq!(t.state(&req, commit(0)), "+new+trk");
    let unreach = icmp4(R, A, 3, 1, [0; 4], &ip_of(&req));
    assert_eq!(t.state(&unreach, track(0)), "+rel+rpl+trk");
    // An error about an error is not tracked.
    let nested = icmp4(B, R, 3, 1, [0; 4], &ip_of(&unreach));
    assert_eq!(t.state(&nested, track(0)), "+inv+trk");
}
