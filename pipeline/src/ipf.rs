//! IP fragment reassembly for connection tracking, with the behaviour of
//! Open vSwitch's userspace `ipf` and Linux's `ip_fragment.c`/`reassembly.c`
//! (written from scratch against RFC 791, RFC 8200, RFC 1858, RFC 5722 and
//! RFC 7112).
//!
//! # What it does
//!
//! Conntrack needs whole datagrams: a later fragment has no ports, and a
//! first fragment alone says nothing about what follows. [`Ipf::add`] takes
//! one IPv4 or IPv6 fragment (a whole Ethernet frame, up to
//! [`MAX_VLAN_TAGS`](crate::wire::ethernet::MAX_VLAN_TAGS) VLAN tags, its
//! [`FlowKey`], the conntrack zone and the caller's monotonic time) and
//! answers with an [`IpfOutcome`]:
//!
//! * [`IpfOutcome::Held`]: a copy of the frame is stored; the caller must not
//!   forward the original now (it comes back inside [`Completed`]).
//! * [`IpfOutcome::Completed`]: this fragment completed its datagram. The
//!   [`Completed`] owns the reassembled frame (for conntrack and the
//!   pipeline) and every stored fragment frame exactly as received (to
//!   forward unchanged once the datagram's verdict is known, as OVS does),
//!   in received order ([`Completed::fragments`]) or offset order
//!   ([`Completed::fragments_by_offset`]). Hand it back with
//!   [`Ipf::recycle`] so its buffers are reused.
//! * [`IpfOutcome::Dropped`]: nothing of this frame is stored; the reason is
//!   counted. [`IpfDrop::NotAFragment`] means "not mine": the caller decides.
//!
//! Nothing here reads a clock, spawns a thread or does I/O; time only moves
//! when the caller says so. Callers serialise access (`&mut self`); there is
//! no internal locking.
//!
//! # Datagrams
//!
//! A datagram is identified by zone, address family, source and destination
//! address, IP protocol and IP identification (16 bits for IPv4, 32 bits
//! for IPv6). For IPv6 the "protocol" is the Fragment header's Next Header
//! (the first header of the fragmentable part, the same in every fragment;
//! the flow key's `nw_proto` is 44 for later fragments and cannot be used).
//!
//! The frame is parsed here (`ipf/parse.rs`) through the wire layer's
//! checked views ([`crate::wire`]); the key is only a filter (`nw_frag`
//! must say "fragment") and a cross-check (its `dl_type` must be the
//! frame's ethertype). IPv6 extension headers are walked by the wire
//! layer's one chain walk ([`crate::wire::ipv6::walk_ext`], at most
//! [`MAX_EXT_HEADERS`](crate::wire::ipv6::MAX_EXT_HEADERS) headers in all,
//! the Fragment header included, the same set and bound as the flow key):
//! the unfragmentable part up to the Fragment header, and in the first
//! fragment on past it (the whole chain and the upper-layer header must be
//! in the first fragment, RFC 7112).
//!
//! The reassembled frame is: the Ethernet header (with tags) of the fragment
//! at offset 0, its IP header, then the fragment data in offset order.
//! IPv4: the header *including options* of the first fragment, with MF and
//! the offset cleared (the reserved bit is kept), the total length set and
//! the checksum recomputed. IPv6: the fixed header and unfragmentable
//! extension headers of the first fragment, the Fragment header removed,
//! the Next Header byte that named it set to the Fragment header's Next
//! Header, and the payload length set. Ethernet padding is never copied.
//!
//! # Drop reasons ([`IpfDrop`])
//!
//! Checks on the fragment alone (nothing stored changes):
//!
//! * `not_a_fragment`: the key or the frame says it is not a fragment
//!   (including IPv6 atomic fragments, offset 0 without M, RFC 6946: they are
//!   whole datagrams), or not IPv4/IPv6.
//! * `malformed`: truncated or inconsistent headers (version, IHL, lengths,
//!   extension chain longer than the bound, a second Fragment header), the
//!   key's `dl_type` disagreeing with the frame, IPv4 DF together with MF or
//!   an offset, an empty last fragment.
//! * `bad_checksum`: IPv4 header checksum wrong ([`IpfConfig::verify_ipv4_checksum`]).
//! * `tiny_first_fragment`: the first fragment does not hold the whole L4
//!   header (TCP 20 bytes, UDP 8, ICMP/ICMPv6 8, SCTP 12; other protocols
//!   unchecked) or, for IPv6, the whole extension header chain (RFC 1858,
//!   RFC 7112); or a TCP fragment at offset 8 (RFC 1858: it can only serve
//!   to rewrite the TCP flags of a tiny first fragment).
//! * `too_small`: a non-last fragment whose payload is not a multiple of 8
//!   bytes or is shorter than [`IpfConfig::min_frag_payload`].
//! * `duplicate`: the same range with the same bytes (and the same MF) as a
//!   stored fragment. The datagram is kept. The same range with *different*
//!   bytes is an overlap.
//! * `source_limit`: a fragment that would start a new datagram beyond
//!   [`IpfConfig::max_datagrams_per_source`] for its source address (per
//!   zone and family), or hold more than
//!   [`IpfConfig::max_bytes_per_source`] for it; for a fragment of a stored
//!   datagram, the whole datagram goes (it could never complete). One
//!   sender (a pod flooding first fragments) fills at most its share, and
//!   the other senders' datagrams still reassemble.
//! * `table_full`, `memory_full`: a fragment that would start a new datagram
//!   beyond [`IpfConfig::max_datagrams`] or [`IpfConfig::max_bytes`]. The
//!   newcomer is dropped; nothing is evicted (as in Linux and OVS: eviction
//!   would let a flood of junk flush legitimate datagrams). Each `add` first
//!   expires up to two timed-out datagrams, so room comes back without
//!   waiting for [`Ipf::expire`].
//!
//! Checks that drop the *whole* datagram (the fragment and everything stored
//! for it; nothing is remembered, a later fragment starts afresh):
//!
//! * `overlap`: the fragment's range overlaps a stored one (RFC 5722;
//!   Linux does the same for IPv4 since 4.19).
//! * `length_mismatch`: a second last fragment with a different end, a last
//!   fragment ending before data already stored, or data beyond the end a
//!   last fragment set.
//! * `too_long`: the reassembled IPv4 total length or IPv6 payload length
//!   would exceed [`IpfConfig::max_datagram_len`] (checked per fragment with
//!   its own header, and again once first and last fragment are known).
//! * `too_many_fragments`: more than [`IpfConfig::max_frags_per_datagram`].
//! * `memory_full`: a fragment of an existing datagram that does not fit in
//!   [`IpfConfig::max_bytes`] (the datagram could never complete).
//!
//! Counted only ([`IpfStats::drops`]): `timeout` (fragments of datagrams
//! that expired) and `flushed` (fragments discarded by [`Ipf::flush`]).
//! Every fragment offered is counted exactly once, so
//! `fragments_total == held_fragments + fragments_reassembled_total + sum(drops)`.
//!
//! # Time
//!
//! A datagram lives [`IpfConfig::timeout_ns`] from its first fragment's
//! arrival; later fragments do not extend it (Linux and OVS alike).
//! Datagrams sit in an intrusive list in creation order: [`Ipf::expire`]
//! pops expired ones from its head (work proportional to what it removes),
//! `add` pops at most two, and a lookup that meets an expired datagram
//! discards it first. With a non-monotonic clock expiry can be late, never
//! early.
//!
//! # Memory and bounds
//!
//! [`Ipf::held_bytes`] is the sum of the stored frame lengths (what the
//! caller handed in, Ethernet padding included) and never exceeds
//! [`IpfConfig::max_bytes`]; at most [`IpfConfig::max_datagrams`] datagrams
//! and [`IpfConfig::max_frags_per_datagram`] fragments each are stored.
//! Each datagram keeps its frames back to back in one buffer plus a small
//! descriptor per fragment; the reassembled frame is built only when the
//! datagram is complete. Buffers of finished datagrams are kept for reuse
//! (at most 8 sets, each at most 128 KiB, not counted in `held_bytes`), so
//! in steady state holding a fragment is a copy into an existing buffer. The
//! datagram table is a `HashMap` with the standard library's randomly keyed
//! hasher (attackers choose the IP ids), a slab and a free list; nothing is
//! pre-sized. Per `add`: one hash lookup, a binary search over at most
//! `max_frags_per_datagram` ranges, one copy of the frame; no syscalls.
//!
//! # Defaults ([`IpfConfig::default`])
//!
//! * `max_bytes` 4 MiB: Linux's `ipfrag_high_thresh`.
//! * `max_datagrams` 1024: with 4 MiB, an average of 4 KiB held per datagram.
//! * `max_frags_per_datagram` 64: a 64 KiB datagram needs 45 fragments on a
//!   1500-byte MTU, 46 on a 1450-byte VXLAN pod MTU and 54 on IPv6's minimum
//!   1280; 64 covers MTUs down to ~1100 for the largest datagrams and any MTU
//!   for datagrams of usual size.
//! * `min_frag_payload` 400: OVS's lower bound for its minimum fragment size
//!   (its defaults are 1200 for IPv4 and 1280 for IPv6, which would drop the
//!   fragments of a 1280-byte IPv6 path: their payload is 1232 bytes, less
//!   with extension headers). 400 passes every fragment of a path with the
//!   IPv6 minimum MTU (1280), the IPv4 minimum reassembly size (576: 512+
//!   bytes per fragment) and Linux's smallest path MTU (552), and refuses
//!   floods of tiny fragments that cost a descriptor each for a few bytes.
//!   Linux has no such limit.
//! * `timeout_ns` 30 s: Linux's `ipfrag_time` (OVS uses 15 s).
//! * `max_datagram_len` 65535: the IPv4 total length / IPv6 payload length
//!   fields; no jumbograms.
//! * `max_datagrams_per_source` 64 and `max_bytes_per_source` 1 MiB: a
//!   sixteenth of the table and a quarter of the memory per sender (Linux
//!   and OVS have only the global limits). A well-behaved sender holds a
//!   datagram only for the microseconds between its fragments, so it
//!   never comes near; a flood from one address leaves at least 3 MiB and
//!   960 datagrams to everyone else.
//! * `verify_ipv4_checksum` true: as OVS and Linux do before reassembling
//!   (otherwise reassembly would launder a corrupt first header into one with
//!   a valid checksum).
//!
//! # Differences from OVS and Linux
//!
//! * The reassembled IPv6 packet has no Fragment header (OVS keeps it with
//!   the offset zeroed).
//! * Overlaps drop and forget the datagram; exact duplicates (same range,
//!   same bytes) are dropped alone.
//! * No ICMP errors are generated (time exceeded, parameter problem); no ECN
//!   consistency check across fragments (Linux drops CE mixed with not-ECT);
//!   no per-source reordering distance (Linux `ipfrag_max_dist`).
//! * Limits are per instance, not per address family; the memory limit
//!   counts frame bytes, not allocator overhead.

use std::collections::HashMap;
use std::fmt;

use crate::field::{frag, Field};
use crate::key::FlowKey;
use crate::wire::{ipv4, ipv6};

mod parse;

use parse::{parse, Parsed};

/// Largest per-datagram fragment count accepted in [`IpfConfig`]: 65535 bytes
/// in fragments of at least 8 bytes.
pub const MAX_FRAGS_LIMIT: usize = 8192;

/// Datagrams discarded per `add` call when they have expired.
const EXPIRE_PER_ADD: usize = 2;
/// Spare buffer sets kept for reuse, and the largest buffer kept.
const POOL_MAX: usize = 8;
const POOL_BUF_MAX: usize = 128 * 1024;
/// "No slot" in the expiry list.
const NIL: u32 = u32::MAX;

// ---------------------------------------------------------------------------
// Public types

/// Limits and knobs; see the module doc for the defaults' reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpfConfig {
    /// Total bytes of stored fragment frames across all incomplete datagrams.
    pub max_bytes: usize,
    /// Incomplete datagrams held at once.
    pub max_datagrams: usize,
    /// Fragments stored per datagram (clamped to `1..=`[`MAX_FRAGS_LIMIT`]).
    pub max_frags_per_datagram: usize,
    /// Smallest payload of a non-last fragment (which must also be a
    /// non-zero multiple of 8).
    pub min_frag_payload: usize,
    /// Lifetime of an incomplete datagram from its first fragment.
    pub timeout_ns: u64,
    /// Largest reassembled IPv4 total length / IPv6 payload length (clamped
    /// to 65535).
    pub max_datagram_len: usize,
    /// Drop IPv4 fragments whose header checksum is wrong.
    pub verify_ipv4_checksum: bool,
    /// Incomplete datagrams held at once for one source address (per zone
    /// and family): one sender cannot take the whole table.
    pub max_datagrams_per_source: usize,
    /// Bytes held at once for one source address (per zone and family).
    pub max_bytes_per_source: usize,
}

impl Default for IpfConfig {
    fn default() -> Self {
        IpfConfig {
            max_bytes: 4 << 20,
            max_datagrams: 1024,
            max_frags_per_datagram: 64,
            min_frag_payload: 400,
            timeout_ns: 30_000_000_000,
            max_datagram_len: 65535,
            verify_ipv4_checksum: true,
            max_datagrams_per_source: 64,
            max_bytes_per_source: 1 << 20,
        }
    }
}

/// Why a fragment was not stored (or, for [`IpfDrop::Timeout`] and
/// [`IpfDrop::Flushed`], why stored fragments were discarded). See the
/// module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum IpfDrop {
    NotAFragment = 0,
    Malformed,
    BadChecksum,
    TinyFirstFragment,
    TooSmall,
    Overlap,
    Duplicate,
    LengthMismatch,
    TooLong,
    TooManyFragments,
    TableFull,
    MemoryFull,
    Timeout,
    Flushed,
    SourceLimit,
}

impl IpfDrop {
    /// Number of reasons (the length of [`IpfStats::drops`]).
    pub const COUNT: usize = 15;
    /// Every reason, in discriminant order.
    pub const ALL: [IpfDrop; IpfDrop::COUNT] = [
        IpfDrop::NotAFragment,
        IpfDrop::Malformed,
        IpfDrop::BadChecksum,
        IpfDrop::TinyFirstFragment,
        IpfDrop::TooSmall,
        IpfDrop::Overlap,
        IpfDrop::Duplicate,
        IpfDrop::LengthMismatch,
        IpfDrop::TooLong,
        IpfDrop::TooManyFragments,
        IpfDrop::TableFull,
        IpfDrop::MemoryFull,
        IpfDrop::Timeout,
        IpfDrop::Flushed,
        IpfDrop::SourceLimit,
    ];

    /// snake_case name (a Prometheus label value).
    pub fn name(&self) -> &'static str {
        match self {
            IpfDrop::NotAFragment => "not_a_fragment",
            IpfDrop::Malformed => "malformed",
            IpfDrop::BadChecksum => "bad_checksum",
            IpfDrop::TinyFirstFragment => "tiny_first_fragment",
            IpfDrop::TooSmall => "too_small",
            IpfDrop::Overlap => "overlap",
            IpfDrop::Duplicate => "duplicate",
            IpfDrop::LengthMismatch => "length_mismatch",
            IpfDrop::TooLong => "too_long",
            IpfDrop::TooManyFragments => "too_many_fragments",
            IpfDrop::TableFull => "table_full",
            IpfDrop::MemoryFull => "memory_full",
            IpfDrop::Timeout => "timeout",
            IpfDrop::Flushed => "flushed",
            IpfDrop::SourceLimit => "source_limit",
        }
    }

    /// Whether this reason discards the fragment's whole datagram when one
    /// is stored.
    pub fn drops_datagram(&self) -> bool {
        matches!(
            self,
            IpfDrop::Overlap
                | IpfDrop::LengthMismatch
                | IpfDrop::TooLong
                | IpfDrop::TooManyFragments
                | IpfDrop::MemoryFull
                | IpfDrop::Timeout
                | IpfDrop::Flushed
                | IpfDrop::SourceLimit
        )
    }
}

impl fmt::Display for IpfDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Counters (monotonic `*_total`) and gauges (`held_*`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpfStats {
    /// Frames given to [`Ipf::add`].
    pub fragments_total: u64,
    /// Fragments handed out inside a [`Completed`].
    pub fragments_reassembled_total: u64,
    /// Datagrams reassembled.
    pub datagrams_completed_total: u64,
    /// Incomplete datagrams discarded because they timed out.
    pub expired_datagrams_total: u64,
    /// Incomplete datagrams discarded for any other reason (overlap, limits,
    /// flush).
    pub discarded_datagrams_total: u64,
    /// Incomplete datagrams held now.
    pub held_datagrams: u64,
    /// Fragments held now.
    pub held_fragments: u64,
    /// Bytes of fragment frames held now.
    pub held_bytes: u64,
    /// Fragments dropped, by reason (index: `IpfDrop as usize`): the offered
    /// fragment plus, for reasons that discard a datagram, its stored ones.
    pub drops: [u64; IpfDrop::COUNT],
}

impl IpfStats {
    /// Fragments dropped for `reason`.
    pub fn dropped(&self, reason: IpfDrop) -> u64 {
        self.drops[reason as usize]
    }

    /// Fragments dropped for any reason.
    pub fn dropped_total(&self) -> u64 {
        self.drops.iter().sum()
    }
}

/// What [`Ipf::add`] did with a frame.
#[derive(Debug)]
pub enum IpfOutcome {
    /// Stored; more fragments are needed.
    Held,
    /// This fragment completed its datagram.
    Completed(Completed),
    /// Not stored, for this reason.
    Dropped(IpfDrop),
}

/// A reassembled datagram and the fragments it was made of. Give it back
/// with [`Ipf::recycle`] to reuse its buffers (dropping it is fine too).
pub struct Completed {
    bufs: Bufs,
    frame: Vec<u8>,
    zone: u16,
    ipv6: bool,
}

impl Completed {
    /// The reassembled Ethernet frame.
    pub fn frame(&self) -> &[u8] {
        &self.frame
    }

    /// Takes the reassembled frame out (it will not be reused).
    pub fn take_frame(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.frame)
    }

    /// The conntrack zone the fragments were offered in.
    pub fn zone(&self) -> u16 {
        self.zone
    }

    /// IPv6 (else IPv4).
    pub fn is_ipv6(&self) -> bool {
        self.ipv6
    }

    /// How many fragments made the datagram.
    pub fn fragment_count(&self) -> usize {
        self.bufs.frags.len()
    }

    /// Total bytes of the fragment frames.
    pub fn fragment_bytes(&self) -> usize {
        self.bufs.frames.len()
    }

    /// The fragment frames exactly as received, in the order received.
    pub fn fragments(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.bufs.frags.iter().map(|f| self.bufs.frame_of(f))
    }

    /// The fragment frames exactly as received, in fragment offset order.
    pub fn fragments_by_offset(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        self.bufs
            .order
            .iter()
            .map(|&i| self.bufs.frame_of(&self.bufs.frags[usize::from(i)]))
    }
}

impl fmt::Debug for Completed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completed")
            .field("zone", &self.zone)
            .field("ipv6", &self.ipv6)
            .field("frame_len", &self.frame.len())
            .field("fragments", &self.bufs.frags.len())
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Internal types

/// A sender, for the per-source limits: zone, family, source address.
type SourceKey = (u16, bool, u128);

fn source_of(k: &DgramKey) -> SourceKey {
    (k.zone, k.ipv6, k.src)
}

/// What one sender holds.
#[derive(Clone, Copy, Debug, Default)]
struct SourceUse {
    datagrams: usize,
    bytes: usize,
}

/// A datagram's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct DgramKey {
    src: u128,
    dst: u128,
    id: u32,
    zone: u16,
    proto: u8,
    ipv6: bool,
}

/// One stored fragment: where its frame is in [`Bufs::frames`] and what the
/// parse found. Offsets inside the frame are relative to its start.
#[derive(Clone, Copy, Debug)]
struct Frag {
    at: usize,
    len: usize,
    /// IP header.
    l3: u32,
    /// Fragment data (after the IPv4 header or the IPv6 Fragment header).
    data: u32,
    /// IPv6: the Next Header byte that names the Fragment header.
    nh_at: u32,
    start: u32,
    end: u32,
    more: bool,
}

/// A datagram's storage; reused through the pool.
#[derive(Default)]
struct Bufs {
    /// Frames back to back, in received order.
    frames: Vec<u8>,
    /// Descriptors, in received order.
    frags: Vec<Frag>,
    /// Indices into `frags`, sorted by `start`.
    order: Vec<u16>,
}

impl Bufs {
    fn frame_of(&self, f: &Frag) -> &[u8] {
        &self.frames[f.at..f.at + f.len]
    }

    fn data_of(&self, f: &Frag) -> &[u8] {
        let from = f.at + f.data as usize;
        &self.frames[from..from + (f.end - f.start) as usize]
    }

    fn clear(&mut self) {
        self.frames.clear();
        self.frags.clear();
        self.order.clear();
    }
}

struct Datagram {
    key: DgramKey,
    created_ns: u64,
    prev: u32,
    next: u32,
    bufs: Bufs,
    /// End set by the last fragment (MF clear).
    last_end: Option<u32>,
    /// Largest end of any stored fragment.
    max_end: u32,
    /// Bytes of data stored (ranges never overlap).
    covered: u32,
    /// Length-field base of the first fragment (IPv4 IHL, IPv6
    /// unfragmentable extension headers).
    first_base: Option<u32>,
}

// ---------------------------------------------------------------------------
// The reassembler

/// The fragment reassembler (see the module doc).
pub struct Ipf {
    config: IpfConfig,
    map: HashMap<DgramKey, u32>,
    slab: Vec<Option<Datagram>>,
    free: Vec<u32>,
    /// Expiry list, oldest first.
    head: u32,
    tail: u32,
    held_bytes: usize,
    held_frags: usize,
    /// What each sender holds (an entry exists while it holds a datagram,
    /// so at most `max_datagrams` entries).
    sources: HashMap<SourceKey, SourceUse>,
    pool: Vec<Bufs>,
    frame_pool: Vec<Vec<u8>>,
    stats: IpfStats,
}

impl fmt::Debug for Ipf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ipf")
            .field("config", &self.config)
            .field("held_datagrams", &self.map.len())
            .field("held_fragments", &self.held_frags)
            .field("held_bytes", &self.held_bytes)
            .finish_non_exhaustive()
    }
}

impl Ipf {
    /// A reassembler with `config` (out-of-range values clamped, see
    /// [`IpfConfig`]).
    pub fn new(mut config: IpfConfig) -> Ipf {
        config.max_frags_per_datagram = config.max_frags_per_datagram.clamp(1, MAX_FRAGS_LIMIT);
        config.max_datagram_len = config.max_datagram_len.min(65535);
        Ipf {
            config,
            map: HashMap::new(),
            slab: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            held_bytes: 0,
            held_frags: 0,
            sources: HashMap::new(),
            pool: Vec::new(),
            frame_pool: Vec::new(),
            stats: IpfStats::default(),
        }
    }

    /// The configuration in effect (after clamping).
    pub fn config(&self) -> &IpfConfig {
        &self.config
    }

    /// Offers one frame that should be an IPv4 or IPv6 fragment (`key` is
    /// its flow key, `zone` its conntrack zone). See [`IpfOutcome`].
    pub fn add(&mut self, frame: &[u8], key: &FlowKey, zone: u16, now_ns: u64) -> IpfOutcome {
        self.stats.fragments_total += 1;
        self.expire_some(now_ns, EXPIRE_PER_ADD);
        let out = self.add_inner(frame, key, zone, now_ns);
        if let IpfOutcome::Dropped(reason) = out {
            self.stats.drops[reason as usize] += 1;
        }
        out
    }

    /// Discards every datagram that has timed out at `now_ns`; returns how
    /// many.
    pub fn expire(&mut self, now_ns: u64) -> usize {
        self.expire_some(now_ns, usize::MAX)
    }

    /// Discards every incomplete datagram (counted as [`IpfDrop::Flushed`]).
    pub fn flush(&mut self) {
        while self.head != NIL {
            self.discard(self.head, IpfDrop::Flushed);
        }
    }

    /// Gives a [`Completed`]'s buffers back for reuse.
    pub fn recycle(&mut self, done: Completed) {
        self.put_bufs(done.bufs);
        let mut frame = done.frame;
        if frame.capacity() <= POOL_BUF_MAX && self.frame_pool.len() < POOL_MAX {
            frame.clear();
            self.frame_pool.push(frame);
        }
    }

    /// Counters and gauges.
    pub fn stats(&self) -> IpfStats {
        let mut s = self.stats;
        s.held_datagrams = self.map.len() as u64;
        s.held_fragments = self.held_frags as u64;
        s.held_bytes = self.held_bytes as u64;
        s
    }

    /// Bytes of fragment frames held now (never above `max_bytes`).
    pub fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Incomplete datagrams held now (never above `max_datagrams`).
    pub fn held_datagrams(&self) -> usize {
        self.map.len()
    }

    /// Fragments held now.
    pub fn held_fragments(&self) -> usize {
        self.held_frags
    }

    // -- internals ----------------------------------------------------------

    fn add_inner(&mut self, frame: &[u8], key: &FlowKey, zone: u16, now_ns: u64) -> IpfOutcome {
        if key.get(Field::NwFrag) as u8 & frag::ANY == 0 {
            return IpfOutcome::Dropped(IpfDrop::NotAFragment);
        }
        let p = match parse(frame, key, zone, &self.config) {
            Ok(p) => p,
            Err(reason) => return IpfOutcome::Dropped(reason),
        };
        let too_long = (p.base + p.end) as usize > self.config.max_datagram_len;

        let mut slot = self.map.get(&p.key).copied();
        if let Some(s) = slot {
            if self.is_expired(s, now_ns) {
                self.discard(s, IpfDrop::Timeout);
                slot = None;
            }
        }
        match slot {
            Some(s) => {
                if too_long {
                    return self.reject(s, IpfDrop::TooLong);
                }
                self.add_to(s, frame, &p)
            }
            None => {
                if too_long {
                    return IpfOutcome::Dropped(IpfDrop::TooLong);
                }
                if self.map.len() >= self.config.max_datagrams {
                    return IpfOutcome::Dropped(IpfDrop::TableFull);
                }
                if self.held_bytes + frame.len() > self.config.max_bytes {
                    return IpfOutcome::Dropped(IpfDrop::MemoryFull);
                }
                let src = self.sources.get(&source_of(&p.key)).copied();
                if src.is_some_and(|u| {
                    u.datagrams >= self.config.max_datagrams_per_source
                        || u.bytes + frame.len() > self.config.max_bytes_per_source
                }) || frame.len() > self.config.max_bytes_per_source
                {
                    return IpfOutcome::Dropped(IpfDrop::SourceLimit);
                }
                let s = self.create(p.key, now_ns);
                self.add_to(s, frame, &p)
            }
        }
    }

    /// Adds a checked fragment to the datagram in slot `s`.
    fn add_to(&mut self, s: u32, frame: &[u8], p: &Parsed) -> IpfOutcome {
        let max_frags = self.config.max_frags_per_datagram;
        let max_len = self.config.max_datagram_len;
        let Some(dg) = self.slab[s as usize].as_ref() else {
            return IpfOutcome::Dropped(IpfDrop::Malformed);
        };

        // Length consistency.
        let last_end = if p.more {
            if dg.last_end.is_some_and(|e| p.end > e) {
                return self.reject(s, IpfDrop::LengthMismatch);
            }
            dg.last_end
        } else {
            if dg.last_end.is_some_and(|e| e != p.end) || p.end < dg.max_end {
                return self.reject(s, IpfDrop::LengthMismatch);
            }
            Some(p.end)
        };
        let first_base = if p.start == 0 {
            Some(p.base)
        } else {
            dg.first_base
        };
        if let (Some(b), Some(e)) = (first_base, last_end) {
            if (b + e) as usize > max_len {
                return self.reject(s, IpfDrop::TooLong);
            }
        }

        // Overlap: the first stored fragment starting at or after ours, and
        // the one before it.
        let frags = &dg.bufs.frags;
        let order = &dg.bufs.order;
        let pos = order.partition_point(|&i| frags[usize::from(i)].start < p.start);
        if let Some(&i) = order.get(pos) {
            let f = &frags[usize::from(i)];
            if f.start == p.start && f.end == p.end && f.more == p.more {
                let ours = &frame[p.data as usize..p.data as usize + (p.end - p.start) as usize];
                if dg.bufs.data_of(f) == ours {
                    return IpfOutcome::Dropped(IpfDrop::Duplicate);
                }
                return self.reject(s, IpfDrop::Overlap);
            }
            if f.start < p.end {
                return self.reject(s, IpfDrop::Overlap);
            }
        }
        if pos > 0 && frags[usize::from(order[pos - 1])].end > p.start {
            return self.reject(s, IpfDrop::Overlap);
        }

        if frags.len() >= max_frags {
            return self.reject(s, IpfDrop::TooManyFragments);
        }
        if self.held_bytes + frame.len() > self.config.max_bytes {
            return self.reject(s, IpfDrop::MemoryFull);
        }
        let source = source_of(&p.key);
        if self
            .sources
            .get(&source)
            .is_some_and(|u| u.bytes + frame.len() > self.config.max_bytes_per_source)
        {
            return self.reject(s, IpfDrop::SourceLimit);
        }

        // Store.
        let Some(dg) = self.slab[s as usize].as_mut() else {
            return IpfOutcome::Dropped(IpfDrop::Malformed);
        };
        let idx = dg.bufs.frags.len() as u16; // < MAX_FRAGS_LIMIT
        dg.bufs.frags.push(Frag {
            at: dg.bufs.frames.len(),
            len: frame.len(),
            l3: p.l3,
            data: p.data,
            nh_at: p.nh_at,
            start: p.start,
            end: p.end,
            more: p.more,
        });
        dg.bufs.frames.extend_from_slice(frame);
        dg.bufs.order.insert(pos, idx);
        dg.last_end = last_end;
        dg.first_base = first_base;
        dg.max_end = dg.max_end.max(p.end);
        dg.covered += p.end - p.start;
        self.held_bytes += frame.len();
        self.held_frags += 1;
        if let Some(u) = self.sources.get_mut(&source) {
            u.bytes += frame.len();
        }

        if dg.last_end == Some(dg.covered) {
            if let Some(done) = self.complete(s) {
                return IpfOutcome::Completed(done);
            }
        }
        IpfOutcome::Held
    }

    /// Drops the offered fragment and the whole datagram in slot `s`.
    fn reject(&mut self, s: u32, reason: IpfDrop) -> IpfOutcome {
        self.discard(s, reason);
        IpfOutcome::Dropped(reason)
    }

    fn create(&mut self, key: DgramKey, now_ns: u64) -> u32 {
        let bufs = self.pool.pop().unwrap_or_default();
        let dg = Datagram {
            key,
            created_ns: now_ns,
            prev: self.tail,
            next: NIL,
            bufs,
            last_end: None,
            max_end: 0,
            covered: 0,
            first_base: None,
        };
        let s = match self.free.pop() {
            Some(s) => {
                self.slab[s as usize] = Some(dg);
                s
            }
            None => {
                self.slab.push(Some(dg));
                (self.slab.len() - 1) as u32
            }
        };
        if let Some(t) = self
            .slab
            .get_mut(self.tail as usize)
            .and_then(Option::as_mut)
        {
            t.next = s;
        } else {
            self.head = s;
        }
        self.tail = s;
        self.map.insert(key, s);
        self.sources.entry(source_of(&key)).or_default().datagrams += 1;
        s
    }

    /// Unlinks the datagram in slot `s` and returns it.
    fn remove(&mut self, s: u32) -> Option<Datagram> {
        let dg = self.slab.get_mut(s as usize)?.take()?;
        match self.slab.get_mut(dg.prev as usize).and_then(Option::as_mut) {
            Some(p) => p.next = dg.next,
            None => self.head = dg.next,
        }
        match self.slab.get_mut(dg.next as usize).and_then(Option::as_mut) {
            Some(n) => n.prev = dg.prev,
            None => self.tail = dg.prev,
        }
        self.map.remove(&dg.key);
        self.free.push(s);
        self.held_bytes -= dg.bufs.frames.len();
        self.held_frags -= dg.bufs.frags.len();
        let source = source_of(&dg.key);
        if let Some(u) = self.sources.get_mut(&source) {
            u.datagrams -= 1;
            u.bytes -= dg.bufs.frames.len();
            if u.datagrams == 0 {
                self.sources.remove(&source);
            }
        }
        Some(dg)
    }

    /// Discards the incomplete datagram in slot `s`, counting its stored
    /// fragments as dropped for `reason`.
    fn discard(&mut self, s: u32, reason: IpfDrop) {
        let Some(dg) = self.remove(s) else {
            return;
        };
        self.stats.drops[reason as usize] += dg.bufs.frags.len() as u64;
        if reason == IpfDrop::Timeout {
            self.stats.expired_datagrams_total += 1;
        } else {
            self.stats.discarded_datagrams_total += 1;
        }
        self.put_bufs(dg.bufs);
    }

    fn complete(&mut self, s: u32) -> Option<Completed> {
        let dg = self.remove(s)?;
        let mut frame = self.frame_pool.pop().unwrap_or_default();
        build(&dg.bufs, dg.key.ipv6, dg.covered, &mut frame);
        self.stats.datagrams_completed_total += 1;
        self.stats.fragments_reassembled_total += dg.bufs.frags.len() as u64;
        Some(Completed {
            bufs: dg.bufs,
            frame,
            zone: dg.key.zone,
            ipv6: dg.key.ipv6,
        })
    }

    fn is_expired(&self, s: u32, now_ns: u64) -> bool {
        self.slab[s as usize]
            .as_ref()
            .is_some_and(|dg| now_ns.saturating_sub(dg.created_ns) >= self.config.timeout_ns)
    }

    fn expire_some(&mut self, now_ns: u64, limit: usize) -> usize {
        let mut n = 0;
        while n < limit && self.head != NIL && self.is_expired(self.head, now_ns) {
            self.discard(self.head, IpfDrop::Timeout);
            n += 1;
        }
        n
    }

    fn put_bufs(&mut self, mut bufs: Bufs) {
        if bufs.frames.capacity() <= POOL_BUF_MAX && self.pool.len() < POOL_MAX {
            bufs.clear();
            self.pool.push(bufs);
        }
    }
}

// ---------------------------------------------------------------------------
// Reassembly

/// Writes the reassembled frame of a complete datagram (data length `len`)
/// into `out`.
fn build(bufs: &Bufs, ipv6: bool, len: u32, out: &mut Vec<u8>) {
    out.clear();
    let Some(&first) = bufs.order.first() else {
        return;
    };
    let first = &bufs.frags[usize::from(first)];
    let f = bufs.frame_of(first);
    let l3 = first.l3 as usize;
    let data = first.data as usize;
    if ipv6 {
        let fh = data - ipv6::EXT_MIN_LEN;
        out.reserve(fh + len as usize);
        out.extend_from_slice(&f[..fh]);
        out[first.nh_at as usize] = f[fh];
        let plen = (fh - l3 - ipv6::HEADER_LEN) as u32 + len;
        let at = l3 + ipv6::field::PAYLOAD_LEN.start;
        out[at..at + 2].copy_from_slice(&(plen as u16).to_be_bytes());
    } else {
        out.reserve(data + len as usize);
        out.extend_from_slice(&f[..data]);
        let ihl = data - l3;
        let total = ihl as u32 + len;
        let at = |r: core::ops::Range<usize>| l3 + r.start..l3 + r.end;
        out[at(ipv4::field::TOTAL_LEN)].copy_from_slice(&(total as u16).to_be_bytes());
        // Flags and offset cleared but for the reserved bit (a fragment
        // with DF was refused as malformed).
        let flags = at(ipv4::field::FLAGS_FRAG);
        let kept =
            u16::from_be_bytes([out[flags.start], out[flags.start + 1]]) & ipv4::FLAG_RESERVED;
        out[flags].copy_from_slice(&kept.to_be_bytes());
        out[at(ipv4::field::CHECKSUM)].fill(0);
        let c = checksum(&out[l3..data]);
        out[at(ipv4::field::CHECKSUM)].copy_from_slice(&c.to_be_bytes());
    }
    for &i in &bufs.order {
        out.extend_from_slice(bufs.data_of(&bufs.frags[usize::from(i)]));
    }
}

/// The Internet checksum of `data` (0 when `data` already holds a valid
/// checksum).
fn checksum(data: &[u8]) -> u16 {
    crate::checksum::checksum(data, 0)
}

// ---------------------------------------------------------------------------

impl Default for Ipf {
    fn default() -> Self {
        Ipf::new(IpfConfig::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract::extract;

    const SEC: u64 = 1_000_000_000;

    fn small() -> IpfConfig {
        IpfConfig {
            min_frag_payload: 8,
            ..IpfConfig::default()
        }
    }

    fn eth(ty: u16, ip: &[u8]) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        f.extend_from_slice(&ty.to_be_bytes());
        f.extend_from_slice(ip);
        f
    }

    /// An IPv4 fragment frame: `data` at byte offset `off`.
    fn v4(id: u16, proto: u8, off: u32, more: bool, data: &[u8]) -> Vec<u8> {
        let mut h = vec![0x45, 0];
        h.extend_from_slice(&((20 + data.len()) as u16).to_be_bytes());
        h.extend_from_slice(&id.to_be_bytes());
        let fw = (off / 8) as u16 | if more { 0x2000 } else { 0 };
        h.extend_from_slice(&fw.to_be_bytes());
        h.extend_from_slice(&[64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(data);
        eth(0x0800, &h)
    }

    /// An IPv6 fragment frame with a Fragment header directly after the
    /// fixed header.
    fn v6(id: u32, next: u8, off: u32, more: bool, data: &[u8]) -> Vec<u8> {
        let mut h = vec![0x60, 0, 0, 0];
        h.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
        h.extend_from_slice(&[44, 64]);
        h.extend_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        h.extend_from_slice(&[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        h.extend_from_slice(&[next, 0]);
        h.extend_from_slice(&((off as u16 & 0xfff8) | u16::from(more)).to_be_bytes());
        h.extend_from_slice(&id.to_be_bytes());
        h.extend_from_slice(data);
        eth(0x86dd, &h)
    }

    fn add(ipf: &mut Ipf, frame: &[u8], now: u64) -> IpfOutcome {
        let key = extract(frame, 1);
        ipf.add(frame, &key, 0, now)
    }

    fn dropped(o: IpfOutcome) -> Option<IpfDrop> {
        match o {
            IpfOutcome::Dropped(r) => Some(r),
            _ => None,
        }
    }

    fn assert_conserved(ipf: &Ipf) {
        let s = ipf.stats();
        assert_eq!(
            s.fragments_total,
            s.held_fragments + s.fragments_reassembled_total + s.dropped_total(),
            "{s:?}"
        );
    }

    #[test]
    fn names_are_distinct_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for (i, r) in IpfDrop::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
            assert!(r
                .name()
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b == b'_'));
            assert!(seen.insert(r.name()));
        }
    }

    #[test]
    fn reassembles_v4_and_v6() {
        let mut ipf = Ipf::new(small());
        let d: Vec<u8> = (0..24).collect();
        assert!(matches!(
            add(&mut ipf, &v4(7, 17, 16, false, &d[16..]), 0),
            IpfOutcome::Held
        ));
        assert!(ipf.held_bytes() > 0);
        let IpfOutcome::Completed(c) = add(&mut ipf, &v4(7, 17, 0, true, &d[..16]), 0) else {
            panic!("not completed")
        };
        assert_eq!(ipf.held_bytes(), 0);
        let f = c.frame();
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 44);
        assert_eq!(&f[20..22], &[0, 0]);
        assert_eq!(checksum(&f[14..34]), 0);
        assert_eq!(&f[34..], &d[..]);
        ipf.recycle(c);

        let a = v6(9, 17, 0, true, &d[..16]);
        let b = v6(9, 17, 16, false, &d[16..]);
        assert!(matches!(add(&mut ipf, &a, 0), IpfOutcome::Held));
        let IpfOutcome::Completed(c) = add(&mut ipf, &b, 0) else {
            panic!("not completed")
        };
        let f = c.frame();
        assert_eq!(&f[12..14], &[0x86, 0xdd]);
        assert_eq!(u16::from_be_bytes([f[18], f[19]]), 24);
        assert_eq!(f[20], 17);
        assert_eq!(&f[54..], &d[..]);
        assert_eq!(c.fragments().collect::<Vec<_>>(), vec![&a[..], &b[..]]);
        ipf.recycle(c);
        assert_eq!(ipf.stats().datagrams_completed_total, 2);
        assert_conserved(&ipf);
    }

    #[test]
    fn drop_not_a_fragment() {
        let mut ipf = Ipf::new(small());
        let whole = v4(1, 17, 0, false, &[0; 16]);
        assert_eq!(
            dropped(add(&mut ipf, &whole, 0)),
            Some(IpfDrop::NotAFragment)
        );
        // The key says fragment, the frame is an atomic IPv6 fragment.
        let atomic = v6(1, 17, 0, false, &[0; 16]);
        let mut key = extract(&atomic, 1);
        key.set(Field::NwFrag, u128::from(frag::ANY));
        assert_eq!(
            dropped(ipf.add(&atomic, &key, 0, 0)),
            Some(IpfDrop::NotAFragment)
        );
        // ARP with a lying key.
        let arp = eth(0x0806, &[0; 28]);
        let mut key = extract(&arp, 1);
        key.set(Field::NwFrag, u128::from(frag::ANY));
        assert_eq!(
            dropped(ipf.add(&arp, &key, 0, 0)),
            Some(IpfDrop::NotAFragment)
        );
        assert_eq!(ipf.stats().dropped(IpfDrop::NotAFragment), 3);
    }

    #[test]
    fn drop_malformed() {
        let mut ipf = Ipf::new(small());
        let good = v4(1, 17, 0, true, &[0; 16]);
        let key = extract(&good, 1);
        // Truncated below the total length.
        assert_eq!(
            dropped(ipf.add(&good[..30], &key, 0, 0)),
            Some(IpfDrop::Malformed)
        );
        // DF together with MF (checksum fixed so only DF is wrong).
        let mut df = good.clone();
        df[20] |= 0x40;
        df[24] = 0;
        df[25] = 0;
        let c = checksum(&df[14..34]);
        df[24..26].copy_from_slice(&c.to_be_bytes());
        assert_eq!(dropped(ipf.add(&df, &key, 0, 0)), Some(IpfDrop::Malformed));
        // Key dl_type disagrees with the frame.
        let mut k6 = key;
        k6.set(Field::DlType, 0x86dd);
        assert_eq!(dropped(ipf.add(&good, &k6, 0, 0)), Some(IpfDrop::Malformed));
        // Empty last fragment.
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 17, 16, false, &[]), 0)),
            Some(IpfDrop::Malformed)
        );
        // IPv6 fragment header cut off.
        let f6 = v6(1, 17, 0, true, &[0; 16]);
        let key6 = extract(&f6, 1);
        let mut cut = f6[..14 + 44].to_vec();
        cut[18..20].copy_from_slice(&4u16.to_be_bytes());
        assert_eq!(
            dropped(ipf.add(&cut, &key6, 0, 0)),
            Some(IpfDrop::Malformed)
        );
        assert_eq!(ipf.held_datagrams(), 0);
        assert_eq!(ipf.stats().dropped(IpfDrop::Malformed), 5);
    }

    #[test]
    fn drop_bad_checksum() {
        let mut ipf = Ipf::new(small());
        let mut f = v4(1, 17, 0, true, &[0; 16]);
        f[24] ^= 1;
        assert_eq!(dropped(add(&mut ipf, &f, 0)), Some(IpfDrop::BadChecksum));
        let mut lax = Ipf::new(IpfConfig {
            verify_ipv4_checksum: false,
            ..small()
        });
        assert!(matches!(add(&mut lax, &f, 0), IpfOutcome::Held));
    }

    #[test]
    fn drop_tiny_first_fragment() {
        let mut ipf = Ipf::new(small());
        // 16 bytes of TCP: less than its 20-byte header.
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 6, 0, true, &[0; 16]), 0)),
            Some(IpfDrop::TinyFirstFragment)
        );
        // TCP at offset 8.
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 6, 8, false, &[0; 16]), 0)),
            Some(IpfDrop::TinyFirstFragment)
        );
        assert_eq!(
            dropped(add(&mut ipf, &v6(1, 6, 8, false, &[0; 16]), 0)),
            Some(IpfDrop::TinyFirstFragment)
        );
        // UDP needs 8: 8 is fine.
        assert!(matches!(
            add(&mut ipf, &v4(2, 17, 0, true, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        // IPv6: a destination options header of 16 bytes cut at 8 (RFC 7112).
        // The extractor gives up on the truncated chain (nw_frag 0), so the
        // key is forced here.
        let mut d = vec![17, 1];
        d.extend_from_slice(&[0; 6]);
        let cut = v6(3, 60, 0, true, &d);
        let mut key = extract(&cut, 1);
        key.set(Field::NwFrag, u128::from(frag::ANY));
        assert_eq!(
            dropped(ipf.add(&cut, &key, 0, 0)),
            Some(IpfDrop::TinyFirstFragment)
        );
        // ... and whole, followed by 8 bytes of UDP.
        let mut d = vec![17, 1];
        d.extend_from_slice(&[0; 22]);
        assert!(matches!(
            add(&mut ipf, &v6(4, 60, 0, true, &d), 0),
            IpfOutcome::Held
        ));
        // Unknown protocols are not checked.
        assert!(matches!(
            add(&mut ipf, &v4(5, 99, 0, true, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        // A Mobility header ends the chain, as in the flow key and
        // conntrack (the wire layer's walk): it is the upper layer, not an
        // extension header whose whole length must be in the fragment.
        let mut d = vec![59, 3];
        d.extend_from_slice(&[0; 14]);
        let mobility = v6(6, 135, 0, true, &d);
        assert_eq!(extract(&mobility, 1).get(Field::NwProto), 135);
        assert!(matches!(add(&mut ipf, &mobility, 0), IpfOutcome::Held));
    }

    #[test]
    fn ipv6_chain_bound_counts_the_fragment_header() {
        // The wire layer's walk takes 8 extension headers in all: 7 before
        // the Fragment header fit, 8 do not (the extractor refuses the
        // chain too, so the key is forced).
        let chain = |n: usize| {
            let mut f = v6(9, 17, 0, true, &[0; 16]);
            // Insert n destination-options headers before the Fragment
            // header; the fixed header names the first.
            let mut ext = Vec::new();
            for i in 0..n {
                ext.extend_from_slice(&[if i + 1 == n { 44 } else { 60 }, 0, 0, 0, 0, 0, 0, 0]);
            }
            f.splice(54..54, ext);
            if n > 0 {
                f[20] = 60;
            }
            let plen = u16::from_be_bytes([f[18], f[19]]) + 8 * n as u16;
            f[18..20].copy_from_slice(&plen.to_be_bytes());
            f
        };
        let mut ipf = Ipf::new(small());
        let seven = chain(7);
        assert_eq!(extract(&seven, 1).get(Field::NwFrag), u128::from(frag::ANY));
        assert!(matches!(add(&mut ipf, &seven, 0), IpfOutcome::Held));
        let eight = chain(8);
        let mut key = extract(&eight, 1);
        assert_eq!(key.get(Field::NwFrag), 0, "the extractor refuses it too");
        key.set(Field::NwFrag, u128::from(frag::ANY));
        assert_eq!(
            dropped(ipf.add(&eight, &key, 0, 0)),
            Some(IpfDrop::Malformed)
        );
    }

    #[test]
    fn drop_too_small() {
        let mut ipf = Ipf::new(small());
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 17, 0, true, &[0; 12]), 0)),
            Some(IpfDrop::TooSmall)
        );
        assert_eq!(
            dropped(add(&mut ipf, &v6(1, 17, 0, true, &[0; 12]), 0)),
            Some(IpfDrop::TooSmall)
        );
        let mut strict = Ipf::new(IpfConfig::default());
        assert_eq!(
            dropped(add(&mut strict, &v4(1, 17, 0, true, &[0; 392]), 0)),
            Some(IpfDrop::TooSmall)
        );
        assert!(matches!(
            add(&mut strict, &v4(1, 17, 0, true, &[0; 400]), 0),
            IpfOutcome::Held
        ));
        // Last fragments may be short.
        assert!(matches!(
            add(&mut strict, &v4(1, 17, 400, false, &[0; 3]), 0),
            IpfOutcome::Completed(_)
        ));
    }

    #[test]
    fn drop_overlap_forgets_the_datagram() {
        let mut ipf = Ipf::new(small());
        assert!(matches!(
            add(&mut ipf, &v4(1, 17, 0, true, &[0; 16]), 0),
            IpfOutcome::Held
        ));
        assert!(matches!(
            add(&mut ipf, &v4(1, 17, 32, false, &[0; 16]), 0),
            IpfOutcome::Held
        ));
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 17, 8, true, &[0; 16]), 0)),
            Some(IpfDrop::Overlap)
        );
        assert_eq!(ipf.held_datagrams(), 0);
        assert_eq!(ipf.held_bytes(), 0);
        assert_eq!(ipf.stats().dropped(IpfDrop::Overlap), 3);
        // Same range, different bytes: overlap too.
        assert!(matches!(
            add(&mut ipf, &v6(1, 17, 16, true, &[1; 16]), 0),
            IpfOutcome::Held
        ));
        assert_eq!(
            dropped(add(&mut ipf, &v6(1, 17, 16, true, &[2; 16]), 0)),
            Some(IpfDrop::Overlap)
        );
        // Overlapping the end of the previous fragment.
        assert!(matches!(
            add(&mut ipf, &v6(2, 17, 16, true, &[1; 16]), 0),
            IpfOutcome::Held
        ));
        assert_eq!(
            dropped(add(&mut ipf, &v6(2, 17, 24, false, &[1; 16]), 0)),
            Some(IpfDrop::Overlap)
        );
        assert_conserved(&ipf);
    }

    #[test]
    fn drop_duplicate_keeps_the_datagram() {
        let mut ipf = Ipf::new(small());
        let a = v4(1, 17, 0, true, &[5; 16]);
        assert!(matches!(add(&mut ipf, &a, 0), IpfOutcome::Held));
        assert_eq!(dropped(add(&mut ipf, &a, 0)), Some(IpfDrop::Duplicate));
        assert_eq!(ipf.held_fragments(), 1);
        let IpfOutcome::Completed(c) = add(&mut ipf, &v4(1, 17, 16, false, &[6; 4]), 0) else {
            panic!("not completed")
        };
        assert_eq!(c.fragment_count(), 2);
        assert_conserved(&ipf);
    }

    #[test]
    fn drop_length_mismatch() {
        let mut ipf = Ipf::new(small());
        assert!(matches!(
            add(&mut ipf, &v4(1, 17, 16, false, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        // A second last fragment with another end.
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 17, 32, false, &[0; 8]), 0)),
            Some(IpfDrop::LengthMismatch)
        );
        // Data beyond the end.
        assert!(matches!(
            add(&mut ipf, &v4(2, 17, 16, false, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        assert_eq!(
            dropped(add(&mut ipf, &v4(2, 17, 24, true, &[0; 8]), 0)),
            Some(IpfDrop::LengthMismatch)
        );
        // A last fragment ending before stored data.
        assert!(matches!(
            add(&mut ipf, &v4(3, 17, 32, true, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        assert_eq!(
            dropped(add(&mut ipf, &v4(3, 17, 16, false, &[0; 8]), 0)),
            Some(IpfDrop::LengthMismatch)
        );
        assert_eq!(ipf.held_datagrams(), 0);
        assert_conserved(&ipf);
    }

    #[test]
    fn drop_too_long() {
        let mut ipf = Ipf::new(small());
        // Offset 65528 + 16 bytes > 65535.
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 17, 65528, false, &[0; 16]), 0)),
            Some(IpfDrop::TooLong)
        );
        let mut capped = Ipf::new(IpfConfig {
            max_datagram_len: 100,
            ..small()
        });
        assert!(matches!(
            add(&mut capped, &v6(1, 17, 0, true, &[0; 64]), 0),
            IpfOutcome::Held
        ));
        assert_eq!(
            dropped(add(&mut capped, &v6(1, 17, 64, false, &[0; 40]), 0)),
            Some(IpfDrop::TooLong)
        );
        assert_eq!(capped.held_datagrams(), 0);
        assert_eq!(capped.stats().dropped(IpfDrop::TooLong), 2);
    }

    #[test]
    fn drop_too_many_fragments() {
        let mut ipf = Ipf::new(IpfConfig {
            max_frags_per_datagram: 3,
            ..small()
        });
        for i in 0..3 {
            assert!(matches!(
                add(&mut ipf, &v4(1, 17, i * 8, true, &[0; 8]), 0),
                IpfOutcome::Held
            ));
        }
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 17, 24, false, &[0; 8]), 0)),
            Some(IpfDrop::TooManyFragments)
        );
        assert_eq!(ipf.held_datagrams(), 0);
        assert_eq!(ipf.stats().dropped(IpfDrop::TooManyFragments), 4);
    }

    /// [`v4`] from source 10.0.0.`src`.
    fn v4_from(src: u8, id: u16, off: u32, more: bool, data: &[u8]) -> Vec<u8> {
        let mut f = v4(id, 17, off, more, data);
        f[14 + 15] = src;
        f[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
        let c = checksum(&f[14..34]);
        f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
        f
    }

    #[test]
    fn one_source_cannot_take_the_table() {
        let mut ipf = Ipf::new(IpfConfig {
            max_datagrams_per_source: 4,
            max_bytes_per_source: 1000,
            ..small()
        });
        // Source .1 floods first fragments: 4 held, then refused.
        for id in 0..4 {
            let o = add(&mut ipf, &v4_from(1, id, 0, true, &[0; 8]), 0);
            assert!(matches!(o, IpfOutcome::Held), "{o:?}");
        }
        for id in 4..100 {
            assert_eq!(
                dropped(add(&mut ipf, &v4_from(1, id, 0, true, &[0; 8]), 0)),
                Some(IpfDrop::SourceLimit)
            );
        }
        assert_eq!(ipf.held_datagrams(), 4);
        // Another source still reassembles.
        assert!(matches!(
            add(&mut ipf, &v4_from(2, 7, 0, true, &[1; 8]), 0),
            IpfOutcome::Held
        ));
        assert!(matches!(
            add(&mut ipf, &v4_from(2, 7, 8, false, &[2; 8]), 0),
            IpfOutcome::Completed(_)
        ));
        // Source .1's existing datagrams complete, which gives it room back.
        assert!(matches!(
            add(&mut ipf, &v4_from(1, 0, 8, false, &[0; 8]), 0),
            IpfOutcome::Completed(_)
        ));
        assert!(matches!(
            add(&mut ipf, &v4_from(1, 200, 0, true, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        // The byte limit: a datagram of source .3 growing past 1000 bytes
        // goes whole.
        let mut held = 0;
        for i in 0..40u32 {
            match add(&mut ipf, &v4_from(3, 9, i * 8, true, &[0; 8]), 0) {
                IpfOutcome::Held => held += 1,
                IpfOutcome::Dropped(IpfDrop::SourceLimit) => break,
                o => panic!("{o:?}"),
            }
        }
        assert!(held > 10 && held < 40, "{held}");
        assert_eq!(ipf.held_datagrams(), 4);
        assert_eq!(
            ipf.stats().dropped(IpfDrop::SourceLimit),
            96 + held + 1,
            "the offered fragment and the datagram's stored ones"
        );
        assert_conserved(&ipf);
        // Nothing is left accounted to a source once its datagrams go.
        ipf.flush();
        assert!(ipf.sources.is_empty());
        assert_conserved(&ipf);
    }

    #[test]
    fn drop_table_full() {
        let mut ipf = Ipf::new(IpfConfig {
            max_datagrams: 2,
            ..small()
        });
        assert!(matches!(
            add(&mut ipf, &v4(1, 17, 0, true, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        assert!(matches!(
            add(&mut ipf, &v4(2, 17, 0, true, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        assert_eq!(
            dropped(add(&mut ipf, &v4(3, 17, 0, true, &[0; 8]), 0)),
            Some(IpfDrop::TableFull)
        );
        // Existing datagrams still take fragments.
        assert!(matches!(
            add(&mut ipf, &v4(2, 17, 8, false, &[0; 8]), 0),
            IpfOutcome::Completed(_)
        ));
        assert!(matches!(
            add(&mut ipf, &v4(3, 17, 0, true, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        // The oldest expires lazily on the next add.
        assert!(matches!(
            add(&mut ipf, &v4(4, 17, 0, true, &[0; 8]), 30 * SEC),
            IpfOutcome::Held
        ));
        assert_eq!(ipf.stats().expired_datagrams_total, 2);
    }

    #[test]
    fn drop_memory_full() {
        let f1 = v4(1, 17, 0, true, &[0; 64]);
        let mut ipf = Ipf::new(IpfConfig {
            max_bytes: f1.len() + 40,
            ..small()
        });
        assert!(matches!(add(&mut ipf, &f1, 0), IpfOutcome::Held));
        // A new datagram that does not fit: dropped alone.
        assert_eq!(
            dropped(add(&mut ipf, &v4(2, 17, 0, true, &[0; 64]), 0)),
            Some(IpfDrop::MemoryFull)
        );
        assert_eq!(ipf.held_datagrams(), 1);
        // A fragment of the stored one that does not fit: the datagram goes.
        assert_eq!(
            dropped(add(&mut ipf, &v4(1, 17, 64, false, &[0; 64]), 0)),
            Some(IpfDrop::MemoryFull)
        );
        assert_eq!(ipf.held_datagrams(), 0);
        assert_eq!(ipf.held_bytes(), 0);
        assert_eq!(ipf.stats().dropped(IpfDrop::MemoryFull), 3);
    }

    #[test]
    fn timeout_and_flush() {
        let mut ipf = Ipf::new(small());
        for id in 0..5 {
            assert!(matches!(
                add(&mut ipf, &v4(id, 17, 0, true, &[0; 8]), id as u64 * SEC),
                IpfOutcome::Held
            ));
        }
        assert_eq!(ipf.expire(30 * SEC - 1), 0);
        assert_eq!(ipf.expire(32 * SEC), 3);
        assert_eq!(ipf.held_datagrams(), 2);
        // A fragment of an expired datagram starts a new one.
        assert!(matches!(
            add(&mut ipf, &v4(3, 17, 8, false, &[0; 8]), 34 * SEC),
            IpfOutcome::Held
        ));
        assert_eq!(ipf.stats().expired_datagrams_total, 5);
        assert_eq!(ipf.stats().dropped(IpfDrop::Timeout), 5);
        ipf.flush();
        assert_eq!(ipf.held_datagrams(), 0);
        assert_eq!(ipf.held_bytes(), 0);
        assert_eq!(ipf.stats().dropped(IpfDrop::Flushed), 1);
        assert_conserved(&ipf);
    }

    #[test]
    fn zones_and_families_are_separate() {
        let mut ipf = Ipf::new(small());
        let a = v4(1, 17, 0, true, &[0; 8]);
        let b = v4(1, 17, 8, false, &[0; 8]);
        let (ka, kb) = (extract(&a, 1), extract(&b, 1));
        assert!(matches!(ipf.add(&a, &ka, 1, 0), IpfOutcome::Held));
        assert!(matches!(ipf.add(&b, &kb, 2, 0), IpfOutcome::Held));
        assert!(matches!(
            add(&mut ipf, &v6(1, 17, 8, false, &[0; 8]), 0),
            IpfOutcome::Held
        ));
        assert_eq!(ipf.held_datagrams(), 3);
        let IpfOutcome::Completed(c) = ipf.add(&b, &kb, 1, 0) else {
            panic!("not completed")
        };
        assert_eq!(c.zone(), 1);
    }

    #[test]
    fn checksum_of_valid_header_is_zero() {
        let f = v4(1, 17, 0, true, &[0; 8]);
        assert_eq!(checksum(&f[14..34]), 0);
        assert_eq!(checksum(&[0xff]), 0x00ff);
    }
}
