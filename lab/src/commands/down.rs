//! `oxvs-lab down`: removes everything the lab made, also when it is
//! half-built or half-broken. Every step runs whatever failed before it,
//! and every failure is reported:
//! 1. pod servers stopped; CNI DEL for every pod whose node agent still
//!    runs (so the agents release addresses and ports the proper way);
//! 2. kube-proxies and the API server (`up --kube-proxy`: `k8s-local.sh
//!    down`), then agents, then switchds: SIGTERM, `--grace` seconds, SIGKILL;
//! 3. every namespace the state lists (write-ahead, so also those a dying
//!    command was about to make), plus any `<lab>-ul` / `<lab>-node-N`
//!    found by name: remaining processes killed, namespace deleted (the
//!    links inside go with it);
//! 4. the lab directory, only when everything above succeeded (otherwise
//!    the state stays so that `down` can be run again).
//!
//! A lab whose state file is missing or corrupt is cleaned by name (step 3
//! only, for the node and underlay namespaces).

use std::time::Duration;

use super::runtime::{cni_for_pod, stop_server};
use super::{Ctx, Global};
use crate::netns;
use crate::procs;
use crate::state::LabState;

#[derive(Debug, clap::Args)]
pub struct DownArgs {
    /// Seconds a daemon gets between SIGTERM and SIGKILL.
    #[arg(long, value_name = "S", default_value_t = 5)]
    pub grace: u64,
}

/// `<lab>-ul` and `<lab>-node-<digits>` among the existing namespaces.
fn by_name(lab: &str) -> Vec<String> {
    let node_prefix = format!("{lab}-node-");
    netns::list()
        .into_iter()
        .filter(|n| {
            *n == format!("{lab}-ul")
                || n.strip_prefix(&node_prefix)
                    .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
        })
        .collect()
}

pub fn run_down(global: &Global, args: &DownArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    let named = by_name(ctx.name());
    if !ctx.paths.root.exists() && named.is_empty() {
        crate::say!("lab {} does not exist: nothing to do", ctx.name());
        return Ok(0);
    }
    let _lock = ctx.paths.lock(true)?;
    let mut errs: Vec<String> = Vec::new();
    let st = match ctx.paths.load() {
        Ok(s) => s,
        Err(e) => {
            errs.push(format!("{e:#} (cleaning by name)"));
            LabState {
                name: ctx.name().to_string(),
                ..LabState::default()
            }
        }
    };
    let grace = Duration::from_secs(args.grace);
    let bins = ctx.bins(&st).ok();

    // 1. Pods.
    for pod in &st.pods {
        if let Err(e) = stop_server(pod) {
            errs.push(format!("pod {}: stopping the server: {e:#}", pod.key()));
        }
        let node = st.node(&pod.node);
        let agent_up = node
            .and_then(|n| n.agent_pid)
            .is_some_and(|p| procs::alive(p, "oxvs-agent"));
        if let (Some(b), Some(n), true) = (&bins, node, agent_up) {
            match cni_for_pod(&ctx, b, n, pod, "DEL") {
                Ok(o) if o.ok => {}
                Ok(o) => errs.push(format!("pod {}: CNI DEL: {}", pod.key(), o.describe())),
                Err(e) => errs.push(format!("pod {}: CNI DEL: {e:#}", pod.key())),
            }
        }
    }
    // 2. Daemons: kube-proxies and the API server, then the agents (they
    //    talk to the switches).
    errs.extend(super::kube::teardown(&ctx, &st, grace));
    for (label, needle) in [("agent", "oxvs-agent"), ("switchd", "oxvs-switchd")] {
        for n in &st.nodes {
            let pid = if label == "agent" {
                n.agent_pid
            } else {
                n.switchd_pid
            };
            if let Some(pid) = pid {
                match procs::stop(pid, needle, grace) {
                    Ok(true) => {}
                    Ok(false) => {
                        // Gone already, or needed SIGKILL: either way gone now.
                    }
                    Err(e) => errs.push(format!("{} {label}: {e:#}", n.name)),
                }
            }
        }
    }
    // 3. Namespaces, newest first.
    let mut all: Vec<String> = st.netns.iter().rev().cloned().collect();
    for n in named {
        if !all.contains(&n) {
            all.push(n);
        }
    }
    let mut removed = 0;
    for ns in &all {
        if !netns::exists(ns) {
            continue;
        }
        procs::kill_netns_processes(ns);
        match netns::del(ns) {
            Ok(()) => removed += 1,
            Err(e) => errs.push(format!("{e:#}")),
        }
    }
    // 4. The lab directory.
    if errs.is_empty() {
        if let Err(e) = std::fs::remove_dir_all(&ctx.paths.root) {
            errs.push(format!("cannot remove {}: {e}", ctx.paths.root.display()));
        }
    }
    crate::say!(
        "lab {}: {} pods, {} nodes, {removed} namespaces removed",
        ctx.name(),
        st.pods.len(),
        st.nodes.len()
    );
    if errs.is_empty() {
        Ok(0)
    } else {
        for e in &errs {
            eprintln!("error: {e}");
        }
        Ok(1)
    }
}
