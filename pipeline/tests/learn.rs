//! `learn` through the slow path, the trace and the caches.

use std::sync::Arc;

use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::field::Field;
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::learn::{describe, Learned};
use oxvs_pipeline::odp::{format_dp_actions, DpAction};
use oxvs_pipeline::parse::{parse_flow_file, parse_packet_spec, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::trace::{trace, TraceOptions};
use oxvs_pipeline::xlate::{translate, XlateEnv};

const AFFINITY: &str = "table=0,priority=100,tcp,nw_dst=10.96.0.1,tp_dst=80 actions=learn(table=36,hard_timeout=300,priority=200,delete_learned,cookie=0x7000000000001,eth_type=0x800,nw_proto=6,NXM_OF_TCP_DST[],NXM_OF_IP_DST[],NXM_OF_IP_SRC[],load:NXM_NX_REG3[]->NXM_NX_REG3[],load:NXM_NX_REG4[0..15]->NXM_NX_REG4[0..15],load:0x1->NXM_NX_REG0[20]),output:2";

/// The packet of OVS's `ofproto/trace ... -generate` run this file's
/// expectations were taken from.
const SPEC: &str = "in_port=1,tcp,nw_src=10.0.0.5,nw_dst=10.96.0.1,tcp_dst=80,reg3=7,reg4=0x12345";

/// What OVS 3.1's `ofproto/trace BR SPEC -generate` prints for the learn.
const OVS_LEARNED: &str = "table=36 tcp,nw_src=10.0.0.5,nw_dst=10.96.0.1,tp_dst=80 priority=200 cookie=0x7000000000001 hard=300 actions=load:0x7->NXM_NX_REG3[],load:0x2345->NXM_NX_REG4[0..15],load:0x1->NXM_NX_REG0[20]";

fn pipeline(flows: &str) -> Arc<Pipeline> {
    let p = Arc::new(Pipeline::new());
    let flows = parse_flow_file(flows, &ParseContext::default()).expect("flows parse");
    p.replace_all(&flows, 0).expect("flows load");
    p
}

fn key(spec: &str) -> FlowKey {
    parse_packet_spec(spec, &ParseContext::default()).expect("spec parses")
}

fn learned(actions: &[DpAction]) -> Vec<&Learned> {
    actions
        .iter()
        .filter_map(|a| match a {
            DpAction::Learn(l) => Some(&**l),
            _ => None,
        })
        .collect()
}

#[test]
fn the_slow_path_learns_what_ovs_learns_and_unwildcards_the_sources() {
    let p = pipeline(AFFINITY);
    let t = translate(&p.snapshot(), &key(SPEC), &XlateEnv::default());
    let l = learned(&t.actions);
    assert_eq!(l.len(), 1);
    assert_eq!(describe(&l[0].flow), OVS_LEARNED);
    // The learn is no datapath action OVS prints.
    assert_eq!(format_dp_actions(&t.actions), "2");
    // learn_mask: every source bit is in the megaflow mask.
    for (f, m) in [
        (Field::NwSrc, 0xffff_ffff),
        (Field::NwDst, 0xffff_ffff),
        (Field::TpDst, 0xffff),
        (Field::Reg(3), 0xffff_ffff),
        (Field::Reg(4), 0xffff),
    ] {
        assert_eq!(t.wildcards.get(f) & m, m, "{f:?}");
    }
    // Bits it does not read stay wildcarded (reg4's high half).
    assert_eq!(t.wildcards.get(Field::Reg(4)) & 0xffff_0000, 0);
    assert_eq!(t.wildcards.get(Field::TpSrc), 0);
}

#[test]
fn the_trace_shows_the_learned_flow_as_ofproto_trace_does() {
    let p = pipeline(AFFINITY);
    let text = trace(
        &*p.snapshot(),
        &key(SPEC),
        &XlateEnv::default(),
        &TraceOptions::default(),
    )
    .to_string();
    assert!(text.contains(&format!("     -> {OVS_LEARNED}\n")), "{text}");
}

#[test]
fn a_cached_learn_learns_per_megaflow_with_its_values() {
    let p = pipeline(AFFINITY);
    let mut dp = Datapath::new(
        Arc::clone(&p),
        XlateEnv::with_ports(vec![1, 2]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::new(CtConfig::default());
    let frame = |src: [u8; 4], sport: u16| {
        let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
        f.extend_from_slice(&[0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&[10, 96, 0, 1]);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&80u16.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
        DpPacket::from_frame(&f, 1)
    };
    let mut sink = RecordingSink::default();
    // Two connections of one client: one megaflow (the source port is not
    // read), so one learned flow within the resend interval...
    let mut pkts = vec![frame([10, 0, 0, 5], 1000), frame([10, 0, 0, 5], 1001)];
    dp.process_batch(&mut pkts, &mut ct, 1, &mut sink);
    assert_eq!(dp.stats().megaflow_inserts, 1);
    assert_eq!(sink.learned.len(), 1);
    // ...and again, from the cache, once it has passed.
    let mut pkts = vec![frame([10, 0, 0, 5], 1002)];
    dp.process_batch(&mut pkts, &mut ct, 1 + Learned::RESEND_NS, &mut sink);
    assert_eq!(dp.stats().upcalls, 1);
    assert_eq!(sink.learned.len(), 2);
    assert_eq!(sink.learned[0], sink.learned[1]);
    // Another client: its own megaflow and its own address in the flow.
    let mut pkts = vec![frame([10, 0, 0, 6], 1000)];
    dp.process_batch(&mut pkts, &mut ct, 2 + Learned::RESEND_NS, &mut sink);
    assert_eq!(sink.learned.len(), 3);
    assert_eq!(
        sink.learned[2].matches.get(Field::NwSrc),
        (0x0a00_0006, 0xffff_ffff)
    );
    assert_eq!(dp.stats().learns, 3);
    // The learned flows go into the tables; an identical one refreshes.
    let r = p.learn(sink.learned.iter(), 10);
    assert_eq!((r.added, r.refreshed), (2, 1));
    assert_eq!(p.snapshot().flows_in(36).len(), 2);
}
