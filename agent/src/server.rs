//! The agent's CNI server: ADD, DEL, CHECK, GC and STATUS for `oxvs-cni`,
//! and the node's convergence with the switch.
//!
//! ## What an ADD does, in order (each step undone if a later one fails)
//!
//! 1. Record the attachment as `pending` on disk ([`crate::state`]), then
//!    allocate its address ([`crate::ipam`]).
//! 2. Create the veth pair and configure the pod end in `CNI_NETNS`
//!    ([`crate::podnet`]): MAC `0a:58:<ip>`, address, MTU, default route
//!    via the gateway, TX checksum offload off, up.
//! 3. Attach the host end to oxvs-switchd as an AF_XDP port.
//! 4. Install the pod's flows ([`crate::flows::pod_flows`]) as one bundle.
//! 5. Inject a gratuitous ARP from the pod's port (so the host's neighbour
//!    cache learns a re-used address's new MAC).
//! 6. Record the attachment as `ready`.
//!
//! DEL undoes them in the reverse order (flows, port, veth, address,
//! record); every step tolerates "already gone", so DEL is idempotent and a
//! failed DEL can simply be retried. A crash between steps leaves a
//! `pending` record that [`Agent::reconcile`] rolls back on start.
//!
//! ## Concurrency
//!
//! Requests run concurrently (one tokio task per connection). Operations
//! on one (container id, ifname) are serialised by a per-key async mutex;
//! the IPAM and the record map sit behind short `std` mutexes; blocking
//! work (netlink, the switch's blocking client, fsync) runs in
//! `spawn_blocking`. [`Agent::reconcile`] takes the `gate` for writing, so
//! it never sees an ADD or DEL half done; requests take it for reading.
//!
//! ## Convergence
//!
//! The desired flows are a pure function of the node and the ready
//! attachments ([`crate::flows::desired_flows`]). `reconcile` (on start and
//! whenever the switch's view drifts, e.g. after a switch restart) re-adds
//! missing ports and sends `replace-flows`, which the switch applies as a
//! diff in one atomic version: flows that did not change keep their
//! counters and never stop matching, so live pods are not disturbed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::Ipv4Net;
use oxvs_api::cni::{
    code, CniCommand, CniError, CniInterface, CniIp, CniRequest, CniResponse, CniResult, CniRoute,
};
use oxvs_api::{
    Client, DumpFlowsResult, DumpPortsResult, PortKind, PortSpec, Request, TraceRequest,
    XdpModeRequest,
};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;

use crate::flows::{self, NodeNet, PodPort, RemoteNode};
use crate::ipam::Ipam;
use crate::model::ClusterState;
use crate::podnet::{self, PodIfaceSpec};
use crate::policy::{self, LocalPod, RuleRef};
use crate::state::{AttachState, Attachment, Store};

/// Longest request line accepted from the plugin.
const MAX_REQUEST: usize = 4 << 20;

/// How the agent is set up.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// This node's name (its Node object, and pods' `spec.nodeName`).
    pub node_name: String,
    /// The CNI socket to serve.
    pub cni_socket: PathBuf,
    /// oxvs-switchd's control socket.
    pub switchd_socket: PathBuf,
    /// Where records and IPAM state live (`/var/lib/oxvs`).
    pub state_dir: PathBuf,
    /// The node's pod CIDR; `None`: from the Node object's `spec.podCIDR`.
    pub pod_cidr: Option<Ipv4Net>,
    /// The node's underlay address; `None`: from the Node object's InternalIP.
    pub node_ip: Option<Ipv4Addr>,
    /// The host's gateway interface (switchd `--gateway NAME`); its switch
    /// port has the same name (on the `NAME-p` end of the pair).
    pub gateway: String,
    /// The VXLAN tunnel port the agent adds to the switch.
    pub tunnel: String,
    /// MTU of pod interfaces.
    pub pod_mtu: u32,
    /// Turn TX checksum offload off in pods (the switch does not complete
    /// partial checksums).
    pub pod_tx_checksum_off: bool,
    /// Deadline of one switch call.
    pub switch_timeout: Duration,
    /// Enable forwarding and masquerade pod traffic leaving the node other
    /// than through the gateway (pod egress to outside the cluster).
    pub masquerade: bool,
}

/// Serialises the operations on one (container id, ifname).
type KeyLock = Arc<tokio::sync::Mutex<()>>;

/// The flows the switch holds, as the agent last set them.
#[derive(Default)]
struct Applied {
    /// False until a full `replace-flows` made the switch equal to `lines`.
    valid: bool,
    lines: HashSet<String>,
}

/// The agent: its state and the operations the CNI server runs.
pub struct Agent {
    cfg: AgentConfig,
    ipam: Mutex<Option<Ipam>>,
    store: Store,
    records: Mutex<BTreeMap<(String, String), Attachment>>,
    locks: Mutex<HashMap<(String, String), KeyLock>>,
    gate: tokio::sync::RwLock<()>,
    node: Mutex<Option<NodeNet>>,
    tunnel_ofport: Mutex<Option<u32>>,
    cluster: Mutex<Arc<ClusterState>>,
    applied: tokio::sync::Mutex<Applied>,
    rules: Mutex<Vec<RuleRef>>,
    routes: Mutex<BTreeMap<Ipv4Net, Ipv4Addr>>,
}

fn err(code: u32, msg: impl Into<String>) -> CniError {
    CniError::new(code, msg)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, CniError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| err(code::IO_FAILURE, format!("internal task failed: {e}")))
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

/// The `table=T,priority=P,MATCH` text that selects exactly `line`'s flow
/// (for `delete_strict`).
fn strict_selector(line: &str) -> Option<String> {
    use oxvs_pipeline::parse::{parse_flow, ParseContext};
    let f = parse_flow(line, &ParseContext::default()).ok()?;
    let m = oxvs_pipeline::print::format_match_priority(&f.matches, f.priority);
    Some(format!("table={},{m}", f.table))
}

impl Agent {
    /// Opens the agent's on-disk state (records; IPAM once the pod CIDR is known).
    pub fn open(cfg: AgentConfig) -> anyhow::Result<Agent> {
        let (store, recs) = Store::open(&cfg.state_dir)?;
        let records = recs.into_iter().map(|r| (r.key(), r)).collect();
        let agent = Agent {
            cfg,
            ipam: Mutex::new(None),
            store,
            records: Mutex::new(records),
            locks: Mutex::new(HashMap::new()),
            gate: tokio::sync::RwLock::new(()),
            node: Mutex::new(None),
            tunnel_ofport: Mutex::new(None),
            cluster: Mutex::new(Arc::new(ClusterState::default())),
            applied: tokio::sync::Mutex::new(Applied::default()),
            rules: Mutex::new(Vec::new()),
            routes: Mutex::new(BTreeMap::new()),
        };
        if let Some(cidr) = agent.cfg.pod_cidr {
            agent.open_ipam(cidr)?;
        }
        Ok(agent)
    }

    fn open_ipam(&self, cidr: Ipv4Net) -> anyhow::Result<()> {
        use anyhow::Context as _;
        let mut slot = self
            .ipam
            .lock()
            .map_err(|_| anyhow::anyhow!("IPAM lock poisoned"))?;
        match slot.as_ref() {
            Some(i) if i.cidr() == cidr => return Ok(()),
            Some(i) => {
                tracing::warn!(old = %i.cidr(), new = %cidr, "the node's pod CIDR changed: new pods get addresses from the new one");
            }
            None => {}
        }
        let ipam = Ipam::open(&self.cfg.state_dir.join("ipam"), cidr)
            .with_context(|| format!("cannot open the IPAM store for {cidr}"))?;
        *slot = Some(ipam);
        Ok(())
    }

    fn with_ipam<T>(
        &self,
        f: impl FnOnce(&mut Ipam) -> Result<T, crate::ipam::IpamError>,
    ) -> Result<T, CniError> {
        let mut slot = self
            .ipam
            .lock()
            .map_err(|_| err(code::IO_FAILURE, "IPAM lock poisoned"))?;
        let Some(ipam) = slot.as_mut() else {
            return Err(err(
                code::TRY_AGAIN_LATER,
                "the node's pod CIDR is not known yet (no --pod-cidr, and the Node object has no spec.podCIDR)",
            ));
        };
        f(ipam).map_err(|e| match e {
            crate::ipam::IpamError::Exhausted { .. } => err(code::IP_EXHAUSTED, e.to_string()),
            _ => err(code::IO_FAILURE, e.to_string()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.cfg
    }

    /// The attachments (ready and pending).
    pub fn attachments(&self) -> Vec<Attachment> {
        self.records
            .lock()
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The cluster state last given to [`Agent::set_cluster`].
    pub fn cluster(&self) -> Arc<ClusterState> {
        self.cluster.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Takes a new cluster snapshot (call [`Agent::sync`] afterwards).
    pub fn set_cluster(&self, state: Arc<ClusterState>) {
        if let Some(cidr) = self.pod_cidr_in(&state) {
            if let Err(e) = self.open_ipam(cidr) {
                tracing::error!("{e:#}");
            }
        }
        if let Ok(mut c) = self.cluster.lock() {
            *c = state;
        }
    }

    /// What each NetworkPolicy rule id stands for (as last installed).
    pub fn rules(&self) -> Vec<RuleRef> {
        self.rules.lock().map(|r| r.clone()).unwrap_or_default()
    }

    fn pod_cidr_in(&self, state: &ClusterState) -> Option<Ipv4Net> {
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
            (None, n) => n,
        }
    }

    fn node_ip(&self) -> Option<Ipv4Addr> {
        self.cfg.node_ip.or_else(|| {
            self.cluster()
                .nodes
                .get(&self.cfg.node_name)
                .and_then(|n| n.internal_ip)
        })
    }

    fn gateway_port(&self) -> String {
        self.cfg.gateway.clone()
    }

    // ---- The switch --------------------------------------------------------

    async fn switch(&self, req: Request) -> Result<Value, oxvs_api::ClientError> {
        let path = self.cfg.switchd_socket.clone();
        let timeout = self.cfg.switch_timeout;
        match tokio::task::spawn_blocking(move || {
            let mut c = Client::connect(&path)?;
            c.set_timeout(timeout);
            c.call(&req)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => Err(oxvs_api::ClientError::Refused(format!(
                "internal task failed: {e}"
            ))),
        }
    }

    async fn switch_ports(&self) -> Result<Vec<oxvs_api::PortInfo>, oxvs_api::ClientError> {
        let v = self.switch(Request::DumpPorts).await?;
        let r: DumpPortsResult = serde_json::from_value(v)
            .map_err(|e| oxvs_api::ClientError::Refused(format!("bad dump-ports answer: {e}")))?;
        Ok(r.ports)
    }

    fn switch_err(what: &str, e: oxvs_api::ClientError) -> CniError {
        if e.is_unreachable() {
            err(code::TRY_AGAIN_LATER, format!("{what}: {e}"))
        } else {
            err(
                code::SWITCH_FAILURE,
                format!("{what}: the switch refused: {e}"),
            )
        }
    }

    /// Learns the node's network from the switch and the host (gateway port
    /// number and MAC), puts the gateway address on the gateway interface
    /// with the pod MTU, and adds the tunnel port once the node's underlay
    /// address is known. Fails while the switch, its gateway or the pod
    /// CIDR is not there.
    pub async fn discover_node(&self) -> anyhow::Result<NodeNet> {
        let Some(cidr) = self.pod_cidr_in(&self.cluster()) else {
            anyhow::bail!(
                "the node's pod CIDR is not known (no --pod-cidr, and Node '{}' has no spec.podCIDR yet)",
                self.cfg.node_name
            );
        };
        self.open_ipam(cidr)?;
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
        let gateway_ip = gateway_of(cidr);
        let mtu = self.cfg.pod_mtu;
        let gateway_mac = tokio::task::spawn_blocking(move || {
            podnet::ensure_address(&gw, gateway_ip, cidr.prefix_len())?;
            podnet::set_mtu(&gw, mtu)?;
            podnet::link_mac(&gw)
        })
        .await??;
        let node = NodeNet {
            pod_cidr: cidr,
            gateway_ip,
            gateway_mac,
            gateway_ofport,
        };
        if let Ok(mut n) = self.node.lock() {
            *n = Some(node.clone());
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
        if self.cfg.masquerade {
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
        // The tunnel port.
        match (
            ports.iter().find(|p| p.name == self.cfg.tunnel),
            self.node_ip(),
        ) {
            (Some(t), _) => {
                if let Ok(mut o) = self.tunnel_ofport.lock() {
                    *o = Some(t.ofport);
                }
            }
            (None, Some(ip)) => {
                let spec = PortSpec {
                    name: self.cfg.tunnel.clone(),
                    ofport: None,
                    kind: PortKind::Vxlan {
                        local_ip: ip,
                        dst_port: None,
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
            (None, None) => {}
        }
        Ok(node)
    }

    fn node(&self) -> Option<NodeNet> {
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

    fn pod_ports(&self) -> Vec<PodPort> {
        let mut v: Vec<PodPort> = self
            .attachments()
            .iter()
            .filter(|a| a.state == AttachState::Ready)
            .filter_map(|a| {
                Some(PodPort {
                    ofport: a.ofport?,
                    ip: a.ip,
                    mac: flows::parse_mac(&a.mac)?,
                })
            })
            .collect();
        v.sort();
        v
    }

    /// The remote nodes with a pod CIDR and an underlay address.
    fn remote_nodes(&self, state: &ClusterState) -> Vec<RemoteNode> {
        let mut v: Vec<RemoteNode> = state
            .nodes
            .values()
            .filter(|n| n.name != self.cfg.node_name)
            .filter_map(|n| {
                Some(RemoteNode {
                    name: n.name.clone(),
                    pod_cidr: n.pod_cidr?,
                    ip: n.internal_ip?,
                })
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Every flow the node should have, from the records and the cluster.
    fn desired(&self, node: &NodeNet) -> (Vec<String>, Vec<RuleRef>) {
        let state = self.cluster();
        let mut lines = flows::node_flows(node);
        for p in self.pod_ports() {
            lines.extend(flows::pod_flows(node, &p));
        }
        let tunnel = self.tunnel_ofport.lock().ok().and_then(|t| *t);
        if let Some(tun) = tunnel {
            lines.extend(flows::tunnel_flows(node, tun, &self.remote_nodes(&state)));
        }
        // Local pods for policy: the IP the pod has here is authoritative.
        let mut state2 = (*state).clone();
        let mut local = Vec::new();
        for a in self.attachments() {
            let (Some(ofport), AttachState::Ready) = (a.ofport, a.state) else {
                continue;
            };
            if a.pod_name.is_empty() {
                continue;
            }
            if let Some(p) = state2
                .pods
                .get_mut(&(a.pod_namespace.clone(), a.pod_name.clone()))
            {
                p.ip = Some(a.ip);
            }
            local.push(LocalPod {
                namespace: a.pod_namespace.clone(),
                name: a.pod_name.clone(),
                ip: a.ip,
                ofport,
            });
        }
        let pf = policy::policy_flows(&state2, &local);
        lines.extend(pf.flows);
        (lines, pf.rules)
    }

    /// Makes the switch's flows the desired ones: the first time (and after
    /// drift) with one `replace-flows`, then by sending only the difference
    /// as one atomic bundle. Also keeps the host routes to remote pod CIDRs.
    pub async fn sync(&self) -> Result<(), CniError> {
        let Some(node) = self.node() else {
            return Err(err(code::TRY_AGAIN_LATER, "the agent is not ready yet"));
        };
        let mut applied = self.applied.lock().await;
        let (lines, rules) = self.desired(&node);
        let want: HashSet<String> = lines.iter().cloned().collect();
        if !applied.valid {
            let text = lines.join("\n");
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
            applied.valid = true;
        } else {
            let mut mods = String::new();
            for old in applied.lines.difference(&want) {
                match strict_selector(old) {
                    Some(sel) => {
                        mods.push_str("delete_strict ");
                        mods.push_str(&sel);
                        mods.push('\n');
                    }
                    None => tracing::error!(flow = %old, "cannot parse a flow the agent made"),
                }
            }
            for new in want.difference(&applied.lines) {
                mods.push_str("add ");
                mods.push_str(new);
                mods.push('\n');
            }
            if !mods.is_empty() {
                if let Err(e) = self.switch(Request::Bundle { mods }).await {
                    // Next time, start over with a full replace.
                    applied.valid = false;
                    return Err(Self::switch_err("cannot update the node's flows", e));
                }
                applied.lines = want;
            }
        }
        if let Ok(mut r) = self.rules.lock() {
            *r = rules;
        }
        drop(applied);
        self.sync_routes(&node).await;
        Ok(())
    }

    /// Host routes: each remote pod CIDR via that node's gateway address,
    /// onlink on the gateway interface (the switch answers ARP for it).
    async fn sync_routes(&self, node: &NodeNet) {
        let want: BTreeMap<Ipv4Net, Ipv4Addr> = self
            .remote_nodes(&self.cluster())
            .iter()
            .filter(|r| r.pod_cidr != node.pod_cidr)
            .map(|r| (r.pod_cidr, gateway_of(r.pod_cidr)))
            .collect();
        let have = self.routes.lock().map(|r| r.clone()).unwrap_or_default();
        if want == have {
            return;
        }
        let gw = self.cfg.gateway.clone();
        let (w, h) = (want.clone(), have);
        let r = tokio::task::spawn_blocking(move || -> Result<(), podnet::PodnetError> {
            for (dst, _) in h.iter().filter(|(d, _)| !w.contains_key(*d)) {
                podnet::remove_route(*dst, &gw)?;
            }
            for (dst, via) in &w {
                podnet::ensure_route(*dst, *via, &gw)?;
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
                tracing::info!(pod = %a.pod_ref(), ip = %a.ip, "pod interface is gone: releasing its port and address");
                self.teardown(&a)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                report.gone += 1;
                continue;
            }
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
        let removed = self
            .with_ipam(|ipam| {
                ipam.retain(|al| held.contains(&(al.container_id.clone(), al.ifname.clone())))
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for al in &removed {
            tracing::info!(ip = %al.ip, container = %al.container_id, "released an address no pod holds");
        }
        report.addresses_released = removed.len();
        self.applied.lock().await.valid = false;
        self.sync().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        report.pods = self.pod_ports().len();
        Ok(report)
    }

    /// Whether the switch no longer holds what the agent set (a port
    /// missing or renumbered, or a different number of flows: e.g.
    /// oxvs-switchd restarted, or someone edited its flows), or the
    /// node's facts changed.
    pub async fn drifted(&self) -> anyhow::Result<bool> {
        let Some(node) = self.node() else {
            return Ok(true);
        };
        if self.pod_cidr_in(&self.cluster()) != Some(node.pod_cidr) {
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
        Ok(show.n_flows != applied.lines.len())
    }

    async fn save_record(&self, a: Attachment) -> Result<(), CniError> {
        let store_rec = a.clone();
        let store = self.store.clone();
        blocking(move || store.save(&store_rec))
            .await?
            .map_err(|e| err(code::IO_FAILURE, e.to_string()))?;
        if let Ok(mut r) = self.records.lock() {
            r.insert(a.key(), a);
        }
        Ok(())
    }

    async fn add_port(&self, name: &str, ofport: Option<u32>) -> Result<u32, CniError> {
        let spec = PortSpec {
            name: name.to_string(),
            ofport,
            kind: PortKind::Afxdp {
                ifname: None,
                xdp_mode: XdpModeRequest::Auto,
            },
        };
        let v = match self.switch(Request::AddPort(spec.clone())).await {
            Ok(v) => v,
            // The wanted number may be taken: take any.
            Err(oxvs_api::ClientError::Refused(_)) if ofport.is_some() => self
                .switch(Request::AddPort(PortSpec {
                    ofport: None,
                    ..spec
                }))
                .await
                .map_err(|e| Self::switch_err(&format!("cannot attach {name} to the switch"), e))?,
            Err(e) => {
                return Err(Self::switch_err(
                    &format!("cannot attach {name} to the switch"),
                    e,
                ))
            }
        };
        let info: oxvs_api::PortInfo = serde_json::from_value(v)
            .map_err(|e| err(code::SWITCH_FAILURE, format!("bad add-port answer: {e}")))?;
        Ok(info.ofport)
    }

    async fn del_port(&self, name: &str) -> Result<(), CniError> {
        match self
            .switch(Request::DelPort {
                name: name.to_string(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(e @ oxvs_api::ClientError::Refused(_)) => {
                let ports = self
                    .switch_ports()
                    .await
                    .map_err(|e| Self::switch_err("cannot list the switch's ports", e))?;
                if ports.iter().any(|p| p.name == name) {
                    Err(Self::switch_err(&format!("cannot remove port {name}"), e))
                } else {
                    Ok(())
                }
            }
            Err(e) => Err(Self::switch_err(&format!("cannot remove port {name}"), e)),
        }
    }

    /// Removes everything of `a` that exists, in order: its flows (the
    /// pod is dropped from the desired state and the switch converged),
    /// its port, its veth, its address, its record. Idempotent; on failure
    /// the record stays, so a retry (or the next start) finishes the job.
    async fn teardown(&self, a: &Attachment) -> Result<(), CniError> {
        if let Ok(mut r) = self.records.lock() {
            r.remove(&a.key());
        }
        let r = self.teardown_steps(a).await;
        if r.is_err() {
            if let Ok(mut recs) = self.records.lock() {
                recs.insert(a.key(), a.clone());
            }
        }
        r
    }

    async fn teardown_steps(&self, a: &Attachment) -> Result<(), CniError> {
        if a.ofport.is_some() && self.node().is_some() {
            self.sync().await?;
        }
        self.del_port(&a.host_ifname).await?;
        let host = a.host_ifname.clone();
        blocking(move || podnet::delete_host_link(&host))
            .await?
            .map_err(|e| {
                err(
                    code::INTERFACE_FAILURE,
                    format!("cannot delete {}: {e}", a.host_ifname),
                )
            })?;
        let (cid, ifn) = a.key();
        match self.with_ipam(|ipam| ipam.release(&cid, &ifn)) {
            Ok(_) => {}
            // No IPAM yet: nothing can have been allocated.
            Err(e) if e.code == code::TRY_AGAIN_LATER => {}
            Err(e) => return Err(e),
        }
        let store = self.store.clone();
        blocking(move || store.remove(&cid, &ifn))
            .await?
            .map_err(|e| err(code::IO_FAILURE, e.to_string()))
    }

    fn key_lock(&self, key: &(String, String)) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = match self.locks.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        m.entry(key.clone()).or_default().clone()
    }

    fn drop_key_lock(&self, key: &(String, String), lock: Arc<tokio::sync::Mutex<()>>) {
        let mut m = match self.locks.lock() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        // Ours and the map's: nobody else waits for it.
        if Arc::strong_count(&lock) == 2 {
            m.remove(key);
        }
    }

    fn record(&self, key: &(String, String)) -> Option<Attachment> {
        self.records.lock().ok().and_then(|r| r.get(key).cloned())
    }

    // ---- The verbs ---------------------------------------------------------

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
                    req.container_id, req.ifname, a.ip, a.netns
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
        let (pod_ns, pod_name) = req.pod().unwrap_or(("", ""));
        let host_ifname = podnet::host_ifname(pod_ns, pod_name, &req.container_id, &req.ifname);
        let ip = self.with_ipam(|ipam| ipam.allocate(&req.container_id, &req.ifname))?;
        let mac = flows::pod_mac(ip);
        let mut a = Attachment {
            container_id: req.container_id.clone(),
            ifname: req.ifname.clone(),
            netns: req.netns.clone(),
            host_ifname: host_ifname.clone(),
            pod_namespace: pod_ns.to_string(),
            pod_name: pod_name.to_string(),
            ip,
            prefix_len: node.pod_cidr.prefix_len(),
            gateway: node.gateway_ip,
            mac: flows::mac_str(&mac),
            mtu: self.cfg.pod_mtu,
            ofport: None,
            state: AttachState::Pending,
        };
        if let Err(e) = self.save_record(a.clone()).await {
            let _ = self.with_ipam(|ipam| ipam.release(&req.container_id, &req.ifname));
            return Err(e);
        }
        match self.attach(&node, &mut a).await {
            Ok(()) => Ok(serde_json::to_value(cni_result(&a)).unwrap_or(Value::Null)),
            Err(e) => {
                tracing::warn!(pod = %a.pod_ref(), error = %e, "ADD failed: undoing it");
                if let Err(u) = self.teardown(&a).await {
                    tracing::error!(pod = %a.pod_ref(), error = %u, "undoing a failed ADD failed too; the next start or DEL retries");
                }
                Err(e)
            }
        }
    }

    async fn attach(&self, node: &NodeNet, a: &mut Attachment) -> Result<(), CniError> {
        let spec = PodIfaceSpec {
            netns: PathBuf::from(&a.netns),
            ifname: a.ifname.clone(),
            host_ifname: a.host_ifname.clone(),
            mac: flows::parse_mac(&a.mac).unwrap_or_default(),
            ip: a.ip,
            prefix_len: a.prefix_len,
            gateway: a.gateway,
            mtu: a.mtu,
            tx_checksum_off: self.cfg.pod_tx_checksum_off,
        };
        let t0 = std::time::Instant::now();
        blocking(move || podnet::setup_pod_interface(&spec))
            .await?
            .map_err(|e| match e {
                podnet::PodnetError::NoNetns(p) => err(
                    code::INVALID_ENV,
                    format!("CNI_NETNS {} does not exist", p.display()),
                ),
                e => err(
                    code::INTERFACE_FAILURE,
                    format!("cannot set up the pod interface: {e}"),
                ),
            })?;
        let t_netlink = t0.elapsed();
        let ofport = self.add_port(&a.host_ifname, None).await?;
        let t_port = t0.elapsed();
        a.ofport = Some(ofport);
        a.state = AttachState::Ready;
        self.save_record(a.clone()).await?;
        // The pod's flows and every policy flow that concerns it, before
        // the pod can send anything: the desired state now includes it.
        self.sync().await?;
        let t_flows = t0.elapsed();
        let mac = flows::pod_mac(a.ip);
        let garp = flows::gratuitous_arp(mac, a.ip);
        let hex: String = garp.iter().map(|b| format!("{b:02x}")).collect();
        if let Err(e) = self
            .switch(Request::Trace(TraceRequest {
                packet_hex: Some(hex),
                in_port: Some(ofport),
                inject: true,
                ..TraceRequest::default()
            }))
            .await
        {
            tracing::debug!(pod = %a.pod_ref(), error = %e, "gratuitous ARP not sent");
        }
        let _ = node;
        tracing::info!(
            pod = %a.pod_ref(),
            ip = %a.ip,
            port = %a.host_ifname,
            ofport,
            netlink_ms = t_netlink.as_secs_f64() * 1e3,
            port_ms = (t_port - t_netlink).as_secs_f64() * 1e3,
            flows_ms = (t_flows - t_port).as_secs_f64() * 1e3,
            total_ms = t0.elapsed().as_secs_f64() * 1e3,
            "pod attached"
        );
        Ok(())
    }

    async fn del(&self, req: &CniRequest) -> Result<(), CniError> {
        let key = (req.container_id.clone(), req.ifname.clone());
        match self.record(&key) {
            Some(a) => {
                self.teardown(&a).await?;
                tracing::info!(pod = %a.pod_ref(), ip = %a.ip, "pod detached");
            }
            None => {
                // Unknown to us: make sure nothing of it is left anyway (an
                // address, or an interface named for it).
                let (pod_ns, pod_name) = req.pod().unwrap_or(("", ""));
                let host = podnet::host_ifname(pod_ns, pod_name, &req.container_id, &req.ifname);
                let h = host.clone();
                if blocking(move || podnet::link_exists(&h))
                    .await?
                    .unwrap_or(false)
                {
                    self.del_port(&host).await?;
                    let h = host.clone();
                    blocking(move || podnet::delete_host_link(&h))
                        .await?
                        .map_err(|e| {
                            err(
                                code::INTERFACE_FAILURE,
                                format!("cannot delete {host}: {e}"),
                            )
                        })?;
                }
                match self.with_ipam(|ipam| ipam.release(&req.container_id, &req.ifname)) {
                    Ok(_) => {}
                    Err(e) if e.code == code::TRY_AGAIN_LATER => {}
                    Err(e) => return Err(e),
                }
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
        let spec = PodIfaceSpec {
            netns: PathBuf::from(&req.netns),
            ifname: a.ifname.clone(),
            host_ifname: a.host_ifname.clone(),
            mac: flows::parse_mac(&a.mac).unwrap_or_default(),
            ip: a.ip,
            prefix_len: a.prefix_len,
            gateway: a.gateway,
            mtu: a.mtu,
            tx_checksum_off: self.cfg.pod_tx_checksum_off,
        };
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
                    ip: a.ip,
                    mac: flows::pod_mac(a.ip),
                },
            );
            problems.extend(compare_flows(&want, &dump, flows::cookie::pod(ofport)));
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
            if valid.contains(&a.key()) {
                continue;
            }
            let key = a.key();
            let lock = self.key_lock(&key);
            let r = {
                let _gate = self.gate.read().await;
                let _g = lock.lock().await;
                match self.record(&key) {
                    Some(a) => self.teardown(&a).await,
                    None => Ok(()),
                }
            };
            self.drop_key_lock(&key, lock);
            match r {
                Ok(()) => {
                    tracing::info!(pod = %a.pod_ref(), ip = %a.ip, "GC: released a stale attachment")
                }
                Err(e) => failures.push(format!("{}: {e}", a.pod_ref())),
            }
        }
        let held: BTreeSet<(String, String)> = self.attachments().iter().map(|a| a.key()).collect();
        match self.with_ipam(|ipam| {
            ipam.retain(|al| {
                let k = (al.container_id.clone(), al.ifname.clone());
                valid.contains(&k) || held.contains(&k)
            })
        }) {
            Ok(_) => {}
            Err(e) if e.code == code::TRY_AGAIN_LATER => {}
            Err(e) => return Err(e),
        }
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
        if self.node().is_none() {
            return Err(err(
                code::NOT_AVAILABLE,
                "the agent has not found oxvs-switchd and its gateway yet",
            ));
        }
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
        let (free, cidr) = self.with_ipam(|i| Ok((i.free_count(), i.cidr())))?;
        if free == 0 {
            return Err(err(
                code::NOT_AVAILABLE,
                format!("pod CIDR {cidr} has no free address"),
            ));
        }
        Ok(())
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

/// The gateway address of a pod CIDR: its first host address.
pub fn gateway_of(cidr: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(cidr.network()).wrapping_add(1))
}

/// The CNI result of an attachment (1.1.0 shape).
pub fn cni_result(a: &Attachment) -> CniResult {
    CniResult {
        interfaces: vec![CniInterface {
            name: a.ifname.clone(),
            mac: a.mac.clone(),
            mtu: Some(a.mtu),
            sandbox: a.netns.clone(),
        }],
        ips: vec![CniIp {
            address: format!("{}/{}", a.ip, a.prefix_len),
            gateway: Some(a.gateway.to_string()),
            interface: Some(0),
        }],
        routes: vec![CniRoute {
            dst: "0.0.0.0/0".into(),
            gw: Some(a.gateway.to_string()),
        }],
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
    let want = format!("{}/{}", a.ip, a.prefix_len);
    let ips = prev
        .get("ips")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
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

/// Serves the CNI socket until the task is dropped.
pub async fn serve(agent: Arc<Agent>, listener: UnixListener, gate: oxvs_api::listen::Gate) {
    let max = gate.limits().max_connections;
    let mut busy = serde_json::to_vec(&CniResponse::busy(format!(
        "busy: the oxvs agent serves {max} CNI connections already (--cni-max-connections); retry"
    )))
    .unwrap_or_default();
    busy.push(b'\n');
    crate::listen::serve_gated(listener, gate, "cni", busy, move |stream| {
        let agent = agent.clone();
        async move { serve_one(&agent, stream).await }
    })
    .await
}

async fn serve_one<S>(agent: &Agent, stream: S) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    let (r, mut w) = tokio::io::split(stream);
    let mut reader = BufReader::new(r).take(MAX_REQUEST as u64 + 1);
    let mut line = Vec::new();
    reader.read_until(b'\n', &mut line).await?;
    let resp = if line.len() > MAX_REQUEST {
        CniResponse::failure(err(code::DECODE_FAILURE, "request too long"))
    } else {
        match serde_json::from_slice::<CniRequest>(&line) {
            Err(e) => CniResponse::failure(err(
                code::DECODE_FAILURE,
                format!("bad request from the plugin: {e}"),
            )),
            Ok(req) if req.v != oxvs_api::cni::CNI_PROTOCOL_VERSION => CniResponse::failure(err(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "plugin speaks protocol {}, agent {}",
                    req.v,
                    oxvs_api::cni::CNI_PROTOCOL_VERSION
                ),
            )),
            Ok(req) => {
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
        }
    };
    let mut out = serde_json::to_vec(&resp).unwrap_or_default();
    out.push(b'\n');
    w.write_all(&out).await?;
    w.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn att() -> Attachment {
        Attachment {
            container_id: "c1".into(),
            ifname: "eth0".into(),
            netns: "/proc/1/ns/net".into(),
            host_ifname: "a-1234567".into(),
            pod_namespace: "x".into(),
            pod_name: "a".into(),
            ip: "10.244.0.5".parse().unwrap(),
            prefix_len: 24,
            gateway: "10.244.0.1".parse().unwrap(),
            mac: "0a:58:0a:f4:00:05".into(),
            mtu: 1450,
            ofport: Some(3),
            state: AttachState::Ready,
        }
    }

    #[test]
    fn result_and_prev_result_check() {
        let r = serde_json::to_value(cni_result(&att())).unwrap();
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
    fn ids_and_gateway() {
        assert!(valid_container_id("abc-1_2.3"));
        assert!(!valid_container_id("a/b"));
        assert!(!valid_container_id(""));
        assert!(valid_ifname("eth0"));
        assert!(!valid_ifname("0123456789abcdef"));
        assert!(!valid_ifname("a/b"));
        assert_eq!(
            gateway_of("10.244.3.0/24".parse().unwrap()),
            Ipv4Addr::new(10, 244, 3, 1)
        );
    }

    #[test]
    fn flow_comparison_by_cookie() {
        let node = NodeNet {
            pod_cidr: "10.244.0.0/24".parse().unwrap(),
            gateway_ip: "10.244.0.1".parse().unwrap(),
            gateway_mac: [2, 0, 0, 0, 0, 1],
            gateway_ofport: 2,
        };
        let pod = PodPort {
            ofport: 3,
            ip: "10.244.0.5".parse().unwrap(),
            mac: flows::pod_mac("10.244.0.5".parse().unwrap()),
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
        assert!(compare_flows(&want, &dump, flows::cookie::pod(3)).is_empty());
        dump.flows.pop();
        let p = compare_flows(&want, &dump, flows::cookie::pod(3));
        assert_eq!(
            p,
            vec!["1 of its flows are missing from the switch".to_string()]
        );
    }
}
