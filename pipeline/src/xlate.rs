//! The slow path: translating a flow key through the OpenFlow tables into
//! datapath actions plus a megaflow mask.
//!
//! ## What a translation is
//!
//! [`translate`] runs one packet's key through the tables the way an
//! OpenFlow switch would (OVS semantics, see `ovs-actions(7)`), executing the
//! matched flows' actions on a *working copy* of the key, and compiles the
//! externally visible effects into a short list of [`DpAction`]s:
//!
//! - the pipeline starts in table 0, or for a recirculated packet
//!   (`recirc_id != 0`) in [`table_for_recirc_id`]; an unknown id drops;
//! - each table is one [`FlowLookup::lookup`]; a miss ends that branch of the
//!   pipeline (OpenFlow 1.3 table-miss: drop), a hit executes the rule's
//!   actions in order; `goto_table` continues in the next table after the
//!   rule's other actions, `resubmit` does a nested lookup and comes back;
//! - header writes (`set_field`, `mod_dl_src`, `dec_ttl`, ...) change only
//!   the working key; they are *committed* as `Set` actions (one per changed
//!   field, in [`Field::ALL`] order) right before an action that lets the
//!   packet be seen (output, ct, recirculation, userspace, vlan push/pop);
//! - `ct(table=T)` forks: the packet goes to conntrack and is recirculated
//!   (`Ct`, `LoadMeta`s for the metadata this pass wrote, `Recirc`), while
//!   the original continues after the `ct` as untracked (ct fields cleared).
//!
//! ## The wildcard invariant
//!
//! The result carries `wildcards`, every key bit whose value could have
//! changed the produced actions. The contract, checked by a property test:
//! for any `key2` with `key2 & wildcards == key & wildcards`,
//! `translate(key2).actions == translate(key).actions`. It holds because
//! every place that *reads* the working key ORs the bits it read into the
//! mask before using them:
//!
//! - lookups: the classifier reports the bits it consulted (including those
//!   of higher-priority flows that did not match);
//! - always: `recirc_id`, `in_port`, `dl_type` (and `nw_frag` for IP), which
//!   steer everything else;
//! - `move` (source bits), `output:SRC[]` and `ct(zone=SRC[])` (the
//!   sub-field), `dec_ttl` (the TTL, whose value decides between a write
//!   and an `invalid_ttl` packet-in), `pop_vlan` (the tag-present bit);
//! - commits: deciding whether a written header field differs from the
//!   packet compares it with the input, and a `Set` carries the whole field,
//!   so every field written since the last commit is unwildcarded whole;
//!   likewise the tunnel fields when written (for `SetTunnel`); a `LoadMeta`
//!   carries a whole metadata field, so its bits that were *not* written
//!   (the input's) are unwildcarded.
//!
//! Bits that were *written* by an action before being read are a function
//! of the bits already in the mask, so unwildcarding them is merely
//! conservative. Translation is a pure function of (tables, key, env).
//!
//! ## Limits and errors
//!
//! Resubmits nest at most [`MAX_DEPTH`] deep and a translation does at most
//! [`MAX_LOOKUPS`] lookups (resubmits and `goto_table`s together); beyond
//! either, the translation fails: all actions are dropped and
//! [`Translation::error`] says why (the mask still covers the bits that led
//! there, so the drop megaflow is as sound as any other).
//!
//! ## Tracing
//!
//! [`translate_traced`] runs the very same code with a recorder that
//! appends [`TraceEvent`]s (tables, actions, details, warnings,
//! recirculations), from which [`crate::trace`] builds `ofproto/trace`
//! output. With no recorder the only cost is a branch on `None`.

use std::sync::Arc;

use crate::extract::VLAN_PRESENT;
use crate::field::{frag, Field};
use crate::flow::{
    port, Action, CtAction, CtZoneSrc, LearnAction, NatAction, PacketInReason, SubField,
};
use crate::group::{self, Group, GroupType, SelectionMethod};
use crate::key::FlowKey;
use crate::learn;
use crate::meter::Meter;
use crate::odp::{recirc_id_for_table, table_for_recirc_id, DpAction, TunnelFields};
use crate::tables::{Rule, TableSet};
use crate::wire::{ethertype, ip_proto};

/// Deepest resubmit nesting (OVS: 64).
pub const MAX_DEPTH: u32 = 64;
/// Most table lookups in one translation (OVS: 4096 resubmits).
pub const MAX_LOOKUPS: u32 = 4096;

const ETH_TYPE_IPV4: u128 = ethertype::IPV4 as u128;
const ETH_TYPE_IPV6: u128 = ethertype::IPV6 as u128;
/// The "a tag is present" bit of `vlan_tci`.
const VLAN_CFI: u128 = VLAN_PRESENT as u128;

/// A classifier as translation sees it: the highest-priority flow of a
/// table that matches a key, OR-ing every key bit it consulted into `wc`.
///
/// [`TableSet`] is the production implementation; [`LinearTables`] is a
/// naive reference implementation for tests.
pub trait FlowLookup {
    /// The highest-priority flow of `table` matching `key` (conjunctions
    /// resolved), OR-ing every key bit it consulted into `wc`.
    fn lookup(&self, table: u8, key: &FlowKey, wc: &mut FlowKey) -> Option<&Arc<Rule>>;

    /// The group with this id, if any.
    fn group(&self, id: u32) -> Option<&Group>;

    /// The meter with this id, if any (none by default).
    fn meter(&self, _id: u32) -> Option<&Arc<Meter>> {
        None
    }
}

impl FlowLookup for TableSet {
    fn lookup(&self, table: u8, key: &FlowKey, wc: &mut FlowKey) -> Option<&Arc<Rule>> {
        TableSet::lookup(self, table, key, wc)
    }

    fn group(&self, id: u32) -> Option<&Group> {
        TableSet::group(self, id)
    }

    fn meter(&self, id: u32) -> Option<&Arc<Meter>> {
        TableSet::meter(self, id)
    }
}

impl<T: FlowLookup + ?Sized> FlowLookup for &T {
    fn lookup(&self, table: u8, key: &FlowKey, wc: &mut FlowKey) -> Option<&Arc<Rule>> {
        (**self).lookup(table, key, wc)
    }

    fn group(&self, id: u32) -> Option<&Group> {
        (**self).group(id)
    }

    fn meter(&self, id: u32) -> Option<&Arc<Meter>> {
        (**self).meter(id)
    }
}

/// A naive classifier: per table, a list of rules scanned in priority order
/// (highest first, then insertion order). Every rule it examines ORs its
/// whole mask into the wildcards, which is what makes its reports sound.
/// Meant for tests and as the reference the real classifier is compared to;
/// conjunctions are not resolved (a flow with `conjunction` actions is
/// returned like any other).
#[derive(Debug, Default, Clone)]
pub struct LinearTables {
    tables: Vec<Vec<Arc<Rule>>>,
    groups: std::collections::BTreeMap<u32, Group>,
}

impl LinearTables {
    /// No flows at all.
    pub fn new() -> Self {
        LinearTables::default()
    }

    /// Builds tables from flows (each goes to `flow.table`).
    pub fn from_flows(flows: impl IntoIterator<Item = crate::flow::Flow>) -> Self {
        let mut t = LinearTables::new();
        for f in flows {
            t.add(f);
        }
        t
    }

    /// Adds a flow to `flow.table` and returns its rule.
    pub fn add(&mut self, flow: crate::flow::Flow) -> Arc<Rule> {
        let table = flow.table as usize;
        if self.tables.len() <= table {
            self.tables.resize_with(table + 1, Vec::new);
        }
        let rule = Arc::new(Rule {
            flow,
            created_ns: 0,
            stats: Default::default(),
        });
        let list = &mut self.tables[table];
        // Stable: after every rule of higher or equal priority.
        let at = list
            .iter()
            .position(|r| r.flow.priority < rule.flow.priority)
            .unwrap_or(list.len());
        list.insert(at, Arc::clone(&rule));
        rule
    }

    /// Adds (or replaces) a group.
    pub fn add_group(&mut self, group: Group) {
        self.groups.insert(group.id, group);
    }
}

impl FlowLookup for LinearTables {
    fn lookup(&self, table: u8, key: &FlowKey, wc: &mut FlowKey) -> Option<&Arc<Rule>> {
        let list = self.tables.get(table as usize)?;
        for rule in list {
            wc.or_assign(&rule.flow.matches.mask);
            if rule.flow.matches.matches(key) {
                return Some(rule);
            }
        }
        None
    }

    fn group(&self, id: u32) -> Option<&Group> {
        self.groups.get(&id)
    }
}

/// Why a translation failed (its actions are then dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum XlateError {
    /// Resubmits nested deeper than [`MAX_DEPTH`].
    #[error("Recursion too deep: resubmit nesting over {0} levels")]
    RecursionTooDeep(u32),
    /// More than [`MAX_LOOKUPS`] table lookups.
    #[error("Too many resubmits: over {0} table lookups")]
    TooManyResubmits(u32),
    /// The key's `recirc_id` names no table.
    #[error("Unknown recirculation id {0:#x}")]
    UnknownRecircId(u32),
}

/// The result of translating one key.
#[derive(Debug, Default)]
pub struct Translation {
    /// What the datapath does with the packet (empty = drop).
    pub actions: Vec<DpAction>,
    /// Every key bit the translation consulted (the megaflow mask).
    pub wildcards: FlowKey,
    /// Flows that matched, in order (their counters are credited per packet).
    pub rules: Vec<Arc<Rule>>,
    /// Set when translation failed; `actions` is then empty.
    pub error: Option<XlateError>,
}

/// What translation needs to know about the switch beyond the tables.
#[derive(Clone, Debug, Default)]
pub struct XlateEnv {
    /// Every port's OpenFlow number (for `output:ALL` / `FLOOD`), in the
    /// order copies are sent. When the ports are known
    /// ([`XlateEnv::ports_known`]), an output to a port that is not listed
    /// sends nothing ("Nonexistent output port"); when they are not (an
    /// offline trace without `--ports`), only port 0 and the unused
    /// reserved numbers are refused.
    pub ports: Vec<u32>,
    /// `ports` is the whole list, even when empty (a switch with no port:
    /// every output goes nowhere). A non-empty list counts as known either
    /// way.
    pub ports_known: bool,
}

impl XlateEnv {
    /// The environment of a switch whose ports are exactly `ports`.
    pub fn with_ports(ports: Vec<u32>) -> XlateEnv {
        XlateEnv {
            ports,
            ports_known: true,
        }
    }

    /// Whether an output to `port` (not a reserved port) has nowhere to go.
    fn port_missing(&self, port: u32) -> bool {
        (self.ports_known || !self.ports.is_empty()) && !self.ports.contains(&port)
    }
}

/// One step of a translation, as recorded for [`crate::trace`].
///
/// Events form a tree: [`TraceEvent::Table`] opens a node (the events that
/// follow are its children) and [`TraceEvent::Close`] closes the most
/// recently opened one. A `goto_table` opens the next table inside the
/// current one (OVS prints it that way too); a resubmit's table is closed
/// when the resubmit returns.
#[derive(Clone, Debug)]
pub enum TraceEvent {
    /// A recirculated packet resumes in `table`.
    Thaw { table: u8 },
    /// A lookup in `table`: the rule that matched, or `None` (table miss).
    Table { table: u8, rule: Option<Arc<Rule>> },
    /// Closes the most recent open [`TraceEvent::Table`].
    Close,
    /// An action of the current rule is executed (also the `exec` actions
    /// of a `ct`, after the `ct`).
    Action(Action),
    /// A note on the action just executed (`NXM_NX_REG1[] is now 0x5`).
    Detail(String),
    /// The action just executed had no effect, and why.
    Warn(String),
    /// Translation failed here.
    Error(String),
    /// `ct(table=..)` sent a copy to conntrack, to come back with `id`;
    /// `key` is the working key at that moment (ct fields not yet cleared);
    /// `nat` the `ct`'s `nat`, if any.
    Recirc {
        id: u32,
        zone: u16,
        key: Box<FlowKey>,
        nat: Option<NatAction>,
    },
}

/// Translates `key` (starting at table 0, or where its recirc_id says).
pub fn translate(tables: &TableSet, key: &FlowKey, env: &XlateEnv) -> Translation {
    translate_with(tables, key, env)
}

/// [`translate`] over any [`FlowLookup`].
pub fn translate_with<L: FlowLookup + ?Sized>(
    tables: &L,
    key: &FlowKey,
    env: &XlateEnv,
) -> Translation {
    Xlate::new(tables, key, env, None).run()
}

/// [`translate_with`], recording every step into `events`.
pub fn translate_traced<L: FlowLookup + ?Sized>(
    tables: &L,
    key: &FlowKey,
    env: &XlateEnv,
    events: &mut Vec<TraceEvent>,
) -> (Translation, FlowKey) {
    let mut x = Xlate::new(tables, key, env, Some(events));
    let t = x.run_inner();
    (t, x.key)
}

/// How executing an action list ended.
enum Flow {
    /// Every action ran; continue in this table (`goto_table`), or not.
    Done(Option<u8>),
    /// The list stopped early (`dec_ttl` exception, conjunction flow, error).
    Stopped,
}

/// The state of one translation.
struct Xlate<'a, L: ?Sized> {
    tables: &'a L,
    env: &'a XlateEnv,
    /// The working key: every action applied.
    key: FlowKey,
    /// Header fields as the packet has them (last committed).
    base: FlowKey,
    /// Header bits written since the last commit.
    dirty: FlowKey,
    /// Metadata bits written by this translation (carried by `LoadMeta`).
    meta_written: FlowKey,
    /// Tunnel metadata as last given to the datapath (`SetTunnel`).
    tun_sent: TunnelFields,
    /// Whether a tunnel field was written since the last `SetTunnel` check.
    tun_dirty: bool,
    wc: FlowKey,
    actions: Vec<DpAction>,
    rules: Vec<Arc<Rule>>,
    depth: u32,
    lookups: u32,
    error: Option<XlateError>,
    trace: Option<&'a mut Vec<TraceEvent>>,
}

/// Metadata fields carried across a recirculation by `LoadMeta`, in order.
const META_FIELDS: [Field; 23] = [
    Field::Metadata,
    Field::Reg(0),
    Field::Reg(1),
    Field::Reg(2),
    Field::Reg(3),
    Field::Reg(4),
    Field::Reg(5),
    Field::Reg(6),
    Field::Reg(7),
    Field::Reg(8),
    Field::Reg(9),
    Field::Reg(10),
    Field::Reg(11),
    Field::Reg(12),
    Field::Reg(13),
    Field::Reg(14),
    Field::Reg(15),
    Field::PktMark,
    Field::TunId,
    Field::TunSrc,
    Field::TunDst,
    Field::TunIpv6Src,
    Field::TunIpv6Dst,
];

fn tunnel_of(key: &FlowKey) -> TunnelFields {
    TunnelFields::of_key(key)
}

/// Sets `mask` bits of `field` in a mask key (OR).
fn or_bits(mask_key: &mut FlowKey, field: Field, mask: u128) {
    let old = mask_key.get(field);
    mask_key.set(field, old | mask);
}

impl<'a, L: FlowLookup + ?Sized> Xlate<'a, L> {
    fn new(
        tables: &'a L,
        key: &FlowKey,
        env: &'a XlateEnv,
        trace: Option<&'a mut Vec<TraceEvent>>,
    ) -> Self {
        Xlate {
            tables,
            env,
            key: *key,
            base: *key,
            dirty: FlowKey::ZERO,
            meta_written: FlowKey::ZERO,
            tun_sent: tunnel_of(key),
            tun_dirty: false,
            wc: FlowKey::ZERO,
            actions: Vec::new(),
            rules: Vec::new(),
            depth: 0,
            lookups: 0,
            error: None,
            trace,
        }
    }

    fn run(mut self) -> Translation {
        self.run_inner()
    }

    fn run_inner(&mut self) -> Translation {
        // Fields that steer everything else are always exact.
        self.wc.mask_field(Field::RecircId);
        self.wc.mask_field(Field::InPort);
        self.wc.mask_field(Field::DlType);
        if self.is_ip() {
            // Only the two defined bits (as OVS; the printer reads 0x3 as "exact").
            or_bits(
                &mut self.wc,
                Field::NwFrag,
                u128::from(frag::ANY | frag::LATER),
            );
        }

        let recirc_id = self.key.get(Field::RecircId) as u32;
        let start = if recirc_id == 0 {
            Some(0)
        } else {
            table_for_recirc_id(recirc_id)
        };
        match start {
            Some(table) => {
                if recirc_id != 0 {
                    self.record(|| TraceEvent::Thaw { table });
                }
                self.run_tables(table);
            }
            None => self.fail(XlateError::UnknownRecircId(recirc_id)),
        }

        let mut actions = std::mem::take(&mut self.actions);
        if self.error.is_some() {
            actions.clear();
        }
        Translation {
            actions,
            wildcards: self.wc,
            rules: std::mem::take(&mut self.rules),
            error: self.error,
        }
    }

    #[inline]
    fn record(&mut self, event: impl FnOnce() -> TraceEvent) {
        if let Some(t) = self.trace.as_deref_mut() {
            t.push(event());
        }
    }

    fn fail(&mut self, e: XlateError) {
        if self.error.is_none() {
            self.error = Some(e);
            self.record(|| TraceEvent::Error(e.to_string()));
        }
    }

    fn dl_type(&self) -> u128 {
        // Always in the mask (see run_inner).
        self.key.get(Field::DlType)
    }

    fn is_ip(&self) -> bool {
        matches!(self.dl_type(), ETH_TYPE_IPV4 | ETH_TYPE_IPV6)
    }

    /// Reads bits `mask` of `field` from the working key, unwildcarding them.
    /// A field whose bits the packet's kind does not own (shared storage,
    /// see [`crate::field`]) reads as 0: only a group bucket, which runs
    /// without prerequisites, can get here with one (the decision reads
    /// `dl_type`, always in the mask).
    fn read(&mut self, field: Field, mask: u128) -> u128 {
        if !self.key.owns(field) {
            return 0;
        }
        or_bits(&mut self.wc, field, mask);
        self.key.get(field) & mask
    }

    fn read_sub(&mut self, sf: &SubField) -> u128 {
        self.read(sf.field, sf.mask()) >> sf.ofs
    }

    /// Writes bits `mask` of `field` in the working key, noting what changed.
    /// A write to a field whose bits the packet's kind does not own (shared
    /// storage, see [`crate::field`]; only in a group bucket, which runs
    /// without prerequisites) is ignored, as OVS ignores a write to a field
    /// whose prerequisites the packet lacks: it would change the other
    /// field.
    fn write(&mut self, field: Field, value: u128, mask: u128) {
        if !self.key.owns(field) {
            self.record(|| {
                TraceEvent::Warn(format!(
                    "unmet prerequisites for {}: write ignored",
                    field.name()
                ))
            });
            return;
        }
        self.key.set_masked(field, value, mask);
        if field.is_header() {
            or_bits(&mut self.dirty, field, mask);
        } else {
            // An xreg write marks both of its regs: they share its word.
            or_bits(&mut self.meta_written, field, mask);
            if field.is_tunnel() {
                self.tun_dirty = true;
            }
        }
    }

    /// Runs a table and the `goto_table` chain that follows from it.
    fn run_tables(&mut self, first: u8) {
        let mut table = first;
        let mut opened = 0u32;
        loop {
            if self.error.is_some() {
                break;
            }
            self.lookups += 1;
            if self.lookups > MAX_LOOKUPS {
                self.fail(XlateError::TooManyResubmits(MAX_LOOKUPS));
                break;
            }
            let rule = self.tables.lookup(table, &self.key, &mut self.wc).cloned();
            self.record(|| TraceEvent::Table {
                table,
                rule: rule.clone(),
            });
            opened += 1;
            let Some(rule) = rule else {
                break;
            };
            self.rules.push(Arc::clone(&rule));
            match self.execute(&rule.flow.actions, table, rule.flow.cookie) {
                Flow::Done(Some(next)) => table = next,
                Flow::Done(None) | Flow::Stopped => break,
            }
        }
        for _ in 0..opened {
            self.record(|| TraceEvent::Close);
        }
    }

    /// Executes one rule's actions (in `table`, rule cookie `cookie`).
    fn execute(&mut self, actions: &[Action], table: u8, cookie: u64) -> Flow {
        let mut goto = None;
        for a in actions {
            if self.error.is_some() {
                return Flow::Stopped;
            }
            self.record(|| TraceEvent::Action(a.clone()));
            match a {
                Action::Output(p) => self.output(*p, table, cookie),
                Action::OutputReg(sf) => {
                    let p = self.read_sub(sf) as u32;
                    self.record(|| TraceEvent::Detail(format!("output port is {p}")));
                    self.output(p, table, cookie);
                }
                Action::Controller(c) => {
                    self.commit();
                    self.actions.push(DpAction::Userspace {
                        reason: c.reason,
                        userdata: c.userdata.clone(),
                        table,
                        cookie,
                    });
                }
                Action::GotoTable(t) => goto = Some(*t),
                Action::Resubmit { in_port, table: rt } => {
                    self.resubmit(*in_port, rt.unwrap_or(table))
                }
                Action::SetField { field, value, mask } => self.write(*field, *value, *mask),
                Action::Load { dst, value } => {
                    self.write(dst.field, *value << dst.ofs, dst.mask());
                }
                Action::Move { src, dst } => {
                    let v = self.read_sub(src);
                    self.write(dst.field, v << dst.ofs, dst.mask());
                    let now = dst.get(&self.key);
                    self.record(|| {
                        TraceEvent::Detail(format!("{} is now {now:#x}", format_subfield(dst)))
                    });
                }
                Action::ModDlSrc(mac) => {
                    self.write(Field::DlSrc, *mac as u128, Field::DlSrc.full_mask())
                }
                Action::ModDlDst(mac) => {
                    self.write(Field::DlDst, *mac as u128, Field::DlDst.full_mask())
                }
                Action::ModNwSrc(ip) | Action::ModNwDst(ip) => {
                    let field = if matches!(a, Action::ModNwSrc(_)) {
                        Field::NwSrc
                    } else {
                        Field::NwDst
                    };
                    if self.dl_type() == ETH_TYPE_IPV4 {
                        self.write(field, *ip as u128, field.full_mask());
                    } else {
                        self.record(|| TraceEvent::Warn("not an IPv4 packet: skipped".into()));
                    }
                }
                Action::DecTtl => {
                    if !self.dec_ttl(table, cookie) {
                        return Flow::Stopped;
                    }
                }
                Action::PushVlan(tpid) => {
                    self.commit();
                    // The new outer tag has VID 0 and PCP 0, tagged packet
                    // or not, as OVS (`push_vlan(tpid=0x88a8,vid=0,pcp=0)`
                    // onto a dl_vlan=5 packet); it does not depend on the
                    // old TCI, so nothing is read.
                    let tci = VLAN_CFI;
                    self.key.set(Field::VlanTci, tci);
                    self.base.set(Field::VlanTci, tci);
                    self.actions.push(DpAction::PushVlan {
                        tpid: *tpid,
                        tci: tci as u16,
                    });
                }
                Action::PopVlan => {
                    if self.read(Field::VlanTci, VLAN_CFI) != 0 {
                        self.key.set(Field::VlanTci, 0);
                        self.dirty.set(Field::VlanTci, 0);
                        self.commit();
                        self.actions.push(DpAction::PopVlan);
                        self.base.set(Field::VlanTci, 0);
                    } else {
                        self.record(|| TraceEvent::Warn("packet has no VLAN tag".into()));
                    }
                }
                Action::SetTunnel(id) => {
                    self.write(Field::TunId, *id as u128, Field::TunId.full_mask())
                }
                Action::Ct(ct) => self.ct(ct),
                Action::CtClear => {
                    self.clear_ct_fields();
                    self.actions.push(DpAction::CtClear);
                }
                Action::Conjunction { .. } => {
                    // Conjunctive flows are never the result of a lookup
                    // with conjunctions resolved; if one is, it drops.
                    self.record(|| TraceEvent::Warn("conjunctive flow: dropping".into()));
                    return Flow::Stopped;
                }
                Action::Note(_) => {}
                Action::Learn(l) => self.learn(l),
                Action::Group(id) => self.group(*id, table, cookie),
                Action::Meter(id) => {
                    // The meter decides per packet in the datapath; header
                    // writes so far happen before it (as in OVS).
                    let tables = self.tables;
                    match tables.meter(*id) {
                        Some(m) => {
                            self.commit();
                            self.actions.push(DpAction::Meter(Arc::clone(m)));
                        }
                        None => self.record(|| {
                            TraceEvent::Warn(format!("meter {id} does not exist: skipped"))
                        }),
                    }
                }
                Action::Nat(_) => {
                    // Only inside `ct` (the parser refuses it elsewhere).
                    self.record(|| TraceEvent::Warn("nat outside ct: skipped".into()));
                }
            }
        }
        if self.error.is_some() {
            return Flow::Stopped;
        }
        Flow::Done(goto)
    }

    /// `learn(...)`: the flow it adds for this packet, from the working key
    /// (every source bit read is un-wildcarded, as OVS's `learn_mask`), as
    /// a datapath action so that every packet of the megaflow learns it.
    fn learn(&mut self, l: &LearnAction) {
        let flow = learn::learned_flow(l, |sf| self.read_sub(&sf));
        self.record(|| TraceEvent::Detail(learn::describe(&flow)));
        self.actions
            .push(DpAction::Learn(Arc::new(learn::Learned::new(flow))));
    }

    fn resubmit(&mut self, in_port: Option<u32>, table: u8) {
        if self.depth >= MAX_DEPTH {
            self.fail(XlateError::RecursionTooDeep(MAX_DEPTH));
            return;
        }
        self.depth += 1;
        let saved = self.key.get(Field::InPort);
        if let Some(p) = in_port {
            self.key.set(Field::InPort, p as u128);
        }
        self.run_tables(table);
        if in_port.is_some() {
            self.key.set(Field::InPort, saved);
        }
        self.depth -= 1;
    }

    /// `group:ID` (the module doc of [`crate::group`]).
    fn group(&mut self, id: u32, table: u8, cookie: u64) {
        let tables = self.tables;
        let Some(g) = tables.group(id) else {
            self.record(|| TraceEvent::Warn(format!("group {id} does not exist: skipped")));
            return;
        };
        match g.kind {
            GroupType::All => {
                for b in &g.buckets {
                    self.record(|| TraceEvent::Detail(format!("bucket {}", b.id)));
                    self.bucket(b, table, cookie);
                }
            }
            GroupType::Select => {
                let hash = match g.method {
                    SelectionMethod::Hash => {
                        group::hash_fields(&self.key, &g.fields, g.basis, &mut self.wc)
                    }
                    SelectionMethod::Default | SelectionMethod::DpHash => {
                        group::hash_symmetric_l4(&self.key, g.basis, &mut self.wc)
                    }
                };
                match group::select_bucket(&g.buckets, hash) {
                    Some(i) => {
                        let b = &g.buckets[i];
                        self.record(|| TraceEvent::Detail(format!("using bucket {}", b.id)));
                        self.bucket(b, table, cookie);
                    }
                    None => self.record(|| TraceEvent::Warn("no live bucket".into())),
                }
            }
            GroupType::Indirect | GroupType::FastFailover => match g.buckets.first() {
                Some(b) => self.bucket(b, table, cookie),
                None => self.record(|| TraceEvent::Warn("no live bucket".into())),
            },
        }
    }

    /// One bucket, as a clone: what it writes is undone after it.
    fn bucket(&mut self, b: &group::Bucket, table: u8, cookie: u64) {
        if self.depth >= MAX_DEPTH {
            self.fail(XlateError::RecursionTooDeep(MAX_DEPTH));
            return;
        }
        self.depth += 1;
        let saved = self.key;
        // A goto_table has no meaning in a bucket (the parser refuses it).
        let _ = self.execute(&b.actions, table, cookie);
        self.depth -= 1;
        self.key = saved;
        // The packet keeps what the bucket committed: every header field
        // that now differs from the restored key is written back at the
        // next commit.
        for &f in Field::ALL {
            if f.is_header() && self.key.owns(f) && self.key.get(f) != self.base.get(f) {
                or_bits(&mut self.dirty, f, f.full_mask());
            }
        }
        if tunnel_of(&self.key) != self.tun_sent {
            self.tun_dirty = true;
        }
    }

    /// `dec_ttl`; false = TTL exception (stop this action list).
    ///
    /// As OVS's `compose_dec_ttl`: a TTL (hop limit) of 0 or 1 sends the
    /// packet to controller id 0 (plain `dec_ttl` names no other) with
    /// reason `invalid_ttl`, the header writes so far committed first, and
    /// stops the current action list; an enclosing `resubmit` resumes.
    /// The TTL was read either way, so it is in the mask whole. The switch
    /// answers these packet-ins itself with an ICMP time exceeded
    /// (`switch/src/icmp_error.rs`).
    fn dec_ttl(&mut self, table: u8, cookie: u64) -> bool {
        let family = match self.dl_type() {
            ETH_TYPE_IPV4 => "IPv4",
            ETH_TYPE_IPV6 => "IPv6",
            _ => {
                self.record(|| TraceEvent::Warn("not an IP packet: skipped".into()));
                return true;
            }
        };
        let ttl = self.read(Field::NwTtl, Field::NwTtl.full_mask());
        if ttl <= 1 {
            self.commit();
            self.actions.push(DpAction::Userspace {
                reason: PacketInReason::InvalidTtl,
                userdata: Vec::new(),
                table,
                cookie,
            });
            self.record(|| TraceEvent::Warn(format!("{family} decrement TTL exception")));
            return false;
        }
        self.write(Field::NwTtl, ttl - 1, Field::NwTtl.full_mask());
        true
    }

    fn output(&mut self, p: u32, table: u8, cookie: u64) {
        let in_port = self.key.get(Field::InPort) as u32;
        match p {
            port::IN_PORT => self.emit_output(in_port),
            port::ALL | port::FLOOD => {
                let env = self.env;
                for &q in &env.ports {
                    if q != in_port {
                        self.emit_output(q);
                    }
                }
            }
            port::CONTROLLER => {
                self.commit();
                self.actions.push(DpAction::Userspace {
                    reason: PacketInReason::Action,
                    userdata: Vec::new(),
                    table,
                    cookie,
                });
            }
            port::NORMAL | port::TABLE => {
                self.record(|| TraceEvent::Warn("unsupported output port: skipped".into()));
            }
            port::NONE => {}
            _ if p == in_port => {
                self.record(|| TraceEvent::Warn("skipping output to input port".into()));
            }
            // Port 0 is never a port; beyond the reserved range only LOCAL
            // is; and when the ports are known, one that is not among them
            // does not exist (OVS: "Nonexistent output port", nothing sent).
            _ if p == 0 || (p > port::MAX && p != port::LOCAL) || self.env.port_missing(p) => {
                self.record(|| TraceEvent::Warn("Nonexistent output port".into()));
            }
            _ => self.emit_output(p),
        }
    }

    fn emit_output(&mut self, p: u32) {
        self.commit();
        if self.tun_dirty {
            self.tun_dirty = false;
            for f in Field::TUNNEL {
                self.wc.mask_field(f);
            }
            let now = tunnel_of(&self.key);
            if now != self.tun_sent {
                self.tun_sent = now;
                self.actions.push(DpAction::SetTunnel(now));
            }
        }
        self.actions.push(DpAction::Output(p));
    }

    /// Emits `Set` for every header field written since the last commit
    /// whose value differs from the packet's.
    fn commit(&mut self) {
        if self.dirty.is_zero() {
            return;
        }
        let icmp_whole = self.icmp_header_changed();
        for &f in Field::ALL {
            // A dirty shared word is dirty under both names: only the one
            // the packet owns is written.
            if !f.is_header() || self.dirty.get(f) == 0 || !self.base.owns(f) {
                continue;
            }
            // The comparison reads the field's input value, and Set carries
            // the whole field: both depend on every bit of it.
            self.wc.mask_field(f);
            let v = self.key.get(f);
            if v != self.base.get(f) || (icmp_whole && matches!(f, Field::TpSrc | Field::TpDst)) {
                self.actions.push(DpAction::Set { field: f, value: v });
                self.base.set(f, v);
            }
        }
        self.dirty = FlowKey::ZERO;
    }

    /// Whether an ICMP/ICMPv6 type or code write is pending and changes the
    /// packet: OVS commits that header whole (`set(icmpv6(type=136,code=0))`),
    /// so both fields are marked dirty and both are written.
    ///
    /// The answer depends on the protocol, so a pending transport write
    /// un-wildcards `nw_proto` (`dl_type` always is): without that, a
    /// megaflow built from a TCP packet would carry its actions to an ICMP
    /// one, which needs both fields written.
    fn icmp_header_changed(&mut self) -> bool {
        let (ty, code) = (Field::TpSrc, Field::TpDst);
        let dirty = self.dirty.get(ty) != 0 || self.dirty.get(code) != 0;
        if !dirty || !self.is_ip() {
            return false;
        }
        self.wc.mask_field(Field::NwProto);
        let proto = self.base.get(Field::NwProto) as u8;
        let icmp = match self.dl_type() {
            ETH_TYPE_IPV4 => proto == ip_proto::ICMP,
            _ => proto == ip_proto::ICMPV6,
        };
        if !icmp {
            return false;
        }
        let changed =
            self.key.get(ty) != self.base.get(ty) || self.key.get(code) != self.base.get(code);
        if changed {
            self.dirty.mask_field(ty);
            self.dirty.mask_field(code);
        }
        changed
    }

    fn clear_ct_fields(&mut self) {
        for f in [Field::CtState, Field::CtZone, Field::CtMark, Field::CtLabel] {
            self.key.set(f, 0);
        }
    }

    fn ct(&mut self, ct: &CtAction) {
        let zone = match ct.zone {
            CtZoneSrc::Imm(z) => z,
            CtZoneSrc::Field(sf) => self.read_sub(&sf) as u16,
        };
        let mut mark: Option<(u32, u32)> = None;
        let mut label: Option<(u128, u128)> = None;
        let mut nat: Option<NatAction> = None;
        for a in &ct.exec {
            self.record(|| TraceEvent::Action(a.clone()));
            let (field, value, mask) = match a {
                Action::Nat(n) => {
                    nat = Some(*n);
                    continue;
                }
                Action::SetField { field, value, mask } => (*field, *value, *mask),
                Action::Load { dst, value } => (dst.field, *value << dst.ofs, dst.mask()),
                // The source bits are the packet's (as the actions so far made
                // them): read, so un-wildcarded, and carried to conntrack as
                // a constant of this megaflow, like a load's.
                Action::Move { src, dst } => {
                    let v = self.read_sub(src);
                    if matches!(dst.field, Field::CtMark | Field::CtLabel) {
                        self.record(|| {
                            TraceEvent::Detail(format!("{} is now {v:#x}", format_subfield(dst)))
                        });
                    }
                    (dst.field, v << dst.ofs, dst.mask())
                }
                _ => {
                    self.record(|| TraceEvent::Warn("not allowed inside ct exec: skipped".into()));
                    continue;
                }
            };
            match field {
                Field::CtMark => {
                    let (v, m) = mark.unwrap_or((0, 0));
                    let (value, mask) = (value as u32, mask as u32);
                    mark = Some(((v & !mask) | (value & mask), m | mask));
                }
                Field::CtLabel => {
                    let (v, m) = label.unwrap_or((0, 0));
                    label = Some(((v & !mask) | (value & mask), m | mask));
                }
                _ => {
                    self.record(|| TraceEvent::Warn("not allowed inside ct exec: skipped".into()));
                    continue;
                }
            }
            self.key.set_masked(field, value, mask);
        }
        self.commit();
        self.actions.push(DpAction::Ct {
            zone,
            commit: ct.commit,
            force: ct.force,
            mark,
            label,
            nat: nat.map(Box::new),
        });
        if let Some(t) = ct.table {
            let id = recirc_id_for_table(t);
            for f in META_FIELDS {
                let written = self.meta_written.get(f);
                if written != 0 {
                    // The written bits are a function of the path (already
                    // in the mask); the others are the input's.
                    or_bits(&mut self.wc, f, f.full_mask() & !written);
                    self.actions.push(DpAction::LoadMeta {
                        field: f,
                        value: self.key.get(f),
                    });
                }
            }
            self.actions.push(DpAction::Recirc(id));
            let key = self.key;
            self.record(|| {
                TraceEvent::Detail(format!(
                    "A clone of the packet is forked to recirculate. \
                     The forked pipeline will be resumed at table {t}."
                ))
            });
            self.record(|| TraceEvent::Recirc {
                id,
                zone,
                key: Box::new(key),
                nat,
            });
        }
        self.record(|| {
            TraceEvent::Detail(
                "Sets the packet to an untracked state, and clears all the conntrack fields."
                    .into(),
            )
        });
        self.clear_ct_fields();
    }
}

/// A sub-field as `NXM_NX_REG1[]`, `NXM_NX_REG1[3]` or `NXM_NX_REG1[0..15]`.
pub fn format_subfield(sf: &SubField) -> String {
    let name = sf.field.nxm_name();
    if sf.ofs == 0 && u32::from(sf.n_bits) == sf.field.bits() {
        format!("{name}[]")
    } else if sf.n_bits == 1 {
        format!("{name}[{}]", sf.ofs)
    } else {
        let end = u32::from(sf.ofs) + u32::from(sf.n_bits) - 1;
        format!("{name}[{}..{end}]", sf.ofs)
    }
}
