//! Memory per installed flow: parses and installs the Antrea-like flow
//! table of about 1k, 10k and 100k flows into a fresh [`Pipeline`] and
//! prints the heap bytes the pipeline holds afterwards, per flow.
//!
//! The numbers come from a counting global allocator (`stats_alloc`): the
//! bytes allocated minus the bytes freed between "before parsing" and
//! "after installing, with the parsed flows and flow mods dropped", i.e.
//! exactly the live heap of the installed table version (rules, classifier
//! subtables, indexes), not the process RSS. The flow text itself is
//! generated before the measurement starts and is not counted.
//!
//! Usage: `cargo run --release -p oxvs-bench --bin memflow [-- N ...]`
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;

use clap::Parser;
use oxvs_bench::{count_flows, Cluster, ClusterSpec};
use oxvs_pipeline::flow::FlowMod;
use oxvs_pipeline::parse::{parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Live bytes (allocated minus freed) since the region started.
fn live(r: &Region<'_, System>) -> i64 {
    let c = r.change();
    c.bytes_allocated as i64 - c.bytes_deallocated as i64
}

/// Heap bytes per installed flow, for tables of about N flows each.
#[derive(Parser)]
#[command(name = "memflow")]
struct Args {
    /// Table sizes (flows).
    #[arg(default_values_t = [1_000, 10_000, 100_000])]
    n: Vec<usize>,
}

fn main() {
    let targets = Args::parse().n;
    println!(
        "{:>8} {:>16} {:>16} {:>16} {:>14}",
        "flows", "parsed B/flow", "installed B/flow", "installed MiB", "allocs/flow"
    );
    for target in targets {
        let text = Cluster::new(ClusterSpec::for_flow_count(target)).flows();
        let n = count_flows(&text);
        let ctx = ParseContext::default();
        let region = Region::new(GLOBAL);
        let flows = match parse_flow_file(&text, &ctx) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("memflow: generated flows do not parse: {e}");
                std::process::exit(1);
            }
        };
        if flows.len() != n {
            eprintln!(
                "memflow: parser returned {} flows for {n} lines (stub parser?)",
                flows.len()
            );
            std::process::exit(1);
        }
        let parsed = live(&region);
        let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
        let pipeline = Pipeline::new();
        if let Err(e) = pipeline.apply(&mods, 0) {
            eprintln!("memflow: installing {n} flows failed: {e}");
            std::process::exit(1);
        }
        drop(mods);
        let installed = live(&region);
        let allocs = region.change().allocations;
        println!(
            "{:>8} {:>16.0} {:>16.0} {:>16.1} {:>14.1}",
            n,
            parsed as f64 / n as f64,
            installed as f64 / n as f64,
            installed as f64 / (1024.0 * 1024.0),
            allocs as f64 / n as f64,
        );
        // Keep the pipeline alive until measured, then free it before the next size.
        drop(pipeline);
    }
}
