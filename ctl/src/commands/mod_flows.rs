//! `oxvsctl mod-flows FLOW [--strict]`: changes the actions of the flows
//! FLOW's match selects, as `ovs-ofctl mod-flows`.

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct ModFlows {
    /// Match plus new actions: `table=0,ip actions=drop`.
    flow: String,
    /// Only the flow with exactly this match and priority.
    #[arg(long)]
    strict: bool,
}

impl ModFlows {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx
            .call(&Request::ModFlows {
                flows: self.flow,
                strict: self.strict,
            })
            .map_err(|e| relocate(e, "<flow>"))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
