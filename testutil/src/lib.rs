//! Test support shared by the test trees of every crate in the workspace.
//!
//! A test that cannot run on this machine (not root, no AF_XDP, Open vSwitch
//! or the Kubernetes build missing, a tool not installed) does not fail: it
//! calls [`skip_or_fail`] with the reason, which prints `SKIPPED: <reason>`,
//! and then returns, so the test passes without having checked anything.
//!
//! CI runs as root on a machine where `scripts/setup.sh` installed
//! everything, so there no test may skip: `scripts/test.sh` (what `.ci/run`
//! runs) sets [`NO_SKIP_ENV`]` = 1`, and then [`skip_or_fail`] panics with
//! the reason instead. A test cannot pass in CI by not running.
//!
//! This crate is a dev-dependency only; it has no dependencies itself.

use std::fmt::Display;

/// The environment variable that turns every skip into a failure when set
/// to `1`.
pub const NO_SKIP_ENV: &str = "OXVS_TESTS_NO_SKIP";

/// Whether skips are failures here ([`NO_SKIP_ENV`] is `1`).
pub fn skips_fail() -> bool {
    std::env::var_os(NO_SKIP_ENV).is_some_and(|v| v == "1")
}

/// A test cannot run here because of `why`: prints `SKIPPED: <why>` and
/// returns, after which the caller returns and the test passes; with
/// [`NO_SKIP_ENV`]` = 1` it panics naming the reason instead.
///
/// ```
/// # let have_tool = true;
/// if !have_tool {
///     oxvs_testutil::skip_or_fail("strace is not installed");
///     return;
/// }
/// ```
#[track_caller]
pub fn skip_or_fail(why: impl Display) {
    if skips_fail() {
        panic!(
            "this test would skip: {why} ({NO_SKIP_ENV}=1: this machine must be able to run every \
             test; scripts/setup.sh installs what they need)"
        );
    }
    eprintln!("SKIPPED: {why}");
}

/// Whether the process runs with effective uid 0 (read from
/// `/proc/self/status`, so no dependency on a libc binding).
pub fn is_root() -> bool {
    euid().as_deref() == Some("0")
}

/// The effective uid of this process as `/proc/self/status` writes it, if
/// readable.
pub fn euid() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .map(str::to_owned)
}

/// The workspace's root directory (this crate's parent).
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directory of the shared test tools holding `script` (`k8s-local.sh`,
/// `ctr-cni.sh`): `$OXVS_SHARED_TOOLS`, `<workspace>/../shared/tools` or
/// `/work/shared/tools`, the first that has it.
pub fn shared_tools_dir(script: &str) -> Option<std::path::PathBuf> {
    [
        std::env::var_os("OXVS_SHARED_TOOLS").map(std::path::PathBuf::from),
        Some(workspace_root().join("../shared/tools")),
        Some(std::path::PathBuf::from("/work/shared/tools")),
    ]
    .into_iter()
    .flatten()
    .find(|d| d.join(script).is_file())
}

/// `bin` as found on `$PATH`, if it is there.
pub fn find_on_path(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(bin))
            .find(|f| f.is_file())
    })
}

/// A TCP port free on 127.0.0.1 right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn euid_is_read() {
        assert!(euid().is_some_and(|u| u.parse::<u32>().is_ok()));
    }
}
