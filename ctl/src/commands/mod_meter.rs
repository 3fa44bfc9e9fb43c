//! `oxvsctl mod-meter METER`: replaces a meter (its bucket and counters
//! start again); a missing one is refused (`OFPMMFC_UNKNOWN_METER`). The
//! flows that name it stay.

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct ModMeter {
    /// The meter: `meter=1,pktps,band=type=drop,rate=200`.
    meter: String,
}

impl ModMeter {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx
            .call(&Request::ModMeters { meters: self.meter })
            .map_err(|e| relocate(e, "<meter>"))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
