//! Meters through the tables and the datapath: `meter:N` naming a missing
//! meter is refused (as OVS), deleting a meter deletes its flows, a meter
//! of 10 pktps with a burst of 10 passes burst + rate * t packets of a
//! flood and drops the rest, counted in its band, also from the megaflow
//! cache; the trace shows `meter:1`.

mod common;

use std::sync::Arc;

use common::udp;
use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{Datapath, DatapathConfig, DpPacket, RecordingSink};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::meter::MeterMod;
use oxvs_pipeline::parse::{parse_flow, parse_meter, ParseContext};
use oxvs_pipeline::tables::{FlowModError, Pipeline, TableMod};
use oxvs_pipeline::xlate::{translate, XlateEnv};

const FLOW: &str = "table=0,priority=10,udp,actions=meter:1,output:2";

fn flow_mod(text: &str) -> TableMod {
    TableMod::Flow(FlowMod::add(
        parse_flow(text, &ParseContext::default()).expect("flow parses"),
    ))
}

fn meter(text: &str) -> MeterMod {
    MeterMod::Add(parse_meter(text).expect("meter parses"))
}

#[test]
fn a_flow_needs_its_meter_and_goes_with_it() {
    let p = Pipeline::new();
    assert_eq!(
        p.apply_bundle(&[flow_mod(FLOW)], 1),
        Err(FlowModError::InvalidMeter(1))
    );
    // The meter may come in the same bundle, after the flow.
    let r = p
        .apply_bundle(
            &[
                flow_mod(FLOW),
                TableMod::Meter(meter("meter=1,pktps,band=type=drop,rate=10")),
            ],
            1,
        )
        .expect("bundle");
    assert_eq!((r.added, r.meters_added), (1, 1));
    assert_eq!(p.snapshot().meter_flow_count(1), 1);
    let again = p.apply_bundle(
        &[TableMod::Meter(meter(
            "meter=1,pktps,band=type=drop,rate=10",
        ))],
        2,
    );
    assert_eq!(again, Err(FlowModError::MeterExists(1)));
    let modify = MeterMod::Modify(parse_meter("meter=9,pktps,band=type=drop,rate=1").unwrap());
    assert_eq!(
        p.apply_bundle(&[TableMod::Meter(modify)], 2),
        Err(FlowModError::UnknownMeter(9))
    );
    let r = p
        .apply_bundle(&[TableMod::Meter(MeterMod::Delete(Some(1)))], 3)
        .expect("delete");
    assert_eq!((r.meters_deleted, r.deleted), (1, 1));
    assert_eq!(p.snapshot().flow_count(), 0);
}

#[test]
fn ten_pktps_with_a_burst_of_ten_passes_burst_plus_rate_times_t() {
    let p = Arc::new(Pipeline::new());
    p.apply_bundle(
        &[
            TableMod::Meter(meter(
                "meter=1,pktps,burst,stats,band=type=drop,rate=10,burst_size=10",
            )),
            flow_mod(FLOW),
        ],
        1,
    )
    .expect("bundle");
    let trace = translate(
        &p.snapshot(),
        &oxvs_pipeline::extract::extract(&udp(3, 1000, 4, 53), 1),
        &XlateEnv::with_ports(vec![1, 2]),
    );
    assert_eq!(
        oxvs_pipeline::odp::format_dp_actions(&trace.actions),
        "meter(1),2"
    );
    let mut dp = Datapath::new(
        Arc::clone(&p),
        XlateEnv::with_ports(vec![1, 2]),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::new(CtConfig::default());
    // 3 s of a flood: a batch of 32 packets every 10 ms.
    let start = 7_000_000_000u64;
    let mut passed = 0;
    let mut sent = 0u64;
    for tick in 0..300u64 {
        let mut batch: Vec<_> = (0..32)
            .map(|i| DpPacket::from_frame(&udp(3, 1000 + (i % 4), 4, 53), 1))
            .collect();
        sent += batch.len() as u64;
        let mut sink = RecordingSink::default();
        dp.process_batch(&mut batch, &mut ct, start + tick * 10_000_000, &mut sink);
        passed += sink.outputs.len() as u64;
    }
    // 10 at once, then 10 a second for 2.99 s.
    assert!((39..=41).contains(&passed), "passed {passed}");
    let tables = p.snapshot();
    let m = tables.meter(1).expect("meter 1");
    let st = m.stats(tables.meter_flow_count(1), start + 3_000_000_000);
    assert_eq!(st.packets_in, sent);
    assert_eq!(st.bands[0].packets, sent - passed);
    assert_eq!(dp.stats().meter_drops, sent - passed);
    assert!(dp.stats().megaflow_hits + dp.stats().emc_hits > 0);
}
