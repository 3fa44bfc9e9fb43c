//! `oxvsctl dump-flows --flows FILE`: load a flow file and print its flows
//! the way `ovs-ofctl dump-flows` does.
//!
//! Offline there is no traffic, so counters and durations are zero; the
//! point is to see the flows as the pipeline holds them, normalised (a flow
//! printed here reads the same whichever way it was written). Order: by
//! table, then by descending priority, then file order. A later flow with
//! the same table, priority and match replaces an earlier one, as an
//! `add-flow` does.

use clap::Args;
use oxvs_pipeline::print::{self, DumpOptions, FlowStats};
use oxvs_pipeline::Flow;

use super::{Reported, UsageError};
use crate::flowfile::{self, Source};
use crate::spec;

#[derive(Debug, Args)]
pub struct DumpFlows {
    /// The flow file; `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    flows: String,
    /// Print table names (`table=SpoofGuard`) instead of numbers.
    #[arg(long)]
    names: bool,
    /// Leave out cookie, duration and counters.
    #[arg(long)]
    no_stats: bool,
    /// Only this table (number or name).
    #[arg(long, value_name = "NAME|N")]
    table: Option<String>,
}

impl DumpFlows {
    pub fn exec(self) -> anyhow::Result<()> {
        let ctx = flowfile::parse_context();
        let table = match &self.table {
            Some(t) => Some(spec::parse_table(t, &ctx.tables).map_err(UsageError)?),
            None => None,
        };
        let src = Source::read(&self.flows)?;
        let loaded = match flowfile::load(&src) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{e}");
                return Err(Reported.into());
            }
        };
        let opts = DumpOptions {
            stats: !self.no_stats,
            names: self.names.then(|| loaded.pipeline.names().clone()),
        };
        let stats = FlowStats::default();
        for flow in installed(&loaded.flows, table) {
            println!("{}", print::format_dump_line(flow, &stats, &opts));
        }
        Ok(())
    }
}

/// The flows a pipeline holds after adding `flows` in order (a flow replaces
/// an earlier one with the same table, priority and match), in dump order,
/// optionally only those of `table`.
fn installed(flows: &[Flow], table: Option<u8>) -> Vec<&Flow> {
    let mut out: Vec<&Flow> = Vec::with_capacity(flows.len());
    for f in flows
        .iter()
        .filter(|f| table.map_or(true, |t| f.table == t))
    {
        match out
            .iter()
            .position(|g| g.table == f.table && g.priority == f.priority && g.matches == f.matches)
        {
            Some(i) => out[i] = f,
            None => out.push(f),
        }
    }
    // Stable: equal (table, priority) keep file order.
    out.sort_by(|a, b| a.table.cmp(&b.table).then(b.priority.cmp(&a.priority)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_pipeline::{Action, Field};

    fn flow(table: u8, priority: u16, port: u128, out: u32) -> Flow {
        let mut f = Flow {
            table,
            priority,
            actions: vec![Action::Output(out)],
            ..Flow::default()
        };
        f.matches.set_exact(Field::InPort, port);
        f
    }

    #[test]
    fn later_identical_flow_replaces_and_order_is_table_then_priority() {
        let flows = [
            flow(10, 100, 1, 1),
            flow(0, 100, 1, 1),
            flow(0, 200, 2, 2),
            flow(0, 100, 1, 9), // replaces the second flow
            flow(0, 100, 3, 3),
        ];
        let got: Vec<(u8, u16, u32)> = installed(&flows, None)
            .iter()
            .map(|f| {
                let Some(Action::Output(p)) = f.actions.first() else {
                    panic!("test flows output");
                };
                (f.table, f.priority, *p)
            })
            .collect();
        assert_eq!(
            got,
            vec![(0, 200, 2), (0, 100, 9), (0, 100, 3), (10, 100, 1)]
        );
        assert_eq!(installed(&flows, Some(10)).len(), 1);
        assert!(installed(&flows, Some(7)).is_empty());
    }
}
