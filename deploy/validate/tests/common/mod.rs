//! Helpers shared by the tests that run against `k8s-local.sh`
//! (`rbac_apiserver.rs`, `daemonset_e2e.rs`): where the workspace and the
//! shared tools are, programs on `PATH`, free ports, command output.
#![allow(dead_code)] // each test file uses its own subset

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Output;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory holding `k8s-local.sh` ([`oxvs_testutil::shared_tools_dir`]).
pub fn tools_dir() -> Option<PathBuf> {
    oxvs_testutil::shared_tools_dir("k8s-local.sh")
}

pub use oxvs_testutil::{find_on_path, free_port};

/// stdout then stderr of a finished command.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What a test against `k8s-local.sh` needs from this host.
pub struct K8sHost {
    pub tools: PathBuf,
    pub cache: PathBuf,
    pub kubectl: PathBuf,
}

/// Why a `k8s-local.sh` test cannot run here, if it cannot: not root, no
/// tools, no cached build with `components` in `bin/` (`build_hint` says
/// how to make one: tests never start a build), no `etcd`, no `kubectl`.
pub fn k8s_host(components: &[&str], build_hint: &str) -> Result<K8sHost, String> {
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX);
    if uid != 0 {
        return Err("not root".into());
    }
    let tools = tools_dir().ok_or("k8s-local.sh not found (set OXVS_SHARED_TOOLS)")?;
    let cache = std::env::var_os("OXVS_K8S_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/oxvs-k8s"));
    for b in components {
        if !cache.join("bin").join(b).is_file() {
            return Err(format!(
                "no cached Kubernetes build in {} (bin/{b} missing; run {build_hint})",
                cache.display()
            ));
        }
    }
    if find_on_path("etcd").is_none() {
        return Err("etcd not installed (k8s-local.sh build installs it)".into());
    }
    let kubectl = Some(cache.join("bin/kubectl"))
        .filter(|k| k.is_file())
        .or_else(|| find_on_path("kubectl"))
        .ok_or("no kubectl (on PATH or in the cache)")?;
    Ok(K8sHost {
        tools,
        cache,
        kubectl,
    })
}

/// A test that cannot run here (`why`): prints SKIPPED, so the caller
/// returns and passes; with `OXVS_TESTS_NO_SKIP=1` (set by `scripts/test.sh`,
/// i.e. CI, after `scripts/setup.sh` with `OXVS_SETUP_K8S=1` built the
/// Kubernetes cache) it fails instead ([`oxvs_testutil::skip_or_fail`]).
#[track_caller]
pub fn skip(why: &str) {
    oxvs_testutil::skip_or_fail(why);
}
