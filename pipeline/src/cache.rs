//! The two flow-cache tiers in front of the slow path: the **exact-match
//! cache** (EMC) and the **megaflow cache**.
//!
//! A packet's key is looked up in three tiers, named the same way in code,
//! stats and docs:
//!
//! 1. **exact-match cache** ([`ExactMatchCache`], one per datapath thread): a
//!    fixed array of slots indexed by the key's hash, probed at two positions
//!    (2-way). A slot stores the *whole* key and a handle (an `Arc`) to the
//!    megaflow entry it resolved to. A hit costs one hash and one key compare.
//! 2. **megaflow cache** ([`MegaflowCache`]): tuple-space search. One hash
//!    table ("subtable") per distinct mask; an entry is `(key & mask, mask)
//!    -> actions`. A lookup masks the key with each subtable's mask in turn
//!    and probes that subtable. Subtables are re-ranked by hit count every
//!    [`MegaflowCache::RANK_INTERVAL`] lookups so the busiest are probed first.
//! 3. the **slow path** ([`crate::xlate::translate`]), whose result (with its
//!    wildcard mask) is installed as a new megaflow; see [`crate::datapath`].
//!
//! ## Invariants
//!
//! - Any megaflow that matches a key gives the right answer for it: the
//!   slow path's wildcard mask covers every bit its result depended on. So
//!   overlapping megaflows are harmless, and the probing order only affects
//!   speed.
//! - Both tiers belong to one table version: [`FlowCaches::revalidate`]
//!   empties both as soon as [`crate::tables::TableSet::generation`] differs
//!   from the one they were filled under (correctness over cleverness: no
//!   partial revalidation).
//! - An EMC slot never outlives its megaflow's validity: evicting or
//!   flushing a megaflow marks the entry dead, and an EMC hit on a dead entry
//!   is a miss.
//! - Bounded: the EMC has a fixed number of slots; the megaflow cache holds
//!   at most `max_entries` entries and evicts one (from the least-hit
//!   subtable) to make room.
//!
//! ## Concurrency and cost
//!
//! Everything here is owned by one datapath thread (`&mut self`), so nothing
//! locks. A hit allocates nothing; the caller clones the entry's `Arc` (one
//! uncontended atomic increment) to keep the actions while it executes them.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use crate::field::KEY_WORDS;
use crate::key::PrehashedU64;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::key::FlowKey;
use crate::odp::DpAction;
use crate::tables::Rule;

/// Which tier answered a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheTier {
    /// The exact-match cache.
    ExactMatch,
    /// The megaflow cache.
    Megaflow,
    /// Neither: the slow path translated the key.
    SlowPath,
}

/// One megaflow: every key `k` with `k & mask == value` gets `actions`.
#[derive(Debug)]
pub struct MegaflowEntry {
    /// The masked key (`key & mask` of the packet that was translated).
    pub value: FlowKey,
    /// Which key bits the slow path consulted.
    pub mask: FlowKey,
    /// What the datapath does with a matching packet.
    pub actions: Box<[DpAction]>,
    /// The OpenFlow rules the translation went through (credited per packet).
    pub rules: Box<[Arc<Rule>]>,
    /// Packets and bytes that used this megaflow (credited per batch).
    pub n_packets: AtomicU64,
    pub n_bytes: AtomicU64,
    alive: AtomicBool,
}

impl MegaflowEntry {
    /// A new (live) entry; `value` is masked here.
    pub fn new(
        key: &FlowKey,
        mask: FlowKey,
        actions: Box<[DpAction]>,
        rules: Box<[Arc<Rule>]>,
    ) -> MegaflowEntry {
        MegaflowEntry {
            value: key.and(&mask),
            mask,
            actions,
            rules,
            n_packets: AtomicU64::new(0),
            n_bytes: AtomicU64::new(0),
            alive: AtomicBool::new(true),
        }
    }

    /// Whether the entry is still in the megaflow cache (not evicted/flushed).
    #[inline]
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    fn kill(&self) {
        self.alive.store(false, Ordering::Relaxed);
    }

    /// One line describing the megaflow, like `ofproto/trace`'s
    /// `Megaflow:` line followed by its actions and counters:
    /// `recirc_id=0,ip,in_port=1,nw_dst=10.0.0.0/24, packets:3, bytes:294, actions:2`.
    pub fn format(&self) -> String {
        let m = crate::flow::Match {
            value: self.value,
            mask: self.mask,
        };
        let mut s = crate::print::format_match(&m);
        if s.is_empty() {
            s.push_str("<any>");
        }
        s.push_str(&format!(
            ", packets:{}, bytes:{}, actions:{}",
            self.n_packets.load(Ordering::Relaxed),
            self.n_bytes.load(Ordering::Relaxed),
            crate::odp::format_dp_actions_for_key(&self.actions, &self.value)
        ));
        s
    }

    /// Adds packets/bytes to this entry and to every rule it went through.
    pub fn credit(&self, packets: u64, bytes: u64, now_ns: u64) {
        self.n_packets.fetch_add(packets, Ordering::Relaxed);
        self.n_bytes.fetch_add(bytes, Ordering::Relaxed);
        for r in self.rules.iter() {
            r.credit(packets, bytes, now_ns);
        }
    }
}

// ---- exact-match cache -------------------------------------------------

#[derive(Debug)]
struct EmcSlot {
    hash: u64,
    key: FlowKey,
    flow: Arc<MegaflowEntry>,
}

/// The exact-match cache (see the module doc). Size is a power of two; 0
/// disables it.
#[derive(Debug)]
pub struct ExactMatchCache {
    slots: Box<[Option<EmcSlot>]>,
    mask: usize,
}

impl ExactMatchCache {
    /// Default number of slots.
    pub const DEFAULT_ENTRIES: usize = 8192;

    /// A cache of `entries` slots, rounded up to a power of two (0 = disabled).
    pub fn new(entries: usize) -> ExactMatchCache {
        let n = if entries == 0 {
            0
        } else {
            entries.next_power_of_two()
        };
        ExactMatchCache {
            slots: (0..n).map(|_| None).collect(),
            mask: n.saturating_sub(1),
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Number of occupied slots (live or not).
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Whether no slot is occupied.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[inline]
    fn positions(&self, hash: u64) -> [usize; 2] {
        [hash as usize & self.mask, (hash >> 32) as usize & self.mask]
    }

    /// The live megaflow entry cached for exactly `key` (whose
    /// [`FlowKey::hash64`] is `hash`).
    #[inline]
    pub fn lookup(&self, key: &FlowKey, hash: u64) -> Option<&Arc<MegaflowEntry>> {
        if self.slots.is_empty() {
            return None;
        }
        for i in self.positions(hash) {
            if let Some(Some(s)) = self.slots.get(i) {
                if s.hash == hash && s.key == *key && s.flow.is_alive() {
                    return Some(&s.flow);
                }
            }
        }
        None
    }

    /// Caches `key -> flow`, replacing an empty, dead or same-key slot if
    /// one of the two positions has one, else one chosen by a hash bit.
    pub fn insert(&mut self, key: &FlowKey, hash: u64, flow: Arc<MegaflowEntry>) {
        if self.slots.is_empty() {
            return;
        }
        let pos = self.positions(hash);
        let reusable = |s: &Option<EmcSlot>| match s {
            None => true,
            Some(s) => !s.flow.is_alive() || (s.hash == hash && s.key == *key),
        };
        let i = pos
            .into_iter()
            .find(|&i| self.slots.get(i).is_some_and(reusable))
            .unwrap_or(pos[(hash >> 63) as usize]);
        if let Some(slot) = self.slots.get_mut(i) {
            *slot = Some(EmcSlot {
                hash,
                key: *key,
                flow,
            });
        }
    }

    /// Empties every slot.
    pub fn flush(&mut self) {
        for s in self.slots.iter_mut() {
            *s = None;
        }
    }
}

// ---- megaflow cache ------------------------------------------------------

/// One subtable's megaflows by the hash of their masked value. Two values
/// with the same hash cannot both be cached (the newer one replaces the
/// older): a lookup always verifies the value, so a collision costs a
/// slow-path trip, never a wrong answer.
type HashedMap = HashMap<u64, Arc<MegaflowEntry>, BuildHasherDefault<PrehashedU64>>;

/// All megaflows with one mask. Only the mask's nonzero words are hashed
/// and compared (megaflow masks are sparse: typically a third of the key).
#[derive(Debug)]
struct Subtable {
    mask: FlowKey,
    words: [u8; KEY_WORDS],
    n_words: u8,
    entries: HashedMap,
    hits: u64,
}

impl Subtable {
    fn new(mask: FlowKey) -> Subtable {
        let mut words = [0u8; KEY_WORDS];
        let mut n = 0usize;
        for (i, w) in mask.w.iter().enumerate() {
            if *w != 0 {
                words[n] = i as u8;
                n += 1;
            }
        }
        Subtable {
            mask,
            words,
            n_words: n as u8,
            entries: HashedMap::default(),
            hits: 0,
        }
    }

    #[inline]
    fn words(&self) -> &[u8] {
        &self.words[..self.n_words as usize]
    }

    /// Hash of `key & mask` over the mask's nonzero words, in two
    /// independent lanes (so the multiplications overlap), then mixed.
    #[inline]
    fn hash(&self, key: &FlowKey) -> u64 {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut a: u64 = 0x243f_6a88_85a3_08d3;
        let mut b: u64 = 0x1319_8a2e_0370_7344;
        for pair in self.words().chunks(2) {
            if let Some(&i) = pair.first() {
                let i = i as usize;
                a = (a ^ (key.w[i] & self.mask.w[i]))
                    .wrapping_mul(K)
                    .rotate_left(29);
            }
            if let Some(&i) = pair.get(1) {
                let i = i as usize;
                b = (b ^ (key.w[i] & self.mask.w[i]))
                    .wrapping_mul(K)
                    .rotate_left(29);
            }
        }
        let mut h = a ^ b.rotate_left(32);
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }

    /// Whether `key & mask == value` (a masked value of this subtable).
    #[inline]
    fn matches(&self, key: &FlowKey, value: &FlowKey) -> bool {
        self.words().iter().all(|&i| {
            let i = i as usize;
            key.w[i] & self.mask.w[i] == value.w[i]
        })
    }
}

/// The megaflow cache (see the module doc). `max_entries == 0` disables it.
#[derive(Debug)]
pub struct MegaflowCache {
    subtables: Vec<Subtable>,
    len: usize,
    max_entries: usize,
    lookups: u32,
    evictions: u64,
}

impl MegaflowCache {
    /// Default bound on the number of megaflows.
    pub const DEFAULT_MAX_ENTRIES: usize = 65_536;
    /// Lookups between two re-rankings of the subtables.
    pub const RANK_INTERVAL: u32 = 1024;

    /// An empty cache holding at most `max_entries` megaflows.
    pub fn new(max_entries: usize) -> MegaflowCache {
        MegaflowCache {
            subtables: Vec::new(),
            len: 0,
            max_entries,
            lookups: 0,
            evictions: 0,
        }
    }

    /// Number of megaflows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no megaflows.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of distinct masks (subtables).
    pub fn n_subtables(&self) -> usize {
        self.subtables.len()
    }

    /// Megaflows evicted to make room so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The subtable masks in probing order (for tests and debugging).
    pub fn masks(&self) -> impl Iterator<Item = &FlowKey> {
        self.subtables.iter().map(|s| &s.mask)
    }

    /// Every megaflow, subtable by subtable (for dumps).
    pub fn entries(&self) -> impl Iterator<Item = &Arc<MegaflowEntry>> {
        self.subtables.iter().flat_map(|s| s.entries.values())
    }

    /// The megaflow matching `key`, probing subtables in rank order.
    #[inline]
    pub fn lookup(&mut self, key: &FlowKey) -> Option<&Arc<MegaflowEntry>> {
        self.lookups += 1;
        if self.lookups >= Self::RANK_INTERVAL {
            self.rerank();
        }
        for s in self.subtables.iter_mut() {
            let h = s.hash(key);
            if let Some(e) = s.entries.get(&h) {
                if s.matches(key, &e.value) {
                    s.hits += 1;
                    return Some(e);
                }
            }
        }
        None
    }

    /// Sorts subtables by hits (most first) and halves the counts, so the
    /// ranking follows recent traffic.
    pub fn rerank(&mut self) {
        self.lookups = 0;
        self.subtables
            .sort_unstable_by_key(|s| std::cmp::Reverse(s.hits));
        for s in &mut self.subtables {
            s.hits /= 2;
        }
    }

    /// Installs a megaflow (replacing one with the same value and mask) and
    /// returns it. With `max_entries == 0` the entry is returned but not kept.
    pub fn insert(&mut self, entry: MegaflowEntry) -> Arc<MegaflowEntry> {
        let entry = Arc::new(entry);
        if self.max_entries == 0 {
            entry.kill();
            return entry;
        }
        if self.len >= self.max_entries {
            self.evict_one();
        }
        let i = match self.subtables.iter().position(|s| s.mask == entry.mask) {
            Some(i) => i,
            None => {
                self.subtables.push(Subtable::new(entry.mask));
                self.subtables.len() - 1
            }
        };
        let st = &mut self.subtables[i];
        let h = st.hash(&entry.value);
        let old = st.entries.insert(h, Arc::clone(&entry));
        match old {
            Some(old) => old.kill(),
            None => self.len += 1,
        }
        entry
    }

    /// Removes one megaflow from the least-hit subtable (the last after
    /// ranking, or any when none has hits).
    fn evict_one(&mut self) {
        let Some(i) = self
            .subtables
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.hits)
            .map(|(i, _)| i)
        else {
            return;
        };
        let s = &mut self.subtables[i];
        if let Some(k) = s.entries.keys().next().copied() {
            if let Some(e) = s.entries.remove(&k) {
                e.kill();
                self.len -= 1;
                self.evictions += 1;
            }
        }
        if s.entries.is_empty() {
            self.subtables.remove(i);
        }
    }

    /// Removes every megaflow (marking each dead, so EMC slots pointing to
    /// them stop hitting).
    pub fn flush(&mut self) {
        for s in &self.subtables {
            for e in s.entries.values() {
                e.kill();
            }
        }
        self.subtables.clear();
        self.len = 0;
    }
}

// ---- both tiers ------------------------------------------------------------

/// Counters of the cache tiers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered by the exact-match cache.
    pub emc_hits: u64,
    /// Lookups answered by the megaflow cache.
    pub megaflow_hits: u64,
    /// Lookups that missed both tiers (the caller goes to the slow path).
    pub misses: u64,
    /// Megaflows installed.
    pub megaflow_inserts: u64,
    /// Times both tiers were emptied (table generation changes and explicit flushes).
    pub flushes: u64,
}

/// The exact-match and megaflow caches of one datapath thread, tied to one
/// table generation.
#[derive(Debug)]
pub struct FlowCaches {
    /// The exact-match tier.
    pub emc: ExactMatchCache,
    /// The megaflow tier.
    pub megaflows: MegaflowCache,
    generation: Option<u64>,
    stats: CacheStats,
}

impl FlowCaches {
    /// Caches with `emc_entries` EMC slots and at most `megaflow_max` megaflows.
    pub fn new(emc_entries: usize, megaflow_max: usize) -> FlowCaches {
        FlowCaches {
            emc: ExactMatchCache::new(emc_entries),
            megaflows: MegaflowCache::new(megaflow_max),
            generation: None,
            stats: CacheStats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    /// The table generation the cached entries belong to.
    pub fn generation(&self) -> Option<u64> {
        self.generation
    }

    /// Makes the caches belong to table generation `generation`: if they were
    /// filled under another one, empties both tiers first.
    #[inline]
    pub fn revalidate(&mut self, generation: u64) {
        if self.generation != Some(generation) {
            if self.generation.is_some() {
                self.flush();
            }
            self.generation = Some(generation);
        }
    }

    /// Empties both tiers.
    pub fn flush(&mut self) {
        self.emc.flush();
        self.megaflows.flush();
        self.stats.flushes += 1;
    }

    /// Looks `key` up in the exact-match cache, then the megaflow cache (a
    /// megaflow hit is then cached in the EMC). `None` = go to the slow path.
    #[inline]
    pub fn lookup(&mut self, key: &FlowKey) -> Option<(Arc<MegaflowEntry>, CacheTier)> {
        let hash = key.hash64();
        if let Some(e) = self.emc.lookup(key, hash) {
            self.stats.emc_hits += 1;
            return Some((Arc::clone(e), CacheTier::ExactMatch));
        }
        if let Some(e) = self.megaflows.lookup(key) {
            let e = Arc::clone(e);
            self.stats.megaflow_hits += 1;
            self.emc.insert(key, hash, Arc::clone(&e));
            return Some((e, CacheTier::Megaflow));
        }
        self.stats.misses += 1;
        None
    }

    /// Installs a slow-path result for `key` as a megaflow (value = `key &
    /// mask`) and caches it in the EMC.
    pub fn install(
        &mut self,
        key: &FlowKey,
        mask: FlowKey,
        actions: Box<[DpAction]>,
        rules: Box<[Arc<Rule>]>,
    ) -> Arc<MegaflowEntry> {
        let e = self
            .megaflows
            .insert(MegaflowEntry::new(key, mask, actions, rules));
        self.stats.megaflow_inserts += 1;
        if e.is_alive() {
            self.emc.insert(key, key.hash64(), Arc::clone(&e));
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::field::Field;

    fn key(port: u32, dst: u32) -> FlowKey {
        let mut k = FlowKey::ZERO;
        k.set(Field::InPort, port as u128);
        k.set(Field::NwDst, dst as u128);
        k.set(Field::DlType, 0x0800);
        k
    }

    fn mask(fields: &[(Field, u128)]) -> FlowKey {
        let mut m = FlowKey::ZERO;
        for (f, v) in fields {
            m.set(*f, *v);
        }
        m
    }

    fn out(p: u32) -> Box<[DpAction]> {
        vec![DpAction::Output(p)].into_boxed_slice()
    }

    #[test]
    fn miss_install_then_emc_then_megaflow_hit() {
        let mut c = FlowCaches::new(64, 16);
        c.revalidate(1);
        let k = key(1, 0x0a00_0001);
        assert!(c.lookup(&k).is_none());
        let m = mask(&[
            (Field::InPort, u32::MAX as u128),
            (Field::NwDst, 0xffff_ff00),
        ]);
        c.install(&k, m, out(2), Box::new([]));
        let (e, tier) = c.lookup(&k).unwrap();
        assert_eq!(tier, CacheTier::ExactMatch);
        assert_eq!(&*e.actions, &[DpAction::Output(2)]);
        // Same /24, different host: megaflow hit, then EMC.
        let k2 = key(1, 0x0a00_0077);
        assert_eq!(c.lookup(&k2).unwrap().1, CacheTier::Megaflow);
        assert_eq!(c.lookup(&k2).unwrap().1, CacheTier::ExactMatch);
        // Other port or subnet: miss.
        assert!(c.lookup(&key(2, 0x0a00_0001)).is_none());
        assert!(c.lookup(&key(1, 0x0a00_0101)).is_none());
        let s = *c.stats();
        assert_eq!((s.emc_hits, s.megaflow_hits, s.misses), (2, 1, 3));
    }

    #[test]
    fn generation_change_flushes_both_tiers() {
        let mut c = FlowCaches::new(64, 16);
        c.revalidate(7);
        let k = key(1, 5);
        c.install(
            &k,
            mask(&[(Field::InPort, 0xffff_ffff)]),
            out(2),
            Box::new([]),
        );
        c.revalidate(7);
        assert!(c.lookup(&k).is_some());
        c.revalidate(8);
        assert!(c.lookup(&k).is_none());
        assert!(c.megaflows.is_empty());
        assert!(c.emc.is_empty());
        assert_eq!(c.stats().flushes, 1);
    }

    #[test]
    fn megaflow_eviction_is_bounded_and_kills_emc_slot() {
        let mut c = FlowCaches::new(64, 4);
        c.revalidate(0);
        let m = mask(&[(Field::NwDst, 0xffff_ffff)]);
        let mut entries = Vec::new();
        for i in 0..10 {
            entries.push(c.install(&key(1, i), m, out(i), Box::new([])));
        }
        assert_eq!(c.megaflows.len(), 4);
        assert_eq!(c.megaflows.evictions(), 6);
        let alive = entries.iter().filter(|e| e.is_alive()).count();
        assert_eq!(alive, 4);
        for (i, e) in entries.iter().enumerate() {
            let got = c.lookup(&key(1, i as u32));
            // An evicted megaflow is never answered, not even from the EMC.
            assert_eq!(got.is_some(), e.is_alive(), "entry {i}");
        }
    }

    #[test]
    fn emc_is_two_way_and_bounded() {
        let mut emc = ExactMatchCache::new(5);
        assert_eq!(emc.capacity(), 8);
        let e = Arc::new(MegaflowEntry::new(
            &FlowKey::ZERO,
            FlowKey::ZERO,
            out(1),
            Box::new([]),
        ));
        for i in 0..100 {
            let k = key(1, i);
            emc.insert(&k, k.hash64(), Arc::clone(&e));
            assert!(emc.lookup(&k, k.hash64()).is_some());
        }
        assert!(emc.len() <= 8);
        // A key whose hash differs only outside the index bits still misses.
        let k = key(9, 9);
        assert!(emc.lookup(&k, k.hash64()).is_none());
        let disabled = ExactMatchCache::new(0);
        assert!(disabled.lookup(&k, k.hash64()).is_none());
    }

    #[test]
    fn subtables_rerank_by_hits() {
        let mut mc = MegaflowCache::new(100);
        let m1 = mask(&[(Field::InPort, 0xffff_ffff)]);
        let m2 = mask(&[(Field::NwDst, 0xffff_ffff)]);
        mc.insert(MegaflowEntry::new(&key(1, 0), m1, out(1), Box::new([])));
        mc.insert(MegaflowEntry::new(&key(0, 9), m2, out(2), Box::new([])));
        assert_eq!(mc.n_subtables(), 2);
        assert_eq!(mc.masks().next(), Some(&m1));
        for _ in 0..10 {
            assert!(mc.lookup(&key(0, 9)).is_some());
        }
        mc.rerank();
        assert_eq!(mc.masks().next(), Some(&m2));
        // Same value and mask replaces.
        mc.insert(MegaflowEntry::new(&key(0, 9), m2, out(3), Box::new([])));
        assert_eq!(mc.len(), 2);
        assert_eq!(
            &*mc.lookup(&key(5, 9)).unwrap().actions,
            &[DpAction::Output(3)]
        );
    }

    #[test]
    fn megaflow_line() {
        let m = mask(&[
            (Field::RecircId, 0xffff_ffff),
            (Field::InPort, 0xffff_ffff),
            (Field::DlType, 0xffff),
            (Field::NwDst, 0xffff_ff00),
        ]);
        let e = MegaflowEntry::new(&key(1, 0x0a00_0005), m, out(2), Box::new([]));
        e.credit(3, 294, 0);
        let line = e.format();
        assert!(line.contains("in_port=1"), "{line}");
        assert!(line.contains("nw_dst=10.0.0.0/24"), "{line}");
        assert!(
            line.ends_with(", packets:3, bytes:294, actions:2"),
            "{line}"
        );
    }

    #[test]
    fn disabled_megaflow_cache_keeps_nothing() {
        let mut c = FlowCaches::new(0, 0);
        let k = key(1, 1);
        let e = c.install(&k, FlowKey::ZERO, out(1), Box::new([]));
        assert!(!e.is_alive());
        assert!(c.lookup(&k).is_none());
    }
}
