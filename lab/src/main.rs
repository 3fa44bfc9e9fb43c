//! `oxvs-lab`: a local Kubernetes-like cluster of network namespaces (see
//! the crate doc). `main` only parses and dispatches; each command lives in
//! `oxvs_lab::commands`.
//!
//! Exit codes: 0 success, 1 failure (or a probe that differs from
//! `--expect`, or an unhealthy `status`), 2 bad flags; `exec` passes on
//! the command's status.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use oxvs_lab::commands::{
    agent, apply, delete, down, exec, kube, node, probe, serve, status, switch, up, Global,
};

/// A local oxvs cluster made of network namespaces.
#[derive(Debug, Parser)]
#[command(name = "oxvs-lab", version, about)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Create the lab: underlay, nodes, switchd and agent on every node.
    Up(up::UpArgs),
    /// Create or update Namespaces, NetworkPolicies and Pods.
    Apply(apply::ApplyArgs),
    /// Delete the objects in the given files.
    Delete(delete::DeleteArgs),
    /// Probe every pod pair and print the reachability matrix.
    Probe(probe::ProbeArgs),
    /// Run a command in a pod's network namespace.
    Exec(exec::ExecArgs),
    /// Show nodes, pods and whether their processes run.
    Status(status::StatusArgs),
    /// Remove everything the lab made.
    Down(down::DownArgs),
    /// Add or remove a node of a running lab.
    Node(node::NodeArgs),
    /// Restart a node's agent (same command line).
    Agent(agent::AgentArgs),
    /// Restart a node's oxvs-switchd (same command line); prints the reattach time.
    Switch(switch::SwitchArgs),
    /// Run kubectl against the lab's API server (`up --kube-proxy`).
    Kubectl(kube::KubectlArgs),
    /// The pod server (internal).
    #[command(hide = true)]
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let g = &cli.global;
    let r = match &cli.command {
        Cmd::Up(a) => up::run_up(g, a),
        Cmd::Apply(a) => apply::run_apply(g, a),
        Cmd::Delete(a) => delete::run_delete(g, a),
        Cmd::Probe(a) => probe::run_probe(g, a),
        Cmd::Exec(a) => exec::run_exec(g, a),
        Cmd::Status(a) => status::run_status(g, a),
        Cmd::Down(a) => down::run_down(g, a),
        Cmd::Node(a) => node::run_node(g, a),
        Cmd::Agent(a) => agent::run_agent(g, a),
        Cmd::Switch(a) => switch::run_switch(g, a),
        Cmd::Kubectl(a) => kube::run_kubectl(g, a),
        Cmd::Serve(a) => serve::run_serve(a),
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("oxvs-lab: {e:#}");
            ExitCode::from(1)
        }
    }
}
