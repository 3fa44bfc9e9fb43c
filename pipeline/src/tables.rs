//! Flow tables, versions and flow mods.
//!
//! ## Versions
//!
//! A [`TableSet`] is one immutable version of all 255 OpenFlow tables, each
//! a [`Classifier`]. [`Pipeline`] publishes the current version through an
//! [`arc_swap::ArcSwap`]: readers ([`Pipeline::snapshot`]) never lock and
//! keep the version they loaded for as long as they like (typically one
//! packet batch). Writers ([`Pipeline::apply`], [`Pipeline::replace_all`],
//! [`Pipeline::expire`]) serialise on a writer-only `Mutex`, build the next
//! version from the current one and publish it with one pointer swap, so a
//! bundle of flow mods is atomic: readers see all of it or none of it, and a
//! bundle with one invalid mod publishes nothing (and leaves the generation
//! unchanged).
//!
//! Unchanged tables are shared between versions (`Arc<Classifier>`); inside
//! a changed table only the touched subtables are copied (see
//! [`crate::classifier`]). Rules are `Arc<Rule>`: a rule that survives a
//! change is the same object in both versions, so packets counted against
//! the old version show up in the new one. When a rule's actions change
//! (modify, or an add that replaces an identical flow) a new `Rule` is made
//! and the counters are copied into it unless `reset_counts` is set, as in
//! OVS (a packet credited to the old object during the swap can be lost).
//!
//! Every successful `apply`/`replace_all` (and every `expire` that removes
//! something) increments [`TableSet::generation`]; caches compare it.
//!
//! ## Flow mod semantics (OpenFlow 1.3 as Open vSwitch implements it)
//!
//! - **Add** goes to `FlowMod::table` if given, else `flow.table`. It
//!   replaces the flow with the identical match and priority: the new flow
//!   takes the new cookie, timeouts and flags and a new creation time, but
//!   keeps the old packet/byte counters unless `reset_counts` is set (OVS
//!   `modify_keep_counts`). With `check_overlap`, the add fails if a flow of
//!   the same priority that could match a common packet exists (an identical
//!   flow counts).
//! - **Modify** (non-strict) changes the actions of every flow in the
//!   table(s) whose match is at least as specific as the given one (every
//!   bit of the given mask is in the flow's mask, and the values agree on
//!   them), whatever its priority; **strict** requires the identical match
//!   and priority. Both filter on `cookie & cookie_mask`. Cookie, timeouts,
//!   flags, creation time and tie-breaking age are kept; counters too unless
//!   the mod has `reset_counts`. Modifying nothing is a no-op (OpenFlow
//!   1.2+; OpenFlow 1.1 added the flow instead).
//! - **Delete** selects like modify, plus `out_port`: only flows with an
//!   `output` to that port (`controller` counts as output to
//!   [`port::CONTROLLER`]). `table: None` means every table for modify and
//!   delete.
//!
//! Validation (each refused with a [`FlowModError`]): table 255 (it means
//! "all tables" in OpenFlow), `conjunction` with `n` outside `2..=64` or
//! `k` outside `1..=n`, `conjunction` mixed with anything but `note`,
//! `goto_table` not last or not to a later table. Like OVS, a flow that
//! matches `conj_id` may itself carry `conjunction` actions, and clause
//! flows of one id with different `n` are accepted (see
//! [`crate::classifier`] for how they behave). Matches are stored canonical
//! (value bits outside the mask are cleared).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::classifier::Classifier;
use crate::flow::{
    port, Action, CtAction, CtZoneSrc, Flow, FlowMod, FlowModCommand, Match, SubField, N_TABLES,
};
use crate::group::{Group, GroupMod, GroupType, GROUP_MAX};
use crate::key::FlowKey;
use crate::meter::{self, Meter, MeterConfig, MeterMod};
use crate::names::TableNames;

/// Counters of one flow, shared by every table version that holds it.
#[derive(Debug, Default)]
pub struct RuleStats {
    pub n_packets: AtomicU64,
    pub n_bytes: AtomicU64,
    /// Time of the last hit (ns, the caller's clock); 0 = never.
    pub last_used_ns: AtomicU64,
    /// When a `learn` last learned this very flow again (ns, the caller's
    /// clock; 0 = never): its hard timeout counts from then, as OVS's
    /// `modified` ([`Pipeline::learn`]).
    pub refreshed_ns: AtomicU64,
}

impl RuleStats {
    /// A copy of the current values (for carrying counters to a new rule).
    fn snapshot(&self) -> RuleStats {
        RuleStats {
            n_packets: AtomicU64::new(self.n_packets.load(Ordering::Relaxed)),
            n_bytes: AtomicU64::new(self.n_bytes.load(Ordering::Relaxed)),
            last_used_ns: AtomicU64::new(self.last_used_ns.load(Ordering::Relaxed)),
            refreshed_ns: AtomicU64::new(self.refreshed_ns.load(Ordering::Relaxed)),
        }
    }
}

/// A flow installed in a table.
#[derive(Debug)]
pub struct Rule {
    pub flow: Flow,
    /// When it was added (ns, the caller's clock).
    pub created_ns: u64,
    pub stats: RuleStats,
}

impl Rule {
    /// Adds `packets`/`bytes` to the counters (relaxed atomics; never blocks).
    pub fn credit(&self, packets: u64, bytes: u64, now_ns: u64) {
        self.stats.n_packets.fetch_add(packets, Ordering::Relaxed);
        self.stats.n_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.stats.last_used_ns.fetch_max(now_ns, Ordering::Relaxed);
    }

    /// Whether the flow has an output action to `port` (the `out_port` filter).
    pub fn outputs_to(&self, out_port: u32) -> bool {
        self.flow.actions.iter().any(|a| match a {
            Action::Output(p) => *p == out_port,
            Action::Controller(_) => out_port == port::CONTROLLER,
            _ => false,
        })
    }

    /// When the flow expires at the latest given its timeouts and last use
    /// (`None` = never). The hard timeout counts from its creation or its
    /// last refresh by a `learn`, the idle timeout from its last hit (or
    /// its creation).
    pub fn expires_at(&self) -> Option<u64> {
        const NS: u64 = 1_000_000_000;
        let hard = (self.flow.hard_timeout > 0).then(|| {
            self.created_ns
                .max(self.stats.refreshed_ns.load(Ordering::Relaxed))
                .saturating_add(u64::from(self.flow.hard_timeout) * NS)
        });
        let last = self
            .stats
            .last_used_ns
            .load(Ordering::Relaxed)
            .max(self.created_ns);
        let idle = (self.flow.idle_timeout > 0)
            .then(|| last.saturating_add(u64::from(self.flow.idle_timeout) * NS));
        match (hard, idle) {
            (Some(h), Some(i)) => Some(h.min(i)),
            (h, i) => h.or(i),
        }
    }
}

/// One immutable version of all tables.
#[derive(Clone)]
pub struct TableSet {
    generation: u64,
    /// `N_TABLES` classifiers (empty tables share one empty classifier).
    tables: Vec<Arc<Classifier>>,
    /// The group table, by id (shared between versions until changed).
    groups: Arc<BTreeMap<u32, Arc<Group>>>,
    /// The meter table, by id (shared between versions until changed; a
    /// meter keeps its bucket and counters while it is not changed).
    meters: Arc<BTreeMap<u32, Arc<Meter>>>,
}

impl Default for TableSet {
    fn default() -> Self {
        TableSet {
            generation: 0,
            // One shared empty classifier: cloned on first write.
            tables: {
                let empty = Arc::new(Classifier::new());
                vec![empty; N_TABLES]
            },
            groups: Arc::default(),
            meters: Arc::default(),
        }
    }
}

impl std::fmt::Debug for TableSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableSet")
            .field("generation", &self.generation)
            .field("flows", &self.flow_count())
            .finish()
    }
}

impl TableSet {
    /// Bumped by every change; caches compare it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The highest-priority flow of `table` matching `key` (conjunctions
    /// resolved), OR-ing every key bit it consulted into `wc`.
    #[inline]
    pub fn lookup(&self, table: u8, key: &FlowKey, wc: &mut FlowKey) -> Option<&Arc<Rule>> {
        self.tables.get(usize::from(table))?.lookup(key, wc)
    }

    /// The group with this id.
    pub fn group(&self, id: u32) -> Option<&Group> {
        self.groups.get(&id).map(|g| &**g)
    }

    /// Every group, by id.
    pub fn groups(&self) -> impl Iterator<Item = &Arc<Group>> + '_ {
        self.groups.values()
    }

    /// The classifier of one table (`None` for 255).
    /// The meter with this id.
    pub fn meter(&self, id: u32) -> Option<&Arc<Meter>> {
        self.meters.get(&id)
    }

    /// Every meter, by id.
    pub fn meters(&self) -> impl Iterator<Item = &Arc<Meter>> + '_ {
        self.meters.values()
    }

    /// The number of flows whose actions name meter `id` (`meter-stats`'
    /// `flow_count`).
    pub fn meter_flow_count(&self, id: u32) -> u64 {
        self.flows()
            .filter(|r| r.flow.actions.contains(&Action::Meter(id)))
            .count() as u64
    }

    pub fn table(&self, table: u8) -> Option<&Classifier> {
        self.tables.get(usize::from(table)).map(|c| &**c)
    }

    /// The flow of `table` with exactly this match and priority.
    pub fn find_strict(&self, table: u8, m: &Match, priority: u16) -> Option<&Arc<Rule>> {
        self.table(table)?.find_exact(&canonical(m), priority)
    }

    /// The flows of one table, by priority descending (ties: oldest first).
    pub fn flows_in(&self, table: u8) -> Vec<&Arc<Rule>> {
        self.table(table)
            .map(Classifier::sorted)
            .unwrap_or_default()
    }

    /// Every flow in (table, priority descending) order, for `dump-flows`.
    pub fn flows(&self) -> impl Iterator<Item = &Arc<Rule>> + '_ {
        self.tables
            .iter()
            .filter(|c| !c.is_empty())
            .flat_map(|c| c.sorted())
    }

    /// Number of flows in all tables.
    pub fn flow_count(&self) -> usize {
        self.tables.iter().map(|c| c.len()).sum()
    }
}

/// Why a flow mod (or a bundle) was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlowModError {
    #[error("table {0} is out of range (tables are 0..=254)")]
    BadTable(u8),
    #[error("table {table}: a flow with priority {priority} overlapping this match already exists (check_overlap)")]
    Overlap { table: u8, priority: u16 },
    #[error("conjunction({id},{clause}/{n_clauses}): {reason}")]
    BadConjunction {
        id: u32,
        clause: u8,
        n_clauses: u8,
        reason: &'static str,
    },
    #[error("\"conjunction\" actions may be used along with \"note\" but not with any other action (found {0})")]
    ConjunctionWithOtherActions(String),
    #[error("goto_table:{target} in table {table}: goto_table must go to a later table")]
    BadGotoTable { table: u8, target: u8 },
    #[error("goto_table:{0} must be the last action")]
    GotoNotLast(u8),
    /// A sub-field outside its field, a `move` between different widths, or
    /// a `load` value wider than its destination.
    #[error("{action}: {reason}")]
    BadSubField {
        /// The offending action (`Debug` form).
        action: String,
        reason: &'static str,
    },
    /// A `learn` the tables cannot run (built in code rather than parsed).
    #[error("{0}")]
    BadLearn(&'static str),
    #[error("group {0} already exists (OFPGMFC_GROUP_EXISTS)")]
    GroupExists(u32),
    #[error("group {0} does not exist (OFPGMFC_UNKNOWN_GROUP)")]
    UnknownGroup(u32),
    /// A flow's actions name a group that does not exist once the bundle
    /// is applied (OpenFlow's `OFPBAC_BAD_OUT_GROUP`).
    #[error("the actions name group {0}, which does not exist (OFPBAC_BAD_OUT_GROUP)")]
    BadOutGroup(u32),
    /// A group that cannot be installed (built in code rather than parsed).
    #[error("group {id}: {reason}")]
    BadGroup { id: u32, reason: String },
    #[error("meter {0} already exists (OFPMMFC_METER_EXISTS)")]
    MeterExists(u32),
    #[error("meter {0} does not exist (OFPMMFC_UNKNOWN_METER)")]
    UnknownMeter(u32),
    /// A flow's actions name a meter that does not exist once the bundle
    /// is applied (OpenFlow's `OFPMMFC_INVALID_METER`, as OVS answers).
    #[error("the actions name meter {0}, which does not exist (OFPMMFC_INVALID_METER)")]
    InvalidMeter(u32),
    /// A meter that cannot be installed (built in code rather than parsed).
    #[error("meter {id}: {reason}")]
    BadMeter { id: u32, reason: String },
    #[error("flow mod #{index} of the bundle: {error}")]
    InBundle {
        /// 0-based position of the failing mod in the bundle.
        index: usize,
        error: Box<FlowModError>,
    },
}

/// What a successful bundle did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// New flows (nothing with the same match and priority existed).
    pub added: usize,
    /// Adds that replaced a flow with the identical match and priority
    /// (for `replace_all`: flows whose actions, cookie or timeouts changed).
    pub replaced: usize,
    /// Flows whose actions were changed by modify.
    pub modified: usize,
    pub deleted: usize,
    /// Groups added (`add-group`, `mod-group --may-create` of a new id,
    /// `replace_all_with_groups`).
    pub groups_added: usize,
    /// Groups replaced (`mod-group`, `replace_all_with_groups`).
    pub groups_modified: usize,
    /// Groups deleted (the flows deleted with them are in `deleted`).
    pub groups_deleted: usize,
    pub meters_added: usize,
    pub meters_modified: usize,
    /// Meters deleted (the flows deleted with them are in `deleted`).
    pub meters_deleted: usize,
}

/// What [`Pipeline::learn`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LearnReport {
    /// New flows.
    pub added: usize,
    /// Flows that replaced one of the same match and priority with other
    /// actions, cookie, timeouts or flags (counters kept).
    pub replaced: usize,
    /// Identical flows whose hard timeout started again.
    pub refreshed: usize,
    /// Flows the tables refused.
    pub failed: usize,
    /// Flows deleted with a replaced flow's `delete_learned`.
    pub deleted: usize,
}

/// One change of a bundle for [`Pipeline::apply_bundle`].
// A bundle is built once per control request; boxing the flow mod would
// only cost every caller an allocation per flow.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableMod {
    Flow(FlowMod),
    Group(GroupMod),
    Meter(MeterMod),
}

/// A borrowed [`TableMod`] (so [`Pipeline::apply`] does not copy flows).
#[derive(Clone, Copy)]
enum ModRef<'a> {
    Flow(&'a FlowMod),
    Group(&'a GroupMod),
    Meter(&'a MeterMod),
}

/// The flow tables of one switch: the current version plus the writer side.
#[derive(Debug, Default)]
pub struct Pipeline {
    current: arc_swap::ArcSwap<TableSet>,
    names: TableNames,
    /// Serialises writers (readers never take it).
    writer: Mutex<()>,
}

impl Pipeline {
    /// An empty pipeline with the oxvs table names.
    pub fn new() -> Self {
        Pipeline::default()
    }

    /// The current version (lock-free).
    pub fn snapshot(&self) -> Arc<TableSet> {
        self.current.load_full()
    }

    /// Table names for dumps and parsing.
    pub fn names(&self) -> &TableNames {
        &self.names
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        // A panic in another writer cannot leave a half-built version
        // published, so a poisoned lock is safe to take over.
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies a bundle of flow mods atomically: all or none, one new
    /// version. With several mods, an error is wrapped in
    /// [`FlowModError::InBundle`] naming the failing mod.
    pub fn apply(&self, mods: &[FlowMod], now_ns: u64) -> Result<ApplyReport, FlowModError> {
        self.apply_refs(mods.iter().map(ModRef::Flow), mods.len(), now_ns)
    }

    /// Applies a bundle of flow and group mods atomically, in order: all or
    /// none, one new version (the generation bumps once). Deleting a group
    /// deletes the flows that name it; a flow added or modified by the
    /// bundle that names a group missing once the whole bundle is applied
    /// fails the bundle ([`FlowModError::BadOutGroup`]). With several mods,
    /// an error is wrapped in [`FlowModError::InBundle`] naming the failing
    /// mod.
    pub fn apply_bundle(
        &self,
        mods: &[TableMod],
        now_ns: u64,
    ) -> Result<ApplyReport, FlowModError> {
        let refs = mods.iter().map(|m| match m {
            TableMod::Flow(f) => ModRef::Flow(f),
            TableMod::Group(g) => ModRef::Group(g),
            TableMod::Meter(m) => ModRef::Meter(m),
        });
        self.apply_refs(refs, mods.len(), now_ns)
    }

    fn apply_refs<'a>(
        &self,
        mods: impl Iterator<Item = ModRef<'a>>,
        n_mods: usize,
        now_ns: u64,
    ) -> Result<ApplyReport, FlowModError> {
        let wrap = |index: usize, error: FlowModError| {
            if n_mods > 1 {
                FlowModError::InBundle {
                    index,
                    error: Box::new(error),
                }
            } else {
                error
            }
        };
        let _w = self.lock();
        let cur = self.current.load_full();
        let mut next = TableSet::clone(&cur);
        let mut report = ApplyReport::default();
        // (group id, index of the flow mod that names it), and meters.
        let mut named: Vec<(u32, usize)> = Vec::new();
        let mut metered: Vec<(u32, usize)> = Vec::new();
        for (index, m) in mods.enumerate() {
            match m {
                ModRef::Flow(fm) => {
                    apply_one(&mut next, fm, now_ns, &mut report).map_err(|e| wrap(index, e))?;
                    if !matches!(fm.command, FlowModCommand::Delete { .. }) {
                        let mut ids = Vec::new();
                        Group::referenced(&fm.flow.actions, &mut ids);
                        named.extend(ids.into_iter().map(|id| (id, index)));
                        let mut ids = Vec::new();
                        meter::referenced(&fm.flow.actions, &mut ids);
                        metered.extend(ids.into_iter().map(|id| (id, index)));
                    }
                }
                ModRef::Group(gm) => {
                    apply_group(&mut next, gm, &mut report).map_err(|e| wrap(index, e))?;
                }
                ModRef::Meter(mm) => {
                    apply_meter(&mut next, mm, now_ns, &mut report).map_err(|e| wrap(index, e))?;
                }
            }
        }
        // As OVS, an add or modify naming a missing group is refused even
        // if it changed nothing.
        if let Some(&(id, index)) = named.iter().find(|(id, _)| !next.groups.contains_key(id)) {
            return Err(wrap(index, FlowModError::BadOutGroup(id)));
        }
        if let Some(&(id, index)) = metered.iter().find(|(id, _)| !next.meters.contains_key(id)) {
            return Err(wrap(index, FlowModError::InvalidMeter(id)));
        }
        report.deleted += delete_orphaned_learned(&cur, &mut next).len();
        next.generation = cur.generation + 1;
        self.current.store(Arc::new(next));
        Ok(report)
    }

    /// `ovs-ofctl replace-flows`: makes the tables hold exactly `flows` (each
    /// in `flow.table`), as one atomic version. Flows not in `flows` are
    /// deleted; new ones added; a flow whose match and priority exist but
    /// whose actions, cookie, timeouts or importance differ is replaced
    /// (counters kept unless `reset_counts`, new creation time, as the add
    /// ovs-ofctl sends); identical flows are left alone (same `Rule`,
    /// counters and age). If `flows` lists the same match and priority twice
    /// in a table, the last one wins.
    pub fn replace_all(&self, flows: &[Flow], now_ns: u64) -> Result<ApplyReport, FlowModError> {
        self.replace_all_with_groups(flows, None, now_ns)
    }

    /// [`Pipeline::replace_all`], and with `groups` the group table too, in
    /// the same atomic version: groups not listed are deleted, new ones
    /// added, changed ones replaced, identical ones kept (the same object).
    /// Every group a flow names must exist afterwards (flow `index` of
    /// `flows` fails with [`FlowModError::BadOutGroup`] inside
    /// [`FlowModError::InBundle`]); with `groups` `None` the group table
    /// is left as it is. Two groups with one id: the last wins.
    pub fn replace_all_with_groups(
        &self,
        flows: &[Flow],
        groups: Option<&[Group]>,
        now_ns: u64,
    ) -> Result<ApplyReport, FlowModError> {
        if let Some(gs) = groups {
            for g in gs {
                validate_group(g)?;
            }
        }
        let mut per_table: Vec<Vec<Flow>> = vec![Vec::new(); N_TABLES];
        for (index, f) in flows.iter().enumerate() {
            let wrap = |error| FlowModError::InBundle {
                index,
                error: Box::new(error),
            };
            let slot = per_table
                .get_mut(usize::from(f.table))
                .ok_or(FlowModError::BadTable(f.table))
                .map_err(wrap)?;
            let mut f = f.clone();
            f.matches = canonical(&f.matches);
            validate_actions(f.table, &f.actions).map_err(wrap)?;
            slot.push(f);
        }
        let _w = self.lock();
        let cur = self.current.load_full();
        let mut next = TableSet::clone(&cur);
        let mut report = ApplyReport::default();
        if let Some(gs) = groups {
            let mut want: BTreeMap<u32, Arc<Group>> = BTreeMap::new();
            for g in gs {
                let g = match cur.groups.get(&g.id) {
                    Some(old) if **old == *g => Arc::clone(old),
                    _ => Arc::new(g.clone()),
                };
                want.insert(g.id, g);
            }
            for (id, g) in &want {
                match cur.groups.get(id) {
                    Some(old) if Arc::ptr_eq(old, g) => {}
                    Some(_) => report.groups_modified += 1,
                    None => report.groups_added += 1,
                }
            }
            report.groups_deleted = cur
                .groups
                .keys()
                .filter(|id| !want.contains_key(id))
                .count();
            next.groups = Arc::new(want);
        }
        for (index, f) in flows.iter().enumerate() {
            let mut ids = Vec::new();
            Group::referenced(&f.actions, &mut ids);
            if let Some(id) = ids.into_iter().find(|id| !next.groups.contains_key(id)) {
                return Err(FlowModError::InBundle {
                    index,
                    error: Box::new(FlowModError::BadOutGroup(id)),
                });
            }
            // Meters are not replaced here: the flows may name the meters
            // the tables have.
            let mut ids = Vec::new();
            meter::referenced(&f.actions, &mut ids);
            if let Some(id) = ids.into_iter().find(|id| !next.meters.contains_key(id)) {
                return Err(FlowModError::InBundle {
                    index,
                    error: Box::new(FlowModError::InvalidMeter(id)),
                });
            }
        }
        for (t, wanted) in per_table.into_iter().enumerate() {
            let Some(slot) = next.tables.get_mut(t) else {
                continue;
            };
            if wanted.is_empty() && slot.is_empty() {
                continue;
            }
            // Last occurrence of each (match, priority) wins.
            let mut want: HashMap<(Match, u16), usize> = HashMap::with_capacity(wanted.len());
            for (i, f) in wanted.iter().enumerate() {
                want.insert((f.matches, f.priority), i);
            }
            let stale: Vec<(Match, u16)> = slot
                .iter()
                .map(|r| (r.flow.matches, r.flow.priority))
                .filter(|k| !want.contains_key(k))
                .collect();
            let mut changes: Vec<&Flow> = Vec::new();
            for (i, f) in wanted.iter().enumerate() {
                if want.get(&(f.matches, f.priority)) != Some(&i) {
                    continue;
                }
                match slot.find_exact(&f.matches, f.priority) {
                    Some(r) if same_version(&r.flow, f) => {}
                    _ => changes.push(f),
                }
            }
            if stale.is_empty() && changes.is_empty() {
                continue;
            }
            let cls = Arc::make_mut(slot);
            for (m, p) in &stale {
                if cls.remove(m, *p).is_some() {
                    report.deleted += 1;
                }
            }
            for f in changes {
                add_rule(cls, f.clone(), now_ns, &mut report);
            }
        }
        report.deleted += delete_orphaned_learned(&cur, &mut next).len();
        next.generation = cur.generation + 1;
        self.current.store(Arc::new(next));
        Ok(report)
    }

    /// Adds the flows `learn` actions learned ([`crate::learn`]), as OVS's
    /// `ofproto_flow_mod_learn`: a flow identical to an installed one
    /// (match, priority, actions, cookie, timeouts, flags) only refreshes
    /// it (its hard timeout counts again from `now_ns`; no new version, so
    /// no cache is flushed); any other is added as one atomic version,
    /// replacing a flow of the same match and priority and keeping its
    /// counters (modify semantics). A flow the tables refuse (which a
    /// parsed `learn` cannot produce) is counted in `failed` and skipped.
    pub fn learn<'a>(&self, flows: impl IntoIterator<Item = &'a Flow>, now_ns: u64) -> LearnReport {
        let _w = self.lock();
        let cur = self.current.load_full();
        let mut report = LearnReport::default();
        let mut changes: Vec<Flow> = Vec::new();
        for f in flows {
            match cur.find_strict(f.table, &f.matches, f.priority) {
                Some(r) if same_version(&r.flow, f) && r.flow.flags == f.flags => {
                    r.stats.refreshed_ns.fetch_max(now_ns, Ordering::Relaxed);
                    report.refreshed += 1;
                }
                _ => {
                    if validate_actions(f.table, &f.actions).is_err()
                        || usize::from(f.table) >= N_TABLES
                    {
                        report.failed += 1;
                        continue;
                    }
                    let mut f = f.clone();
                    f.matches = canonical(&f.matches);
                    changes.push(f);
                }
            }
        }
        if changes.is_empty() {
            return report;
        }
        let mut next = TableSet::clone(&cur);
        let mut applied = ApplyReport::default();
        for f in changes {
            let Some(slot) = next.tables.get_mut(usize::from(f.table)) else {
                report.failed += 1;
                continue;
            };
            // The same flow twice in one call: the second only refreshes.
            if let Some(r) = slot.find_exact(&f.matches, f.priority) {
                if same_version(&r.flow, &f) && r.flow.flags == f.flags {
                    report.refreshed += 1;
                    continue;
                }
            }
            add_rule(Arc::make_mut(slot), f, now_ns, &mut applied);
        }
        report.added = applied.added;
        report.replaced = applied.replaced;
        report.deleted = delete_orphaned_learned(&cur, &mut next).len();
        next.generation = cur.generation + 1;
        self.current.store(Arc::new(next));
        report
    }

    /// Removes every flow whose idle timeout (since its last hit, or its
    /// creation if never hit) or hard timeout (since its creation) has
    /// passed at `now_ns`, and returns them. Publishes a new version only if
    /// something expired.
    pub fn expire(&self, now_ns: u64) -> Vec<Flow> {
        let _w = self.lock();
        let cur = self.current.load_full();
        let mut next = TableSet::clone(&cur);
        let mut gone = Vec::new();
        for slot in next.tables.iter_mut() {
            let dead: Vec<(Match, u16)> = slot
                .iter()
                .filter(|r| r.expires_at().is_some_and(|t| now_ns >= t))
                .map(|r| (r.flow.matches, r.flow.priority))
                .collect();
            if dead.is_empty() {
                continue;
            }
            let cls = Arc::make_mut(slot);
            for (m, p) in dead {
                if let Some(r) = cls.remove(&m, p) {
                    gone.push(r.flow.clone());
                }
            }
        }
        gone.extend(
            delete_orphaned_learned(&cur, &mut next)
                .into_iter()
                .map(|r| r.flow.clone()),
        );
        if !gone.is_empty() {
            next.generation = cur.generation + 1;
            self.current.store(Arc::new(next));
        }
        gone
    }
}

/// `delete_learned` (OVS's `learned_cookies`): every (table, cookie) that
/// a `learn` with `delete_learned` of `cur` names and none of `next` does
/// any more loses its flows in `next`, which are returned. Only tables
/// that hold such a `learn` are looked at, and only when one of them
/// changed.
fn delete_orphaned_learned(cur: &TableSet, next: &mut TableSet) -> Vec<Arc<Rule>> {
    let changed = cur
        .tables
        .iter()
        .zip(&next.tables)
        .any(|(a, b)| a.has_delete_learned() && !Arc::ptr_eq(a, b));
    if !changed {
        return Vec::new();
    }
    let keys = |ts: &TableSet| -> std::collections::BTreeSet<(u8, u64)> {
        ts.tables
            .iter()
            .filter(|c| c.has_delete_learned())
            .flat_map(|c| c.iter())
            .flat_map(|r| crate::learn::delete_learned_keys(&r.flow.actions))
            .collect()
    };
    let alive = keys(next);
    let mut gone = Vec::new();
    for (t, cookie) in keys(cur).difference(&alive) {
        let Some(slot) = next.tables.get_mut(usize::from(*t)) else {
            continue;
        };
        let dead: Vec<(Match, u16)> = slot
            .iter()
            .filter(|r| r.flow.cookie == *cookie)
            .map(|r| (r.flow.matches, r.flow.priority))
            .collect();
        if dead.is_empty() {
            continue;
        }
        let cls = Arc::make_mut(slot);
        for (m, p) in dead {
            if let Some(r) = cls.remove(&m, p) {
                gone.push(r);
            }
        }
    }
    gone
}

/// Whether `actions` name group `id` (nested `ct` actions included).
fn names_group(actions: &[Action], id: u32) -> bool {
    let mut ids = Vec::new();
    Group::referenced(actions, &mut ids);
    ids.contains(&id)
}

/// Checks a group as the parser would (for groups built in code): its id,
/// one bucket at most if indirect, unique bucket ids, bucket actions valid
/// in a table (no `goto_table`, no `conjunction`).
fn validate_group(g: &Group) -> Result<(), FlowModError> {
    let bad = |reason: String| FlowModError::BadGroup { id: g.id, reason };
    if g.id > GROUP_MAX {
        return Err(bad(format!("group ids go up to {GROUP_MAX:#x}")));
    }
    if g.kind == GroupType::Indirect && g.buckets.len() > 1 {
        return Err(bad("indirect groups can have at most one bucket".into()));
    }
    let mut ids = std::collections::BTreeSet::new();
    for b in &g.buckets {
        if !ids.insert(b.id) {
            return Err(bad(format!("duplicate bucket id {}", b.id)));
        }
        for a in &b.actions {
            match a {
                Action::GotoTable(_) => {
                    return Err(bad("goto_table is not allowed in a group bucket".into()))
                }
                Action::Conjunction { .. } => {
                    return Err(bad("conjunction is not allowed in a group bucket".into()))
                }
                _ => check_sub_fields(a).map_err(|e| bad(e.to_string()))?,
            }
        }
    }
    Ok(())
}

/// Applies one meter mod to `next`: a new or changed meter is a new
/// [`Meter`] (bucket full, counters at 0); deleting one deletes the flows
/// that name it (as OVS).
fn apply_meter(
    next: &mut TableSet,
    mm: &MeterMod,
    now_ns: u64,
    report: &mut ApplyReport,
) -> Result<(), FlowModError> {
    let check = |c: &MeterConfig| match meter::invalid(c) {
        Some(reason) => Err(FlowModError::BadMeter { id: c.id, reason }),
        None => Ok(()),
    };
    match mm {
        MeterMod::Add(c) => {
            check(c)?;
            if next.meters.contains_key(&c.id) {
                return Err(FlowModError::MeterExists(c.id));
            }
            Arc::make_mut(&mut next.meters).insert(c.id, Arc::new(Meter::new(c.clone(), now_ns)));
            report.meters_added += 1;
        }
        MeterMod::Modify(c) => {
            check(c)?;
            if !next.meters.contains_key(&c.id) {
                return Err(FlowModError::UnknownMeter(c.id));
            }
            Arc::make_mut(&mut next.meters).insert(c.id, Arc::new(Meter::new(c.clone(), now_ns)));
            report.meters_modified += 1;
        }
        MeterMod::Delete(which) => {
            let gone: Vec<u32> = match which {
                Some(id) => next
                    .meters
                    .get(id)
                    .map(|m| m.config.id)
                    .into_iter()
                    .collect(),
                None => next.meters.keys().copied().collect(),
            };
            if gone.is_empty() {
                return Ok(());
            }
            let meters = Arc::make_mut(&mut next.meters);
            for id in &gone {
                meters.remove(id);
            }
            report.meters_deleted += gone.len();
            delete_flows_where(next, report, |f| {
                let mut ids = Vec::new();
                meter::referenced(&f.actions, &mut ids);
                ids.iter().any(|id| gone.contains(id))
            });
        }
    }
    Ok(())
}

/// Deletes from `next` every flow `dead` says must go (those naming a
/// deleted group or meter), counting them in `report`. Tables without one
/// are not copied.
fn delete_flows_where(next: &mut TableSet, report: &mut ApplyReport, dead: impl Fn(&Flow) -> bool) {
    for slot in next.tables.iter_mut() {
        let gone: Vec<(Match, u16)> = slot
            .iter()
            .filter(|r| dead(&r.flow))
            .map(|r| (r.flow.matches, r.flow.priority))
            .collect();
        if gone.is_empty() {
            continue;
        }
        let cls = Arc::make_mut(slot);
        for (m, p) in gone {
            if cls.remove(&m, p).is_some() {
                report.deleted += 1;
            }
        }
    }
}

/// Applies one group mod to `next`.
fn apply_group(
    next: &mut TableSet,
    gm: &GroupMod,
    report: &mut ApplyReport,
) -> Result<(), FlowModError> {
    match gm {
        GroupMod::Add(g) => {
            validate_group(g)?;
            if next.groups.contains_key(&g.id) {
                return Err(FlowModError::GroupExists(g.id));
            }
            Arc::make_mut(&mut next.groups).insert(g.id, Arc::new(g.clone()));
            report.groups_added += 1;
        }
        GroupMod::Modify { group, may_create } => {
            validate_group(group)?;
            let exists = next.groups.contains_key(&group.id);
            if !exists && !may_create {
                return Err(FlowModError::UnknownGroup(group.id));
            }
            Arc::make_mut(&mut next.groups).insert(group.id, Arc::new(group.clone()));
            if exists {
                report.groups_modified += 1;
            } else {
                report.groups_added += 1;
            }
        }
        GroupMod::Delete(which) => {
            let gone: Vec<u32> = match which {
                Some(id) => next.groups.get(id).map(|g| g.id).into_iter().collect(),
                None => next.groups.keys().copied().collect(),
            };
            if gone.is_empty() {
                return Ok(());
            }
            let groups = Arc::make_mut(&mut next.groups);
            for id in &gone {
                groups.remove(id);
            }
            report.groups_deleted += gone.len();
            // The flows that name a deleted group go with it.
            delete_flows_where(next, report, |f| {
                gone.iter().any(|id| names_group(&f.actions, *id))
            });
        }
    }
    Ok(())
}

/// `m` with value bits outside the mask cleared.
fn canonical(m: &Match) -> Match {
    Match {
        value: m.value.and(&m.mask),
        mask: m.mask,
    }
}

/// Whether two matches can match a common packet.
fn overlaps(a: &Match, b: &Match) -> bool {
    a.value
        .w
        .iter()
        .zip(&b.value.w)
        .zip(a.mask.w.iter().zip(&b.mask.w))
        .all(|((va, vb), (ma, mb))| (va ^ vb) & ma & mb == 0)
}

/// Whether `flow` is at least as specific as `sel` (non-strict selection).
fn covers(sel: &Match, flow: &Match) -> bool {
    sel.mask
        .w
        .iter()
        .zip(&flow.mask.w)
        .zip(sel.value.w.iter().zip(&flow.value.w))
        .all(|((sm, fm), (sv, fv))| sm & !fm == 0 && fv & sm == *sv)
}

/// The fields `ovs-ofctl replace-flows` compares (`fte_version_equals`).
fn same_version(a: &Flow, b: &Flow) -> bool {
    a.cookie == b.cookie
        && a.idle_timeout == b.idle_timeout
        && a.hard_timeout == b.hard_timeout
        && a.importance == b.importance
        && a.actions == b.actions
}

/// Checks an action list for a flow of `table`.
fn validate_actions(table: u8, actions: &[Action]) -> Result<(), FlowModError> {
    if usize::from(table) >= N_TABLES {
        return Err(FlowModError::BadTable(table));
    }
    let mut has_conj = false;
    let mut other: Option<&Action> = None;
    for (i, a) in actions.iter().enumerate() {
        match a {
            Action::Conjunction {
                id,
                clause,
                n_clauses,
            } => {
                has_conj = true;
                let reason = if *n_clauses < 2 {
                    Some("a conjunction must have at least 2 clauses")
                } else if *n_clauses > 64 {
                    Some("a conjunction must have at most 64 clauses")
                } else if *clause == 0 || clause > n_clauses {
                    Some("the clause number must be between 1 and the number of clauses")
                } else {
                    None
                };
                if let Some(reason) = reason {
                    return Err(FlowModError::BadConjunction {
                        id: *id,
                        clause: *clause,
                        n_clauses: *n_clauses,
                        reason,
                    });
                }
            }
            Action::Note(_) => {}
            Action::Learn(l) => {
                if let Some(why) = l.invalid() {
                    return Err(FlowModError::BadLearn(why));
                }
                other = other.or(Some(a));
            }
            Action::OutputReg(_) | Action::Load { .. } | Action::Move { .. } | Action::Ct(_) => {
                check_sub_fields(a)?;
                other = other.or(Some(a));
            }
            Action::GotoTable(t) => {
                if i + 1 != actions.len() {
                    return Err(FlowModError::GotoNotLast(*t));
                }
                if *t <= table || usize::from(*t) >= N_TABLES {
                    return Err(FlowModError::BadGotoTable { table, target: *t });
                }
                other = other.or(Some(a));
            }
            _ => other = other.or(Some(a)),
        }
    }
    if let (true, Some(a)) = (has_conj, other) {
        return Err(FlowModError::ConjunctionWithOtherActions(format!("{a:?}")));
    }
    Ok(())
}

/// Checks the sub-fields of `a` (and of the actions nested in `ct`): every
/// one within its field, `move` between equal widths, `load` values that fit.
/// The translator shifts by these offsets, so this is what keeps it from
/// overflowing on a flow built in code rather than parsed.
fn check_sub_fields(a: &Action) -> Result<(), FlowModError> {
    let bad = |reason| {
        Err(FlowModError::BadSubField {
            action: format!("{a:?}"),
            reason,
        })
    };
    let within = |sf: &SubField| {
        sf.n_bits >= 1 && u32::from(sf.ofs) + u32::from(sf.n_bits) <= sf.field.bits()
    };
    match a {
        Action::OutputReg(sf)
        | Action::Ct(CtAction {
            zone: CtZoneSrc::Field(sf),
            ..
        }) if !within(sf) => bad("sub-field outside its field"),
        Action::Load { dst, value } => {
            if !within(dst) {
                bad("sub-field outside its field")
            } else if dst.n_bits < 128 && *value >> dst.n_bits != 0 {
                bad("value does not fit the destination")
            } else {
                Ok(())
            }
        }
        Action::Move { src, dst } => {
            if !within(src) || !within(dst) {
                bad("sub-field outside its field")
            } else if src.n_bits != dst.n_bits {
                bad("source and destination widths differ")
            } else {
                Ok(())
            }
        }
        Action::Ct(ct) => ct.exec.iter().try_for_each(check_sub_fields),
        _ => Ok(()),
    }
}

/// Inserts `flow` (already validated, canonical, `flow.table` set) with add
/// semantics.
fn add_rule(cls: &mut Classifier, flow: Flow, now_ns: u64, report: &mut ApplyReport) {
    let stats = match cls.find_exact(&flow.matches, flow.priority) {
        Some(old) if !flow.flags.reset_counts => old.stats.snapshot(),
        _ => RuleStats::default(),
    };
    let rule = Rule {
        flow,
        created_ns: now_ns,
        stats,
    };
    if cls.insert(Arc::new(rule)).is_some() {
        report.replaced += 1;
    } else {
        report.added += 1;
    }
}

/// The tables a modify/delete addresses.
fn target_tables(fm: &FlowMod) -> Result<std::ops::Range<usize>, FlowModError> {
    match fm.table {
        Some(t) if usize::from(t) >= N_TABLES => Err(FlowModError::BadTable(t)),
        Some(t) => Ok(usize::from(t)..usize::from(t) + 1),
        None => Ok(0..N_TABLES),
    }
}

/// The flows of `cls` that a modify/delete selects.
fn select(
    cls: &Classifier,
    fm: &FlowMod,
    strict: bool,
    sel: &Match,
    use_out_port: bool,
) -> Vec<Arc<Rule>> {
    let cookie_ok = |r: &Rule| (r.flow.cookie ^ fm.flow.cookie) & fm.cookie_mask == 0;
    let port_ok = |r: &Rule| match fm.out_port {
        Some(p) if use_out_port && p != port::NONE => r.outputs_to(p),
        _ => true,
    };
    if strict {
        cls.find_exact(sel, fm.flow.priority)
            .filter(|r| cookie_ok(r) && port_ok(r))
            .into_iter()
            .cloned()
            .collect()
    } else {
        cls.iter()
            .filter(|r| covers(sel, &r.flow.matches) && cookie_ok(r) && port_ok(r))
            .cloned()
            .collect()
    }
}

fn apply_one(
    next: &mut TableSet,
    fm: &FlowMod,
    now_ns: u64,
    report: &mut ApplyReport,
) -> Result<(), FlowModError> {
    match fm.command {
        FlowModCommand::Add => {
            let table = fm.table.unwrap_or(fm.flow.table);
            validate_actions(table, &fm.flow.actions)?;
            let mut flow = fm.flow.clone();
            flow.table = table;
            flow.matches = canonical(&flow.matches);
            let slot = next
                .tables
                .get_mut(usize::from(table))
                .ok_or(FlowModError::BadTable(table))?;
            if flow.flags.check_overlap
                && slot.iter().any(|r| {
                    r.flow.priority == flow.priority && overlaps(&r.flow.matches, &flow.matches)
                })
            {
                return Err(FlowModError::Overlap {
                    table,
                    priority: flow.priority,
                });
            }
            add_rule(Arc::make_mut(slot), flow, now_ns, report);
        }
        FlowModCommand::Modify { strict } => {
            let sel = canonical(&fm.flow.matches);
            let tables = target_tables(fm)?;
            if let Some(t) = fm.table {
                validate_actions(t, &fm.flow.actions)?;
            }
            for t in tables {
                let Some(slot) = next.tables.get_mut(t) else {
                    continue;
                };
                let targets = select(slot, fm, strict, &sel, false);
                if targets.is_empty() {
                    continue;
                }
                // goto_table validity depends on the table of each target.
                validate_actions(t as u8, &fm.flow.actions)?;
                let cls = Arc::make_mut(slot);
                for old in targets {
                    let mut flow = old.flow.clone();
                    flow.actions = fm.flow.actions.clone();
                    let stats = if fm.flow.flags.reset_counts {
                        RuleStats::default()
                    } else {
                        old.stats.snapshot()
                    };
                    let rule = Rule {
                        flow,
                        created_ns: old.created_ns,
                        stats,
                    };
                    if cls.replace(Arc::new(rule)).is_some() {
                        report.modified += 1;
                    }
                }
            }
        }
        FlowModCommand::Delete { strict } => {
            let sel = canonical(&fm.flow.matches);
            for t in target_tables(fm)? {
                let Some(slot) = next.tables.get_mut(t) else {
                    continue;
                };
                let targets = select(slot, fm, strict, &sel, true);
                if targets.is_empty() {
                    continue;
                }
                let cls = Arc::make_mut(slot);
                for old in targets {
                    if cls.remove(&old.flow.matches, old.flow.priority).is_some() {
                        report.deleted += 1;
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
