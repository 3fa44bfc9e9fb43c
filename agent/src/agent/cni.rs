//! The CNI verbs for `oxvs-cni`: ADD, DEL, CHECK, GC and STATUS
//! ([`Agent::handle`]), and the CNI socket's protocol ([`CniSocket`]: one
//! [`CniRequest`] line in, one [`CniResponse`] line out, per connection;
//! served by [`crate::socket_server`]).
//!
//! ## What an ADD does, in order (each step undone if a later one fails)
//!
//! 0. With a cluster source, admit the pod ([`Agent::admit_pod`]): its Pod
//!    object must be known (from the snapshot, or read from the source
//!    now), else "try again later"; a pod is never attached without the
//!    NetworkPolicies that select it.
//! 1. Allocate the address ([`crate::ipam`]), then record the attachment
//!    as `pending` on disk ([`crate::state`]).
//! 2. Create the veth pair ([`crate::podnet`]), the host end up and the
//!    pod end made directly in `CNI_NETNS`. If a host link has the name
//!    already, ADD fails and undoes only steps 0-1: that link and its port
//!    are not this attachment's.
//! 3. Attach the host end to oxvs-switchd as an AF_XDP port and, at the
//!    same time, configure the pod end: MAC `0a:58:<ip>`, address, MTU,
//!    default route via the gateway, up (TX checksum offload stays on:
//!    the switch completes the checksums; off only with
//!    `--pod-tx-checksum-off`); and isolate the host end from the host's
//!    stack ([`crate::hostnet::isolate_host_link`]). All three finish
//!    before an error of any is returned.
//! 4. Record the attachment as `ready`.
//! 5. Install the pod's flows ([`crate::flows::pod_flows`]) and every
//!    policy flow that concerns it as one bundle, and wait for the
//!    switch's answer.
//! 6. Inject a gratuitous ARP from the pod's port (so the host's neighbour
//!    cache learns a re-used address's new MAC), in the background: ADD
//!    answers without waiting for it.
//!
//! DEL undoes them (flows, veth, port, address, record: the veth before
//! the port, [`Agent::delete_then_detach`]); every step tolerates
//! "already gone", so DEL is idempotent and a failed DEL can simply be
//! retried. A crash between steps leaves a
//! `pending` record that [`Agent::reconcile`] rolls back on start. DEL of
//! an attachment without a record deletes a host link only if it is
//! provably that attachment's (no record names it, and its alias,
//! [`podnet::owner_alias`], does): host names are 28-bit hashes.

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::time::Duration;

use oxvs_api::cni::{
    code, CniCommand, CniError, CniInterface, CniIp, CniRequest, CniResponse, CniResult, CniRoute,
    CNI_PROTOCOL_VERSION,
};
use oxvs_api::{DumpFlowsResult, Request};
use serde_json::Value;

use super::{blocking, err, Agent};
use crate::flows::{self, PodPort};
use crate::model::Pod;
use crate::podnet;
use crate::socket_server::{LineProtocol, Requests};
use crate::state::{AttachState, Attachment, PodIpv4, PodIpv6};

/// Longest request line accepted from the plugin (its newline included).
const MAX_REQUEST: usize = 4 << 20;

/// Deadline of ADD's read of a pod the snapshot lacks (below the
/// plugin's default 30 s, so the plugin gets the agent's answer).
const POD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The CNI socket's protocol: one request line per connection, answered
/// by one [`CniResponse`] line, then closed. A line refused before it is
/// decoded (too long, not UTF-8) is a decode failure; over the connection
/// cap the answer is `busy` with code 11 (try again later), and the plugin
/// retries.
pub struct CniSocket;

impl LineProtocol for CniSocket {
    type State = Agent;
    const NAME: &'static str = "cni";
    const MAX_LINE: usize = MAX_REQUEST;
    const REQUESTS: Requests = Requests::One;

    fn busy(max_connections: usize) -> String {
        response_line(&CniResponse::busy(format!(
            "busy: the oxvs agent serves {max_connections} CNI connections already (--cni-max-connections); retry"
        )))
    }

    fn refused(why: &str) -> String {
        response_line(&CniResponse::failure(err(code::DECODE_FAILURE, why)))
    }

    async fn handle(agent: &Agent, line: &str) -> String {
        response_line(&answer(agent, line).await)
    }
}

fn response_line(r: &CniResponse) -> String {
    serde_json::to_string(r).unwrap_or_default()
}

/// Answers one request line: decoded, its protocol version checked, run
/// ([`Agent::handle`]), counted and logged.
async fn answer(agent: &Agent, line: &str) -> CniResponse {
    let req = match serde_json::from_str::<CniRequest>(line) {
        Ok(req) => req,
        Err(e) => {
            return CniResponse::failure(err(
                code::DECODE_FAILURE,
                format!("bad request from the plugin: {e}"),
            ))
        }
    };
    if req.v != CNI_PROTOCOL_VERSION {
        return CniResponse::failure(err(
            code::INCOMPATIBLE_VERSION,
            format!(
                "plugin speaks protocol {}, agent {}",
                req.v, CNI_PROTOCOL_VERSION
            ),
        ));
    }
    let started = std::time::Instant::now();
    let verb = req.command.as_str();
    let cid = req.container_id.clone();
    let r = agent.handle(req).await;
    crate::metrics::record_cni(verb, r.is_ok(), started.elapsed().as_secs_f64());
    let ms = started.elapsed().as_secs_f64() * 1e3;
    match r {
        Ok(result) => {
            tracing::debug!(verb, container = %cid, ms, "CNI request served");
            CniResponse::success(result)
        }
        Err(e) if verb == "STATUS" => {
            tracing::debug!(code = e.code, error = %e.msg, "STATUS: not ready");
            CniResponse::failure(e)
        }
        Err(e) => {
            tracing::info!(verb, container = %cid, ms, code = e.code, error = %e.msg, "CNI request failed");
            CniResponse::failure(e)
        }
    }
}

impl Agent {
    /// Serves one request.
    pub async fn handle(&self, req: CniRequest) -> Result<Option<Value>, CniError> {
        match req.command {
            CniCommand::Add | CniCommand::Del | CniCommand::Check => {
                if !valid_container_id(&req.container_id) {
                    return Err(err(
                        code::INVALID_ENV,
                        format!("invalid CNI_CONTAINERID '{}'", req.container_id),
                    ));
                }
                if !valid_ifname(&req.ifname) {
                    return Err(err(
                        code::INVALID_ENV,
                        format!("invalid CNI_IFNAME '{}'", req.ifname),
                    ));
                }
                let key = (req.container_id.clone(), req.ifname.clone());
                let lock = self.key_lock(&key);
                let r = {
                    let _gate = self.gate.read().await;
                    let _g = lock.lock().await;
                    match req.command {
                        CniCommand::Add => self.add(&req).await.map(Some),
                        CniCommand::Del => self.del(&req).await.map(|()| None),
                        _ => self.check(&req).await.map(|()| None),
                    }
                };
                self.drop_key_lock(&key, lock);
                r
            }
            CniCommand::Gc => self.gc(&req).await.map(|()| None),
            CniCommand::Status => self.status().await.map(|()| None),
        }
    }

    async fn add(&self, req: &CniRequest) -> Result<Value, CniError> {
        let Some(node) = self.node() else {
            return Err(err(
                code::TRY_AGAIN_LATER,
                "the agent is not ready yet (oxvs-switchd or its gateway not found)",
            ));
        };
        let key = (req.container_id.clone(), req.ifname.clone());
        if let Some(a) = self.record(&key) {
            return Err(err(
                code::ALREADY_ATTACHED,
                format!(
                    "container {} interface {} is already attached ({} in {}); DEL it first",
                    req.container_id,
                    req.ifname,
                    a.ip_text(),
                    a.netns
                ),
            ));
        }
        if req.netns.is_empty() {
            return Err(err(code::INVALID_ENV, "CNI_NETNS is empty"));
        }
        if !podnet::netns_exists(Path::new(&req.netns)) {
            return Err(err(
                code::INVALID_ENV,
                format!("CNI_NETNS {} is not a network namespace", req.netns),
            ));
        }
        self.admit_pod(req).await?;
        let (pod_ns, pod_name) = req.pod().unwrap_or(("", ""));
        let host_ifname = podnet::host_ifname(pod_ns, pod_name, &req.container_id, &req.ifname);
        let (cid, ifn) = (req.container_id.clone(), req.ifname.clone());
        let ip = match &node.ipv4 {
            Some(_) => match self.with_ipam(move |ipam| ipam.allocate(&cid, &ifn)).await {
                Ok(ip) => Some(ip),
                Err(e) => {
                    self.forget_admitted(pod_ns, pod_name);
                    return Err(e);
                }
            },
            None => None,
        };
        let (cid, ifn) = (req.container_id.clone(), req.ifname.clone());
        let ip6 = match self.with_ipam6(move |ipam| ipam.allocate(&cid, &ifn)).await {
            Ok(ip6) => ip6,
            Err(e) => {
                let _ = self.release_addresses(&req.container_id, &req.ifname).await;
                self.forget_admitted(pod_ns, pod_name);
                return Err(e);
            }
        };
        let ipv6 = match (ip6, &node.ipv6) {
            (Some(ip), Some(v6)) => Some(PodIpv6 {
                ip,
                prefix_len: v6.pod_cidr.prefix_len(),
                gateway: v6.gateway_ip,
            }),
            _ => None,
        };
        let ipv4 = match (ip, &node.ipv4) {
            (Some(ip), Some(v4)) => Some(PodIpv4 {
                ip,
                prefix_len: v4.pod_cidr.prefix_len(),
                gateway: v4.gateway_ip,
            }),
            _ => None,
        };
        if ipv4.is_none() && ipv6.is_none() {
            let _ = self.release_addresses(&req.container_id, &req.ifname).await;
            self.forget_admitted(pod_ns, pod_name);
            return Err(err(
                code::TRY_AGAIN_LATER,
                "the node has no pod CIDR to take an address from yet",
            ));
        }
        let mac = flows::pod_mac_of(ip, ipv6.map(|v6| v6.ip));
        let mut a = Attachment {
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            netns: req.netns.clone(),
            host_ifname: host_ifname.clone(),
            pod_namespace: pod_ns.to_string(),
            pod_name: pod_name.to_string(),
            ipv4,
            mac: flows::mac_str(&mac),
            mtu: self.link_mtu(),
            ofport: None,
            state: AttachState::Pending,
            ipv6,
            qdisc: self.cfg.pod_qdisc.clone(),
        };
        if let Err(e) = self.save_record(a.clone()).await {
            let _ = self.release_addresses(&req.container_id, &req.ifname).await;
            self.forget_admitted(pod_ns, pod_name);
            return Err(e);
        }
        match self.attach(&node, &mut a).await {
            Ok(()) => {
                Ok(serde_json::to_value(cni_result(&a, self.route_mtu(a.mtu)))
                    .unwrap_or(Value::Null))
            }
            Err(super::attach::AttachError {
                error: e,
                made_veth,
            }) => {
                tracing::warn!(pod = %a.pod_ref(), error = %e, "ADD failed: undoing it");
                let undone = if made_veth {
                    self.teardown(&a).await
                } else {
                    self.teardown_unmade(&a).await
                };
                if let Err(u) = undone {
                    tracing::error!(pod = %a.pod_ref(), error = %u, "undoing a failed ADD failed too; the next start or DEL retries");
                }
                Err(e)
            }
        }
    }

    /// With a cluster source, makes sure the Pod object of an ADD is known
    /// before anything is made for it, so its NetworkPolicies are in the
    /// flows the ADD installs: from the snapshot (same uid as `K8S_POD_UID`
    /// when the runtime gives one), else read from the source now
    /// ([`PodLookup`]) and kept in `admitted` until the snapshot has it.
    /// A pod the source does not have (yet) is refused with "try again
    /// later": a pod is never attached without its policy in force.
    async fn admit_pod(&self, req: &CniRequest) -> Result<(), CniError> {
        let Some(lookup) = self.pods.clone() else {
            // CNI-only mode: no cluster, so no policy can select the pod.
            return Ok(());
        };
        let Some((ns, name)) = req.pod() else {
            return Err(err(
                code::INVALID_ENV,
                "CNI_ARGS has no K8S_POD_NAMESPACE and K8S_POD_NAME: the agent follows a cluster and attaches a pod only with its NetworkPolicies, so it must know which pod this is",
            ));
        };
        if ns.is_empty() || name.is_empty() {
            return Err(err(
                code::INVALID_ENV,
                format!("CNI_ARGS names no pod (K8S_POD_NAMESPACE '{ns}', K8S_POD_NAME '{name}')"),
            ));
        }
        let uid = req.args.get("K8S_POD_UID").filter(|u| !u.is_empty());
        let key = (ns.to_string(), name.to_string());
        let fits = |p: &Pod| uid.is_none_or(|u| *u == p.uid);
        if self.cluster().pods.get(&key).is_some_and(fits) {
            return Ok(());
        }
        if let Some(p) = self.admitted.lock().ok().and_then(|a| a.get(&key).cloned()) {
            if fits(&p) {
                return Ok(());
            }
        }
        // Bounded: a hung API server must not hold this pod's lock (and
        // the gate) beyond the plugin's own deadline.
        let pod = tokio::time::timeout(POD_LOOKUP_TIMEOUT, lookup.get_pod(ns, name))
            .await
            .map_err(|_| {
                err(
                    code::TRY_AGAIN_LATER,
                    format!(
                        "cannot read Pod {ns}/{name}: the cluster source did not answer within {} s",
                        POD_LOOKUP_TIMEOUT.as_secs()
                    ),
                )
            })?
            .map_err(|e| {
                err(
                    code::TRY_AGAIN_LATER,
                    format!("cannot read Pod {ns}/{name} from the cluster source: {e:#}"),
                )
            })?;
        let Some(pod) = pod else {
            return Err(err(
                code::TRY_AGAIN_LATER,
                format!("Pod {ns}/{name} is not in the cluster (yet): it is attached only once its NetworkPolicies can be applied"),
            ));
        };
        if !fits(&pod) {
            return Err(err(
                code::TRY_AGAIN_LATER,
                format!(
                    "Pod {ns}/{name} has uid '{}', the runtime asks for '{}' (an older or newer pod of that name)",
                    pod.uid,
                    uid.map(String::as_str).unwrap_or_default()
                ),
            ));
        }
        if !pod.node_name.is_empty() && pod.node_name != self.cfg.node_name {
            tracing::warn!(pod = %format!("{ns}/{name}"), node = %pod.node_name, "the Pod is bound to another node; attaching it here anyway");
        }
        tracing::debug!(pod = %format!("{ns}/{name}"), "Pod read from the cluster source (not in the snapshot yet)");
        if let Ok(mut a) = self.admitted.lock() {
            a.insert(key, pod);
        }
        Ok(())
    }

    /// Drops an admitted pod no attachment uses any more.
    pub(super) fn forget_admitted(&self, ns: &str, name: &str) {
        let in_use = self
            .attachments()
            .iter()
            .any(|a| a.pod_namespace == ns && a.pod_name == name);
        if !in_use {
            if let Ok(mut a) = self.admitted.lock() {
                a.remove(&(ns.to_string(), name.to_string()));
            }
        }
    }

    async fn del(&self, req: &CniRequest) -> Result<(), CniError> {
        let key = (req.container_id.clone(), req.ifname.clone());
        match self.record(&key) {
            Some(a) => {
                self.teardown(&a).await?;
                tracing::info!(pod = %a.pod_ref(), ip = %a.ip_text(), "pod detached");
            }
            None => {
                // Unknown to us: make sure nothing of it is left anyway (an
                // address, or an interface made for it). The interface
                // name is a 28-bit hash: another attachment may have it, so
                // a link is deleted only if it is provably this one's (no
                // record names it, and its alias names this attachment).
                let (pod_ns, pod_name) = req.pod().unwrap_or(("", ""));
                let host = podnet::host_ifname(pod_ns, pod_name, &req.container_id, &req.ifname);
                let owner = self
                    .attachments()
                    .into_iter()
                    .find(|a| a.host_ifname == host);
                let h = host.clone();
                let alias = blocking(move || podnet::link_alias(&h))
                    .await?
                    .unwrap_or(None);
                let mine = podnet::owner_alias(&req.container_id, &req.ifname);
                let ours = match (&owner, &alias) {
                    (Some(o), _) => {
                        tracing::warn!(container = %req.container_id, ifname = %req.ifname, link = %host, owner = %o.pod_ref(), "DEL of an unknown attachment: its interface name is taken by another pod (a hash collision); left alone");
                        false
                    }
                    (None, None) => false,
                    (None, Some(Some(a))) if *a == mine => true,
                    (None, Some(a)) => {
                        tracing::warn!(container = %req.container_id, ifname = %req.ifname, link = %host, alias = ?a, "DEL of an unknown attachment: a link has its name but is not its own; left alone");
                        false
                    }
                };
                if ours {
                    self.delete_then_detach(&host).await?;
                }
                self.release_addresses(&req.container_id, &req.ifname)
                    .await?;
            }
        }
        Ok(())
    }

    async fn check(&self, req: &CniRequest) -> Result<(), CniError> {
        let key = (req.container_id.clone(), req.ifname.clone());
        let Some(a) = self.record(&key) else {
            return Err(err(
                code::UNKNOWN_CONTAINER,
                format!(
                    "container {} interface {} is not attached",
                    req.container_id, req.ifname
                ),
            ));
        };
        if a.state != AttachState::Ready {
            return Err(err(
                code::TRY_AGAIN_LATER,
                format!("{} is still being attached", a.pod_ref()),
            ));
        }
        let mut problems = Vec::new();
        // prevResult must show our interface and address.
        match req.config.get("prevResult") {
            None => problems.push("no prevResult to check against".to_string()),
            Some(prev) => problems.extend(check_prev_result(prev, &a)),
        }
        let spec = self.iface_spec(&a, &req.netns);
        if let Err(e) = blocking(move || podnet::check_pod_interface(&spec)).await? {
            problems.push(e.to_string());
        }
        let ports = self
            .switch_ports()
            .await
            .map_err(|e| Self::switch_err("cannot list the switch's ports", e))?;
        match ports.iter().find(|p| p.name == a.host_ifname) {
            None => problems.push(format!("the switch has no port {}", a.host_ifname)),
            Some(p) if Some(p.ofport) != a.ofport => problems.push(format!(
                "switch port {} is ofport {}, expected {:?}",
                a.host_ifname, p.ofport, a.ofport
            )),
            Some(_) => {}
        }
        if let (Some(node), Some(ofport)) = (self.node(), a.ofport) {
            let v = self
                .switch(Request::DumpFlows {
                    table: None,
                    names: false,
                    stats: false,
                })
                .await
                .map_err(|e| Self::switch_err("cannot dump the switch's flows", e))?;
            let dump: DumpFlowsResult = serde_json::from_value(v)
                .map_err(|e| err(code::SWITCH_FAILURE, format!("bad dump-flows answer: {e}")))?;
            let want = flows::pod_flows(
                &node,
                &PodPort {
                    ofport,
                    ip: a.ip4(),
                    mac: flows::parse_mac(&a.mac).unwrap_or_default(),
                    ip6: a.ip6(),
                },
            );
            problems.extend(compare_flows(&want, &dump, crate::cookie::pod(ofport)));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(err(
                code::CHECK_FAILED,
                format!(
                    "{} is not as attached: {}",
                    a.pod_ref(),
                    problems.join("; ")
                ),
            ))
        }
    }

    async fn gc(&self, req: &CniRequest) -> Result<(), CniError> {
        let list = req
            .config
            .get("cni.dev/valid-attachments")
            .or_else(|| req.config.get("cni.dev/attachments"));
        let list = match list {
            Some(Value::Array(list)) => list,
            // No list: the runtime does not know what is valid; keep everything.
            None | Some(Value::Null) => return Ok(()),
            Some(_) => {
                return Err(err(
                    code::INVALID_CONFIG,
                    "cni.dev/valid-attachments must be a list",
                ))
            }
        };
        let mut valid = BTreeSet::new();
        for (i, item) in list.iter().enumerate() {
            let cid = item.get("containerID").and_then(Value::as_str);
            let ifn = item.get("ifname").and_then(Value::as_str);
            match (cid, ifn) {
                (Some(c), Some(i)) => {
                    valid.insert((c.to_string(), i.to_string()));
                }
                _ => {
                    return Err(err(
                        code::INVALID_CONFIG,
                        format!(
                            "cni.dev/valid-attachments[{i}] needs string containerID and ifname"
                        ),
                    ))
                }
            }
        }
        let mut failures = Vec::new();
        for a in self.attachments() {
            // A pending record is an ADD in progress (or one interrupted,
            // which the agent's own convergence rolls back): not stale.
            if valid.contains(&a.key()) || a.state != AttachState::Ready {
                continue;
            }
            let key = a.key();
            let lock = self.key_lock(&key);
            let r = {
                let _gate = self.gate.read().await;
                let _g = lock.lock().await;
                match self.record(&key) {
                    Some(a) if a.state == AttachState::Ready => self.teardown(&a).await,
                    _ => Ok(()),
                }
            };
            self.drop_key_lock(&key, lock);
            match r {
                Ok(()) => {
                    tracing::info!(pod = %a.pod_ref(), ip = %a.ip_text(), "GC: released a stale attachment")
                }
                Err(e) => failures.push(format!("{}: {e}", a.pod_ref())),
            }
        }
        // Addresses: with no ADD or DEL in flight (the gate for writing),
        // so an address an ADD has just allocated, before its record is
        // written, is never taken for stale.
        let gate = self.gate.write().await;
        let held: BTreeSet<(String, String)> = self.attachments().iter().map(|a| a.key()).collect();
        let valid = std::sync::Arc::new(valid);
        let held = std::sync::Arc::new(held);
        let r = self
            .retain_addresses(move |k| valid.contains(k) || held.contains(k))
            .await;
        drop(gate);
        r?;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(err(
                code::TRY_AGAIN_LATER,
                format!("GC could not release everything: {}", failures.join("; ")),
            ))
        }
    }

    async fn status(&self) -> Result<(), CniError> {
        let Some(node) = self.node() else {
            return Err(err(
                code::NOT_AVAILABLE,
                "the agent has not found oxvs-switchd and its gateway yet",
            ));
        };
        match self.switch(Request::Show).await {
            Ok(_) => {}
            Err(e) if e.is_unreachable() => {
                return Err(err(
                    code::LIMITED_CONNECTIVITY,
                    format!("oxvs-switchd is not reachable: {e}"),
                ))
            }
            Err(_) => {}
        }
        // Each family the node has must have an address left.
        let mut left: Vec<(usize, String)> = Vec::new();
        if node.ipv4.is_some() {
            let (free, cidr) = self.with_ipam(|i| Ok((i.free_count(), i.cidr()))).await?;
            left.push((free, cidr.to_string()));
        }
        if node.ipv6.is_some() {
            if let Some((free, cidr)) = self.with_ipam6(|i| Ok((i.free_count(), i.cidr()))).await? {
                left.push((free, cidr.to_string()));
            }
        }
        match left.iter().find(|(free, _)| *free == 0) {
            Some((_, cidr)) => Err(err(
                code::NOT_AVAILABLE,
                format!("pod CIDR {cidr} has no free address"),
            )),
            None => Ok(()),
        }
    }
}

fn valid_ifname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 15
        && s != "."
        && s != ".."
        && !s
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
}

fn valid_container_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
        && !s.starts_with('.')
}

/// The CNI result of an attachment (1.1.0 shape).
/// `route_mtu`: the default route's MTU when below the interface's (see
/// [`AgentConfig::pod_mtu`](super::AgentConfig)).
pub fn cni_result(a: &Attachment, route_mtu: Option<u32>) -> CniResult {
    CniResult {
        interfaces: vec![CniInterface {
            name: a.ifname.clone(),
            mac: a.mac.clone(),
            mtu: Some(a.mtu),
            sandbox: a.netns.clone(),
        }],
        ips: a
            .ipv4
            .map(|v4| CniIp {
                address: format!("{}/{}", v4.ip, v4.prefix_len),
                gateway: Some(v4.gateway.to_string()),
                interface: Some(0),
            })
            .into_iter()
            .chain(a.ipv6.map(|v6| CniIp {
                address: format!("{}/{}", v6.ip, v6.prefix_len),
                gateway: Some(v6.gateway.to_string()),
                interface: Some(0),
            }))
            .collect(),
        routes: a
            .ipv4
            .map(|v4| CniRoute {
                dst: "0.0.0.0/0".into(),
                gw: Some(v4.gateway.to_string()),
                mtu: route_mtu,
            })
            .into_iter()
            .chain(a.ipv6.map(|v6| CniRoute {
                dst: "::/0".into(),
                gw: Some(v6.gateway.to_string()),
                mtu: route_mtu,
            }))
            .collect(),
        dns: Default::default(),
    }
}

/// Differences between `prev` (a prevResult of any version) and `a`.
fn check_prev_result(prev: &Value, a: &Attachment) -> Vec<String> {
    let mut problems = Vec::new();
    let ifaces = prev
        .get("interfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let idx = ifaces.iter().position(|i| {
        i.get("name").and_then(Value::as_str) == Some(a.ifname.as_str())
            && i.get("sandbox")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
    });
    let Some(idx) = idx else {
        problems.push(format!(
            "prevResult has no interface {} in a sandbox",
            a.ifname
        ));
        return problems;
    };
    if let Some(mac) = ifaces[idx].get("mac").and_then(Value::as_str) {
        if !mac.eq_ignore_ascii_case(&a.mac) {
            problems.push(format!("prevResult MAC {mac} differs from {}", a.mac));
        }
    }
    let ips = prev
        .get("ips")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let wanted = a
        .ipv4
        .map(|v4| format!("{}/{}", v4.ip, v4.prefix_len))
        .into_iter()
        .chain(a.ipv6.map(|v6| format!("{}/{}", v6.ip, v6.prefix_len)));
    for want in wanted {
        let found = ips.iter().any(|ip| {
            ip.get("address").and_then(Value::as_str) == Some(want.as_str())
                && ip
                    .get("interface")
                    .and_then(Value::as_u64)
                    .is_none_or(|i| i as usize == idx)
        });
        if !found {
            problems.push(format!("prevResult has no address {want} on {}", a.ifname));
        }
    }
    problems
}

/// Differences between the flows wanted and those the switch has with `cookie`.
fn compare_flows(want: &[String], dump: &DumpFlowsResult, cookie: u64) -> Vec<String> {
    use oxvs_pipeline::parse::{parse_flow, ParseContext};
    let ctx = ParseContext::default();
    let norm = |f: &oxvs_pipeline::flow::Flow| {
        (f.table, f.priority, f.matches, format!("{:?}", f.actions))
    };
    let want: HashSet<_> = want
        .iter()
        .filter_map(|l| parse_flow(l, &ctx).ok())
        .map(|f| norm(&f))
        .collect();
    let have: HashSet<_> = dump
        .flows
        .iter()
        .filter(|e| e.cookie == cookie)
        .filter_map(|e| {
            let text = format!(
                "table={},priority={},{}{}actions={}",
                e.table,
                e.priority,
                e.matches,
                if e.matches.is_empty() { "" } else { "," },
                e.actions
            );
            parse_flow(&text, &ctx).ok()
        })
        .map(|f| norm(&f))
        .collect();
    let missing = want.difference(&have).count();
    let extra = have.difference(&want).count();
    let mut v = Vec::new();
    if missing > 0 {
        v.push(format!(
            "{missing} of its flows are missing from the switch"
        ));
    }
    if extra > 0 {
        v.push(format!(
            "the switch has {extra} unexpected flows with its cookie"
        ));
    }
    v
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::super::test_fixtures::{att, gc_request, holds, offline_agent};
    use super::*;
    use crate::flows::NodeNet;
    use crate::model::ClusterState;
    use crate::model::ObjKey;
    use crate::source::PodLookup;

    /// GC races with an ADD in progress: the ADD has allocated its address
    /// but not yet written its record when GC (with a list that does not
    /// name it) sweeps the addresses. The sweep must wait for the ADD, so
    /// the address is still the pod's afterwards; and a pending record (an
    /// ADD in flight) is never torn down as stale.
    #[test]
    fn gc_spares_an_add_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let agent = offline_agent(dir.path());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Another ADD, further along: its record is pending.
            let mut other = att();
            other.container_id = "c2".into();
            other.ofport = None;
            other.state = AttachState::Pending;
            let ip2 = agent.with_ipam(|i| i.allocate("c2", "eth0")).await.unwrap();
            other.ipv4.as_mut().unwrap().ip = ip2;
            agent.save_record(other).await.unwrap();
            // The ADD of c1, as `handle` runs it: the gate for reading,
            // then the address; its record is not written yet.
            let gate = agent.gate.read().await;
            let ip = agent.with_ipam(|i| i.allocate("c1", "eth0")).await.unwrap();
            let a = agent.clone();
            let gc = tokio::spawn(async move { a.handle(gc_request(serde_json::json!([]))).await });
            // Ample time for a GC that does not wait to finish its sweep.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut rec = att();
            rec.ipv4.as_mut().unwrap().ip = ip;
            rec.ofport = None;
            rec.state = AttachState::Pending;
            agent.save_record(rec).await.unwrap();
            drop(gate);
            let r = tokio::time::timeout(Duration::from_secs(30), gc)
                .await
                .expect("GC hangs (hang guard)")
                .unwrap();
            assert!(r.is_ok(), "{r:?}");
        });
        assert!(
            holds(&agent, "c1"),
            "GC released the address of an ADD in progress"
        );
        assert!(
            holds(&agent, "c2"),
            "GC released a pending attachment's address"
        );
        assert_eq!(agent.attachments().len(), 2);
    }

    /// A [`PodLookup`] that answers from a map (or fails), counting calls.
    struct FakePods {
        pods: BTreeMap<ObjKey, Pod>,
        fail: bool,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl PodLookup for FakePods {
        fn get_pod<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> futures::future::BoxFuture<'a, anyhow::Result<Option<Pod>>> {
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let r = if self.fail {
                Err(anyhow::anyhow!("connection refused"))
            } else {
                Ok(self
                    .pods
                    .get(&(namespace.to_string(), name.to_string()))
                    .cloned())
            };
            Box::pin(async move { r })
        }
    }

    fn kpod(ns: &str, name: &str, uid: &str) -> Pod {
        Pod {
            namespace: ns.into(),
            name: name.into(),
            uid: uid.into(),
            labels: Default::default(),
            node_name: "n1".into(),
            ip: None,
            host_network: false,
            ports: vec![],
            ip6: None,
        }
    }

    fn add_request(args: &[(&str, &str)]) -> CniRequest {
        CniRequest {
            v: oxvs_api::cni::CNI_PROTOCOL_VERSION,
            command: CniCommand::Add,
            container_id: "c1".into(),
            netns: "/proc/self/ns/net".into(),
            ifname: "eth0".into(),
            args: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            config: serde_json::json!({"cniVersion": "1.0.0", "name": "oxvs"}),
        }
    }

    /// ADD's admission with a cluster source: the snapshot first, then one
    /// read of the source; a pod the source lacks, a stale uid, a failed
    /// read, or no pod in CNI_ARGS is refused with the right code and a
    /// message naming the pod.
    #[test]
    fn admission_reads_a_pod_the_snapshot_lacks_and_refuses_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakePods {
            pods: BTreeMap::from([
                (("x".into(), "late".into()), kpod("x", "late", "u-late")),
                (("x".into(), "known".into()), kpod("x", "known", "u-known")),
            ]),
            fail: false,
            calls: Default::default(),
        });
        let agent = Arc::into_inner(offline_agent(dir.path()))
            .unwrap()
            .with_pod_lookup(fake.clone());
        let calls = || fake.calls.load(std::sync::atomic::Ordering::Relaxed);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut st = ClusterState::default();
            st.pods
                .insert(("x".into(), "known".into()), kpod("x", "known", "u-known"));
            agent.set_cluster(Arc::new(st)).await;
            fn pod(name: &str) -> [(&str, &str); 2] {
                [("K8S_POD_NAMESPACE", "x"), ("K8S_POD_NAME", name)]
            }
            // In the snapshot: no read.
            agent.admit_pod(&add_request(&pod("known"))).await.unwrap();
            assert_eq!(calls(), 0);
            // Not in the snapshot, in the source: read once, then kept.
            agent.admit_pod(&add_request(&pod("late"))).await.unwrap();
            agent.admit_pod(&add_request(&pod("late"))).await.unwrap();
            assert_eq!(calls(), 1);
            assert!(agent
                .admitted
                .lock()
                .unwrap()
                .contains_key(&("x".into(), "late".into())));
            // In neither.
            let e = agent
                .admit_pod(&add_request(&pod("ghost")))
                .await
                .unwrap_err();
            assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e:?}");
            assert!(e.msg.contains("x/ghost"), "{e:?}");
            // The runtime's pod is another one (uid) than the object.
            let mut args = pod("known").to_vec();
            args.push(("K8S_POD_UID", "u-other"));
            let e = agent.admit_pod(&add_request(&args)).await.unwrap_err();
            assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e:?}");
            assert!(
                e.msg.contains("u-other") && e.msg.contains("x/known"),
                "{e:?}"
            );
            // No pod named at all.
            let e = agent.admit_pod(&add_request(&[])).await.unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{e:?}");
            assert!(e.msg.contains("K8S_POD_NAME"), "{e:?}");
        });
        // A failed read.
        let failing = Arc::into_inner(offline_agent(&dir.path().join("b")))
            .unwrap()
            .with_pod_lookup(Arc::new(FakePods {
                pods: BTreeMap::new(),
                fail: true,
                calls: Default::default(),
            }));
        rt.block_on(async {
            let e = failing
                .admit_pod(&add_request(&[
                    ("K8S_POD_NAMESPACE", "x"),
                    ("K8S_POD_NAME", "p"),
                ]))
                .await
                .unwrap_err();
            assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e:?}");
            assert!(
                e.msg.contains("x/p") && e.msg.contains("connection refused"),
                "{e:?}"
            );
        });
    }

    #[test]
    fn result_and_prev_result_check() {
        let r = serde_json::to_value(cni_result(&att(), None)).unwrap();
        assert!(check_prev_result(&r, &att()).is_empty());
        // A 0.4.0-style prevResult with "version" and a chained plugin's host interface first.
        let prev = serde_json::json!({
            "interfaces": [{"name": "cni0"}, {"name": "eth0", "mac": "0A:58:0A:F4:00:05", "sandbox": "/x"}],
            "ips": [{"version": "4", "address": "10.244.0.5/24", "interface": 1}]
        });
        assert!(check_prev_result(&prev, &att()).is_empty());
        let bad = serde_json::json!({"interfaces": [{"name": "eth0", "sandbox": "/x"}], "ips": [{"address": "10.244.0.6/24", "interface": 0}]});
        let p = check_prev_result(&bad, &att());
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("10.244.0.5/24"));
        assert!(!check_prev_result(&serde_json::json!({}), &att()).is_empty());
    }

    #[test]
    fn ids() {
        assert!(valid_container_id("abc-1_2.3"));
        assert!(!valid_container_id("a/b"));
        assert!(!valid_container_id(""));
        assert!(valid_ifname("eth0"));
        assert!(!valid_ifname("0123456789abcdef"));
        assert!(!valid_ifname("a/b"));
    }

    #[test]
    fn flow_comparison_by_cookie() {
        let node = NodeNet {
            ipv4: Some(crate::flows::NodeNet4 {
                pod_cidr: "10.244.0.0/24".parse().unwrap(),
                gateway_ip: "10.244.0.1".parse().unwrap(),
            }),
            gateway_mac: [2, 0, 0, 0, 0, 1],
            gateway_ofport: 2,
            ipv6: None,
        };
        let pod = PodPort {
            ofport: 3,
            ip: Some("10.244.0.5".parse().unwrap()),
            mac: flows::pod_mac("10.244.0.5".parse().unwrap()),
            ip6: None,
        };
        let want = flows::pod_flows(&node, &pod);
        // Build a dump from the wanted flows through the pipeline's printer.
        let ctx = oxvs_pipeline::parse::ParseContext::default();
        let entries: Vec<oxvs_api::FlowEntry> = want
            .iter()
            .map(|l| {
                let f = oxvs_pipeline::parse::parse_flow(l, &ctx).unwrap();
                oxvs_api::FlowEntry {
                    table: f.table,
                    table_name: None,
                    priority: f.priority,
                    cookie: f.cookie,
                    duration_ns: 0,
                    n_packets: 0,
                    n_bytes: 0,
                    idle_age_s: None,
                    matches: oxvs_pipeline::print::format_match(&f.matches),
                    actions: oxvs_pipeline::print::format_actions(&f.actions, None),
                }
            })
            .collect();
        let mut dump = DumpFlowsResult {
            lines: vec![],
            flows: entries,
        };
        assert!(compare_flows(&want, &dump, crate::cookie::pod(3)).is_empty());
        dump.flows.pop();
        let p = compare_flows(&want, &dump, crate::cookie::pod(3));
        assert_eq!(
            p,
            vec!["1 of its flows are missing from the switch".to_string()]
        );
    }

    /// The CNI socket's answers: a line that is not a request, a request
    /// of another protocol version, a refused line and the busy answer are
    /// typed failures with the right code; a request is run (STATUS of an
    /// agent without a switch: not available).
    #[test]
    fn cni_socket_answers() {
        let dir = tempfile::tempdir().unwrap();
        let agent = offline_agent(dir.path());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let ask = |line: &str| -> CniResponse {
            let text = rt.block_on(CniSocket::handle(&agent, line));
            serde_json::from_str(&text).unwrap()
        };
        let failure = |r: CniResponse| r.error.filter(|_| !r.ok).expect("a failure");
        let e = failure(ask("not json"));
        assert_eq!(e.code, code::DECODE_FAILURE, "{e:?}");
        assert!(e.msg.starts_with("bad request from the plugin: "), "{e:?}");
        let e = failure(ask(r#"{"v":99,"command":"STATUS","config":{}}"#));
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION, "{e:?}");
        assert!(e.msg.contains("protocol 99"), "{e:?}");
        let e = failure(ask(
            r#"{"v":1,"command":"STATUS","config":{"cniVersion":"1.1.0","name":"oxvs"}}"#,
        ));
        assert_eq!(e.code, code::NOT_AVAILABLE, "{e:?}");
        let r: CniResponse = serde_json::from_str(&CniSocket::refused("why")).unwrap();
        let e = failure(r);
        assert_eq!((e.code, e.msg.as_str()), (code::DECODE_FAILURE, "why"));
        let r: CniResponse = serde_json::from_str(&CniSocket::busy(7)).unwrap();
        assert!(r.busy);
        let e = failure(r);
        assert_eq!(e.code, code::TRY_AGAIN_LATER);
        assert!(e.msg.contains("7 CNI connections") && e.msg.contains("--cni-max-connections"));
    }
}
