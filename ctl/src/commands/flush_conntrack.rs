//! `oxvsctl flush-conntrack [--zone Z]`: removes connections. Prints
//! nothing (as `ovs-appctl dpctl/flush-conntrack`); `--json` prints the count.

use clap::Args;
use oxvs_api::Request;

use super::online::Ctx;

#[derive(Debug, Args)]
pub struct FlushConntrack {
    /// Only this zone.
    #[arg(long, value_name = "Z")]
    zone: Option<u16>,
}

impl FlushConntrack {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::FlushConntrack { zone: self.zone })?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
