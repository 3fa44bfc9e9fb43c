//! `/metrics`: oxvs-agent's metrics in the Prometheus text format.
//!
//! ## What is exported
//!
//! | family | type | labels | from |
//! |---|---|---|---|
//! | `oxvs_cni_requests_total` | counter | `verb`, `result` (`success`, `error`) | [`record_cni`] |
//! | `oxvs_cni_request_duration_seconds` | histogram | `verb`, `result` | [`record_cni`] |
//! | `oxvs_agent_pods` | gauge | `state` (`ready`, `pending`) | the attachment records |
//! | `oxvs_networkpolicies` | gauge | | the cluster snapshot |
//! | `oxvs_networkpolicy_rules` | gauge | `direction` | [`Agent::rules`] |
//! | `oxvs_agent_flows` | gauge | `feature` | the switch's flows, by cookie feature |
//! | `oxvs_networkpolicy_rule_packets_total`, `..._bytes_total` | counter | `namespace`, `policy`, `direction`, `rule` | IngressMetric/EgressMetric flows |
//! | `oxvs_networkpolicy_denied_packets_total`, `..._bytes_total` | counter | `namespace`, `pod`, `direction` | IngressDefaultRule/EgressDefaultRule isolation drops |
//! | `oxvs_agent_tunnel_drops_total` | counter | `reason` (`unknown_source`, `pod_to_tunnel_port`) | the tunnel guard's drop flows (cookies `0x3<<48 \| 3`, `\| 4`) |
//! | `oxvs_networkpolicy_refused` | gauge | `namespace`, `policy` | policies the translator refused on this node (over `--max-policy-flows`), 1 each |
//! | `oxvs_networkpolicy_refusals_total` | counter | | [`record_policy_refusal`]: a policy newly refused |
//! | `oxvs_agent_nodes_refused` | gauge | `node`, `reason` | Node objects refused ([`crate::nodes`]), 1 each |
//! | `oxvs_agent_node_refusals_total` | counter | `reason` | [`record_node_refusal`]: a Node newly refused (or for a new reason) |
//! | `oxvs_service_connections_total` | counter | `namespace`, `service`, `port`, `protocol`, `result` (`balanced`, `no_endpoints`) | the Service proxy's ServiceLB flows: new connections sent to an endpoint, or refused for want of one |
//! | `oxvs_service_ready_endpoints` | gauge | `namespace`, `service`, `port`, `protocol` | the Service proxy's view of each Service port (all nodes' ready endpoints) |
//! | `oxvs_agent_switch_up` | gauge | | 1 if this scrape read the switch |
//! | `oxvs_agent_switch_scrape_errors_total` | counter | | scrapes that could not read the switch |
//!
//! `rule` is the rule's index in the policy's `spec.ingress` /
//! `spec.egress`. Packets *allowed* by a rule are the counters of the
//! rule's metric flow (cookie [`cookie::rule`], table IngressMetric
//! or EgressMetric); packets *denied* to or from an isolated pod are the
//! counters of its isolation drop flow (cookie [`cookie::isolation`],
//! table IngressDefaultRule or EgressDefaultRule). Both are flow counters
//! in the switch: they survive agent restarts and unchanged-flow resyncs,
//! and restart from zero when a flow is re-created (a policy change that
//! renumbers a rule, a pod re-attached), which Prometheus treats as a
//! counter reset.
//!
//! ## The CNI path is never blocked
//!
//! CNI counts and latencies are process-wide atomics ([`record_cni`]: a
//! few relaxed `fetch_add`s, called by the CNI server when a request is
//! answered). Everything else is read at scrape time: the agent's state
//! through its short `std` mutexes (cloned, not held), the switch's flows
//! with one `dump-flows` on a separate connection, from the blocking pool,
//! with a [`SWITCH_TIMEOUT`] deadline. Scrapes are serialised among
//! themselves (one `dump-flows` at a time, whatever the scrape rate); if
//! the switch does not answer in time the scrape still answers, with
//! `oxvs_agent_switch_up 0` and without the switch-derived families'
//! samples.
//!
//! The HTTP side is a task per connection on the agent's runtime: one
//! request per connection, `GET`/`HEAD /metrics`, a 2 s deadline to read
//! the request head.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use oxvs_api::listen::ListenStats;
use oxvs_api::metrics::{self as prom, Exposition};
use oxvs_api::{Client, DumpFlowsResult, FlowEntry, Request};
use oxvs_pipeline::names;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::agent::Agent;
use crate::cookie::{self, Feature, POD_TO_TUNNEL, TUNNEL_UNKNOWN_SOURCE};
use crate::nodes::{NodeProblem, RefusedNode};
use crate::policy::{Direction, Refusal, RuleRef};
use crate::state::{AttachState, Attachment};

/// Default listen address of `--metrics-addr`.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9531";

/// Deadline of the scrape's call to the switch.
pub const SWITCH_TIMEOUT: Duration = Duration::from_secs(2);

/// Upper bounds (seconds) of the CNI latency buckets: 1 ms to 10 s.
pub const CNI_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The CNI verbs, in label order.
pub const CNI_VERBS: [&str; 5] = ["ADD", "DEL", "CHECK", "GC", "STATUS"];

const RESULTS: [&str; 2] = ["success", "error"];
const N_BUCKETS: usize = CNI_BUCKETS.len() + 1;

/// One (verb, result) latency series: per-bucket (not cumulative) counts
/// and the sum in nanoseconds. The request count is the sum of the
/// buckets, so `_count`, the `+Inf` bucket and `oxvs_cni_requests_total`
/// always agree in one scrape.
struct Series {
    buckets: [AtomicU64; N_BUCKETS],
    sum_ns: AtomicU64,
}

impl Series {
    const fn new() -> Series {
        Series {
            buckets: [const { AtomicU64::new(0) }; N_BUCKETS],
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// Process-wide: one agent per process.
static CNI: [[Series; 2]; CNI_VERBS.len()] =
    [const { [Series::new(), Series::new()] }; CNI_VERBS.len()];

static SWITCH_SCRAPE_ERRORS: AtomicU64 = AtomicU64::new(0);

/// Policies newly refused by the translator.
static POLICY_REFUSALS: AtomicU64 = AtomicU64::new(0);

/// Nodes newly refused, by reason ([`NodeProblem::REASONS`] order).
static NODE_REFUSALS: [AtomicU64; NodeProblem::REASONS.len()] =
    [const { AtomicU64::new(0) }; NodeProblem::REASONS.len()];

/// Counts a NetworkPolicy newly refused (too many flows).
pub fn record_policy_refusal() {
    POLICY_REFUSALS.fetch_add(1, Ordering::Relaxed);
}

/// Counts a Node newly refused for `reason` ([`NodeProblem::reason`]).
pub fn record_node_refusal(reason: &str) {
    if let Some(i) = NodeProblem::REASONS.iter().position(|r| *r == reason) {
        NODE_REFUSALS[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Records one answered CNI request (`verb` as in `CNI_COMMAND`; an
/// unknown verb is not recorded). Lock-free; for the CNI server.
pub fn record_cni(verb: &str, ok: bool, seconds: f64) {
    let Some(v) = CNI_VERBS.iter().position(|x| *x == verb) else {
        return;
    };
    let s = &CNI[v][usize::from(!ok)];
    let seconds = if seconds.is_finite() {
        seconds.max(0.0)
    } else {
        0.0
    };
    let b = CNI_BUCKETS
        .iter()
        .position(|le| seconds <= *le)
        .unwrap_or(CNI_BUCKETS.len());
    s.buckets[b].fetch_add(1, Ordering::Relaxed);
    // Saturates at ~584 years.
    s.sum_ns
        .fetch_add((seconds * 1e9).round() as u64, Ordering::Relaxed);
}

/// A copy of one (verb, result) series.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CniSeries {
    pub verb: &'static str,
    pub result: &'static str,
    /// Per bucket (not cumulative), `CNI_BUCKETS.len() + 1` long.
    pub buckets: Vec<u64>,
    pub sum_ns: u64,
}

/// The CNI counters now, every (verb, result) pair.
pub fn cni_snapshot() -> Vec<CniSeries> {
    let mut out = Vec::new();
    for (v, verb) in CNI_VERBS.iter().enumerate() {
        for (r, result) in RESULTS.iter().enumerate() {
            let s = &CNI[v][r];
            out.push(CniSeries {
                verb,
                result,
                buckets: s
                    .buckets
                    .iter()
                    .map(|b| b.load(Ordering::Relaxed))
                    .collect(),
                sum_ns: s.sum_ns.load(Ordering::Relaxed),
            });
        }
    }
    out
}

/// What a scrape reads from the agent (cloned out of its locks).
#[derive(Clone, Debug, Default)]
pub struct AgentView {
    pub attachments: Vec<Attachment>,
    pub rules: Vec<RuleRef>,
    pub policies: usize,
    pub refused_policies: Vec<Refusal>,
    pub refused_nodes: Vec<RefusedNode>,
    /// The Service ports the proxy serves (empty without `--proxy`).
    pub services: Vec<ServicePortRef>,
}

/// A Service port as the metrics name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortRef {
    /// Its group id (the object of its flows' cookie).
    pub group_id: u32,
    pub namespace: String,
    pub service: String,
    pub port: String,
    pub protocol: &'static str,
    pub ready_endpoints: usize,
}

impl AgentView {
    pub fn take(agent: &Agent) -> AgentView {
        let cluster = agent.cluster();
        let services = match agent.config().proxy {
            true => crate::proxy::service_ports(&cluster, &agent.config().node_name)
                .into_iter()
                .map(|sp| ServicePortRef {
                    group_id: sp.group_id,
                    namespace: sp.service.0,
                    service: sp.service.1,
                    port: match sp.port_name.is_empty() {
                        true => sp.port.to_string(),
                        false => sp.port_name,
                    },
                    protocol: sp.protocol.keyword(),
                    ready_endpoints: sp.endpoints.len(),
                })
                .collect(),
            false => Vec::new(),
        };
        AgentView {
            attachments: agent.attachments(),
            rules: agent.rules(),
            policies: cluster.policies.len(),
            refused_policies: agent.refused_policies(),
            refused_nodes: agent.refused_nodes(),
            services,
        }
    }
}

fn direction_label(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "ingress",
        Direction::Egress => "egress",
    }
}

/// The name of a cookie's feature (high 16 bits), for flows the agent makes.
fn feature_name(cookie: u64) -> Option<&'static str> {
    Feature::of(cookie).map(Feature::metric_name)
}

/// Writes the exposition. `flows` is the switch's `dump-flows` (`None`:
/// the switch could not be read this time).
pub fn encode(cni: &[CniSeries], view: &AgentView, flows: Option<&[FlowEntry]>) -> String {
    let mut e = Exposition::new();
    e.gauge(
        "oxvs_build_info",
        "Version of oxvs-agent (the value is always 1).",
    )
    .sample(&[("version", env!("CARGO_PKG_VERSION"))], 1.0);

    {
        let mut f = e.counter(
            "oxvs_cni_requests_total",
            "CNI requests answered, by verb and result.",
        );
        for s in cni {
            f.int(
                &[("verb", s.verb), ("result", s.result)],
                s.buckets.iter().sum(),
            );
        }
    }
    {
        let mut f = e.histogram(
            "oxvs_cni_request_duration_seconds",
            "Time to answer a CNI request, by verb and result.",
        );
        for s in cni {
            f.histogram(
                &[("verb", s.verb), ("result", s.result)],
                &CNI_BUCKETS,
                &s.buckets,
                s.sum_ns as f64 / 1e9,
            );
        }
    }

    let ready = view
        .attachments
        .iter()
        .filter(|a| a.state == AttachState::Ready)
        .count();
    e.gauge(
        "oxvs_agent_pods",
        "Pod interfaces attached by this agent (pending: ADD in progress or interrupted).",
    )
    .int(&[("state", "ready")], ready as u64)
    .int(
        &[("state", "pending")],
        (view.attachments.len() - ready) as u64,
    );
    e.gauge(
        "oxvs_networkpolicies",
        "NetworkPolicies in the cluster snapshot the agent follows.",
    )
    .int(&[], view.policies as u64);
    {
        let mut g = e.gauge(
            "oxvs_service_ready_endpoints",
            "Ready endpoints of a Service port the Service proxy serves (on every node).",
        );
        for sp in &view.services {
            g.int(
                &[
                    ("namespace", &sp.namespace),
                    ("service", &sp.service),
                    ("port", &sp.port),
                    ("protocol", sp.protocol),
                ],
                sp.ready_endpoints as u64,
            );
        }
    }
    {
        let mut f = e.gauge(
            "oxvs_networkpolicy_rules",
            "NetworkPolicy rules installed on this node (rules with an id).",
        );
        for d in [Direction::Ingress, Direction::Egress] {
            let n = view.rules.iter().filter(|r| r.direction == d).count();
            f.int(&[("direction", direction_label(d))], n as u64);
        }
    }

    {
        let mut f = e.gauge(
            "oxvs_networkpolicy_refused",
            "NetworkPolicies refused on this node: they would add more flows than --max-policy-flows (their pods stay isolated).",
        );
        for r in &view.refused_policies {
            f.int(&[("namespace", &r.policy.0), ("policy", &r.policy.1)], 1);
        }
    }
    e.counter(
        "oxvs_networkpolicy_refusals_total",
        "NetworkPolicies newly refused on this node (too many flows).",
    )
    .int(&[], POLICY_REFUSALS.load(Ordering::Relaxed));
    {
        let mut f = e.gauge(
            "oxvs_agent_nodes_refused",
            "Node objects refused (bad or overlapping podCIDR, bad InternalIP): no route or tunnel flow for them.",
        );
        for r in &view.refused_nodes {
            f.int(&[("node", &r.name), ("reason", r.problem.reason())], 1);
        }
    }
    {
        let mut f = e.counter(
            "oxvs_agent_node_refusals_total",
            "Node objects newly refused, by reason.",
        );
        for (i, reason) in NodeProblem::REASONS.iter().enumerate() {
            f.int(
                &[("reason", reason)],
                NODE_REFUSALS[i].load(Ordering::Relaxed),
            );
        }
    }

    e.gauge(
        "oxvs_agent_switch_up",
        "Whether this scrape could read oxvs-switchd's flows (1) or not (0).",
    )
    .int(&[], u64::from(flows.is_some()));
    e.counter(
        "oxvs_agent_switch_scrape_errors_total",
        "Scrapes that could not read oxvs-switchd's flows.",
    )
    .int(&[], SWITCH_SCRAPE_ERRORS.load(Ordering::Relaxed));

    let flows = flows.unwrap_or_default();
    encode_flows(&mut e, view, flows);
    e.finish()
}

fn encode_flows(e: &mut Exposition, view: &AgentView, flows: &[FlowEntry]) {
    let mut by_feature: BTreeMap<&str, u64> = BTreeMap::new();
    // rule id -> (packets, bytes)
    let mut allowed: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    // (ofport, direction) -> (packets, bytes)
    let mut denied: BTreeMap<(u32, Direction), (u64, u64)> = BTreeMap::new();
    // The tunnel guard's drops, by reason.
    let mut tunnel_drops: [(&str, u64, u64); 2] = [
        ("unknown_source", TUNNEL_UNKNOWN_SOURCE, 0),
        ("pod_to_tunnel_port", POD_TO_TUNNEL, 0),
    ];
    // Service port group id -> (balanced, no endpoints) new connections.
    let mut service_conns: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for f in flows {
        if f.table == names::SERVICE_LB.id {
            if let Some(g) = Feature::Service.object(f.cookie) {
                let c = service_conns.entry(g as u32).or_default();
                match f.actions.contains("group:") {
                    true => c.0 += f.n_packets,
                    false => c.1 += f.n_packets,
                }
            }
        }
        for (_, cookie, n) in &mut tunnel_drops {
            if f.cookie == *cookie {
                *n += f.n_packets;
            }
        }
        if let Some(n) = feature_name(f.cookie) {
            *by_feature.entry(n).or_default() += 1;
        }
        let metric_table =
            f.table == names::INGRESS_METRIC.id || f.table == names::EGRESS_METRIC.id;
        if metric_table {
            if let Some(id) = cookie::rule_id(f.cookie) {
                let c = allowed.entry(id).or_default();
                c.0 += f.n_packets;
                c.1 += f.n_bytes;
            }
        }
        let dir = if f.table == names::INGRESS_DEFAULT_RULE.id {
            Some(Direction::Ingress)
        } else if f.table == names::EGRESS_DEFAULT_RULE.id {
            Some(Direction::Egress)
        } else {
            None
        };
        if let (Some(dir), Some(port)) = (dir, cookie::isolation_port(f.cookie)) {
            if port != 0 {
                let c = denied.entry((port, dir)).or_default();
                c.0 += f.n_packets;
                c.1 += f.n_bytes;
            }
        }
    }
    {
        let mut c = e.counter(
            "oxvs_agent_tunnel_drops_total",
            "Packets the tunnel guard dropped: from the tunnel with an outer source that is no known node (unknown_source), from a pod to a node's VXLAN port (pod_to_tunnel_port).",
        );
        for (reason, _, n) in &tunnel_drops {
            c.int(&[("reason", reason)], *n);
        }
    }
    {
        let mut g = e.gauge(
            "oxvs_agent_flows",
            "Flows of this agent in oxvs-switchd, by feature (the cookie's high 16 bits).",
        );
        for (feature, n) in &by_feature {
            g.int(&[("feature", feature)], *n);
        }
    }

    {
        let mut c = e.counter(
            "oxvs_service_connections_total",
            "New connections to a Service port through the Service proxy (its ServiceLB flows' n_packets): sent to an endpoint (balanced), or refused for want of a ready endpoint (no_endpoints).",
        );
        for sp in &view.services {
            let (ok, none) = service_conns.get(&sp.group_id).copied().unwrap_or_default();
            for (result, n) in [("balanced", ok), ("no_endpoints", none)] {
                c.int(
                    &[
                        ("namespace", &sp.namespace),
                        ("service", &sp.service),
                        ("port", &sp.port),
                        ("protocol", sp.protocol),
                        ("result", result),
                    ],
                    n,
                );
            }
        }
    }

    let rules: BTreeMap<u32, &RuleRef> = view.rules.iter().map(|r| (r.id, r)).collect();
    let rule_samples: Vec<([String; 4], (u64, u64))> = allowed
        .iter()
        .filter_map(|(id, c)| {
            let r = rules.get(id)?;
            Some((
                [
                    r.policy.0.clone(),
                    r.policy.1.clone(),
                    direction_label(r.direction).to_owned(),
                    r.index.to_string(),
                ],
                *c,
            ))
        })
        .collect();
    for (name, help, bytes) in [
        (
            "oxvs_networkpolicy_rule_packets_total",
            "Packets allowed by a NetworkPolicy rule (its metric flow's n_packets).",
            false,
        ),
        (
            "oxvs_networkpolicy_rule_bytes_total",
            "Bytes allowed by a NetworkPolicy rule (its metric flow's n_bytes).",
            true,
        ),
    ] {
        let mut f = e.counter(name, help);
        for (l, (p, b)) in &rule_samples {
            f.int(
                &[
                    ("namespace", &l[0]),
                    ("policy", &l[1]),
                    ("direction", &l[2]),
                    ("rule", &l[3]),
                ],
                if bytes { *b } else { *p },
            );
        }
    }

    let pods: BTreeMap<u32, &Attachment> = view
        .attachments
        .iter()
        .filter_map(|a| Some((a.ofport?, a)))
        .collect();
    let denied_samples: Vec<([String; 3], (u64, u64))> = denied
        .iter()
        .filter_map(|((port, dir), c)| {
            let a = pods.get(port)?;
            let pod = if a.pod_name.is_empty() {
                a.container_id.clone()
            } else {
                a.pod_name.clone()
            };
            Some((
                [
                    a.pod_namespace.clone(),
                    pod,
                    direction_label(*dir).to_owned(),
                ],
                *c,
            ))
        })
        .collect();
    for (name, help, bytes) in [
        (
            "oxvs_networkpolicy_denied_packets_total",
            "Packets dropped because a pod is isolated by NetworkPolicy and no rule allowed them.",
            false,
        ),
        (
            "oxvs_networkpolicy_denied_bytes_total",
            "Bytes dropped because a pod is isolated by NetworkPolicy and no rule allowed them.",
            true,
        ),
    ] {
        let mut f = e.counter(name, help);
        for (l, (p, b)) in &denied_samples {
            f.int(
                &[("namespace", &l[0]), ("pod", &l[1]), ("direction", &l[2])],
                if bytes { *b } else { *p },
            );
        }
    }
}

/// Reads the switch's flows (blocking pool, [`SWITCH_TIMEOUT`]).
async fn switch_flows(agent: &Agent) -> Option<Vec<FlowEntry>> {
    let path = agent.config().switchd_socket.clone();
    let call = tokio::task::spawn_blocking(move || {
        let mut c = Client::connect(&path)?;
        c.set_timeout(SWITCH_TIMEOUT);
        c.call_as::<DumpFlowsResult>(&Request::DumpFlows {
            table: None,
            names: false,
            stats: true,
        })
    });
    // The client's own deadline bounds the call; this one bounds the wait
    // for a blocking-pool thread too.
    match tokio::time::timeout(SWITCH_TIMEOUT + Duration::from_secs(1), call).await {
        Ok(Ok(Ok(r))) => Some(r.flows),
        Ok(Ok(Err(e))) => {
            SWITCH_SCRAPE_ERRORS.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("metrics: cannot read the switch's flows: {e}");
            None
        }
        Ok(Err(e)) => {
            SWITCH_SCRAPE_ERRORS.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("metrics: the switch call task failed: {e}");
            None
        }
        Err(_) => {
            SWITCH_SCRAPE_ERRORS.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("metrics: the switch did not answer within {SWITCH_TIMEOUT:?}");
            None
        }
    }
}

/// The exposition now (reads the switch).
pub async fn render(agent: &Agent) -> String {
    let flows = switch_flows(agent).await;
    let view = AgentView::take(agent);
    encode(&cni_snapshot(), &view, flows.as_deref())
}

/// The default cap and idle timeout of the agent's `/metrics`: a handful
/// of scrapers at once, 5 s to send a request head.
pub const DEFAULT_LIMITS: oxvs_api::listen::Limits = oxvs_api::listen::Limits {
    max_connections: 8,
    idle_timeout: Duration::from_secs(5),
};

/// Serves `/metrics` on `listener` until the task is dropped: at most the
/// gate's cap at once (one more gets 503 + `Retry-After`), a request head
/// within its idle timeout (else 408). Also exports the counters of
/// `listeners` (the CNI and API sockets) and its own, as
/// `oxvs_listener_*{socket}`.
pub async fn serve(
    agent: Arc<Agent>,
    listener: TcpListener,
    gate: oxvs_api::listen::Gate,
    listeners: Vec<(&'static str, Arc<ListenStats>)>,
) {
    let scrape = Arc::new(tokio::sync::Mutex::new(()));
    let mut listeners = listeners;
    listeners.push(("metrics", gate.stats()));
    let listeners = Arc::new(listeners);
    let idle = gate.limits().idle_timeout;
    crate::listen::serve_gated(
        listener,
        gate,
        "metrics",
        prom::busy_response(),
        move |stream| {
            let agent = agent.clone();
            let scrape = scrape.clone();
            let listeners = listeners.clone();
            async move { serve_one(&agent, &scrape, &listeners, stream, idle).await }
        },
    )
    .await
}

async fn serve_one<S: AsyncRead + AsyncWrite + Unpin>(
    agent: &Agent,
    scrape: &tokio::sync::Mutex<()>,
    listeners: &[(&'static str, Arc<ListenStats>)],
    mut stream: S,
    idle: Duration,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let read_head = async {
        loop {
            if let Some(n) = prom::request_head_end(&buf) {
                return Ok(Some(n));
            }
            if buf.len() > prom::MAX_REQUEST_HEAD {
                return Ok(None);
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "closed before a full request",
                ));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    // The whole head within the idle timeout (a client trickling one byte
    // at a time is idle too); 408 and counted as idle otherwise.
    let mut idled = None;
    let resp = match tokio::time::timeout(idle, read_head).await {
        Ok(Err(e)) if crate::listen::is_idle(&e) => {
            idled = Some(e);
            prom::http_response(408, "text/plain", b"request timeout\n", false)
        }
        Err(_) => {
            idled = Some(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                crate::listen::Idle(idle),
            ));
            prom::http_response(408, "text/plain", b"request timeout\n", false)
        }
        Ok(Err(e)) => return Err(e),
        Ok(Ok(None)) => prom::http_response(413, "text/plain", b"request head too long\n", false),
        Ok(Ok(Some(n))) => {
            let head = &buf[..n];
            let wanted = matches!(prom::parse_request_head(head),
                Ok(r) if r.path == "/metrics" && (r.method == "GET" || r.method == "HEAD"));
            let text = if wanted {
                let _one_at_a_time = scrape.lock().await;
                let mut text = render(agent).await;
                let mut e = Exposition::new();
                let l: Vec<(&str, &ListenStats)> =
                    listeners.iter().map(|(n, s)| (*n, s.as_ref())).collect();
                prom::encode_listeners(&mut e, &l);
                text.push_str(&e.finish());
                text
            } else {
                String::new()
            };
            prom::respond(head, move || text)
        }
    };
    stream.write_all(&resp).await?;
    stream.shutdown().await?;
    match idled {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn flow(table: u8, cookie: u64, n_packets: u64) -> FlowEntry {
        FlowEntry {
            table,
            table_name: None,
            priority: 200,
            cookie,
            duration_ns: 0,
            n_packets,
            n_bytes: n_packets * 100,
            idle_age_s: None,
            matches: String::new(),
            actions: String::new(),
        }
    }

    fn attachment(name: &str, ofport: u32, state: AttachState) -> Attachment {
        Attachment {
            container_id: format!("c-{name}"),
            ifname: "eth0".into(),
            netns: String::new(),
            host_ifname: format!("h-{name}"),
            pod_namespace: "ns1".into(),
            pod_name: name.into(),
            ipv4: Some(crate::state::PodIpv4 {
                ip: Ipv4Addr::new(10, 0, 0, 2),
                prefix_len: 24,
                gateway: Ipv4Addr::new(10, 0, 0, 1),
            }),
            mac: "0a:58:0a:00:00:02".into(),
            mtu: 1450,
            ofport: Some(ofport),
            state,
            ipv6: None,
            qdisc: None,
        }
    }

    fn view() -> AgentView {
        AgentView {
            attachments: vec![
                attachment("web", 5, AttachState::Ready),
                attachment("db", 6, AttachState::Ready),
                attachment("new", 7, AttachState::Pending),
            ],
            rules: vec![
                RuleRef {
                    id: 1,
                    policy: ("ns1".into(), "allow-web".into()),
                    uid: "u1".into(),
                    direction: Direction::Ingress,
                    index: 0,
                },
                RuleRef {
                    id: 2,
                    policy: ("ns1".into(), "egress-dns".into()),
                    uid: "u2".into(),
                    direction: Direction::Egress,
                    index: 3,
                },
            ],
            policies: 2,
            refused_policies: vec![],
            refused_nodes: vec![],
            services: vec![ServicePortRef {
                group_id: 77,
                namespace: "shop".into(),
                service: "web".into(),
                port: "http".into(),
                protocol: "tcp",
                ready_endpoints: 2,
            }],
        }
    }

    fn cni(verb: &'static str, result: &'static str, buckets: &[u64], sum_ns: u64) -> CniSeries {
        let mut b = buckets.to_vec();
        b.resize(N_BUCKETS, 0);
        CniSeries {
            verb,
            result,
            buckets: b,
            sum_ns,
        }
    }

    #[test]
    fn service_counters_come_from_the_service_lb_flows() {
        let mut balanced = flow(names::SERVICE_LB.id, cookie::service(77), 9);
        balanced.actions = "group:77".into();
        let mut nodeport = flow(names::SERVICE_LB.id, cookie::service(77), 3);
        nodeport.actions = "load:0x1->NXM_NX_REG0[20],group:78".into();
        let mut refused = flow(names::SERVICE_LB.id, cookie::service(77), 2);
        refused.actions = "drop".into();
        // Another table's flow with the cookie does not count.
        let other = flow(names::EGRESS_RULE.id, cookie::service(77), 50);
        let text = encode(&[], &view(), Some(&[balanced, nodeport, refused, other]));
        let p = prom::parse(&text).unwrap();
        let labels = |result| {
            [
                ("namespace", "shop"),
                ("service", "web"),
                ("port", "http"),
                ("protocol", "tcp"),
                ("result", result),
            ]
        };
        let v = |name: &str, l: &[(&str, &str)]| p.find(name, l).next().unwrap().value;
        assert_eq!(
            v("oxvs_service_connections_total", &labels("balanced")),
            12.0
        );
        assert_eq!(
            v("oxvs_service_connections_total", &labels("no_endpoints")),
            2.0
        );
        assert_eq!(
            v("oxvs_service_ready_endpoints", &labels("balanced")[..4]),
            2.0
        );
    }

    #[test]
    fn policy_counters_come_from_the_right_flows() {
        let flows = vec![
            flow(names::INGRESS_METRIC.id, cookie::rule(1), 10),
            flow(names::EGRESS_METRIC.id, cookie::rule(2), 4),
            // A rule flow outside the metric tables does not count.
            flow(names::INGRESS_RULE.id, cookie::rule(1), 99),
            // A metric flow of an unknown rule id is left out.
            flow(names::INGRESS_METRIC.id, cookie::rule(42), 7),
            flow(names::INGRESS_DEFAULT_RULE.id, cookie::isolation(5), 3),
            flow(names::EGRESS_DEFAULT_RULE.id, cookie::isolation(6), 2),
            // Node exemption (port 0) and an unknown port are not pods.
            flow(names::INGRESS_RULE.id, cookie::NODE_EXEMPTION, 50),
            flow(names::INGRESS_DEFAULT_RULE.id, cookie::isolation(99), 8),
            flow(0, cookie::DEFAULTS, 1),
            flow(10, cookie::pod(5), 1),
            flow(10, 0, 1), // not the agent's
            flow(0, cookie::TUNNEL_UNKNOWN_SOURCE, 6),
            flow(31, cookie::POD_TO_TUNNEL, 2),
            flow(31, cookie::POD_TO_TUNNEL, 3),
        ];
        let series = vec![
            cni("ADD", "success", &[0, 0, 1, 2], 30_000_000),
            cni(
                "ADD",
                "error",
                &[0; 13].iter().copied().chain([1]).collect::<Vec<_>>(),
                12_000_000_000,
            ),
        ];
        let text = encode(&series, &view(), Some(&flows));
        let p = prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let v = |n: &str, l: &[(&str, &str)]| p.value(n, l).unwrap_or(-1.0);
        let rule1 = [
            ("namespace", "ns1"),
            ("policy", "allow-web"),
            ("direction", "ingress"),
            ("rule", "0"),
        ];
        assert_eq!(v("oxvs_networkpolicy_rule_packets_total", &rule1), 10.0);
        assert_eq!(v("oxvs_networkpolicy_rule_bytes_total", &rule1), 1000.0);
        let rule2 = [
            ("namespace", "ns1"),
            ("policy", "egress-dns"),
            ("direction", "egress"),
            ("rule", "3"),
        ];
        assert_eq!(v("oxvs_networkpolicy_rule_packets_total", &rule2), 4.0);
        assert_eq!(
            p.find("oxvs_networkpolicy_rule_packets_total", &[]).count(),
            2
        );
        let web_in = [
            ("namespace", "ns1"),
            ("pod", "web"),
            ("direction", "ingress"),
        ];
        assert_eq!(v("oxvs_networkpolicy_denied_packets_total", &web_in), 3.0);
        let db_out = [("namespace", "ns1"), ("pod", "db"), ("direction", "egress")];
        assert_eq!(v("oxvs_networkpolicy_denied_packets_total", &db_out), 2.0);
        assert_eq!(
            p.find("oxvs_networkpolicy_denied_packets_total", &[])
                .count(),
            2
        );
        assert_eq!(v("oxvs_agent_flows", &[("feature", "policy_rule")]), 4.0);
        assert_eq!(
            v("oxvs_agent_flows", &[("feature", "policy_isolation")]),
            4.0
        );
        assert_eq!(v("oxvs_agent_flows", &[("feature", "pipeline")]), 1.0);
        assert_eq!(p.sum("oxvs_agent_flows", &[]), 13.0);
        let drops = |r: &str| v("oxvs_agent_tunnel_drops_total", &[("reason", r)]);
        assert_eq!(drops("unknown_source"), 6.0);
        assert_eq!(drops("pod_to_tunnel_port"), 5.0);
        assert_eq!(v("oxvs_agent_pods", &[("state", "ready")]), 2.0);
        assert_eq!(v("oxvs_agent_pods", &[("state", "pending")]), 1.0);
        assert_eq!(
            v("oxvs_networkpolicy_rules", &[("direction", "egress")]),
            1.0
        );
        assert_eq!(v("oxvs_networkpolicies", &[]), 2.0);
        assert_eq!(v("oxvs_agent_switch_up", &[]), 1.0);
        // CNI: requests_total, _count and +Inf agree; buckets cumulative.
        let add_ok = [("verb", "ADD"), ("result", "success")];
        assert_eq!(v("oxvs_cni_requests_total", &add_ok), 3.0);
        assert_eq!(v("oxvs_cni_request_duration_seconds_count", &add_ok), 3.0);
        assert_eq!(v("oxvs_cni_request_duration_seconds_sum", &add_ok), 0.03);
        let le = |l: &'static str| {
            let mut x = add_ok.to_vec();
            x.push(("le", l));
            v("oxvs_cni_request_duration_seconds_bucket", &x)
        };
        assert_eq!(
            (le("0.001"), le("0.005"), le("0.01"), le("10"), le("+Inf")),
            (0.0, 1.0, 3.0, 3.0, 3.0)
        );
        let add_err = [("verb", "ADD"), ("result", "error"), ("le", "10")];
        assert_eq!(v("oxvs_cni_request_duration_seconds_bucket", &add_err), 0.0);
    }

    #[test]
    fn without_the_switch_the_scrape_still_answers() {
        let text = encode(&cni_snapshot(), &AgentView::default(), None);
        let p = prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(p.value("oxvs_agent_switch_up", &[]), Some(0.0));
        assert!(p
            .types
            .contains_key("oxvs_networkpolicy_rule_packets_total"));
        assert_eq!(
            p.find("oxvs_networkpolicy_rule_packets_total", &[]).count(),
            0
        );
        // Every verb x result series is there from the start.
        assert_eq!(p.find("oxvs_cni_requests_total", &[]).count(), 10);
    }

    #[test]
    fn refusals_are_exported() {
        let mut view = view();
        view.refused_policies = vec![Refusal {
            policy: ("ns1".into(), "huge".into()),
            flows: 20_001,
            limit: 10_000,
        }];
        view.refused_nodes = vec![RefusedNode {
            name: "evil".into(),
            problem: NodeProblem::TooBroad {
                cidr: "0.0.0.0/0".parse().unwrap(),
            },
        }];
        let before = encode(&[], &view, None);
        record_policy_refusal();
        record_node_refusal("too_broad");
        record_node_refusal("no-such-reason");
        let after = encode(&[], &view, None);
        let (b, a) = (prom::parse(&before).unwrap(), prom::parse(&after).unwrap());
        assert_eq!(
            a.value(
                "oxvs_networkpolicy_refused",
                &[("namespace", "ns1"), ("policy", "huge")]
            ),
            Some(1.0)
        );
        assert_eq!(
            a.value(
                "oxvs_agent_nodes_refused",
                &[("node", "evil"), ("reason", "too_broad")]
            ),
            Some(1.0)
        );
        let d = |name: &str, l: &[(&str, &str)]| {
            a.value(name, l).unwrap_or_default() - b.value(name, l).unwrap_or_default()
        };
        assert_eq!(d("oxvs_networkpolicy_refusals_total", &[]), 1.0);
        assert_eq!(
            d("oxvs_agent_node_refusals_total", &[("reason", "too_broad")]),
            1.0
        );
        // Every reason has a series from the start.
        assert_eq!(
            a.find("oxvs_agent_node_refusals_total", &[]).count(),
            NodeProblem::REASONS.len()
        );
    }

    #[test]
    fn record_cni_fills_the_right_bucket() {
        // Process-wide counters: look at the deltas of one series only this
        // test touches (GC errors).
        let before = cni_snapshot();
        record_cni("GC", false, 0.003);
        record_cni("GC", false, 0.0001);
        record_cni("GC", false, 60.0);
        record_cni("GC", false, f64::NAN);
        record_cni("BOGUS", true, 1.0);
        let after = cni_snapshot();
        let gc = |s: &[CniSeries]| {
            s.iter()
                .find(|x| x.verb == "GC" && x.result == "error")
                .cloned()
                .unwrap_or_default()
        };
        let (b, a) = (gc(&before), gc(&after));
        let delta: Vec<u64> = a
            .buckets
            .iter()
            .zip(&b.buckets)
            .map(|(x, y)| x - y)
            .collect();
        // 0.0001 and NaN (as 0) in le=0.001, 0.003 in le=0.005, 60 s above 10 s.
        let mut want = vec![0u64; N_BUCKETS];
        want[0] = 2;
        want[2] = 1;
        want[N_BUCKETS - 1] = 1;
        assert_eq!(delta, want);
        assert_eq!(a.sum_ns - b.sum_ns, 60_003_100_000);
        assert_eq!(after.len(), 10);
    }
}
