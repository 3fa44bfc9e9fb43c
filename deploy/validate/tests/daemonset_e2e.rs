//! `deploy/oxvs.yaml` installed on a real single-node Kubernetes cluster
//! (`shared/tools/k8s-local.sh up --kubelet`: etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager, containerd, kubelet 1.20), and
//! the `kubectl` commands of `docs/operations.md` run against it.
//!
//! What happens, in order:
//!
//! 1. `deploy/build-image.sh` builds the image from the workspace's built
//!    binaries (no docker, no registry).
//! 2. `k8s-local.sh up --kubelet` starts in the background with a run dir,
//!    ports, node name and CNI dirs of this test's own. Its `up` waits for
//!    the node to be Ready, which needs a CNI configuration: as on a real
//!    cluster, the node only becomes Ready once oxvs' init container has
//!    installed the conflist. Meanwhile the test imports the image into
//!    the cluster's containerd, gives the Node its `spec.podCIDR` (what
//!    `kube-controller-manager --allocate-node-cidrs` does; k8s-local.sh
//!    runs it without) and applies the manifest.
//! 3. The manifest is applied with the substitutions a test on a shared
//!    host needs and nothing else (see [`substitute`]): host paths of the
//!    CNI dirs, `/run/oxvs` and `/var/lib/oxvs` under the test's dir (and
//!    the conflist's `agentSocket` pointing there: the plugin runs on the
//!    host);
//!    gateway and tunnel names and metrics ports of its own; and the API
//!    server's address for the in-cluster configuration (this cluster has
//!    no kube-proxy, so the `kubernetes` Service's ClusterIP leads nowhere:
//!    `KUBERNETES_SERVICE_HOST/PORT`, as on any kube-proxy-free cluster).
//! 4. DaemonSet rolled out, node Ready, plugin and conflist installed; two
//!    busybox pods get addresses from the pod CIDR and ping each other and
//!    the node; a deny-all-ingress NetworkPolicy stops the pod-to-pod ping.
//! 5. The commands of docs/operations.md (rollout status, the `$OXVS`
//!    lookup, `exec ... oxvsctl show/stats/dump-ports/dump-flows/traceflow`,
//!    the STATUS call, `logs | grep`, the IPAM listing, `ip link show eth0`)
//!    run and print what the doc says.
//!
//! `kubectl exec/logs`: the API server dials the kubelet at the Node's
//! Hostname (the node name, unknown to DNS here) or InternalIP, and
//! k8s-local.sh's kubelet listens on 127.0.0.1 only. The test runs
//! k8s-local.sh with a private cache dir ([`private_cache`]: links to the
//! shared build, and a `kube-apiserver` wrapper adding
//! `--kubelet-preferred-address-types=InternalIP,Hostname`) and relays
//! InternalIP:port to 127.0.0.1:port ([`Relay`]) while it runs.
//!
//! The agent's `HostToContainer` mount of `/run/netns` needs that path to
//! be a shared mount; on a host where nobody ran `ip netns add` yet the
//! test makes it one the same way ([`ensure_run_netns_shared`]).
//!
//! Teardown (also on failure, [`Cluster`]'s Drop): the test pods are
//! deleted while the agent still runs (so their CNI DEL succeeds), then
//! `k8s-local.sh down`, then whatever oxvs left on the host under this
//! test's names (gateway, tunnel, masquerade rule). On failure the logs
//! are printed and the test dir is kept.
//!
//! Skips (prints SKIPPED, passes) unless: root; k8s-local.sh found; a
//! cached build WITH the controllers (`OXVS_K8S_EXTRA_COMPONENTS="kube-scheduler
//! kube-controller-manager" k8s-local.sh build`; a DaemonSet needs them);
//! etcd, kubectl, ctr, containerd, umoci, skopeo, busybox-static and the
//! reference CNI plugins (`loopback`, `portmap` in /usr/lib/cni) installed;
//! the four oxvs binaries built; no other kubelet running (k8s-local.sh
//! allows one per host). It never starts a build.

mod common;
use common::{find_on_path, free_port, k8s_host, text, workspace_root, K8sHost};

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_yaml::Value;

const BINS: [&str; 4] = ["oxvs-switchd", "oxvs-agent", "oxvsctl", "oxvs-cni"];
/// The image the manifest names (kept: the test imports it under that name).
const IMAGE: &str = "localhost/oxvs:0.1.0";
const CNI_PLUGINS: &str = "/usr/lib/cni";

/// The directory holding all four oxvs binaries: `$OXVS_IMAGE_BIN_DIR`,
/// this test's profile dir (`target/debug` under `cargo test`), or
/// `target/release`.
fn binaries_dir() -> Option<PathBuf> {
    let has_all = |d: &PathBuf| BINS.iter().all(|b| d.join(b).is_file());
    [
        std::env::var_os("OXVS_IMAGE_BIN_DIR").map(PathBuf::from),
        oxvs_deploy_validate::built_binaries_dir(),
        Some(workspace_root().join("target/release")),
    ]
    .into_iter()
    .flatten()
    .find(has_all)
}

/// Whether `/run/netns` is a mount point with shared propagation (what
/// the DaemonSet's `HostToContainer` mount of it needs).
fn run_netns_is_shared() -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|m| {
            m.lines().any(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.len() > 6
                    && f[4] == "/run/netns"
                    && f[6..]
                        .iter()
                        .take_while(|x| **x != "-")
                        .any(|x| x.starts_with("shared:"))
            })
        })
        .unwrap_or(false)
}

/// Makes `/run/netns` a shared mount as iproute2 does on its first
/// `ip netns add` (a bind mount of itself, `MS_SHARED`); a no-op if it is.
fn ensure_run_netns_shared() -> Result<(), String> {
    if run_netns_is_shared() {
        return Ok(());
    }
    let ns = format!("oxvs-e2e-probe-{}", std::process::id());
    let add = Command::new("ip").args(["netns", "add", &ns]).output();
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    match add {
        Ok(o) if o.status.success() && run_netns_is_shared() => Ok(()),
        Ok(o) => Err(format!(
            "/run/netns is not a shared mount and `ip netns add` did not make it one: {}",
            text(&o)
        )),
        Err(e) => Err(format!("ip netns add: {e}")),
    }
}

/// A private k8s-local cache: the shared build's binaries and images,
/// with `kube-apiserver` wrapped to dial kubelets at their InternalIP
/// (`--kubelet-preferred-address-types`; the default tries the Hostname
/// first, here the node name, which no DNS knows). Nothing shared changes.
fn private_cache(shared: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    let cache = dir.join("cache");
    let bin = cache.join("bin");
    std::fs::create_dir_all(&bin)?;
    for b in ["kubelet", "kube-scheduler", "kube-controller-manager"] {
        std::os::unix::fs::symlink(shared.join("bin").join(b), bin.join(b))?;
    }
    std::os::unix::fs::symlink(shared.join("images"), cache.join("images"))?;
    let w = bin.join("kube-apiserver");
    std::fs::write(
        &w,
        format!(
            "#!/bin/sh\n# oxvs-deploy-validate daemonset_e2e: kubelets are dialled at their InternalIP\n\
             exec '{}' \"$@\" --kubelet-preferred-address-types=InternalIP,Hostname\n",
            shared.join("bin/kube-apiserver").display()
        ),
    )?;
    std::fs::set_permissions(&w, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(cache)
}

/// Whether a process named `kubelet` runs on this host.
fn kubelet_running() -> bool {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(Result::ok).any(|e| {
                std::fs::read_to_string(e.path().join("comm"))
                    .map(|c| c.trim() == "kubelet")
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false)
}

struct Prereqs {
    tools: PathBuf,
    cache: PathBuf,
    kubectl: PathBuf,
    bins: PathBuf,
}

/// Why the test cannot run here, if it cannot.
fn prerequisites() -> Result<Prereqs, String> {
    let K8sHost {
        tools,
        cache,
        kubectl,
    } = k8s_host(
        &[
            "kube-apiserver",
            "kubelet",
            "kube-scheduler",
            "kube-controller-manager",
        ],
        "OXVS_K8S_EXTRA_COMPONENTS=\"kube-scheduler kube-controller-manager\" k8s-local.sh build",
    )?;
    for t in ["etcd", "ctr", "containerd", "umoci", "skopeo"] {
        if find_on_path(t).is_none() {
            return Err(format!(
                "{t} not installed (k8s-local.sh build installs it)"
            ));
        }
    }
    if !Path::new("/bin/busybox").is_file() {
        return Err("/bin/busybox missing (busybox-static)".into());
    }
    for p in ["loopback", "portmap"] {
        if !Path::new(CNI_PLUGINS).join(p).is_file() {
            return Err(format!(
                "{CNI_PLUGINS}/{p} missing (containernetworking-plugins)"
            ));
        }
    }
    let bins = binaries_dir().ok_or(
        "oxvs binaries not built (cargo build -p oxvs-switch -p oxvs-agent -p oxvsctl -p oxvs-cni)",
    )?;
    if kubelet_running() {
        return Err("another kubelet runs on this host (k8s-local.sh allows one per host)".into());
    }
    Ok(Prereqs {
        tools,
        cache,
        kubectl,
        bins,
    })
}

/// Retries `f` every 500 ms until it returns `Some` or `timeout` passes.
fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

// ------------------------------------------------------------- relay ----

/// TCP relay from the node's InternalIP to the kubelet on 127.0.0.1 (what
/// `kubectl exec/logs` need: the API server dials the InternalIP).
struct Relay {
    stop: Arc<AtomicBool>,
}

impl Relay {
    fn start(listen: SocketAddr, target: SocketAddr) -> std::io::Result<Relay> {
        let l = TcpListener::bind(listen)?;
        l.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((c, _)) => {
                        std::thread::spawn(move || {
                            let _ = c.set_nonblocking(false);
                            if let Ok(k) = TcpStream::connect(target) {
                                pipe(c, k);
                            }
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        Ok(Relay { stop })
    }
}

fn pipe(a: TcpStream, b: TcpStream) {
    let (Ok(mut a2), Ok(mut b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let (mut a, mut b) = (a, b);
    let t = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a, &mut b2);
        let _ = b2.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut b, &mut a2);
    let _ = a2.shutdown(std::net::Shutdown::Write);
    let _ = t.join();
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ----------------------------------------------------------- cluster ----

/// Names and addresses of this test run.
struct Names {
    node: String,
    gateway: String,
    tunnel: String,
    cidr: String,
    /// the pod CIDR's /24 prefix, e.g. "10.251.17."
    prefix: String,
    api_port: u16,
    kubelet_port: u16,
}

impl Names {
    fn new() -> Names {
        let pid = std::process::id();
        let third = 20 + pid % 200;
        Names {
            node: format!("oxvs-e2e-{pid}"),
            gateway: format!("oxgw{pid}"),
            tunnel: format!("oxtn{pid}"),
            cidr: format!("10.251.{third}.0/24"),
            prefix: format!("10.251.{third}."),
            api_port: free_port(),
            kubelet_port: free_port(),
        }
    }
}

/// The running cluster; tears everything down on drop.
struct Cluster {
    tools: PathBuf,
    dir: PathBuf,
    env: Vec<(&'static str, String)>,
    kubectl: PathBuf,
    names: Names,
    up: Option<Child>,
    relay: Option<Relay>,
}

impl Cluster {
    fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.tools.join("k8s-local.sh"));
        cmd.args(args).arg("--run-dir").arg(self.run_dir());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(self.run_dir().join("admin.kubeconfig"))
            .arg("--request-timeout=30s")
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// kubectl that must succeed; its stdout.
    fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A shell pipeline as the doc writes it, with KUBECONFIG, NODE and
    /// OXVS set; its stdout, or what failed.
    fn shell(&self, script: &str) -> Result<String, String> {
        let kubectl_dir = self.kubectl.parent().unwrap_or(Path::new("/usr/bin"));
        let path = format!(
            "{}:{}",
            kubectl_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let full = format!(
            "set -eo pipefail\nNODE={}\nOXVS=$(kubectl -n kube-system get pod -l app.kubernetes.io/name=oxvs \\\n  --field-selector spec.nodeName=$NODE -o name)\n{script}",
            self.names.node
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(&full)
            .env("KUBECONFIG", self.run_dir().join("admin.kubeconfig"))
            .env("PATH", path)
            .output()
            .map_err(|e| format!("bash: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "doc command failed ({}):\n{full}\n---\n{}",
                out.status,
                text(&out)
            ))
        }
    }

    /// [`Cluster::shell`] that must succeed.
    fn shell_ok(&self, script: &str) -> String {
        self.shell(script).unwrap_or_else(|e| panic!("{e}"))
    }

    fn dump_diagnostics(&self) {
        eprintln!("==== diagnostics (test dir kept: {})", self.dir.display());
        for args in [
            &["get", "nodes", "-o", "wide"][..],
            &["get", "pods", "-A", "-o", "wide"],
            &["-n", "kube-system", "describe", "daemonset/oxvs"],
            &[
                "-n",
                "kube-system",
                "describe",
                "pods",
                "-l",
                "app.kubernetes.io/name=oxvs",
            ],
            &["describe", "pods"],
            &[
                "-n",
                "kube-system",
                "logs",
                "-l",
                "app.kubernetes.io/name=oxvs",
                "-c",
                "install-cni",
                "--tail=20",
            ],
            &[
                "-n",
                "kube-system",
                "logs",
                "-l",
                "app.kubernetes.io/name=oxvs",
                "-c",
                "oxvs-switchd",
                "--tail=40",
            ],
            &[
                "-n",
                "kube-system",
                "logs",
                "-l",
                "app.kubernetes.io/name=oxvs",
                "-c",
                "oxvs-agent",
                "--tail=60",
            ],
        ] {
            eprintln!("---- kubectl {}", args.join(" "));
            eprintln!("{}", text(&self.kubectl(args)));
        }
        for f in ["up.log", "run/logs/kubelet.log", "run/logs/containerd.log"] {
            let p = self.dir.join(f);
            let t = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = t.lines().collect();
            let from = lines.len().saturating_sub(40);
            eprintln!("---- tail {}\n{}", p.display(), lines[from..].join("\n"));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            self.dump_diagnostics();
        }
        if let Some(mut c) = self.up.take() {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        if self.run_dir().join("admin.kubeconfig").is_file() {
            // The test pods first, while the agent runs: their DEL succeeds.
            let _ = self.kubectl(&[
                "delete",
                "pods,networkpolicies",
                "--all",
                "-n",
                "default",
                "--grace-period=1",
                "--timeout=60s",
            ]);
        }
        match self.script(&["down", "--purge"]).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!("k8s-local.sh down failed:\n{}", text(&o)),
            Err(e) => eprintln!("k8s-local.sh down: {e}"),
        }
        self.relay.take();
        // What oxvs made on the host under this test's names (switchd's
        // SIGTERM teardown removes the gateway; a crash would not).
        for link in [&self.names.gateway, &self.names.tunnel] {
            let _ = Command::new("ip")
                .args(["link", "del", "dev", link])
                .stderr(Stdio::null())
                .status();
        }
        let rule = [
            "-w",
            "5",
            "-t",
            "nat",
            "-D",
            "POSTROUTING",
            "-s",
            &self.names.cidr,
            "!",
            "-o",
            &self.names.gateway,
            "-m",
            "comment",
            "--comment",
            "oxvs: pod egress",
            "-j",
            "MASQUERADE",
        ];
        for _ in 0..5 {
            let ok = Command::new("iptables")
                .args(rule)
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                break;
            }
        }
        if !failed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ----------------------------------------------------- substitutions ----

fn map_get<'a>(v: &'a mut Value, key: &str) -> &'a mut Value {
    v.get_mut(key)
        .unwrap_or_else(|| panic!("manifest: no '{key}'"))
}

fn seq(v: &mut Value) -> &mut Vec<Value> {
    v.as_sequence_mut().expect("manifest: a list")
}

/// `deploy/oxvs.yaml` with this test's substitutions; returns the new
/// multi-document YAML. Every substitution asserts that what it replaces
/// is there, so the test fails if the manifest changes under it.
fn substitute(manifest: &str, dir: &Path, n: &Names, metrics: (u16, u16)) -> String {
    let mut out = String::new();
    for doc in serde_yaml::Deserializer::from_str(manifest) {
        let mut v = Value::deserialize(doc).expect("manifest parses");
        if v.is_null() {
            continue;
        }
        let kind = v["kind"].as_str().unwrap_or_default().to_string();
        if kind == "ConfigMap" {
            let data = map_get(&mut v, "data");
            for (k, new) in [("gateway", &n.gateway), ("tunnel", &n.tunnel)] {
                assert!(data.get(k).is_some(), "ConfigMap has no '{k}'");
                data[k] = Value::String(new.clone());
            }
            // /run/oxvs is moved: the plugin (run by containerd on the
            // host) must be told where the agent's socket is.
            let key = "10-oxvs.conflist";
            let text = data[key].as_str().expect("the conflist").to_string();
            let mut conf: serde_json::Value = serde_json::from_str(&text).expect("conflist JSON");
            let oxvs = conf["plugins"]
                .as_array_mut()
                .and_then(|p| p.iter_mut().find(|p| p["type"] == "oxvs"))
                .expect("the oxvs plugin in the conflist");
            oxvs["agentSocket"] =
                serde_json::Value::String(dir.join("oxvs-run/cni.sock").display().to_string());
            data[key] = Value::String(serde_json::to_string_pretty(&conf).expect("JSON"));
        }
        if kind == "DaemonSet" {
            let spec = map_get(map_get(map_get(&mut v, "spec"), "template"), "spec");
            let mut replaced = 0;
            for vol in seq(map_get(spec, "volumes")) {
                let path = match vol.get("hostPath").and_then(|h| h.get("path")) {
                    Some(p) => p.as_str().unwrap_or_default().to_string(),
                    None => continue,
                };
                let new = match path.as_str() {
                    "/opt/cni/bin" => dir.join("cni-bin"),
                    "/etc/cni/net.d" => dir.join("cni-conf"),
                    "/run/oxvs" => dir.join("oxvs-run"),
                    "/var/lib/oxvs" => dir.join("oxvs-state"),
                    _ => continue,
                };
                vol["hostPath"]["path"] = Value::String(new.display().to_string());
                replaced += 1;
            }
            assert_eq!(replaced, 4, "the four host paths the test moves");
            for c in seq(map_get(spec, "containers")) {
                let name = c["name"].as_str().unwrap_or_default().to_string();
                assert_eq!(c["image"].as_str(), Some(IMAGE), "image of {name}");
                let port = match name.as_str() {
                    "oxvs-switchd" => metrics.0,
                    "oxvs-agent" => metrics.1,
                    other => panic!("unexpected container {other}"),
                };
                seq(map_get(c, "command")).extend([
                    Value::String("--metrics-addr".into()),
                    Value::String(format!("127.0.0.1:{port}")),
                ]);
                if name == "oxvs-agent" {
                    let env = seq(map_get(c, "env"));
                    for (k, val) in [
                        ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
                        ("KUBERNETES_SERVICE_PORT", n.api_port.to_string()),
                    ] {
                        let mut m = serde_yaml::Mapping::new();
                        m.insert("name".into(), k.into());
                        m.insert("value".into(), val.into());
                        env.push(Value::Mapping(m));
                    }
                }
            }
        }
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&v).expect("serialise"));
    }
    out
}

use serde::Deserialize as _;

// -------------------------------------------------------------- test ----

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: a, namespace: default, labels: {app: a}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - {name: c, image: localhost/busybox:latest, imagePullPolicy: Never, command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: b, namespace: default, labels: {app: b}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - {name: c, image: localhost/busybox:latest, imagePullPolicy: Never, command: [sleep, "3600"]}
"#;

const DENY_ALL: &str = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all, namespace: default}
spec:
  podSelector: {}
  policyTypes: [Ingress]
"#;

#[test]
fn the_daemonset_runs_pods_and_the_doc_commands_work() {
    let p = match prerequisites() {
        Ok(p) => p,
        Err(why) => {
            println!("SKIPPED: {why}");
            return;
        }
    };
    if let Err(e) = ensure_run_netns_shared() {
        panic!("{e}");
    }
    let t0 = Instant::now();
    let names = Names::new();
    let dir = std::env::temp_dir().join(format!("oxvs-deploy-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["cni-bin", "cni-conf", "oxvs-run", "oxvs-state"] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    // containerd's CRI needs `loopback`; the conflist chains `portmap`.
    for plugin in ["loopback", "portmap"] {
        std::fs::copy(
            Path::new(CNI_PLUGINS).join(plugin),
            dir.join("cni-bin").join(plugin),
        )
        .expect("copy reference plugin");
    }

    // 1. the image
    let image = dir.join("oxvs-image.tar");
    let out = Command::new(workspace_root().join("deploy/build-image.sh"))
        .arg("--bin-dir")
        .arg(&p.bins)
        .arg("--out")
        .arg(&image)
        .output()
        .expect("run build-image.sh");
    assert!(
        out.status.success(),
        "build-image.sh failed:\n{}",
        text(&out)
    );
    println!(
        "image built from {} in {:?}",
        p.bins.display(),
        t0.elapsed()
    );

    // 2. the cluster, in the background
    let cache = private_cache(&p.cache, &dir).expect("private k8s-local cache");
    let env = vec![
        ("OXVS_K8S_CACHE", cache.display().to_string()),
        ("OXVS_K8S_ETCD_PORT", free_port().to_string()),
        ("OXVS_K8S_ETCD_PEER_PORT", free_port().to_string()),
        ("OXVS_K8S_API_PORT", names.api_port.to_string()),
        ("OXVS_K8S_KUBELET_PORT", names.kubelet_port.to_string()),
        ("OXVS_K8S_READY_TIMEOUT", "240".to_string()),
        ("OXVS_KUBECTL", p.kubectl.display().to_string()),
        (
            "OXVS_CNI_CONF_DIR",
            dir.join("cni-conf").display().to_string(),
        ),
        (
            "OXVS_CNI_BIN_DIR",
            dir.join("cni-bin").display().to_string(),
        ),
    ];
    let mut c = Cluster {
        tools: p.tools,
        dir: dir.clone(),
        env,
        kubectl: p.kubectl,
        names,
        up: None,
        relay: None,
    };
    let log = std::fs::File::create(dir.join("up.log")).expect("up.log");
    let up = c
        .script(&["up", "--kubelet", "--node-name", &c.names.node.clone()])
        .stdout(log.try_clone().expect("dup"))
        .stderr(log)
        .spawn()
        .expect("spawn k8s-local.sh up");
    c.up = Some(up);
    let node = c.names.node.clone();
    let registered = wait_for(Duration::from_secs(180), || {
        if let Some(Ok(Some(st))) = c.up.as_mut().map(|u| u.try_wait()) {
            panic!("k8s-local.sh up exited early ({st})");
        }
        let sock = c.run_dir().join("containerd/containerd.sock");
        (sock.exists()
            && c.run_dir().join("admin.kubeconfig").is_file()
            && c.kubectl(&["get", "node", &node]).status.success())
        .then_some(())
    });
    assert!(registered.is_some(), "node {node} not registered in 180 s");
    println!("node registered after {:?}", t0.elapsed());

    // the image into the cluster's containerd (namespace k8s.io, as CRI)
    let out = Command::new("ctr")
        .arg("-a")
        .arg(c.run_dir().join("containerd/containerd.sock"))
        .args(["-n", "k8s.io", "images", "import"])
        .arg(&image)
        .output()
        .expect("run ctr");
    assert!(
        out.status.success(),
        "ctr images import failed:\n{}",
        text(&out)
    );
    let images = Command::new("ctr")
        .arg("-a")
        .arg(c.run_dir().join("containerd/containerd.sock"))
        .args(["-n", "k8s.io", "images", "ls", "-q"])
        .output()
        .expect("run ctr");
    assert!(
        String::from_utf8_lossy(&images.stdout)
            .lines()
            .any(|l| l == IMAGE),
        "{IMAGE} not among the imported images:\n{}",
        text(&images)
    );

    // the node's pod CIDR (kube-controller-manager --allocate-node-cidrs)
    let cidr = c.names.cidr.clone();
    c.kubectl_ok(&[
        "patch",
        "node",
        &node,
        "-p",
        &format!(r#"{{"spec":{{"podCIDR":"{cidr}","podCIDRs":["{cidr}"]}}}}"#),
    ]);

    // kubectl exec/logs: relay InternalIP:kubelet-port -> 127.0.0.1
    let node_ip: Ipv4Addr = c
        .kubectl_ok(&[
            "get",
            "node",
            &node,
            "-o",
            r#"jsonpath={.status.addresses[?(@.type=="InternalIP")].address}"#,
        ])
        .trim()
        .parse()
        .expect("the node's InternalIP");
    let kp = c.names.kubelet_port;
    c.relay = Some(
        Relay::start(
            SocketAddr::from((node_ip, kp)),
            SocketAddr::from((Ipv4Addr::LOCALHOST, kp)),
        )
        .expect("relay to the kubelet"),
    );

    // 3. the manifest
    let manifest =
        std::fs::read_to_string(workspace_root().join("deploy/oxvs.yaml")).expect("read manifest");
    let applied = substitute(&manifest, &dir, &c.names, (free_port(), free_port()));
    let mpath = dir.join("oxvs.yaml");
    std::fs::write(&mpath, &applied).expect("write manifest");
    c.kubectl_ok(&["apply", "-f", &mpath.display().to_string()]);

    // 4. node Ready: `up` returns once the init container wrote the conflist
    let mut up = c.up.take().expect("up child");
    let st = wait_for(Duration::from_secs(300), || up.try_wait().ok().flatten());
    c.up = Some(up);
    let st = st.expect("k8s-local.sh up did not finish in 300 s");
    assert!(st.success(), "k8s-local.sh up failed ({st})");
    println!("node Ready after {:?}", t0.elapsed());
    let plugin = dir.join("cni-bin/oxvs");
    let meta = std::fs::metadata(&plugin).expect("the init container installed the plugin");
    assert_eq!(meta.mode() & 0o777, 0o755, "mode of {}", plugin.display());
    let conflist = std::fs::read_to_string(dir.join("cni-conf/10-oxvs.conflist"))
        .expect("the init container installed the conflist");
    assert!(conflist.contains(r#""type": "oxvs""#), "{conflist}");

    // docs/operations.md, Install
    let rollout = c.shell_ok("kubectl -n kube-system rollout status daemonset/oxvs --timeout=180s");
    assert!(rollout.contains("successfully rolled out"), "{rollout}");
    println!("DaemonSet rolled out after {:?}", t0.elapsed());

    // two pods
    let ppath = dir.join("pods.yaml");
    std::fs::write(&ppath, PODS).expect("write pods");
    c.kubectl_ok(&["apply", "-f", &ppath.display().to_string()]);
    c.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/a",
        "pod/b",
        "--timeout=120s",
    ]);
    println!("pods Ready after {:?}", t0.elapsed());
    let ip_of = |pod: &str| -> String {
        c.kubectl_ok(&["get", "pod", pod, "-o", "jsonpath={.status.podIP}"])
            .trim()
            .to_string()
    };
    let (ip_a, ip_b) = (ip_of("a"), ip_of("b"));
    for ip in [&ip_a, &ip_b] {
        assert!(
            ip.starts_with(&c.names.prefix),
            "pod address {ip} not in the node's pod CIDR {cidr}"
        );
    }
    let ping = |from: &str, to: &str| -> Output {
        c.kubectl(&["exec", from, "--", "ping", "-c", "2", "-W", "2", to])
    };
    let o = ping("a", &ip_b);
    assert!(
        o.status.success(),
        "a -> b ({ip_b}) ping failed:\n{}",
        text(&o)
    );
    let o = ping("b", &ip_a);
    assert!(
        o.status.success(),
        "b -> a ({ip_a}) ping failed:\n{}",
        text(&o)
    );
    let o = ping("a", &node_ip.to_string());
    assert!(
        o.status.success(),
        "a -> node ({node_ip}) ping failed:\n{}",
        text(&o)
    );
    println!("pod-to-pod and pod-to-node pings pass");

    // the NetworkPolicy
    let npath = dir.join("deny-all.yaml");
    std::fs::write(&npath, DENY_ALL).expect("write policy");
    c.kubectl_ok(&["apply", "-f", &npath.display().to_string()]);
    let dropped = wait_for(Duration::from_secs(30), || {
        (!ping("a", &ip_b).status.success()).then_some(())
    });
    assert!(dropped.is_some(), "a -> b still pings 30 s after deny-all");
    println!("deny-all ingress: a -> b ping fails");

    doc_commands(&c, &ip_b);
    restarts(&c, &ip_a, &node_ip.to_string());
    println!("all done in {:?}", t0.elapsed());
}

/// Failures of the doc commands, collected so one run shows them all.
#[derive(Default)]
struct Checks {
    failures: Vec<String>,
}

impl Checks {
    /// Runs a doc command (see [`Cluster::shell`]); its stdout, or "" and a
    /// recorded failure.
    fn run(&mut self, c: &Cluster, script: &str) -> String {
        match c.shell(script) {
            Ok(out) => {
                println!(
                    "$ {}\n{}",
                    script.lines().last().unwrap_or(script),
                    out.trim_end()
                );
                out
            }
            Err(e) => {
                self.failures.push(e);
                String::new()
            }
        }
    }

    fn expect(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.failures.push(what());
        }
    }
}

/// The commands of docs/operations.md, as written there (NODE and OXVS set
/// as the doc sets them). Every failure is collected, then reported.
fn doc_commands(c: &Cluster, ip_b: &str) {
    let gw = c.names.gateway.clone();
    let cidr = c.names.cidr.clone();
    let mut k = Checks::default();
    let exec = "kubectl -n kube-system exec $OXVS -c oxvs-agent --";

    let nodes = k.run(c, "kubectl get nodes -o custom-columns=NAME:.metadata.name,CIDR:.spec.podCIDR,IP:.status.addresses[0].address");
    k.expect(
        nodes.contains(&c.names.node) && nodes.contains(&cidr),
        || format!("get nodes shows node and CIDR:\n{nodes}"),
    );

    let show = k.run(c, &format!("{exec} oxvsctl show"));
    k.expect(show.contains(&gw) && show.contains(&c.names.tunnel), || {
        format!("oxvsctl show lists gateway {gw} and tunnel:\n{show}")
    });

    // STATUS, as the readiness probe: no output, exit 0
    let status = k.run(c, r#"kubectl -n kube-system exec $OXVS -c oxvs-agent -- sh -c \
  'echo "{\"cniVersion\":\"1.1.0\",\"name\":\"oxvs\",\"type\":\"oxvs\"}" | CNI_COMMAND=STATUS CNI_PATH=/opt/cni/bin oxvs-cni'"#);
    k.expect(status.trim().is_empty(), || {
        format!("STATUS prints nothing when ready, got: {status}")
    });

    let logs = k.run(
        c,
        r"kubectl -n kube-system logs $OXVS -c oxvs-agent | grep -i 'pod CIDR\|switch'",
    );
    k.expect(!logs.trim().is_empty(), || {
        "the agent's log mentions the switch".into()
    });

    // traceflow names the policy that drops b's ingress (exit code 4)
    let trace = k.run(c, &format!("{exec} \\\n  oxvsctl traceflow --src default/a --dst default/b --proto tcp --dport 80 || test $? = 4"));
    k.expect(
        trace.contains("dropped") && trace.contains("default/deny-all"),
        || format!("traceflow names the drop and the policy:\n{trace}"),
    );

    let stats = k.run(c, &format!("{exec} oxvsctl stats"));
    k.expect(stats.contains("drops"), || {
        format!("oxvsctl stats shows drops:\n{stats}")
    });
    let ports = k.run(c, &format!("{exec} oxvsctl dump-ports"));
    k.expect(ports.contains("port  2: rx pkts="), || {
        format!("dump-ports counts the gateway (ofport 2 in oxvsctl show):\n{ports}")
    });
    let flows = k.run(
        c,
        &format!("{exec} oxvsctl dump-flows --names --table IngressDefaultRule"),
    );
    // pod b is ofport 4 (a is 3; 1 the tunnel, 2 the gateway)
    k.expect(flows.contains("cookie=0x5000000000004"), || {
        format!("pod b's isolation drop, cookie 0x0005 + its ofport 4:\n{flows}")
    });
    k.run(
        c,
        &format!("{exec} oxvsctl dump-flows --names --table IngressRule"),
    );
    k.run(
        c,
        &format!("{exec} oxvsctl dump-flows --names --table EgressRule"),
    );
    let l3 = k.run(
        c,
        &format!("{exec} oxvsctl dump-flows --names --table L3Forwarding"),
    );
    k.expect(l3.contains(ip_b), || {
        format!("L3Forwarding has pod b ({ip_b}):\n{l3}")
    });

    // MTU: the underlay's minus 50
    let uplink_mtu: u32 = std::fs::read_to_string("/sys/class/net/eth0/mtu")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500);
    let link = k.run(c, "kubectl exec -n default a -- ip link show eth0");
    k.expect(link.contains(&format!("mtu {}", uplink_mtu - 50)), || {
        format!("pod MTU = underlay {uplink_mtu} - 50:\n{link}")
    });

    // IP exhaustion
    let ipam = k.run(c, &format!("{exec} ls /var/lib/oxvs/ipam/"));
    k.expect(!ipam.trim().is_empty(), || {
        "one IPAM dir per network".into()
    });
    let n = k.run(
        c,
        &format!("{exec} sh -c 'ls /var/lib/oxvs/ipam/*/ | grep -c \"^[0-9]\"'"),
    );
    k.expect(n.trim() == "2", || {
        format!("the two pods' addresses, got {n}")
    });
    let pods = k.run(
        c,
        "kubectl get pods -A --field-selector spec.nodeName=$NODE --no-headers | wc -l",
    );
    k.expect(pods.trim().parse::<usize>().is_ok_and(|n| n >= 3), || {
        format!("a, b and the oxvs pod, got {pods}")
    });

    let node = k.run(
        c,
        "kubectl get node $NODE -o jsonpath='{.spec.podCIDR} {.status.addresses}'",
    );
    k.expect(node.starts_with(&cidr), || format!("podCIDR first: {node}"));

    let describe = k.run(
        c,
        "kubectl describe pod -n default a | sed -n '/Events/,$p'",
    );
    k.expect(describe.contains("Events"), || describe.clone());

    k.run(c, &format!("{exec} oxvsctl flush-conntrack"));
    let _ = std::io::stdout().flush();
    assert!(
        k.failures.is_empty(),
        "{} doc command(s) failed or printed something else than the doc says:\n\n{}",
        k.failures.len(),
        k.failures.join("\n\n")
    );
}

/// docs/operations.md, Upgrade: the agent alone restarts (`kill 1`) and
/// forwarding goes on; the whole DaemonSet pod is replaced (`rollout
/// restart`, what a ConfigMap change or a new image does) and the node's
/// pods forward again once the new agent re-added their ports.
fn restarts(c: &Cluster, ip_a: &str, node_ip: &str) {
    let restart_count = || -> u32 {
        c.shell(
            "kubectl -n kube-system get $OXVS -o jsonpath='{.status.containerStatuses[?(@.name==\"oxvs-agent\")].restartCount}'",
        )
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
    };
    let before = restart_count();
    c.shell_ok("kubectl -n kube-system exec $OXVS -c oxvs-agent -- kill 1");
    // forwarding goes on while the agent is away (the pod exemption lets
    // the node reach a; a's echo requests leave freely)
    let o = c.kubectl(&["exec", "a", "--", "ping", "-c", "2", "-W", "2", node_ip]);
    assert!(
        o.status.success(),
        "a -> node while the agent restarts:\n{}",
        text(&o)
    );
    let restarted = wait_for(Duration::from_secs(60), || {
        (restart_count() > before).then_some(())
    });
    assert!(
        restarted.is_some(),
        "`kill 1` did not restart the oxvs-agent container"
    );
    c.shell_ok("kubectl -n kube-system wait --for=condition=Ready $OXVS --timeout=60s");
    println!("agent restarted by `kill 1`; forwarding went on");

    c.shell_ok("kubectl -n kube-system rollout restart daemonset/oxvs");
    let out = c.shell_ok("kubectl -n kube-system rollout status daemonset/oxvs --timeout=180s");
    assert!(out.contains("successfully rolled out"), "{out}");
    // the new agent re-adds the ports (at start, then every resync)
    let back = wait_for(Duration::from_secs(60), || {
        c.kubectl(&["exec", "a", "--", "ping", "-c", "1", "-W", "2", node_ip])
            .status
            .success()
            .then_some(())
    });
    assert!(
        back.is_some(),
        "a -> node does not come back after the DaemonSet pod was replaced"
    );
    let show = c.shell_ok("kubectl -n kube-system exec $OXVS -c oxvs-agent -- oxvsctl show");
    assert!(
        show.contains("(a-") && show.contains("(b-"),
        "pods re-attached:\n{show}"
    );
    let _ = ip_a;
    println!("DaemonSet pod replaced; a's port re-added, a -> node pings again");
}
