//! IPv6 Neighbour Discovery end to end, byte by byte: the pod network's ND
//! responder (a solicitation for the gateway's address answered in place)
//! and the advertisement guard, through the datapath, with the ICMPv6
//! checksum of every output recomputed here independently. The datapath
//! actions are the ones OVS 3.1 gives for the same flows
//! (ctl/tests/ovs_cases/nd.*).

use std::sync::Arc;

use oxvs_pipeline::conntrack::Conntrack;
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::Field;
use oxvs_pipeline::flow::{FlowMod, FlowModCommand};
use oxvs_pipeline::odp::format_dp_actions_for_key;
use oxvs_pipeline::parse::{parse_flow_mod, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::{translate, XlateEnv};

const POD_MAC: [u8; 6] = [0x0a, 0, 0, 0, 0, 5];
const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const POD_IP: u128 = 0xfd00_0010_0244_0001_0000_0000_0000_0005;
const GW_IP: u128 = 0xfd00_0010_0244_0001_0000_0000_0000_0001;
/// ff02::1:ff00:1, the gateway address's solicited-node group.
const SNM: u128 = 0xff02_0000_0000_0000_0000_0001_ff00_0001;
const SNM_MAC: [u8; 6] = [0x33, 0x33, 0xff, 0, 0, 1];

/// The responder as OVS 3.1 accepts it: `set_field->nd_tll` needs an
/// advertisement in the match, so the second half runs in table 1, on the
/// packet the first half made an advertisement.
const RESPONDER: &[&str] = &[
    "table=0,priority=300,icmp6,icmp_type=135,icmp_code=0,nd_target=fd00:10:244:1::1,actions=move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:02:00:00:00:00:01->eth_src,move:NXM_NX_IPV6_SRC[]->NXM_NX_IPV6_DST[],set_field:fd00:10:244:1::1->ipv6_src,set_field:136->icmpv6_type,set_field:0x60000000->nd_reserved,set_field:2->nd_options_type,goto_table:1",
    "table=1,priority=200,icmp6,icmp_type=136,icmp_code=0,nd_target=fd00:10:244:1::1,actions=set_field:02:00:00:00:00:01->nd_tll,IN_PORT",
    "table=0,priority=200,in_port=1,icmp6,icmp_type=136,nd_target=fd00:10:244:1::5,nd_tll=0a:00:00:00:00:05,actions=output:2",
    "table=0,priority=190,in_port=1,icmp6,icmp_type=136,actions=drop",
];

fn pipeline(flows: &[&str]) -> Arc<Pipeline> {
    let ctx = ParseContext::default();
    let mods: Vec<FlowMod> = flows
        .iter()
        .map(|t| {
            parse_flow_mod(t, FlowModCommand::Add, &ctx).unwrap_or_else(|e| panic!("{t}: {e}"))
        })
        .collect();
    let p = Arc::new(Pipeline::new());
    p.apply(&mods, 0).expect("apply");
    p
}

fn env() -> XlateEnv {
    XlateEnv::with_ports(vec![1, 2, 3])
}

/// The ICMPv6 checksum of `msg` between `src` and `dst` (RFC 4443 2.3,
/// RFC 8200 8.1), computed from scratch with the checksum field as zero.
fn icmpv6_checksum(src: u128, dst: u128, msg: &[u8]) -> u16 {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&src.to_be_bytes());
    bytes.extend_from_slice(&dst.to_be_bytes());
    bytes.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    bytes.extend_from_slice(&[0, 0, 0, 58]);
    let mut m = msg.to_vec();
    m[2] = 0;
    m[3] = 0;
    bytes.extend_from_slice(&m);
    if bytes.len() % 2 == 1 {
        bytes.push(0);
    }
    let mut sum: u32 = 0;
    for w in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet/IPv6/ICMPv6 frame carrying `msg` (hop limit 255), with a
/// correct ICMPv6 checksum.
fn frame(eth_src: [u8; 6], eth_dst: [u8; 6], src: u128, dst: u128, msg: &[u8]) -> Vec<u8> {
    let mut msg = msg.to_vec();
    let c = icmpv6_checksum(src, dst, &msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&eth_dst);
    f.extend_from_slice(&eth_src);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    f.extend_from_slice(&[58, 255]);
    f.extend_from_slice(&src.to_be_bytes());
    f.extend_from_slice(&dst.to_be_bytes());
    f.extend_from_slice(&msg);
    f
}

/// An ND message: type, flags word, target, then one link-layer option.
fn nd_msg(ty: u8, flags: u32, target: u128, opt: u8, mac: [u8; 6]) -> Vec<u8> {
    let mut m = vec![ty, 0, 0, 0];
    m.extend_from_slice(&flags.to_be_bytes());
    m.extend_from_slice(&target.to_be_bytes());
    m.extend_from_slice(&[opt, 1]);
    m.extend_from_slice(&mac);
    m
}

/// Runs one frame in on port 1; returns the (port, frame) outputs.
fn run(flows: &[&str], f: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut dp = Datapath::new(pipeline(flows), env(), DatapathConfig::default());
    let mut sink = RecordingSink::default();
    let mut batch = vec![DpPacket::from_frame(f, 1)];
    dp.process_batch(&mut batch, &mut Conntrack::default(), 1, &mut sink);
    sink.outputs
        .iter()
        .map(|(p, b, _)| (*p, b.clone()))
        .collect()
}

fn ns_for_gateway() -> Vec<u8> {
    let ns = nd_msg(135, 0, GW_IP, 1, POD_MAC);
    frame(POD_MAC, SNM_MAC, POD_IP, SNM, &ns)
}

#[test]
fn solicitation_for_the_gateway_is_answered_in_place() {
    let out = run(RESPONDER, &ns_for_gateway());
    assert_eq!(out.len(), 1, "{out:?}");
    let (port, na) = &out[0];
    assert_eq!(*port, 1, "back out of the pod's port");

    // The advertisement OVS's userspace datapath writes, byte by byte.
    let want_msg = nd_msg(136, 0x6000_0000, GW_IP, 2, GW_MAC);
    let want = frame(GW_MAC, POD_MAC, GW_IP, POD_IP, &want_msg);
    assert_eq!(na, &want);

    // Independently: a valid NA (RFC 4861 4.4) with a correct checksum.
    let msg = &na[54..];
    assert_eq!(na[21], 255, "hop limit kept");
    assert_eq!((msg[0], msg[1]), (136, 0));
    assert_eq!(&msg[4..8], &[0x60, 0, 0, 0], "Solicited + Override");
    assert_eq!(&msg[8..24], &GW_IP.to_be_bytes(), "target kept");
    assert_eq!(&msg[24..26], &[2, 1], "target link-layer option");
    assert_eq!(&msg[26..32], &GW_MAC);
    let got = u16::from_be_bytes([msg[2], msg[3]]);
    assert_eq!(got, icmpv6_checksum(GW_IP, POD_IP, msg));
    // And the extractor reads it back as the advertisement it is.
    let k = extract(na, 1);
    assert_eq!(k.get(Field::TpSrc), 136);
    assert_eq!(k.get(Field::NdTarget), GW_IP);
    assert_eq!(k.get(Field::NdTll), 0x0200_0000_0001);
    assert_eq!((k.get(Field::NdSll), k.get(Field::NdOptionsType)), (0, 2));
    assert_eq!(k.get(Field::NdReserved), 0x6000_0000);
}

#[test]
fn responder_datapath_actions_are_ovs_s() {
    let f = ns_for_gateway();
    let key = extract(&f, 1);
    let t = translate(&pipeline(RESPONDER).snapshot(), &key, &env());
    assert_eq!(
        format_dp_actions_for_key(&t.actions, &key),
        "set(eth(src=02:00:00:00:00:01,dst=0a:00:00:00:00:05)),\
         set(ipv6(src=fd00:10:244:1::1,dst=fd00:10:244:1::5)),\
         set(nd_ext(nd_reserved=0x60000000,nd_options_type=2)),\
         set(nd(tll=02:00:00:00:00:01)),set(icmpv6(type=136,code=0)),1"
    );
}

/// OVS refuses the one-flow responder: `nd_tll` needs `icmp_type=136` in
/// the match (`set_field nd_tll lacks correct prerequisites`).
#[test]
fn one_flow_responder_is_refused_like_ovs() {
    let text = "table=0,icmp6,icmp_type=135,icmp_code=0,nd_target=fd00:10:244:1::1,actions=set_field:136->icmpv6_type,set_field:02:00:00:00:00:01->nd_tll,IN_PORT";
    let e = parse_flow_mod(text, FlowModCommand::Add, &ParseContext::default())
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("set_field nd_tll lacks correct prerequisites"),
        "{e}"
    );
}

#[test]
fn guard_passes_only_the_pods_own_advertisement() {
    let na = |target: u128, mac: [u8; 6]| {
        let m = nd_msg(136, 0x2000_0000, target, 2, mac);
        frame(POD_MAC, GW_MAC, POD_IP, GW_IP, &m)
    };
    let own = na(POD_IP, POD_MAC);
    assert_eq!(run(RESPONDER, &own), vec![(2, own.clone())]);
    assert!(
        run(RESPONDER, &na(POD_IP + 1, POD_MAC)).is_empty(),
        "other target"
    );
    assert!(run(RESPONDER, &na(POD_IP, GW_MAC)).is_empty(), "other MAC");
    // A repeated TLL option makes OVS read target and TLL as zero: no match.
    let mut dup = nd_msg(136, 0x2000_0000, POD_IP, 2, POD_MAC);
    dup.extend_from_slice(&[2, 1, 0x0a, 0, 0, 0, 0, 5]);
    let dup = frame(POD_MAC, GW_MAC, POD_IP, GW_IP, &dup);
    assert!(run(RESPONDER, &dup).is_empty(), "duplicate option");
}

/// The caches must tell the advertisements apart: the translation
/// un-wildcards `nd_target` and `nd_tll`, so a megaflow made by the pod's
/// own advertisement never lets a spoofed one through (and the other way).
#[test]
fn caches_keep_nd_fields_apart() {
    let na = |target: u128, mac: [u8; 6]| {
        let m = nd_msg(136, 0x2000_0000, target, 2, mac);
        frame(POD_MAC, GW_MAC, POD_IP, GW_IP, &m)
    };
    let (own, spoof_ip, spoof_mac) = (na(POD_IP, POD_MAC), na(GW_IP, POD_MAC), na(POD_IP, GW_MAC));
    let mut dp = Datapath::new(pipeline(RESPONDER), env(), DatapathConfig::default());
    let mut ct = Conntrack::default();
    for round in 0..3u64 {
        for f in [&spoof_ip, &own, &spoof_mac, &own] {
            let mut sink = RecordingSink::default();
            let mut batch = vec![DpPacket::from_frame(f, 1)];
            dp.process_batch(&mut batch, &mut ct, 1 + round, &mut sink);
            let n = sink.outputs.len();
            assert_eq!(n, usize::from(f == &own), "round {round}");
        }
    }
}

/// Address rewrites keep the ICMPv6 checksum (pseudo-header), and so do
/// target and link-layer option writes; a TLL write on a message whose
/// option is SLL changes nothing (OVS's `packet_set_nd`).
#[test]
fn nd_and_address_writes_keep_the_checksum() {
    let flows = [
        "table=0,in_port=1,icmp6,icmp_type=135,actions=set_field:fd00::aa->ipv6_src,set_field:fd00::bb->ipv6_dst,set_field:fd00::cc->nd_target,set_field:0a:00:00:00:00:cc->nd_sll,output:2",
    ];
    let out = run(&flows, &ns_for_gateway());
    assert_eq!(out.len(), 1);
    let f = &out[0].1;
    let msg = &f[54..];
    let (src, dst) = (0xfd00u128 << 112 | 0xaa, 0xfd00u128 << 112 | 0xbb);
    assert_eq!(&f[22..38], &src.to_be_bytes());
    assert_eq!(&msg[8..24], &(0xfd00u128 << 112 | 0xcc).to_be_bytes());
    assert_eq!(&msg[26..32], &[0x0a, 0, 0, 0, 0, 0xcc]);
    assert_eq!(
        u16::from_be_bytes([msg[2], msg[3]]),
        icmpv6_checksum(src, dst, msg)
    );

    // nd_tll on a solicitation turned advertisement whose option is still
    // SLL (no nd_options_type write): the option is left alone.
    let flows = [
        "table=0,in_port=1,icmp6,icmp_type=135,actions=set_field:136->icmpv6_type,resubmit(,1)",
        "table=1,icmp6,icmp_type=136,actions=set_field:02:00:00:00:00:01->nd_tll,output:2",
    ];
    let out = run(&flows, &ns_for_gateway());
    let msg = &out[0].1[54..];
    assert_eq!(&msg[24..32], &[1, 1, 0x0a, 0, 0, 0, 0, 5]);
    assert_eq!(msg[0], 136);
    assert_eq!(
        u16::from_be_bytes([msg[2], msg[3]]),
        icmpv6_checksum(POD_IP, SNM, msg)
    );
}

#[test]
fn nd_prerequisites_are_refused_with_ovs_wording() {
    let ctx = ParseContext::default();
    for (text, field) in [
        ("icmp6,nd_target=::1,actions=drop", "nd_target"),
        ("ipv6,nd_target=::1,actions=drop", "nd_target"),
        (
            "icmp6,icmp_type=135,icmp_code=1,nd_target=::1,actions=drop",
            "nd_target",
        ),
        (
            "icmp6,icmp_type=135,nd_tll=00:00:00:00:00:01,actions=drop",
            "nd_tll",
        ),
        (
            "icmp6,icmp_type=136,nd_sll=00:00:00:00:00:01,actions=drop",
            "nd_sll",
        ),
        (
            "icmp,icmp_type=135,nd_reserved=1,actions=drop",
            "nd_reserved",
        ),
        (
            "icmp6,icmp_type=128,nd_options_type=1,actions=drop",
            "nd_options_type",
        ),
    ] {
        let e = parse_flow_mod(text, FlowModCommand::Add, &ctx)
            .expect_err(text)
            .to_string();
        assert!(
            e.contains(&format!("prerequisites not met for setting {field}")),
            "{text}: {e}"
        );
    }
    let e = parse_flow_mod(
        "icmp6,icmp_type=135,nd_reserved=5/0xff,actions=drop",
        FlowModCommand::Add,
        &ctx,
    )
    .expect_err("not maskable")
    .to_string();
    assert!(e.contains("field nd_reserved cannot be masked"), "{e}");
}

// ---------------------------------------------------------------------------
// Shared storage: `nd_sll`/`nd_tll` are `arp_sha`/`arp_tha`'s key bits and
// the high half of `nd_target` is `nw_src`/`nw_dst`'s (field.rs, "Shared
// storage"). The packets below put the same bits there as ARP, IPv4 and
// ND: flows, caches, writes and traces must still keep them apart.

/// The high half of [`GW_IP`] (fd00:10:244:1::) as IPv4 addresses.
const GW_HI_SRC: [u8; 4] = [0xfd, 0x00, 0x00, 0x10];
const GW_HI_DST: [u8; 4] = [0x02, 0x44, 0x00, 0x01];

/// An ARP request from the pod's MAC with the given addresses.
fn arp(spa: [u8; 4], tpa: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&POD_MAC);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&POD_MAC);
    f.extend_from_slice(&spa);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&tpa);
    f
}

/// An IPv4/UDP frame (checksums zero: nothing here checks them).
fn udp4(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&GW_MAC);
    f.extend_from_slice(&POD_MAC);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&[0x30, 0x39, 0, 53, 0, 8, 0, 0]);
    f
}

const SHARED_FLOWS: &[&str] = &[
    "table=0,priority=100,arp,arp_sha=0a:00:00:00:00:05,actions=output:2",
    "table=0,priority=100,icmp6,icmp_type=135,nd_sll=0a:00:00:00:00:05,actions=output:3",
    "table=0,priority=90,ip,nw_src=253.0.0.16,nw_dst=2.68.0.1,actions=output:2",
    "table=0,priority=90,icmp6,icmp_type=135,nd_target=fd00:10:244:1::/64,actions=output:3",
    "table=0,priority=0,actions=drop",
];

#[test]
fn fields_sharing_key_bits_never_match_the_other_packet_kind() {
    // The keys really do hold the same bits: this is what is under test.
    let (a, n) = (
        extract(&arp([10, 0, 0, 1], [10, 0, 0, 2]), 1),
        extract(&ns_for_gateway(), 1),
    );
    assert_eq!(a.get(Field::ArpSha), n.get(Field::NdSll));
    let v4 = extract(&udp4(GW_HI_SRC, GW_HI_DST), 1);
    assert_eq!(
        (v4.get(Field::NwSrc) << 32 | v4.get(Field::NwDst)) << 64,
        n.get(Field::NdTarget) & !u128::from(u64::MAX)
    );
    let other_ns = frame(
        POD_MAC,
        SNM_MAC,
        POD_IP,
        SNM,
        &nd_msg(135, 0, GW_IP, 1, GW_MAC),
    );
    let frames: [(&[u8], u32); 4] = [
        (&arp([10, 0, 0, 1], [10, 0, 0, 2]), 2),
        (&ns_for_gateway(), 3),
        (&udp4(GW_HI_SRC, GW_HI_DST), 2),
        (&other_ns, 3),
    ];
    // One datapath for all, several rounds: the second and later rounds
    // hit the megaflows and exact-match entries the first installed.
    let mut dp = Datapath::new(pipeline(SHARED_FLOWS), env(), DatapathConfig::default());
    let mut ct = Conntrack::default();
    for round in 0..3u64 {
        for (f, port) in frames {
            let mut sink = RecordingSink::default();
            let mut batch = vec![DpPacket::from_frame(f, 1)];
            dp.process_batch(&mut batch, &mut ct, 1 + round, &mut sink);
            let got: Vec<u32> = sink.outputs.iter().map(|(p, _, _)| *p).collect();
            assert_eq!(got, vec![port], "round {round}, {:?}", extract(f, 1));
        }
    }
}

#[test]
fn traces_print_only_the_fields_a_packet_has() {
    use oxvs_pipeline::print::format_key;
    let v4 = format_key(&extract(&udp4(GW_HI_SRC, GW_HI_DST), 1));
    assert!(v4.contains("nw_src=253.0.0.16,nw_dst=2.68.0.1"), "{v4}");
    assert!(!v4.contains("nd_"), "{v4}");
    let a = format_key(&extract(&arp([10, 0, 0, 1], [10, 0, 0, 2]), 1));
    assert!(a.contains("arp_sha=0a:00:00:00:00:05"), "{a}");
    assert!(!a.contains("nd_"), "{a}");
    let n = format_key(&extract(&ns_for_gateway(), 1));
    assert!(
        n.contains("nd_target=fd00:10:244:1::1,nd_sll=0a:00:00:00:00:05"),
        "{n}"
    );
    assert!(!n.contains("nw_src") && !n.contains("arp_"), "{n}");
    let d = format!("{:?}", extract(&ns_for_gateway(), 1));
    assert!(
        d.contains("nd_sll") && !d.contains("arp_sha") && !d.contains("nw_src"),
        "{d}"
    );

    // The megaflow of an IPv4 packet matched on its addresses prints
    // them, not an nd_target.
    let t = oxvs_pipeline::trace::trace_packet(
        &*pipeline(SHARED_FLOWS).snapshot(),
        &udp4(GW_HI_SRC, GW_HI_DST),
        1,
        &env(),
        &Default::default(),
    );
    let text = t.to_string();
    assert!(text.contains("nw_src=253.0.0.16"), "{text}");
    assert!(!text.contains("nd_target"), "{text}");
    let mega = oxvs_pipeline::print::format_match(&t.passes[0].megaflow);
    assert!(mega.contains("nw_src=253.0.0.16,nw_dst=2.68.0.1"), "{mega}");
    assert!(!mega.contains("nd_"), "{mega}");
}

/// A group bucket runs without prerequisites: a write of a field whose
/// bits the packet's kind does not own is ignored (it would change the
/// other field), and a read of one gives 0, as OVS's runtime
/// prerequisite check does.
#[test]
fn bucket_writes_to_the_other_packet_kinds_field_are_ignored() {
    use oxvs_pipeline::group::GroupMod;
    use oxvs_pipeline::parse::{parse_flow_file, parse_group};
    use oxvs_pipeline::tables::TableMod;
    let ctx = ParseContext::default();
    let groups = [
        "group_id=1,type=all,bucket=set_field:fd00::1->nd_target,set_field:02:00:00:00:00:09->nd_sll,output:2",
        "group_id=2,type=all,bucket=set_field:1.2.3.4->ip_src,set_field:02:00:00:00:00:09->arp_sha,move:NXM_OF_IP_DST[]->NXM_NX_REG0[],output:2",
        "group_id=3,type=all,bucket=move:NXM_NX_ND_TARGET[64..95]->NXM_NX_REG0[],move:NXM_NX_ND_SLL[0..31]->NXM_NX_REG1[],resubmit(,1)",
    ];
    let flows = "table=0,priority=10,ip,actions=group:1\n\
                 table=0,priority=10,arp,actions=group:3\n\
                 table=0,priority=10,icmp6,actions=group:2\n\
                 table=1,priority=10,reg0=0,reg1=0,actions=output:3\n\
                 table=1,priority=0,actions=drop\n";
    let p = Pipeline::new();
    let mut mods: Vec<TableMod> = groups
        .iter()
        .map(|g| TableMod::Group(GroupMod::Add(parse_group(g, &ctx).unwrap())))
        .collect();
    mods.extend(
        parse_flow_file(flows, &ctx)
            .unwrap()
            .into_iter()
            .map(|f| TableMod::Flow(FlowMod::add(f))),
    );
    p.apply_bundle(&mods, 0).unwrap();
    let p = Arc::new(p);
    let send = |f: &[u8]| {
        let mut dp = Datapath::new(Arc::clone(&p), env(), DatapathConfig::default());
        let mut sink = RecordingSink::default();
        let mut batch = vec![DpPacket::from_frame(f, 1)];
        dp.process_batch(&mut batch, &mut Conntrack::default(), 1, &mut sink);
        sink.outputs
            .iter()
            .map(|(p, b, _)| (*p, b.clone()))
            .collect::<Vec<_>>()
    };
    // IPv4 through ND writes: unchanged.
    let v4 = udp4(GW_HI_SRC, GW_HI_DST);
    assert_eq!(send(&v4), vec![(2, v4.clone())]);
    let t = translate(&p.snapshot(), &extract(&v4, 1), &env());
    assert_eq!(format_dp_actions_for_key(&t.actions, &extract(&v4, 1)), "2");
    // ND through IPv4/ARP writes: unchanged.
    let ns = ns_for_gateway();
    assert_eq!(send(&ns), vec![(2, ns.clone())]);
    // ARP reading ND fields: zeros (its sha and addresses are not).
    let a = arp(GW_HI_SRC, GW_HI_DST);
    assert_eq!(send(&a), vec![(3, a.clone())]);
}
