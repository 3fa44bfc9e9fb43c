//! The Kubernetes API source: watchers on Namespaces, Pods, Nodes and
//! NetworkPolicies (all namespaces) feeding one model state; with the
//! Service proxy also Services and their endpoints: EndpointSlices
//! (`discovery.k8s.io/v1`) where the API server serves them, else
//! Endpoints (a v1.20 server's slices are `v1beta1`, which the agent does
//! not read), decided once at start ([`slices_served`]).
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
use k8s_openapi::api::discovery::v1 as discovery;
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

impl Kind for discovery::EndpointSlice {
    const KIND: &'static str = "EndpointSlice";
    type Key = ObjKey;
    type Model = model::EndpointSet;
    fn key(&self) -> Option<ObjKey> {
        ns_key(&self.metadata)
    }
    fn convert(&self) -> Result<model::EndpointSet, ConvertError> {
        convert::endpoint_slice(self)
    }
}

/// Whether the API server serves EndpointSlices as `discovery.k8s.io/v1`
/// (Kubernetes 1.21 and later). An error other than "not found" is
/// returned: the caller retries rather than guess.
pub async fn slices_served(client: &Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources("discovery.k8s.io/v1").await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "endpointslices")),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Where a Service's endpoints are read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointsFrom {
    /// `discovery.k8s.io/v1` EndpointSlices.
    Slices,
    /// v1 Endpoints (no v1 EndpointSlices on this API server).
    Endpoints,
}

/// The Service proxy's stores.
#[derive(Default)]
struct ServiceStores {
    services: Store<core::Service>,
    /// Watched when the server has no v1 EndpointSlices.
    endpoints: Option<Store<core::Endpoints>>,
    slices: Option<Store<discovery::EndpointSlice>>,
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
    Slice(Event<discovery::EndpointSlice>),
}

#[derive(Default)]
struct State {
    namespaces: Store<core::Namespace>,
    pods: Store<core::Pod>,
    nodes: Store<core::Node>,
    policies: Store<net::NetworkPolicy>,
    /// Watched only with the proxy on (`Some` then).
    services: Option<ServiceStores>,
}

impl State {
    fn apply(&mut self, ev: Ev) -> bool {
        match ev {
            Ev::Namespace(e) => self.namespaces.apply(e),
            Ev::Pod(e) => self.pods.apply(e),
            Ev::Node(e) => self.nodes.apply(e),
            Ev::Policy(e) => self.policies.apply(e),
            Ev::Service(e) => self.services.as_mut().is_some_and(|s| s.services.apply(e)),
            Ev::Endpoints(e) => self
                .services
                .as_mut()
                .and_then(|s| s.endpoints.as_mut())
                .is_some_and(|s| s.apply(e)),
            Ev::Slice(e) => self
                .services
                .as_mut()
                .and_then(|s| s.slices.as_mut())
                .is_some_and(|s| s.apply(e)),
        }
    }

    fn synced(&self) -> bool {
        self.namespaces.synced
            && self.pods.synced
            && self.nodes.synced
            && self.policies.synced
            && self.services.as_ref().is_none_or(|s| {
                s.services.synced
                    && s.endpoints.as_ref().is_none_or(|e| e.synced)
                    && s.slices.as_ref().is_none_or(|e| e.synced)
            })
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
                .map(|s| s.services.items.clone())
                .unwrap_or_default(),
            endpoints: self
                .services
                .as_ref()
                .and_then(|s| s.endpoints.as_ref())
                .map(|e| e.items.clone())
                .unwrap_or_default(),
            endpoint_slices: self
                .services
                .as_ref()
                .and_then(|s| s.slices.as_ref())
                .map(|e| e.items.clone())
                .unwrap_or_default(),
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
        let from = endpoints_from(&client, &tx).await;
        streams.push(stream::<core::Service>(&client, Ev::Service));
        let mut stores = ServiceStores::default();
        match from {
            Some(EndpointsFrom::Slices) => {
                streams.push(stream::<discovery::EndpointSlice>(&client, Ev::Slice));
                stores.slices = Some(Store::default());
            }
            Some(EndpointsFrom::Endpoints) => {
                streams.push(stream::<core::Endpoints>(&client, Ev::Endpoints));
                stores.endpoints = Some(Store::default());
            }
            None => return Ok(()),
        }
        info!(from = ?from, "Service endpoints read from");
        state.services = Some(stores);
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

/// Asks the API server whether it serves v1 EndpointSlices, retrying with
/// backoff while it cannot be asked (`None`: every receiver went).
async fn endpoints_from(
    client: &Client,
    tx: &watch::Sender<Arc<ClusterState>>,
) -> Option<EndpointsFrom> {
    let mut backoff = CappedBackoff::default();
    loop {
        match slices_served(client).await {
            Ok(true) => return Some(EndpointsFrom::Slices),
            Ok(false) => return Some(EndpointsFrom::Endpoints),
            Err(e) => {
                let d = backoff.next().unwrap_or(CappedBackoff::MAX);
                warn!("cannot ask the API server for EndpointSlices: {e}; retrying in {d:?}");
                tokio::select! {
                    _ = tx.closed() => return None,
                    _ = tokio::time::sleep(d) => {}
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

    fn slice(name: &str, service: &str, ip: &str, ready: bool) -> discovery::EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}}],
            "ports": [{"name": "http", "port": 8080}]
        }))
        .unwrap()
    }

    #[test]
    fn slices_feed_the_snapshot_when_the_server_has_them() {
        let mut st = State {
            services: Some(ServiceStores {
                slices: Some(Store::default()),
                ..ServiceStores::default()
            }),
            ..State::default()
        };
        for e in [
            Ev::Namespace(Event::InitDone),
            Ev::Pod(Event::InitDone),
            Ev::Node(Event::InitDone),
            Ev::Policy(Event::InitDone),
            Ev::Service(Event::InitDone),
        ] {
            st.apply(e);
        }
        assert!(!st.synced(), "waits for the slices' first list");
        st.apply(Ev::Slice(Event::Init));
        st.apply(Ev::Slice(Event::InitApply(slice(
            "web-a",
            "web",
            "10.244.1.2",
            true,
        ))));
        st.apply(Ev::Slice(Event::InitApply(slice(
            "web-b",
            "web",
            "10.244.2.2",
            false,
        ))));
        st.apply(Ev::Slice(Event::InitDone));
        assert!(st.synced());
        let snap = st.snapshot();
        assert_eq!(snap.endpoint_slices.len(), 2);
        let eps = snap.service_endpoints(&("shop".into(), "web".into()));
        assert_eq!(eps.iter().filter(|e| e.ready).count(), 1);
        // Endpoints events are not watched then: ignored.
        assert!(!st.apply(Ev::Endpoints(Event::InitDone)));
    }

    /// A client whose API server answers discovery of
    /// `discovery.k8s.io/v1` with `status` and `body`.
    fn fake_server(status: u16, body: &'static str) -> Client {
        let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| async move {
            assert_eq!(req.uri().path(), "/apis/discovery.k8s.io/v1");
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(body.as_bytes().to_vec()))
                    .unwrap(),
            )
        });
        Client::new(svc, "default")
    }

    #[tokio::test]
    async fn slices_are_used_where_served_else_endpoints() {
        let v121 = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"discovery.k8s.io/v1","resources":[{"name":"endpointslices","singularName":"endpointslice","namespaced":true,"kind":"EndpointSlice","verbs":["get","list","watch"]}]}"#;
        assert!(slices_served(&fake_server(200, v121)).await.unwrap());
        let v120 = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#;
        assert!(!slices_served(&fake_server(404, v120)).await.unwrap());
        let broken = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcd is down","reason":"InternalError","code":500}"#;
        assert!(slices_served(&fake_server(500, broken)).await.is_err());
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
