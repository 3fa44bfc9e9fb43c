//! `oxvs-lab agent restart NODE [--kill]`: stops a node's agent and starts
//! it again with exactly the command line it had, as a kubelet restarting
//! the agent's container would (switchd and the pods are left alone).
//!
//! The command line is read from `/proc/PID/cmdline` of the running agent
//! (so flags `up` chose, such as `--log-level`, are kept); when the agent is
//! already dead it is rebuilt as `up` builds it, with `--log-level info`.
//! The agent is stopped with SIGTERM (`--grace` seconds, then SIGKILL), or
//! with SIGKILL at once (`--kill`, a crash). The new process appends to the
//! same `agent.log`, its pid replaces the old one in the state, and the
//! command returns once it answers CNI STATUS, printing how long the node
//! had no agent. Holds the lab's exclusive lock throughout.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::node::wait_ready;
use super::up::agent_argv;
use super::{Ctx, Global};
use crate::netns;
use crate::procs;

/// What an agent's command line contains (for [`procs::alive`]).
const AGENT_NEEDLE: &str = "oxvs-agent";

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub command: AgentCmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum AgentCmd {
    /// Stop a node's agent and start it again with the same command line.
    Restart(AgentRestartArgs),
}

#[derive(Debug, clap::Args)]
pub struct AgentRestartArgs {
    /// The node (`node-N`).
    #[arg(value_name = "NODE")]
    pub node: String,
    /// SIGKILL instead of SIGTERM (an agent crash).
    #[arg(long)]
    pub kill: bool,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, value_name = "S", default_value_t = 5)]
    pub grace: u64,
    /// Seconds to wait for the new agent to be ready.
    #[arg(long, value_name = "S", default_value_t = 30)]
    pub timeout: u64,
}

pub fn run_agent(global: &Global, args: &AgentArgs) -> anyhow::Result<u8> {
    match &args.command {
        AgentCmd::Restart(a) => run_restart(global, a),
    }
}

fn run_restart(global: &Global, args: &AgentRestartArgs) -> anyhow::Result<u8> {
    let ctx = Ctx::new(global, None)?;
    if !ctx.paths.exists() {
        anyhow::bail!("lab {} does not exist", ctx.name());
    }
    let _lock = ctx.paths.lock(true)?;
    let mut st = ctx.paths.load()?;
    let bins = ctx.bins(&st)?;
    let k = st.node_index(&args.node)?;
    let node = st.nodes[k].clone();
    let old = node.agent_pid.filter(|p| procs::alive(*p, AGENT_NEEDLE));
    let argv = match old.and_then(procs::cmdline) {
        Some(v) => v,
        None => {
            let help = netns::output(&[&bins.agent.display().to_string(), "--help"])
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            agent_argv(
                &ctx,
                &st,
                &node,
                &bins.agent.display().to_string(),
                "info",
                &help,
            )
        }
    };
    let stopped_at = Instant::now();
    if let Some(pid) = old {
        if args.kill {
            let raw = i32::try_from(pid).context("pid out of range")?;
            let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
            let deadline = Instant::now() + Duration::from_secs(2);
            while procs::alive(pid, AGENT_NEEDLE) {
                if Instant::now() > deadline {
                    anyhow::bail!("the agent of {} (pid {pid}) survived SIGKILL", node.name);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        } else {
            procs::stop(pid, AGENT_NEEDLE, Duration::from_secs(args.grace))?;
        }
    }
    if let Some(pid) = old {
        procs::wait_exited(pid, "agent", Duration::from_secs(5))?;
    }
    let gone_ms = stopped_at.elapsed().as_millis();
    let dir = ctx.paths.node_dir(node.index);
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let mut child = procs::spawn_in(&node.netns, &argv_ref, &dir.join("agent.log"))?;
    st.nodes[k].agent_pid = Some(child.id());
    ctx.paths.save(&st)?;
    wait_ready(
        &ctx,
        &bins,
        &st.nodes[k],
        &mut child,
        Duration::from_secs(args.timeout.max(1)),
    )?;
    crate::say!(
        "{} agent restarted: pid {} -> {} ({}; stopped in {gone_ms} ms, no ready agent for {} ms)",
        node.name,
        old.map_or_else(|| "none".to_string(), |p| p.to_string()),
        child.id(),
        if args.kill { "SIGKILL" } else { "SIGTERM" },
        stopped_at.elapsed().as_millis()
    );
    Ok(0)
}
