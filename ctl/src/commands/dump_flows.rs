//! `oxvsctl dump-flows [--flows FILE]`: print flows the way
//! `ovs-ofctl dump-flows` does: the switch's (online, without `--flows`;
//! `--json` prints the result with structured entries), or those of a flow
//! file loaded in-process (offline, with `--flows`).
//!
//! The flows are read back from the pipeline's tables, not from the file:
//! what is printed is what the pipeline holds, normalised (a flow reads the
//! same whichever way it was written; a later flow with the same table,
//! priority and match has replaced an earlier one, as an `add-flow` does).
//! Order: by table, then by descending priority, then oldest first.
//! Offline there is no traffic, so counters and durations are zero.

use clap::Args;
use oxvs_pipeline::print::{self, DumpOptions, FlowStats};

use super::online::Ctx;
use super::{emit, Reported, UsageError};
use crate::flowfile::{self, Source};
use crate::spec;

#[derive(Debug, Args)]
pub struct DumpFlows {
    /// Offline: the flow file (`-` reads standard input). Without it the
    /// switch is asked.
    #[arg(long, value_name = "FILE")]
    flows: Option<String>,
    /// Offline: a group file the flows' `group:ID` actions may name.
    #[arg(long, value_name = "FILE", requires = "flows")]
    groups: Option<String>,
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
    pub fn exec(self, online: &Ctx) -> anyhow::Result<()> {
        let ctx = flowfile::parse_context();
        let table = match &self.table {
            Some(t) => Some(spec::parse_table(t, &ctx.tables).map_err(UsageError)?),
            None => None,
        };
        let Some(flows) = &self.flows else {
            return self.exec_online(online, table);
        };
        let src = Source::read(flows)?;
        let groups = self.groups.as_deref().map(Source::read).transpose()?;
        let loaded = match flowfile::load_with_groups(&src, groups.as_ref()) {
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
        let tables = loaded.pipeline.snapshot();
        let rules = match table {
            Some(t) => tables.flows_in(t),
            None => tables.flows().collect(),
        };
        let mut text = String::new();
        for rule in rules {
            let stats = FlowStats {
                duration_ns: loaded.loaded_at_ns.saturating_sub(rule.created_ns),
                n_packets: rule
                    .stats
                    .n_packets
                    .load(std::sync::atomic::Ordering::Relaxed),
                n_bytes: rule
                    .stats
                    .n_bytes
                    .load(std::sync::atomic::Ordering::Relaxed),
                idle_age_s: None,
            };
            text.push_str(&print::format_dump_line(&rule.flow, &stats, &opts));
            text.push('\n');
        }
        emit(&text)
    }

    /// Asks the switch.
    fn exec_online(&self, ctx: &Ctx, table: Option<u8>) -> anyhow::Result<()> {
        let v = ctx.call(&oxvs_api::Request::DumpFlows {
            table: table.map(|t| t.to_string()),
            names: self.names,
            stats: !self.no_stats,
        })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: oxvs_api::DumpFlowsResult = serde_json::from_value(v)?;
        let text: String = r.lines.iter().map(|l| format!("{l}\n")).collect();
        emit(&text)
    }
}
