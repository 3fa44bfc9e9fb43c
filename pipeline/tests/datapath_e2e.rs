//! End to end on a `Vec` of frames: two ports, flows that forward between
//! them (ARP both ways; IPv4 routed with MAC rewrite and `dec_ttl` one way,
//! through a second table the other way; everything else dropped). Checks
//! the exact frames out, the rule and datapath counters, and that a flow
//! change takes effect for the very next batch.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use oxvs_pipeline::conntrack::Conntrack;
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::Field;
use oxvs_pipeline::flow::{Action, Flow, FlowMod, FlowModCommand, Match};
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::packet::{checksum, ones_sum};
use oxvs_pipeline::tables::{Pipeline, Rule};
use oxvs_pipeline::xlate::XlateEnv;

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const MAC_GW: [u8; 6] = [0x02, 0, 0, 0, 0, 0xff];
const IP_A: u32 = 0x0a00_0001;
const IP_B: u32 = 0x0a00_0002;

fn mac_u64(m: [u8; 6]) -> u64 {
    m.iter().fold(0, |acc, b| acc << 8 | *b as u64)
}

fn arp(op: u16, sha: [u8; 6], spa: u32, tha: [u8; 6], tpa: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(if op == 1 { &[0xff; 6] } else { &tha });
    f.extend_from_slice(&sha);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&sha);
    f.extend_from_slice(&spa.to_be_bytes());
    f.extend_from_slice(&tha);
    f.extend_from_slice(&tpa.to_be_bytes());
    f
}

fn udp(src_mac: [u8; 6], dst_mac: [u8; 6], src: u32, dst: u32, sport: u16, ttl: u8) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend_from_slice(&sport.to_be_bytes());
    l4.extend_from_slice(&5000u16.to_be_bytes());
    l4.extend_from_slice(&[0, 13, 0, 0]);
    l4.extend_from_slice(b"hello");
    let mut ip = vec![
        0x45,
        0,
        0,
        (20 + l4.len()) as u8,
        0,
        7,
        0x40,
        0,
        ttl,
        17,
        0,
        0,
    ];
    ip.extend_from_slice(&src.to_be_bytes());
    ip.extend_from_slice(&dst.to_be_bytes());
    let c = checksum(&ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let c = checksum(&l4, ones_sum(&ip[12..20], 17 + l4.len() as u64));
    l4[6..8].copy_from_slice(&c.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&l4);
    f
}

fn flow(table: u8, priority: u16, m: &[(Field, u128)], actions: Vec<Action>) -> Flow {
    let mut matches = Match::CATCHALL;
    for (f, v) in m {
        matches.set_exact(*f, *v);
    }
    Flow {
        table,
        priority,
        matches,
        actions,
        ..Flow::default()
    }
}

fn add(flow: Flow) -> FlowMod {
    FlowMod::add(flow)
}

fn routed_flow() -> Flow {
    flow(
        0,
        100,
        &[
            (Field::InPort, 1),
            (Field::DlType, 0x0800),
            (Field::NwDst, IP_B as u128),
        ],
        vec![
            Action::ModDlSrc(mac_u64(MAC_GW)),
            Action::ModDlDst(mac_u64(MAC_B)),
            Action::DecTtl,
            Action::Output(2),
        ],
    )
}

fn flows() -> Vec<Flow> {
    vec![
        flow(
            0,
            100,
            &[(Field::InPort, 1), (Field::DlType, 0x0806)],
            vec![Action::Output(2)],
        ),
        flow(
            0,
            100,
            &[(Field::InPort, 2), (Field::DlType, 0x0806)],
            vec![Action::Output(1)],
        ),
        routed_flow(),
        flow(
            0,
            100,
            &[
                (Field::InPort, 2),
                (Field::DlType, 0x0800),
                (Field::NwDst, IP_A as u128),
            ],
            vec![Action::GotoTable(1)],
        ),
        flow(1, 10, &[(Field::DlType, 0x0800)], vec![Action::Output(1)]),
        flow(0, 0, &[], vec![]),
    ]
}

fn rule_for(pipeline: &Pipeline, table: u8, frame: &[u8], port: u32) -> Arc<Rule> {
    let key = extract(frame, port);
    let mut wc = FlowKey::ZERO;
    Arc::clone(
        pipeline
            .snapshot()
            .lookup(table, &key, &mut wc)
            .expect("a rule matches"),
    )
}

#[test]
fn forwards_between_two_ports() {
    let pipeline = Arc::new(Pipeline::new());
    let mods: Vec<FlowMod> = flows().into_iter().map(add).collect();
    pipeline.apply(&mods, 1).expect("Pipeline::apply");
    let mut dp = Datapath::new(
        Arc::clone(&pipeline),
        XlateEnv::with_ports(vec![1, 2]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::default();

    let arp_req = arp(1, MAC_A, IP_A, [0; 6], IP_B);
    let arp_rep = arp(2, MAC_B, IP_B, MAC_A, IP_A);
    let to_b: Vec<Vec<u8>> = (0..3)
        .map(|i| udp(MAC_A, MAC_GW, IP_A, IP_B, 1000 + i, 64))
        .collect();
    let to_a = udp(MAC_B, MAC_A, IP_B, IP_A, 7, 64);
    let stray = udp(MAC_A, MAC_GW, IP_A, 0x0a00_0009, 7, 64);

    let mut input: Vec<(Vec<u8>, u32)> = vec![(arp_req.clone(), 1), (arp_rep.clone(), 2)];
    input.extend(to_b.iter().map(|f| (f.clone(), 1)));
    input.push((to_a.clone(), 2));
    input.push((stray.clone(), 1));
    let mut batch: Vec<DpPacket<Vec<u8>>> = input
        .iter()
        .map(|(f, p)| DpPacket::from_frame(f, *p))
        .collect();
    let mut sink = RecordingSink::default();
    dp.process_batch(&mut batch, &mut ct, 2_000, &mut sink);

    // What the routed frames must look like: new MACs, TTL 63, checksums right.
    let expect_routed = |f: &Vec<u8>| {
        let mut g = udp(
            MAC_GW,
            MAC_B,
            IP_A,
            IP_B,
            u16::from_be_bytes([f[34], f[35]]),
            63,
        );
        g[0..6].copy_from_slice(&MAC_B);
        g
    };
    let mut want: Vec<(u32, Vec<u8>)> = vec![(2, arp_req.clone()), (1, arp_rep.clone())];
    want.extend(to_b.iter().map(|f| (2, expect_routed(f))));
    want.push((1, to_a.clone()));
    let got: Vec<(u32, Vec<u8>)> = sink
        .outputs
        .iter()
        .map(|(p, f, t)| {
            assert_eq!(*t, None, "no tunnel metadata expected");
            (*p, f.clone())
        })
        .collect();
    assert_eq!(got, want);
    assert!(sink.packet_ins.is_empty());

    // Datapath counters.
    let s = dp.stats();
    assert_eq!(s.packets, 7);
    assert_eq!(s.outputs, 6);
    assert_eq!(s.drops, 1);
    assert_eq!(s.write_errors, 0);
    assert_eq!(s.emc_hits + s.megaflow_hits + s.upcalls, 7);
    assert!(s.upcalls <= 7 && s.upcalls >= 5, "{s:?}");

    // Rule counters (credited at the end of the batch).
    let routed = rule_for(&pipeline, 0, &to_b[0], 1);
    assert_eq!(routed.stats.n_packets.load(Ordering::Relaxed), 3);
    let bytes: u64 = to_b.iter().map(|f| f.len() as u64).sum();
    assert_eq!(routed.stats.n_bytes.load(Ordering::Relaxed), bytes);
    assert_eq!(routed.stats.last_used_ns.load(Ordering::Relaxed), 2_000);
    let t1 = rule_for(&pipeline, 1, &to_a, 2);
    assert_eq!(t1.stats.n_packets.load(Ordering::Relaxed), 1);
    let arp_rule = rule_for(&pipeline, 0, &arp_req, 1);
    assert_eq!(arp_rule.stats.n_packets.load(Ordering::Relaxed), 1);

    // Same traffic again: all answered by the caches.
    let upcalls = s.upcalls;
    let mut batch: Vec<DpPacket<Vec<u8>>> = input
        .iter()
        .map(|(f, p)| DpPacket::from_frame(f, *p))
        .collect();
    let mut sink2 = RecordingSink::default();
    dp.process_batch(&mut batch, &mut ct, 3_000, &mut sink2);
    assert_eq!(sink2.outputs, sink.outputs);
    assert_eq!(dp.stats().upcalls, upcalls);
    assert_eq!(routed.stats.n_packets.load(Ordering::Relaxed), 6);

    // Delete the routed flow: the very next batch drops that traffic.
    let del = FlowMod {
        command: FlowModCommand::Delete { strict: true },
        table: Some(0),
        flow: routed_flow(),
        cookie_mask: 0,
        out_port: None,
    };
    pipeline.apply(&[del], 4_000).expect("delete");
    let mut batch = vec![DpPacket::from_frame(&to_b[0], 1)];
    let mut sink3 = RecordingSink::default();
    dp.process_batch(&mut batch, &mut ct, 5_000, &mut sink3);
    assert!(
        sink3.outputs.is_empty(),
        "a deleted flow still forwarded: {:?}",
        sink3.outputs
    );
    assert_eq!(dp.stats().cache_flushes, 1);
}

/// A `push_vlan` that does not fit (no headroom in front of the frame) must
/// not send the frame on untagged (it would land in the native VLAN): the
/// packet is dropped and counted.
#[test]
fn push_vlan_without_headroom_drops_the_packet() {
    use oxvs_pipeline::packet::PacketRef;
    use oxvs_pipeline::parse::{parse_flow_file, ParseContext};

    let flows = parse_flow_file(
        "in_port=1,arp actions=push_vlan:0x8100,set_field:5->vlan_vid,output:2\n",
        &ParseContext::default(),
    )
    .expect("flows");
    let pipeline = Arc::new(Pipeline::new());
    let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
    pipeline.apply(&mods, 0).expect("install");
    let mut dp = Datapath::new(
        Arc::clone(&pipeline),
        XlateEnv::with_ports(vec![1, 2]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::default();

    // With headroom: tagged and sent.
    let frame = arp(1, MAC_A, IP_A, [0; 6], IP_B);
    let mut sink = RecordingSink::default();
    dp.process_batch(
        &mut [DpPacket::from_frame(&frame, 1)],
        &mut ct,
        1,
        &mut sink,
    );
    assert_eq!(sink.outputs.len(), 1);
    assert_eq!(&sink.outputs[0].1[12..16], &[0x81, 0x00, 0x00, 0x05]);

    // Without headroom: dropped, not sent untagged.
    let mut buf = frame.clone();
    let len = buf.len();
    let pkt = PacketRef::new(&mut buf, 0, len).expect("fits");
    let mut sink = RecordingSink::default();
    let drops = dp.stats().drops;
    dp.process_batch(
        &mut [DpPacket {
            packet: pkt,
            in_port: 1,
            tunnel: None,
        }],
        &mut ct,
        2,
        &mut sink,
    );
    assert!(sink.outputs.is_empty(), "sent untagged: {:?}", sink.outputs);
    assert_eq!(dp.stats().drops, drops + 1);
}
