//! The on-disk record of one lab: `/run/oxvs-lab/<lab>/state.json`, and
//! the layout of the lab's directory.
//!
//! ```text
//! /run/oxvs-lab/<lab>/
//!   lock                 flock: exclusive for changes, shared for reads
//!   state.json           LabState (this module), replaced atomically
//!   manifests/           the manifest directory every agent watches
//!   node-N/              switchd.sock, cni.sock, agent-api.sock,
//!                        agent/ (the agent's --state-dir),
//!                        switchd.log, agent.log
//!   pods/<ns>_<pod>.log  the pod server's output
//!   k8s/                 with `up --kube-proxy`: k8s-local.sh's run directory
//!                        (etcd, API server, kubeconfigs, logs/)
//!   k8s-local.log        what `k8s-local.sh up` / `down` printed
//!   node-N/kube-proxy.log
//! ```
//!
//! Invariant: a namespace is appended to [`LabState::netns`] and the state
//! saved *before* the namespace is created, and a pid is saved right after
//! its process starts, so `down` finds everything even when the command
//! that made it died half-way.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// Where labs live.
pub const STATE_ROOT: &str = "/run/oxvs-lab";

/// The lab name used when none is given.
pub const DEFAULT_LAB: &str = "lab";

/// Checks a lab name: 1-20 characters of `[a-z0-9-]`, starting with a
/// letter or digit (it prefixes namespace names).
pub fn check_lab_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 20
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        anyhow::bail!(
            "invalid lab name {name:?}: use 1-20 characters of a-z, 0-9 and '-', not starting with '-'"
        )
    }
}

/// Paths of one lab.
#[derive(Clone, Debug)]
pub struct LabPaths {
    pub name: String,
    pub root: PathBuf,
}

impl LabPaths {
    pub fn new(state_root: &Path, name: &str) -> LabPaths {
        LabPaths {
            name: name.to_string(),
            root: state_root.join(name),
        }
    }
    pub fn state_file(&self) -> PathBuf {
        self.root.join("state.json")
    }
    pub fn lock_file(&self) -> PathBuf {
        self.root.join("lock")
    }
    pub fn manifests(&self) -> PathBuf {
        self.root.join("manifests")
    }
    pub fn node_dir(&self, index: u32) -> PathBuf {
        self.root.join(format!("node-{index}"))
    }
    pub fn pods_dir(&self) -> PathBuf {
        self.root.join("pods")
    }
    pub fn pod_log(&self, namespace: &str, name: &str) -> PathBuf {
        self.pods_dir().join(format!("{namespace}_{name}.log"))
    }
    /// The underlay namespace.
    pub fn underlay_netns(&self) -> String {
        format!("{}-ul", self.name)
    }
    /// Node `index`'s namespace.
    pub fn node_netns(&self, index: u32) -> String {
        format!("{}-node-{index}", self.name)
    }

    /// Takes the lab's lock (exclusive or shared), creating the directory.
    pub fn lock(&self, exclusive: bool) -> anyhow::Result<Flock<File>> {
        std::fs::create_dir_all(&self.root)
            .with_context(|| format!("cannot create {}", self.root.display()))?;
        let f = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.lock_file())
            .with_context(|| format!("cannot open {}", self.lock_file().display()))?;
        let arg = if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        };
        Flock::lock(f, arg)
            .map_err(|(_, e)| anyhow::anyhow!("cannot lock {}: {e}", self.lock_file().display()))
    }

    /// Whether a state file exists.
    pub fn exists(&self) -> bool {
        self.state_file().exists()
    }

    pub fn load(&self) -> anyhow::Result<LabState> {
        let p = self.state_file();
        let text = std::fs::read_to_string(&p).with_context(|| {
            format!(
                "lab {:?} does not exist (no {}); run `oxvs-lab up --name {}`",
                self.name,
                p.display(),
                self.name
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("corrupt lab state {}", p.display()))
    }

    pub fn save(&self, st: &LabState) -> anyhow::Result<()> {
        let text = serde_json::to_vec_pretty(st).context("cannot encode the lab state")?;
        write_atomic(&self.state_file(), &text)
    }
}

/// Writes `bytes` to `path` through a dot-file in the same directory,
/// fsynced and renamed into place: readers see the old or the new file,
/// never a half-written one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    let file_name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let tmp = dir.join(format!(".{}.tmp", file_name.to_string_lossy()));
    let mut f = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    drop(f);
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// How the agent is driven (decided once at `up` from `oxvs-agent --help`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentMode {
    /// `--node-name --manifests`: pod CIDR and node IP from the Node object.
    #[default]
    Manifests,
    /// An agent without a manifest source: `--pod-cidr`, single-node flows only.
    Legacy,
}

/// One node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// Kubernetes node name (`node-N`).
    pub name: String,
    pub index: u32,
    pub netns: String,
    /// Its IPv4 underlay (InternalIP) address; none on an IPv6-only node
    /// (`up --ip-family ipv6`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Its IPv6 underlay address (a second InternalIP) in a dual-stack
    /// lab, the only one in an IPv6-only lab: the host's IPv6 routes (a
    /// default route via the underlay bridge, as a dual-stack node has),
    /// NodePorts over IPv6, and the tunnel's address with `up --underlay
    /// ipv6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<String>,
    /// Its IPv4 pod CIDR; none on an IPv6-only node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    /// Its IPv6 pod CIDR (a dual-stack or IPv6-only lab).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_cidr6: Option<String>,
    pub switchd_pid: Option<u32>,
    pub agent_pid: Option<u32>,
}

impl NodeState {
    /// Node `index` of a lab whose node namespaces are named by
    /// `netns`: IPv4 underlay address `UNDERLAY.(10+index)` and pod CIDR
    /// `10.244.<index>.0/24` (not on an IPv6-only node) and, dual-stack
    /// or IPv6-only, `fd00:10:244:<index hex>::/64` and underlay address
    /// `UNDERLAY6::(10+index)`.
    pub fn new(index: u32, netns: String, family: IpFamily) -> NodeState {
        let (v4, v6) = (family.has_ipv4(), family.has_ipv6());
        NodeState {
            name: format!("node-{index}"),
            index,
            netns,
            ip: v4.then(|| format!("{}.{}", crate::commands::up::UNDERLAY, 10 + index)),
            ip6: v6.then(|| format!("{}::{}", crate::commands::up::UNDERLAY6, 10 + index)),
            pod_cidr: v4.then(|| format!("10.244.{index}.0/24")),
            pod_cidr6: v6.then(|| format!("fd00:10:244:{index:x}::/64")),
            switchd_pid: None,
            agent_pid: None,
        }
    }

    /// Its InternalIP addresses, IPv4 first.
    pub fn internal_ips(&self) -> Vec<&str> {
        self.ip
            .as_deref()
            .into_iter()
            .chain(self.ip6.as_deref())
            .collect()
    }

    /// Its first InternalIP (IPv4, or IPv6 on an IPv6-only node): a Pod's
    /// `status.hostIP`, what `status` shows. Empty only for a node without
    /// any address (not one the lab makes).
    pub fn primary_ip(&self) -> &str {
        self.internal_ips().first().copied().unwrap_or("")
    }

    /// Its pod CIDRs, IPv4 first.
    pub fn pod_cidrs(&self) -> Vec<&str> {
        self.pod_cidr
            .as_deref()
            .into_iter()
            .chain(self.pod_cidr6.as_deref())
            .collect()
    }

    /// The address its tunnel runs from (`oxvs-agent --node-ip`): its
    /// address of the `underlay` family, if it has one.
    pub fn tunnel_ip(&self, underlay: UnderlayFamily) -> Option<&str> {
        match underlay {
            UnderlayFamily::Ipv4 => self.ip.as_deref(),
            UnderlayFamily::Ipv6 => self.ip6.as_deref(),
        }
    }
}

/// The lab's address families (`up --ip-family`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum IpFamily {
    /// IPv4 pods.
    #[default]
    Ipv4,
    /// Dual-stack pods: an IPv4 and an IPv6 address each.
    Dual,
    /// IPv6-only pods and nodes, as an IPv6-only cluster has: IPv6 pod
    /// CIDRs, IPv6 InternalIPs, the tunnel over IPv6.
    Ipv6,
}

impl IpFamily {
    /// Whether pods and nodes have IPv4 addresses.
    pub fn has_ipv4(self) -> bool {
        self != IpFamily::Ipv6
    }
    /// Whether pods and nodes have IPv6 addresses.
    pub fn has_ipv6(self) -> bool {
        self != IpFamily::Ipv4
    }
    /// As `--ip-family` spells it.
    pub fn flag(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "ipv4",
            IpFamily::Dual => "dual",
            IpFamily::Ipv6 => "ipv6",
        }
    }
}

/// The family of the addresses the nodes' tunnel runs between (`up
/// --underlay`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum UnderlayFamily {
    /// The nodes' IPv4 addresses (192.168.77.N).
    #[default]
    Ipv4,
    /// The nodes' IPv6 addresses (fd00:192:168:77::N).
    Ipv6,
}

/// One declared container port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PortState {
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub port: u16,
    pub name: Option<String>,
}

/// One pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub netns: String,
    pub container_id: String,
    /// Its IPv4 address (none before CNI ADD, and in an IPv6-only lab).
    pub ip: Option<String>,
    /// Its IPv6 address, in a dual-stack or IPv6-only lab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip6: Option<String>,
    pub ports: Vec<PortState>,
    pub server_pid: Option<u32>,
}

impl PodState {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
    pub fn netns_path(&self) -> String {
        format!("/var/run/netns/{}", self.netns)
    }
    /// Its addresses as `status.podIPs` lists them: IPv4 first (an
    /// IPv6-only pod's IPv6 address alone).
    pub fn ips(&self) -> Vec<&str> {
        self.ip
            .as_deref()
            .into_iter()
            .chain(self.ip6.as_deref())
            .collect()
    }
    /// Its addresses for people: `10.244.1.2,fd00:10:244:1::2`, or
    /// `<none>` before CNI ADD gave it any.
    pub fn ips_display(&self) -> String {
        let v = self.ips();
        if v.is_empty() {
            "<none>".to_string()
        } else {
            v.join(",")
        }
    }
}

/// Everything one lab made.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabState {
    pub name: String,
    pub agent_mode: AgentMode,
    #[serde(default)]
    pub ip_family: IpFamily,
    /// The tunnel's underlay family.
    #[serde(default)]
    pub underlay: UnderlayFamily,
    /// The binaries the lab runs (absolute paths), for liveness checks.
    pub bins: BTreeMap<String, String>,
    pub nodes: Vec<NodeState>,
    /// In creation order.
    pub pods: Vec<PodState>,
    /// Every namespace the lab created or is about to create (write-ahead).
    pub netns: Vec<String>,
    /// `metadata.uid` the lab gave each object, by manifest file name.
    pub uids: BTreeMap<String, String>,
    /// Round-robin cursor for pods without `spec.nodeName`.
    pub next_node: usize,
    /// The API server and kube-proxies of a lab started with
    /// `up --kube-proxy` (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube: Option<KubeState>,
    /// The Services of a lab started with `up --proxy` (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyState>,
}

/// What `up --proxy` keeps: the Services applied (with their ClusterIP)
/// and the Endpoints the lab wrote for them, both also in the manifest
/// directory ([`crate::commands::proxy`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyState {
    /// `ns/name` -> the Service as written.
    #[serde(default)]
    pub services: BTreeMap<String, serde_json::Value>,
    /// `ns/name` -> the Endpoints the lab wrote (Services with a selector).
    #[serde(default)]
    pub endpoints: BTreeMap<String, serde_json::Value>,
    /// Their IPv6 side (a dual-stack lab): the Endpoints-shaped object
    /// written as IPv6 EndpointSlices.
    #[serde(default)]
    pub endpoints6: BTreeMap<String, serde_json::Value>,
}

/// What `up --kube-proxy` runs: an etcd + kube-apiserver from
/// `k8s-local.sh` in the underlay namespace, a kube-proxy per node; and the
/// Services the lab keeps Endpoints for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeState {
    /// `k8s-local.sh` (absolute).
    pub script: String,
    /// `$OXVS_K8S_CACHE` of the build used.
    pub cache: String,
    /// kubectl (absolute).
    pub kubectl: String,
    /// k8s-local.sh's run directory.
    pub run_dir: String,
    /// `https://<address>:<port>`, as the nodes reach it.
    pub server: String,
    /// kube-proxy pid per node name.
    #[serde(default)]
    pub kube_proxy: BTreeMap<String, u32>,
    /// Services applied through the lab (`ns/name` -> the user's object).
    #[serde(default)]
    pub services: BTreeMap<String, serde_json::Value>,
    /// The Endpoints the lab last wrote for a Service with a selector
    /// (`ns/name` -> object).
    #[serde(default)]
    pub endpoints: BTreeMap<String, serde_json::Value>,
    /// The lab's address families ([`LabState::ip_family`]): IPv4 (one
    /// IPv4 proxier per node, Endpoints); dual-stack (the API server and
    /// kube-proxies with `IPv6DualStack`, IPv6 ClusterIPs on request,
    /// kube-proxy reading EndpointSlices); IPv6-only (a single-stack IPv6
    /// API server and proxier, IPv6 Endpoints). Read through
    /// [`KubeState::family`].
    #[serde(default)]
    pub ip_family: IpFamily,
    /// What state files written before [`KubeState::ip_family`] said of a
    /// dual-stack lab; read, never written.
    #[serde(default, skip_serializing)]
    pub dual_stack: bool,
    /// The IPv6 side of [`KubeState::endpoints`] (a dual-stack lab): the
    /// Endpoints-shaped object the lab last wrote as IPv6 EndpointSlices.
    /// (An IPv6-only lab's Endpoints are IPv6 and live in
    /// [`KubeState::endpoints`], its only family.)
    #[serde(default)]
    pub endpoints6: BTreeMap<String, serde_json::Value>,
}

impl KubeState {
    /// The lab's families (a state file of a dual-stack lab written before
    /// [`KubeState::ip_family`] included).
    pub fn family(&self) -> IpFamily {
        if self.dual_stack {
            IpFamily::Dual
        } else {
            self.ip_family
        }
    }
}

impl LabState {
    pub fn node(&self, name: &str) -> Option<&NodeState> {
        self.nodes.iter().find(|n| n.name == name)
    }
    /// The index of node `name` in [`LabState::nodes`], or an error naming
    /// the lab's nodes.
    pub fn node_index(&self, name: &str) -> anyhow::Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| {
                let have: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
                anyhow::anyhow!(
                    "lab {} has no node {name:?} (nodes: {})",
                    self.name,
                    have.join(", ")
                )
            })
    }
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&PodState> {
        self.pods
            .iter()
            .find(|p| p.namespace == namespace && p.name == name)
    }
    pub fn pod_mut(&mut self, namespace: &str, name: &str) -> Option<&mut PodState> {
        self.pods
            .iter_mut()
            .find(|p| p.namespace == namespace && p.name == name)
    }
    /// Records a namespace about to be created (no duplicates).
    pub fn note_netns(&mut self, name: &str) {
        if !self.netns.iter().any(|n| n == name) {
            self.netns.push(name.to_string());
        }
    }
    pub fn forget_netns(&mut self, name: &str) {
        self.netns.retain(|n| n != name);
    }
}

/// A namespace name for pod `namespace/name` of lab `lab`, unique among
/// `taken`: `<lab>-<ns>-<pod>`, characters outside `[A-Za-z0-9_.-]`
/// replaced by `_`, cut to 60 characters, and `-2`, `-3`... appended when
/// the name is taken (e.g. `x-y/z` and `x/y-z` give the same base).
pub fn pod_netns_name(lab: &str, namespace: &str, name: &str, taken: &[String]) -> String {
    let raw = format!("{lab}-{namespace}-{name}");
    let mut base: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(60)
        .collect();
    if base.starts_with('.') {
        base.replace_range(0..1, "_");
    }
    if !taken.contains(&base) {
        return base;
    }
    (2u32..)
        .map(|i| format!("{base}-{i}"))
        .find(|n| !taken.contains(n))
        .unwrap_or(base)
}

/// A fresh random id: `bytes` random bytes in hex (from `/dev/urandom`,
/// falling back to the clock and pid).
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let ok = File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut buf))
        .is_ok();
    if !ok {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            ^ u128::from(std::process::id());
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (seed >> ((i % 16) * 8)) as u8 ^ (i as u8).wrapping_mul(131);
        }
    }
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// A UUID-shaped random id (as the API server gives `metadata.uid`).
pub fn random_uid() -> String {
    let h = random_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_netns_names_are_sanitised_and_unique() {
        assert_eq!(pod_netns_name("lab", "x", "a", &[]), "lab-x-a");
        let taken = vec!["lab-x-y-z".to_string()];
        assert_eq!(pod_netns_name("lab", "x", "y-z", &taken), "lab-x-y-z-2");
        assert_eq!(pod_netns_name("lab", "a/b", "c d", &[]), "lab-a_b-c_d");
        let long = "p".repeat(100);
        assert_eq!(pod_netns_name("lab", "x", &long, &[]).len(), 60);
    }

    #[test]
    fn lab_names() {
        assert!(check_lab_name("lab").is_ok());
        assert!(check_lab_name("t-123").is_ok());
        for bad in ["", "-x", "Lab", "a/b", "a_b", &"x".repeat(21)] {
            assert!(check_lab_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn uids_look_like_uuids() {
        let u = random_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(u.matches('-').count(), 4);
        assert_ne!(u, random_uid());
    }

    #[test]
    fn state_round_trips_atomically() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = LabPaths::new(dir.path(), "t");
        let _l = paths.lock(true).expect("lock");
        let mut st = LabState {
            name: "t".into(),
            ..LabState::default()
        };
        st.note_netns("t-ul");
        st.note_netns("t-ul");
        paths.save(&st).expect("save");
        assert_eq!(paths.load().expect("load"), st);
        assert_eq!(st.netns, vec!["t-ul".to_string()]);
        let names: Vec<_> = std::fs::read_dir(&paths.root)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".tmp")), "{names:?}");
    }

    #[test]
    fn nodes_of_each_family() {
        let n = NodeState::new(11, "t-node-11".into(), IpFamily::Ipv4);
        assert_eq!(n.ip.as_deref(), Some("192.168.77.21"));
        assert_eq!(n.ip6, None);
        assert_eq!(n.pod_cidrs(), vec!["10.244.11.0/24"]);
        assert_eq!(n.internal_ips(), vec!["192.168.77.21"]);
        assert_eq!(n.primary_ip(), "192.168.77.21");
        assert_eq!(n.tunnel_ip(UnderlayFamily::Ipv4), Some("192.168.77.21"));
        assert_eq!(n.tunnel_ip(UnderlayFamily::Ipv6), None);

        let n = NodeState::new(11, "t-node-11".into(), IpFamily::Dual);
        assert_eq!(n.pod_cidrs(), vec!["10.244.11.0/24", "fd00:10:244:b::/64"]);
        assert_eq!(
            n.internal_ips(),
            vec!["192.168.77.21", "fd00:192:168:77::21"]
        );
        assert_eq!(n.primary_ip(), "192.168.77.21");
        assert_eq!(
            n.tunnel_ip(UnderlayFamily::Ipv6),
            Some("fd00:192:168:77::21")
        );

        // IPv6-only: nothing IPv4 for Kubernetes or the agent.
        let n = NodeState::new(11, "t-node-11".into(), IpFamily::Ipv6);
        assert_eq!(n.ip, None);
        assert_eq!(n.pod_cidr, None);
        assert_eq!(n.pod_cidrs(), vec!["fd00:10:244:b::/64"]);
        assert_eq!(n.internal_ips(), vec!["fd00:192:168:77::21"]);
        assert_eq!(n.primary_ip(), "fd00:192:168:77::21");
        assert_eq!(n.tunnel_ip(UnderlayFamily::Ipv4), None);
        assert_eq!(
            n.tunnel_ip(UnderlayFamily::Ipv6),
            Some("fd00:192:168:77::21")
        );
        let text = serde_json::to_string(&n).expect("encode");
        assert!(
            !text.contains("\"ip\"") && !text.contains("\"pod_cidr\""),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<NodeState>(&text).expect("decode"), n);

        assert!(IpFamily::Ipv4.has_ipv4() && !IpFamily::Ipv4.has_ipv6());
        assert!(IpFamily::Dual.has_ipv4() && IpFamily::Dual.has_ipv6());
        assert!(!IpFamily::Ipv6.has_ipv4() && IpFamily::Ipv6.has_ipv6());
    }

    #[test]
    fn pods_without_an_ipv4_address() {
        let mut p = PodState {
            namespace: "x".into(),
            name: "a".into(),
            uid: "u".into(),
            node: "node-1".into(),
            netns: "t-x-a".into(),
            container_id: "c".into(),
            ip: None,
            ip6: None,
            ports: Vec::new(),
            server_pid: None,
        };
        assert!(p.ips().is_empty());
        assert_eq!(p.ips_display(), "<none>");
        p.ip6 = Some("fd00:10:244:1::2".into());
        assert_eq!(p.ips(), vec!["fd00:10:244:1::2"]);
        assert_eq!(p.ips_display(), "fd00:10:244:1::2");
        p.ip = Some("10.244.1.2".into());
        assert_eq!(p.ips(), vec!["10.244.1.2", "fd00:10:244:1::2"]);
        assert_eq!(p.ips_display(), "10.244.1.2,fd00:10:244:1::2");
    }

    /// A state file written before IPv6-only labs (node `ip` and
    /// `pod_cidr` plain strings, no `ip_family`) still loads.
    #[test]
    fn old_state_files_still_load() {
        let old = r#"{
          "name": "t", "agent_mode": "manifests", "bins": {},
          "nodes": [{"name": "node-1", "index": 1, "netns": "t-node-1",
                     "ip": "192.168.77.11", "pod_cidr": "10.244.1.0/24",
                     "switchd_pid": 10, "agent_pid": 11}],
          "pods": [{"namespace": "x", "name": "a", "uid": "u", "node": "node-1",
                    "netns": "t-x-a", "container_id": "c", "ip": "10.244.1.2",
                    "ports": [], "server_pid": null}],
          "netns": ["t-ul", "t-node-1", "t-x-a"], "uids": {}, "next_node": 1
        }"#;
        let st: LabState = serde_json::from_str(old).expect("an old state file");
        assert_eq!(st.ip_family, IpFamily::Ipv4);
        assert_eq!(st.underlay, UnderlayFamily::Ipv4);
        let n = &st.nodes[0];
        assert_eq!(n.ip.as_deref(), Some("192.168.77.11"));
        assert_eq!(n.pod_cidrs(), vec!["10.244.1.0/24"]);
        assert_eq!(st.pods[0].ips(), vec!["10.244.1.2"]);
        // And an IPv6-only lab's file round-trips.
        let v6 = LabState {
            name: "t".into(),
            ip_family: IpFamily::Ipv6,
            underlay: UnderlayFamily::Ipv6,
            nodes: vec![NodeState::new(1, "t-node-1".into(), IpFamily::Ipv6)],
            ..LabState::default()
        };
        let text = serde_json::to_string(&v6).expect("encode");
        assert!(text.contains(r#""ip_family":"ipv6""#), "{text}");
        assert_eq!(serde_json::from_str::<LabState>(&text).expect("decode"), v6);
    }

    /// The Kubernetes side of a state file written before
    /// `KubeState::ip_family` (a `dual_stack` flag) keeps its family; a new
    /// one writes the family only.
    #[test]
    fn old_kube_state_keeps_its_family() {
        let base = r#""script": "s", "cache": "c", "kubectl": "k", "run_dir": "r", "server": "x""#;
        let dual: KubeState =
            serde_json::from_str(&format!("{{{base}, \"dual_stack\": true}}")).expect("old dual");
        assert_eq!(dual.family(), IpFamily::Dual);
        let v4: KubeState = serde_json::from_str(&format!("{{{base}}}")).expect("old ipv4");
        assert_eq!(v4.family(), IpFamily::Ipv4);
        let v6 = KubeState {
            ip_family: IpFamily::Ipv6,
            ..KubeState::default()
        };
        let text = serde_json::to_string(&v6).expect("encode");
        assert!(!text.contains("dual_stack"), "{text}");
        let back: KubeState = serde_json::from_str(&text).expect("decode");
        assert_eq!(back.family(), IpFamily::Ipv6);
    }
}
