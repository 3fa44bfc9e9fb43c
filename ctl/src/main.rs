//! `oxvsctl`: the oxvs operator CLI.
//!
//! `main` only parses the command line and dispatches: every command lives
//! in its own file under [`commands`] with an `exec` method. Most commands
//! talk to oxvs-switchd's control socket (`--socket`, env
//! `OXVS_SWITCHD_SOCKET`); `check-flows`, and `dump-flows` / `trace` with
//! `--flows FILE`, work offline on a flow file loaded into an in-process
//! [`oxvs_pipeline::tables::Pipeline`]. `--json` prints the switch's raw
//! result JSON.
//!
//! Exit codes: 0 success, 1 invalid input or the switch refused (a flow
//! file or packet that does not parse or load, an unreadable file, a
//! refused request), 2 usage (bad options), 3 the switch cannot be reached
//! (the message names the socket and why); `traceflow` also exits 4
//! (dropped) and 5 (incomplete).
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod commands;
mod flowfile;
mod spec;

use std::process::ExitCode;

use clap::Parser;

use commands::Command;

/// The oxvs operator CLI.
#[derive(Debug, Parser)]
#[command(name = "oxvsctl", version, about, propagate_version = true)]
struct Cli {
    /// oxvs-switchd's control socket.
    #[arg(long, global = true, value_name = "PATH", env = "OXVS_SWITCHD_SOCKET",
          default_value = oxvs_api::DEFAULT_SWITCHD_SOCKET)]
    socket: std::path::PathBuf,
    /// Print the switch's result as raw JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Exit code for invalid input (bad flow file, bad packet, unreadable file).
const EXIT_INVALID: u8 = 1;
/// Exit code for a usage error (also what clap uses).
const EXIT_USAGE: u8 = 2;
/// Exit code when the switch cannot be reached.
const EXIT_UNREACHABLE: u8 = 3;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` are "errors" that print to stdout and exit 0.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    let ctx = commands::online::Ctx {
        socket: cli.socket,
        json: cli.json,
    };
    match cli.command.exec(&ctx) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(f) = e.downcast_ref::<commands::traceflow::Finished>() {
                return ExitCode::from(f.0);
            }
            if let Some(usage) = e.downcast_ref::<commands::UsageError>() {
                eprintln!("oxvsctl: {usage}");
                return ExitCode::from(EXIT_USAGE);
            }
            if let Some(u) = e.downcast_ref::<commands::online::Unreachable>() {
                eprintln!("oxvsctl: {u}");
                return ExitCode::from(EXIT_UNREACHABLE);
            }
            if e.downcast_ref::<commands::Reported>().is_none() {
                eprintln!("oxvsctl: {e:#}");
            }
            ExitCode::from(EXIT_INVALID)
        }
    }
}
