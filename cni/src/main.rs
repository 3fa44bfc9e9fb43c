//! `oxvs-cni`: the CNI plugin binary. All logic is in the library
//! ([`oxvs_cni::run`]); this only wires the process's environment, stdin,
//! stdout and exit status to it.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::io::{IsTerminal, Write};

fn main() {
    let getenv = |k: &str| std::env::var_os(k);
    let stdin = std::io::stdin();
    let stdin_is_terminal = stdin.is_terminal();
    let mut lock = stdin.lock();
    let out = oxvs_cni::run(oxvs_cni::Invocation {
        getenv: &getenv,
        stdin: &mut lock,
        stdin_is_terminal,
    });
    // If stdout/stderr are gone there is nobody left to tell.
    let _ = std::io::stderr().write_all(out.stderr.as_bytes());
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(out.stdout.as_bytes());
    let _ = stdout.flush();
    std::process::exit(out.exit_code);
}
