//! Convergence with the switch: its flows and ports made what the
//! records and the cluster say.
//!
//! The desired flows are a pure function of the node, the ready
//! attachments and the cluster ([`crate::desired::compute`]).
//! [`Agent::reconcile`] (on start and whenever the switch's view drifts,
//! e.g. after a switch restart; [`Agent::drifted`] tells) re-adds missing
//! ports and sends `replace-flows`, which the switch applies as a diff in
//! one atomic version: flows that did not change keep their counters and
//! never stop matching, so live pods are not disturbed.
//!
//! In between, [`Agent::sync`] (after every ADD, DEL and cluster change)
//! sends only the difference from the set it last applied, deletes then
//! adds, as one atomic `bundle` (after a reconcile or a failed bundle: one
//! `replace-flows`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net};
use oxvs_api::cni::{code, CniError};
use oxvs_api::Request;

use super::{blocking, err, gateway_of, Agent};
use crate::desired::{self, Inputs, Tunnel};
use crate::flows::{self, NodeNet, PodPort};
use crate::model::Pod;
use crate::podnet;
use crate::policy::Refusal;
use crate::state::AttachState;

impl Agent {
    fn pod_ports(&self) -> Vec<PodPort> {
        desired::pod_ports(&self.attachments())
    }

    /// The NetworkPolicies the translator refused (too many flows).
    pub fn refused_policies(&self) -> Vec<Refusal> {
        self.refused_policies
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Everything the node's flows are computed from, cloned out of the
    /// agent's locks (cheap: the cluster is an `Arc`).
    fn inputs(&self, node: NodeNet) -> Inputs {
        let state = self.cluster();
        let admitted: Vec<Pod> = match self.admitted.lock() {
            Ok(mut a) => {
                // The snapshot caught up with a pod ADD read: it wins.
                a.retain(|k, p| state.pods.get(k).is_none_or(|s| s.uid != p.uid));
                a.values().cloned().collect()
            }
            Err(_) => Vec::new(),
        };
        let attachments = self.attachments();
        let tunnel = self.tunnel_ofport.lock().ok().and_then(|t| *t);
        let remotes = self.remote_nodes(&state);
        Inputs {
            pods: desired::pod_ports(&attachments),
            tunnel: tunnel.map(|ofport| Tunnel {
                ofport,
                remotes,
                node_ip: self.node_ip(),
                guard: true,
            }),
            local: desired::local_pods(&attachments),
            admitted,
            state,
            node,
            max_policy_flows: self.cfg.max_policy_flows,
            proxy: self.cfg.proxy,
            node_name: self.cfg.node_name.clone(),
        }
    }

    /// Makes the switch's flows the desired ones: the first time (and after
    /// drift) with one `replace-flows`, then by sending only the difference
    /// as one atomic bundle. Also keeps the host routes to remote pod CIDRs.
    ///
    /// The translation and the diff run on the blocking pool ([`desired::compute`]
    /// is linear in the cluster, and a policy is capped at
    /// `max_policy_flows`), so a large policy never occupies a runtime
    /// thread: CNI requests, the API and metrics keep being served while
    /// it is translated.
    pub async fn sync(&self) -> Result<(), CniError> {
        let Some(node) = self.node() else {
            return Err(err(code::TRY_AGAIN_LATER, "the agent is not ready yet"));
        };
        let mut applied = self.applied.lock().await;
        let inputs = self.inputs(node.clone());
        let valid = applied.valid;
        let old = std::mem::take(&mut applied.lines);
        let old_groups = std::mem::take(&mut applied.groups);
        // With groups (the proxy's, or left over from it) the full
        // replace carries them too, in the same version.
        let with_groups = self.cfg.proxy || !old_groups.is_empty();
        // Until the lines are back: a failed task means a full replace.
        applied.valid = false;
        let (desired, want, want_groups, change, old, old_groups) = blocking(move || {
            let d = desired::compute(&inputs);
            let want: HashSet<String> = d.lines.iter().cloned().collect();
            let want_groups: HashSet<String> = d.groups.iter().cloned().collect();
            let change = if valid {
                FlowChange::Bundle(diff_mods(&old, &want, &old_groups, &want_groups))
            } else if with_groups || !d.groups.is_empty() {
                FlowChange::ReplaceWithGroups(d.groups.join("\n"), d.lines.join("\n"))
            } else {
                FlowChange::Replace(d.lines.join("\n"))
            };
            (d, want, want_groups, change, old, old_groups)
        })
        .await?;
        applied.lines = old;
        applied.groups = old_groups;
        applied.valid = valid;
        self.note_refused_policies(&desired.refused);
        match change {
            FlowChange::Replace(text) => {
                let r = self
                    .switch(Request::ReplaceFlows { flows: text })
                    .await
                    .map_err(|e| Self::switch_err("cannot set the node's flows", e))?;
                let r: oxvs_api::FlowModResult = serde_json::from_value(r).unwrap_or_default();
                tracing::debug!(
                    added = r.added,
                    deleted = r.deleted,
                    n_flows = r.n_flows,
                    "flows replaced"
                );
                applied.lines = want;
                applied.groups = want_groups;
                applied.valid = true;
            }
            FlowChange::ReplaceWithGroups(groups, flows) => {
                let r = self
                    .switch(Request::ReplaceGroups { groups, flows })
                    .await
                    .map_err(|e| Self::switch_err("cannot set the node's flows and groups", e))?;
                let r: oxvs_api::ReplaceResult = serde_json::from_value(r).unwrap_or_default();
                tracing::debug!(
                    added = r.flows.added,
                    deleted = r.flows.deleted,
                    n_flows = r.flows.n_flows,
                    n_groups = r.groups.n_groups,
                    "flows and groups replaced"
                );
                applied.lines = want;
                applied.groups = want_groups;
                applied.valid = true;
            }
            FlowChange::Bundle(mods) => {
                if !mods.is_empty() {
                    if let Err(e) = self.switch(Request::Bundle { mods }).await {
                        // Next time, start over with a full replace.
                        applied.valid = false;
                        return Err(Self::switch_err("cannot update the node's flows", e));
                    }
                    applied.lines = want;
                    applied.groups = want_groups;
                }
            }
        }
        // Endpoints gone: their UDP connections end now (kube-proxy's
        // conntrack flush), or clients keep sending to a dead endpoint.
        let udp_now: BTreeSet<(IpAddr, u16)> = desired.udp_endpoints.iter().copied().collect();
        let gone: Vec<(IpAddr, u16)> = applied
            .udp_endpoints
            .difference(&udp_now)
            .copied()
            .collect();
        applied.udp_endpoints = udp_now;
        if let Ok(mut r) = self.rules.lock() {
            *r = desired.rules;
        }
        drop(applied);
        for (ip, port) in gone {
            let req = Request::FlushConntrack {
                zone: Some(crate::flows::CT_ZONE),
                proto: Some(17),
                reply_src: Some(ip),
                reply_sport: Some(port),
            };
            match self.switch(req).await {
                Ok(_) => {
                    tracing::info!(endpoint = %format!("{ip}:{port}"), "UDP connections of a removed endpoint flushed")
                }
                Err(e) => {
                    tracing::warn!(endpoint = %format!("{ip}:{port}"), "cannot flush the UDP connections of a removed endpoint: {e}")
                }
            }
        }
        self.sync_routes(&node).await;
        if self.cfg.proxy {
            self.sync_node_ports(&node).await;
        }
        Ok(())
    }

    /// The proxy's NodePorts on the host: DNATed to the Service VIP of
    /// their family (which the host routes into the switch), when they
    /// changed; IPv6 ones on a dual-stack node.
    async fn sync_node_ports(&self, node: &NodeNet) {
        let cluster = self.cluster();
        let want = (
            crate::proxy::node_ports(&cluster),
            match node.ipv6 {
                Some(_) => crate::proxy::node_ports6(&cluster),
                None => Vec::new(),
            },
        );
        if self
            .node_ports
            .lock()
            .is_ok_and(|h| h.as_ref() == Some(&want))
        {
            return;
        }
        let w = want.clone();
        let v6 = node.ipv6.is_some();
        let r = tokio::task::spawn_blocking(move || {
            crate::hostnet::sync_node_ports(&w.0, crate::proxy::SERVICE_VIP.into())?;
            if v6 {
                crate::hostnet::sync_node_ports(&w.1, crate::proxy::SERVICE_VIP6.into())?;
            }
            Ok::<(), crate::hostnet::HostnetError>(())
        })
        .await;
        match r {
            Ok(Ok(())) => {
                tracing::info!(
                    node_ports = want.0.len(),
                    node_ports6 = want.1.len(),
                    "NodePorts set on the host"
                );
                if let Ok(mut h) = self.node_ports.lock() {
                    *h = Some(want);
                }
            }
            Ok(Err(e)) => tracing::warn!("cannot set the NodePorts on the host: {e}"),
            Err(e) => tracing::warn!("NodePort task failed: {e}"),
        }
    }

    fn note_refused_policies(&self, refused: &[Refusal]) {
        let Ok(mut last) = self.refused_policies.lock() else {
            return;
        };
        if last.as_slice() == refused {
            return;
        }
        for r in refused {
            if !last.contains(r) {
                tracing::error!(namespace = %r.policy.0, policy = %r.policy.1, flows = r.flows, limit = r.limit, "{r}");
                crate::metrics::record_policy_refusal();
            }
        }
        for r in last.iter() {
            if !refused.iter().any(|x| x.policy == r.policy) {
                tracing::info!(namespace = %r.policy.0, policy = %r.policy.1, "NetworkPolicy no longer refused");
            }
        }
        *last = refused.to_vec();
    }

    /// Host routes: each remote pod CIDR via that node's gateway address,
    /// onlink on the gateway interface (the switch answers ARP for it).
    /// With the proxy, also the Service VIP onto the gateway link and every
    /// Service address via it ([`crate::proxy`], "From outside the node").
    async fn sync_routes(&self, node: &NodeNet) {
        let cluster = self.cluster();
        let remotes = self.remote_nodes(&cluster);
        let mut want: BTreeMap<IpNet, Option<IpAddr>> = BTreeMap::new();
        if let Some(own) = node.pod_cidr4() {
            for c in remotes.iter().filter_map(|r| r.pod_cidr) {
                if c != own {
                    want.insert(c.into(), Some(gateway_of(c).into()));
                }
            }
        }
        if let Some(own) = &node.ipv6 {
            for c in remotes.iter().filter_map(|r| r.pod_cidr6) {
                if c != own.pod_cidr {
                    want.insert(c.into(), Some(flows::ipv6::gateway_of(c).into()));
                }
            }
        }
        if self.cfg.proxy {
            if node.ipv4.is_some() {
                // IPv4 ClusterIPs via the VIP, for which the switch answers
                // ARP (an IPv6-only node has neither).
                let vip = crate::proxy::SERVICE_VIP;
                want.insert(Ipv4Net::from(vip).into(), None);
                for ip in crate::proxy::host_routes(&cluster) {
                    want.entry(Ipv4Net::from(ip).into())
                        .or_insert(Some(vip.into()));
                }
            }
            if node.ipv6.is_some() {
                // IPv6 ClusterIPs via the IPv6 VIP, for which the switch
                // answers Neighbour Discovery.
                let vip6 = crate::proxy::SERVICE_VIP6;
                want.insert(ipnet::Ipv6Net::from(vip6).into(), None);
                for ip in crate::proxy::host_routes6(&cluster) {
                    want.entry(ipnet::Ipv6Net::from(ip).into())
                        .or_insert(Some(vip6.into()));
                }
            }
        }
        let mut have = self.routes.lock().map(|r| r.clone()).unwrap_or_default();
        let gw = self.cfg.gateway.clone();
        if self.cfg.proxy && have.is_empty() {
            // First sync since the agent started: Service routes a previous
            // run left (Services deleted meanwhile) are ours to remove.
            for vip in [
                IpAddr::from(crate::proxy::SERVICE_VIP),
                IpAddr::from(crate::proxy::SERVICE_VIP6),
            ] {
                let g = gw.clone();
                if let Ok(Ok(left)) =
                    tokio::task::spawn_blocking(move || podnet::routes_via(vip, &g)).await
                {
                    for dst in left {
                        have.entry(dst).or_insert(Some(vip));
                    }
                }
            }
        }
        if want == have {
            return;
        }
        let mtu = self.route_mtu(self.link_mtu());
        let (w, h) = (want.clone(), have);
        let r = tokio::task::spawn_blocking(move || -> Result<(), podnet::PodnetError> {
            for (dst, _) in h.iter().filter(|(d, _)| !w.contains_key(*d)) {
                podnet::remove_route(*dst, &gw)?;
            }
            for (dst, via) in &w {
                if h.get(dst) != Some(via) {
                    podnet::ensure_route(*dst, *via, &gw, mtu)?;
                }
            }
            Ok(())
        })
        .await;
        match r {
            Ok(Ok(())) => {
                if let Ok(mut r) = self.routes.lock() {
                    *r = want;
                }
            }
            Ok(Err(e)) => tracing::warn!("cannot set the routes to remote pod CIDRs: {e}"),
            Err(e) => tracing::warn!("route task failed: {e}"),
        }
    }

    /// Brings the switch and the host in line with the records: rolls back
    /// pending attachments, forgets pods whose interface is gone (the
    /// sandbox was destroyed while the agent was away), re-adds ports the
    /// switch lost, releases addresses no record holds, and makes the
    /// switch's flows exactly the desired ones (`replace-flows`, a diff).
    pub async fn reconcile(&self) -> anyhow::Result<ReconcileReport> {
        let _gate = self.gate.write().await;
        self.discover_node().await?;
        let mut report = ReconcileReport::default();
        let ports = self.switch_ports().await?;
        let by_name: HashMap<String, u32> =
            ports.iter().map(|p| (p.name.clone(), p.ofport)).collect();
        for a in self.attachments() {
            if a.state == AttachState::Pending {
                tracing::info!(pod = %a.pod_ref(), "rolling back an interrupted ADD");
                self.teardown(&a)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                report.rolled_back += 1;
                continue;
            }
            let host = a.host_ifname.clone();
            let exists = tokio::task::spawn_blocking(move || podnet::link_exists(&host)).await??;
            if !exists {
                tracing::info!(pod = %a.pod_ref(), ip = %a.ip_text(), "pod interface is gone: releasing its port and address");
                self.teardown(&a)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                report.gone += 1;
                continue;
            }
            self.isolate_host_link(&a).await;
            match by_name.get(&a.host_ifname) {
                Some(&ofport) if Some(ofport) == a.ofport => {}
                Some(&ofport) => {
                    let mut b = a.clone();
                    b.ofport = Some(ofport);
                    self.save_record(b)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    report.ports_renumbered += 1;
                }
                None => {
                    tracing::info!(pod = %a.pod_ref(), port = %a.host_ifname, "the switch lost the pod's port: re-adding it");
                    let ofport = self
                        .add_port(&a.host_ifname, a.ofport)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    let mut b = a.clone();
                    b.ofport = Some(ofport);
                    self.save_record(b)
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    report.ports_readded += 1;
                }
            }
        }
        // Addresses no record holds.
        let held: BTreeSet<(String, String)> = self.attachments().iter().map(|a| a.key()).collect();
        let held = std::sync::Arc::new(held);
        let removed = self
            .retain_addresses(move |k| held.contains(k))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (ip, container) in &removed {
            tracing::info!(%ip, %container, "released an address no pod holds");
        }
        report.addresses_released = removed.len();
        self.applied.lock().await.valid = false;
        self.sync().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        report.pods = self.pod_ports().len();
        Ok(report)
    }

    /// Makes `a`'s host link isolated from the host's stack again
    /// ([`crate::hostnet::isolate_host_link`]: made by an agent without it,
    /// or undone since by a change of `net.ipv4.ip_forward`); a failure is
    /// logged, not fatal: the pod keeps working.
    async fn isolate_host_link(&self, a: &crate::state::Attachment) {
        let host = a.host_ifname.clone();
        let r = tokio::task::spawn_blocking(move || {
            if crate::hostnet::host_link_isolated(&host) {
                return Ok(false);
            }
            crate::hostnet::isolate_host_link(&host).map(|()| true)
        })
        .await;
        match r {
            Ok(Ok(true)) => {
                tracing::info!(pod = %a.pod_ref(), link = %a.host_ifname, "the pod's host link was not isolated from the host's stack: now it is");
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(pod = %a.pod_ref(), error = %e, "the pod's host link is not isolated from the host's stack")
            }
            Err(e) => tracing::warn!(pod = %a.pod_ref(), error = %e, "the isolation task failed"),
        }
    }

    /// Whether the switch no longer holds what the agent set (a port
    /// missing or renumbered, or a different number of flows: e.g.
    /// oxvs-switchd restarted, or someone edited its flows), or the
    /// node's facts changed.
    pub async fn drifted(&self) -> anyhow::Result<bool> {
        let Some(node) = self.node() else {
            return Ok(true);
        };
        let cluster = self.cluster();
        if self.pod_cidr_in(&cluster).map(|c| c.trunc()) != node.pod_cidr4()
            || self.pod_cidr6_in(&cluster).map(|c| c.trunc()) != node.pod_cidr6()
        {
            return Ok(true);
        }
        let tunnel = self.tunnel_ofport.lock().ok().and_then(|t| *t);
        if tunnel.is_none() && self.node_ip().is_some() {
            return Ok(true);
        }
        let _gate = self.gate.write().await;
        let applied = self.applied.lock().await;
        if !applied.valid {
            return Ok(true);
        }
        let v = self.switch(Request::Show).await?;
        let show: oxvs_api::ShowResult = serde_json::from_value(v)?;
        let ports: HashMap<&str, u32> = show
            .ports
            .iter()
            .map(|p| (p.name.as_str(), p.ofport))
            .collect();
        if ports.get(self.gateway_port().as_str()) != Some(&node.gateway_ofport) {
            return Ok(true);
        }
        if tunnel.is_some() && ports.get(self.cfg.tunnel.as_str()).copied() != tunnel {
            return Ok(true);
        }
        for a in self.attachments() {
            if a.state != AttachState::Ready
                || ports.get(a.host_ifname.as_str()).copied() != a.ofport
            {
                return Ok(true);
            }
        }
        // Learned flows (the proxy's session affinity, in SessionAffinity)
        // are the switch's own: not drift.
        let mut n_flows = show.n_flows;
        if self.cfg.proxy {
            let table = oxvs_pipeline::names::SESSION_AFFINITY;
            let v = self
                .switch(Request::DumpFlows {
                    table: Some(table.id.to_string()),
                    names: false,
                    stats: false,
                })
                .await?;
            let dump: oxvs_api::DumpFlowsResult = serde_json::from_value(v)?;
            let prefix = format!("table={},", table.name);
            let ours = applied
                .lines
                .iter()
                .filter(|l| l.starts_with(&prefix))
                .count();
            n_flows = n_flows.saturating_sub(dump.flows.len().saturating_sub(ours));
        }
        Ok(n_flows != applied.lines.len())
    }
}

/// What [`Agent::reconcile`] did.
#[derive(Clone, Debug, Default)]
pub struct ReconcileReport {
    pub pods: usize,
    pub rolled_back: usize,
    pub gone: usize,
    pub ports_readded: usize,
    pub ports_renumbered: usize,
    pub addresses_released: usize,
    pub flow_changes: oxvs_api::FlowModResult,
}

/// How the switch is brought to the desired flows.
enum FlowChange {
    /// `replace-flows` with this text (first time, or after a failure).
    Replace(String),
    /// `replace-groups` with these groups and flows (the proxy's way).
    ReplaceWithGroups(String, String),
    /// One atomic bundle of these mods (may be empty).
    Bundle(String),
}

/// The bundle that turns the flows `old` into `want` and the groups
/// `old_groups` into `want_groups`: new and changed groups first (flows
/// may name them), then flow deletes and adds, then the groups no longer
/// wanted (no flow names them by then).
fn diff_mods(
    old: &HashSet<String>,
    want: &HashSet<String>,
    old_groups: &HashSet<String>,
    want_groups: &HashSet<String>,
) -> String {
    let mut mods = String::new();
    let group_id = |line: &str| -> Option<String> {
        line.split(',')
            .next()
            .and_then(|f| f.strip_prefix("group_id="))
            .map(str::to_string)
    };
    let want_ids: HashSet<String> = want_groups.iter().filter_map(|g| group_id(g)).collect();
    for g in want_groups.difference(old_groups) {
        mods.push_str("group add_or_mod ");
        mods.push_str(g);
        mods.push('\n');
    }
    for line in old.difference(want) {
        match strict_selector(line) {
            Some(sel) => {
                mods.push_str("delete_strict ");
                mods.push_str(&sel);
                mods.push('\n');
            }
            None => tracing::error!(flow = %line, "cannot parse a flow the agent made"),
        }
    }
    for line in want.difference(old) {
        mods.push_str("add ");
        mods.push_str(line);
        mods.push('\n');
    }
    for g in old_groups.difference(want_groups) {
        match group_id(g) {
            Some(id) if !want_ids.contains(&id) => {
                mods.push_str("group delete group_id=");
                mods.push_str(&id);
                mods.push('\n');
            }
            Some(_) => {}
            None => tracing::error!(group = %g, "cannot read a group the agent made"),
        }
    }
    mods
}

/// The `table=T,priority=P,MATCH` text that selects exactly `line`'s flow
/// (for `delete_strict`).
fn strict_selector(line: &str) -> Option<String> {
    use oxvs_pipeline::parse::{parse_flow, ParseContext};
    let f = parse_flow(line, &ParseContext::default()).ok()?;
    let m = oxvs_pipeline::print::format_match_priority(&f.matches, f.priority);
    Some(format!("table={},{m}", f.table))
}
