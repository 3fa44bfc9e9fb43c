//! `oxvsctl mod-group GROUP [--may-create]`: replaces a group (type,
//! selection and buckets) as `ovs-ofctl mod-group`; a missing group is
//! refused (`OFPGMFC_UNKNOWN_GROUP`) unless `--may-create`. The flows that
//! name it keep naming it.

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct ModGroup {
    /// The group, `add-group` syntax.
    group: String,
    /// Add the group if it does not exist.
    #[arg(long)]
    may_create: bool,
}

impl ModGroup {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx
            .call(&Request::ModGroups {
                groups: self.group,
                may_create: self.may_create,
            })
            .map_err(|e| relocate(e, "<group>"))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
