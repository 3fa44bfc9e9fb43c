//! `oxvsctl add-port NAME [--ofport N] [--type afxdp|vxlan] ...`: adds a
//! port at run time. Prints nothing (as `ovs-vsctl add-port`); `--json`
//! prints the port as the switch reports it.

use std::net::IpAddr;

use clap::{Args, ValueEnum};
use oxvs_api::{PortKind, PortSpec, Request, XdpModeRequest};

use super::online::Ctx;
use super::UsageError;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PortType {
    /// AF_XDP socket on an existing interface.
    Afxdp,
    /// VXLAN tunnel port.
    Vxlan,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum XdpMode {
    Auto,
    Native,
    Generic,
}

#[derive(Debug, Args)]
pub struct AddPort {
    /// Port name.
    name: String,
    /// OpenFlow port number (default: the lowest free one).
    #[arg(long, value_name = "N")]
    ofport: Option<u32>,
    #[arg(long = "type", value_enum, default_value_t = PortType::Afxdp)]
    port_type: PortType,
    /// afxdp: the interface (default: the port name).
    #[arg(long, value_name = "IF")]
    ifname: Option<String>,
    /// afxdp: XDP attach mode.
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    xdp_mode: XdpMode,
    /// afxdp: receive queues served, from queue 0 (OVS's
    /// `options:n_rxq`; default: all the interface has).
    #[arg(long, value_name = "N")]
    n_rxq: Option<u32>,
    /// vxlan: local underlay address, IPv4 or IPv6 (the underlay's
    /// family: an IPv6 address encapsulates in IPv6, to `tun_ipv6_dst`).
    #[arg(long, value_name = "IP")]
    local_ip: Option<IpAddr>,
    /// vxlan: UDP destination port (default 4789).
    #[arg(long, value_name = "P")]
    dst_port: Option<u16>,
    /// vxlan: underlay MTU (default: from the interface).
    #[arg(long, value_name = "MTU")]
    underlay_mtu: Option<u32>,
}

impl AddPort {
    pub fn exec(self, ctx: &Ctx) -> anyhow::Result<()> {
        let kind = match self.port_type {
            PortType::Afxdp => {
                if self.local_ip.is_some() || self.dst_port.is_some() || self.underlay_mtu.is_some()
                {
                    return Err(UsageError(
                        "--local-ip, --dst-port and --underlay-mtu are for --type vxlan".into(),
                    )
                    .into());
                }
                PortKind::Afxdp {
                    ifname: self.ifname,
                    xdp_mode: match self.xdp_mode {
                        XdpMode::Auto => XdpModeRequest::Auto,
                        XdpMode::Native => XdpModeRequest::Native,
                        XdpMode::Generic => XdpModeRequest::Generic,
                    },
                    n_rxq: self.n_rxq,
                }
            }
            PortType::Vxlan => {
                if self.ifname.is_some() || self.n_rxq.is_some() {
                    return Err(
                        UsageError("--ifname and --n-rxq are for --type afxdp".into()).into(),
                    );
                }
                let local_ip = self
                    .local_ip
                    .ok_or_else(|| UsageError("--type vxlan needs --local-ip IP".into()))?;
                PortKind::Vxlan {
                    local_ip,
                    dst_port: self.dst_port,
                    underlay_mtu: self.underlay_mtu,
                }
            }
        };
        let v = ctx.call(&Request::AddPort(PortSpec {
            name: self.name,
            ofport: self.ofport,
            kind,
        }))?;
        ctx.print_json(&v)?;
        Ok(())
    }
}
