//! The slow path over the real classifier and flow text, checked against
//! what Open vSwitch 3.1 does with the same flows (`ofproto/trace` output
//! recorded on a netdev bridge; datapath port numbers mapped back to
//! OpenFlow ports).

use oxvs_pipeline::field::Field;
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::odp::{recirc_id_for_table, DpAction};
use oxvs_pipeline::parse::{parse_flow_file, parse_packet_spec, ParseContext};
use oxvs_pipeline::tables::{Pipeline, TableSet};
use oxvs_pipeline::trace::{trace, TraceOptions};
use oxvs_pipeline::xlate::{translate, XlateEnv};
use std::sync::Arc;

fn tables(text: &str) -> Arc<TableSet> {
    let ctx = ParseContext::default();
    let flows = parse_flow_file(text, &ctx).expect("flows parse");
    let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
    let p = Pipeline::new();
    p.apply(&mods, 0).expect("flows apply");
    p.snapshot()
}

fn key(spec: &str) -> oxvs_pipeline::key::FlowKey {
    parse_packet_spec(spec, &ParseContext::default()).expect("packet spec parses")
}

fn env() -> XlateEnv {
    XlateEnv::with_ports(vec![1, 2, 3])
}

const SPEC: &str = "in_port=1,tcp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_dst=80,nw_ttl=64";

#[test]
fn resubmit_move_and_mod_nw_like_ovs() {
    let t = tables(
        "table=0,priority=100,in_port=1,ip actions=resubmit(,5),note:aa.bb,mod_nw_dst:10.0.0.9,output:2,goto_table:10
         table=0,priority=50,in_port=1 actions=output:ALL
         table=5,priority=10,ip actions=move:NXM_OF_IP_SRC[]->NXM_NX_REG1[],resubmit(,6)
         table=6,priority=10 actions=set_field:0x99->reg2
         table=10,priority=10,ip,nw_dst=10.0.0.2 actions=output:3",
    );
    let x = translate(&t, &key(SPEC), &env());
    // OVS: set(ipv4(dst=10.0.0.9)),2 — and table 10 misses (nw_dst changed).
    assert_eq!(
        x.actions,
        vec![
            DpAction::Set {
                field: Field::NwDst,
                value: 0x0a00_0009
            },
            DpAction::Output(2)
        ]
    );
    assert_eq!(x.rules.len(), 3);
    let report = trace(&*t, &key(SPEC), &env(), &TraceOptions::default());
    let text = report.to_string();
    // OVS: Megaflow: recirc_id=0,eth,tcp,in_port=1,nw_src=10.0.0.1,nw_dst=10.0.0.2,nw_frag=no
    // (OVS also pins nw_proto via its tcp-aware classifier stages; we are
    // allowed to be as wide as the lookups require.)
    let mf = &report.passes[0].megaflow;
    assert_eq!(mf.mask.get(Field::NwSrc), 0xffff_ffff);
    assert_eq!(mf.mask.get(Field::NwDst), 0xffff_ffff);
    assert_eq!(mf.mask.get(Field::TpDst), 0);
    let steps = "\
 0. ip,in_port=1, priority 100
    resubmit(,5)
     5. ip, priority 10
            move:NXM_OF_IP_SRC[]->NXM_NX_REG1[]
             -> NXM_NX_REG1[] is now 0xa000001
            resubmit(,6)
         6. priority 10
            set_field:0x99->reg2
    note:aa.bb
";
    assert!(text.contains(steps), "{text}");
    assert!(text.contains("\n10. No match.\n    drop\n"), "{text}");

    // ARP from port 1: output:ALL, i.e. every other port.
    let x = translate(&t, &key("in_port=1,arp"), &env());
    assert_eq!(x.actions, vec![DpAction::Output(2), DpAction::Output(3)]);
}

#[test]
fn ct_recirculation_like_ovs() {
    let t = tables(
        "table=0,priority=100,in_port=1,ip actions=load:0x5->NXM_NX_REG0[],set_field:00:00:00:00:00:aa->eth_src,goto_table:10
         table=0,priority=0 actions=drop
         table=10,priority=10,ip,nw_dst=10.0.0.2 actions=ct(zone=5,table=20)
         table=20,priority=10,ct_state=+new+trk,ip actions=ct(commit,zone=5,exec(set_field:0x1->ct_mark)),dec_ttl,resubmit(,30)
         table=20,priority=5,ct_state=+est+trk,ip actions=output:2
         table=30,priority=0 actions=output:NXM_NX_REG0[0..3],output:in_port,output:1,controller",
    );
    let report = trace(&*t, &key(SPEC), &env(), &TraceOptions::default());
    assert_eq!(report.passes.len(), 2);
    // OVS: set(eth(src=00:00:00:00:00:aa)),ct(zone=5),recirc(..)
    assert_eq!(
        report.passes[0].actions,
        vec![
            DpAction::Set {
                field: Field::DlSrc,
                value: 0xaa
            },
            DpAction::Ct {
                zone: 5,
                commit: false,
                force: false,
                mark: None,
                label: None,
                nat: None,
            },
            DpAction::LoadMeta {
                field: Field::Reg(0),
                value: 5
            },
            DpAction::Recirc(recirc_id_for_table(20)),
        ]
    );
    // OVS: ct(commit,zone=5,mark=0x1/0xffffffff),set(ipv4(ttl=63)),
    // userspace(controller(reason=action...)); port 5 does not exist
    // ("Nonexistent output port", nothing sent, as in OVS), IN_PORT goes
    // out port 1 here because OVS refused it only for lack of a port 1.
    let second = &report.passes[1];
    assert_eq!(
        second.actions,
        vec![
            DpAction::Ct {
                zone: 5,
                commit: true,
                force: false,
                mark: Some((1, 0xffff_ffff)),
                label: None,
                nat: None,
            },
            DpAction::Set {
                field: Field::NwTtl,
                value: 63
            },
            DpAction::Output(1),
            DpAction::Userspace {
                reason: oxvs_pipeline::flow::PacketInReason::Action,
                userdata: vec![],
                table: 30,
                cookie: 0
            },
        ]
    );
    let text = report.to_string();
    let steps = "\
    thaw
        Resuming from table 20
20. ct_state=+new+trk,ip, priority 10
    ct(commit,zone=5,exec(set_field:0x1->ct_mark))
    set_field:0x1->ct_mark
     -> Sets the packet to an untracked state, and clears all the conntrack fields.
    dec_ttl
    resubmit(,30)
30. priority 0
    output:NXM_NX_REG0[0..3]
     -> output port is 5
";
    assert!(text.contains(steps), "{text}");
    assert!(
        text.contains("    output:1\n     >> skipping output to input port\n"),
        "{text}"
    );
    // The recirculated flow carries the first pass's writes.
    assert!(text.contains("Flow: recirc_id=0x15,"), "{text}");
    let mf = &second.megaflow;
    assert_eq!(mf.mask.get(Field::NwTtl), 0xff);
    assert_eq!(mf.value.get(Field::RecircId), 0x15);
}

#[test]
fn dec_ttl_exception_resumes_outer_level_like_ovs() {
    let t = tables(
        "table=0,priority=100,in_port=1,ip,cookie=0x1234 actions=resubmit(,5),mod_dl_src:00:00:00:00:00:01,output:3
         table=5,priority=10,ip actions=dec_ttl,output:2,resubmit(,5)",
    );
    let spec = "in_port=1,tcp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_dst=80,nw_ttl=3";
    let x = translate(&t, &key(spec), &env());
    let ttl = |v| DpAction::Set {
        field: Field::NwTtl,
        value: v,
    };
    assert_eq!(
        x.actions,
        vec![
            ttl(2),
            DpAction::Output(2),
            ttl(1),
            DpAction::Output(2),
            DpAction::Userspace {
                reason: oxvs_pipeline::flow::PacketInReason::InvalidTtl,
                userdata: vec![],
                table: 5,
                cookie: 0,
            },
            DpAction::Set {
                field: Field::DlSrc,
                value: 1
            },
            DpAction::Output(3)
        ]
    );
    let text = trace(&*t, &key(spec), &env(), &TraceOptions::default()).to_string();
    assert!(
        text.contains(" 0. ip,in_port=1, priority 100, cookie 0x1234\n"),
        "{text}"
    );
    assert!(
        text.contains("            dec_ttl\n             >> IPv4 decrement TTL exception\n    mod_dl_src:00:00:00:00:00:01\n"),
        "{text}"
    );
}

#[test]
fn output_to_a_port_that_does_not_exist_sends_nothing() {
    let t = tables(
        "table=0,priority=10,in_port=1 actions=output:7,output:0,output:2
         table=0,priority=0 actions=drop",
    );
    // The ports are known: 7 and 0 do not exist, 2 does.
    let report = trace(&*t, &key("in_port=1,arp"), &env(), &TraceOptions::default());
    assert_eq!(report.passes[0].actions, vec![DpAction::Output(2)]);
    let text = report.to_string();
    assert_eq!(text.matches("Nonexistent output port").count(), 2, "{text}");
    // The ports are not known (an offline trace without --ports): port 0
    // still never exists, any other number is sent to.
    let none = XlateEnv::default();
    let report = trace(&*t, &key("in_port=1,arp"), &none, &TraceOptions::default());
    assert_eq!(
        report.passes[0].actions,
        vec![DpAction::Output(7), DpAction::Output(2)]
    );
    assert_eq!(
        report
            .to_string()
            .matches("Nonexistent output port")
            .count(),
        1
    );
    // A switch with no port at all: the (empty) list is known, so every
    // output goes nowhere.
    let empty = XlateEnv::with_ports(Vec::new());
    let report = trace(&*t, &key("in_port=1,arp"), &empty, &TraceOptions::default());
    assert!(
        report.passes[0].actions.is_empty(),
        "{:?}",
        report.passes[0].actions
    );
    let text = report.to_string();
    assert_eq!(text.matches("Nonexistent output port").count(), 3, "{text}");
}
