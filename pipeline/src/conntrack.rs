//! Userspace connection tracking. (Being written: this is the API contract.)
use crate::key::FlowKey;

/// Limits and timeouts of a connection tracker.
#[derive(Clone, Debug)]
pub struct CtConfig {
    /// Most connections tracked at once; beyond it new connections are `+inv`.
    pub max_entries: usize,
}

impl Default for CtConfig {
    fn default() -> Self {
        CtConfig { max_entries: 262_144 }
    }
}

/// What a `ct` datapath action asks of the tracker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtParams {
    pub zone: u16,
    pub commit: bool,
    pub force: bool,
    /// `(value, mask)` stored as ct_mark on commit.
    pub mark: Option<(u32, u32)>,
    /// `(value, mask)` stored as ct_label on commit.
    pub label: Option<(u128, u128)>,
}

/// The tracker's answer: what goes into the key's ct fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtVerdict {
    /// `ct_state` bits ([`crate::field::ct_state`]).
    pub state: u32,
    pub zone: u16,
    pub mark: u32,
    pub label: u128,
}

/// A connection tracker (one per switch; callers serialise access).
#[derive(Debug, Default)]
pub struct Conntrack {
    config: CtConfig,
}

impl Conntrack {
    pub fn new(config: CtConfig) -> Self {
        Conntrack { config }
    }

    /// Tracks one packet: `frame` is the whole Ethernet frame as it is now,
    /// `key` its flow key (extracted from that frame).
    pub fn execute(&mut self, _frame: &[u8], _key: &FlowKey, p: &CtParams, _now_ns: u64) -> CtVerdict {
        let _ = &self.config;
        CtVerdict { state: crate::field::ct_state::TRK | crate::field::ct_state::INV, zone: p.zone, mark: 0, label: 0 }
    }
}
