//! `ofproto/trace`-style explanations of what the pipeline does to a packet.
//!
//! A trace is not a second implementation of the pipeline: [`trace`] runs
//! the real slow path ([`crate::xlate::translate_traced`]) with a recorder, turns
//! the recorded [`TraceEvent`]s into a tree of [`TraceNode`]s and prints it
//! the way `ovs-appctl ofproto/trace` does:
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
//! Recirculation: every `ct(table=T)` queues the recirculated packet (the
//! key at the moment of the `ct`, with `recirc_id`, `ct_zone` and an assumed
//! `ct_state`, from [`TraceOptions::ct_next`] one per recirculation, else
//! `trk|new`); each is traced in turn as its own section, up to
//! [`MAX_RECIRCULATIONS`].

use std::fmt;

use crate::field::{ct_state, Field};
use crate::flow::{Action, Match};
use crate::key::FlowKey;
use crate::names::TableNames;
use crate::odp::{format_dp_actions_for_key, DpAction};
use crate::print::format_key;
use crate::xlate::{translate_traced, FlowLookup, TraceEvent, XlateEnv, XlateError};

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
    /// A table lookup (`10. ip, priority 5`), parent of the rule's actions.
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

/// One line of the trace and the lines nested under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceNode {
    pub kind: NodeKind,
    pub text: String,
    pub subs: Vec<TraceNode>,
}

impl TraceNode {
    fn leaf(kind: NodeKind, text: impl Into<String>) -> Self {
        TraceNode {
            kind,
            text: text.into(),
            subs: Vec::new(),
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
            if let TraceEvent::Recirc { id, zone, key } = e {
                let (state, default_state) = match ct_next.next() {
                    Some(s) => (*s, false),
                    None => (ct_state::TRK | ct_state::NEW, true),
                };
                let mut k = *key;
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

fn table_label(table: u8, names: Option<&TableNames>) -> String {
    match names.and_then(|n| n.name(table)) {
        Some(name) => format!("{table:2}. {name}:"),
        None => format!("{table:2}."),
    }
}

/// Builds the node tree of one pass from its events.
fn build_tree(events: &[TraceEvent], opts: &TraceOptions) -> TraceNode {
    let names = opts.names.as_ref();
    let mut stack = vec![TraceNode::leaf(
        NodeKind::Bridge,
        format!("bridge(\"{}\")", opts.bridge),
    )];
    fn top(stack: &mut [TraceNode]) -> &mut TraceNode {
        // The root is never popped, so the stack is never empty.
        let last = stack.len() - 1;
        &mut stack[last]
    }
    for e in events {
        match e {
            TraceEvent::Thaw { table } => {
                let resume = match names.and_then(|n| n.name(*table)) {
                    Some(name) => format!("Resuming from table {table} ({name})"),
                    None => format!("Resuming from table {table}"),
                };
                let mut thaw = TraceNode::leaf(NodeKind::Thaw, "thaw");
                thaw.subs.push(TraceNode::leaf(NodeKind::Table, resume));
                top(&mut stack).subs.push(thaw);
            }
            TraceEvent::Table { table, rule } => {
                let label = table_label(*table, names);
                let mut node = match rule {
                    None => TraceNode::leaf(NodeKind::Table, format!("{label} No match.")),
                    Some(r) => {
                        let m = crate::print::format_match(&r.flow.matches);
                        let mut text = label;
                        text.push(' ');
                        if !m.is_empty() {
                            text.push_str(&m);
                            text.push_str(", ");
                        }
                        text.push_str(&format!("priority {}", r.flow.priority));
                        if r.flow.cookie != 0 {
                            text.push_str(&format!(", cookie {:#x}", r.flow.cookie));
                        }
                        TraceNode::leaf(NodeKind::Table, text)
                    }
                };
                let no_actions = match rule {
                    Some(r) => r.flow.actions.is_empty(),
                    None => true,
                };
                if no_actions {
                    node.subs.push(TraceNode::leaf(NodeKind::Action, "drop"));
                }
                stack.push(node);
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
                    .push(TraceNode::leaf(NodeKind::Action, text));
            }
            TraceEvent::Detail(s) => top(&mut stack)
                .subs
                .push(TraceNode::leaf(NodeKind::Detail, s.clone())),
            TraceEvent::Warn(s) => top(&mut stack)
                .subs
                .push(TraceNode::leaf(NodeKind::Warn, s.clone())),
            TraceEvent::Error(s) => top(&mut stack)
                .subs
                .push(TraceNode::leaf(NodeKind::Error, s.clone())),
            TraceEvent::Recirc { .. } => {}
        }
    }
    while stack.len() > 1 {
        if let Some(node) = stack.pop() {
            top(&mut stack).subs.push(node);
        }
    }
    stack
        .pop()
        .unwrap_or_else(|| TraceNode::leaf(NodeKind::Bridge, ""))
}

fn format_action(a: &Action, names: Option<&TableNames>) -> String {
    crate::print::format_actions(std::slice::from_ref(a), names)
}

fn write_nodes(f: &mut fmt::Formatter<'_>, nodes: &[TraceNode], level: usize) -> fmt::Result {
    for (i, n) in nodes.iter().enumerate() {
        if n.kind == NodeKind::Bridge {
            writeln!(f)?;
        }
        let step = usize::from(i + 1 < nodes.len() || n.kind.is_leaf());
        let indent = (level + step) * 4;
        let pad = "";
        match n.kind {
            NodeKind::Detail => writeln!(f, "{pad:indent$} -> {}", n.text)?,
            NodeKind::Warn => writeln!(f, "{pad:indent$} >> {}", n.text)?,
            NodeKind::Error => writeln!(f, "{pad:indent$} >>>> {} <<<<", n.text)?,
            NodeKind::Bridge => {
                writeln!(f, "{pad:indent$}{}", n.text)?;
                writeln!(f, "{pad:indent$}{}", "-".repeat(n.text.len()))?;
            }
            NodeKind::Table | NodeKind::Thaw | NodeKind::Action => {
                writeln!(f, "{pad:indent$}{}", n.text)?
            }
        }
        write_nodes(f, &n.subs, level + 2 * step)?;
    }
    Ok(())
}

fn ct_state_text(state: u32) -> String {
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
