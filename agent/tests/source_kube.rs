//! The Kubernetes source against a real kube-apiserver 1.20 (etcd +
//! apiserver, no kubelet) started by `shared/tools/k8s-local.sh up` in a
//! private run dir on free ports.
//!
//! The test creates a namespace, a node, a pod and a NetworkPolicy through
//! the API, checks each snapshot reflects them (incl. a pod status IP, a
//! relabel), restarts the apiserver process and checks changes made after
//! it came back (deletes) still arrive, then tears everything down
//! (`k8s-local.sh down --purge`, also on failure).
//!
//! Skips (prints SKIPPED, passes) unless: root, `k8s-local.sh` found
//! (`$OXVS_SHARED_TOOLS`, `../shared/tools`, `/work/shared/tools`), the
//! cached build (`$OXVS_K8S_CACHE`, default `/var/cache/oxvs-k8s`,
//! `bin/kube-apiserver`), `etcd` and `kubectl` on PATH. Build once with
//! `k8s-local.sh build` (~10 min cold), then
//! `cargo test -p oxvs-agent --test source_kube -- --nocapture`.

mod kube_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use kube_support::{prerequisites, Cluster};
use oxvs_agent::model::{ClusterState, Peer, PortRef, Protocol};
use oxvs_agent::source::{kube_client, watch_kube};
use serde_json::json;
use tokio::sync::watch;

async fn wait_for(
    rx: &mut watch::Receiver<Arc<ClusterState>>,
    what: &str,
    secs: u64,
    f: impl Fn(&ClusterState) -> bool,
) -> Arc<ClusterState> {
    let r = tokio::time::timeout(Duration::from_secs(secs), async {
        loop {
            let st = rx.borrow_and_update().clone();
            if f(&st) {
                return st;
            }
            rx.changed().await.expect("source still running");
        }
    })
    .await;
    match r {
        Ok(st) => st,
        Err(_) => panic!(
            "timed out waiting for {what}; last snapshot: {:#?}",
            rx.borrow()
        ),
    }
}

fn key(ns: &str, name: &str) -> (String, String) {
    (ns.to_string(), name.to_string())
}

#[test]
fn kube_source_follows_the_api_server() {
    let tools = match prerequisites() {
        Ok(t) => t,
        Err(why) => {
            oxvs_testutil::skip_or_fail(why);
            return;
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "oxvs_agent=debug".to_string()),
        )
        .try_init();
    let mut cluster = Cluster::up(tools);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let kubeconfig = cluster.kubeconfig();
    let client = rt
        .block_on(kube_client(Some(kubeconfig)))
        .expect("client from the kubeconfig");
    let (tx, mut rx) = watch::channel(Arc::new(ClusterState::default()));
    let source = rt.spawn(watch_kube(client.clone(), tx, true));

    let tag = std::process::id();
    let ns_name = format!("oxvs-src-{tag}");
    let node_name = format!("oxvs-src-node-{tag}");
    let nss: Api<core::Namespace> = Api::all(client.clone());
    let nodes: Api<core::Node> = Api::all(client.clone());
    let pods: Api<core::Pod> = Api::namespaced(client.clone(), &ns_name);
    let nps: Api<net::NetworkPolicy> = Api::namespaced(client.clone(), &ns_name);
    let pp = PostParams::default();

    rt.block_on(async {
        wait_for(&mut rx, "initial snapshot", 30, |s| s.namespaces.contains_key("default")).await;

        let ns: core::Namespace = serde_json::from_value(json!({
            "metadata": {"name": ns_name, "labels": {"team": "a"}}
        }))
        .expect("ns");
        nss.create(&pp, &ns).await.expect("create namespace");
        // No controller-manager: the ServiceAccount admission needs this.
        let sas: Api<core::ServiceAccount> = Api::namespaced(client.clone(), &ns_name);
        let sa: core::ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("sa");
        sas.create(&pp, &sa).await.expect("create service account");
        let node: core::Node = serde_json::from_value(json!({
            "metadata": {"name": node_name},
            "spec": {"podCIDR": "10.244.7.0/24"}
        }))
        .expect("node");
        nodes.create(&pp, &node).await.expect("create node");
        let pod: core::Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "nodeName": node_name,
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "localhost/busybox:latest",
                                "ports": [{"containerPort": 8080, "name": "http"},
                                          {"containerPort": 53, "protocol": "UDP"}]}]
            }
        }))
        .expect("pod");
        pods.create(&pp, &pod).await.expect("create pod");
        let np: net::NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"name": "allow-web"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "web"}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}],
                             "ports": [{"port": "http"}]}],
                "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}]}]
            }
        }))
        .expect("policy");
        nps.create(&pp, &np).await.expect("create policy");

        let st = wait_for(&mut rx, "created objects", 20, |s| {
            s.namespaces.contains_key(&ns_name)
                && s.nodes.contains_key(&node_name)
                && s.pods.contains_key(&key(&ns_name, "web"))
                && s.policies.contains_key(&key(&ns_name, "allow-web"))
        })
        .await;
        assert_eq!(st.namespace_labels(&ns_name).get("team").map(String::as_str), Some("a"));
        assert_eq!(st.nodes[&node_name].pod_cidr, Some("10.244.7.0/24".parse().expect("cidr")));
        let p = &st.pods[&key(&ns_name, "web")];
        assert_eq!(p.node_name, node_name);
        assert_eq!(p.ip, None);
        assert_eq!(p.named_port("http", Protocol::Tcp), Some(8080));
        assert_eq!(p.ports[1].protocol, Protocol::Udp);
        assert!(!p.uid.is_empty());
        let pol = &st.policies[&key(&ns_name, "allow-web")];
        assert!(pol.ingress_isolation && pol.egress_isolation);
        assert_eq!(pol.ingress[0].ports[0].port, Some(PortRef::Name("http".into())));
        assert_eq!(pol.ingress[0].ports[0].protocol, Protocol::Tcp);
        assert_eq!(
            pol.egress[0].peers[0],
            Peer::IpBlock {
                cidr: "10.0.0.0/8".parse().expect("cidr"),
                except: vec!["10.1.0.0/16".parse().expect("cidr")]
            }
        );

        // Status updates (as kubelet would make them).
        let ps = PatchParams::default();
        pods.patch_status("web", &ps, &Patch::Merge(json!({"status": {"podIP": "10.244.7.9"}})))
            .await
            .expect("pod status");
        nodes
            .patch_status(
                &node_name,
                &ps,
                &Patch::Merge(json!({"status": {"addresses": [{"type": "InternalIP", "address": "192.168.77.3"}]}})),
            )
            .await
            .expect("node status");
        wait_for(&mut rx, "pod IP and node InternalIP", 20, |s| {
            s.pods[&key(&ns_name, "web")].ip == Some("10.244.7.9".parse().expect("ip"))
                && s.nodes[&node_name].internal_ip == Some("192.168.77.3".parse().expect("ip"))
        })
        .await;

        // A Service and its Endpoints (the proxy's objects; the source
        // watches them because it was started for the proxy).
        let svcs: Api<core::Service> = Api::namespaced(client.clone(), &ns_name);
        let eps: Api<core::Endpoints> = Api::namespaced(client.clone(), &ns_name);
        let svc: core::Service = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"},
                     "sessionAffinity": "ClientIP",
                     "ports": [{"name": "http", "port": 80, "targetPort": "http"},
                               {"name": "dns", "port": 53, "protocol": "UDP"}]}
        }))
        .expect("service");
        svcs.create(&pp, &svc).await.expect("create service");
        let ep: core::Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "subsets": [{"addresses": [{"ip": "10.244.7.9", "nodeName": node_name}],
                         "notReadyAddresses": [{"ip": "10.244.7.10"}],
                         "ports": [{"name": "http", "port": 8080},
                                   {"name": "dns", "port": 53, "protocol": "UDP"}]}]
        }))
        .expect("endpoints");
        eps.create(&pp, &ep).await.expect("create endpoints");
        let st = wait_for(&mut rx, "Service and Endpoints", 20, |s| {
            s.services.contains_key(&key(&ns_name, "web"))
                && s.endpoints.contains_key(&key(&ns_name, "web"))
        })
        .await;
        let s = &st.services[&key(&ns_name, "web")];
        assert!(s.cluster_ip.is_some(), "the API server allocated a ClusterIP");
        assert_eq!(s.affinity_timeout, Some(10_800));
        assert_eq!((s.ports[1].port, s.ports[1].protocol), (53, Protocol::Udp));
        let e = st.service_endpoints(&key(&ns_name, "web"));
        assert_eq!(e.len(), 2);
        assert!(e[0].ready && !e[1].ready, "{e:?}");
        assert_eq!(e[0].node_name.as_deref(), Some(node_name.as_str()));
        assert_eq!(e[0].ports[0].port, 53);
        assert_eq!(e[0].ports[1].port, 8080);

        // Relabel the pod and the namespace.
        pods.patch("web", &ps, &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})))
            .await
            .expect("relabel pod");
        nss.patch(&ns_name, &ps, &Patch::Merge(json!({"metadata": {"labels": {"team": "b"}}})))
            .await
            .expect("relabel namespace");
        wait_for(&mut rx, "relabels", 20, |s| {
            s.pods[&key(&ns_name, "web")].labels.get("app").map(String::as_str) == Some("db")
                && s.namespace_labels(&ns_name).get("team").map(String::as_str) == Some("b")
        })
        .await;
    });

    // The API server goes away and comes back: the watchers reconnect.
    let argv = cluster.kill_apiserver();
    eprintln!("apiserver stopped; restarting");
    // Let the source notice the outage.
    std::thread::sleep(Duration::from_secs(2));
    cluster.start_apiserver(&argv);

    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        while nss.get("default").await.is_err() {
            assert!(Instant::now() < deadline, "apiserver did not come back");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        pods.delete("web", &now).await.expect("delete pod");
        nps.delete("allow-web", &now).await.expect("delete policy");
        nodes.delete(&node_name, &now).await.expect("delete node");
        let st = wait_for(&mut rx, "deletes after the restart", 60, |s| {
            !s.pods.contains_key(&key(&ns_name, "web"))
                && !s.policies.contains_key(&key(&ns_name, "allow-web"))
                && !s.nodes.contains_key(&node_name)
        })
        .await;
        // Everything else is still there.
        assert!(st.namespaces.contains_key(&ns_name) && st.namespaces.contains_key("default"));

        // Namespaces cannot go without the controller-manager: best effort.
        let _ = nss.delete(&ns_name, &DeleteParams::default()).await;
    });
    drop(rx);
    let r = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), source).await })
        .expect("source ends when the receiver is gone")
        .expect("task");
    r.expect("source result");
}
