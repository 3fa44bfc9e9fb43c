//! `oxvs-lab up`: builds the underlay, the nodes, their Node objects, and
//! starts oxvs-switchd then oxvs-agent in every node, waiting until each
//! agent answers CNI STATUS.
//!
//! The agent is driven by its manifest source (`--node-name --manifests`)
//! when its `--help` offers `--manifests`; an older agent without it is run
//! with `--pod-cidr` ("legacy" mode: no Node objects, so no cross-node
//! routes). Optional agent flags (`--node-ip`, `--api-socket`) are passed
//! only when `--help` lists them.
//!
//! `--kube-proxy` adds the Kubernetes side ([`super::kube`]): the API
//! server starts in the underlay namespace while the nodes are built, then
//! Node objects and a kube-proxy per node; without it nothing of that runs.
//!
//! On failure the half-built lab stays for inspection (its logs are in the
//! lab directory); `oxvs-lab down` removes it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Deserialize;

use super::runtime::{cni_status, wait_for_socket};
use super::{Bins, Ctx, Global, GATEWAY};
use crate::manifest;
use crate::netns::{self, run};
use crate::procs;
use crate::state::{random_uid, AgentMode, IpFamily, LabState, NodeState, UnderlayFamily};

/// Underlay prefix: the bridge is .1, node N is .(10+N).
pub(crate) const UNDERLAY: &str = "192.168.77";
/// The IPv6 underlay's /64 (a dual-stack lab): the bridge is `::1`, node N
/// `::(10+N)`.
pub(crate) const UNDERLAY6: &str = "fd00:192:168:77";
/// Underlay MTU.
pub(crate) const UNDERLAY_MTU: &str = "1500";
/// Most nodes (pod CIDRs 10.244.N.0/24, underlay .(10+N)).
pub(crate) const MAX_NODES: u32 = 200;

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Cluster file (YAML: `name`, `nodes`).
    #[arg(short = 'f', long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Number of nodes (default 2, or the cluster file's).
    #[arg(long, value_name = "N")]
    pub nodes: Option<u32>,
    /// Seconds to wait for every agent to be ready.
    #[arg(long, value_name = "S", default_value_t = 30)]
    pub timeout: u64,
    /// Log filter for switchd and the agents.
    #[arg(long, value_name = "FILTER", default_value = "info")]
    pub log_level: String,
    /// Also run a kube-apiserver (k8s-local.sh, in the underlay namespace)
    /// and a real kube-proxy (iptables mode) on every node, for Services.
    /// Needs the cached Kubernetes build with kube-proxy.
    #[arg(long)]
    pub kube_proxy: bool,
    /// Load-balance Services in the switch (`oxvs-agent --proxy`): no
    /// kube-proxy, no API server; `apply` writes Services and their
    /// Endpoints for the agents to read.
    #[arg(long, conflicts_with = "kube_proxy")]
    pub proxy: bool,
    /// One more argument for every node's oxvs-switchd, e.g.
    /// `--switchd-arg=--ct-max=4096` (repeatable; `switch restart` keeps
    /// them, nodes added later by `node add` do not get them).
    #[arg(long = "switchd-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub switchd_args: Vec<String>,
    /// Pods' address families: `ipv4`; `dual` (an IPv4 and an IPv6
    /// address per pod, IPv6 pod CIDRs fd00:10:244:N::/64; the nodes get
    /// an IPv6 underlay address too); or `ipv6` (IPv6-only pods and
    /// nodes: IPv6 pod CIDRs and InternalIPs only, the tunnel over IPv6).
    #[arg(long, value_enum, default_value_t = IpFamily::Ipv4)]
    pub ip_family: IpFamily,
    /// The tunnel's underlay family: `ipv4`, or `ipv6` (VXLAN between the
    /// nodes' IPv6 addresses fd00:192:168:77::N, pod MTU 1430; needs
    /// `--ip-family dual` or `ipv6`). Default: ipv6 with `--ip-family
    /// ipv6`, else ipv4.
    #[arg(long, value_enum)]
    pub underlay: Option<UnderlayFamily>,
}

/// The tunnel's family for a lab of `family` asked for `underlay`
/// (`up --underlay`, `None` when not given): IPv4 by default, IPv6 in an
/// IPv6-only lab (whose nodes have no IPv4 address), and an error for a
/// combination the nodes' addresses cannot carry.
pub fn resolve_underlay(
    family: IpFamily,
    underlay: Option<UnderlayFamily>,
) -> anyhow::Result<UnderlayFamily> {
    match (family, underlay) {
        (IpFamily::Ipv6, None | Some(UnderlayFamily::Ipv6)) => Ok(UnderlayFamily::Ipv6),
        (IpFamily::Ipv6, Some(UnderlayFamily::Ipv4)) => anyhow::bail!(
            "--underlay ipv4 cannot be used with --ip-family ipv6: IPv6-only nodes have no IPv4 \
             address to run the tunnel between (leave --underlay out, or use --ip-family dual)"
        ),
        (IpFamily::Ipv4, Some(UnderlayFamily::Ipv6)) => anyhow::bail!(
            "--underlay ipv6 needs --ip-family dual or ipv6 (the nodes' IPv6 addresses come with them)"
        ),
        (_, u) => Ok(u.unwrap_or_default()),
    }
}

/// The cluster file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    pub name: Option<String>,
    pub nodes: Option<u32>,
}

pub fn run_up(global: &Global, args: &UpArgs) -> anyhow::Result<u8> {
    let file: ClusterFile = match &args.file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            serde_saphyr::from_str_with_options(&text, crate::manifest::yaml_options())
                .with_context(|| {
                    format!("{}: not a cluster file (keys: name, nodes)", p.display())
                })?
        }
        None => ClusterFile::default(),
    };
    let ctx = Ctx::new(global, file.name.as_deref())?;
    let underlay = resolve_underlay(args.ip_family, args.underlay)?;
    let n_nodes = args.nodes.or(file.nodes).unwrap_or(2);
    if !(1..=MAX_NODES).contains(&n_nodes) {
        anyhow::bail!("--nodes {n_nodes}: use 1 to {MAX_NODES}");
    }
    // Checked before anything (even the lab's directory) is made; never builds.
    let kube_tools = if args.kube_proxy {
        Some(super::kube::find_tools(&Bins::find(
            global.bin_dir.as_deref(),
        )?)?)
    } else {
        None
    };
    let _lock = ctx.paths.lock(true)?;
    if ctx.paths.exists() {
        let st = ctx.paths.load()?;
        let dead = super::status::dead_daemons(&st);
        if dead.is_empty() && args.kube_proxy && st.kube.is_none() {
            anyhow::bail!(
                "lab {} is already up, without kube-proxy; run `oxvs-lab down --name {}` first",
                ctx.name(),
                ctx.name()
            );
        }
        if dead.is_empty() {
            crate::say!(
                "lab {} is already up ({} nodes, {} pods)",
                ctx.name(),
                st.nodes.len(),
                st.pods.len()
            );
            return Ok(0);
        }
        anyhow::bail!(
            "lab {} exists but is not healthy ({}); run `oxvs-lab down --name {}` first",
            ctx.name(),
            dead.join(", "),
            ctx.name()
        );
    }
    let bins = Bins::find(global.bin_dir.as_deref())?;
    let help = netns::output(&[&bins.agent.display().to_string(), "--help"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mode = if help.contains("--manifests") {
        AgentMode::Manifests
    } else {
        AgentMode::Legacy
    };
    if underlay == UnderlayFamily::Ipv6
        && !(mode == AgentMode::Manifests && help.contains("--node-ip"))
    {
        anyhow::bail!(
            "--underlay ipv6{}: this oxvs-agent ({}) takes no --node-ip with its manifests; the tunnel would stay IPv4",
            if args.ip_family == IpFamily::Ipv6 { " (what --ip-family ipv6 runs on)" } else { "" },
            bins.agent.display()
        );
    }
    let mut st = LabState {
        name: ctx.name().to_string(),
        agent_mode: mode,
        ip_family: args.ip_family,
        underlay,
        proxy: args.proxy.then(Default::default),
        ..LabState::default()
    };
    bins.record(&mut st);
    for d in [ctx.paths.manifests(), ctx.paths.pods_dir()] {
        std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    ctx.paths.save(&st)?;
    if let Err(e) = build(
        &ctx,
        &bins,
        &mut st,
        n_nodes,
        args,
        &help,
        kube_tools.as_ref(),
    ) {
        anyhow::bail!(
            "{e:#}\n(the half-built lab {} is left for inspection in {}; `oxvs-lab down --name {}` removes it)",
            ctx.name(),
            ctx.paths.root.display(),
            ctx.name()
        );
    }
    crate::say!(
        "lab {} is up: {} nodes ({} agent), manifests in {}",
        ctx.name(),
        st.nodes.len(),
        match mode {
            AgentMode::Manifests => "manifest-driven",
            AgentMode::Legacy => "legacy --pod-cidr",
        },
        ctx.paths.manifests().display()
    );
    for n in &st.nodes {
        crate::say!(
            "  {}  netns {}  ip {}  podCIDR {}",
            n.name,
            n.netns,
            n.internal_ips().join(","),
            n.pod_cidrs().join(",")
        );
    }
    if let Some(k) = &st.kube {
        crate::say!(
            "  kube-apiserver {} (in {}), kube-proxy ({}) on every node; Services: `oxvs-lab apply -f`, `oxvs-lab kubectl get svc -A`",
            k.server,
            ctx.paths.underlay_netns(),
            match k.family() {
                IpFamily::Ipv4 => "iptables",
                IpFamily::Dual => "iptables and ip6tables",
                IpFamily::Ipv6 => "ip6tables",
            }
        );
    }
    Ok(0)
}

fn build(
    ctx: &Ctx,
    bins: &Bins,
    st: &mut LabState,
    n_nodes: u32,
    args: &UpArgs,
    agent_help: &str,
    kube_tools: Option<&super::kube::KubeTools>,
) -> anyhow::Result<()> {
    // Underlay: a bridge in its own namespace.
    let ul = ctx.paths.underlay_netns();
    st.note_netns(&ul);
    ctx.paths.save(st)?;
    netns::add(&ul)?;
    run(&["ip", "-n", &ul, "link", "add", "br0", "type", "bridge"])?;
    run(&[
        "ip",
        "-n",
        &ul,
        "addr",
        "add",
        &format!("{UNDERLAY}.1/24"),
        "dev",
        "br0",
    ])?;
    run(&[
        "ip",
        "-n",
        &ul,
        "link",
        "set",
        "br0",
        "mtu",
        UNDERLAY_MTU,
        "up",
    ])?;
    if st.ip_family.has_ipv6() {
        run(&[
            "ip",
            "-n",
            &ul,
            "addr",
            "add",
            &format!("{UNDERLAY6}::1/64"),
            "dev",
            "br0",
            "nodad",
        ])?;
    }
    // The API server starts in the background while the nodes are built.
    let apiserver = match kube_tools {
        Some(t) => Some(super::kube::start_apiserver(ctx, st, t)?),
        None => None,
    };

    let mdir = ctx.paths.manifests();
    let ns_uid = st
        .uids
        .entry("namespace_default.yaml".into())
        .or_insert_with(random_uid)
        .clone();
    manifest::write(
        &mdir,
        "namespace_default.yaml",
        &manifest::default_namespace(&ns_uid),
    )?;

    for i in 1..=n_nodes {
        let node = NodeState::new(i, ctx.paths.node_netns(i), args.ip_family);
        st.note_netns(&node.netns);
        st.nodes.push(node.clone());
        ctx.paths.save(st)?;
        wire_node(&ul, &node, i)?;
        let file = manifest::object_file_name("Node", "", &node.name);
        let uid = st
            .uids
            .entry(file.clone())
            .or_insert_with(random_uid)
            .clone();
        manifest::write(
            &mdir,
            &file,
            &manifest::node_object(&node.name, &uid, &node.pod_cidrs(), &node.internal_ips()),
        )?;
        let dir = ctx.paths.node_dir(i);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }

    // switchd everywhere first, then the agents.
    let sw_bin = bins.switchd.display().to_string();
    let mut switches = Vec::new();
    for k in 0..st.nodes.len() {
        let node = st.nodes[k].clone();
        let dir = ctx.paths.node_dir(node.index);
        let sock = dir.join("switchd.sock");
        let _ = std::fs::remove_file(&sock);
        let sock_arg = sock.display().to_string();
        let mut argv = vec![
            sw_bin.as_str(),
            "--socket",
            &sock_arg,
            "--gateway",
            GATEWAY,
            "--log-level",
            &args.log_level,
        ];
        argv.extend(args.switchd_args.iter().map(String::as_str));
        let child = procs::spawn_in(&node.netns, &argv, &dir.join("switchd.log"))?;
        st.nodes[k].switchd_pid = Some(child.id());
        switches.push(child);
        ctx.paths.save(st)?;
    }
    for (node, child) in st.nodes.clone().iter().zip(switches.iter_mut()) {
        let dir = ctx.paths.node_dir(node.index);
        let sock = dir.join("switchd.sock");
        if !wait_for_socket(&sock, child, Duration::from_secs(10)) {
            anyhow::bail!(
                "oxvs-switchd on {} did not come up (no {}):\n{}",
                node.name,
                sock.display(),
                procs::log_tail(&dir.join("switchd.log"), 30)
            );
        }
    }
    let agent_bin = bins.agent.display().to_string();
    let mut agents = Vec::new();
    for k in 0..st.nodes.len() {
        let node = st.nodes[k].clone();
        let argv = agent_argv(ctx, st, &node, &agent_bin, &args.log_level, agent_help);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let dir = ctx.paths.node_dir(node.index);
        let child = procs::spawn_in(&node.netns, &argv, &dir.join("agent.log"))?;
        st.nodes[k].agent_pid = Some(child.id());
        agents.push(child);
        ctx.paths.save(st)?;
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout.max(1));
    for (node, child) in st.nodes.clone().iter().zip(agents.iter_mut()) {
        let dir = ctx.paths.node_dir(node.index);
        loop {
            let status = cni_status(ctx, bins, node)?;
            if status.ok {
                break;
            }
            let agent_alive = procs::child_running(child);
            if !agent_alive || Instant::now() > deadline {
                anyhow::bail!(
                    "oxvs-agent on {} {} (last STATUS: {})\n--- agent.log (tail) ---\n{}\n--- switchd.log (tail) ---\n{}",
                    node.name,
                    if agent_alive {
                        format!("is not ready after {} s", args.timeout)
                    } else {
                        "exited".to_string()
                    },
                    status.describe(),
                    procs::log_tail(&dir.join("agent.log"), 30),
                    procs::log_tail(&dir.join("switchd.log"), 10)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    if let Some(child) = apiserver {
        super::kube::finish_up(ctx, st, child, Duration::from_secs(args.timeout.max(1)))?;
    }
    Ok(())
}

/// The agent's command line for `node`.
pub(crate) fn agent_argv(
    ctx: &Ctx,
    st: &LabState,
    node: &NodeState,
    bin: &str,
    log_level: &str,
    help: &str,
) -> Vec<String> {
    let (mode, proxy) = (st.agent_mode, st.proxy.is_some());
    let dir = ctx.paths.node_dir(node.index);
    let p = |f: &str| dir.join(f).display().to_string();
    let mut v = vec![bin.to_string()];
    let mut push = |k: &str, val: String| {
        v.push(k.to_string());
        v.push(val);
    };
    match mode {
        AgentMode::Manifests => {
            push("--node-name", node.name.clone());
            push("--manifests", ctx.paths.manifests().display().to_string());
        }
        AgentMode::Legacy => {
            for c in node.pod_cidrs() {
                push("--pod-cidr", c.to_string());
            }
            push("--mtu", "1450".to_string());
        }
    }
    push("--cni-socket", p("cni.sock"));
    push("--switchd-socket", p("switchd.sock"));
    push("--state-dir", p("agent"));
    push("--gateway", GATEWAY.to_string());
    if mode == AgentMode::Manifests {
        // Redundant with the Node object, but lets an agent whose manifest
        // source is not ready yet still serve pods on its own node.
        if help.contains("--pod-cidr") {
            for c in node.pod_cidrs() {
                push("--pod-cidr", c.to_string());
            }
        }
        if help.contains("--node-ip") {
            // The tunnel's address; `up` checked the node has one of the
            // underlay's family (an IPv6-only node has no IPv4 one).
            if let Some(ip) = node.tunnel_ip(st.underlay) {
                push("--node-ip", ip.to_string());
            }
            if st.underlay == UnderlayFamily::Ipv6 {
                // VXLAN over IPv6 takes 70 bytes of the underlay's 1500.
                push("--mtu", "1430".to_string());
            }
        }
        if help.contains("--api-socket") {
            push("--api-socket", p("agent-api.sock"));
        }
    }
    push("--log-level", log_level.to_string());
    if proxy {
        v.push("--proxy".to_string());
    }
    v
}

/// Makes node `index`'s namespace and plugs it into the underlay bridge in
/// `ul`: veth `n<index>` on `br0`, `eth0` in the node with its address, the
/// underlay MTU and a default route via the bridge's address.
pub(crate) fn wire_node(ul: &str, node: &NodeState, index: u32) -> anyhow::Result<()> {
    let ns = node.netns.as_str();
    let port = format!("n{index}");
    netns::add(ns)?;
    run(&[
        "ip",
        "-n",
        ul,
        "link",
        "add",
        &port,
        "mtu",
        UNDERLAY_MTU,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        ns,
    ])?;
    run(&["ip", "-n", ul, "link", "set", &port, "master", "br0", "up"])?;
    if let Some(ip) = &node.ip {
        run(&[
            "ip",
            "-n",
            ns,
            "addr",
            "add",
            &format!("{ip}/24"),
            "dev",
            "eth0",
        ])?;
    }
    run(&[
        "ip",
        "-n",
        ns,
        "link",
        "set",
        "eth0",
        "mtu",
        UNDERLAY_MTU,
        "up",
    ])?;
    if node.ip.is_some() {
        run(&[
            "ip",
            "-n",
            ns,
            "route",
            "add",
            "default",
            "via",
            &format!("{UNDERLAY}.1"),
        ])?;
    }
    if let Some(ip6) = &node.ip6 {
        run(&[
            "ip",
            "-n",
            ns,
            "addr",
            "add",
            &format!("{ip6}/64"),
            "dev",
            "eth0",
            "nodad",
        ])?;
        run(&[
            "ip",
            "-n",
            ns,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &format!("{UNDERLAY6}::1"),
        ])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        global: Global,
        #[command(flatten)]
        up: UpArgs,
    }

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("up").chain(args.iter().copied())).expect("flags")
    }

    #[test]
    fn the_underlay_follows_the_ip_family() {
        use IpFamily::{Dual, Ipv4, Ipv6};
        let u = |f, u| resolve_underlay(f, u);
        assert_eq!(u(Ipv4, None).expect("v4"), UnderlayFamily::Ipv4);
        assert_eq!(u(Dual, None).expect("dual"), UnderlayFamily::Ipv4);
        assert_eq!(u(Ipv6, None).expect("v6"), UnderlayFamily::Ipv6);
        assert_eq!(
            u(Dual, Some(UnderlayFamily::Ipv6)).expect("dual over v6"),
            UnderlayFamily::Ipv6
        );
        assert_eq!(
            u(Ipv6, Some(UnderlayFamily::Ipv6)).expect("v6 over v6"),
            UnderlayFamily::Ipv6
        );
        let e = u(Ipv6, Some(UnderlayFamily::Ipv4))
            .expect_err("no IPv4 tunnel between IPv6-only nodes")
            .to_string();
        assert!(
            e.contains("--underlay ipv4") && e.contains("IPv6-only nodes have no IPv4"),
            "{e}"
        );
        let e = u(Ipv4, Some(UnderlayFamily::Ipv6))
            .expect_err("no IPv6 underlay on IPv4 nodes")
            .to_string();
        assert!(e.contains("needs --ip-family dual or ipv6"), "{e}");
        // As parsed: `--underlay` is optional.
        let c = parse(&["--ip-family", "ipv6"]);
        assert_eq!(c.up.ip_family, Ipv6);
        assert_eq!(c.up.underlay, None);
    }

    #[test]
    fn agent_flags_of_an_ipv6_only_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = parse(&[
            "--name",
            "t",
            "--state-root",
            &dir.path().display().to_string(),
        ]);
        let ctx = Ctx::new(&c.global, None).expect("ctx");
        let help = "--node-name --manifests --pod-cidr --node-ip --api-socket";
        let argv = |family, underlay| {
            let st = LabState {
                name: "t".into(),
                ip_family: family,
                underlay,
                ..LabState::default()
            };
            let node = NodeState::new(1, "t-node-1".into(), family);
            agent_argv(&ctx, &st, &node, "oxvs-agent", "info", help).join(" ")
        };
        let v6 = argv(IpFamily::Ipv6, UnderlayFamily::Ipv6);
        assert!(v6.contains("--pod-cidr fd00:10:244:1::/64"), "{v6}");
        assert_eq!(v6.matches("--pod-cidr").count(), 1, "{v6}");
        assert!(v6.contains("--node-ip fd00:192:168:77::11"), "{v6}");
        assert!(v6.contains("--mtu 1430"), "{v6}");
        assert!(!v6.contains("192.168.") && !v6.contains("10.244."), "{v6}");
        let dual = argv(IpFamily::Dual, UnderlayFamily::Ipv4);
        assert!(
            dual.contains("--pod-cidr 10.244.1.0/24 --pod-cidr fd00:10:244:1::/64"),
            "{dual}"
        );
        assert!(dual.contains("--node-ip 192.168.77.11"), "{dual}");
        assert!(!dual.contains("--mtu"), "{dual}");
        let dual6 = argv(IpFamily::Dual, UnderlayFamily::Ipv6);
        assert!(
            dual6.contains("--node-ip fd00:192:168:77::11 --mtu 1430"),
            "{dual6}"
        );
        let v4 = argv(IpFamily::Ipv4, UnderlayFamily::Ipv4);
        assert!(v4.contains("--pod-cidr 10.244.1.0/24 "), "{v4}");
        assert!(!v4.contains("fd00"), "{v4}");
    }
}
