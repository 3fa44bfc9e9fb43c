//! Rule ids: the number a NetworkPolicy rule has in the flows (conjunction
//! id, `reg3`/`reg5` value, low bits of the cookie).
//!
//! An id is a deterministic function of `(policy uid, direction, rule
//! index)`: the 32-bit FNV-1a hash of those, never 0. Collisions are
//! resolved deterministically: rules are taken in sorted order
//! (uid, direction, index, then policy key) and a rule whose hash is taken
//! gets the next free value. Ids are computed over every policy of the
//! cluster (not only those applying to this node), so a rule has the same id
//! on every node, across recomputations and agent restarts; only a hash
//! collision (about one in 2^32 per pair of rules) makes an id depend on the
//! other rules present.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{ClusterState, ObjKey};

use super::{Direction, RuleRef};

/// 32-bit FNV-1a.
fn fnv1a(bytes: impl IntoIterator<Item = u8>, mut h: u32) -> u32 {
    for b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The preferred id of a rule (before collision resolution), never 0.
pub fn rule_hash(uid: &str, direction: Direction, index: usize) -> u32 {
    let mut h = fnv1a(uid.bytes(), 0x811c_9dc5);
    h = fnv1a([0xff, direction as u8], h);
    h = fnv1a((index as u64).to_le_bytes(), h);
    if h == 0 {
        1
    } else {
        h
    }
}

/// Every rule of every policy of `state`, keyed by (policy, direction,
/// index), with its id.
pub fn assign(state: &ClusterState) -> BTreeMap<(ObjKey, Direction, usize), RuleRef> {
    let mut keys: Vec<(&str, Direction, usize, &ObjKey)> = Vec::new();
    for (key, p) in &state.policies {
        for i in 0..p.ingress.len() {
            keys.push((&p.uid, Direction::Ingress, i, key));
        }
        for i in 0..p.egress.len() {
            keys.push((&p.uid, Direction::Egress, i, key));
        }
    }
    keys.sort();
    let mut used = BTreeSet::new();
    let mut out = BTreeMap::new();
    for (uid, dir, index, key) in keys {
        let mut id = rule_hash(uid, dir, index);
        while !used.insert(id) {
            id = id.wrapping_add(1).max(1);
        }
        out.insert(
            (key.clone(), dir, index),
            RuleRef {
                id,
                policy: key.clone(),
                uid: uid.to_string(),
                direction: dir,
                index,
            },
        );
    }
    out
}
