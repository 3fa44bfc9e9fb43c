//! `oxvsctl add-meter METER`: adds one meter (`ovs-ofctl add-meter`
//! syntax: `meter=1,pktps,burst,stats,band=type=drop,rate=10,burst_size=10`).
//! An existing meter id is refused (`OFPMMFC_METER_EXISTS`).

use clap::Args;
use oxvs_api::Request;

use super::add_flow::relocate;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct AddMeter {
    /// The meter: `meter=1,pktps,band=type=drop,rate=100`.
    meter: String,
}

impl AddMeter {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx
            .call(&Request::AddMeters { meters: self.meter })
            .map_err(|e| relocate(e, "<meter>"))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
