//! Saving and restoring the connection table (`Conntrack::save_state`,
//! `Conntrack::restore_state`): a restored table gives the same verdicts
//! as the original would have (direction, `+est`/`+rpl`, zone, mark,
//! label, TCP windows), on another clock; damaged files are refused with
//! an error and leave the table empty; no input panics.

use oxvs_pipeline::conntrack::{
    state_len_limit, Conntrack, CtConfig, CtParams, CtStateError, STATE_VERSION,
};
use oxvs_pipeline::field::{ct_state, tcp_flags as tf, write_flags, Field};
use oxvs_pipeline::key::FlowKey;
use proptest::prelude::*;

const SEC: u64 = 1_000_000_000;
const A: [u8; 4] = [10, 244, 0, 3];
const B: [u8; 4] = [10, 244, 1, 4];
const A6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3];
const B6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4];

struct Pkt {
    frame: Vec<u8>,
    key: FlowKey,
}

fn tcp_l4(sport: u16, dport: u16, seq: u32, ack: u32, flags: u16, win: u16, len: usize) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&ack.to_be_bytes());
    h.extend_from_slice(&((5u16 << 12) | flags).to_be_bytes());
    h.extend_from_slice(&win.to_be_bytes());
    h.extend_from_slice(&[0; 4]);
    h.extend(std::iter::repeat_n(0xab, len));
    h
}

fn frame(ethertype: u16, l3: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(l3);
    f
}

fn ip4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Pkt {
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(l4);
    let mut k = FlowKey::ZERO;
    k.set(Field::DlType, 0x0800);
    k.set(Field::NwSrc, u32::from_be_bytes(src).into());
    k.set(Field::NwDst, u32::from_be_bytes(dst).into());
    k.set(Field::NwProto, proto.into());
    Pkt {
        frame: frame(0x0800, &ip),
        key: k,
    }
}

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
    let mut p = ip4(
        src,
        dst,
        6,
        &tcp_l4(sport, dport, seq, ack, flags, 8192, len),
    );
    p.key.set(Field::TpSrc, sport.into());
    p.key.set(Field::TpDst, dport.into());
    p.key.set(Field::TcpFlags, flags.into());
    p
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
    let l4 = tcp_l4(sport, dport, seq, ack, flags, 8192, len);
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[6, 64]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    ip.extend_from_slice(&l4);
    let mut k = FlowKey::ZERO;
    k.set(Field::DlType, 0x86dd);
    k.set(Field::Ipv6Src, u128::from_be_bytes(src));
    k.set(Field::Ipv6Dst, u128::from_be_bytes(dst));
    k.set(Field::NwProto, 6);
    k.set(Field::TpSrc, sport.into());
    k.set(Field::TpDst, dport.into());
    k.set(Field::TcpFlags, flags.into());
    Pkt {
        frame: frame(0x86dd, &ip),
        key: k,
    }
}

fn udp4(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Pkt {
    let mut l4 = Vec::new();
    l4.extend_from_slice(&sport.to_be_bytes());
    l4.extend_from_slice(&dport.to_be_bytes());
    l4.extend_from_slice(&[0, 13, 0, 0]);
    l4.extend_from_slice(b"hello");
    let mut p = ip4(src, dst, 17, &l4);
    p.key.set(Field::TpSrc, sport.into());
    p.key.set(Field::TpDst, dport.into());
    p
}

fn echo4(src: [u8; 4], dst: [u8; 4], icmp_type: u8, id: u16) -> Pkt {
    let mut l4 = vec![icmp_type, 0, 0, 0];
    l4.extend_from_slice(&id.to_be_bytes());
    l4.extend_from_slice(&[0, 1]);
    l4.extend_from_slice(b"ping");
    let mut p = ip4(src, dst, 1, &l4);
    p.key.set(Field::TpSrc, icmp_type.into());
    p
}

fn params(zone: u16, commit: bool, mark: u32, label: u128) -> CtParams {
    CtParams {
        zone,
        commit,
        force: false,
        mark: commit.then_some((mark, u32::MAX)),
        label: commit.then_some((label, u128::MAX)),
        nat: None,
    }
}

fn state(bits: u32) -> String {
    let names = ct_state::NAMES.map(|(n, b)| (n, u128::from(b)));
    let mut s = String::new();
    write_flags(&mut s, &names, bits.into(), bits.into());
    s
}

/// A tracker and its clock.
struct T {
    ct: Conntrack,
    now: u64,
}

impl T {
    fn new(now: u64) -> T {
        T {
            ct: Conntrack::new(CtConfig::default()),
            now,
        }
    }
    /// `(ct_state, zone, mark, label)` of one packet.
    fn go(&mut self, p: &Pkt, ps: CtParams) -> (String, u16, u32, u128) {
        self.now += 1_000;
        let v = self.ct.execute(&p.frame, &p.key, &ps, self.now);
        (state(v.state), v.zone, v.mark, v.label)
    }
}

const ISN_A: u32 = 4_000_000_000; // wraps during the test
const ISN_B: u32 = 100;

/// A tracker holding: a TCP connection A:40000 -> B:80 in zone 5 with mark
/// and label, established with data both ways; a UDP flow seen both ways
/// (zone 0); an unanswered ping; an IPv6 TCP connection half open (SYN
/// only); a TCP connection in FIN_WAIT on one side.
fn populated() -> T {
    let mut t = T::new(5_000 * SEC);
    let tcp = params(5, true, 0x1234, 0xfeed << 64);
    assert_eq!(
        t.go(&tcp4(A, 40000, B, 80, ISN_A, 0, tf::SYN, 0), tcp).0,
        "+new+trk"
    );
    let syn_ack = tcp4(B, 80, A, 40000, ISN_B, ISN_A + 1, tf::SYN | tf::ACK, 0);
    assert_eq!(t.go(&syn_ack, params(5, false, 0, 0)).0, "+est+rpl+trk");
    let mut sa = ISN_A.wrapping_add(1);
    for _ in 0..100 {
        let d = tcp4(A, 40000, B, 80, sa, ISN_B + 1, tf::ACK, 1400);
        assert_eq!(t.go(&d, params(5, false, 0, 0)).0, "+est+trk");
        sa = sa.wrapping_add(1400);
        let r = tcp4(B, 80, A, 40000, ISN_B + 1, sa, tf::ACK, 0);
        assert_eq!(t.go(&r, params(5, false, 0, 0)).0, "+est+rpl+trk");
    }
    t.go(&udp4(A, 5353, B, 53), params(0, true, 7, 0));
    t.go(&udp4(B, 53, A, 5353), params(0, false, 0, 0));
    t.go(&echo4(A, B, 8, 77), params(0, true, 0, 0));
    t.go(
        &tcp6(A6, 1111, B6, 443, 5, 0, tf::SYN, 0),
        params(3, true, 0, 0),
    );
    // A closing connection: A sent FIN.
    t.go(
        &tcp4(A, 40001, B, 80, 1, 0, tf::SYN, 0),
        params(0, true, 0, 0),
    );
    t.go(
        &tcp4(B, 80, A, 40001, 9, 2, tf::SYN | tf::ACK, 0),
        params(0, false, 0, 0),
    );
    t.go(
        &tcp4(A, 40001, B, 80, 2, 10, tf::ACK, 0),
        params(0, false, 0, 0),
    );
    t.go(
        &tcp4(A, 40001, B, 80, 2, 10, tf::FIN | tf::ACK, 0),
        params(0, false, 0, 0),
    );
    assert_eq!(t.ct.len(), 5);
    t
}

/// The sequence number A's next data starts at in `populated`.
fn next_seq_a() -> u32 {
    ISN_A.wrapping_add(1).wrapping_add(100 * 1400)
}

fn track(zone: u16) -> CtParams {
    params(zone, false, 0, 0)
}

#[test]
fn a_restored_table_gives_the_same_verdicts() {
    let orig = populated();
    let wall = 1_700_000_000 * SEC;
    let bytes = orig.ct.save_state(orig.now, wall);
    assert_eq!(bytes.len() as u64, state_len_limit(5));
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), STATE_VERSION);

    // The new process: another monotonic clock (it started at 0), 2 s of
    // wall-clock downtime; loose pickup off, so every +est below comes from
    // the restored state, not from a pickup.
    let mut t = T::new(3 * SEC);
    let r =
        t.ct.restore_state(&bytes, t.now, wall + 2 * SEC)
            .expect("restore");
    assert_eq!((r.restored, r.expired, r.downtime_ns), (5, 0, 2 * SEC));

    // Same entries (dump text), lifetimes moved to the new clock minus the downtime.
    let text = |ct: &Conntrack| {
        let mut v: Vec<String> = ct.entries().iter().map(|e| e.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(text(&t.ct), text(&orig.ct));
    for (a, b) in orig.ct.entries().iter().zip(t.ct.entries()) {
        assert_eq!(a.tcp_states, b.tcp_states);
        assert_eq!(
            b.expiration_ns - t.now,
            a.expiration_ns - orig.now - 2 * SEC,
            "{a}"
        );
    }

    // TCP: A's next segment is +est, B's ack +est+rpl, both with the
    // connection's zone, mark and label.
    let sa = next_seq_a();
    let d = tcp4(A, 40000, B, 80, sa, ISN_B + 1, tf::ACK, 1400);
    assert_eq!(
        t.go(&d, track(5)),
        ("+est+trk".into(), 5, 0x1234, 0xfeed << 64)
    );
    let r = tcp4(
        B,
        80,
        A,
        40000,
        ISN_B + 1,
        sa.wrapping_add(1400),
        tf::ACK,
        0,
    );
    assert_eq!(
        t.go(&r, track(5)),
        ("+est+rpl+trk".into(), 5, 0x1234, 0xfeed << 64)
    );
    // The window state came along: a segment far outside it is still +inv
    // (a pickup would have had nothing to check it against).
    let wild = tcp4(
        A,
        40000,
        B,
        80,
        sa.wrapping_add(0x7000_0000),
        ISN_B + 1,
        tf::ACK,
        10,
    );
    assert_eq!(t.go(&wild, track(5)).0, "+inv+trk");
    // Same tuple, other zone: a different connection (and a mid-stream
    // one, so +inv without loose pickup).
    assert_eq!(t.go(&d, track(6)).0, "+inv+trk");

    // UDP both ways seen: +est either way; the mark came along.
    assert_eq!(
        t.go(&udp4(A, 5353, B, 53), track(0)),
        ("+est+trk".into(), 0, 7, 0)
    );
    assert_eq!(t.go(&udp4(B, 53, A, 5353), track(0)).0, "+est+rpl+trk");
    // The ping's reply completes it.
    assert_eq!(t.go(&echo4(B, A, 0, 77), track(0)).0, "+est+rpl+trk");
    // The half-open IPv6 connection: the SYN-ACK is its first reply.
    let sa6 = tcp6(B6, 443, A6, 1111, 900, 6, tf::SYN | tf::ACK, 0);
    assert_eq!(t.go(&sa6, track(3)).0, "+est+rpl+trk");
    // The closing connection: B acks A's FIN and closes too.
    let f = tcp4(B, 80, A, 40001, 10, 3, tf::FIN | tf::ACK, 0);
    assert_eq!(t.go(&f, track(0)).0, "+est+rpl+trk");
    let last = tcp4(A, 40001, B, 80, 3, 11, tf::ACK, 0);
    assert_eq!(t.go(&last, track(0)).0, "+est+trk");
    assert_eq!(t.ct.len(), 5);
    assert_eq!(t.ct.stats().invalid_total, 2);

    // Saving the restored table again and restoring that also works.
    let again = t.ct.save_state(t.now, wall + 3 * SEC);
    let mut u = T::new(0);
    let r =
        u.ct.restore_state(&again, 0, wall + 3 * SEC)
            .expect("again");
    assert_eq!(r.restored, 5);
}

#[test]
fn expired_connections_are_not_saved_nor_restored() {
    let orig = populated();
    // 40 s later the UDP flow (30 s once answered) and the half-open
    // connection (30 s) are gone; the ping (60 s), the closing connection
    // (15 min) and the established one (24 h) are saved.
    let bytes = orig.ct.save_state(orig.now + 40 * SEC, 0);
    assert_eq!(bytes.len() as u64, state_len_limit(3));
    // Down for 2 minutes: the ping expired meanwhile.
    let mut t = T::new(0);
    let r = t.ct.restore_state(&bytes, 0, 120 * SEC).expect("ok");
    assert_eq!((r.restored, r.expired), (2, 1));
    // Down for 16 minutes: only the established connection is left.
    let mut t = T::new(0);
    let r = t.ct.restore_state(&bytes, 0, 16 * 60 * SEC).expect("ok");
    assert_eq!((r.restored, r.expired), (1, 2));
    assert_eq!(t.ct.entries()[0].zone, 5);
}

#[test]
fn damaged_files_are_refused_and_leave_the_table_empty() {
    let orig = populated();
    let good = orig.ct.save_state(orig.now, 0);
    let refuse = |bytes: &[u8]| -> CtStateError {
        let mut ct = Conntrack::new(CtConfig::default());
        let e = ct.restore_state(bytes, 0, 0).expect_err("must be refused");
        assert!(ct.is_empty(), "{e}");
        e
    };
    // Every truncation.
    for n in 0..good.len() {
        let e = refuse(&good[..n]);
        assert!(
            matches!(e, CtStateError::Truncated { .. }),
            "cut to {n}: {e}"
        );
        assert!(e.to_string().starts_with("truncated: "), "{e}");
    }
    // Every single-bit flip, anywhere (header, records, checksum).
    for i in 0..good.len() {
        for bit in [0u8, 3, 7] {
            let mut b = good.clone();
            b[i] ^= 1 << bit;
            refuse(&b);
        }
    }
    // What the errors say.
    let mut b = good.clone();
    b[0] = b'X';
    assert!(refuse(&b)
        .to_string()
        .contains("not a conntrack state file"));
    let mut b = good.clone();
    b[8] = 9;
    assert_eq!(
        refuse(&b).to_string(),
        format!("format version 9, this switch reads versions 1 to {STATE_VERSION}")
    );
    let mut b = good.clone();
    b.push(0);
    assert_eq!(refuse(&b).to_string(), "1 bytes after the last record");
    let mut b = good.clone();
    let n = b.len();
    b[n - 20] ^= 0xff;
    assert!(refuse(&b).to_string().contains("checksum mismatch"));
    // A count that would need more than the table holds: refused before
    // anything is allocated, whatever the file's length.
    let mut b = good.clone();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(refuse(&b), CtStateError::TooMany { .. }));
    let mut small = Conntrack::new(CtConfig {
        max_entries: 4,
        ..CtConfig::default()
    });
    let e = small.restore_state(&good, 0, 0).expect_err("5 > 4");
    assert_eq!(
        e.to_string(),
        "5 connections, more than this table holds (max_entries 4)"
    );
    // Empty input and an empty table's file.
    assert!(matches!(refuse(&[]), CtStateError::Truncated { .. }));
    let empty = Conntrack::new(CtConfig::default()).save_state(0, 0);
    let mut ct = Conntrack::new(CtConfig::default());
    assert_eq!(ct.restore_state(&empty, 0, 0).expect("ok").restored, 0);
}

/// FNV-1a 64, as the format's trailer (so that mutated files get past the
/// checksum and reach the record checks).
fn reseal(b: &mut [u8]) {
    if b.len() < 8 {
        return;
    }
    let n = b.len() - 8;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in &b[..n] {
        h ^= u64::from(*x);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    b[n..].copy_from_slice(&h.to_le_bytes());
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let mut ct = Conntrack::new(CtConfig { max_entries: 8, ..CtConfig::default() });
        let r = ct.restore_state(&bytes, 0, 0);
        prop_assert!(r.is_err() || ct.len() <= 8);
        if r.is_err() {
            prop_assert!(ct.is_empty());
        }
    }

    /// A valid file with bytes changed and the checksum fixed up: restored
    /// or refused, never a panic; whatever is restored then tracks
    /// packets, saves and restores again without panicking.
    #[test]
    fn mutated_files_never_panic(changes in proptest::collection::vec((0usize..600, any::<u8>()), 1..8),
                                 pkt in 0usize..4) {
        let orig = populated();
        let mut b = orig.ct.save_state(orig.now, 0);
        for (i, v) in changes {
            let n = b.len();
            b[i % n] = v;
        }
        reseal(&mut b);
        let mut t = T::new(0);
        if t.ct.restore_state(&b, 0, 0).is_ok() {
            let sa = next_seq_a();
            let p = [
                tcp4(A, 40000, B, 80, sa, ISN_B + 1, tf::ACK, 100),
                tcp4(B, 80, A, 40000, ISN_B + 1, sa, tf::ACK | tf::RST, 0),
                udp4(B, 53, A, 5353),
                tcp4(A, 40001, B, 80, 3, 11, tf::ACK, 0),
            ];
            for zone in [0, 5] {
                t.go(&p[pkt], track(zone));
            }
            let again = t.ct.save_state(t.now, 0);
            let mut u = T::new(0);
            prop_assert!(u.ct.restore_state(&again, 0, 0).is_ok());
        } else {
            prop_assert!(t.ct.is_empty());
        }
    }
}
