//! `oxvsctl`: the oxvs operator CLI.
//!
//! `main` only parses the command line and dispatches: every command lives
//! in its own file under [`commands`] with an `exec` method. Today the
//! commands work offline, on a flow file loaded into an in-process
//! [`oxvs_pipeline::tables::Pipeline`]; once `oxvs-switchd` exists the same
//! commands will talk to its control socket.
//!
//! Exit codes: 0 success, 1 invalid input (a flow file or packet that does
//! not parse or load, an unreadable file), 2 usage (bad options).

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
    #[command(subcommand)]
    command: Command,
}

/// Exit code for invalid input (bad flow file, bad packet, unreadable file).
const EXIT_INVALID: u8 = 1;
/// Exit code for a usage error (also what clap uses).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` are "errors" that print to stdout and exit 0.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { 0 });
        }
    };
    match cli.command.exec() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(usage) = e.downcast_ref::<commands::UsageError>() {
                eprintln!("oxvsctl: {usage}");
                return ExitCode::from(EXIT_USAGE);
            }
            if e.downcast_ref::<commands::Reported>().is_none() {
                eprintln!("oxvsctl: {e:#}");
            }
            ExitCode::from(EXIT_INVALID)
        }
    }
}
