//! `move` into `ct_mark` / `ct_label` inside `ct(commit,exec(...))`, through
//! the whole datapath: the committed connection gets the packet's source
//! bits (as the actions before the `ct` made them), and the megaflow cache
//! keeps packets with other source bits apart (the source is un-wildcarded).

mod common;

use std::sync::Arc;

use common::udp;
use oxvs_pipeline::conntrack::{Conntrack, CtConfig, CtL4};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;

/// reg0 gets the UDP source port's low byte in table 0; the commit moves
/// reg0[0..3] into ct_mark[4..7], the UDP source port into ct_mark[16..31]
/// and reg1 (loaded) into ct_label[32..63].
const FLOWS: &str = "
table=0,priority=10,udp,actions=move:NXM_OF_UDP_SRC[0..7]->NXM_NX_REG0[0..7],load:0xabcd->NXM_NX_REG1[],ct(commit,zone=3,exec(move:NXM_NX_REG0[0..3]->NXM_NX_CT_MARK[4..7],move:NXM_NX_REG1[]->NXM_NX_CT_LABEL[32..63],move:NXM_OF_UDP_SRC[]->NXM_NX_CT_MARK[16..31])),output:2
";

#[test]
fn committed_connection_gets_the_moved_bits() {
    let flows = parse_flow_file(FLOWS, &ParseContext::default()).expect("flows parse");
    let pipeline = Arc::new(Pipeline::new());
    let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
    pipeline.apply(&mods, 1).expect("flows load");
    let mut dp = Datapath::new(
        pipeline,
        XlateEnv::with_ports(vec![1, 2]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::new(CtConfig::default());
    let mut now = 1_000_000_000;
    for sport in [0x1235u16, 0x1236, 0x1235] {
        now += 1_000_000;
        let mut batch = vec![DpPacket::from_frame(&udp(3, sport, 4, 53), 1)];
        let mut sink = RecordingSink::default();
        dp.process_batch(&mut batch, &mut ct, now, &mut sink);
        assert_eq!(sink.outputs.len(), 1);
    }
    let mut got: Vec<(u16, u32, u128)> = ct
        .entries()
        .iter()
        .map(|e| match e.orig.l4 {
            CtL4::Ports { src, .. } => (src, e.mark, e.label),
            other => panic!("a UDP connection, got {other:?}"),
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (0x1235, 0x1235_0050, 0xabcd << 32),
            (0x1236, 0x1236_0060, 0xabcd << 32),
        ]
    );
}
