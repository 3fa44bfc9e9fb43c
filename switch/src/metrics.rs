//! `/metrics`: oxvs-switchd's counters in the Prometheus text format.
//!
//! ## What is exported
//!
//! Everything is read at scrape time from the [`Switch`] (nothing is
//! counted twice, nothing is added to the datapath): [`Snapshot::take`]
//! copies the counters, [`encode`] writes them (pure, unit-tested).
//!
//! | family | type | labels | from |
//! |---|---|---|---|
//! | `oxvs_port_{rx,tx}_{packets,bytes,drops,errors}_total` | counter | `port` | [`Switch::ports`] |
//! | `oxvs_port_info` | gauge (1) | `port`, `ofport`, `kind`, `mode` | [`Switch::ports`] |
//! | `oxvs_port_queue_rx_packets_total` | counter | `port`, `queue`, `thread` | [`Switch::ports`] (ports with several queues) |
//! | `oxvs_port_queue_rx_drops_total` | counter | `port`, `queue` | [`Switch::ports`] (ports with several queues) |
//! | `oxvs_datapath_*_total` | counter | | [`Switch::stats`] (summed over threads) |
//! | `oxvs_datapath_cache_hits_total` | counter | `tier` = `emc`, `megaflow` | [`Switch::stats`] |
//! | `oxvs_datapath_upcalls_total` | counter | | slow-path passes |
//! | `oxvs_datapath_busy_seconds_total` | counter | | time spent processing packets |
//! | `oxvs_conntrack_entries`, `oxvs_conntrack_*_total` | gauge, counters | | [`Conntrack::stats`](oxvs_pipeline::conntrack::Conntrack::stats) |
//! | `oxvs_conntrack_max_entries`, `oxvs_conntrack_default_port_limit` | gauges | | the table's size and the default per-port limit (0: none) |
//! | `oxvs_conntrack_port_entries`, `oxvs_conntrack_port_limit`, `oxvs_conntrack_port_limit_refusals_total` | gauges, counter | `port` | [`Conntrack::port_limits`](oxvs_pipeline::conntrack::Conntrack::port_limits): connections each port owns, its limit, its refused commits |
//! | `oxvs_ipf_held_{datagrams,fragments,bytes}`, `oxvs_ipf_*_total` | gauges, counters | | [`Ipf::stats`](oxvs_pipeline::ipf::Ipf::stats): the fragment reassembler in front of conntrack |
//! | `oxvs_ipf_fragment_drops_total` | counter | `reason` ([`IpfDrop::name`]) | fragments dropped, by reason |
//! | `oxvs_pipeline_flows` | gauge | `table` | flows per table |
//! | `oxvs_pipeline_flow_packets`, `oxvs_pipeline_flow_bytes` | gauge | `table` | sum of the table's flows' counters |
//!
//! `table` is the table's name (`IngressMetric`) or, for a table without
//! one, its number. The per-table packet sums are **gauges**, not
//! counters: the pipeline keeps no per-table lookup or match counters, only
//! per-flow ones, and a deleted flow takes its counts with it, so the sum
//! can go down. The datapath keeps its caches per thread and publishes no
//! megaflow *count*; `oxvs_datapath_megaflow_inserts_total` and
//! `oxvs_datapath_cache_flushes_total` are what it has.
//!
//! ## The server
//!
//! [`MetricsServer`] is a minimal HTTP/1.1 server on a std `TcpListener`
//! (switchd is not async): one request per connection, answered and
//! closed, `GET`/`HEAD /metrics` only. An accept thread admits at most
//! [`Limits::max_connections`] connections at once (default
//! [`DEFAULT_LIMITS`]; `--metrics-max-connections`), each served on a
//! short-lived thread of its own with read and write timeouts of
//! [`Limits::idle_timeout`] (`--metrics-idle-timeout`), so a slow or idle
//! client holds one place for at most that and delays no other scrape.
//! One more connection is answered `503 Service Unavailable` with
//! `Retry-After: 1` ("busy, retry") and closed. Scrapes never touch the
//! datapath: one takes the conntrack lock once (O(1)) and the port registry
//! lock briefly, and reads the flow tables from a lock-free snapshot.
//! `oxvs_listener_*{socket="control"|"metrics"}` count what the listeners
//! did ([`oxvs_api::metrics::encode_listeners`]).
//!
//! [`MetricsServer::stop`] (or drop) sets a flag, wakes the accept call by
//! connecting to the listener, and joins the accept thread (a connection
//! thread ends by itself within the idle timeout).

use std::collections::BTreeMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use oxvs_api::listen::{Gate, Limits, ListenStats};
use oxvs_api::metrics::{self as prom, Exposition};
use oxvs_api::PortInfo;
use oxvs_pipeline::conntrack::{CtPortLimit, CtStats};
use oxvs_pipeline::datapath::DatapathStats;
use oxvs_pipeline::flow::N_TABLES;
use oxvs_pipeline::ipf::{IpfDrop, IpfStats};

use crate::engine::{Switch, SwitchStats};

/// Default listen address of `--metrics-addr`.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9530";

/// The default cap and idle timeout of the metrics endpoint: a handful of
/// scrapers at once, 5 s to send a request head.
pub const DEFAULT_LIMITS: Limits = Limits {
    max_connections: 8,
    idle_timeout: Duration::from_secs(5),
};

/// How long the accept thread spends on a connection turned away busy.
const BUSY_IO_TIMEOUT: Duration = Duration::from_millis(100);

/// Counters of one flow table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Name, or the number when the table has no name.
    pub table: String,
    pub flows: u64,
    /// Sum of the `n_packets` / `n_bytes` of its current flows.
    pub packets: u64,
    pub bytes: u64,
}

/// Everything one scrape exports, copied out of the switch.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub stats: SwitchStats,
    pub ports: Vec<PortInfo>,
    pub conntrack: CtStats,
    /// The table's size.
    pub ct_max_entries: usize,
    /// The default per-port connection limit (0: none).
    pub ct_default_port_limit: u32,
    /// Per-port connection counts, limits and refusals.
    pub ct_ports: Vec<CtPortLimit>,
    /// The fragment reassembler in front of conntrack.
    pub ipf: IpfStats,
    /// Tables that have a name or at least one flow, by number.
    pub tables: Vec<TableStats>,
    /// Flow table version ([`oxvs_pipeline::tables::TableSet::generation`]).
    pub generation: u64,
}

impl Snapshot {
    /// Copies the switch's counters.
    pub fn take(switch: &Switch) -> Snapshot {
        let stats = switch.stats();
        let ports = switch.ports();
        let (conntrack, ipf, ct_max_entries, ct_default_port_limit, ct_ports) = switch
            .with_conntrack(|ct| {
                (
                    ct.stats(),
                    ct.ipf().stats(),
                    ct.config().max_entries,
                    ct.default_port_limit(),
                    ct.port_limits(),
                )
            });
        let pipeline = switch.pipeline();
        let names = pipeline.names();
        let set = pipeline.snapshot();
        let mut per: BTreeMap<u8, TableStats> = BTreeMap::new();
        for rule in set.flows() {
            let t = per.entry(rule.flow.table).or_default();
            t.flows += 1;
            t.packets += rule.stats.n_packets.load(Ordering::Relaxed);
            t.bytes += rule.stats.n_bytes.load(Ordering::Relaxed);
        }
        for id in 0..N_TABLES {
            let Ok(id) = u8::try_from(id) else { break };
            if names.name(id).is_some() {
                per.entry(id).or_default();
            }
        }
        let tables = per
            .into_iter()
            .map(|(id, mut t)| {
                t.table = names.name(id).map_or_else(|| id.to_string(), str::to_owned);
                t
            })
            .collect();
        Snapshot {
            stats,
            ports,
            conntrack,
            ct_max_entries,
            ct_default_port_limit,
            ct_ports,
            ipf,
            tables,
            generation: set.generation(),
        }
    }
}

/// The exposition of the switch's counters now.
pub fn render(switch: &Switch) -> String {
    encode(&Snapshot::take(switch))
}

/// Writes a snapshot as a Prometheus text exposition.
pub fn encode(s: &Snapshot) -> String {
    let mut e = Exposition::new();
    e.gauge(
        "oxvs_build_info",
        "Version of oxvs-switchd (the value is always 1).",
    )
    .sample(&[("version", env!("CARGO_PKG_VERSION"))], 1.0);
    encode_ports(&mut e, &s.ports);
    encode_datapath(&mut e, &s.stats);
    encode_conntrack(&mut e, s);
    encode_ipf(&mut e, &s.ipf);
    encode_tables(&mut e, &s.tables, s.generation);
    e.finish()
}

fn encode_ports(e: &mut Exposition, ports: &[PortInfo]) {
    e.gauge("oxvs_ports", "Switch ports.")
        .int(&[], ports.len() as u64);
    {
        let mut f = e.gauge(
            "oxvs_port_info",
            "A switch port (the value is always 1): its OpenFlow number, kind and mode.",
        );
        for p in ports {
            let ofport = p.ofport.to_string();
            f.sample(
                &[
                    ("port", &p.name),
                    ("ofport", &ofport),
                    ("kind", &p.kind),
                    ("mode", &p.mode),
                ],
                1.0,
            );
        }
    }
    type Get = fn(&PortInfo) -> u64;
    let families: [(&str, &str, Get); 10] = [
        (
            "oxvs_port_rx_packets_total",
            "Packets received on a switch port.",
            |p| p.stats.rx_packets,
        ),
        (
            "oxvs_port_rx_bytes_total",
            "Bytes received on a switch port.",
            |p| p.stats.rx_bytes,
        ),
        (
            "oxvs_port_rx_drops_total",
            "Received packets a switch port dropped (no buffer, ring full).",
            |p| p.stats.rx_dropped,
        ),
        (
            "oxvs_port_rx_errors_total",
            "Receive errors of a switch port.",
            |p| p.stats.rx_errors,
        ),
        (
            "oxvs_port_tx_packets_total",
            "Packets sent on a switch port.",
            |p| p.stats.tx_packets,
        ),
        (
            "oxvs_port_tx_bytes_total",
            "Bytes sent on a switch port.",
            |p| p.stats.tx_bytes,
        ),
        (
            "oxvs_port_tx_drops_total",
            "Packets a switch port could not send (TX ring full, no frame).",
            |p| p.stats.tx_dropped,
        ),
        (
            "oxvs_port_tx_errors_total",
            "Transmit errors of a switch port.",
            |p| p.stats.tx_errors,
        ),
        (
            "oxvs_port_tx_moved_total",
            "Packets a switch port sent without a copy: received on a port sharing its UMEM, \
             they went out in the frames they arrived in.",
            |p| p.stats.tx_moved,
        ),
        (
            "oxvs_port_tx_checksum_requests_total",
            "Packets a switch port sent asking the kernel to finish their TCP/UDP checksum \
             (AF_XDP TX metadata).",
            |p| p.stats.tx_checksum_requests,
        ),
    ];
    for (name, help, get) in families {
        let mut f = e.counter(name, help);
        for p in ports {
            f.int(&[("port", &p.name)], get(p));
        }
    }
    let reasons: [(&str, &str, Get); 5] = [
        ("rx", "ring_full", |p| p.stats.rx_ring_full),
        ("rx", "fill_ring_empty", |p| p.stats.rx_fill_empty),
        ("rx", "other", |p| p.stats.rx_other),
        ("tx", "no_frame", |p| p.stats.tx_no_frame),
        ("tx", "ring_full", |p| p.stats.tx_ring_full),
    ];
    let mut f = e.counter(
        "oxvs_port_drops_total",
        "Packets a switch port dropped, by direction and reason (rx ring_full: the switch did \
         not drain the RX ring in time; rx fill_ring_empty: no free frame to receive into (or fewer than a multi-buffer packet needs); \
         tx no_frame: no free UMEM frame; tx ring_full: the TX ring was full).",
    );
    for p in ports {
        for (dir, reason, get) in reasons {
            f.int(
                &[("port", &p.name), ("direction", dir), ("reason", reason)],
                get(p),
            );
        }
    }
    // The fill rings: what each AF_XDP port can receive before the switch
    // gives it more, and what it is topped up to.
    let gauges: [(&str, &str, Get); 2] = [
        (
            "oxvs_port_fill_ring_frames",
            "Frames on an AF_XDP port's fill ring (all its queues), sampled every ~50 ms.",
            |p| p.stats.rx_fill_frames,
        ),
        (
            "oxvs_port_fill_ring_target_frames",
            "Frames the switch tops an AF_XDP port's fill ring up to now (all its queues): \
             grows while the port is busy, up to its share of the UMEM (borrowing beyond a \
             small share), decays while it is idle.",
            |p| p.stats.rx_fill_target,
        ),
    ];
    for (name, help, get) in gauges {
        let mut f = e.gauge(name, help);
        for p in ports.iter().filter(|p| p.stats.rx_fill_target > 0) {
            f.int(&[("port", &p.name)], get(p));
        }
    }
    // Ports serving several receive queues: how the NIC spread the load.
    let mut f = e.counter(
        "oxvs_port_queue_rx_packets_total",
        "Packets received on one receive queue of a switch port serving several (its thread \
         in `thread`).",
    );
    for p in ports {
        for q in &p.queues {
            let (queue, thread) = (q.queue.to_string(), q.thread.to_string());
            f.int(
                &[("port", &p.name), ("queue", &queue), ("thread", &thread)],
                q.stats.rx_packets,
            );
        }
    }
    let mut f = e.counter(
        "oxvs_port_queue_rx_drops_total",
        "Received packets one receive queue of a switch port dropped.",
    );
    for p in ports {
        for q in &p.queues {
            let queue = q.queue.to_string();
            f.int(&[("port", &p.name), ("queue", &queue)], q.stats.rx_dropped);
        }
    }
}

fn encode_datapath(e: &mut Exposition, s: &SwitchStats) {
    // Destructured without `..`: a counter added to the engine or the
    // datapath does not compile until it is exported here.
    let SwitchStats {
        datapath,
        threads,
        busy_ns,
        packet_in_dropped,
        icmp_too_big,
        rejects,
        rejects_limited,
        time_exceeded,
        time_exceeded_limited,
        time_exceeded_unanswered,
        output_no_port,
        cross_thread,
        bad_frames,
        tunnel_bad_checksums,
        tunnel_tso_frames,
        tunnel_gro_merged,
        umem_frames,
        umem_free_frames,
        learn,
    } = s;
    let DatapathStats {
        packets,
        bytes,
        emc_hits,
        megaflow_hits,
        upcalls,
        megaflow_inserts,
        xlate_errors,
        cache_flushes,
        recirculations,
        drops,
        recirc_limit_drops,
        write_errors,
        outputs,
        packet_ins,
        frags_held,
        frag_drops,
        reassembled,
        ct_refused_drops,
        learns,
        meter_drops,
    } = datapath;
    let crate::learn::LearnStats {
        learned,
        learn_replaced,
        learn_refreshed,
        learn_dropped,
        learn_failed,
        flows_expired,
    } = learn;
    e.gauge("oxvs_datapath_threads", "Datapath threads.")
        .int(&[], *threads as u64);
    e.gauge(
        "oxvs_umem_frames",
        "Frames (4 KiB, pinned) of the UMEMs the datapath threads' ports share.",
    )
    .int(&[], *umem_frames);
    e.gauge(
        "oxvs_umem_free_frames",
        "Frames of the shared UMEMs that are free (on no ring, in no batch).",
    )
    .int(&[], *umem_free_frames);
    e.counter(
        "oxvs_datapath_cache_hits_total",
        "Pipeline passes answered by a flow cache tier (emc: exact match; megaflow: wildcarded).",
    )
    .int(&[("tier", "emc")], *emc_hits)
    .int(&[("tier", "megaflow")], *megaflow_hits);
    e.counter(
        "oxvs_learned_flows_total",
        "Flows learned by learn actions, by what became of them (added: new; replaced: \
         changed an installed flow; refreshed: identical to an installed one, whose hard \
         timeout started again; dropped: the learn queue was full; failed: refused by the tables).",
    )
    .int(&[("result", "added")], *learned)
    .int(&[("result", "replaced")], *learn_replaced)
    .int(&[("result", "refreshed")], *learn_refreshed)
    .int(&[("result", "dropped")], *learn_dropped)
    .int(&[("result", "failed")], *learn_failed);
    e.counter(
        "oxvs_flows_expired_total",
        "Flows removed by their idle or hard timeout, or with the learn that learned them (delete_learned).",
    )
    .int(&[], *flows_expired);
    let counters: [(&str, &str, u64); 31] = [
        (
            "oxvs_datapath_meter_drops_total",
            "Packets a meter dropped (over its rate; per meter and band in meter-stats).",
            *meter_drops,
        ),
        (
            "oxvs_datapath_packets_total",
            "Packets received by the datapath.",
            *packets,
        ),
        (
            "oxvs_datapath_bytes_total",
            "Bytes of the packets received by the datapath.",
            *bytes,
        ),
        (
            "oxvs_datapath_upcalls_total",
            "Pipeline passes that missed both cache tiers and went to the slow path.",
            *upcalls,
        ),
        (
            "oxvs_datapath_megaflow_inserts_total",
            "Megaflows installed by the slow path.",
            *megaflow_inserts,
        ),
        (
            "oxvs_datapath_cache_flushes_total",
            "Times the flow caches were emptied (flow table changes, flushes).",
            *cache_flushes,
        ),
        (
            "oxvs_datapath_xlate_errors_total",
            "Slow-path translations that failed (the packet is dropped).",
            *xlate_errors,
        ),
        (
            "oxvs_datapath_recirculations_total",
            "Recirculations (extra pipeline passes, e.g. after ct).",
            *recirculations,
        ),
        (
            "oxvs_datapath_drops_total",
            "Pipeline passes that ended in a drop (no flow, or an explicit drop).",
            *drops,
        ),
        (
            "oxvs_datapath_recirc_limit_drops_total",
            "Packets dropped for recirculating too deep.",
            *recirc_limit_drops,
        ),
        (
            "oxvs_datapath_write_errors_total",
            "Header writes skipped because the frame was too short.",
            *write_errors,
        ),
        (
            "oxvs_datapath_outputs_total",
            "Frames the pipeline sent to an output port.",
            *outputs,
        ),
        (
            "oxvs_datapath_packet_ins_total",
            "Packets sent to the controller queue.",
            *packet_ins,
        ),
        (
            "oxvs_datapath_packet_in_drops_total",
            "Packets to the controller dropped because the queue was full.",
            *packet_in_dropped,
        ),
        (
            "oxvs_datapath_tunnel_tso_frames_total",
            "Inner TCP frames the tunnel cut into pieces (userspace TSO).",
            *tunnel_tso_frames,
        ),
        (
            "oxvs_datapath_tunnel_gro_merged_total",
            "Received tunnel TCP segments merged into the frame before them (userspace GRO).",
            *tunnel_gro_merged,
        ),
        (
            "oxvs_datapath_icmp_too_big_total",
            "ICMP fragmentation-needed replies sent for packets too big for a tunnel.",
            *icmp_too_big,
        ),
        (
            "oxvs_datapath_rejects_total",
            "ICMP port-unreachable answers to packets a flow rejected (a Service without endpoints).",
            *rejects,
        ),
        (
            "oxvs_datapath_rejects_limited_total",
            "Rejected packets not answered: over the rate limit.",
            *rejects_limited,
        ),
        (
            "oxvs_datapath_time_exceeded_total",
            "ICMP time exceeded answers to packets whose TTL (hop limit) a dec_ttl found at 0 or 1.",
            *time_exceeded,
        ),
        (
            "oxvs_datapath_time_exceeded_limited_total",
            "Packets whose TTL a dec_ttl found at 0 or 1 not answered: over the rate limit.",
            *time_exceeded_limited,
        ),
        (
            "oxvs_datapath_time_exceeded_unanswered_total",
            "Packets whose TTL a dec_ttl found at 0 or 1 not answered: an ICMP error, a later fragment, a non-unicast address, a malformed header, or no address to answer from.",
            *time_exceeded_unanswered,
        ),
        (
            "oxvs_datapath_output_no_port_total",
            "Outputs to a port number no port has (dropped).",
            *output_no_port,
        ),
        (
            "oxvs_datapath_cross_thread_total",
            "Outputs handed to another datapath thread.",
            *cross_thread,
        ),
        (
            "oxvs_datapath_fragments_held_total",
            "IP fragments a ct action handed to the reassembler that did not complete their datagram.",
            *frags_held,
        ),
        (
            "oxvs_datapath_fragment_drops_total",
            "IP fragments the reassembler refused (see oxvs_ipf_fragment_drops_total for why).",
            *frag_drops,
        ),
        (
            "oxvs_datapath_reassembled_total",
            "Datagrams reassembled for ct and sent on as their original fragments.",
            *reassembled,
        ),
        (
            "oxvs_datapath_ct_refused_drops_total",
            "Packets dropped because conntrack refused to commit their new connection (see oxvs_conntrack_limit_refusals_total and oxvs_conntrack_table_full_drops_total).",
            *ct_refused_drops,
        ),
        (
            "oxvs_datapath_learns_total",
            "Learned flows the datapath handed to the flow keeper (at most one per megaflow per 100 ms).",
            *learns,
        ),
        (
            "oxvs_datapath_bad_frames_total",
            "Received frames with an unusable descriptor (dropped).",
            *bad_frames,
        ),
        (
            "oxvs_datapath_tunnel_bad_checksum_drops_total",
            "Frames from tunnels dropped because their TCP/UDP checksum failed (corrupted on the way; \
             a partial checksum, what a kernel peer over a veth leaves, is completed instead).",
            *tunnel_bad_checksums,
        ),
    ];
    for (name, help, v) in counters {
        e.counter(name, help).int(&[], v);
    }
    e.counter(
        "oxvs_datapath_busy_seconds_total",
        "Time the datapath threads spent processing packets.",
    )
    .sample(&[], *busy_ns as f64 / 1e9);
}

fn encode_conntrack(e: &mut Exposition, s: &Snapshot) {
    // Destructured without `..`: a counter added to the tracker does not
    // compile until it is exported here.
    let CtStats {
        entries,
        packets_total,
        committed_total,
        invalid_total,
        table_full_total,
        limit_refused_total,
        early_drop_total,
        commits_discarded_total,
        expired_total,
        deleted_total,
        nat_exhausted_total,
    } = s.conntrack;
    e.gauge(
        "oxvs_conntrack_entries",
        "Connections tracked now (expired ones not yet removed included).",
    )
    .int(&[], entries as u64);
    e.gauge(
        "oxvs_conntrack_max_entries",
        "Most connections the table holds (--ct-max).",
    )
    .int(&[], s.ct_max_entries as u64);
    e.gauge(
        "oxvs_conntrack_default_port_limit",
        "Most connections a port without its own limit may own (0: no limit).",
    )
    .int(&[], u64::from(s.ct_default_port_limit));
    let counters: [(&str, &str, u64); 10] = [
        (
            "oxvs_conntrack_nat_exhausted_total",
            "New connections refused because nat found no free address and port for them (the packet is dropped).",
            nat_exhausted_total,
        ),
        (
            "oxvs_conntrack_packets_total",
            "Packets given to the connection tracker.",
            packets_total,
        ),
        (
            "oxvs_conntrack_commits_total",
            "Connections created by a commit.",
            committed_total,
        ),
        (
            "oxvs_conntrack_invalid_packets_total",
            "Packets the tracker marked invalid (refused commits included).",
            invalid_total,
        ),
        (
            "oxvs_conntrack_table_full_drops_total",
            "Commits refused because the connection table was full and no unreplied connection near the new one could be dropped early (the packet is dropped).",
            table_full_total,
        ),
        (
            "oxvs_conntrack_limit_refusals_total",
            "Commits refused because their port owned its limit of connections (the packet is dropped).",
            limit_refused_total,
        ),
        (
            "oxvs_conntrack_early_drops_total",
            "Unreplied connections dropped to make room in a (nearly) full table.",
            early_drop_total,
        ),
        (
            "oxvs_conntrack_commits_discarded_total",
            "New connections not committed because the pipeline dropped their packet after the commit.",
            commits_discarded_total,
        ),
        (
            "oxvs_conntrack_expired_total",
            "Connections removed because they expired.",
            expired_total,
        ),
        (
            "oxvs_conntrack_deleted_total",
            "Connections removed by a flush or TCP port reuse.",
            deleted_total,
        ),
    ];
    for (name, help, v) in counters {
        e.counter(name, help).int(&[], v);
    }
    let port_name = |ofport: u32| -> String {
        s.ports
            .iter()
            .find(|p| p.ofport == ofport)
            .map_or_else(|| ofport.to_string(), |p| p.name.clone())
    };
    let names: Vec<(String, &CtPortLimit)> =
        s.ct_ports.iter().map(|p| (port_name(p.port), p)).collect();
    let mut g = e.gauge(
        "oxvs_conntrack_port_entries",
        "Connections each port owns (committed by its packets).",
    );
    for (n, p) in &names {
        g.int(&[("port", n)], u64::from(p.count));
    }
    let mut g = e.gauge(
        "oxvs_conntrack_port_limit",
        "Most connections each port may own (0: no limit).",
    );
    for (n, p) in &names {
        g.int(&[("port", n)], u64::from(p.limit));
    }
    let mut c = e.counter(
        "oxvs_conntrack_port_limit_refusals_total",
        "Commits of each port refused by its limit.",
    );
    for (n, p) in &names {
        c.int(&[("port", n)], p.refused);
    }
}

fn encode_ipf(e: &mut Exposition, s: &IpfStats) {
    let gauges: [(&str, &str, u64); 3] = [
        (
            "oxvs_ipf_held_datagrams",
            "Incomplete IP datagrams the reassembler holds now.",
            s.held_datagrams,
        ),
        (
            "oxvs_ipf_held_fragments",
            "IP fragments the reassembler holds now.",
            s.held_fragments,
        ),
        (
            "oxvs_ipf_held_bytes",
            "Bytes of IP fragments the reassembler holds now.",
            s.held_bytes,
        ),
    ];
    for (name, help, v) in gauges {
        e.gauge(name, help).int(&[], v);
    }
    let counters: [(&str, &str, u64); 4] = [
        (
            "oxvs_ipf_fragments_total",
            "IP fragments offered to the reassembler.",
            s.fragments_total,
        ),
        (
            "oxvs_ipf_datagrams_completed_total",
            "IP datagrams reassembled.",
            s.datagrams_completed_total,
        ),
        (
            "oxvs_ipf_expired_datagrams_total",
            "Incomplete IP datagrams discarded because they timed out.",
            s.expired_datagrams_total,
        ),
        (
            "oxvs_ipf_discarded_datagrams_total",
            "Incomplete IP datagrams discarded for another reason (overlap, limits).",
            s.discarded_datagrams_total,
        ),
    ];
    for (name, help, v) in counters {
        e.counter(name, help).int(&[], v);
    }
    let mut f = e.counter(
        "oxvs_ipf_fragment_drops_total",
        "IP fragments dropped by the reassembler, by reason.",
    );
    for r in IpfDrop::ALL {
        f.int(&[("reason", r.name())], s.dropped(r));
    }
}

fn encode_tables(e: &mut Exposition, tables: &[TableStats], generation: u64) {
    e.gauge(
        "oxvs_pipeline_generation",
        "Version of the flow tables (grows with every flow table change).",
    )
    .int(&[], generation);
    type Get = fn(&TableStats) -> u64;
    let families: [(&str, &str, Get); 3] = [
        ("oxvs_pipeline_flows", "Flows in a table.", |t| t.flows),
        (
            "oxvs_pipeline_flow_packets",
            "Packets matched by a table's current flows (sum of their n_packets; drops when a flow is deleted).",
            |t| t.packets,
        ),
        (
            "oxvs_pipeline_flow_bytes",
            "Bytes matched by a table's current flows (sum of their n_bytes; drops when a flow is deleted).",
            |t| t.bytes,
        ),
    ];
    for (name, help, get) in families {
        let mut f = e.gauge(name, help);
        for t in tables {
            f.int(&[("table", &t.table)], get(t));
        }
    }
}

// ---------------------------------------------------------------------------
// The HTTP server.

/// Why the metrics server did not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
}

/// The `/metrics` endpoint (one thread); stopped on drop.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    join: Option<JoinHandle<()>>,
    /// The listening socket (a second handle): shut down to wake the
    /// accept thread.
    wake: Option<TcpListener>,
}

impl MetricsServer {
    /// Listens on `addr` (port 0: any free port, see
    /// [`MetricsServer::local_addr`]) and serves `switch`'s metrics, with
    /// the [`DEFAULT_LIMITS`] and no other listener's counters.
    pub fn start(addr: SocketAddr, switch: Arc<Switch>) -> Result<MetricsServer, MetricsError> {
        MetricsServer::start_with(addr, switch, DEFAULT_LIMITS, Vec::new())
    }

    /// [`MetricsServer::start`] with a connection cap and idle timeout,
    /// also exporting the counters of `listeners` (name, counters), e.g.
    /// the control socket's.
    pub fn start_with(
        addr: SocketAddr,
        switch: Arc<Switch>,
        limits: Limits,
        listeners: Vec<(&'static str, Arc<ListenStats>)>,
    ) -> Result<MetricsServer, MetricsError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| MetricsError::Bind { addr, source })?;
        let wake = listener.try_clone().ok();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let gate = Gate::new(limits);
        let mut listeners = listeners;
        listeners.push(("metrics", gate.stats()));
        let shared = Arc::new(Shared {
            switch,
            gate,
            listeners,
        });
        let join = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || accept_loop(listener, shared, &flag))
            .map_err(MetricsError::Thread)?;
        tracing::info!(addr = %bound, "serving metrics at http://{bound}/metrics");
        Ok(MetricsServer {
            addr: bound,
            stop,
            join: Some(join),
            wake,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and joins the thread (idempotent).
    pub fn stop(&mut self) {
        let Some(join) = self.join.take() else {
            return;
        };
        self.stop.store(true, Ordering::Release);
        if let Some(l) = self.wake.take() {
            oxvs_api::listen::wake_accept(std::os::fd::AsRawFd::as_raw_fd(&l));
            if join.join().is_err() {
                tracing::error!("the metrics thread panicked");
            }
            return;
        }
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
            });
        }
        match TcpStream::connect_timeout(&wake, Duration::from_secs(1)) {
            Ok(_) => {
                if join.join().is_err() {
                    tracing::error!("the metrics thread panicked");
                }
            }
            // Cannot wake it: leave it blocked in accept (it ends with the process).
            Err(e) => tracing::warn!("cannot wake the metrics thread at {wake}: {e}"),
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the connection threads share.
struct Shared {
    switch: Arc<Switch>,
    gate: Gate,
    listeners: Vec<(&'static str, Arc<ListenStats>)>,
}

impl Shared {
    fn render(&self) -> String {
        let mut out = render(&self.switch);
        let mut e = Exposition::new();
        let l: Vec<(&str, &ListenStats)> = self
            .listeners
            .iter()
            .map(|(n, s)| (*n, s.as_ref()))
            .collect();
        prom::encode_listeners(&mut e, &l);
        out.push_str(&e.finish());
        out
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: &AtomicBool) {
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::Acquire) {
            return;
        }
        match accepted {
            Ok((stream, peer)) => {
                let Some(permit) = shared.gate.try_enter() else {
                    tracing::debug!(%peer, "metrics endpoint busy: a connection turned away");
                    turn_away(stream);
                    continue;
                };
                let shared2 = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("metrics-conn".into())
                    .spawn(move || {
                        let _permit = permit;
                        let idle = shared2.gate.limits().idle_timeout;
                        match serve_one(stream, &shared2, idle) {
                            Ok(true) => shared2.gate.stats().idle_closed(),
                            Ok(false) => {}
                            Err(e) => tracing::debug!(%peer, "metrics connection ended badly: {e}"),
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!("cannot start a metrics connection thread: {e}");
                }
            }
            Err(e) => {
                tracing::warn!("accept on the metrics listener failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Answers 503 + `Retry-After` on a connection over the cap. The request
/// (usually sent right after connect) is read first, briefly: closing a
/// TCP socket with unread data resets it, and the client would lose the
/// answer.
fn turn_away(mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(BUSY_IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(BUSY_IO_TIMEOUT));
    let mut buf = [0u8; 2048];
    let _ = stream.read(&mut buf);
    let _ = stream.write_all(&prom::busy_response());
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.read(&mut buf);
}

/// Serves one request; `Ok(true)` when the client sat idle past `idle`.
fn serve_one(mut stream: TcpStream, shared: &Shared, idle: Duration) -> std::io::Result<bool> {
    stream.set_read_timeout(Some(idle))?;
    stream.set_write_timeout(Some(idle))?;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let head_len = loop {
        if let Some(n) = prom::request_head_end(&buf) {
            break n;
        }
        if buf.len() > prom::MAX_REQUEST_HEAD {
            let r = prom::http_response(413, "text/plain", b"request head too long\n", false);
            return stream.write_all(&r).map(|()| false);
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(false), // closed before a full request
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                let r = prom::http_response(408, "text/plain", b"request timeout\n", false);
                return stream.write_all(&r).map(|()| true);
            }
            Err(e) => return Err(e),
        }
    };
    let resp = prom::respond(&buf[..head_len], || shared.render());
    stream.write_all(&resp)?;
    stream.flush().map(|()| false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_api::PortStats;

    fn sample() -> Snapshot {
        let mut s = Snapshot::default();
        s.stats.threads = 1;
        s.stats.datapath.packets = 10;
        s.stats.datapath.emc_hits = 7;
        s.stats.datapath.megaflow_hits = 2;
        s.stats.datapath.upcalls = 1;
        s.stats.busy_ns = 1_500_000;
        s.stats.packet_in_dropped = 4;
        s.ports = vec![
            PortInfo {
                name: "p1".into(),
                ofport: 1,
                kind: "afxdp".into(),
                mode: "skb".into(),
                state: "up".into(),
                local: None,
                stats: PortStats {
                    rx_packets: 5,
                    rx_bytes: 500,
                    tx_dropped: 2,
                    ..PortStats::default()
                },
                queues: vec![
                    oxvs_api::QueueInfo {
                        queue: 0,
                        thread: 0,
                        stats: PortStats {
                            rx_packets: 2,
                            ..PortStats::default()
                        },
                        umem: None,
                    },
                    oxvs_api::QueueInfo {
                        queue: 1,
                        thread: 1,
                        stats: PortStats {
                            rx_packets: 3,
                            rx_dropped: 1,
                            ..PortStats::default()
                        },
                        umem: None,
                    },
                ],
                umem: None,
            },
            PortInfo {
                name: "weird\"name\\".into(),
                ofport: 2,
                kind: "vxlan".into(),
                mode: "udp".into(),
                state: "up".into(),
                local: None,
                stats: PortStats::default(),
                queues: Vec::new(),
                umem: None,
            },
        ];
        s.conntrack = CtStats {
            entries: 3,
            table_full_total: 9,
            limit_refused_total: 11,
            early_drop_total: 12,
            commits_discarded_total: 13,
            ..CtStats::default()
        };
        s.ct_max_entries = 1000;
        s.ct_default_port_limit = 250;
        s.ct_ports = vec![
            CtPortLimit {
                port: 1,
                limit: 250,
                explicit: false,
                count: 2,
                refused: 11,
            },
            CtPortLimit {
                port: 7,
                limit: 0,
                explicit: true,
                count: 1,
                refused: 0,
            },
        ];
        s.stats.datapath.ct_refused_drops = 11;
        s.tables = vec![
            TableStats {
                table: "Classifier".into(),
                flows: 2,
                packets: 10,
                bytes: 1000,
            },
            TableStats {
                table: "7".into(),
                flows: 1,
                packets: 0,
                bytes: 0,
            },
        ];
        s.generation = 5;
        s
    }

    #[test]
    fn exposition_is_valid_and_carries_the_values() {
        let text = encode(&sample());
        let p = prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let v = |n: &str, l: &[(&str, &str)]| p.value(n, l).unwrap_or(-1.0);
        assert_eq!(v("oxvs_port_rx_packets_total", &[("port", "p1")]), 5.0);
        assert_eq!(
            v(
                "oxvs_port_queue_rx_packets_total",
                &[("port", "p1"), ("queue", "1"), ("thread", "1")]
            ),
            3.0
        );
        assert_eq!(
            v(
                "oxvs_port_queue_rx_drops_total",
                &[("port", "p1"), ("queue", "1")]
            ),
            1.0
        );
        assert_eq!(v("oxvs_port_rx_bytes_total", &[("port", "p1")]), 500.0);
        assert_eq!(v("oxvs_port_tx_drops_total", &[("port", "p1")]), 2.0);
        assert_eq!(
            v("oxvs_port_rx_packets_total", &[("port", "weird\"name\\")]),
            0.0
        );
        assert_eq!(v("oxvs_datapath_cache_hits_total", &[("tier", "emc")]), 7.0);
        assert_eq!(
            v("oxvs_datapath_cache_hits_total", &[("tier", "megaflow")]),
            2.0
        );
        assert_eq!(v("oxvs_datapath_upcalls_total", &[]), 1.0);
        assert_eq!(v("oxvs_datapath_busy_seconds_total", &[]), 0.0015);
        assert_eq!(v("oxvs_datapath_packet_in_drops_total", &[]), 4.0);
        assert_eq!(v("oxvs_conntrack_entries", &[]), 3.0);
        assert_eq!(v("oxvs_conntrack_table_full_drops_total", &[]), 9.0);
        assert_eq!(v("oxvs_conntrack_limit_refusals_total", &[]), 11.0);
        assert_eq!(v("oxvs_conntrack_early_drops_total", &[]), 12.0);
        assert_eq!(v("oxvs_conntrack_commits_discarded_total", &[]), 13.0);
        assert_eq!(v("oxvs_conntrack_max_entries", &[]), 1000.0);
        assert_eq!(v("oxvs_conntrack_default_port_limit", &[]), 250.0);
        assert_eq!(v("oxvs_conntrack_port_entries", &[("port", "p1")]), 2.0);
        assert_eq!(v("oxvs_conntrack_port_limit", &[("port", "p1")]), 250.0);
        assert_eq!(
            v(
                "oxvs_conntrack_port_limit_refusals_total",
                &[("port", "p1")]
            ),
            11.0
        );
        // A port number no port has now is named by its number.
        assert_eq!(v("oxvs_conntrack_port_limit", &[("port", "7")]), 0.0);
        assert_eq!(v("oxvs_datapath_ct_refused_drops_total", &[]), 11.0);
        assert_eq!(v("oxvs_pipeline_flows", &[("table", "Classifier")]), 2.0);
        assert_eq!(
            v("oxvs_pipeline_flow_packets", &[("table", "Classifier")]),
            10.0
        );
        assert_eq!(v("oxvs_pipeline_flows", &[("table", "7")]), 1.0);
        assert_eq!(v("oxvs_pipeline_generation", &[]), 5.0);
        assert_eq!(
            v(
                "oxvs_port_info",
                &[
                    ("port", "p1"),
                    ("ofport", "1"),
                    ("kind", "afxdp"),
                    ("mode", "skb")
                ]
            ),
            1.0
        );
        for (name, kind) in &p.types {
            assert!(name.starts_with("oxvs_"), "{name}");
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} ({kind:?}) has no HELP"
            );
        }
    }

    #[test]
    fn every_counter_of_the_switch_is_exported() {
        // One family per counter field: a new field must be added here and
        // to encode_datapath, or this fails.
        let text = encode(&Snapshot::default());
        let p = prom::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let datapath = p
            .types
            .keys()
            .filter(|n| n.starts_with("oxvs_datapath_") && n.ends_with("_total"))
            .count();
        // 20 DatapathStats fields (emc+megaflow in one family) + 13 engine
        // counters + busy time.
        assert_eq!(datapath, 19 + 13 + 1, "{text}");
        for family in ["oxvs_learned_flows_total", "oxvs_flows_expired_total"] {
            assert!(p.types.contains_key(family), "{family}\n{text}");
        }
        // The reassembler: 3 gauges, 4 counters, the drops by reason.
        assert_eq!(
            p.types
                .keys()
                .filter(|n| n.starts_with("oxvs_ipf_"))
                .count(),
            8
        );
        assert_eq!(
            p.types
                .keys()
                .filter(|n| n.starts_with("oxvs_conntrack_"))
                .count(),
            // entries, size, default limit, 10 counters, 3 per-port families
            16
        );
    }

    #[test]
    fn server_answers_on_a_free_port() {
        let switch = match Switch::start(
            crate::engine::SwitchConfig::default(),
            Arc::new(oxvs_pipeline::tables::Pipeline::new()),
        ) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                oxvs_testutil::skip_or_fail(format!("cannot start a switch here: {e}"));
                return;
            }
        };
        let mut srv =
            match MetricsServer::start("127.0.0.1:0".parse().expect("addr"), switch.clone()) {
                Ok(s) => s,
                Err(e) => {
                    oxvs_testutil::skip_or_fail(format!("cannot start the metrics server: {e}"));
                    return;
                }
            };
        let get = |req: &str| {
            let mut c = TcpStream::connect(srv.local_addr()).expect("connect");
            c.write_all(req.as_bytes()).expect("write");
            let mut out = String::new();
            c.read_to_string(&mut out).expect("read");
            out
        };
        let r = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        let body = r.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        let p = prom::parse(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
        assert_eq!(p.value("oxvs_ports", &[]), Some(0.0));
        assert_eq!(
            p.value("oxvs_pipeline_flows", &[("table", "Classifier")]),
            Some(0.0)
        );
        assert!(get("GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        // An idle client does not stop later scrapes for longer than the timeout.
        let idle = TcpStream::connect(srv.local_addr()).expect("connect");
        assert!(get("GET /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.1 200"));
        drop(idle);
        srv.stop();
        assert!(TcpStream::connect(srv.local_addr()).is_err());
        switch.shutdown();
    }
}
