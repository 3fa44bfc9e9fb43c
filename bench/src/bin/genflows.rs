//! Prints the Antrea-like flow table for about N flows (default 10000) in
//! `ovs-ofctl add-flows` syntax, with the cluster shape as `#` comments.
//!
//! Usage: `cargo run -p oxvs-bench --bin genflows -- [N]`
#![deny(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;
use oxvs_bench::{count_flows, Cluster, ClusterSpec};

/// Prints the Antrea-like flow table for about N flows.
#[derive(Parser)]
#[command(name = "genflows")]
struct Args {
    /// About how many flows.
    #[arg(default_value_t = 10_000)]
    n: usize,
}

fn main() {
    let target = Args::parse().n;
    let spec = ClusterSpec::for_flow_count(target);
    let text = Cluster::new(spec.clone()).flows();
    println!("# {spec:?}");
    println!("# {} flows", count_flows(&text));
    print!("{text}");
}
