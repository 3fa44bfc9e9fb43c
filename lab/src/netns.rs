//! Network namespace and link helpers, through `ip(8)`.
//!
//! The lab makes few links (a bridge and one veth per node, all inside its
//! own namespaces), so the `ip` tool is simpler than netlink here and its
//! error text is what an operator would see typing the same command. Every
//! failure names the command and carries `ip`'s stderr. Nothing here touches
//! the root namespace's links: deleting the lab's namespaces removes every
//! link the lab made.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::Context as _;

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";

/// Runs a command, failing with its stderr when it fails.
pub fn run(argv: &[&str]) -> anyhow::Result<String> {
    let out = output(argv)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        anyhow::bail!(
            "`{}` failed ({}): {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }
}

/// Runs a command and returns its output whatever the status.
pub fn output(argv: &[&str]) -> anyhow::Result<Output> {
    let (prog, args) = argv.split_first().context("empty command")?;
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run `{}`", argv.join(" ")))
}

/// Whether namespace `name` exists.
pub fn exists(name: &str) -> bool {
    Path::new(NETNS_DIR).join(name).exists()
}

/// Creates namespace `name` with `lo` up.
pub fn add(name: &str) -> anyhow::Result<()> {
    run(&["ip", "netns", "add", name])?;
    run(&["ip", "-n", name, "link", "set", "lo", "up"])?;
    Ok(())
}

/// Pids of the processes in namespace `name`.
pub fn pids(name: &str) -> Vec<u32> {
    output(&["ip", "netns", "pids", name])
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Deletes namespace `name` (absent is fine). Processes still inside are
/// the caller's business ([`crate::procs::kill_netns_processes`]).
pub fn del(name: &str) -> anyhow::Result<()> {
    if !exists(name) {
        return Ok(());
    }
    run(&["ip", "netns", "del", name]).map(|_| ())
}

/// Runs `argv` inside namespace `ns`.
pub fn run_in(ns: &str, argv: &[&str]) -> anyhow::Result<String> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(argv);
    run(&full)
}

/// Names of every named namespace.
pub fn list() -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
