//! `oxvsctl show`: the switch and its ports, like `ovs-ofctl show`
//! (` 1(name): ...` port lines).

use clap::Args;
use oxvs_api::{Request, ShowResult};

use super::emit;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct Show {}

impl Show {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::Show)?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: ShowResult = serde_json::from_value(v)?;
        emit(&format(&r))
    }
}

/// The text form.
pub fn format(r: &ShowResult) -> String {
    let mut s = format!(
        "oxvs-switchd {}: n_tables:{}, n_flows:{}, n_ports:{}\n",
        r.version,
        r.n_tables,
        r.n_flows,
        r.ports.len()
    );
    for p in &r.ports {
        let local = p
            .local
            .as_ref()
            .map(|l| format!(", local={l}"))
            .unwrap_or_default();
        s.push_str(&format!(
            " {}({}): type={}, mode={}{local}, state={}\n",
            p.ofport, p.name, p.kind, p.mode, p.state
        ));
    }
    s
}
