//! `oxvsctl del-flows [SPEC] [--strict]`: deletes the flows SPEC selects
//! (every flow without SPEC), as `ovs-ofctl del-flows`.

use clap::Args;
use oxvs_api::Request;

use super::online::Ctx;

#[derive(Debug, Args)]
pub struct DelFlows {
    /// `table=..., match, priority=...` (strict: identical match and priority).
    spec: Option<String>,
    /// Only the flow with exactly this match and priority.
    #[arg(long)]
    strict: bool,
}

impl DelFlows {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::DelFlows {
            spec: self.spec,
            strict: self.strict,
        })?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
