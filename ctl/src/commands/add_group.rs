//! `oxvsctl add-group GROUP`: adds one group (`ovs-ofctl add-group`
//! syntax). An existing group id is refused (`OFPGMFC_GROUP_EXISTS`).

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct AddGroup {
    /// The group: `group_id=1,type=select,bucket=output:2,bucket=output:3`.
    group: String,
}

impl AddGroup {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx
            .call(&Request::AddGroups { groups: self.group })
            .map_err(|e| relocate(e, "<group>"))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
