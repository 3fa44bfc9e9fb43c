//! `oxvsctl del-meters [meter=N|meter=all]`: deletes one meter or all,
//! and, as Open vSwitch does, every flow that names a deleted meter.

use clap::Args;
use oxvs_api::Request;

use super::online::Ctx;

#[derive(Debug, Args)]
pub struct DelMeters {
    /// `meter=N` (without it, or with `meter=all`: every meter).
    spec: Option<String>,
}

impl DelMeters {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::DelMeters { spec: self.spec })?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
