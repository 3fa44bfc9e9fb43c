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

use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use oxvs_agent::model::{ClusterState, Peer, PortRef, Protocol};
use oxvs_agent::source::{kube_client, watch_kube};
use serde_json::json;
use tokio::sync::watch;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tools_dir() -> Option<PathBuf> {
    [
        std::env::var_os("OXVS_SHARED_TOOLS").map(PathBuf::from),
        Some(workspace_root().join("../shared/tools")),
        Some(PathBuf::from("/work/shared/tools")),
    ]
    .into_iter()
    .flatten()
    .find(|d| d.join("k8s-local.sh").exists())
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

/// Why the test cannot run here, if it cannot.
fn prerequisites() -> Result<PathBuf, String> {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    if uid != 0 {
        return Err("not root".into());
    }
    let tools = tools_dir().ok_or("k8s-local.sh not found (set OXVS_SHARED_TOOLS)")?;
    let cache = std::env::var_os("OXVS_K8S_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/oxvs-k8s"));
    if !cache.join("bin/kube-apiserver").is_file() {
        return Err(format!(
            "no cached Kubernetes build in {} (run k8s-local.sh build)",
            cache.display()
        ));
    }
    if !on_path("etcd") {
        return Err("etcd not installed (run k8s-local.sh build)".into());
    }
    if !on_path("kubectl") && !cache.join("bin/kubectl").is_file() {
        return Err("no kubectl".into());
    }
    Ok(tools)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A private etcd + apiserver; `down --purge` on drop.
struct Cluster {
    tools: PathBuf,
    run_dir: PathBuf,
    env: Vec<(&'static str, String)>,
    /// The apiserver this test restarted itself (stopped by us on drop).
    restarted: Option<Child>,
}

impl Cluster {
    fn up(tools: PathBuf) -> Cluster {
        let run_dir = std::env::temp_dir().join(format!("oxvs-source-kube-{}", std::process::id()));
        let env = vec![
            ("OXVS_K8S_ETCD_PORT", free_port().to_string()),
            ("OXVS_K8S_ETCD_PEER_PORT", free_port().to_string()),
            ("OXVS_K8S_API_PORT", free_port().to_string()),
            ("OXVS_K8S_CONTROLLERS", "0".to_string()),
        ];
        let c = Cluster {
            tools,
            run_dir,
            env,
            restarted: None,
        };
        let out = c.script(&["up"]).output().expect("run k8s-local.sh up");
        assert!(
            out.status.success(),
            "k8s-local.sh up failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.tools.join("k8s-local.sh"));
        cmd.args(args).arg("--run-dir").arg(&self.run_dir);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    fn kubeconfig(&self) -> PathBuf {
        self.run_dir.join("admin.kubeconfig")
    }

    /// Stops the apiserver (recorded by the script) and starts it again
    /// with the same command line, recording the new pid for `down`.
    fn restart_apiserver(&mut self) {
        let pid_file = self.run_dir.join("pids/kube-apiserver");
        let rec = std::fs::read_to_string(&pid_file).expect("apiserver pid file");
        let mut it = rec.split_whitespace();
        let pid: i32 = it.next().and_then(|p| p.parse().ok()).expect("pid");
        let start = it.next().expect("start time").to_string();
        assert_eq!(
            starttime(pid).as_deref(),
            Some(start.as_str()),
            "recorded apiserver not running"
        );
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        // Abruptly (a graceful 1.20 shutdown waits on open watches).
        assert!(signal(pid as u32, "KILL"), "kill apiserver {pid}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while starttime(pid).as_deref() == Some(start.as_str()) {
            assert!(Instant::now() < deadline, "apiserver did not stop");
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("apiserver {pid} stopped; restarting");
        // Let the source notice the outage.
        std::thread::sleep(Duration::from_secs(2));
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.run_dir.join("logs/kube-apiserver.log"))
            .expect("log");
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("restart apiserver");
        let new_pid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(200));
        let st = starttime(new_pid).expect("restarted apiserver running");
        std::fs::write(&pid_file, format!("{new_pid} {st}\n")).expect("pid file");
        self.restarted = Some(child);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.restarted.take() {
            signal(c.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(self.run_dir.join("logs/kube-apiserver.log")) {
                let tail: Vec<_> = log.lines().rev().take(30).collect();
                eprintln!("--- kube-apiserver.log (tail) ---");
                for l in tail.iter().rev() {
                    eprintln!("{l}");
                }
            }
        }
        match self.script(&["down", "--purge"]).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "k8s-local.sh down failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("k8s-local.sh down: {e}"),
        }
    }
}

/// Sends signal `sig` to `pid` (a process this test started or recorded).
fn signal(pid: u32, sig: &str) -> bool {
    Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// Field 22 of /proc/PID/stat (start time), as the scripts record it.
fn starttime(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let st = rest.split_whitespace().nth(19)?.to_string();
    // A zombie is gone for our purposes.
    (rest.split_whitespace().next()? != "Z").then_some(st)
}

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
            println!("SKIPPED: {why}");
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
    let source = rt.spawn(watch_kube(client.clone(), tx));

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
    cluster.restart_apiserver();

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
