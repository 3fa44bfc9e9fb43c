//! `oxvsctl add-flows FILE|-`: adds a flow file as one atomic bundle: a
//! file with one bad flow changes nothing, and the error is
//! `FILE:LINE:COLUMN: message (token 'x')` as in `check-flows`.

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;
use crate::flowfile::Source;

#[derive(Debug, Args)]
pub struct AddFlows {
    /// The flow file; `-` reads standard input.
    file: String,
}

impl AddFlows {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let src = Source::read(&self.file)?;
        let v = ctx
            .call(&Request::AddFlows { flows: src.text })
            .map_err(|e| relocate(e, &src.name))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
