//! `oxvsctl replace-flows FILE|-`: makes the switch hold exactly the flows
//! of the file, as one atomic version (identical flows keep their counters).

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;
use crate::flowfile::Source;

#[derive(Debug, Args)]
pub struct ReplaceFlows {
    /// The flow file; `-` reads standard input.
    file: String,
}

impl ReplaceFlows {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let src = Source::read(&self.file)?;
        let v = ctx
            .call(&Request::ReplaceFlows { flows: src.text })
            .map_err(|e| relocate(e, &src.name))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
