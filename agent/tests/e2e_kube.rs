//! End-to-end against a real Kubernetes API: the real `oxvs-agent`
//! (`--kubeconfig`) and `oxvs-switchd` in a node namespace, a real
//! kube-apiserver 1.20 (etcd + apiserver from `shared/tools/k8s-local.sh`,
//! no kubelet), and pods attached with the real `oxvs-cni`.
//!
//! The test plays kubelet and the container runtime: it creates Node `n1`
//! (`spec.podCIDR` 10.233.1.0/24, an InternalIP status) and the Pod
//! objects through the API, attaches each pod with `oxvs-cni` (CNI_ARGS
//! `K8S_POD_NAMESPACE=..;K8S_POD_NAME=..`) into a namespace it makes, and
//! patches the pod's `status.podIP`. Reachability is real: a python3 TCP
//! server on port 80 in the server pod, connection attempts and pings
//! from the client pods.
//!
//! Cluster: namespace X (pods `srv` app=srv serving port 80 "http", and
//! `cli` app=cli) and namespace Y (pod `cli2` app=cli2, also serving port
//! 80). Checks, in order (each a real traffic or flow assertion preceded by
//! the opposite state, so it fails if the agent does not follow the API):
//! 1. No policy: cli and cli2 reach srv, cli reaches cli2 (TCP, ping); no
//!    policy flows at all.
//! 2. Deny-all ingress in X: within 2 s srv is unreachable (TCP, ping), and
//!    table IngressDefaultRule holds a drop for srv's address with an
//!    isolation cookie (`0x5...`).
//! 3. Allow ingress to srv from pods `role=client` on port "http": cli
//!    stays blocked until its labels are patched (then TCP passes within
//!    2 s, ICMP still not, and an IngressRule flow matches cli's address);
//!    allow from namespaces `team=blue`: cli2 passes once Y is labelled,
//!    and is blocked again when the label is removed.
//! 6. The apiserver is killed (SIGKILL): the agent notices (its watches
//!    retry), keeps its flows (identical dump) and traffic as it was;
//!    monitors in cli and cli2 connect to srv every 100 ms from before the
//!    kill until after the re-list: no allowed connection fails, no denied
//!    one passes. The apiserver is restarted with the same command line; a
//!    policy created then (deny-all ingress in Y) takes effect (cli can no
//!    longer reach cli2), and later changes are prompt again (allow cli2
//!    into srv within 2 s).
//! 5. Pod `cli` deleted through the API: within 2 s the policy flows that
//!    matched it as a peer (`nw_src=CLI`) are gone and cli is blocked; CNI
//!    DEL then leaves no flow naming its address.
//! 4. All policies deleted: within 2 s no policy flow (cookie feature 4 or
//!    5) is left, srv reaches cli2 and cli2 reaches srv again (TCP, ping).
//!
//! The agent runs in the node namespace, the apiserver on the host's
//! loopback: [`kube_support::ApiProxy`] forwards the apiserver's port into
//! the node namespace, so the kubeconfig is used unchanged.
//!
//! Skips (prints SKIPPED, passes) unless root, AF_XDP and the tools of the
//! switch harness, and `k8s-local.sh` with its cached build, `etcd` and
//! `kubectl` (see `kube_support::prerequisites`). Needs the binaries:
//! `cargo build -p oxvs-agent -p oxvs-switch -p oxvs-cni -p oxvsctl`, then
//! `cargo test -p oxvs-agent --test e2e_kube -- --nocapture`.
//! Everything (namespaces, processes, the apiserver's run dir) is removed
//! by guards, also on failure.

#[path = "../../switch/tests/common/mod.rs"]
mod common;
mod kube_support;
mod node;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{ping, ping_until_up, unique, workspace_bin, Bg, Netns, Switchd};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as net;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_support::{ApiProxy, Cluster};
use node::{run_plugin, CniOut, GW};
use oxvs_agent::cookie::Feature;
use serde_json::{json, Value};

const NODE: &str = "n1";
const POD_CIDR: &str = "10.233.1.0/24";
const GATEWAY_CIDR: &str = "10.233.1.1/24";
const NODE_IP: &str = "192.0.2.11";
/// How fast a change made through the API must show in the datapath.
const PROMPT: f64 = 2.0;

/// A persistent TCP server: answers every connection with "ok\n".
const SERVER: &str = r#"
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(64)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    try:
        c.sendall(b"ok\n")
    except OSError:
        pass
    c.close()
"#;

/// Connects to ADDR:PORT every 50 ms (each attempt with a PER s timeout,
/// a new connection each time) until the outcome (got "ok") equals WANT
/// or SECS passed. Prints "elapsed attempts"; exit 0 iff WANT was seen.
const PROBE: &str = r#"
import socket, sys, time
ip, port, want, secs, per = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4]), float(sys.argv[5])
t0 = time.time(); n = 0
while True:
    n += 1; ok = False
    try:
        c = socket.create_connection((ip, port), timeout=per); c.settimeout(per)
        ok = c.recv(3) == b"ok\n"; c.close()
    except OSError:
        pass
    el = time.time() - t0
    if ok == want:
        print("%.3f %d" % (el, n)); sys.exit(0)
    if el > secs:
        print("%.3f %d" % (el, n)); sys.exit(1)
    time.sleep(0.05)
"#;

/// Connects to ADDR:PORT every 100 ms (0.5 s timeout each, a new
/// connection each time) until file STOP exists (or 120 s passed); prints
/// "ok N fail M" (counts of attempts that got "ok\n" and that did not).
const MONITOR: &str = r#"
import os, socket, sys, time
ip, port, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ok = fail = 0; t0 = time.time()
print("started", flush=True)
while not os.path.exists(stop) and time.time() - t0 < 120:
    try:
        c = socket.create_connection((ip, port), timeout=0.5); c.settimeout(0.5)
        if c.recv(3) == b"ok\n": ok += 1
        else: fail += 1
        c.close()
    except OSError:
        fail += 1
    time.sleep(0.1)
print("ok %d fail %d" % (ok, fail), flush=True)
"#;

/// A [`MONITOR`] running in a pod.
struct Monitor {
    proc: Bg,
    stop: PathBuf,
}

impl Monitor {
    fn start(from: &KPod, ip: &str) -> Monitor {
        let stop = std::env::temp_dir().join(unique("monitor-stop"));
        let stop_s = stop.to_string_lossy().into_owned();
        let mut proc = from
            .ns
            .spawn(&["python3", "-c", MONITOR, ip, "80", &stop_s]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !proc.stdout_text().contains("started") {
            assert!(
                Instant::now() < deadline && proc.running(),
                "monitor did not start: {}",
                proc.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Monitor { proc, stop }
    }

    /// Stops it: (successful, failed) attempts.
    fn finish(mut self) -> (u64, u64) {
        std::fs::write(&self.stop, b"").expect("stop file");
        let (_, out, err) = self.proc.wait(Duration::from_secs(5));
        let _ = std::fs::remove_file(&self.stop);
        let n: Vec<u64> = out
            .lines()
            .last()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        match n[..] {
            [ok, fail] => (ok, fail),
            _ => panic!("monitor output: {out}{err}"),
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.stop);
    }
}

/// The node: switchd (gateway `oxgw0`) and the agent reading the API.
struct KubeNode {
    agent: Option<Bg>,
    proxy: Option<ApiProxy>,
    sw: Switchd,
    dir: PathBuf,
    // Dropped last: takes the processes and links with it.
    ns: Netns,
}

impl KubeNode {
    fn start(kubeconfig: &Path, api_port: u16) -> KubeNode {
        let ns = Netns::new("n1");
        // The InternalIP: the agent's VXLAN port binds to it (a veth
        // pair inside the node: no dummy module on every kernel).
        ns.must(&[
            "ip", "link", "add", "ul0", "type", "veth", "peer", "name", "ul0p",
        ]);
        ns.must(&["ip", "addr", "add", &format!("{NODE_IP}/24"), "dev", "ul0"]);
        ns.must(&["ip", "link", "set", "ul0p", "up"]);
        ns.must(&["ip", "link", "set", "ul0", "up"]);
        let dir = std::env::temp_dir().join(unique("kagent"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let proxy = ApiProxy::start(&ns.name, api_port);
        let sw = Switchd::start_with(&ns, &["--gateway", GW]);
        let mut node = KubeNode {
            agent: None,
            proxy: Some(proxy),
            sw,
            dir,
            ns,
        };
        let bin = workspace_bin("oxvs-agent").to_string_lossy().into_owned();
        let p = |f: &str| node.dir.join(f).to_string_lossy().into_owned();
        let (cni, api, state) = (p("cni.sock"), p("api.sock"), p("state"));
        let sw_sock = node.sw.sock.to_string_lossy().into_owned();
        let kc = kubeconfig.to_string_lossy().into_owned();
        node.agent = Some(Bg::spawn(
            Some(&node.ns.name),
            &[
                &bin,
                "--node-name",
                NODE,
                "--kubeconfig",
                &kc,
                "--cni-socket",
                &cni,
                "--switchd-socket",
                &sw_sock,
                "--state-dir",
                &state,
                "--gateway",
                GW,
                "--api-socket",
                &api,
                "--mtu",
                "1450",
                "--resync-interval",
                "1",
                "--no-masquerade",
                "--log-level",
                "oxvs_agent=debug,info",
            ],
        ));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = node.cni("STATUS", "", "", "", "");
            if st.ok {
                return node;
            }
            let a = node.agent.as_mut().expect("just started");
            assert!(a.running(), "oxvs-agent exited:\n{}", a.stderr_text());
            assert!(
                Instant::now() < deadline,
                "agent not ready within 30 s: {st:?}\n{}",
                a.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cni_socket(&self) -> String {
        self.dir.join("cni.sock").to_string_lossy().into_owned()
    }

    fn cni(&self, verb: &str, cid: &str, netns: &str, ifname: &str, args: &str) -> CniOut {
        // STATUS exists since CNI 1.1.0.
        let version = if verb == "STATUS" { "1.1.0" } else { "1.0.0" };
        let config = json!({"cniVersion": version, "name": "oxvs-kube", "type": "oxvs",
                            "agentSocket": self.cni_socket()});
        run_plugin(
            &self.ns.name,
            &workspace_bin("oxvs-cni").to_string_lossy(),
            &[
                ("CNI_COMMAND", verb),
                ("CNI_CONTAINERID", cid),
                ("CNI_NETNS", netns),
                ("CNI_IFNAME", ifname),
                ("CNI_ARGS", args),
                ("CNI_PATH", "/usr/lib/cni"),
            ],
            &config,
        )
    }

    fn agent_log(&self) -> String {
        self.agent
            .as_ref()
            .map(|a| a.stderr_text())
            .unwrap_or_default()
    }

    fn agent_running(&mut self) -> bool {
        self.agent.as_mut().is_some_and(Bg::running)
    }

    /// Every flow, without counters (cookies stay).
    fn flows(&self) -> String {
        self.sw.ctl_ok(&["dump-flows", "--names", "--no-stats"])
    }

    /// `dump-flows --names --table TABLE` (with cookies and counters).
    fn table(&self, table: &str) -> String {
        self.sw.ctl_ok(&["dump-flows", "--names", "--table", table])
    }

    /// The policy flows (the three ingress and three egress tables).
    fn policy_tables(&self) -> String {
        [
            "EgressRule",
            "EgressDefaultRule",
            "EgressMetric",
            "IngressRule",
            "IngressDefaultRule",
            "IngressMetric",
        ]
        .iter()
        .map(|t| self.table(t))
        .collect()
    }

    /// Attaches pod NAMESPACE/NAME as a runtime does (ADD from the node).
    fn attach(&self, namespace: &str, name: &str) -> KPod {
        let ns = Netns::new(name);
        let cid = format!("{}-c0", ns.name);
        let path = format!("/var/run/netns/{}", ns.name);
        let out = self.cni(
            "ADD",
            &cid,
            &path,
            "eth0",
            &format!("K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name}"),
        );
        assert!(
            out.ok,
            "ADD {namespace}/{name} failed: {out:?}\n--- agent ---\n{}",
            self.agent_log()
        );
        let ip = out.json["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .expect("ADD result has an address")
            .to_string();
        KPod {
            name: format!("{namespace}/{name}"),
            cid,
            ip,
            ns,
        }
    }

    fn detach(&self, pod: &KPod) {
        let path = format!("/var/run/netns/{}", pod.ns.name);
        let out = self.cni("DEL", &pod.cid, &path, "eth0", "");
        assert!(out.ok, "DEL {} failed: {out:?}", pod.name);
    }

    /// Probes TCP `to:80` from `from` until reachability is `want` (at
    /// most `secs`); returns the seconds it took. Panics (with the policy
    /// tables and the agent's log tail) if it never is.
    fn wait_tcp(&self, from: &KPod, to: &KPod, want: bool, secs: f64, what: &str) -> f64 {
        let (ok, out) = probe(from, &to.ip, want, secs, if want { 0.5 } else { 0.3 });
        if !ok {
            panic!(
                "{what}: {} -> {}:80 did not become {} within {secs} s (probe: {out})\n--- policy tables ---\n{}\n--- agent log (tail) ---\n{}",
                from.name,
                to.name,
                if want { "reachable" } else { "unreachable" },
                self.policy_tables(),
                tail(&self.agent_log(), 40),
            );
        }
        let t: f64 = out
            .split_whitespace()
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or(0.0);
        eprintln!(
            "  {what}: {} -> {} {} after {t:.2} s",
            from.name,
            to.name,
            if want { "reachable" } else { "unreachable" }
        );
        t
    }

    /// One connection attempt (1 s) must give `want`.
    fn check_tcp(&self, from: &KPod, to: &KPod, want: bool, what: &str) {
        let (ok, out) = probe(from, &to.ip, true, 0.0, 1.0);
        assert_eq!(
            ok,
            want,
            "{what}: {} -> {}:80 reachable={ok} (probe: {out})\n--- policy tables ---\n{}",
            from.name,
            to.name,
            self.policy_tables()
        );
    }

    /// Waits (up to `secs`) until `cond` holds for the flow dump.
    fn wait_flows(&self, secs: f64, what: &str, cond: impl Fn(&str) -> bool) -> f64 {
        let t0 = Instant::now();
        loop {
            let f = self.flows();
            if cond(&f) {
                let t = t0.elapsed().as_secs_f64();
                eprintln!("  {what}: after {t:.2} s");
                return t;
            }
            if t0.elapsed().as_secs_f64() > secs {
                panic!("{what}: not within {secs} s\n--- flows ---\n{f}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("OXVS_TEST_LOGS").is_some() {
            eprintln!(
                "--- oxvs-agent log (tail) ---\n{}",
                tail(&self.agent_log(), 80)
            );
        }
        if let Some(mut a) = self.agent.take() {
            a.terminate(Duration::from_secs(5));
        }
        self.proxy = None;
        self.sw.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A pod the test attached.
struct KPod {
    /// `namespace/name`, for messages.
    name: String,
    cid: String,
    ip: String,
    ns: Netns,
}

fn tail(text: &str, n: usize) -> String {
    let l: Vec<&str> = text.lines().collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

/// Runs [`PROBE`] in `from`: (whether `want` was seen, its output).
fn probe(from: &KPod, ip: &str, want: bool, secs: f64, per: f64) -> (bool, String) {
    let out = from.ns.exec(&[
        "python3",
        "-c",
        PROBE,
        ip,
        "80",
        if want { "1" } else { "0" },
        &secs.to_string(),
        &per.to_string(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string()
        + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// The feature of a dump line's cookie.
fn feature(line: &str) -> Option<Feature> {
    let i = line.find("cookie=0x")? + "cookie=0x".len();
    let hex: String = line[i..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    u64::from_str_radix(&hex, 16).ok().and_then(Feature::of)
}

/// Dump lines of NetworkPolicy flows (rules and isolation).
fn policy_lines(dump: &str) -> Vec<&str> {
    dump.lines()
        .filter(|l| matches!(feature(l), Some(Feature::PolicyRule | Feature::Isolation)))
        .collect()
}

/// Whether `text` names address `ip` (not merely a longer one).
fn mentions(text: &str, ip: &str) -> bool {
    text.match_indices(ip).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + ip.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_digit() || c == '.')
            && !after.is_some_and(|c| c.is_ascii_digit())
    })
}

/// The test's Kubernetes client (blocking wrappers).
struct K8s {
    rt: tokio::runtime::Runtime,
    client: Client,
}

impl K8s {
    fn new(kubeconfig: PathBuf) -> K8s {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let client = rt
            .block_on(oxvs_agent::source::kube_client(Some(kubeconfig)))
            .expect("client from the kubeconfig");
        K8s { rt, client }
    }

    fn pods(&self, ns: &str) -> Api<core::Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn policies(&self, ns: &str) -> Api<net::NetworkPolicy> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn namespaces(&self) -> Api<core::Namespace> {
        Api::all(self.client.clone())
    }

    /// A namespace (and its ServiceAccount `default`: no controller-manager
    /// makes it, and pod admission needs it).
    fn create_namespace(&self, name: &str, labels: Value) {
        let ns: core::Namespace =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))
                .expect("namespace");
        let sa: core::ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("sa");
        self.rt.block_on(async {
            self.namespaces()
                .create(&PostParams::default(), &ns)
                .await
                .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
            Api::<core::ServiceAccount>::namespaced(self.client.clone(), name)
                .create(&PostParams::default(), &sa)
                .await
                .unwrap_or_else(|e| panic!("create service account in {name}: {e}"));
        });
    }

    fn patch_namespace(&self, name: &str, patch: Value) {
        self.rt
            .block_on(
                self.namespaces()
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
            )
            .unwrap_or_else(|e| panic!("patch namespace {name}: {e}"));
    }

    /// Node `n1` with its pod CIDR and (status) InternalIP.
    fn create_node(&self) {
        let nodes: Api<core::Node> = Api::all(self.client.clone());
        let node: core::Node = serde_json::from_value(json!({
            "metadata": {"name": NODE},
            "spec": {"podCIDR": POD_CIDR}
        }))
        .expect("node");
        self.rt.block_on(async {
            nodes
                .create(&PostParams::default(), &node)
                .await
                .expect("create node");
            nodes
                .patch_status(
                    NODE,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"addresses": [
                        {"type": "InternalIP", "address": NODE_IP}]}})),
                )
                .await
                .expect("node status");
        });
    }

    fn create_pod(&self, ns: &str, name: &str, labels: Value, ports: Value) {
        let pod: core::Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "nodeName": NODE,
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "localhost/busybox:latest",
                                "imagePullPolicy": "Never", "ports": ports}]
            }
        }))
        .expect("pod");
        self.rt
            .block_on(self.pods(ns).create(&PostParams::default(), &pod))
            .unwrap_or_else(|e| panic!("create pod {ns}/{name}: {e}"));
    }

    /// What kubelet writes once the sandbox has its address.
    fn pod_running(&self, ns: &str, name: &str, ip: &str) {
        self.rt
            .block_on(self.pods(ns).patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Running", "podIP": ip,
                                                "podIPs": [{"ip": ip}]}})),
            ))
            .unwrap_or_else(|e| panic!("pod status {ns}/{name}: {e}"));
    }

    fn patch_pod(&self, ns: &str, name: &str, patch: Value) {
        self.rt
            .block_on(
                self.pods(ns)
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
            )
            .unwrap_or_else(|e| panic!("patch pod {ns}/{name}: {e}"));
    }

    fn delete_pod(&self, ns: &str, name: &str) {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        self.rt
            .block_on(self.pods(ns).delete(name, &now))
            .unwrap_or_else(|e| panic!("delete pod {ns}/{name}: {e}"));
    }

    fn create_policy(&self, ns: &str, name: &str, spec: Value) {
        let np: net::NetworkPolicy =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))
                .expect("policy");
        self.rt
            .block_on(self.policies(ns).create(&PostParams::default(), &np))
            .unwrap_or_else(|e| panic!("create policy {ns}/{name}: {e}"));
    }

    fn delete_policy(&self, ns: &str, name: &str) {
        self.rt
            .block_on(self.policies(ns).delete(name, &DeleteParams::default()))
            .unwrap_or_else(|e| panic!("delete policy {ns}/{name}: {e}"));
    }

    /// Waits until the apiserver answers again.
    fn wait_api(&self, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while self.rt.block_on(self.namespaces().get("default")).is_err() {
            assert!(Instant::now() < deadline, "apiserver did not come back");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[test]
fn agent_follows_the_kubernetes_api() {
    let tools = match kube_support::prerequisites() {
        Ok(t) => t,
        Err(why) => {
            oxvs_testutil::skip_or_fail(why);
            return;
        }
    };
    if let Some(why) = common::skip_reason() {
        oxvs_testutil::skip_or_fail(why);
        return;
    }
    let t_start = Instant::now();
    let mut cluster = Cluster::up(tools);
    eprintln!(
        "apiserver up after {:.1} s",
        t_start.elapsed().as_secs_f64()
    );
    let k = K8s::new(cluster.kubeconfig());
    let tag = std::process::id();
    let (x, y) = (format!("oxk-x-{tag}"), format!("oxk-y-{tag}"));
    k.create_namespace(&x, json!({"oxk": "x"}));
    k.create_namespace(&y, json!({"oxk": "y"}));
    k.create_node();

    // The node: its pod CIDR comes from the Node object (no --pod-cidr).
    let mut node = KubeNode::start(&cluster.kubeconfig(), cluster.api_port);
    let gw = node.ns.must(&["ip", "-4", "-o", "addr", "show", GW]);
    assert!(
        gw.contains(GATEWAY_CIDR),
        "gateway address from the Node's podCIDR: {gw}"
    );
    eprintln!("agent ready after {:.1} s", t_start.elapsed().as_secs_f64());

    // A pod the API server does not have is never attached (its policies
    // cannot be known): the agent asks the API (a GET), then answers "try
    // again later", naming the pod, and makes nothing.
    {
        let ghost = Netns::new("ghost");
        let out = node.cni(
            "ADD",
            &format!("{}-c0", ghost.name),
            &format!("/var/run/netns/{}", ghost.name),
            "eth0",
            &format!("K8S_POD_NAMESPACE={x};K8S_POD_NAME=ghost"),
        );
        assert!(!out.ok, "ADD of a pod the API lacks succeeded: {out:?}");
        assert_eq!(out.code(), 11, "{out:?}");
        assert!(out.msg().contains(&format!("{x}/ghost")), "{out:?}");
    }

    // Pods: API object, CNI ADD, status (as kubelet + runtime would).
    let http = json!([{"containerPort": 80, "name": "http"}]);
    let mut pods = Vec::new();
    for (ns, name, labels, ports) in [
        (&x, "srv", json!({"app": "srv"}), http),
        (&x, "cli", json!({"app": "cli"}), json!([])),
        (&y, "cli2", json!({"app": "cli2"}), json!([])),
    ] {
        k.create_pod(ns, name, labels, ports);
        let p = node.attach(ns, name);
        assert!(
            p.ip.starts_with("10.233.1.") && p.ip != "10.233.1.1",
            "{}",
            p.ip
        );
        k.pod_running(ns, name, &p.ip);
        pods.push(p);
    }
    let mut pods = pods.into_iter();
    let (srv, cli, cli2) = match (pods.next(), pods.next(), pods.next()) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => unreachable!("three pods made"),
    };
    // TCP servers on port 80 in srv and cli2.
    let _servers: Vec<Bg> = [&srv, &cli2]
        .iter()
        .map(|p| {
            let mut b = p.ns.spawn(&["python3", "-c", SERVER, "80"]);
            let deadline = Instant::now() + Duration::from_secs(5);
            while !b.stdout_text().contains("listening") {
                assert!(
                    Instant::now() < deadline && b.running(),
                    "server in {} did not start: {}",
                    p.name,
                    b.stderr_text()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            b
        })
        .collect();

    // (1) No policy: everyone reaches srv.
    eprintln!("(1) no policy");
    assert!(ping_until_up(&cli.ns, &srv.ip, 5).ok, "cli -> srv ping");
    assert_eq!(
        ping(&cli2.ns, &srv.ip, 2, "0.2", &[]).received,
        2,
        "cli2 -> srv ping"
    );
    node.wait_tcp(&cli, &srv, true, 5.0, "no policy");
    node.wait_tcp(&cli2, &srv, true, 5.0, "no policy");
    node.wait_tcp(&cli, &cli2, true, 5.0, "no policy");
    let f = node.flows();
    assert!(
        policy_lines(&f).is_empty(),
        "policy flows without policies:\n{f}"
    );

    // (2) Deny all ingress in X.
    eprintln!("(2) deny-all ingress in {x}");
    k.create_policy(
        &x,
        "deny-all",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    node.wait_tcp(&cli2, &srv, false, PROMPT, "deny-all");
    node.check_tcp(&cli, &srv, false, "deny-all");
    node.check_tcp(&cli2, &srv, false, "deny-all");
    assert_eq!(
        ping(&cli.ns, &srv.ip, 1, "0.2", &[]).received,
        0,
        "ping under deny-all"
    );
    let out = node
        .sw
        .ctl_ok(&["dump-flows", "--names", "--table", "IngressDefaultRule"]);
    assert!(
        out.lines().any(|l| l.contains("cookie=0x5")
            && feature(l) == Some(Feature::Isolation)
            && mentions(l, &format!("nw_dst={}", srv.ip))
            && l.contains("drop")),
        "no isolation drop for srv {} in IngressDefaultRule:\n{out}",
        srv.ip
    );

    // (3) Allow from a pod label, then from a namespace label.
    eprintln!("(3) allow role=client / namespaces team=blue");
    k.create_policy(
        &x,
        "allow-role",
        json!({"podSelector": {"matchLabels": {"app": "srv"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}],
                            "ports": [{"port": "http"}]}]}),
    );
    std::thread::sleep(Duration::from_millis(300));
    node.check_tcp(&cli, &srv, false, "allow-role before the relabel");
    k.patch_pod(
        &x,
        "cli",
        json!({"metadata": {"labels": {"role": "client"}}}),
    );
    node.wait_tcp(&cli, &srv, true, PROMPT, "cli relabelled role=client");
    node.check_tcp(&cli2, &srv, false, "cli2 is not role=client");
    assert_eq!(
        ping(&cli.ns, &srv.ip, 1, "0.2", &[]).received,
        0,
        "ICMP must stay blocked (only TCP 'http' is allowed)"
    );
    let rules = node.table("IngressRule");
    assert!(
        rules
            .lines()
            .any(|l| feature(l) == Some(Feature::PolicyRule)
                && mentions(l, &format!("nw_src={}", cli.ip))),
        "IngressRule does not match cli {}:\n{rules}",
        cli.ip
    );
    k.create_policy(
        &x,
        "allow-ns",
        json!({"podSelector": {"matchLabels": {"app": "srv"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]}]}),
    );
    std::thread::sleep(Duration::from_millis(300));
    node.check_tcp(
        &cli2,
        &srv,
        false,
        "allow-ns before the namespace is labelled",
    );
    k.patch_namespace(&y, json!({"metadata": {"labels": {"team": "blue"}}}));
    node.wait_tcp(&cli2, &srv, true, PROMPT, "namespace labelled team=blue");
    k.patch_namespace(&y, json!({"metadata": {"labels": {"team": null}}}));
    node.wait_tcp(&cli2, &srv, false, PROMPT, "namespace label removed");
    node.check_tcp(&cli2, &srv, false, "namespace label removed");
    node.check_tcp(&cli, &srv, true, "cli still allowed");

    // (6) The apiserver goes away: the agent keeps the last known state.
    eprintln!("(6) apiserver killed");
    let before = node.flows();
    // Traffic all along the outage and the agent's re-list afterwards:
    // allowed cli -> srv must never fail, denied cli2 -> srv never pass.
    let allowed = Monitor::start(&cli, &srv.ip);
    let denied = Monitor::start(&cli2, &srv.ip);
    let log_mark = node.agent_log().len();
    let argv = cluster.kill_apiserver();
    let t_kill = Instant::now();
    // The agent notices (its watches fail and retry)...
    let deadline = Instant::now() + Duration::from_secs(5);
    while !node
        .agent_log()
        .get(log_mark..)
        .is_some_and(|l| l.contains("retrying with backoff"))
    {
        assert!(
            Instant::now() < deadline,
            "the agent did not notice the apiserver going away:\n{}",
            tail(&node.agent_log(), 30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // ... and keeps its flows and the traffic as they were.
    assert!(node.agent_running(), "agent died with the apiserver");
    node.check_tcp(&cli, &srv, true, "during the outage");
    node.check_tcp(&cli2, &srv, false, "during the outage");
    let during = node.flows();
    assert_eq!(during, before, "flows changed while the apiserver was away");
    cluster.start_apiserver(&argv);
    k.wait_api(60);
    eprintln!(
        "  apiserver back after {:.1} s",
        t_kill.elapsed().as_secs_f64()
    );
    assert_eq!(
        node.flows(),
        before,
        "flows changed when the apiserver came back"
    );
    // A new policy (isolating Y) takes effect once the agent's watches
    // are back; the monitors run until then, so they cover the re-list.
    let t_back = Instant::now();
    k.create_policy(
        &y,
        "deny-y",
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    );
    node.wait_tcp(&cli, &cli2, false, 40.0, "policy created after the restart");
    node.check_tcp(&cli, &cli2, false, "policy created after the restart");
    eprintln!(
        "  new policy effective {:.1} s after the apiserver answered again",
        t_back.elapsed().as_secs_f64()
    );
    let (ok, fail) = denied.finish();
    assert_eq!(
        ok,
        0,
        "denied cli2 -> srv passed {ok} times (of {}) during the outage and re-list",
        ok + fail
    );
    let (ok, fail) = allowed.finish();
    assert_eq!(
        fail,
        0,
        "allowed cli -> srv failed {fail} times (of {}) during the outage and re-list",
        ok + fail
    );
    eprintln!("  cli -> srv: {ok} connections through the outage and re-list, none failed");
    // And the watches follow changes promptly again.
    k.create_policy(
        &x,
        "allow-cli2",
        json!({"podSelector": {"matchLabels": {"app": "srv"}},
               "ingress": [{"from": [{"namespaceSelector": {},
                                      "podSelector": {"matchLabels": {"app": "cli2"}}}]}]}),
    );
    node.wait_tcp(&cli2, &srv, true, PROMPT, "allow-cli2 after the restart");
    node.check_tcp(&cli, &srv, true, "cli after the restart");

    // (5) Delete pod cli: the flows matching it as a peer go.
    eprintln!("(5) delete pod {x}/cli");
    let src = format!("nw_src={}", cli.ip);
    let f = node.flows();
    assert!(
        policy_lines(&f).iter().any(|l| mentions(l, &src)),
        "no policy flow matches cli {} before its deletion:\n{f}",
        cli.ip
    );
    k.delete_pod(&x, "cli");
    node.wait_flows(PROMPT, "cli gone from the policy flows", |f| {
        !policy_lines(f).iter().any(|l| mentions(l, &src))
    });
    node.wait_tcp(&cli, &srv, false, PROMPT, "pod object deleted");
    node.check_tcp(&cli, &srv, false, "pod object deleted");
    node.check_tcp(&cli2, &srv, true, "cli2 unaffected");
    node.detach(&cli);
    let f = node.flows();
    assert!(
        !mentions(&f, &cli.ip),
        "flows still name cli {}:\n{f}",
        cli.ip
    );

    // (4) Delete the policies: open again, and no policy flow left.
    eprintln!("(4) delete the policies");
    node.check_tcp(&srv, &cli2, false, "before the policies go");
    assert_eq!(
        ping(&srv.ns, &cli2.ip, 1, "0.2", &[]).received,
        0,
        "ping srv -> cli2 under deny-y"
    );
    for p in ["deny-all", "allow-role", "allow-ns", "allow-cli2"] {
        k.delete_policy(&x, p);
    }
    k.delete_policy(&y, "deny-y");
    node.wait_flows(PROMPT, "policy flows gone", |f| policy_lines(f).is_empty());
    node.wait_tcp(&srv, &cli2, true, PROMPT, "policies deleted");
    node.check_tcp(&cli2, &srv, true, "policies deleted");
    assert_eq!(
        ping(&srv.ns, &cli2.ip, 2, "0.2", &[]).received,
        2,
        "ping srv -> cli2 after the policies went"
    );
    assert_eq!(
        ping(&cli2.ns, &srv.ip, 2, "0.2", &[]).received,
        2,
        "ping cli2 -> srv after the policies went"
    );
    assert!(node.agent_running(), "agent exited");
    eprintln!(
        "done in {:.1} s (before teardown)",
        t_start.elapsed().as_secs_f64()
    );
}
