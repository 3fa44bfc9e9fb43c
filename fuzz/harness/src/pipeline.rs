//! The first four targets, on the pipeline crate alone (moved here from
//! `fuzz/fuzz_targets/` unchanged in what they check, so their corpora are
//! replayed too).

use std::sync::{Arc, OnceLock};

use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{CountingSink, Datapath, DatapathConfig, DpPacket};
use oxvs_pipeline::extract::{extract, extract_packet, PACKET_FIELDS};
use oxvs_pipeline::field::{frag, Field as F};
use oxvs_pipeline::ipf::{Ipf, IpfConfig, IpfOutcome};
use oxvs_pipeline::parse::{parse_flow, parse_flow_file, ParseContext};
use oxvs_pipeline::print::{format_actions, format_match};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;
use oxvs_pipeline::{Field, FlowKey, FlowMod};

/// `extract`: flow key extraction on arbitrary bytes. Beyond "no panic":
/// `extract_packet` keeps every metadata bit of the key it is given and
/// writes the same packet fields as `extract` does from a zero key.
pub fn extract_target(frame: &[u8]) {
    let fresh = extract(frame, 7);
    assert_eq!(fresh.get(Field::InPort), 7);

    // A key full of metadata and stale packet fields.
    let mut key = FlowKey {
        w: [0xa5a5_a5a5_a5a5_a5a5; oxvs_pipeline::field::KEY_WORDS],
    };
    let before = key;
    extract_packet(frame, &mut key);
    let mut packet_mask = FlowKey::ZERO;
    for f in PACKET_FIELDS {
        packet_mask.mask_field(f);
    }
    for i in 0..key.w.len() {
        let m = packet_mask.w[i];
        assert_eq!(key.w[i] & !m, before.w[i] & !m, "metadata word {i} changed");
        assert_eq!(
            key.w[i] & m,
            fresh.w[i] & m,
            "packet word {i} differs from extract()"
        );
    }
}

/// `parse_flow`: the `ovs-ofctl` flow parser on arbitrary UTF-8, and the
/// printer on whatever it accepts. Either may reject input; neither may
/// panic. (libFuzzer hands `&str` targets only valid UTF-8; other bytes are
/// skipped here the same way.)
pub fn parse_flow_target(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let ctx = ParseContext::default();
    if let Ok(flow) = parse_flow(text, &ctx) {
        let m = format_match(&flow.matches);
        let a = format_actions(&flow.actions, None);
        std::hint::black_box((m, a));
    }
    // The same text as a group (`add-group` syntax): what prints parses
    // back and prints the same.
    if let Ok(g) = oxvs_pipeline::parse::parse_group(text, &ctx) {
        let printed = g.to_string();
        let again = oxvs_pipeline::parse::parse_group(&printed, &ctx)
            .unwrap_or_else(|e| panic!("printed group does not parse: {printed}: {e}"));
        assert_eq!(again.to_string(), printed, "group printing is not stable");
    }
}

const EXTRA: &str = "
table=0,priority=1000,in_port=6 actions=goto_table:100
table=100,priority=10,ip actions=push_vlan:0x8100,set_field:5->vlan_vid,mod_nw_src:10.9.9.9,mod_dl_dst:02:00:00:00:00:09,output:3
table=100,priority=20,tcp actions=set_field:8080->tcp_dst,dec_ttl,output:4
table=100,priority=20,udp actions=set_field:53->udp_src,ct(commit,zone=3,table=101)
table=100,priority=5,vlan_tci=0x1000/0x1000 actions=pop_vlan,output:5
table=100,priority=1 actions=controller(reason=action,userdata=01.02)
table=101,priority=1 actions=output:in_port,output:ALL
";

fn datapath_pipeline() -> &'static Arc<Pipeline> {
    static P: OnceLock<Arc<Pipeline>> = OnceLock::new();
    P.get_or_init(|| {
        let text = format!("{}\n{EXTRA}", crate::common::ANTREA_LIKE);
        let flows = parse_flow_file(&text, &ParseContext::default()).expect("flows parse");
        let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
        let p = Arc::new(Pipeline::new());
        p.apply(&mods, 0).expect("flows install");
        p
    })
}

/// `datapath`: the frame path of the datapath (key extraction, cache
/// lookups, the slow path and action execution: header rewrites with
/// checksum updates, VLAN push/pop, conntrack with recirculation, dec_ttl,
/// outputs) on arbitrary frames, through the example Antrea-like pipeline
/// plus flows that exercise the remaining actions. Each input is processed
/// twice so the second pass runs from the caches. "No panic" is the check.
pub fn datapath_target(data: &[u8]) {
    // First byte: ingress port 1..=6 (6 enters the extra flows at table 100).
    let (port, frame) = match data.split_first() {
        Some((p, rest)) => (u32::from(*p % 6) + 1, rest),
        None => (1, data),
    };
    let env = XlateEnv::with_ports(vec![1, 2, 3, 4, 5]);
    let mut dp = Datapath::new(
        Arc::clone(datapath_pipeline()),
        env,
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::new(CtConfig::default());
    let mut sink = CountingSink::default();
    for round in 0..2u64 {
        let mut pkts = [DpPacket::from_frame(frame, port)];
        dp.process_batch(&mut pkts, &mut ct, round * 1_000_000, &mut sink);
    }
}

const MS: u64 = 1_000_000;

/// `ipf`: IP fragment reassembly on arbitrary frames. The input is a
/// sequence of records `[flags, len, zone, frame bytes (len)]`; each frame
/// goes to `Ipf::add` with its extracted key (or, when `flags & 1`, a key
/// forced to say "fragment") at a time that only grows (`flags >> 1` ms per
/// record, so datagrams also time out). Small limits make every limit
/// reachable. Checked after every call: held bytes and datagrams within the
/// limits, and every offered fragment counted exactly once (held,
/// reassembled or dropped). At the end, expiry must free everything.
pub fn ipf_target(data: &[u8]) {
    let config = IpfConfig {
        max_bytes: 16 * 1024,
        max_datagrams: 8,
        max_frags_per_datagram: 16,
        min_frag_payload: 8,
        timeout_ns: 100 * MS,
        ..IpfConfig::default()
    };
    let mut ipf = Ipf::new(config);
    let mut now = 0u64;
    let mut rest = data;
    while let [flags, len, zone, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (frame, after) = tail.split_at(n);
        rest = after;
        now += u64::from(flags >> 1) * MS;

        let mut key = extract(frame, 1);
        if flags & 1 != 0 {
            key.set(F::NwFrag, u128::from(frag::ANY));
        }
        if let IpfOutcome::Completed(done) = ipf.add(frame, &key, u16::from(*zone % 4), now) {
            assert!(done.fragment_count() >= 2);
            ipf.recycle(done);
        }

        assert!(ipf.held_bytes() <= config.max_bytes);
        assert!(ipf.held_datagrams() <= config.max_datagrams);
        let s = ipf.stats();
        assert_eq!(
            s.fragments_total,
            s.held_fragments + s.fragments_reassembled_total + s.dropped_total()
        );
    }
    ipf.expire(u64::MAX);
    assert_eq!(ipf.held_bytes(), 0);
    assert_eq!(ipf.held_datagrams(), 0);
}
