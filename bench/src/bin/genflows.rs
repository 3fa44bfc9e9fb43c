//! Prints the Antrea-like flow table for about N flows (default 10000) in
//! `ovs-ofctl add-flows` syntax, with the cluster shape as `#` comments.
//!
//! Usage: `cargo run -p oxvs-bench --bin genflows -- [N]`

use oxvs_bench::{count_flows, Cluster, ClusterSpec};

fn main() {
    let target = match std::env::args().nth(1) {
        None => 10_000,
        Some(a) => match a.parse::<usize>() {
            Ok(n) => n,
            Err(e) => {
                eprintln!("genflows: bad flow count '{a}': {e}");
                std::process::exit(2);
            }
        },
    };
    let spec = ClusterSpec::for_flow_count(target);
    let text = Cluster::new(spec.clone()).flows();
    println!("# {spec:?}");
    println!("# {} flows", count_flows(&text));
    print!("{text}");
}
