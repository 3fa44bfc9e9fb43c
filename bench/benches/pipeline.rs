//! Pipeline benchmarks on an Antrea-like node table of ~1k, 10k and 100k
//! flows (see `oxvs_bench` for the generator and `docs/benchmarks.md` for
//! how to run them and the results).
//!
//! Groups (criterion ids are `group/case/flows`):
//!
//! - `install`: `parse` = flow text -> `Vec<Flow>`; `parse_apply` = parse,
//!   then install everything as one bundle into a fresh `Pipeline`
//!   (throughput in flows/s; dropping the pipeline is not timed).
//!   `incremental` = one add + one strict delete of a policy flow on a
//!   pipeline that already holds the whole table (2 flow mods per iteration).
//! - `slow_path`: full translation of one packet through the tables, both
//!   passes: pass 1 from table 0 up to `ct(table=ConntrackState)`, then pass 2
//!   from the recirculation with `ct_state=+trk+new` through policy,
//!   forwarding, commit and output. One iteration = one packet, cycling over
//!   4096 packets with distinct 5-tuples.
//! - `cached`: key extraction from the frame plus a cache hit, one packet
//!   per iteration: `emc_hit` (exact-match cache) and `megaflow_hit` (EMC
//!   bypassed; keys that differ from the ones that installed the megaflows).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use oxvs_bench::{count_flows, recirculated_key, Cluster, ClusterSpec, Packet};
use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::{ct_state, Field};
use oxvs_pipeline::flow::{Flow, FlowMod, FlowModCommand};
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::names;
use oxvs_pipeline::odp::{recirc_id_for_table, DpAction};
use oxvs_pipeline::parse::{parse_flow, parse_flow_file, ParseContext};
use oxvs_pipeline::tables::Pipeline;
use oxvs_pipeline::xlate::{translate, Translation, XlateEnv};

/// Flow-table sizes (targets; the generated tables are within a few %).
/// `OXVS_BENCH_SIZES=1000,10000` runs only those (criterion's name filter
/// would still build every workload).
fn sizes() -> Vec<usize> {
    let all = vec![1_000, 10_000, 100_000];
    match std::env::var("OXVS_BENCH_SIZES") {
        Ok(v) => {
            let s: Vec<usize> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
            if s.is_empty() {
                all
            } else {
                s
            }
        }
        Err(_) => all,
    }
}
/// Packets (distinct 5-tuples) cycled through by the per-packet benches.
const N_PACKETS: usize = 4096;

/// One generated node table, parsed and installed.
struct Workload {
    n_flows: usize,
    text: String,
    cluster: Cluster,
    pipeline: Pipeline,
}

fn add_mods(flows: Vec<Flow>) -> Vec<FlowMod> {
    flows
        .into_iter()
        .map(|flow| FlowMod {
            command: FlowModCommand::Add,
            flow,
            table: None,
            cookie_mask: 0,
            out_port: None,
        })
        .collect()
}

/// Parses `text` and installs it as one bundle into a fresh pipeline.
fn parse_apply(text: &str, ctx: &ParseContext) -> Result<Pipeline, String> {
    let flows = parse_flow_file(text, ctx).map_err(|e| e.to_string())?;
    let pipeline = Pipeline::new();
    pipeline
        .apply(&add_mods(flows), 0)
        .map_err(|e| e.to_string())?;
    Ok(pipeline)
}

fn workload(target: usize) -> Workload {
    let cluster = Cluster::new(ClusterSpec::for_flow_count(target));
    let text = cluster.flows();
    let n_flows = count_flows(&text);
    let ctx = ParseContext::default();
    let parsed = parse_flow_file(&text, &ctx).map(|f| f.len()).unwrap_or(0);
    if parsed != n_flows {
        eprintln!("WARNING: parser returned {parsed} of {n_flows} flows: numbers are meaningless");
    }
    let pipeline = parse_apply(&text, &ctx).unwrap_or_else(|e| {
        eprintln!("WARNING: installing the generated flows failed ({e}): numbers are meaningless");
        Pipeline::new()
    });
    Workload {
        n_flows,
        text,
        cluster,
        pipeline,
    }
}

fn xlate_env(c: &Cluster) -> XlateEnv {
    let mut ports = vec![oxvs_bench::TUNNEL_PORT, oxvs_bench::GATEWAY_PORT];
    ports.extend(c.local_pods().iter().map(|p| p.ofport));
    XlateEnv { ports }
}

fn keys(packets: &[Packet]) -> Vec<FlowKey> {
    packets
        .iter()
        .map(|p| extract(&p.frame, p.in_port))
        .collect()
}

fn second_pass_key(key: &FlowKey, pass1: &Translation) -> Option<FlowKey> {
    recirculated_key(key, pass1, ct_state::TRK | ct_state::NEW)
}

/// Prints, once per size, what the packets do in the slow path, so that the
/// numbers can be checked to come from a real pipeline.
fn describe(w: &Workload, keys: &[FlowKey], env: &XlateEnv) {
    let ts = w.pipeline.snapshot();
    let (mut recirc, mut out, mut drop) = (0, 0, 0);
    let expect = recirc_id_for_table(names::CONNTRACK_STATE.id);
    for k in keys {
        let t1 = translate(&ts, k, env);
        if let Some(k2) = second_pass_key(k, &t1) {
            if k2.get(Field::RecircId) == u128::from(expect) {
                recirc += 1;
            }
            let t2 = translate(&ts, &k2, env);
            if t2.actions.iter().any(|a| matches!(a, DpAction::Output(_))) {
                out += 1;
            } else {
                drop += 1;
            }
        }
    }
    eprintln!(
        "{} flows: of {} packets, {recirc} recirculate to ConntrackState; pass 2: {out} output, {drop} dropped",
        w.n_flows,
        keys.len()
    );
}

fn bench_install(c: &mut Criterion) {
    let mut g = c.benchmark_group("install");
    g.sample_size(10);
    let ctx = ParseContext::default();
    for target in sizes() {
        let text = Cluster::new(ClusterSpec::for_flow_count(target)).flows();
        let n = count_flows(&text);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("parse", n), &text, |b, text| {
            b.iter_with_large_drop(|| parse_flow_file(black_box(text), &ctx))
        });
        g.bench_with_input(BenchmarkId::new("parse_apply", n), &text, |b, text| {
            b.iter_with_large_drop(|| parse_apply(black_box(text), &ctx))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("install");
    for target in sizes() {
        let w = workload(target);
        // A flow that is not in the table: a policy peer outside the cluster.
        let flow = parse_flow(
            &format!(
                "table={},priority=100,ip,nw_src=198.18.0.1 actions=drop",
                names::INGRESS_RULE.id
            ),
            &ctx,
        );
        let Ok(flow) = flow else {
            eprintln!("install/incremental: parser not ready, skipped");
            continue;
        };
        let add = FlowMod {
            command: FlowModCommand::Add,
            flow: flow.clone(),
            table: None,
            cookie_mask: 0,
            out_port: None,
        };
        let del = FlowMod {
            command: FlowModCommand::Delete { strict: true },
            flow,
            table: Some(names::INGRESS_RULE.id),
            cookie_mask: 0,
            out_port: None,
        };
        g.throughput(Throughput::Elements(2));
        g.bench_function(BenchmarkId::new("incremental", w.n_flows), |b| {
            let mut now = 1u64;
            b.iter(|| {
                now += 1;
                let _ = w.pipeline.apply(std::slice::from_ref(&add), now);
                let _ = w.pipeline.apply(std::slice::from_ref(&del), now);
            })
        });
        drop(w.text);
    }
    g.finish();
}

fn bench_slow_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("slow_path");
    g.throughput(Throughput::Elements(1));
    for target in sizes() {
        let w = workload(target);
        let env = xlate_env(&w.cluster);
        let packets = w.cluster.packets(N_PACKETS, 42);
        let keys = keys(&packets);
        describe(&w, &keys, &env);
        let ts = w.pipeline.snapshot();
        g.bench_function(BenchmarkId::new("translate_2pass", w.n_flows), |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % keys.len();
                let k = &keys[i];
                let t1 = translate(&ts, black_box(k), &env);
                let t2 = second_pass_key(k, &t1).map(|k2| translate(&ts, &k2, &env));
                (t1, t2)
            })
        });
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args()
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_install, bench_slow_path
}
criterion_main!(benches);
