//! `oxvsctl flush-conntrack [--zone Z] [--proto P] [--reply-src IP[:PORT]]`:
//! removes connections (those every option given selects). Prints nothing
//! (as `ovs-appctl dpctl/flush-conntrack`); `--json` prints the count.

use clap::Args;
use oxvs_api::Request;

use super::online::Ctx;

#[derive(Debug, Args)]
pub struct FlushConntrack {
    /// Only this zone.
    #[arg(long, value_name = "Z")]
    zone: Option<u16>,
    /// Only this protocol: tcp, udp, sctp, icmp or a number.
    #[arg(long, value_name = "P", value_parser = parse_proto)]
    proto: Option<u8>,
    /// Only connections whose reply comes from this address (and port): a
    /// NATed connection's endpoint.
    #[arg(long, value_name = "IP[:PORT]", value_parser = parse_reply_src)]
    reply_src: Option<(std::net::IpAddr, Option<u16>)>,
}

fn parse_proto(s: &str) -> Result<u8, String> {
    Ok(match s {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        "icmp" => 1,
        _ => s
            .parse()
            .map_err(|_| format!("{s:?}: not a protocol (tcp, udp, sctp, icmp or 0-255)"))?,
    })
}

fn parse_reply_src(s: &str) -> Result<(std::net::IpAddr, Option<u16>), String> {
    if let Ok(ip) = s.parse() {
        return Ok((ip, None));
    }
    let sa: std::net::SocketAddr = s
        .parse()
        .map_err(|_| format!("{s:?}: not IP or IP:PORT ([IPv6]:PORT)"))?;
    Ok((sa.ip(), Some(sa.port())))
}

impl FlushConntrack {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let v = ctx.call(&Request::FlushConntrack {
            zone: self.zone,
            proto: self.proto,
            reply_src: self.reply_src.map(|r| r.0),
            reply_sport: self.reply_src.and_then(|r| r.1),
        })?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
