//! The per-thread datapath: batches of packets through the exact-match
//! cache, the megaflow cache and the slow path, then their actions.
//!
//! One [`Datapath`] belongs to one datapath (poll) thread. For each batch it
//! loads the current table version once ([`Pipeline::snapshot`]), empties its
//! caches if the version's generation changed, and for every packet:
//!
//! 1. extracts the flow key from the frame, the ingress port and the tunnel
//!    metadata the port layer decapsulated ([`crate::extract::extract`]);
//! 2. looks the key up: **exact-match cache** -> **megaflow cache** -> on a
//!    miss the **slow path** ([`crate::xlate::translate`]), whose result is
//!    installed as a megaflow (value = key & wildcards, plus `recirc_id`,
//!    which every megaflow matches exactly);
//! 3. executes the datapath actions on the frame, keeping the key in step:
//!    `Set` writes the header ([`crate::packet`]) and the key; `PushVlan` /
//!    `PopVlan`; `SetTunnel` and `LoadMeta` write only the key; `Ct` runs the
//!    connection tracker on the frame as it is now and writes the verdict
//!    into `ct_state`/`ct_zone`/`ct_mark`/`ct_label`; `CtClear` zeroes them;
//!    `Output` hands the bytes to the [`DatapathSink`] (with [`TunnelMeta`]
//!    if the key has a tunnel destination); `Userspace` is a packet-in;
//!    `Recirc(id)` sets `recirc_id = id` and goes back to step 2 with the
//!    updated key: in place if it is the last action, else on a copy of the
//!    frame (the original continues with the actions after it).
//!
//! ## Fragments
//!
//! A `Ct` action on an IP fragment (`nw_frag` set) does not track the
//! fragment: it offers it to the tracker's reassembler
//! ([`Conntrack::ipf_mut`], module [`crate::ipf`]), which keeps a copy.
//! Until its datagram is complete the fragment goes no further (counted in
//! [`DatapathStats::frags_held`]; refused ones in
//! [`DatapathStats::frag_drops`], with the reason in the reassembler's own
//! counters). The fragment that completes it makes the datagram go on, from
//! that `Ct` action, as one reassembled packet: tracked as a whole (ports,
//! TCP flags, ICMP type), through the remaining tables, so NetworkPolicy
//! decides on the datagram's real ports. Its outputs send the **original
//! fragments**, in offset order, each with the reassembled packet's
//! Ethernet header (with VLAN tags) and its IP header's rewritable fields
//! (IPv4: TOS, TTL, addresses, checksum recomputed; IPv6: traffic class,
//! flow label, hop limit, addresses) as the actions left them; the rest of
//! each fragment (identification, offsets, its payload) is untouched.
//! Packet-ins get the reassembled packet. This is Open vSwitch userspace's
//! `ipf` model, with the whole datagram rather than each fragment seen by
//! the tables after `ct`.
//!
//! ## Conntrack
//!
//! A `Ct` action runs [`Conntrack::execute_staged`]: a commit of a new
//! connection is only staged, and applied when the packet has left the
//! pipeline (an output or a packet-in), or discarded when the pipeline
//! dropped it, so a packet dropped after ConntrackCommit (Output without a
//! port, any later drop) leaves nothing in the table. A commit the tracker
//! refuses (the ingress port owns its limit of connections, or the table
//! is full and nothing can be dropped early) drops the packet at once
//! ([`DatapathStats::ct_refused_drops`]). After each batch the tracker's
//! background sweep examines one slot per packet ([`Conntrack::sweep`]).
//! The cost on the common path: a counter comparison per packet and the
//! sweep per batch; no allocation, lock or syscall.
//!
//! ## Invariants
//!
//! - The actions executed for a key are always the actions the slow path
//!   would compute for it under the batch's table version (see
//!   [`crate::cache`]); `pipeline/tests/datapath_cache.rs` checks it.
//! - Recirculation is bounded: a packet may go round at most
//!   [`DatapathConfig::max_recirc_depth`] times; deeper, it is dropped and
//!   counted.
//! - Bad packets never panic: a header write that does not fit the frame is
//!   skipped and counted in [`DatapathStats::write_errors`]; the key is
//!   still updated, so later lookups see what the slow path saw.
//!
//! ## Cost
//!
//! On the cached path, nothing allocates and nothing locks: the lookup
//! clones one `Arc` per pass (an uncontended atomic), outputs are slices of
//! the frame, recirculation copies reuse per-depth scratch buffers, and rule
//! counters are credited once per megaflow per batch, not per packet.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use crate::cache::{CacheTier, FlowCaches, MegaflowEntry};
use crate::conntrack::{Conntrack, CtParams, CtRewrite};
use crate::extract::{extract, extract_packet};
use crate::field::Field;
use crate::flow::{port, Flow, PacketInReason};
use crate::ipf::{Completed, IpfOutcome};
use crate::key::FlowKey;
use crate::learn::Learned;
use crate::odp::DpAction;
use crate::packet::{Layout, Packet, PacketBuf};
use crate::tables::{Pipeline, TableSet};
use crate::wire::ethertype;
use crate::xlate::{translate, Translation, XlateEnv};

/// The slow path's signature: [`translate`] unless a test or benchmark
/// substitutes its own (see [`Datapath::with_slow_path`]).
pub type SlowPathFn = fn(&TableSet, &FlowKey, &XlateEnv) -> Translation;

/// Tunnel metadata of a packet: what the port layer decapsulated on
/// ingress, or what an output to a tunnel port must encapsulate with.
///
/// The outer addresses are of one family, IPv4 (the key's `tun_src` and
/// `tun_dst`) or IPv6 (`tun_ipv6_src`, `tun_ipv6_dst`): [`from_key`]
/// never mixes them, and [`write_to`] writes the family's fields.
/// `Copy`, 48 bytes, no allocation.
///
/// [`from_key`]: TunnelMeta::from_key
/// [`write_to`]: TunnelMeta::write_to
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TunnelMeta {
    /// Tunnel id (VXLAN VNI).
    pub tun_id: u64,
    /// Outer source (unspecified: none set; the port uses its own address).
    pub src: IpAddr,
    /// Outer destination.
    pub dst: IpAddr,
}

impl Default for TunnelMeta {
    fn default() -> Self {
        TunnelMeta {
            tun_id: 0,
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        }
    }
}

impl TunnelMeta {
    /// IPv4 outer addresses (`src` and `dst` as the key holds them).
    pub fn v4(tun_id: u64, src: u32, dst: u32) -> TunnelMeta {
        TunnelMeta {
            tun_id,
            src: IpAddr::V4(Ipv4Addr::from(src)),
            dst: IpAddr::V4(Ipv4Addr::from(dst)),
        }
    }

    /// IPv6 outer addresses.
    pub fn v6(tun_id: u64, src: Ipv6Addr, dst: Ipv6Addr) -> TunnelMeta {
        TunnelMeta {
            tun_id,
            src: IpAddr::V6(src),
            dst: IpAddr::V6(dst),
        }
    }

    /// What an output of a packet with this key encapsulates with, if
    /// the key has a tunnel destination. As Open vSwitch's
    /// `flow_tnl_dst()`: a nonzero `tun_dst` (IPv4) wins, with `tun_src`
    /// as the source; else a nonzero `tun_ipv6_dst`, with `tun_ipv6_src`.
    #[inline]
    pub fn from_key(key: &FlowKey) -> Option<TunnelMeta> {
        let dst = key.get(Field::TunDst) as u32;
        let tun_id = key.get(Field::TunId) as u64;
        if dst != 0 {
            return Some(TunnelMeta::v4(tun_id, key.get(Field::TunSrc) as u32, dst));
        }
        let dst6 = key.get(Field::TunIpv6Dst);
        (dst6 != 0).then(|| {
            TunnelMeta::v6(
                tun_id,
                Ipv6Addr::from(key.get(Field::TunIpv6Src)),
                Ipv6Addr::from(dst6),
            )
        })
    }

    /// Writes the received tunnel's fields into a packet's key: `tun_id`
    /// and the destination's family's address fields (the other family's
    /// stay as they are, zero in a fresh key; a source of the other
    /// family is written as 0).
    #[inline]
    pub fn write_to(&self, key: &mut FlowKey) {
        key.set(Field::TunId, u128::from(self.tun_id));
        match self.dst {
            IpAddr::V6(d) => {
                key.set(Field::TunIpv6Src, ipv6_bits(self.src));
                key.set(Field::TunIpv6Dst, u128::from(d));
            }
            IpAddr::V4(d) => {
                let s = match self.src {
                    IpAddr::V4(s) => u32::from(s),
                    IpAddr::V6(_) => 0,
                };
                key.set(Field::TunSrc, u128::from(s));
                key.set(Field::TunDst, u128::from(u32::from(d)));
            }
        }
    }

    /// Whether the outer header is IPv6 (the destination's family).
    #[inline]
    pub fn is_ipv6(&self) -> bool {
        self.dst.is_ipv6()
    }
}

/// An address as the 128 bits of an IPv6 field (IPv4: 0, never mixed in).
#[inline]
fn ipv6_bits(a: IpAddr) -> u128 {
    match a {
        IpAddr::V6(a) => u128::from(a),
        IpAddr::V4(_) => 0,
    }
}

/// A packet handed to [`Datapath::process_batch`].
#[derive(Clone, Debug)]
pub struct DpPacket<B> {
    /// The frame (header writes and VLAN pushes happen in place).
    pub packet: Packet<B>,
    /// OpenFlow port it arrived on.
    pub in_port: u32,
    /// Tunnel metadata if it arrived through a tunnel.
    pub tunnel: Option<TunnelMeta>,
}

impl DpPacket<Vec<u8>> {
    /// An owned copy of `frame` that arrived on `in_port`.
    pub fn from_frame(frame: &[u8], in_port: u32) -> DpPacket<Vec<u8>> {
        DpPacket {
            packet: PacketBuf::from_frame(frame),
            in_port,
            tunnel: None,
        }
    }
}

/// A packet sent to the controller.
#[derive(Clone, Copy, Debug)]
pub struct PacketIn<'a> {
    pub reason: PacketInReason,
    /// Table of the flow that sent it.
    pub table: u8,
    /// Cookie of the flow that sent it.
    pub cookie: u64,
    pub userdata: &'a [u8],
    /// The frame as it is at this point of the actions.
    pub frame: &'a [u8],
    /// The packet's key at this point (in_port, registers, ct state...).
    pub key: &'a FlowKey,
}

/// Where the datapath's results go: the port layer (or a test).
pub trait DatapathSink {
    /// Transmit `frame` on OpenFlow port `port`. `tunnel` is set when the
    /// packet's key has a tunnel destination (for tunnel ports).
    fn output(&mut self, port: u32, frame: &[u8], tunnel: Option<TunnelMeta>);
    /// As [`DatapathSink::output`], for the packet's last output (its last
    /// action, with nothing after it): when `frame` lies in a packet
    /// buffer the caller handed to [`Datapath::process_batch`], the
    /// datapath neither reads nor writes that buffer again in the batch,
    /// so a sink may hand the buffer itself to the port instead of
    /// copying it (the switch moves AF_XDP descriptors). A recirculated
    /// copy's last output also comes here; such a copy lives in the
    /// datapath's own scratch, which later packets reuse. The default
    /// copies.
    fn output_last(&mut self, port: u32, frame: &[u8], tunnel: Option<TunnelMeta>) {
        self.output(port, frame, tunnel);
    }
    /// Queue a packet-in for the controller.
    fn packet_in(&mut self, pkt: PacketIn<'_>);
    /// Called before each packet of a batch is processed, with its ingress
    /// port and frame as received, so a sink can answer the sender itself
    /// (e.g. an ICMP "fragmentation needed" when an output does not fit a
    /// tunnel). The default does nothing.
    fn begin_packet(&mut self, _in_port: u32, _frame: &[u8]) {}
    /// A `learn` action's flow, for the switch to add or refresh
    /// ([`crate::tables::Pipeline::learn`]). A cached translation hands on
    /// each of its learned flows at most every [`Learned::RESEND_NS`]. The
    /// default forgets it (sinks that only forward or count).
    fn learn(&mut self, _flow: &Arc<Learned>) {}
}

/// A packet-in as recorded by [`RecordingSink`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedPacketIn {
    pub reason: PacketInReason,
    pub table: u8,
    pub cookie: u64,
    pub userdata: Vec<u8>,
    pub frame: Vec<u8>,
    pub in_port: u32,
}

/// A sink that copies everything it gets (tests and slow paths).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecordingSink {
    /// `(port, frame, tunnel)` in output order.
    pub outputs: Vec<(u32, Vec<u8>, Option<TunnelMeta>)>,
    pub packet_ins: Vec<OwnedPacketIn>,
    /// Learned flows, in order.
    pub learned: Vec<Flow>,
}

impl DatapathSink for RecordingSink {
    fn output(&mut self, port: u32, frame: &[u8], tunnel: Option<TunnelMeta>) {
        self.outputs.push((port, frame.to_vec(), tunnel));
    }
    fn packet_in(&mut self, p: PacketIn<'_>) {
        self.packet_ins.push(OwnedPacketIn {
            reason: p.reason,
            table: p.table,
            cookie: p.cookie,
            userdata: p.userdata.to_vec(),
            frame: p.frame.to_vec(),
            in_port: p.key.get(Field::InPort) as u32,
        });
    }
    fn learn(&mut self, flow: &Arc<Learned>) {
        self.learned.push(flow.flow.clone());
    }
}

/// A sink that only counts (benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountingSink {
    pub outputs: u64,
    pub output_bytes: u64,
    pub packet_ins: u64,
}

impl DatapathSink for CountingSink {
    fn output(&mut self, _port: u32, frame: &[u8], _tunnel: Option<TunnelMeta>) {
        self.outputs += 1;
        self.output_bytes += frame.len() as u64;
    }
    fn packet_in(&mut self, _p: PacketIn<'_>) {
        self.packet_ins += 1;
    }
}

/// Sizes and limits of a [`Datapath`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatapathConfig {
    /// Exact-match cache slots (power of two; 0 disables the tier).
    pub emc_entries: usize,
    /// Most megaflows kept (0 disables the tier: every packet takes the slow path).
    pub megaflow_max: usize,
    /// Most recirculations of one packet.
    pub max_recirc_depth: u8,
}

impl Default for DatapathConfig {
    fn default() -> Self {
        DatapathConfig {
            emc_entries: crate::cache::ExactMatchCache::DEFAULT_ENTRIES,
            megaflow_max: crate::cache::MegaflowCache::DEFAULT_MAX_ENTRIES,
            max_recirc_depth: 8,
        }
    }
}

impl DatapathConfig {
    /// No caches at all: every lookup is a slow-path translation (the
    /// reference behaviour the caches must reproduce).
    pub fn uncached() -> Self {
        DatapathConfig {
            emc_entries: 0,
            megaflow_max: 0,
            ..DatapathConfig::default()
        }
    }
}

/// Counters of one datapath thread. Lookup counters count *passes*: a
/// packet that recirculates is looked up once per pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathStats {
    /// Packets received by [`Datapath::process_batch`].
    pub packets: u64,
    /// Their bytes (as received).
    pub bytes: u64,
    /// Passes answered by the exact-match cache.
    pub emc_hits: u64,
    /// Passes answered by the megaflow cache.
    pub megaflow_hits: u64,
    /// Passes that went to the slow path (upcalls).
    pub upcalls: u64,
    /// Megaflows installed by the slow path.
    pub megaflow_inserts: u64,
    /// Slow-path translations that failed (resubmit loops, unknown
    /// recirculation ids): the packet is dropped, and the drop is cached
    /// like any result (the failure depends only on the bits consulted).
    pub xlate_errors: u64,
    /// Times the caches were emptied (table changes, explicit flushes).
    pub cache_flushes: u64,
    /// Recirculations (extra passes).
    pub recirculations: u64,
    /// Passes whose action list was empty (explicit drop / no flow), plus
    /// packets dropped for recirculating too deep.
    pub drops: u64,
    /// Packets dropped because they recirculated more than the limit.
    pub recirc_limit_drops: u64,
    /// Packets a meter dropped (over its rate; also in the meter's band
    /// counters).
    pub meter_drops: u64,
    /// Header writes skipped because the frame did not fit them (per write).
    pub write_errors: u64,
    /// Frames handed to [`DatapathSink::output`].
    pub outputs: u64,
    /// Packet-ins handed to [`DatapathSink::packet_in`].
    pub packet_ins: u64,
    /// Learned flows handed to [`DatapathSink::learn`].
    pub learns: u64,
    /// Fragments a `ct` action handed to the reassembler that did not
    /// complete their datagram (held until the rest arrives).
    pub frags_held: u64,
    /// Fragments the reassembler refused (limits, overlaps, malformed:
    /// the reasons are in its own counters).
    pub frag_drops: u64,
    /// Datagrams reassembled and sent on through the pipeline.
    pub reassembled: u64,
    /// Packets dropped because conntrack refused to commit their new
    /// connection (the reason is in its own counters).
    pub ct_refused_drops: u64,
}

/// One datapath thread's state: caches, counters and scratch space.
#[derive(Debug)]
pub struct Datapath {
    pipeline: Arc<Pipeline>,
    env: XlateEnv,
    config: DatapathConfig,
    caches: FlowCaches,
    stats: DatapathStats,
    /// Per-batch rule credits: (megaflow, packets, bytes).
    credits: Vec<(Arc<MegaflowEntry>, u64, u64)>,
    /// Frame copies for non-tail recirculation, one per depth.
    scratch: Vec<PacketBuf>,
    /// The reassembled datagram's buffer (reused).
    reassembled: PacketBuf,
    /// One outgoing fragment being rewritten (reused).
    frag_out: Vec<u8>,
    slow_path: SlowPathFn,
}

/// Conntrack slots the background sweep examines per packet of a batch
/// ([`Conntrack::sweep`]): a table of N slots is swept every N packets or
/// faster (a port at its limit sweeps more).
const CT_SWEEP_PER_PACKET: usize = 1;

/// Credits are flushed early when this many distinct megaflows were hit in
/// one batch (keeps the per-packet search short for huge batches).
const MAX_PENDING_CREDITS: usize = 128;

impl Datapath {
    /// A datapath over `pipeline`'s tables.
    pub fn new(pipeline: Arc<Pipeline>, env: XlateEnv, config: DatapathConfig) -> Datapath {
        Datapath::with_slow_path(pipeline, env, config, translate)
    }

    /// A datapath whose slow path is `slow_path` instead of
    /// [`translate`]: for testing or benchmarking the caches and the action
    /// executor in isolation.
    pub fn with_slow_path(
        pipeline: Arc<Pipeline>,
        env: XlateEnv,
        config: DatapathConfig,
        slow_path: SlowPathFn,
    ) -> Datapath {
        Datapath {
            slow_path,
            pipeline,
            env,
            config,
            caches: FlowCaches::new(config.emc_entries, config.megaflow_max),
            stats: DatapathStats::default(),
            credits: Vec::with_capacity(MAX_PENDING_CREDITS),
            scratch: (0..=config.max_recirc_depth)
                .map(|_| PacketBuf::default())
                .collect(),
            reassembled: PacketBuf::default(),
            frag_out: Vec::new(),
        }
    }

    /// The counters (cache-tier counters included).
    pub fn stats(&self) -> DatapathStats {
        let c = self.caches.stats();
        DatapathStats {
            emc_hits: c.emc_hits,
            megaflow_hits: c.megaflow_hits,
            megaflow_inserts: c.megaflow_inserts,
            cache_flushes: c.flushes,
            ..self.stats
        }
    }

    /// Empties both cache tiers.
    pub fn flush_caches(&mut self) {
        self.caches.flush();
    }

    /// The caches (for dumps and tests).
    pub fn caches(&self) -> &FlowCaches {
        &self.caches
    }

    /// The translation environment (ports).
    pub fn env(&self) -> &XlateEnv {
        &self.env
    }

    /// Replaces the translation environment (ports added/removed) and
    /// flushes the caches, whose entries may depend on it.
    pub fn set_env(&mut self, env: XlateEnv) {
        self.env = env;
        self.caches.flush();
    }

    /// The actions for `key` under the current table version, through the
    /// caches like a packet's lookup (installing a megaflow on a miss), and
    /// which tier answered. Executes nothing and credits no counters.
    pub fn classify(&mut self, key: &FlowKey) -> (Arc<MegaflowEntry>, CacheTier) {
        let tables = self.pipeline.snapshot();
        self.caches.revalidate(tables.generation());
        self.lookup(&tables, key)
    }

    /// Processes a batch of packets: lookups, actions, outputs to `sink`.
    /// Header writes modify the packets in place.
    pub fn process_batch<B, S>(
        &mut self,
        pkts: &mut [DpPacket<B>],
        ct: &mut Conntrack,
        now_ns: u64,
        sink: &mut S,
    ) where
        B: AsRef<[u8]> + AsMut<[u8]>,
        S: DatapathSink + ?Sized,
    {
        let tables = self.pipeline.snapshot();
        self.caches.revalidate(tables.generation());
        let mut run = Run {
            tables: &tables,
            ct,
            now_ns,
            sink,
            frags: None,
        };
        for p in pkts.iter_mut() {
            let mut key = extract(p.packet.data(), p.in_port);
            if let Some(t) = p.tunnel {
                t.write_to(&mut key);
            }
            self.stats.packets += 1;
            self.stats.bytes += p.packet.len() as u64;
            run.sink.begin_packet(p.in_port, p.packet.data());
            run.ct.begin_packet();
            let delivered = self.stats.outputs + self.stats.packet_ins;
            self.pass(&mut run, &mut p.packet, &mut key, 0);
            // The packet's fate is known: its new connections enter the
            // table only if it went somewhere (module doc, "Conntrack").
            if run.ct.has_staged() {
                if self.stats.outputs + self.stats.packet_ins != delivered {
                    run.ct.commit_staged(now_ns);
                } else {
                    run.ct.discard_staged();
                }
            }
        }
        self.flush_credits(now_ns);
        // The background conntrack sweep, paid for by the traffic.
        run.ct
            .sweep(now_ns, CT_SWEEP_PER_PACKET.saturating_mul(pkts.len()));
    }

    fn lookup(&mut self, tables: &TableSet, key: &FlowKey) -> (Arc<MegaflowEntry>, CacheTier) {
        if let Some(hit) = self.caches.lookup(key) {
            return hit;
        }
        self.stats.upcalls += 1;
        let t = (self.slow_path)(tables, key, &self.env);
        if t.error.is_some() {
            self.stats.xlate_errors += 1;
        }
        let mut mask = t.wildcards;
        // The slow path chooses its start table by recirc_id: every
        // megaflow matches it exactly, whatever the translation reported.
        mask.mask_field(Field::RecircId);
        let e = self.caches.install(
            key,
            mask,
            t.actions.into_boxed_slice(),
            t.rules.into_boxed_slice(),
        );
        (e, CacheTier::SlowPath)
    }

    fn credit(&mut self, e: &Arc<MegaflowEntry>, bytes: u64, now_ns: u64) {
        if let Some(c) = self.credits.iter_mut().rev().find(|c| Arc::ptr_eq(&c.0, e)) {
            c.1 += 1;
            c.2 += bytes;
            return;
        }
        if self.credits.len() >= MAX_PENDING_CREDITS {
            self.flush_credits(now_ns);
        }
        self.credits.push((Arc::clone(e), 1, bytes));
    }

    fn flush_credits(&mut self, now_ns: u64) {
        for (e, packets, bytes) in self.credits.drain(..) {
            e.credit(packets, bytes, now_ns);
        }
    }

    /// One pass (and its tail recirculations) of a packet.
    fn pass<B, S>(
        &mut self,
        run: &mut Run<'_, S>,
        pkt: &mut Packet<B>,
        key: &mut FlowKey,
        mut depth: u8,
    ) where
        B: AsRef<[u8]> + AsMut<[u8]>,
        S: DatapathSink + ?Sized,
    {
        loop {
            let (entry, _tier) = self.lookup(run.tables, key);
            self.credit(&entry, pkt.len() as u64, run.now_ns);
            if entry.actions.is_empty() {
                self.stats.drops += 1;
                return;
            }
            match self.execute(run, &entry.actions, pkt, key, depth) {
                Some(id) => {
                    if !self.may_recirculate(depth) {
                        return;
                    }
                    key.set(Field::RecircId, id as u128);
                    depth += 1;
                }
                None => return,
            }
        }
    }

    /// A `ct` action met a fragment: offer it to the reassembler; if it
    /// completes its datagram, the reassembled packet is tracked and goes
    /// through `rest` (the actions after the `ct`) and on, its outputs
    /// sending the original fragments (module doc, "Fragments").
    /// Out of line: fragments are rare, and the common path stays small.
    #[cold]
    #[inline(never)]
    fn ct_fragment<B, S>(
        &mut self,
        run: &mut Run<'_, S>,
        params: &CtParams,
        rest: &[DpAction],
        pkt: &Packet<B>,
        key: &FlowKey,
        depth: u8,
    ) where
        B: AsRef<[u8]> + AsMut<[u8]>,
        S: DatapathSink + ?Sized,
    {
        let done = match run
            .ct
            .ipf_mut()
            .add(pkt.data(), key, params.zone, run.now_ns)
        {
            IpfOutcome::Held => {
                self.stats.frags_held += 1;
                return;
            }
            IpfOutcome::Dropped(_) => {
                self.stats.frag_drops += 1;
                self.stats.drops += 1;
                return;
            }
            IpfOutcome::Completed(done) => done,
        };
        if run.frags.is_some() {
            // Cannot happen (a reassembled packet is no fragment); never
            // nest, whatever a flow table does.
            run.ct.ipf_mut().recycle(done);
            self.stats.frag_drops += 1;
            self.stats.drops += 1;
            return;
        }
        self.stats.reassembled += 1;
        let mut whole = std::mem::take(&mut self.reassembled);
        whole.set_frame(done.frame());
        // Metadata (port, registers, tunnel, recirculation) as the
        // fragment had it; the packet fields of the whole datagram.
        let mut k = *key;
        extract_packet(whole.data(), &mut k);
        let Ok(v) = run.ct.execute_staged(whole.data(), &k, params, run.now_ns) else {
            run.ct.ipf_mut().recycle(done);
            self.ct_refused();
            return;
        };
        k.set(Field::CtState, v.state as u128);
        k.set(Field::CtZone, v.zone as u128);
        k.set(Field::CtMark, v.mark as u128);
        k.set(Field::CtLabel, v.label);
        if let Some(rw) = v.rewrite {
            self.nat_rewrite(&mut whole, &mut k, &rw);
        }
        run.frags = Some(done);
        if let Some(id) = self.execute(run, rest, &mut whole, &mut k, depth) {
            if self.may_recirculate(depth) {
                k.set(Field::RecircId, id as u128);
                self.pass(run, &mut whole, &mut k, depth + 1);
            }
        }
        if let Some(done) = run.frags.take() {
            run.ct.ipf_mut().recycle(done);
        }
        self.reassembled = whole;
    }

    /// An output of a reassembled datagram: its original fragments.
    #[cold]
    #[inline(never)]
    fn output_fragments<S: DatapathSink + ?Sized>(
        &mut self,
        sink: &mut S,
        port: u32,
        whole: &[u8],
        done: &Completed,
        tunnel: Option<TunnelMeta>,
    ) {
        for frag in done.fragments_by_offset() {
            if rewrite_fragment(whole, frag, &mut self.frag_out) {
                self.stats.outputs += 1;
                sink.output(port, &self.frag_out, tunnel);
            } else {
                self.stats.write_errors += 1;
            }
        }
    }

    /// Writes the addresses and ports NAT gave the packet (those that
    /// differ; each write updates the checksums) into the frame and the
    /// key. Out of line: only NATed connections come here.
    #[cold]
    #[inline(never)]
    fn nat_rewrite<B>(&mut self, pkt: &mut Packet<B>, key: &mut FlowKey, rw: &CtRewrite)
    where
        B: AsRef<[u8]> + AsMut<[u8]>,
    {
        let (src, dst) = if rw.v6 {
            (Field::Ipv6Src, Field::Ipv6Dst)
        } else {
            (Field::NwSrc, Field::NwDst)
        };
        let mut writes = [
            (src, rw.src),
            (dst, rw.dst),
            (Field::TpSrc, 0),
            (Field::TpDst, 0),
        ];
        writes[2].1 = u128::from(rw.sport);
        writes[3].1 = u128::from(rw.dport);
        let n = if rw.ports { 4 } else { 2 };
        for &(field, value) in &writes[..n] {
            if key.get(field) != value {
                if pkt.set_field(field, value).is_err() {
                    self.stats.write_errors += 1;
                }
                key.set(field, value);
            }
        }
    }

    /// A commit was refused (per-port limit, full table): the packet is
    /// dropped, as Linux drops a packet whose conntrack entry cannot be
    /// created. Out of line: the common path stays small.
    #[cold]
    #[inline(never)]
    fn ct_refused(&mut self) {
        self.stats.ct_refused_drops += 1;
        self.stats.drops += 1;
    }

    fn may_recirculate(&mut self, depth: u8) -> bool {
        if depth >= self.config.max_recirc_depth {
            self.stats.recirc_limit_drops += 1;
            self.stats.drops += 1;
            false
        } else {
            self.stats.recirculations += 1;
            true
        }
    }

    /// Executes `actions`; returns `Some(id)` if the last action is
    /// `Recirc(id)` (the caller continues in place).
    fn execute<B, S>(
        &mut self,
        run: &mut Run<'_, S>,
        actions: &[DpAction],
        pkt: &mut Packet<B>,
        key: &mut FlowKey,
        depth: u8,
    ) -> Option<u32>
    where
        B: AsRef<[u8]> + AsMut<[u8]>,
        S: DatapathSink + ?Sized,
    {
        let n = actions.len();
        for (i, a) in actions.iter().enumerate() {
            match a {
                DpAction::Output(p) => {
                    let p = if *p == port::IN_PORT {
                        key.get(Field::InPort) as u32
                    } else {
                        *p
                    };
                    let tunnel = TunnelMeta::from_key(key);
                    match &run.frags {
                        Some(done) => self.output_fragments(run.sink, p, pkt.data(), done, tunnel),
                        None => {
                            self.stats.outputs += 1;
                            if i + 1 == n {
                                // Nothing follows: the packet is done with.
                                run.sink.output_last(p, pkt.data(), tunnel);
                            } else {
                                run.sink.output(p, pkt.data(), tunnel);
                            }
                        }
                    }
                }
                DpAction::Set { field, value } => {
                    if pkt.set_field(*field, *value).is_err() {
                        self.stats.write_errors += 1;
                    }
                    key.set(*field, *value);
                }
                DpAction::PushVlan { tpid, tci } => {
                    if pkt.push_vlan(*tpid, *tci).is_err() {
                        // No headroom for the tag: sending the frame on
                        // untagged would put it in the wrong VLAN. Drop it.
                        self.stats.write_errors += 1;
                        self.stats.drops += 1;
                        return None;
                    }
                    key.set(Field::VlanTci, (*tci | 0x1000) as u128);
                }
                DpAction::PopVlan => {
                    if pkt.pop_vlan().is_err() {
                        self.stats.write_errors += 1;
                    }
                    key.set(Field::VlanTci, 0);
                }
                DpAction::SetTunnel(t) => t.write_to(key),
                DpAction::Ct {
                    zone,
                    commit,
                    force,
                    mark,
                    label,
                    nat,
                } => {
                    let params = CtParams {
                        zone: *zone,
                        commit: *commit,
                        force: *force,
                        mark: *mark,
                        label: *label,
                        nat: nat.as_deref().copied(),
                    };
                    if key.get(Field::NwFrag) != 0 {
                        self.ct_fragment(run, &params, &actions[i + 1..], pkt, key, depth);
                        return None;
                    }
                    let Ok(v) = run.ct.execute_staged(pkt.data(), key, &params, run.now_ns) else {
                        self.ct_refused();
                        return None;
                    };
                    key.set(Field::CtState, v.state as u128);
                    key.set(Field::CtZone, v.zone as u128);
                    key.set(Field::CtMark, v.mark as u128);
                    key.set(Field::CtLabel, v.label);
                    if let Some(rw) = v.rewrite {
                        self.nat_rewrite(pkt, key, &rw);
                    }
                }
                DpAction::CtClear => {
                    run.ct.begin_packet();
                    key.set(Field::CtState, 0);
                    key.set(Field::CtZone, 0);
                    key.set(Field::CtMark, 0);
                    key.set(Field::CtLabel, 0);
                }
                DpAction::LoadMeta { field, value } => key.set(*field, *value),
                DpAction::Meter(m) => {
                    if !m.admit(run.now_ns, pkt.data().len()) {
                        self.stats.meter_drops += 1;
                        return None;
                    }
                }
                DpAction::Learn(l) => {
                    if l.due(run.now_ns) {
                        self.stats.learns += 1;
                        run.sink.learn(l);
                    }
                }
                DpAction::Recirc(id) => {
                    if i + 1 == n {
                        return Some(*id);
                    }
                    if !self.may_recirculate(depth) {
                        continue;
                    }
                    // More actions follow: the recirculated packet is a copy.
                    let slot = (depth as usize).min(self.scratch.len().saturating_sub(1));
                    let mut copy = std::mem::take(&mut self.scratch[slot]);
                    copy.set_frame(pkt.data());
                    let mut k = *key;
                    k.set(Field::RecircId, *id as u128);
                    self.pass(run, &mut copy, &mut k, depth + 1);
                    self.scratch[slot] = copy;
                }
                DpAction::Userspace {
                    reason,
                    userdata,
                    table,
                    cookie,
                } => {
                    self.stats.packet_ins += 1;
                    run.sink.packet_in(PacketIn {
                        reason: *reason,
                        table: *table,
                        cookie: *cookie,
                        userdata,
                        frame: pkt.data(),
                        key,
                    });
                }
            }
        }
        None
    }
}

/// What stays the same for a whole batch.
struct Run<'a, S: ?Sized> {
    tables: &'a TableSet,
    ct: &'a mut Conntrack,
    now_ns: u64,
    sink: &'a mut S,
    /// While a reassembled datagram goes through the actions: its original
    /// fragments, which its outputs send instead of it.
    frags: Option<Completed>,
}

/// Writes into `out` the fragment `frag` as it leaves: the Ethernet header
/// (VLAN tags included) of `whole`, the reassembled packet as the actions
/// left it, then the fragment's own IP header with `whole`'s rewritable
/// fields, then the fragment's data. `false` if either frame is not the
/// IP packet it should be (nothing is sent then).
fn rewrite_fragment(whole: &[u8], frag: &[u8], out: &mut Vec<u8>) -> bool {
    let (w, f) = (Layout::parse(whole), Layout::parse(frag));
    let (Some(wl3), Some(fl3)) = (w.l3, f.l3) else {
        return false;
    };
    if w.eth_type != f.eth_type || f.l3_end <= fl3 || whole.len() < wl3 + 40 {
        return false;
    }
    let Some(frag_ip) = frag.get(fl3..f.l3_end) else {
        return false;
    };
    out.clear();
    out.extend_from_slice(&whole[..wl3]);
    out.extend_from_slice(frag_ip);
    let ip = &mut out[wl3..];
    let wip = &whole[wl3..];
    match f.eth_type {
        ethertype::IPV4 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ip.len() < ihl || ihl < 20 {
                return false;
            }
            ip[1] = wip[1];
            ip[8] = wip[8];
            ip[12..20].copy_from_slice(&wip[12..20]);
            ip[10..12].fill(0);
            let sum = ipv4_checksum(&ip[..ihl]);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            // The fragment's data as the datagram has it now: what the
            // actions rewrote in the L4 header (ports, and the checksum
            // that covers the addresses, e.g. after NAT) reaches the
            // fragment that carries it.
            let off = usize::from(u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff) * 8;
            let w_ihl = usize::from(wip[0] & 0x0f) * 4;
            let w_end = w.l3_end.saturating_sub(wl3);
            let data = ip.len() - ihl;
            if let Some(now) = wip.get(w_ihl + off..(w_ihl + off + data).min(w_end)) {
                if now.len() == data {
                    ip[ihl..].copy_from_slice(now);
                }
            }
            true
        }
        ethertype::IPV6 if ip.len() >= 40 => {
            ip[..4].copy_from_slice(&wip[..4]);
            ip[7] = wip[7];
            ip[8..40].copy_from_slice(&wip[8..40]);
            true
        }
        _ => false,
    }
}

/// The IPv4 header checksum of `hdr` (its checksum field zeroed).
fn ipv4_checksum(hdr: &[u8]) -> u16 {
    crate::checksum::checksum(hdr, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::ct_state;
    use crate::flow::Flow;
    use crate::packet::Layout;
    use crate::tables::{Rule, RuleStats};
    use std::sync::OnceLock;

    fn rule() -> &'static Arc<Rule> {
        static R: OnceLock<Arc<Rule>> = OnceLock::new();
        R.get_or_init(|| {
            Arc::new(Rule {
                flow: Flow::default(),
                created_ns: 0,
                stats: RuleStats::default(),
            })
        })
    }

    /// A stand-in slow path that decides from in_port, recirc_id and
    /// ct_state only (so it does not depend on extraction).
    // Built by assignment so it compiles whatever other fields
    // `Translation` has (the real one has more than the contract stub).
    #[allow(clippy::field_reassign_with_default)]
    fn fake(_t: &TableSet, key: &FlowKey, _env: &XlateEnv) -> Translation {
        let port = key.get(Field::InPort) as u32;
        let recirc = key.get(Field::RecircId) as u32;
        let mut wildcards = FlowKey::ZERO;
        wildcards.mask_field(Field::InPort);
        use DpAction as A;
        let actions = match (port, recirc) {
            // Plain forward with a rewrite.
            (1, 0) => vec![
                A::Set {
                    field: Field::DlSrc,
                    value: 0x0200_0000_00ee,
                },
                A::Output(2),
            ],
            // Output, recirculate a copy, output the original again.
            (2, 0) => vec![A::Output(1), A::Recirc(5), A::Output(3)],
            (2, 5) => vec![
                A::Set {
                    field: Field::DlDst,
                    value: 0x0200_0000_00dd,
                },
                A::Output(4),
            ],
            // Conntrack then tail recirculation; the next pass sees ct_state.
            (3, 0) => vec![
                A::Ct {
                    zone: 7,
                    commit: false,
                    force: false,
                    mark: None,
                    label: None,
                    nat: None,
                },
                A::LoadMeta {
                    field: Field::Reg(0),
                    value: 0x42,
                },
                A::Recirc(9),
            ],
            (3, 9) => {
                wildcards.mask_field(Field::CtState);
                wildcards.mask_field(Field::Reg(0));
                let trk = key.get(Field::CtState) as u32 & ct_state::TRK != 0;
                let reg_ok = key.get(Field::Reg(0)) == 0x42;
                let zone_ok = key.get(Field::CtZone) == 7;
                vec![A::Output(if trk && reg_ok && zone_ok { 10 } else { 11 })]
            }
            // Recirculates forever.
            (4, _) => vec![A::Recirc(recirc + 1)],
            // Tunnel, VLAN, packet-in.
            (5, 0) => vec![
                A::SetTunnel(crate::odp::TunnelFields {
                    tun_id: 0x10,
                    dst: 0x0a01_0101,
                    ..Default::default()
                }),
                A::PushVlan {
                    tpid: 0x8100,
                    tci: 0x1005,
                },
                A::Output(6),
                A::Userspace {
                    reason: PacketInReason::Action,
                    userdata: vec![1, 2],
                    table: 7,
                    cookie: 9,
                },
            ],
            // The slow path fails (e.g. a resubmit loop): dropped, counted.
            (7, 0) => {
                let mut t = Translation::default();
                t.wildcards = wildcards;
                t.error = Some(crate::xlate::XlateError::TooManyResubmits(1));
                return t;
            }
            // A write that does not fit the frame.
            (6, 0) => vec![
                A::Set {
                    field: Field::TpDst,
                    value: 80,
                },
                A::Output(1),
            ],
            _ => vec![],
        };
        let mut t = Translation::default();
        t.actions = actions;
        t.wildcards = wildcards;
        t.rules = vec![Arc::clone(rule())];
        t
    }

    fn dp(config: DatapathConfig) -> Datapath {
        Datapath::with_slow_path(Arc::new(Pipeline::new()), XlateEnv::default(), config, fake)
    }

    fn frame(tag: u8) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 0xbb, 0x02, 0, 0, 0, 0, 0xaa, 0x08, 0x06];
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&[tag; 20]);
        f
    }

    fn batch(ports: &[u32]) -> Vec<DpPacket<Vec<u8>>> {
        ports
            .iter()
            .map(|&p| DpPacket::from_frame(&frame(p as u8), p))
            .collect()
    }

    fn run(d: &mut Datapath, ports: &[u32]) -> RecordingSink {
        let mut sink = RecordingSink::default();
        let mut ct = Conntrack::default();
        d.process_batch(&mut batch(ports), &mut ct, 1_000, &mut sink);
        sink
    }

    #[test]
    fn tiers_and_counters() {
        let mut d = dp(DatapathConfig::default());
        let before = rule()
            .stats
            .n_packets
            .load(std::sync::atomic::Ordering::Relaxed);
        let sink = run(&mut d, &[1, 1, 1]);
        assert_eq!(sink.outputs.len(), 3);
        let s = d.stats();
        assert_eq!(
            (s.packets, s.upcalls, s.emc_hits, s.megaflow_hits),
            (3, 1, 2, 0)
        );
        assert_eq!(s.outputs, 3);
        let (_, o, _) = &sink.outputs[0];
        assert_eq!(&o[6..12], &[0x02, 0, 0, 0, 0, 0xee]);
        let after = rule()
            .stats
            .n_packets
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(after >= before + 3);
        // The megaflow counted the batch once, with 3 packets.
        let e = d.caches().megaflows.entries().next().unwrap();
        assert_eq!(e.n_packets.load(std::sync::atomic::Ordering::Relaxed), 3);
        d.flush_caches();
        run(&mut d, &[1]);
        assert_eq!(d.stats().upcalls, 2);
    }

    /// Which outputs came as a packet's last, and whether their frame was
    /// the caller's packet buffer.
    #[derive(Default)]
    struct LastSink {
        calls: Vec<(u32, bool, usize)>,
    }

    impl DatapathSink for LastSink {
        fn output(&mut self, port: u32, frame: &[u8], _t: Option<TunnelMeta>) {
            self.calls.push((port, false, frame.as_ptr() as usize));
        }
        fn output_last(&mut self, port: u32, frame: &[u8], _t: Option<TunnelMeta>) {
            self.calls.push((port, true, frame.as_ptr() as usize));
        }
        fn packet_in(&mut self, _p: PacketIn<'_>) {}
    }

    #[test]
    fn only_the_last_action_is_a_last_output() {
        // in_port=2: output:1, a recirculated copy that outputs to 4 (its
        // own last, in the datapath's scratch), then output:3 (the
        // packet's last, in the caller's buffer).
        let mut d = dp(DatapathConfig::default());
        let mut sink = LastSink::default();
        let mut ct = Conntrack::default();
        let mut pkts = batch(&[2]);
        let buf = pkts[0].packet.data().as_ptr_range();
        d.process_batch(&mut pkts, &mut ct, 1_000, &mut sink);
        let got: Vec<(u32, bool, bool)> = sink
            .calls
            .iter()
            .map(|&(port, last, ptr)| (port, last, buf.contains(&(ptr as *const u8))))
            .collect();
        assert_eq!(got, [(1, false, true), (4, true, false), (3, true, true)]);
    }

    #[test]
    fn non_tail_recirculation_works_on_a_copy() {
        let mut d = dp(DatapathConfig::default());
        let sink = run(&mut d, &[2]);
        let ports: Vec<u32> = sink.outputs.iter().map(|o| o.0).collect();
        assert_eq!(ports, [1, 4, 3]);
        let orig = frame(2);
        assert_eq!(sink.outputs[0].1, orig);
        assert_eq!(&sink.outputs[1].1[0..6], &[0x02, 0, 0, 0, 0, 0xdd]);
        assert_eq!(
            sink.outputs[2].1, orig,
            "the copy's rewrite leaked into the original"
        );
        assert_eq!(d.stats().recirculations, 1);
    }

    #[test]
    fn ct_verdict_and_meta_reach_the_next_pass() {
        let mut d = dp(DatapathConfig::default());
        let sink = run(&mut d, &[3, 3]);
        let ports: Vec<u32> = sink.outputs.iter().map(|o| o.0).collect();
        assert_eq!(ports, [10, 10]);
        let s = d.stats();
        assert_eq!(s.recirculations, 2);
        assert_eq!(s.upcalls, 2);
        assert_eq!(s.emc_hits, 2);
    }

    #[test]
    fn recirculation_is_bounded() {
        let mut d = dp(DatapathConfig {
            max_recirc_depth: 3,
            ..DatapathConfig::default()
        });
        let sink = run(&mut d, &[4]);
        assert!(sink.outputs.is_empty());
        let s = d.stats();
        assert_eq!((s.recirculations, s.recirc_limit_drops, s.drops), (3, 1, 1));
    }

    #[test]
    fn tunnel_vlan_and_packet_in() {
        let mut d = dp(DatapathConfig::default());
        let sink = run(&mut d, &[5]);
        let (port, out, tun) = &sink.outputs[0];
        assert_eq!(*port, 6);
        assert_eq!(*tun, Some(TunnelMeta::v4(0x10, 0, 0x0a01_0101)));
        assert_eq!(Layout::parse(out).vlan_tags, 1);
        assert_eq!(&out[12..16], &[0x81, 0, 0, 5]);
        let pi = &sink.packet_ins[0];
        assert_eq!((pi.table, pi.cookie, pi.in_port), (7, 9, 5));
        assert_eq!(pi.userdata, [1, 2]);
        assert_eq!(pi.frame, *out);
        assert_eq!(d.stats().packet_ins, 1);
    }

    #[test]
    fn bad_writes_are_counted_and_drops_too() {
        let mut d = dp(DatapathConfig::default());
        let sink = run(&mut d, &[6, 99]);
        assert_eq!(sink.outputs.len(), 1);
        assert_eq!(sink.outputs[0].1, frame(6));
        let s = d.stats();
        assert_eq!((s.write_errors, s.drops), (1, 1));
    }

    #[test]
    fn xlate_errors_drop_and_are_cached() {
        let mut d = dp(DatapathConfig::default());
        let sink = run(&mut d, &[7, 7]);
        assert!(sink.outputs.is_empty());
        let s = d.stats();
        assert_eq!(
            (s.xlate_errors, s.drops, s.upcalls, s.emc_hits),
            (1, 2, 1, 1)
        );
    }

    #[test]
    fn uncached_config_always_upcalls() {
        let mut d = dp(DatapathConfig::uncached());
        run(&mut d, &[1, 1, 2]);
        let s = d.stats();
        assert_eq!((s.upcalls, s.emc_hits, s.megaflow_hits), (4, 0, 0));
    }

    #[test]
    fn zero_copy_packets() {
        let mut d = dp(DatapathConfig::default());
        let f = frame(1);
        let mut umem = vec![0u8; 512];
        umem[256..256 + f.len()].copy_from_slice(&f);
        let mut pkts = [DpPacket {
            packet: crate::packet::PacketRef::new(&mut umem, 256, f.len()).unwrap(),
            in_port: 1,
            tunnel: None,
        }];
        let mut sink = CountingSink::default();
        d.process_batch(&mut pkts, &mut Conntrack::default(), 0, &mut sink);
        assert_eq!(sink.outputs, 1);
        assert_eq!(&umem[256 + 6..256 + 12], &[0x02, 0, 0, 0, 0, 0xee]);
    }
}
