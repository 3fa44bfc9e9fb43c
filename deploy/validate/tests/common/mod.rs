//! Helpers shared by the tests that run against `k8s-local.sh`
//! (`rbac_apiserver.rs`, `daemonset_e2e.rs`): where the workspace and the
//! shared tools are, programs on `PATH`, free ports, command output.
#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::Output;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding `k8s-local.sh`: `$OXVS_SHARED_TOOLS`,
/// `<workspace>/../shared/tools` or `/work/shared/tools`.
pub fn tools_dir() -> Option<PathBuf> {
    [
        std::env::var_os("OXVS_SHARED_TOOLS").map(PathBuf::from),
        Some(workspace_root().join("../shared/tools")),
        Some(PathBuf::from("/work/shared/tools")),
    ]
    .into_iter()
    .flatten()
    .find(|d| d.join("k8s-local.sh").is_file())
}

pub fn find_on_path(bin: &str) -> Option<PathBuf> {
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

/// stdout then stderr of a finished command.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
