//! `oxvs-lab node add` and `oxvs-lab node remove NODE`: growing and
//! shrinking a running lab, as a cluster gains and loses machines.
//!
//! `add` makes node N+1 (N = the highest index in use, so a removed node's
//! pod CIDR is only reused once every higher node is gone too) exactly as
//! `up` makes each node: namespace, underlay veth `nN` on `br0`, address
//! and default route, the Node object with pod CIDR `10.244.(N+1).0/24`,
//! then oxvs-switchd and oxvs-agent (same flags as `up`), and waits until
//! the agent answers CNI STATUS. The other agents see the new Node object
//! in the manifest directory and add its tunnel flows and host route.
//!
//! `remove` refuses a node that still runs pods unless `--force`, which
//! deletes them first (server stopped, CNI DEL while the node's agent still
//! runs, namespace, manifest). Then the node's agent and switchd are
//! stopped (SIGTERM, `--grace`, SIGKILL), its Node object is removed (the
//! other agents drop its flows and route), its namespace deleted (its
//! underlay veth goes with it) and its directory (agent state, logs)
//! removed, so a later node with the same index starts clean.
//!
//! Both hold the lab's exclusive lock; each step is recorded in the state
//! before the next (write-ahead, as `up` does), so a failed `add` leaves a
//! node that `node remove --force` or `down` cleans up.

use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::runtime::{cni_status, destroy_pod, wait_for_socket};
use super::up::{agent_argv, MAX_NODES};
use super::{Bins, Ctx, Global, GATEWAY};
use crate::manifest;
use crate::netns;
use crate::procs;
use crate::state::{random_uid, LabState, NodeState};

#[derive(Debug, clap::Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    pub command: NodeCmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum NodeCmd {
    /// Add node N+1 (namespace, underlay link, Node object, switchd, agent).
    Add(NodeAddArgs),
    /// Remove a node (its pods too with --force).
    Remove(NodeRemoveArgs),
}

#[derive(Debug, clap::Args)]
pub struct NodeAddArgs {
    /// Seconds to wait for the new agent to be ready.
    #[arg(long, value_name = "S", default_value_t = 30)]
    pub timeout: u64,
    /// Log filter for the node's switchd and agent.
    #[arg(long, value_name = "FILTER", default_value = "info")]
    pub log_level: String,
}

#[derive(Debug, clap::Args)]
pub struct NodeRemoveArgs {
    /// The node (`node-N`).
    #[arg(value_name = "NODE")]
    pub node: String,
    /// Delete the node's pods first instead of refusing.
    #[arg(long)]
    pub force: bool,
    /// Seconds a daemon gets between SIGTERM and SIGKILL.
    #[arg(long, value_name = "S", default_value_t = 5)]
    pub grace: u64,
}

pub fn run_node(global: &Global, args: &NodeArgs) -> anyhow::Result<u8> {
    match &args.command {
        NodeCmd::Add(a) => run_add(global, a),
        NodeCmd::Remove(a) => run_remove(global, a),
    }
}

fn open(global: &Global) -> anyhow::Result<Ctx> {
    let ctx = Ctx::new(global, None)?;
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist: run `oxvs-lab up` first", ctx.name());
    }
    Ok(ctx)
}

fn run_add(global: &Global, args: &NodeAddArgs) -> anyhow::Result<u8> {
    let ctx = open(global)?;
    let _lock = ctx.paths.lock(true)?;
    let mut st = ctx.paths.load()?;
    let bins = ctx.bins(&st)?;
    let i = st.nodes.iter().map(|n| n.index).max().unwrap_or(0) + 1;
    if i > MAX_NODES {
        anyhow::bail!(
            "lab {} cannot have a node {i}: at most {MAX_NODES}",
            ctx.name()
        );
    }
    let node = NodeState::new(i, ctx.paths.node_netns(i), st.ip_family);
    if netns::exists(&node.netns) {
        anyhow::bail!(
            "namespace {} already exists but the lab has no {}: remove it (`ip netns del {}`) or run `oxvs-lab down`",
            node.netns,
            node.name,
            node.netns
        );
    }
    let started = Instant::now();
    if let Err(e) = add_node(&ctx, &bins, &mut st, &node, args) {
        anyhow::bail!(
            "{e:#}\n(the half-made {} is left for inspection; `oxvs-lab node remove --force {}` removes it)",
            node.name,
            node.name
        );
    }
    crate::say!(
        "{} added in {} ms: netns {}  ip {}  podCIDR {}",
        node.name,
        started.elapsed().as_millis(),
        node.netns,
        node.internal_ips().join(","),
        node.pod_cidrs().join(",")
    );
    Ok(0)
}

fn add_node(
    ctx: &Ctx,
    bins: &Bins,
    st: &mut LabState,
    node: &NodeState,
    args: &NodeAddArgs,
) -> anyhow::Result<()> {
    let ul = ctx.paths.underlay_netns();
    if !netns::exists(&ul) {
        anyhow::bail!("the lab's underlay namespace {ul} is gone");
    }
    st.note_netns(&node.netns);
    st.nodes.push(node.clone());
    ctx.paths.save(st)?;
    super::up::wire_node(&ul, node, node.index)?;
    let ns = node.netns.as_str();
    let dir = ctx.paths.node_dir(node.index);
    // A leftover directory of an earlier node with this index would hand
    // the new agent someone else's records.
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = manifest::object_file_name("Node", "", &node.name);
    let uid = st
        .uids
        .entry(file.clone())
        .or_insert_with(random_uid)
        .clone();
    manifest::write(
        &ctx.paths.manifests(),
        &file,
        &manifest::node_object(&node.name, &uid, &node.pod_cidrs(), &node.internal_ips()),
    )?;
    ctx.paths.save(st)?;

    let k = st.nodes.len() - 1;
    let sock = dir.join("switchd.sock");
    let mut sw = procs::spawn_in(
        ns,
        &[
            &bins.switchd.display().to_string(),
            "--socket",
            &sock.display().to_string(),
            "--gateway",
            GATEWAY,
            "--log-level",
            &args.log_level,
        ],
        &dir.join("switchd.log"),
    )?;
    st.nodes[k].switchd_pid = Some(sw.id());
    ctx.paths.save(st)?;
    if !wait_for_socket(&sock, &mut sw, Duration::from_secs(10)) {
        anyhow::bail!(
            "oxvs-switchd on {} did not come up (no {}):\n{}",
            node.name,
            sock.display(),
            procs::log_tail(&dir.join("switchd.log"), 30)
        );
    }
    let help = netns::output(&[&bins.agent.display().to_string(), "--help"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let argv = agent_argv(
        ctx,
        st,
        node,
        &bins.agent.display().to_string(),
        &args.log_level,
        &help,
    );
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut agent = procs::spawn_in(ns, &argv, &dir.join("agent.log"))?;
    st.nodes[k].agent_pid = Some(agent.id());
    ctx.paths.save(st)?;
    wait_ready(
        ctx,
        bins,
        node,
        &mut agent,
        Duration::from_secs(args.timeout.max(1)),
    )?;
    if st.kube.is_some() {
        // up --kube-proxy: its Node object in the API server, its kube-proxy.
        super::kube::add_node(ctx, st, node, Duration::from_secs(args.timeout.max(1)))?;
    }
    Ok(())
}

/// Waits until `node`'s agent answers CNI STATUS; on failure the logs.
pub(crate) fn wait_ready(
    ctx: &Ctx,
    bins: &Bins,
    node: &NodeState,
    agent: &mut std::process::Child,
    timeout: Duration,
) -> anyhow::Result<()> {
    let dir = ctx.paths.node_dir(node.index);
    let deadline = Instant::now() + timeout;
    loop {
        let status = cni_status(ctx, bins, node)?;
        if status.ok {
            return Ok(());
        }
        let alive = procs::child_running(agent);
        if !alive || Instant::now() > deadline {
            anyhow::bail!(
                "oxvs-agent on {} {} (last STATUS: {})\n--- agent.log (tail) ---\n{}\n--- switchd.log (tail) ---\n{}",
                node.name,
                if alive {
                    format!("is not ready after {} s", timeout.as_secs())
                } else {
                    "exited".to_string()
                },
                status.describe(),
                procs::log_tail(&dir.join("agent.log"), 30),
                procs::log_tail(&dir.join("switchd.log"), 10)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_remove(global: &Global, args: &NodeRemoveArgs) -> anyhow::Result<u8> {
    let ctx = open(global)?;
    let _lock = ctx.paths.lock(true)?;
    let mut st = ctx.paths.load()?;
    let node = st.nodes[st.node_index(&args.node)?].clone();
    let pods: Vec<(String, String)> = st
        .pods
        .iter()
        .filter(|p| p.node == node.name)
        .map(|p| (p.namespace.clone(), p.name.clone()))
        .collect();
    if !pods.is_empty() && !args.force {
        let names: Vec<String> = pods.iter().map(|(ns, n)| format!("{ns}/{n}")).collect();
        anyhow::bail!(
            "{} runs {} pod(s) ({}): delete them first, or pass --force to delete them with the node",
            node.name,
            pods.len(),
            names.join(", ")
        );
    }
    let mut errs: Vec<String> = Vec::new();
    if !pods.is_empty() {
        let bins = ctx.bins(&st)?;
        for (ns, name) in &pods {
            let e = destroy_pod(&ctx, &bins, &mut st, ns, name);
            if e.is_empty() {
                crate::say!("Pod {ns}/{name} deleted (with {})", node.name);
            }
            errs.extend(e);
        }
    }
    let grace = Duration::from_secs(args.grace);
    errs.extend(super::kube::remove_node(&ctx, &mut st, &node, grace));
    match super::kube::sync_endpoints(&ctx, &mut st) {
        Ok(lines) => lines.iter().for_each(|l| crate::say!("{l}")),
        Err(e) => errs.push(format!("{e:#}")),
    }
    for (label, needle, pid) in [
        ("agent", "oxvs-agent", node.agent_pid),
        ("switchd", "oxvs-switchd", node.switchd_pid),
    ] {
        if let Some(pid) = pid {
            if let Err(e) = procs::stop(pid, needle, grace) {
                errs.push(format!("{} {label}: {e:#}", node.name));
            }
        }
    }
    let file = manifest::object_file_name("Node", "", &node.name);
    if let Err(e) = manifest::remove(&ctx.paths.manifests(), &file) {
        errs.push(format!("{e:#}"));
    }
    st.uids.remove(&file);
    procs::kill_netns_processes(&node.netns);
    match netns::del(&node.netns) {
        Ok(()) => st.forget_netns(&node.netns),
        Err(e) => errs.push(format!("{e:#}")),
    }
    // Deleting the namespace deletes eth0 and so its peer on the bridge;
    // make sure of it (absent is fine).
    let port = format!("n{}", node.index);
    let ul = ctx.paths.underlay_netns();
    if netns::exists(&ul) {
        let _ = netns::output(&["ip", "-n", &ul, "link", "del", &port]);
    }
    if errs.is_empty() {
        st.nodes.retain(|n| n.name != node.name);
        let dir = ctx.paths.node_dir(node.index);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                errs.push(format!("cannot remove {}: {e}", dir.display()));
            }
        }
    }
    ctx.paths.save(&st)?;
    if errs.is_empty() {
        crate::say!("{} removed", node.name);
        Ok(0)
    } else {
        for e in &errs {
            eprintln!("error: {e}");
        }
        eprintln!(
            "{} is only partly removed; run `oxvs-lab node remove --force {}` again or `oxvs-lab down`",
            node.name, node.name
        );
        Ok(1)
    }
}
