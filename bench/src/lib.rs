//! # oxvs-bench: synthetic Antrea-like workloads for benchmarks and tests
//!
//! This crate makes the inputs the benchmarks (and, later, the end-to-end
//! harness and the tests) run on: a flow table for one node of a
//! Kubernetes cluster, shaped like the one Antrea programs into Open vSwitch,
//! and packets between the pods of that cluster.
//!
//! ## The model
//!
//! A [`Cluster`] is built from a [`ClusterSpec`] by a seeded pseudo-random
//! generator (no `rand` dependency; [`Rng`] is a SplitMix64), so the same
//! spec always gives the same flows and packets, byte for byte.
//!
//! - **This node** has `n_pods` local pods, each on its own OpenFlow port
//!   (from [`FIRST_POD_PORT`]), plus the gateway port [`GATEWAY_PORT`] and
//!   the VXLAN tunnel port [`TUNNEL_PORT`] (Antrea's numbering).
//! - **Remote nodes** (`n_remote_nodes`) each own a /24 pod CIDR reached
//!   through the tunnel, and have `pods_per_remote_node` pods that policies
//!   can name as peers.
//! - **NetworkPolicies** (`n_policies`): each selects `pods_per_policy`
//!   local pods (its *applied-to* set) and has one ingress and one egress
//!   rule, each with `peers_per_rule` peer pod IPs (sometimes plus an
//!   ipBlock CIDR) and 1..=`max_ports_per_rule` L4 ports. Every rule becomes
//!   a three-clause conjunction, as in Antrea:
//!   - ingress (table `IngressRule`): clause 1 `nw_src=<peer>`, clause 2
//!     `reg1=<ofport of an applied-to pod>` (the output port chosen by
//!     `L2ForwardingCalc`), clause 3 `tcp|udp,tp_dst=<port>`;
//!   - egress (table `EgressRule`): clause 1 `in_port=<applied-to pod>`,
//!     clause 2 `nw_dst=<peer>`, clause 3 the ports;
//!   - a `conj_id=<id>` flow that records the rule id in a register and
//!     goes on to the metric table; a metric flow per rule; and, for every
//!     pod any policy selects, a default-deny flow in the `*DefaultRule`
//!     table.
//!
//!   Conjunction flows with identical (table, priority, match) are merged
//!   into one flow with several `conjunction(...)` actions, as Antrea and
//!   OVS require (adding a second flow with the same match and priority
//!   would replace the first).
//!
//! The table numbers come from [`oxvs_pipeline::names`], the register
//! fields and marks from [`oxvs_pipeline::regs`] (the agent's, so a rule id
//! is in the same register here as on a node). The text is plain `ovs-ofctl` syntax (numbers for
//! tables, so the same file also loads into Open vSwitch: `ovs-ofctl
//! add-flows br file`).
//!
//! ## Sizing
//!
//! [`ClusterSpec::for_flow_count`] picks a node shape for a target number of
//! flows (about 1k, 10k, 100k) and then adjusts the number of policies until
//! the generated table is within a few percent of the target. Real flow
//! counts are reported by [`count_flows`].
//!
//! ## Packets
//!
//! [`Cluster::packets`] produces Ethernet frames (IPv4 TCP/UDP with valid
//! checksums) between pods, each with its own 5-tuple: half of them are
//! traffic some policy allows (peer -> applied-to pod on a rule port), the
//! rest random pod pairs and ports (mostly denied where a pod is isolated,
//! allowed elsewhere). Local pods send on their own port with the gateway
//! MAC as destination (routed); remote pods' packets arrive decapsulated on
//! the tunnel port with the tunnel's virtual MAC as destination.
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod cni_bench;
pub mod policy_bench;
pub mod service_bench;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use oxvs_pipeline::{names, regs};

/// OpenFlow port of the VXLAN tunnel (Antrea: `antrea-tun0` = 1).
pub const TUNNEL_PORT: u32 = 1;
/// OpenFlow port of the host gateway (Antrea: `antrea-gw0` = 2).
pub const GATEWAY_PORT: u32 = 2;
/// OpenFlow port of the first local pod; pod `i` is on `FIRST_POD_PORT + i`.
pub const FIRST_POD_PORT: u32 = 3;
/// The conntrack zone of pod traffic (Antrea's default).
pub const CT_ZONE: u16 = 65520;
/// The destination MAC of routed packets sent to / received from the tunnel.
pub const VIRTUAL_MAC: [u8; 6] = [0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff];
/// Priority of NetworkPolicy rule flows (Kubernetes policies share one).
pub const POLICY_PRIORITY: u16 = 200;

/// A small, fast, seeded PRNG (SplitMix64). Deterministic across platforms.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator with the given seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0; returns 0 for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        ((self.next_u64() >> 11) % n as u64) as usize
    }

    /// True with probability `p_percent`/100.
    pub fn chance(&mut self, p_percent: u64) -> bool {
        self.next_u64() % 100 < p_percent
    }
}

/// The shape of the simulated cluster, as seen from one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Pods on this node.
    pub n_pods: usize,
    /// Other nodes (each: a /24 pod CIDR through the tunnel).
    pub n_remote_nodes: usize,
    /// Pods per remote node that policies may name as peers.
    pub pods_per_remote_node: usize,
    /// NetworkPolicies that select pods of this node.
    pub n_policies: usize,
    /// Local pods each policy applies to.
    pub pods_per_policy: usize,
    /// Peer pod IPs per rule (ingress sources / egress destinations).
    pub peers_per_rule: usize,
    /// Each rule allows 1..=this many L4 ports.
    pub max_ports_per_rule: usize,
    /// Seed of everything random.
    pub seed: u64,
}

impl ClusterSpec {
    /// A node shape for about `target` flows: the node size grows with the
    /// target (more pods and nodes), the rest is NetworkPolicy, with the
    /// number of policies adjusted until the generated table is within 3%
    /// of `target` (or as close as whole policies get).
    pub fn for_flow_count(target: usize) -> ClusterSpec {
        let (n_pods, n_remote_nodes, peers) = if target <= 2_000 {
            (30, 16, 8)
        } else if target <= 20_000 {
            (110, 100, 16)
        } else {
            (250, 1_000, 24)
        };
        let mut spec = ClusterSpec {
            n_pods,
            n_remote_nodes,
            pods_per_remote_node: 60,
            n_policies: 1,
            pods_per_policy: 4,
            peers_per_rule: peers,
            max_ports_per_rule: 3,
            seed: 0x0a5e_ed00 ^ target as u64,
        };
        let base = count_flows(&Cluster::new(spec.clone()).flows());
        if base >= target {
            return spec;
        }
        // Each policy adds roughly 2 * (peers + 3) flows; refine by measuring.
        spec.n_policies = ((target - base) / (2 * (peers + 3))).max(1);
        for _ in 0..8 {
            let n = count_flows(&Cluster::new(spec.clone()).flows());
            let err = n.abs_diff(target);
            if err * 100 <= target * 3 {
                break;
            }
            let per_policy = (n.saturating_sub(base) as f64 / spec.n_policies as f64).max(1.0);
            let wanted = (target.saturating_sub(base) as f64 / per_policy).round() as usize;
            if wanted.max(1) == spec.n_policies {
                break;
            }
            spec.n_policies = wanted.max(1);
        }
        spec
    }
}

/// A pod: where it is and its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pod {
    /// 0 = this node, `j >= 1` = remote node `j`.
    pub node: usize,
    pub ip: [u8; 4],
    pub mac: [u8; 6],
    /// OpenFlow port (local pods only; remote pods: the tunnel port).
    pub ofport: u32,
}

/// An L4 port a rule allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct L4Port {
    /// 6 = TCP, 17 = UDP.
    pub proto: u8,
    pub port: u16,
}

/// One direction of a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Conjunction id (unique over the node).
    pub conj_id: u32,
    /// Peer pods (indices into [`Cluster::pods`]).
    pub peers: Vec<usize>,
    /// An ipBlock peer `(network, prefix length)`, if any.
    pub cidr: Option<([u8; 4], u8)>,
    pub ports: Vec<L4Port>,
}

/// A NetworkPolicy with one ingress and one egress rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Local pods it applies to (indices into [`Cluster::pods`]).
    pub applied_to: Vec<usize>,
    pub ingress: Rule,
    pub egress: Rule,
}

/// A packet as it arrives at the switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packet {
    pub in_port: u32,
    pub frame: Vec<u8>,
}

/// The generated cluster: pods, nodes, policies (see the module doc).
#[derive(Clone, Debug)]
pub struct Cluster {
    pub spec: ClusterSpec,
    /// Local pods first (`0..spec.n_pods`), then remote pods.
    pub pods: Vec<Pod>,
    pub policies: Vec<Policy>,
}

/// Well-known service ports policies pick from (protocol, port).
const COMMON_PORTS: [L4Port; 10] = [
    L4Port { proto: 6, port: 80 },
    L4Port {
        proto: 6,
        port: 443,
    },
    L4Port {
        proto: 6,
        port: 8080,
    },
    L4Port {
        proto: 17,
        port: 53,
    },
    L4Port {
        proto: 6,
        port: 5432,
    },
    L4Port {
        proto: 6,
        port: 6379,
    },
    L4Port {
        proto: 6,
        port: 9090,
    },
    L4Port {
        proto: 6,
        port: 3306,
    },
    L4Port {
        proto: 6,
        port: 8443,
    },
    L4Port {
        proto: 6,
        port: 27017,
    },
];

/// The pod CIDR network of node `j` (0 = this node): `10.(64 + j/256).(j%256).0/24`.
pub fn node_cidr(node: usize) -> [u8; 4] {
    [10, 64 + (node / 256) as u8, (node % 256) as u8, 0]
}

/// The gateway IP of node `j`: the first address of its pod CIDR.
pub fn gateway_ip(node: usize) -> [u8; 4] {
    let c = node_cidr(node);
    [c[0], c[1], c[2], 1]
}

/// The underlay (transport) IP of node `j`: `172.16.0.0/12`.
pub fn node_ip(node: usize) -> [u8; 4] {
    let n = node + 1;
    [172, 16 + (n >> 16) as u8, (n >> 8) as u8, n as u8]
}

/// The MAC of this node's gateway.
pub const GATEWAY_MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0x40, 0x00, 0x01];

fn pod_mac(ip: [u8; 4]) -> [u8; 6] {
    [0x0a, 0x58, ip[0], ip[1], ip[2], ip[3]]
}

/// `a.b.c.d`.
pub fn fmt_ip(ip: [u8; 4]) -> String {
    format!("{}.{}.{}.{}", ip[0], ip[1], ip[2], ip[3])
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// Number of flows in flow text (non-blank lines that are not `#` comments).
pub fn count_flows(text: &str) -> usize {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .count()
}

/// Flow text for one node with `n_pods` local pods, `n_policies`
/// NetworkPolicies and `n_remote_nodes` other nodes (other parameters as in
/// [`ClusterSpec::for_flow_count`]'s mid-size shape).
pub fn antrea_like_flows(n_pods: usize, n_policies: usize, n_remote_nodes: usize) -> String {
    Cluster::new(ClusterSpec {
        n_pods,
        n_remote_nodes,
        pods_per_remote_node: 60,
        n_policies,
        pods_per_policy: 4,
        peers_per_rule: 16,
        max_ports_per_rule: 3,
        seed: 1,
    })
    .flows()
}

/// The generated flows grouped by (table, priority, match) so that identical
/// matches merge their actions (conjunctions).
#[derive(Default)]
struct FlowSet {
    /// Flows in insertion order: (table, priority, match) -> actions.
    order: Vec<(u8, u16, String)>,
    actions: BTreeMap<(u8, u16, String), Vec<String>>,
}

impl FlowSet {
    fn add(&mut self, table: names::TableDef, priority: u16, matches: &str, actions: &str) {
        let k = (table.id, priority, matches.to_string());
        match self.actions.get_mut(&k) {
            Some(a) => {
                if !a.iter().any(|x| x == actions) {
                    a.push(actions.to_string());
                }
            }
            None => {
                self.order.push(k.clone());
                self.actions.insert(k, vec![actions.to_string()]);
            }
        }
    }

    fn render(&self) -> String {
        let mut out = String::with_capacity(self.order.len() * 120);
        for k in &self.order {
            let (table, prio, m) = k;
            let acts = self.actions.get(k).map(|a| a.join(",")).unwrap_or_default();
            let sep = if m.is_empty() { "" } else { "," };
            let _ = writeln!(out, "table={table},priority={prio}{sep}{m} actions={acts}");
        }
        out
    }
}

fn goto(t: names::TableDef) -> String {
    format!("goto_table:{}", t.id)
}

impl Cluster {
    /// Builds the cluster model for `spec` (deterministic in `spec.seed`).
    pub fn new(spec: ClusterSpec) -> Cluster {
        let mut rng = Rng::new(spec.seed);
        let mut pods = Vec::new();
        let n_local = spec.n_pods.min(250);
        for i in 0..n_local {
            let c = node_cidr(0);
            let ip = [c[0], c[1], c[2], (i + 2) as u8];
            pods.push(Pod {
                node: 0,
                ip,
                mac: pod_mac(ip),
                ofport: FIRST_POD_PORT + i as u32,
            });
        }
        for j in 1..=spec.n_remote_nodes {
            for x in 0..spec.pods_per_remote_node.min(250) {
                let c = node_cidr(j);
                let ip = [c[0], c[1], c[2], (x + 2) as u8];
                pods.push(Pod {
                    node: j,
                    ip,
                    mac: pod_mac(ip),
                    ofport: TUNNEL_PORT,
                });
            }
        }
        let mut policies = Vec::with_capacity(spec.n_policies);
        let mut next_conj = 1u32;
        for _ in 0..spec.n_policies {
            let mut applied_to = Vec::new();
            for _ in 0..spec.pods_per_policy.min(n_local) {
                let p = rng.below(n_local);
                if !applied_to.contains(&p) {
                    applied_to.push(p);
                }
            }
            let mut rule = |rng: &mut Rng| {
                let mut peers = Vec::new();
                for _ in 0..spec.peers_per_rule {
                    // Peers: mostly pods elsewhere in the cluster, some local.
                    let p = if n_local > 0 && rng.chance(20) {
                        rng.below(n_local)
                    } else {
                        rng.below(pods.len())
                    };
                    if !peers.contains(&p) {
                        peers.push(p);
                    }
                }
                let cidr = rng
                    .chance(25)
                    .then(|| ([192, 168, rng.below(256) as u8, 0], 24u8));
                let mut ports = Vec::new();
                let n_ports = 1 + rng.below(spec.max_ports_per_rule.max(1));
                for _ in 0..n_ports {
                    let p = if rng.chance(30) {
                        L4Port {
                            proto: 6,
                            port: 10_000 + rng.below(20_000) as u16,
                        }
                    } else {
                        COMMON_PORTS[rng.below(COMMON_PORTS.len())]
                    };
                    if !ports.contains(&p) {
                        ports.push(p);
                    }
                }
                let r = Rule {
                    conj_id: next_conj,
                    peers,
                    cidr,
                    ports,
                };
                next_conj += 1;
                r
            };
            let ingress = rule(&mut rng);
            let egress = rule(&mut rng);
            policies.push(Policy {
                applied_to,
                ingress,
                egress,
            });
        }
        Cluster {
            spec,
            pods,
            policies,
        }
    }

    /// Local pods (this node's).
    pub fn local_pods(&self) -> &[Pod] {
        &self.pods[..self.spec.n_pods.min(250).min(self.pods.len())]
    }

    /// The flow text of this node, one flow per line, in `ovs-ofctl add-flows` syntax.
    pub fn flows(&self) -> String {
        use names::*;
        let mut f = FlowSet::default();
        let gw_mac = fmt_mac(GATEWAY_MAC);
        let vmac = fmt_mac(VIRTUAL_MAC);
        let gw_ip = fmt_ip(gateway_ip(0));

        // Classifier: where did the packet come from?
        f.add(
            CLASSIFIER,
            200,
            &format!("in_port={TUNNEL_PORT}"),
            &format!(
                "{},{},{}",
                regs::FROM_TUNNEL.load(),
                regs::REWRITE_MAC_MARK.load(),
                goto(CONNTRACK_ZONE)
            ),
        );
        f.add(
            CLASSIFIER,
            200,
            &format!("in_port={GATEWAY_PORT}"),
            &format!("{},{}", regs::FROM_GATEWAY.load(), goto(SPOOF_GUARD)),
        );
        for p in self.local_pods() {
            f.add(
                CLASSIFIER,
                190,
                &format!("in_port={}", p.ofport),
                &format!("{},{}", regs::FROM_POD.load(), goto(SPOOF_GUARD)),
            );
        }
        f.add(CLASSIFIER, 0, "", "drop");

        // SpoofGuard: a pod port may only use its own MAC and IP.
        f.add(
            SPOOF_GUARD,
            200,
            &format!("ip,in_port={GATEWAY_PORT}"),
            &goto(CONNTRACK_ZONE),
        );
        f.add(
            SPOOF_GUARD,
            200,
            &format!("arp,in_port={GATEWAY_PORT}"),
            &goto(ARP_RESPONDER),
        );
        for p in self.local_pods() {
            let (ip, mac) = (fmt_ip(p.ip), fmt_mac(p.mac));
            f.add(
                SPOOF_GUARD,
                200,
                &format!("ip,in_port={},dl_src={mac},nw_src={ip}", p.ofport),
                &goto(CONNTRACK_ZONE),
            );
            f.add(
                SPOOF_GUARD,
                200,
                &format!("arp,in_port={},arp_spa={ip},arp_sha={mac}", p.ofport),
                &goto(ARP_RESPONDER),
            );
        }
        f.add(SPOOF_GUARD, 0, "", "drop");

        // ARPResponder: answer for the local gateway, forward the rest.
        f.add(
            ARP_RESPONDER,
            200,
            &format!("arp,arp_tpa={gw_ip},arp_op=1"),
            &format!(
                "move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:{gw_mac}->eth_src,\
                 set_field:2->arp_op,move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],\
                 set_field:{gw_mac}->arp_sha,move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],\
                 set_field:{gw_ip}->arp_spa,output:in_port"
            ),
        );
        f.add(ARP_RESPONDER, 190, "arp", &goto(L2_FORWARDING_CALC));
        f.add(ARP_RESPONDER, 0, "", "drop");

        // Conntrack.
        f.add(
            CONNTRACK_ZONE,
            200,
            "ip",
            &format!("ct(table={},zone={CT_ZONE})", CONNTRACK_STATE.id),
        );
        f.add(CONNTRACK_ZONE, 0, "", &goto(CONNTRACK_STATE));
        f.add(CONNTRACK_STATE, 200, "ct_state=+inv+trk,ip", "drop");
        f.add(
            CONNTRACK_STATE,
            190,
            "ct_state=-new+trk,ip",
            &goto(L3_FORWARDING),
        );
        f.add(CONNTRACK_STATE, 0, "", &goto(EGRESS_RULE));

        // NetworkPolicy.
        self.policy_flows(&mut f);

        // L3Forwarding: local pods, the gateway, remote pod CIDRs.
        f.add(
            L3_FORWARDING,
            210,
            &format!("ip,nw_dst={gw_ip}"),
            &format!("set_field:{gw_mac}->eth_dst,{}", goto(L2_FORWARDING_CALC)),
        );
        for p in self.local_pods() {
            f.add(
                L3_FORWARDING,
                200,
                &format!("ip,nw_dst={}", fmt_ip(p.ip)),
                &format!(
                    "set_field:{gw_mac}->eth_src,set_field:{}->eth_dst,{},{}",
                    fmt_mac(p.mac),
                    regs::REWRITE_MAC_MARK.load(),
                    goto(L3_DEC_TTL)
                ),
            );
        }
        for j in 1..=self.spec.n_remote_nodes {
            f.add(
                L3_FORWARDING,
                200,
                &format!("ip,nw_dst={}/24", fmt_ip(node_cidr(j))),
                &format!(
                    "set_field:{gw_mac}->eth_src,set_field:{vmac}->eth_dst,\
                     set_field:{}->tun_dst,{},{}",
                    fmt_ip(node_ip(j)),
                    regs::REWRITE_MAC_MARK.load(),
                    goto(L3_DEC_TTL)
                ),
            );
        }
        f.add(L3_FORWARDING, 0, "", &goto(L2_FORWARDING_CALC));

        // L3DecTTL: routed packets lose a hop, except those from the gateway.
        f.add(
            L3_DEC_TTL,
            210,
            &format!("ip,{}", regs::FROM_GATEWAY.matching()),
            &goto(L2_FORWARDING_CALC),
        );
        f.add(
            L3_DEC_TTL,
            200,
            &format!("ip,{}", regs::REWRITE_MAC_MARK.matching()),
            &format!("dec_ttl,{}", goto(L2_FORWARDING_CALC)),
        );
        f.add(L3_DEC_TTL, 0, "", &goto(L2_FORWARDING_CALC));

        // L2ForwardingCalc: destination MAC -> output port.
        let l2 = |f: &mut FlowSet, mac: &str, port: u32| {
            f.add(
                L2_FORWARDING_CALC,
                200,
                &format!("dl_dst={mac}"),
                &format!(
                    "{},{},{}",
                    regs::TARGET_OFPORT.load(port),
                    regs::OFPORT_FOUND_MARK.load(),
                    goto(INGRESS_RULE)
                ),
            );
        };
        l2(&mut f, &gw_mac, GATEWAY_PORT);
        l2(&mut f, &vmac, TUNNEL_PORT);
        for p in self.local_pods() {
            l2(&mut f, &fmt_mac(p.mac), p.ofport);
        }
        f.add(L2_FORWARDING_CALC, 0, "", &goto(INGRESS_RULE));

        // ConntrackCommit and Output.
        f.add(
            CONNTRACK_COMMIT,
            200,
            "ct_state=+new+trk,ip",
            &format!(
                "ct(commit,zone={CT_ZONE},exec(set_field:0x1->ct_mark)),{}",
                goto(OUTPUT)
            ),
        );
        f.add(CONNTRACK_COMMIT, 0, "", &goto(OUTPUT));
        f.add(
            OUTPUT,
            200,
            &regs::OFPORT_FOUND_MARK.matching(),
            &format!("output:{}", regs::TARGET_OFPORT.nxm()),
        );
        f.add(OUTPUT, 0, "", "drop");
        f.render()
    }

    fn policy_flows(&self, f: &mut FlowSet) {
        use names::*;
        let prio = POLICY_PRIORITY;
        let mut isolated_in = Vec::new();
        let mut isolated_out = Vec::new();
        let port_match = |p: &L4Port| {
            let proto = if p.proto == 17 { "udp" } else { "tcp" };
            format!("{proto},tp_dst={}", p.port)
        };
        for pol in &self.policies {
            // Ingress: peers -> applied-to pods.
            let r = &pol.ingress;
            let c = r.conj_id;
            for &peer in &r.peers {
                f.add(
                    INGRESS_RULE,
                    prio,
                    &format!("ip,nw_src={}", fmt_ip(self.pods[peer].ip)),
                    &format!("conjunction({c},1/3)"),
                );
            }
            if let Some((net, len)) = r.cidr {
                f.add(
                    INGRESS_RULE,
                    prio,
                    &format!("ip,nw_src={}/{len}", fmt_ip(net)),
                    &format!("conjunction({c},1/3)"),
                );
            }
            for &a in &pol.applied_to {
                f.add(
                    INGRESS_RULE,
                    prio,
                    &format!("ip,{}", regs::TARGET_OFPORT.matching(self.pods[a].ofport)),
                    &format!("conjunction({c},2/3)"),
                );
                if !isolated_in.contains(&a) {
                    isolated_in.push(a);
                }
            }
            for p in &r.ports {
                f.add(
                    INGRESS_RULE,
                    prio,
                    &port_match(p),
                    &format!("conjunction({c},3/3)"),
                );
            }
            f.add(
                INGRESS_RULE,
                prio,
                &format!("conj_id={c},ip"),
                &format!("{},{}", regs::INGRESS_RULE.load(c), goto(INGRESS_METRIC)),
            );
            f.add(
                INGRESS_METRIC,
                200,
                &format!("ip,{}", regs::INGRESS_RULE.matching(c)),
                &goto(CONNTRACK_COMMIT),
            );

            // Egress: applied-to pods -> peers.
            let r = &pol.egress;
            let c = r.conj_id;
            for &a in &pol.applied_to {
                f.add(
                    EGRESS_RULE,
                    prio,
                    &format!("ip,in_port={}", self.pods[a].ofport),
                    &format!("conjunction({c},1/3)"),
                );
                if !isolated_out.contains(&a) {
                    isolated_out.push(a);
                }
            }
            for &peer in &r.peers {
                f.add(
                    EGRESS_RULE,
                    prio,
                    &format!("ip,nw_dst={}", fmt_ip(self.pods[peer].ip)),
                    &format!("conjunction({c},2/3)"),
                );
            }
            if let Some((net, len)) = r.cidr {
                f.add(
                    EGRESS_RULE,
                    prio,
                    &format!("ip,nw_dst={}/{len}", fmt_ip(net)),
                    &format!("conjunction({c},2/3)"),
                );
            }
            for p in &r.ports {
                f.add(
                    EGRESS_RULE,
                    prio,
                    &port_match(p),
                    &format!("conjunction({c},3/3)"),
                );
            }
            f.add(
                EGRESS_RULE,
                prio,
                &format!("conj_id={c},ip"),
                &format!("{},{}", regs::EGRESS_RULE.load(c), goto(EGRESS_METRIC)),
            );
            f.add(
                EGRESS_METRIC,
                200,
                &format!("ip,{}", regs::EGRESS_RULE.matching(c)),
                &goto(L3_FORWARDING),
            );
        }
        f.add(EGRESS_RULE, 0, "", &goto(EGRESS_DEFAULT_RULE));
        f.add(INGRESS_RULE, 0, "", &goto(INGRESS_DEFAULT_RULE));
        // Default deny for every pod some policy selects.
        isolated_out.sort_unstable();
        isolated_in.sort_unstable();
        for &a in &isolated_out {
            f.add(
                EGRESS_DEFAULT_RULE,
                200,
                &format!("ip,in_port={}", self.pods[a].ofport),
                "drop",
            );
        }
        for &a in &isolated_in {
            f.add(
                INGRESS_DEFAULT_RULE,
                200,
                &format!("ip,{}", regs::TARGET_OFPORT.matching(self.pods[a].ofport)),
                "drop",
            );
        }
        f.add(EGRESS_DEFAULT_RULE, 0, "", &goto(EGRESS_METRIC));
        f.add(INGRESS_DEFAULT_RULE, 0, "", &goto(INGRESS_METRIC));
        f.add(EGRESS_METRIC, 0, "", &goto(L3_FORWARDING));
        f.add(INGRESS_METRIC, 0, "", &goto(CONNTRACK_COMMIT));
    }

    /// `n` packets with distinct 5-tuples (see the module doc), deterministic in `seed`.
    pub fn packets(&self, n: usize, seed: u64) -> Vec<Packet> {
        self.packets_from(n, seed, 0)
    }

    /// [`Cluster::packets`] with every source port moved by `sport_shift`:
    /// the same pod pairs and destination ports (so the same megaflows)
    /// with different 5-tuples (so different exact-match keys).
    pub fn packets_from(&self, n: usize, seed: u64, sport_shift: u16) -> Vec<Packet> {
        let mut rng = Rng::new(seed);
        let n_local = self.local_pods().len();
        let mut out = Vec::with_capacity(n);
        if n_local == 0 || self.pods.is_empty() {
            return out;
        }
        for i in 0..n {
            // Distinct source ports make distinct 5-tuples (i < 2^16 * pairs).
            let sport = 1024 + ((i as u64 * 7919 + u64::from(sport_shift)) % 64_000) as u16;
            let (src, dst, l4) = if !self.policies.is_empty() && rng.chance(50) {
                // Allowed by an ingress or egress rule of some policy.
                let pol = &self.policies[rng.below(self.policies.len())];
                let applied = pol.applied_to[rng.below(pol.applied_to.len())];
                if rng.chance(50) && !pol.ingress.peers.is_empty() {
                    let r = &pol.ingress;
                    let peer = r.peers[rng.below(r.peers.len())];
                    (peer, applied, r.ports[rng.below(r.ports.len())])
                } else {
                    let r = &pol.egress;
                    let peer = if r.peers.is_empty() {
                        rng.below(self.pods.len())
                    } else {
                        r.peers[rng.below(r.peers.len())]
                    };
                    (applied, peer, r.ports[rng.below(r.ports.len())])
                }
            } else {
                // Random pair, at least one end local.
                let a = rng.below(n_local);
                let b = rng.below(self.pods.len());
                let l4 = if rng.chance(20) {
                    L4Port {
                        proto: 17,
                        port: 53,
                    }
                } else if rng.chance(50) {
                    COMMON_PORTS[rng.below(COMMON_PORTS.len())]
                } else {
                    L4Port {
                        proto: 6,
                        port: 1 + rng.below(65_535) as u16,
                    }
                };
                if rng.chance(50) {
                    (a, b, l4)
                } else {
                    (b, a, l4)
                }
            };
            out.push(self.packet(src, dst, l4, sport));
        }
        out
    }

    /// A packet from pod `src` to pod `dst` (indices into [`Cluster::pods`]):
    /// a local sender sends on its own port to the gateway MAC (routed); a
    /// remote sender's packet arrives decapsulated on the tunnel port,
    /// addressed to [`VIRTUAL_MAC`]. TCP packets are SYNs.
    pub fn packet(&self, src: usize, dst: usize, l4: L4Port, sport: u16) -> Packet {
        let (s, d) = (&self.pods[src], &self.pods[dst]);
        let (in_port, dl_src, dl_dst) = if s.node == 0 {
            (s.ofport, s.mac, GATEWAY_MAC)
        } else {
            (TUNNEL_PORT, GATEWAY_MAC, VIRTUAL_MAC)
        };
        let frame = build_frame(&FrameSpec {
            dl_src,
            dl_dst,
            nw_src: s.ip,
            nw_dst: d.ip,
            proto: l4.proto,
            tp_src: sport,
            tp_dst: l4.port,
            ttl: 64,
            payload_len: 18,
        });
        Packet { in_port, frame }
    }
}

/// The key of the second pass of a packet whose first translation ended in
/// `ct(...)` + `Recirc(id)`: the first pass's metadata and header writes
/// (`LoadMeta`, `Set`) applied to `key`, `recirc_id = id`, and the
/// tracker's verdict `ct_state` in zone [`CT_ZONE`] (what the datapath does
/// after the connection tracker ran). `None` if `pass1` does not recirculate.
pub fn recirculated_key(
    key: &oxvs_pipeline::FlowKey,
    pass1: &oxvs_pipeline::xlate::Translation,
    ct_state: u32,
) -> Option<oxvs_pipeline::FlowKey> {
    use oxvs_pipeline::odp::DpAction;
    use oxvs_pipeline::Field;
    let mut k = *key;
    let mut recirc = None;
    for a in &pass1.actions {
        match a {
            DpAction::LoadMeta { field, value } | DpAction::Set { field, value } => {
                k.set(*field, *value)
            }
            DpAction::Recirc(id) => recirc = Some(*id),
            _ => {}
        }
    }
    let id = recirc?;
    k.set(Field::RecircId, u128::from(id));
    k.set(Field::CtState, u128::from(ct_state));
    k.set(Field::CtZone, u128::from(CT_ZONE));
    Some(k)
}

/// What [`build_frame`] puts in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameSpec {
    pub dl_src: [u8; 6],
    pub dl_dst: [u8; 6],
    pub nw_src: [u8; 4],
    pub nw_dst: [u8; 4],
    /// 6 = TCP (a SYN), 17 = UDP; anything else: an IP packet of that
    /// protocol with `payload_len` zero bytes.
    pub proto: u8,
    pub tp_src: u16,
    pub tp_dst: u16,
    pub ttl: u8,
    pub payload_len: usize,
}

fn csum_add(mut sum: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    sum
}

fn csum_fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet + IPv4 + TCP/UDP frame with correct IP and L4 checksums.
pub fn build_frame(s: &FrameSpec) -> Vec<u8> {
    let l4_hdr = match s.proto {
        6 => 20,
        17 => 8,
        _ => 0,
    };
    let l4_len = l4_hdr + s.payload_len;
    let ip_len = 20 + l4_len;
    let mut f = Vec::with_capacity(14 + ip_len);
    f.extend_from_slice(&s.dl_dst);
    f.extend_from_slice(&s.dl_src);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    // IPv4 header.
    let ip_start = f.len();
    f.push(0x45);
    f.push(0);
    f.extend_from_slice(&(ip_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0]); // id 0, DF
    f.push(s.ttl);
    f.push(s.proto);
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&s.nw_src);
    f.extend_from_slice(&s.nw_dst);
    let c = csum_fold(csum_add(0, &f[ip_start..]));
    f[ip_start + 10..ip_start + 12].copy_from_slice(&c.to_be_bytes());
    // L4 header.
    let l4_start = f.len();
    match s.proto {
        6 => {
            f.extend_from_slice(&s.tp_src.to_be_bytes());
            f.extend_from_slice(&s.tp_dst.to_be_bytes());
            f.extend_from_slice(&1u32.to_be_bytes()); // seq
            f.extend_from_slice(&0u32.to_be_bytes()); // ack
            f.push(0x50); // data offset 5
            f.push(0x02); // SYN
            f.extend_from_slice(&64240u16.to_be_bytes());
            f.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent
        }
        17 => {
            f.extend_from_slice(&s.tp_src.to_be_bytes());
            f.extend_from_slice(&s.tp_dst.to_be_bytes());
            f.extend_from_slice(&(l4_len as u16).to_be_bytes());
            f.extend_from_slice(&[0, 0]);
        }
        _ => {}
    }
    f.resize(f.len() + s.payload_len, 0);
    if l4_hdr > 0 {
        let mut sum = csum_add(0, &s.nw_src);
        sum = csum_add(sum, &s.nw_dst);
        sum += u32::from(s.proto) + l4_len as u32;
        let mut c = csum_fold(csum_add(sum, &f[l4_start..]));
        if s.proto == 17 && c == 0 {
            c = 0xffff;
        }
        let at = l4_start + if s.proto == 6 { 16 } else { 6 };
        f[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_hit_their_targets() {
        for target in [1_000usize, 10_000] {
            let spec = ClusterSpec::for_flow_count(target);
            let n = count_flows(&Cluster::new(spec.clone()).flows());
            assert!(
                n.abs_diff(target) * 100 <= target * 5,
                "target {target}: got {n} flows with {spec:?}"
            );
        }
    }

    #[test]
    fn deterministic_and_merged() {
        let c = Cluster::new(ClusterSpec::for_flow_count(1_000));
        let a = c.flows();
        assert_eq!(a, Cluster::new(c.spec.clone()).flows());
        // No two lines share (table, priority, match): conjunctions merged.
        let mut seen = std::collections::HashSet::new();
        for l in a.lines() {
            let head = l.split(" actions=").next().unwrap_or("");
            assert!(seen.insert(head.to_string()), "duplicate match: {l}");
        }
        // Every conjunction id has all three clauses and an action flow.
        for p in &c.policies {
            for r in [&p.ingress, &p.egress] {
                for k in 1..=3 {
                    let needle = format!("conjunction({},{k}/3)", r.conj_id);
                    assert!(a.contains(&needle), "missing {needle}");
                }
                assert!(a.contains(&format!("conj_id={},ip", r.conj_id)));
            }
        }
    }

    #[test]
    fn frames_have_valid_checksums() {
        let c = Cluster::new(ClusterSpec::for_flow_count(1_000));
        let pkts = c.packets(500, 7);
        assert_eq!(pkts.len(), 500);
        let mut tuples = std::collections::HashSet::new();
        for p in &pkts {
            let f = &p.frame;
            assert_eq!(&f[12..14], &[0x08, 0x00]);
            // IP header checksum verifies to zero.
            assert_eq!(csum_fold(csum_add(0, &f[14..34])), 0);
            let proto = f[23];
            let mut sum = csum_add(0, &f[26..34]);
            sum += u32::from(proto) + (f.len() - 34) as u32;
            assert_eq!(csum_fold(csum_add(sum, &f[34..])), 0, "L4 checksum");
            tuples.insert((f[26..38].to_vec(), proto));
        }
        assert!(
            tuples.len() >= 490,
            "only {} distinct 5-tuples",
            tuples.len()
        );
    }
}
pub mod plots;
pub mod process;
pub mod xbench;

/// A comma-separated list of counts (`100,1000`), for the benchmarks'
/// command lines; the error names the item that is not a count.
pub fn parse_counts(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .map_err(|e| format!("{x:?} is not a count: {e}"))
        })
        .collect()
}
