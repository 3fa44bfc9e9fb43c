//! Printing flows in `ovs-ofctl` syntax. (Being written.)
use crate::flow::{Action, Flow, Match};
use crate::names::TableNames;

/// Counters and ages shown by `dump-flows`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowStats {
    pub duration_ns: u64,
    pub n_packets: u64,
    pub n_bytes: u64,
    /// Seconds since last hit (None = never hit).
    pub idle_age_s: Option<u64>,
}

/// How `dump-flows` lines are printed.
#[derive(Clone, Debug, Default)]
pub struct DumpOptions {
    /// Print cookie, duration, n_packets, n_bytes (`--no-stats` clears it).
    pub stats: bool,
    /// Print table names (`table=SpoofGuard`) where known.
    pub names: Option<TableNames>,
}

/// The match in `ovs-ofctl` order (`ip,in_port=1,nw_dst=10.0.0.0/24`); empty for catch-all.
pub fn format_match(_m: &Match) -> String {
    String::new()
}

/// The action list (`drop` when empty).
pub fn format_actions(_a: &[Action], _names: Option<&TableNames>) -> String {
    "drop".into()
}

/// One `dump-flows` line.
pub fn format_dump_line(_flow: &Flow, _stats: &FlowStats, _opts: &DumpOptions) -> String {
    String::new()
}
