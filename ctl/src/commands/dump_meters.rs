//! `oxvsctl dump-meters [meter=N]`: prints the switch's meters the way
//! `ovs-ofctl -O OpenFlow15 dump-meters` does (without its header line),
//! by meter id; `--json` prints the result with structured entries.

use clap::Args;

use super::emit;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct DumpMeters {
    /// `meter=N` (without it, or with `meter=all`: every meter).
    spec: Option<String>,
}

impl DumpMeters {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let meter_id = oxvs_pipeline::parse::parse_meter_id(self.spec.as_deref().unwrap_or(""))
            .map_err(|e| anyhow::anyhow!("{}: {}", e.token, e.msg))?;
        let v = ctx.call(&oxvs_api::Request::DumpMeters { meter_id })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: oxvs_api::DumpMetersResult = serde_json::from_value(v)?;
        emit(&join_blocks(&r.lines))
    }
}

/// Blocks separated by an empty line, as `ovs-ofctl` prints meters.
pub(super) fn join_blocks(blocks: &[String]) -> String {
    let mut text = blocks.join("\n\n");
    if !text.is_empty() {
        text.push('\n');
    }
    text
}
