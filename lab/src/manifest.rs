//! Kubernetes objects in and out: reading what the user applies, and
//! writing the manifest directory the agents watch.
//!
//! Input: YAML or JSON files, several documents per file (`---`), `kind:
//! List` flattened. Kinds: Namespace (v1), Pod (v1), NetworkPolicy
//! (networking.k8s.io/v1), Service and Endpoints (v1, for a lab with an API
//! server: [`crate::service`]); anything else is an error naming the file and
//! document. Names are checked the way the API server checks them
//! (DNS-1123); everything else (policy contents in particular) is passed to
//! the agent unchanged: the agent's manifest source validates and defaults
//! like the API server, and its log names what it rejected.
//!
//! Output: one file per object, `<kind>_<namespace>_<name>.yaml`
//! (`<kind>_<name>.yaml` for cluster-scoped kinds; `_` cannot occur in a
//! Kubernetes name, so file names never collide), written through a
//! dot-file and renamed into place ([`crate::state::write_atomic`]). The
//! lab fills in what the API server and kubelet would: `metadata.uid`,
//! `metadata.namespace`, the `kubernetes.io/metadata.name` namespace label,
//! a Pod's `spec.nodeName` and `status` (`podIP`, `podIPs`, `hostIP`,
//! `phase`).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::{json, Map, Value};

use crate::state::{write_atomic, PortState};

/// The kinds the lab applies, in apply order (namespaces first, policies
/// before pods so that a pod is never briefly unprotected, Services after
/// pods so that their first Endpoints already list them). Services and
/// Endpoints exist only in a lab with an API server (`up --kube-proxy`);
/// they go to the API server, not to the manifest directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Namespace,
    NetworkPolicy,
    Pod,
    Service,
    Endpoints,
}

impl Kind {
    fn parse(kind: &str) -> Option<Kind> {
        match kind {
            "Namespace" => Some(Kind::Namespace),
            "NetworkPolicy" => Some(Kind::NetworkPolicy),
            "Pod" => Some(Kind::Pod),
            "Service" => Some(Kind::Service),
            "Endpoints" => Some(Kind::Endpoints),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::NetworkPolicy => "NetworkPolicy",
            Kind::Pod => "Pod",
            Kind::Service => "Service",
            Kind::Endpoints => "Endpoints",
        }
    }
    fn api_version(self) -> &'static str {
        match self {
            Kind::Namespace | Kind::Pod | Kind::Service | Kind::Endpoints => "v1",
            Kind::NetworkPolicy => "networking.k8s.io/v1",
        }
    }
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Namespace)
    }
}

/// One object read from the user's files.
#[derive(Clone, Debug, PartialEq)]
pub struct Object {
    pub kind: Kind,
    /// Empty for cluster-scoped kinds; `default` when not given.
    pub namespace: String,
    pub name: String,
    pub body: Value,
    /// `file#document` for messages.
    pub source: String,
}

impl Object {
    /// `ns/name` or `name`.
    pub fn display_name(&self) -> String {
        if self.kind.namespaced() {
            format!("{} {}/{}", self.kind.as_str(), self.namespace, self.name)
        } else {
            format!("{} {}", self.kind.as_str(), self.name)
        }
    }
    /// The manifest file of this object.
    pub fn file_name(&self) -> String {
        object_file_name(self.kind.as_str(), &self.namespace, &self.name)
    }
    /// `metadata.labels` as strings.
    pub fn labels(&self) -> Map<String, Value> {
        self.body
            .pointer("/metadata/labels")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default()
    }
}

/// The manifest file name of an object.
pub fn object_file_name(kind: &str, namespace: &str, name: &str) -> String {
    let kind = kind.to_ascii_lowercase();
    if namespace.is_empty() {
        format!("{kind}_{name}.yaml")
    } else {
        format!("{kind}_{namespace}_{name}.yaml")
    }
}

/// A DNS-1123 label (namespace names): 1-63 of `[a-z0-9-]`, alphanumeric at both ends.
fn is_dns_label(s: &str) -> bool {
    is_dns_subdomain(s) && s.len() <= 63 && !s.contains('.')
}

/// A DNS-1123 subdomain (pod and policy names).
fn is_dns_subdomain(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.chars().all(|c| alnum(c) || c == '-' || c == '.')
        && s.chars().next().is_some_and(alnum)
        && s.chars().last().is_some_and(alnum)
}

/// How the lab reads YAML (serde-saphyr): YAML 1.2 scalars as
/// `serde_yaml` read them, so `name: n` or `on` stays a string and so do
/// `0755` and `1_000`.
pub fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o.leading_zero_numbers_as_strings = true;
    o.underscored_numbers_as_strings = true;
    o
}

/// Parses every non-empty document of `text` (from `source`, for
/// messages).
pub fn parse_documents(text: &str, source: &str) -> anyhow::Result<Vec<Object>> {
    let mut out = Vec::new();
    let mut bytes = text.as_bytes();
    for (i, doc) in
        serde_saphyr::read_with_options::<_, Value>(&mut bytes, yaml_options()).enumerate()
    {
        let where_ = format!("{source}#{}", i + 1);
        let v = doc.with_context(|| format!("{where_}: invalid YAML"))?;
        collect(v, &where_, &mut out)?;
    }
    Ok(out)
}

fn collect(v: Value, where_: &str, out: &mut Vec<Object>) -> anyhow::Result<()> {
    if v.is_null() {
        return Ok(());
    }
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .with_context(|| format!("{where_}: no \"kind\""))?
        .to_string();
    if kind == "List" {
        let items = v
            .get("items")
            .and_then(Value::as_array)
            .with_context(|| format!("{where_}: a List without \"items\""))?;
        for (j, item) in items.iter().enumerate() {
            collect(item.clone(), &format!("{where_}.items[{j}]"), out)?;
        }
        return Ok(());
    }
    let k = Kind::parse(&kind).with_context(|| {
        format!("{where_}: kind {kind:?} is not supported (Namespace, Pod, NetworkPolicy, Service, Endpoints)")
    })?;
    let api = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api != k.api_version() {
        anyhow::bail!(
            "{where_}: {kind} needs apiVersion {:?}, got {api:?}",
            k.api_version()
        );
    }
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .with_context(|| format!("{where_}: {kind} without metadata.name"))?
        .to_string();
    let name_ok = match k {
        Kind::Namespace => is_dns_label(&name),
        _ => is_dns_subdomain(&name),
    };
    if !name_ok {
        anyhow::bail!("{where_}: {kind} name {name:?} is not a valid DNS-1123 name");
    }
    let namespace = if k.namespaced() {
        let ns = v
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        if !is_dns_label(&ns) {
            anyhow::bail!(
                "{where_}: {kind} {name}: namespace {ns:?} is not a valid DNS-1123 label"
            );
        }
        ns
    } else {
        String::new()
    };
    if let Some(labels) = v.pointer("/metadata/labels") {
        let ok = labels
            .as_object()
            .is_some_and(|m| m.values().all(Value::is_string));
        if !ok {
            anyhow::bail!("{where_}: {kind} {name}: metadata.labels must map strings to strings");
        }
    }
    out.push(Object {
        kind: k,
        namespace,
        name,
        body: v,
        source: where_.to_string(),
    });
    Ok(())
}

/// Reads `path`: a file, or every `*.yaml`, `*.yml` and `*.json` file of a
/// directory (not recursive, in name order).
pub fn read_path(path: &Path) -> anyhow::Result<Vec<Object>> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("cannot read directory {}", path.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("yaml" | "yml" | "json")
                    )
            })
            .collect();
        v.sort();
        v
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("cannot read {}", f.display()))?;
        out.extend(parse_documents(&text, &f.display().to_string())?);
    }
    Ok(out)
}

/// The declared container ports of a Pod (`spec.containers[].ports[]`;
/// protocol defaults to TCP). Errors name the container and field.
pub fn pod_ports(body: &Value) -> anyhow::Result<Vec<PortState>> {
    let mut out = Vec::new();
    let containers = body
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (ci, c) in containers.iter().enumerate() {
        let Some(ports) = c.get("ports") else {
            continue;
        };
        let ports = ports
            .as_array()
            .with_context(|| format!("spec.containers[{ci}].ports must be a list"))?;
        for (pi, p) in ports.iter().enumerate() {
            let field = format!("spec.containers[{ci}].ports[{pi}]");
            let port = p
                .get("containerPort")
                .and_then(Value::as_u64)
                .filter(|n| (1..=65535).contains(n))
                .with_context(|| {
                    format!(
                        "{field}.containerPort must be 1-65535, got {}",
                        p.get("containerPort").unwrap_or(&Value::Null)
                    )
                })?;
            let protocol = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            if !matches!(protocol, "TCP" | "UDP" | "SCTP") {
                anyhow::bail!("{field}.protocol must be TCP, UDP or SCTP, got {protocol:?}");
            }
            out.push(PortState {
                protocol: protocol.to_string(),
                port: u16::try_from(port).unwrap_or(0),
                name: p.get("name").and_then(Value::as_str).map(str::to_string),
            });
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `v` as a JSON object, replacing whatever else it was by `{}`.
fn object_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = json!({});
    }
    match v {
        Value::Object(m) => m,
        _ => unreachable!("replaced by an object above"),
    }
}

fn metadata_mut(body: &mut Value) -> &mut Map<String, Value> {
    field_mut(body, "metadata")
}

fn field_mut<'a>(body: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    object_mut(object_mut(body).entry(key).or_insert_with(|| json!({})))
}

/// The stored form of a user object: uid and namespace filled in, and for
/// a Namespace the `kubernetes.io/metadata.name` label.
pub fn stored_object(obj: &Object, uid: &str) -> Value {
    let mut body = obj.body.clone();
    let md = metadata_mut(&mut body);
    md.insert("uid".into(), json!(uid));
    if obj.kind.namespaced() {
        md.insert("namespace".into(), json!(obj.namespace));
    }
    if obj.kind == Kind::Namespace {
        let labels = md.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), json!(obj.name));
        }
    }
    body
}

/// A Pod's stored form: [`stored_object`] plus `spec.nodeName` and, once
/// the runtime gave it an address, `status`.
/// `ips`: the pod's addresses (IPv4 first, as the kubelet lists them) and
/// its node's.
pub fn pod_object(obj: &Object, uid: &str, node: &str, ips: Option<(&[&str], &str)>) -> Value {
    let mut body = stored_object(obj, uid);
    field_mut(&mut body, "spec").insert("nodeName".into(), json!(node));
    let status = field_mut(&mut body, "status");
    match ips {
        Some((pod_ips, host_ip)) => {
            status.insert("phase".into(), json!("Running"));
            status.insert("hostIP".into(), json!(host_ip));
            status.insert("podIP".into(), json!(pod_ips.first()));
            let list: Vec<Value> = pod_ips.iter().map(|ip| json!({ "ip": ip })).collect();
            status.insert("podIPs".into(), json!(list));
        }
        None => {
            status.insert("phase".into(), json!("Pending"));
            status.remove("podIP");
            status.remove("podIPs");
        }
    }
    body
}

/// The Node object of a lab node (`pod_cidrs`: IPv4 first).
pub fn node_object(name: &str, uid: &str, pod_cidrs: &[&str], internal_ips: &[&str]) -> Value {
    let mut addresses: Vec<Value> = internal_ips
        .iter()
        .map(|ip| json!({ "type": "InternalIP", "address": ip }))
        .collect();
    addresses.push(json!({ "type": "Hostname", "address": name }));
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": uid,
            "labels": { "kubernetes.io/hostname": name, "kubernetes.io/os": "linux" },
        },
        "spec": { "podCIDR": pod_cidrs.first(), "podCIDRs": pod_cidrs },
        "status": { "addresses": addresses },
    })
}

/// The `default` Namespace every cluster has.
pub fn default_namespace(uid: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "default",
            "uid": uid,
            "labels": { "kubernetes.io/metadata.name": "default" },
        },
    })
}

/// Writes `value` as YAML to `dir/file` atomically.
pub fn write(dir: &Path, file: &str, value: &Value) -> anyhow::Result<()> {
    let text = serde_saphyr::to_string(value).with_context(|| format!("cannot encode {file}"))?;
    write_atomic(&dir.join(file), text.as_bytes())
}

/// Removes `dir/file` (absent is fine).
pub fn remove(dir: &Path, file: &str) -> anyhow::Result<()> {
    let p = dir.join(file);
    match std::fs::remove_file(&p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow::anyhow!("cannot remove {}: {e}", p.display())),
    }
}

/// Reads a manifest back (for tests and `status`).
pub fn read(dir: &Path, file: &str) -> anyhow::Result<Value> {
    let p = dir.join(file);
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    serde_saphyr::from_str_with_options(&text, yaml_options())
        .with_context(|| format!("{} is not valid YAML", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: x
  labels: {ns: x}
---
apiVersion: v1
kind: Pod
metadata:
  name: a
  namespace: x
  labels: {pod: a}
spec:
  containers:
  - name: c
    image: none
    ports:
    - {containerPort: 80, name: serve-80-tcp}
    - {containerPort: 80, protocol: UDP}
    - {containerPort: 81, protocol: SCTP}
---
apiVersion: v1
kind: List
items:
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: deny}
  spec: {podSelector: {}}
"#;

    #[test]
    fn parses_multi_document_files_and_lists() {
        let objs = parse_documents(PODS, "f.yaml").expect("parse");
        assert_eq!(objs.len(), 3);
        assert_eq!(objs[0].kind, Kind::Namespace);
        assert_eq!(objs[0].namespace, "");
        assert_eq!(objs[1].display_name(), "Pod x/a");
        assert_eq!(objs[2].display_name(), "NetworkPolicy default/deny");
        assert_eq!(objs[2].source, "f.yaml#3.items[0]");
        assert_eq!(objs[1].file_name(), "pod_x_a.yaml");
        assert_eq!(objs[0].file_name(), "namespace_x.yaml");
        let ports = pod_ports(&objs[1].body).expect("ports");
        let got: Vec<(String, u16)> = ports.iter().map(|p| (p.protocol.clone(), p.port)).collect();
        assert_eq!(
            got,
            vec![("SCTP".into(), 81), ("TCP".into(), 80), ("UDP".into(), 80)]
        );
        assert_eq!(ports[1].name.as_deref(), Some("serve-80-tcp"));
    }

    #[test]
    fn bad_objects_are_named() {
        let e = parse_documents(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: s}\n",
            "s.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("s.yaml#1") && e.contains("Deployment"), "{e}");
        let e = parse_documents(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: Bad_Name}\n",
            "p",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("Bad_Name"), "{e}");
        let e = parse_documents(
            "apiVersion: v1\nkind: NetworkPolicy\nmetadata: {name: p}\n",
            "p",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("networking.k8s.io/v1"), "{e}");
        let e = parse_documents("kind: [", "broken")
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken#1"), "{e}");
        let pod = parse_documents(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, ports: [{containerPort: 70000}]}]}\n",
            "p",
        )
        .expect("parses");
        let e = pod_ports(&pod[0].body).unwrap_err().to_string();
        assert!(
            e.contains("spec.containers[0].ports[0].containerPort") && e.contains("70000"),
            "{e}"
        );
    }

    #[test]
    fn manifests_are_written_with_what_the_api_server_and_kubelet_add() {
        let dir = tempfile::tempdir().expect("tempdir");
        let objs = parse_documents(PODS, "f.yaml").expect("parse");
        // Namespace: uid and the automatic name label, user labels kept.
        let ns = stored_object(&objs[0], "u-ns");
        write(dir.path(), &objs[0].file_name(), &ns).expect("write");
        let back = read(dir.path(), "namespace_x.yaml").expect("read");
        assert_eq!(back["metadata"]["uid"], "u-ns");
        assert_eq!(back["metadata"]["labels"]["ns"], "x");
        assert_eq!(
            back["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "x"
        );
        // Pod: pending without IP, then running with it.
        let pending = pod_object(&objs[1], "u-a", "node-1", None);
        write(dir.path(), &objs[1].file_name(), &pending).expect("write");
        let back = read(dir.path(), "pod_x_a.yaml").expect("read");
        assert_eq!(back["spec"]["nodeName"], "node-1");
        assert_eq!(back["status"]["phase"], "Pending");
        assert!(back["status"].get("podIP").is_none());
        let running = pod_object(
            &objs[1],
            "u-a",
            "node-1",
            Some((&["10.244.1.2", "fd00:10:244:1::2"], "192.168.77.11")),
        );
        write(dir.path(), &objs[1].file_name(), &running).expect("write");
        let back = read(dir.path(), "pod_x_a.yaml").expect("read");
        assert_eq!(back["status"]["podIP"], "10.244.1.2");
        assert_eq!(back["status"]["podIPs"][0]["ip"], "10.244.1.2");
        assert_eq!(back["status"]["podIPs"][1]["ip"], "fd00:10:244:1::2");
        assert_eq!(back["status"]["hostIP"], "192.168.77.11");
        assert_eq!(back["metadata"]["namespace"], "x");
        assert_eq!(
            back["spec"]["containers"][0]["ports"][0]["containerPort"],
            80
        );
        // Policy: namespace defaulted into the stored object.
        let pol = stored_object(&objs[2], "u-p");
        assert_eq!(pol["metadata"]["namespace"], "default");
        // Node.
        let node = node_object("node-1", "u-n", &["10.244.1.0/24"], &["192.168.77.11"]);
        write(dir.path(), "node_node-1.yaml", &node).expect("write");
        let back = read(dir.path(), "node_node-1.yaml").expect("read");
        assert_eq!(back["spec"]["podCIDR"], "10.244.1.0/24");
        assert_eq!(back["status"]["addresses"][0]["type"], "InternalIP");
        assert_eq!(back["status"]["addresses"][0]["address"], "192.168.77.11");
        // Only final files in the directory (no temporaries), and remove is idempotent.
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec!["namespace_x.yaml", "node_node-1.yaml", "pod_x_a.yaml"]
        );
        remove(dir.path(), "pod_x_a.yaml").expect("remove");
        remove(dir.path(), "pod_x_a.yaml").expect("remove again");
    }

    #[test]
    fn ipv6_only_pods_and_nodes() {
        let objs = parse_documents(PODS, "f.yaml").expect("parse");
        let running = pod_object(
            &objs[1],
            "u-a",
            "node-1",
            Some((&["fd00:10:244:1::2"], "fd00:192:168:77::11")),
        );
        assert_eq!(running["status"]["podIP"], "fd00:10:244:1::2");
        assert_eq!(
            running["status"]["podIPs"],
            json!([{ "ip": "fd00:10:244:1::2" }])
        );
        assert_eq!(running["status"]["hostIP"], "fd00:192:168:77::11");
        let node = node_object(
            "node-1",
            "u-n",
            &["fd00:10:244:1::/64"],
            &["fd00:192:168:77::11"],
        );
        assert_eq!(node["spec"]["podCIDR"], "fd00:10:244:1::/64");
        assert_eq!(node["spec"]["podCIDRs"], json!(["fd00:10:244:1::/64"]));
        assert_eq!(
            node["status"]["addresses"],
            json!([
                { "type": "InternalIP", "address": "fd00:192:168:77::11" },
                { "type": "Hostname", "address": "node-1" },
            ])
        );
    }
}
