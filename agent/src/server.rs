//! The agent's CNI server: ADD, DEL, CHECK, GC and STATUS for `oxvs-cni`,
//! and the node's convergence with the switch.
//!
//! ## What an ADD does, in order (each step undone if a later one fails)
//!
//! 0. With a cluster source, admit the pod ([`Agent::admit_pod`]): its Pod
//!    object must be known (from the snapshot, or read from the source
//!    now), else "try again later"; a pod is never attached without the
//!    NetworkPolicies that select it.
//! 1. Allocate the address ([`crate::ipam`]), then record the attachment
//!    as `pending` on disk ([`crate::state`]).
//! 2. Create the veth pair and configure the pod end in `CNI_NETNS`
//!    ([`crate::podnet`]): MAC `0a:58:<ip>`, address, MTU, default route
//!    via the gateway, TX checksum offload off, up.
//! 3. Attach the host end to oxvs-switchd as an AF_XDP port.
//! 4. Install the pod's flows ([`crate::flows::pod_flows`]) and every
//!    policy flow that concerns it as one bundle, and wait for the
//!    switch's answer.
//! 5. Inject a gratuitous ARP from the pod's port (so the host's neighbour
//!    cache learns a re-used address's new MAC).
//! 6. Record the attachment as `ready`.
//!
//! DEL undoes them in the reverse order (flows, port, veth, address,
//! record); every step tolerates "already gone", so DEL is idempotent and a
//! failed DEL can simply be retried. A crash between steps leaves a
//! `pending` record that [`Agent::reconcile`] rolls back on start. DEL of
//! an attachment without a record deletes a host link only if it is
//! provably that attachment's (no record names it, and its alias,
//! [`podnet::owner_alias`], does): host names are 28-bit hashes.
//!
//! ## Concurrency
//!
//! Requests run concurrently (one tokio task per connection). Operations
//! on one (container id, ifname) are serialised by a per-key async mutex;
//! the record map and the other small caches sit behind short `std`
//! mutexes, never held across an `.await` or any I/O; blocking work
//! (netlink, the switch's blocking client, fsync, the flow translation)
//! runs in `spawn_blocking`. The IPAM store's `std` mutex is only ever
//! taken on the blocking pool ([`Agent::with_ipam`]), since its operations
//! fsync: a runtime thread never waits for a disk. [`Agent::reconcile`]
//! and GC's address sweep take the `gate` for writing, so they never see
//! an ADD or DEL half done (an address allocated whose record is not
//! written yet); requests take it for reading.
//!
//! Lock order: `gate`, then the per-key lock, then `applied` (in
//! [`Agent::sync`]); the `std` mutexes are leaves.
//!
//! ## Convergence
//!
//! The desired flows are a pure function of the node, the ready
//! attachments and the cluster ([`crate::desired::compute`]). `reconcile` (on start and
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

use crate::desired::{self, Inputs, Tunnel};
use crate::flows::{self, NodeNet, PodPort, RemoteNode};
use crate::ipam::Ipam;
use crate::model::{ClusterState, ObjKey, Pod};
use crate::nodes::{self, LocalNode, NodeProblem, RefusedNode};
use crate::podnet::{self, PodIfaceSpec};
use crate::policy::{Refusal, RuleRef};
use crate::source::PodLookup;
use crate::state::{AttachState, Attachment, Store};

/// Longest request line accepted from the plugin.
const MAX_REQUEST: usize = 4 << 20;

/// Deadline of ADD's read of a pod the snapshot lacks (below the
/// plugin's default 30 s, so the plugin gets the agent's answer).
const POD_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// The most flows one NetworkPolicy may add on this node
    /// ([`crate::policy::DEFAULT_MAX_POLICY_FLOWS`]); a policy over it is refused.
    pub max_policy_flows: usize,
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

/// The IPAM store, once the pod CIDR is known. Locked only on the
/// blocking pool ([`Agent::with_ipam`]): its operations fsync.
type IpamSlot = Arc<Mutex<Option<Ipam>>>;

/// The agent: its state and the operations the CNI server runs.
pub struct Agent {
    cfg: AgentConfig,
    ipam: IpamSlot,
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
    /// Reads a pod the snapshot lacks (`None`: no cluster source).
    pods: Option<Arc<dyn PodLookup>>,
    /// Pods read by ADD that the snapshot did not have yet; used by the
    /// translation until the snapshot has them (same uid), dropped with
    /// their attachment.
    admitted: Mutex<BTreeMap<ObjKey, Pod>>,
    /// The underlay subnet (the prefix of the interface with the node's
    /// address), once found.
    underlay: Mutex<Option<Ipv4Net>>,
    /// Nodes refused ([`crate::nodes`]), by name, as last logged.
    refused_nodes: Mutex<BTreeMap<String, NodeProblem>>,
    /// This node's own Node refused as the IPAM range, as last logged.
    refused_local: Mutex<Option<NodeProblem>>,
    /// Policies refused by the translator, as last logged.
    refused_policies: Mutex<Vec<Refusal>>,
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
            ipam: Arc::new(Mutex::new(None)),
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
            pods: None,
            admitted: Mutex::new(BTreeMap::new()),
            underlay: Mutex::new(None),
            refused_nodes: Mutex::new(BTreeMap::new()),
            refused_local: Mutex::new(None),
            refused_policies: Mutex::new(Vec::new()),
        };
        if let Some(cidr) = agent.cfg.pod_cidr {
            open_ipam_in(&agent.ipam, &agent.cfg.state_dir, cidr)?;
        }
        Ok(agent)
    }

    /// With `lookup`, CNI ADD admits a pod only once its Pod object is
    /// known: from the snapshot, or read from the source (see
    /// [`Agent::admit_pod`]). Without (CNI-only mode) there are no
    /// policies, and every pod is admitted.
    pub fn with_pod_lookup(mut self, lookup: Arc<dyn PodLookup>) -> Agent {
        self.pods = Some(lookup);
        self
    }

    /// Opens (or switches) the IPAM store for `cidr`, on the blocking pool.
    async fn open_ipam(&self, cidr: Ipv4Net) -> anyhow::Result<()> {
        let (slot, dir) = (self.ipam.clone(), self.cfg.state_dir.clone());
        tokio::task::spawn_blocking(move || open_ipam_in(&slot, &dir, cidr))
            .await
            .map_err(|e| anyhow::anyhow!("IPAM task failed: {e}"))?
    }

    /// Runs `f` on the IPAM store on the blocking pool: its writes fsync,
    /// and the store's lock is only ever taken there, so no runtime thread
    /// waits for a disk (nor for another request's fsync).
    async fn with_ipam<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Ipam) -> Result<T, crate::ipam::IpamError> + Send + 'static,
    ) -> Result<T, CniError> {
        let slot = self.ipam.clone();
        blocking(move || {
            let mut slot = slot
                .lock()
                .map_err(|_| err(code::IO_FAILURE, "IPAM lock poisoned"))?;
            let Some(ipam) = slot.as_mut() else {
                return Err(err(
                    code::TRY_AGAIN_LATER,
                    "the node's pod CIDR is not known yet (no --pod-cidr, and the Node object has no valid spec.podCIDR)",
                ));
            };
            f(ipam).map_err(|e| match e {
                crate::ipam::IpamError::Exhausted { .. } => err(code::IP_EXHAUSTED, e.to_string()),
                _ => err(code::IO_FAILURE, e.to_string()),
            })
        })
        .await?
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
    pub async fn set_cluster(&self, state: Arc<ClusterState>) {
        if let Some(cidr) = self.pod_cidr_in(&state) {
            if let Err(e) = self.open_ipam(cidr).await {
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
            (None, Some(n)) => self.check_own_node(n, state),
            (None, None) => None,
        }
    }

    /// What this node knows of itself, for [`crate::nodes`].
    fn local_node(&self, state: &ClusterState, pod_cidr: Option<Ipv4Net>) -> LocalNode {
        LocalNode {
            name: self.cfg.node_name.clone(),
            pod_cidr,
            node_ip: self.cfg.node_ip.or_else(|| {
                state
                    .nodes
                    .get(&self.cfg.node_name)
                    .and_then(|n| n.internal_ip)
            }),
            underlay: self.underlay.lock().ok().and_then(|u| *u),
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
        self.open_ipam(cidr).await?;
        if let Some(ip) = self.node_ip() {
            match tokio::task::spawn_blocking(move || podnet::subnet_of(ip)).await {
                Ok(Ok(subnet)) => {
                    if let Ok(mut u) = self.underlay.lock() {
                        *u = subnet;
                    }
                }
                Ok(Err(e)) => tracing::warn!("cannot read the node subnet of {ip}: {e}"),
                Err(e) => tracing::warn!("node subnet task failed: {e}"),
            }
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
        desired::pod_ports(&self.attachments())
    }

    /// The remote nodes with a pod CIDR and an underlay address that
    /// pass [`crate::nodes::check_remotes`]; a newly refused Node is
    /// logged (naming it and why) and counted.
    fn remote_nodes(&self, state: &ClusterState) -> Vec<RemoteNode> {
        let pod_cidr = self
            .node()
            .map(|n| n.pod_cidr)
            .or_else(|| self.pod_cidr_in(state));
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
        // Until the lines are back: a failed task means a full replace.
        applied.valid = false;
        let (desired, want, change, old) = blocking(move || {
            let d = desired::compute(&inputs);
            let want: HashSet<String> = d.lines.iter().cloned().collect();
            let change = if valid {
                FlowChange::Bundle(diff_mods(&old, &want))
            } else {
                FlowChange::Replace(d.lines.join("\n"))
            };
            (d, want, change, old)
        })
        .await?;
        applied.lines = old;
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
                }
            }
        }
        if let Ok(mut r) = self.rules.lock() {
            *r = desired.rules;
        }
        drop(applied);
        self.sync_routes(&node).await;
        Ok(())
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
            .with_ipam(move |ipam| {
                ipam.retain(|al| held.contains(&(al.container_id.clone(), al.ifname.clone())))
            })
            .await
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
        } else {
            self.forget_admitted(&a.pod_namespace, &a.pod_name);
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
        let (c, i) = (cid.clone(), ifn.clone());
        match self.with_ipam(move |ipam| ipam.release(&c, &i)).await {
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
        self.admit_pod(req).await?;
        let (pod_ns, pod_name) = req.pod().unwrap_or(("", ""));
        let host_ifname = podnet::host_ifname(pod_ns, pod_name, &req.container_id, &req.ifname);
        let (cid, ifn) = (req.container_id.clone(), req.ifname.clone());
        let ip = match self.with_ipam(move |ipam| ipam.allocate(&cid, &ifn)).await {
            Ok(ip) => ip,
            Err(e) => {
                self.forget_admitted(pod_ns, pod_name);
                return Err(e);
            }
        };
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
            let (cid, ifn) = (req.container_id.clone(), req.ifname.clone());
            let _ = self.with_ipam(move |ipam| ipam.release(&cid, &ifn)).await;
            self.forget_admitted(pod_ns, pod_name);
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
    fn forget_admitted(&self, ns: &str, name: &str) {
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
        let alias = podnet::owner_alias(&a.container_id, &a.ifname);
        blocking(move || {
            podnet::setup_pod_interface(&spec)?;
            // Whose link this is, for a DEL without a record (see `del`).
            podnet::set_link_alias(&spec.host_ifname, &alias)
        })
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
                let (cid, ifn) = (req.container_id.clone(), req.ifname.clone());
                match self.with_ipam(move |ipam| ipam.release(&cid, &ifn)).await {
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
                    tracing::info!(pod = %a.pod_ref(), ip = %a.ip, "GC: released a stale attachment")
                }
                Err(e) => failures.push(format!("{}: {e}", a.pod_ref())),
            }
        }
        // Addresses: with no ADD or DEL in flight (the gate for writing),
        // so an address an ADD has just allocated, before its record is
        // written, is never taken for stale.
        let gate = self.gate.write().await;
        let held: BTreeSet<(String, String)> = self.attachments().iter().map(|a| a.key()).collect();
        let r = self
            .with_ipam(move |ipam| {
                ipam.retain(|al| {
                    let k = (al.container_id.clone(), al.ifname.clone());
                    valid.contains(&k) || held.contains(&k)
                })
            })
            .await;
        drop(gate);
        match r {
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
        let (free, cidr) = self.with_ipam(|i| Ok((i.free_count(), i.cidr()))).await?;
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

/// How the switch is brought to the desired flows.
enum FlowChange {
    /// `replace-flows` with this text (first time, or after a failure).
    Replace(String),
    /// One atomic bundle of these mods (may be empty).
    Bundle(String),
}

/// The bundle that turns the flows `old` into `want`: deletes, then adds.
fn diff_mods(old: &HashSet<String>, want: &HashSet<String>) -> String {
    let mut mods = String::new();
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
    mods
}

/// Opens (or switches to) the IPAM store of `cidr` in `slot` (blocking).
fn open_ipam_in(slot: &Mutex<Option<Ipam>>, state_dir: &Path, cidr: Ipv4Net) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut slot = slot
        .lock()
        .map_err(|_| anyhow::anyhow!("IPAM lock poisoned"))?;
    match slot.as_ref() {
        Some(i) if i.cidr() == cidr => return Ok(()),
        Some(i) => {
            tracing::warn!(old = %i.cidr(), new = %cidr, "the node's pod CIDR changed: new pods get addresses from the new one");
        }
        None => {}
    }
    let ipam = Ipam::open(&state_dir.join("ipam"), cidr)
        .with_context(|| format!("cannot open the IPAM store for {cidr}"))?;
    *slot = Some(ipam);
    Ok(())
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

    /// An agent on a fresh state directory, with no switch.
    fn offline_agent(dir: &Path) -> Arc<Agent> {
        Arc::new(
            Agent::open(AgentConfig {
                node_name: "n1".into(),
                cni_socket: dir.join("cni.sock"),
                switchd_socket: dir.join("no-switchd.sock"),
                state_dir: dir.join("state"),
                pod_cidr: Some("10.244.0.0/24".parse().unwrap()),
                node_ip: None,
                gateway: "gw".into(),
                tunnel: "tun".into(),
                pod_mtu: 1450,
                pod_tx_checksum_off: true,
                switch_timeout: Duration::from_secs(1),
                masquerade: false,
                max_policy_flows: crate::policy::DEFAULT_MAX_POLICY_FLOWS,
            })
            .unwrap(),
        )
    }

    fn gc_request(valid: Value) -> CniRequest {
        CniRequest {
            v: oxvs_api::cni::CNI_PROTOCOL_VERSION,
            command: CniCommand::Gc,
            container_id: String::new(),
            netns: String::new(),
            ifname: String::new(),
            args: Default::default(),
            config: serde_json::json!({
                "cniVersion": "1.1.0", "name": "oxvs", "cni.dev/valid-attachments": valid
            }),
        }
    }

    fn holds(agent: &Agent, cid: &str) -> bool {
        let ipam = agent.ipam.lock().unwrap();
        ipam.as_ref()
            .unwrap()
            .allocations()
            .iter()
            .any(|a| a.container_id == cid)
    }

    /// The IPAM store is locked (and fsyncs) only on the blocking pool:
    /// while another thread holds it (as a slow fsync would), a request
    /// that needs it waits without occupying the runtime's thread, so the
    /// runtime's other tasks keep running. On a one-thread runtime: a tick
    /// task must run (and release the store) before GC completes. Without
    /// the fix GC blocks the thread on the lock and the tick runs only
    /// after the holder's 30 s hang guard let go.
    #[test]
    fn ipam_never_blocks_a_runtime_thread() {
        let dir = tempfile::tempdir().unwrap();
        let agent = offline_agent(dir.path());
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (locked, is_locked) = std::sync::mpsc::channel::<()>();
        let slot = agent.ipam.clone();
        let holder = std::thread::spawn(move || {
            let _g = slot.lock().unwrap();
            locked.send(()).unwrap();
            // Hang guard only: the test releases it long before.
            let _ = released.recv_timeout(Duration::from_secs(30));
        });
        is_locked.recv().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        rt.block_on(async {
            let (a, o) = (agent.clone(), order.clone());
            let gc = tokio::spawn(async move {
                let r = a.handle(gc_request(serde_json::json!([]))).await;
                o.lock().unwrap().push("gc");
                r
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
            order.lock().unwrap().push("tick");
            // (Without the fix the holder gave up waiting long ago.)
            let _ = release.send(());
            gc.await.unwrap().unwrap();
        });
        holder.join().unwrap();
        assert_eq!(
            *order.lock().unwrap(),
            ["tick", "gc"],
            "GC blocked the runtime's thread while the IPAM store was busy"
        );
    }

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
            other.ip = ip2;
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
            rec.ip = ip;
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
        assert!(compare_flows(&want, &dump, crate::cookie::pod(3)).is_empty());
        dump.flows.pop();
        let p = compare_flows(&want, &dump, crate::cookie::pod(3));
        assert_eq!(
            p,
            vec!["1 of its flows are missing from the switch".to_string()]
        );
    }
}
