//! The agent: its state ([`Agent`], [`AgentConfig`]) and the operations
//! the CNI server, the API and the convergence loops run on it.
//!
//! - this file: the state, the attachment records and their per-key
//!   locks, the IPAM store;
//! - `node.rs`: the node's own network (pod CIDR, gateway, tunnel port,
//!   underlay subnet) and the remote Nodes it believes;
//! - `switch.rs`: the calls to oxvs-switchd (ports; its errors as CNI
//!   codes);
//! - `attach.rs`: one pod's interface, port and flows, made and undone;
//! - `reconcile.rs`: convergence with the switch ([`Agent::sync`],
//!   [`Agent::reconcile`], [`Agent::drifted`]);
//! - [`cni`]: the CNI verbs (ADD, DEL, CHECK, GC, STATUS) and the CNI
//!   socket's protocol ([`cni::CniSocket`]).
//!
//! The sockets themselves (accepting, the connection cap, line framing,
//! timeouts) are [`crate::socket_server`]'s.
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

mod attach;
pub mod cni;
mod node;
mod reconcile;
mod switch;
#[cfg(test)]
mod test_fixtures;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use oxvs_api::cni::{code, CniError};

use crate::flows::NodeNet;
use crate::ipam::Ipam;
use crate::model::{ClusterState, ObjKey, Pod};
use crate::nodes::NodeProblem;
use crate::policy::{Refusal, RuleRef};
use crate::source::PodLookup;
use crate::state::{Attachment, Store};

pub use reconcile::ReconcileReport;

/// NodePorts the host sends into the switch: IPv4, IPv6.
type NodePortSets = (Vec<crate::hostnet::NodePort>, Vec<crate::hostnet::NodePort>);

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
    /// The node's IPv6 pod CIDR (dual-stack); `None`: from the Node
    /// object's `spec.podCIDRs`, if it has one.
    pub pod_cidr6: Option<Ipv6Net>,
    /// The node's underlay address, of either family (the tunnel runs
    /// over its family); `None`: from the Node object's InternalIP (its
    /// IPv4 one, else its IPv6 one).
    pub node_ip: Option<IpAddr>,
    /// The host's gateway interface (switchd `--gateway NAME`); its switch
    /// port has the same name (on the `NAME-p` end of the pair).
    pub gateway: String,
    /// The VXLAN tunnel port the agent adds to the switch.
    pub tunnel: String,
    /// The MTU of paths leaving the node (VXLAN: the underlay's less 50):
    /// pod interfaces have it, or, with a larger `local_mtu`, their
    /// default route and the host's routes to other nodes' pods do.
    pub pod_mtu: u32,
    /// `pod_mtu` is a default (no `--mtu`): once the tunnel's address is
    /// known, the agent sizes it from that address's link, less the
    /// tunnel's overhead of its family ([`auto_pod_mtu`]).
    pub pod_mtu_auto: bool,
    /// The MTU of pod interfaces and the gateway when above `pod_mtu`
    /// (pods and the host on one node exchange frames that large; the
    /// switch must take them whole, see [`LocalMtu`]).
    pub local_mtu: LocalMtu,
    /// Turn TX checksum offload off in pods (only for a switch that does
    /// not complete partial checksums: `oxvs-switchd --trust-checksums`).
    pub pod_tx_checksum_off: bool,
    /// The root qdisc of pods' interfaces (`--pod-qdisc`, resolved; `None`
    /// keeps the veth's `noqueue`).
    pub pod_qdisc: Option<String>,
    /// Deadline of one switch call.
    pub switch_timeout: Duration,
    /// Enable forwarding and masquerade pod traffic leaving the node other
    /// than through the gateway (pod egress to outside the cluster).
    pub masquerade: bool,
    /// The most flows one NetworkPolicy may add on this node
    /// ([`crate::policy::DEFAULT_MAX_POLICY_FLOWS`]); a policy over it is refused.
    pub max_policy_flows: usize,
    /// Load-balance Services in the switch ([`crate::proxy`]); kube-proxy
    /// must then not run.
    pub proxy: bool,
}

/// What MTU pods and the gateway get on the node (`--local-mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalMtu {
    /// The largest the switch takes whole (its `show` says: 65535 with
    /// multi-buffer AF_XDP), else `pod_mtu`.
    Auto,
    /// `pod_mtu` everywhere.
    Off,
    /// This much (at least `pod_mtu`), if the switch takes it whole.
    Fixed(u32),
}

impl std::str::FromStr for LocalMtu {
    type Err = String;
    fn from_str(s: &str) -> Result<LocalMtu, String> {
        match s {
            "auto" => Ok(LocalMtu::Auto),
            "off" => Ok(LocalMtu::Off),
            n => match n.parse::<u32>() {
                Ok(m) if (576..=65535).contains(&m) => Ok(LocalMtu::Fixed(m)),
                _ => Err(format!(
                    "'{s}' is not a local MTU: auto, off, or 576 to 65535 bytes"
                )),
            },
        }
    }
}

/// Serialises the operations on one (container id, ifname).
type KeyLock = Arc<tokio::sync::Mutex<()>>;

/// The flows the switch holds, as the agent last set them.
#[derive(Default)]
struct Applied {
    /// False until a full `replace-flows` made the switch equal to `lines`.
    valid: bool,
    lines: HashSet<String>,
    /// The groups (the proxy's), as group lines.
    groups: HashSet<String>,
    /// The proxy's UDP endpoints the switch serves.
    udp_endpoints: BTreeSet<(std::net::IpAddr, u16)>,
}

/// The IPAM store, once the pod CIDR is known. Locked only on the
/// blocking pool ([`Agent::with_ipam`]): its operations fsync.
type IpamSlot<A = Ipv4Addr> = Arc<Mutex<Option<Ipam<A>>>>;

/// The agent: its state and the operations the CNI server runs.
pub struct Agent {
    cfg: AgentConfig,
    ipam: IpamSlot,
    /// The IPv6 store, on a dual-stack node.
    ipam6: IpamSlot<Ipv6Addr>,
    store: Store,
    records: Mutex<BTreeMap<(String, String), Attachment>>,
    locks: Mutex<HashMap<(String, String), KeyLock>>,
    gate: tokio::sync::RwLock<()>,
    node: Mutex<Option<NodeNet>>,
    tunnel_ofport: Mutex<Option<u32>>,
    cluster: Mutex<Arc<ClusterState>>,
    applied: tokio::sync::Mutex<Applied>,
    rules: Mutex<Vec<RuleRef>>,
    /// Host routes set: destination, next hop (`None`: onto the link).
    routes: Mutex<BTreeMap<ipnet::IpNet, Option<std::net::IpAddr>>>,
    /// The proxy's NodePorts as last set on the host.
    /// The NodePorts set on the host: IPv4, IPv6.
    node_ports: Mutex<Option<NodePortSets>>,
    /// Reads a pod the snapshot lacks (`None`: no cluster source).
    pods: Option<Arc<dyn PodLookup>>,
    /// Pods read by ADD that the snapshot did not have yet; used by the
    /// translation until the snapshot has them (same uid), dropped with
    /// their attachment.
    admitted: Mutex<BTreeMap<ObjKey, Pod>>,
    /// The underlay subnets (the prefixes of the interfaces with the
    /// node's IPv4 and IPv6 addresses), once found.
    underlay: Mutex<Vec<IpNet>>,
    /// The address the tunnel port was made on (its family is the
    /// tunnel's for the agent's life), once it is.
    tunnel_ip: Mutex<Option<IpAddr>>,
    /// The MTU new pod interfaces get, resolved from `cfg.local_mtu` once
    /// the switch said what it takes (0 until then: `cfg.pod_mtu`).
    link_mtu: std::sync::atomic::AtomicU32,
    /// The MTU of paths leaving the node: `cfg.pod_mtu`, or what
    /// discovery sized it to ([`AgentConfig::pod_mtu_auto`]).
    pod_mtu: std::sync::atomic::AtomicU32,
    /// Whether the switch's tunnel port segments large TCP frames (its
    /// `show`, asked once the tunnel port exists).
    tunnel_tso: std::sync::atomic::AtomicBool,
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

impl Agent {
    /// Opens the agent's on-disk state (records; IPAM once the pod CIDR is known).
    pub fn open(cfg: AgentConfig) -> anyhow::Result<Agent> {
        let (store, recs) = Store::open(&cfg.state_dir)?;
        let records = recs.into_iter().map(|r| (r.key(), r)).collect();
        let cfg_pod_mtu = cfg.pod_mtu;
        let agent = Agent {
            cfg,
            ipam: Arc::new(Mutex::new(None)),
            ipam6: Arc::new(Mutex::new(None)),
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
            node_ports: Mutex::new(None),
            pods: None,
            admitted: Mutex::new(BTreeMap::new()),
            underlay: Mutex::new(Vec::new()),
            tunnel_ip: Mutex::new(None),
            link_mtu: std::sync::atomic::AtomicU32::new(0),
            pod_mtu: std::sync::atomic::AtomicU32::new(cfg_pod_mtu),
            tunnel_tso: std::sync::atomic::AtomicBool::new(false),
            refused_nodes: Mutex::new(BTreeMap::new()),
            refused_local: Mutex::new(None),
            refused_policies: Mutex::new(Vec::new()),
        };
        if let Some(cidr) = agent.cfg.pod_cidr {
            open_ipam_in(&agent.ipam, &agent.cfg.state_dir, cidr)?;
        }
        if let Some(cidr) = agent.cfg.pod_cidr6 {
            open_ipam_in(&agent.ipam6, &agent.cfg.state_dir, cidr)?;
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

    /// Releases the addresses (both families) of (container id, ifname);
    /// none allocated, or no IPAM yet, is not an error.
    async fn release_addresses(&self, cid: &str, ifn: &str) -> Result<(), CniError> {
        let (c, i) = (cid.to_owned(), ifn.to_owned());
        match self.with_ipam(move |ipam| ipam.release(&c, &i)).await {
            Ok(_) => {}
            // No IPAM yet: nothing can have been allocated.
            Err(e) if e.code == code::TRY_AGAIN_LATER => {}
            Err(e) => return Err(e),
        }
        let (c, i) = (cid.to_owned(), ifn.to_owned());
        self.with_ipam6(move |ipam| ipam.release(&c, &i))
            .await
            .map(drop)
    }

    /// Releases every allocation (both families) whose key `keep` refuses;
    /// returns the addresses released. No IPAM yet: nothing.
    async fn retain_addresses(
        &self,
        keep: impl Fn(&(String, String)) -> bool + Clone + Send + 'static,
    ) -> Result<Vec<(std::net::IpAddr, String)>, CniError> {
        let k = keep.clone();
        let mut gone: Vec<(std::net::IpAddr, String)> = match self
            .with_ipam(move |ipam| {
                ipam.retain(|al| k(&(al.container_id.clone(), al.ifname.clone())))
            })
            .await
        {
            Ok(v) => v
                .into_iter()
                .map(|al| (al.ip.into(), al.container_id))
                .collect(),
            Err(e) if e.code == code::TRY_AGAIN_LATER => Vec::new(),
            Err(e) => return Err(e),
        };
        let v6 = self
            .with_ipam6(move |ipam| {
                ipam.retain(|al| keep(&(al.container_id.clone(), al.ifname.clone())))
            })
            .await?
            .unwrap_or_default();
        gone.extend(v6.into_iter().map(|al| (al.ip.into(), al.container_id)));
        Ok(gone)
    }

    /// [`Agent::open_ipam`] for the IPv6 pod CIDR.
    async fn open_ipam6(&self, cidr: Ipv6Net) -> anyhow::Result<()> {
        let (slot, dir) = (self.ipam6.clone(), self.cfg.state_dir.clone());
        tokio::task::spawn_blocking(move || open_ipam_in(&slot, &dir, cidr))
            .await
            .map_err(|e| anyhow::anyhow!("IPAM task failed: {e}"))?
    }

    /// Runs `f` on the IPv6 IPAM store, if the node has one (`Ok(None)`
    /// on an IPv4-only node); see [`Agent::with_ipam`].
    async fn with_ipam6<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Ipam<Ipv6Addr>) -> Result<T, crate::ipam::IpamError> + Send + 'static,
    ) -> Result<Option<T>, CniError> {
        let slot = self.ipam6.clone();
        blocking(move || {
            let mut slot = slot
                .lock()
                .map_err(|_| err(code::IO_FAILURE, "IPAM lock poisoned"))?;
            let Some(ipam) = slot.as_mut() else {
                return Ok(None);
            };
            f(ipam).map(Some).map_err(|e| match e {
                crate::ipam::IpamError::Exhausted { .. } => err(code::IP_EXHAUSTED, e.to_string()),
                _ => err(code::IO_FAILURE, e.to_string()),
            })
        })
        .await?
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

    /// The MTU of paths leaving the node (see [`AgentConfig::pod_mtu`]).
    pub fn pod_mtu(&self) -> u32 {
        self.pod_mtu.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets [`Agent::pod_mtu`] (discovery, before any pod is attached).
    pub(super) fn set_pod_mtu(&self, mtu: u32) {
        self.pod_mtu
            .store(mtu, std::sync::atomic::Ordering::Relaxed);
    }

    /// The MTU a new pod interface gets (see [`AgentConfig::local_mtu`]).
    pub fn link_mtu(&self) -> u32 {
        match self.link_mtu.load(std::sync::atomic::Ordering::Relaxed) {
            0 => self.pod_mtu(),
            m => m.max(self.pod_mtu()),
        }
    }

    /// The MTU of the default route of a pod whose interface has `mtu`
    /// (and of the host's routes to other nodes' pods): the path leaving
    /// the node's, when below the interface's.
    pub fn route_mtu(&self, mtu: u32) -> Option<u32> {
        (mtu > self.pod_mtu()).then_some(self.pod_mtu())
    }

    /// Whether a pod whose interface has `mtu` sends TCP at that MTU to
    /// every destination (its default route keeping [`route_mtu`](Self::route_mtu)
    /// for the rest): when the interface is above the tunnel's MTU and the
    /// switch segments TCP into the tunnel.
    pub fn tcp_full_mtu(&self, mtu: u32) -> bool {
        self.route_mtu(mtu).is_some() && self.tunnel_tso.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Resolves `cfg.local_mtu` against the largest frame the switch takes
    /// whole (`max_frame_len`, from its `show`; 0 if it does not say).
    pub(super) fn resolve_link_mtu(&self, max_frame_len: u32) -> u32 {
        let can = max_frame_len.saturating_sub(14).min(65_535);
        let want = match self.cfg.local_mtu {
            LocalMtu::Off => self.pod_mtu(),
            // Only large frames are worth a second MTU (a switch without
            // multi-buffer says 1514: pods keep --mtu as before).
            LocalMtu::Auto if can > 1500 => can.max(self.pod_mtu()),
            LocalMtu::Auto => self.pod_mtu(),
            LocalMtu::Fixed(m) if m <= can || m <= self.pod_mtu() => m.max(self.pod_mtu()),
            LocalMtu::Fixed(m) => {
                tracing::warn!(
                    local_mtu = m,
                    switch_takes = can,
                    "the switch cannot take frames that large whole (no multi-buffer AF_XDP: kernel 6.6+); pods keep the MTU {}",
                    self.pod_mtu()
                );
                self.pod_mtu()
            }
        };
        self.link_mtu
            .store(want, std::sync::atomic::Ordering::Relaxed);
        want
    }

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
        if let Some(cidr) = self.pod_cidr6_in(&state) {
            if let Err(e) = self.open_ipam6(cidr).await {
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

    // ---- Records and per-key locks -----------------------------------------

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
}

/// Opens (or switches to) the IPAM store of `cidr` in `slot` (blocking).
fn open_ipam_in<A: crate::ipam::PodFamily>(
    slot: &Mutex<Option<Ipam<A>>>,
    state_dir: &Path,
    cidr: A::Net,
) -> anyhow::Result<()> {
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
    let ipam = Ipam::<A>::open(&state_dir.join("ipam"), cidr)
        .with_context(|| format!("cannot open the IPAM store for {cidr}"))?;
    *slot = Some(ipam);
    Ok(())
}

/// The default pod MTU over an underlay link of MTU `underlay` for a
/// tunnel from `tunnel_ip`: VXLAN over IPv4 (outer IPv4, UDP, VXLAN and
/// the inner Ethernet header) costs 50 bytes, over IPv6 70; at least 576.
pub fn auto_pod_mtu(underlay: u32, tunnel_ip: std::net::IpAddr) -> u32 {
    let overhead = if tunnel_ip.is_ipv6() { 70 } else { 50 };
    underlay.saturating_sub(overhead).max(576)
}

/// The gateway address of a pod CIDR: its first host address.
pub fn gateway_of(cidr: Ipv4Net) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(cidr.network()).wrapping_add(1))
}

#[cfg(test)]
mod tests {
    use super::test_fixtures::{gc_request, offline_agent};
    use super::*;

    /// The default pod MTU leaves the tunnel's overhead of its family.
    #[test]
    fn auto_pod_mtu_leaves_the_tunnels_overhead() {
        let v4: std::net::IpAddr = "192.168.77.11".parse().unwrap();
        let v6: std::net::IpAddr = "fd00:77::11".parse().unwrap();
        assert_eq!(auto_pod_mtu(1500, v4), 1450);
        assert_eq!(auto_pod_mtu(1500, v6), 1430);
        assert_eq!(auto_pod_mtu(9000, v6), 8930);
        assert_eq!(auto_pod_mtu(600, v6), 576);
    }

    /// What `--local-mtu` resolves to against what the switch takes
    /// (`pod_mtu` is 1450 in the fixture).
    #[test]
    fn local_mtu_resolves_against_the_switch() {
        let dir = tempfile::tempdir().unwrap();
        let a = offline_agent(dir.path());
        assert_eq!(a.link_mtu(), 1450, "before the switch said anything");
        assert_eq!(a.resolve_link_mtu(65557), 65535);
        assert_eq!(a.route_mtu(a.link_mtu()), Some(1450));
        // No multi-buffer (1514), an older switch (0): --mtu, no route MTU.
        for frame in [1514, 0] {
            assert_eq!(a.resolve_link_mtu(frame), 1450);
            assert_eq!(a.route_mtu(a.link_mtu()), None);
        }
    }

    /// `--local-mtu`: auto, off, or 576..=65535 bytes; anything else is
    /// refused naming what was given.
    #[test]
    fn local_mtu_parses_and_refuses_bad_values() {
        assert_eq!("auto".parse::<LocalMtu>(), Ok(LocalMtu::Auto));
        assert_eq!("off".parse::<LocalMtu>(), Ok(LocalMtu::Off));
        assert_eq!("9000".parse::<LocalMtu>(), Ok(LocalMtu::Fixed(9000)));
        assert_eq!("65535".parse::<LocalMtu>(), Ok(LocalMtu::Fixed(65535)));
        for bad in ["575", "65536", "-1", "", "Auto", "9k", "99999999999"] {
            let e = bad.parse::<LocalMtu>().unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
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

    #[test]
    fn gateway_is_the_first_address() {
        assert_eq!(
            gateway_of("10.244.3.0/24".parse().unwrap()),
            Ipv4Addr::new(10, 244, 3, 1)
        );
    }
}
