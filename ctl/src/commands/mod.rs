//! One file per command, each a clap `Args` struct with an `exec` method.
//! Online commands talk to oxvs-switchd ([`online::Ctx`]); `dump-flows` and
//! `trace` are offline with `--flows FILE`, online without.

mod add_flow;
mod add_flows;
mod add_group;
mod add_groups;
mod add_meter;
mod add_meters;
mod add_port;
mod check_flows;
mod ct_del_limits;
mod ct_get_limits;
mod ct_set_limits;
mod del_flows;
mod del_groups;
mod del_meters;
mod del_port;
mod dump_conntrack;
mod dump_flows;
mod dump_groups;
mod dump_meters;
mod dump_ports;
mod flush_conntrack;
mod meter_stats;
mod mod_flows;
mod mod_group;
mod mod_meter;
pub mod online;
mod packet_in;
mod replace_flows;
mod show;
mod stats;
mod trace;
pub mod traceflow;

use clap::Subcommand;

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Parse and validate a flow file (as one atomic bundle).
    CheckFlows(check_flows::CheckFlows),
    /// Print flows in `ovs-ofctl dump-flows` format: the switch's, or a flow file's (--flows).
    DumpFlows(dump_flows::DumpFlows),
    /// Trace a packet like `ovs-appctl ofproto/trace`: through the switch, or a flow file (--flows).
    Trace(trace::Trace),
    /// Show the switch and its ports.
    Show(show::Show),
    /// Add a port.
    AddPort(add_port::AddPort),
    /// Remove a port.
    DelPort(del_port::DelPort),
    /// Add one flow.
    AddFlow(add_flow::AddFlow),
    /// Add the flows of a file (`-`: stdin) as one atomic bundle.
    AddFlows(add_flows::AddFlows),
    /// Delete flows (all, or those SPEC selects).
    DelFlows(del_flows::DelFlows),
    /// Change the actions of the flows a match selects.
    ModFlows(mod_flows::ModFlows),
    /// Make the switch hold exactly the flows of a file (atomic).
    ReplaceFlows(replace_flows::ReplaceFlows),
    /// Add one group (`ovs-ofctl add-group` syntax).
    AddGroup(add_group::AddGroup),
    /// Add the groups of a file (`-`: stdin) as one atomic bundle.
    AddGroups(add_groups::AddGroups),
    /// Replace a group (`--may-create`: add it if missing).
    ModGroup(mod_group::ModGroup),
    /// Delete a group (`group_id=N`) or all, with the flows that name them.
    DelGroups(del_groups::DelGroups),
    /// Print groups like `ovs-ofctl -O OpenFlow15 dump-groups`: the switch's, or a group file's (--groups).
    DumpGroups(dump_groups::DumpGroups),
    /// Add one meter (`ovs-ofctl add-meter` syntax).
    AddMeter(add_meter::AddMeter),
    /// Add the meters of a file (`-`: stdin) as one atomic bundle.
    AddMeters(add_meters::AddMeters),
    /// Replace a meter (its bucket and counters start again).
    ModMeter(mod_meter::ModMeter),
    /// Delete a meter (`meter=N`) or all, with the flows that name them.
    DelMeters(del_meters::DelMeters),
    /// Print meters like `ovs-ofctl -O OpenFlow15 dump-meters`.
    DumpMeters(dump_meters::DumpMeters),
    /// Print meter counters like `ovs-ofctl -O OpenFlow15 meter-stats`.
    MeterStats(meter_stats::MeterStats),
    /// Port counters, like `ovs-ofctl dump-ports`.
    DumpPorts(dump_ports::DumpPorts),
    /// Tracked connections, like `ovs-appctl dpctl/dump-conntrack`.
    DumpConntrack(dump_conntrack::DumpConntrack),
    /// Remove tracked connections.
    FlushConntrack(flush_conntrack::FlushConntrack),
    /// Set connection limits: the default and per port (pod), like `dpctl/ct-set-limits`.
    CtSetLimits(ct_set_limits::CtSetLimits),
    /// Show connection limits, counts and refusals per port, like `dpctl/ct-get-limits`.
    CtGetLimits(ct_get_limits::CtGetLimits),
    /// Remove ports' own connection limits (the default applies again).
    CtDelLimits(ct_del_limits::CtDelLimits),
    /// Datapath counters (cache hits, upcalls, ns per packet).
    Stats(stats::Stats),
    /// Take queued packet-ins (flows' `controller` actions).
    PacketIn(packet_in::PacketIn),
    /// Where a pod's packet goes, node by node, and which Kubernetes object decided (asks the agents).
    Traceflow(traceflow::Traceflow),
}

impl Command {
    pub fn exec(self, ctx: &online::Ctx) -> anyhow::Result<()> {
        match self {
            Command::CheckFlows(c) => c.exec(),
            Command::DumpFlows(c) => c.exec(ctx),
            Command::Trace(c) => c.exec(ctx),
            Command::Show(c) => c.exec(ctx),
            Command::AddPort(c) => c.exec(ctx),
            Command::DelPort(c) => c.exec(ctx),
            Command::AddFlow(c) => c.exec(ctx),
            Command::AddFlows(c) => c.exec(ctx),
            Command::DelFlows(c) => c.exec(ctx),
            Command::ModFlows(c) => c.exec(ctx),
            Command::ReplaceFlows(c) => c.exec(ctx),
            Command::AddGroup(c) => c.exec(ctx),
            Command::AddGroups(c) => c.exec(ctx),
            Command::ModGroup(c) => c.exec(ctx),
            Command::DelGroups(c) => c.exec(ctx),
            Command::DumpGroups(c) => c.exec(ctx),
            Command::AddMeter(c) => c.exec(ctx),
            Command::AddMeters(c) => c.exec(ctx),
            Command::ModMeter(c) => c.exec(ctx),
            Command::DelMeters(c) => c.exec(ctx),
            Command::DumpMeters(c) => c.exec(ctx),
            Command::MeterStats(c) => c.exec(ctx),
            Command::DumpPorts(c) => c.exec(ctx),
            Command::DumpConntrack(c) => c.exec(ctx),
            Command::FlushConntrack(c) => c.exec(ctx),
            Command::CtSetLimits(c) => c.exec(ctx),
            Command::CtGetLimits(c) => c.exec(ctx),
            Command::CtDelLimits(c) => c.exec(ctx),
            Command::Stats(c) => c.exec(ctx),
            Command::PacketIn(c) => c.exec(ctx),
            Command::Traceflow(c) => c.exec(ctx),
        }
    }
}

/// A usage error found after argument parsing (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// An error whose message the command has already printed (exit code 1,
/// nothing more to print).
#[derive(Debug, thiserror::Error)]
#[error("invalid input (reported above)")]
pub struct Reported;

/// Writes a command's output to standard output. A closed pipe (`| head`)
/// ends the output quietly instead of panicking as `println!` would.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(|e| anyhow::anyhow!("cannot write the output: {e}")),
    }
}
