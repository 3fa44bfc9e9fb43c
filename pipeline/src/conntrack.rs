//! Userspace connection tracking, with the semantics of Open vSwitch's
//! `ct` action and `ct_state` field.
//!
//! # What it does
//!
//! [`Conntrack::execute`] takes one packet (the Ethernet frame as it is now,
//! its [`FlowKey`], the `ct` action's [`CtParams`] and the caller's
//! monotonic time) and answers with a [`CtVerdict`]: the `ct_state` bits and
//! the connection's zone, mark and label, which the datapath writes into the
//! key before recirculating. Nothing here reads a clock, spawns a thread or
//! does I/O; time only moves when the caller says so.
//!
//! # Connections
//!
//! A connection is identified by its key: zone, address family, IP
//! protocol, source and destination address, and source/destination port (TCP,
//! UDP, SCTP), or ICMP echo id plus request/reply types (ICMP and ICMPv6
//! queries; an echo request `A->B type 8` reverses to the echo reply
//! `B->A type 0`), or nothing more (other protocols). The key's reverse is the
//! reply direction; a packet finds its connection in either direction and the
//! reply direction gets `+rpl`.
//!
//! The tuple comes from the flow key (`dl_type`, addresses, `nw_proto`,
//! `tp_src`/`tp_dst`, `tcp_flags`, `nw_frag`); the frame is parsed (through
//! the wire layer's checked views, [`crate::wire`]) only for what the key
//! lacks: header lengths, TCP sequence/ack/window/window-scale option, the
//! ICMP echo id, and the inner IP + L4 header of ICMP errors. IPv6
//! extension headers are walked by the wire layer's one chain walk (the
//! flow key's set and bound); a chain it cannot finish, or one with a
//! Fragment header (atomic fragments included), is `+inv`. The key must
//! describe the frame: if the frame's ethertype or IP protocol disagrees
//! with the key, the packet is `+inv`.
//!
//! # `ct_state`, as OVS computes it
//!
//! * Every packet that goes through the tracker gets `+trk`.
//! * A packet that matches no connection and could start one is `+new`
//!   (TCP: a SYN without ACK, or, with [`CtConfig::tcp_loose`], any valid
//!   flag combination except SYN+ACK; ICMP: echo/timestamp/info requests,
//!   ICMPv6: echo requests; UDP and other protocols: anything). Nothing is
//!   stored unless the action has `commit`.
//! * Packets of a committed connection are `+new` until the connection has
//!   seen a reply (a retransmitted SYN, a second UDP datagram from the
//!   initiator), and `+est` after that, plus `+rpl` in the reply direction:
//!   a TCP SYN-ACK is `+est+rpl`, the initiator's next ACK is `+est`.
//! * An ICMP/ICMPv6 error (destination unreachable, time exceeded, parameter
//!   problem, packet too big, and for IPv4 source quench and redirect) whose
//!   embedded header belongs to a tracked connection is `+rel` (plus `+rpl`
//!   when it travels in that connection's reply direction). An error whose
//!   embedded header matches nothing is `+inv`; errors never create
//!   connections.
//! * `+inv` for everything that cannot be tracked or does not fit the
//!   connection: non-IP frames, truncated or malformed headers, key/frame
//!   mismatches, port 0, ICMP types that are neither queries nor errors (so
//!   IPv6 neighbour discovery is `+inv`, as in OVS userspace), TCP packets with
//!   illegal flag combinations or outside the sequence windows, and a
//!   refused commit (below, "Limits"). An IP fragment given to [`Conntrack::execute`] is
//!   `+inv`: the datapath never does that, it first reassembles the
//!   datagram with the tracker's [`crate::ipf::Ipf`] ([`Conntrack::ipf_mut`]),
//!   tracks the whole datagram, and forwards the original fragments with
//!   its verdict (see [`crate::datapath`], "Fragments").
//!
//! `+inv` packets never change a connection. A verdict carries the mark and
//! label of the connection the packet belongs to (also for `+inv` packets that
//! matched one), and zeros when there is none (untracked, or `+new` without
//! commit).
//!
//! # TCP
//!
//! TCP follows the window-tracking model OVS took from pf (Guido van
//! Rooij's "Real Stateful TCP Packet Filtering"): each direction ("peer")
//! keeps the highest sequence number it sent (`seqlo`), the highest it may
//! send given what the other side acked and advertised (`seqhi`), its largest
//! advertised window and its window-scale factor, and a state (`SYN_SENT`
//! .. `TIME_WAIT`, [`TcpState`]). A segment is valid if its data ends inside
//! the receiver's window, starts no more than one window back (retransmits
//! are fine) and acks nothing unreasonable; RSTs must carry an exact (+-1)
//! sequence number. A FIN moves its sender to `CLOSING`, the ack of a FIN
//! moves it to `FIN_WAIT_2`, an RST moves both sides to `TIME_WAIT`. A new
//! SYN on a tuple whose connection is closed on both sides (`FIN_WAIT_2` or
//! later) replaces that connection with a new one. Sequence checking can be
//! switched off ([`CtConfig::tcp_seq_check`], OVS `tcp-seq-chk`).
//!
//! **Mid-stream pickup** ([`CtConfig::tcp_loose`], Linux's
//! `nf_conntrack_tcp_loose`; off by default here, on by default in
//! `oxvs-switchd`): a TCP segment without SYN that matches no connection is
//! `+new` (so the flows judge it as a new connection from its sender) and,
//! if committed, starts a connection in that direction: after a restart
//! without saved state, `flush-conntrack` or an idle expiry, established
//! connections go on. What the tracker did not see is unknown, as in pf: the
//! window scale counts as the maximum (14) for the connection's life; until
//! the other side is seen, its position is what the first segment acked and
//! both directions get a maximal window, so one side can keep sending and
//! retransmitting (from before the pickup point) while the other is silent;
//! and acks may run ahead of the data seen by a maximal window too (data
//! sent before the pickup). A picked-up connection is still checked: a
//! segment half the sequence space away is `+inv`.
//!
//! # Timeouts
//!
//! Each connection has an expiration time, moved forward by valid packets
//! according to its state ([`CtTimeouts`], OVS defaults, names of the OVS
//! timeout policy). Expired connections are invisible to lookups (a lookup
//! that meets one removes it) and are removed in bulk by
//! [`Conntrack::expire`] or, with bounded work per call, by
//! [`Conntrack::expire_some`].
//!
//! # Saving and restoring
//!
//! [`Conntrack::save_state`] writes the live connections (original tuple,
//! zone, mark, label, L4 state with both TCP peers, remaining lifetime) in a
//! versioned binary format; [`Conntrack::restore_state`] loads it into a new
//! tracker on another clock, validating every byte (the format and the
//! checks: the `persist` submodule, [`CtStateError`]). `oxvs-switchd` saves
//! on SIGTERM and restores at start, so connections keep their state across
//! a restart.
//!
//! # Storage and bounds
//!
//! Connections live in a slab (`Vec<Option<Conn>>` plus a free list) that
//! never holds more than [`CtConfig::max_entries`] connections; a hash map
//! from the connection's *canonical* key (the smaller of the key and its
//! reverse) to the slab index finds a connection from either direction with
//! one probe. [`Conntrack::bytes_per_entry`] reports the memory cost of one
//! connection. The per-packet path allocates nothing; committing a new
//! connection inserts into the map (which may grow it, never beyond what
//! `max_entries` connections need), and a port's first connection adds
//! its entry to the per-port map.
//!
//! # Limits: one pod must not starve the node
//!
//! **Per-port limits.** Every connection is charged to the OpenFlow port
//! its committing packet came in on (its *owner*, [`CtEntry::owner`]), and
//! a port may own at most its limit ([`CtConfig::port_limit`], or its own
//! set by [`Conntrack::set_port_limit`]; 0 is no limit). A commit beyond
//! it is refused ([`CtRefusal::PortLimit`]). Why the ingress port and not
//! the zone or the source address: every pod has its own port, which the
//! switch knows for sure (a pod cannot choose it, while its source address
//! is only as good as the spoof guard), and Antrea-style pipelines put all
//! pods in one zone, so OVS's per-zone limits cannot tell them apart.
//! Connections a port did not start (replies, traffic to it) are not
//! charged to it. Ports whose traffic was already limited elsewhere or is
//! trusted get no limit from `oxvs-switchd`: the tunnel (every remote pod
//! is limited by its own node) and the gateway (the host). Replies of a
//! port's connections never count, and a deleted port's connections stop
//! counting ([`Conntrack::disown_port_slice`]). A port at its limit first
//! sweeps a few slots for expired connections (they may be its own) before
//! it is refused.
//!
//! **Early drop.** A commit into a full table does not fail at once: as
//! Linux's `early_drop` scans the new entry's hash bucket, it looks at
//! 64 slots (`EARLY_DROP_SCAN`) from a place the new key's hash picks and
//! drops the first expired connection there, else the first one that is
//! not *assured* (has seen no reply; TCP: not both sides ESTABLISHED).
//! Only when that window holds nothing but assured connections is the
//! commit refused ([`CtRefusal::TableFull`]). A flood of new flows is
//! exactly what early drop evicts; connections with replies are never
//! evicted. And as Linux's `gc_worker` does, the background sweep
//! ([`Conntrack::sweep`], run by the datapath with every batch, one slot
//! per packet) removes expired connections and, while the table is more
//! than 95 % full, also those that are not assured or are closing.
//!
//! **Refused commits.** A refused commit makes the packet `+trk+inv`, and
//! the datapath drops it (Linux and OVS's kernel datapath drop a packet
//! whose connection cannot be created; OVS userspace forwards it
//! untracked, which lets the flood through and leaves its replies
//! `+inv`).
//!
//! **Staged commits.** The commit in ConntrackCommit comes before the
//! tables that may still drop the packet (Output without a port, any
//! later flow). [`Conntrack::execute_staged`] therefore only stages a new
//! connection (admission, limits and early-drop choice included, so its
//! verdict is final), and the datapath applies the packet's staged commits
//! when the packet has been output or sent to the controller
//! ([`Conntrack::commit_staged`]) or forgets them when it was dropped
//! ([`Conntrack::discard_staged`], counted). Nothing is allocated or
//! locked for it: at most four commits per packet wait in a fixed array
//! (more are applied at once). A packet's commit is applied before the
//! next packet of the batch is processed, so a reply in the same batch
//! finds its connection. What is not staged: changes to existing
//! connections (mark, label, TCP state, a `force` or TCP-reuse removal).
//!
//! # NAT
//!
//! A `ct` action with `nat` ([`CtParams::nat`]) translates, as OVS's
//! userspace conntrack does:
//!
//! * **Choosing.** A new connection committed with `nat(src=RANGE)` or
//!   `nat(dst=RANGE)` gets an address of the range and a port (of the
//!   range's ports; without them the packet's own, and for SNAT, when that
//!   is taken, one of 1024-65535) such that its reply-direction tuple is
//!   not in use: the start is a hash of the connection (`persistent`: of
//!   the addresses only; `random`: a fresh number), at most 8 addresses x
//!   32 ports are tried. When all are held, DNAT also moves the client's
//!   source port (of 1024-65535, as OVS does and Linux's implicit source
//!   NAT does): a pod reusing a port towards a second ClusterIP of the same
//!   endpoint would otherwise hand the endpoint a 4-tuple it still holds
//!   in TIME_WAIT, which it answers with an ACK of the old connection.
//!   Only then may a connection that is over (closed TCP) give up its
//!   tuple, and if none does the commit is refused
//!   ([`CtRefusal::NatExhausted`], counted in
//!   [`CtStats::nat_exhausted_total`]; the datapath drops the packet). A
//!   translation that changes nothing is no translation.
//! * **Storing.** The connection keeps its original key and, in a side
//!   table, its reply-direction key (what a reply really looks like); the
//!   key map finds it by both, so a reply is found in one probe. A packet
//!   that matches a translated connection's map entry but is neither of its
//!   directions (the untranslated reverse, or a translated tuple seen
//!   without its earlier `ct`) is `+inv`.
//! * **Applying.** Every packet of a translated connection through a `ct`
//!   with `nat` (bare `nat` included) is translated: the original direction
//!   to the reply key's reverse, the reply direction to the original key's
//!   reverse. The verdict carries the new addresses and ports
//!   ([`CtVerdict::rewrite`]) and `ct_state` gets `+snat` when the packet's
//!   source changed, `+dnat` when its destination did (so a reply of a
//!   DNATed connection is `+snat`, as OVS marks it). ICMP errors about a
//!   translated connection are not translated (their embedded header
//!   would have to be too).
//! * **One connection per zone per packet.** A packet that already went
//!   through `ct` in a zone (since [`Conntrack::begin_packet`]) and whose
//!   key says so (`+trk`, that `ct_zone`) uses the connection found or
//!   created then: no second lookup, no second state update, its
//!   `ct_state` kept; a commit adds mark and label, a `nat` translates if
//!   no earlier `ct` in the zone did. This is how OVS (the connection
//!   cached in the packet's metadata) and Linux (the skb's conntrack) make
//!   `ct(nat)` ... `ct(commit,nat(dst=...))` ... `ct(commit)` in one zone
//!   work on one connection, whose translated tuple no lookup would find.
//!
//! # Differences from OVS
//!
//! * A refused commit (port limit, full table) is `+trk+inv` (and counted)
//!   and the datapath drops the packet; OVS userspace leaves such a packet
//!   `+new` without storing anything. OVS limits zones, oxvs ports
//!   ("Limits"); OVS has no early drop in userspace.
//! * A commit takes effect only if the packet is not dropped later in the
//!   pipeline ("Staged commits"); OVS commits at once.
//! * Checksums are not verified (OVS userspace verifies them unless the NIC
//!   did); no ALGs or timeout policies per zone; NAT as above, without
//!   the translation of ICMP errors and without OVS's NAT address/port
//!   selection order (which tuple a new connection gets differs).
//!   Fragments are reassembled by [`crate::ipf`] as OVS userspace's `ipf`
//!   does, with the limits and drop reasons listed there.
//! * TCP needs a SYN to start a connection unless `tcp_loose` is set (OVS
//!   userspace always picks up mid-stream connections, as `oxvs-switchd`
//!   does by default). A picked-up connection's window checks are looser
//!   than OVS's (above, "Mid-stream pickup"): OVS allows acks only one
//!   unscaled window ahead of the data seen and gives the silent side a
//!   window of 1, so a stream picked up while its other direction is
//!   dropped, or whose receiver had acked data the tracker never saw, goes
//!   `+inv` in OVS. Linux goes further and does not check the windows of
//!   picked-up connections at all.
//! * SCTP is tracked like UDP (ports, first/multiple/bidirectional), without
//!   SCTP's own state machine.
//! * Mark and label are written only on commit and only by packets that are
//!   not `+inv`.
//!
//! # Concurrency
//!
//! Callers serialise access (`&mut self`); there is no internal locking.
//! Everything that walks the whole table also exists in slices
//! ([`Conntrack::entries_slice`], [`Conntrack::flush_slice`],
//! [`Conntrack::disown_port_slice`]) so that a caller holding a lock the
//! datapath needs can release it between slices.
//!
//! # Layout
//!
//! This file holds the public vocabulary (configuration, parameters,
//! verdicts, counters, entries as dumped); the rest is in submodules:
//! `packet` (a frame into what the tracker needs, or why it cannot be
//! tracked), `state` (connection keys, per-connection state, the TCP, ICMP
//! and generic state machines), `table` ([`Conntrack`] itself) and
//! `persist` (saving and restoring the table).

use std::fmt;
use std::net::IpAddr;

use crate::flow::NatAction;
use crate::ipf::IpfConfig;
use crate::wire::ip_proto;

mod nat;
mod packet;
mod persist;
mod state;
mod table;

pub use persist::{state_len_limit, CtRestored, CtStateError, STATE_VERSION};
pub use state::NO_OWNER;
pub use table::{Conntrack, CtPortLimit, CtRefusal};

const NS_PER_SEC: u64 = 1_000_000_000;

/// Per-state timeouts in seconds. Field names and defaults are those of OVS's
/// userspace timeout policy (`ovs-vsctl add-zone-tp`, `lib/conntrack-tp.c`).
/// Protocols other than TCP and ICMP use the `udp_*` values, as in OVS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtTimeouts {
    /// After the first SYN (or a retransmitted one).
    pub tcp_syn_sent: u32,
    /// While either side has not reached ESTABLISHED.
    pub tcp_syn_recv: u32,
    /// Both sides established.
    pub tcp_established: u32,
    /// One side has sent a FIN.
    pub tcp_fin_wait: u32,
    /// Both sides have sent a FIN.
    pub tcp_time_wait: u32,
    /// Both sides closed (FIN acked both ways, or RST).
    pub tcp_close: u32,
    /// UDP/other: first packet only.
    pub udp_first: u32,
    /// UDP/other: more packets, one direction only.
    pub udp_single: u32,
    /// UDP/other: packets seen in both directions.
    pub udp_multiple: u32,
    /// ICMP: request seen.
    pub icmp_first: u32,
    /// ICMP: reply seen.
    pub icmp_reply: u32,
}

impl Default for CtTimeouts {
    fn default() -> Self {
        CtTimeouts {
            tcp_syn_sent: 30,
            tcp_syn_recv: 30,
            tcp_established: 24 * 60 * 60,
            tcp_fin_wait: 15 * 60,
            tcp_time_wait: 45,
            tcp_close: 30,
            udp_first: 60,
            udp_single: 60,
            udp_multiple: 30,
            icmp_first: 60,
            icmp_reply: 30,
        }
    }
}

/// Limits and timeouts of a connection tracker.
#[derive(Clone, Debug)]
pub struct CtConfig {
    /// Most connections tracked at once. A commit into a full table first
    /// drops an expired or unreplied connection near its hash ("Early
    /// drop"); if there is none, the new connection is refused.
    pub max_entries: usize,
    /// Most connections one ingress port may own ("Per-port limits"); 0: no
    /// limit. [`Conntrack::set_port_limit`] overrides it per port.
    pub port_limit: u32,
    /// Pick up TCP connections from a mid-stream packet (no SYN seen) as `+new`.
    pub tcp_loose: bool,
    /// Check TCP sequence/ack windows (OVS `tcp-seq-chk`, on by default).
    pub tcp_seq_check: bool,
    /// Per-state timeouts.
    pub timeouts: CtTimeouts,
    /// Limits of the fragment reassembler ([`Conntrack::ipf_mut`]).
    pub ipf: IpfConfig,
}

impl Default for CtConfig {
    fn default() -> Self {
        CtConfig {
            max_entries: DEFAULT_MAX_ENTRIES,
            port_limit: CtConfig::default_port_limit(DEFAULT_MAX_ENTRIES),
            tcp_loose: false,
            tcp_seq_check: true,
            timeouts: CtTimeouts::default(),
            ipf: IpfConfig::default(),
        }
    }
}

/// The default table size (Linux's `nf_conntrack_max` on a large node).
pub const DEFAULT_MAX_ENTRIES: usize = 262_144;

impl CtConfig {
    /// The per-port limit that goes with a table of `max_entries`: a
    /// quarter of it (65,536 for the default table), at least 1. Why a
    /// quarter: the module doc, "Per-port limits".
    pub fn default_port_limit(max_entries: usize) -> u32 {
        u32::try_from(max_entries / 4).unwrap_or(u32::MAX).max(1)
    }
}

/// What a `ct` datapath action asks of the tracker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtParams {
    pub zone: u16,
    pub commit: bool,
    /// If the packet matches a connection in its reply direction, delete that
    /// connection and commit a new one with this packet as original
    /// direction. Implies `commit`.
    pub force: bool,
    /// `(value, mask)` stored as ct_mark on commit.
    pub mark: Option<(u32, u32)>,
    /// `(value, mask)` stored as ct_label on commit.
    pub label: Option<(u128, u128)>,
    /// `nat(...)`: translate packets of translated connections, and with
    /// `commit` choose a new connection's translation (module doc, "NAT").
    pub nat: Option<NatAction>,
}

/// The tracker's answer: what goes into the key's ct fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtVerdict {
    /// `ct_state` bits ([`crate::field::ct_state`]).
    pub state: u32,
    pub zone: u16,
    pub mark: u32,
    pub label: u128,
    /// What the packet becomes when `nat` translated it.
    pub rewrite: Option<CtRewrite>,
}

/// A packet's addresses and ports after NAT (the datapath writes the ones
/// that differ, with their checksums).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtRewrite {
    /// IPv6 (`src`/`dst` are 128-bit) or IPv4 (the low 32 bits).
    pub v6: bool,
    pub src: u128,
    pub dst: u128,
    /// Whether the protocol has ports (TCP, UDP, SCTP); ICMP ids are kept.
    pub ports: bool,
    pub sport: u16,
    pub dport: u16,
}

/// Which connections a flush removes: every condition given must hold.
/// The reply direction's source is, for a DNATed connection, the endpoint
/// it was translated to (how a Service proxy ends the connections of an
/// endpoint that went, as kube-proxy does for UDP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtFilter {
    pub zone: Option<u16>,
    /// IP protocol number.
    pub proto: Option<u8>,
    /// The reply direction's source address.
    pub reply_src: Option<IpAddr>,
    /// The reply direction's source port (TCP, UDP, SCTP).
    pub reply_sport: Option<u16>,
}

impl CtFilter {
    /// Whether a connection of `zone` and `proto` whose reply direction is
    /// `reply` is selected.
    pub fn selects(&self, zone: u16, proto: u8, reply: &CtTuple) -> bool {
        self.zone.is_none_or(|z| z == zone)
            && self.proto.is_none_or(|p| p == proto)
            && self.reply_src.is_none_or(|a| a == reply.src)
            && self
                .reply_sport
                .is_none_or(|p| matches!(reply.l4, CtL4::Ports { src, .. } if src == p))
    }
}

/// Counters of a tracker. `*_total` counters only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtStats {
    /// Connections stored now (some may be expired and not yet removed).
    pub entries: usize,
    /// Packets given to [`Conntrack::execute`].
    pub packets_total: u64,
    /// Connections created by a commit.
    pub committed_total: u64,
    /// Packets answered `+inv` (including table-full ones).
    pub invalid_total: u64,
    /// Commits refused because the table was full and no connection near
    /// the new one's hash could be dropped early.
    pub table_full_total: u64,
    /// Commits refused because their ingress port owned its limit of
    /// connections.
    pub limit_refused_total: u64,
    /// Unreplied connections dropped to make room (a commit into a full
    /// table, or the background sweep above 95 % full).
    pub early_drop_total: u64,
    /// New connections not committed because the pipeline dropped the
    /// packet that would have committed them.
    pub commits_discarded_total: u64,
    /// Connections removed because they expired.
    pub expired_total: u64,
    /// Connections removed by [`Conntrack::flush`], `force` or TCP reuse.
    pub deleted_total: u64,
    /// New connections `nat` found no free address and port for.
    pub nat_exhausted_total: u64,
}

/// TCP state of one side of a connection, in OVS order (`ct-dpif.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum TcpState {
    Closed = 0,
    Listen,
    SynSent,
    SynRecv,
    Established,
    CloseWait,
    FinWait1,
    Closing,
    LastAck,
    FinWait2,
    TimeWait,
}

impl TcpState {
    /// The name `dpctl/dump-conntrack` prints.
    pub fn name(self) -> &'static str {
        match self {
            TcpState::Closed => "CLOSED",
            TcpState::Listen => "LISTEN",
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::Established => "ESTABLISHED",
            TcpState::CloseWait => "CLOSE_WAIT",
            TcpState::FinWait1 => "FIN_WAIT_1",
            TcpState::Closing => "CLOSING",
            TcpState::LastAck => "LAST_ACK",
            TcpState::FinWait2 => "FIN_WAIT_2",
            TcpState::TimeWait => "TIME_WAIT",
        }
    }

    /// The single state OVS prints for a connection: the later of the two
    /// sides, with `FIN_WAIT_2` shown as `TIME_WAIT` and `SYN_RECV` as
    /// `ESTABLISHED` (OVS coalesces them to match the kernel's view).
    fn coalesce(orig: TcpState, reply: TcpState) -> TcpState {
        match orig.max(reply) {
            TcpState::FinWait2 => TcpState::TimeWait,
            TcpState::SynRecv => TcpState::Established,
            s => s,
        }
    }
}

impl fmt::Display for TcpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The L4 part of a [`CtTuple`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtL4 {
    /// TCP/UDP/SCTP ports (zero for protocols without ports).
    Ports { src: u16, dst: u16 },
    /// ICMP/ICMPv6 query: echo id and message type (code is always 0).
    Icmp { id: u16, icmp_type: u8, code: u8 },
}

/// One direction of a connection, as `dpctl/dump-conntrack` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtTuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub l4: CtL4,
}

impl fmt::Display for CtTuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "src={},dst={}", self.src, self.dst)?;
        match self.l4 {
            CtL4::Ports { src, dst } => write!(f, ",sport={src},dport={dst}"),
            CtL4::Icmp {
                id,
                icmp_type,
                code,
            } => write!(f, ",id={id},type={icmp_type},code={code}"),
        }
    }
}

/// A snapshot of one connection (for dumps and the CLI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtEntry {
    /// IP protocol number.
    pub proto: u8,
    pub orig: CtTuple,
    pub reply: CtTuple,
    pub zone: u16,
    pub mark: u32,
    pub label: u128,
    /// TCP only: the state as OVS prints it (see [`TcpState`]).
    pub tcp_state: Option<TcpState>,
    /// TCP only: the states of the original and reply sides.
    pub tcp_states: Option<(TcpState, TcpState)>,
    /// When the connection expires, on the caller's clock.
    pub expiration_ns: u64,
    /// The port it counts against ("Per-port limits"), if any.
    pub owner: Option<u32>,
}

/// `ovs-appctl dpctl/dump-conntrack` format, e.g.
/// `tcp,orig=(src=10.0.0.1,dst=10.0.0.2,sport=1234,dport=80),reply=(...),zone=5,mark=1,labels=0x2,protoinfo=(state=ESTABLISHED)`.
/// `zone`, `mark` and `labels` are printed only when nonzero.
impl fmt::Display for CtEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match proto_name(self.proto) {
            Some(name) => f.write_str(name)?,
            None => write!(f, "{}", self.proto)?,
        }
        write!(f, ",orig=({}),reply=({})", self.orig, self.reply)?;
        if self.zone != 0 {
            write!(f, ",zone={}", self.zone)?;
        }
        if self.mark != 0 {
            write!(f, ",mark={}", self.mark)?;
        }
        if self.label != 0 {
            write!(f, ",labels={:#x}", self.label)?;
        }
        if let Some(state) = self.tcp_state {
            write!(f, ",protoinfo=(state={state})")?;
        }
        Ok(())
    }
}

fn proto_name(proto: u8) -> Option<&'static str> {
    Some(match proto {
        ip_proto::ICMP => "icmp",
        ip_proto::ICMPV6 => "icmpv6",
        ip_proto::TCP => "tcp",
        ip_proto::UDP => "udp",
        ip_proto::SCTP => "sctp",
        ip_proto::UDPLITE => "udplite",
        ip_proto::DCCP => "dccp",
        ip_proto::IGMP => "igmp",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::packet::{tcp_wscale, v4_mapped};
    use super::state::{seq_geq, seq_gt, tcp_flags_invalid, ConnKey, WS_FLAG};
    use crate::field::tcp_flags as tf;
    use crate::wire::ip_proto;

    #[test]
    fn canonical_is_direction_free() {
        let k = ConnKey {
            src: v4_mapped(0x0a00_0002),
            dst: v4_mapped(0x0a00_0001),
            sport: 80,
            dport: 1234,
            zone: 3,
            v6: false,
            proto: ip_proto::TCP,
            stype: 0,
            dtype: 0,
        };
        assert_eq!(k.canonical(), k.reverse().canonical());
        assert_eq!(k.reverse().reverse(), k);
        let icmp = ConnKey {
            proto: ip_proto::ICMP,
            sport: 7,
            dport: 7,
            stype: 8,
            dtype: 0,
            ..k
        };
        assert_eq!(icmp.canonical(), icmp.reverse().canonical());
        assert_ne!(icmp.canonical(), k.canonical());
    }

    #[test]
    fn flag_checks() {
        assert!(tcp_flags_invalid(tf::SYN | tf::FIN));
        assert!(tcp_flags_invalid(tf::SYN | tf::RST));
        assert!(tcp_flags_invalid(0));
        assert!(tcp_flags_invalid(tf::FIN));
        assert!(tcp_flags_invalid(tf::RST | tf::PSH));
        assert!(!tcp_flags_invalid(tf::SYN));
        assert!(!tcp_flags_invalid(tf::SYN | tf::ACK));
        assert!(!tcp_flags_invalid(tf::RST));
        assert!(!tcp_flags_invalid(tf::FIN | tf::ACK | tf::PSH));
    }

    #[test]
    fn wscale_option() {
        // MSS, NOP, WS=7
        assert_eq!(tcp_wscale(&[2, 4, 5, 0xb4, 1, 3, 3, 7]), WS_FLAG | 7);
        assert_eq!(tcp_wscale(&[1, 3, 3, 20]), WS_FLAG | 14);
        assert_eq!(tcp_wscale(&[0, 3, 3, 7]), 0);
        assert_eq!(tcp_wscale(&[3, 3]), 0);
        assert_eq!(tcp_wscale(&[2, 0, 3, 3, 7]), 0);
    }

    #[test]
    fn seq_arith_wraps() {
        assert!(seq_geq(5, u32::MAX - 5));
        assert!(seq_gt(0, u32::MAX));
        assert!(!seq_geq(u32::MAX, 1));
    }
}
