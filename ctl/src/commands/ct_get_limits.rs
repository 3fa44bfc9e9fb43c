//! `oxvsctl ct-get-limits [port=P[,port=Q]...]`: connection limits, counts
//! and refusals per port, like `ovs-appctl dpctl/ct-get-limits` with ports
//! in place of zones: of the named ports, or of every port that owns
//! connections, has its own limit or had commits refused.

use clap::Args;
use oxvs_api::{CtLimitsResult, Request};

use super::ct_set_limits::{format, parse_ports};
use super::emit;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct CtGetLimits {
    /// `port=P[,port=Q]...` (a name or a number).
    #[arg(value_name = "PORTS")]
    ports: Vec<String>,
}

impl CtGetLimits {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let ports = parse_ports(&self.ports)?;
        let v = ctx.call(&Request::CtGetLimits { ports })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: CtLimitsResult = serde_json::from_value(v)?;
        emit(&format(&r))
    }
}
