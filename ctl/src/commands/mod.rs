//! One file per command, each a clap `Args` struct with an `exec` method.

mod check_flows;
mod dump_flows;
mod trace;

use clap::Subcommand;

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Parse and validate a flow file (as one atomic bundle).
    CheckFlows(check_flows::CheckFlows),
    /// Load a flow file and print its flows in `ovs-ofctl dump-flows` format.
    DumpFlows(dump_flows::DumpFlows),
    /// Trace a packet through the flows of a flow file, like `ovs-appctl ofproto/trace`.
    Trace(trace::Trace),
}

impl Command {
    pub fn exec(self) -> anyhow::Result<()> {
        match self {
            Command::CheckFlows(c) => c.exec(),
            Command::DumpFlows(c) => c.exec(),
            Command::Trace(c) => c.exec(),
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
