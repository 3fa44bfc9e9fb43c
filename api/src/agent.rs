//! The agent's API: what travels on oxvs-agent's API socket.
//!
//! ## Wire format
//!
//! The same envelope as the switch's control protocol ([`crate::protocol`]):
//! one JSON object per line both ways, a request `{"v":1,"op":"<op>", ...}`
//! answered by `{"v":1,"ok":true,"result":...}` or
//! `{"v":1,"ok":false,"error":"..."}`. Default socket:
//! [`DEFAULT_AGENT_SOCKET`], mode 0600. A connection carries any number of
//! request lines, each answered by one response line, in order.
//!
//! ## Operations ([`AgentRequest`])
//!
//! - `info` ([`InfoResult`]): the node: name, pod CIDR, gateway, tunnel port,
//!   the switch's socket, remote nodes and the pods attached here.
//! - `pod {namespace, name}` ([`PodInfo`]): where a pod is (node, IP; MAC and
//!   port when it is attached to this node).
//! - `traceflow {...}` ([`TraceflowRequest`] -> [`TraceflowHop`]): the first
//!   packet of a connection between two pods (or a pod and an IP) traced
//!   through this node's live pipeline by the switch (no traffic sent unless
//!   `inject`), each table step annotated with the Kubernetes object its flow
//!   belongs to (from the flow's cookie), and the verdict on this node.
//!   With `from_tunnel` the trace starts where the previous node's ended:
//!   the packet as it arrives on this node's tunnel port.
//!
//! `oxvsctl traceflow` chains hops across nodes into a [`TraceflowReport`].
//!
//! ## Strictness
//!
//! [`parse_agent_request`] refuses, naming what was wrong, a line that is
//! not a JSON object, has no or another `v`, an unknown `op`, or unknown or
//! mistyped arguments.

use std::io::{BufRead as _, BufReader, ErrorKind, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::Response;
use crate::VERSION;

/// Default path of oxvs-agent's API socket.
pub const DEFAULT_AGENT_SOCKET: &str = "/run/oxvs/agent.sock";

/// Longest request or response line on the agent socket (bytes).
pub const MAX_AGENT_LINE: usize = 16 << 20;

/// Every operation name, in the order of [`AgentRequest`].
pub const AGENT_OPS: &[&str] = &["info", "pod", "traceflow"];

/// A request to the agent (the `op` and its arguments).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum AgentRequest {
    /// The node and its pods.
    Info,
    /// Where a pod is.
    Pod { namespace: String, name: String },
    /// Traces the first packet of a connection through this node.
    Traceflow(TraceflowRequest),
}

impl AgentRequest {
    /// The operation name as on the wire.
    pub fn op(&self) -> &'static str {
        match self {
            AgentRequest::Info => "info",
            AgentRequest::Pod { .. } => "pod",
            AgentRequest::Traceflow(_) => "traceflow",
        }
    }

    /// The request as one wire line (with `"v"`, without the newline).
    pub fn to_line(&self) -> String {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("v".into(), Value::from(VERSION));
        }
        v.to_string()
    }
}

/// Parses one request line of the agent socket.
pub fn parse_agent_request(line: &str) -> Result<AgentRequest, String> {
    if line.len() > MAX_AGENT_LINE {
        return Err(format!("request line longer than {MAX_AGENT_LINE} bytes"));
    }
    let value: Value =
        serde_json::from_str(line).map_err(|e| format!("request is not valid JSON: {e}"))?;
    let Value::Object(mut obj) = value else {
        return Err("request must be a JSON object".into());
    };
    match obj.remove("v") {
        None => {
            return Err(format!(
                "request has no \"v\" (protocol version; this agent speaks {VERSION})"
            ))
        }
        Some(v) if v.as_u64() == Some(u64::from(VERSION)) => {}
        Some(v) => {
            return Err(format!(
                "unsupported protocol version {v} (this agent speaks {VERSION})"
            ))
        }
    }
    let op = match obj.get("op") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("unknown op '{other}'")),
        None => {
            return Err(format!(
                "request has no \"op\" (one of: {})",
                AGENT_OPS.join(", ")
            ))
        }
    };
    if !AGENT_OPS.contains(&op.as_str()) {
        return Err(format!(
            "unknown op '{op}' (one of: {})",
            AGENT_OPS.join(", ")
        ));
    }
    serde_json::from_value(Value::Object(obj)).map_err(|e| format!("bad arguments for '{op}': {e}"))
}

/// A pod as the agent knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    /// The node it runs on (empty: not known / not scheduled).
    pub node: String,
    #[serde(default)]
    pub ip: Option<Ipv4Addr>,
    /// Its IPv6 address (dual-stack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<std::net::Ipv6Addr>,
    /// Attached to this agent's node.
    pub local: bool,
    /// Its MAC (local pods).
    #[serde(default)]
    pub mac: Option<String>,
    /// Its switch port (local pods).
    #[serde(default)]
    pub ofport: Option<u32>,
}

/// The node's gateway.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayInfo {
    pub name: String,
    /// Its IPv4 address: none on an IPv6-only node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<Ipv4Addr>,
    /// Its IPv6 address, on a dual-stack or IPv6-only node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<std::net::Ipv6Addr>,
    pub mac: String,
    pub ofport: u32,
}

/// Another node, reached through the tunnel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteNodeInfo {
    pub name: String,
    /// Its IPv4 pod CIDR: none for an IPv6-only node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    /// Its IPv6 pod CIDR, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr6: Option<String>,
    pub ip: IpAddr,
}

/// `info`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfoResult {
    pub node: String,
    /// The node's IPv4 pod CIDR, once known (none on an IPv6-only node).
    #[serde(default)]
    pub pod_cidr: Option<String>,
    /// The node's IPv6 pod CIDR, on a dual-stack or IPv6-only node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr6: Option<String>,
    /// Once discovered from the switch.
    #[serde(default)]
    pub gateway: Option<GatewayInfo>,
    #[serde(default)]
    pub tunnel_ofport: Option<u32>,
    pub switchd_socket: String,
    pub remotes: Vec<RemoteNodeInfo>,
    /// Pods attached to this node (ready ones).
    pub pods: Vec<PodInfo>,
}

/// The L4 protocol of a traced packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
    /// An echo request.
    Icmp,
}

impl Proto {
    /// The flow-syntax keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
            Proto::Icmp => "icmp",
        }
    }

    /// The flow-syntax keyword over IPv6 (`tcp6`, ..., `icmp6`).
    pub fn keyword6(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp6",
            Proto::Udp => "udp6",
            Proto::Sctp => "sctp6",
            Proto::Icmp => "icmp6",
        }
    }

    /// Parses `tcp`, `udp`, `sctp`, `icmp` (any case).
    pub fn parse(s: &str) -> Option<Proto> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Proto::Tcp),
            "udp" => Some(Proto::Udp),
            "sctp" => Some(Proto::Sctp),
            "icmp" => Some(Proto::Icmp),
            _ => None,
        }
    }

    /// Whether the protocol has ports.
    pub fn has_ports(self) -> bool {
        !matches!(self, Proto::Icmp)
    }
}

/// The source port used when none is given (start of the dynamic range).
pub const DEFAULT_SPORT: u16 = 49152;

/// `traceflow`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceflowRequest {
    /// The source pod, `namespace/name`.
    pub src: String,
    /// The destination: a pod `namespace/name`, or an IPv4 or IPv6 address.
    pub dst: String,
    pub proto: Proto,
    /// Source port (default [`DEFAULT_SPORT`]; not for icmp).
    #[serde(default)]
    pub sport: Option<u16>,
    /// Destination port (required for tcp, udp and sctp).
    #[serde(default)]
    pub dport: Option<u16>,
    /// Also send the packet through the datapath.
    #[serde(default)]
    pub inject: bool,
    /// Continue a trace: the packet as it arrives on this node's tunnel
    /// port (from the previous hop's [`TraceflowHop::next`]).
    #[serde(default)]
    pub from_tunnel: Option<TunnelArrival>,
    /// Trace over the pods' IPv6 addresses (dual-stack; implied by an IPv6
    /// `dst`).
    #[serde(default)]
    pub ipv6: bool,
}

/// A packet as it leaves one node through the tunnel, i.e. as it arrives
/// at the next: the inner headers after the sending node's pipeline, and
/// the tunnel metadata the receiving port sets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelArrival {
    /// The node that sent it.
    pub from_node: String,
    /// Outer source (the sending node's underlay address).
    pub tun_src: IpAddr,
    /// Outer destination (the receiving node's underlay address).
    pub tun_dst: IpAddr,
    pub src_mac: String,
    pub dst_mac: String,
    /// Inner addresses, of either family.
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub ttl: u8,
}

/// Which object a flow belongs to, decoded from its cookie. The cookie
/// layout and the feature ids are declared once, in the agent's
/// `cookie.rs` (`Feature`); the variants name the feature they decode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FlowOwner {
    /// `Feature::Pipeline`: the pipeline's defaults.
    Pipeline,
    /// `Feature::Pod`: a local pod's flows.
    Pod {
        ofport: u32,
        /// `namespace/name`, when known.
        #[serde(default)]
        pod: Option<String>,
    },
    /// `Feature::Node`, the gateway's object.
    Gateway,
    /// `Feature::Node`, the tunnel's object.
    Tunnel,
    /// `Feature::PolicyRule`: a NetworkPolicy rule.
    PolicyRule {
        id: u32,
        /// `namespace/name`, when the rule id is known.
        #[serde(default)]
        policy: Option<String>,
        /// `ingress` or `egress`.
        #[serde(default)]
        direction: Option<String>,
        /// Index in `spec.ingress` / `spec.egress`.
        #[serde(default)]
        index: Option<usize>,
    },
    /// `Feature::Isolation`: the default drop of a pod isolated by policies.
    Isolation {
        ofport: u32,
        #[serde(default)]
        pod: Option<String>,
        #[serde(default)]
        direction: Option<String>,
        /// The policies (`namespace/name`) that select the pod in that direction.
        policies: Vec<String>,
    },
    /// `Feature::Isolation`, the node exemption's object: traffic between
    /// a pod and its own node skips the policies (always allowed).
    NodeExemption,
    /// `Feature::RemoteNode`: flows towards a remote node.
    RemoteNode {
        ip: IpAddr,
        #[serde(default)]
        node: Option<String>,
    },
    /// `Feature::Service`: a Service port's flows and group (the proxy).
    Service {
        group_id: u32,
        /// `namespace/name:port/protocol`, when the agent knows it.
        #[serde(default)]
        service: Option<String>,
    },
    /// A cookie of no known feature (or 0).
    Unknown { cookie: u64 },
}

/// One table step of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceStep {
    /// 0: the packet as given; 1, 2...: each recirculation (after `ct`).
    pub pass: usize,
    pub table: u8,
    #[serde(default)]
    pub table_name: Option<String>,
    /// False: no flow matched (the packet is dropped there).
    pub matched: bool,
    #[serde(default)]
    pub priority: Option<u16>,
    pub cookie: u64,
    /// The matched flow's match, as printed in the trace.
    #[serde(rename = "match")]
    pub matches: String,
    /// The actions executed for this flow, as printed in the trace.
    pub actions: Vec<String>,
    #[serde(default)]
    pub owner: Option<FlowOwner>,
    /// What the owner is, for people: `pod x/a (port 3)`,
    /// `NetworkPolicy x/allow-b ingress[0]`, ...
    pub annotation: String,
}

/// What happened to the packet on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Verdict {
    /// Output to a local port: a pod or the gateway.
    Delivered {
        ofport: u32,
        /// `pod x/b`, `gateway oxvs-gw0`, or `port N`.
        to: String,
    },
    /// Output to the tunnel towards another node.
    Tunnel {
        ofport: u32,
        #[serde(default)]
        tun_dst: Option<IpAddr>,
        /// The node whose InternalIP is `tun_dst`.
        #[serde(default)]
        node: Option<String>,
    },
    /// No output.
    Dropped {
        /// The annotation of the last step (the object whose flow dropped it).
        by: String,
        #[serde(default)]
        table: Option<u8>,
        #[serde(default)]
        table_name: Option<String>,
    },
}

impl Verdict {
    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            Verdict::Delivered { ofport, to } => format!("delivered to {to} (port {ofport})"),
            Verdict::Tunnel {
                ofport,
                tun_dst,
                node,
            } => {
                let dst = tun_dst.map(|d| d.to_string()).unwrap_or_else(|| "?".into());
                match node {
                    Some(n) => format!("sent through the tunnel (port {ofport}) to node {n} ({dst})"),
                    None => format!("sent through the tunnel (port {ofport}) to {dst} (no known node has that address)"),
                }
            }
            Verdict::Dropped {
                by,
                table,
                table_name,
            } => {
                let at = match (table, table_name) {
                    (Some(t), Some(n)) => format!(" in table {t} ({n})"),
                    (Some(t), None) => format!(" in table {t}"),
                    _ => String::new(),
                };
                format!("dropped by {by}{at}")
            }
        }
    }
}

/// `traceflow`: the trace on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceflowHop {
    pub node: String,
    /// The packet spec given to the switch.
    pub packet: String,
    /// The switch's `ofproto/trace`-style text.
    pub text: String,
    pub steps: Vec<TraceStep>,
    /// The `Datapath actions:` of each pass.
    pub datapath_actions: Vec<String>,
    pub verdict: Verdict,
    /// The NetworkPolicy rules whose flows the packet matched on this node
    /// (annotations), in order.
    pub allowed_by: Vec<String>,
    /// The packet as the next node receives it (verdict `tunnel`).
    #[serde(default)]
    pub next: Option<TunnelArrival>,
    /// Whether the packet was also sent through the datapath.
    pub injected: bool,
}

/// What `oxvsctl traceflow --json` prints: every hop, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceflowReport {
    pub src: String,
    pub dst: String,
    pub proto: Proto,
    #[serde(default)]
    pub sport: Option<u16>,
    #[serde(default)]
    pub dport: Option<u16>,
    pub hops: Vec<TraceflowHop>,
    /// `delivered`, `dropped`, or `incomplete` (a hop's node could not be asked).
    pub outcome: String,
    /// Why the report is incomplete.
    #[serde(default)]
    pub incomplete: Option<String>,
}

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentClientError {
    #[error("cannot reach oxvs-agent at {}: {source}", .path.display())]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to oxvs-agent at {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad response from oxvs-agent at {}: {msg}", .path.display())]
    BadResponse { path: PathBuf, msg: String },
    /// The agent answered with an error.
    #[error("{0}")]
    Refused(String),
    /// The agent turned every attempt away as busy (its connection cap)
    /// until the timeout.
    #[error("oxvs-agent at {} stayed busy ({attempts} attempts): {msg}", .path.display())]
    Busy {
        path: PathBuf,
        attempts: u32,
        msg: String,
    },
}

impl AgentClientError {
    /// True when the agent could not be talked to (as opposed to refusing).
    pub fn is_unreachable(&self) -> bool {
        !matches!(self, AgentClientError::Refused(_))
    }
}

/// Sends one request to the agent at `path` (a new connection) and decodes
/// the result. `timeout` bounds each read and write, and the time spent
/// retrying while the agent answers busy ([`crate::listen`]).
pub fn call_agent<T: serde::de::DeserializeOwned>(
    path: &Path,
    req: &AgentRequest,
    timeout: Duration,
) -> Result<T, AgentClientError> {
    let started = std::time::Instant::now();
    let mut attempt = 0u32;
    let resp = loop {
        let resp = call_agent_once(path, req, timeout)?;
        if !resp.busy {
            break resp;
        }
        let wait = crate::listen::backoff(attempt);
        attempt += 1;
        if started.elapsed() + wait >= timeout {
            return Err(AgentClientError::Busy {
                path: path.to_path_buf(),
                attempts: attempt,
                msg: resp.error.unwrap_or_default(),
            });
        }
        std::thread::sleep(wait);
    };
    let v = resp.into_result().map_err(AgentClientError::Refused)?;
    serde_json::from_value(v).map_err(|e| AgentClientError::BadResponse {
        path: path.to_path_buf(),
        msg: format!("unexpected result for '{}': {e}", req.op()),
    })
}

fn call_agent_once(
    path: &Path,
    req: &AgentRequest,
    timeout: Duration,
) -> Result<Response, AgentClientError> {
    let io = |source| AgentClientError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(path).map_err(|source| AgentClientError::Connect {
        path: path.to_path_buf(),
        source,
    })?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    stream.set_write_timeout(Some(timeout)).map_err(io)?;
    let mut line = req.to_line();
    line.push('\n');
    // An agent that turned the connection away (busy) may have closed it
    // already: its answer is still there to read.
    let written = match stream.write_all(line.as_bytes()) {
        Err(e) if !matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
            return Err(io(e));
        }
        other => other,
    };
    let mut reader = BufReader::new(stream.take(MAX_AGENT_LINE as u64 + 1));
    let mut buf = String::new();
    match reader.read_line(&mut buf) {
        Ok(0) => {
            return Err(AgentClientError::BadResponse {
                path: path.to_path_buf(),
                msg: "the agent closed the connection without answering".into(),
            })
        }
        Ok(_) => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            return Err(AgentClientError::BadResponse {
                path: path.to_path_buf(),
                msg: format!("no answer within {timeout:?}"),
            })
        }
        Err(e) => return Err(io(e)),
    }
    let resp: Response =
        serde_json::from_str(buf.trim_end()).map_err(|e| AgentClientError::BadResponse {
            path: path.to_path_buf(),
            msg: format!("not a protocol response: {e}"),
        })?;
    match written {
        Err(e) if !resp.busy => Err(io(e)),
        _ => Ok(resp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let reqs = vec![
            AgentRequest::Info,
            AgentRequest::Pod {
                namespace: "x".into(),
                name: "a".into(),
            },
            AgentRequest::Traceflow(TraceflowRequest {
                src: "x/a".into(),
                dst: "10.0.0.9".into(),
                proto: Proto::Tcp,
                sport: None,
                dport: Some(80),
                inject: true,
                from_tunnel: Some(TunnelArrival {
                    from_node: "n1".into(),
                    tun_src: Ipv4Addr::new(192, 168, 1, 1).into(),
                    tun_dst: Ipv4Addr::new(192, 168, 1, 2).into(),
                    src_mac: "0a:58:0a:f4:00:01".into(),
                    dst_mac: "aa:bb:cc:dd:ee:ff".into(),
                    src_ip: Ipv4Addr::new(10, 244, 0, 3).into(),
                    dst_ip: Ipv4Addr::new(10, 244, 1, 3).into(),
                    ttl: 63,
                }),
                ipv6: false,
            }),
        ];
        for r in reqs {
            let line = r.to_line();
            assert!(line.contains(&format!(r#""op":"{}""#, r.op())), "{line}");
            assert_eq!(parse_agent_request(&line), Ok(r.clone()));
        }
    }

    #[test]
    fn bad_requests_name_what_was_wrong() {
        for (line, want) in [
            ("x", "not valid JSON"),
            ("[]", "JSON object"),
            (r#"{"op":"info"}"#, "no \"v\""),
            (r#"{"v":2,"op":"info"}"#, "version 2"),
            (r#"{"v":1}"#, "no \"op\""),
            (r#"{"v":1,"op":"dump"}"#, "unknown op 'dump'"),
            (
                r#"{"v":1,"op":"pod","namespace":"x"}"#,
                "bad arguments for 'pod'",
            ),
            (
                r#"{"v":1,"op":"traceflow","src":"x/a","dst":"x/b","proto":"icmpv6"}"#,
                "bad arguments for 'traceflow'",
            ),
            (
                r#"{"v":1,"op":"traceflow","src":"x/a","dst":"x/b","proto":"tcp","dprt":1}"#,
                "unknown field `dprt`",
            ),
        ] {
            let e = parse_agent_request(line).unwrap_err();
            assert!(e.contains(want), "{line}: {e}");
        }
    }

    #[test]
    fn verdicts_describe_themselves() {
        let d = Verdict::Dropped {
            by: "NetworkPolicy x/deny-all ingress (isolation)".into(),
            table: Some(71),
            table_name: Some("IngressDefaultRule".into()),
        };
        assert_eq!(
            d.describe(),
            "dropped by NetworkPolicy x/deny-all ingress (isolation) in table 71 (IngressDefaultRule)"
        );
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["kind"], "dropped");
        assert_eq!(serde_json::from_value::<Verdict>(v).unwrap(), d);
        let t = Verdict::Tunnel {
            ofport: 9,
            tun_dst: Some(Ipv4Addr::new(192, 168, 1, 2).into()),
            node: Some("n2".into()),
        };
        assert!(t.describe().contains("to node n2 (192.168.1.2)"));
    }
}
