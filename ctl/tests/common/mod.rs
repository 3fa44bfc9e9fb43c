//! Helpers shared by the `oxvsctl` tests: running the binary and reading
//! what it printed.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

/// Runs the built `oxvsctl` with `args` (without `OXVS_SWITCHD_SOCKET` from
/// the caller's environment), `stdin` as its input (none: closed at once).
pub fn oxvsctl(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxvsctl"))
        .args(args)
        .env_remove("OXVS_SWITCHD_SOCKET")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("oxvsctl runs");
    {
        let mut input = child.stdin.take().expect("stdin");
        if let Some(text) = stdin {
            // The command may exit (usage error) before reading its input.
            let _ = input.write_all(text.as_bytes());
        }
    }
    child.wait_with_output().expect("oxvsctl exits")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// stdout then stderr.
pub fn text(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

/// Its stdout, after checking that it exited 0.
#[track_caller]
pub fn ok(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(o));
    stdout(o)
}

/// A directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
