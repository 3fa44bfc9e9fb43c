//! Fuzz target: the frame path of the datapath — key extraction, cache
//! lookups, the slow path and action execution (header rewrites with
//! checksum updates, VLAN push/pop, conntrack with recirculation, dec_ttl,
//! outputs) — on arbitrary frames, through the example Antrea-like pipeline
//! plus flows that exercise the remaining actions. Each input is processed
//! twice so the second pass runs from the caches. "No panic" is the check.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{CountingSink, Datapath, DatapathConfig, DpPacket};
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;
use oxvs_pipeline::FlowMod;

const EXTRA: &str = "
table=0,priority=1000,in_port=6 actions=goto_table:100
table=100,priority=10,ip actions=push_vlan:0x8100,set_field:5->vlan_vid,mod_nw_src:10.9.9.9,mod_dl_dst:02:00:00:00:00:09,output:3
table=100,priority=20,tcp actions=set_field:8080->tcp_dst,dec_ttl,output:4
table=100,priority=20,udp actions=set_field:53->udp_src,ct(commit,zone=3,table=101)
table=100,priority=5,vlan_tci=0x1000/0x1000 actions=pop_vlan,output:5
table=100,priority=1 actions=controller(reason=action,userdata=01.02)
table=101,priority=1 actions=output:in_port,output:ALL
";

fn pipeline() -> &'static Arc<Pipeline> {
    static P: OnceLock<Arc<Pipeline>> = OnceLock::new();
    P.get_or_init(|| {
        let text = format!(
            "{}\n{EXTRA}",
            include_str!("../../examples/antrea-like.flows")
        );
        let flows = parse_flow_file(&text, &ParseContext::default()).expect("flows parse");
        let mods: Vec<FlowMod> = flows
            .into_iter()
            .map(|flow| FlowMod::add(flow))
            .collect();
        let p = Arc::new(Pipeline::new());
        p.apply(&mods, 0).expect("flows install");
        p
    })
}

fuzz_target!(|data: &[u8]| {
    // First byte: ingress port 1..=6 (6 enters the extra flows at table 100).
    let (port, frame) = match data.split_first() {
        Some((p, rest)) => (u32::from(*p % 6) + 1, rest),
        None => (1, data),
    };
    let env = XlateEnv {
        ports: vec![1, 2, 3, 4, 5],
    };
    let mut dp = Datapath::new(Arc::clone(pipeline()), env, DatapathConfig::default());
    let mut ct = Conntrack::new(CtConfig::default());
    let mut sink = CountingSink::default();
    for round in 0..2u64 {
        let mut pkts = [DpPacket::from_frame(frame, port)];
        dp.process_batch(&mut pkts, &mut ct, round * 1_000_000, &mut sink);
    }
});
