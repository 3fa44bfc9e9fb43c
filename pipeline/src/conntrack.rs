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
//! `tp_src`/`tp_dst`, `tcp_flags`, `nw_frag`); the frame is parsed (every
//! access bounds-checked) only for what the key lacks: header lengths, TCP
//! sequence/ack/window/window-scale option, the ICMP echo id, and the inner
//! IP + L4 header of ICMP errors. The key must describe the frame: if the
//! frame's ethertype or IP protocol disagrees with the key, the packet is
//! `+inv`.
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
//! # Differences from OVS
//!
//! * A refused commit (port limit, full table) is `+trk+inv` (and counted)
//!   and the datapath drops the packet; OVS userspace leaves such a packet
//!   `+new` without storing anything. OVS limits zones, oxvs ports
//!   ("Limits"); OVS has no early drop in userspace.
//! * A commit takes effect only if the packet is not dropped later in the
//!   pipeline ("Staged commits"); OVS commits at once.
//! * Checksums are not verified (OVS userspace verifies them unless the NIC
//!   did); no NAT, ALGs or timeout policies per zone.
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

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::field::{ct_state, tcp_flags as tf, Field};
use crate::ipf::{Ipf, IpfConfig};
use crate::key::FlowKey;

mod persist;
pub use persist::{state_len_limit, CtRestored, CtStateError, STATE_VERSION};

const NS_PER_SEC: u64 = 1_000_000_000;

const ETH_TYPE_IPV4: u16 = 0x0800;
const ETH_TYPE_IPV6: u16 = 0x86dd;

const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ICMPV6: u8 = 58;
const IPPROTO_SCTP: u8 = 132;

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
}

/// The tracker's answer: what goes into the key's ct fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtVerdict {
    /// `ct_state` bits ([`crate::field::ct_state`]).
    pub state: u32,
    pub zone: u16,
    pub mark: u32,
    pub label: u128,
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
        IPPROTO_ICMP => "icmp",
        IPPROTO_ICMPV6 => "icmpv6",
        IPPROTO_TCP => "tcp",
        IPPROTO_UDP => "udp",
        IPPROTO_SCTP => "sctp",
        136 => "udplite",
        33 => "dccp",
        2 => "igmp",
        _ => return None,
    })
}

// ---------------------------------------------------------------------------
// Connection keys and state
// ---------------------------------------------------------------------------

/// One direction of a connection. Addresses are 16 bytes (IPv4 as
/// IPv4-mapped IPv6); `stype`/`dtype` are the ICMP types of this direction
/// and of the reverse one (zero for other protocols). Byte arrays keep the
/// alignment at 2, so the key is 42 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ConnKey {
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
    zone: u16,
    v6: bool,
    proto: u8,
    stype: u8,
    dtype: u8,
}

impl ConnKey {
    fn reverse(&self) -> ConnKey {
        ConnKey {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            stype: self.dtype,
            dtype: self.stype,
            ..*self
        }
    }

    /// The same key for both directions: the smaller of the key and its
    /// reverse, comparing the (address, port, type) endpoints.
    fn canonical(&self) -> ConnKey {
        if (self.src, self.sport, self.stype) <= (self.dst, self.dport, self.dtype) {
            *self
        } else {
            self.reverse()
        }
    }

    fn tuple(&self) -> CtTuple {
        let addr = |a: [u8; 16]| -> IpAddr {
            if self.v6 {
                IpAddr::V6(Ipv6Addr::from(a))
            } else {
                IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))
            }
        };
        let l4 = if self.proto == IPPROTO_ICMP || self.proto == IPPROTO_ICMPV6 {
            CtL4::Icmp {
                id: self.sport,
                icmp_type: self.stype,
                code: 0,
            }
        } else {
            CtL4::Ports {
                src: self.sport,
                dst: self.dport,
            }
        };
        CtTuple {
            src: addr(self.src),
            dst: addr(self.dst),
            l4,
        }
    }
}

const WS_FLAG: u8 = 0x80;
const WS_UNKNOWN: u8 = 0x40;
const WS_MASK: u8 = 0x0f;
const TCP_MAX_WSCALE: u8 = 14;
/// How far an ack may lag or lead: a maximal unscaled window plus slack.
const MAX_ACK_WINDOW: i64 = 0xffff + 1500;

/// One side of a TCP connection (see the module doc).
#[derive(Clone, Copy, Debug)]
struct TcpPeer {
    /// Highest sequence number sent (end of its data).
    seqlo: u32,
    /// Highest sequence number it may send (other side's ack + window).
    seqhi: u32,
    /// Largest window advertised, in units of `1 << wscale`.
    max_win: u32,
    /// Window scale: `WS_FLAG | shift` if negotiated, `WS_UNKNOWN` if the
    /// connection was picked up mid-stream.
    wscale: u8,
    state: TcpState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OtherState {
    First,
    Multiple,
    Bidir,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IcmpState {
    First,
    Reply,
}

#[derive(Clone, Copy, Debug)]
enum L4State {
    /// Index 0: original direction, 1: reply direction.
    Tcp([TcpPeer; 2]),
    Other(OtherState),
    Icmp(IcmpState),
}

/// A stored connection.
#[derive(Clone, Copy, Debug)]
struct Conn {
    /// Original-direction key (the reply key is its reverse).
    orig: ConnKey,
    mark: u32,
    expiration_ns: u64,
    label: u128,
    l4: L4State,
    /// The OpenFlow port whose packet committed it ([`NO_OWNER`]: none),
    /// charged against that port's limit while it lives.
    owner: u32,
}

impl Conn {
    /// Whether the connection is "assured" (Linux's `IPS_ASSURED`): it has
    /// seen traffic both ways (TCP: both sides reached ESTABLISHED). Only
    /// connections that are not may be dropped early.
    fn assured(&self) -> bool {
        match self.l4 {
            L4State::Other(s) => s == OtherState::Bidir,
            L4State::Icmp(s) => s == IcmpState::Reply,
            L4State::Tcp([o, r]) => {
                o.state >= TcpState::Established && r.state >= TcpState::Established
            }
        }
    }

    /// Whether it may go when the table is nearly full: not assured, or a
    /// TCP connection that is closing (Linux's `gc_worker_can_early_drop`).
    fn reclaimable(&self) -> bool {
        match self.l4 {
            L4State::Tcp([o, r]) => !self.assured() || o.state.max(r.state) > TcpState::Established,
            _ => !self.assured(),
        }
    }
}

/// The stored owner of a connection charged to no port ([`CtEntry::owner`]
/// is `None`): restored from a version-1 state file, or its port was
/// deleted.
pub const NO_OWNER: u32 = u32::MAX;

/// Which timeout applies (OVS `CT_TM_*`).
#[derive(Clone, Copy, Debug)]
enum Tm {
    TcpFirstPacket,
    TcpOpening,
    TcpEstablished,
    TcpClosing,
    TcpFinWait,
    TcpClosed,
    OtherFirst,
    OtherMultiple,
    OtherBidir,
    IcmpFirst,
    IcmpReply,
}

impl CtTimeouts {
    fn secs(&self, tm: Tm) -> u32 {
        match tm {
            Tm::TcpFirstPacket => self.tcp_syn_sent,
            Tm::TcpOpening => self.tcp_syn_recv,
            Tm::TcpEstablished => self.tcp_established,
            Tm::TcpClosing => self.tcp_fin_wait,
            Tm::TcpFinWait => self.tcp_time_wait,
            Tm::TcpClosed => self.tcp_close,
            Tm::OtherFirst => self.udp_first,
            Tm::OtherMultiple => self.udp_single,
            Tm::OtherBidir => self.udp_multiple,
            Tm::IcmpFirst => self.icmp_first,
            Tm::IcmpReply => self.icmp_reply,
        }
    }

    fn deadline(&self, tm: Tm, now_ns: u64) -> u64 {
        now_ns.saturating_add(u64::from(self.secs(tm)) * NS_PER_SEC)
    }
}

/// Result of updating a connection with a packet (OVS `ct_update_res`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Update {
    /// Fits the connection, which has seen both directions: `+est`.
    Valid,
    /// Fits, but the connection has not seen a reply yet: `+new`.
    ValidNew,
    /// Does not fit: `+inv`.
    Invalid,
    /// Starts a new connection on a closed tuple: delete and start over.
    New,
}

// ---------------------------------------------------------------------------
// Packet parsing
// ---------------------------------------------------------------------------

/// Why a packet could not be tracked (kept for debugging; every one is `+inv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Untrackable {
    NotIp,
    KeyMismatch,
    Truncated,
    BadHeader,
    Fragment,
    ZeroPort,
    UnsupportedIcmp,
    BadInner,
}

/// What the TCP state machine needs from a segment.
#[derive(Clone, Copy, Debug)]
struct TcpSeg {
    flags: u16,
    seq: u32,
    ack: u32,
    win: u16,
    /// `WS_FLAG | shift` if the segment carries a window-scale option.
    wscale: u8,
    payload: u32,
}

#[derive(Clone, Copy, Debug)]
enum PktKind {
    Tcp(TcpSeg),
    /// ICMP/ICMPv6 query message (`may_start`: a request, which may create a
    /// connection).
    IcmpQuery {
        may_start: bool,
    },
    /// ICMP error; the packet's key is the reversed embedded header.
    Related,
    /// UDP, SCTP, other protocols.
    Other,
}

#[derive(Clone, Copy, Debug)]
struct Pkt {
    key: ConnKey,
    kind: PktKind,
}

fn be16(b: &[u8], off: usize) -> Option<u16> {
    let s: [u8; 2] = b.get(off..off.checked_add(2)?)?.try_into().ok()?;
    Some(u16::from_be_bytes(s))
}

fn be32(b: &[u8], off: usize) -> Option<u32> {
    let s: [u8; 4] = b.get(off..off.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_be_bytes(s))
}

fn byte(b: &[u8], off: usize) -> Option<u8> {
    b.get(off).copied()
}

fn addr16(b: &[u8], off: usize) -> Option<[u8; 16]> {
    b.get(off..off.checked_add(16)?)?.try_into().ok()
}

fn v4_mapped(a: u32) -> [u8; 16] {
    Ipv4Addr::from(a).to_ipv6_mapped().octets()
}

/// An IPv4 header at the start of `b`: (header length, protocol, src, dst,
/// total length, fragment offset/flags word).
fn ipv4_header(b: &[u8]) -> Result<(usize, u8, u32, u32, usize, u16), Untrackable> {
    let vihl = byte(b, 0).ok_or(Untrackable::Truncated)?;
    if vihl >> 4 != 4 {
        return Err(Untrackable::BadHeader);
    }
    let ihl = usize::from(vihl & 0x0f) * 4;
    if ihl < 20 {
        return Err(Untrackable::BadHeader);
    }
    if b.len() < ihl {
        return Err(Untrackable::Truncated);
    }
    let tot = usize::from(be16(b, 2).ok_or(Untrackable::Truncated)?);
    let frag = be16(b, 6).ok_or(Untrackable::Truncated)?;
    let proto = byte(b, 9).ok_or(Untrackable::Truncated)?;
    let src = be32(b, 12).ok_or(Untrackable::Truncated)?;
    let dst = be32(b, 16).ok_or(Untrackable::Truncated)?;
    Ok((ihl, proto, src, dst, tot, frag))
}

/// Skips IPv6 extension headers starting at `off` with next header `next`;
/// returns the upper-layer protocol and its offset. Fragments are refused.
fn ipv6_upper(b: &[u8], mut next: u8, mut off: usize) -> Result<(u8, usize), Untrackable> {
    loop {
        let len = match next {
            // Hop-by-hop, routing, destination options.
            0 | 43 | 60 => (usize::from(byte(b, off + 1).ok_or(Untrackable::Truncated)?) + 1) * 8,
            // Authentication header.
            51 => (usize::from(byte(b, off + 1).ok_or(Untrackable::Truncated)?) + 2) * 4,
            44 => return Err(Untrackable::Fragment),
            _ => return Ok((next, off)),
        };
        next = byte(b, off).ok_or(Untrackable::Truncated)?;
        off += len;
        if off > b.len() {
            return Err(Untrackable::Truncated);
        }
    }
}

/// The window-scale option of a TCP header (`WS_FLAG | shift`, or 0).
fn tcp_wscale(opts: &[u8]) -> u8 {
    let mut i = 0;
    while let Some(&kind) = opts.get(i) {
        match kind {
            0 => break,
            1 => i += 1,
            _ => {
                let Some(&len) = opts.get(i + 1) else { break };
                if len < 2 {
                    break;
                }
                if kind == 3 && len == 3 {
                    if let Some(&shift) = opts.get(i + 2) {
                        return WS_FLAG | shift.min(TCP_MAX_WSCALE);
                    }
                }
                i += usize::from(len);
            }
        }
    }
    0
}

fn icmp4_reverse_query(t: u8) -> Option<u8> {
    Some(match t {
        8 => 0,
        0 => 8,
        13 => 14,
        14 => 13,
        15 => 16,
        16 => 15,
        _ => return None,
    })
}

fn icmp6_reverse_query(t: u8) -> Option<u8> {
    Some(match t {
        128 => 129,
        129 => 128,
        _ => return None,
    })
}

/// Parses the packet: the key comes from `key`, lengths and L4 details from
/// `frame` (see the module doc).
fn parse(frame: &[u8], key: &FlowKey, zone: u16) -> Result<Pkt, Untrackable> {
    let mut ethertype = be16(frame, 12).ok_or(Untrackable::Truncated)?;
    let mut off = 14;
    while matches!(ethertype, 0x8100 | 0x88a8 | 0x9100) {
        ethertype = be16(frame, off + 2).ok_or(Untrackable::Truncated)?;
        off += 4;
    }
    if u128::from(ethertype) != key.get(Field::DlType) {
        return Err(
            if ethertype == ETH_TYPE_IPV4 || ethertype == ETH_TYPE_IPV6 {
                Untrackable::KeyMismatch
            } else {
                Untrackable::NotIp
            },
        );
    }
    if key.get(Field::NwFrag) != 0 {
        return Err(Untrackable::Fragment);
    }
    let l3 = frame.get(off..).ok_or(Untrackable::Truncated)?;
    let key_proto = key.get(Field::NwProto) as u8;
    let (v6, proto, l4, src, dst) = match ethertype {
        ETH_TYPE_IPV4 => {
            let (ihl, proto, _, _, tot, frag) = ipv4_header(l3)?;
            if frag & 0x3fff != 0 {
                return Err(Untrackable::Fragment);
            }
            if tot < ihl {
                return Err(Untrackable::BadHeader);
            }
            // Bytes beyond the total length are Ethernet padding.
            let l4 = l3.get(ihl..tot).ok_or(Untrackable::Truncated)?;
            let src = v4_mapped(key.get(Field::NwSrc) as u32);
            let dst = v4_mapped(key.get(Field::NwDst) as u32);
            (false, proto, l4, src, dst)
        }
        ETH_TYPE_IPV6 => {
            if byte(l3, 0).ok_or(Untrackable::Truncated)? >> 4 != 6 {
                return Err(Untrackable::BadHeader);
            }
            let plen = usize::from(be16(l3, 4).ok_or(Untrackable::Truncated)?);
            if plen == 0 {
                // Jumbogram or empty: nothing to track.
                return Err(Untrackable::BadHeader);
            }
            let ip = l3.get(..40 + plen).ok_or(Untrackable::Truncated)?;
            let next = byte(ip, 6).ok_or(Untrackable::Truncated)?;
            let (proto, l4off) = ipv6_upper(ip, next, 40)?;
            let l4 = ip.get(l4off..).ok_or(Untrackable::Truncated)?;
            let src = key.get(Field::Ipv6Src).to_be_bytes();
            let dst = key.get(Field::Ipv6Dst).to_be_bytes();
            (true, proto, l4, src, dst)
        }
        _ => return Err(Untrackable::NotIp),
    };
    if proto != key_proto {
        return Err(Untrackable::KeyMismatch);
    }
    let mut ck = ConnKey {
        src,
        dst,
        sport: 0,
        dport: 0,
        zone,
        v6,
        proto,
        stype: 0,
        dtype: 0,
    };
    let tp_src = key.get(Field::TpSrc) as u16;
    let tp_dst = key.get(Field::TpDst) as u16;
    let kind = match proto {
        IPPROTO_TCP => {
            let doff = usize::from(byte(l4, 12).ok_or(Untrackable::Truncated)? >> 4) * 4;
            if doff < 20 {
                return Err(Untrackable::BadHeader);
            }
            let opts = l4.get(20..doff).ok_or(Untrackable::Truncated)?;
            if tp_src == 0 || tp_dst == 0 {
                return Err(Untrackable::ZeroPort);
            }
            ck.sport = tp_src;
            ck.dport = tp_dst;
            let flags = key.get(Field::TcpFlags) as u16;
            PktKind::Tcp(TcpSeg {
                flags,
                seq: be32(l4, 4).ok_or(Untrackable::Truncated)?,
                ack: be32(l4, 8).ok_or(Untrackable::Truncated)?,
                win: be16(l4, 14).ok_or(Untrackable::Truncated)?,
                wscale: if flags & tf::SYN != 0 {
                    tcp_wscale(opts)
                } else {
                    0
                },
                payload: (l4.len() - doff) as u32,
            })
        }
        IPPROTO_UDP | IPPROTO_SCTP => {
            let min = if proto == IPPROTO_UDP { 8 } else { 12 };
            if l4.len() < min {
                return Err(Untrackable::Truncated);
            }
            if proto == IPPROTO_UDP {
                let ulen = usize::from(be16(l4, 4).ok_or(Untrackable::Truncated)?);
                if ulen < 8 || ulen > l4.len() {
                    return Err(Untrackable::BadHeader);
                }
            }
            if tp_src == 0 || tp_dst == 0 {
                return Err(Untrackable::ZeroPort);
            }
            ck.sport = tp_src;
            ck.dport = tp_dst;
            PktKind::Other
        }
        IPPROTO_ICMP if !v6 => {
            if l4.len() < 8 {
                return Err(Untrackable::Truncated);
            }
            let (t, code) = (tp_src as u8, tp_dst as u8);
            match t {
                0 | 8 | 13 | 14 | 15 | 16 => {
                    if code != 0 {
                        return Err(Untrackable::UnsupportedIcmp);
                    }
                    let id = be16(l4, 4).ok_or(Untrackable::Truncated)?;
                    ck.sport = id;
                    ck.dport = id;
                    ck.stype = t;
                    ck.dtype = icmp4_reverse_query(t).ok_or(Untrackable::UnsupportedIcmp)?;
                    PktKind::IcmpQuery {
                        may_start: matches!(t, 8 | 13 | 15),
                    }
                }
                3 | 4 | 5 | 11 | 12 => {
                    ck = inner_key(l4.get(8..).ok_or(Untrackable::Truncated)?, &ck)?;
                    PktKind::Related
                }
                _ => return Err(Untrackable::UnsupportedIcmp),
            }
        }
        IPPROTO_ICMPV6 if v6 => {
            if l4.len() < 8 {
                return Err(Untrackable::Truncated);
            }
            let (t, code) = (tp_src as u8, tp_dst as u8);
            match t {
                128 | 129 => {
                    if code != 0 {
                        return Err(Untrackable::UnsupportedIcmp);
                    }
                    let id = be16(l4, 4).ok_or(Untrackable::Truncated)?;
                    ck.sport = id;
                    ck.dport = id;
                    ck.stype = t;
                    ck.dtype = icmp6_reverse_query(t).ok_or(Untrackable::UnsupportedIcmp)?;
                    PktKind::IcmpQuery {
                        may_start: t == 128,
                    }
                }
                1..=4 => {
                    ck = inner_key(l4.get(8..).ok_or(Untrackable::Truncated)?, &ck)?;
                    PktKind::Related
                }
                _ => return Err(Untrackable::UnsupportedIcmp),
            }
        }
        _ => PktKind::Other,
    };
    Ok(Pkt { key: ck, kind })
}

/// The key of the connection an ICMP error is about: the embedded header's
/// tuple, reversed (the error travels back towards the embedded packet's
/// sender, which must be the error's destination). `outer` gives the zone,
/// family and the error's destination.
fn inner_key(b: &[u8], outer: &ConnKey) -> Result<ConnKey, Untrackable> {
    let bad = |_| Untrackable::BadInner;
    let (proto, l4, src, dst) = if outer.v6 {
        if byte(b, 0).ok_or(Untrackable::BadInner)? >> 4 != 6 {
            return Err(Untrackable::BadInner);
        }
        let next = byte(b, 6).ok_or(Untrackable::BadInner)?;
        let src = addr16(b, 8).ok_or(Untrackable::BadInner)?;
        let dst = addr16(b, 24).ok_or(Untrackable::BadInner)?;
        let (proto, off) = ipv6_upper(b, next, 40).map_err(bad)?;
        (proto, b.get(off..).ok_or(Untrackable::BadInner)?, src, dst)
    } else {
        let (ihl, proto, src, dst, _, frag) = ipv4_header(b).map_err(bad)?;
        if frag & 0x1fff != 0 {
            return Err(Untrackable::BadInner);
        }
        (
            proto,
            b.get(ihl..).ok_or(Untrackable::BadInner)?,
            v4_mapped(src),
            v4_mapped(dst),
        )
    };
    if src != outer.dst {
        return Err(Untrackable::BadInner);
    }
    let mut k = ConnKey {
        src,
        dst,
        sport: 0,
        dport: 0,
        zone: outer.zone,
        v6: outer.v6,
        proto,
        stype: 0,
        dtype: 0,
    };
    // The embedded L4 header: at least the 8 bytes an ICMPv4 error must
    // carry; IPv6 errors carry more, and OVS wants a whole TCP header there.
    let min = if outer.v6 && proto == IPPROTO_TCP {
        20
    } else {
        8
    };
    match proto {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP => {
            if l4.len() < min {
                return Err(Untrackable::BadInner);
            }
            k.sport = be16(l4, 0).ok_or(Untrackable::BadInner)?;
            k.dport = be16(l4, 2).ok_or(Untrackable::BadInner)?;
            if k.sport == 0 || k.dport == 0 {
                return Err(Untrackable::BadInner);
            }
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            if (proto == IPPROTO_ICMPV6) != outer.v6 || l4.len() < 8 {
                return Err(Untrackable::BadInner);
            }
            let t = byte(l4, 0).ok_or(Untrackable::BadInner)?;
            let code = byte(l4, 1).ok_or(Untrackable::BadInner)?;
            let rev = if outer.v6 {
                icmp6_reverse_query(t)
            } else {
                icmp4_reverse_query(t)
            };
            let rev = rev.ok_or(Untrackable::BadInner)?;
            if code != 0 {
                return Err(Untrackable::BadInner);
            }
            let id = be16(l4, 4).ok_or(Untrackable::BadInner)?;
            k.sport = id;
            k.dport = id;
            k.stype = t;
            k.dtype = rev;
        }
        _ => {}
    }
    Ok(k.reverse())
}

// ---------------------------------------------------------------------------
// Per-protocol state machines
// ---------------------------------------------------------------------------

fn seq_diff(a: u32, b: u32) -> i32 {
    a.wrapping_sub(b) as i32
}

fn seq_geq(a: u32, b: u32) -> bool {
    seq_diff(a, b) >= 0
}

fn seq_gt(a: u32, b: u32) -> bool {
    seq_diff(a, b) > 0
}

/// Flag combinations no TCP stack sends.
fn tcp_flags_invalid(flags: u16) -> bool {
    let has = |f: u16| flags & f != 0;
    if has(tf::SYN) {
        if has(tf::RST) || has(tf::FIN) {
            return true;
        }
    } else if !has(tf::ACK) && !has(tf::RST) {
        return true;
    }
    !has(tf::ACK) && (has(tf::FIN) || has(tf::PSH) || has(tf::URG))
}

fn tcp_new(seg: &TcpSeg) -> [TcpPeer; 2] {
    let mut src = TcpPeer {
        seqlo: seg.seq,
        seqhi: 0,
        max_win: 0,
        wscale: 0,
        state: TcpState::SynSent,
    };
    let mut dst = TcpPeer {
        seqlo: 0,
        seqhi: 1,
        max_win: 1,
        wscale: 0,
        state: TcpState::Closed,
    };
    src.seqhi = seg.seq.wrapping_add(seg.payload).wrapping_add(1);
    if seg.flags & tf::SYN != 0 {
        src.seqhi = src.seqhi.wrapping_add(1);
        src.wscale = seg.wscale;
    } else {
        src.wscale = WS_UNKNOWN;
        dst.wscale = WS_UNKNOWN;
        // Picked up mid-stream: the other side is unknown until it is
        // seen. Its position is what this segment acks, and both
        // directions get a maximal window meanwhile, so that this side
        // may go on sending (and retransmitting) while the other is
        // silent, e.g. while a policy drops its packets.
        if seg.flags & tf::ACK != 0 {
            dst.seqlo = seg.ack;
        }
        dst.max_win = u32::from(u16::MAX);
        src.seqhi = src
            .seqhi
            .wrapping_add(u32::from(u16::MAX) << TCP_MAX_WSCALE);
    }
    src.max_win = u32::from(seg.win).max(1);
    let sws = src.wscale & WS_MASK;
    if sws != 0 {
        src.max_win = src.max_win.div_ceil(1 << sws);
    }
    if seg.flags & tf::FIN != 0 {
        src.seqhi = src.seqhi.wrapping_add(1);
    }
    [src, dst]
}

/// Runs a segment through the connection's TCP state; returns the result and
/// the timeout to apply (if the expiration moves).
fn tcp_update(
    peers: &mut [TcpPeer; 2],
    seg: &TcpSeg,
    reply: bool,
    seq_check: bool,
) -> (Update, Option<Tm>) {
    use TcpState as S;
    let flags = seg.flags;
    let has = |f: u16| flags & f != 0;
    if tcp_flags_invalid(flags) {
        return (Update::Invalid, None);
    }
    let [p0, p1] = peers;
    let (src, dst) = if reply { (p1, p0) } else { (p0, p1) };

    if flags & (tf::SYN | tf::ACK) == tf::SYN {
        if src.state >= S::FinWait2 && dst.state >= S::FinWait2 {
            src.state = S::Closed;
            dst.state = S::Closed;
            return (Update::New, None);
        }
        if src.state <= S::SynSent {
            src.state = S::SynSent;
            return (Update::ValidNew, Some(Tm::TcpFirstPacket));
        }
    }

    let syn = has(tf::SYN);
    let (mut sws, mut dws) = (0u32, 0u32);
    // How far an ack may run ahead of the data seen from the other side.
    let mut ack_lead = MAX_ACK_WINDOW;
    if !syn {
        if src.wscale & WS_FLAG != 0 && dst.wscale & WS_FLAG != 0 {
            sws = u32::from(src.wscale & WS_MASK);
            dws = u32::from(dst.wscale & WS_MASK);
        } else if src.wscale & WS_UNKNOWN != 0 && dst.wscale & WS_UNKNOWN != 0 {
            sws = u32::from(TCP_MAX_WSCALE);
            dws = u32::from(TCP_MAX_WSCALE);
            // Picked up mid-stream: the other side may have sent up to a
            // (maximally scaled) window of data before the pickup, which
            // this side acks but the tracker never saw.
            ack_lead = MAX_ACK_WINDOW << dws;
        }
    }

    let mut win = u32::from(seg.win);
    let orig_seq = seg.seq;
    let mut seq = seg.seq;
    let mut ack = seg.ack;
    let mut end = seq.wrapping_add(seg.payload);
    let mut check_ackskew = true;
    if syn {
        end = end.wrapping_add(1);
    }
    if has(tf::FIN) {
        end = end.wrapping_add(1);
    }
    if src.state < S::SynSent {
        // First packet from this side (normally the SYN-ACK).
        if syn && dst.wscale & WS_FLAG != 0 {
            src.wscale = seg.wscale;
            if src.wscale & WS_FLAG != 0 {
                sws = u32::from(src.wscale & WS_MASK);
                win = win.div_ceil(1 << sws);
                dws = u32::from(dst.wscale & WS_MASK);
            } else {
                // The other side offered scaling but this side did not: no
                // scaling at all, so the other side's window is unscaled.
                dst.max_win <<= dst.wscale & WS_MASK;
                dst.wscale = 0;
            }
        }
        src.seqlo = seq;
        src.state = S::SynSent;
        let reach = end.wrapping_add((dst.max_win << dws).max(1));
        if src.seqhi == 1 || seq_geq(reach, src.seqhi) {
            src.seqhi = reach;
            check_ackskew = false;
        }
        if win > src.max_win {
            src.max_win = win;
        }
    }

    if !has(tf::ACK) || (ack == 0 && has(tf::RST)) {
        // No ack to check (or a stack that sends RST|ACK with ack 0).
        ack = dst.seqlo;
    }
    if seq == end {
        // No data: only the ack matters.
        seq = src.seqlo;
        end = seq;
    }
    let ackskew = if check_ackskew {
        i64::from(seq_diff(dst.seqlo, ack))
    } else {
        0
    };
    let rst_ok = !has(tf::RST)
        || orig_seq == src.seqlo
        || orig_seq == src.seqlo.wrapping_add(1)
        || orig_seq.wrapping_add(1) == src.seqlo;
    let in_window = seq_geq(src.seqhi, end)
        && seq_geq(seq, src.seqlo.wrapping_sub(dst.max_win << dws))
        && ackskew >= -ack_lead
        && ackskew <= MAX_ACK_WINDOW << sws
        && rst_ok;

    let slide = |src: &mut TcpPeer, dst: &mut TcpPeer| {
        if src.max_win < win {
            src.max_win = win;
        }
        if seq_gt(end, src.seqlo) {
            src.seqlo = end;
        }
        let w = win << sws;
        if seq_geq(ack.wrapping_add(w), dst.seqhi) {
            dst.seqhi = ack.wrapping_add(w.max(1));
        }
    };

    if in_window || !seq_check {
        slide(src, dst);
        if has(tf::FIN) && src.state < S::Closing {
            src.state = S::Closing;
        }
        if has(tf::ACK) {
            if dst.state == S::SynSent {
                dst.state = S::Established;
            } else if dst.state == S::Closing {
                dst.state = S::FinWait2;
            }
        }
        if has(tf::RST) {
            src.state = S::TimeWait;
            dst.state = S::TimeWait;
        }
        let tm = if src.state >= S::FinWait2 && dst.state >= S::FinWait2 {
            Tm::TcpClosed
        } else if src.state >= S::Closing && dst.state >= S::Closing {
            Tm::TcpFinWait
        } else if src.state < S::Established || dst.state < S::Established {
            Tm::TcpOpening
        } else if src.state >= S::Closing || dst.state >= S::Closing {
            Tm::TcpClosing
        } else {
            Tm::TcpEstablished
        };
        return (Update::Valid, Some(tm));
    }
    // Looser acceptance while the other side has not answered yet (SYNs
    // shotgunned before the peer replies) or after the close (stray FINs and
    // ACKs): within a maximal window of what this side sent. The expiration
    // does not move, so a flood of these cannot keep a connection alive.
    if (dst.state < S::SynSent || dst.state >= S::FinWait2 || src.state >= S::FinWait2)
        && seq_geq(src.seqhi.wrapping_add(MAX_ACK_WINDOW as u32), end)
        && seq_geq(seq, src.seqlo.wrapping_sub(MAX_ACK_WINDOW as u32))
    {
        slide(src, dst);
        if has(tf::FIN) && src.state < S::Closing {
            src.state = S::Closing;
        }
        if has(tf::RST) {
            src.state = S::TimeWait;
            dst.state = S::TimeWait;
        }
        return (Update::Valid, None);
    }
    (Update::Invalid, None)
}

fn other_update(st: &mut OtherState, reply: bool) -> (Update, Tm) {
    if reply {
        *st = OtherState::Bidir;
    } else if *st == OtherState::First {
        *st = OtherState::Multiple;
    }
    match st {
        OtherState::Bidir => (Update::Valid, Tm::OtherBidir),
        OtherState::Multiple => (Update::ValidNew, Tm::OtherMultiple),
        OtherState::First => (Update::ValidNew, Tm::OtherFirst),
    }
}

fn icmp_update(st: &mut IcmpState, reply: bool) -> (Update, Tm) {
    if reply {
        *st = IcmpState::Reply;
    }
    match st {
        IcmpState::Reply => (Update::Valid, Tm::IcmpReply),
        IcmpState::First => (Update::ValidNew, Tm::IcmpFirst),
    }
}

// ---------------------------------------------------------------------------
// The tracker
// ---------------------------------------------------------------------------

/// Why a commit was refused (the packet is `+inv`; the datapath drops it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtRefusal {
    /// The ingress port owns its limit of connections.
    PortLimit,
    /// The table is full and nothing near the new connection's hash could
    /// be dropped early.
    TableFull,
}

/// One port's connection limit, count and refusals
/// ([`Conntrack::port_limits`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtPortLimit {
    /// OpenFlow port.
    pub port: u32,
    /// The limit in force (0: none).
    pub limit: u32,
    /// Whether `limit` was set for this port (else it is the default).
    pub explicit: bool,
    /// Connections it owns now (expired ones not yet removed included).
    pub count: u32,
    /// Commits from it refused by its limit (only grows while the port
    /// exists).
    pub refused: u64,
}

/// Per-port bookkeeping.
#[derive(Clone, Copy, Debug, Default)]
struct PortCt {
    count: u32,
    limit: Option<u32>,
    refused: u64,
}

/// A new connection waiting for its packet's fate ("Staged commits").
#[derive(Clone, Copy, Debug)]
struct Staged {
    pkt: Pkt,
    owner: u32,
    mark: u32,
    label: u128,
    /// The slot admission chose to drop early, if the table was full.
    victim: Option<u32>,
}

/// Most commits one packet can stage; more are applied at once.
const MAX_STAGED: usize = 4;

/// Slots a commit into a full table examines for an expired or unreplied
/// connection to drop (Linux scans the new entry's hash bucket).
const EARLY_DROP_SCAN: usize = 64;

/// Slots swept for expired connections when a port hits its limit, so
/// that a port whose old connections expired is not refused until the
/// background sweep gets there (bounded work per refused packet).
const LIMIT_RECLAIM_SCAN: usize = 64;

/// A connection tracker (one per switch; callers serialise access).
#[derive(Debug)]
pub struct Conntrack {
    config: CtConfig,
    /// Connection storage; `None` slots are on `free`.
    slots: Vec<Option<Conn>>,
    free: Vec<u32>,
    /// Canonical key -> slot index.
    map: HashMap<ConnKey, u32>,
    /// Next slot [`Conntrack::expire_some`] / [`Conntrack::sweep`] looks at.
    cursor: usize,
    stats: CtStats,
    /// Connections owned, limits and refusals, by port.
    ports: HashMap<u32, PortCt>,
    /// New connections of the packet being processed, not yet in the table
    /// (`staged[..n_staged]`).
    staged: [Option<Staged>; MAX_STAGED],
    n_staged: usize,
    /// Reassembles IP fragments for the tracker (the datapath offers
    /// fragments here before `ct`; see [`crate::ipf`]).
    ipf: Ipf,
}

impl Default for Conntrack {
    fn default() -> Self {
        Conntrack::new(CtConfig::default())
    }
}

impl Conntrack {
    pub fn new(config: CtConfig) -> Self {
        Conntrack {
            ipf: Ipf::new(config.ipf),
            config,
            slots: Vec::new(),
            free: Vec::new(),
            map: HashMap::new(),
            cursor: 0,
            stats: CtStats::default(),
            ports: HashMap::new(),
            staged: [None; MAX_STAGED],
            n_staged: 0,
        }
    }

    /// The fragment reassembler that serves this tracker.
    pub fn ipf(&self) -> &Ipf {
        &self.ipf
    }

    /// The fragment reassembler, to offer it fragments.
    pub fn ipf_mut(&mut self) -> &mut Ipf {
        &mut self.ipf
    }

    /// The configuration.
    pub fn config(&self) -> &CtConfig {
        &self.config
    }

    /// Tracks one packet: `frame` is the whole Ethernet frame as it is now,
    /// `key` its flow key (extracted from that frame). A new connection is
    /// stored at once (see [`Conntrack::execute_staged`] for the
    /// datapath's way). Never panics, never allocates except to store a
    /// newly committed connection.
    pub fn execute(&mut self, frame: &[u8], key: &FlowKey, p: &CtParams, now_ns: u64) -> CtVerdict {
        let v = match self.execute_staged(frame, key, p, now_ns) {
            Ok(v) => v,
            Err(_) => CtVerdict {
                state: ct_state::TRK | ct_state::INV,
                zone: p.zone,
                mark: 0,
                label: 0,
            },
        };
        self.commit_staged(now_ns);
        v
    }

    /// Tracks one packet like [`Conntrack::execute`], but a connection it
    /// commits is only staged: it enters the table at
    /// [`Conntrack::commit_staged`], called when the packet has left the
    /// pipeline, or never, at [`Conntrack::discard_staged`], when the
    /// pipeline dropped it (module doc, "Staged commits"). The verdict is
    /// the same either way. `Err` if the commit was refused (per-port
    /// limit, or a full table with nothing to drop early): the packet is
    /// `+trk+inv` and the datapath drops it, as Linux and the OVS kernel
    /// datapath drop a packet whose connection cannot be created.
    /// Commits of existing connections (mark, label) apply at once.
    pub fn execute_staged(
        &mut self,
        frame: &[u8],
        key: &FlowKey,
        p: &CtParams,
        now_ns: u64,
    ) -> Result<CtVerdict, CtRefusal> {
        use ct_state::{EST, INV, NEW, REL, RPL, TRK};
        self.stats.packets_total += 1;
        let mut verdict = CtVerdict {
            state: TRK,
            zone: p.zone,
            mark: 0,
            label: 0,
        };
        let pkt = match parse(frame, key, p.zone) {
            Ok(pkt) => pkt,
            Err(_) => {
                verdict.state |= INV;
                self.stats.invalid_total += 1;
                return Ok(verdict);
            }
        };
        let commit = p.commit || p.force;
        let related = matches!(pkt.kind, PktKind::Related);

        let mut found = self.lookup(&pkt.key, now_ns);
        if let (true, Some((idx, true))) = (p.force, found) {
            self.remove(idx);
            self.stats.deleted_total += 1;
            found = None;
        }

        let mut state = 0;
        let mut conn_idx = None;
        let mut create = false;
        match found {
            Some((idx, reply)) if related => {
                conn_idx = Some(idx);
                state = REL | if reply { RPL } else { 0 };
            }
            Some((idx, reply)) => {
                conn_idx = Some(idx);
                match self.update(idx, &pkt, reply, now_ns) {
                    Update::Valid => state = EST | if reply { RPL } else { 0 },
                    Update::ValidNew => state = NEW,
                    Update::Invalid => state = INV,
                    Update::New => {
                        self.remove(idx);
                        self.stats.deleted_total += 1;
                        conn_idx = None;
                        create = true;
                    }
                }
            }
            None if related => state = INV,
            None => create = true,
        }

        if create {
            if !self.valid_new(&pkt) {
                state = INV;
            } else {
                state = NEW;
                if commit {
                    let owner = key.get(Field::InPort) as u32;
                    let victim = match self.admit(&pkt.key, owner, now_ns) {
                        Ok(victim) => victim,
                        Err(r) => {
                            self.stats.invalid_total += 1;
                            return Err(r);
                        }
                    };
                    let staged = Staged {
                        pkt,
                        owner,
                        mark: p.mark.map_or(0, |(v, m)| v & m),
                        label: p.label.map_or(0, |(v, m)| v & m),
                        victim,
                    };
                    verdict.mark = staged.mark;
                    verdict.label = staged.label;
                    if self.n_staged < MAX_STAGED {
                        self.staged[self.n_staged] = Some(staged);
                        self.n_staged += 1;
                    } else {
                        self.apply(staged, now_ns);
                    }
                }
            }
        }

        if let Some(conn) = conn_idx
            .and_then(|i| self.slots.get_mut(i as usize))
            .and_then(Option::as_mut)
        {
            if commit && state & INV == 0 {
                if let Some((v, m)) = p.mark {
                    conn.mark = (conn.mark & !m) | (v & m);
                }
                if let Some((v, m)) = p.label {
                    conn.label = (conn.label & !m) | (v & m);
                }
            }
            verdict.mark = conn.mark;
            verdict.label = conn.label;
        }
        if state & INV != 0 {
            self.stats.invalid_total += 1;
        }
        verdict.state |= state;
        Ok(verdict)
    }

    /// Whether commits wait for [`Conntrack::commit_staged`] or
    /// [`Conntrack::discard_staged`].
    #[inline]
    pub fn has_staged(&self) -> bool {
        self.n_staged != 0
    }

    /// The packet that staged commits left the pipeline (was output or
    /// sent to the controller): its new connections enter the table.
    pub fn commit_staged(&mut self, now_ns: u64) {
        for i in 0..std::mem::take(&mut self.n_staged) {
            if let Some(s) = self.staged[i].take() {
                self.apply(s, now_ns);
            }
        }
    }

    /// The packet that staged commits was dropped: its new connections are
    /// forgotten (counted in [`CtStats::commits_discarded_total`]).
    pub fn discard_staged(&mut self) {
        for i in 0..std::mem::take(&mut self.n_staged) {
            if self.staged[i].take().is_some() {
                self.stats.commits_discarded_total += 1;
            }
        }
    }

    /// Admission of a new connection owned by `owner`: `Ok(victim)` with
    /// the slot to drop early if the table is full. Bounded work.
    fn admit(&mut self, key: &ConnKey, owner: u32, now_ns: u64) -> Result<Option<u32>, CtRefusal> {
        let limit = self.limit_of(owner);
        if limit != 0 {
            let staged_here = self.staged[..self.n_staged]
                .iter()
                .flatten()
                .filter(|s| s.owner == owner)
                .count() as u32;
            let count = |ct: &Self| ct.ports.get(&owner).map_or(0, |p| p.count) + staged_here;
            if count(self) >= limit {
                // Maybe some of its connections expired: sweep a little
                // before refusing.
                self.sweep(now_ns, LIMIT_RECLAIM_SCAN);
                if count(self) >= limit {
                    self.ports.entry(owner).or_default().refused += 1;
                    self.stats.limit_refused_total += 1;
                    return Err(CtRefusal::PortLimit);
                }
            }
        }
        if self.map.len() + self.n_staged < self.config.max_entries {
            return Ok(None);
        }
        match self.early_drop_candidate(key, now_ns) {
            Some(victim) => Ok(Some(victim)),
            None => {
                self.stats.table_full_total += 1;
                Err(CtRefusal::TableFull)
            }
        }
    }

    /// The limit in force for `port` (0: none).
    fn limit_of(&self, port: u32) -> u32 {
        match self.ports.get(&port).and_then(|p| p.limit) {
            Some(l) => l,
            None => self.config.port_limit,
        }
    }

    /// A slot to drop for a new connection with `key` in a full table:
    /// among [`EARLY_DROP_SCAN`] slots from a place the key's hash picks,
    /// the first expired connection, else the first unreplied one (not
    /// assured), else none; never a slot another staged commit chose.
    /// Reads only.
    fn early_drop_candidate(&self, key: &ConnKey, now_ns: u64) -> Option<u32> {
        use std::hash::BuildHasher;
        let n = self.slots.len();
        if n == 0 {
            return None;
        }
        let start = (self.map.hasher().hash_one(key.canonical()) % n as u64) as usize;
        let mut unreplied = None;
        for i in 0..EARLY_DROP_SCAN.min(n) {
            let idx = (start + i) % n;
            let Some(Some(c)) = self.slots.get(idx) else {
                continue;
            };
            if self.staged[..self.n_staged]
                .iter()
                .flatten()
                .any(|s| s.victim == Some(idx as u32))
            {
                continue;
            }
            if now_ns >= c.expiration_ns {
                return Some(idx as u32);
            }
            if unreplied.is_none() && !c.assured() {
                unreplied = Some(idx as u32);
            }
        }
        unreplied
    }

    /// Stores a staged connection (admission already passed): drops its
    /// victim first if the table is (still) full.
    fn apply(&mut self, s: Staged, now_ns: u64) {
        let canon = s.pkt.key.canonical();
        if let Some(&idx) = self.map.get(&canon) {
            // The same packet committed it twice: the second commit only
            // adds its mark and label, as on an existing connection.
            if let Some(Some(c)) = self.slots.get_mut(idx as usize) {
                c.mark |= s.mark;
                c.label |= s.label;
            }
            return;
        }
        if self.map.len() >= self.config.max_entries {
            let victim = s
                .victim
                .filter(|&v| {
                    matches!(self.slots.get(v as usize), Some(Some(c))
                        if now_ns >= c.expiration_ns || !c.assured())
                })
                .or_else(|| self.early_drop_candidate(&s.pkt.key, now_ns));
            match victim {
                Some(v) => self.drop_early(v, now_ns),
                None => {
                    self.stats.table_full_total += 1;
                    return;
                }
            }
        }
        if let Some(idx) = self.insert(&s.pkt, s.owner, now_ns) {
            if let Some(Some(c)) = self.slots.get_mut(idx as usize) {
                c.mark = s.mark;
                c.label = s.label;
            }
        }
    }

    /// Removes `idx` to make room: counted as expired if it was, else as an
    /// early drop.
    fn drop_early(&mut self, idx: u32, now_ns: u64) {
        let expired = match self.slots.get(idx as usize) {
            Some(Some(c)) => now_ns >= c.expiration_ns,
            _ => return,
        };
        self.remove(idx);
        if expired {
            self.stats.expired_total += 1;
        } else {
            self.stats.early_drop_total += 1;
        }
    }

    /// Finds the live connection `key` belongs to: (slot, is reply direction).
    /// An expired connection met here is removed.
    fn lookup(&mut self, key: &ConnKey, now_ns: u64) -> Option<(u32, bool)> {
        let idx = *self.map.get(&key.canonical())?;
        let conn = self.slots.get(idx as usize)?.as_ref()?;
        let reply = conn.orig != *key;
        if now_ns >= conn.expiration_ns {
            self.remove(idx);
            self.stats.expired_total += 1;
            return None;
        }
        Some((idx, reply))
    }

    fn valid_new(&self, pkt: &Pkt) -> bool {
        match pkt.kind {
            PktKind::Tcp(seg) => {
                let f = seg.flags;
                // Never a SYN-ACK: a connection starts at its beginning
                // (a SYN) or, when loose, anywhere but half-way through
                // the handshake.
                let syn_ack = f & (tf::SYN | tf::ACK) == tf::SYN | tf::ACK;
                !tcp_flags_invalid(f) && !syn_ack && (self.config.tcp_loose || f & tf::SYN != 0)
            }
            PktKind::IcmpQuery { may_start } => may_start,
            PktKind::Related => false,
            PktKind::Other => true,
        }
    }

    fn update(&mut self, idx: u32, pkt: &Pkt, reply: bool, now_ns: u64) -> Update {
        let timeouts = self.config.timeouts;
        let seq_check = self.config.tcp_seq_check;
        let Some(conn) = self.slots.get_mut(idx as usize).and_then(Option::as_mut) else {
            return Update::Invalid;
        };
        let (res, tm) = match (&mut conn.l4, pkt.kind) {
            (L4State::Tcp(peers), PktKind::Tcp(seg)) => {
                // `+inv` never changes a connection: `tcp_update` sets up a
                // side at its first segment before the window check, so
                // undo that when the segment then fails it (found by the
                // `conntrack` fuzz target).
                let before = *peers;
                let r = tcp_update(peers, &seg, reply, seq_check);
                if matches!(r.0, Update::Invalid) {
                    *peers = before;
                }
                r
            }
            (L4State::Icmp(st), _) => {
                let (r, tm) = icmp_update(st, reply);
                (r, Some(tm))
            }
            (L4State::Other(st), _) => {
                let (r, tm) = other_update(st, reply);
                (r, Some(tm))
            }
            // A TCP connection key with a non-TCP packet cannot happen (the
            // protocol is part of the key).
            (L4State::Tcp(_), _) => (Update::Invalid, None),
        };
        if let Some(tm) = tm {
            conn.expiration_ns = timeouts.deadline(tm, now_ns);
        }
        res
    }

    /// Stores a new connection with `pkt` as its original direction, owned
    /// by `owner`, or `None` if the table is full (the caller made room).
    fn insert(&mut self, pkt: &Pkt, owner: u32, now_ns: u64) -> Option<u32> {
        if self.map.len() >= self.config.max_entries {
            return None;
        }
        let (l4, tm) = match pkt.kind {
            PktKind::Tcp(seg) => (L4State::Tcp(tcp_new(&seg)), Tm::TcpFirstPacket),
            PktKind::IcmpQuery { .. } => (L4State::Icmp(IcmpState::First), Tm::IcmpFirst),
            PktKind::Other | PktKind::Related => {
                (L4State::Other(OtherState::First), Tm::OtherFirst)
            }
        };
        let conn = Conn {
            orig: pkt.key,
            mark: 0,
            expiration_ns: self.config.timeouts.deadline(tm, now_ns),
            label: 0,
            l4,
            owner,
        };
        let idx = self.store(conn)?;
        self.map.insert(pkt.key.canonical(), idx);
        self.charge(owner);
        self.stats.committed_total += 1;
        Some(idx)
    }

    /// Puts `conn` in a free slot (growing the slab within the bound).
    fn store(&mut self, conn: Conn) -> Option<u32> {
        Some(match self.free.pop() {
            Some(i) => {
                *self.slots.get_mut(i as usize)? = Some(conn);
                i
            }
            None => {
                if self.slots.len() == self.slots.capacity() {
                    // Grow geometrically but never past the bound.
                    let want = (self.slots.len() * 2)
                        .max(16)
                        .min(self.config.max_entries.max(1));
                    self.slots
                        .reserve_exact(want.saturating_sub(self.slots.len()));
                    // Room for every slot on the free list, so that removing
                    // (also from the per-packet path) never allocates.
                    let free_room = self.slots.capacity().saturating_sub(self.free.len());
                    self.free.reserve_exact(free_room);
                }
                self.slots.push(Some(conn));
                (self.slots.len() - 1) as u32
            }
        })
    }

    /// One more connection owned by `owner`.
    fn charge(&mut self, owner: u32) {
        if owner != NO_OWNER {
            let p = self.ports.entry(owner).or_default();
            p.count = p.count.saturating_add(1);
        }
    }

    fn remove(&mut self, idx: u32) {
        if let Some(conn) = self.slots.get_mut(idx as usize).and_then(Option::take) {
            self.map.remove(&conn.orig.canonical());
            self.free.push(idx);
            if let Some(p) = self.ports.get_mut(&conn.owner) {
                p.count = p.count.saturating_sub(1);
            }
        }
    }

    /// Number of stored connections (expired ones not yet removed included).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no connection is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Counters.
    pub fn stats(&self) -> CtStats {
        CtStats {
            entries: self.map.len(),
            ..self.stats
        }
    }

    // -- Per-port limits ----------------------------------------------------

    /// The limit of ports without one of their own (0: none).
    pub fn default_port_limit(&self) -> u32 {
        self.config.port_limit
    }

    /// Sets the limit of ports without one of their own (0: none). Ports
    /// already over it keep their connections; their new ones are refused
    /// until they are below it.
    pub fn set_default_port_limit(&mut self, limit: u32) {
        self.config.port_limit = limit;
    }

    /// Sets `port`'s own limit (`Some(0)`: none), or `None` to go back to
    /// the default.
    pub fn set_port_limit(&mut self, port: u32, limit: Option<u32>) {
        match limit {
            Some(l) => self.ports.entry(port).or_default().limit = Some(l),
            None => {
                if let Some(p) = self.ports.get_mut(&port) {
                    p.limit = None;
                }
            }
        }
    }

    /// `port`'s limit, count and refusals.
    pub fn port_limit(&self, port: u32) -> CtPortLimit {
        let p = self.ports.get(&port).copied().unwrap_or_default();
        CtPortLimit {
            port,
            limit: p.limit.unwrap_or(self.config.port_limit),
            explicit: p.limit.is_some(),
            count: p.count,
            refused: p.refused,
        }
    }

    /// Every port that owns connections, has its own limit or had commits
    /// refused, by port number.
    pub fn port_limits(&self) -> Vec<CtPortLimit> {
        let mut v: Vec<CtPortLimit> = self.ports.keys().map(|&p| self.port_limit(p)).collect();
        v.sort_by_key(|p| p.port);
        v
    }

    /// `port` was deleted: up to `max_slots` slots from `start`, its
    /// connections stop counting against it (they stay until they expire);
    /// returns where to go on, `None` when done, and then its limit and
    /// refusal counter are forgotten too, so that a new port with the same
    /// number starts afresh. Call repeatedly (each call under the lock)
    /// from 0; see [`Conntrack::flush_slice`] for the semantics of a scan
    /// in slices.
    pub fn disown_port_slice(
        &mut self,
        port: u32,
        start: usize,
        max_slots: usize,
    ) -> Option<usize> {
        let end = start.saturating_add(max_slots).min(self.slots.len());
        for slot in self.slots.iter_mut().take(end).skip(start).flatten() {
            if slot.owner == port {
                slot.owner = NO_OWNER;
                if let Some(p) = self.ports.get_mut(&port) {
                    p.count = p.count.saturating_sub(1);
                }
            }
        }
        if end < self.slots.len() {
            return Some(end);
        }
        if self.ports.get(&port).is_some_and(|p| p.count == 0) {
            self.ports.remove(&port);
        }
        None
    }

    // -- Expiry and reclaim -------------------------------------------------

    /// Removes every connection that has expired at `now_ns`; returns how many.
    /// Work is proportional to the number of slots ever used.
    pub fn expire(&mut self, now_ns: u64) -> usize {
        self.cursor = 0;
        self.expire_some(now_ns, self.slots.len())
    }

    /// Examines at most `max_slots` slots, continuing where the previous call
    /// stopped (wrapping around), and removes the expired connections found;
    /// returns how many. Calling it regularly with a small budget spreads the
    /// cleanup over time.
    pub fn expire_some(&mut self, now_ns: u64, max_slots: usize) -> usize {
        self.scan(now_ns, max_slots, false)
    }

    /// The background sweep ([`crate::datapath`] runs it with every batch):
    /// [`Conntrack::expire_some`], and while the table is more than 95 %
    /// full also drops the connections that are not assured or are closing
    /// (Linux's `gc_worker` early drop), so that a commit rarely meets a
    /// full table. Returns how many it removed.
    pub fn sweep(&mut self, now_ns: u64, max_slots: usize) -> usize {
        let crowded =
            self.map.len().saturating_mul(20) > self.config.max_entries.saturating_mul(19);
        self.scan(now_ns, max_slots, crowded)
    }

    fn scan(&mut self, now_ns: u64, max_slots: usize, reclaim: bool) -> usize {
        let n = self.slots.len();
        if n == 0 {
            return 0;
        }
        let mut removed = 0;
        for _ in 0..max_slots.min(n) {
            if self.cursor >= n {
                self.cursor = 0;
            }
            let idx = self.cursor;
            self.cursor += 1;
            if let Some(Some(conn)) = self.slots.get(idx) {
                if now_ns >= conn.expiration_ns {
                    self.remove(idx as u32);
                    self.stats.expired_total += 1;
                    removed += 1;
                } else if reclaim && conn.reclaimable() {
                    self.remove(idx as u32);
                    self.stats.early_drop_total += 1;
                    removed += 1;
                }
            }
        }
        removed
    }

    // -- Dumps and flushes --------------------------------------------------

    /// Removes all connections, or those of one zone; returns how many.
    /// Work is proportional to the table: a caller that must not hold its
    /// lock that long uses [`Conntrack::flush_slice`].
    pub fn flush(&mut self, zone: Option<u16>) -> usize {
        let mut removed = 0;
        let mut at = Some(0);
        while let Some(start) = at {
            let (n, next) = self.flush_slice(zone, start, usize::MAX);
            removed += n;
            at = next;
        }
        removed
    }

    /// Removes the connections (all, or those of one zone) in up to
    /// `max_slots` slots from `start`; returns how many, and where to go on
    /// (`None`: done). Flushing in slices, the lock released in between:
    /// every connection that exists for the whole flush is removed;
    /// connections committed meanwhile may survive (if their slot was
    /// already passed), so a flush ends with the table empty only if
    /// nothing was committed while it ran.
    pub fn flush_slice(
        &mut self,
        zone: Option<u16>,
        start: usize,
        max_slots: usize,
    ) -> (usize, Option<usize>) {
        let end = start.saturating_add(max_slots).min(self.slots.len());
        let mut removed = 0;
        for idx in start..end {
            let hit = match self.slots.get(idx) {
                Some(Some(conn)) => zone.is_none() || zone == Some(conn.orig.zone),
                _ => false,
            };
            if hit {
                self.remove(idx as u32);
                removed += 1;
            }
        }
        self.stats.deleted_total += removed as u64;
        (removed, (end < self.slots.len()).then_some(end))
    }

    /// A snapshot of every stored connection, in storage order (expired ones
    /// not yet removed included: compare `expiration_ns` with the time).
    /// Work and memory are proportional to the table: a caller that must
    /// not hold its lock that long uses [`Conntrack::entries_slice`].
    pub fn entries(&self) -> Vec<CtEntry> {
        let mut out = Vec::with_capacity(self.len());
        self.entries_slice(None, 0, usize::MAX, &mut out);
        out
    }

    /// Appends to `out` the connections (all, or those of one zone) in up
    /// to `max_slots` slots from `start`; returns where to go on (`None`:
    /// done). A dump in slices, the lock released in between, reports every
    /// connection that exists for the whole dump exactly once, each as it
    /// was when its slice was read; connections committed or removed
    /// meanwhile may or may not appear (a slot's connection never moves,
    /// so nothing is reported twice unless it was removed and committed
    /// again). This is what Linux's `conntrack -L` (a netlink dump bucket
    /// by bucket) promises too.
    pub fn entries_slice(
        &self,
        zone: Option<u16>,
        start: usize,
        max_slots: usize,
        out: &mut Vec<CtEntry>,
    ) -> Option<usize> {
        let end = start.saturating_add(max_slots).min(self.slots.len());
        let slots = self.slots.get(start..end).unwrap_or_default();
        out.extend(
            slots
                .iter()
                .flatten()
                .filter(|c| zone.is_none() || zone == Some(c.orig.zone))
                .map(|c| {
                    let tcp_states = match c.l4 {
                        L4State::Tcp([o, r]) => Some((o.state, r.state)),
                        _ => None,
                    };
                    CtEntry {
                        proto: c.orig.proto,
                        orig: c.orig.tuple(),
                        reply: c.orig.reverse().tuple(),
                        zone: c.orig.zone,
                        mark: c.mark,
                        label: c.label,
                        tcp_state: tcp_states.map(|(o, r)| TcpState::coalesce(o, r)),
                        tcp_states,
                        expiration_ns: c.expiration_ns,
                        owner: (c.owner != NO_OWNER).then_some(c.owner),
                    }
                }),
        );
        (end < self.slots.len()).then_some(end)
    }

    /// Memory one connection costs at most: its slot, its map entry (key,
    /// index, control byte), its free-list entry. Hash-map load factor slack
    /// comes on top (at most 2x for the map part).
    pub fn bytes_per_entry() -> usize {
        std::mem::size_of::<Option<Conn>>()
            + std::mem::size_of::<(ConnKey, u32)>()
            + 1
            + std::mem::size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_is_direction_free() {
        let k = ConnKey {
            src: v4_mapped(0x0a00_0002),
            dst: v4_mapped(0x0a00_0001),
            sport: 80,
            dport: 1234,
            zone: 3,
            v6: false,
            proto: IPPROTO_TCP,
            stype: 0,
            dtype: 0,
        };
        assert_eq!(k.canonical(), k.reverse().canonical());
        assert_eq!(k.reverse().reverse(), k);
        let icmp = ConnKey {
            proto: IPPROTO_ICMP,
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
