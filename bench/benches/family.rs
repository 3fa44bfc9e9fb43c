//! What a packet costs per address family: UDP pod traffic, IPv4 against
//! IPv6, through the agent's real flows for a dual-stack node (the
//! desired flows `oxvs_agent::desired::compute` gives a node with 8 pods
//! and a remote node behind the tunnel; no NetworkPolicy), the datapath's
//! `process_batch` of 32 packets with conntrack, in steady state (every
//! connection committed, every megaflow installed), as `pipeline`'s
//! `datapath` group measures the Antrea-like workload.
//!
//! Paths: pod to pod on this node, and pod to a pod of the other node
//! (routed into the tunnel), over an IPv4 underlay and over an IPv6 one
//! (`tun_dst` or `tun_ipv6_dst`, the tunnel guard of that family). 256
//! connections per path and family.
//!
//! Run: `cargo bench -p oxvs-bench --bench family` (the figures in
//! `docs/benchmarks.md`, "IPv4 and IPv6"). Criterion reports the time per
//! batch of 32 and the packet rate (elements/s).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use oxvs_agent::desired::{compute, Inputs, Tunnel};
use oxvs_agent::flows::{NodeNet, NodeNet6, PodPort, RemoteNode};
use oxvs_agent::model::{ClusterState, Node};
use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{CountingSink, Datapath, DatapathConfig, DpPacket};
use oxvs_pipeline::parse::{parse_flow_file, parse_group_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;

const TUNNEL_PORT: u32 = 1;
const GATEWAY_PORT: u32 = 2;
const PODS: u32 = 8;
const BATCH: usize = 32;
const CONNECTIONS: u16 = 256;

fn mac(i: u8) -> [u8; 6] {
    [0x0a, 0x58, 10, 244, 1, i]
}

fn pod(i: u8) -> PodPort {
    PodPort {
        ofport: u32::from(i) + 1,
        ip: Some(Ipv4Addr::new(10, 244, 1, i)),
        mac: mac(i),
        ip6: Some(Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, u16::from(i))),
    }
}

/// The node's flows and groups, installed; the tunnel over an IPv6
/// underlay with `underlay6`.
fn pipeline(underlay6: bool) -> Arc<Pipeline> {
    let (remote_ip, node_ip): (IpAddr, IpAddr) = if underlay6 {
        (
            "fd00:77::12".parse().unwrap(),
            "fd00:77::11".parse().unwrap(),
        )
    } else {
        (
            Ipv4Addr::new(192, 168, 77, 12).into(),
            Ipv4Addr::new(192, 168, 77, 11).into(),
        )
    };
    let node = NodeNet {
        ipv4: Some(oxvs_agent::flows::NodeNet4 {
            pod_cidr: "10.244.1.0/24".parse().unwrap(),
            gateway_ip: Ipv4Addr::new(10, 244, 1, 1),
        }),
        gateway_mac: mac(1),
        gateway_ofport: GATEWAY_PORT,
        ipv6: Some(NodeNet6::of("fd00:10:244:1::/64".parse().unwrap())),
    };
    let mut state = ClusterState::default();
    state.nodes.insert(
        "n2".into(),
        Node {
            name: "n2".into(),
            pod_cidr: Some("10.244.2.0/24".parse().unwrap()),
            pod_cidr6: Some("fd00:10:244:2::/64".parse().unwrap()),
            internal_ip: Some(Ipv4Addr::new(192, 168, 77, 12)),
            internal_ip6: Some("fd00:77::12".parse().unwrap()),
        },
    );
    let inp = Inputs {
        pods: (2..2 + PODS as u8).map(pod).collect(),
        tunnel: Some(Tunnel {
            ofport: TUNNEL_PORT,
            remotes: vec![RemoteNode {
                name: "n2".into(),
                pod_cidr: Some("10.244.2.0/24".parse().unwrap()),
                ip: remote_ip,
                pod_cidr6: Some("fd00:10:244:2::/64".parse().unwrap()),
            }],
            node_ip: Some(node_ip),
            guard: true,
        }),
        state: Arc::new(state),
        node_name: "n1".into(),
        ..Inputs::for_node(node)
    };
    let d = compute(&inp);
    let ctx = ParseContext::default();
    let flows = parse_flow_file(&d.text(), &ctx).expect("desired flows parse");
    let groups = parse_group_file(&d.groups.join("\n"), &ctx).expect("groups parse");
    let p = Pipeline::new();
    p.replace_all_with_groups(&flows, Some(&groups), 0)
        .expect("desired flows install");
    Arc::new(p)
}

/// One UDP frame from pod `from` to `dst` (a 64-byte payload).
fn udp(from: &PodPort, dst: IpAddr, sport: u16) -> Vec<u8> {
    let payload = [0x5au8; 64];
    let mut f = Vec::with_capacity(14 + 40 + 8 + payload.len());
    f.extend_from_slice(&mac(1));
    f.extend_from_slice(&from.mac);
    let udp_len = (8 + payload.len()) as u16;
    match dst {
        IpAddr::V4(d) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&from.ip.expect("IPv4 pod").octets());
            ip[16..20].copy_from_slice(&d.octets());
            let sum = oxvs_pipeline::checksum::checksum(&ip, 0);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&ip);
        }
        IpAddr::V6(d) => {
            f.extend_from_slice(&[0x86, 0xdd]);
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&udp_len.to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&from.ip6.expect("dual-stack pod").octets());
            ip[24..40].copy_from_slice(&d.octets());
            f.extend_from_slice(&ip);
        }
    }
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&8080u16.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    // No UDP checksum: the datapath does not verify it (IPv6 would need
    // one on the wire; the switch forwards what it gets).
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&payload);
    f
}

/// `CONNECTIONS` connections of one path and family, round robin over the
/// pods.
fn packets(v6: bool, remote: bool) -> Vec<DpPacket<Vec<u8>>> {
    (0..CONNECTIONS)
        .map(|c| {
            let from = pod(2 + (c % PODS as u16) as u8);
            let to = 2 + ((c + 1) % PODS as u16) as u8;
            let node = if remote { 2 } else { 1 };
            let dst: IpAddr = match v6 {
                false => Ipv4Addr::new(10, 244, node, to).into(),
                true => Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(node), 0, 0, 0, u16::from(to))
                    .into(),
            };
            DpPacket::from_frame(&udp(&from, dst, 10_000 + c), from.ofport)
        })
        .collect()
}

fn bench_family(c: &mut Criterion) {
    let pipelines = [pipeline(false), pipeline(true)];
    let mut ports = vec![TUNNEL_PORT, GATEWAY_PORT];
    ports.extend((2..2 + PODS as u8).map(|i| pod(i).ofport));
    let mut g = c.benchmark_group("family");
    g.throughput(Throughput::Elements(BATCH as u64));
    for (remote, underlay6) in [(false, false), (true, false), (true, true)] {
        let p = &pipelines[usize::from(underlay6)];
        for v6 in [false, true] {
            let pkts = packets(v6, remote);
            let mut dp = Datapath::new(
                Arc::clone(p),
                XlateEnv::with_ports(ports.clone()),
                DatapathConfig::default(),
            );
            let mut ct = Conntrack::new(CtConfig::default());
            let mut sink = CountingSink::default();
            let now = 1_000_000_000u64;
            for _ in 0..3 {
                for chunk in pkts.chunks(BATCH) {
                    let mut batch = chunk.to_vec();
                    dp.process_batch(&mut batch, &mut ct, now, &mut sink);
                }
            }
            let before = dp.stats();
            for chunk in pkts.chunks(BATCH) {
                let mut batch = chunk.to_vec();
                dp.process_batch(&mut batch, &mut ct, now, &mut sink);
            }
            let s = dp.stats();
            let name = format!(
                "{}/{}",
                match (remote, underlay6) {
                    (false, _) => "same_node",
                    (true, false) => "to_tunnel",
                    (true, true) => "to_tunnel_over_ipv6",
                },
                if v6 { "ipv6" } else { "ipv4" }
            );
            // Every packet forwarded, none dropped: what is measured is
            // the forwarding path.
            assert_eq!(
                (s.outputs - before.outputs, s.drops - before.drops),
                (u64::from(CONNECTIONS), 0),
                "{name}: steady state must forward every packet"
            );
            eprintln!(
                "{name}: steady state per {} packets: emc {} megaflow {} upcalls {} recirc {}",
                s.packets - before.packets,
                s.emc_hits - before.emc_hits,
                s.megaflow_hits - before.megaflow_hits,
                s.upcalls - before.upcalls,
                s.recirculations - before.recirculations,
            );
            g.bench_function(BenchmarkId::new("process_batch32", &name), |b| {
                let mut i = 0usize;
                b.iter_batched_ref(
                    || {
                        i = (i + BATCH) % pkts.len();
                        pkts[i..(i + BATCH).min(pkts.len())].to_vec()
                    },
                    |batch| dp.process_batch(batch, &mut ct, now, &mut sink),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args()
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_family
}
criterion_main!(benches);
