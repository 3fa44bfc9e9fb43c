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
//! - `cached`: key extraction from the frame plus one cache hit, one packet
//!   per iteration, cycling over 1024 packets: `emc_hit` (exact-match
//!   cache, all keys cached) and `megaflow_hit` (EMC disabled; keys with
//!   other source ports than the ones that installed the megaflows), both on
//!   the first pass (from a port); `megaflow_hit_recirc` = lookup alone of
//!   the recirculated (post-conntrack) keys, whose megaflows cover policy
//!   and forwarding and so have many more masks. Breakdown: `extract_only`
//!   (frame -> key), `hash64_only` (`FlowKey::hash64`, which every EMC and
//!   megaflow probe computes) and `emc_lookup_only` (precomputed key -> EMC
//!   hit).
//! - `datapath`: `Datapath::process_batch` on batches of 32 packets in
//!   steady state (connections tracked, megaflows installed): extraction,
//!   both cached passes, conntrack, header rewrites, output to a counting
//!   sink. Copying the batch's frames (setup) is not timed.
//!
//! Each group prints (stderr) what its packets do before timing, so a
//! reader can check the numbers come from the real pipeline.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use oxvs_bench::{count_flows, recirculated_key, Cluster, ClusterSpec, Packet};
use oxvs_pipeline::cache::{CacheTier, FlowCaches, MegaflowCache};
use oxvs_pipeline::conntrack::{Conntrack, CtConfig};
use oxvs_pipeline::datapath::{CountingSink, Datapath, DatapathConfig, DpPacket};
use oxvs_pipeline::extract::extract;
use oxvs_pipeline::field::{ct_state, Field};
use oxvs_pipeline::flow::{Flow, FlowMod, FlowModCommand};
use oxvs_pipeline::key::FlowKey;
use oxvs_pipeline::names;
use oxvs_pipeline::odp::{recirc_id_for_table, DpAction};
use oxvs_pipeline::parse::{parse_flow, parse_flow_file, ParseContext};
use oxvs_pipeline::tables::{Pipeline, TableSet};
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
    pipeline: Arc<Pipeline>,
}

fn add_mods(flows: Vec<Flow>) -> Vec<FlowMod> {
    flows.into_iter().map(FlowMod::add).collect()
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
        pipeline: Arc::new(pipeline),
    }
}

fn xlate_env(c: &Cluster) -> XlateEnv {
    let mut ports = vec![oxvs_bench::TUNNEL_PORT, oxvs_bench::GATEWAY_PORT];
    ports.extend(c.local_pods().iter().map(|p| p.ofport));
    XlateEnv::with_ports(ports)
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
        )
        .expect("the benchmark's flow parses");
        let add = FlowMod::add(flow.clone());
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

/// Packets per cached-path run: few enough that all fit in the EMC.
const N_CACHED: usize = 1024;

/// Looks `key` up and, on a miss, translates and installs it, the way the
/// datapath does (the megaflow matches `recirc_id` exactly).
fn warm(caches: &mut FlowCaches, ts: &TableSet, env: &XlateEnv, key: &FlowKey) {
    if caches.lookup(key).is_none() {
        let t = translate(ts, key, env);
        let mut mask = t.wildcards;
        mask.mask_field(Field::RecircId);
        caches.install(
            key,
            mask,
            t.actions.into_boxed_slice(),
            t.rules.into_boxed_slice(),
        );
    }
}

/// Which tier answers each key (checked before timing, printed).
fn tiers(caches: &mut FlowCaches, keys: &[FlowKey]) -> (usize, usize, usize) {
    let (mut emc, mut mf, mut miss) = (0, 0, 0);
    for k in keys {
        match caches.lookup(k).map(|(_, t)| t) {
            Some(CacheTier::ExactMatch) => emc += 1,
            Some(CacheTier::Megaflow) => mf += 1,
            _ => miss += 1,
        }
    }
    (emc, mf, miss)
}

fn bench_cached(c: &mut Criterion) {
    let mut g = c.benchmark_group("cached");
    g.throughput(Throughput::Elements(1));
    for target in sizes() {
        let w = workload(target);
        let env = xlate_env(&w.cluster);
        let ts = w.pipeline.snapshot();
        // Set A installs the cache entries; set B has the same pod pairs
        // and destination ports but other source ports: other exact keys,
        // same megaflows.
        let pkts_a = w.cluster.packets_from(N_CACHED, 42, 0);
        let pkts_b = w.cluster.packets_from(N_CACHED, 42, 1);
        let keys_a = keys(&pkts_a);
        let keys_b = keys(&pkts_b);

        // Exact-match hits: extract + EMC lookup of keys already cached.
        let mut emc = FlowCaches::new(
            oxvs_pipeline::cache::ExactMatchCache::DEFAULT_ENTRIES,
            MegaflowCache::DEFAULT_MAX_ENTRIES,
        );
        for k in &keys_a {
            warm(&mut emc, &ts, &env, k);
        }
        let t = tiers(&mut emc, &keys_a);
        eprintln!(
            "{} flows: emc_hit keys -> (emc, megaflow, miss) = {t:?}",
            w.n_flows
        );
        if target == sizes()[0] {
            // The breakdown: extraction alone (does not depend on the table).
            g.bench_function("extract_only", |b| {
                let mut i = 0usize;
                b.iter(|| {
                    i = (i + 1) % pkts_a.len();
                    let p = &pkts_a[i];
                    extract(black_box(&p.frame), p.in_port)
                })
            });
            // ... and hashing a whole key, which every cache probe does.
            g.bench_function("hash64_only", |b| {
                let mut i = 0usize;
                b.iter(|| {
                    i = (i + 1) % keys_a.len();
                    black_box(&keys_a[i]).hash64()
                })
            });
        }
        g.bench_function(BenchmarkId::new("emc_lookup_only", w.n_flows), |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % keys_a.len();
                emc.lookup(black_box(&keys_a[i])).map(|(e, _)| e)
            })
        });
        g.bench_function(BenchmarkId::new("emc_hit", w.n_flows), |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % pkts_a.len();
                let p = &pkts_a[i];
                let k = extract(black_box(&p.frame), p.in_port);
                emc.lookup(&k).map(|(e, _)| e)
            })
        });

        // Megaflow hits, EMC disabled: extract + megaflow lookup of keys
        // that did not install the megaflows.
        let mut mf = FlowCaches::new(0, MegaflowCache::DEFAULT_MAX_ENTRIES);
        for k in &keys_a {
            warm(&mut mf, &ts, &env, k);
        }
        let t = tiers(&mut mf, &keys_b);
        eprintln!(
            "{} flows: megaflow_hit keys -> (emc, megaflow, miss) = {t:?}, megaflows: {}",
            w.n_flows,
            mf.stats().megaflow_inserts
        );
        g.bench_function(BenchmarkId::new("megaflow_hit", w.n_flows), |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % pkts_b.len();
                let p = &pkts_b[i];
                let k = extract(black_box(&p.frame), p.in_port);
                mf.lookup(&k).map(|(e, _)| e)
            })
        });

        // The recirculated pass (after conntrack): the policy and
        // forwarding megaflows, which have many more distinct masks.
        // Lookup only (the key comes from pass 1, not from a frame).
        let second = |keys: &[FlowKey]| -> Vec<FlowKey> {
            keys.iter()
                .filter_map(|k| second_pass_key(k, &translate(&ts, k, &env)))
                .collect()
        };
        let keys_a2 = second(&keys_a);
        let keys_b2 = second(&keys_b);
        let mut mf2 = FlowCaches::new(0, MegaflowCache::DEFAULT_MAX_ENTRIES);
        for k in &keys_a2 {
            warm(&mut mf2, &ts, &env, k);
        }
        let t = tiers(&mut mf2, &keys_b2);
        eprintln!(
            "{} flows: megaflow_hit_recirc keys -> (emc, megaflow, miss) = {t:?}, megaflows: {}",
            w.n_flows,
            mf2.stats().megaflow_inserts
        );
        g.bench_function(BenchmarkId::new("megaflow_hit_recirc", w.n_flows), |b| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % keys_b2.len();
                mf2.lookup(black_box(&keys_b2[i])).map(|(e, _)| e)
            })
        });
    }
    g.finish();
}

/// Packets per `process_batch` call.
const BATCH: usize = 32;

fn bench_datapath(c: &mut Criterion) {
    let mut g = c.benchmark_group("datapath");
    g.throughput(Throughput::Elements(BATCH as u64));
    for target in sizes() {
        let w = workload(target);
        let env = xlate_env(&w.cluster);
        let pkts: Vec<DpPacket<Vec<u8>>> = w
            .cluster
            .packets(N_CACHED, 42)
            .iter()
            .map(|p| DpPacket::from_frame(&p.frame, p.in_port))
            .collect();
        let mut dp = Datapath::new(Arc::clone(&w.pipeline), env, DatapathConfig::default());
        let mut ct = Conntrack::new(CtConfig::default());
        let mut sink = CountingSink::default();
        let now = 1_000_000_000u64;
        // Warm up: every connection tracked and committed (its ct_mark
        // set, which changes the recirculated keys once), every megaflow
        // installed.
        for _ in 0..3 {
            for chunk in pkts.chunks(BATCH) {
                let mut batch = chunk.to_vec();
                dp.process_batch(&mut batch, &mut ct, now, &mut sink);
            }
        }
        let before = dp.stats();
        for chunk in pkts.chunks(BATCH) {
            let mut batch = chunk.to_vec();
            dp.process_batch(&mut batch, &mut ct, now, &mut sink);
        }
        let s = dp.stats();
        eprintln!(
            "{} flows: steady state per {} packets: emc {} megaflow {} upcalls {} recirc {} outputs {} drops {}",
            w.n_flows,
            s.packets - before.packets,
            s.emc_hits - before.emc_hits,
            s.megaflow_hits - before.megaflow_hits,
            s.upcalls - before.upcalls,
            s.recirculations - before.recirculations,
            s.outputs - before.outputs,
            s.drops - before.drops,
        );
        g.bench_function(BenchmarkId::new("process_batch32", w.n_flows), |b| {
            let mut i = 0usize;
            b.iter_batched_ref(
                || {
                    i = (i + BATCH) % pkts.len();
                    pkts[i..(i + BATCH).min(pkts.len())].to_vec()
                },
                |batch| dp.process_batch(batch, &mut ct, now, &mut sink),
                BatchSize::SmallInput,
            )
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
    targets = bench_cached, bench_slow_path, bench_datapath, bench_install
}
criterion_main!(benches);
