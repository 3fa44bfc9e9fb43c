//! `oxvsctl packet-in [--max N] [--wait-ms MS]`: takes queued packet-ins
//! (flows' `controller` actions), printed like `ovs-ofctl monitor`:
//! a `NXT_PACKET_IN2` line, the userdata, then the packet's flow.

use clap::Args;
use oxvs_api::{PacketInResult, Request};
use oxvs_pipeline::{extract, print};

use super::emit;
use super::online::Ctx;

#[derive(Debug, Args)]
pub struct PacketIn {
    /// Most packets to take.
    #[arg(long, value_name = "N", default_value_t = 100)]
    max: usize,
    /// Wait up to MS milliseconds for at least one.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    wait_ms: u64,
}

impl PacketIn {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::PacketIn {
            max: self.max,
            wait_ms: self.wait_ms,
        })?;
        if ctx.print_json(&v)? {
            return Ok(());
        }
        let r: PacketInResult = serde_json::from_value(v)?;
        let mut s = String::new();
        for p in &r.packets {
            let frame = oxvs_api::from_hex(&p.frame).unwrap_or_default();
            s.push_str(&format!(
                "NXT_PACKET_IN2: table_id={} cookie={:#x} total_len={} in_port={} (via {})\n",
                p.table,
                p.cookie,
                frame.len(),
                p.in_port,
                p.reason
            ));
            if !p.userdata.is_empty() {
                s.push_str(&format!(" userdata={}\n", p.userdata));
            }
            let key = extract::extract(&frame, p.in_port);
            s.push_str(&format!("{}\n", print::format_key(&key)));
        }
        emit(&s)
    }
}
