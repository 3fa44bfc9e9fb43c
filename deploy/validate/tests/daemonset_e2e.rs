//! `deploy/oxvs.yaml` installed on a real single-node Kubernetes cluster
//! (`shared/tools/k8s-local.sh up --kubelet`: etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager, containerd, kubelet 1.20, plus
//! kube-proxy 1.20 in iptables mode), Services reached through kube-proxy,
//! and the `kubectl` commands of `docs/operations.md` run against it.
//!
//! What happens, in order:
//!
//! 1. `deploy/build-image.sh` builds the image from the workspace's built
//!    binaries (no docker, no registry).
//! 2. `k8s-local.sh up --kubelet` starts in the background with a run dir,
//!    ports, node name and CNI dirs of this test's own. The API server
//!    listens on every address and advertises the node's address (the
//!    endpoint of the `kubernetes` Service, which pods can route to); its
//!    certificate also names the `kubernetes` Service's ClusterIP, as a
//!    real cluster's does. Its `up` waits for the node to be Ready, which
//!    needs a CNI configuration: as on a real cluster, the node only
//!    becomes Ready once oxvs' init container has installed the conflist.
//!    Meanwhile the test imports the image into the cluster's containerd,
//!    gives the Node its `spec.podCIDR` (what `kube-controller-manager
//!    --allocate-node-cidrs` does; k8s-local.sh runs it without), starts
//!    kube-proxy ([`KubeProxy`]) and applies the manifest.
//! 3. kube-proxy runs as a process of the test on the host, which is this
//!    single node's network namespace (`--hostname-override` the node,
//!    `--cluster-cidr` its pod CIDR, the admin kubeconfig), and the test
//!    waits until it has programmed the `kubernetes` Service.
//! 4. The manifest is applied with the substitutions a test on a shared
//!    host needs and nothing else (see [`substitute`]): host paths of the
//!    CNI dirs, `/run/oxvs` and `/var/lib/oxvs` under the test's dir (and
//!    the conflist's `agentSocket` pointing there: the plugin runs on the
//!    host); gateway and tunnel names and metrics ports of its own. The
//!    agent's in-cluster configuration is the real one: the `kubernetes`
//!    Service's ClusterIP, through kube-proxy.
//! 5. DaemonSet rolled out, node Ready, plugin and conflist installed; two
//!    busybox pods get addresses from the pod CIDR and ping each other and
//!    the node. Services ([`services`]): pod `a` fetches a page from pod
//!    `web` through the ClusterIP of Service `web` (kube-proxy's DNAT on
//!    the host, the reply back through the gateway so the host undoes it),
//!    and the API server's `/version` through the `kubernetes` Service
//!    (`KUBERNETES_SERVICE_HOST`, as the kubelet sets it, and the pod's
//!    ServiceAccount token). A deny-all-ingress NetworkPolicy then stops
//!    the pod-to-pod ping and the Service connection (the policy applies
//!    to the backend after DNAT).
//! 6. The commands of docs/operations.md (rollout status, the `$OXVS`
//!    lookup, `exec ... oxvsctl show/stats/dump-ports/dump-flows/traceflow`,
//!    the STATUS call, `logs | grep`, the IPAM listing, `ip link show eth0`,
//!    the Service troubleshooting: endpoints, `iptables-save | grep`,
//!    `conntrack -L`, traceflow to the backend, the reply flow's counter)
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
//! kube-proxy is stopped and `kube-proxy --cleanup` removes its rules, the
//! sysctls it may change are put back, then `k8s-local.sh down`, then
//! whatever oxvs left on the host under this test's names (gateway,
//! tunnel, masquerade rule). On failure the logs are printed (with
//! kube-proxy's NAT rules, the host's conntrack entries of the pod CIDR
//! and the switch's flows) and the test dir is kept.
//!
//! Skips (prints SKIPPED, passes) unless: root; k8s-local.sh found; a
//! cached build WITH kube-proxy and the controllers
//! (`OXVS_K8S_EXTRA_COMPONENTS="kube-proxy kube-scheduler
//! kube-controller-manager" k8s-local.sh build`; a DaemonSet needs the
//! controllers); etcd, kubectl, ctr, containerd, umoci, skopeo, iptables,
//! conntrack, busybox-static and the reference CNI plugins (`loopback`, `portmap` in
//! /usr/lib/cni) installed; the four oxvs binaries built; a default route
//! (its interface's address is the node's); no other kubelet running
//! (k8s-local.sh allows one per host). It never starts a build. With
//! `OXVS_TESTS_NO_SKIP=1` (set by `scripts/test.sh`, i.e. CI, whose setup
//! builds the cache) a missing prerequisite fails the test instead.

mod common;
use common::{find_on_path, free_port, k8s_host, skip, text, workspace_root, K8sHost};

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

const BINS: [&str; 4] = ["oxvs-switchd", "oxvs-agent", "oxvsctl", "oxvs-cni"];
/// The image the manifest names (kept: the test imports it under that name).
const IMAGE: &str = "localhost/oxvs:0.1.0";
const CNI_PLUGINS: &str = "/usr/lib/cni";
/// The cluster's Service range (k8s-local.sh's `OXVS_K8S_SERVICE_CIDR`,
/// given explicitly) and its first address, the `kubernetes` Service's
/// ClusterIP, which the API server's certificate must name for the
/// in-cluster configuration (`https://$KUBERNETES_SERVICE_HOST`).
const SERVICE_CIDR: &str = "10.0.0.0/24";
const KUBERNETES_CLUSTER_IP: &str = "10.0.0.1";

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

/// The address kubelet takes as its Node's InternalIP (it runs without
/// `--node-ip`, and its node name resolves to nothing): the first global
/// IPv4 address of the default route's interface.
fn default_route_ipv4() -> Option<Ipv4Addr> {
    let route = Command::new("ip")
        .args(["-4", "-o", "route", "show", "default"])
        .output()
        .ok()?;
    let route = String::from_utf8_lossy(&route.stdout).into_owned();
    let mut words = route.split_whitespace();
    let dev = words.find(|w| *w == "dev").and_then(|_| words.next())?;
    let addr = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", dev, "scope", "global"])
        .output()
        .ok()?;
    let addr = String::from_utf8_lossy(&addr.stdout).into_owned();
    let mut words = addr.split_whitespace();
    words
        .find(|w| *w == "inet")
        .and_then(|_| words.next())
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
}

struct Prereqs {
    tools: PathBuf,
    cache: PathBuf,
    kubectl: PathBuf,
    bins: PathBuf,
    node_ip: Ipv4Addr,
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
            "kube-proxy",
        ],
        "OXVS_K8S_EXTRA_COMPONENTS=\"kube-proxy kube-scheduler kube-controller-manager\" k8s-local.sh build",
    )?;
    for t in ["etcd", "ctr", "containerd", "umoci", "skopeo", "iptables"] {
        if find_on_path(t).is_none() {
            return Err(format!(
                "{t} not installed (k8s-local.sh build installs it)"
            ));
        }
    }
    // the doc's Service troubleshooting runs `conntrack -L`
    if find_on_path("conntrack").is_none() {
        return Err("conntrack not installed (Debian package conntrack)".into());
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
    let node_ip = default_route_ipv4()
        .ok_or("no default route with an IPv4 address (kubelet takes its address as the node's)")?;
    if kubelet_running() {
        return Err("another kubelet runs on this host (k8s-local.sh allows one per host)".into());
    }
    Ok(Prereqs {
        tools,
        cache,
        kubectl,
        bins,
        node_ip,
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

// -------------------------------------------------------- kube-proxy ----

/// What kube-proxy may change in its network namespace besides iptables:
/// `route_localnet` (iptables mode always sets it), the conntrack table
/// size and TCP timeouts (only for non-zero `--conntrack-*` flags, which
/// [`KubeProxy::start`] passes as 0; saved and restored all the same).
/// Also `send_redirects`, which the oxvs agent turns off for all
/// interfaces when it runs next to kube-proxy (`agent/src/hostnet.rs`).
const PROXY_SYSCTLS: [&str; 6] = [
    "/proc/sys/net/ipv4/conf/all/route_localnet",
    "/proc/sys/net/ipv4/conf/all/send_redirects",
    "/proc/sys/net/netfilter/nf_conntrack_max",
    "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
    "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "/sys/module/nf_conntrack/parameters/hashsize",
];

/// kube-proxy (iptables mode), run by the test on the host: the single
/// node's network namespace is the host's. Drop stops it, removes its
/// rules (`kube-proxy --cleanup`) and puts back the sysctls it changed.
struct KubeProxy {
    child: Child,
    bin: PathBuf,
    log: PathBuf,
    /// [`PROXY_SYSCTLS`] that exist, with their values before the start
    saved: Vec<(&'static str, String)>,
}

impl KubeProxy {
    fn start(
        bin: &Path,
        kubeconfig: &Path,
        node: &str,
        cluster_cidr: &str,
        log: &Path,
    ) -> std::io::Result<KubeProxy> {
        let saved = PROXY_SYSCTLS
            .iter()
            .filter_map(|p| Some((*p, std::fs::read_to_string(p).ok()?.trim().to_string())))
            .collect();
        let out = std::fs::File::create(log)?;
        let child = Command::new(bin)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--hostname-override",
                node,
                "--proxy-mode",
                "iptables",
                "--cluster-cidr",
                cluster_cidr,
                "--healthz-bind-address",
                &format!("127.0.0.1:{}", free_port()),
                "--metrics-bind-address",
                &format!("127.0.0.1:{}", free_port()),
                // leave the host's conntrack settings as they are
                "--conntrack-max-per-core",
                "0",
                "--conntrack-tcp-timeout-established",
                "0",
                "--conntrack-tcp-timeout-close-wait",
                "0",
                // its default, -999, needs CAP_SYS_RESOURCE
                "--oom-score-adj",
                "0",
                "--v",
                "2",
            ])
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        Ok(KubeProxy {
            child,
            bin: bin.to_path_buf(),
            log: log.to_path_buf(),
            saved,
        })
    }

    /// Whether it has exited (and how).
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn log_tail(&self, n: usize) -> String {
        let t = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// The host's `nat` rules of kube-proxy's chains (`iptables -S` form).
fn kube_nat_rules() -> String {
    let out = Command::new("iptables")
        .args(["-w", "5", "-t", "nat", "-S"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter(|l| {
            [
                "KUBE-SERVICES",
                "KUBE-SVC-",
                "KUBE-SEP-",
                "KUBE-POSTROUTING",
                "KUBE-MARK-MASQ",
                "KUBE-NODEPORTS",
            ]
            .iter()
            .any(|c| l.contains(c))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        // Its chains and the jumps to them, in every table. The IPVS part of
        // --cleanup fails without the `ipset` command and exits 1 for it
        // (there are no IPVS rules here), so the result is checked instead.
        let out = Command::new(&self.bin)
            .args(["--cleanup", "--v", "0"])
            .output();
        // (KUBE-MARK-MASQ is shared with kubelet: --cleanup leaves it.)
        let left: Vec<String> = kube_nat_rules()
            .lines()
            .filter(|l| !l.contains("KUBE-MARK-MASQ"))
            .map(str::to_string)
            .collect();
        let left = left.join("\n");
        if !left.is_empty() {
            eprintln!(
                "kube-proxy --cleanup left rules in the host's nat table (k8s-local.sh down removes the KUBE-* chains it did not see before):\n{left}\n{}",
                out.map(|o| text(&o)).unwrap_or_else(|e| e.to_string())
            );
        }
        for (path, before) in &self.saved {
            let now = std::fs::read_to_string(path).unwrap_or_default();
            if now.trim() != before {
                match std::fs::write(path, before) {
                    Ok(()) => println!(
                        "restored {path} to {before} (kube-proxy had set {})",
                        now.trim()
                    ),
                    Err(e) => eprintln!("could not restore {path} to {before}: {e}"),
                }
            }
        }
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
    proxy: Option<KubeProxy>,
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

    /// The host's conntrack entries of the pod CIDR and the switch's flows
    /// and connections: what to look at when a Service path fails.
    fn network_evidence(&self) -> String {
        let mut out = String::new();
        let conntrack = if find_on_path("conntrack").is_some() {
            Command::new("conntrack")
                .arg("-L")
                .output()
                .map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .lines()
                        .filter(|l| l.contains(&self.names.prefix))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_else(|e| e.to_string())
        } else {
            "(conntrack not installed)".to_string()
        };
        out.push_str(&format!(
            "---- conntrack -L | grep {}\n{conntrack}\n",
            self.names.prefix
        ));
        for cmd in ["oxvsctl dump-flows --names", "oxvsctl dump-conntrack"] {
            let r = self.shell(&format!(
                "kubectl -n kube-system exec $OXVS -c oxvs-agent -- {cmd}"
            ));
            out.push_str(&format!("---- {cmd}\n{}\n", r.unwrap_or_else(|e| e)));
        }
        out
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
        eprintln!("---- kube-proxy's rules in the host's nat table");
        eprintln!("{}", kube_nat_rules());
        eprintln!("{}", self.network_evidence());
        for f in [
            "up.log",
            "run/logs/kubelet.log",
            "run/logs/containerd.log",
            "kube-proxy.log",
        ] {
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
        // kube-proxy's rules and sysctls, before the cluster goes
        self.proxy.take();
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
    v.as_array_mut().expect("manifest: a list")
}

/// `deploy/oxvs.yaml` with this test's substitutions; returns the new
/// multi-document YAML. Every substitution asserts that what it replaces
/// is there, so the test fails if the manifest changes under it.
fn substitute(manifest: &str, dir: &Path, n: &Names, metrics: (u16, u16)) -> String {
    let mut out = String::new();
    let mut bytes = manifest.as_bytes();
    let options = oxvs_deploy_validate::yaml_options();
    for doc in serde_saphyr::read_with_options::<_, Value>(&mut bytes, options) {
        let mut v = doc.expect("manifest parses");
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
                // No KUBERNETES_SERVICE_HOST/PORT: the agent reaches the API
                // server as in any cluster with kube-proxy, through the
                // `kubernetes` Service's ClusterIP.
                if let Some(env) = c.get("env").and_then(Value::as_array) {
                    assert!(
                        !env.iter().any(|e| e["name"]
                            .as_str()
                            .is_some_and(|n| n.starts_with("KUBERNETES_"))),
                        "{name} overrides the in-cluster API address"
                    );
                }
            }
        }
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&v).expect("serialise"));
    }
    out
}

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
        Err(why) => return skip(&why),
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
        // The `kubernetes` Service's endpoint: the node's address, where
        // pods (through kube-proxy's DNAT) can reach the API server.
        ("OXVS_K8S_API_BIND", "0.0.0.0".to_string()),
        ("OXVS_K8S_API_ADVERTISE", p.node_ip.to_string()),
        ("OXVS_K8S_SERVICE_CIDR", SERVICE_CIDR.to_string()),
        ("OXVS_K8S_API_EXTRA_IPS", KUBERNETES_CLUSTER_IP.to_string()),
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
        proxy: None,
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
    assert_eq!(
        node_ip, p.node_ip,
        "the API server advertises {} (the default route's address), kubelet registered {node_ip}",
        p.node_ip
    );
    let kp = c.names.kubelet_port;
    c.relay = Some(
        Relay::start(
            SocketAddr::from((node_ip, kp)),
            SocketAddr::from((Ipv4Addr::LOCALHOST, kp)),
        )
        .expect("relay to the kubelet"),
    );

    // 3. kube-proxy, on the host (this node's network namespace), once the
    // Node it takes its address from exists
    c.proxy = Some(
        KubeProxy::start(
            &p.cache.join("bin/kube-proxy"),
            &c.run_dir().join("admin.kubeconfig"),
            &node,
            &cidr,
            &dir.join("kube-proxy.log"),
        )
        .expect("start kube-proxy"),
    );
    let programmed = wait_for(Duration::from_secs(60), || {
        let proxy = c.proxy.as_mut().expect("kube-proxy");
        if let Some(st) = proxy.exited() {
            panic!("kube-proxy exited ({st}):\n{}", proxy.log_tail(30));
        }
        kube_nat_rules()
            .contains("default/kubernetes:https")
            .then_some(())
    });
    assert!(
        programmed.is_some(),
        "kube-proxy did not program the `kubernetes` Service in 60 s:\n{}",
        c.proxy.as_ref().map(|p| p.log_tail(30)).unwrap_or_default()
    );
    println!(
        "kube-proxy programmed the kubernetes Service after {:?}",
        t0.elapsed()
    );

    // 4. the manifest
    let manifest =
        std::fs::read_to_string(workspace_root().join("deploy/oxvs.yaml")).expect("read manifest");
    let applied = substitute(&manifest, &dir, &c.names, (free_port(), free_port()));
    let mpath = dir.join("oxvs.yaml");
    std::fs::write(&mpath, &applied).expect("write manifest");
    c.kubectl_ok(&["apply", "-f", &mpath.display().to_string()]);

    // 5. node Ready: `up` returns once the init container wrote the conflist
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
    privileges(&c, &dir);

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

    let web = services(&c, &dir);

    // the NetworkPolicy
    let npath = dir.join("deny-all.yaml");
    std::fs::write(&npath, DENY_ALL).expect("write policy");
    c.kubectl_ok(&["apply", "-f", &npath.display().to_string()]);
    let dropped = wait_for(Duration::from_secs(30), || {
        (!ping("a", &ip_b).status.success()).then_some(())
    });
    assert!(dropped.is_some(), "a -> b still pings 30 s after deny-all");
    println!("deny-all ingress: a -> b ping fails");
    // ... and applies to the Service's backend after kube-proxy's DNAT
    let o = fetch(&c, "a", &web.url);
    assert!(
        !o.status.success(),
        "a -> Service web ({}) still answers under deny-all ingress:\n{}",
        web.url,
        text(&o)
    );
    println!("deny-all ingress: a -> Service web fails too");

    agent_settings_took(&c);
    doc_commands(&c, &ip_b, &web);
    restarts(&c, &ip_a, &node_ip.to_string());
    println!("all done in {:?}", t0.elapsed());
}

// -------------------------------------------------------- privileges ----

/// Capability numbers (linux/capability.h).
const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_IPC_LOCK: u32 = 14;
const CAP_SYS_ADMIN: u32 = 21;

/// The running daemons of this test (found on the host by their
/// `--gateway` flag, which names the test's gateway): (pid, status text).
fn daemon_status(comm: &str, gateway: &str) -> Vec<(u32, String)> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("comm")).ok()?;
            if name.trim() != comm {
                return None;
            }
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            let ours = args
                .windows(2)
                .any(|w| w[0] == b"--gateway" && w[1] == gateway.as_bytes());
            if !ours {
                return None;
            }
            Some((pid, std::fs::read_to_string(e.path().join("status")).ok()?))
        })
        .collect()
}

/// A `/proc/PID/status` field's value.
fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(str::trim)
}

/// The DaemonSet runs with the least privileges deploy/README.md lists,
/// as the kernel sees them: each daemon's effective, permitted and
/// bounding capability sets are exactly its list (so traffic working in
/// this test proves they suffice), no_new_privs is set, a seccomp filter
/// applies; only the agent has the ServiceAccount token; the sockets on
/// the host are 0600.
fn privileges(c: &Cluster, dir: &Path) {
    let gw = c.names.gateway.clone();
    for (comm, caps) in [
        (
            "oxvs-switchd",
            &[CAP_NET_ADMIN, CAP_NET_RAW, CAP_IPC_LOCK, CAP_SYS_ADMIN][..],
        ),
        ("oxvs-agent", &[CAP_NET_ADMIN, CAP_SYS_ADMIN][..]),
    ] {
        let want: u64 = caps.iter().map(|c| 1u64 << c).sum();
        let procs = daemon_status(comm, &gw);
        assert_eq!(procs.len(), 1, "one {comm} with --gateway {gw} on the host");
        let (pid, status) = &procs[0];
        for key in ["CapEff", "CapPrm", "CapBnd"] {
            let v = status_field(status, key)
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .unwrap_or_else(|| panic!("{comm} ({pid}): no {key} in\n{status}"));
            assert_eq!(v, want, "{comm} ({pid}) {key} {v:#x}, want {want:#x}");
        }
        assert_eq!(
            status_field(status, "NoNewPrivs"),
            Some("1"),
            "{comm} no_new_privs"
        );
        assert_eq!(
            status_field(status, "Seccomp"),
            Some("2"),
            "{comm}: a seccomp filter"
        );
        let memlock = std::fs::read_to_string(format!("/proc/{pid}/limits"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("Max locked memory"))
            .unwrap_or_default()
            .to_string();
        println!(
            "{comm} (pid {pid}): capabilities {want:#x}, no_new_privs, seccomp filter; {memlock}"
        );
    }
    let token = "/var/run/secrets/kubernetes.io/serviceaccount/token";
    let sw = c.shell(&format!(
        "kubectl -n kube-system exec $OXVS -c oxvs-switchd -- cat {token}"
    ));
    assert!(sw.is_err(), "the switch can read a ServiceAccount token");
    let ag = c.shell_ok(&format!(
        "kubectl -n kube-system exec $OXVS -c oxvs-agent -- cat {token}"
    ));
    assert!(!ag.trim().is_empty(), "the agent has its token");
    for sock in ["switchd.sock", "cni.sock", "agent.sock"] {
        let p = dir.join("oxvs-run").join(sock);
        let m = std::fs::symlink_metadata(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .mode();
        assert_eq!(m & 0o777, 0o600, "mode of {}", p.display());
    }
    println!("token only in the agent; sockets 0600");
    let libxdp = c.shell("kubectl -n kube-system logs $OXVS -c oxvs-switchd | grep -i 'libxdp\\|libbpf' | sort | uniq -c");
    println!(
        "switchd's libxdp messages:\n{}",
        libxdp.unwrap_or_else(|e| e)
    );
}

/// What the agent sets on the node through the mounted /proc/sys/net
/// (its own is read-only) took effect, and it said nothing failed.
fn agent_settings_took(c: &Cluster) {
    let gw = &c.names.gateway;
    for (path, want) in [
        ("/proc/sys/net/ipv4/ip_forward".to_string(), "1"),
        (format!("/proc/sys/net/ipv4/conf/{gw}/send_redirects"), "0"),
    ] {
        let v = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(v.trim(), want, "{path}");
    }
    let logs = c.shell_ok("kubectl -n kube-system logs $OXVS -c oxvs-agent");
    for bad in [
        "cannot turn off ICMP redirects",
        "pod egress to outside the cluster will not work",
        "Operation not permitted",
        "Read-only file system",
    ] {
        assert!(!logs.contains(bad), "the agent's log says '{bad}':\n{logs}");
    }
    // (libxdp's own stderr lines say "Operation not permitted" when its
    // dispatcher check fails, as it does on this kernel with every
    // capability: it then loads its program directly. What counts is that
    // switchd reports no error.)
    let logs = c.shell_ok("kubectl -n kube-system logs $OXVS -c oxvs-switchd");
    assert!(!logs.contains(" ERROR "), "the switch's log:\n{logs}");
}

/// Service `web` and its one endpoint, pod `web`.
struct WebService {
    /// pod web's address
    pod_ip: String,
    cluster_ip: String,
    /// `http://CLUSTER_IP/`
    url: String,
}

const WEB: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default, labels: {app: web}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: localhost/busybox:latest
      imagePullPolicy: Never
      command: [sh, -c, 'mkdir -p /www && echo "hello from $(hostname)" >/www/index.html && exec httpd -f -p 8080 -h /www']
      ports: [{containerPort: 8080}]
      readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
"#;

/// `wget URL` in pod `from` (busybox's has no timeout of its own).
fn fetch(c: &Cluster, from: &str, url: &str) -> Output {
    c.kubectl(&["exec", from, "--", "timeout", "5", "wget", "-qO-", url])
}

/// Services through kube-proxy. Pod `a` fetches `web`'s page through the
/// ClusterIP of Service `web` (kube-proxy's DNAT on the host; `web` is on
/// the same node, so its reply must go back out of the gateway for the
/// host to undo the DNAT), and the API server's `/version` through the
/// `kubernetes` Service, addressed as the kubelet tells pods
/// (`KUBERNETES_SERVICE_HOST/PORT`) with the pod's ServiceAccount token.
fn services(c: &Cluster, dir: &Path) -> WebService {
    let path = dir.join("web.yaml");
    std::fs::write(&path, WEB).expect("write web.yaml");
    c.kubectl_ok(&["apply", "-f", &path.display().to_string()]);
    c.kubectl_ok(&["wait", "--for=condition=Ready", "pod/web", "--timeout=120s"]);
    let web_ip = c
        .kubectl_ok(&["get", "pod", "web", "-o", "jsonpath={.status.podIP}"])
        .trim()
        .to_string();
    let cluster_ip = c
        .kubectl_ok(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"])
        .trim()
        .to_string();
    // kube-proxy has the endpoint (EndpointSlices of the controller-manager)
    let dnat = format!("--to-destination {web_ip}:8080");
    let programmed = wait_for(Duration::from_secs(60), || {
        kube_nat_rules().contains(&dnat).then_some(())
    });
    assert!(
        programmed.is_some(),
        "kube-proxy has no DNAT to web ({web_ip}:8080) 60 s after it was Ready:\n{}\n{}\n{}",
        text(&c.kubectl(&["get", "endpoints,endpointslices", "-o", "wide"])),
        kube_nat_rules(),
        c.proxy.as_ref().map(|p| p.log_tail(30)).unwrap_or_default()
    );
    let url = format!("http://{cluster_ip}/");
    // A transient loss may cost an attempt; a broken path fails them all.
    let first = (0..3)
        .map(|_| fetch(c, "a", &url))
        .find(|o| o.status.success());
    let Some(o) = first else {
        service_failure(
            c,
            &format!("a -> Service web ({url}, backend web {web_ip}:8080)"),
            &url,
        );
    };
    let page = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(page.trim(), "hello from web", "the page through {url}");
    for i in 0..5 {
        let o = fetch(c, "a", &url);
        assert!(
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("hello from web"),
            "a -> Service web ({url}): connection {} of 6 failed:\n{}",
            i + 2,
            text(&o)
        );
    }
    println!("a -> Service web ({url}) -> pod web ({web_ip}:8080): 6 connections answered");

    // the `kubernetes` Service, as in-cluster clients find it
    let kubernetes = c
        .kubectl_ok(&[
            "get",
            "service",
            "kubernetes",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .trim()
        .to_string();
    assert_eq!(
        kubernetes, KUBERNETES_CLUSTER_IP,
        "the kubernetes Service's ClusterIP"
    );
    let env = c.kubectl_ok(&[
        "exec",
        "a",
        "--",
        "sh",
        "-c",
        "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT",
    ]);
    assert_eq!(
        env.trim(),
        format!("{kubernetes}:443"),
        "what the kubelet tells pods"
    );
    let version = c.kubectl(&[
        "exec",
        "a",
        "--",
        "sh",
        "-c",
        "timeout 10 wget -qO- --no-check-certificate \
         --header \"Authorization: Bearer $(cat /var/run/secrets/kubernetes.io/serviceaccount/token)\" \
         https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version",
    ]);
    let body = String::from_utf8_lossy(&version.stdout).into_owned();
    if !(version.status.success() && body.contains(r#""gitVersion": "v1.20"#)) {
        eprintln!("{}", text(&version));
        service_failure(
            c,
            &format!("a -> Service kubernetes (https://{kubernetes}:443/version)"),
            &format!("https://{kubernetes}:443/version"),
        );
    }
    println!(
        "a -> Service kubernetes (https://{kubernetes}:443) -> the API server: {}",
        body.lines()
            .find(|l| l.contains("gitVersion"))
            .unwrap_or_default()
            .trim()
    );
    WebService {
        pod_ip: web_ip,
        cluster_ip,
        url,
    }
}

/// A Service path failed: tcpdump on the gateway (the host's own
/// connections, kubelet's probes, left out) while pod `a` tries `url` once
/// more, then the failure. The Drop diagnostics add kube-proxy's NAT
/// rules, the host's conntrack entries and the switch's flows and
/// connections.
fn service_failure(c: &Cluster, what: &str, url: &str) -> ! {
    let mut evidence = String::new();
    if find_on_path("tcpdump").is_some() {
        let filter = format!("not host {}1", c.names.prefix);
        let dump = Command::new("timeout")
            .args([
                "8",
                "tcpdump",
                "-nn",
                "-l",
                "-c",
                "40",
                "-i",
                &c.names.gateway,
                &filter,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        std::thread::sleep(Duration::from_secs(1));
        let again = c.kubectl(&[
            "exec",
            "a",
            "--",
            "timeout",
            "5",
            "wget",
            "--no-check-certificate",
            "-qO-",
            url,
        ]);
        evidence.push_str(&format!("---- once more: wget {url}\n{}\n", text(&again)));
        match dump.and_then(|d| d.wait_with_output()) {
            Ok(o) => evidence.push_str(&format!(
                "---- tcpdump -i {} {filter}, meanwhile\n{}\n",
                c.names.gateway,
                text(&o)
            )),
            Err(e) => evidence.push_str(&format!("tcpdump: {e}\n")),
        }
    } else {
        evidence.push_str("(tcpdump not installed: no capture)\n");
    }
    panic!("{what}: no answer\n{evidence}");
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
fn doc_commands(c: &Cluster, ip_b: &str, web: &WebService) {
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

    // MTU: 65535 on the node (the switch takes large frames whole,
    // `--local-mtu auto`), the underlay's minus 50 on the way off it (each
    // pod's default route; busybox's `ip` does not print route MTUs, so
    // they are read from the node, as docs/operations.md does).
    let uplink_mtu: u32 = std::fs::read_to_string("/sys/class/net/eth0/mtu")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500);
    let link = k.run(c, "kubectl exec -n default a -- ip link show eth0");
    k.expect(link.contains("mtu 65535"), || {
        format!("pod interface MTU 65535 (large frames on the node):\n{link}")
    });
    let routes = k.run(c, "ip -all netns exec ip -4 route show default");
    k.expect(routes.contains(&format!("mtu {}", uplink_mtu - 50)), || {
        format!("pod default routes: MTU = underlay {uplink_mtu} - 50:\n{routes}")
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
    k.expect(n.trim() == "3", || {
        format!("the addresses of pods a, b and web, got {n}")
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

    // A Service does not answer: here deny-all drops pod web's ingress
    let endpoints = k.run(c, "kubectl get endpoints -n default web");
    k.expect(endpoints.contains(&format!("{}:8080", web.pod_ip)), || {
        format!(
            "endpoints of web name pod web ({}):\n{endpoints}",
            web.pod_ip
        )
    });
    let nat = k.run(c, "iptables-save -t nat | grep 'default/web'");
    k.expect(
        nat.contains(&format!("--to-destination {}:8080", web.pod_ip)),
        || format!("kube-proxy's DNAT to pod web:\n{nat}"),
    );
    let ct = k.run(c, &format!("conntrack -L -d {}", web.cluster_ip));
    k.expect(ct.contains(&web.cluster_ip), || {
        format!("the host's NAT entries for {}:\n{ct}", web.cluster_ip)
    });
    let trace = k.run(c, &format!("{exec} \\\n  oxvsctl traceflow --src default/a --dst default/web --proto tcp --dport 8080 || test $? = 4"));
    k.expect(
        trace.contains("dropped") && trace.contains("default/deny-all"),
        || format!("traceflow a -> web names the policy:\n{trace}"),
    );
    let reply = k.run(
        c,
        &format!("{exec} \\\n  oxvsctl dump-flows --names --table L3Forwarding | grep ct_mark"),
    );
    k.expect(
        reply.contains("priority=210")
            && reply.contains("ct_state=+rpl+trk,ct_mark=0x1/0x1")
            && !reply.contains("n_packets=0,"),
        || format!("the reply detour flow counted the Service connections' replies:\n{reply}"),
    );

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
