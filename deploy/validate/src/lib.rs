//! Checks of the Kubernetes manifests in `deploy/` (`deploy/oxvs.yaml`).
//!
//! [`parse_documents`] reads a multi-document YAML file and turns every
//! document into its typed `k8s-openapi` object ([`Object`]). The
//! `k8s-openapi` types ignore fields they do not know, so a typo such as
//! `hostpath:` for `hostPath:` would parse and silently vanish; every
//! document is therefore serialised back from its typed form and compared
//! with the original ([`unknown_fields`]): anything in the original that the
//! round trip lost or changed is an error naming the document and the path.
//!
//! The helpers below ([`help_flags`], [`env_refs`], [`flag_values`],
//! [`built_binaries_dir`]) serve the invariant checks in `tests/`.
//!
//! Invariants: pure functions, no I/O except [`built_binaries_dir`]
//! (reads the test executable's path); nothing here panics on bad input.
#![deny(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// One typed object of a manifest.
#[derive(Debug, Clone)]
pub enum Object {
    ServiceAccount(Box<ServiceAccount>),
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    ConfigMap(Box<ConfigMap>),
    DaemonSet(Box<DaemonSet>),
}

/// One document of a manifest file: its position, the raw value and the
/// typed object.
#[derive(Debug, Clone)]
pub struct Document {
    /// 0-based position in the file (empty documents are not counted).
    pub index: usize,
    /// `kind` as written.
    pub kind: String,
    /// `metadata.name` as written (empty if absent).
    pub name: String,
    /// The document as JSON, as written.
    pub value: Value,
    /// The typed object.
    pub object: Object,
}

/// What is wrong with a manifest; every variant names the document.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("document {index}: not valid YAML: {source}")]
    Yaml {
        index: usize,
        source: serde_saphyr::Error,
    },
    #[error("document {index}: not a Kubernetes object (no string `apiVersion` and `kind`)")]
    NotAnObject { index: usize },
    #[error("document {index} ({kind} {name:?}): kind {api_version}/{kind} is not one this manifest may contain")]
    UnsupportedKind {
        index: usize,
        api_version: String,
        kind: String,
        name: String,
    },
    #[error(
        "document {index} ({kind} {name:?}): does not parse as {api_version}/{kind}: {source}"
    )]
    Typed {
        index: usize,
        api_version: String,
        kind: String,
        name: String,
        source: serde_json::Error,
    },
    #[error("document {index} ({kind} {name:?}): fields the Kubernetes type does not have (typo?) or values it changed: {}", paths.join("; "))]
    UnknownFields {
        index: usize,
        kind: String,
        name: String,
        paths: Vec<String>,
    },
}

/// How a manifest is read (serde-saphyr): YAML 1.2 scalars as `serde_yaml`
/// read them, so `on`, `n`, `0755` and `1_000` stay strings.
pub fn yaml_options() -> serde_saphyr::Options {
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o.leading_zero_numbers_as_strings = true;
    o.underscored_numbers_as_strings = true;
    o
}

/// Parses every non-empty document of `text` as its typed Kubernetes
/// object, rejecting fields the type does not know.
pub fn parse_documents(text: &str) -> Result<Vec<Document>, ManifestError> {
    let mut docs = Vec::new();
    let mut bytes = text.as_bytes();
    for value in serde_saphyr::read_with_options::<_, Value>(&mut bytes, yaml_options()) {
        let index = docs.len();
        let value = value.map_err(|source| ManifestError::Yaml { index, source })?;
        if value.is_null() {
            continue;
        }
        docs.push(parse_document(index, value)?);
    }
    Ok(docs)
}

fn parse_document(index: usize, value: Value) -> Result<Document, ManifestError> {
    let (Some(api_version), Some(kind)) = (
        value.get("apiVersion").and_then(Value::as_str),
        value.get("kind").and_then(Value::as_str),
    ) else {
        return Err(ManifestError::NotAnObject { index });
    };
    let (api_version, kind) = (api_version.to_string(), kind.to_string());
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let ctx = Ctx {
        index,
        api_version: &api_version,
        kind: &kind,
        name: &name,
        value: &value,
    };
    let object = match (api_version.as_str(), kind.as_str()) {
        ("v1", "ServiceAccount") => Object::ServiceAccount(ctx.typed()?),
        ("v1", "ConfigMap") => Object::ConfigMap(ctx.typed()?),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => Object::ClusterRole(ctx.typed()?),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            Object::ClusterRoleBinding(ctx.typed()?)
        }
        ("apps/v1", "DaemonSet") => Object::DaemonSet(ctx.typed()?),
        _ => {
            return Err(ManifestError::UnsupportedKind {
                index,
                api_version,
                kind,
                name,
            })
        }
    };
    Ok(Document {
        index,
        kind,
        name,
        value,
        object,
    })
}

struct Ctx<'a> {
    index: usize,
    api_version: &'a str,
    kind: &'a str,
    name: &'a str,
    value: &'a Value,
}

impl Ctx<'_> {
    fn typed<T: DeserializeOwned + Serialize>(&self) -> Result<Box<T>, ManifestError> {
        let typed_err = |source| ManifestError::Typed {
            index: self.index,
            api_version: self.api_version.to_string(),
            kind: self.kind.to_string(),
            name: self.name.to_string(),
            source,
        };
        let typed: T = serde_json::from_value(self.value.clone()).map_err(typed_err)?;
        let back = serde_json::to_value(&typed).map_err(typed_err)?;
        let paths = unknown_fields(self.value, &back);
        if !paths.is_empty() {
            return Err(ManifestError::UnknownFields {
                index: self.index,
                kind: self.kind.to_string(),
                name: self.name.to_string(),
                paths,
            });
        }
        Ok(Box::new(typed))
    }
}

/// Every place where `original` has something `reserialized` (the same
/// document after a round trip through its typed form) lost or changed,
/// as JSON-pointer-like paths (`/spec/template/spec/volumes/0/hostpath`).
/// Fields only the round trip has (serialised defaults) are fine.
pub fn unknown_fields(original: &Value, reserialized: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff(original, reserialized, &mut String::new(), &mut out);
    out
}

fn diff(orig: &Value, back: &Value, path: &mut String, out: &mut Vec<String>) {
    match (orig, back) {
        (Value::Object(o), Value::Object(b)) => {
            for (k, v) in o {
                let len = path.len();
                path.push('/');
                path.push_str(k);
                match b.get(k) {
                    Some(bv) => diff(v, bv, path, out),
                    None => out.push(format!("{path} (unknown field)")),
                }
                path.truncate(len);
            }
        }
        (Value::Array(o), Value::Array(b)) => {
            if o.len() != b.len() {
                out.push(format!("{path} ({} elements became {})", o.len(), b.len()));
                return;
            }
            for (i, (ov, bv)) in o.iter().zip(b).enumerate() {
                let len = path.len();
                path.push('/');
                path.push_str(&i.to_string());
                diff(ov, bv, path, out);
                path.truncate(len);
            }
        }
        (o, b) if o == b => {}
        (o, b) => out.push(format!("{path} (value {o} became {b})")),
    }
}

/// The long flags (`--name`) a program's `--help` text lists.
pub fn help_flags(help: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let bytes = help.as_bytes();
    let mut i = 0;
    while let Some(off) = help.get(i..).and_then(|s| s.find("--")) {
        let start = i + off;
        // A flag starts a word: not the tail of `---` or of a word.
        let at_word_start =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'-');
        let mut end = start + 2;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'-') {
            end += 1;
        }
        if at_word_start && end > start + 2 && bytes[start + 2].is_ascii_alphabetic() {
            flags.insert(help[start..end].to_string());
        }
        i = end.max(start + 2);
    }
    flags
}

/// The `--flag` arguments of a command line (`--flag=value` counts as
/// `--flag`); a lone `--` is not a flag.
pub fn flags_of<S: AsRef<str>>(args: &[S]) -> Vec<String> {
    args.iter()
        .map(AsRef::as_ref)
        .filter(|a| a.starts_with("--") && a.len() > 2)
        .map(|a| a.split('=').next().unwrap_or(a).to_string())
        .collect()
}

/// The value given to `flag` in a command line (`--flag VALUE` or
/// `--flag=VALUE`), the last one if repeated.
pub fn flag_values<S: AsRef<str>>(args: &[S], flag: &str) -> Option<String> {
    let mut found = None;
    let mut it = args.iter().map(AsRef::as_ref).peekable();
    while let Some(a) = it.next() {
        if a == flag {
            found = it.peek().map(|v| v.to_string());
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v.to_string());
        }
    }
    found
}

/// The `$(VAR)` references Kubernetes expands in a container's command and
/// args (`$$(VAR)` is an escaped literal and not a reference).
pub fn env_refs(s: &str) -> Vec<String> {
    let mut refs = Vec::new();
    let mut rest = s;
    while let Some(pos) = rest.find("$(") {
        let escaped = rest[..pos].ends_with('$');
        let after = &rest[pos + 2..];
        match after.find(')') {
            Some(close) => {
                if !escaped {
                    refs.push(after[..close].to_string());
                }
                rest = &after[close + 1..];
            }
            None => break,
        }
    }
    refs
}

/// `target/<profile>/` of the running test executable
/// (`target/<profile>/deps/<test>-<hash>`), where cargo puts the
/// workspace's binaries.
pub fn built_binaries_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? == "deps" {
        deps.parent().map(PathBuf::from)
    } else {
        Some(deps.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DS: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: x, namespace: kube-system}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: c
          image: i
          command: [oxvs-agent, --node-name, $(NODE_NAME)]
      volumes:
        - name: v
          hostPath: {path: /run/oxvs, type: DirectoryOrCreate}
"#;

    #[test]
    fn a_clean_daemonset_parses() {
        let docs = match parse_documents(DS) {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(docs.len(), 1);
        assert!(matches!(docs[0].object, Object::DaemonSet(_)));
        assert_eq!(docs[0].name, "x");
    }

    #[test]
    fn a_misspelt_field_is_an_error_naming_its_path() {
        let bad = DS.replace("hostPath:", "hostpath:");
        let err = parse_documents(&bad).err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(
            err.contains("/spec/template/spec/volumes/0/hostpath (unknown field)"),
            "{err}"
        );
        assert!(err.contains("DaemonSet \"x\""), "{err}");
    }

    #[test]
    fn a_misspelt_field_in_a_later_document_names_that_document() {
        let text = format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: sa}}\n---\n{}",
            DS.replace("image: i", "image: i\n          imagePullPolicyy: Never")
        );
        let err = parse_documents(&text).err().map(|e| e.to_string());
        let err = err.unwrap_or_default();
        assert!(err.starts_with("document 1 (DaemonSet"), "{err}");
        assert!(err.contains("imagePullPolicyy"), "{err}");
    }

    #[test]
    fn wrong_types_and_unsupported_kinds_are_errors() {
        let bad = DS.replace("image: i", "image: [i]");
        assert!(matches!(
            parse_documents(&bad),
            Err(ManifestError::Typed { .. })
        ));
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n";
        assert!(matches!(
            parse_documents(svc),
            Err(ManifestError::UnsupportedKind { .. })
        ));
        assert!(matches!(
            parse_documents("- a\n- b\n"),
            Err(ManifestError::NotAnObject { index: 0 })
        ));
        assert!(matches!(
            parse_documents("a: [\n"),
            Err(ManifestError::Yaml { .. })
        ));
    }

    #[test]
    fn help_flags_finds_long_flags_only() {
        let help = "Usage: x [OPTIONS]\n  -s, --socket <PATH>  the socket\n      --log-level <F>\n  ---- not\n  a--b no\n  --  end\n";
        let f = help_flags(help);
        assert_eq!(
            f.into_iter().collect::<Vec<_>>(),
            vec!["--log-level".to_string(), "--socket".to_string()]
        );
    }

    #[test]
    fn flag_helpers() {
        let args = ["oxvs-agent", "--a", "1", "--b=2", "--", "--a", "3"];
        assert_eq!(flags_of(&args), vec!["--a", "--b", "--a"]);
        assert_eq!(flag_values(&args, "--a").as_deref(), Some("3"));
        assert_eq!(flag_values(&args, "--b").as_deref(), Some("2"));
        assert_eq!(flag_values(&args, "--c"), None);
        assert_eq!(env_refs("x $(A) $$(B) $(C"), vec!["A".to_string()]);
    }
}
