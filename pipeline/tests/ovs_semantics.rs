//! Pipeline semantics that must match OVS 3.1, each case checked against it
//! (`ovs-ofctl add-flow` + `ovs-appctl ofproto/trace`).

use std::sync::Arc;

use oxvs_pipeline::conntrack::Conntrack;
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::field::Field;
use oxvs_pipeline::flow::{FlowMod, FlowModCommand};
use oxvs_pipeline::odp::DpAction;
use oxvs_pipeline::parse::{parse_flow_mod, parse_packet_spec, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::{translate, XlateEnv};

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

/// OVS: `set_field:7->vlan_vid` is `mod_vlan_vid:7` (OpenFlow 1.0/NXM; with
/// OpenFlow 1.3 the value must carry OFPVID_PRESENT, 4103); either way the
/// tag stays (`Datapath actions: pop_vlan,push_vlan(vid=7,pcp=0),2`). It
/// used to clear the tag-present bit, and the datapath then popped the tag.
#[test]
fn set_field_vlan_vid_keeps_the_tag() {
    let p = pipeline(&["in_port=1,dl_vlan=5,actions=set_field:7->vlan_vid,output:2"]);
    let k = parse_packet_spec(
        "in_port=1,dl_vlan=5,dl_type=0x0800",
        &ParseContext::default(),
    )
    .expect("spec");
    let t = translate(&p.snapshot(), &k, &env());
    assert_eq!(
        t.actions,
        vec![
            DpAction::Set {
                field: Field::VlanTci,
                value: 0x1007
            },
            DpAction::Output(2)
        ]
    );
    // And on the wire: the frame keeps a tag, with VID 7 and its PCP.
    let mut frame = vec![
        2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 0x81, 0, 0x60, 5, 0x08, 0x00,
    ];
    frame.extend_from_slice(&[
        0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ]);
    let mut dp = Datapath::new(p, env(), DatapathConfig::default());
    let mut sink = RecordingSink::default();
    let mut batch = vec![DpPacket::from_frame(&frame, 1)];
    dp.process_batch(&mut batch, &mut Conntrack::default(), 1, &mut sink);
    let out = &sink.outputs;
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(&out[0].1[12..16], &[0x81, 0, 0x60, 7]);
}
