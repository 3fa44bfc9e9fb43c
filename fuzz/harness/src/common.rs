//! What several harnesses share: the example pipeline and a running switch.

use std::sync::{Arc, OnceLock};

use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::{Flow, FlowMod};
use oxvs_switch::engine::{Switch, SwitchConfig};

/// `examples/antrea-like.flows`: one node's complete pipeline.
pub const ANTREA_LIKE: &str = include_str!("../../../examples/antrea-like.flows");

/// The flows of [`ANTREA_LIKE`].
pub fn antrea_flows() -> Vec<Flow> {
    parse_flow_file(ANTREA_LIKE, &ParseContext::default()).expect("the example flows parse")
}

/// A pipeline holding [`ANTREA_LIKE`] (shared, never changed: datapath
/// harnesses only read it).
pub fn antrea_pipeline() -> Arc<Pipeline> {
    static P: OnceLock<Arc<Pipeline>> = OnceLock::new();
    P.get_or_init(|| {
        let mods: Vec<FlowMod> = antrea_flows().into_iter().map(FlowMod::add).collect();
        let p = Arc::new(Pipeline::new());
        p.apply(&mods, 0).expect("the example flows install");
        p
    })
    .clone()
}

/// A started switch (one datapath thread, no ports) on its own pipeline.
pub fn start_switch() -> Switch {
    Switch::start(SwitchConfig::default(), Arc::new(Pipeline::new())).expect("start a switch")
}
