//! The one place the agent's flow text is put together.
//!
//! Every flow the agent installs is a [`FlowLine`]: a table of the plan
//! ([`oxvs_pipeline::names`]), a priority ([`crate::priority`]), a cookie
//! ([`crate::cookie`]), matches and actions. Register matches and loads come
//! from the named fields and marks of [`oxvs_pipeline::regs`]. The text is
//! the `ovs-ofctl` dialect with table names:
//!
//! ```text
//! table=Classifier, priority=200, cookie=0x3000000000001, in_port=2, actions=load:2->NXM_NX_REG0[0..3],goto_table:10
//! ```
//!
//! The agent diffs its flows as lines, so this text is part of the
//! contract with a running switch: the golden files of
//! `agent/tests/golden/` pin it byte for byte.

use std::fmt::Write as _;

use oxvs_pipeline::names::TableDef;
use oxvs_pipeline::regs::RegMark;

/// One flow being built.
#[derive(Clone, Debug)]
#[must_use]
pub struct FlowLine {
    table: TableDef,
    priority: u16,
    cookie: u64,
    matches: Vec<String>,
    actions: Vec<String>,
}

impl FlowLine {
    /// A flow of `table` at `priority` with `cookie`, matching everything
    /// and doing nothing yet (a flow without actions drops).
    pub fn new(table: TableDef, priority: u16, cookie: u64) -> FlowLine {
        FlowLine {
            table,
            priority,
            cookie,
            matches: Vec::new(),
            actions: Vec::new(),
        }
    }

    /// The flow's priority.
    pub fn priority(&self) -> u16 {
        self.priority
    }

    /// The same flow at another priority.
    pub fn with_priority(mut self, priority: u16) -> FlowLine {
        self.priority = priority;
        self
    }

    /// Adds a match (`ip`, `in_port=3`, `nw_dst=10.0.0.0/8`), in order.
    pub fn matching(mut self, m: impl Into<String>) -> FlowLine {
        self.matches.push(m.into());
        self
    }

    /// Adds the match of a register mark (`reg0=0x2/0xf`).
    pub fn mark(self, mark: RegMark) -> FlowLine {
        self.matching(mark.matching())
    }

    /// Adds an action (`dec_ttl`, `output:3`), in order.
    pub fn action(mut self, a: impl Into<String>) -> FlowLine {
        self.actions.push(a.into());
        self
    }

    /// Adds the action that sets a register mark (`load:2->NXM_NX_REG0[0..3]`).
    pub fn set_mark(self, mark: RegMark) -> FlowLine {
        self.action(mark.load())
    }

    /// Adds `goto_table:N`.
    pub fn goto(self, table: TableDef) -> FlowLine {
        let id = table.id;
        self.action(format!("goto_table:{id}"))
    }

    /// Adds `drop`.
    pub fn drop_packet(self) -> FlowLine {
        self.action("drop")
    }

    /// The flow's text.
    pub fn text(&self) -> String {
        let mut s = String::with_capacity(128);
        let _ = write!(
            s,
            "table={}, priority={}, cookie={:#x}, ",
            self.table.name, self.priority, self.cookie
        );
        for m in &self.matches {
            s.push_str(m);
            s.push_str(", ");
        }
        s.push_str("actions=");
        s.push_str(&self.actions.join(","));
        s
    }
}

impl From<FlowLine> for String {
    fn from(f: FlowLine) -> String {
        f.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_pipeline::{names, regs};

    #[test]
    fn text() {
        let f = FlowLine::new(names::CLASSIFIER, 200, 0x3_0000_0000_0001)
            .matching("in_port=2")
            .set_mark(regs::FROM_GATEWAY)
            .goto(names::SPOOF_GUARD);
        assert_eq!(
            f.text(),
            "table=Classifier, priority=200, cookie=0x3000000000001, in_port=2, \
             actions=load:2->NXM_NX_REG0[0..3],goto_table:10"
        );
        let f = FlowLine::new(names::OUTPUT, 0, 0x1_0000_0000_0000).drop_packet();
        assert_eq!(
            f.text(),
            "table=Output, priority=0, cookie=0x1000000000000, actions=drop"
        );
    }
}
