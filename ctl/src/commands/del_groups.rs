//! `oxvsctl del-groups [group_id=N|group_id=all]`: deletes one group or
//! all, and, as Open vSwitch does, every flow that names a deleted group.

use clap::Args;
use oxvs_api::Request;

use super::online::Ctx;

#[derive(Debug, Args)]
pub struct DelGroups {
    /// `group_id=N` (without it, or with `group_id=all`: every group).
    spec: Option<String>,
}

impl DelGroups {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::DelGroups { spec: self.spec })?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
