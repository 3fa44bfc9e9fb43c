//! `oxvs-lab serve` (hidden): the pod server, see [`crate::serve`].

use crate::serve::{serve, ServeConfig};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// What to answer TCP/SCTP connections with (the pod's `ns/name`).
    #[arg(long, default_value = "")]
    pub id: String,
    /// Listen on this address only (default: every address); IPv4 or
    /// IPv6.
    #[arg(long, value_name = "IP")]
    pub address: Option<std::net::IpAddr>,
    #[arg(long, value_name = "PORT")]
    pub tcp: Vec<u16>,
    #[arg(long, value_name = "PORT")]
    pub udp: Vec<u16>,
    #[arg(long, value_name = "PORT")]
    pub sctp: Vec<u16>,
    /// Serve on IPv6 too (one dual-stack socket on `::`; a dual-stack or
    /// IPv6-only pod).
    #[arg(long, conflicts_with = "address")]
    pub dual: bool,
}

pub fn run_serve(args: &ServeArgs) -> anyhow::Result<u8> {
    serve(&ServeConfig {
        id: args.id.clone(),
        address: args.address,
        tcp: args.tcp.clone(),
        udp: args.udp.clone(),
        sctp: args.sctp.clone(),
        dual: args.dual,
    })?;
    Ok(0)
}
