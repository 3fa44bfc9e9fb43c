//! `oxvsctl ct-del-limits port=P[,port=Q]...`: the ports' own limits are
//! removed, the default applies to them again (`ovs-appctl
//! dpctl/ct-del-limits` with ports in place of zones). Prints the limits
//! of those ports.

use clap::Args;
use oxvs_api::{CtLimitsResult, CtPortLimitSpec, Request};

use super::ct_set_limits::{format, parse_ports};
use super::online::Ctx;
use super::{emit, UsageError};

#[derive(Debug, Args)]
pub struct CtDelLimits {
    /// `port=P[,port=Q]...` (a name or a number).
    #[arg(value_name = "PORTS", required = true)]
    ports: Vec<String>,
}

impl CtDelLimits {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let ports = parse_ports(&self.ports)?;
        if ports.is_empty() {
            return Err(UsageError("ct-del-limits needs port=P".into()).into());
        }
        let ports = ports
            .into_iter()
            .map(|port| CtPortLimitSpec { port, limit: None })
            .collect();
        let v = ctx.call(&Request::CtSetLimits {
            default: None,
            ports,
        })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: CtLimitsResult = serde_json::from_value(v)?;
        emit(&format(&r))
    }
}
