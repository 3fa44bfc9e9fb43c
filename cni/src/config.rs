//! The network configuration read on stdin: what the plugin checks before
//! forwarding it (unchanged) to the agent.
//!
//! Checks, in order, each with the code the reference library uses:
//! 1. a JSON object (else 6, decode failure);
//! 2. `cniVersion`: a string (else 6) naming a supported version (else 1,
//!    naming it and listing the supported ones; missing counts as the
//!    spec's implied 0.1.0, which is not supported);
//! 3. `name`: present and non-empty (else 7), a string (else 6), matching
//!    `[A-Za-z0-9][A-Za-z0-9_.-]*` (else 7);
//! 4. `type`: the string `"oxvs"` (else 7);
//! 5. oxvs's own optional keys, wrong type or value -> 7 naming the key:
//!    `agentSocket` (non-empty string, default
//!    [`oxvs_api::cni::DEFAULT_CNI_SOCKET`]), `agentTimeoutSeconds`
//!    (positive number, at most [`MAX_TIMEOUT_SECS`], default
//!    [`DEFAULT_TIMEOUT_SECS`]);
//! 6. the verb against the version: CHECK needs >= 0.4.0, GC and STATUS
//!    need >= 1.1.0 (else 1, "config version does not allow X");
//! 7. GC: `cni.dev/valid-attachments` (and the legacy
//!    `cni.dev/attachments`), when present and not null, must be a list of
//!    `{"containerID": string, "ifname": string}` (else 7), so the agent
//!    never mistakes a malformed list for "nothing is valid".
//!
//! Every other key (`prevResult`, `runtimeConfig`, `capabilities`, `args`,
//! `ipam`, `dns`, unknown keys) is not interpreted here and reaches the
//! agent unchanged.

use std::path::PathBuf;
use std::time::Duration;

use oxvs_api::cni::{code, CniCommand, CniError, DEFAULT_CNI_SOCKET};
use serde_json::{Map, Value};

use crate::version::CniVersion;

/// Default deadline for the whole exchange with the agent.
pub const DEFAULT_TIMEOUT_SECS: f64 = 30.0;
/// Largest accepted `agentTimeoutSeconds` (one hour).
pub const MAX_TIMEOUT_SECS: f64 = 3600.0;
/// The `type` this plugin answers to.
pub const PLUGIN_TYPE: &str = "oxvs";

/// A checked network configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    /// The configuration exactly as read (a JSON object).
    pub raw: Value,
    pub version: CniVersion,
    pub name: String,
    pub agent_socket: PathBuf,
    pub agent_timeout: Duration,
}

impl NetConf {
    /// `prevResult`, if present and not null.
    pub fn prev_result(&self) -> Option<&Value> {
        self.raw.get("prevResult").filter(|v| !v.is_null())
    }
}

/// Parses the configuration; `version_out` is set as soon as the
/// configuration's version is known to be supported, so errors after that
/// point are reported in that version.
pub fn parse(
    stdin: &[u8],
    command: CniCommand,
    version_out: &mut CniVersion,
) -> Result<NetConf, CniError> {
    let raw: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            code::DECODE_FAILURE,
            format!("error decoding network config from stdin: {e}"),
        )
    })?;
    let Some(obj) = raw.as_object() else {
        return Err(CniError::new(
            code::DECODE_FAILURE,
            format!(
                "network config on stdin must be a JSON object, got {}",
                kind(&raw)
            ),
        ));
    };
    let version = parse_version(obj)?;
    *version_out = version;
    let name = match obj.get("name") {
        None | Some(Value::Null) => return Err(invalid("missing network name (key \"name\")")),
        Some(Value::String(s)) if s.is_empty() => {
            return Err(invalid("missing network name (key \"name\" is empty)"))
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(CniError::new(
                code::DECODE_FAILURE,
                format!(
                    "network config key \"name\" must be a string, got {}",
                    kind(other)
                ),
            ))
        }
    };
    if crate::env::validate_container_id(&name).is_err() {
        return Err(invalid(format!(
            "invalid characters in network name {name:?}"
        ))
        .with_details("a network name must start with a letter or digit, followed by letters, digits, '_', '.' or '-'"));
    }
    match obj.get("type") {
        Some(Value::String(t)) if t == PLUGIN_TYPE => {}
        None | Some(Value::Null) => {
            return Err(invalid(format!(
                "missing plugin type (key \"type\"), expected {PLUGIN_TYPE:?}"
            )))
        }
        Some(other) => {
            return Err(invalid(format!(
                "network config key \"type\" is {other}, expected {PLUGIN_TYPE:?}"
            )))
        }
    }
    let agent_socket = match obj.get("agentSocket") {
        None | Some(Value::Null) => PathBuf::from(DEFAULT_CNI_SOCKET),
        Some(Value::String(s)) if !s.is_empty() => PathBuf::from(s),
        Some(other) => {
            return Err(invalid(format!(
                "network config key \"agentSocket\" must be a non-empty path string, got {other}"
            )))
        }
    };
    let agent_timeout = match obj.get("agentTimeoutSeconds") {
        None | Some(Value::Null) => Duration::from_secs_f64(DEFAULT_TIMEOUT_SECS),
        Some(v) => v
            .as_f64()
            .filter(|s| *s > 0.0 && *s <= MAX_TIMEOUT_SECS)
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| {
                invalid(format!(
                    "network config key \"agentTimeoutSeconds\" must be a number of seconds in (0, {MAX_TIMEOUT_SECS}], got {v}"
                ))
            })?,
    };
    let min = match command {
        CniCommand::Check => Some((CniVersion::V0_4_0, "CHECK")),
        CniCommand::Gc => Some((CniVersion::V1_1_0, "GC")),
        CniCommand::Status => Some((CniVersion::V1_1_0, "STATUS")),
        CniCommand::Add | CniCommand::Del => None,
    };
    if let Some((min, verb)) = min {
        if version < min {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("config version does not allow {verb}"),
            )
            .with_details(format!(
                "config is {version:?}, {verb} needs cniVersion {min} or later",
                version = version.as_str()
            )));
        }
    }
    if command == CniCommand::Gc {
        for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
            check_attachments(obj, key)?;
        }
    }
    Ok(NetConf {
        raw: raw.clone(),
        version,
        name,
        agent_socket,
        agent_timeout,
    })
}

fn parse_version(obj: &Map<String, Value>) -> Result<CniVersion, CniError> {
    let supported = CniVersion::supported_strings().join(", ");
    let s =
        match obj.get("cniVersion") {
            None | Some(Value::Null) => return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                "incompatible CNI versions: network config has no \"cniVersion\" (meaning 0.1.0)",
            )
            .with_details(format!("plugin supports {supported}"))),
            Some(Value::String(s)) => s,
            Some(other) => {
                return Err(CniError::new(
                    code::DECODE_FAILURE,
                    format!("network config key \"cniVersion\" must be a string, got {other}"),
                ))
            }
        };
    CniVersion::parse(s).ok_or_else(|| {
        CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("incompatible CNI versions: config is {s:?}"),
        )
        .with_details(format!("config is {s:?}, plugin supports {supported}"))
    })
}

fn check_attachments(obj: &Map<String, Value>, key: &str) -> Result<(), CniError> {
    let list = match obj.get(key) {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(list)) => list,
        Some(other) => {
            return Err(invalid(format!(
                "GC config key {key:?} must be a list, got {}",
                kind(other)
            )))
        }
    };
    for (i, a) in list.iter().enumerate() {
        let ok = a.get("containerID").is_some_and(Value::is_string)
            && a.get("ifname").is_some_and(Value::is_string);
        if !ok {
            return Err(invalid(format!(
                "GC config {key:?}[{i}] must be {{\"containerID\": string, \"ifname\": string}}, got {a}"
            )));
        }
    }
    Ok(())
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_CONFIG, msg)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(v: Value, cmd: CniCommand) -> Result<NetConf, CniError> {
        let mut ver = CniVersion::LATEST;
        parse(v.to_string().as_bytes(), cmd, &mut ver)
    }

    fn base() -> Value {
        json!({"cniVersion": "1.1.0", "name": "pods", "type": "oxvs"})
    }

    fn with(k: &str, v: Value) -> Value {
        let mut b = base();
        b[k] = v;
        b
    }

    #[test]
    fn defaults_and_passthrough() {
        let c = p(with("someUnknownKey", json!({"a": 1})), CniCommand::Add).unwrap();
        assert_eq!(c.agent_socket, PathBuf::from(DEFAULT_CNI_SOCKET));
        assert_eq!(c.agent_timeout, Duration::from_secs(30));
        assert_eq!(c.raw["someUnknownKey"]["a"], 1);
        assert_eq!(c.name, "pods");
        assert!(c.prev_result().is_none());
    }

    #[test]
    fn decode_errors() {
        let mut ver = CniVersion::LATEST;
        for bad in [&b"{"[..], b"", b"\xff", b"nul"] {
            let e = parse(bad, CniCommand::Add, &mut ver).unwrap_err();
            assert_eq!(e.code, code::DECODE_FAILURE);
        }
        for bad in [json!([1]), json!("x"), json!(1), json!(null)] {
            let e = p(bad, CniCommand::Add).unwrap_err();
            assert_eq!(e.code, code::DECODE_FAILURE);
            assert!(e.msg.contains("JSON object"), "{}", e.msg);
        }
        assert_eq!(
            p(with("cniVersion", json!(1)), CniCommand::Add)
                .unwrap_err()
                .code,
            6
        );
        assert_eq!(
            p(with("name", json!(1)), CniCommand::Add).unwrap_err().code,
            6
        );
    }

    #[test]
    fn versions() {
        for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
            let mut ver = CniVersion::LATEST;
            let c = parse(
                with("cniVersion", json!(v)).to_string().as_bytes(),
                CniCommand::Del,
                &mut ver,
            )
            .unwrap();
            assert_eq!(c.version.as_str(), v);
            assert_eq!(ver.as_str(), v);
        }
        let e = p(with("cniVersion", json!("0.2.0")), CniCommand::Add).unwrap_err();
        assert_eq!(e.code, code::INCOMPATIBLE_VERSION);
        assert!(
            e.msg.contains("0.2.0") && e.details.contains("1.1.0"),
            "{e}"
        );
        let mut b = base();
        b.as_object_mut().unwrap().remove("cniVersion");
        assert_eq!(p(b, CniCommand::Add).unwrap_err().code, 1);
    }

    #[test]
    fn name_and_type() {
        let mut b = base();
        b.as_object_mut().unwrap().remove("name");
        let e = p(b, CniCommand::Add).unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("name"));
        assert_eq!(
            p(with("name", json!("")), CniCommand::Add)
                .unwrap_err()
                .code,
            7
        );
        assert_eq!(
            p(with("name", json!("a/b")), CniCommand::Add)
                .unwrap_err()
                .code,
            7
        );
        let e = p(with("type", json!("bridge")), CniCommand::Add).unwrap_err();
        assert_eq!(e.code, 7);
        assert!(e.msg.contains("bridge"), "{}", e.msg);
        let mut b = base();
        b.as_object_mut().unwrap().remove("type");
        assert_eq!(p(b, CniCommand::Add).unwrap_err().code, 7);
    }

    #[test]
    fn oxvs_keys() {
        let c = p(with("agentSocket", json!("/tmp/x.sock")), CniCommand::Add).unwrap();
        assert_eq!(c.agent_socket, PathBuf::from("/tmp/x.sock"));
        let c = p(with("agentTimeoutSeconds", json!(0.25)), CniCommand::Add).unwrap();
        assert_eq!(c.agent_timeout, Duration::from_millis(250));
        for (k, v) in [
            ("agentSocket", json!(1)),
            ("agentSocket", json!("")),
            ("agentTimeoutSeconds", json!("30")),
            ("agentTimeoutSeconds", json!(0)),
            ("agentTimeoutSeconds", json!(-1)),
            ("agentTimeoutSeconds", json!(1e300)),
        ] {
            let e = p(with(k, v.clone()), CniCommand::Add).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{k}={v}");
            assert!(e.msg.contains(k), "{}", e.msg);
        }
    }

    #[test]
    fn verb_version_gates() {
        let e = p(with("cniVersion", json!("0.3.1")), CniCommand::Check).unwrap_err();
        assert_eq!(e.code, 1);
        assert_eq!(e.msg, "config version does not allow CHECK");
        p(with("cniVersion", json!("0.4.0")), CniCommand::Check).unwrap();
        for cmd in [CniCommand::Gc, CniCommand::Status] {
            let e = p(with("cniVersion", json!("1.0.0")), cmd).unwrap_err();
            assert_eq!(e.code, 1);
            assert!(e.msg.contains(cmd.as_str()));
            p(base(), cmd).unwrap();
        }
    }

    #[test]
    fn gc_attachments_shape() {
        let ok = json!([{"containerID": "a", "ifname": "eth0"}]);
        p(
            with("cni.dev/valid-attachments", ok.clone()),
            CniCommand::Gc,
        )
        .unwrap();
        p(with("cni.dev/attachments", ok), CniCommand::Gc).unwrap();
        p(
            with("cni.dev/valid-attachments", json!(null)),
            CniCommand::Gc,
        )
        .unwrap();
        for bad in [json!({}), json!([{"containerID": "a"}]), json!([1])] {
            let e = p(with("cni.dev/valid-attachments", bad), CniCommand::Gc).unwrap_err();
            assert_eq!(e.code, 7);
            assert!(e.msg.contains("cni.dev/valid-attachments"));
        }
    }
}
