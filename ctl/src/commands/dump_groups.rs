//! `oxvsctl dump-groups [N] [--groups FILE]`: prints groups the way
//! `ovs-ofctl -O OpenFlow15 dump-groups` does (one per line, each line
//! after a space, without OVS's header line), by group id: the switch's
//! (online; `--json` prints the result with structured entries), or those
//! of a group file loaded in-process (offline, `--groups`).

use clap::Args;

use super::online::Ctx;
use super::{emit, Reported};
use crate::flowfile::{self, Source};

#[derive(Debug, Args)]
pub struct DumpGroups {
    /// Offline: the group file (`-` reads standard input).
    #[arg(long, value_name = "FILE")]
    groups: Option<String>,
    /// Only this group.
    #[arg(value_name = "GROUP_ID")]
    group_id: Option<u32>,
}

impl DumpGroups {
    pub fn exec(self, online: &Ctx) -> anyhow::Result<()> {
        let Some(file) = &self.groups else {
            return self.exec_online(online);
        };
        let groups = Source::read(file)?;
        let flows = Source {
            name: "<no flows>".into(),
            text: String::new(),
        };
        let loaded = match flowfile::load_with_groups(&flows, Some(&groups)) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("{e}");
                return Err(Reported.into());
            }
        };
        let tables = loaded.pipeline.snapshot();
        let text: String = tables
            .groups()
            .filter(|g| self.group_id.is_none_or(|id| g.id == id))
            .map(|g| format!(" {g}\n"))
            .collect();
        emit(&text)
    }

    fn exec_online(&self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&oxvs_api::Request::DumpGroups {
            group_id: self.group_id,
        })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: oxvs_api::DumpGroupsResult = serde_json::from_value(v)?;
        let text: String = r.lines.iter().map(|l| format!(" {l}\n")).collect();
        emit(&text)
    }
}
