//! The Kubernetes API source: watchers on Namespaces, Pods, Nodes and
//! NetworkPolicies (all namespaces) feeding one model state.
//!
//! - Each kind has a `kube::runtime::watcher` with the runtime's default
//!   backoff. A (re-)list (`Init` .. `InitDone`) is buffered and replaces
//!   the kind's objects at `InitDone`, so objects deleted while the API
//!   server was unreachable disappear, and nothing flaps during a re-list.
//! - Objects are converted as they arrive ([`super::convert`]); an invalid
//!   one is logged and removed from the state (an invalid update of a
//!   valid object removes it too: never half-applied).
//! - The first snapshot is published once every kind has completed its
//!   first list (a state with pods but not yet their policies would open
//!   traffic the policies deny). Afterwards changes are coalesced: a
//!   snapshot is built [`COALESCE`] after the first change of a burst and
//!   published if it differs from the last one.
//! - Watch errors (API server unreachable, expired resource versions) are
//!   logged; the watchers retry with backoff and re-list.
//!
//! Concurrency: one task; the watch streams are polled by it.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Config};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::convert::{self, ConvertError, DEFAULT_NAMESPACE};
use crate::model::{self, ClusterState, ObjKey};

/// Delay between the first change of a burst and the snapshot.
pub const COALESCE: Duration = Duration::from_millis(50);

/// A client from `kubeconfig` if given, else the default inference
/// (in-cluster service account, then `$KUBECONFIG` / `~/.kube/config`).
pub async fn kube_client(kubeconfig: Option<PathBuf>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(&path)
                .with_context(|| format!("kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", path.display()))?
        }
        None => Config::infer()
            .await
            .context("no Kubernetes configuration (in-cluster or KUBECONFIG)")?,
    };
    let url = config.cluster_url.clone();
    Client::try_from(config).with_context(|| format!("Kubernetes client for {url}"))
}

/// An API type the source watches.
trait Kind: Clone + Debug + Send + 'static {
    const KIND: &'static str;
    type Key: Ord + Clone + Debug + Send;
    type Model: Clone + Send;
    /// The key from metadata alone (for deletes of invalid objects).
    fn key(&self) -> Option<Self::Key>;
    fn convert(&self) -> Result<Self::Model, ConvertError>;
}

fn ns_key(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<ObjKey> {
    let ns = m
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.into());
    m.name.clone().map(|n| (ns, n))
}

impl Kind for core::Namespace {
    const KIND: &'static str = "Namespace";
    type Key = String;
    type Model = model::Namespace;
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn convert(&self) -> Result<model::Namespace, ConvertError> {
        convert::namespace(self)
    }
}

impl Kind for core::Node {
    const KIND: &'static str = "Node";
    type Key = String;
    type Model = model::Node;
    fn key(&self) -> Option<String> {
        self.metadata.name.clone()
    }
    fn convert(&self) -> Result<model::Node, ConvertError> {
        convert::node(self)
    }
}

impl Kind for core::Pod {
    const KIND: &'static str = "Pod";
    type Key = ObjKey;
    type Model = model::Pod;
    fn key(&self) -> Option<ObjKey> {
        ns_key(&self.metadata)
    }
    fn convert(&self) -> Result<model::Pod, ConvertError> {
        convert::pod(self)
    }
}

impl Kind for net::NetworkPolicy {
    const KIND: &'static str = "NetworkPolicy";
    type Key = ObjKey;
    type Model = model::NetworkPolicy;
    fn key(&self) -> Option<ObjKey> {
        ns_key(&self.metadata)
    }
    fn convert(&self) -> Result<model::NetworkPolicy, ConvertError> {
        convert::network_policy(self)
    }
}

impl Kind for core::Service {
    const KIND: &'static str = "Service";
    type Key = ObjKey;
    type Model = model::Service;
    fn key(&self) -> Option<ObjKey> {
        ns_key(&self.metadata)
    }
    fn convert(&self) -> Result<model::Service, ConvertError> {
        convert::service(self)
    }
}

impl Kind for core::Endpoints {
    const KIND: &'static str = "Endpoints";
    type Key = ObjKey;
    type Model = model::EndpointSet;
    fn key(&self) -> Option<ObjKey> {
        ns_key(&self.metadata)
    }
    fn convert(&self) -> Result<model::EndpointSet, ConvertError> {
        convert::endpoints(self)
    }
}

/// The converted objects of one kind.
struct Store<K: Kind> {
    items: BTreeMap<K::Key, K::Model>,
    /// The buffer of a (re-)list in progress.
    pending: Option<BTreeMap<K::Key, K::Model>>,
    /// The first list completed.
    synced: bool,
}

impl<K: Kind> Default for Store<K> {
    fn default() -> Self {
        Store {
            items: BTreeMap::new(),
            pending: None,
            synced: false,
        }
    }
}

impl<K: Kind> Store<K> {
    /// Converts `obj` into `map` (or removes its key if it is invalid).
    fn put(map: &mut BTreeMap<K::Key, K::Model>, obj: &K) {
        let Some(key) = obj.key() else {
            warn!("{} without a name ignored", K::KIND);
            return;
        };
        match obj.convert() {
            Ok(m) => {
                map.insert(key, m);
            }
            Err(e) => {
                warn!("{e}; left out");
                map.remove(&key);
            }
        }
    }

    /// Applies one watcher event; returns whether the visible items may
    /// have changed.
    fn apply(&mut self, ev: Event<K>) -> bool {
        match ev {
            Event::Init => {
                debug!("{}: (re-)list started", K::KIND);
                self.pending = Some(BTreeMap::new());
                false
            }
            Event::InitApply(obj) => {
                Self::put(self.pending.get_or_insert_with(BTreeMap::new), &obj);
                false
            }
            Event::InitDone => {
                self.items = self.pending.take().unwrap_or_default();
                if !self.synced {
                    info!("{}: {} listed", K::KIND, self.items.len());
                }
                self.synced = true;
                true
            }
            Event::Apply(obj) => {
                Self::put(&mut self.items, &obj);
                true
            }
            Event::Delete(obj) => {
                if let Some(k) = obj.key() {
                    self.items.remove(&k);
                }
                true
            }
        }
    }
}

// Moved once per event, straight into its store: boxing would only add
// an allocation.
#[allow(clippy::large_enum_variant)]
enum Ev {
    Namespace(Event<core::Namespace>),
    Pod(Event<core::Pod>),
    Node(Event<core::Node>),
    Policy(Event<net::NetworkPolicy>),
    Service(Event<core::Service>),
    Endpoints(Event<core::Endpoints>),
}

#[derive(Default)]
struct State {
    namespaces: Store<core::Namespace>,
    pods: Store<core::Pod>,
    nodes: Store<core::Node>,
    policies: Store<net::NetworkPolicy>,
    /// Watched only with the proxy on (`Some` then).
    services: Option<(Store<core::Service>, Store<core::Endpoints>)>,
}

impl State {
    fn apply(&mut self, ev: Ev) -> bool {
        match ev {
            Ev::Namespace(e) => self.namespaces.apply(e),
            Ev::Pod(e) => self.pods.apply(e),
            Ev::Node(e) => self.nodes.apply(e),
            Ev::Policy(e) => self.policies.apply(e),
            Ev::Service(e) => self.services.as_mut().is_some_and(|s| s.0.apply(e)),
            Ev::Endpoints(e) => self.services.as_mut().is_some_and(|s| s.1.apply(e)),
        }
    }

    fn synced(&self) -> bool {
        self.namespaces.synced
            && self.pods.synced
            && self.nodes.synced
            && self.policies.synced
            && self
                .services
                .as_ref()
                .is_none_or(|(s, e)| s.synced && e.synced)
    }

    fn snapshot(&self) -> ClusterState {
        ClusterState {
            namespaces: self.namespaces.items.clone(),
            pods: self.pods.items.clone(),
            nodes: self.nodes.items.clone(),
            policies: self.policies.items.clone(),
            services: self
                .services
                .as_ref()
                .map(|s| s.0.items.clone())
                .unwrap_or_default(),
            endpoints: self
                .services
                .as_ref()
                .map(|s| s.1.items.clone())
                .unwrap_or_default(),
            endpoint_slices: Default::default(),
        }
    }
}

/// The watchers' retry delays: 200 ms doubling up to 3 s (kube's default
/// grows to 30 s, so a node would take up to half a minute to see changes
/// made after an API server outage); reset once a watch works again.
#[derive(Clone, Copy, Debug)]
struct CappedBackoff {
    next: std::time::Duration,
}

impl CappedBackoff {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(200);
    const MAX: std::time::Duration = std::time::Duration::from_secs(3);
}

impl Default for CappedBackoff {
    fn default() -> Self {
        CappedBackoff { next: Self::FIRST }
    }
}

impl Iterator for CappedBackoff {
    type Item = std::time::Duration;
    fn next(&mut self) -> Option<std::time::Duration> {
        let d = self.next;
        self.next = (d * 2).min(Self::MAX);
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for CappedBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

fn stream<K>(
    client: &Client,
    wrap: fn(Event<K>) -> Ev,
) -> futures::stream::BoxStream<'static, Result<Ev, (&'static str, watcher::Error)>>
where
    K: Kind
        + kube::Resource<DynamicType = ()>
        + Clone
        + Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .backoff(CappedBackoff::default())
        .map_ok(wrap)
        .map_err(|e| (K::KIND, e))
        .boxed()
}

/// Watches the cluster through `client` and publishes snapshots on `tx`
/// (see the module doc). Runs until every receiver is dropped (then `Ok`);
/// API errors are retried forever.
pub async fn watch_kube(
    client: Client,
    tx: watch::Sender<Arc<ClusterState>>,
    services: bool,
) -> anyhow::Result<()> {
    let mut streams = vec![
        stream::<core::Namespace>(&client, Ev::Namespace),
        stream::<core::Pod>(&client, Ev::Pod),
        stream::<core::Node>(&client, Ev::Node),
        stream::<net::NetworkPolicy>(&client, Ev::Policy),
    ];
    let mut state = State::default();
    if services {
        streams.push(stream::<core::Service>(&client, Ev::Service));
        streams.push(stream::<core::Endpoints>(&client, Ev::Endpoints));
        state.services = Some(Default::default());
    }
    let mut events = futures::stream::select_all(streams);
    let mut last: Option<Arc<ClusterState>> = None;
    let mut deadline: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tx.closed() => return Ok(()),
            ev = events.next() => match ev {
                None => anyhow::bail!("Kubernetes watch streams ended"),
                Some(Err((kind, e))) => warn!("Kubernetes watch of {kind}s: {e}; retrying with backoff"),
                Some(Ok(ev)) => {
                    if state.apply(ev) && deadline.is_none() {
                        deadline = Some(Instant::now() + COALESCE);
                    }
                }
            },
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                deadline = None;
                if !state.synced() {
                    continue;
                }
                let st = state.snapshot();
                if last.as_deref() != Some(&st) {
                    if last.is_none() {
                        info!(
                            "Kubernetes source synced: {} namespaces, {} pods, {} nodes, {} policies",
                            st.namespaces.len(), st.pods.len(), st.nodes.len(), st.policies.len()
                        );
                    }
                    let st = Arc::new(st);
                    last = Some(st.clone());
                    if tx.send(st).is_err() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

/// [`super::PodLookup`] through the API: one `GET` of the pod (the
/// agent's service account may `get` pods, `deploy/oxvs.yaml`).
pub struct KubePods {
    pub client: Client,
}

impl super::PodLookup for KubePods {
    fn get_pod<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, anyhow::Result<Option<model::Pod>>> {
        Box::pin(async move {
            let api: Api<core::Pod> = Api::namespaced(self.client.clone(), namespace);
            let pod = api
                .get_opt(name)
                .await
                .with_context(|| format!("GET pod {namespace}/{name}"))?;
            match pod {
                None => Ok(None),
                Some(p) => convert::pod(&p)
                    .map(Some)
                    .map_err(|e| anyhow::anyhow!("{e}")),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn np(name: &str, cidr: &str) -> net::NetworkPolicy {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "x"},
            "spec": {"ingress": [{"from": [{"ipBlock": {"cidr": cidr}}]}]}
        }))
        .expect("policy")
    }

    fn keys(s: &Store<net::NetworkPolicy>) -> Vec<String> {
        s.items.keys().map(|(_, n)| n.clone()).collect()
    }

    #[test]
    fn relist_replaces_and_invalid_updates_remove() {
        let mut s = Store::<net::NetworkPolicy>::default();
        assert!(!s.apply(Event::Init));
        assert!(!s.apply(Event::InitApply(np("a", "10.0.0.0/8"))));
        assert!(!s.apply(Event::InitApply(np("bad", "10.0.0/8"))));
        assert!(
            !s.synced && s.items.is_empty(),
            "nothing visible before InitDone"
        );
        assert!(s.apply(Event::InitDone));
        assert!(s.synced);
        assert_eq!(keys(&s), ["a"]);
        assert!(s.apply(Event::Apply(np("b", "10.0.0.0/8"))));
        assert_eq!(keys(&s), ["a", "b"]);
        // An invalid update removes the object (never half-applied).
        assert!(s.apply(Event::Apply(np("b", "nope"))));
        assert_eq!(keys(&s), ["a"]);
        // A re-list keeps the old items visible until it is done, then
        // replaces them (objects deleted meanwhile disappear).
        s.apply(Event::Init);
        s.apply(Event::InitApply(np("c", "10.0.0.0/8")));
        assert_eq!(keys(&s), ["a"]);
        s.apply(Event::InitDone);
        assert_eq!(keys(&s), ["c"]);
        assert!(s.apply(Event::Delete(np("c", "garbage"))));
        assert!(s.items.is_empty());
    }

    #[test]
    fn snapshot_waits_for_every_kind() {
        let mut st = State::default();
        st.apply(Ev::Namespace(Event::InitDone));
        st.apply(Ev::Pod(Event::InitDone));
        st.apply(Ev::Node(Event::InitDone));
        assert!(!st.synced());
        st.apply(Ev::Policy(Event::InitDone));
        assert!(st.synced());
    }
}

#[cfg(test)]
mod backoff_tests {
    use super::CappedBackoff;
    use kube::runtime::utils::Backoff as _;
    use std::time::Duration;

    #[test]
    fn doubles_to_a_cap_and_resets() {
        let mut b = CappedBackoff::default();
        let v: Vec<Duration> = (&mut b).take(6).collect();
        assert_eq!(
            v,
            [200, 400, 800, 1600, 3000, 3000].map(Duration::from_millis)
        );
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(200)));
    }
}
