//! `ofproto/trace`-style explanations of what the pipeline does to a packet.
//!
//! A trace is not a second implementation of the pipeline: [`trace`] runs
//! the real slow path ([`crate::xlate::translate_traced`]) with a recorder, turns
//! the recorded [`TraceEvent`]s into a tree of typed [`TraceNode`]s (a
//! [`TraceItem`] each: a [`Lookup`] with the matched rule, an executed
//! [`Action`], a note...) and prints it, in the `Display` impls at the end
//! of this file and nowhere else, the way `ovs-appctl ofproto/trace` does:
//!
//! ```text
//! Flow: tcp,in_port=1,...
//!
//! bridge("oxvs")
//! --------------
//!  0. ip,in_port=1, priority 100
//!     resubmit(,5)
//!      5. priority 10
//!             move:NXM_OF_IP_SRC[]->NXM_NX_REG1[]
//!              -> NXM_NX_REG1[] is now 0xa000001
//!     ct(table=20,zone=5)
//!      -> A clone of the packet is forked to recirculate. ...
//!
//! Final flow: ...
//! Megaflow: recirc_id=0,eth,ip,in_port=1,nw_frag=no
//! Datapath actions: ct(zone=5),recirc(0x15)
//!
//! ===============================================================================
//! recirc(0x15) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
//! ===============================================================================
//! ...
//! ```
//!
//! Layout rule (the same as OVS's, so the output reads the same): a node is
//! indented one step (4 spaces) deeper than its list's level when it is not
//! the last of its list or is a leaf kind (action, detail, warning, error);
//! its children are listed at two steps deeper in that case, at the same
//! level otherwise. A `goto_table` or a tail `resubmit` therefore does not
//! march the output to the right.
//!
//! For programs, the same pass reads as [`TracePass::steps`] (the lookups
//! in execution order, each with its own actions and notes and the step
//! whose `resubmit`/`goto_table` led to it) and [`TracePass::outcome`]
//! (the copies sent to ports, each with the packet as it is sent, to the
//! controller, the recirculations, or why nothing is sent: no match, no
//! output, an output to a port that does not exist, a skipped output, a
//! translation error). `oxvs_api::TraceResult::from_report` puts both,
//! the text and that structure, in the switch's `trace` answer.
//!
//! Recirculation: every `ct(table=T)` queues the recirculated packet (the
//! key at the moment of the `ct`, with `recirc_id`, `ct_zone` and an assumed
//! `ct_state`, from [`TraceOptions::ct_next`] one per recirculation, else
//! `trk|new`); each is traced in turn as its own section, up to
//! [`MAX_RECIRCULATIONS`].

use std::fmt;
use std::sync::Arc;

use crate::field::{ct_state, Field};
use crate::flow::{port, Action, Match, NatAction, NatKind, PacketInReason};
use crate::key::FlowKey;
use crate::names::TableNames;
use crate::odp::{format_dp_actions_for_key, DpAction};
use crate::print::format_key;
use crate::tables::Rule;
use crate::xlate::{translate_traced, FlowLookup, TraceEvent, XlateEnv, XlateError};

/// `vlan_tci` bit "a tag is present" (OVS `VLAN_CFI`).
const VLAN_CFI: u16 = 0x1000;

/// Most recirculated passes traced after the first one.
pub const MAX_RECIRCULATIONS: usize = 64;

/// How to trace.
#[derive(Clone, Debug)]
pub struct TraceOptions {
    /// Conntrack state assumed for each recirculation after `ct(table=..)`,
    /// in order (`--ct-next`); when exhausted, `trk|new`.
    pub ct_next: Vec<u32>,
    /// Table names to print (`resubmit(,SpoofGuard)`, ` 10. SpoofGuard: ...`).
    pub names: Option<TableNames>,
    /// The bridge name printed in the `bridge("...")` header.
    pub bridge: String,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            ct_next: Vec::new(),
            names: None,
            bridge: "oxvs".into(),
        }
    }
}

/// What a node of the trace tree is (decides its indentation and prefix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// `bridge("name")` with an underline.
    Bridge,
    /// A table lookup (`10. ip, priority 5`), parent of the rule's actions;
    /// also the `Resuming from table N` line under a `thaw`.
    Table,
    /// A recirculated packet resuming (`thaw`).
    Thaw,
    /// An executed action.
    Action,
    /// ` -> ` a note on the action before.
    Detail,
    /// ` >> ` why the action before did nothing.
    Warn,
    /// ` >>>> ... <<<<` translation failed.
    Error,
}

impl NodeKind {
    /// Leaf kinds are always indented one step (OVS "terminal" nodes).
    fn is_leaf(self) -> bool {
        matches!(
            self,
            NodeKind::Action | NodeKind::Detail | NodeKind::Warn | NodeKind::Error
        )
    }
}

/// A table lookup: the table and the flow that matched.
#[derive(Clone, Debug)]
pub struct Lookup {
    pub table: u8,
    /// The table's name, when the trace names tables.
    pub table_name: Option<String>,
    /// The flow that matched; `None`: no flow matched (the packet is
    /// dropped there, OpenFlow's table-miss).
    pub rule: Option<Arc<Rule>>,
    /// The matched flow's actions as `dump-flows` prints them (with table
    /// names when the trace names tables; `drop` for none); empty on a miss.
    pub actions_text: String,
}

impl Lookup {
    /// The matched flow's match in `ovs-ofctl` syntax, without the priority
    /// (empty: it matches everything, or no flow matched).
    pub fn match_text(&self) -> String {
        self.rule
            .as_ref()
            .map(|r| crate::print::format_match(&r.flow.matches))
            .unwrap_or_default()
    }

    /// Whether the lookup ends in a drop by itself: no flow matched, or
    /// the one that did has no actions (the trace prints `drop` under it).
    pub fn drops(&self) -> bool {
        self.rule.as_ref().is_none_or(|r| r.flow.actions.is_empty())
    }
}

/// What one line of the trace says: the typed form the text is rendered
/// from (only by the `Display` impls below).
#[derive(Clone, Debug)]
pub enum TraceItem {
    /// `bridge("name")`: the root of a pass.
    Bridge { name: String },
    /// A table lookup; its subs are what the matched flow's actions did.
    Lookup(Lookup),
    /// `thaw`: a recirculated packet resumes (its sub is a [`TraceItem::Resume`]).
    Thaw,
    /// `Resuming from table N`.
    Resume {
        table: u8,
        table_name: Option<String>,
    },
    /// An executed action and how the trace prints it.
    Action { action: Action, text: String },
    /// ` -> ` a note on the action before.
    Detail(String),
    /// ` >> ` why the action before did nothing.
    Warn(String),
    /// ` >>>> ... <<<<` translation failed.
    Error(String),
}

/// One line of the trace and the lines nested under it.
#[derive(Clone, Debug)]
pub struct TraceNode {
    pub item: TraceItem,
    pub subs: Vec<TraceNode>,
}

impl TraceNode {
    fn leaf(item: TraceItem) -> Self {
        TraceNode {
            item,
            subs: Vec::new(),
        }
    }

    /// How the node is laid out.
    pub fn kind(&self) -> NodeKind {
        match self.item {
            TraceItem::Bridge { .. } => NodeKind::Bridge,
            TraceItem::Lookup(_) | TraceItem::Resume { .. } => NodeKind::Table,
            TraceItem::Thaw => NodeKind::Thaw,
            TraceItem::Action { .. } => NodeKind::Action,
            TraceItem::Detail(_) => NodeKind::Detail,
            TraceItem::Warn(_) => NodeKind::Warn,
            TraceItem::Error(_) => NodeKind::Error,
        }
    }
}

/// Why a pass is traced: the recirculation that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecircInfo {
    pub id: u32,
    /// The conntrack state assumed for it.
    pub ct_state: u32,
    /// Whether that state is the default (no `ct_next` entry left).
    pub default_state: bool,
}

/// One translation of the trace: the packet as it entered, the steps, the
/// result.
#[derive(Clone, Debug)]
pub struct TracePass {
    /// `None` for the packet as given; `Some` for a recirculated copy.
    pub recirc: Option<RecircInfo>,
    /// The key translated.
    pub flow: FlowKey,
    /// The step tree (one `Bridge` root).
    pub nodes: Vec<TraceNode>,
    /// The working key after the last action.
    pub final_flow: FlowKey,
    /// The megaflow: the key under the translation's wildcards.
    pub megaflow: Match,
    pub actions: Vec<DpAction>,
    pub error: Option<XlateError>,
}

/// A whole trace: the first pass and every recirculation it led to.
#[derive(Clone, Debug)]
pub struct TraceReport {
    pub passes: Vec<TracePass>,
    /// Recirculations queued but not traced (over [`MAX_RECIRCULATIONS`]).
    pub unprocessed: usize,
}

/// A note of the trace: what an action did, or why it did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoteKind {
    /// ` -> ` (`NXM_NX_REG1[] is now 0x5`).
    Detail,
    /// ` >> ` (`Nonexistent output port`).
    Warn,
    /// ` >>>> ... <<<<` translation failed here.
    Error,
}

/// A ` -> `, ` >> ` or ` >>>> ` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub kind: NoteKind,
    pub text: String,
}

/// An action a step's flow executed.
#[derive(Clone, Debug)]
pub struct StepAction {
    pub action: Action,
    /// As the trace prints it.
    pub text: String,
    /// The lines under it: what it did, or why it did nothing.
    pub notes: Vec<Note>,
    /// For a `resubmit` or `goto_table`: the step (index in the pass's
    /// steps) of the lookup it led to.
    pub lookup: Option<usize>,
}

/// A table lookup of a pass, with the actions its flow executed.
#[derive(Clone, Debug)]
pub struct Step {
    pub lookup: Lookup,
    /// The step whose `resubmit` or `goto_table` led here (`None`: the
    /// pass's first lookup).
    pub parent: Option<usize>,
    /// In execution order. A resubmitted lookup's own actions belong to
    /// its step, not to this one.
    pub actions: Vec<StepAction>,
    /// Notes that follow no action of the step.
    pub notes: Vec<Note>,
}

/// The steps of a pass, in the order the lookups happened.
#[derive(Clone, Debug, Default)]
pub struct PassSteps {
    pub steps: Vec<Step>,
    /// Notes outside any lookup (`Unknown recirculation id`).
    pub notes: Vec<Note>,
}

/// A copy of the packet sent to a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortOutput {
    /// The port (`in_port` resolved).
    pub port: u32,
    /// The packet as it is sent: the pass's flow with the datapath actions
    /// before the output applied (header writes, VLAN, tunnel metadata).
    pub packet: FlowKey,
}

/// A copy of the packet sent to the controller (a packet-in).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerOutput {
    pub reason: PacketInReason,
    /// Table and cookie of the flow that sent it.
    pub table: u8,
    pub cookie: u64,
}

/// Why a pass sends the packet nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Translation failed: nothing is sent.
    Error(XlateError),
    /// Outputs went only to ports that do not exist (OVS: "Nonexistent
    /// output port"); the first such port when the action named it.
    NonexistentPort { port: Option<u32> },
    /// Outputs were skipped for another reason (`skipping output to input
    /// port`, `unsupported output port: skipped`).
    OutputSkipped { port: Option<u32>, why: String },
    /// The last table looked up had no matching flow (table-miss drop).
    NoMatch,
    /// The flows sent it nowhere (`drop`, or no output action).
    NoOutput,
}

/// A pass that sends the packet nowhere, and what decided it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub reason: DropReason,
    /// The step that decided (index in the pass's steps): the one whose
    /// output was refused, where translation failed, else the last one.
    pub step: Option<usize>,
}

/// What a pass does with the packet, from its datapath actions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassOutcome {
    /// Copies sent to ports, in order.
    pub outputs: Vec<PortOutput>,
    /// Copies sent to the controller.
    pub controller: Vec<ControllerOutput>,
    /// `ct(table=..)` recirculations (ids; each is traced as a later pass).
    pub recirculations: Vec<u32>,
    /// Set when the pass sends nothing anywhere: no output, no controller,
    /// no recirculation.
    pub drop: Option<Dropped>,
}

const NONEXISTENT_PORT: &str = "Nonexistent output port";

impl TracePass {
    /// The pass's table lookups in the order they happened, each with the
    /// actions its flow executed (the tree of [`TracePass::nodes`],
    /// flattened; `parent` and [`StepAction::lookup`] keep its shape).
    pub fn steps(&self) -> PassSteps {
        let mut out = PassSteps::default();
        flatten(&self.nodes, None, &mut out);
        out
    }

    /// Where the pass sends the packet, and why nowhere when it does not.
    pub fn outcome(&self) -> PassOutcome {
        let mut o = PassOutcome::default();
        let mut key = self.flow;
        for a in &self.actions {
            match a {
                DpAction::Output(p) => {
                    let port = if *p == port::IN_PORT {
                        key.get(Field::InPort) as u32
                    } else {
                        *p
                    };
                    o.outputs.push(PortOutput { port, packet: key });
                }
                DpAction::Set { field, value } | DpAction::LoadMeta { field, value } => {
                    key.set(*field, *value)
                }
                DpAction::PushVlan { tci, .. } => {
                    key.set(Field::VlanTci, u128::from(*tci | VLAN_CFI))
                }
                DpAction::PopVlan => key.set(Field::VlanTci, 0),
                DpAction::SetTunnel(t) => t.write_to(&mut key),
                DpAction::CtClear => {
                    for f in [Field::CtState, Field::CtZone, Field::CtMark, Field::CtLabel] {
                        key.set(f, 0);
                    }
                }
                // The connection tracker's verdict is not known here (the
                // next pass assumes one).
                DpAction::Ct { .. } | DpAction::Learn(_) | DpAction::Meter(_) => {}
                DpAction::Recirc(id) => o.recirculations.push(*id),
                DpAction::Userspace {
                    reason,
                    table,
                    cookie,
                    ..
                } => o.controller.push(ControllerOutput {
                    reason: *reason,
                    table: *table,
                    cookie: *cookie,
                }),
            }
        }
        if o.outputs.is_empty() && o.controller.is_empty() && o.recirculations.is_empty() {
            o.drop = Some(self.why_dropped());
        }
        o
    }

    fn why_dropped(&self) -> Dropped {
        let s = self.steps();
        let last = s.steps.len().checked_sub(1);
        if let Some(e) = self.error {
            let step = s.steps.iter().rposition(|st| {
                st.notes.iter().any(|n| n.kind == NoteKind::Error)
                    || st
                        .actions
                        .iter()
                        .any(|a| a.notes.iter().any(|n| n.kind == NoteKind::Error))
            });
            return Dropped {
                reason: DropReason::Error(e),
                step,
            };
        }
        // The first output that did nothing, with the warning that says why.
        for (i, st) in s.steps.iter().enumerate() {
            for a in &st.actions {
                let port = match a.action {
                    Action::Output(p) => Some(p),
                    Action::OutputReg(_) => None,
                    _ => continue,
                };
                if let Some(w) = a.notes.iter().find(|n| n.kind == NoteKind::Warn) {
                    let reason = if w.text == NONEXISTENT_PORT {
                        DropReason::NonexistentPort { port }
                    } else {
                        DropReason::OutputSkipped {
                            port,
                            why: w.text.clone(),
                        }
                    };
                    return Dropped {
                        reason,
                        step: Some(i),
                    };
                }
            }
        }
        let reason = match last.map(|i| &s.steps[i]) {
            Some(st) if st.lookup.rule.is_none() => DropReason::NoMatch,
            _ => DropReason::NoOutput,
        };
        Dropped { reason, step: last }
    }
}

/// Appends the steps of `nodes` (children of step `cur`) to `out`.
fn flatten(nodes: &[TraceNode], cur: Option<usize>, out: &mut PassSteps) {
    for n in nodes {
        match &n.item {
            TraceItem::Lookup(l) => {
                let idx = out.steps.len();
                if let Some(parent) = cur.and_then(|c| out.steps.get_mut(c)) {
                    // The resubmit or goto_table that led here: the last
                    // one of the parent not linked yet.
                    if let Some(a) = parent.actions.iter_mut().rev().find(|a| {
                        a.lookup.is_none()
                            && matches!(a.action, Action::Resubmit { .. } | Action::GotoTable(_))
                    }) {
                        a.lookup = Some(idx);
                    }
                }
                out.steps.push(Step {
                    lookup: l.clone(),
                    parent: cur,
                    actions: Vec::new(),
                    notes: Vec::new(),
                });
                flatten(&n.subs, Some(idx), out);
            }
            TraceItem::Action { action, text } => {
                let a = StepAction {
                    action: action.clone(),
                    text: text.clone(),
                    notes: Vec::new(),
                    lookup: None,
                };
                match cur.and_then(|c| out.steps.get_mut(c)) {
                    Some(st) => st.actions.push(a),
                    // Never: actions run inside a lookup. Kept as a note.
                    None => out.notes.push(Note {
                        kind: NoteKind::Detail,
                        text: a.text,
                    }),
                }
            }
            TraceItem::Detail(t) | TraceItem::Warn(t) | TraceItem::Error(t) => {
                let kind = match n.kind() {
                    NodeKind::Detail => NoteKind::Detail,
                    NodeKind::Warn => NoteKind::Warn,
                    _ => NoteKind::Error,
                };
                let note = Note {
                    kind,
                    text: t.clone(),
                };
                match cur.and_then(|c| out.steps.get_mut(c)) {
                    Some(st) => match st.actions.last_mut() {
                        Some(a) => a.notes.push(note),
                        None => st.notes.push(note),
                    },
                    None => out.notes.push(note),
                }
            }
            TraceItem::Bridge { .. } | TraceItem::Thaw | TraceItem::Resume { .. } => {
                flatten(&n.subs, cur, out)
            }
        }
    }
}

/// Traces `key` through `tables`, following recirculations.
pub fn trace<L: FlowLookup + ?Sized>(
    tables: &L,
    key: &FlowKey,
    env: &XlateEnv,
    opts: &TraceOptions,
) -> TraceReport {
    let mut passes = Vec::new();
    let mut queue: std::collections::VecDeque<(RecircInfo, FlowKey)> = Default::default();
    let mut ct_next = opts.ct_next.iter();
    let mut pending: Option<(Option<RecircInfo>, FlowKey)> = Some((None, *key));
    let mut unprocessed = 0;

    while let Some((recirc, flow)) = pending.take() {
        let mut events = Vec::new();
        let (t, final_flow) = translate_traced(tables, &flow, env, &mut events);
        for e in &events {
            if let TraceEvent::Recirc { id, zone, key, nat } = e {
                let (state, default_state) = match ct_next.next() {
                    Some(s) => (*s, false),
                    None => (ct_state::TRK | ct_state::NEW, true),
                };
                let mut k = **key;
                if let Some(n) = nat {
                    simulate_nat(&mut k, n, state);
                }
                k.set(Field::RecircId, *id as u128);
                k.set(Field::CtZone, *zone as u128);
                k.set(Field::CtState, state as u128);
                let info = RecircInfo {
                    id: *id,
                    ct_state: state,
                    default_state,
                };
                queue.push_back((info, k));
            }
        }
        passes.push(TracePass {
            recirc,
            flow,
            nodes: vec![build_tree(&events, opts)],
            final_flow,
            megaflow: Match {
                value: flow.and(&t.wildcards),
                mask: t.wildcards,
            },
            actions: t.actions,
            error: t.error,
        });
        if passes.len() > MAX_RECIRCULATIONS {
            unprocessed = queue.len();
            break;
        }
        pending = queue.pop_front().map(|(info, k)| (Some(info), k));
    }
    TraceReport {
        passes,
        unprocessed,
    }
}

/// What a trace assumes `nat` did, as `ofproto/trace` does ("Replacing
/// src/dst IP/ports to simulate NAT"): with `snat` (`dnat`) in the assumed
/// `ct_state` and a `nat(src=...)` (`nat(dst=...)`) range, the source
/// (destination) becomes the range's first address and port.
fn simulate_nat(k: &mut FlowKey, n: &NatAction, state: u32) {
    let (Some(kind), Some(r)) = (n.kind, n.range) else {
        return;
    };
    let (flag, v4, v6, tp) = match kind {
        NatKind::Src => (ct_state::SNAT, Field::NwSrc, Field::Ipv6Src, Field::TpSrc),
        NatKind::Dst => (ct_state::DNAT, Field::NwDst, Field::Ipv6Dst, Field::TpDst),
    };
    if state & flag == 0 {
        return;
    }
    match r.addr_min {
        std::net::IpAddr::V4(a) => k.set(v4, u128::from(u32::from(a))),
        std::net::IpAddr::V6(a) => k.set(v6, u128::from(a)),
    }
    if let Some((lo, _)) = r.ports {
        k.set(tp, u128::from(lo));
    }
}

/// Extracts the key of `frame` arriving on `in_port`, then traces it.
pub fn trace_packet<L: FlowLookup + ?Sized>(
    tables: &L,
    frame: &[u8],
    in_port: u32,
    env: &XlateEnv,
    opts: &TraceOptions,
) -> TraceReport {
    let key = crate::extract::extract(frame, in_port);
    trace(tables, &key, env, opts)
}

fn table_name(table: u8, names: Option<&TableNames>) -> Option<String> {
    names.and_then(|n| n.name(table)).map(str::to_string)
}

/// Builds the node tree of one pass from its events.
fn build_tree(events: &[TraceEvent], opts: &TraceOptions) -> TraceNode {
    let names = opts.names.as_ref();
    let mut stack = vec![TraceNode::leaf(TraceItem::Bridge {
        name: opts.bridge.clone(),
    })];
    fn top(stack: &mut [TraceNode]) -> &mut TraceNode {
        // The root is never popped, so the stack is never empty.
        let last = stack.len() - 1;
        &mut stack[last]
    }
    for e in events {
        match e {
            TraceEvent::Thaw { table } => {
                let mut thaw = TraceNode::leaf(TraceItem::Thaw);
                thaw.subs.push(TraceNode::leaf(TraceItem::Resume {
                    table: *table,
                    table_name: table_name(*table, names),
                }));
                top(&mut stack).subs.push(thaw);
            }
            TraceEvent::Table { table, rule } => {
                let actions_text = match rule {
                    Some(r) => {
                        crate::print::format_actions_for(&r.flow.actions, &r.flow.matches, names)
                    }
                    None => String::new(),
                };
                stack.push(TraceNode::leaf(TraceItem::Lookup(Lookup {
                    table: *table,
                    table_name: table_name(*table, names),
                    rule: rule.clone(),
                    actions_text,
                })));
            }
            TraceEvent::Close => {
                if stack.len() > 1 {
                    if let Some(node) = stack.pop() {
                        top(&mut stack).subs.push(node);
                    }
                }
            }
            TraceEvent::Action(a) => {
                let text = format_action(a, names);
                top(&mut stack)
                    .subs
                    .push(TraceNode::leaf(TraceItem::Action {
                        action: a.clone(),
                        text,
                    }));
            }
            TraceEvent::Detail(s) => top(&mut stack)
                .subs
                .push(TraceNode::leaf(TraceItem::Detail(s.clone()))),
            TraceEvent::Warn(s) => top(&mut stack)
                .subs
                .push(TraceNode::leaf(TraceItem::Warn(s.clone()))),
            TraceEvent::Error(s) => top(&mut stack)
                .subs
                .push(TraceNode::leaf(TraceItem::Error(s.clone()))),
            TraceEvent::Recirc { .. } => {}
        }
    }
    while stack.len() > 1 {
        if let Some(node) = stack.pop() {
            top(&mut stack).subs.push(node);
        }
    }
    stack.pop().unwrap_or_else(|| {
        TraceNode::leaf(TraceItem::Bridge {
            name: String::new(),
        })
    })
}

fn format_action(a: &Action, names: Option<&TableNames>) -> String {
    crate::print::format_actions(std::slice::from_ref(a), names)
}

// ---------------------------------------------------------------------------
// The text: rendered from the typed form above, here only.

impl fmt::Display for Lookup {
    /// `10. SpoofGuard: ip,in_port=3, priority 200, cookie 0x2` or
    /// `10. No match.`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:2}.", self.table)?;
        if let Some(name) = &self.table_name {
            write!(f, " {name}:")?;
        }
        let Some(r) = &self.rule else {
            return f.write_str(" No match.");
        };
        let m = crate::print::format_match(&r.flow.matches);
        if !m.is_empty() {
            write!(f, " {m},")?;
        }
        write!(f, " priority {}", r.flow.priority)?;
        if r.flow.cookie != 0 {
            write!(f, ", cookie {:#x}", r.flow.cookie)?;
        }
        Ok(())
    }
}

fn write_nodes(f: &mut fmt::Formatter<'_>, nodes: &[TraceNode], level: usize) -> fmt::Result {
    for (i, n) in nodes.iter().enumerate() {
        write_node(f, n, i + 1 < nodes.len(), level)?;
    }
    Ok(())
}

/// One node and its subs: indented one step deeper than `level` when it is
/// not the last of its list or is a leaf; its subs two steps deeper then,
/// at the same level otherwise (the module doc's layout rule).
fn write_node(
    f: &mut fmt::Formatter<'_>,
    n: &TraceNode,
    not_last: bool,
    level: usize,
) -> fmt::Result {
    let kind = n.kind();
    let step = usize::from(not_last || kind.is_leaf());
    let indent = (level + step) * 4;
    let pad = "";
    match &n.item {
        TraceItem::Bridge { name } => {
            let line = format!("bridge(\"{name}\")");
            writeln!(f)?;
            writeln!(f, "{pad:indent$}{line}")?;
            writeln!(f, "{pad:indent$}{}", "-".repeat(line.len()))?;
        }
        TraceItem::Lookup(l) => writeln!(f, "{pad:indent$}{l}")?,
        TraceItem::Thaw => writeln!(f, "{pad:indent$}thaw")?,
        TraceItem::Resume { table, table_name } => match table_name {
            Some(name) => writeln!(f, "{pad:indent$}Resuming from table {table} ({name})")?,
            None => writeln!(f, "{pad:indent$}Resuming from table {table}")?,
        },
        TraceItem::Action { text, .. } => writeln!(f, "{pad:indent$}{text}")?,
        TraceItem::Detail(t) => writeln!(f, "{pad:indent$} -> {t}")?,
        TraceItem::Warn(t) => writeln!(f, "{pad:indent$} >> {t}")?,
        TraceItem::Error(t) => writeln!(f, "{pad:indent$} >>>> {t} <<<<")?,
    }
    let sub_level = level + 2 * step;
    if let TraceItem::Lookup(l) = &n.item {
        if l.drops() {
            // OVS prints `drop` under a miss and under a flow without
            // actions: a leaf, so always one step in.
            let indent = (sub_level + 1) * 4;
            writeln!(f, "{pad:indent$}drop")?;
        }
    }
    write_nodes(f, &n.subs, sub_level)
}

/// `trk|new`-style text of conntrack state bits (`0` for none).
pub fn ct_state_text(state: u32) -> String {
    let names: Vec<&str> = ct_state::NAMES
        .iter()
        .filter(|(_, bit)| state & bit != 0)
        .map(|(n, _)| *n)
        .collect();
    if names.is_empty() {
        "0".into()
    } else {
        names.join("|")
    }
}

impl fmt::Display for TracePass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Flow: {}", format_key(&self.flow))?;
        write_nodes(f, &self.nodes, 0)?;
        writeln!(f)?;
        if self.final_flow == self.flow {
            writeln!(f, "Final flow: unchanged")?;
        } else {
            writeln!(f, "Final flow: {}", format_key(&self.final_flow))?;
        }
        writeln!(
            f,
            "Megaflow: {}",
            crate::print::format_match(&self.megaflow)
        )?;
        write!(
            f,
            "Datapath actions: {}",
            format_dp_actions_for_key(&self.actions, &self.flow)
        )?;
        if let Some(e) = self.error {
            write!(f, "\nTranslation failed ({e}), packet is dropped.\n")?;
        }
        Ok(())
    }
}

impl fmt::Display for TraceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rule = "=".repeat(79);
        for pass in &self.passes {
            if let Some(r) = pass.recirc {
                write!(f, "\n\n{rule}\nrecirc({:#x})", r.id)?;
                if r.default_state {
                    write!(
                        f,
                        " - resume conntrack with default ct_state=trk|new \
                         (use --ct-next to customize)"
                    )?;
                } else {
                    write!(
                        f,
                        " - resume conntrack with ct_state={}",
                        ct_state_text(r.ct_state)
                    )?;
                }
                write!(f, "\n{rule}\n\n")?;
            }
            write!(f, "{pass}")?;
        }
        if self.unprocessed > 0 {
            write!(
                f,
                "\n\n{rule}\nTrace reached the recirculation limit.  Stopping the trace here.\
                 \nQueued but not processed: {} recirculations.",
                self.unprocessed
            )?;
        }
        Ok(())
    }
}

/// The typed form: steps and outcomes of real traces (the text is checked
/// in `tests/xlate_trace.rs` and against OVS in `ctl/tests/ovs_diff.rs`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowMod;
    use crate::parse::{parse_flow_file, parse_packet_spec, ParseContext};
    use crate::tables::{Pipeline, TableSet};

    fn tables(text: &str) -> Arc<TableSet> {
        let flows = parse_flow_file(text, &ParseContext::default()).expect("flows parse");
        let mods: Vec<FlowMod> = flows.into_iter().map(FlowMod::add).collect();
        let p = Pipeline::new();
        p.apply(&mods, 0).expect("flows apply");
        p.snapshot()
    }

    /// `ports` empty: not known (an offline trace without `--ports`).
    fn run(flows: &str, spec: &str, ports: &[u32]) -> TraceReport {
        let key = parse_packet_spec(spec, &ParseContext::default()).expect("spec parses");
        let env = XlateEnv {
            ports: ports.to_vec(),
            ..XlateEnv::default()
        };
        trace(&*tables(flows), &key, &env, &TraceOptions::default())
    }

    fn dropped(reason: DropReason, step: usize) -> Option<Dropped> {
        Some(Dropped {
            reason,
            step: Some(step),
        })
    }

    #[test]
    fn outputs_to_ports_that_do_not_exist_send_nothing_and_say_why() {
        let flows = "table=0,priority=10,in_port=1,tcp actions=output:7,output:0
                     table=0,priority=5,in_port=1 actions=output:7,output:0,output:2";
        // The ports are known (the switch; an offline trace with --ports).
        let r = run(flows, "in_port=1,tcp", &[1, 2, 3]);
        let p = &r.passes[0];
        assert!(p.actions.is_empty());
        let o = p.outcome();
        assert!(o.outputs.is_empty());
        assert_eq!(
            o.drop,
            dropped(DropReason::NonexistentPort { port: Some(7) }, 0)
        );
        let s = p.steps();
        let notes: Vec<(&str, Vec<&str>)> = s.steps[0]
            .actions
            .iter()
            .map(|a| {
                (
                    a.text.as_str(),
                    a.notes.iter().map(|n| n.text.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            notes,
            vec![
                ("output:7", vec![NONEXISTENT_PORT]),
                ("output:0", vec![NONEXISTENT_PORT])
            ]
        );
        // OVS's words, under the action.
        let text = r.to_string();
        assert_eq!(
            text.matches("\n     >> Nonexistent output port\n").count(),
            2,
            "{text}"
        );
        assert!(text.ends_with("Datapath actions: drop"), "{text}");
        // Another output that exists: sent, no drop.
        let o = run(flows, "in_port=1,udp", &[1, 2, 3]).passes[0].outcome();
        assert_eq!(o.outputs.len(), 1);
        assert_eq!(o.outputs[0].port, 2);
        assert_eq!(o.drop, None);
        // The ports are not known (offline without --ports): only port 0
        // is refused.
        let r = run(flows, "in_port=1,tcp", &[]);
        let o = r.passes[0].outcome();
        let ports: Vec<u32> = o.outputs.iter().map(|o| o.port).collect();
        assert_eq!(ports, vec![7]);
        assert_eq!(r.to_string().matches("Nonexistent output port").count(), 1);
        let o =
            run("table=0,priority=1 actions=output:0", "in_port=1,tcp", &[]).passes[0].outcome();
        assert_eq!(
            o.drop,
            dropped(DropReason::NonexistentPort { port: Some(0) }, 0)
        );
    }

    #[test]
    fn steps_keep_each_lookups_own_actions_and_their_parents() {
        let r = run(
            "table=0,priority=10,in_port=1 actions=resubmit(,5),mod_dl_src:0a:00:00:00:00:01,goto_table:10
             table=5,priority=1,ip actions=move:NXM_OF_IP_SRC[]->NXM_NX_REG1[],resubmit(,6)
             table=6,priority=1 actions=load:0x7->NXM_NX_REG2[]
             table=10,priority=1,ip actions=output:2",
            "in_port=1,tcp,nw_src=10.0.0.1",
            &[1, 2],
        );
        let s = r.passes[0].steps();
        let shape: Vec<(u8, Option<usize>, usize)> = s
            .steps
            .iter()
            .map(|st| (st.lookup.table, st.parent, st.actions.len()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, None, 3),
                (5, Some(0), 2),
                (6, Some(1), 1),
                (10, Some(0), 1)
            ]
        );
        let links: Vec<Option<usize>> = s.steps[0].actions.iter().map(|a| a.lookup).collect();
        assert_eq!(links, vec![Some(1), None, Some(3)]);
        assert_eq!(s.steps[1].actions[1].lookup, Some(2));
        assert_eq!(
            s.steps[1].actions[0].notes,
            vec![Note {
                kind: NoteKind::Detail,
                text: "NXM_NX_REG1[] is now 0xa000001".into()
            }]
        );
        let l = &s.steps[3].lookup;
        assert_eq!(
            (l.match_text().as_str(), l.actions_text.as_str()),
            ("ip", "output:2")
        );
        assert!(s.notes.is_empty());
        // The copy on port 2 carries the header write made before it.
        let o = r.passes[0].outcome();
        assert_eq!(o.outputs.len(), 1);
        assert_eq!(o.outputs[0].packet.get(Field::DlSrc), 0x0a00_0000_0001);
        assert_eq!(o.drop, None);
    }

    #[test]
    fn drops_name_what_decided() {
        // A miss: the last lookup decided.
        let r = run(
            "table=0,priority=1 actions=goto_table:10",
            "in_port=1,tcp",
            &[1, 2],
        );
        let p = &r.passes[0];
        assert_eq!(p.outcome().drop, dropped(DropReason::NoMatch, 1));
        assert!(p.steps().steps[1].lookup.drops());
        // A flow without output.
        let r = run("table=0,priority=1 actions=drop", "in_port=1,tcp", &[1, 2]);
        assert_eq!(r.passes[0].outcome().drop, dropped(DropReason::NoOutput, 0));
        // Output to the input port is skipped (not a missing port).
        let r = run(
            "table=0,priority=1 actions=output:1",
            "in_port=1,tcp",
            &[1, 2],
        );
        assert_eq!(
            r.passes[0].outcome().drop,
            dropped(
                DropReason::OutputSkipped {
                    port: Some(1),
                    why: "skipping output to input port".into()
                },
                0
            )
        );
        // A translation error, where it happened.
        let r = run(
            "table=0,priority=1 actions=resubmit(,0)",
            "in_port=1,tcp",
            &[1],
        );
        let o = r.passes[0].outcome();
        let d = o.drop.expect("dropped");
        assert_eq!(
            d.reason,
            DropReason::Error(XlateError::RecursionTooDeep(64))
        );
        assert!(d.step.is_some());
        // Sent to the controller, or recirculated: not dropped.
        let r = run(
            "table=0,priority=1,cookie=0x9 actions=controller",
            "in_port=1,tcp",
            &[1],
        );
        let o = r.passes[0].outcome();
        assert_eq!(
            o.controller,
            vec![ControllerOutput {
                reason: PacketInReason::Action,
                table: 0,
                cookie: 0x9
            }]
        );
        assert_eq!(o.drop, None);
        let r = run(
            "table=0,priority=1,ip actions=ct(table=5,zone=1)
             table=5,priority=1 actions=set_field:10.1.1.1->tun_dst,set_field:0x5->tun_id,output:in_port",
            "in_port=2,tcp",
            &[1, 2],
        );
        let first = r.passes[0].outcome();
        assert_eq!(
            first.recirculations,
            vec![crate::odp::recirc_id_for_table(5)]
        );
        assert_eq!(first.drop, None);
        // output:in_port goes back out of port 2, with the tunnel metadata.
        let second = r.passes[1].outcome();
        assert_eq!(second.outputs.len(), 1, "{r}");
        assert_eq!(second.outputs[0].port, 2);
        assert_eq!(second.outputs[0].packet.get(Field::TunDst), 0x0a01_0101);
        assert_eq!(second.outputs[0].packet.get(Field::TunId), 5);
    }
}
