//! `oxvsctl stats`: datapath counters, laid out like
//! `ovs-appctl dpif-netdev/pmd-stats-show`.

use clap::Args;
use oxvs_api::{Request, StatsResult};

use super::emit;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct Stats {}

impl Stats {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::Stats)?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: StatsResult = serde_json::from_value(v)?;
        emit(&format(&r))
    }
}

/// The text form.
pub fn format(r: &StatsResult) -> String {
    let passes = r.packets + r.recirculations;
    let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    let mut s = format!("datapath threads: {}\n", r.threads);
    s.push_str(&format!("  packets received: {}\n", r.packets));
    s.push_str(&format!("  bytes received: {}\n", r.bytes));
    s.push_str(&format!("  packet recirculations: {}\n", r.recirculations));
    s.push_str(&format!(
        "  avg. datapath passes per packet: {:.2}\n",
        per(passes, r.packets)
    ));
    s.push_str(&format!("  emc hits: {}\n", r.emc_hits));
    s.push_str(&format!("  megaflow hits: {}\n", r.megaflow_hits));
    s.push_str(&format!(
        "  miss with success upcall: {}\n",
        r.upcalls.saturating_sub(r.xlate_errors)
    ));
    s.push_str(&format!("  miss with failed upcall: {}\n", r.xlate_errors));
    s.push_str(&format!("  megaflows installed: {}\n", r.megaflow_inserts));
    s.push_str(&format!("  cache flushes: {}\n", r.cache_flushes));
    s.push_str(&format!("  drops: {}\n", r.drops));
    s.push_str(&format!("  outputs: {}\n", r.outputs));
    s.push_str(&format!("  packet-ins: {}\n", r.packet_ins));
    s.push_str(&format!(
        "  icmp answers: {} time exceeded ({} over the rate, {} not answerable), {} port unreachable ({} over the rate), {} too big\n",
        r.time_exceeded,
        r.time_exceeded_limited,
        r.time_exceeded_unanswered,
        r.rejects,
        r.rejects_limited,
        r.icmp_too_big
    ));
    match r.ns_per_packet {
        Some(ns) => s.push_str(&format!("  avg. processing time per packet: {ns:.1} ns\n")),
        None => s.push_str("  avg. processing time per packet: -\n"),
    }
    s.push_str(&format!("flows: {}\n", r.n_flows));
    s.push_str(&format!(
        "  learned: {} handed on, {} added, {} replaced, {} refreshed, {} dropped (queue full), {} refused\n",
        r.learns,
        r.learned_added,
        r.learned_replaced,
        r.learned_refreshed,
        r.learn_dropped,
        r.learn_failed
    ));
    s.push_str(&format!("  expired: {}\n", r.flows_expired));
    s.push_str(&format!("conntrack entries: {}\n", r.conntrack_entries));
    s.push_str(&format!(
        "  refused commits: {} over a port's limit, {} table full ({} packets dropped)\n",
        r.ct_limit_refused, r.ct_table_full, r.ct_refused_drops
    ));
    s.push_str(&format!("  early drops: {}\n", r.ct_early_drops));
    s.push_str(&format!(
        "  commits discarded (packet dropped later): {}\n",
        r.ct_commits_discarded
    ));
    s.push_str(&format!(
        "shared umem: {} frames ({} MiB), {} free\n",
        r.umem_frames,
        r.umem_frames * 4096 / (1 << 20),
        r.umem_free_frames
    ));
    s.push_str(&format!(
        "ip fragments: {} datagrams reassembled, {} fragments held then, {} dropped; {} datagrams ({} bytes) incomplete now\n",
        r.reassembled, r.frags_held, r.frag_drops, r.ipf_held_datagrams, r.ipf_held_bytes
    ));
    s
}
