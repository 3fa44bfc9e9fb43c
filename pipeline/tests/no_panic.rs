//! Robustness: the flow-text parsers and the datapath must never panic on
//! untrusted input. Random strings, random token soups built from the flow
//! vocabulary, and byte-level mutations of valid flow lines go to every
//! parser entry point; random and mutated frames go through a pipeline that
//! uses every action kind.

use std::sync::Arc;

use oxvs_pipeline::conntrack::Conntrack;
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::flow::{FlowMod, FlowModCommand};
use oxvs_pipeline::parse::{
    parse_flow, parse_flow_file, parse_flow_mod, parse_match, parse_packet_spec, ParseContext,
};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;
use proptest::prelude::*;

/// Valid flow lines to mutate.
const SEEDS: &[&str] = &[
    "table=0,priority=100,ip,nw_dst=10.0.0.1,actions=output:2",
    "table=1,tcp,tp_dst=80,nw_src=10.0.0.0/24,actions=load:0x1->NXM_NX_REG0[],move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:10.0.0.2->tun_dst,resubmit(,10),goto_table:10",
    "table=2,cookie=0x5/0xff,priority=5,ip,ct_state=+trk+est-rel,reg1=0x5/0xff,actions=ct(commit,zone=5,exec(set_field:0x1/0xff->ct_mark,set_field:0x5->ct_label,load:0x3->NXM_NX_CT_MARK[0..3]))",
    "table=3,ct_state=+trk,actions=conjunction(1,2/3)",
    "table=3,arp,nw_src=10.0.0.1,actions=output:NXM_NX_REG1[],output:reg1[0..15],in_port,LOCAL,controller(reason=no_match,userdata=01.02.03,max_len=100,id=3)",
    "table=4,dl_vlan=0xffff,ip,actions=mod_dl_src:00:11:22:33:44:55,mod_nw_src:1.2.3.4,dec_ttl,push_vlan:0x8100,pop_vlan,strip_vlan,set_tunnel:5,set_tunnel64:0x1234567890,ct_clear,note:00.11.22,resubmit:3,resubmit(4,5),ct(zone=NXM_NX_REG0[0..15],table=7)",
    "table=5,tcp6,ipv6_src=2001:db8::/64,tcp_flags=+syn-ack,actions=drop",
    "table=5,udp,tp_dst=0x1000/0xf000,dl_src=00:11:22:00:00:00/ff:ff:ff:00:00:00,in_port=LOCAL,vlan_tci=0x1005/0x1fff,actions=drop",
    "table=6,ip,nw_frag=yes,nw_dst=10.0.0.0/255.255.0.255,actions=drop",
    "table=8,metadata=0x5,tun_id=0x7/0xff,tun_src=1.1.1.1,ct_label=0x1/0x1,conj_id=7,xreg1=0x5,actions=drop",
    "table=9,ct_state=trk|est,actions=drop",
    " cookie=0x5, duration=1.234s, table=2, n_packets=7, idle_timeout=10, send_flow_rem importance=3, priority=5,ip actions=drop",
    "in_port=1,tcp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_src=5,tp_dst=80,tcp_flags=0x2,dl_vlan=5",
];

/// Tokens to assemble into soups (deep nesting, odd punctuation, huge numbers).
const TOKENS: &[&str] = &[
    "table=",
    "priority=",
    "actions=",
    "action=",
    "ct(",
    "exec(",
    ")",
    "(",
    ",",
    "=",
    ":",
    "->",
    "[",
    "]",
    "..",
    "/",
    "reg0",
    "reg16",
    "xreg8",
    "NXM_NX_REG0[]",
    "[0..31]",
    "[31..0]",
    "[64]",
    "0x",
    "0xffffffffffffffffffffffffffffffffff",
    "99999999999999999999",
    "-1",
    "255",
    "256",
    "65536",
    "4294967295",
    "ip",
    "tcp",
    "arp",
    "ipv6",
    "ct_state=",
    "+trk",
    "-est",
    "|",
    "conjunction(",
    "1,2/3",
    "0/0",
    "resubmit(",
    "output:",
    "load:",
    "move:",
    "set_field:",
    "nw_dst",
    "ipv6_src",
    "::",
    ":::",
    "1.2.3.4",
    "1.2.3.4/33",
    "/255.0.255.0",
    "ff:ff:ff:ff:ff:ff",
    "vlan_tci=",
    "dl_vlan=",
    "push_vlan:",
    "dec_ttl(",
    "controller(",
    "userdata=",
    "note:",
    "é",
    "\u{1F980}",
    "\\",
    "\n",
    " ",
    "\t",
    "#",
    "drop",
    "in_port=",
    "tcp_flags=",
    "nw_frag=",
    "zone=",
    "commit",
    "nat",
    "learn(",
    "cookie=",
    "0x1/0x",
    "ct_label=",
    "tun_id=",
    "metadata=",
    "goto_table:",
    "strict",
    "out_port=",
    "",
];

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..40).prop_map(|v| v.concat())
}

fn mutated() -> impl Strategy<Value = String> {
    (
        prop::sample::select(SEEDS),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 1..6),
    )
        .prop_map(|(seed, edits)| {
            let mut b: Vec<u8> = seed.as_bytes().to_vec();
            for (at, byte, op) in edits {
                if b.is_empty() {
                    b.push(byte);
                    continue;
                }
                let i = at.index(b.len());
                match op {
                    0 => b[i] = byte,
                    1 => b.insert(i, byte),
                    2 => {
                        b.remove(i);
                    }
                    _ => b.truncate(i),
                }
            }
            String::from_utf8_lossy(&b).into_owned()
        })
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), soup(), mutated(), "[ -~]{0,80}"]
}

fn parse_everything(text: &str) {
    let ctx = ParseContext::default();
    let _ = parse_flow(text, &ctx);
    for command in [
        FlowModCommand::Add,
        FlowModCommand::Modify { strict: false },
        FlowModCommand::Modify { strict: true },
        FlowModCommand::Delete { strict: false },
        FlowModCommand::Delete { strict: true },
    ] {
        let _ = parse_flow_mod(text, command, &ctx);
    }
    let _ = parse_match(text, &ctx);
    let _ = parse_packet_spec(text, &ctx);
    let _ = parse_flow_file(text, &ctx);
    if let Err(e) = parse_flow(text, &ctx) {
        // The error position must point at the token inside the text.
        assert!(e.pos <= text.len(), "{text:?}: {e}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn parsers_never_panic(text in any_text()) {
        parse_everything(&text);
    }
}

#[test]
fn parsers_survive_deep_nesting_and_huge_input() {
    let deep = format!(
        "ip,actions={}{}",
        "ct(exec(".repeat(2000),
        "))".repeat(2000)
    );
    parse_everything(&deep);
    let deep_parens = format!("actions={}", "(".repeat(5000));
    parse_everything(&deep_parens);
    let many = format!("ip,actions={}", "dec_ttl,".repeat(20000));
    parse_everything(&many);
    let big = format!("reg0={},actions=drop", "9".repeat(1000));
    parse_everything(&big);
    parse_everything("actions=");
    parse_everything("actions=,");
    parse_everything(",,,,");
    parse_everything("=");
    parse_everything("actions");
    parse_everything("\\\n\\\n\\");
}

// ---------------------------------------------------------------------------
// Datapath

/// Flows that use every action kind, for every protocol the writer knows.
const DP_FLOWS: &[&str] = &[
    "table=0,priority=50,in_port=1,tcp,actions=set_field:00:11:22:33:44:55->eth_src,mod_dl_dst:00:00:00:00:00:01,mod_nw_src:1.2.3.4,mod_nw_dst:5.6.7.8,set_field:7->tp_src,set_field:9->tcp_dst,set_field:4->nw_tos,set_field:1->nw_ecn,set_field:9->nw_ttl,dec_ttl,push_vlan:0x8100,set_field:0x1005->vlan_tci,output:2,pop_vlan,pop_vlan,strip_vlan,output:3,ct(commit,zone=5,table=1,exec(set_field:0x1->ct_mark,set_field:0x2->ct_label))",
    "table=0,priority=50,in_port=1,udp,actions=set_field:1->udp_src,set_field:2->udp_dst,dec_ttl,ct(table=1),output:2",
    "table=0,priority=50,in_port=1,sctp,actions=set_field:1->sctp_src,set_field:2->sctp_dst,output:2,ct(commit,table=1)",
    "table=0,priority=50,in_port=1,icmp,actions=set_field:3->icmp_type,set_field:1->icmp_code,dec_ttl,output:2,ct(zone=NXM_NX_REG0[0..15],table=1)",
    "table=0,priority=50,in_port=1,arp,actions=set_field:2->arp_op,set_field:00:11:22:33:44:55->arp_sha,set_field:00:11:22:33:44:66->arp_tha,set_field:1.1.1.1->arp_spa,set_field:2.2.2.2->arp_tpa,load:1->NXM_OF_ARP_OP[],move:NXM_OF_ETH_SRC[]->NXM_NX_ARP_THA[],output:in_port",
    "table=0,priority=50,in_port=1,ipv6,actions=set_field:2001:db8::1->ipv6_src,set_field:2001:db8::2->ipv6_dst,set_field:0x12->ipv6_label,set_field:8->nw_tos,set_field:3->nw_ttl,dec_ttl,ct(commit,table=1),output:2",
    "table=0,priority=60,in_port=1,tcp6,actions=set_field:7->tp_src,set_field:9->tp_dst,dec_ttl,ct(table=1)",
    "table=0,priority=60,in_port=1,icmp6,actions=set_field:136->icmpv6_type,set_field:1->icmpv6_code,output:2",
    "table=0,priority=70,in_port=1,icmp6,icmp_type=135,nd_target=2001:db8::/32,actions=set_field:2001:db8::9->nd_target,set_field:00:11:22:33:44:55->nd_sll,set_field:0x60000000->nd_reserved,set_field:2->nd_options_type,set_field:136->icmpv6_type,resubmit(,3)",
    "table=0,priority=70,in_port=1,icmp6,icmp_type=136,actions=set_field:00:11:22:33:44:66->nd_tll,move:NXM_NX_ND_TLL[]->NXM_OF_ETH_SRC[],set_field:0->nd_options_type,output:2",
    "table=3,priority=1,icmp6,icmp_type=136,actions=set_field:00:11:22:33:44:77->nd_tll,output:in_port",
    "table=0,priority=40,in_port=1,actions=push_vlan:0x88a8,set_field:0x1007->vlan_tci,push_vlan:0x8100,output:2,pop_vlan,set_tunnel:5,set_field:1.2.3.4->tun_dst,output:3,set_field:0.0.0.0->tun_dst,ct_clear,load:0x5->NXM_NX_REG0[],move:NXM_NX_REG0[]->NXM_NX_REG1[],resubmit(,2),controller(reason=no_match,userdata=01.02),goto_table:2",
    "table=0,priority=30,in_port=2,ip,actions=ct(table=1),ct(table=2)",
    "table=0,priority=30,in_port=3,ip,actions=ct(commit,table=0)",
    "table=0,priority=30,in_port=4,actions=output:in_port,resubmit(,0)",
    "table=0,priority=2,ip,actions=pop_vlan,dec_ttl,output:1,output:2,output:3,output:4",
    "table=0,priority=1,actions=pop_vlan,output:1,output:2,output:3,output:4",
    "table=1,priority=10,ip,ct_state=+trk+new,actions=ct(commit),output:4",
    "table=1,priority=10,ipv6,ct_state=+trk+est,actions=output:4,ct(table=2)",
    "table=1,priority=1,ip,actions=ct_clear,ct(table=2)",
    "table=2,priority=10,ip,actions=dec_ttl,output:4,ct(commit,zone=7,exec(set_field:0x5/0xff->ct_mark))",
    "table=2,priority=1,actions=output:4",
];

/// Valid frames of every kind the extractor and writer know, to mutate.
fn seed_frames() -> Vec<Vec<u8>> {
    let eth = |ty: u16| {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2];
        f.extend_from_slice(&ty.to_be_bytes());
        f
    };
    let ipv4 = |proto: u8, frag: u16, l4: &[u8]| {
        let mut f = eth(0x0800);
        let len = (20 + l4.len()) as u16;
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(&[0, 1]);
        f.extend_from_slice(&frag.to_be_bytes());
        f.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(l4);
        f
    };
    let ipv6 = |next: u8, l4: &[u8]| {
        let mut f = eth(0x86dd);
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        f.extend_from_slice(&[next, 64]);
        f.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        f.extend_from_slice(&[0; 11]);
        f.push(1);
        f.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        f.extend_from_slice(&[0; 11]);
        f.push(2);
        f.extend_from_slice(l4);
        f
    };
    let tcp = [
        0, 5, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0,
    ];
    let udp = [0, 5, 0, 53, 0, 12, 0, 0, 1, 2, 3, 4];
    let sctp = [0, 5, 0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 4];
    let icmp = [8, 0, 0, 0, 0, 1, 0, 1];
    // ND solicitations/advertisements: header, flags, target 2001:db8::1, options.
    let nd = |ty: u8, opts: &[u8]| {
        let mut m = vec![ty, 0, 0, 0, 0x60, 0, 0, 0, 0x20, 0x01, 0x0d, 0xb8];
        m.extend_from_slice(&[0; 11]);
        m.push(1);
        m.extend_from_slice(opts);
        m
    };
    let mut arp = eth(0x0806);
    arp.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 2, 10, 0, 0, 1]);
    arp.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 0, 0, 2]);
    let mut vlan = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x81, 0, 0x20, 5];
    vlan.extend_from_slice(&ipv4(6, 0, &tcp)[12..]);
    let mut qinq = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x88, 0xa8, 0, 7];
    qinq.extend_from_slice(&vlan[12..]);
    // IPv6 with a hop-by-hop header before TCP.
    let mut hbh = vec![6, 0, 1, 4, 0, 0, 0, 0];
    hbh.extend_from_slice(&tcp);
    vec![
        ipv4(6, 0, &tcp),
        ipv4(17, 0, &udp),
        ipv4(132, 0, &sctp),
        ipv4(1, 0, &icmp),
        ipv4(6, 0x2000, &tcp),
        ipv4(6, 0x0010, &tcp),
        ipv4(99, 0, &[1, 2, 3]),
        ipv6(6, &tcp),
        ipv6(17, &udp),
        ipv6(58, &[135, 0, 0, 0, 0, 0, 0, 0]),
        ipv6(58, &nd(135, &[1, 1, 2, 0, 0, 0, 0, 5])),
        ipv6(58, &nd(136, &[2, 1, 2, 0, 0, 0, 0, 6])),
        ipv6(
            58,
            &nd(
                136,
                &[
                    14, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 2, 0, 0, 0, 0, 6,
                ],
            ),
        ),
        ipv6(
            58,
            &nd(135, &[1, 1, 2, 0, 0, 0, 0, 5, 1, 1, 2, 0, 0, 0, 0, 5]),
        ),
        ipv6(58, &nd(135, &[0, 0, 0, 0, 0, 0, 0, 0])),
        ipv6(58, &nd(136, &[])),
        ipv6(0, &hbh),
        ipv6(44, &[6, 0, 0, 1, 0, 0, 0, 1]),
        arp,
        vlan,
        qinq,
        eth(0x88cc),
    ]
}

fn frame() -> impl Strategy<Value = Vec<u8>> {
    let seeds = seed_frames();
    let mutated = (
        prop::sample::select(seeds),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..4), 0..6),
    )
        .prop_map(|(mut b, edits)| {
            for (at, byte, op) in edits {
                if b.is_empty() {
                    break;
                }
                let i = at.index(b.len());
                match op {
                    0 | 1 => b[i] = byte,
                    2 => b.truncate(i),
                    _ => b.insert(i, byte),
                }
            }
            b
        });
    prop_oneof![
        4 => mutated,
        1 => prop::collection::vec(any::<u8>(), 0..100),
    ]
}

fn dp_pipeline() -> Arc<Pipeline> {
    let ctx = ParseContext::default();
    let mods: Vec<FlowMod> = DP_FLOWS
        .iter()
        .map(|t| {
            parse_flow_mod(t, FlowModCommand::Add, &ctx).unwrap_or_else(|e| panic!("{t}: {e}"))
        })
        .collect();
    let p = Arc::new(Pipeline::new());
    p.apply(&mods, 0).expect("apply");
    p
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn datapath_never_panics(frames in prop::collection::vec((frame(), 1u32..6), 1..8)) {
        let mut dp = Datapath::new(
            dp_pipeline(),
            XlateEnv::with_ports(vec![1, 2, 3, 4]),
            DatapathConfig::default(),
        );
        let mut ct = Conntrack::default();
        let mut sink = RecordingSink::default();
        // Twice: the second batch goes through the caches.
        for round in 0..2u64 {
            let mut batch: Vec<DpPacket<Vec<u8>>> = frames
                .iter()
                .map(|(f, p)| DpPacket::from_frame(f, *p))
                .collect();
            dp.process_batch(&mut batch, &mut ct, 1_000 + round, &mut sink);
        }
    }
}

#[test]
fn datapath_pipeline_reaches_every_action() {
    // The flows above parse and the valid seeds produce outputs.
    let mut dp = Datapath::new(
        dp_pipeline(),
        XlateEnv::with_ports(vec![1, 2, 3, 4]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::default();
    let mut sink = RecordingSink::default();
    let mut batch: Vec<DpPacket<Vec<u8>>> = seed_frames()
        .iter()
        .map(|f| DpPacket::from_frame(f, 1))
        .collect();
    dp.process_batch(&mut batch, &mut ct, 1, &mut sink);
    let s = dp.stats();
    assert!(s.outputs > 10, "{s:?}");
    assert!(s.recirculations > 3, "{s:?}");
    assert!(s.packet_ins > 0, "{s:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    /// The tracker reads both the key and the frame; after a header write
    /// that did not fit, they can disagree. Any pair must be safe.
    #[test]
    fn conntrack_never_panics_on_key_frame_mismatch(
        steps in prop::collection::vec((frame(), frame(), any::<bool>(), any::<bool>(), 0u16..3), 1..10),
    ) {
        use oxvs_pipeline::conntrack::CtParams;
        use oxvs_pipeline::extract::extract;
        let mut ct = Conntrack::default();
        for (i, (f, other, commit, force, zone)) in steps.iter().enumerate() {
            let p = CtParams { zone: *zone, commit: *commit, force: *force, mark: Some((1, 1)), label: Some((1, 1)), nat: None };
            // The key of `other` over the bytes of `f`, then the honest pair.
            let _ = ct.execute(f, &extract(other, 1), &p, i as u64 * 1_000);
            let _ = ct.execute(f, &extract(f, 1), &p, i as u64 * 1_000 + 1);
        }
    }
}

/// Every prefix of every seed frame (the ND ones included: cut inside the
/// target, inside an option) is extracted and run through the datapath,
/// twice (the second time through the caches), without panicking.
#[test]
fn every_prefix_of_every_seed_frame() {
    use oxvs_pipeline::extract::extract;
    let mut dp = Datapath::new(
        dp_pipeline(),
        XlateEnv::with_ports(vec![1, 2, 3, 4]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::default();
    let mut sink = RecordingSink::default();
    for f in seed_frames() {
        for cut in 0..=f.len() {
            let _ = extract(&f[..cut], 1);
            for round in 0..2u64 {
                let mut batch = vec![DpPacket::from_frame(&f[..cut], 1)];
                dp.process_batch(&mut batch, &mut ct, 10 + round, &mut sink);
            }
        }
    }
}
