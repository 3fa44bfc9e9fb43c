//! The classifier: tuple-space search over one table's flows.
//!
//! ## What it is
//!
//! A [`Classifier`] holds the rules ([`Rule`]) of one OpenFlow table and
//! answers "which is the highest-priority rule matching this key, and which
//! key bits did you look at to decide?". Rules are grouped by mask into
//! *subtables* (one per distinct mask: the "tuples" of tuple-space search).
//! Within a subtable every rule has the same mask, so a key can match at
//! most one *masked value*; the subtable is a hash table from the 64-bit hash
//! of the masked value to a bucket of entries (all rules with that hash,
//! sorted by priority descending, then by age). Only the hash is stored as a
//! key, never the 224-byte masked value: candidates are verified against the
//! rule's own [`Match`](crate::flow::Match), which also takes care of hash
//! collisions. A lookup therefore costs one hash and one short bucket scan
//! per *distinct mask*, independent of the number of rules.
//!
//! Subtables are kept sorted by the highest priority they contain. A lookup
//! probes them in that order and stops as soon as the next subtable's max
//! priority is below the best ordinary match found so far: nothing in it
//! could win. Every subtable probed ORs its mask into the caller's wildcard
//! mask `wc` (except `conj_id` bits, which are internal to the lookup): the
//! result depends on exactly those bits, which is what makes megaflows
//! correct, including the bits of higher-priority subtables that did *not*
//! match (a packet differing in those bits could have hit them).
//!
//! ## Staged lookup (keeping megaflows general)
//!
//! Probing a subtable with its whole mask would unwildcard every field the
//! subtable matches on, even when the packet is ruled out by its first
//! fields: an IPv4 packet probing an ARP subtable (`arp,arp_sha=...`) would
//! pull `arp_sha` into the megaflow, and a packet from the wrong pod probing
//! a policy subtable (`in_port=3,ip,nw_src=...,tp_dst=80`) would pull
//! `nw_src` and `tp_dst` in. As OVS does, each subtable also indexes its
//! rules by *stage*: metadata (in_port, registers, conntrack, tunnel), then
//! metadata + L2, then + L3. A probe checks the stages in that order, and if
//! no rule of the subtable agrees with the key on a stage's bits, it stops
//! there and unwildcards only those bits: every key agreeing on them misses
//! the subtable too, so the megaflow stays correct and gets wider. (A hash
//! collision in a stage index only means probing on: less general, never
//! wrong.)
//!
//! ## Ties
//!
//! Two rules with the same priority can match one key only if their masks
//! differ (identical match and priority is one rule: adding it again
//! replaces it). OpenFlow leaves the winner undefined; here the rule that
//! was *added earliest* to the table wins (modifying a rule's actions keeps
//! its age; an add that replaces a rule makes it new). To make that hold,
//! subtables whose max priority *equals* the best match are still probed.
//!
//! ## Conjunctive match (OVS semantics)
//!
//! A rule whose actions are only `conjunction(id,k/n)` (plus `note`s) is a
//! *clause* rule ("soft" below); every other rule is "hard". The lookup
//! follows Open vSwitch's `classifier_lookup` (checked against OVS 3.1
//! `ofproto/trace`):
//!
//! 1. Probe subtables as above. For each subtable, the matching entries form
//!    a list by priority. A hard top entry is a candidate answer. A soft top
//!    entry is remembered as a conjunctive candidate, and the first hard
//!    entry below it in the same list is also a candidate (OVS reaches it by
//!    "falling back" after the soft entries fail). The best hard candidate
//!    is `hard`. Hard wins ties against soft at equal priority.
//! 2. If no soft entry is above `hard`, return `hard`. Otherwise, for each
//!    distinct soft priority `p > hard.priority`, from the highest: the soft
//!    entries at exactly `p` (at most one per probed subtable) are counted
//!    (`count`); conjunction `id` *completes* if for some `n <= count` every
//!    clause `1..=n` is covered by a matching clause rule at `p` carrying
//!    `conjunction(id,k/n)`. (So one rule carrying several clauses of the
//!    same conjunction does not complete it alone: OVS requires at least `n`
//!    clause rules to match at that priority.) Completed ids are tried in
//!    ascending order: the key is copied with `conj_id=id` and looked up
//!    again, *ignoring clause rules* (and, as in OVS, a soft top entry hides
//!    the hard entries below it in that second lookup). The first
//!    second-lookup that finds any rule returns that rule. Note that the
//!    second lookup can return an ordinary rule that does not match on
//!    `conj_id` at all (e.g. a priority-0 catch-all), exactly as OVS does.
//! 3. If no completed conjunction yields a rule, `hard` is the answer.
//!
//! Documented consequences:
//! - clause rules of one conjunction must share a priority: clauses at
//!   different priorities never complete together (OVS treats each
//!   (id, priority) as its own conjunction);
//! - clause rules with the same id and priority but different `n` are
//!   treated as different conjunctions `(id, n)` (OVS lets whichever it sees
//!   first decide `n`; overlapping conjunctions are "unpredictable" in OVS);
//! - when several conjunctions complete at the same priority, the smallest
//!   id whose `conj_id=id` lookup finds a rule wins (OVS: the first to
//!   complete in probe order; its manual calls this unpredictable).
//!
//! ## Invariants
//!
//! - Every stored match is canonical (`value & mask == value`); callers
//!   ([`crate::tables`]) guarantee it.
//! - One rule per (match, priority).
//! - `order` lists every subtable exactly once, sorted by max priority
//!   descending; no subtable is empty.
//! - Lookup never allocates and never locks; it borrows from `&self`.
//!
//! ## Versions
//!
//! A `Classifier` is a value: [`crate::tables`] clones it to build the next
//! table version. Subtables are behind `Arc` and copied on write
//! (`Arc::make_mut`), so a change copies only the subtables it touches;
//! rules are `Arc<Rule>` and are never copied.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use crate::field::{Field, KEY_WORDS};
use crate::flow::{Action, Flow, Match};
use crate::key::{FlowKey, PrehashedU64};
use crate::tables::Rule;

/// Whether `flow` is a conjunctive clause flow: its actions are only
/// `conjunction` (at least one) and `note`.
pub fn is_clause_flow(flow: &Flow) -> bool {
    flow.actions
        .iter()
        .any(|a| matches!(a, Action::Conjunction { .. }))
        && flow
            .actions
            .iter()
            .all(|a| matches!(a, Action::Conjunction { .. } | Action::Note(_)))
}

/// Per-word filter applied to masks before they are OR-ed into a caller's
/// wildcards: clears `conj_id`, which never reaches the datapath.
const fn wc_filter() -> [u64; KEY_WORDS] {
    let mut f = [u64::MAX; KEY_WORDS];
    let s = Field::ConjId.slot();
    // conj_id is 32 bits inside one word (see field.rs).
    let m = ((1u64 << s.bits) - 1) << s.shift;
    f[s.word as usize] &= !m;
    f
}
const WC_FILTER: [u64; KEY_WORDS] = wc_filter();

/// Number of lookup stages before the full mask (see "Staged lookup").
const N_STAGES: usize = 3;

/// Fields of each stage; a stage's mask is the union of its fields and all
/// earlier stages' fields.
const STAGE_FIELDS: [&[Field]; N_STAGES] = [
    &[
        Field::InPort,
        Field::RecircId,
        Field::Metadata,
        Field::Xreg(0),
        Field::Xreg(1),
        Field::Xreg(2),
        Field::Xreg(3),
        Field::Xreg(4),
        Field::Xreg(5),
        Field::Xreg(6),
        Field::Xreg(7),
        Field::TunId,
        Field::TunSrc,
        Field::TunDst,
        Field::TunIpv6Src,
        Field::TunIpv6Dst,
        Field::PktMark,
        Field::CtMark,
        Field::CtState,
        Field::ConjId,
        Field::CtZone,
        Field::CtLabel,
    ],
    &[Field::VlanTci, Field::DlType, Field::DlSrc, Field::DlDst],
    &[
        Field::NwSrc,
        Field::NwDst,
        Field::Ipv6Src,
        Field::Ipv6Dst,
        Field::Ipv6Label,
        Field::NwProto,
        Field::NwTos,
        Field::NwTtl,
        Field::NwFrag,
    ],
];

/// The cumulative stage masks (all-ones over each stage's fields).
fn stage_masks() -> [FlowKey; N_STAGES] {
    let mut out = [FlowKey::ZERO; N_STAGES];
    let mut acc = FlowKey::ZERO;
    for (i, fields) in STAGE_FIELDS.iter().enumerate() {
        for f in *fields {
            acc.mask_field(*f);
        }
        out[i] = acc;
    }
    out
}

/// Hash of `key & mask` over `words` (the nonzero words of `mask`).
#[inline]
fn hash_masked(key: &FlowKey, mask: &FlowKey, words: &[u8]) -> u64 {
    let mut h: u64 = 0x243f_6a88_85a3_08d3;
    for &i in words {
        let i = i as usize;
        h = (h ^ (key.w[i] & mask.w[i])).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    h ^ (h >> 32)
}

/// The indices of the nonzero words of `mask`.
fn nonzero_words(mask: &FlowKey) -> ([u8; KEY_WORDS], u8) {
    let mut words = [0u8; KEY_WORDS];
    let mut n = 0usize;
    for (i, w) in mask.w.iter().enumerate() {
        if *w != 0 {
            words[n] = i as u8;
            n += 1;
        }
    }
    (words, n as u8)
}

/// One stage of a subtable: the subtable's mask cut to the stage, and how
/// many rules have each hash of their value under it.
#[derive(Clone, Debug)]
struct Stage {
    mask: FlowKey,
    words: [u8; KEY_WORDS],
    n_words: u8,
    counts: HashMap<u64, u32, BuildHasherDefault<PrehashedU64>>,
}

impl Stage {
    #[inline]
    fn hash(&self, key: &FlowKey) -> u64 {
        hash_masked(key, &self.mask, &self.words[..self.n_words as usize])
    }
}

type HashIndex = HashMap<u64, Bucket, BuildHasherDefault<PrehashedU64>>;

/// One installed rule plus what the lookup needs without chasing the `Arc`.
#[derive(Clone, Debug)]
struct Entry {
    rule: Arc<Rule>,
    /// Insertion order within the table (smaller = older = wins ties).
    seq: u64,
    priority: u16,
    /// A conjunctive clause rule (see the module doc).
    soft: bool,
    /// The rule's well-formed `conjunction` actions as (id, n, clause bit),
    /// sorted: completion is a merge of these sorted lists (linear in their
    /// total length, however many conjunctions a clause flow carries).
    conj: Arc<[(u32, u8, u64)]>,
}

impl Entry {
    /// Whether `self` beats `other` among hard matches.
    #[inline]
    fn beats(&self, other: Option<&Entry>) -> bool {
        match other {
            None => true,
            Some(o) => {
                self.priority > o.priority || (self.priority == o.priority && self.seq < o.seq)
            }
        }
    }
}

/// All entries whose masked value hashes alike, by priority desc then seq asc.
#[derive(Clone, Debug)]
enum Bucket {
    One(Entry),
    Many(Vec<Entry>),
}

impl Bucket {
    fn entries(&self) -> &[Entry] {
        match self {
            Bucket::One(e) => std::slice::from_ref(e),
            Bucket::Many(v) => v,
        }
    }
}

/// All rules with one mask.
#[derive(Clone, Debug)]
struct Subtable {
    mask: FlowKey,
    /// Indices of the nonzero words of `mask` (only those are hashed/compared).
    words: [u8; KEY_WORDS],
    n_words: u8,
    index: HashIndex,
    /// Number of rules per priority (gives the max priority after deletions).
    prios: BTreeMap<u16, u32>,
    n_rules: usize,
    /// Stage indices, first stage first; stages that would not narrow the
    /// probe (empty, or equal to the previous stage or the full mask) are left out.
    stages: Vec<Stage>,
}

impl Subtable {
    fn new(mask: FlowKey) -> Subtable {
        let (words, n_words) = nonzero_words(&mask);
        let mut stages: Vec<Stage> = Vec::new();
        for stage_mask in stage_masks() {
            let m = mask.and(&stage_mask);
            let prev = stages.last().map_or(FlowKey::ZERO, |s| s.mask);
            if m.is_zero() || m == prev || m == mask {
                continue;
            }
            let (words, n_words) = nonzero_words(&m);
            stages.push(Stage {
                mask: m,
                words,
                n_words,
                counts: HashMap::default(),
            });
        }
        Subtable {
            mask,
            words,
            n_words,
            index: HashIndex::default(),
            prios: BTreeMap::new(),
            n_rules: 0,
            stages,
        }
    }

    /// Checks the stages (module doc, "Staged lookup"). If one rules the
    /// key out, ORs that stage's bits into `wc` and returns false; otherwise
    /// ORs the whole mask into `wc` and returns true (probe the index).
    #[inline]
    fn probe_stages(&self, key: &FlowKey, wc: &mut FlowKey) -> bool {
        for st in &self.stages {
            if !st.counts.contains_key(&st.hash(key)) {
                for &i in &st.words[..st.n_words as usize] {
                    let i = i as usize;
                    wc.w[i] |= st.mask.w[i] & WC_FILTER[i];
                }
                return false;
            }
        }
        self.or_wc(wc);
        true
    }

    fn stages_add(&mut self, value: &FlowKey) {
        for st in &mut self.stages {
            let h = st.hash(value);
            *st.counts.entry(h).or_insert(0) += 1;
        }
    }

    fn stages_remove(&mut self, value: &FlowKey) {
        for st in &mut self.stages {
            let h = st.hash(value);
            if let Some(c) = st.counts.get_mut(&h) {
                *c -= 1;
                if *c == 0 {
                    st.counts.remove(&h);
                }
            }
        }
    }

    #[inline]
    fn words(&self) -> &[u8] {
        &self.words[..self.n_words as usize]
    }

    /// Hash of `key & mask` over the mask's words.
    #[inline]
    fn hash(&self, key: &FlowKey) -> u64 {
        hash_masked(key, &self.mask, self.words())
    }

    /// Whether `key & mask == value` (the value of a rule of this subtable).
    #[inline]
    fn key_matches(&self, key: &FlowKey, value: &FlowKey) -> bool {
        self.words().iter().all(|&i| {
            let i = i as usize;
            key.w[i] & self.mask.w[i] == value.w[i]
        })
    }

    #[inline]
    fn or_wc(&self, wc: &mut FlowKey) {
        for &i in self.words() {
            let i = i as usize;
            wc.w[i] |= self.mask.w[i] & WC_FILTER[i];
        }
    }

    /// The entries matching `key`, best first.
    #[inline]
    fn matching<'s: 'k, 'k>(&'s self, key: &'k FlowKey) -> impl Iterator<Item = &'s Entry> + 'k {
        let bucket = self.index.get(&self.hash(key));
        bucket
            .map(Bucket::entries)
            .unwrap_or(&[])
            .iter()
            .filter(move |e| self.key_matches(key, &e.rule.flow.matches.value))
    }

    fn max_priority(&self) -> Option<u16> {
        self.prios.last_key_value().map(|(p, _)| *p)
    }

    /// Inserts, replacing the entry with the identical match and priority.
    fn insert(&mut self, entry: Entry) -> Option<Entry> {
        let h = self.hash(&entry.rule.flow.matches.value);
        let value = entry.rule.flow.matches.value;
        let pos_of = |v: &[Entry]| {
            v.iter()
                .position(|e| e.priority == entry.priority && e.rule.flow.matches.value == value)
        };
        let old = match self.index.get_mut(&h) {
            None => {
                self.index.insert(h, Bucket::One(entry.clone()));
                None
            }
            Some(bucket) => {
                let mut v = match std::mem::replace(bucket, Bucket::Many(Vec::new())) {
                    Bucket::One(e) => vec![e],
                    Bucket::Many(v) => v,
                };
                let old = pos_of(&v).map(|i| v.remove(i));
                let at = v
                    .iter()
                    .position(|e| {
                        (e.priority, std::cmp::Reverse(e.seq))
                            < (entry.priority, std::cmp::Reverse(entry.seq))
                    })
                    .unwrap_or(v.len());
                v.insert(at, entry.clone());
                *bucket = match <[Entry; 1]>::try_from(v) {
                    Ok([only]) => Bucket::One(only),
                    Err(v) => Bucket::Many(v),
                };
                old
            }
        };
        if old.is_none() {
            self.n_rules += 1;
            *self.prios.entry(entry.priority).or_insert(0) += 1;
            self.stages_add(&value);
        }
        old
    }

    fn find(&self, m: &Match, priority: u16) -> Option<&Entry> {
        self.index
            .get(&self.hash(&m.value))?
            .entries()
            .iter()
            .find(|e| e.priority == priority && e.rule.flow.matches.value == m.value)
    }

    fn remove(&mut self, m: &Match, priority: u16) -> Option<Entry> {
        let h = self.hash(&m.value);
        let bucket = self.index.get_mut(&h)?;
        let removed = match bucket {
            Bucket::One(e) => {
                if e.priority == priority && e.rule.flow.matches.value == m.value {
                    self.index.remove(&h).map(|b| match b {
                        Bucket::One(e) => e,
                        Bucket::Many(mut v) => v.remove(0),
                    })
                } else {
                    None
                }
            }
            Bucket::Many(v) => {
                let i = v
                    .iter()
                    .position(|e| e.priority == priority && e.rule.flow.matches.value == m.value)?;
                let e = v.remove(i);
                if v.len() == 1 {
                    if let Some(last) = v.pop() {
                        *bucket = Bucket::One(last);
                    }
                }
                Some(e)
            }
        }?;
        self.stages_remove(&m.value);
        self.n_rules -= 1;
        if let Some(c) = self.prios.get_mut(&priority) {
            *c -= 1;
            if *c == 0 {
                self.prios.remove(&priority);
            }
        }
        Some(removed)
    }
}

/// The rules of one table, organised for tuple-space search (module doc).
#[derive(Clone, Debug, Default)]
pub struct Classifier {
    /// Subtables, in no particular order (indices are stable until a
    /// subtable is removed).
    subtables: Vec<Arc<Subtable>>,
    /// Subtable index by mask.
    by_mask: HashMap<FlowKey, u32>,
    /// (max priority, subtable index), max priority descending.
    order: Vec<(u16, u32)>,
    n_rules: usize,
    next_seq: u64,
    /// Rules whose actions hold a `learn` with `delete_learned` (so the
    /// tables know when to look for the flows they learned).
    n_delete_learned: usize,
}

impl Classifier {
    /// An empty classifier.
    pub fn new() -> Self {
        Classifier::default()
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.n_rules
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.n_rules == 0
    }

    /// Whether a rule's actions hold a `learn` with `delete_learned`.
    pub fn has_delete_learned(&self) -> bool {
        self.n_delete_learned > 0
    }

    /// Number of subtables (distinct masks).
    pub fn n_subtables(&self) -> usize {
        self.subtables.len()
    }

    /// Inserts `rule` as a new rule (newest for tie-breaking). A rule with the
    /// identical match and priority is replaced and returned. The rule's
    /// match must be canonical (`value & mask == value`).
    pub fn insert(&mut self, rule: Arc<Rule>) -> Option<Arc<Rule>> {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.insert_entry(rule, seq)
    }

    /// Replaces the rule with the same match and priority as `rule`, keeping
    /// its age (for modify: tie-breaking does not change). Returns the old
    /// rule, or `None` (and inserts nothing) if there was none.
    pub fn replace(&mut self, rule: Arc<Rule>) -> Option<Arc<Rule>> {
        let f = &rule.flow;
        let seq = self.find_entry(&f.matches, f.priority)?.seq;
        self.insert_entry(rule, seq)
    }

    fn insert_entry(&mut self, rule: Arc<Rule>, seq: u64) -> Option<Arc<Rule>> {
        let mask = rule.flow.matches.mask;
        let soft = is_clause_flow(&rule.flow);
        let mut conj: Vec<(u32, u8, u64)> = Vec::new();
        if soft {
            conj = rule
                .flow
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Conjunction {
                        id,
                        clause,
                        n_clauses,
                    } if *clause >= 1 && clause <= n_clauses && *n_clauses <= 64 => {
                        Some((*id, *n_clauses, 1u64 << (clause - 1)))
                    }
                    _ => None,
                })
                .collect();
            conj.sort_unstable();
        }
        let entry = Entry {
            seq,
            priority: rule.flow.priority,
            soft,
            conj: conj.into(),
            rule,
        };
        let idx = match self.by_mask.get(&mask) {
            Some(&i) => i,
            None => {
                let i = self.subtables.len() as u32;
                self.subtables.push(Arc::new(Subtable::new(mask)));
                self.by_mask.insert(mask, i);
                i
            }
        };
        if crate::learn::has_delete_learned(&entry.rule.flow.actions) {
            self.n_delete_learned += 1;
        }
        let st = Arc::make_mut(&mut self.subtables[idx as usize]);
        let old = st.insert(entry);
        match &old {
            None => self.n_rules += 1,
            Some(e) if crate::learn::has_delete_learned(&e.rule.flow.actions) => {
                self.n_delete_learned -= 1;
            }
            Some(_) => {}
        }
        self.reorder(idx);
        old.map(|e| e.rule)
    }

    /// The rule with exactly this match and priority.
    pub fn find_exact(&self, m: &Match, priority: u16) -> Option<&Arc<Rule>> {
        self.find_entry(m, priority).map(|e| &e.rule)
    }

    fn find_entry(&self, m: &Match, priority: u16) -> Option<&Entry> {
        let &i = self.by_mask.get(&m.mask)?;
        self.subtables.get(i as usize)?.find(m, priority)
    }

    /// Removes the rule with exactly this match and priority.
    pub fn remove(&mut self, m: &Match, priority: u16) -> Option<Arc<Rule>> {
        let &idx = self.by_mask.get(&m.mask)?;
        let st = Arc::make_mut(self.subtables.get_mut(idx as usize)?);
        let e = st.remove(m, priority)?;
        self.n_rules -= 1;
        if crate::learn::has_delete_learned(&e.rule.flow.actions) {
            self.n_delete_learned -= 1;
        }
        if st.n_rules == 0 {
            self.remove_subtable(idx);
        } else {
            self.reorder(idx);
        }
        Some(e.rule)
    }

    fn remove_subtable(&mut self, idx: u32) {
        let st = self.subtables.swap_remove(idx as usize);
        self.by_mask.remove(&st.mask);
        self.order.retain(|&(_, i)| i != idx);
        let moved = self.subtables.len() as u32;
        if idx != moved {
            // The last subtable now lives at `idx`.
            if let Some(st) = self.subtables.get(idx as usize) {
                self.by_mask.insert(st.mask, idx);
            }
            for o in &mut self.order {
                if o.1 == moved {
                    o.1 = idx;
                }
            }
        }
    }

    /// Puts subtable `idx` at its place in `order` after its max priority changed.
    fn reorder(&mut self, idx: u32) {
        let Some(maxp) = self
            .subtables
            .get(idx as usize)
            .and_then(|s| s.max_priority())
        else {
            return;
        };
        if let Some(pos) = self.order.iter().position(|&(_, i)| i == idx) {
            if self.order[pos].0 == maxp {
                return;
            }
            self.order.remove(pos);
        }
        let at = self.order.partition_point(|&(p, _)| p >= maxp);
        self.order.insert(at, (maxp, idx));
    }

    /// Every rule, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Rule>> + '_ {
        self.entries().map(|e| &e.rule)
    }

    fn entries(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.subtables
            .iter()
            .flat_map(|st| st.index.values().flat_map(|b| b.entries().iter()))
    }

    /// Every rule by priority descending, then age (oldest first): the order
    /// in which they win ties, and the `dump-flows` order.
    pub fn sorted(&self) -> Vec<&Arc<Rule>> {
        let mut v: Vec<&Entry> = self.entries().collect();
        v.sort_by_key(|e| (std::cmp::Reverse(e.priority), e.seq));
        v.into_iter().map(|e| &e.rule).collect()
    }

    /// The highest-priority rule matching `key` (conjunctions resolved; see
    /// the module doc), OR-ing the mask of every subtable probed into `wc`
    /// (`conj_id` excluded). Never allocates.
    pub fn lookup(&self, key: &FlowKey, wc: &mut FlowKey) -> Option<&Arc<Rule>> {
        self.lookup_entry(key, wc, true).map(|e| &e.rule)
    }

    fn lookup_entry(&self, key: &FlowKey, wc: &mut FlowKey, allow_conj: bool) -> Option<&Entry> {
        let mut hard: Option<&Entry> = None;
        let mut max_soft: Option<u16> = None;
        let mut probed = 0usize;
        for &(maxp, idx) in &self.order {
            if hard.is_some_and(|h| maxp < h.priority) {
                break;
            }
            probed += 1;
            let Some(st) = self.subtables.get(idx as usize) else {
                continue;
            };
            if !st.probe_stages(key, wc) {
                continue;
            }
            let mut it = st.matching(key);
            let Some(top) = it.next() else {
                continue;
            };
            if !top.soft {
                if top.beats(hard) {
                    hard = Some(top);
                }
            } else if allow_conj {
                max_soft = max_soft.max(Some(top.priority));
                // The first hard entry under the clause entries is reached by
                // OVS's fall-back when they fail; it is a candidate too.
                if let Some(h) = it.find(|e| !e.soft) {
                    if h.beats(hard) {
                        hard = Some(h);
                    }
                }
            }
        }
        let floor = hard.map_or(-1, |h| i32::from(h.priority));
        let soft_above = matches!(max_soft, Some(p) if i32::from(p) > floor);
        if !soft_above {
            return hard;
        }
        let probed_order = self.order.get(..probed).unwrap_or(&[]);
        let mut ceiling = i32::MAX;
        loop {
            // Next soft level: the highest clause priority in (floor, ceiling).
            let mut level: Option<u16> = None;
            for st in self.probed(probed_order) {
                for e in st.matching(key) {
                    if !e.soft || i32::from(e.priority) <= floor {
                        break;
                    }
                    if i32::from(e.priority) < ceiling {
                        level = level.max(Some(e.priority));
                        break;
                    }
                }
            }
            let Some(p) = level else {
                return hard;
            };
            let count = self.soft_at(probed_order, key, p).count();
            let mut last_id: Option<u32> = None;
            while let Some(id) = self.next_completed(probed_order, key, p, count, last_id) {
                last_id = Some(id);
                let mut k2 = *key;
                k2.set(Field::ConjId, u128::from(id));
                if let Some(r) = self.lookup_entry(&k2, wc, false) {
                    return Some(r);
                }
            }
            ceiling = i32::from(p);
        }
    }

    fn probed<'a>(
        &'a self,
        probed_order: &'a [(u16, u32)],
    ) -> impl Iterator<Item = &'a Subtable> + 'a {
        probed_order
            .iter()
            .filter_map(|&(_, i)| self.subtables.get(i as usize).map(|s| &**s))
    }

    /// The clause entries at exactly priority `p` that are visible (no hard
    /// entry above them in their subtable's matching list): at most one per
    /// probed subtable.
    fn soft_at<'a>(
        &'a self,
        probed_order: &'a [(u16, u32)],
        key: &'a FlowKey,
        p: u16,
    ) -> impl Iterator<Item = &'a Entry> + 'a {
        self.probed(probed_order).filter_map(move |st| {
            st.matching(key)
                .take_while(|e| e.soft && e.priority >= p)
                .find(|e| e.priority == p)
        })
    }

    /// The smallest conjunction id greater than `after` that completes at
    /// priority `p` (module doc), if any. A k-way merge of the clause
    /// entries' sorted conjunction lists: linear in their total length
    /// (times the number of clause entries, which is at most one per probed
    /// subtable). Allocation-free for up to [`MERGE_WAYS`] clause entries;
    /// beyond that (absurd tables) it falls back to a quadratic scan.
    fn next_completed(
        &self,
        probed_order: &[(u16, u32)],
        key: &FlowKey,
        p: u16,
        count: usize,
        after: Option<u32>,
    ) -> Option<u32> {
        let mut lists: [&[(u32, u8, u64)]; MERGE_WAYS] = [&[]; MERGE_WAYS];
        let mut k = 0usize;
        for e in self.soft_at(probed_order, key, p) {
            if k == MERGE_WAYS {
                return self.next_completed_slow(probed_order, key, p, count, after);
            }
            // Skip ids <= after.
            let from = after.map_or(0, |a| e.conj.partition_point(|c| c.0 <= a));
            lists[k] = e.conj.get(from..).unwrap_or(&[]);
            k += 1;
        }
        let lists = &mut lists[..k];
        loop {
            // The smallest (id, n) at the head of any list.
            let head = lists
                .iter()
                .filter_map(|l| l.first().map(|c| (c.0, c.1)))
                .min()?;
            let mut bits = 0u64;
            for l in lists.iter_mut() {
                while let Some(&(id, n, bit)) = l.first() {
                    if (id, n) != head {
                        break;
                    }
                    bits |= bit;
                    *l = l.get(1..).unwrap_or(&[]);
                }
            }
            let (id, n) = head;
            let full = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
            if usize::from(n) <= count && bits == full {
                return Some(id);
            }
        }
    }

    /// [`Self::next_completed`] for more than [`MERGE_WAYS`] clause entries.
    fn next_completed_slow(
        &self,
        probed_order: &[(u16, u32)],
        key: &FlowKey,
        p: u16,
        count: usize,
        after: Option<u32>,
    ) -> Option<u32> {
        let mut best: Option<u32> = None;
        for e in self.soft_at(probed_order, key, p) {
            for &(id, n, _) in e.conj.iter() {
                if usize::from(n) > count
                    || after.is_some_and(|a| id <= a)
                    || best.is_some_and(|b| id >= b)
                {
                    continue;
                }
                let mut bits = 0u64;
                for e2 in self.soft_at(probed_order, key, p) {
                    for &(id2, n2, bit) in e2.conj.iter() {
                        if id2 == id && n2 == n {
                            bits |= bit;
                        }
                    }
                }
                let full = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
                if bits == full {
                    best = Some(id);
                }
            }
        }
        best
    }
}

/// Clause entries merged without allocating in [`Classifier::next_completed`].
const MERGE_WAYS: usize = 32;

#[cfg(test)]
mod tests;
