//! The generated Antrea-like workload does what it says when run through
//! the real parser, tables, extractor and slow path: policy-allowed traffic
//! reaches the right port, isolated pods drop the rest, routing works.

use oxvs_bench::{
    count_flows, recirculated_key, Cluster, ClusterSpec, L4Port, Packet, TUNNEL_PORT,
};
use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::{ct_state, Field};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::odp::DpAction;
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::{Pipeline, TableSet};
use oxvs_pipeline::xlate::{translate, XlateEnv};

fn install(c: &Cluster) -> Pipeline {
    let text = c.flows();
    let flows = parse_flow_file(&text, &ParseContext::default()).expect("flows parse");
    assert_eq!(flows.len(), count_flows(&text));
    let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
    let p = Pipeline::new();
    p.apply(&mods, 0).expect("flows install");
    assert_eq!(p.snapshot().flow_count(), count_flows(&text));
    p
}

/// The output ports of a new connection's packet (both passes).
fn outputs(ts: &TableSet, pkt: &Packet) -> Vec<u32> {
    let env = XlateEnv::default();
    let key = extract(&pkt.frame, pkt.in_port);
    let t1 = translate(ts, &key, &env);
    assert!(
        t1.actions.iter().any(|a| matches!(a, DpAction::Ct { .. })),
        "pass 1 must run conntrack: {:?}",
        t1.actions
    );
    let k2 = recirculated_key(&key, &t1, ct_state::TRK | ct_state::NEW).expect("recirculates");
    let t2 = translate(ts, &k2, &env);
    t2.actions
        .iter()
        .filter_map(|a| match a {
            DpAction::Output(p) => Some(*p),
            _ => None,
        })
        .collect()
}

#[test]
fn policies_allow_and_isolate() {
    let c = Cluster::new(ClusterSpec::for_flow_count(1_000));
    let p = install(&c);
    let ts = p.snapshot();
    let n_local = c.local_pods().len();
    let mut checked = 0;
    for pol in &c.policies {
        let r = &pol.ingress;
        // A remote peer (arrives from the tunnel: no egress policy applies).
        let Some(&peer) = r.peers.iter().find(|&&x| x >= n_local) else {
            continue;
        };
        for &dst in &pol.applied_to {
            let port = r.ports[0];
            let pkt = c.packet(peer, dst, port, 40_000);
            assert_eq!(pkt.in_port, TUNNEL_PORT);
            assert_eq!(
                outputs(&ts, &pkt),
                vec![c.pods[dst].ofport],
                "policy {} allows {port:?} from pod {peer} to pod {dst}",
                r.conj_id
            );
            // A port no rule allows: the isolated pod drops it.
            let closed = L4Port { proto: 6, port: 1 };
            assert!(outputs(&ts, &c.packet(peer, dst, closed, 40_001)).is_empty());
            checked += 1;
        }
    }
    assert!(checked >= 10, "only {checked} cases");
}

#[test]
fn routes_to_remote_nodes_through_the_tunnel() {
    let spec = ClusterSpec {
        n_policies: 0,
        ..ClusterSpec::for_flow_count(1_000)
    };
    let c = Cluster::new(spec);
    let p = install(&c);
    let ts = p.snapshot();
    let env = XlateEnv::default();
    let remote = c.local_pods().len() + 5;
    let pkt = c.packet(0, remote, L4Port { proto: 6, port: 80 }, 1234);
    assert_eq!(outputs(&ts, &pkt), vec![TUNNEL_PORT]);
    // The tunnel destination is the remote node's underlay IP and TTL drops by one.
    let key = extract(&pkt.frame, pkt.in_port);
    let t1 = translate(&ts, &key, &env);
    let k2 = recirculated_key(&key, &t1, ct_state::TRK | ct_state::NEW).expect("recirculates");
    let t2 = translate(&ts, &k2, &env);
    let node = c.pods[remote].node;
    let want = u32::from_be_bytes(oxvs_bench::node_ip(node));
    assert!(
        t2.actions
            .iter()
            .any(|a| matches!(a, DpAction::SetTunnel(t) if t.dst == want)),
        "{:?}",
        t2.actions
    );
    assert!(
        t2.actions.iter().any(|a| matches!(
            a,
            DpAction::Set {
                field: Field::NwTtl,
                value: 63
            }
        )),
        "{:?}",
        t2.actions
    );
}
