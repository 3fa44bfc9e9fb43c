//! NAT through the whole datapath: flows with `ct(commit,nat(...))` as a
//! Service proxy writes them, real frames in, the frames out checked byte
//! by byte (addresses, ports, IP and L4 checksums), both directions, a
//! second `ct` in the same zone, port ranges, SNAT port allocation and its
//! exhaustion, the dump, and a save/restore of the table.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use oxvs_pipeline::conntrack::{Conntrack, CtConfig, CtFilter, CtL4};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;

const CLIENT: [u8; 4] = [10, 244, 0, 3];
const EP1: [u8; 4] = [10, 244, 0, 4];
const EP2: [u8; 4] = [10, 244, 0, 5];
const VIP: [u8; 4] = [10, 96, 0, 10];
/// A second ClusterIP of endpoint 1.
const VIP2: [u8; 4] = [10, 96, 0, 11];
const SNAT_IP: [u8; 4] = [192, 168, 9, 1];
const OUTSIDE: [u8; 4] = [172, 16, 0, 7];

/// Ports: 1 the client, 2 endpoint 1, 3 endpoint 2, 4 the outside.
/// Zone 5 is the Service zone (ClusterIPs 10.96.0.10 and 10.96.0.11: TCP 80
/// -> EP1:8080; 10.96.0.10: UDP 53 -> EP1 or EP2 :5353), zone 9 SNATs
/// traffic to the outside.
const FLOWS: &str = "
table=0,priority=100,ip,in_port=4,actions=ct(table=40,zone=9,nat)
table=0,priority=100,ip,nw_dst=172.16.0.0/16,actions=ct(commit,table=40,zone=9,nat(src=192.168.9.1:1000-1001))
table=0,priority=90,ip,actions=ct(table=10,zone=5,nat)
table=10,priority=200,ct_state=+inv+trk,ip,actions=drop
table=10,priority=100,ct_state=+new+trk,tcp,nw_dst=10.96.0.10,tp_dst=80,actions=ct(commit,table=20,zone=5,nat(dst=10.244.0.4:8080),exec(set_field:0x1/0x1->ct_mark))
table=10,priority=100,ct_state=+new+trk,tcp,nw_dst=10.96.0.11,tp_dst=80,actions=ct(commit,table=20,zone=5,nat(dst=10.244.0.4:8080))
table=10,priority=100,ct_state=+new+trk,udp,nw_dst=10.96.0.10,tp_dst=53,actions=ct(commit,table=20,zone=5,nat(dst=10.244.0.4-10.244.0.5:5353))
table=10,priority=50,ct_state=+trk,ip,actions=goto_table:20
table=20,priority=100,ct_state=+new+trk,ip,actions=ct(commit,table=40,zone=5,exec(set_field:0x2/0x2->ct_mark))
table=20,priority=50,ip,actions=goto_table:40
table=40,priority=100,ip,nw_dst=10.244.0.3,actions=output:1
table=40,priority=100,ip,nw_dst=10.244.0.4,actions=output:2
table=40,priority=100,ip,nw_dst=10.244.0.5,actions=output:3
table=40,priority=100,ip,nw_dst=172.16.0.0/16,actions=output:4
";

struct Node {
    dp: Datapath,
    ct: Conntrack,
    now: u64,
}

impl Node {
    fn new() -> Node {
        let flows = parse_flow_file(FLOWS, &ParseContext::default()).expect("flows parse");
        let pipeline = Arc::new(Pipeline::new());
        let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
        pipeline.apply(&mods, 1).expect("flows load");
        Node {
            dp: Datapath::new(
                pipeline,
                XlateEnv::with_ports(vec![1, 2, 3, 4]),
                DatapathConfig::default(),
            ),
            ct: Conntrack::new(CtConfig::default()),
            now: 1_000_000_000,
        }
    }

    /// Sends one frame in on `port`: the (port, frame) copies that came out.
    fn send(&mut self, frame: &[u8], port: u32) -> Vec<(u32, Vec<u8>)> {
        self.now += 1_000_000;
        let mut batch = vec![DpPacket::from_frame(frame, port)];
        let mut sink = RecordingSink::default();
        self.dp
            .process_batch(&mut batch, &mut self.ct, self.now, &mut sink);
        sink.outputs.into_iter().map(|(p, f, _)| (p, f)).collect()
    }

    /// Like `send`, expecting exactly one copy out: its port and header.
    fn one(&mut self, frame: &[u8], port: u32) -> (u32, Hdr) {
        let out = self.send(frame, port);
        assert_eq!(out.len(), 1, "one copy out, got {out:?}");
        let (p, f) = &out[0];
        (*p, Hdr::parse(f))
    }
}

fn sum16(data: &[u8], mut acc: u32) -> u16 {
    for c in data.chunks(2) {
        acc += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

fn pseudo(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u32 {
    let mut acc = 0u32;
    for w in [src, dst] {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
        acc += u32::from(u16::from_be_bytes([w[2], w[3]]));
    }
    acc + u32::from(proto) + len as u32
}

/// An IPv4 frame with correct IP and L4 checksums.
fn frame(src: [u8; 4], dst: [u8; 4], proto: u8, mut l4: Vec<u8>) -> Vec<u8> {
    let csum_at = if proto == 6 { 16 } else { 6 };
    l4[csum_at..csum_at + 2].fill(0);
    let c = sum16(&l4, pseudo(src, dst, proto, l4.len()));
    l4[csum_at..csum_at + 2].copy_from_slice(&c.to_be_bytes());
    let tot = (20 + l4.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&tot.to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = sum16(&ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x08, 0x00];
    f.extend_from_slice(&ip);
    f.extend_from_slice(&l4);
    f
}

fn tcp(src: ([u8; 4], u16), dst: ([u8; 4], u16), flags: u8, seq: u32, ack: u32) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&src.1.to_be_bytes());
    t.extend_from_slice(&dst.1.to_be_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&ack.to_be_bytes());
    t.extend_from_slice(&[0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    t.extend_from_slice(b"data");
    frame(src.0, dst.0, 6, t)
}

fn udp(src: ([u8; 4], u16), dst: ([u8; 4], u16)) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&src.1.to_be_bytes());
    u.extend_from_slice(&dst.1.to_be_bytes());
    u.extend_from_slice(&13u16.to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(b"query");
    frame(src.0, dst.0, 17, u)
}

/// What the tests check of a frame out: its endpoints, and that both of
/// its checksums are right.
#[derive(Debug, PartialEq, Eq)]
struct Hdr {
    src: ([u8; 4], u16),
    dst: ([u8; 4], u16),
}

impl Hdr {
    fn parse(f: &[u8]) -> Hdr {
        let ip = &f[14..34];
        assert_eq!(sum16(ip, 0), 0, "IP header checksum of {f:02x?}");
        let proto = ip[9];
        let l4 = &f[34..];
        let src: [u8; 4] = ip[12..16].try_into().unwrap();
        let dst: [u8; 4] = ip[16..20].try_into().unwrap();
        assert_eq!(
            sum16(l4, pseudo(src, dst, proto, l4.len())),
            0,
            "L4 checksum of {f:02x?}"
        );
        let port = |o: usize| u16::from_be_bytes([l4[o], l4[o + 1]]);
        Hdr {
            src: (src, port(0)),
            dst: (dst, port(2)),
        }
    }
}

const SYN: u8 = 0x02;
const SYN_ACK: u8 = 0x12;
const ACK: u8 = 0x10;

#[test]
fn clusterip_tcp_is_dnated_both_ways() {
    let mut n = Node::new();
    let client = (CLIENT, 40000);
    // SYN to the VIP: out to endpoint 1, port 8080.
    let (p, h) = n.one(&tcp(client, (VIP, 80), SYN, 100, 0), 1);
    assert_eq!(p, 2);
    assert_eq!(
        h,
        Hdr {
            src: client,
            dst: (EP1, 8080)
        }
    );
    // One connection, both commits' marks on it (the second `ct(commit)`
    // in the zone found it without a second entry), reply tuple NATed.
    let e = n.ct.entries();
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].mark, 0x3);
    assert_eq!(e[0].orig.dst, IpAddr::V4(Ipv4Addr::from(VIP)));
    assert_eq!(e[0].reply.src, IpAddr::V4(Ipv4Addr::from(EP1)));
    assert_eq!(
        e[0].reply.l4,
        CtL4::Ports {
            src: 8080,
            dst: 40000
        }
    );
    assert_eq!(
        e[0].to_string(),
        "tcp,orig=(src=10.244.0.3,dst=10.96.0.10,sport=40000,dport=80),\
         reply=(src=10.244.0.4,dst=10.244.0.3,sport=8080,dport=40000),zone=5,mark=3,\
         protoinfo=(state=SYN_SENT)"
    );
    // SYN-ACK from the endpoint: back to the client from the VIP.
    let (p, h) = n.one(&tcp((EP1, 8080), client, SYN_ACK, 500, 101), 2);
    assert_eq!(p, 1);
    assert_eq!(
        h,
        Hdr {
            src: (VIP, 80),
            dst: client
        }
    );
    // The client's ACK and data: to the endpoint again, established.
    for (seq, flags) in [(101, ACK), (101, ACK | 0x08)] {
        let (p, h) = n.one(&tcp(client, (VIP, 80), flags, seq, 501), 1);
        assert_eq!(
            (p, h),
            (
                2,
                Hdr {
                    src: client,
                    dst: (EP1, 8080)
                }
            )
        );
    }
    assert_eq!(
        n.ct.entries()[0].tcp_state.map(|s| s.name()),
        Some("ESTABLISHED")
    );
    // Talking to the endpoint directly from the same port is another
    // tuple that collides with the translated one: `+inv`, dropped.
    assert!(n.send(&tcp(client, (EP1, 8080), SYN, 7, 0), 1).is_empty());
    // A second client port is a second connection.
    let (p, h) = n.one(&tcp((CLIENT, 40001), (VIP, 80), SYN, 1, 0), 1);
    assert_eq!(
        (p, h),
        (
            2,
            Hdr {
                src: (CLIENT, 40001),
                dst: (EP1, 8080)
            }
        )
    );
    assert_eq!(n.ct.len(), 2);
}

#[test]
fn udp_spreads_over_the_range_and_keeps_each_flow() {
    let mut n = Node::new();
    let mut seen = std::collections::HashMap::new();
    for sport in 2000..2064u16 {
        let (p, h) = n.one(&udp((CLIENT, sport), (VIP, 53)), 1);
        assert!(p == 2 || p == 3, "{p}");
        let ep = if p == 2 { EP1 } else { EP2 };
        assert_eq!(
            h,
            Hdr {
                src: (CLIENT, sport),
                dst: (ep, 5353)
            }
        );
        seen.insert(sport, (p, ep));
    }
    let to_ep1 = seen.values().filter(|(p, _)| *p == 2).count();
    assert!(
        (10..=54).contains(&to_ep1),
        "both endpoints chosen: {to_ep1}/64 on EP1"
    );
    for (sport, (p, ep)) in &seen {
        // The flow sticks to its endpoint...
        let (p2, _) = n.one(&udp((CLIENT, *sport), (VIP, 53)), 1);
        assert_eq!(p2, *p);
        // ...and its answer comes from the VIP.
        let (p3, h) = n.one(&udp((*ep, 5353), (CLIENT, *sport)), *p);
        assert_eq!(
            (p3, h),
            (
                1,
                Hdr {
                    src: (VIP, 53),
                    dst: (CLIENT, *sport)
                }
            )
        );
    }
    assert_eq!(n.ct.len(), 64);
    // An endpoint goes: its connections are flushed by their reply source,
    // the other endpoint's stay.
    let filter = CtFilter {
        zone: Some(5),
        proto: Some(17),
        reply_src: Some(IpAddr::V4(Ipv4Addr::from(EP2))),
        reply_sport: Some(5353),
    };
    let on_ep2 = seen.values().filter(|(p, _)| *p == 3).count();
    let (flushed, next) = n.ct.flush_slice_filtered(&filter, 0, usize::MAX);
    assert_eq!((flushed, next), (on_ep2, None));
    assert_eq!(n.ct.len(), 64 - on_ep2);
    let wrong_port = CtFilter {
        reply_src: Some(IpAddr::V4(Ipv4Addr::from(EP1))),
        reply_sport: Some(53),
        ..filter
    };
    assert_eq!(n.ct.flush_slice_filtered(&wrong_port, 0, usize::MAX).0, 0);
}

#[test]
fn snat_allocates_ports_and_refuses_when_none_is_free() {
    let mut n = Node::new();
    let out = (OUTSIDE, 9000);
    let mut given = Vec::new();
    for sport in [5000u16, 5001] {
        let (p, h) = n.one(&udp((CLIENT, sport), out), 1);
        assert_eq!(p, 4);
        assert_eq!(h.src.0, SNAT_IP);
        assert_eq!(h.dst, out);
        given.push((sport, h.src.1));
    }
    let mut ports: Vec<u16> = given.iter().map(|g| g.1).collect();
    ports.sort();
    assert_eq!(ports, [1000, 1001], "each connection its own port");
    // The range is used up: a third connection cannot be translated.
    assert!(n.send(&udp((CLIENT, 5002), out), 1).is_empty());
    assert_eq!(n.ct.stats().nat_exhausted_total, 1);
    // Replies to each translated port reach their own client port.
    for (sport, nat_port) in given {
        let (p, h) = n.one(&udp(out, (SNAT_IP, nat_port)), 4);
        assert_eq!(
            (p, h),
            (
                1,
                Hdr {
                    src: out,
                    dst: (CLIENT, sport)
                }
            )
        );
    }
    // Something to the SNAT address nobody asked for matches nothing.
    assert!(n.send(&udp(out, (SNAT_IP, 1234)), 4).is_empty());
}

#[test]
fn translations_survive_a_save_and_restore() {
    let mut n = Node::new();
    let client = (CLIENT, 41000);
    n.one(&tcp(client, (VIP, 80), SYN, 100, 0), 1);
    n.one(&tcp((EP1, 8080), client, SYN_ACK, 500, 101), 2);
    n.one(&udp((CLIENT, 5000), (OUTSIDE, 9000)), 1);
    let saved = n.ct.save_state(n.now, 1_000);
    let before = n.ct.entries();

    let mut m = Node::new();
    m.now = 5_000_000_000;
    let r = m.ct.restore_state(&saved, m.now, 2_000).expect("restores");
    assert_eq!(r.restored, 2);
    let mut after = m.ct.entries();
    for (a, b) in after.iter_mut().zip(&before) {
        a.expiration_ns = b.expiration_ns;
    }
    assert_eq!(after, before, "the same tuples, NAT included");
    // The restored switch goes on translating both ways.
    let (p, h) = m.one(&tcp(client, (VIP, 80), ACK, 101, 501), 1);
    assert_eq!(
        (p, h),
        (
            2,
            Hdr {
                src: client,
                dst: (EP1, 8080)
            }
        )
    );
    let (p, h) = m.one(&tcp((EP1, 8080), client, ACK, 501, 105), 2);
    assert_eq!(
        (p, h),
        (
            1,
            Hdr {
                src: (VIP, 80),
                dst: client
            }
        )
    );
    let snat_port = match before.iter().find(|e| e.proto == 17).map(|e| e.reply.l4) {
        Some(CtL4::Ports { dst, .. }) => dst,
        other => panic!("{other:?}"),
    };
    let (p, h) = m.one(&udp((OUTSIDE, 9000), (SNAT_IP, snat_port)), 4);
    assert_eq!(
        (p, h),
        (
            1,
            Hdr {
                src: (OUTSIDE, 9000),
                dst: (CLIENT, 5000)
            }
        )
    );
    // A damaged NAT record is refused, naming it.
    let mut bad = saved.clone();
    let rec = 32;
    bad[rec + 104] = 7;
    let len = bad.len();
    let sum = fnv1a(&bad[..len - 8]);
    bad[len - 8..].copy_from_slice(&sum.to_le_bytes());
    let err = Conntrack::new(CtConfig::default())
        .restore_state(&bad, 0, 2_000)
        .unwrap_err();
    assert!(err.to_string().contains("NAT byte 7"), "{err}");
}

fn fnv1a(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in b {
        h ^= u64::from(*x);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Opens `client` -> `frontend` (port 1) to endpoint 1 (port 2) and closes
/// it, the endpoint first (so its stack holds the 4-tuple in TIME_WAIT):
/// the client port the endpoint saw.
fn open_and_close(n: &mut Node, client: ([u8; 4], u16), frontend: ([u8; 4], u16)) -> u16 {
    let (p, h) = n.one(&tcp(client, frontend, SYN, 100, 0), 1);
    assert_eq!((p, h.dst), (2, (EP1, 8080)));
    let seen = h.src;
    assert_eq!(seen.0, client.0);
    let (p, h) = n.one(&tcp((EP1, 8080), seen, SYN_ACK, 500, 101), 2);
    assert_eq!((p, h.src, h.dst), (1, frontend, client));
    n.one(&tcp(client, frontend, ACK, 101, 501), 1);
    const FIN_ACK: u8 = 0x11;
    n.one(&tcp((EP1, 8080), seen, FIN_ACK, 501, 105), 2);
    n.one(&tcp(client, frontend, FIN_ACK, 105, 502), 1);
    n.one(&tcp((EP1, 8080), seen, ACK, 502, 106), 2);
    seen.1
}

#[test]
fn a_closed_connection_keeps_its_tuple_from_a_translated_one() {
    let mut n = Node::new();
    let client = (CLIENT, 42000);
    // The client talks to the endpoint directly, and closes.
    assert_eq!(open_and_close(&mut n, client, (EP1, 8080)), 42000);
    // Its kernel may reuse the port for the ClusterIP at once. The
    // endpoint still holds the 4-tuple (TIME_WAIT) and would answer a SYN
    // on it with an ACK of the old connection: the translated connection
    // gets another client port instead (as OVS and Linux's implicit source
    // NAT do), both ways right, and the closed connection stays.
    let (p, h) = n.one(&tcp(client, (VIP, 80), SYN, 7000, 0), 1);
    assert_eq!((p, h.dst, h.src.0), (2, (EP1, 8080), CLIENT));
    let moved = h.src;
    assert_ne!(moved.1, 42000, "the endpoint's held 4-tuple was reused");
    let (p, h) = n.one(&tcp((EP1, 8080), moved, SYN_ACK, 9000, 7001), 2);
    assert_eq!(
        (p, h),
        (
            1,
            Hdr {
                src: (VIP, 80),
                dst: client
            }
        )
    );
    assert_eq!(n.ct.entries().len(), 2);
    // The other way round: a translated connection that is over gives its
    // tuple to the endpoint directly (no NAT there to move it).
    let client = (CLIENT, 42002);
    assert_eq!(open_and_close(&mut n, client, (VIP, 80)), 42002);
    let (p, h) = n.one(&tcp(client, (EP1, 8080), SYN, 1, 0), 1);
    assert_eq!(
        (p, h),
        (
            2,
            Hdr {
                src: client,
                dst: (EP1, 8080)
            }
        )
    );
    // An open translated connection keeps its tuple: a direct SYN that
    // would collide with it is dropped.
    let other = (CLIENT, 42001);
    n.one(&tcp(other, (VIP, 80), SYN, 100, 0), 1);
    assert!(n.send(&tcp(other, (EP1, 8080), SYN, 5, 0), 1).is_empty());
}

#[test]
fn a_client_port_reused_for_another_frontend_of_the_endpoint_moves() {
    // The lab's flaky Service test: a pod connects to two ClusterIPs of
    // one endpoint from the same port (its stack allows it: the 4-tuples
    // differ). The second connection's tuple at the endpoint is the first
    // one's, which the endpoint holds in TIME_WAIT.
    let mut n = Node::new();
    let client = (CLIENT, 43000);
    assert_eq!(open_and_close(&mut n, client, (VIP, 80)), 43000);
    let seen = open_and_close(&mut n, client, (VIP2, 80));
    assert_ne!(seen, 43000, "the endpoint's held 4-tuple was reused");
    // The first frontend again from that port: its own closed connection
    // starts over (a new SYN on its tuple), and the port stays.
    let (p, h) = n.one(&tcp(client, (VIP, 80), SYN, 9000, 0), 1);
    assert_eq!((p, h.src, h.dst), (2, client, (EP1, 8080)));
    // Without NAT conflicts nothing moves: a fresh port stays.
    let fresh = (CLIENT, 43002);
    let (_, h) = n.one(&tcp(fresh, (VIP2, 80), SYN, 1, 0), 1);
    assert_eq!(h.src, fresh);
}
