//! The Kubernetes side of a lab started with `up --kube-proxy`: a real
//! kube-apiserver (etcd + kube-apiserver 1.20 from `k8s-local.sh`), a real
//! kube-proxy (iptables mode) in every node's host namespace, and the lab
//! playing the endpoints controller for the Services applied through it.
//! Also `oxvs-lab kubectl` (kubectl against the lab's API server).
//!
//! Layout:
//! - `k8s-local.sh up` runs inside the underlay namespace `<lab>-ul`, with
//!   its run directory `<lab dir>/k8s` and the API server listening on
//!   every address of that namespace (`OXVS_K8S_API_BIND=0.0.0.0`), port
//!   6443, etcd on 2379/2380: loopback of a namespace of the lab's own, so
//!   it never clashes with another `k8s-local.sh` on the host or another
//!   lab. Every node reaches it at the bridge address 192.168.77.1
//!   ([`api_url`]; the lab's `node.kubeconfig`, [`write_node_kubeconfig`]);
//!   it advertises that address (so the certificate names it), and the
//!   `kubernetes` Service (10.96.0.1:443) has an endpoint pods can reach. The controllers of
//!   the build are not started (`OXVS_K8S_CONTROLLERS=0`): the endpoints
//!   controller would empty every Endpoints object, the lab's pods not
//!   being API objects.
//! - One Node object per lab node (name, `spec.podCIDR`, InternalIP), then
//!   `kube-proxy --proxy-mode iptables --hostname-override node-N
//!   --cluster-cidr 10.244.0.0/16` in `<lab>-node-N` (log
//!   `node-N/kube-proxy.log`); `up` returns once every kube-proxy has
//!   programmed the `kubernetes` Service.
//! - Services and Endpoints applied through the lab go to the API server
//!   with kubectl (run in `<lab>-ul` through `<lab dir>/k8s/admin.kubeconfig`),
//!   together with their Namespace. For a Service with a selector the lab
//!   writes the Endpoints ([`crate::service::endpoints_object`]) and
//!   rewrites them whenever its pods change (apply, delete, node removal);
//!   the agents keep reading the manifest directory. `apply` (and a
//!   `delete` that changed Endpoints) then waits, 10 s at most, until every
//!   kube-proxy has programmed those Services with that many endpoints
//!   ([`programmed`]: `iptables-save` in the node namespaces), so traffic
//!   right after it meets the new rules; a warning when it does not.
//!
//! A dual-stack lab (`up --kube-proxy --ip-family dual`) runs Kubernetes
//! v1.20's dual-stack: the API server with the `IPv6DualStack` feature
//! gate and a second ClusterIP range `fd00:10:96::/108` (through a
//! wrapper of the build's binary: [`write_dual_stack_cache`]), each
//! kube-proxy with the gate (an IPv4 and an IPv6 proxier, `iptables` and
//! `ip6tables`) reading EndpointSlices, which the lab writes per family
//! next to the Endpoints (and mirrors from the user's Endpoints).
//! Services ask for IPv6 with `spec.ipFamilies`/`spec.ipFamilyPolicy` as
//! in Kubernetes; the wait after `apply` checks both families' rules.
//!
//! An IPv6-only lab (`up --kube-proxy --ip-family ipv6`) is a
//! single-stack IPv6 cluster: the API server's one ClusterIP range is
//! [`SERVICE_CIDR6`] (no gate), it binds `::` and advertises the bridge's
//! IPv6 address (`https://[fd00:192:168:77::1]:6443` for the nodes, the
//! `kubernetes` Service `fd00:10:96::1`); each kube-proxy runs the IPv6
//! proxier only (`--bind-address` the node's IPv6 address,
//! `--cluster-cidr` [`CLUSTER_CIDR6`], reading Endpoints), kubelet's rules
//! go in with `ip6tables-restore`, and every check reads
//! `ip6tables-save`. Services are checked as with `--proxy`
//! ([`super::proxy::check_service`]: IPv6 unless they ask otherwise,
//! which is refused); the lab's Endpoints list the pods' IPv6 addresses.
//! [`KubeState::family`] says which lab it is; [`Family::primary`] and
//! [`Family::all`] which families' rules and Endpoints there are.
//!
//! `down` stops the kube-proxies and runs `k8s-local.sh down` before the
//! namespaces go (their iptables rules go with them).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{json, Value};

use super::up::{UNDERLAY, UNDERLAY6};
use super::{Bins, Ctx, Global};
use crate::manifest::{self, Object};
use crate::netns;
use crate::procs;
use crate::service::{self, Backend, Family};
use crate::state::{IpFamily, KubeState, LabState, NodeState};

/// The API server's port (inside `<lab>-ul`).
pub const API_PORT: u16 = 6443;
/// The Service ClusterIP range.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The pods' range (kube-proxy `--cluster-cidr`).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The IPv6 Service ClusterIP range of a dual-stack or IPv6-only lab
/// (v1.20 takes at most 20 bits of IPv6 ClusterIPs: /108).
pub const SERVICE_CIDR6: &str = "fd00:10:96::/108";
/// The pods' IPv6 range of a dual-stack or IPv6-only lab (every node's
/// `fd00:10:244:N::/64`).
pub const CLUSTER_CIDR6: &str = "fd00:10:244::/56";
/// What kube-proxy's command line contains (for [`procs::alive`]).
pub const KUBE_PROXY_NEEDLE: &str = "kube-proxy";
/// kubectl's `--request-timeout`.
const KUBECTL_TIMEOUT: &str = "--request-timeout=20s";

/// The API server's address as the nodes see it: the underlay bridge's,
/// its IPv6 one in an IPv6-only lab (whose nodes have no IPv4).
pub fn api_address(family: IpFamily) -> String {
    match family {
        IpFamily::Ipv6 => format!("{UNDERLAY6}::1"),
        IpFamily::Ipv4 | IpFamily::Dual => format!("{UNDERLAY}.1"),
    }
}

/// `https://<api_address>:6443` (an IPv6 address in brackets).
pub fn api_url(family: IpFamily) -> String {
    match api_address(family).parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(a)) => format!("https://[{a}]:{API_PORT}"),
        _ => format!("https://{}:{API_PORT}", api_address(family)),
    }
}

/// The `iptables-save` of `family`'s proxier.
fn save_tool(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "iptables-save",
        Family::Ipv6 => "ip6tables-save",
    }
}

/// The `iptables-restore` of `family`.
fn restore_tool(family: Family) -> &'static str {
    match family {
        Family::Ipv4 => "iptables-restore",
        Family::Ipv6 => "ip6tables-restore",
    }
}

/// Whether kube-proxy reads EndpointSlices, which the lab then writes per
/// family (a dual-stack lab), or Endpoints (the lab's primary family only).
fn reads_slices(k: &KubeState) -> bool {
    k.family() == IpFamily::Dual
}

/// The Endpoints the lab last wrote for `family` (an IPv6-only lab's are
/// in [`KubeState::endpoints`], its primary family's map).
fn endpoints_of(k: &KubeState, family: Family) -> &BTreeMap<String, Value> {
    if family == Family::primary(k.family()) {
        &k.endpoints
    } else {
        &k.endpoints6
    }
}

/// What `up --kube-proxy` needs from the host.
#[derive(Clone, Debug)]
pub struct KubeTools {
    pub script: PathBuf,
    pub cache: PathBuf,
    pub kubectl: PathBuf,
}

/// `k8s-local.sh`: `$OXVS_SHARED_TOOLS`, then `shared/tools` next to an
/// ancestor of this binary or of the source tree, then `/work/shared/tools`.
fn find_script(bins: &Bins) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("OXVS_SHARED_TOOLS") {
        dirs.push(PathBuf::from(d));
    }
    for start in [bins.lab.as_path(), Path::new(env!("CARGO_MANIFEST_DIR"))] {
        for a in start.ancestors().skip(1) {
            dirs.push(a.join("shared/tools"));
        }
    }
    dirs.push(PathBuf::from("/work/shared/tools"));
    dirs.into_iter()
        .map(|d| d.join("k8s-local.sh"))
        .find(|p| p.is_file())
}

/// A kubectl that runs: `$OXVS_KUBECTL`, the build's, or one on `PATH`.
fn find_kubectl(cache: &Path) -> Option<PathBuf> {
    let works = |p: &Path| {
        Command::new(p)
            .args(["version", "--client"])
            .stdin(Stdio::null())
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if let Some(k) = std::env::var_os("OXVS_KUBECTL") {
        return Some(PathBuf::from(k)).filter(|p| works(p));
    }
    let mut candidates = vec![cache.join("bin/kubectl")];
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("kubectl")));
    }
    candidates.into_iter().find(|p| p.is_file() && works(p))
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(name).is_file()))
}

/// Checks, before anything is made, that `up --kube-proxy` can run. Never
/// builds: a missing binary is an error naming the build command.
pub fn find_tools(bins: &Bins) -> anyhow::Result<KubeTools> {
    let cache = PathBuf::from(
        std::env::var_os("OXVS_K8S_CACHE").unwrap_or_else(|| "/var/cache/oxvs-k8s".into()),
    );
    let script = find_script(bins).context(
        "--kube-proxy needs k8s-local.sh (shared/tools): not found; set $OXVS_SHARED_TOOLS to its directory",
    )?;
    let s = script.display();
    for b in ["kube-apiserver", "kubelet"] {
        if !cache.join("bin").join(b).is_file() {
            anyhow::bail!(
                "--kube-proxy needs the Kubernetes build of k8s-local.sh, and {} is missing: build it once with `OXVS_K8S_EXTRA_COMPONENTS=\"kube-proxy\" {s} build` (~10 min cold; set $OXVS_K8S_CACHE if it is elsewhere). `up` never starts a build",
                cache.join("bin").join(b).display()
            );
        }
    }
    if !cache.join("bin/kube-proxy").is_file() {
        anyhow::bail!(
            "--kube-proxy needs kube-proxy from the Kubernetes build, and {} is missing: build it with `OXVS_K8S_EXTRA_COMPONENTS=\"kube-proxy\" {s} build` (seconds once the API server is built; set $OXVS_K8S_CACHE if the build is elsewhere). `up` never starts a build",
            cache.join("bin/kube-proxy").display()
        );
    }
    if !on_path("etcd") {
        anyhow::bail!(
            "--kube-proxy needs etcd (Debian package etcd-server; `{s} build` installs it)"
        );
    }
    let kubectl = find_kubectl(&cache).context(
        "--kube-proxy needs a working kubectl ($OXVS_KUBECTL, the build's bin/kubectl, or one on PATH)",
    )?;
    for tool in ["iptables-save", "conntrack"] {
        if !on_path(tool) {
            anyhow::bail!(
                "--kube-proxy needs {tool} in the node namespaces (Debian packages iptables, conntrack)"
            );
        }
    }
    Ok(KubeTools {
        script,
        cache,
        kubectl,
    })
}

fn run_dir(ctx: &Ctx) -> PathBuf {
    ctx.paths.root.join("k8s")
}

fn script_log(ctx: &Ctx) -> PathBuf {
    ctx.paths.root.join("k8s-local.log")
}

/// kube-proxy's log on node `index`.
pub fn kube_proxy_log(ctx: &Ctx, index: u32) -> PathBuf {
    ctx.paths.node_dir(index).join("kube-proxy.log")
}

/// The kubeconfig the nodes use (server [`KubeState::server`]), written by
/// [`write_node_kubeconfig`].
fn node_kubeconfig(k: &KubeState) -> String {
    format!("{}/node.kubeconfig", k.run_dir)
}

/// Writes [`node_kubeconfig`]: `k8s-local.sh`'s `admin.kubeconfig` (server
/// `https://127.0.0.1:6443`, for clients in `<lab>-ul`) with the server
/// the nodes reach, [`KubeState::server`]. (`OXVS_K8S_API_EXTRA_IPS` would
/// write such a file too, with no brackets around an IPv6 address.)
fn write_node_kubeconfig(k: &KubeState) -> anyhow::Result<()> {
    let admin = Path::new(&k.run_dir).join("admin.kubeconfig");
    let text = std::fs::read_to_string(&admin)
        .with_context(|| format!("cannot read {}", admin.display()))?;
    let mut out = String::new();
    let mut replaced = false;
    for line in text.lines() {
        match line.split_once("server:") {
            Some((indent, _)) if indent.trim().is_empty() && !replaced => {
                out += &format!("{indent}server: {}\n", k.server);
                replaced = true;
            }
            _ => {
                out += line;
                out.push('\n');
            }
        }
    }
    if !replaced {
        anyhow::bail!("{} names no server", admin.display());
    }
    let path = node_kubeconfig(k);
    std::fs::write(&path, out).with_context(|| format!("cannot write {path}"))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {path}"))
}

/// `k8s-local.sh` with the lab's settings, run inside the underlay
/// namespace when it exists.
fn script_command(ctx: &Ctx, k: &KubeState, args: &[&str]) -> anyhow::Result<Command> {
    let ul = ctx.paths.underlay_netns();
    let mut cmd = if netns::exists(&ul) {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &ul, &k.script]);
        c
    } else {
        Command::new(&k.script)
    };
    cmd.args(args).args(["--run-dir", &k.run_dir]);
    let family = k.family();
    // Advertised (the `kubernetes` Service's endpoint, which pods reach)
    // and named by the serving certificate.
    let addr = api_address(family);
    let cache = if family == IpFamily::Dual {
        dual_stack_cache(ctx).display().to_string()
    } else {
        k.cache.clone()
    };
    let (bind, service_cidr) = match family {
        // Every address of `<lab>-ul`: `::` listens on IPv4 too (kubectl
        // in `<lab>-ul` and k8s-local.sh use 127.0.0.1).
        IpFamily::Ipv6 => ("::", SERVICE_CIDR6),
        IpFamily::Ipv4 | IpFamily::Dual => ("0.0.0.0", SERVICE_CIDR),
    };
    for (key, val) in [
        ("OXVS_K8S_CACHE", cache.as_str()),
        ("OXVS_KUBECTL", k.kubectl.as_str()),
        ("OXVS_K8S_API_BIND", bind),
        ("OXVS_K8S_API_ADVERTISE", addr.as_str()),
        ("OXVS_K8S_API_PORT", "6443"),
        ("OXVS_K8S_ETCD_PORT", "2379"),
        ("OXVS_K8S_ETCD_PEER_PORT", "2380"),
        ("OXVS_K8S_SERVICE_CIDR", service_cidr),
        ("OXVS_K8S_CONTROLLERS", "0"),
    ] {
        cmd.env(key, val);
    }
    cmd.env_remove("OXVS_K8S_KEEP_ON_FAILURE")
        .env_remove("OXVS_K8S_API_EXTRA_IPS")
        .env_remove("OXVS_K8S_RUN_DIR");
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(script_log(ctx))
        .with_context(|| format!("cannot open {}", script_log(ctx).display()))?;
    let log2 = log.try_clone().context("cannot dup the k8s-local.sh log")?;
    cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
    Ok(cmd)
}

/// The cache directory `k8s-local.sh up` is given in a dual-stack lab:
/// its `bin/` holds the build's binaries (symbolic links) but a
/// `kube-apiserver` that adds the dual-stack flags
/// ([`write_dual_stack_cache`]).
fn dual_stack_cache(ctx: &Ctx) -> PathBuf {
    ctx.paths.root.join("k8s-bin")
}

/// The API server's flags in a dual-stack lab: v1.20 has dual-stack
/// Services behind the `IPv6DualStack` feature gate, and a ClusterIP
/// range per family. (`k8s-local.sh` takes no API server flags, and its
/// `--service-cluster-ip-range` comes first: the later one wins.)
fn dual_stack_apiserver_flags() -> Vec<String> {
    vec![
        "--feature-gates=IPv6DualStack=true".into(),
        format!("--service-cluster-ip-range={SERVICE_CIDR},{SERVICE_CIDR6}"),
    ]
}

/// Writes [`dual_stack_cache`]: `bin/kube-apiserver` a shell script that
/// `exec`s the build's with [`dual_stack_apiserver_flags`] appended (the
/// pid `k8s-local.sh` records stays the API server's), every other binary
/// of the build linked.
fn write_dual_stack_cache(ctx: &Ctx, build: &Path) -> anyhow::Result<()> {
    let bin = dual_stack_cache(ctx).join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("cannot create {}", bin.display()))?;
    let entries = std::fs::read_dir(build.join("bin"))
        .with_context(|| format!("cannot list {}", build.join("bin").display()))?;
    for e in entries {
        let e = e.with_context(|| format!("cannot list {}", build.join("bin").display()))?;
        let name = e.file_name();
        if name == "kube-apiserver" {
            continue;
        }
        let link = bin.join(&name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(e.path(), &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    let real = build.join("bin/kube-apiserver");
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let script = format!(
        "#!/bin/sh\n# Written by oxvs-lab: the build's API server with the dual-stack flags.\nexec {} \"$@\" {}\n",
        quote(&real.display().to_string()),
        dual_stack_apiserver_flags()
            .iter()
            .map(|f| quote(f))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let path = bin.join("kube-apiserver");
    std::fs::write(&path, script).with_context(|| format!("cannot write {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", path.display()))
}

/// Records the Kubernetes side in the state (write-ahead) and starts
/// `k8s-local.sh up` in the underlay namespace, in the background: the
/// nodes are built meanwhile. [`finish_up`] waits for it.
pub fn start_apiserver(ctx: &Ctx, st: &mut LabState, tools: &KubeTools) -> anyhow::Result<Child> {
    if st.ip_family == IpFamily::Dual {
        write_dual_stack_cache(ctx, &tools.cache)?;
    }
    let k = KubeState {
        script: tools.script.display().to_string(),
        cache: tools.cache.display().to_string(),
        kubectl: tools.kubectl.display().to_string(),
        run_dir: run_dir(ctx).display().to_string(),
        server: api_url(st.ip_family),
        ip_family: st.ip_family,
        ..KubeState::default()
    };
    let mut cmd = script_command(ctx, &k, &["up"])?;
    st.kube = Some(k);
    ctx.paths.save(st)?;
    cmd.spawn().context("cannot start k8s-local.sh up")
}

/// Waits for the API server, creates the Node objects, starts a
/// kube-proxy on every node and waits until each has programmed the
/// `kubernetes` Service.
pub fn finish_up(
    ctx: &Ctx,
    st: &mut LabState,
    mut child: Child,
    timeout: Duration,
) -> anyhow::Result<()> {
    let status = child.wait().context("waiting for k8s-local.sh up")?;
    if !status.success() {
        anyhow::bail!(
            "k8s-local.sh up failed ({status}):\n{}",
            procs::log_tail(&script_log(ctx), 30)
        );
    }
    let nodes = st.nodes.clone();
    put_nodes(ctx, st, &nodes)?;
    for n in &nodes {
        start_kube_proxy(ctx, st, n)?;
    }
    wait_synced(ctx, st, &nodes, Instant::now() + timeout)
}

fn kube(st: &LabState) -> anyhow::Result<&KubeState> {
    st.kube.as_ref().with_context(|| {
        format!(
            "lab {} has no API server: Services need a lab started with `oxvs-lab up --kube-proxy`",
            st.name
        )
    })
}

/// Runs kubectl against the lab's API server (inside `<lab>-ul`), `stdin`
/// fed when given.
pub fn kubectl(
    ctx: &Ctx,
    k: &KubeState,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<Output> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ctx.paths.underlay_netns(), &k.kubectl])
        .arg(format!("--kubeconfig={}/admin.kubeconfig", k.run_dir))
        .arg(format!("--cache-dir={}/kubectl-cache", k.run_dir))
        .arg(KUBECTL_TIMEOUT)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run kubectl {}", args.join(" ")))?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .with_context(|| format!("cannot feed kubectl {}", args.join(" ")))?;
    }
    child
        .wait_with_output()
        .with_context(|| format!("kubectl {}", args.join(" ")))
}

/// kubectl that must succeed; its stdout.
fn kubectl_ok(
    ctx: &Ctx,
    k: &KubeState,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<String> {
    let out = kubectl(ctx, k, args, stdin)?;
    if !out.status.success() {
        anyhow::bail!(
            "`kubectl {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl apply -f -` of `items` (a List).
fn apply_list(ctx: &Ctx, k: &KubeState, items: Vec<Value>) -> anyhow::Result<String> {
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": items });
    kubectl_ok(ctx, k, &["apply", "-f", "-"], Some(&list.to_string()))
}

/// The Node objects of `nodes`, created or updated in the API server.
fn put_nodes(ctx: &Ctx, st: &LabState, nodes: &[NodeState]) -> anyhow::Result<()> {
    let k = kube(st)?;
    let items: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let mut v = manifest::node_object(&n.name, "", &n.pod_cidrs(), &n.internal_ips());
            if let Some(md) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                md.remove("uid");
            }
            v
        })
        .collect();
    apply_list(ctx, k, items)
        .map(|_| ())
        .context("cannot create the Node objects in the API server")
}

/// kube-proxy's command line for `node`.
fn kube_proxy_argv(k: &KubeState, node: &NodeState) -> Vec<String> {
    // Endpoints, not EndpointSlices (single-stack): the lab writes
    // Endpoints and no controller mirrors them into slices.
    let endpoints = "EndpointSliceProxying=false";
    let (cluster_cidr, gates) = match k.family() {
        IpFamily::Ipv4 => (CLUSTER_CIDR.to_string(), endpoints),
        // Both families (a proxier each); EndpointSlices, which carry one
        // family each (an Endpoints object has the primary family only),
        // written by the lab.
        IpFamily::Dual => (
            format!("{CLUSTER_CIDR},{CLUSTER_CIDR6}"),
            "IPv6DualStack=true",
        ),
        IpFamily::Ipv6 => (CLUSTER_CIDR6.to_string(), endpoints),
    };
    // v1.20 runs the proxier of `--bind-address`'s family, else of the
    // Node's first InternalIP: an IPv6-only node says so explicitly.
    let bind = match (k.family(), &node.ip6) {
        (IpFamily::Ipv6, Some(ip6)) => vec![format!("--bind-address={ip6}")],
        _ => Vec::new(),
    };
    let argv: Vec<String> = [
        format!("{}/bin/kube-proxy", k.cache),
        format!("--kubeconfig={}", node_kubeconfig(k)),
        format!("--hostname-override={}", node.name),
        "--proxy-mode=iptables".into(),
        format!("--cluster-cidr={cluster_cidr}"),
        format!("--feature-gates={gates}"),
        // nf_conntrack_max and the hash size are host-wide: leave them.
        "--conntrack-max-per-core=0".into(),
        "--conntrack-min=0".into(),
        "--iptables-min-sync-period=100ms".into(),
        "--metrics-bind-address=127.0.0.1:10249".into(),
        "--healthz-bind-address=127.0.0.1:10256".into(),
        "--v=2".into(),
    ]
    .into();
    argv.into_iter().chain(bind).collect()
}

/// What kubelet 1.20 puts into every node's iptables for kube-proxy
/// (`syncNetworkUtil`): `KUBE-MARK-DROP` marks with 0x8000 and
/// `KUBE-FIREWALL` (from INPUT and OUTPUT) drops what is marked; kube-proxy
/// only jumps to `KUBE-MARK-DROP` (e.g. NodePort `Local` traffic on a node
/// without a local endpoint) and leaves its rules to kubelet. The lab plays
/// kubelet, so it writes them. The masquerade chains kube-proxy writes
/// itself. Per family of the node's proxiers (`iptables-restore`,
/// `ip6tables-restore`): kubelet's "block incoming localnet connections"
/// rule is IPv4's only (127.0.0.0/8 reached from outside through
/// `route_localnet`; IPv6 has no such thing).
fn kubelet_rules_text(family: Family) -> String {
    let localnet = match family {
        Family::Ipv4 => "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment \"block incoming localnet connections\" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n",
        Family::Ipv6 => "",
    };
    format!(
        "*nat
:KUBE-MARK-DROP - [0:0]
-A KUBE-MARK-DROP -j MARK --or-mark 0x8000
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
-A KUBE-FIREWALL -m comment --comment \"kubernetes firewall for dropping marked packets\" -m mark --mark 0x8000/0x8000 -j DROP
{localnet}-I INPUT -j KUBE-FIREWALL
-I OUTPUT -j KUBE-FIREWALL
COMMIT
"
    )
}

/// Writes [`kubelet_rules_text`] of every proxier family of the lab into
/// namespace `ns` (a fresh node namespace).
fn kubelet_rules(ns: &str, lab: IpFamily) -> anyhow::Result<()> {
    for family in Family::all(lab) {
        let tool = restore_tool(family);
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, tool, "--noflush", "-w", "5"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {tool} in {ns}"))?;
        if let Some(mut pipe) = child.stdin.take() {
            pipe.write_all(kubelet_rules_text(family).as_bytes())
                .with_context(|| format!("cannot feed {tool} in {ns}"))?;
        }
        let out = child
            .wait_with_output()
            .with_context(|| format!("{tool} in {ns}"))?;
        if !out.status.success() {
            anyhow::bail!(
                "cannot write kubelet's KUBE-MARK-DROP/KUBE-FIREWALL rules in {ns} ({tool}): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}

/// Starts kube-proxy in `node`'s host namespace (after kubelet's rules)
/// and records its pid.
pub fn start_kube_proxy(ctx: &Ctx, st: &mut LabState, node: &NodeState) -> anyhow::Result<()> {
    let k = kube(st)?;
    kubelet_rules(&node.netns, k.family())?;
    write_node_kubeconfig(k)?;
    let argv = kube_proxy_argv(k, node);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let child = procs::spawn_in(&node.netns, &argv, &kube_proxy_log(ctx, node.index))?;
    if let Some(k) = st.kube.as_mut() {
        k.kube_proxy.insert(node.name.clone(), child.id());
    }
    ctx.paths.save(st)
}

/// `iptables-save` of `table` in namespace `ns`.
pub fn iptables_save(ns: &str, table: &str) -> anyhow::Result<String> {
    iptables_save_family(ns, table, Family::Ipv4)
}

/// `iptables-save` (IPv4) or `ip6tables-save` (IPv6) of `table` in
/// namespace `ns`.
pub fn iptables_save_family(ns: &str, table: &str, family: Family) -> anyhow::Result<String> {
    netns::run_in(ns, &[save_tool(family), "-t", table])
}

/// Waits until every kube-proxy of `nodes` has programmed the `kubernetes`
/// Service (so it is connected, knows its node and syncs rules), in the
/// rules of the lab's primary family (the `kubernetes` Service's).
fn wait_synced(
    ctx: &Ctx,
    st: &LabState,
    nodes: &[NodeState],
    deadline: Instant,
) -> anyhow::Result<()> {
    let family = st
        .kube
        .as_ref()
        .map_or(Family::Ipv4, |k| Family::primary(k.family()));
    for n in nodes {
        loop {
            let nat = iptables_save_family(&n.netns, "nat", family).unwrap_or_default();
            if nat.contains("default/kubernetes:https") {
                break;
            }
            let pid = st
                .kube
                .as_ref()
                .and_then(|k| k.kube_proxy.get(&n.name).copied());
            let alive = pid.is_some_and(|p| procs::alive(p, KUBE_PROXY_NEEDLE));
            if !alive || Instant::now() > deadline {
                anyhow::bail!(
                    "kube-proxy on {} {} (no rule for the `kubernetes` Service in its nat table, {})\n--- kube-proxy.log (tail) ---\n{}",
                    n.name,
                    if alive { "did not sync in time" } else { "exited" },
                    save_tool(family),
                    procs::log_tail(&kube_proxy_log(ctx, n.index), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// `node add`: the new node's Node object and kube-proxy.
pub fn add_node(
    ctx: &Ctx,
    st: &mut LabState,
    node: &NodeState,
    timeout: Duration,
) -> anyhow::Result<()> {
    put_nodes(ctx, st, std::slice::from_ref(node))?;
    start_kube_proxy(ctx, st, node)?;
    wait_synced(
        ctx,
        st,
        std::slice::from_ref(node),
        Instant::now() + timeout,
    )
}

/// `node remove`: stops the node's kube-proxy and deletes its Node
/// object; the failures.
pub fn remove_node(ctx: &Ctx, st: &mut LabState, node: &NodeState, grace: Duration) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(k) = st.kube.clone() else {
        return errs;
    };
    if let Some(pid) = k.kube_proxy.get(&node.name) {
        if let Err(e) = procs::stop(*pid, KUBE_PROXY_NEEDLE, grace) {
            errs.push(format!("{} kube-proxy: {e:#}", node.name));
        }
    }
    if let Err(e) = kubectl_ok(
        ctx,
        &k,
        &["delete", "node", &node.name, "--ignore-not-found"],
        None,
    ) {
        errs.push(format!("{e:#}"));
    }
    if let Some(k) = st.kube.as_mut() {
        k.kube_proxy.remove(&node.name);
    }
    errs
}

/// `down`: kube-proxies stopped, then `k8s-local.sh down`; the failures.
pub fn teardown(ctx: &Ctx, st: &LabState, grace: Duration) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(k) = &st.kube else {
        return errs;
    };
    for (node, pid) in &k.kube_proxy {
        if let Err(e) = procs::stop(*pid, KUBE_PROXY_NEEDLE, grace) {
            errs.push(format!("{node} kube-proxy: {e:#}"));
        }
    }
    if !Path::new(&k.run_dir).exists() {
        return errs;
    }
    match script_command(ctx, k, &["down"]).and_then(|mut c| {
        c.status()
            .with_context(|| format!("cannot run {} down", k.script))
    }) {
        Ok(s) if s.success() => {}
        Ok(s) => errs.push(format!(
            "k8s-local.sh down failed ({s}):\n{}",
            procs::log_tail(&script_log(ctx), 20)
        )),
        Err(e) => errs.push(format!("{e:#}")),
    }
    errs
}

/// The pid k8s-local.sh recorded for `daemon`, if it still runs.
fn script_daemon(k: &KubeState, daemon: &str) -> Option<u32> {
    let text = std::fs::read_to_string(Path::new(&k.run_dir).join("pids").join(daemon)).ok()?;
    let pid: u32 = text.split_whitespace().next()?.parse().ok()?;
    procs::alive(pid, daemon).then_some(pid)
}

/// The Kubernetes daemons of the lab that are not running
/// (`kube-apiserver`, `etcd`, `node-N/kube-proxy`).
pub fn dead(st: &LabState) -> Vec<String> {
    let mut v = Vec::new();
    let Some(k) = &st.kube else {
        return v;
    };
    for d in ["etcd", "kube-apiserver"] {
        if script_daemon(k, d).is_none() {
            v.push(d.to_string());
        }
    }
    for n in &st.nodes {
        let pid = k.kube_proxy.get(&n.name).copied();
        if !pid.is_some_and(|p| procs::alive(p, KUBE_PROXY_NEEDLE)) {
            v.push(format!("{}/kube-proxy", n.name));
        }
    }
    v
}

/// kube-proxy's pid on `node` and whether it runs (`None`: no kube-proxy
/// in this lab).
pub fn kube_proxy_status(st: &LabState, node: &str) -> Option<(Option<u32>, bool)> {
    let k = st.kube.as_ref()?;
    let pid = k.kube_proxy.get(node).copied();
    Some((pid, pid.is_some_and(|p| procs::alive(p, KUBE_PROXY_NEEDLE))))
}

/// The Services and Endpoints in the API server, for `status`: one entry
/// per Service (`namespace`, `name`, `type`, `clusterIP`, `ports`
/// (`80/TCP`, `80:30080/TCP`), `endpoints` (addresses)).
pub fn services_json(ctx: &Ctx, st: &LabState) -> anyhow::Result<Value> {
    let k = kube(st)?;
    let out = kubectl_ok(
        ctx,
        k,
        &[
            "get",
            "services,endpoints",
            "--all-namespaces",
            "-o",
            "json",
        ],
        None,
    )?;
    let v: Value = serde_json::from_str(&out).context("kubectl get: not JSON")?;
    let items = v["items"].as_array().cloned().unwrap_or_default();
    let mut eps: BTreeMap<(String, String), usize> = BTreeMap::new();
    for i in items.iter().filter(|i| i["kind"] == "Endpoints") {
        let key = (
            i["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            i["metadata"]["name"].as_str().unwrap_or("").to_string(),
        );
        eps.insert(key, service::address_count(i));
    }
    let svcs: Vec<Value> = items
        .iter()
        .filter(|i| i["kind"] == "Service")
        .map(|i| {
            let ns = i["metadata"]["namespace"].as_str().unwrap_or("");
            let name = i["metadata"]["name"].as_str().unwrap_or("");
            let ports: Vec<String> = i["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| match p["nodePort"].as_u64() {
                    Some(np) => format!(
                        "{}:{np}/{}",
                        p["port"],
                        p["protocol"].as_str().unwrap_or("")
                    ),
                    None => format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("")),
                })
                .collect();
            json!({
                "namespace": ns, "name": name,
                "type": i["spec"]["type"], "clusterIP": i["spec"]["clusterIP"],
                "clusterIPs": i["spec"]["clusterIPs"],
                "ports": ports,
                "endpoints": eps.get(&(ns.to_string(), name.to_string())).copied().unwrap_or(0),
            })
        })
        .collect();
    Ok(Value::Array(svcs))
}

/// The `kind/name` line of kubectl apply's output for an object:
/// `created`, `configured` or `unchanged`.
/// `created`, `configured` or `unchanged`, for an object the lab writes
/// itself.
pub(crate) fn apply_word_local(existed: bool, unchanged: bool) -> &'static str {
    match (existed, unchanged) {
        (false, _) => "created",
        (true, true) => "unchanged",
        (true, false) => "configured",
    }
}

fn apply_word(out: &str, kind: &str, name: &str) -> &'static str {
    let prefix = format!("{kind}/{name} ");
    let line = out.lines().find(|l| l.starts_with(&prefix)).unwrap_or("");
    if line.ends_with("created") {
        "created"
    } else if line.ends_with("unchanged") {
        "unchanged"
    } else {
        "configured"
    }
}

fn api_namespace(ns: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } })
}

/// The object as sent to the API server: namespace filled in.
fn api_object(obj: &Object) -> Value {
    let mut body = obj.body.clone();
    if let Some(md) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        md.insert("namespace".into(), json!(obj.namespace));
    }
    body
}

/// `apply` of a Service: checked ([`service::parse_service`]), sent to the
/// API server with its Namespace, remembered for the Endpoints sync.
pub fn apply_service(ctx: &Ctx, st: &mut LabState, obj: &Object) -> anyhow::Result<&'static str> {
    if super::proxy::serves_services(st) {
        return super::proxy::apply_service(ctx, st, obj);
    }
    let k = kube(st)?.clone();
    // As the `--proxy` path: an IPv6-only lab's Services are IPv6, the
    // object remembered as the API server defaults it (its families), the
    // user's sent (the API server defaults it alike).
    let (defaulted, spec) = super::proxy::check_service(st, obj, "--kube-proxy")?;
    let out = apply_list(
        ctx,
        &k,
        vec![api_namespace(&obj.namespace), api_object(obj)],
    )
    .with_context(|| format!("{}: the API server refused it", obj.display_name()))?;
    let key = spec.key();
    if let Some(k) = st.kube.as_mut() {
        k.services.insert(key.clone(), api_object(&defaulted));
        if spec.selector.is_none() {
            // The user's Endpoints from now on (as the endpoints controller
            // leaves a Service without a selector alone).
            k.endpoints.remove(&key);
            k.endpoints6.remove(&key);
        }
    }
    ctx.paths.save(st)?;
    Ok(apply_word(&out, "service", &obj.name))
}

/// `apply` of an Endpoints object, for a Service without a selector.
pub fn apply_endpoints(ctx: &Ctx, st: &mut LabState, obj: &Object) -> anyhow::Result<&'static str> {
    if super::proxy::serves_services(st) {
        return super::proxy::apply_endpoints(ctx, st, obj);
    }
    let k = kube(st)?.clone();
    service::check_endpoints(obj, k.family())?;
    let key = format!("{}/{}", obj.namespace, obj.name);
    if k.endpoints.contains_key(&key) {
        anyhow::bail!(
            "{}: Service {key} has a selector, so the lab keeps its Endpoints (apply Endpoints only for a Service without a selector)",
            obj.display_name()
        );
    }
    let mut objects = vec![api_namespace(&obj.namespace), api_object(obj)];
    if reads_slices(&k) {
        // kube-proxy reads EndpointSlices: mirror the user's Endpoints, as
        // Kubernetes' EndpointSlice mirroring controller does (the old
        // slices go first: the new set may have fewer).
        delete_service_slices(ctx, &k, &obj.namespace, &obj.name)?;
        for family in [Family::Ipv4, Family::Ipv6] {
            objects.extend(service::endpoint_slices(
                &api_object(obj),
                family,
                service::SliceApi::V1beta1,
            ));
        }
    }
    let out = apply_list(ctx, &k, objects)
        .with_context(|| format!("{}: the API server refused it", obj.display_name()))?;
    Ok(apply_word(&out, "endpoints", &obj.name))
}

/// `delete` of a Service (and its Endpoints). Whether it existed.
pub fn delete_service(ctx: &Ctx, st: &mut LabState, ns: &str, name: &str) -> anyhow::Result<bool> {
    if super::proxy::serves_services(st) {
        return super::proxy::delete_service(ctx, st, ns, name);
    }
    let k = kube(st)?.clone();
    let out = kubectl_ok(
        ctx,
        &k,
        &[
            "delete",
            "-n",
            ns,
            &format!("service/{name}"),
            &format!("endpoints/{name}"),
            "--ignore-not-found",
        ],
        None,
    )?;
    if reads_slices(&k) {
        delete_service_slices(ctx, &k, ns, name)?;
    }
    let key = format!("{ns}/{name}");
    let known = st
        .kube
        .as_mut()
        .map(|k| {
            k.endpoints.remove(&key);
            k.endpoints6.remove(&key);
            k.services.remove(&key).is_some()
        })
        .unwrap_or(false);
    ctx.paths.save(st)?;
    Ok(known || out.contains(&format!("service \"{name}\" deleted")))
}

/// `delete` of an Endpoints object. Whether it existed.
pub fn delete_endpoints(ctx: &Ctx, st: &LabState, ns: &str, name: &str) -> anyhow::Result<bool> {
    if super::proxy::serves_services(st) {
        return super::proxy::delete_endpoints(ctx, ns, name);
    }
    let k = kube(st)?;
    let out = kubectl_ok(
        ctx,
        k,
        &[
            "delete",
            "-n",
            ns,
            &format!("endpoints/{name}"),
            "--ignore-not-found",
        ],
        None,
    )?;
    if reads_slices(k) {
        delete_service_slices(ctx, k, ns, name)?;
    }
    Ok(out.contains("deleted"))
}

/// Deleting a Namespace: its Services go too. The failures.
pub fn delete_namespace_services(ctx: &Ctx, st: &mut LabState, ns: &str) -> Vec<String> {
    let keys: Vec<String> = if super::proxy::serves_services(st) {
        super::proxy::namespace_services(st, ns)
    } else {
        st.kube
            .as_ref()
            .map(|k| service::keys_in_namespace(&k.services, ns))
            .unwrap_or_default()
    };
    let mut errs = Vec::new();
    for key in keys {
        let name = key.split_once('/').map(|(_, n)| n).unwrap_or("");
        match delete_service(ctx, st, ns, name) {
            Ok(_) => crate::say!("Service {key} deleted (with its namespace)"),
            Err(e) => errs.push(format!("Service {key}: {e:#}")),
        }
    }
    errs
}

/// Every pod of the lab as an endpoint candidate (labels from its manifest).
fn backends(ctx: &Ctx, st: &LabState) -> Vec<Backend> {
    let dir = ctx.paths.manifests();
    st.pods
        .iter()
        .map(|p| {
            let file = manifest::object_file_name("Pod", &p.namespace, &p.name);
            let labels = manifest::read(&dir, &file)
                .ok()
                .and_then(|m| {
                    m.pointer("/metadata/labels")
                        .and_then(Value::as_object)
                        .map(|l| {
                            l.iter()
                                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                                .collect()
                        })
                })
                .unwrap_or_default();
            Backend {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                uid: p.uid.clone(),
                node: p.node.clone(),
                ip: p.ip.clone(),
                ip6: p.ip6.clone(),
                labels,
                ports: p.ports.clone(),
            }
        })
        .collect()
}

/// [`sync_endpoints_keys`], as a line per changed Endpoints object.
pub fn sync_endpoints(ctx: &Ctx, st: &mut LabState) -> anyhow::Result<Vec<String>> {
    Ok(sync_endpoints_keys(ctx, st)?
        .into_iter()
        .map(|(key, n)| endpoints_line(&key, n))
        .collect())
}

/// `Endpoints ns/name: N addresses`.
pub fn endpoints_line(key: &str, n: usize) -> String {
    format!(
        "Endpoints {key}: {n} address{}",
        if n == 1 { "" } else { "es" }
    )
}

/// The endpoints controller's pass: recomputes the Endpoints of every
/// Service with a selector and writes those that changed, in one kubectl
/// call. Returns each changed Service (`ns/name`) with its number of
/// addresses. A lab without an API server: nothing to do.
pub fn sync_endpoints_keys(ctx: &Ctx, st: &mut LabState) -> anyhow::Result<Vec<(String, usize)>> {
    if super::proxy::serves_services(st) {
        let pods = backends(ctx, st);
        return super::proxy::sync_endpoints(ctx, st, &pods);
    }
    let Some(k) = st.kube.clone() else {
        return Ok(Vec::new());
    };
    let pods = backends(ctx, st);
    // The Endpoints objects: the primary family's addresses (IPv6 in an
    // IPv6-only lab); a dual-stack lab's IPv6 ones as EndpointSlices only.
    let primary = Family::primary(k.family());
    let changed = service::changed_endpoints(&k.services, &k.endpoints, &pods, primary);
    let changed6 = if reads_slices(&k) {
        service::changed_endpoints(&k.services, &k.endpoints6, &pods, Family::Ipv6)
    } else {
        Vec::new()
    };
    if changed.is_empty() && changed6.is_empty() {
        return Ok(Vec::new());
    }
    let mut objects: Vec<Value> = changed.iter().map(|(_, e)| e.clone()).collect();
    let mut stale: Vec<(String, Value)> = Vec::new();
    if reads_slices(&k) {
        for (family, list, old) in [
            (Family::Ipv4, &changed, &k.endpoints),
            (Family::Ipv6, &changed6, &k.endpoints6),
        ] {
            for (key, ep) in list {
                let slices = service::endpoint_slices(ep, family, service::SliceApi::V1beta1);
                let before = old
                    .get(key)
                    .map(|e| service::endpoint_slices(e, family, service::SliceApi::V1beta1))
                    .unwrap_or_default();
                stale.extend(
                    before
                        .into_iter()
                        .filter(|b| !slices.iter().any(|s| s["metadata"] == b["metadata"]))
                        .map(|b| (key.clone(), b)),
                );
                objects.extend(slices);
            }
        }
    }
    apply_list(ctx, &k, objects).context("cannot write Endpoints to the API server")?;
    delete_slices(ctx, &k, &stale)?;
    let mut out: Vec<(String, usize)> = Vec::new();
    if let Some(kk) = st.kube.as_mut() {
        for (key, ep) in changed {
            out.push((key.clone(), service::address_count(&ep)));
            kk.endpoints.insert(key, ep);
        }
        for (key, ep) in changed6 {
            if !out.iter().any(|(k, _)| *k == key) {
                let n = kk.endpoints.get(&key).map_or(0, service::address_count);
                out.push((key.clone(), n));
            }
            kk.endpoints6.insert(key, ep);
        }
    }
    ctx.paths.save(st)?;
    Ok(out)
}

/// Deletes EndpointSlices the lab wrote that are no longer wanted
/// (`(service key, slice)`), in one kubectl call per namespace.
fn delete_slices(ctx: &Ctx, k: &KubeState, stale: &[(String, Value)]) -> anyhow::Result<()> {
    let mut by_ns: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (key, slice) in stale {
        let ns = key.split_once('/').map_or("default", |(ns, _)| ns);
        if let Some(name) = slice.pointer("/metadata/name").and_then(Value::as_str) {
            by_ns
                .entry(ns)
                .or_default()
                .push(format!("endpointslice.discovery.k8s.io/{name}"));
        }
    }
    for (ns, names) in by_ns {
        let mut args = vec!["delete", "-n", ns, "--ignore-not-found"];
        args.extend(names.iter().map(String::as_str));
        kubectl_ok(ctx, k, &args, None)
            .with_context(|| format!("cannot delete stale EndpointSlices in {ns}"))?;
    }
    Ok(())
}

/// Deletes every EndpointSlice the lab wrote for Service `ns/name`.
fn delete_service_slices(ctx: &Ctx, k: &KubeState, ns: &str, name: &str) -> anyhow::Result<()> {
    let selector = format!(
        "{}={name},{}={}",
        service::SERVICE_NAME_LABEL,
        service::MANAGED_BY_LABEL,
        service::MANAGED_BY_LAB
    );
    kubectl_ok(
        ctx,
        k,
        &["delete", "-n", ns, "endpointslices", "-l", &selector],
        None,
    )
    .map(|_| ())
    .with_context(|| format!("cannot delete the EndpointSlices of Service {ns}/{name}"))
}

/// Per Service port (kube-proxy's name for it: `ns/name:port`, or
/// `ns/name` for an unnamed port), the number of endpoints kube-proxy
/// programmed in namespace `ns`: the distinct `KUBE-SEP-` chains its
/// `KUBE-SVC-` chain jumps to, or 0 when the filter table rejects it
/// ("has no endpoints").
pub fn programmed(ns: &str) -> BTreeMap<String, usize> {
    programmed_family(ns, Family::Ipv4)
}

/// [`programmed`] for the IPv4 proxier (`iptables`) or the IPv6 one
/// (`ip6tables`: a dual-stack kube-proxy's second, an IPv6-only one's
/// only).
pub fn programmed_family(ns: &str, family: Family) -> BTreeMap<String, usize> {
    fn comment(l: &str) -> Option<&str> {
        l.split("--comment \"").nth(1)?.split('"').next()
    }
    let save = |table: &str| iptables_save_family(ns, table, family);
    let mut seps: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let nat = save("nat").unwrap_or_default();
    for l in nat.lines().filter(|l| l.starts_with("-A KUBE-SVC-")) {
        if let (Some(c), Some(t)) = (comment(l), l.split(" -j ").nth(1)) {
            if t.starts_with("KUBE-SEP-") {
                seps.entry(c.to_string()).or_default().insert(t.to_string());
            }
        }
    }
    let mut out: BTreeMap<String, usize> = seps.into_iter().map(|(k, v)| (k, v.len())).collect();
    let filter = save("filter").unwrap_or_default();
    for l in filter.lines().filter(|l| l.contains("-j REJECT")) {
        if let Some(svc) = comment(l).and_then(|c| c.strip_suffix(" has no endpoints")) {
            out.insert(svc.to_string(), 0);
        }
    }
    out
}

/// The families Service `key` has in this lab: those it asks for
/// ([`service::ServiceSpec::families`]) in a dual-stack lab; a
/// single-stack lab's one family.
fn service_families(k: &KubeState, key: &str) -> Vec<Family> {
    if k.family() != IpFamily::Dual {
        return vec![Family::primary(k.family())];
    }
    let Some(body) = k.services.get(key) else {
        return Vec::new();
    };
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let obj = Object {
        kind: crate::manifest::Kind::Service,
        namespace: ns.to_string(),
        name: name.to_string(),
        body: body.clone(),
        source: format!("Service {key}"),
    };
    service::parse_service(&obj)
        .map(|s| s.families)
        .unwrap_or_default()
}

/// What kube-proxy's `family` proxier must show for Service `key`: per
/// port, its name and the number of endpoints (`None`: the user's
/// Endpoints, any number). Empty for a headless Service (kube-proxy leaves
/// those alone) and for a family the Service does not have.
fn expected_rules(k: &KubeState, key: &str, family: Family) -> Vec<(String, Option<usize>)> {
    let Some(body) = k.services.get(key) else {
        return Vec::new();
    };
    if body.pointer("/spec/clusterIP").and_then(Value::as_str) == Some("None") {
        return Vec::new();
    }
    if !service_families(k, key).contains(&family) {
        return Vec::new();
    }
    let ports = body
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ep = endpoints_of(k, family).get(key);
    ports
        .iter()
        .map(|p| {
            let name = p.get("name").and_then(Value::as_str).unwrap_or("");
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            let port_name = if name.is_empty() {
                key.to_string()
            } else {
                format!("{key}:{name}")
            };
            let count = ep.map(|e| {
                e.get("subsets")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|s| {
                        s.get("ports").and_then(Value::as_array).is_some_and(|ps| {
                            ps.iter().any(|x| {
                                x.get("name").and_then(Value::as_str).unwrap_or("") == name
                                    && x.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                                        == proto
                            })
                        })
                    })
                    .filter_map(|s| s.get("addresses").and_then(Value::as_array))
                    .map(Vec::len)
                    .sum()
            });
            (port_name, count)
        })
        .collect()
}

/// Waits until every node's kube-proxy has programmed Services `keys` as
/// the lab wrote them (each port with its number of endpoints), so that
/// traffic right after `apply` meets the new rules. `Err` says what is
/// still missing after `timeout`.
pub fn wait_programmed(
    st: &LabState,
    keys: &[String],
    timeout: Duration,
) -> Result<Duration, String> {
    let t = Instant::now();
    let Some(k) = &st.kube else {
        return Ok(t.elapsed());
    };
    let families = Family::all(k.family());
    let want: Vec<(Family, String, Option<usize>)> = families
        .iter()
        .copied()
        .flat_map(|f| {
            keys.iter()
                .flat_map(move |key| expected_rules(k, key, f))
                .map(move |(port, count)| (f, port, count))
        })
        .collect();
    if want.is_empty() {
        return Ok(t.elapsed());
    }
    loop {
        let mut missing = Vec::new();
        for n in &st.nodes {
            let got: Vec<(Family, BTreeMap<String, usize>)> = families
                .iter()
                .map(|f| (*f, programmed_family(&n.netns, *f)))
                .collect();
            for (family, port, count) in &want {
                let Some((_, got)) = got.iter().find(|(f, _)| f == family) else {
                    continue;
                };
                let ok = match (got.get(port), count) {
                    (Some(g), Some(c)) => g == c,
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                if !ok {
                    missing.push(format!(
                        "{}: {port} ({}) has {} endpoints, {} expected",
                        n.name,
                        family.api_name(),
                        got.get(port)
                            .map_or("no rules, no".to_string(), |g| g.to_string()),
                        count.map_or("some".to_string(), |c| c.to_string())
                    ));
                }
            }
        }
        if missing.is_empty() {
            return Ok(t.elapsed());
        }
        if t.elapsed() > timeout {
            return Err(missing.join("; "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// After `apply` / `delete`: waits (10 s at most) for kube-proxy to
/// program `keys` and says so; a warning when it does not.
pub fn report_programmed(st: &LabState, keys: &[String]) {
    if st.kube.is_none() || keys.is_empty() {
        return;
    }
    match wait_programmed(st, keys, Duration::from_secs(10)) {
        Ok(d) => crate::say!(
            "kube-proxy: {} Service(s) programmed on every node in {} ms",
            keys.len(),
            d.as_millis()
        ),
        Err(missing) => eprintln!(
            "warning: kube-proxy has not programmed every Service after 10 s ({missing}); see node-N/kube-proxy.log"
        ),
    }
}

/// `oxvs-lab kubectl ARGS...`.
#[derive(Debug, clap::Args)]
pub struct KubectlArgs {
    /// kubectl's arguments (e.g. `get svc,endpoints -A`).
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "ARGS"
    )]
    pub args: Vec<String>,
}

/// Runs kubectl against the lab's API server, output passed through.
pub fn run_kubectl(global: &Global, args: &KubectlArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist", ctx.name());
    }
    let st = {
        let _lock = ctx.paths.lock(false)?;
        ctx.paths.load()?
    };
    let k = kube(&st)?;
    let status = Command::new("ip")
        .args(["netns", "exec", &ctx.paths.underlay_netns(), &k.kubectl])
        .arg(format!("--kubeconfig={}/admin.kubeconfig", k.run_dir))
        .arg(format!("--cache-dir={}/kubectl-cache", k.run_dir))
        .args(&args.args)
        .status()
        .context("cannot run kubectl")?;
    Ok(status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_apply_output_is_read_per_object() {
        let out = "namespace/web unchanged\nservice/web created\nservice/webx configured\n";
        assert_eq!(apply_word(out, "service", "web"), "created");
        assert_eq!(apply_word(out, "service", "webx"), "configured");
        assert_eq!(apply_word(out, "namespace", "web"), "unchanged");
    }

    #[test]
    fn the_api_server_of_each_family() {
        assert_eq!(api_url(IpFamily::Ipv4), "https://192.168.77.1:6443");
        assert_eq!(api_url(IpFamily::Dual), "https://192.168.77.1:6443");
        assert_eq!(api_url(IpFamily::Ipv6), "https://[fd00:192:168:77::1]:6443");
        assert!(kubelet_rules_text(Family::Ipv4).contains("127.0.0.0/8"));
        let v6 = kubelet_rules_text(Family::Ipv6);
        assert!(!v6.contains("127.0.0.0/8"), "{v6}");
        assert!(
            v6.contains("-A KUBE-MARK-DROP -j MARK --or-mark 0x8000"),
            "{v6}"
        );
    }

    #[test]
    fn kube_proxy_flags() {
        let k = KubeState {
            cache: "/c".into(),
            run_dir: "/r".into(),
            ..KubeState::default()
        };
        let n = NodeState {
            name: "node-2".into(),
            index: 2,
            netns: "l-node-2".into(),
            ip: Some("192.168.77.12".into()),
            ip6: None,
            pod_cidr: Some("10.244.2.0/24".into()),
            pod_cidr6: None,
            switchd_pid: None,
            agent_pid: None,
        };
        let argv = kube_proxy_argv(&k, &n);
        assert_eq!(argv[0], "/c/bin/kube-proxy");
        assert!(argv.contains(&"--kubeconfig=/r/node.kubeconfig".to_string()));
        assert!(argv.contains(&"--hostname-override=node-2".to_string()));
        assert!(argv.contains(&"--proxy-mode=iptables".to_string()));
        assert!(argv.contains(&"--cluster-cidr=10.244.0.0/16".to_string()));
        assert!(argv.contains(&"--feature-gates=EndpointSliceProxying=false".to_string()));
        assert!(!argv.iter().any(|a| a.starts_with("--bind-address")));
        let dual = KubeState {
            ip_family: IpFamily::Dual,
            ..k.clone()
        };
        let argv = kube_proxy_argv(&dual, &n);
        assert!(argv.contains(&"--cluster-cidr=10.244.0.0/16,fd00:10:244::/56".to_string()));
        assert!(argv.contains(&"--feature-gates=IPv6DualStack=true".to_string()));
        // An IPv6-only node: the IPv6 proxier (its address bound), reading
        // Endpoints.
        let v6 = KubeState {
            ip_family: IpFamily::Ipv6,
            ..k
        };
        let n6 = NodeState::new(2, "l-node-2".into(), IpFamily::Ipv6);
        let argv = kube_proxy_argv(&v6, &n6);
        assert!(argv.contains(&"--cluster-cidr=fd00:10:244::/56".to_string()));
        assert!(argv.contains(&"--feature-gates=EndpointSliceProxying=false".to_string()));
        assert!(argv.contains(&"--bind-address=fd00:192:168:77::12".to_string()));
        let flags = dual_stack_apiserver_flags();
        assert!(
            flags.contains(&"--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/108".to_string())
        );
    }
}
