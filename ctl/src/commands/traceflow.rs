//! `oxvsctl traceflow --src NS/POD --dst NS/POD|IP --proto P [--dport N]`:
//! where the first packet of a connection goes, node by node, and which
//! Kubernetes object decided at each table.
//!
//! The trace is computed by the agents from the live pipelines (the
//! switch's `trace` op: no traffic is sent, unless `--inject`). The source
//! pod's agent traces the packet as the pod would send it; if it leaves
//! through the tunnel, the agent of the node it is sent to continues with
//! the packet as it arrives there (`from_tunnel`), until it is delivered or
//! dropped (at most [`MAX_HOPS`] nodes).
//!
//! Agents are found with `--agent-socket NODE=PATH` (one per node; the
//! source pod's node is asked for with the `pod` op of the first agent that
//! answers), or a single `--agent-socket PATH` for a one-node setup
//! (default `/run/oxvs/agent.sock`).
//!
//! With `--inject` the first node also sends the packet through its
//! datapath (the real packet then crosses the tunnel by itself; later
//! hops are only traced).
//!
//! Exit codes: 0 delivered, 4 dropped, 5 incomplete (a node on the path
//! has no `--agent-socket`, or the path is longer than [`MAX_HOPS`]); as
//! for every command, 1 when an agent refused (e.g. unknown pod), 2 for
//! usage errors and 3 when an agent cannot be reached. `--json` prints the
//! whole [`TraceflowReport`].

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use oxvs_api::agent::{
    call_agent, AgentClientError, AgentRequest, PodInfo, Proto, TraceflowHop, TraceflowReport,
    TraceflowRequest, Verdict, DEFAULT_AGENT_SOCKET, DEFAULT_SPORT,
};

use super::online::{Ctx, Unreachable};
use super::{emit, UsageError};

/// Most nodes one trace crosses.
pub const MAX_HOPS: usize = 8;

/// Exit code: the packet was dropped.
pub const EXIT_DROPPED: u8 = 4;
/// Exit code: the trace could not follow the packet to its end.
pub const EXIT_INCOMPLETE: u8 = 5;

/// A command that finished with an outcome other than success: exit with
/// this code (its output is printed already).
#[derive(Debug, thiserror::Error)]
#[error("traceflow outcome (exit code {0})")]
pub struct Finished(pub u8);

/// Deadline of one agent call (the agent calls its switch within it).
const AGENT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Args)]
pub struct Traceflow {
    /// The source pod, NAMESPACE/NAME.
    #[arg(long, value_name = "NS/POD")]
    src: String,
    /// The destination: a pod NAMESPACE/NAME or an IPv4 or IPv6 address.
    #[arg(long, value_name = "NS/POD|IP")]
    dst: String,
    /// Trace over the pods' IPv6 addresses (a dual-stack node; implied by
    /// an IPv6 --dst).
    #[arg(long)]
    ipv6: bool,
    /// tcp, udp, sctp or icmp (an echo request).
    #[arg(long, value_name = "PROTO", default_value = "tcp", value_parser = parse_proto)]
    proto: Proto,
    /// Destination port (tcp, udp, sctp).
    #[arg(long, value_name = "N")]
    dport: Option<u16>,
    /// Source port (default 49152).
    #[arg(long, value_name = "N")]
    sport: Option<u16>,
    /// An agent's API socket: NODE=PATH (repeat, one per node), or PATH
    /// alone for a one-node setup.
    #[arg(long = "agent-socket", value_name = "NODE=PATH|PATH")]
    agent_sockets: Vec<String>,
    /// Also send the packet through the source node's datapath.
    #[arg(long)]
    inject: bool,
    /// Also print the switch's raw trace of each node.
    #[arg(long)]
    show_trace: bool,
}

fn parse_proto(s: &str) -> Result<Proto, String> {
    Proto::parse(s).ok_or_else(|| format!("'{s}' is not tcp, udp, sctp or icmp"))
}

/// Where the agents are.
#[derive(Debug, PartialEq, Eq)]
enum Agents {
    /// One agent for everything.
    Single(PathBuf),
    /// One per node, in the order given.
    PerNode(Vec<(String, PathBuf)>),
}

fn parse_agents(args: &[String]) -> Result<Agents, UsageError> {
    match args {
        [] => Ok(Agents::Single(PathBuf::from(DEFAULT_AGENT_SOCKET))),
        [one] if !one.contains('=') => Ok(Agents::Single(PathBuf::from(one))),
        many => {
            let mut v: Vec<(String, PathBuf)> = Vec::new();
            for a in many {
                let Some((node, path)) = a.split_once('=') else {
                    return Err(UsageError(format!(
                        "--agent-socket '{a}': with several agents, give each as NODE=PATH"
                    )));
                };
                if node.is_empty() || path.is_empty() {
                    return Err(UsageError(format!(
                        "--agent-socket '{a}': expected NODE=PATH"
                    )));
                }
                if v.iter().any(|(n, _)| n == node) {
                    return Err(UsageError(format!(
                        "--agent-socket: node '{node}' given twice"
                    )));
                }
                v.push((node.to_string(), PathBuf::from(path)));
            }
            Ok(Agents::PerNode(v))
        }
    }
}

/// A refusal is an ordinary error (exit 1), a transport failure [`Unreachable`] (exit 3).
fn agent_err(e: AgentClientError) -> anyhow::Error {
    match e {
        AgentClientError::Refused(m) => anyhow::anyhow!("{m}"),
        e => Unreachable(e.to_string()).into(),
    }
}

impl Agents {
    fn socket_of(&self, node: &str) -> Option<PathBuf> {
        match self {
            Agents::Single(p) => Some(p.clone()),
            Agents::PerNode(v) => v.iter().find(|(n, _)| n == node).map(|(_, p)| p.clone()),
        }
    }

    /// The socket of the agent whose node runs `src` (`ns/name`).
    fn source_agent(&self, src: &str) -> anyhow::Result<PathBuf> {
        let v = match self {
            Agents::Single(p) => return Ok(p.clone()),
            Agents::PerNode(v) => v,
        };
        let (ns, name) = src
            .split_once('/')
            .ok_or_else(|| UsageError(format!("--src '{src}' is not NAMESPACE/NAME")))?;
        let req = AgentRequest::Pod {
            namespace: ns.into(),
            name: name.into(),
        };
        let mut last_err = None;
        let mut node_named = None;
        for (node, path) in v {
            match call_agent::<PodInfo>(path, &req, AGENT_TIMEOUT).map_err(agent_err) {
                Ok(p) if p.local => return Ok(path.clone()),
                Ok(p) if !p.node.is_empty() => node_named = node_named.or(Some(p.node)),
                Ok(_) => {}
                Err(e) => last_err = Some((node.clone(), e)),
            }
        }
        if let Some(n) = node_named {
            return self.socket_of(&n).ok_or_else(|| {
                UsageError(format!(
                    "pod {src} runs on node {n}, and no --agent-socket {n}=PATH was given"
                ))
                .into()
            });
        }
        Err(match last_err {
            Some((node, e)) => e.context(format!("asking node {node} where pod {src} is")),
            None => anyhow::anyhow!("no agent knows pod {src}"),
        })
    }
}

impl Traceflow {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let agents = parse_agents(&self.agent_sockets)?;
        if self.proto.has_ports() && self.dport.is_none() {
            return Err(
                UsageError(format!("--proto {} needs --dport", self.proto.keyword())).into(),
            );
        }
        if !self.proto.has_ports() && (self.dport.is_some() || self.sport.is_some()) {
            return Err(UsageError("--proto icmp takes no --dport/--sport".into()).into());
        }
        let mut req = TraceflowRequest {
            src: self.src.clone(),
            dst: self.dst.clone(),
            proto: self.proto,
            sport: self.sport,
            dport: self.dport,
            inject: self.inject,
            from_tunnel: None,
            ipv6: self.ipv6,
        };
        let mut socket = agents.source_agent(&self.src)?;
        let mut report = TraceflowReport {
            src: self.src.clone(),
            dst: self.dst.clone(),
            proto: self.proto,
            sport: self
                .proto
                .has_ports()
                .then_some(self.sport.unwrap_or(DEFAULT_SPORT)),
            dport: self.dport,
            hops: Vec::new(),
            outcome: "incomplete".into(),
            incomplete: None,
        };
        loop {
            let hop: TraceflowHop = call_agent(
                &socket,
                &AgentRequest::Traceflow(req.clone()),
                AGENT_TIMEOUT,
            )
            .map_err(agent_err)?;
            let verdict = hop.verdict.clone();
            let next = hop.next.clone();
            report.hops.push(hop);
            match verdict {
                Verdict::Delivered { .. } => {
                    report.outcome = "delivered".into();
                    break;
                }
                Verdict::Dropped { .. } => {
                    report.outcome = "dropped".into();
                    break;
                }
                Verdict::Tunnel { node, tun_dst, .. } => {
                    let Some(node) = node else {
                        report.incomplete = Some(format!(
                            "the packet was sent through the tunnel to {}, which is no known node's address",
                            tun_dst.map(|t| t.to_string()).unwrap_or_else(|| "an unknown address".into())
                        ));
                        break;
                    };
                    let Some(arrival) = next else {
                        report.incomplete = Some(format!(
                            "node {} could not say how the packet arrives at node {node} (its underlay address is unknown)",
                            report.hops.last().map(|h| h.node.as_str()).unwrap_or("?")
                        ));
                        break;
                    };
                    if report.hops.len() >= MAX_HOPS {
                        report.incomplete = Some(format!(
                            "the path is longer than {MAX_HOPS} nodes (a loop?)"
                        ));
                        break;
                    }
                    let Some(s) = agents.socket_of(&node) else {
                        report.incomplete = Some(format!(
                            "the packet continues on node {node}, and no --agent-socket {node}=PATH was given"
                        ));
                        break;
                    };
                    socket = s;
                    req.from_tunnel = Some(arrival);
                    req.inject = false;
                }
            }
        }
        if ctx.json {
            emit(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
        } else {
            emit(&render(&report, self.show_trace))?;
        }
        match report.outcome.as_str() {
            "delivered" => Ok(()),
            "dropped" => Err(Finished(EXIT_DROPPED).into()),
            _ => Err(Finished(EXIT_INCOMPLETE).into()),
        }
    }
}

/// The report for people.
pub fn render(r: &TraceflowReport, show_trace: bool) -> String {
    let mut s = String::new();
    let ports = match (r.sport, r.dport) {
        (Some(sp), Some(dp)) => format!(" {sp} -> {dp}"),
        (None, Some(dp)) => format!(" -> {dp}"),
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "Traceflow {} -> {} ({}{ports})",
        r.src,
        r.dst,
        r.proto.keyword()
    );
    for h in &r.hops {
        let _ = writeln!(s, "\nNode {}", h.node);
        let _ = writeln!(s, "  packet: {}", h.packet);
        let mut pass = 0;
        for st in &h.steps {
            if st.pass != pass {
                pass = st.pass;
                let _ = writeln!(s, "  -- after conntrack (pass {pass}, new connection) --");
            }
            let name = st.table_name.as_deref().unwrap_or("");
            let flow = if !st.matched {
                "no match".to_string()
            } else {
                let mut f = st.matches.clone();
                if !f.is_empty() {
                    f.push_str(", ");
                }
                let _ = write!(f, "priority {}", st.priority.unwrap_or(0));
                f
            };
            let _ = writeln!(
                s,
                "  {:>3}. {name:<19} {:<44} {flow}",
                st.table, st.annotation
            );
            if !st.actions.is_empty() {
                let _ = writeln!(s, "       {:<19} actions: {}", "", st.actions.join(", "));
            }
        }
        for a in &h.allowed_by {
            let _ = writeln!(s, "  allowed by {a}");
        }
        let _ = writeln!(s, "  => {}", h.verdict.describe());
        if h.injected {
            let _ = writeln!(s, "  (the packet was also injected into the datapath)");
        }
        if show_trace {
            let _ = writeln!(s, "\n  switch trace:");
            for l in h.text.lines() {
                let _ = writeln!(s, "    {l}");
            }
        }
    }
    let last = r.hops.last();
    let node = last.map(|h| h.node.as_str()).unwrap_or("?");
    let _ = match (r.outcome.as_str(), last.map(|h| &h.verdict)) {
        ("delivered", Some(v)) => {
            let _ = writeln!(s, "\nResult: {} on node {node}", v.describe());
            match v {
                // To the host, for an address that is not a pod: the node's
                // network stack decides what happens next.
                Verdict::Delivered { to, .. }
                    if to.starts_with("gateway") && !r.dst.contains('/') =>
                {
                    writeln!(
                        s,
                        "  The node's network stack takes it from here. For a Service IP, kube-proxy's\n  \
                         DNAT sends it back into the switch from the gateway, to the chosen endpoint\n  \
                         (trace that leg with --dst NS/POD); the endpoint's replies return through the\n  \
                         gateway too (L3Forwarding, priority 210: replies of connections from the gateway)."
                    )
                }
                _ => Ok(()),
            }
        }
        ("dropped", Some(Verdict::Dropped { by, .. })) => {
            writeln!(s, "\nResult: dropped on node {node} by {by}")
        }
        _ => writeln!(
            s,
            "\nResult: incomplete: {}",
            r.incomplete.as_deref().unwrap_or("unknown reason")
        ),
    };
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_sockets_parse() {
        assert_eq!(
            parse_agents(&[]).unwrap(),
            Agents::Single(DEFAULT_AGENT_SOCKET.into())
        );
        assert_eq!(
            parse_agents(&["/tmp/a.sock".into()]).unwrap(),
            Agents::Single("/tmp/a.sock".into())
        );
        assert_eq!(
            parse_agents(&["n1=/a".into(), "n2=/b".into()]).unwrap(),
            Agents::PerNode(vec![("n1".into(), "/a".into()), ("n2".into(), "/b".into())])
        );
        assert_eq!(
            parse_agents(&["n1=/a".into()]).unwrap(),
            Agents::PerNode(vec![("n1".into(), "/a".into())])
        );
        for bad in [
            vec!["n1=/a".to_string(), "/b".to_string()],
            vec!["=/a".to_string()],
            vec!["n1=".to_string()],
            vec!["n1=/a".to_string(), "n1=/b".to_string()],
        ] {
            assert!(parse_agents(&bad).is_err(), "{bad:?}");
        }
    }
}
