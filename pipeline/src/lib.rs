//! # oxvs-pipeline: everything that decides what happens to a packet
//!
//! This crate is the pure core of oxvs. It owns no sockets, threads or
//! clocks: callers hand it frames (byte slices), the time (nanoseconds on
//! their own monotonic clock) and flow changes, and it hands back what to do.
//! A `Vec` of frames is enough to test the whole datapath.
//!
//! ## The pieces
//!
//! | module | what |
//! |---|---|
//! | [`field`], [`key`] | the flow key: every header and metadata field as fixed 64-bit words; field names |
//! | [`wire`] | the wire layer: ethertypes and protocol numbers, a checked view per header (Ethernet/VLAN, ARP, IPv4, IPv6, TCP, UDP/SCTP, ICMP, VXLAN), the one IPv6 extension header walk |
//! | [`extract`] | raw Ethernet frame -> [`key::FlowKey`] (never panics; truncated frames give partial keys) |
//! | [`flow`] | matches, actions, flows and flow mods (the OpenFlow model) |
//! | [`learn`] | the `learn` action: its specs, OVS's field names for them, and the flow it learns from a packet |
//! | [`parse`], [`print`] | the `ovs-ofctl` text dialect, both ways |
//! | [`classifier`], [`tables`] | tuple-space classifier per table; versioned tables; flow mods and bundles |
//! | [`xlate`] | the slow path: key -> datapath actions + megaflow mask |
//! | [`odp`] | datapath actions |
//! | [`conntrack`] | userspace connection tracking |
//! | [`cache`], [`datapath`], [`packet`] | exact-match and megaflow caches; batch processing; header rewrites |
//! | [`checksum`] | the Internet checksum; completing the TCP/UDP checksums a pod's offload left partial |
//! | [`trace`] | `ofproto/trace`-style explanations |
//! | [`names`] | the oxvs table plan (numbers and names) |
//! | [`regs`] | the table plan's register fields and marks, by name (`reg0[0..3]` = `PKT_SOURCE`...) |
//!
//! ## The packet's way
//!
//! 1. [`extract`] builds the key from the frame plus metadata (in_port, tunnel).
//! 2. The exact-match cache (per datapath thread) is probed with the whole key;
//!    then the megaflow cache (one hash table per distinct mask, probed in
//!    order of hits); on a miss, the slow path.
//! 3. The slow path ([`xlate::translate`]) runs the key through the tables
//!    from table 0 (or the table a recirculation resumes in), executing
//!    OpenFlow actions on a copy of the key, and produces the datapath
//!    actions plus the *wildcard mask*: every key bit any lookup consulted,
//!    including bits consulted by higher-priority flows that did not match.
//!    That (masked key, mask) -> actions triple is installed as a megaflow.
//! 4. The datapath executes the actions on the frame: header writes, `ct`
//!    (which runs [`conntrack`] and, with `table=`, recirculates: the packet
//!    goes round again with its conntrack state in the key), outputs.
//!
//! ## Invariants
//!
//! - **The cache never changes an answer.** For any key, the actions found in
//!   the exact-match or megaflow cache are the actions the slow path would
//!   compute now. Two things make this true: a megaflow's mask covers every
//!   bit that could have changed the slow path's result (so every key the
//!   megaflow matches would translate the same way), and every table change
//!   bumps the [`tables::TableSet::generation`], which empties the caches
//!   before the next packet is looked up. A property test checks cache ==
//!   slow path for random tables, packets and flow changes.
//! - **Tables are immutable versions.** A flow mod (or an atomic bundle of
//!   them) builds a new [`tables::TableSet`] and publishes it with one atomic
//!   pointer swap; readers load the current version without locks and keep
//!   it for a whole batch. Rules that survive a change are shared between
//!   versions (`Arc`), so their counters carry over.
//! - **Untrusted input never panics.** Frames, flow text and packet specs are
//!   parsed with length checks before every access; malformed input becomes a
//!   partial key or an error naming what was wrong.
//! - **No allocation, lock or syscall per packet** on the cached path.
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod cache;
pub mod checksum;
pub mod classifier;
pub mod conntrack;
pub mod datapath;
pub mod extract;
pub mod field;
pub mod flow;
pub mod group;
pub mod ipf;
pub mod key;
pub mod learn;
pub mod meter;
pub mod names;
pub mod odp;
pub mod packet;
pub mod parse;
pub mod print;
pub mod regs;
pub mod tables;
pub mod trace;
pub mod wire;
pub mod xlate;

pub use field::Field;
pub use flow::{Action, Flow, FlowMod, FlowModCommand, Match};
pub use key::FlowKey;
