//! The manifest directory source: the cluster described by the `*.yaml`,
//! `*.yml` and `*.json` files of one directory (not recursive; names
//! starting with `.` are ignored, symlinks are followed).
//!
//! - A file holds one or more documents (YAML `---`-separated; JSON values
//!   one after the other), each an object or a `kind: List` (or `*List`)
//!   with `items`. Kinds Namespace, Pod, Node, NetworkPolicy, Service,
//!   Endpoints and EndpointSlice (discovery.k8s.io/v1) are used, others
//!   are ignored (debug log). Namespaced objects without a namespace
//!   are in `default`.
//! - Invalid objects (see [`super::convert`]) are left out, with a warning.
//! - Duplicates: the object of the last file (sorted by name) wins, and
//!   within a file the last document; a warning names both places.
//! - [`watch_manifest_dir`] polls the files' size/mtime/ctime/inode every
//!   [`POLL_INTERVAL`]. A file that fails to read or parse (e.g. half
//!   written) keeps contributing the objects of its last good version (with
//!   a warning); a deleted file's objects are removed.
//!
//! Concurrency: the watcher is one task; file I/O and parsing run on the
//! blocking pool, one poll at a time.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as net;
use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::convert;
use crate::model::{
    ClusterState, EndpointSet, Namespace, NetworkPolicy, Node, ObjKey, Pod, Service,
};

/// How often [`watch_manifest_dir`] looks at the directory.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Lists nested deeper than this are rejected.
const MAX_LIST_DEPTH: usize = 4;

/// One object of a manifest, converted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Object {
    Namespace(Namespace),
    Pod(Pod),
    Node(Node),
    NetworkPolicy(NetworkPolicy),
    Service(Service),
    Endpoints(EndpointSet),
    /// An EndpointSlice: its own (namespace, name), and its endpoints.
    EndpointSlice(ObjKey, EndpointSet),
}

impl Object {
    /// `Kind ns/name` (or `Kind name`).
    pub fn describe(&self) -> String {
        match self {
            Object::Namespace(n) => format!("Namespace {}", n.name),
            Object::Pod(p) => format!("Pod {}/{}", p.namespace, p.name),
            Object::Node(n) => format!("Node {}", n.name),
            Object::NetworkPolicy(p) => format!("NetworkPolicy {}/{}", p.namespace, p.name),
            Object::Service(s) => format!("Service {}/{}", s.namespace, s.name),
            Object::Endpoints(e) => format!("Endpoints {}/{}", e.service.0, e.service.1),
            Object::EndpointSlice(k, _) => format!("EndpointSlice {}/{}", k.0, k.1),
        }
    }
}

/// Parses one manifest file's text. `Err` (with the parser's message) when
/// the text is not valid YAML/JSON: the file is unusable as a whole. `Ok`
/// carries the valid objects and a warning for each document or object
/// that was rejected.
pub fn parse_manifest(text: &str, json: bool) -> Result<(Vec<Object>, Vec<String>), String> {
    // Each document with, for YAML, its text (for typed deserialization).
    let docs: Vec<(Value, Option<String>)> = if json {
        serde_json::Deserializer::from_str(text)
            .into_iter::<Value>()
            .map(|r| r.map(|v| (v, None)))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?
    } else {
        let mut docs = Vec::new();
        for (i, piece) in split_yaml(text).into_iter().enumerate() {
            // Untyped, only YAML 1.2 booleans: `name: n` stays a string.
            let mut opts = serde_saphyr::Options::default();
            opts.strict_booleans = true;
            let mut parsed = serde_saphyr::from_multiple_with_options::<Value>(&piece, opts)
                .map_err(|e| format!("document {}: {e}", i + 1))?;
            match parsed.len() {
                // An empty (or comment-only) document still counts.
                0 => docs.push((Value::Null, None)),
                1 => docs.push((parsed.remove(0), Some(piece))),
                _ => docs.extend(parsed.into_iter().map(|v| (v, None))),
            }
        }
        docs
    };
    let mut objects = Vec::new();
    let mut warnings = Vec::new();
    for (i, (doc, raw)) in docs.into_iter().enumerate() {
        let place = format!("document {}", i + 1);
        add_doc(
            doc,
            raw.as_deref(),
            &place,
            None,
            0,
            &mut objects,
            &mut warnings,
        );
    }
    Ok((objects, warnings))
}

/// Splits a YAML stream at its `---` document markers (a line starting
/// with `---` followed by nothing or whitespace; what follows the marker
/// on its line belongs to the new document), keeping line numbers out of
/// the way: each piece is parsed on its own so documents are counted even
/// when empty.
fn split_yaml(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    let mut seen_content = false;
    for line in text.split_inclusive('\n') {
        let is_marker = line
            .strip_prefix("---")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace));
        if is_marker {
            // A marker before any content opens the first document.
            if seen_content {
                docs.push(String::new());
            }
            seen_content = true;
            if let Some(last) = docs.last_mut() {
                last.push_str(&line[3..]);
            }
            continue;
        }
        let t = line.trim();
        if !t.is_empty() && !t.starts_with('#') {
            seen_content = true;
        }
        if let Some(last) = docs.last_mut() {
            last.push_str(line);
        }
    }
    docs
}

/// Adds the object(s) of one document. `raw`: the document's YAML text,
/// deserialized straight into the API type so that string fields take
/// scalars as written (`name: 123`, `value: yes`), as kubectl does.
#[allow(clippy::too_many_arguments)]
fn add_doc(
    doc: Value,
    raw: Option<&str>,
    place: &str,
    item_kind: Option<&str>,
    depth: usize,
    objects: &mut Vec<Object>,
    warnings: &mut Vec<String>,
) {
    if doc.is_null() {
        return; // an empty document
    }
    let Some(map) = doc.as_object() else {
        warnings.push(format!("{place}: not an object"));
        return;
    };
    let kind = map
        .get("kind")
        .and_then(Value::as_str)
        .or(item_kind)
        .unwrap_or_default()
        .to_string();
    let kind = kind.as_str();
    let api_version = map
        .get("apiVersion")
        .and_then(Value::as_str)
        .map(str::to_string);
    if kind == "List" || (kind.ends_with("List") && map.contains_key("items")) {
        if depth >= MAX_LIST_DEPTH {
            warnings.push(format!("{place}: Lists nested too deep"));
            return;
        }
        let items = match map.get("items") {
            Some(Value::Array(items)) => items.clone(),
            None | Some(Value::Null) => Vec::new(),
            Some(_) => {
                warnings.push(format!("{place}: {kind}.items is not a list"));
                return;
            }
        };
        // Items of a typed list (`PodList`) may omit their kind.
        let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
        for (j, item) in items.into_iter().enumerate() {
            add_doc(
                item,
                None,
                &format!("{place} item {}", j + 1),
                item_kind,
                depth + 1,
                objects,
                warnings,
            );
        }
        return;
    }
    let want_api = match kind {
        "Namespace" | "Pod" | "Node" | "Service" | "Endpoints" => "v1",
        "NetworkPolicy" => "networking.k8s.io/v1",
        "EndpointSlice" => "discovery.k8s.io/v1",
        "" => {
            warnings.push(format!("{place}: no kind"));
            return;
        }
        other => {
            debug!("{place}: ignoring kind {other}");
            return;
        }
    };
    if let Some(v) = api_version {
        if v.as_str() != want_api {
            warnings.push(format!(
                "{place}: {kind} with apiVersion {v:?} is not supported (want {want_api:?})"
            ));
            return;
        }
    }
    let result = match kind {
        "Namespace" => typed::<core::Namespace>(doc, raw, kind, false)
            .and_then(|o| convert::namespace(&o).map_err(|e| e.to_string()))
            .map(Object::Namespace),
        "Pod" => typed::<core::Pod>(doc, raw, kind, true)
            .and_then(|o| convert::pod(&o).map_err(|e| e.to_string()))
            .map(Object::Pod),
        "Node" => typed::<core::Node>(doc, raw, kind, false)
            .and_then(|o| convert::node(&o).map_err(|e| e.to_string()))
            .map(Object::Node),
        "Service" => typed::<core::Service>(doc, raw, kind, true)
            .and_then(|o| convert::service(&o).map_err(|e| e.to_string()))
            .map(Object::Service),
        "Endpoints" => typed::<core::Endpoints>(doc, raw, kind, true)
            .and_then(|o| convert::endpoints(&o).map_err(|e| e.to_string()))
            .map(Object::Endpoints),
        "EndpointSlice" => typed::<discovery::EndpointSlice>(doc, raw, kind, true).and_then(|o| {
            let set = convert::endpoint_slice(&o).map_err(|e| e.to_string())?;
            let name = o.metadata.name.clone().unwrap_or_default();
            Ok(Object::EndpointSlice((set.service.0.clone(), name), set))
        }),
        _ => typed::<net::NetworkPolicy>(doc, raw, kind, true)
            .and_then(|o| convert::network_policy(&o).map_err(|e| e.to_string()))
            .map(Object::NetworkPolicy),
    };
    match result {
        Ok(o) => objects.push(o),
        Err(e) => warnings.push(format!("{place}: {e}")),
    }
}

/// Deserializes a document into its API type; the error names the object.
fn typed<T>(doc: Value, raw: Option<&str>, kind: &str, namespaced: bool) -> Result<T, String>
where
    T: serde::de::DeserializeOwned,
{
    let meta: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta = doc
        .get("metadata")
        .cloned()
        .and_then(|m| serde_json::from_value(m).ok())
        .unwrap_or_default();
    let name = convert::object_name(&meta, namespaced);
    match raw {
        Some(raw) => serde_saphyr::from_str(raw).map_err(|e| {
            let e = e.to_string();
            format!("{kind} {name}: {}", e.lines().next().unwrap_or_default())
        }),
        None => serde_json::from_value(doc).map_err(|e| format!("{kind} {name}: {e}")),
    }
}

/// Where an object came from: `file, document`.
type Origin = String;

/// Builds the state from the files' objects in file-name order; later wins.
fn merge<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a [Object])>,
) -> (ClusterState, Vec<String>) {
    let mut st = ClusterState::default();
    let mut origin: BTreeMap<String, Origin> = BTreeMap::new();
    let mut warnings = Vec::new();
    for (file, objects) in files {
        for o in objects {
            let what = o.describe();
            if let Some(prev) = origin.insert(what.clone(), file.to_string()) {
                warnings.push(format!(
                    "{what} is defined in {prev} and in {file}: {file} wins"
                ));
            }
            match o.clone() {
                Object::Namespace(n) => {
                    st.namespaces.insert(n.name.clone(), n);
                }
                Object::Pod(p) => {
                    st.pods.insert(p.key(), p);
                }
                Object::Node(n) => {
                    st.nodes.insert(n.name.clone(), n);
                }
                Object::NetworkPolicy(p) => {
                    st.policies.insert(p.key(), p);
                }
                Object::Service(svc) => {
                    st.services.insert(svc.key(), svc);
                }
                Object::Endpoints(e) => {
                    st.endpoints.insert(e.service.clone(), e);
                }
                Object::EndpointSlice(k, e) => {
                    st.endpoint_slices.insert(k, e);
                }
            }
        }
    }
    (st, warnings)
}

/// Identity of a file's content as far as polling can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
}

/// The manifest files of `dir`, by name (sorted).
fn scan(dir: &Path) -> std::io::Result<BTreeMap<String, (PathBuf, Stamp)>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with('.') || !is_manifest_name(&name) {
            continue;
        }
        let path = entry.path();
        // Follows symlinks; a dangling one or a vanished file is skipped.
        let Ok(md) = std::fs::metadata(&path) else {
            continue;
        };
        if !md.is_file() {
            continue;
        }
        let stamp = Stamp {
            len: md.len(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
            ino: md.ino(),
        };
        out.insert(name, (path, stamp));
    }
    Ok(out)
}

fn is_manifest_name(name: &str) -> bool {
    [".yaml", ".yml", ".json"]
        .iter()
        .any(|ext| name.len() > ext.len() && name.ends_with(ext))
}

/// Reads and parses one file; `Err` names the file.
fn load_file(name: &str, path: &Path) -> Result<(Vec<Object>, Vec<String>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{name}: {e}"))?;
    let (objects, warnings) = parse_manifest(&text, name.ends_with(".json"))
        .map_err(|e| format!("{name}: {}", e.lines().next().unwrap_or_default()))?;
    let warnings = warnings
        .into_iter()
        .map(|w| format!("{name}: {w}"))
        .collect();
    Ok((objects, warnings))
}

/// Reads every manifest of `dir` once. `Err` only when the directory cannot
/// be read; unreadable or unparsable files and invalid objects become
/// warnings (and contribute nothing).
pub fn load_manifest_dir(dir: &Path) -> anyhow::Result<(ClusterState, Vec<String>)> {
    let files = scan(dir).with_context(|| format!("manifest directory {}", dir.display()))?;
    let mut warnings = Vec::new();
    let mut loaded = Vec::new();
    for (name, (path, _)) in &files {
        match load_file(name, path) {
            Ok((objects, w)) => {
                warnings.extend(w);
                loaded.push((name.as_str(), objects));
            }
            Err(e) => warnings.push(e),
        }
    }
    let (st, w) = merge(loaded.iter().map(|(n, o)| (*n, o.as_slice())));
    warnings.extend(w);
    Ok((st, warnings))
}

/// The watcher's view of one file.
struct FileEntry {
    stamp: Stamp,
    /// The objects of the last version that parsed (None: never parsed).
    good: Option<Vec<Object>>,
}

/// The watcher's state: every file's last good objects.
struct DirWatch {
    dir: PathBuf,
    files: BTreeMap<String, FileEntry>,
}

impl DirWatch {
    /// Looks for changed files; returns whether any file's objects changed.
    /// Warnings are logged here, once per file version.
    fn poll(&mut self) -> std::io::Result<bool> {
        let now = scan(&self.dir)?;
        let mut changed = false;
        let gone: Vec<String> = self
            .files
            .keys()
            .filter(|n| !now.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            info!("manifest {name} removed");
            if let Some(e) = self.files.remove(&name) {
                changed |= e.good.is_some();
            }
        }
        for (name, (path, stamp)) in now {
            if self.files.get(&name).is_some_and(|e| e.stamp == stamp) {
                continue;
            }
            let entry = self
                .files
                .entry(name.clone())
                .or_insert(FileEntry { stamp, good: None });
            entry.stamp = stamp;
            match load_file(&name, &path) {
                Ok((objects, warnings)) => {
                    for w in warnings {
                        warn!("{w}");
                    }
                    if entry.good.as_ref() != Some(&objects) {
                        debug!("manifest {name}: {} objects", objects.len());
                        entry.good = Some(objects);
                        changed = true;
                    }
                }
                Err(e) if entry.good.is_some() => {
                    warn!("{e}; keeping the objects of its last good version")
                }
                Err(e) => warn!("{e}; ignoring the file until it parses"),
            }
        }
        Ok(changed)
    }

    fn state(&self) -> ClusterState {
        let (st, warnings) = merge(
            self.files
                .iter()
                .filter_map(|(n, e)| e.good.as_deref().map(|o| (n.as_str(), o))),
        );
        for w in warnings {
            warn!("{w}");
        }
        st
    }
}

/// Watches `dir` and publishes a snapshot at start and whenever what its
/// files hold changes. Runs until every receiver is dropped (then `Ok`).
/// `Err` if the directory cannot be read at start; later read errors of the
/// directory are logged and the last state is kept.
pub async fn watch_manifest_dir(
    dir: PathBuf,
    tx: watch::Sender<Arc<ClusterState>>,
) -> anyhow::Result<()> {
    let mut w = DirWatch {
        dir: dir.clone(),
        files: BTreeMap::new(),
    };
    let (mut w, first) = tokio::task::spawn_blocking(move || {
        let r = w.poll();
        (w, r)
    })
    .await
    .context("manifest poll task")?;
    first.with_context(|| format!("manifest directory {}", dir.display()))?;
    let mut last = Arc::new(w.state());
    info!(
        "manifest source {}: {} namespaces, {} pods, {} nodes, {} policies",
        dir.display(),
        last.namespaces.len(),
        last.pods.len(),
        last.nodes.len(),
        last.policies.len()
    );
    if tx.send(last.clone()).is_err() {
        return Ok(());
    }
    let mut dir_error = false;
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tx.closed() => return Ok(()),
            _ = tick.tick() => {}
        }
        let (w2, r) = tokio::task::spawn_blocking(move || {
            let r = w.poll().map(|changed| changed.then(|| w.state()));
            (w, r)
        })
        .await
        .context("manifest poll task")?;
        w = w2;
        match r {
            Err(e) => {
                if !dir_error {
                    warn!(
                        "manifest directory {}: {e}; keeping the last state",
                        dir.display()
                    );
                }
                dir_error = true;
            }
            Ok(new) => {
                dir_error = false;
                if let Some(st) = new {
                    if *last != st {
                        last = Arc::new(st);
                        if tx.send(last.clone()).is_err() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_doc_list_and_defaults() {
        let text = r#"
---
apiVersion: v1
kind: Namespace
metadata: {name: shop, labels: {team: a}}
---
# a comment-only document
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: web, labels: {app: web}}
  spec: {nodeName: n1, containers: [{name: c, ports: [{containerPort: 80, name: http}]}]}
  status: {podIP: 10.0.0.2}
- kind: ConfigMap
  apiVersion: v1
  metadata: {name: ignored}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: bad, namespace: shop}
  spec: {ingress: [{from: [{ipBlock: {cidr: 10.0.0/8}}]}]}
---
apiVersion: extensions/v1beta1
kind: NetworkPolicy
metadata: {name: old}
"#;
        let (objects, warnings) = parse_manifest(text, false).expect("parses");
        assert_eq!(objects.len(), 2, "{objects:?}");
        assert_eq!(objects[0].describe(), "Namespace shop");
        let Object::Pod(p) = &objects[1] else {
            panic!("not a pod: {:?}", objects[1])
        };
        assert_eq!(p.namespace, "default");
        assert_eq!(p.named_port("http", crate::model::Protocol::Tcp), Some(80));
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert_eq!(
            warnings[0],
            r#"document 3 item 3: NetworkPolicy shop/bad: spec.ingress[0].from[0].ipBlock.cidr: invalid CIDR "10.0.0/8""#
        );
        assert!(
            warnings[1].contains("apiVersion \"extensions/v1beta1\""),
            "{warnings:?}"
        );
    }

    #[test]
    fn json_stream_and_errors() {
        let text = r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"},"spec":{"podCIDR":"10.1.0.0/24"}}
{"kind":"PodList","apiVersion":"v1","items":[{"metadata":{"name":"a","namespace":"x"}}]}"#;
        let (objects, warnings) = parse_manifest(text, true).expect("parses");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            objects.iter().map(Object::describe).collect::<Vec<_>>(),
            ["Node n1", "Pod x/a"]
        );
        assert!(parse_manifest("{\"kind\": ", true).is_err());
        assert!(parse_manifest("kind: [Pod\n", false).is_err());
        // Wrong field types: the object is rejected by name, the rest stays.
        let (objects, warnings) =
            parse_manifest("kind: Pod\nmetadata: {name: p}\nspec: {hostNetwork: [1]}\n---\nkind: Namespace\nmetadata: {name: n}\n", false)
                .expect("parses");
        assert_eq!(objects.len(), 1, "{objects:?} {warnings:?}");
        assert!(
            warnings[0].starts_with("document 1: Pod default/p: "),
            "{warnings:?}"
        );
        let (_, warnings) =
            parse_manifest("- 1\n---\nmetadata: {name: x}\n", false).expect("parses");
        assert_eq!(
            warnings,
            ["document 1: not an object", "document 2: no kind"]
        );
    }

    #[test]
    fn yaml_scalars_as_kubectl_reads_them() {
        // Typed fields take scalars as written (YAML 1.1 `n`, `yes`).
        let (objects, warnings) = parse_manifest(
            "kind: Namespace\nmetadata: {name: n, labels: {enabled: yes, no: off}}\n",
            false,
        )
        .expect("parses");
        assert!(warnings.is_empty(), "{warnings:?}");
        let Object::Namespace(ns) = &objects[0] else {
            panic!("{objects:?}")
        };
        assert_eq!(ns.name, "n");
        assert_eq!(ns.labels.get("enabled").map(String::as_str), Some("yes"));
        assert_eq!(ns.labels.get("no").map(String::as_str), Some("off"));
        // In a List (untyped first): only YAML 1.2 booleans are booleans.
        let (objects, warnings) = parse_manifest(
            "kind: List\nitems:\n- kind: Namespace\n  metadata: {name: y}\n",
            false,
        )
        .expect("parses");
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(objects[0].describe(), "Namespace y");
    }

    #[test]
    fn document_splitting() {
        assert_eq!(split_yaml("a: 1\n---\nb: 2\n"), ["a: 1\n", "\nb: 2\n"]);
        assert_eq!(
            split_yaml("# c\n---\na: 1\n--- \n---\n"),
            ["# c\n\na: 1\n", " \n", "\n"]
        );
        assert_eq!(
            split_yaml("a: '---'\nb: |\n  ---x\n"),
            ["a: '---'\nb: |\n  ---x\n"]
        );
        assert_eq!(split_yaml("----\n"), ["----\n"]);
    }

    #[test]
    fn names() {
        assert!(
            is_manifest_name("a.yaml") && is_manifest_name("b.yml") && is_manifest_name("c.json")
        );
        assert!(
            !is_manifest_name(".yaml")
                && !is_manifest_name("a.yaml~")
                && !is_manifest_name("a.txt")
        );
    }
}
