//! `oxvsctl add-meters FILE|-`: adds a meter file (one `add-meter` meter
//! per line, `#` comments) as one atomic bundle: one bad or existing meter
//! changes nothing, and the error is `FILE:LINE:COLUMN: message`.

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;
use crate::flowfile::Source;

#[derive(Debug, Args)]
pub struct AddMeters {
    /// The meter file; `-` reads standard input.
    file: String,
}

impl AddMeters {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let src = Source::read(&self.file)?;
        let v = ctx
            .call(&Request::AddMeters { meters: src.text })
            .map_err(|e| relocate(e, &src.name))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
