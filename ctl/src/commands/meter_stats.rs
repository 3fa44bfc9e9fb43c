//! `oxvsctl meter-stats [meter=N]`: prints the switch's meter counters the
//! way `ovs-ofctl -O OpenFlow15 meter-stats` does (without its header
//! line): packets and bytes metered, and per band the packets and bytes
//! it dropped; `--json` prints the result with structured entries.

use clap::Args;

use super::dump_meters::join_blocks;
use super::emit;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct MeterStats {
    /// `meter=N` (without it, or with `meter=all`: every meter).
    spec: Option<String>,
}

impl MeterStats {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let meter_id = oxvs_pipeline::parse::parse_meter_id(self.spec.as_deref().unwrap_or(""))
            .map_err(|e| anyhow::anyhow!("{}: {}", e.token, e.msg))?;
        let v = ctx.call(&oxvs_api::Request::MeterStats { meter_id })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: oxvs_api::MeterStatsResult = serde_json::from_value(v)?;
        emit(&join_blocks(&r.lines))
    }
}
