//! # Service scale benchmark
//!
//! The library half of `service-bench` (`src/bin/service-bench.rs`): a
//! synthetic cluster of S Services ([`Model`]), the in-process cost of
//! realising them with the in-pipeline Service proxy per node
//! ([`realise`]), the datapath's per-packet cost for established and new
//! connections to ClusterIPs ([`established`], [`new_connections`]), and
//! the same Services as Kubernetes objects for the end-to-end runs on
//! `oxvs-lab` against the real kube-proxy ([`lab_objects`]), with the rule
//! count kube-proxy v1.20's iptables mode writes for them, derived from its
//! `proxier.go` ([`kube_proxy_expected`]) to check the measured one.
//!
//! ## The model (`ModelSpec` -> `Model`)
//!
//! `nodes` nodes; node `n` (1-based) is `node-n`, pod CIDR
//! `10.244.n.0/24` (gateway `.1`), InternalIP `192.168.77.(10+n)`, as in
//! `oxvs-lab`. A fixed pool of `pods_per_node` pods per node (pool pod `p`
//! on node `p % nodes`, the `p / nodes`-th there: address `.(2 + that)`,
//! OpenFlow port `3 + that`; 1 = tunnel, 2 = gateway): the endpoints are
//! drawn from it, so the node's own flows (pods, tunnel) are the same at 0,
//! 1k and 10k Services and only the Services' flows grow.
//!
//! Service `i` is `sb/s<i>` (namespace `sb`), ClusterIP `10.96.16.0 + i`,
//! port `http` TCP 80 -> 8080; every `udp_every`-th (i % udp_every == 0)
//! also `dns` UDP 53 -> 5353; every `node_port_every`-th has NodePort
//! on each of its ports (`30000 + 2 * (i / node_port_every)` on `http`, the
//! next on `dns`; type NodePort, `externalTrafficPolicy: Cluster`). Its `endpoints` ready endpoints are
//! pool pods `base + j * (pool / endpoints + 1)` (mod pool, `base` a hash
//! of `i`), all distinct and, with 10 nodes and 10 endpoints, one per node.
//! No selector: the Endpoints object lists the addresses (the lab applies
//! both, so nothing depends on Pods existing there).
//!
//! ## What is timed, per node ([`realise`])
//!
//! As the agent and switch do (`agent/src/agent/reconcile.rs`):
//!
//! - **bundle** (Services arrive at a running node): the pipeline holds
//!   the node's flows without Services (proxy on); `translate` =
//!   [`desired::compute`] with the Services; `diff` = the agent's
//!   line-set difference of flows and groups and the bundle text
//!   ([`bundle_text`], the agent's `diff_mods`); `parse` = the switch
//!   parsing that bundle ([`parse_bundle`], the switch's `bundle` op);
//!   `install` = one atomic [`Pipeline::apply_bundle`].
//! - **replace** (agent start, first sync): the flow and group text joined
//!   as the agent sends it, parsed, and [`Pipeline::replace_all_with_groups`]
//!   on an empty pipeline.
//! - **change** (one Service's endpoints change, a pool pod replaced by
//!   another): translate, diff, parse, install again, on the pipeline
//!   holding the S Services.
//!
//! Heap: the live bytes the bundle's install added to the pipeline (the
//! caller's counting allocator), per Service.
//!
//! ## The datapath
//!
//! Node 1's pipeline (its flows and groups at S Services) in one
//! [`Datapath`], its local pool pods as clients. Connection `c`: client
//! pod `c % local`, source port from 10000 up, to a ClusterIP (Service
//! `hash(c) % S`, TCP 80) or, with [`Target::PodIp`], to a pool pod (`hash(c)
//! % pool`, TCP 8080) directly, so that the reference without Services
//! has the same mix of local and remote destinations (1 in `nodes`).
//!
//! - [`established`]: every connection opened (SYN, SYN-ACK from where the
//!   SYN went, ACK; a client that gets itself as the endpoint, hairpin, is
//!   left out and the next connection taken), then steady state: the client's data segment and the
//!   endpoint's answer for every connection, cycled; only `process_batch`
//!   timed, 32 packets per batch.
//! - [`new_connections`]: SYNs, each from a source port never used before
//!   (a new conntrack entry and, through a ClusterIP, a group choice and
//!   an upcall: the group hashes the 5-tuple, so no cached flow covers a
//!   new connection); a fresh conntrack table per trial.
//!
//! Everything is deterministic. No function here panics on its input;
//! errors name what failed.

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use oxvs_agent::desired::{self, Inputs, Tunnel};
use oxvs_agent::flows::{self as aflows, NodeNet, PodPort, RemoteNode};
use oxvs_agent::model::{
    ClusterState, Endpoint, EndpointPort, EndpointSet, Node, Protocol, Service, ServicePort,
};
use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{
    Datapath, DatapathConfig, DatapathSink, DpPacket, PacketIn, RecordingSink, TunnelMeta,
};
use oxvs_pipeline::flow::{FlowMod, FlowModCommand};
use oxvs_pipeline::group::{mix64, Group, GroupMod};
use oxvs_pipeline::parse::{
    logical_lines, parse_flow, parse_flow_file, parse_flow_mod, parse_group, parse_group_file,
    parse_group_id, ParseContext,
};
use oxvs_pipeline::tables::{Pipeline, TableMod};
use oxvs_pipeline::xlate::XlateEnv;
use serde_json::{json, Value};

/// OpenFlow port of the tunnel in the model.
pub const TUNNEL_OFPORT: u32 = 1;
/// OpenFlow port of the gateway in the model.
pub const GATEWAY_OFPORT: u32 = 2;
/// The Services' namespace.
pub const NAMESPACE: &str = "sb";
/// The first ClusterIP (Service `i` has this + `i`).
pub const FIRST_CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 16, 0);
/// The first NodePort.
pub const FIRST_NODE_PORT: u16 = 30000;
/// NodePorts available (30000-32767).
pub const NODE_PORTS: usize = 2768;
/// The cluster's pod network (kube-proxy's `--cluster-cidr`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The endpoints' TCP port.
pub const HTTP_TARGET: u16 = 8080;
/// The endpoints' UDP port.
pub const DNS_TARGET: u16 = 5353;

/// Errors of the benchmark library.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bad model: {0}")]
    Spec(String),
    #[error("node {node}: {what} does not parse: {msg}")]
    Parse {
        node: String,
        what: &'static str,
        msg: String,
    },
    #[error("node {node}: installing failed: {msg}")]
    Install { node: String, msg: String },
    #[error("datapath: {0}")]
    Datapath(String),
}

/// The shape of the synthetic cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    pub services: usize,
    /// Ready endpoints per Service.
    pub endpoints: usize,
    pub nodes: usize,
    /// Pool pods per node (the endpoints are drawn from them).
    pub pods_per_node: usize,
    /// Every n-th Service also has a UDP port (0: none).
    pub udp_every: usize,
    /// Every n-th Service has a NodePort (0: none).
    pub node_port_every: usize,
}

impl ModelSpec {
    /// The benchmark's defaults for `services` Services.
    pub fn with_services(services: usize) -> ModelSpec {
        ModelSpec {
            services,
            endpoints: 10,
            nodes: 10,
            pods_per_node: 100,
            udp_every: 5,
            node_port_every: 10,
        }
    }

    fn has_udp(&self, i: usize) -> bool {
        self.udp_every > 0 && i.is_multiple_of(self.udp_every)
    }

    /// Service `i`'s NodePort for its port `k` (0 = `http`, 1 = `dns`):
    /// every port of a NodePort Service has one, as the API server gives.
    fn node_port(&self, i: usize, k: usize) -> Option<u16> {
        if self.node_port_every == 0 || !i.is_multiple_of(self.node_port_every) {
            return None;
        }
        u16::try_from(2 * (i / self.node_port_every) + k)
            .ok()
            .map(|n| FIRST_NODE_PORT + n)
    }

    /// Service ports in the model: (TCP, UDP, NodePorts).
    pub fn port_counts(&self) -> (usize, usize, usize) {
        let udp = (0..self.services).filter(|&i| self.has_udp(i)).count();
        let np = (0..self.services)
            .filter(|&i| self.node_port(i, 0).is_some())
            .map(|i| 1 + usize::from(self.has_udp(i)))
            .sum();
        (self.services, udp, np)
    }
}

/// One node of the model.
#[derive(Clone, Debug)]
pub struct NodeModel {
    pub name: String,
    pub net: NodeNet,
    pub ip: Ipv4Addr,
    /// Its pool pods.
    pub ports: Vec<PodPort>,
    pub remotes: Vec<RemoteNode>,
}

impl NodeModel {
    /// What this node's agent computes its flows from (proxy on).
    pub fn inputs(&self, state: Arc<ClusterState>) -> Inputs {
        Inputs {
            pods: self.ports.clone(),
            tunnel: Some(Tunnel {
                ofport: TUNNEL_OFPORT,
                remotes: self.remotes.clone(),
                node_ip: Some(self.ip.into()),
                guard: true,
            }),
            state,
            proxy: true,
            node_name: self.name.clone(),
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
    /// Pool pod `p`: (node index, address).
    pub pool: Vec<(usize, Ipv4Addr)>,
}

/// Service `i`'s name.
pub fn service_name(i: usize) -> String {
    format!("s{i:05}")
}

/// Service `i`'s ClusterIP.
pub fn cluster_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(FIRST_CLUSTER_IP).wrapping_add(i as u32))
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
        if spec.pods_per_node == 0 || spec.pods_per_node > 250 {
            return Err(BenchError::Spec(format!(
                "pods per node = {} (1..=250: a /24)",
                spec.pods_per_node
            )));
        }
        let pool_len = spec.nodes * spec.pods_per_node;
        if spec.endpoints > pool_len {
            return Err(BenchError::Spec(format!(
                "{} endpoints per Service but only {pool_len} pods",
                spec.endpoints
            )));
        }
        if spec.services > 48_000 {
            return Err(BenchError::Spec(format!(
                "{} Services do not fit 10.96.16.0-10.96.255.255",
                spec.services
            )));
        }
        if spec.node_port_every > 0 && 2 * spec.services.div_ceil(spec.node_port_every) > NODE_PORTS
        {
            return Err(BenchError::Spec(format!(
                "{} NodePort Services do not fit 30000-32767",
                spec.services.div_ceil(spec.node_port_every)
            )));
        }
        let mut state = ClusterState::default();
        let mut nodes: Vec<NodeModel> = (1..=spec.nodes)
            .map(|n| {
                let n8 = n as u8; // n <= 200
                let gw = Ipv4Addr::new(10, 244, n8, 1);
                NodeModel {
                    name: format!("node-{n}"),
                    net: NodeNet {
                        ipv4: Some(aflows::NodeNet4 {
                            pod_cidr: Ipv4Net::new(Ipv4Addr::new(10, 244, n8, 0), 24)
                                .unwrap_or_default(),
                            gateway_ip: gw,
                        }),
                        gateway_mac: aflows::pod_mac(gw),
                        gateway_ofport: GATEWAY_OFPORT,
                        ipv6: None,
                    },
                    ip: Ipv4Addr::new(192, 168, 77, 10 + n8),
                    ports: Vec::new(),
                    remotes: Vec::new(),
                }
            })
            .collect();
        for n in &nodes {
            state.nodes.insert(
                n.name.clone(),
                Node {
                    name: n.name.clone(),
                    pod_cidr: n.net.pod_cidr4(),
                    pod_cidr6: None,
                    internal_ip: Some(n.ip),
                    internal_ip6: None,
                },
            );
        }
        let mut pool = Vec::with_capacity(pool_len);
        for p in 0..pool_len {
            let ni = p % spec.nodes;
            let node = &mut nodes[ni];
            let k = node.ports.len() as u32;
            let ip = Ipv4Addr::from(
                u32::from(
                    node.net
                        .ipv4
                        .as_ref()
                        .map_or(Ipv4Addr::UNSPECIFIED, |v4| v4.gateway_ip),
                ) + 1
                    + k,
            );
            node.ports.push(PodPort {
                ofport: 3 + k,
                ip: Some(ip),
                mac: aflows::pod_mac(ip),
                ip6: None,
            });
            pool.push((ni, ip));
        }
        let remotes: Vec<RemoteNode> = nodes
            .iter()
            .map(|n| RemoteNode {
                name: n.name.clone(),
                pod_cidr: n.net.pod_cidr4(),
                ip: n.ip.into(),
                pod_cidr6: None,
            })
            .collect();
        for n in &mut nodes {
            n.remotes = remotes
                .iter()
                .filter(|r| r.name != n.name)
                .cloned()
                .collect();
        }
        let mut model = Model {
            spec,
            state,
            nodes,
            pool,
        };
        for i in 0..spec.services {
            let svc = model.service(i);
            let eps = model.endpoint_set(i, &model.endpoint_pods(i));
            model.state.endpoints.insert(svc.key(), eps);
            model.state.services.insert(svc.key(), svc);
        }
        Ok(model)
    }

    /// Service `i` (see the module doc).
    pub fn service(&self, i: usize) -> Service {
        let mut ports = vec![ServicePort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: self.spec.node_port(i, 0),
        }];
        if self.spec.has_udp(i) {
            ports.push(ServicePort {
                name: "dns".into(),
                protocol: Protocol::Udp,
                port: 53,
                node_port: self.spec.node_port(i, 1),
            });
        }
        Service {
            namespace: NAMESPACE.into(),
            name: service_name(i),
            cluster_ip: Some(cluster_ip(i)),
            cluster_ip6: None,
            ports,
            affinity_timeout: None,
            external_ips: Vec::new(),
            external_local: false,
            internal_local: false,
        }
    }

    /// The pool pods behind Service `i`, distinct.
    pub fn endpoint_pods(&self, i: usize) -> Vec<usize> {
        let pool = self.pool.len();
        let step = pool / self.spec.endpoints.max(1) + 1;
        let base = (mix64(i as u64) % pool as u64) as usize;
        let mut out: Vec<usize> = Vec::with_capacity(self.spec.endpoints);
        let mut j = 0;
        while out.len() < self.spec.endpoints {
            let mut p = (base + j * step) % pool;
            while out.contains(&p) {
                p = (p + 1) % pool;
            }
            out.push(p);
            j += 1;
        }
        out
    }

    /// Service `i`'s Endpoints with the pool pods `pods`.
    pub fn endpoint_set(&self, i: usize, pods: &[usize]) -> EndpointSet {
        let mut ports = vec![EndpointPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: HTTP_TARGET,
        }];
        if self.spec.has_udp(i) {
            ports.push(EndpointPort {
                name: "dns".into(),
                protocol: Protocol::Udp,
                port: DNS_TARGET,
            });
        }
        EndpointSet {
            service: (NAMESPACE.into(), service_name(i)),
            endpoints: pods
                .iter()
                .filter_map(|&p| self.pool.get(p))
                .map(|&(ni, ip)| Endpoint {
                    ip: ip.into(),
                    ready: true,
                    node_name: self.nodes.get(ni).map(|n| n.name.clone()),
                    ports: ports.clone(),
                })
                .collect(),
        }
    }

    /// The same cluster with Service `i`'s first endpoint replaced by the
    /// next pool pod that is not already one: "one Service's endpoints
    /// change".
    pub fn with_endpoint_change(&self, i: usize) -> Model {
        let mut m = self.clone();
        let mut pods = self.endpoint_pods(i);
        if let Some(first) = pods.first().copied() {
            let pool = self.pool.len();
            let mut p = (first + 1) % pool;
            while pods.contains(&p) && p != first {
                p = (p + 1) % pool;
            }
            pods[0] = p;
        }
        let eps = m.endpoint_set(i, &pods);
        m.state
            .endpoints
            .insert((NAMESPACE.into(), service_name(i)), eps);
        m
    }

    /// The Service whose endpoints [`Model::with_endpoint_change`] changes
    /// in the benchmark: the first with one TCP port and no NodePort.
    pub fn changed_service(&self) -> usize {
        (1..self.spec.services)
            .find(|&i| !self.spec.has_udp(i) && self.spec.node_port(i, 0).is_none())
            .unwrap_or(0)
    }

    /// The same nodes and pods without any Service.
    pub fn without_services(&self) -> Model {
        let mut m = self.clone();
        m.state.services.clear();
        m.state.endpoints.clear();
        m.spec.services = 0;
        m
    }
}

// ---------------------------------------------------------------------------
// The agent's diff and the switch's bundle, as they are done there.

fn group_id_of(line: &str) -> Option<&str> {
    line.split(',').next()?.strip_prefix("group_id=")
}

/// The bundle that turns flows `old` into `want` and groups `old_groups`
/// into `want_groups`, as the agent's `diff_mods`
/// (`agent/src/agent/reconcile.rs`, private there) writes it: new and
/// changed groups first, then flow deletes (strict, by match and
/// priority) and adds, then the groups no longer wanted. Returns the text
/// and the number of mods.
pub fn bundle_text(
    old: &HashSet<String>,
    want: &HashSet<String>,
    old_groups: &HashSet<String>,
    want_groups: &HashSet<String>,
) -> (String, usize) {
    let mut mods = String::new();
    let mut n = 0;
    let want_ids: HashSet<&str> = want_groups.iter().filter_map(|g| group_id_of(g)).collect();
    for g in want_groups.difference(old_groups) {
        mods.push_str("group add_or_mod ");
        mods.push_str(g);
        mods.push('\n');
        n += 1;
    }
    for line in old.difference(want) {
        if let Ok(f) = parse_flow(line, &ParseContext::default()) {
            let m = oxvs_pipeline::print::format_match_priority(&f.matches, f.priority);
            mods.push_str(&format!("delete_strict table={},{m}\n", f.table));
            n += 1;
        }
    }
    for line in want.difference(old) {
        mods.push_str("add ");
        mods.push_str(line);
        mods.push('\n');
        n += 1;
    }
    for g in old_groups.difference(want_groups) {
        if let Some(id) = group_id_of(g).filter(|id| !want_ids.contains(id)) {
            mods.push_str("group delete group_id=");
            mods.push_str(id);
            mods.push('\n');
            n += 1;
        }
    }
    (mods, n)
}

/// Parses a bundle as the switch's `bundle` op does
/// (`switch/src/control.rs`, private there): `group add|modify|add_or_mod
/// GROUP`, `group delete group_id=N`, `add|modify|delete[_strict] FLOW`.
pub fn parse_bundle(text: &str, ctx: &ParseContext) -> Result<Vec<TableMod>, String> {
    let mut mods = Vec::new();
    for (line, text) in logical_lines(text) {
        let t = text.trim_start();
        let at = |e: oxvs_pipeline::parse::ParseError| format!("line {line}: {e}");
        if let Some(g) = t.strip_prefix("group ") {
            let (cmd, rest) = g
                .trim_start()
                .split_once(|c: char| c.is_ascii_whitespace())
                .unwrap_or((g, ""));
            let gm = match cmd {
                "delete" => GroupMod::Delete(parse_group_id(rest).map_err(at)?),
                "add" => GroupMod::Add(parse_group(rest, ctx).map_err(at)?),
                "modify" | "add_or_mod" => GroupMod::Modify {
                    group: parse_group(rest, ctx).map_err(at)?,
                    may_create: cmd == "add_or_mod",
                },
                other => return Err(format!("line {line}: unknown group command {other:?}")),
            };
            mods.push(TableMod::Group(gm));
            continue;
        }
        let (command, rest) = match t.split_once(|c: char| c.is_ascii_whitespace()) {
            Some(("add", r)) => (FlowModCommand::Add, r),
            Some(("modify", r)) => (FlowModCommand::Modify { strict: false }, r),
            Some(("modify_strict", r)) => (FlowModCommand::Modify { strict: true }, r),
            Some(("delete", r)) => (FlowModCommand::Delete { strict: false }, r),
            Some(("delete_strict", r)) => (FlowModCommand::Delete { strict: true }, r),
            _ => (FlowModCommand::Add, t),
        };
        let fm: FlowMod = parse_flow_mod(rest, command, ctx).map_err(at)?;
        mods.push(TableMod::Flow(fm));
    }
    Ok(mods)
}

// ---------------------------------------------------------------------------
// Realisation per node.

/// Installs `lines` and `groups` into a fresh pipeline (untimed setup).
fn pipeline_with(node: &str, lines: &[String], groups: &[String]) -> Result<Pipeline, BenchError> {
    let ctx = ParseContext::default();
    let flows = parse_flow_file(&lines.join("\n"), &ctx).map_err(|e| BenchError::Parse {
        node: node.into(),
        what: "flows",
        msg: e.to_string(),
    })?;
    let groups = parse_group_file(&groups.join("\n"), &ctx).map_err(|e| BenchError::Parse {
        node: node.into(),
        what: "groups",
        msg: e.to_string(),
    })?;
    let p = Pipeline::new();
    p.replace_all_with_groups(&flows, Some(&groups), 0)
        .map_err(|e| BenchError::Install {
            node: node.into(),
            msg: e.to_string(),
        })?;
    Ok(p)
}

/// One bundle step's times.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Step {
    pub translate: Duration,
    pub diff: Duration,
    pub parse: Duration,
    pub install: Duration,
    /// Mods in the bundle.
    pub mods: usize,
}

impl Step {
    pub fn total(&self) -> Duration {
        self.translate + self.diff + self.parse + self.install
    }

    fn json(&self) -> Value {
        json!({
            "translate_ms": ms(self.translate), "diff_ms": ms(self.diff),
            "parse_ms": ms(self.parse), "install_ms": ms(self.install),
            "total_ms": ms(self.total()), "mods": self.mods,
        })
    }
}

/// Results for one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeResult {
    pub node: String,
    /// Flows without Services (proxy on: its node flows, pods, tunnel).
    pub base_flows: usize,
    /// Flows with the Services (all of them).
    pub flows: usize,
    pub groups: usize,
    pub buckets: usize,
    /// Bytes of the Services' flow text (lines plus newlines).
    pub flow_text_bytes: usize,
    /// Bytes of the group text.
    pub group_text_bytes: usize,
    /// Services arriving at a running node.
    pub bundle: Step,
    /// Agent start: join, parse and `replace_all_with_groups` of
    /// everything on an empty pipeline (translate as in `bundle`).
    pub replace_parse: Duration,
    pub replace_install: Duration,
    /// One Service's endpoints change.
    pub change: Step,
    /// Live heap the bundle's install added to the pipeline.
    pub heap_bytes: Option<i64>,
}

fn to_sets(d: &desired::DesiredFlows) -> (HashSet<String>, HashSet<String>) {
    (
        d.lines.iter().cloned().collect(),
        d.groups.iter().cloned().collect(),
    )
}

/// One bundle: translate `model` on node `n`, diff against `old`, parse,
/// install into `pipeline`. Returns the step and the new sets.
fn bundle_step(
    n: &NodeModel,
    model: &Model,
    old: &(HashSet<String>, HashSet<String>),
    pipeline: &Pipeline,
    live_bytes: Option<&dyn Fn() -> i64>,
) -> Result<(Step, desired::DesiredFlows, Option<i64>), BenchError> {
    let ctx = ParseContext::default();
    let state = Arc::new(model.state.clone());
    let inputs = n.inputs(state);
    let mut s = Step::default();
    let t = Instant::now();
    let d = desired::compute(&inputs);
    s.translate = t.elapsed();
    let t = Instant::now();
    let want = to_sets(&d);
    let (text, mods) = bundle_text(&old.0, &want.0, &old.1, &want.1);
    s.diff = t.elapsed();
    s.mods = mods;
    drop(want);
    let before = live_bytes.map(|f| f());
    let t = Instant::now();
    let bundle = parse_bundle(&text, &ctx).map_err(|msg| BenchError::Parse {
        node: n.name.clone(),
        what: "bundle",
        msg,
    })?;
    s.parse = t.elapsed();
    let t = Instant::now();
    pipeline
        .apply_bundle(&bundle, 1)
        .map_err(|e| BenchError::Install {
            node: n.name.clone(),
            msg: e.to_string(),
        })?;
    s.install = t.elapsed();
    drop(bundle);
    let heap = match (live_bytes, before) {
        (Some(f), Some(b)) => Some(f() - b),
        _ => None,
    };
    let snap = pipeline.snapshot();
    if snap.flow_count() != d.lines.len() || snap.groups().count() != d.groups.len() {
        return Err(BenchError::Install {
            node: n.name.clone(),
            msg: format!(
                "{} flows and {} groups installed, {} and {} wanted",
                snap.flow_count(),
                snap.groups().count(),
                d.lines.len(),
                d.groups.len()
            ),
        });
    }
    Ok((s, d, heap))
}

/// Realises the model's Services on its first `measure_nodes` nodes (see
/// the module doc). `live_bytes`, if given, returns the process's live
/// heap bytes.
pub fn realise(
    model: &Model,
    measure_nodes: usize,
    live_bytes: Option<&dyn Fn() -> i64>,
) -> Result<Vec<NodeResult>, BenchError> {
    let ctx = ParseContext::default();
    let empty = model.without_services();
    let changed = model.with_endpoint_change(model.changed_service());
    let mut out = Vec::new();
    for n in model.nodes.iter().take(measure_nodes.max(1)) {
        let base = desired::compute(&n.inputs(Arc::new(empty.state.clone())));
        let pipeline = pipeline_with(&n.name, &base.lines, &base.groups)?;
        let base_sets = to_sets(&base);
        let (bundle, d, heap) = bundle_step(n, model, &base_sets, &pipeline, live_bytes)?;
        let mut r = NodeResult {
            node: n.name.clone(),
            base_flows: base.lines.len(),
            flows: d.lines.len(),
            groups: d.groups.len(),
            buckets: d.groups.iter().map(|g| g.matches(",bucket=").count()).sum(),
            flow_text_bytes: d
                .lines
                .iter()
                .filter(|l| !base_sets.0.contains(*l))
                .map(|l| l.len() + 1)
                .sum(),
            group_text_bytes: d.groups.iter().map(|g| g.len() + 1).sum(),
            bundle,
            heap_bytes: heap,
            ..NodeResult::default()
        };
        // One Service's endpoints change.
        let sets = to_sets(&d);
        let (change, _, _) = bundle_step(n, &changed, &sets, &pipeline, None)?;
        r.change = change;
        drop(pipeline);

        // Agent start: everything at once on an empty switch.
        let t = Instant::now();
        let flow_text = d.lines.join("\n");
        let group_text = d.groups.join("\n");
        let flows = parse_flow_file(&flow_text, &ctx).map_err(|e| BenchError::Parse {
            node: n.name.clone(),
            what: "flows",
            msg: e.to_string(),
        })?;
        let groups: Vec<Group> =
            parse_group_file(&group_text, &ctx).map_err(|e| BenchError::Parse {
                node: n.name.clone(),
                what: "groups",
                msg: e.to_string(),
            })?;
        r.replace_parse = t.elapsed();
        let fresh = Pipeline::new();
        let t = Instant::now();
        fresh
            .replace_all_with_groups(&flows, Some(&groups), 2)
            .map_err(|e| BenchError::Install {
                node: n.name.clone(),
                msg: e.to_string(),
            })?;
        r.replace_install = t.elapsed();
        out.push(r);
    }
    Ok(out)
}

/// Milliseconds, to the microsecond.
pub fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// One number of Services of the in-process matrix, summarised.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub spec: ModelSpec,
    pub nodes: Vec<NodeResult>,
}

impl Summary {
    fn max_of(&self, f: impl Fn(&NodeResult) -> Duration) -> Duration {
        self.nodes.iter().map(f).max().unwrap_or_default()
    }
    fn max_n(&self, f: impl Fn(&NodeResult) -> usize) -> usize {
        self.nodes.iter().map(f).max().unwrap_or(0)
    }
    /// Cluster realisation when Services arrive: the slowest node.
    pub fn bundle_max(&self) -> Duration {
        self.max_of(|n| n.bundle.total())
    }
    /// Mean per node of the heap growth, bytes.
    pub fn heap_mean(&self) -> Option<f64> {
        let v: Option<Vec<i64>> = self.nodes.iter().map(|n| n.heap_bytes).collect();
        let v = v?;
        (!v.is_empty()).then(|| v.iter().sum::<i64>() as f64 / v.len() as f64)
    }

    /// One row of the results table.
    pub fn row(&self) -> Vec<String> {
        let s = self.spec.services;
        let per_svc = |x: f64| {
            if s == 0 {
                "-".to_string()
            } else {
                format!("{:.0}", x / s as f64)
            }
        };
        let f2 = |d: Duration| format!("{:.2}", ms(d));
        vec![
            s.to_string(),
            self.max_n(|n| n.flows).to_string(),
            self.max_n(|n| n.flows - n.base_flows).to_string(),
            self.max_n(|n| n.groups).to_string(),
            self.max_n(|n| n.buckets).to_string(),
            f2(self.max_of(|n| n.bundle.translate)),
            f2(self.max_of(|n| n.bundle.diff)),
            f2(self.max_of(|n| n.bundle.parse)),
            f2(self.max_of(|n| n.bundle.install)),
            f2(self.bundle_max()),
            f2(self.max_of(|n| n.bundle.translate + n.replace_parse + n.replace_install)),
            f2(self.max_of(|n| n.change.total())),
            f2(self.max_of(|n| n.change.translate)),
            f2(self.max_of(|n| n.change.install)),
            per_svc(self.max_n(|n| n.flow_text_bytes + n.group_text_bytes) as f64),
            self.heap_mean().map_or("-".into(), per_svc),
        ]
    }

    /// The table header matching [`Summary::row`].
    pub const HEADER: [&'static str; 16] = [
        "services",
        "flows",
        "svc flows",
        "groups",
        "buckets",
        "translate",
        "diff",
        "parse",
        "install",
        "realise",
        "first sync",
        "1 change",
        "chg translate",
        "chg install",
        "text B/svc",
        "heap B/svc",
    ];

    pub fn json(&self) -> Value {
        let (tcp, udp, np) = self.spec.port_counts();
        json!({
            "services": self.spec.services,
            "endpoints_per_service": self.spec.endpoints,
            "service_ports": {"tcp": tcp, "udp": udp, "node_ports": np},
            "nodes": self.nodes.iter().map(|n| json!({
                "node": n.node,
                "base_flows": n.base_flows,
                "flows": n.flows,
                "service_flows": n.flows - n.base_flows,
                "groups": n.groups,
                "buckets": n.buckets,
                "flow_text_bytes": n.flow_text_bytes,
                "group_text_bytes": n.group_text_bytes,
                "heap_bytes": n.heap_bytes,
                "bundle": n.bundle.json(),
                "first_sync": {
                    "translate_ms": ms(n.bundle.translate),
                    "parse_ms": ms(n.replace_parse),
                    "install_ms": ms(n.replace_install),
                    "total_ms": ms(n.bundle.translate + n.replace_parse + n.replace_install),
                },
                "change": n.change.json(),
            })).collect::<Vec<_>>(),
            "realise_max_ms": ms(self.bundle_max()),
        })
    }
}

// ---------------------------------------------------------------------------
// The datapath.

/// Where the connections go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A Service's ClusterIP, TCP 80.
    ClusterIp,
    /// A pool pod's address, TCP 8080 (the reference without translation).
    PodIp,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::ClusterIp => "ClusterIP",
            Target::PodIp => "pod IP",
        }
    }
}

/// Packets per `process_batch` call.
pub const BATCH: usize = 32;

const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
const TCP_PSH: u8 = 0x08;
const CLIENT_ISN: u32 = 1000;
const SERVER_ISN: u32 = 5000;
const PAYLOAD: usize = 64;

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

/// One TCP segment of a connection.
#[derive(Clone, Copy, Debug)]
struct Seg {
    dl_src: [u8; 6],
    dl_dst: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    flags: u8,
    seq: u32,
    ack: u32,
    payload: usize,
}

/// An Ethernet + IPv4 + TCP frame with correct checksums.
fn tcp_frame(s: &Seg) -> Vec<u8> {
    let l4_len = 20 + s.payload;
    let ip_len = 20 + l4_len;
    let mut f = Vec::with_capacity(14 + ip_len);
    f.extend_from_slice(&s.dl_dst);
    f.extend_from_slice(&s.dl_src);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&(ip_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&s.src.octets());
    f.extend_from_slice(&s.dst.octets());
    let c = csum_fold(csum_add(0, &f[14..34]));
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&s.sport.to_be_bytes());
    f.extend_from_slice(&s.dport.to_be_bytes());
    f.extend_from_slice(&s.seq.to_be_bytes());
    f.extend_from_slice(&s.ack.to_be_bytes());
    f.push(0x50);
    f.push(s.flags);
    f.extend_from_slice(&64240u16.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]);
    f.resize(f.len() + s.payload, 0x61);
    let mut sum = csum_add(0, &s.src.octets());
    sum = csum_add(sum, &s.dst.octets());
    sum += 6 + l4_len as u32;
    let c = csum_fold(csum_add(sum, &f[34..]));
    f[50..52].copy_from_slice(&c.to_be_bytes());
    f
}

/// Node 0's pipeline at the model's Services (flows and groups), a
/// datapath over it, and its ports.
fn node0_datapath(model: &Model, emc: bool) -> Result<(Datapath, usize, usize), BenchError> {
    let Some(node) = model.nodes.first() else {
        return Err(BenchError::Spec("no node".into()));
    };
    let d = desired::compute(&node.inputs(Arc::new(model.state.clone())));
    let pipeline = Arc::new(pipeline_with(&node.name, &d.lines, &d.groups)?);
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
    Ok((
        Datapath::new(pipeline, XlateEnv::with_ports(ports), cfg),
        d.lines.len(),
        d.groups.len(),
    ))
}

/// Connection `c`'s client (a local pod of node 0), source port and
/// destination.
fn conn(model: &Model, target: Target, c: usize, port_base: usize) -> Option<Seg> {
    let node = model.nodes.first()?;
    let client = node.ports.get(c % node.ports.len().max(1))?;
    let sport = u16::try_from(10_000 + (port_base + c / node.ports.len()) % 55_000).ok()?;
    let h = mix64(c as u64 ^ 0x5eed);
    let (dst, dport) = match target {
        Target::ClusterIp => {
            let s = model.spec.services;
            if s == 0 {
                return None;
            }
            (cluster_ip((h % s as u64) as usize), 80)
        }
        Target::PodIp => {
            // Never the client itself (a pod reaches its own address
            // without the switch).
            let n = model.pool.len().max(1);
            let p = (h % n as u64) as usize;
            let ip = match model.pool.get(p)?.1 {
                ip if Some(ip) == client.ip => model.pool.get((p + 1) % n)?.1,
                ip => ip,
            };
            (ip, HTTP_TARGET)
        }
    };
    let local = node.ports.iter().any(|p| p.ip == Some(dst));
    Some(Seg {
        dl_src: client.mac,
        dl_dst: if local {
            aflows::pod_mac(dst)
        } else {
            node.net.gateway_mac
        },
        src: client.ip?,
        dst,
        sport,
        dport,
        flags: TCP_SYN,
        seq: CLIENT_ISN,
        ack: 0,
        payload: 0,
    })
}

/// A sink that only counts, and drops (reject answers aside) nothing.
#[derive(Default)]
struct Count {
    outputs: u64,
    packet_ins: u64,
}

impl DatapathSink for Count {
    fn output(&mut self, _port: u32, _frame: &[u8], _tunnel: Option<TunnelMeta>) {
        self.outputs += 1;
    }
    fn packet_in(&mut self, _p: PacketIn<'_>) {
        self.packet_ins += 1;
    }
}

/// The result of a datapath measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct DpResult {
    pub services: usize,
    pub target: Target,
    pub emc: bool,
    pub flows: usize,
    pub groups: usize,
    /// Distinct packets cycled (established) or SYNs per trial (new).
    pub packets: usize,
    /// Median over trials, packets per second.
    pub pps: f64,
    pub trials: Vec<f64>,
    /// Counters of one round (established) or of the last trial (new).
    pub emc_hits: u64,
    pub megaflow_hits: u64,
    pub upcalls: u64,
    pub outputs: u64,
    /// Of the connections, how many went to an endpoint on node 0.
    pub local_share: f64,
}

impl DpResult {
    /// Nanoseconds per packet at the median.
    pub fn ns_per_packet(&self) -> f64 {
        1e9 / self.pps.max(1e-9)
    }

    /// (min, max) of the trials, packets per second.
    pub fn spread(&self) -> (f64, f64) {
        let min = self.trials.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.trials.iter().copied().fold(0.0, f64::max);
        (min, max)
    }

    pub fn json(&self, kind: &str) -> Value {
        let (min, max) = self.spread();
        json!({
            "kind": kind, "services": self.services, "target": self.target.name(),
            "emc": self.emc, "flows": self.flows, "groups": self.groups,
            "packets": self.packets, "pps": self.pps, "ns_per_packet": self.ns_per_packet(),
            "trials_pps": self.trials, "min_pps": min, "max_pps": max,
            "emc_hits": self.emc_hits, "megaflow_hits": self.megaflow_hits,
            "upcalls": self.upcalls, "outputs": self.outputs, "local_share": self.local_share,
        })
    }
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// Established connections (see the module doc): `conns` connections to
/// `target`, opened, then their data segments and answers cycled for
/// `trials` runs of `dur` each.
pub fn established(
    model: &Model,
    target: Target,
    conns: usize,
    emc: bool,
    trials: usize,
    dur: Duration,
) -> Result<DpResult, BenchError> {
    let (mut dp, flows, groups) = node0_datapath(model, emc)?;
    let node = model
        .nodes
        .first()
        .ok_or_else(|| BenchError::Spec("no node".into()))?;
    let mut ct = Conntrack::new(CtConfig::default());
    let now = 1_000_000_000u64;
    let mut steady: Vec<DpPacket<Vec<u8>>> = Vec::with_capacity(2 * conns);
    let mut local = 0usize;
    let mut opened = 0usize;
    for c in 0..4 * conns {
        if opened == conns {
            break;
        }
        let syn = conn(model, target, c, 0)
            .ok_or_else(|| BenchError::Spec(format!("no connection {c} to {target:?}")))?;
        // SYN: where does it go?
        let mut rec = RecordingSink::default();
        let cport = client_port(node, syn.src);
        let mut b = vec![DpPacket::from_frame(&tcp_frame(&syn), cport)];
        dp.process_batch(&mut b, &mut ct, now, &mut rec);
        // A client that got itself as the endpoint (hairpin, SNATed back
        // out of its own port): left out, its answer is not the endpoint's.
        if rec.outputs.first().is_some_and(|(p, _, _)| *p == cport) {
            continue;
        }
        opened += 1;
        let Some((port, frame, _)) = rec.outputs.first() else {
            return Err(BenchError::Datapath(format!(
                "the SYN of connection {c} ({}:{} -> {}:{}) was not forwarded",
                syn.src, syn.sport, syn.dst, syn.dport
            )));
        };
        let (ep, ep_port) = ip_dst_port(frame).ok_or_else(|| {
            BenchError::Datapath(format!("connection {c}: the output is not TCP/IPv4"))
        })?;
        // The answer comes from the endpoint: its local port, or the tunnel.
        let from_tunnel = *port == TUNNEL_OFPORT;
        local += usize::from(!from_tunnel);
        let reply_seg = |flags: u8, seq: u32, ack: u32, payload: usize| Seg {
            dl_src: aflows::pod_mac(ep),
            dl_dst: if from_tunnel {
                aflows::VIRTUAL_MAC
            } else {
                aflows::pod_mac(syn.src)
            },
            src: ep,
            dst: syn.src,
            sport: ep_port,
            dport: syn.sport,
            flags,
            seq,
            ack,
            payload,
        };
        let reply_pkt = |s: &Seg| -> DpPacket<Vec<u8>> {
            if from_tunnel {
                let mut p = DpPacket::from_frame(&tcp_frame(s), TUNNEL_OFPORT);
                let src_node = model
                    .nodes
                    .iter()
                    .find(|n| n.net.holds(ep.into()))
                    .map_or(Ipv4Addr::UNSPECIFIED, |n| n.ip);
                p.tunnel = Some(TunnelMeta::v4(0, u32::from(src_node), u32::from(node.ip)));
                p
            } else {
                let port = node
                    .ports
                    .iter()
                    .find(|p| p.ip == Some(ep))
                    .map_or(0, |p| p.ofport);
                DpPacket::from_frame(&tcp_frame(s), port)
            }
        };
        let synack = reply_pkt(&reply_seg(TCP_SYN | TCP_ACK, SERVER_ISN, CLIENT_ISN + 1, 0));
        let ack_seg = Seg {
            flags: TCP_ACK,
            seq: CLIENT_ISN + 1,
            ack: SERVER_ISN + 1,
            ..syn
        };
        let data_seg = Seg {
            flags: TCP_ACK | TCP_PSH,
            payload: PAYLOAD,
            ..ack_seg
        };
        let mut cnt = Count::default();
        let mut b = vec![synack, DpPacket::from_frame(&tcp_frame(&ack_seg), cport)];
        dp.process_batch(&mut b, &mut ct, now, &mut cnt);
        if cnt.outputs != 2 {
            return Err(BenchError::Datapath(format!(
                "connection {c} ({} -> {ep}:{ep_port}): the handshake's SYN-ACK and ACK gave {} outputs",
                syn.dst, cnt.outputs
            )));
        }
        steady.push(DpPacket::from_frame(&tcp_frame(&data_seg), cport));
        steady.push(reply_pkt(&reply_seg(
            TCP_ACK | TCP_PSH,
            SERVER_ISN + 1,
            CLIENT_ISN + 1,
            PAYLOAD,
        )));
    }
    if opened < conns {
        return Err(BenchError::Datapath(format!(
            "only {opened} of {conns} connections could be opened"
        )));
    }
    // Warm up, then one counted round.
    let mut sink = Count::default();
    for _ in 0..3 {
        for chunk in steady.chunks(BATCH) {
            let mut b = chunk.to_vec();
            dp.process_batch(&mut b, &mut ct, now, &mut sink);
        }
    }
    let s0 = dp.stats();
    let mut round = Count::default();
    for chunk in steady.chunks(BATCH) {
        let mut b = chunk.to_vec();
        dp.process_batch(&mut b, &mut ct, now, &mut round);
    }
    let s1 = dp.stats();
    if round.outputs != steady.len() as u64 {
        return Err(BenchError::Datapath(format!(
            "{} of {} established packets forwarded",
            round.outputs,
            steady.len()
        )));
    }
    let mut results = Vec::with_capacity(trials.max(1));
    for _ in 0..trials.max(1) {
        let mut spent = Duration::ZERO;
        let mut n = 0u64;
        let wall = Instant::now();
        while wall.elapsed() < dur {
            for chunk in steady.chunks(BATCH) {
                let mut b = chunk.to_vec();
                let t = Instant::now();
                dp.process_batch(&mut b, &mut ct, now, &mut sink);
                spent += t.elapsed();
                n += chunk.len() as u64;
            }
        }
        results.push(n as f64 / spent.as_secs_f64().max(1e-9));
    }
    Ok(DpResult {
        services: model.spec.services,
        target,
        emc,
        flows,
        groups,
        packets: steady.len(),
        pps: median(&results),
        trials: results,
        emc_hits: s1.emc_hits - s0.emc_hits,
        megaflow_hits: s1.megaflow_hits - s0.megaflow_hits,
        upcalls: s1.upcalls - s0.upcalls,
        outputs: round.outputs,
        local_share: local as f64 / conns.max(1) as f64,
    })
}

fn client_port(node: &NodeModel, ip: Ipv4Addr) -> u32 {
    node.ports
        .iter()
        .find(|p| p.ip == Some(ip))
        .map_or(0, |p| p.ofport)
}

/// The IPv4 destination and TCP destination port of an Ethernet frame.
fn ip_dst_port(frame: &[u8]) -> Option<(Ipv4Addr, u16)> {
    let ip: [u8; 4] = frame.get(30..34)?.try_into().ok()?;
    let ihl = usize::from(frame.get(14)? & 0x0f) * 4;
    let p = frame.get(14 + ihl + 2..14 + ihl + 4)?;
    Some((Ipv4Addr::from(ip), u16::from_be_bytes([p[0], p[1]])))
}

/// New connections (see the module doc): `trials` runs of `per_trial`
/// SYNs, each from a new source port, to `target`; a fresh conntrack
/// table per trial, the datapath (and its caches) kept.
pub fn new_connections(
    model: &Model,
    target: Target,
    per_trial: usize,
    trials: usize,
) -> Result<DpResult, BenchError> {
    let (mut dp, flows, groups) = node0_datapath(model, true)?;
    let node = model
        .nodes
        .first()
        .ok_or_else(|| BenchError::Spec("no node".into()))?;
    let now = 1_000_000_000u64;
    let per_pod = per_trial.div_ceil(node.ports.len().max(1));
    let make = |trial: usize| -> Result<Vec<DpPacket<Vec<u8>>>, BenchError> {
        (0..per_trial)
            .map(|c| {
                let s = conn(model, target, c, trial * per_pod)
                    .ok_or_else(|| BenchError::Spec(format!("no connection to {target:?}")))?;
                Ok(DpPacket::from_frame(
                    &tcp_frame(&s),
                    client_port(node, s.src),
                ))
            })
            .collect()
    };
    if per_pod * (trials + 2) > 55_000 {
        return Err(BenchError::Spec(format!(
            "{per_trial} SYNs x {} trials need more source ports than a pod has",
            trials + 2
        )));
    }
    // Warm-up trial: the caches hold what does not depend on the port.
    let mut sink = Count::default();
    let warm = make(0)?;
    let mut ct = Conntrack::new(CtConfig::default());
    for chunk in warm.chunks(BATCH) {
        let mut b = chunk.to_vec();
        dp.process_batch(&mut b, &mut ct, now, &mut sink);
    }
    let mut results = Vec::with_capacity(trials.max(1));
    let mut last = (0, 0, 0, 0);
    let mut local = 0.0;
    for trial in 1..=trials.max(1) {
        let pkts = make(trial)?;
        let mut ct = Conntrack::new(CtConfig::default());
        let s0 = dp.stats();
        let mut cnt = Count::default();
        let mut spent = Duration::ZERO;
        for chunk in pkts.chunks(BATCH) {
            let mut b = chunk.to_vec();
            let t = Instant::now();
            dp.process_batch(&mut b, &mut ct, now, &mut cnt);
            spent += t.elapsed();
        }
        let s1 = dp.stats();
        if cnt.outputs != pkts.len() as u64 {
            return Err(BenchError::Datapath(format!(
                "{} of {} SYNs forwarded",
                cnt.outputs,
                pkts.len()
            )));
        }
        results.push(pkts.len() as f64 / spent.as_secs_f64().max(1e-9));
        last = (
            s1.emc_hits - s0.emc_hits,
            s1.megaflow_hits - s0.megaflow_hits,
            s1.upcalls - s0.upcalls,
            cnt.outputs,
        );
        local = ct_local_share(&ct, node);
    }
    Ok(DpResult {
        services: model.spec.services,
        target,
        emc: true,
        flows,
        groups,
        packets: per_trial,
        pps: median(&results),
        trials: results,
        emc_hits: last.0,
        megaflow_hits: last.1,
        upcalls: last.2,
        outputs: last.3,
        local_share: local,
    })
}

/// Of the tracked connections, the share whose (translated) destination
/// is a pod of `node`.
fn ct_local_share(ct: &Conntrack, node: &NodeModel) -> f64 {
    let (mut n, mut l) = (0usize, 0usize);
    for e in ct.entries() {
        let std::net::IpAddr::V4(dst) = e.reply.src else {
            continue;
        };
        n += 1;
        l += usize::from(node.net.holds(dst.into()));
    }
    l as f64 / n.max(1) as f64
}

// ---------------------------------------------------------------------------
// Kubernetes objects and kube-proxy's rules.

/// The model's Services and Endpoints as Kubernetes objects (selector-less
/// Services with `clusterIP` and NodePorts as in the model; Endpoints with
/// every address, its `nodeName`, and the ports), the namespace first.
pub fn lab_objects(model: &Model) -> Vec<Value> {
    let mut out = vec![json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE},
    })];
    for (key, svc) in &model.state.services {
        let ports: Vec<Value> = svc
            .ports
            .iter()
            .map(|p| {
                let target = match p.protocol {
                    Protocol::Udp => DNS_TARGET,
                    _ => HTTP_TARGET,
                };
                let mut o = json!({"name": p.name, "protocol": proto_api(p.protocol),
                    "port": p.port, "targetPort": target});
                if let Some(np) = p.node_port {
                    o["nodePort"] = json!(np);
                }
                o
            })
            .collect();
        let kind = if svc.ports.iter().any(|p| p.node_port.is_some()) {
            "NodePort"
        } else {
            "ClusterIP"
        };
        let mut spec = json!({"type": kind, "ports": ports,
            "clusterIP": svc.cluster_ip.map(|ip| ip.to_string())});
        if kind == "NodePort" {
            spec["externalTrafficPolicy"] = json!("Cluster");
        }
        out.push(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": key.1, "namespace": key.0},
            "spec": spec,
        }));
        let Some(eps) = model.state.endpoints.get(key) else {
            continue;
        };
        let addresses: Vec<Value> = eps
            .endpoints
            .iter()
            .map(|e| json!({"ip": e.ip.to_string(), "nodeName": e.node_name}))
            .collect();
        let ports: Vec<Value> = eps
            .endpoints
            .first()
            .map(|e| {
                e.ports
                    .iter()
                    .map(|p| json!({"name": p.name, "protocol": proto_api(p.protocol), "port": p.port}))
                    .collect()
            })
            .unwrap_or_default();
        out.push(json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": key.1, "namespace": key.0},
            "subsets": [{"addresses": addresses, "ports": ports}],
        }));
    }
    out
}

fn proto_api(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
        Protocol::Sctp => "SCTP",
    }
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

/// What kube-proxy v1.20 (iptables mode, `--cluster-cidr` set, no
/// `--masquerade-all`) writes into the `nat` table for the model's
/// Services, derived from `pkg/proxy/iptables/proxier.go`
/// (`syncProxyRules`): per Service port with endpoints, in
/// `KUBE-SERVICES` a `KUBE-MARK-MASQ` rule for sources outside the cluster
/// CIDR and the jump to its `KUBE-SVC-*` chain; that chain, one rule per
/// endpoint (`-m statistic --mode random` but the last); per endpoint a
/// `KUBE-SEP-*` chain with its `KUBE-MARK-MASQ` (hairpin) and `DNAT`
/// rules; per NodePort (`Cluster`), in `KUBE-NODEPORTS` a
/// `KUBE-MARK-MASQ` and a jump. Returns (rules, chains) of the Services
/// alone (kube-proxy's fixed chains and the `kubernetes` Service not
/// counted).
pub fn kube_proxy_expected(spec: &ModelSpec) -> (usize, usize) {
    let (tcp, udp, np) = spec.port_counts();
    let ports = tcp + udp;
    let e = spec.endpoints;
    let rules = ports * (2 + e + 2 * e) + np * 2;
    let chains = ports * (1 + e);
    (rules, chains)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_distinct_and_spread() {
        let m = Model::new(ModelSpec::with_services(50)).unwrap();
        for i in 0..50 {
            let pods = m.endpoint_pods(i);
            assert_eq!(pods.len(), 10);
            let mut nodes: Vec<usize> = pods.iter().map(|&p| m.pool[p].0).collect();
            nodes.sort();
            nodes.dedup();
            assert_eq!(nodes.len(), 10, "service {i}: {pods:?}");
        }
        let c = m.changed_service();
        let m2 = m.with_endpoint_change(c);
        assert_ne!(
            m.state.endpoints.get(&(NAMESPACE.into(), service_name(c))),
            m2.state.endpoints.get(&(NAMESPACE.into(), service_name(c)))
        );
    }

    #[test]
    fn bundle_round_trips() {
        let old: HashSet<String> = ["table=0,priority=5,ip actions=drop".to_string()].into();
        let want: HashSet<String> = ["table=0,priority=6,ip actions=drop".to_string()].into();
        let g: HashSet<String> =
            ["group_id=7,type=select,bucket=bucket_id:1,actions=drop".to_string()].into();
        let (text, n) = bundle_text(&old, &want, &HashSet::new(), &g);
        assert_eq!(n, 3, "{text}");
        let mods = parse_bundle(&text, &ParseContext::default()).unwrap();
        assert_eq!(mods.len(), 3);
        assert!(parse_bundle("group frob 1", &ParseContext::default()).is_err());
    }

    #[test]
    fn bad_specs_are_errors() {
        for spec in [
            ModelSpec {
                nodes: 0,
                ..ModelSpec::with_services(1)
            },
            ModelSpec {
                endpoints: 2000,
                ..ModelSpec::with_services(1)
            },
            ModelSpec {
                node_port_every: 1,
                ..ModelSpec::with_services(5000)
            },
        ] {
            assert!(Model::new(spec).is_err(), "{spec:?}");
        }
    }
}
