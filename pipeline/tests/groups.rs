//! Groups through the real tables, translator and datapath: a select
//! group's choice (weights, stability per connection and both directions,
//! what a removed bucket moves), and a group change reaching the very next
//! batch of a datapath whose caches hold megaflows through the old group.

use std::collections::HashMap;
use std::sync::Arc;

use oxvs_pipeline::conntrack::Conntrack;
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::field::Field;
use oxvs_pipeline::group::GroupMod;
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::odp::DpAction;
use oxvs_pipeline::parse::{parse_flow_file, parse_group, ParseContext};
use oxvs_pipeline::tables::{Pipeline, TableMod};
use oxvs_pipeline::xlate::{translate, XlateEnv};

fn ctx() -> ParseContext {
    ParseContext::default()
}

/// A pipeline with `groups` and `flows` (text), loaded as one bundle.
fn pipeline(groups: &[&str], flows: &str) -> Pipeline {
    let p = Pipeline::new();
    let mut mods: Vec<TableMod> = groups
        .iter()
        .map(|g| TableMod::Group(GroupMod::Add(parse_group(g, &ctx()).unwrap())))
        .collect();
    mods.extend(
        parse_flow_file(flows, &ctx())
            .unwrap()
            .into_iter()
            .map(|f| TableMod::Flow(oxvs_pipeline::FlowMod::add(f))),
    );
    p.apply_bundle(&mods, 0).unwrap();
    p
}

fn tcp(src: u32, dst: u32, sport: u16, dport: u16) -> FlowKey {
    let mut k = FlowKey::ZERO;
    k.set(Field::InPort, 1);
    k.set(Field::DlType, 0x0800);
    k.set(Field::NwProto, 6);
    k.set(Field::NwSrc, u128::from(src));
    k.set(Field::NwDst, u128::from(dst));
    k.set(Field::TpSrc, u128::from(sport));
    k.set(Field::TpDst, u128::from(dport));
    k
}

/// The ports a packet is sent to.
fn outputs(p: &Pipeline, k: &FlowKey) -> Vec<u32> {
    let t = translate(&p.snapshot(), k, &XlateEnv::default());
    assert_eq!(t.error, None);
    t.actions
        .iter()
        .filter_map(|a| match a {
            DpAction::Output(p) => Some(*p),
            _ => None,
        })
        .collect()
}

#[test]
fn select_spreads_by_weight_keeps_connections_and_moves_only_a_removed_buckets_packets() {
    for method in [
        "",
        ",selection_method=hash,fields(ip_src,ip_dst,tcp_src,tcp_dst)",
    ] {
        let group = format!(
            "group_id=1,type=select{method},bucket=output:2,bucket=output:3,bucket=weight:2,output:4"
        );
        let p = pipeline(&[&group], "in_port=1,ip actions=group:1\n");
        let mut counts: HashMap<u32, usize> = HashMap::new();
        let mut chosen = Vec::new();
        for i in 0..4000u32 {
            let k = tcp(0x0a00_0001 + (i % 7), 0x0a00_0100, 1024 + i as u16, 80);
            let out = outputs(&p, &k);
            assert_eq!(out.len(), 1, "one bucket: {out:?}");
            // The same packet, the same bucket.
            assert_eq!(outputs(&p, &k), out);
            *counts.entry(out[0]).or_default() += 1;
            chosen.push((k, out[0]));
        }
        for (port, want) in [(2, 1000.0), (3, 1000.0), (4, 2000.0)] {
            let got = counts.get(&port).copied().unwrap_or(0) as f64;
            assert!((got - want).abs() < want * 0.1, "{method}: {counts:?}");
        }
        if method.is_empty() {
            // The default method is symmetric: the reply takes the same bucket.
            for (k, port) in chosen.iter().take(200) {
                let mut r = tcp(0, 0, 0, 0);
                r.set(Field::NwSrc, k.get(Field::NwDst));
                r.set(Field::NwDst, k.get(Field::NwSrc));
                r.set(Field::TpSrc, k.get(Field::TpDst));
                r.set(Field::TpDst, k.get(Field::TpSrc));
                assert_eq!(outputs(&p, &r), vec![*port]);
            }
        }
        // Remove bucket 1 (port 3): only its packets move.
        let smaller = format!(
            "group_id=1,type=select{method},bucket=bucket_id:0,output:2,bucket=bucket_id:2,weight:2,output:4"
        );
        let modify = GroupMod::Modify {
            group: parse_group(&smaller, &ctx()).unwrap(),
            may_create: false,
        };
        p.apply_bundle(&[TableMod::Group(modify)], 1).unwrap();
        for (k, port) in &chosen {
            let now = outputs(&p, k);
            if *port != 3 {
                assert_eq!(
                    now,
                    vec![*port],
                    "{method}: a packet not on the removed bucket moved"
                );
            } else {
                assert_ne!(now, vec![3]);
            }
        }
    }
}

#[test]
fn all_indirect_and_empty_groups() {
    let p = pipeline(
        &[
            "group_id=1,type=all,bucket=output:2,bucket=output:3",
            "group_id=2,type=indirect,bucket=output:4",
            "group_id=3,type=all",
            "group_id=4,type=select,bucket=weight:0,output:2",
        ],
        "in_port=1,tcp,tp_dst=1 actions=group:1\n\
         in_port=1,tcp,tp_dst=2 actions=group:2,output:5\n\
         in_port=1,tcp,tp_dst=3 actions=group:3\n\
         in_port=1,tcp,tp_dst=4 actions=group:4\n",
    );
    assert_eq!(outputs(&p, &tcp(1, 2, 3, 1)), vec![2, 3]);
    assert_eq!(outputs(&p, &tcp(1, 2, 3, 2)), vec![4, 5]);
    assert_eq!(outputs(&p, &tcp(1, 2, 3, 3)), Vec::<u32>::new());
    assert_eq!(outputs(&p, &tcp(1, 2, 3, 4)), Vec::<u32>::new());
}

fn frame() -> Vec<u8> {
    // An Ethernet + IPv4 + UDP frame (checksums are not looked at).
    let mut f = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1, 0x08, 0x00];
    f.extend_from_slice(&[
        0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ]);
    f.extend_from_slice(&[0x04, 0x00, 0x00, 0x35, 0, 8, 0, 0]);
    f
}

#[test]
fn a_group_change_reaches_the_next_batch() {
    let p = Arc::new(pipeline(
        &["group_id=1,type=all,bucket=output:2"],
        "in_port=1,ip actions=group:1\n",
    ));
    let mut dp = Datapath::new(
        Arc::clone(&p),
        XlateEnv::with_ports(vec![1, 2, 3]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::default();
    let run = |dp: &mut Datapath, ct: &mut Conntrack, now| {
        let f = frame();
        let mut sink = RecordingSink::default();
        dp.process_batch(&mut [DpPacket::from_frame(&f, 1)], ct, now, &mut sink);
        sink.outputs
            .iter()
            .map(|(port, _, _)| *port)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(&mut dp, &mut ct, 1_000), vec![2]);
    // Cached now: the second packet takes the cache.
    assert_eq!(run(&mut dp, &mut ct, 2_000), vec![2]);
    let g = parse_group(
        "group_id=1,type=all,bucket=output:3,bucket=output:2",
        &ctx(),
    )
    .unwrap();
    let modify = GroupMod::Modify {
        group: g,
        may_create: false,
    };
    p.apply_bundle(&[TableMod::Group(modify)], 3_000).unwrap();
    assert_eq!(run(&mut dp, &mut ct, 4_000), vec![3, 2]);
    // Deleting the group deletes its flow: the next packet is dropped.
    p.apply_bundle(&[TableMod::Group(GroupMod::Delete(Some(1)))], 5_000)
        .unwrap();
    assert_eq!(p.snapshot().flow_count(), 0);
    assert_eq!(run(&mut dp, &mut ct, 6_000), Vec::<u32>::new());
}

#[test]
fn a_group_loop_is_a_translation_error_not_a_hang() {
    let p = pipeline(
        &[
            "group_id=1,type=all,bucket=group:2,bucket=output:3",
            "group_id=2,type=indirect,bucket=group:1",
        ],
        "in_port=1,ip actions=group:1\n",
    );
    let t = translate(&p.snapshot(), &tcp(1, 2, 3, 4), &XlateEnv::default());
    assert!(t.error.is_some(), "{:?}", t.actions);
    assert!(t.actions.is_empty());
}
