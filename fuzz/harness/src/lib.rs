//! # oxvs-fuzz-harness: the bodies of the fuzz targets
//!
//! Every fuzz target in `fuzz/fuzz_targets/` is one line that calls a
//! function here, so the same code runs two ways:
//!
//! - under libFuzzer (`cargo +nightly fuzz run TARGET`, nightly, outside the
//!   workspace: `fuzz/Cargo.toml`), to search for inputs that break it;
//! - under `cargo test` on stable, in CI: `tests/replay.rs` feeds every
//!   file of `fuzz/corpus/<target>/` to the target's function and fails on
//!   any panic, on a missing or empty corpus directory, and on a target
//!   listed in `fuzz/Cargo.toml` but not in [`TARGETS`] (or the reverse).
//!
//! A harness calls the real entry point of the code under test (the
//! parser, the state machine, the socket server) and checks invariants
//! that must hold for every input, beyond "no panic"; each module says
//! which. Harnesses that need a running switch, socket or fake agent start
//! one per process (loopback and temporary Unix sockets only) and reset
//! what they change before each input, so an input's result does not
//! depend on the inputs before it.
//!
//! | target | what | module |
//! |---|---|---|
//! | `extract` | flow key extraction | [`pipeline`] |
//! | `parse_flow` | the `ovs-ofctl` flow parser and printer | [`pipeline`] |
//! | `datapath` | one frame through a fresh datapath | [`pipeline`] |
//! | `ipf` | IP fragment reassembly | [`pipeline`] |
//! | `conntrack` | TCP/UDP/ICMP sequences with time steps through conntrack; the state file | [`conntrack`] |
//! | `vxlan_rx` | VXLAN receive, then the pipeline | [`vxlan`] |
//! | `vxlan_tx` | VXLAN send: fragmentation and ICMP "too big" replies | [`vxlan`] |
//! | `control` | switchd's control-socket protocol | [`control`] |
//! | `agent_api` | the agent's API socket (info, pod, traceflow) | [`agent_api`] |
//! | `cni` | the CNI plugin: environment, stdin, the agent's answer | [`cni`] |
//! | `metrics_http` | the `/metrics` HTTP server | [`metrics`] |
//! | `ipblock` | `ipBlock` prefixes and port ranges, time and memory bounded | [`ipblock`] |

pub mod agent_api;
pub mod cni;
pub mod common;
pub mod conntrack;
pub mod control;
pub mod frames;
pub mod input;
pub mod ipblock;
pub mod metrics;
pub mod pipeline;
pub mod vxlan;

/// A fuzz target's body.
pub type Harness = fn(&[u8]);

/// Every target: its name (the `[[bin]]` in `fuzz/Cargo.toml` and the
/// directory under `fuzz/corpus/`) and its body.
pub const TARGETS: &[(&str, Harness)] = &[
    ("extract", pipeline::extract_target),
    ("parse_flow", pipeline::parse_flow_target),
    ("datapath", pipeline::datapath_target),
    ("ipf", pipeline::ipf_target),
    ("conntrack", conntrack::run),
    ("vxlan_rx", vxlan::run_rx),
    ("vxlan_tx", vxlan::run_tx),
    ("control", control::run),
    ("agent_api", agent_api::run),
    ("cni", cni::run),
    ("metrics_http", metrics::run),
    ("ipblock", ipblock::run),
];

/// The body of target `name`.
pub fn harness(name: &str) -> Option<Harness> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, h)| *h)
}
