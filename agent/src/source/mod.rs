//! Where the cluster state comes from: the Kubernetes API ([`watch_kube`])
//! or a manifest directory ([`watch_manifest_dir`], [`load_manifest_dir`]).
//!
//! Both publish full [`ClusterState`] snapshots (`Arc`, immutable) on a
//! `tokio::sync::watch` channel, and only when the snapshot differs from the
//! one published before. Both convert API objects with [`convert`], which
//! applies the API server's defaulting and validation: an invalid object is
//! logged (`tracing::warn`, naming the object and the field) and left out of
//! the snapshot, never half-applied.
//!
//! Concurrency: each source is one async task owning its state; the only
//! shared values are the published `Arc<ClusterState>` snapshots.

pub mod convert;
mod k8s;
mod manifest;

pub use convert::{ConvertError, FieldError};
pub use k8s::{kube_client, watch_kube, COALESCE};
pub use manifest::{load_manifest_dir, parse_manifest, watch_manifest_dir, Object, POLL_INTERVAL};

#[allow(unused_imports)]
use crate::model::ClusterState;
