//! `oxvsctl replace-flows FILE|- [--groups GROUPFILE]`: makes the switch
//! hold exactly the flows of the file, as one atomic version (identical
//! flows keep their counters); with `--groups`, exactly the groups of the
//! group file too, in the same version (identical groups are kept, the
//! others added, replaced or deleted), so the flows may name them.

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;
use crate::flowfile::Source;

#[derive(Debug, Args)]
pub struct ReplaceFlows {
    /// The flow file; `-` reads standard input.
    file: String,
    /// A group file (`ovs-ofctl add-groups` text): the switch's groups
    /// become exactly these, with the flows.
    #[arg(long, value_name = "FILE")]
    groups: Option<String>,
}

impl ReplaceFlows {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let src = Source::read(&self.file)?;
        let Some(gfile) = &self.groups else {
            let v = ctx
                .call(&Request::ReplaceFlows { flows: src.text })
                .map_err(|e| relocate(e, &src.name))?;
            ctx.print_json(&v)?;
            return Ok(());
        };
        let groups = Source::read(gfile)?;
        let v = ctx
            .call(&Request::ReplaceGroups {
                groups: groups.text,
                flows: src.text,
            })
            .map_err(|e| {
                // The switch says which file an error is about.
                match e.to_string().strip_prefix("groups: ") {
                    Some(rest) if e.downcast_ref::<super::online::Unreachable>().is_none() => {
                        anyhow::anyhow!("{}", super::online::locate(&groups.name, rest))
                    }
                    _ => relocate(e, &src.name),
                }
            })?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
