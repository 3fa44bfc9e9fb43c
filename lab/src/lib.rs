//! # oxvs-lab: a Kubernetes-like cluster made of network namespaces
//!
//! `oxvs-lab` builds, on one machine, a cluster of N nodes, each a network
//! namespace running its own `oxvs-switchd` and `oxvs-agent`, joined by an
//! underlay bridge, and then plays the container runtime for it: for every
//! Pod it makes a network namespace, calls `oxvs-cni` exactly as containerd
//! does, writes the pod's IP back into the Pod object and runs a small
//! server for each declared container port, so reachability can be probed
//! with real traffic.
//!
//! ## The cluster
//!
//! ```text
//!   <lab>-ul   (underlay netns)  br0 192.168.77.1/24
//!                |  nN (veth)        (one per node, enslaved to br0)
//!   <lab>-node-N (node netns)    eth0 192.168.77.(10+N)/24, MTU 1500,
//!                                default route via 192.168.77.1
//!                                oxvs-switchd --gateway oxvs-gw0
//!                                oxvs-agent (pod CIDR 10.244.N.0/24)
//!   <lab>-<ns>-<pod> (pod netns) eth0 made by the agent on CNI ADD
//! ```
//!
//! `up --ip-family dual` adds IPv6 (node N: `fd00:192:168:77::(10+N)`,
//! pod CIDR `fd00:10:244:N::/64`); `up --ip-family ipv6` makes the nodes
//! and pods IPv6-only: those IPv6 addresses and CIDRs alone, the tunnel
//! over IPv6 ([`state::IpFamily`]).
//!
//! There is no API server: every agent watches one manifest directory
//! (`/run/oxvs-lab/<lab>/manifests/`), where the lab writes one YAML file
//! per object (Node, Namespace, Pod, NetworkPolicy), atomically (a dot-file
//! renamed into place). The lab is the only writer.
//!
//! ## State and concurrency
//!
//! Everything the lab made is recorded in `/run/oxvs-lab/<lab>/state.json`
//! ([`state`]) *before* it is made (write-ahead), so `down` can remove a
//! half-built lab. Every command that changes the lab holds an exclusive
//! `flock` on `/run/oxvs-lab/<lab>/lock` for its whole run; read-only
//! commands (`status`, `probe`, `exec`) take it shared. The daemons outlive
//! the `oxvs-lab` invocation that started them (their own process group,
//! output to log files); their pids are in the state and are only ever
//! signalled after checking `/proc/PID/cmdline` still names the binary the
//! lab started.
//!
//! ## Modules
//!
//! - [`state`]: the on-disk record of a lab and its paths.
//! - [`manifest`]: reading user objects, writing the manifest directory.
//! - [`netns`]: `ip netns`/`ip link` helpers.
//! - [`procs`]: detached daemons, liveness, TERM-then-KILL.
//! - [`cni`]: calling `oxvs-cni` like containerd.
//! - [`probe`]: one connection attempt from inside a namespace (setns on a
//!   dedicated thread) and the bounded parallel matrix.
//! - [`table`]: the truth-table printer.
//! - [`serve`]: the per-pod TCP/UDP/SCTP server.
//! - [`service`]: Services checked, and their Endpoints computed (the lab
//!   as endpoints controller, with `up --kube-proxy`).
//! - [`commands`]: one module per CLI command.
#![deny(clippy::unwrap_used, clippy::expect_used)]

/// `println!` that ignores a closed stdout (`oxvs-lab probe | head`): a
/// command must finish what it changes even when nobody reads its output.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `print!` that ignores a closed stdout.
#[macro_export]
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), $($arg)*);
    }};
}

pub mod cni;
pub mod commands;
pub mod manifest;
pub mod netns;
pub mod probe;
pub mod procs;
pub mod serve;
pub mod service;
pub mod state;
pub mod table;
