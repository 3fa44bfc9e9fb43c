//! `conntrack`: sequences of TCP, UDP and ICMP packets between a few
//! endpoints, with time steps, through the connection tracker, directly
//! ([`Conntrack::execute`]) or through a [`Datapath`] whose flows `ct` and
//! recirculate (IPv4 packets optionally cut into fragments, delivered in
//! the order the input says, so reassembly feeds the tracker).
//!
//! The input picks the tracker's configuration (a small `max_entries` so
//! the table fills, loose pickup, sequence checking), then a list of
//! operations. TCP sequence and ack numbers are by default the ones the
//! harness tracked per direction (plus a fuzzed offset), so the state
//! machine and window tracking are reached in depth rather than rejected
//! at the first segment.
//!
//! Checked after every operation: `+trk` on every verdict; `+inv` never
//! with `+new`/`+est`/`+rel`; an `+inv` packet (without `force`) leaves the
//! live connections as they were; a packet without `commit` never adds a
//! connection, nor carries a mark or label when there is none; the table never holds more than `max_entries`, and `len`,
//! `stats().entries` and `entries()` agree. At the end the live table
//! survives `save_state` / `restore_state` unchanged, and expiry after the
//! longest timeout leaves it empty. A separate mode (first byte 0xff)
//! offers the rest of the input to `restore_state` as a state file.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, OnceLock};

use oxvs_pipeline::conntrack::{Conntrack, CtConfig, CtEntry, CtParams};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::ct_state::{EST, INV, NEW, REL, TRK};
use oxvs_pipeline::flow::{NatAction, NatKind, NatRange};
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;
use oxvs_pipeline::FlowMod;

use crate::frames::{self, tcp, Addr, V4Opts};
use crate::input::Input;

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

const V4: [[u8; 4]; 3] = [[10, 0, 0, 1], [10, 0, 0, 2], [10, 0, 0, 3]];
const V6: [[u8; 16]; 3] = [
    [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
    [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3],
];
const PORTS: [u16; 4] = [40000, 80, 53, 0];

/// The flows of the datapath mode: everything IP is tracked in zone 1,
/// new connections are committed, established and related ones forwarded.
const FLOWS: &str = "
table=0,priority=10,ip actions=ct(zone=1,table=1)
table=0,priority=10,ipv6 actions=ct(zone=1,table=1)
table=0,priority=0 actions=drop
table=1,priority=20,ct_state=+trk+inv actions=drop
table=1,priority=10,ct_state=+trk+new,ip actions=ct(commit,zone=1,exec(set_field:0x5->ct_mark)),output:2
table=1,priority=10,ct_state=+trk+new,ipv6 actions=ct(commit,zone=1,exec(set_field:0x5->ct_mark)),output:2
table=1,priority=10,ct_state=+trk+est actions=output:2
table=1,priority=10,ct_state=+trk+rel actions=output:2
table=1,priority=0 actions=drop
";

fn pipeline() -> Arc<Pipeline> {
    static P: OnceLock<Arc<Pipeline>> = OnceLock::new();
    P.get_or_init(|| {
        let flows = parse_flow_file(FLOWS, &ParseContext::default()).expect("flows parse");
        let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
        let p = Arc::new(Pipeline::new());
        p.apply(&mods, 0).expect("flows install");
        p
    })
    .clone()
}

/// One direction of a connection as the harness sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Dir {
    src: Addr,
    dst: Addr,
    sport: u16,
    dport: u16,
}

impl Dir {
    fn from_input(i: &mut Input<'_>) -> Dir {
        let a = i.u8();
        let b = i.u8();
        let (s, d) = (usize::from(a >> 1) % 3, usize::from(a >> 3) % 3);
        let (src, dst) = if a & 1 == 0 {
            (Addr::V4(V4[s]), Addr::V4(V4[d]))
        } else {
            (Addr::V6(V6[s]), Addr::V6(V6[d]))
        };
        Dir {
            src,
            dst,
            sport: PORTS[usize::from(b & 3)],
            dport: PORTS[usize::from(b >> 2 & 3)],
        }
    }

    fn reverse(self) -> Dir {
        Dir {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
        }
    }

    fn v6(self) -> bool {
        matches!(self.src, Addr::V6(_))
    }
}

/// What the harness remembers of each TCP direction: the next sequence
/// number it would send.
#[derive(Default)]
struct Seqs(HashMap<Dir, u32>);

impl Seqs {
    fn next(&mut self, d: Dir, i: &mut Input<'_>) -> u32 {
        *self.0.entry(d).or_insert_with(|| i.u32())
    }
}

/// Builds the next packet (its L4 bytes and protocol) of the operation.
fn tcp_packet(i: &mut Input<'_>, d: Dir, seqs: &mut Seqs) -> (u8, Vec<u8>) {
    let mode = i.u8();
    let mut seq = seqs.next(d, i);
    let mut ack = seqs.next(d.reverse(), i);
    match mode & 3 {
        0 => {}
        1 => {
            seq = seq.wrapping_add(i.u8() as i8 as u32);
            ack = ack.wrapping_add(i.u8() as i8 as u32);
        }
        2 => {
            seq = seq.wrapping_add(u32::from(i.u16()) << 8);
            ack = ack.wrapping_sub(u32::from(i.u16()) << 4);
        }
        _ => {
            seq = i.u32();
            ack = i.u32();
        }
    }
    let flags = match mode >> 2 & 7 {
        0 => tcp::SYN,
        1 => tcp::SYN | tcp::ACK,
        2 | 3 => tcp::ACK,
        4 => tcp::PSH | tcp::ACK,
        5 => tcp::FIN | tcp::ACK,
        6 => {
            if i.bool() {
                tcp::RST
            } else {
                tcp::RST | tcp::ACK
            }
        }
        _ => i.u8(),
    };
    let window = match i.u8() & 3 {
        0 => 65535,
        1 => 1024,
        2 => 0,
        _ => i.u16(),
    };
    let mut options = Vec::new();
    if mode & 0x20 != 0 {
        // MSS, SACK permitted, window scale.
        options.extend_from_slice(&[2, 4, 0x05, 0xb4, 4, 2, 3, 3, i.u8() % 16, 1]);
    }
    let len = i.below(if mode & 0x40 != 0 { 1400 } else { 48 });
    let data = vec![0x5a; len];
    let seg = frames::tcp_segment(d.sport, d.dport, seq, ack, flags, window, &options, &data);
    let advance = len as u32 + u32::from(flags & tcp::SYN != 0) + u32::from(flags & tcp::FIN != 0);
    seqs.0.insert(d, seq.wrapping_add(advance));
    (frames::PROTO_TCP, seg)
}

fn icmp_packet(i: &mut Input<'_>, d: Dir, seqs: &mut Seqs) -> (u8, Vec<u8>) {
    let kind = i.u8();
    let v6 = d.v6();
    let proto = if v6 {
        frames::PROTO_ICMPV6
    } else {
        frames::PROTO_ICMP
    };
    let id = [i.u8() & 3, 0, 0, i.u8()];
    match kind % 4 {
        // Echo request / reply.
        0 | 1 => {
            let ty = match (v6, kind % 4) {
                (false, 0) => 8,
                (false, _) => 0,
                (true, 0) => 128,
                (true, _) => 129,
            };
            (proto, frames::icmp_message(ty, 0, id, &[0; 8]))
        }
        // An error quoting a packet of some (maybe tracked) connection.
        2 => {
            let quoted = *i.pick(&[d, d.reverse()]);
            let (qproto, l4) = if i.bool() {
                tcp_packet(i, quoted, seqs)
            } else {
                (
                    frames::PROTO_UDP,
                    frames::udp_datagram(quoted.sport, quoted.dport, &[]),
                )
            };
            let mut inner = frames::ip_frame(quoted.src, quoted.dst, qproto, &l4);
            inner.drain(..14);
            let keep = match i.u8() % 3 {
                0 => inner.len(),
                1 => inner.len().min(if v6 { 48 } else { 28 }),
                _ => i.below(inner.len() + 1),
            };
            inner.truncate(keep);
            let (ty, code) = match (v6, i.u8() % 4) {
                (false, 0) => (3, 3),
                (false, 1) => (3, 4),
                (false, 2) => (11, 0),
                (false, _) => (5, 1),
                (true, 0) => (1, 4),
                (true, 1) => (2, 0),
                (true, 2) => (3, 0),
                (true, _) => (4, 1),
            };
            (
                proto,
                frames::icmp_message(ty, code, [0, 0, 0x05, 0xdc], &inner),
            )
        }
        // Anything else (neighbour discovery, timestamps, garbage).
        _ => {
            let ty = i.u8();
            let code = i.u8();
            let data = i.short_bytes().to_vec();
            (proto, frames::icmp_message(ty, code, id, &data))
        }
    }
}

/// Live connections, comparable: (entry as text) sorted.
fn live(ct: &Conntrack, now: u64) -> Vec<String> {
    let mut v: Vec<String> = ct
        .entries()
        .iter()
        .filter(|e| e.expiration_ns > now)
        .map(|e: &CtEntry| format!("{e:?}"))
        .collect();
    v.sort();
    v
}

fn check_table(ct: &Conntrack, max: usize) {
    assert!(
        ct.len() <= max,
        "{} connections > max_entries {max}",
        ct.len()
    );
    assert_eq!(ct.stats().entries, ct.len());
    assert_eq!(ct.entries().len(), ct.len());
}

/// Cuts an IPv4 frame into fragments carrying `chunk`-byte pieces of its
/// payload (a multiple of 8), in offset order. Non-IPv4 frames stay whole.
fn fragment(frame: &[u8], chunk: usize) -> Vec<Vec<u8>> {
    if frame.len() < 34 || frame[12..14] != frames::ETH_IPV4.to_be_bytes() {
        return vec![frame.to_vec()];
    }
    let ip = &frame[14..];
    let src: [u8; 4] = ip[12..16].try_into().expect("4 bytes");
    let dst: [u8; 4] = ip[16..20].try_into().expect("4 bytes");
    let payload = &ip[20..];
    let chunk = (chunk / 8 * 8).max(8);
    let mut out = Vec::new();
    for (k, piece) in payload.chunks(chunk).enumerate() {
        let off = k * chunk;
        let more = off + piece.len() < payload.len();
        let o = V4Opts {
            ttl: 64,
            ident: 0x4242,
            frag: (if more { 0x2000 } else { 0 }) | (off / 8) as u16,
        };
        let mut f = frame[..14].to_vec();
        f.extend_from_slice(&frames::ipv4_packet(src, dst, ip[9], o, piece));
        out.push(f);
    }
    out
}

pub fn run(data: &[u8]) {
    let mut i = Input::new(data);
    let cfg_byte = i.u8();
    if cfg_byte == 0xff {
        restore_untrusted(i.rest());
        return;
    }
    let max = 1 + usize::from(cfg_byte & 0x0f);
    let config = CtConfig {
        max_entries: max,
        tcp_loose: cfg_byte & 0x10 != 0,
        tcp_seq_check: cfg_byte & 0x20 == 0,
        ..CtConfig::default()
    };
    let mut ct = Conntrack::new(config.clone());
    let mut dp = Datapath::new(
        pipeline(),
        XlateEnv::with_ports(vec![1, 2]),
        DatapathConfig::default(),
    );
    let mut seqs = Seqs::default();
    let mut now: u64 = S;
    let mut ops = 0;
    while !i.is_empty() && ops < 256 {
        ops += 1;
        let op = i.u8();
        match op % 8 {
            0..=5 => {
                let d = Dir::from_input(&mut i);
                let (proto, l4) = match op % 8 {
                    0..=2 => tcp_packet(&mut i, d, &mut seqs),
                    3 | 4 => (
                        frames::PROTO_UDP,
                        frames::udp_datagram(d.sport, d.dport, &vec![0; i.below(64)]),
                    ),
                    _ => icmp_packet(&mut i, d, &mut seqs),
                };
                let frame = frames::ip_frame(d.src, d.dst, proto, &l4);
                if op & 0x80 == 0 {
                    direct(&mut i, &mut ct, &frame, now, max);
                } else {
                    let chunk = if op & 0x40 != 0 {
                        8 * (1 + i.below(64))
                    } else {
                        usize::MAX
                    };
                    let mut pieces = fragment(&frame, chunk);
                    if pieces.len() > 1 && i.bool() {
                        let k = i.below(pieces.len());
                        pieces.swap(0, k);
                        if i.bool() {
                            pieces.push(pieces[0].clone());
                        }
                    }
                    for p in pieces {
                        let mut batch = [DpPacket::from_frame(&p, 1)];
                        let mut sink = RecordingSink::default();
                        dp.process_batch(&mut batch, &mut ct, now, &mut sink);
                        for (port, _, _) in &sink.outputs {
                            assert_eq!(*port, 2);
                        }
                    }
                }
            }
            6 => {
                let step = match i.u8() % 6 {
                    0 => MS,
                    1 => S,
                    2 => 30 * S,
                    3 => 121 * S,
                    4 => 3600 * S,
                    _ => u64::from(i.u16()) * MS,
                };
                now += step;
                match i.u8() % 3 {
                    0 => {}
                    1 => {
                        ct.expire(now);
                        assert!(
                            ct.entries().iter().all(|e| e.expiration_ns > now),
                            "expire left an expired connection"
                        );
                    }
                    _ => {
                        let n = i.below(8);
                        assert!(ct.expire_some(now, n) <= n.max(ct.len() + n));
                    }
                }
            }
            _ => match i.u8() % 3 {
                0 => {
                    let zone = if i.bool() {
                        Some(u16::from(i.u8() & 1))
                    } else {
                        None
                    };
                    let before = ct.len();
                    let flushed = ct.flush(zone);
                    assert_eq!(ct.len() + flushed, before);
                    if zone.is_none() {
                        assert!(ct.is_empty());
                    }
                }
                1 => roundtrip(&ct, &config, now),
                _ => {
                    // A frame of arbitrary bytes.
                    let frame = i.short_bytes().to_vec();
                    direct(&mut i, &mut ct, &frame, now, max);
                }
            },
        }
        check_table(&ct, max);
    }
    roundtrip(&ct, &config, now);
    // Nothing outlives the longest timeout (a day is more than any default).
    let end = now + 24 * 3600 * S;
    ct.expire(end);
    assert!(
        ct.is_empty(),
        "{} connections outlived every timeout",
        ct.len()
    );
}

/// A `nat` with a small IPv4 (or, rarely, IPv6) range, so that tuples
/// collide and the port search runs out.
fn nat(i: &mut Input<'_>) -> NatAction {
    let b = i.u8();
    let base = u32::from_be_bytes([10, 0, 0, b & 0x0f]);
    let n = u32::from(b >> 4 & 3);
    let (min, max): (IpAddr, IpAddr) = if b & 0x40 != 0 {
        (
            IpAddr::V6(Ipv6Addr::from(u128::from(base))),
            IpAddr::V6(Ipv6Addr::from(u128::from(base + n))),
        )
    } else {
        (
            IpAddr::V4(Ipv4Addr::from(base)),
            IpAddr::V4(Ipv4Addr::from(base + n)),
        )
    };
    let lo = u16::from(i.u8()) + 1;
    let hi = lo + u16::from(i.u8() & 3);
    NatAction {
        kind: match i.u8() % 3 {
            0 => None,
            1 => Some(NatKind::Src),
            _ => Some(NatKind::Dst),
        },
        range: (b & 0x80 == 0).then_some(NatRange {
            addr_min: min,
            addr_max: max,
            ports: (lo & 1 == 0).then_some((lo, hi)),
        }),
        persistent: lo & 2 != 0,
        hash: false,
        random: lo & 4 != 0,
    }
}

/// One packet through [`Conntrack::execute`], with the invariants.
fn direct(i: &mut Input<'_>, ct: &mut Conntrack, frame: &[u8], now: u64, max: usize) {
    let p = i.u8();
    let params = CtParams {
        zone: u16::from(p >> 2 & 1),
        commit: p & 1 != 0,
        force: p & 2 != 0 && p & 0x80 != 0,
        mark: (p & 8 != 0).then(|| (i.u32(), i.u32())),
        label: (p & 16 != 0).then(|| (u128::from(i.u32()) << 64 | 7, u128::MAX)),
        nat: (p & 32 != 0).then(|| nat(i)),
    };
    let key = extract(frame, 1);
    let before = ct.len();
    let live_before = live(ct, now);
    let v = ct.execute(frame, &key, &params, now);
    assert!(v.state & TRK != 0, "no +trk: {v:?}");
    if v.state & INV != 0 {
        assert_eq!(
            v.state & (NEW | EST | REL),
            0,
            "+inv with another state: {v:?}"
        );
        if !params.force {
            assert_eq!(live(ct, now), live_before, "+inv changed the connections");
        }
    }
    if !params.commit && !params.force {
        assert!(
            ct.len() <= before,
            "a packet without commit added a connection"
        );
    }
    if v.state & NEW != 0 && !params.commit && !params.force && live_before.is_empty() {
        // No connection it could belong to: nothing to carry.
        assert_eq!((v.mark, v.label), (0, 0), "+new without commit has a mark");
    }
    check_table(ct, max);
}

/// save_state then restore_state into a fresh tracker gives the same live
/// connections (on the same clock).
fn roundtrip(ct: &Conntrack, config: &CtConfig, now: u64) {
    let bytes = ct.save_state(now, 1_700_000_000 * S);
    let mut fresh = Conntrack::new(config.clone());
    fresh
        .restore_state(&bytes, now, 1_700_000_000 * S)
        .expect("a saved table restores");
    assert_eq!(
        live(&fresh, now),
        live(ct, now),
        "save/restore changed the table"
    );
}

/// Arbitrary bytes as a state file: either refused, with the table left
/// empty, or loaded within the limit.
fn restore_untrusted(bytes: &[u8]) {
    let config = CtConfig {
        max_entries: 8,
        ..CtConfig::default()
    };
    let mut ct = Conntrack::new(config);
    match ct.restore_state(bytes, 5 * S, 1_700_000_000 * S) {
        Ok(_) => {
            check_table(&ct, 8);
            ct.expire(u64::MAX);
            assert!(ct.is_empty());
        }
        Err(_) => assert!(ct.is_empty(), "a refused state file left connections"),
    }
}
