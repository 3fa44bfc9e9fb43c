//! OpenFlow groups (`add-group`, `group:ID`), with Open vSwitch's
//! semantics and syntax.
//!
//! A group is a list of buckets, each an action list. What `group:ID` does
//! depends on the group's type:
//!
//! - **all**: every bucket runs, each on its own copy of the packet as it
//!   was at the `group` action (flooding, mirroring);
//! - **select**: one bucket runs, chosen by a hash of the packet: the
//!   load-balancing group (a Service's endpoints);
//! - **indirect**: the one bucket runs (a shared next hop);
//! - **fast_failover**: the first live bucket runs (every bucket is live
//!   here: oxvs does not watch ports).
//!
//! After the group the packet continues with the state it had before it:
//! what a bucket writes is seen only by that bucket (OVS translates each
//! bucket as a clone).
//!
//! ## Choosing a bucket
//!
//! A select group hashes the packet: with `selection_method=hash`, the
//! `fields(...)` it lists (under their masks), else (the default, and
//! `dp_hash`) the symmetric 5-tuple (addresses, protocol, ports: both
//! directions of a connection hash alike). The translation reads those
//! fields, so they are exact in the megaflow. The bucket is chosen by
//! weighted rendezvous hashing ([`select_bucket`]): every bucket scores
//! `weight / -ln(u)`, `u` a uniform number from the hash and the bucket's
//! id, and the highest score wins. A packet's choice therefore depends only
//! on its hash and the bucket ids and weights: adding or removing a bucket
//! moves only the packets that it wins or that were on it, and the others
//! keep theirs (what OVS's `hash` method does with its own scoring; a
//! Service's existing connections are kept by conntrack anyway). A bucket
//! with weight 0 is never chosen; a group whose buckets all weigh 0, or
//! that has none, drops.
//!
//! Differences from OVS: the default method hashes in the slow path, where
//! OVS's userspace datapath computes a `dp_hash` and recirculates (so its
//! megaflows match hash bits, ours the 5-tuple), and the bucket a given
//! packet gets differs from OVS's (another hash function); which bucket
//! is chosen is never part of OpenFlow's contract.

use crate::field::Field;
use crate::flow::Action;
use crate::key::FlowKey;

/// The largest group id (OpenFlow `OFPG_MAX`); above are reserved.
pub const GROUP_MAX: u32 = 0xffff_ff00;

/// A group's type (`type=`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum GroupType {
    All,
    Select,
    Indirect,
    FastFailover,
}

/// How a select group hashes (`selection_method=`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum SelectionMethod {
    /// Not given: the symmetric 5-tuple.
    #[default]
    Default,
    /// `selection_method=hash`: the listed `fields(...)`.
    Hash,
    /// `selection_method=dp_hash`: as the default here.
    DpHash,
}

/// One bucket of a group.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Bucket {
    /// `bucket_id:` (OVS numbers them 0, 1, ... when not given).
    pub id: u32,
    /// `weight:` (select groups; OVS's default is 1).
    pub weight: u16,
    /// `watch_port:` (kept and printed; every bucket counts as live).
    pub watch_port: Option<u32>,
    /// `watch_group:` (kept and printed).
    pub watch_group: Option<u32>,
    /// What the bucket does (empty: drop).
    pub actions: Vec<Action>,
}

/// A group as `add-group` gives it.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct Group {
    /// `group_id=` (1..=[`GROUP_MAX`]; 0 is valid in OpenFlow too).
    pub id: u32,
    pub kind: GroupType,
    pub method: SelectionMethod,
    /// `selection_method_param=` (the hash basis).
    pub basis: u64,
    /// `fields(...)` of `selection_method=hash`: each field with its mask
    /// (the whole field when no mask was given), in the order written.
    pub fields: Vec<(Field, u128)>,
    pub buckets: Vec<Bucket>,
}

impl Group {
    /// A group with no buckets.
    pub fn new(id: u32, kind: GroupType) -> Group {
        Group {
            id,
            kind,
            method: SelectionMethod::Default,
            basis: 0,
            fields: Vec::new(),
            buckets: Vec::new(),
        }
    }

    /// Every group id a flow's (or bucket's) actions name, nested `ct`
    /// actions included.
    pub fn referenced(actions: &[Action], out: &mut Vec<u32>) {
        for a in actions {
            match a {
                Action::Group(id) => out.push(*id),
                Action::Ct(ct) => Group::referenced(&ct.exec, out),
                _ => {}
            }
        }
    }
}

/// A 64-bit mix (the SplitMix64 finaliser): deterministic across runs,
/// processes and machines.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn mix_u128(h: u64, v: u128) -> u64 {
    mix64(mix64(h ^ (v as u64)) ^ ((v >> 64) as u64))
}

/// The default method's hash: dl_type, protocol, and the two (address,
/// port) endpoints combined so that both directions hash alike. Every key
/// bit it reads is OR-ed into `wc`.
pub fn hash_symmetric_l4(key: &FlowKey, basis: u64, wc: &mut FlowKey) -> u64 {
    let mut read = |f: Field| {
        wc.mask_field(f);
        key.get(f)
    };
    let dl_type = read(Field::DlType);
    let mut h = mix64(basis ^ (dl_type as u64));
    let (a, b) = match dl_type as u16 {
        crate::wire::ethertype::IPV4 => (read(Field::NwSrc), read(Field::NwDst)),
        crate::wire::ethertype::IPV6 => (read(Field::Ipv6Src), read(Field::Ipv6Dst)),
        _ => return h,
    };
    let proto = read(Field::NwProto);
    h = mix64(h ^ proto as u64);
    let (pa, pb) = match proto as u8 {
        crate::wire::ip_proto::TCP | crate::wire::ip_proto::UDP | crate::wire::ip_proto::SCTP => {
            (read(Field::TpSrc), read(Field::TpDst))
        }
        _ => (0, 0),
    };
    // Symmetric: the smaller endpoint first.
    let (lo, hi) = if (a, pa) <= (b, pb) {
        ((a, pa), (b, pb))
    } else {
        ((b, pb), (a, pa))
    };
    h = mix_u128(h, lo.0);
    h = mix64(h ^ lo.1 as u64);
    h = mix_u128(h, hi.0);
    mix64(h ^ hi.1 as u64)
}

/// The `hash` method's hash: the listed fields under their masks, in
/// order. Every bit read is OR-ed into `wc`.
pub fn hash_fields(key: &FlowKey, fields: &[(Field, u128)], basis: u64, wc: &mut FlowKey) -> u64 {
    let mut h = mix64(basis);
    for &(f, mask) in fields {
        let m = mask & f.full_mask();
        let old = wc.get(f);
        wc.set(f, old | m);
        h = mix_u128(h, key.get(f) & m);
    }
    h
}

/// The bucket a packet with `hash` goes to (weighted rendezvous hashing,
/// module doc), or `None` when no bucket has a weight.
pub fn select_bucket(buckets: &[Bucket], hash: u64) -> Option<usize> {
    let mut best: Option<(f64, usize)> = None;
    for (i, b) in buckets.iter().enumerate() {
        if b.weight == 0 {
            continue;
        }
        let r = mix64(hash ^ mix64(u64::from(b.id)));
        // A uniform number in (0, 1): 53 bits, never 0 or 1.
        let u = ((r >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let score = f64::from(b.weight) / -u.ln();
        if best.is_none_or(|(s, _)| score > s) {
            best = Some((score, i));
        }
    }
    best.map(|(_, i)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buckets(weights: &[(u32, u16)]) -> Vec<Bucket> {
        weights
            .iter()
            .map(|&(id, weight)| Bucket {
                id,
                weight,
                watch_port: None,
                watch_group: None,
                actions: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn selection_follows_weights_and_is_stable() {
        let three = buckets(&[(0, 1), (1, 1), (2, 2)]);
        let mut counts = [0usize; 3];
        for h in 0..40_000u64 {
            counts[select_bucket(&three, mix64(h)).unwrap()] += 1;
        }
        // Weights 1:1:2 within a few percent.
        for (i, want) in [(0, 10_000.0), (1, 10_000.0), (2, 20_000.0)] {
            let got = counts[i] as f64;
            assert!((got - want).abs() < want * 0.05, "bucket {i}: {counts:?}");
        }
        // Removing bucket 1 moves only what bucket 1 had.
        let two = buckets(&[(0, 1), (2, 2)]);
        for h in 0..10_000u64 {
            let h = mix64(h);
            let before = three[select_bucket(&three, h).unwrap()].id;
            let after = two[select_bucket(&two, h).unwrap()].id;
            if before != 1 {
                assert_eq!(before, after);
            }
        }
    }

    #[test]
    fn weightless_groups_choose_nothing() {
        assert_eq!(select_bucket(&[], 5), None);
        assert_eq!(select_bucket(&buckets(&[(0, 0), (1, 0)]), 5), None);
        assert_eq!(select_bucket(&buckets(&[(0, 0), (7, 3)]), 5), Some(1));
    }

    #[test]
    fn symmetric_hash_reads_the_five_tuple_both_ways_alike() {
        let mut k = FlowKey::ZERO;
        k.set(Field::DlType, 0x0800);
        k.set(Field::NwProto, 6);
        k.set(Field::NwSrc, 0x0a00_0001);
        k.set(Field::NwDst, 0x0a00_0002);
        k.set(Field::TpSrc, 1000);
        k.set(Field::TpDst, 80);
        let mut r = k;
        r.set(Field::NwSrc, 0x0a00_0002);
        r.set(Field::NwDst, 0x0a00_0001);
        r.set(Field::TpSrc, 80);
        r.set(Field::TpDst, 1000);
        let mut wc = FlowKey::ZERO;
        let h = hash_symmetric_l4(&k, 0, &mut wc);
        assert_eq!(h, hash_symmetric_l4(&r, 0, &mut { FlowKey::ZERO }));
        assert_ne!(h, hash_symmetric_l4(&k, 1, &mut { FlowKey::ZERO }));
        for f in [Field::NwSrc, Field::NwDst, Field::TpSrc, Field::TpDst] {
            assert_eq!(wc.get(f), f.full_mask(), "{f:?}");
        }
        let mut other = k;
        other.set(Field::TpSrc, 1001);
        assert_ne!(h, hash_symmetric_l4(&other, 0, &mut { FlowKey::ZERO }));
    }
}
