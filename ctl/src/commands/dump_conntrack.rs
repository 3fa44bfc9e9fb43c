//! `oxvsctl dump-conntrack [--zone Z]`: connections, one per line in
//! `ovs-appctl dpctl/dump-conntrack` format.

use clap::Args;
use oxvs_api::{DumpConntrackResult, Request};

use super::emit;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct DumpConntrack {
    /// Only this zone.
    #[arg(long, value_name = "Z")]
    zone: Option<u16>,
}

impl DumpConntrack {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::DumpConntrack { zone: self.zone })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: DumpConntrackResult = serde_json::from_value(v)?;
        let text: String = r.entries.iter().map(|e| format!("{}\n", e.line)).collect();
        emit(&text)
    }
}
