//! Flow tables, versions and flow mods. (Being written.)
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::flow::{Flow, FlowMod};
use crate::key::FlowKey;
use crate::names::TableNames;

/// Counters of one flow, shared by every table version that holds it.
#[derive(Debug, Default)]
pub struct RuleStats {
    pub n_packets: AtomicU64,
    pub n_bytes: AtomicU64,
    /// Time of the last hit (ns, the caller's clock); 0 = never.
    pub last_used_ns: AtomicU64,
}

/// A flow installed in a table.
#[derive(Debug)]
pub struct Rule {
    pub flow: Flow,
    /// When it was added (ns, the caller's clock).
    pub created_ns: u64,
    pub stats: RuleStats,
}

impl Rule {
    /// Adds `packets`/`bytes` to the counters (relaxed atomics; never blocks).
    pub fn credit(&self, packets: u64, bytes: u64, now_ns: u64) {
        self.stats.n_packets.fetch_add(packets, Ordering::Relaxed);
        self.stats.n_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.stats.last_used_ns.fetch_max(now_ns, Ordering::Relaxed);
    }
}

/// One immutable version of all tables.
#[derive(Debug, Default)]
pub struct TableSet {
    generation: u64,
}

impl TableSet {
    /// Bumped by every change; caches compare it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The highest-priority flow of `table` matching `key` (conjunctions
    /// resolved), OR-ing every key bit it consulted into `wc`.
    pub fn lookup(&self, _table: u8, _key: &FlowKey, _wc: &mut FlowKey) -> Option<&Arc<Rule>> {
        None
    }
}

/// Why a flow mod (or a bundle) was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlowModError {
    #[error("not written yet")]
    Todo,
}

/// The flow tables of one switch: the current version plus the writer side.
#[derive(Debug, Default)]
pub struct Pipeline {
    current: arc_swap::ArcSwap<TableSet>,
    names: TableNames,
}

impl Pipeline {
    /// An empty pipeline with the oxvs table names.
    pub fn new() -> Self {
        Pipeline::default()
    }

    /// The current version (lock-free).
    pub fn snapshot(&self) -> Arc<TableSet> {
        self.current.load_full()
    }

    /// Table names for dumps and parsing.
    pub fn names(&self) -> &TableNames {
        &self.names
    }

    /// Applies a bundle of flow mods atomically: all or none, one new version.
    pub fn apply(&self, _mods: &[FlowMod], _now_ns: u64) -> Result<(), FlowModError> {
        Err(FlowModError::Todo)
    }
}
