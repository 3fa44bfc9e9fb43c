//! Where the cluster state comes from: the Kubernetes API or a manifest
//! directory. CONTRACT, implementation pending.
//!
//! Both publish full [`ClusterState`] snapshots on a `watch` channel.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use crate::model::ClusterState;

/// Watches `dir` (multi-document YAML/JSON files) and publishes a snapshot
/// whenever what it holds changes. Runs until the receiver is dropped.
pub async fn watch_manifest_dir(
    dir: PathBuf,
    tx: watch::Sender<Arc<ClusterState>>,
) -> anyhow::Result<()> {
    let _ = (dir, tx);
    anyhow::bail!("manifest source not implemented yet")
}
