//! `oxvs-agent`: the node agent.
//!
//! Serves `oxvs-cni` on the CNI socket, allocates pod addresses from the
//! node's pod CIDR, attaches pods to oxvs-switchd and keeps the switch's
//! flows equal to what its records say. Start order does not matter: the
//! agent serves the socket at once (ADD answers "try again later" until the
//! switch and its gateway are found), retries the switch until it appears,
//! and reconverges whenever the switch's view drifts (e.g. switchd
//! restarted). The API socket (`--api-socket`, [`oxvs_agent::api`]) serves
//! `oxvsctl traceflow`. Stopping the agent (SIGTERM/SIGINT) never touches pods: the
//! switch keeps forwarding, and the next agent picks up from the records.
//!
//! Exit codes: 0 after SIGTERM/SIGINT, 1 when startup failed, 2 for bad flags.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use oxvs_agent::agent::cni::CniSocket;
use oxvs_agent::agent::{Agent, AgentConfig};
use oxvs_agent::api::ApiSocket;
use oxvs_agent::model::ClusterState;
use oxvs_agent::{podnet, socket_server, source};
use oxvs_api::cni::DEFAULT_CNI_SOCKET;
use oxvs_api::listen::{Gate, Limits, ListenError};
use oxvs_api::DEFAULT_SWITCHD_SOCKET;

/// The oxvs node agent.
#[derive(Debug, Parser)]
#[command(name = "oxvs-agent", version, about)]
struct Args {
    /// This node's name (its Node object; pods' spec.nodeName). Default: the host name.
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// The node's pod CIDR, e.g. 10.244.0.0/24; the gateway gets its
    /// first address. Give it twice, an IPv4 and an IPv6 CIDR (e.g.
    /// fd00:10:244:1::/64), for a dual-stack node. Default: the Node
    /// object's spec.podCIDRs.
    #[arg(long, value_name = "CIDR")]
    pod_cidr: Vec<IpNet>,
    /// The node's underlay address for VXLAN, IPv4 or IPv6 (the tunnel
    /// runs over that family; every node of a cluster must use the same).
    /// Default: the Node object's IPv4 InternalIP, else its IPv6 one.
    #[arg(long, value_name = "IP")]
    node_ip: Option<std::net::IpAddr>,
    /// Take the cluster (Namespaces, Pods, Nodes, NetworkPolicies) from the
    /// YAML/JSON manifests in this directory, watched for changes.
    #[arg(long, value_name = "DIR")]
    manifests: Option<PathBuf>,
    /// Take the cluster from the Kubernetes API with this kubeconfig.
    #[arg(long, value_name = "PATH", conflicts_with = "manifests")]
    kubeconfig: Option<PathBuf>,
    /// Take the cluster from the Kubernetes API with the in-cluster
    /// configuration (the DaemonSet's service account), or $KUBECONFIG.
    #[arg(long, conflicts_with_all = ["manifests", "kubeconfig"])]
    in_cluster: bool,
    /// The switch's VXLAN port the agent adds for traffic to other nodes.
    #[arg(long, value_name = "NAME", default_value = "oxvs-tun0")]
    tunnel: String,
    /// The CNI socket to serve.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_CNI_SOCKET)]
    cni_socket: PathBuf,
    /// oxvs-switchd's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SWITCHD_SOCKET)]
    switchd_socket: PathBuf,
    /// The API socket (`oxvsctl traceflow`); not served if another agent serves it.
    #[arg(long, value_name = "PATH", default_value = oxvs_api::agent::DEFAULT_AGENT_SOCKET)]
    api_socket: PathBuf,
    /// Directory for attachment records and IPAM state.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/oxvs")]
    state_dir: PathBuf,
    /// The gateway interface oxvs-switchd made (`--gateway NAME`).
    #[arg(long, value_name = "NAME", default_value = "oxvs-gw0")]
    gateway: String,
    /// MTU of paths leaving the node: of pod interfaces, or with a larger
    /// --local-mtu of their default route and the host's routes to other
    /// nodes' pods (default: the MTU of the link holding the tunnel's
    /// address, --node-ip or the Node's InternalIP, minus 50 for VXLAN
    /// over IPv4, minus 70 over IPv6; the default-route interface's until
    /// that address is known).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(576..=65000))]
    mtu: Option<u32>,
    /// MTU of pod interfaces and the gateway, for traffic that stays on the
    /// node: `auto` (the largest the switch takes whole: 65535 with
    /// multi-buffer AF_XDP, kernel 6.6+), `off` (--mtu everywhere), or
    /// bytes. Above --mtu, routes leaving the node carry --mtu.
    #[arg(long, value_name = "auto|off|BYTES", default_value = "auto")]
    local_mtu: oxvs_agent::agent::LocalMtu,
    /// Turn TX checksum offload off in pods (and with it their GSO). Only
    /// needed with a switch started with `--trust-checksums`; by default
    /// the switch completes the checksums pods leave partial.
    #[arg(long)]
    pod_tx_checksum_off: bool,
    /// Accepted for compatibility with older manifests: offload is on by
    /// default now.
    #[arg(long, hide = true, conflicts_with = "pod_tx_checksum_off")]
    pod_tx_checksum_on: bool,
    /// Root qdisc of pods' interfaces: `auto` (the node's
    /// net.core.default_qdisc), `none` (the veth's noqueue), or a kind.
    /// With one, a pod's veth (Linux 6.16+) pauses the pod's sending while
    /// the switch's receive ring is full, where noqueue drops the frame.
    #[arg(long, value_name = "auto|none|KIND", default_value = "auto")]
    pod_qdisc: oxvs_netlink::RootQdisc,
    /// Deadline of one call to the switch, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    switch_timeout_ms: u64,
    /// Do not masquerade pod traffic to outside the cluster (nor turn on forwarding).
    #[arg(long)]
    no_masquerade: bool,
    /// The most flows one NetworkPolicy may add on this node; a policy over
    /// it is refused (logged and counted; the pods it selects stay isolated).
    #[arg(long, value_name = "N", default_value_t = oxvs_agent::policy::DEFAULT_MAX_POLICY_FLOWS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    max_policy_flows: usize,
    /// Load-balance Services (ClusterIP) in the switch instead of leaving
    /// them to kube-proxy, which must then not run (docs/operations.md,
    /// "The Service proxy"). Watches Services and Endpoints (or takes them
    /// from the manifests).
    #[arg(long)]
    proxy: bool,
    /// Seconds between checks that the switch still holds what the records say.
    #[arg(long, value_name = "S", default_value_t = 5)]
    resync_interval: u64,
    /// Log filter (`info`, `debug`, `oxvs_agent=debug,warn`...).
    #[arg(long, value_name = "FILTER", default_value = "info")]
    log_level: String,
    /// Serve Prometheus metrics at http://ADDR/metrics (`none`: do not).
    #[arg(long, value_name = "ADDR", default_value = oxvs_agent::metrics::DEFAULT_METRICS_ADDR,
          value_parser = parse_metrics_addr)]
    metrics_addr: MetricsAddr,
    /// Most CNI connections served at once; one more is answered "busy"
    /// and the plugin retries.
    #[arg(long, value_name = "N", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    cni_max_connections: u32,
    /// Close a CNI connection that sends no request for this long: 500ms, 10s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_idle)]
    cni_idle_timeout: Duration,
    /// Most API connections (`oxvsctl traceflow`) served at once.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    api_max_connections: u32,
    /// Close an API connection that sends no request for this long.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_idle)]
    api_idle_timeout: Duration,
    /// Most /metrics connections served at once; one more is answered 503
    /// with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    metrics_max_connections: u32,
    /// Close a /metrics connection that sends no complete request for this long.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_idle)]
    metrics_idle_timeout: Duration,
    /// Where the host's /proc/sys is (the agent writes net.ipv4 forwarding
    /// and redirect settings there). In a container without privileges
    /// /proc/sys is read-only: mount the host's /proc/sys/net at
    /// DIR/net and pass DIR (the DaemonSet: /host/proc/sys).
    #[arg(long, value_name = "DIR", default_value = "/proc/sys")]
    proc_sys: PathBuf,
}

/// An idle timeout: a duration with a unit, not zero.
fn parse_idle(s: &str) -> Result<Duration, String> {
    let d = oxvs_api::listen::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!(
            "'{s}': an idle timeout of 0 would close every connection at once"
        ));
    }
    Ok(d)
}

fn gate(max: u32, idle: Duration) -> Gate {
    Gate::new(Limits {
        max_connections: max as usize,
        idle_timeout: idle,
    })
}

/// Listens on a Unix socket that is mode 0600 from the moment it exists
/// ([`oxvs_api::listen::bind_private_unix`]: a live server on the path is
/// refused, a stale socket replaced).
fn bind_unix(sock: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    let l = oxvs_api::listen::bind_private_unix(sock)?;
    l.set_nonblocking(true)
        .with_context(|| format!("cannot make {} non-blocking", sock.display()))?;
    tokio::net::UnixListener::from_std(l)
        .with_context(|| format!("cannot serve {} on the runtime", sock.display()))
}

/// `--metrics-addr`: an address, or `none`.
#[derive(Clone, Debug)]
struct MetricsAddr(Option<std::net::SocketAddr>);

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "none" {
        return Ok(MetricsAddr(None));
    }
    s.parse()
        .map(|a| MetricsAddr(Some(a)))
        .map_err(|_| format!("'{s}' is not IP:PORT (e.g. 127.0.0.1:9531) or 'none'"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // Before the runtime: podnet's blocking calls run their own.
    let mtu = pod_mtu(&args);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(args, mtu)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

fn pod_mtu(args: &Args) -> u32 {
    if let Some(m) = args.mtu {
        return m;
    }
    let underlay = podnet::default_route_interface()
        .ok()
        .flatten()
        .and_then(|i| podnet::link_mtu(&i).ok())
        .unwrap_or(1500);
    // VXLAN: outer Ethernet-less IPv4 + UDP + VXLAN + inner Ethernet is
    // 50 bytes; over IPv6, 70.
    let overhead = if args.node_ip.is_some_and(|ip| ip.is_ipv6()) {
        70
    } else {
        50
    };
    underlay.saturating_sub(overhead).max(576)
}

/// The `--pod-cidr`s by family: at most one of each, large enough.
fn pod_cidrs(given: &[IpNet]) -> anyhow::Result<(Option<Ipv4Net>, Option<Ipv6Net>)> {
    let (mut v4, mut v6) = (None, None);
    for c in given {
        match c.trunc() {
            IpNet::V4(n) => {
                if n.prefix_len() > 30 {
                    anyhow::bail!("--pod-cidr {c} is too small (at most /30)");
                }
                if v4.replace(n).is_some() {
                    anyhow::bail!("--pod-cidr is given two IPv4 CIDRs; a node has one per family");
                }
            }
            IpNet::V6(n) => {
                if n.prefix_len() > 126 {
                    anyhow::bail!("--pod-cidr {c} is too small (at most /126)");
                }
                if v6.replace(n).is_some() {
                    anyhow::bail!("--pod-cidr is given two IPv6 CIDRs; a node has one per family");
                }
            }
        }
    }
    Ok((v4, v6))
}

async fn run(args: Args, pod_mtu: u32) -> anyhow::Result<()> {
    let (pod_cidr, pod_cidr6) = pod_cidrs(&args.pod_cidr)?;
    let pod_qdisc = args
        .pod_qdisc
        .resolve()
        .map_err(|e| anyhow::anyhow!("--pod-qdisc: {e}"))?;
    let node_name = match &args.node_name {
        Some(n) => n.clone(),
        None => nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into()),
    };
    let cfg = AgentConfig {
        node_name,
        node_ip: args.node_ip,
        tunnel: args.tunnel.clone(),
        cni_socket: args.cni_socket.clone(),
        switchd_socket: args.switchd_socket.clone(),
        state_dir: args.state_dir.clone(),
        pod_cidr,
        pod_cidr6,
        gateway: args.gateway.clone(),
        pod_mtu,
        pod_mtu_auto: args.mtu.is_none(),
        local_mtu: args.local_mtu,
        pod_tx_checksum_off: args.pod_tx_checksum_off,
        pod_qdisc,
        switch_timeout: Duration::from_millis(args.switch_timeout_ms),
        masquerade: !args.no_masquerade,
        max_policy_flows: args.max_policy_flows,
        proxy: args.proxy,
    };
    tracing::info!(node = %cfg.node_name, pod_cidr = ?cfg.pod_cidr, pod_cidr6 = ?cfg.pod_cidr6, mtu = cfg.pod_mtu, pod_qdisc = cfg.pod_qdisc.as_deref().unwrap_or("noqueue"), state = %cfg.state_dir.display(), "starting");
    oxvs_agent::hostnet::set_proc_sys(args.proc_sys.clone());
    let kube = match (&args.manifests, &args.kubeconfig, args.in_cluster) {
        (None, kubeconfig, in_cluster) if kubeconfig.is_some() || in_cluster => Some(
            source::kube_client(kubeconfig.clone())
                .await
                .context("cannot configure the Kubernetes client")?,
        ),
        _ => None,
    };
    // With a cluster source, CNI ADD reads a pod the snapshot lacks from it.
    let mut agent = Agent::open(cfg)?;
    if let Some(dir) = &args.manifests {
        agent = agent.with_pod_lookup(Arc::new(source::ManifestPods { dir: dir.clone() }));
    } else if let Some(client) = &kube {
        agent = agent.with_pod_lookup(Arc::new(source::KubePods {
            client: client.clone(),
        }));
    }
    let agent = Arc::new(agent);

    let sock = &args.cni_socket;
    let listener = bind_unix(sock).map_err(|e| match e.downcast_ref::<ListenError>() {
        Some(ListenError::AlreadyServing(_)) => {
            anyhow::anyhow!("another agent is serving {}", sock.display())
        }
        _ => e,
    })?;
    let cni_gate = gate(args.cni_max_connections, args.cni_idle_timeout);
    let mut listeners = vec![("cni", cni_gate.stats())];
    tracing::info!(socket = %sock.display(), limits = ?cni_gate.limits(), "serving CNI");
    let server = tokio::spawn(socket_server::serve::<CniSocket, _>(
        agent.clone(),
        listener,
        cni_gate,
    ));
    let api_gate = gate(args.api_max_connections, args.api_idle_timeout);
    let api = serve_api(&agent, &args.api_socket, api_gate.clone());
    if api.is_some() {
        listeners.push(("api", api_gate.stats()));
    }
    // Auxiliary like the API: a bind failure is logged, not fatal.
    let metrics = match args.metrics_addr.0 {
        None => None,
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => {
                let bound = l.local_addr().unwrap_or(addr);
                tracing::info!(addr = %bound, "serving metrics at http://{bound}/metrics");
                let g = gate(args.metrics_max_connections, args.metrics_idle_timeout);
                Some(tokio::spawn(oxvs_agent::metrics::serve(
                    agent.clone(),
                    l,
                    g,
                    listeners,
                )))
            }
            Err(e) => {
                tracing::error!("no metrics: cannot listen on {addr}: {e}");
                None
            }
        },
    };
    // The cluster source, and the controller that follows it.
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(ClusterState::default()));
    let source_task = match (&args.manifests, &args.kubeconfig, args.in_cluster) {
        (Some(dir), _, _) => {
            let dir = dir.clone();
            tracing::info!(dir = %dir.display(), "cluster source: manifest directory");
            Some(tokio::spawn(async move {
                if let Err(e) = source::watch_manifest_dir(dir.clone(), tx).await {
                    tracing::error!("manifest source {} stopped: {e:#}", dir.display());
                }
            }))
        }
        (None, _, _) if kube.is_some() => {
            let client = kube.clone().context("the Kubernetes client")?;
            let proxy = args.proxy;
            tracing::info!("cluster source: the Kubernetes API");
            Some(tokio::spawn(async move {
                if let Err(e) = source::watch_kube(client, tx, proxy).await {
                    tracing::error!("Kubernetes source stopped: {e:#}");
                }
            }))
        }
        _ => {
            // CNI-only mode: the node's own pods, no cluster objects.
            drop(tx);
            None
        }
    };
    // With a cluster source, touch the switch only once its first snapshot
    // (a complete one) is in; see keep_converged.
    let first_snapshot = source_task.is_some().then(|| rx.clone());
    let controller = tokio::spawn(follow_cluster(agent.clone(), rx));
    let keeper = tokio::spawn(keep_converged(
        agent.clone(),
        first_snapshot,
        Duration::from_secs(args.resync_interval.max(1)),
        args.switchd_socket.clone(),
    ));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping (pods keep forwarding)");
    server.abort();
    if let Some(m) = metrics {
        m.abort();
    }
    if let Some(api) = api {
        api.abort();
        let _ = std::fs::remove_file(&args.api_socket);
    }
    keeper.abort();
    controller.abort();
    if let Some(s) = source_task {
        s.abort();
    }
    let _ = std::fs::remove_file(sock);
    Ok(())
}

/// Serves the API socket (mode 0600; a stale socket is replaced). The API
/// is auxiliary: when the socket cannot be served (e.g. another agent
/// serves it) the agent logs why and runs without it.
fn serve_api(
    agent: &Arc<Agent>,
    sock: &std::path::Path,
    gate: Gate,
) -> Option<tokio::task::JoinHandle<()>> {
    match bind_unix(sock) {
        Ok(l) => {
            tracing::info!(socket = %sock.display(), limits = ?gate.limits(), "serving the API");
            Some(tokio::spawn(socket_server::serve::<ApiSocket, _>(
                agent.clone(),
                l,
                gate,
            )))
        }
        Err(e) => {
            tracing::error!("no API socket: {e:#}");
            None
        }
    }
}

/// Applies every new cluster snapshot: the node's flows follow the objects.
async fn follow_cluster(
    agent: Arc<Agent>,
    mut rx: tokio::sync::watch::Receiver<Arc<ClusterState>>,
) {
    loop {
        if rx.changed().await.is_err() {
            return; // no source: CNI-only mode
        }
        // Coalesce a burst of changes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let state = rx.borrow_and_update().clone();
        let started = std::time::Instant::now();
        agent.set_cluster(state.clone()).await;
        match agent.sync().await {
            Ok(()) => tracing::debug!(
                pods = state.pods.len(),
                policies = state.policies.len(),
                nodes = state.nodes.len(),
                ms = started.elapsed().as_secs_f64() * 1e3,
                "cluster change applied"
            ),
            // Not ready yet (the keeper converges once it is), or the
            // switch is away (the keeper notices the drift).
            Err(e) => tracing::debug!("cluster change not applied yet: {}", e.msg),
        }
    }
}

/// Converges with the switch on start, then whenever it drifts.
///
/// With a cluster source (`first` is its receiver) the first convergence
/// waits for the source's first snapshot: converging with the empty initial
/// state would make the switch's flows ones without policies and remote
/// nodes, so a restarted agent would open denied traffic and cut
/// cross-node traffic until the snapshot came (measured by the lab's
/// `churn` test). Until then the node is not discovered, so CNI ADD and
/// STATUS answer "not ready" and the switch keeps the flows it has.
async fn keep_converged(
    agent: Arc<Agent>,
    first: Option<tokio::sync::watch::Receiver<Arc<ClusterState>>>,
    every: Duration,
    switchd_socket: std::path::PathBuf,
) {
    if let Some(mut rx) = first {
        tracing::info!("waiting for the cluster source before converging with the switch");
        // An error means the source ended without a snapshot (it logged why).
        if rx.changed().await.is_ok() {
            let state = rx.borrow_and_update().clone();
            agent.set_cluster(state).await;
        }
    }
    let mut converged = false;
    let mut failures = 0u64;
    loop {
        let drifted = if converged {
            match agent.drifted().await {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!("cannot check the switch: {e:#}");
                    true
                }
            }
        } else {
            true
        };
        if drifted {
            match agent.reconcile().await {
                Ok(r) => {
                    if !converged || r.rolled_back + r.gone + r.ports_readded > 0 {
                        tracing::info!(
                            pods = r.pods,
                            rolled_back = r.rolled_back,
                            gone = r.gone,
                            ports_readded = r.ports_readded,
                            addresses_released = r.addresses_released,
                            flows_added = r.flow_changes.added,
                            flows_deleted = r.flow_changes.deleted,
                            "converged with the switch"
                        );
                    }
                    converged = true;
                    failures = 0;
                }
                Err(e) => {
                    if failures.is_multiple_of(30) {
                        tracing::warn!("cannot converge with the switch yet (retrying): {e:#}");
                    }
                    failures += 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        wait_for_resync(every, &switchd_socket).await;
    }
}

/// How often the keeper looks whether switchd's socket was replaced.
const SOCKET_POLL: Duration = Duration::from_millis(100);

/// Sleeps `every`, or less: until switchd's control socket is a new one (a
/// restarted switch makes its socket anew, so its ports are gone and must
/// be re-added now, not at the next resync). One `stat` per
/// [`SOCKET_POLL`].
async fn wait_for_resync(every: Duration, socket: &std::path::Path) {
    use std::os::unix::fs::MetadataExt as _;
    // Inode numbers are reused at once on tmpfs: the change time tells a
    // new socket from the old one, and so does having seen none between.
    let id = |p: &std::path::Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
    };
    let before = id(socket);
    let mut gone = before.is_none();
    let end = tokio::time::Instant::now() + every;
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(SOCKET_POLL.min(end - tokio::time::Instant::now())).await;
        let now = id(socket);
        gone |= now.is_none();
        if now.is_some() && (gone || now != before) {
            tracing::info!("switchd's socket is new (the switch restarted): converging now");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pod_cidrs;

    fn nets(v: &[&str]) -> Vec<ipnet::IpNet> {
        v.iter().map(|s| s.parse().expect("test CIDR")).collect()
    }

    /// `--pod-cidr` by family: at most one each, large enough; every
    /// refusal names what is wrong.
    #[test]
    fn pod_cidr_flags() {
        let (v4, v6) = pod_cidrs(&nets(&["10.244.1.7/24", "fd00:10:244:1::9/64"])).unwrap();
        assert_eq!(v4.unwrap().to_string(), "10.244.1.0/24");
        assert_eq!(v6.unwrap().to_string(), "fd00:10:244:1::/64");
        assert_eq!(pod_cidrs(&[]).unwrap(), (None, None));
        // An IPv6-only node.
        let (v4, v6) = pod_cidrs(&nets(&["fd00:10:244:1::/64"])).unwrap();
        assert_eq!(
            (v4, v6.unwrap().to_string().as_str()),
            (None, "fd00:10:244:1::/64")
        );
        for (given, why) in [
            (&["10.0.0.0/31"][..], "too small (at most /30)"),
            (
                &["10.0.0.0/24", "fd00::/127"][..],
                "too small (at most /126)",
            ),
            (&["10.0.0.0/24", "10.1.0.0/24"][..], "two IPv4 CIDRs"),
            (
                &["10.0.0.0/24", "fd00::/64", "fd01::/64"][..],
                "two IPv6 CIDRs",
            ),
        ] {
            let e = pod_cidrs(&nets(given)).unwrap_err().to_string();
            assert!(e.contains(why), "{given:?}: {e}");
        }
    }
}
