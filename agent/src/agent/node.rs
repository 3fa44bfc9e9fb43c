//! The node's own network, learned from the cluster, the host and the
//! switch: its pod CIDR (`--pod-cidr`, or its Node object once
//! [`crate::nodes`] accepts it as the IPAM range), the gateway port and
//! address, the tunnel port, the underlay subnet; and the remote Nodes it
//! believes ([`crate::nodes::check_remotes`]), refusals logged and counted
//! once per change.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use oxvs_api::{PortKind, PortSpec, Request};

use super::Agent;
use crate::flows::{self, NodeNet, NodeNet4, NodeNet6, RemoteNode};
use crate::model::{ClusterState, Node};
use crate::nodes::{self, LocalNode, NodeProblem, RefusedNode};
use crate::podnet;

impl Agent {
    pub(super) fn pod_cidr_in(&self, state: &ClusterState) -> Option<Ipv4Net> {
        let from_node = state
            .nodes
            .get(&self.cfg.node_name)
            .and_then(|n| n.pod_cidr);
        match (self.cfg.pod_cidr, from_node) {
            (Some(c), Some(n)) if c != n => {
                tracing::warn!(flag = %c, node = %n, "--pod-cidr differs from the Node's spec.podCIDR; using --pod-cidr");
                Some(c)
            }
            (Some(c), _) => Some(c),
            (None, Some(n)) => self.check_own_node(n, state),
            (None, None) => None,
        }
    }

    /// The node's IPv6 pod CIDR: `--pod-cidr` (IPv6), else its Node
    /// object's first IPv6 `spec.podCIDRs` entry, if usable.
    pub(super) fn pod_cidr6_in(&self, state: &ClusterState) -> Option<Ipv6Net> {
        if let Some(c) = self.cfg.pod_cidr6 {
            return Some(c);
        }
        let c = state.nodes.get(&self.cfg.node_name)?.pod_cidr6?;
        (c.prefix_len() <= 126).then_some(c)
    }

    /// What this node knows of itself, for [`crate::nodes`].
    fn local_node(&self, state: &ClusterState, pod_cidr: Option<Ipv4Net>) -> LocalNode {
        LocalNode {
            name: self.cfg.node_name.clone(),
            pod_cidr,
            pod_cidr6: self.pod_cidr6_in(state),
            node_ip: self.node_ip_in(state),
            ip4: self.node_ip4_in(state),
            underlay: self.underlay.lock().ok().and_then(|u| {
                u.iter().find_map(|n| match n {
                    IpNet::V4(n) => Some(*n),
                    IpNet::V6(_) => None,
                })
            }),
            underlay6: self.underlay.lock().ok().and_then(|u| {
                u.iter().find_map(|n| match n {
                    IpNet::V6(n) => Some(*n),
                    IpNet::V4(_) => None,
                })
            }),
        }
    }

    /// This node's own Node's podCIDR, if it may be the IPAM range;
    /// a refusal is logged and counted once per change.
    fn check_own_node(&self, cidr: Ipv4Net, state: &ClusterState) -> Option<Ipv4Net> {
        let r = nodes::check_local(cidr, &self.local_node(state, None));
        let Ok(mut last) = self.refused_local.lock() else {
            return r.ok();
        };
        match r {
            Ok(c) => {
                if last.take().is_some() {
                    tracing::info!(node = %self.cfg.node_name, pod_cidr = %c, "this node's Node object is accepted again");
                }
                Some(c)
            }
            Err(p) => {
                if last.as_ref() != Some(&p) {
                    let refused = RefusedNode {
                        name: self.cfg.node_name.clone(),
                        problem: p.clone(),
                    };
                    tracing::error!(node = %refused.name, reason = p.reason(), "{refused}; not used as this node's pod CIDR (set --pod-cidr or fix the Node)");
                    crate::metrics::record_node_refusal(p.reason());
                    *last = Some(p);
                }
                None
            }
        }
    }

    /// This node's tunnel address: the one its tunnel port was made on,
    /// else what the flag or the Node says ([`own_tunnel_ip`]).
    pub(crate) fn node_ip(&self) -> Option<IpAddr> {
        self.node_ip_in(&self.cluster())
    }

    /// [`Agent::node_ip`], the Node read from `state`.
    fn node_ip_in(&self, state: &ClusterState) -> Option<IpAddr> {
        if let Some(ip) = self.tunnel_ip.lock().ok().and_then(|t| *t) {
            return Some(ip);
        }
        own_tunnel_ip(self.cfg.node_ip, state.nodes.get(&self.cfg.node_name))
    }

    /// This node's IPv4 address: `--node-ip` if IPv4, else its Node's IPv4
    /// InternalIP (whatever family the tunnel runs over).
    fn node_ip4_in(&self, state: &ClusterState) -> Option<std::net::Ipv4Addr> {
        match self.cfg.node_ip {
            Some(IpAddr::V4(a)) => Some(a),
            _ => state
                .nodes
                .get(&self.cfg.node_name)
                .and_then(|n| n.internal_ip),
        }
    }

    /// Sizes the pod MTU for the tunnel's address ([`Agent::node_ip`]):
    /// without `--mtu`, its link's MTU less the tunnel's overhead of its
    /// family ([`super::auto_pod_mtu`]: an IPv6 tunnel taken from the
    /// Node's InternalIP gets 70 bytes, not the 50 the start-up default
    /// assumed); with `--mtu`, a warning if that leaves too little room.
    /// Nothing when the address is unknown or on no link of this host.
    async fn size_pod_mtu(&self) {
        let Some(ip) = self.node_ip() else {
            return;
        };
        let underlay = match tokio::task::spawn_blocking(move || podnet::mtu_of_address(ip)).await {
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                tracing::warn!(tunnel_ip = %ip, "cannot read the MTU of the tunnel address's link: {e}");
                return;
            }
            Err(e) => {
                tracing::warn!("MTU task failed: {e}");
                return;
            }
        };
        let fits = super::auto_pod_mtu(underlay, ip);
        let mtu = self.pod_mtu();
        if self.cfg.pod_mtu_auto {
            if fits != mtu {
                tracing::info!(from = mtu, to = fits, underlay_mtu = underlay, tunnel_ip = %ip, "pod MTU sized for the tunnel's address");
                self.set_pod_mtu(fits);
            }
        } else if mtu > fits {
            tracing::warn!(mtu, underlay_mtu = underlay, tunnel_ip = %ip, "--mtu leaves less room than the tunnel needs over this address (70 bytes over IPv6, 50 over IPv4): larger packets leaving the node get a 'too big' error at the tunnel; use --mtu {fits} or less");
        }
    }

    pub(super) fn gateway_port(&self) -> String {
        self.cfg.gateway.clone()
    }

    /// Learns the node's network from the switch and the host (gateway port
    /// number and MAC), puts the gateway address on the gateway interface
    /// with the pod MTU, and adds the tunnel port once the node's underlay
    /// address is known. Fails while the switch, its gateway or the pod
    /// CIDR is not there.
    pub async fn discover_node(&self) -> anyhow::Result<NodeNet> {
        let cluster = self.cluster();
        let cidr = self.pod_cidr_in(&cluster);
        let ipv6 = self.pod_cidr6_in(&cluster).map(NodeNet6::of);
        if let (None, Some(c)) = (
            &ipv6,
            cluster
                .nodes
                .get(&self.cfg.node_name)
                .and_then(|n| n.pod_cidr6),
        ) {
            tracing::error!(node = %self.cfg.node_name, pod_cidr = %c, "the Node's IPv6 pod CIDR is too small (at most /126); pods get no IPv6 address");
        }
        // IPv6-only: neither the flag nor the Node names an IPv4 range. A
        // Node whose IPv4 range is refused does not make the node
        // IPv6-only: it stays not ready until fixed.
        let ipv4_named = self.cfg.pod_cidr.is_some()
            || cluster
                .nodes
                .get(&self.cfg.node_name)
                .is_some_and(|n| n.pod_cidr.is_some());
        if cidr.is_none() && (ipv4_named || ipv6.is_none()) {
            anyhow::bail!(
                "the node's pod CIDR is not known (no --pod-cidr, and Node '{}' has no usable spec.podCIDRs yet)",
                self.cfg.node_name
            );
        }
        if let Some(cidr) = cidr {
            self.open_ipam(cidr).await?;
        }
        if let Some(v6) = &ipv6 {
            self.open_ipam6(v6.pod_cidr).await?;
        }
        let ipv4 = cidr.map(NodeNet4::of);
        // The subnets of the node's addresses of both families: a pod
        // CIDR overlapping either would capture the host's traffic to its
        // neighbours, whichever family the tunnel runs over.
        let mut own: Vec<IpAddr> = self.node_ip().into_iter().collect();
        own.extend(self.node_ip4_in(&self.cluster()).map(IpAddr::V4));
        own.sort();
        own.dedup();
        let mut subnets = Vec::new();
        for ip in own {
            match tokio::task::spawn_blocking(move || podnet::subnet_of(ip)).await {
                Ok(Ok(subnet)) => subnets.extend(subnet),
                Ok(Err(e)) => tracing::warn!("cannot read the node subnet of {ip}: {e}"),
                Err(e) => tracing::warn!("node subnet task failed: {e}"),
            }
        }
        if let Ok(mut u) = self.underlay.lock() {
            *u = subnets;
        }
        let gw_port = self.gateway_port();
        let ports = self.switch_ports().await?;
        let Some(p) = ports.iter().find(|p| p.name == gw_port) else {
            anyhow::bail!(
                "oxvs-switchd has no port '{gw_port}' (start it with --gateway {})",
                self.cfg.gateway
            );
        };
        let gateway_ofport = p.ofport;
        let gw = self.cfg.gateway.clone();
        self.size_pod_mtu().await;
        // Pods and the host exchange frames as large as the switch takes
        // whole on the node (`--local-mtu`); paths leaving it keep pod_mtu.
        let max_frame = self.switch_max_frame_len().await;
        let mtu = self.resolve_link_mtu(max_frame);
        tracing::info!(
            link_mtu = mtu,
            route_mtu = ?self.route_mtu(mtu),
            switch_max_frame = max_frame,
            "pod interface and gateway MTU"
        );
        let (v4, v6) = (ipv4.clone(), ipv6.clone());
        let gateway_mac = tokio::task::spawn_blocking(move || {
            if let Some(v4) = v4 {
                podnet::ensure_address(&gw, v4.gateway_ip, v4.pod_cidr.prefix_len())?;
            }
            if let Some(v6) = v6 {
                podnet::ensure_address(&gw, v6.gateway_ip, v6.pod_cidr.prefix_len())?;
            }
            podnet::set_mtu(&gw, mtu)?;
            podnet::link_mac(&gw)
        })
        .await??;
        let node = NodeNet {
            ipv4,
            gateway_mac,
            gateway_ofport,
            ipv6,
        };
        if let Some(v6) = &node.ipv6 {
            // The host routes pods' IPv6 traffic between the gateway and
            // its other interfaces, as it does IPv4's.
            let cidr6 = v6.pod_cidr;
            let (gw, masquerade) = (self.cfg.gateway.clone(), self.cfg.masquerade);
            let r = tokio::task::spawn_blocking(move || {
                crate::hostnet::enable_ipv6_forwarding()?;
                if masquerade {
                    crate::hostnet::ensure_masquerade(cidr6, &gw)?;
                }
                Ok::<(), crate::hostnet::HostnetError>(())
            })
            .await;
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!("pods' IPv6 beyond the node will not work: {e}"),
                Err(e) => tracing::warn!("IPv6 forwarding task failed: {e}"),
            }
        }
        {
            let gw = self.cfg.gateway.clone();
            match tokio::task::spawn_blocking(move || crate::hostnet::disable_redirects(&gw)).await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(
                    "Services without endpoints may answer a pod only after a retransmit: {e}"
                ),
                Err(e) => tracing::warn!("redirects task failed: {e}"),
            }
        }
        if let (true, Some(cidr)) = (self.cfg.masquerade, cidr) {
            let gw = self.cfg.gateway.clone();
            let r = tokio::task::spawn_blocking(move || {
                crate::hostnet::enable_forwarding()?;
                crate::hostnet::ensure_masquerade(cidr, &gw)
            })
            .await;
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!("pod egress to outside the cluster will not work: {e}")
                }
                Err(e) => tracing::warn!("masquerade task failed: {e}"),
            }
        }
        // The tunnel port: added on the node's address, or, if a switch
        // that outlived the agent has it on another address (the node's
        // address or its family changed), made again there under the
        // same port number.
        let existing = ports.iter().find(|p| p.name == self.cfg.tunnel);
        let node_ip = self.node_ip();
        let want_local =
            node_ip.map(|ip| std::net::SocketAddr::new(ip, flows::VXLAN_UDP_PORT).to_string());
        let moved = match (existing, &want_local) {
            (Some(t), Some(want)) => t.local.as_ref().is_some_and(|l| l != want),
            _ => false,
        };
        if let (true, Some(t)) = (moved, existing) {
            tracing::warn!(port = %t.name, from = ?t.local, to = ?want_local, "the tunnel port is on another address than the node's: made again");
            self.switch(Request::DelPort {
                name: t.name.clone(),
            })
            .await?;
        }
        match (existing, node_ip) {
            (Some(t), _) if !moved => {
                if let Ok(mut o) = self.tunnel_ofport.lock() {
                    *o = Some(t.ofport);
                }
            }
            (_, Some(ip)) => {
                let spec = PortSpec {
                    name: self.cfg.tunnel.clone(),
                    ofport: existing.map(|t| t.ofport),
                    kind: PortKind::Vxlan {
                        local_ip: ip,
                        dst_port: Some(flows::VXLAN_UDP_PORT),
                        underlay_mtu: None,
                    },
                };
                let v = self.switch(Request::AddPort(spec)).await?;
                let info: oxvs_api::PortInfo = serde_json::from_value(v)?;
                tracing::info!(port = %self.cfg.tunnel, ofport = info.ofport, local_ip = %ip, "tunnel port added");
                if let Ok(mut o) = self.tunnel_ofport.lock() {
                    *o = Some(info.ofport);
                }
            }
            (_, None) => {}
        }
        // From now on the tunnel's family is this address's: flows for
        // the other family would go to a socket that is not there.
        if let (Some(ip), Ok(mut t)) = (node_ip, self.tunnel_ip.lock()) {
            *t = Some(ip);
        }
        let tso = self.switch_tunnel_tso().await;
        self.tunnel_tso
            .store(tso, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            tunnel_tso = tso,
            tcp_full_mtu = self.tcp_full_mtu(mtu),
            "pods' TCP to other nodes: at the interface MTU when the tunnel segments it"
        );
        // Published last: flows computed with the node known must also see
        // its tunnel port (a restarted agent computing them in between
        // would drop the tunnel's flows until its next convergence).
        if let Ok(mut n) = self.node.lock() {
            *n = Some(node.clone());
        }
        Ok(node)
    }

    pub(super) fn node(&self) -> Option<NodeNet> {
        self.node.lock().ok().and_then(|n| n.clone())
    }

    /// The node's network facts, once discovered.
    pub fn node_net(&self) -> Option<NodeNet> {
        self.node()
    }

    /// The tunnel port's number, once added.
    pub fn tunnel_ofport(&self) -> Option<u32> {
        self.tunnel_ofport.lock().ok().and_then(|t| *t)
    }

    /// The remote nodes reachable through the tunnel (from the cluster).
    pub fn remotes(&self) -> Vec<RemoteNode> {
        self.remote_nodes(&self.cluster())
    }

    /// The remote nodes with a pod CIDR and an underlay address that
    /// pass [`crate::nodes::check_remotes`]; a newly refused Node is
    /// logged (naming it and why) and counted.
    pub(super) fn remote_nodes(&self, state: &ClusterState) -> Vec<RemoteNode> {
        let pod_cidr = match self.node() {
            Some(n) => n.pod_cidr4(),
            None => self.pod_cidr_in(state),
        };
        let checked = nodes::check_remotes(&self.local_node(state, pod_cidr), &state.nodes);
        self.note_refused_nodes(&checked.refused);
        checked.remotes
    }

    fn note_refused_nodes(&self, refused: &[RefusedNode]) {
        let Ok(mut last) = self.refused_nodes.lock() else {
            return;
        };
        let now: BTreeMap<String, NodeProblem> = refused
            .iter()
            .map(|r| (r.name.clone(), r.problem.clone()))
            .collect();
        if *last == now {
            return;
        }
        for r in refused {
            if last.get(&r.name) != Some(&r.problem) {
                tracing::error!(node = %r.name, reason = r.problem.reason(), "{r}; no route or tunnel flow is installed for it");
                crate::metrics::record_node_refusal(r.problem.reason());
            }
        }
        for name in last.keys().filter(|n| !now.contains_key(*n)) {
            tracing::info!(node = %name, "Node no longer refused");
        }
        *last = now;
    }

    /// The Nodes refused now (remote ones, and this node's own), by name.
    pub fn refused_nodes(&self) -> Vec<RefusedNode> {
        let mut v: Vec<RefusedNode> = self
            .refused_nodes
            .lock()
            .map(|m| {
                m.iter()
                    .map(|(name, problem)| RefusedNode {
                        name: name.clone(),
                        problem: problem.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        if let Some(p) = self.refused_local.lock().ok().and_then(|l| l.clone()) {
            v.push(RefusedNode {
                name: self.cfg.node_name.clone(),
                problem: p,
            });
        }
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }
}

/// This node's underlay address, the tunnel's: `--node-ip` if given, else
/// its Node's IPv4 InternalIP, else its IPv6 one (an IPv6-underlay node
/// with both says `--node-ip`).
fn own_tunnel_ip(flag: Option<IpAddr>, node: Option<&Node>) -> Option<IpAddr> {
    flag.or_else(|| {
        let n = node?;
        n.tunnel_ip(false).or_else(|| n.tunnel_ip(true))
    })
}
