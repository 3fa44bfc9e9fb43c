//! # NetworkPolicy realisation benchmark
//!
//! The library half of `policy-bench` (`src/bin/policy-bench.rs`): a
//! synthetic app-tier cluster ([`Model`]), the in-process measurement of
//! policy realisation per node ([`realise`]), the datapath throughput with
//! and without policies ([`datapath_pps`]), and the manifests plus expected
//! flow counts for the end-to-end run on `oxvs-lab` ([`lab_objects`],
//! [`expected_policy_flows`]).
//!
//! ## The model (`ModelSpec` -> `Model`)
//!
//! `pods` pods in namespaces of `pods_per_namespace` (`pb-000`, ...; label
//! `team=t0..t4` and the automatic `kubernetes.io/metadata.name`). Pod `k`
//! of a namespace is `p<k>`, labels `app=a<k/6>`, `tier=web|api|db`
//! (`(k/2)%3`), container ports `http` TCP 8080 and `metrics` TCP 9090 (db
//! pods also `db` TCP 5432). Pod `j` (global) runs on node `node-(1 + j %
//! nodes)`; node `n` has pod CIDR `10.n.0.0/16` (gateway `.0.1`, pods from
//! `.0.2`), InternalIP `192.168.77.(10+n)`; local pod `i` is on OpenFlow port
//! `3 + i` (1 = tunnel, 2 = gateway).
//!
//! Policy `k` lives in namespace `k % namespaces` and selects one (app,
//! tier) of it; its rules depend on the tier, like an app-tier deployment:
//! - web: ingress from `tier=web` pods of the namespaces with the next team
//!   label (namespaceSelector AND podSelector), and from the ipBlock
//!   `172.16.0.0/12` except `172.16.5.0/24`; TCP 8080 and TCP `10000+k`;
//! - api: ingress from the same app's web pods on the named port `http`;
//!   egress (isolated) to the same app's db pods on TCP 5432 and to every
//!   pod of `pb-000` on UDP 53;
//! - db: ingress from the same app's api pods on TCP 5432 and from every
//!   non-db pod of teams t0/t1 (`matchExpressions`: `team In`, `tier
//!   NotIn`) on the named port `metrics`.
//!
//! So the policies overlap (several select the same pods) and the flow
//! count grows with pods, peers and ports, not their product.
//!
//! ## What is timed, per node ([`realise`])
//!
//! The node first holds its base flows (node, pods, tunnel: what
//! `oxvs-agent` installs without policy). Then, as the agent and switch do
//! when policies arrive: `translate` = [`desired::policy_flows`] (the
//! policy part of the agent's [`desired::compute`]) for the node's local
//! pods; `diff` = the agent's line-set difference against the installed
//! lines and the bundle text; `parse` = the flow text
//! of the new lines parsed ([`parse_flow_file`]); `install` = one atomic
//! [`Pipeline::apply`] of the adds. `replace` is the other install path
//! (first sync / agent restart): [`Pipeline::replace_all`] of base + policy
//! on a pipeline holding the base. Realisation time of a node = translate +
//! diff + parse + install; of the cluster = the slowest node (nodes work in
//! parallel). The pipeline's heap growth is measured when the caller passes
//! a live-bytes probe (the binary's counting allocator).
//!
//! Everything is deterministic; no randomness. No function here panics on
//! its input; errors name what failed.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use oxvs_agent::cookie::Feature;
use oxvs_agent::desired::{self, Inputs, Tunnel};
use oxvs_agent::flows::{self as aflows, NodeNet, PodPort, RemoteNode};
use oxvs_agent::model::{
    ClusterState, ContainerPort, LabelSelector, Labels, Namespace, NetworkPolicy, Node, Peer,
    PolicyPort, PortRef, Protocol, Requirement, Rule, SelectorOp,
};
use oxvs_agent::policy::{self, LocalPod};
use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{CountingSink, Datapath, DatapathConfig, DpPacket, TunnelMeta};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::XlateEnv;
use serde_json::{json, Value};

use crate::{build_frame, FrameSpec};

/// OpenFlow port of the tunnel in the model.
pub const TUNNEL_OFPORT: u32 = 1;
/// OpenFlow port of the gateway in the model.
pub const GATEWAY_OFPORT: u32 = 2;
const TIERS: [&str; 3] = ["web", "api", "db"];
const TEAMS: usize = 5;

/// Errors of the benchmark library.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bad model {0}")]
    Spec(String),
    #[error("node {node}: flows do not parse: {msg}")]
    Parse { node: String, msg: String },
    #[error("node {node}: installing flows failed: {msg}")]
    Install { node: String, msg: String },
}

/// The shape of the synthetic cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    pub pods: usize,
    pub policies: usize,
    pub nodes: usize,
    pub pods_per_namespace: usize,
}

/// One node of the model.
#[derive(Clone, Debug)]
pub struct NodeModel {
    pub name: String,
    pub net: NodeNet,
    pub ports: Vec<PodPort>,
    pub local: Vec<LocalPod>,
    pub remotes: Vec<RemoteNode>,
    /// This node's underlay address (the tunnel guard covers it and every
    /// remote node's).
    pub node_ip: Option<IpAddr>,
    /// Install the tunnel guard ([`Tunnel::guard`]), as the agent does; off
    /// only to measure what it costs.
    pub tunnel_guard: bool,
}

impl NodeModel {
    /// What the agent of this node computes its flows from, in a cluster
    /// `state`: [`desired::compute`] of it is the node's flow set.
    pub fn inputs(&self, state: Arc<ClusterState>) -> Inputs {
        Inputs {
            pods: self.ports.clone(),
            tunnel: Some(Tunnel {
                ofport: TUNNEL_OFPORT,
                remotes: self.remotes.clone(),
                node_ip: self.node_ip,
                guard: self.tunnel_guard,
            }),
            state,
            local: self.local.clone(),
            ..Inputs::for_node(self.net.clone())
        }
    }
}

/// The cluster and its nodes.
#[derive(Clone, Debug)]
pub struct Model {
    pub spec: ModelSpec,
    pub state: ClusterState,
    pub nodes: Vec<NodeModel>,
}

fn labels(kv: &[(&str, &str)]) -> Labels {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn sel(kv: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: labels(kv),
        match_expressions: Vec::new(),
    }
}

fn tcp(p: u16) -> PolicyPort {
    PolicyPort {
        protocol: Protocol::Tcp,
        port: Some(PortRef::Number(p)),
        end_port: None,
    }
}

fn named(name: &str) -> PolicyPort {
    PolicyPort {
        protocol: Protocol::Tcp,
        port: Some(PortRef::Name(name.into())),
        end_port: None,
    }
}

fn ns_name(i: usize) -> String {
    format!("pb-{i:03}")
}

/// The NetworkPolicy number `k` of the model (see the module doc).
fn make_policy(k: usize, namespaces: usize, ppn: usize) -> NetworkPolicy {
    let ns = k % namespaces;
    // Only whole apps (6 pods: every tier twice): a trailing partial app
    // lacks tiers, and a policy for it would select nothing.
    let apps = (ppn / 6).max(1);
    let app = (k / namespaces) % apps;
    let tier = TIERS[(k / (namespaces * apps)) % 3];
    let app_l = format!("a{app}");
    let uniq = 10_000u16.saturating_add(u16::try_from(k % 50_000).unwrap_or(0));
    let (ingress, egress) = match tier {
        "web" => {
            let next_team = format!("t{}", (ns + 1) % TEAMS);
            (
                vec![Rule {
                    peers: vec![
                        Peer::Pods {
                            namespace_selector: Some(sel(&[("team", &next_team)])),
                            pod_selector: Some(sel(&[("tier", "web")])),
                        },
                        Peer::IpBlock {
                            cidr: Ipv4Net::new(Ipv4Addr::new(172, 16, 0, 0), 12)
                                .unwrap_or_default(),
                            except: vec![
                                Ipv4Net::new(Ipv4Addr::new(172, 16, 5, 0), 24).unwrap_or_default()
                            ],
                        },
                    ],
                    ports: vec![tcp(8080), tcp(uniq)],
                }],
                vec![],
            )
        }
        "api" => (
            vec![Rule {
                peers: vec![Peer::Pods {
                    namespace_selector: None,
                    pod_selector: Some(sel(&[("app", &app_l), ("tier", "web")])),
                }],
                ports: vec![named("http"), tcp(uniq)],
            }],
            vec![
                Rule {
                    peers: vec![Peer::Pods {
                        namespace_selector: None,
                        pod_selector: Some(sel(&[("app", &app_l), ("tier", "db")])),
                    }],
                    ports: vec![tcp(5432)],
                },
                Rule {
                    peers: vec![Peer::Pods {
                        namespace_selector: Some(sel(&[(
                            "kubernetes.io/metadata.name",
                            &ns_name(0),
                        )])),
                        pod_selector: None,
                    }],
                    ports: vec![PolicyPort {
                        protocol: Protocol::Udp,
                        port: Some(PortRef::Number(53)),
                        end_port: None,
                    }],
                },
            ],
        ),
        _ => (
            vec![
                Rule {
                    peers: vec![Peer::Pods {
                        namespace_selector: None,
                        pod_selector: Some(sel(&[("app", &app_l), ("tier", "api")])),
                    }],
                    ports: vec![tcp(5432), tcp(uniq)],
                },
                Rule {
                    peers: vec![Peer::Pods {
                        namespace_selector: Some(LabelSelector {
                            match_labels: Labels::new(),
                            match_expressions: vec![Requirement {
                                key: "team".into(),
                                op: SelectorOp::In,
                                values: vec!["t0".into(), "t1".into()],
                            }],
                        }),
                        pod_selector: Some(LabelSelector {
                            match_labels: Labels::new(),
                            match_expressions: vec![Requirement {
                                key: "tier".into(),
                                op: SelectorOp::NotIn,
                                values: vec!["db".into()],
                            }],
                        }),
                    }],
                    ports: vec![named("metrics")],
                },
            ],
            vec![],
        ),
    };
    let namespace = ns_name(ns);
    let name = format!("pol-{k:04}-{app_l}-{tier}");
    NetworkPolicy {
        uid: format!("uid-{namespace}-{name}"),
        namespace,
        name,
        pod_selector: sel(&[("app", &app_l), ("tier", tier)]),
        ingress_isolation: true,
        egress_isolation: !egress.is_empty(),
        ingress,
        egress,
    }
}

impl Model {
    /// Builds the model (see the module doc).
    pub fn new(spec: ModelSpec) -> Result<Model, BenchError> {
        if spec.nodes == 0 || spec.nodes > 200 {
            return Err(BenchError::Spec(format!(
                "nodes = {} (1..=200)",
                spec.nodes
            )));
        }
        if spec.pods == 0 || spec.pods_per_namespace == 0 {
            return Err(BenchError::Spec(format!(
                "pods = {}, pods per namespace = {} (both > 0)",
                spec.pods, spec.pods_per_namespace
            )));
        }
        if spec.pods / spec.nodes > 60_000 {
            return Err(BenchError::Spec(format!(
                "{} pods per node do not fit a /16",
                spec.pods / spec.nodes
            )));
        }
        let n_ns = spec.pods.div_ceil(spec.pods_per_namespace);
        let mut state = ClusterState::default();
        for i in 0..n_ns {
            let name = ns_name(i);
            let team = format!("t{}", i % TEAMS);
            state.namespaces.insert(
                name.clone(),
                Namespace {
                    labels: labels(&[("team", &team), ("kubernetes.io/metadata.name", &name)]),
                    name,
                },
            );
        }
        let mut nodes: Vec<NodeModel> = (1..=spec.nodes)
            .map(|n| {
                let n8 = n as u8; // n <= 200
                let pod_cidr = Ipv4Net::new(Ipv4Addr::new(10, n8, 0, 0), 16).unwrap_or_default();
                let gw = Ipv4Addr::new(10, n8, 0, 1);
                NodeModel {
                    name: format!("node-{n}"),
                    net: NodeNet {
                        ipv4: Some(aflows::NodeNet4 {
                            pod_cidr,
                            gateway_ip: gw,
                        }),
                        gateway_mac: aflows::pod_mac(gw),
                        gateway_ofport: GATEWAY_OFPORT,
                        ipv6: None,
                    },
                    ports: Vec::new(),
                    local: Vec::new(),
                    remotes: Vec::new(),
                    node_ip: None,
                    tunnel_guard: true,
                }
            })
            .collect();
        for (ni, n) in nodes.iter().enumerate() {
            state.nodes.insert(
                n.name.clone(),
                Node {
                    name: n.name.clone(),
                    pod_cidr: n.net.pod_cidr4(),
                    pod_cidr6: None,
                    internal_ip: Some(Ipv4Addr::new(192, 168, 77, 11 + ni as u8)),
                    internal_ip6: None,
                },
            );
        }
        for j in 0..spec.pods {
            let ns = ns_name(j / spec.pods_per_namespace);
            let k = j % spec.pods_per_namespace;
            let ni = j % spec.nodes;
            let node = &mut nodes[ni];
            let idx = node.ports.len() as u32;
            let host = u32::from(
                node.net
                    .ipv4
                    .as_ref()
                    .map_or(Ipv4Addr::UNSPECIFIED, |v4| v4.gateway_ip),
            ) + 1
                + idx;
            let ip = Ipv4Addr::from(host);
            let tier = TIERS[(k / 2) % 3];
            let mut ports = vec![
                ContainerPort {
                    name: Some("http".into()),
                    port: 8080,
                    protocol: Protocol::Tcp,
                },
                ContainerPort {
                    name: Some("metrics".into()),
                    port: 9090,
                    protocol: Protocol::Tcp,
                },
            ];
            if tier == "db" {
                ports.push(ContainerPort {
                    name: Some("db".into()),
                    port: 5432,
                    protocol: Protocol::Tcp,
                });
            }
            let name = format!("p{k:03}");
            let pod = oxvs_agent::model::Pod {
                namespace: ns.clone(),
                name: name.clone(),
                uid: format!("uid-{ns}-{name}"),
                labels: labels(&[("app", &format!("a{}", k / 6)), ("tier", tier)]),
                node_name: node.name.clone(),
                ip: Some(ip),
                host_network: false,
                ports,
                ip6: None,
            };
            let ofport = 3 + idx;
            node.ports.push(PodPort {
                ofport,
                ip: Some(ip),
                mac: aflows::pod_mac(ip),
                ip6: None,
            });
            node.local.push(LocalPod {
                namespace: ns.clone(),
                name: name.clone(),
                ip: Some(ip),
                ofport,
                ip6: None,
            });
            state.pods.insert((ns, name), pod);
        }
        let all: Vec<RemoteNode> = state
            .nodes
            .values()
            .filter_map(|n| {
                Some(RemoteNode {
                    name: n.name.clone(),
                    pod_cidr: Some(n.pod_cidr?),
                    ip: IpAddr::V4(n.internal_ip?),
                    pod_cidr6: None,
                })
            })
            .collect();
        for n in &mut nodes {
            n.remotes = all.iter().filter(|r| r.name != n.name).cloned().collect();
            n.node_ip = all.iter().find(|r| r.name == n.name).map(|r| r.ip);
        }
        for k in 0..spec.policies {
            let p = make_policy(k, n_ns, spec.pods_per_namespace);
            state.policies.insert(p.key(), p);
        }
        Ok(Model { spec, state, nodes })
    }

    /// The same cluster without any NetworkPolicy.
    /// The same cluster with the tunnel guard's flows left out.
    pub fn without_tunnel_guard(&self) -> Model {
        let mut m = self.clone();
        for n in &mut m.nodes {
            n.tunnel_guard = false;
        }
        m
    }

    pub fn without_policies(&self) -> Model {
        let mut m = self.clone();
        m.state.policies.clear();
        m.spec.policies = 0;
        m
    }
}

/// Counts the flows of `lines` that belong to NetworkPolicy (rule and
/// isolation cookies: [`Feature::PolicyRule`], [`Feature::Isolation`]).
pub fn is_policy_cookie(c: u64) -> bool {
    matches!(
        Feature::of(c),
        Some(Feature::PolicyRule | Feature::Isolation)
    )
}

/// Results for one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeResult {
    pub node: String,
    pub local_pods: usize,
    pub base_flows: usize,
    pub policy_flows: usize,
    /// Rules (conjunction ids) with flows on this node.
    pub rules: usize,
    /// Bytes of the policy flow text (one line each plus newline).
    pub text_bytes: usize,
    pub translate: Duration,
    pub diff: Duration,
    pub parse: Duration,
    pub install: Duration,
    pub replace: Duration,
    /// Live heap the installed policy flows added to the pipeline, if measured.
    pub heap_bytes: Option<i64>,
}

impl NodeResult {
    /// translate + diff + parse + install.
    pub fn realise(&self) -> Duration {
        self.translate + self.diff + self.parse + self.install
    }
}

fn mods(flows: Vec<oxvs_pipeline::flow::Flow>) -> Vec<FlowMod> {
    flows.into_iter().map(FlowMod::add).collect()
}

/// Installs `lines` into a fresh pipeline (untimed setup).
fn pipeline_with(node: &str, lines: &[String]) -> Result<Pipeline, BenchError> {
    let flows = parse_flow_file(&lines.join("\n"), &ParseContext::default()).map_err(|e| {
        BenchError::Parse {
            node: node.into(),
            msg: e.to_string(),
        }
    })?;
    let p = Pipeline::new();
    p.replace_all(&flows, 0).map_err(|e| BenchError::Install {
        node: node.into(),
        msg: e.to_string(),
    })?;
    Ok(p)
}

/// Realises the model's policies on every node (see the module doc).
/// `live_bytes`, if given, returns the process's live heap bytes.
pub fn realise(
    model: &Model,
    live_bytes: Option<&dyn Fn() -> i64>,
) -> Result<Vec<NodeResult>, BenchError> {
    let ctx = ParseContext::default();
    let state = Arc::new(model.state.clone());
    let mut out = Vec::with_capacity(model.nodes.len());
    for n in &model.nodes {
        let inputs = n.inputs(Arc::clone(&state));
        let base = desired::base_flows(&inputs);
        let pipeline = pipeline_with(&n.name, &base)?;
        let mut r = NodeResult {
            node: n.name.clone(),
            local_pods: n.local.len(),
            base_flows: base.len(),
            ..NodeResult::default()
        };

        let t = Instant::now();
        let pf = desired::policy_flows(&inputs);
        r.translate = t.elapsed();
        r.policy_flows = pf.flows.len();
        r.rules = pf.rules.len();
        r.text_bytes = pf.flows.iter().map(|l| l.len() + 1).sum();

        // The agent's diff: desired line set against the applied one.
        let t = Instant::now();
        let applied: HashSet<&String> = base.iter().collect();
        let want: HashSet<&String> = base.iter().chain(pf.flows.iter()).collect();
        let mut bundle = String::new();
        let mut added: Vec<&str> = Vec::new();
        for l in want.difference(&applied) {
            bundle.push_str("add ");
            bundle.push_str(l);
            bundle.push('\n');
            added.push(l.as_str());
        }
        r.diff = t.elapsed();
        drop(bundle);
        let text = added.join("\n");

        let before = live_bytes.map(|f| f());
        let t = Instant::now();
        let flows = parse_flow_file(&text, &ctx).map_err(|e| BenchError::Parse {
            node: n.name.clone(),
            msg: e.to_string(),
        })?;
        r.parse = t.elapsed();
        let m = mods(flows);
        let t = Instant::now();
        pipeline.apply(&m, 1).map_err(|e| BenchError::Install {
            node: n.name.clone(),
            msg: e.to_string(),
        })?;
        r.install = t.elapsed();
        drop(m);
        if let (Some(f), Some(b)) = (live_bytes, before) {
            r.heap_bytes = Some(f() - b);
        }
        let installed = pipeline.snapshot().flow_count();
        if installed != base.len() + pf.flows.len() {
            return Err(BenchError::Install {
                node: n.name.clone(),
                msg: format!(
                    "{installed} flows installed, expected {} base + {} policy",
                    base.len(),
                    pf.flows.len()
                ),
            });
        }
        drop(pipeline);

        // The replace-flows path (agent start / restart).
        let pipeline = pipeline_with(&n.name, &base)?;
        let all: Vec<String> = base.iter().chain(pf.flows.iter()).cloned().collect();
        let flows = parse_flow_file(&all.join("\n"), &ctx).map_err(|e| BenchError::Parse {
            node: n.name.clone(),
            msg: e.to_string(),
        })?;
        let t = Instant::now();
        pipeline
            .replace_all(&flows, 2)
            .map_err(|e| BenchError::Install {
                node: n.name.clone(),
                msg: e.to_string(),
            })?;
        r.replace = t.elapsed();
        out.push(r);
    }
    Ok(out)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// One (pods, policies) point of the in-process matrix, summarised.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub spec: ModelSpec,
    pub nodes: Vec<NodeResult>,
}

impl Summary {
    fn max_of(&self, f: impl Fn(&NodeResult) -> Duration) -> Duration {
        self.nodes.iter().map(f).max().unwrap_or_default()
    }
    fn mean_of(&self, f: impl Fn(&NodeResult) -> usize) -> f64 {
        if self.nodes.is_empty() {
            return 0.0;
        }
        self.nodes.iter().map(f).sum::<usize>() as f64 / self.nodes.len() as f64
    }
    /// Cluster realisation time: the slowest node.
    pub fn realise_max(&self) -> Duration {
        self.max_of(NodeResult::realise)
    }
    /// Sum over nodes (one CPU doing every node's work).
    pub fn realise_sum(&self) -> Duration {
        self.nodes.iter().map(NodeResult::realise).sum()
    }
    pub fn policy_flows_max(&self) -> usize {
        self.nodes.iter().map(|n| n.policy_flows).max().unwrap_or(0)
    }
    pub fn policy_flows_mean(&self) -> f64 {
        self.mean_of(|n| n.policy_flows)
    }
    /// Mean per node of the heap growth, bytes.
    pub fn heap_mean(&self) -> Option<f64> {
        let v: Option<Vec<i64>> = self.nodes.iter().map(|n| n.heap_bytes).collect();
        let v = v?;
        (!v.is_empty()).then(|| v.iter().sum::<i64>() as f64 / v.len() as f64)
    }

    /// One row of the results table.
    pub fn row(&self) -> Vec<String> {
        let per_pol = |x: f64| {
            if self.spec.policies == 0 {
                "-".to_string()
            } else {
                format!("{:.0}", x / self.spec.policies as f64)
            }
        };
        let heap = self.heap_mean();
        vec![
            self.spec.pods.to_string(),
            self.spec.policies.to_string(),
            format!("{}", self.nodes.len()),
            format!("{:.0}", self.policy_flows_mean()),
            self.policy_flows_max().to_string(),
            format!("{:.2}", ms(self.max_of(|n| n.translate))),
            format!("{:.2}", ms(self.max_of(|n| n.diff))),
            format!("{:.2}", ms(self.max_of(|n| n.parse))),
            format!("{:.2}", ms(self.max_of(|n| n.install))),
            format!("{:.2}", ms(self.realise_max())),
            format!("{:.2}", ms(self.realise_sum())),
            format!("{:.2}", ms(self.max_of(|n| n.replace))),
            per_pol(self.mean_of(|n| n.text_bytes)),
            heap.map_or("-".into(), per_pol),
        ]
    }

    /// The table header matching [`Summary::row`].
    pub const HEADER: [&'static str; 14] = [
        "pods",
        "policies",
        "nodes",
        "flows/node",
        "max",
        "translate",
        "diff",
        "parse",
        "install",
        "realise(max)",
        "sum",
        "replace_all",
        "text B/pol/node",
        "heap B/pol/node",
    ];

    pub fn json(&self) -> Value {
        json!({
            "pods": self.spec.pods,
            "policies": self.spec.policies,
            "nodes": self.nodes.iter().map(|n| json!({
                "node": n.node,
                "local_pods": n.local_pods,
                "base_flows": n.base_flows,
                "policy_flows": n.policy_flows,
                "rules": n.rules,
                "text_bytes": n.text_bytes,
                "heap_bytes": n.heap_bytes,
                "translate_ms": ms(n.translate),
                "diff_ms": ms(n.diff),
                "parse_ms": ms(n.parse),
                "install_ms": ms(n.install),
                "realise_ms": ms(n.realise()),
                "replace_all_ms": ms(n.replace),
            })).collect::<Vec<_>>(),
            "realise_max_ms": ms(self.realise_max()),
            "realise_sum_ms": ms(self.realise_sum()),
        })
    }
}

/// Datapath throughput on one node.
#[derive(Clone, Debug, PartialEq)]
pub struct DpResult {
    pub policies: usize,
    pub emc: bool,
    pub flows: usize,
    pub packets: usize,
    /// Median over trials, packets per second.
    pub pps: f64,
    pub trials: Vec<f64>,
    /// Steady-state counters of one round over the packets.
    pub emc_hits: u64,
    pub megaflow_hits: u64,
    pub upcalls: u64,
    pub outputs: u64,
    pub drops: u64,
    pub megaflows: u64,
}

/// The traffic of node 0 (`node-1`): `n` TCP SYNs with distinct 5-tuples,
/// half from its local pods (to local pods switched, to remote pods
/// routed), half from remote pods through the tunnel; destination ports
/// cycle over 8080, 5432, 9090, 53/UDP and a policy's own port.
pub fn traffic(model: &Model, n: usize) -> Vec<DpPacket<Vec<u8>>> {
    let Some(node) = model.nodes.first() else {
        return Vec::new();
    };
    let pods: Vec<&oxvs_agent::model::Pod> = model.state.pods.values().collect();
    let remote: Vec<&&oxvs_agent::model::Pod> =
        pods.iter().filter(|p| p.node_name != node.name).collect();
    let mut out = Vec::with_capacity(n);
    if node.ports.is_empty() || pods.is_empty() {
        return out;
    }
    let gw_mac = node.net.gateway_mac;
    for i in 0..n {
        let local = &node.ports[(i / 2) % node.ports.len()];
        let peer = pods[(i * 7 + 3) % pods.len()];
        let (proto, dport) = match i % 5 {
            0 => (6, 8080),
            1 => (6, 5432),
            2 => (6, 9090),
            3 => (17, 53),
            _ => (6, 10_000 + (i % 1000) as u16),
        };
        let sport = 1024 + (i % 60_000) as u16;
        let peer_ip = peer.ip.unwrap_or(Ipv4Addr::UNSPECIFIED);
        let pkt = if i % 2 == 0 || remote.is_empty() {
            // From the local pod.
            let dl_dst = if model
                .nodes
                .first()
                .is_some_and(|n| n.ports.iter().any(|p| p.ip == Some(peer_ip)))
            {
                aflows::pod_mac(peer_ip)
            } else {
                gw_mac
            };
            let frame = build_frame(&FrameSpec {
                dl_src: local.mac,
                dl_dst,
                nw_src: local.ip.unwrap_or(Ipv4Addr::UNSPECIFIED).octets(),
                nw_dst: peer_ip.octets(),
                proto,
                tp_src: sport,
                tp_dst: dport,
                ttl: 64,
                payload_len: 18,
            });
            DpPacket::from_frame(&frame, local.ofport)
        } else {
            let src = remote[(i * 13) % remote.len()];
            let src_ip = src.ip.unwrap_or(Ipv4Addr::UNSPECIFIED);
            let frame = build_frame(&FrameSpec {
                dl_src: aflows::pod_mac(src_ip),
                dl_dst: aflows::VIRTUAL_MAC,
                nw_src: src_ip.octets(),
                nw_dst: local.ip.unwrap_or(Ipv4Addr::UNSPECIFIED).octets(),
                proto,
                tp_src: sport,
                tp_dst: dport,
                ttl: 63,
                payload_len: 18,
            });
            let mut p = DpPacket::from_frame(&frame, TUNNEL_OFPORT);
            let src_node = model
                .state
                .nodes
                .get(&src.node_name)
                .and_then(|n| n.internal_ip)
                .unwrap_or(Ipv4Addr::UNSPECIFIED);
            p.tunnel = Some(TunnelMeta::v4(0, u32::from(src_node), 0));
            p
        };
        out.push(pkt);
    }
    out
}

/// The traffic of [`traffic`] restricted to packets that `policies`'
/// flows on node 0 allow (each run alone through a fresh datapath), up to
/// `n` of them: the same work per packet with and without policy, so the
/// comparison measures the lookup cost, not fewer outputs.
pub fn allowed_traffic(policies: &Model, n: usize) -> Result<Vec<DpPacket<Vec<u8>>>, BenchError> {
    let Some(node) = policies.nodes.first() else {
        return Err(BenchError::Spec("no node".into()));
    };
    let lines = desired::compute(&node.inputs(Arc::new(policies.state.clone()))).lines;
    let pipeline = Arc::new(pipeline_with(&node.name, &lines)?);
    let mut ports = vec![TUNNEL_OFPORT, GATEWAY_OFPORT];
    ports.extend(node.ports.iter().map(|p| p.ofport));
    let mut dp = Datapath::new(
        pipeline,
        XlateEnv::with_ports(ports),
        DatapathConfig::default(),
    );
    let mut ct = Conntrack::new(CtConfig::default());
    let mut out = Vec::with_capacity(n);
    for p in traffic(policies, 4 * n) {
        let mut sink = CountingSink::default();
        let mut b = vec![p.clone()];
        dp.process_batch(&mut b, &mut ct, 1, &mut sink);
        if sink.outputs > 0 {
            out.push(p);
            if out.len() == n {
                break;
            }
        }
    }
    Ok(out)
}

/// Packets per `process_batch` call.
pub const BATCH: usize = 32;

/// `Datapath::process_batch` throughput on node 0 of `model` (its base
/// flows plus its policy flows), in steady state: `pkts` (distinct), warmed up for 3 rounds (connections tracked, caches filled),
/// then `trials` runs of `dur` each; only `process_batch` is timed (the
/// batch copy is not). `emc: false` disables the exact-match cache, so
/// every pass is a megaflow hit.
pub fn datapath_pps(
    model: &Model,
    pkts: &[DpPacket<Vec<u8>>],
    emc: bool,
    trials: usize,
    dur: Duration,
) -> Result<DpResult, BenchError> {
    let Some(node) = model.nodes.first() else {
        return Err(BenchError::Spec("no node".into()));
    };
    let lines = desired::compute(&node.inputs(Arc::new(model.state.clone()))).lines;
    let pipeline = Arc::new(pipeline_with(&node.name, &lines)?);
    let mut ports = vec![TUNNEL_OFPORT, GATEWAY_OFPORT];
    ports.extend(node.ports.iter().map(|p| p.ofport));
    let cfg = DatapathConfig {
        emc_entries: if emc {
            DatapathConfig::default().emc_entries
        } else {
            0
        },
        ..DatapathConfig::default()
    };
    let mut dp = Datapath::new(Arc::clone(&pipeline), XlateEnv::with_ports(ports), cfg);
    let mut ct = Conntrack::new(CtConfig::default());
    let mut sink = CountingSink::default();
    let now = 1_000_000_000u64;
    for _ in 0..3 {
        for chunk in pkts.chunks(BATCH) {
            let mut b = chunk.to_vec();
            dp.process_batch(&mut b, &mut ct, now, &mut sink);
        }
    }
    let s0 = dp.stats();
    for chunk in pkts.chunks(BATCH) {
        let mut b = chunk.to_vec();
        dp.process_batch(&mut b, &mut ct, now, &mut sink);
    }
    let s1 = dp.stats();
    let mut results = Vec::with_capacity(trials);
    for _ in 0..trials.max(1) {
        let mut spent = Duration::ZERO;
        let mut n = 0u64;
        let wall = Instant::now();
        while wall.elapsed() < dur {
            for chunk in pkts.chunks(BATCH) {
                let mut b = chunk.to_vec();
                let t = Instant::now();
                dp.process_batch(&mut b, &mut ct, now, &mut sink);
                spent += t.elapsed();
                n += chunk.len() as u64;
            }
        }
        results.push(n as f64 / spent.as_secs_f64().max(1e-9));
    }
    let mut sorted = results.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(DpResult {
        policies: model.spec.policies,
        emc,
        flows: lines.len(),
        packets: pkts.len(),
        pps: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        trials: results,
        emc_hits: s1.emc_hits - s0.emc_hits,
        megaflow_hits: s1.megaflow_hits - s0.megaflow_hits,
        upcalls: s1.upcalls - s0.upcalls,
        outputs: s1.outputs - s0.outputs,
        drops: s1.drops - s0.drops,
        megaflows: dp.stats().megaflow_inserts,
    })
}

// ---------------------------------------------------------------------------
// oxvs-lab: manifests and expected flow counts.

fn selector_json(s: &LabelSelector) -> Value {
    let mut v = serde_json::Map::new();
    if !s.match_labels.is_empty() {
        v.insert("matchLabels".into(), json!(s.match_labels));
    }
    if !s.match_expressions.is_empty() {
        let e: Vec<Value> = s
            .match_expressions
            .iter()
            .map(|r| {
                let op = match r.op {
                    SelectorOp::In => "In",
                    SelectorOp::NotIn => "NotIn",
                    SelectorOp::Exists => "Exists",
                    SelectorOp::DoesNotExist => "DoesNotExist",
                };
                json!({"key": r.key, "operator": op, "values": r.values})
            })
            .collect();
        v.insert("matchExpressions".into(), Value::Array(e));
    }
    Value::Object(v)
}

fn proto_api(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
    }
}

fn rule_json(r: &Rule, dir: &str) -> Value {
    let peers: Vec<Value> = r
        .peers
        .iter()
        .map(|p| match p {
            Peer::Pods {
                namespace_selector,
                pod_selector,
            } => {
                let mut o = serde_json::Map::new();
                if let Some(s) = namespace_selector {
                    o.insert("namespaceSelector".into(), selector_json(s));
                }
                if let Some(s) = pod_selector {
                    o.insert("podSelector".into(), selector_json(s));
                }
                Value::Object(o)
            }
            Peer::IpBlock { cidr, except } => json!({"ipBlock": {
                "cidr": cidr.to_string(),
                "except": except.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            }}),
            Peer::IpBlock6 { cidr, except } => json!({"ipBlock": {
                "cidr": cidr.to_string(),
                "except": except.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
            }}),
        })
        .collect();
    let ports: Vec<Value> = r
        .ports
        .iter()
        .map(|p| {
            let mut o = serde_json::Map::new();
            o.insert("protocol".into(), json!(proto_api(p.protocol)));
            match &p.port {
                Some(PortRef::Number(n)) => {
                    o.insert("port".into(), json!(n));
                }
                Some(PortRef::Name(s)) => {
                    o.insert("port".into(), json!(s));
                }
                None => {}
            }
            if let Some(e) = p.end_port {
                o.insert("endPort".into(), json!(e));
            }
            Value::Object(o)
        })
        .collect();
    let key = if dir == "ingress" { "from" } else { "to" };
    json!({ key: peers, "ports": ports })
}

/// The model as Kubernetes objects: (Namespaces + Pods, NetworkPolicies).
/// Pods carry `spec.nodeName` and one container with their ports.
pub fn lab_objects(model: &Model) -> (Vec<Value>, Vec<Value>) {
    let mut base = Vec::new();
    for ns in model.state.namespaces.values() {
        let l: BTreeMap<&String, &String> = ns
            .labels
            .iter()
            .filter(|(k, _)| k.as_str() != "kubernetes.io/metadata.name")
            .collect();
        base.push(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns.name, "labels": l},
        }));
    }
    for p in model.state.pods.values() {
        let ports: Vec<Value> = p
            .ports
            .iter()
            .map(|c| json!({"name": c.name, "containerPort": c.port, "protocol": proto_api(c.protocol)}))
            .collect();
        base.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": p.name, "namespace": p.namespace, "labels": p.labels},
            "spec": {"nodeName": p.node_name, "containers": [{"name": "c", "image": "oxvs-lab/serve", "ports": ports}]},
        }));
    }
    let mut pols = Vec::new();
    for p in model.state.policies.values() {
        let mut types = Vec::new();
        if p.ingress_isolation {
            types.push("Ingress");
        }
        if p.egress_isolation {
            types.push("Egress");
        }
        let mut spec = serde_json::Map::new();
        spec.insert("podSelector".into(), selector_json(&p.pod_selector));
        spec.insert("policyTypes".into(), json!(types));
        if !p.ingress.is_empty() {
            spec.insert(
                "ingress".into(),
                Value::Array(p.ingress.iter().map(|r| rule_json(r, "ingress")).collect()),
            );
        }
        if !p.egress.is_empty() {
            spec.insert(
                "egress".into(),
                Value::Array(p.egress.iter().map(|r| rule_json(r, "egress")).collect()),
            );
        }
        pols.push(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": p.name, "namespace": p.namespace},
            "spec": spec,
        }));
    }
    (base, pols)
}

/// Multi-document YAML (each document in JSON flow style, which is YAML).
pub fn to_yaml_docs(objs: &[Value]) -> String {
    let mut s = String::new();
    for o in objs {
        s.push_str("---\n");
        s.push_str(&o.to_string());
        s.push('\n');
    }
    s
}

/// What the lab really made: a pod's IP and node, a node's pod CIDR and IP.
#[derive(Clone, Debug, Default)]
pub struct LabFacts {
    /// (namespace, name) -> (node, IP).
    pub pods: BTreeMap<(String, String), (String, Ipv4Addr)>,
    /// node -> (pod CIDR, InternalIP).
    pub nodes: BTreeMap<String, (Ipv4Net, Ipv4Addr)>,
}

/// The number of policy flows each node of the lab should hold: the
/// model's cluster with the lab's real addresses, translated per node.
pub fn expected_policy_flows(model: &Model, facts: &LabFacts) -> BTreeMap<String, usize> {
    let mut state = model.state.clone();
    state.nodes = facts
        .nodes
        .iter()
        .map(|(n, (cidr, ip))| {
            (
                n.clone(),
                Node {
                    name: n.clone(),
                    pod_cidr: Some(*cidr),
                    pod_cidr6: None,
                    internal_ip: Some(*ip),
                    internal_ip6: None,
                },
            )
        })
        .collect();
    for (key, pod) in state.pods.iter_mut() {
        match facts.pods.get(key) {
            Some((node, ip)) => {
                pod.node_name = node.clone();
                pod.ip = Some(*ip);
            }
            None => pod.ip = None,
        }
    }
    let mut out = BTreeMap::new();
    for node in facts.nodes.keys() {
        let local: Vec<LocalPod> = state
            .pods
            .values()
            .filter(|p| &p.node_name == node)
            .enumerate()
            .filter_map(|(i, p)| {
                Some(LocalPod {
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                    ip: Some(p.ip?),
                    ofport: 3 + i as u32,
                    ip6: None,
                })
            })
            .collect();
        out.insert(
            node.clone(),
            policy::policy_flows(&state, &local).flows.len(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_is_deterministic_and_policies_select_pods() {
        let spec = ModelSpec {
            pods: 60,
            policies: 30,
            nodes: 3,
            pods_per_namespace: 20,
        };
        let a = Model::new(spec).unwrap();
        let b = Model::new(spec).unwrap();
        assert_eq!(a.state, b.state);
        assert_eq!(a.state.pods.len(), 60);
        assert_eq!(a.state.policies.len(), 30);
        assert_eq!(a.nodes.iter().map(|n| n.local.len()).sum::<usize>(), 60);
        for p in a.state.policies.values() {
            let n = a
                .state
                .pods
                .values()
                .filter(|q| q.namespace == p.namespace && p.pod_selector.matches(&q.labels))
                .count();
            assert!(n > 0, "{} selects nothing", p.name);
        }
    }

    #[test]
    fn bad_specs_are_errors() {
        for spec in [
            ModelSpec {
                pods: 10,
                policies: 1,
                nodes: 0,
                pods_per_namespace: 5,
            },
            ModelSpec {
                pods: 0,
                policies: 1,
                nodes: 1,
                pods_per_namespace: 5,
            },
        ] {
            assert!(Model::new(spec).is_err(), "{spec:?}");
        }
    }
}
