//! Fuzz target: the `ovs-ofctl` flow parser on arbitrary UTF-8, and the
//! printer on whatever it accepts. Either may reject input; neither may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oxvs_pipeline::parse::{parse_flow, ParseContext};
use oxvs_pipeline::print::{format_actions, format_match};

fuzz_target!(|text: &str| {
    let ctx = ParseContext::default();
    if let Ok(flow) = parse_flow(text, &ctx) {
        let m = format_match(&flow.matches);
        let a = format_actions(&flow.actions, None);
        std::hint::black_box((m, a));
    }
});
