//! `oxvsctl add-groups FILE|-`: adds a group file (one group per line,
//! `#` comments, as `ovs-ofctl add-groups`) as one atomic bundle: one bad
//! or existing group changes nothing, and the error is
//! `FILE:LINE:COLUMN: message`.

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;
use crate::flowfile::Source;

#[derive(Debug, Args)]
pub struct AddGroups {
    /// The group file; `-` reads standard input.
    file: String,
}

impl AddGroups {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let src = Source::read(&self.file)?;
        let v = ctx
            .call(&Request::AddGroups { groups: src.text })
            .map_err(|e| relocate(e, &src.name))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
