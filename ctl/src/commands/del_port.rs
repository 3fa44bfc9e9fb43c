//! `oxvsctl del-port NAME`: removes a port. Prints nothing.

use clap::Args;
use oxvs_api::Request;

use super::online::Ctx;

#[derive(Debug, Args)]
pub struct DelPort {
    /// Port name.
    name: String,
}

impl DelPort {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::DelPort { name: self.name })?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
