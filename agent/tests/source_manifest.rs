//! The manifest directory source against a real temporary directory:
//! one-shot loading (multi-document YAML, `List`, JSON, duplicates, invalid
//! objects) and the watcher (initial snapshot, change detection, a
//! half-written file keeps its last good objects, deleting a file).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oxvs_agent::model::{ClusterState, Protocol};
use oxvs_agent::source::{load_manifest_dir, watch_manifest_dir};
use tokio::sync::watch;

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write manifest");
}

const NS_AND_PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shop
  labels: {team: a}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  nodeName: n1
  containers:
  - name: c
    ports: [{containerPort: 8080, name: http}]
status: {podIP: 10.10.1.5}
---
apiVersion: v1
kind: Pod
metadata: {name: lonely}
spec: {containers: [{name: c}]}
"#;

const POLICY_LIST: &str = r#"
apiVersion: v1
kind: List
items:
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: allow-web, namespace: shop}
  spec:
    podSelector: {matchLabels: {app: web}}
    ingress:
    - from: [{namespaceSelector: {matchLabels: {team: a}}}]
      ports: [{port: http}]
    egress:
    - to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]
      ports: [{port: 53, protocol: UDP}, {port: 1000, endPort: 2000}]
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: deny, namespace: shop}
  spec:
    ingress:
    - from: [{podSelector: {}}, {ipBlock: {cidr: 10.0.0/8}}]
- apiVersion: v1
  kind: Service
  metadata: {name: ignored}
"#;

const NODES_JSON: &str = r#"{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
 "spec": {"podCIDR": "10.10.1.0/24"},
 "status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.11"}]}}
{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}, "spec": {"podCIDR": "10.10.2.0/24"}}"#;

#[test]
fn load_multi_doc_list_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "10-pods.yaml", NS_AND_PODS);
    write(dir.path(), "20-policies.yml", POLICY_LIST);
    write(dir.path(), "30-nodes.json", NODES_JSON);
    write(dir.path(), "README.md", "kind: Pod\n");
    write(
        dir.path(),
        ".hidden.yaml",
        "kind: Namespace\nmetadata: {name: hidden}\n",
    );
    let (st, warnings) = load_manifest_dir(dir.path()).expect("load");

    assert_eq!(st.namespaces.keys().collect::<Vec<_>>(), ["shop"]);
    assert_eq!(
        st.namespace_labels("shop").get("team").map(String::as_str),
        Some("a")
    );
    let web = &st.pods[&("shop".to_string(), "web".to_string())];
    assert_eq!(web.ip, Some("10.10.1.5".parse().expect("ip")));
    assert_eq!(web.named_port("http", Protocol::Tcp), Some(8080));
    assert!(st
        .pods
        .contains_key(&("default".to_string(), "lonely".to_string())));
    assert_eq!(st.nodes.len(), 2);
    assert_eq!(
        st.nodes["n1"].internal_ip,
        Some("192.168.56.11".parse().expect("ip"))
    );
    assert_eq!(
        st.nodes["n2"].pod_cidr,
        Some("10.10.2.0/24".parse().expect("cidr"))
    );

    // The valid policy is in, with defaults; the invalid one is out and named.
    assert_eq!(st.policies.len(), 1, "{:?}", st.policies.keys());
    let p = &st.policies[&("shop".to_string(), "allow-web".to_string())];
    assert!(p.ingress_isolation && p.egress_isolation);
    assert_eq!(p.egress[0].ports[1].protocol, Protocol::Tcp);
    assert_eq!(p.egress[0].ports[1].end_port, Some(2000));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0],
        r#"20-policies.yml: document 1 item 2: NetworkPolicy shop/deny: spec.ingress[0].from[1].ipBlock.cidr: invalid CIDR "10.0.0/8""#
    );
}

#[test]
fn load_duplicates_last_file_wins_and_broken_files_warn() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(
        dir.path(),
        "a.yaml",
        "kind: Namespace\nmetadata: {name: x, labels: {v: a}}\n",
    );
    write(
        dir.path(),
        "b.yaml",
        "kind: Namespace\nmetadata: {name: x, labels: {v: b}}\n",
    );
    write(
        dir.path(),
        "c.yaml",
        "kind: Namespace\nmetadata: {name: y\n",
    );
    let (st, warnings) = load_manifest_dir(dir.path()).expect("load");
    assert_eq!(
        st.namespace_labels("x").get("v").map(String::as_str),
        Some("b")
    );
    assert!(!st.namespaces.contains_key("y"));
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings.iter().any(|w| w.starts_with("c.yaml: ")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w == "Namespace x is defined in a.yaml and in b.yaml: b.yaml wins"),
        "{warnings:?}"
    );
    assert!(load_manifest_dir(&dir.path().join("missing")).is_err());
}

/// Waits until the latest snapshot satisfies `f`.
async fn wait_for(
    rx: &mut watch::Receiver<Arc<ClusterState>>,
    what: &str,
    f: impl Fn(&ClusterState) -> bool,
) -> Arc<ClusterState> {
    let r = tokio::time::timeout(Duration::from_secs(5), async {
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
            "timed out waiting for {what}; last snapshot: {:?}",
            rx.borrow()
        ),
    }
}

#[tokio::test]
async fn watch_changes_half_written_and_delete() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "10-pods.yaml", NS_AND_PODS);
    write(dir.path(), "20-policies.yaml", POLICY_LIST);
    let (tx, mut rx) = watch::channel(Arc::new(ClusterState::default()));
    let task = tokio::spawn(watch_manifest_dir(dir.path().to_path_buf(), tx));

    let st = wait_for(&mut rx, "initial snapshot", |s| !s.pods.is_empty()).await;
    assert_eq!(st.pods.len(), 2);
    assert_eq!(st.policies.len(), 1);

    // Relabel a pod: the change is picked up.
    write(
        dir.path(),
        "10-pods.yaml",
        &NS_AND_PODS.replace("app: web", "app: db"),
    );
    wait_for(&mut rx, "relabel", |s| {
        s.pods[&("shop".to_string(), "web".to_string())]
            .labels
            .get("app")
            .map(String::as_str)
            == Some("db")
    })
    .await;

    // A new file appears.
    write(dir.path(), "30-nodes.json", NODES_JSON);
    wait_for(&mut rx, "nodes", |s| s.nodes.len() == 2).await;

    // Half-written file: its last good objects stay; no snapshot drops them.
    let half = &POLICY_LIST[..POLICY_LIST.find("- from").expect("marker")];
    let half = format!("{half}    - from: [{{namespaceSelector: {{matchLabels: {{team: a");
    write(dir.path(), "20-policies.yaml", &half);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        rx.borrow().policies.len(),
        1,
        "half-written file dropped its objects"
    );
    // A new file that never parsed contributes nothing, and breaks nothing.
    write(
        dir.path(),
        "40-broken.yaml",
        "kind: Pod\nmetadata: {name: [\n",
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    {
        let st = rx.borrow();
        assert_eq!(
            (st.pods.len(), st.policies.len(), st.nodes.len()),
            (2, 1, 2)
        );
    }

    // The file is completed with a change: the new version is used.
    write(
        dir.path(),
        "20-policies.yaml",
        &POLICY_LIST.replace("allow-web", "allow-web2"),
    );
    wait_for(&mut rx, "completed file", |s| {
        s.policies
            .contains_key(&("shop".to_string(), "allow-web2".to_string()))
            && s.policies.len() == 1
    })
    .await;

    // Deleting a file removes its objects.
    std::fs::remove_file(dir.path().join("10-pods.yaml")).expect("rm");
    let st = wait_for(&mut rx, "delete", |s| s.pods.is_empty()).await;
    assert!(st.namespaces.is_empty());
    assert_eq!(st.nodes.len(), 2);

    // A snapshot is only published on change: touching with equal content
    // publishes nothing.
    let before = rx.borrow_and_update().clone();
    write(dir.path(), "30-nodes.json", NODES_JSON);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !rx.has_changed().expect("running"),
        "unchanged content republished"
    );
    assert_eq!(*rx.borrow(), before);

    // Dropping the receiver ends the source.
    drop(rx);
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("source ends when the receiver is gone")
        .expect("task")
        .expect("source result");
}

#[tokio::test]
async fn watch_missing_dir_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (tx, _rx) = watch::channel(Arc::new(ClusterState::default()));
    assert!(watch_manifest_dir(dir.path().join("nope"), tx)
        .await
        .is_err());
}
