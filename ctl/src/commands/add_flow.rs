//! `oxvsctl add-flow FLOW`: adds one flow. Prints nothing; errors name the
//! column and token.

use clap::Args;
use oxvs_api::Request;

use super::online::{locate, Ctx};

#[derive(Debug, Args)]
pub struct AddFlow {
    /// The flow, `ovs-ofctl add-flow` syntax.
    flow: String,
}

impl AddFlow {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx
            .call(&Request::AddFlows { flows: self.flow })
            .map_err(|e| relocate(e, "<flow>"))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}

/// A refusal located in `file` (`FILE:LINE:COL: msg`); other errors unchanged.
pub fn relocate(e: anyhow::Error, file: &str) -> anyhow::Error {
    if e.downcast_ref::<super::online::Unreachable>().is_some() {
        return e;
    }
    anyhow::anyhow!("{}", locate(file, &e.to_string()))
}
