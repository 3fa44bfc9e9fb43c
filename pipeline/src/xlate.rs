//! The slow path: translating a key through the tables. (Being written.)
use std::sync::Arc;

use crate::key::FlowKey;
use crate::odp::DpAction;
use crate::tables::{Rule, TableSet};

/// The result of translating one key.
#[derive(Debug, Default)]
pub struct Translation {
    /// What the datapath does with the packet (empty = drop).
    pub actions: Vec<DpAction>,
    /// Every key bit the translation consulted (the megaflow mask).
    pub wildcards: FlowKey,
    /// Flows that matched, in order (their counters are credited per packet).
    pub rules: Vec<Arc<Rule>>,
}

/// What translation needs to know about the switch beyond the tables.
#[derive(Clone, Debug, Default)]
pub struct XlateEnv {
    /// Every port's OpenFlow number (for `output:ALL` / `FLOOD`).
    pub ports: Vec<u32>,
}

/// Translates `key` (starting at table 0, or where its recirc_id says).
pub fn translate(_tables: &TableSet, _key: &FlowKey, _env: &XlateEnv) -> Translation {
    Translation::default()
}
