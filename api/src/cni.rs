//! What travels on the agent's CNI socket, between `oxvs-cni` and
//! `oxvs-agent`.
//!
//! The plugin is thin: it reads the CNI call (environment + the network
//! configuration on stdin), checks what the spec requires of the caller,
//! answers `VERSION` itself, and forwards every other verb as one
//! [`CniRequest`] line to the agent's socket (default
//! [`DEFAULT_CNI_SOCKET`]). The agent answers with one [`CniResponse`] line.
//! The connection then closes (one request per connection).
//!
//! Results travel in the CNI 1.1.0 shape ([`CniResult`]); the plugin
//! converts them to the version the runtime asked for and merges them with
//! a `prevResult` when oxvs is not the first plugin of a chain.
//!
//! Error codes are the CNI specification's ([`code`]); the plugin prints the
//! error as the spec's error JSON on stdout.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Default path of the agent's CNI socket.
pub const DEFAULT_CNI_SOCKET: &str = "/run/oxvs/cni.sock";

/// Protocol version of the CNI socket.
pub const CNI_PROTOCOL_VERSION: u32 = 1;

/// CNI error codes (CNI specification 1.1.0, "Error").
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Unsupported field in network configuration.
    pub const UNSUPPORTED_FIELD: u32 = 2;
    /// Container unknown or does not exist.
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables.
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure.
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content.
    pub const DECODE_FAILURE: u32 = 6;
    /// Invalid network config.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin is not available (cannot serve ADD).
    pub const NOT_AVAILABLE: u32 = 50;
    /// STATUS: limited connectivity.
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// oxvs-specific (>= 100): ADD for a (container, ifname) already attached.
    pub const ALREADY_ATTACHED: u32 = 100;
    /// oxvs-specific: the node's pod CIDR has no free address.
    pub const IP_EXHAUSTED: u32 = 101;
    /// oxvs-specific: the switch refused or failed an operation.
    pub const SWITCH_FAILURE: u32 = 102;
    /// oxvs-specific: setting up the pod's interface failed (netlink).
    pub const INTERFACE_FAILURE: u32 = 103;
    /// oxvs-specific: CHECK found the attachment differs from prevResult.
    pub const CHECK_FAILED: u32 = 104;
}

/// The verbs the agent serves (`VERSION` never leaves the plugin).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum CniCommand {
    Add,
    Del,
    Check,
    Gc,
    Status,
}

impl CniCommand {
    /// The verb as in `CNI_COMMAND`.
    pub fn as_str(self) -> &'static str {
        match self {
            CniCommand::Add => "ADD",
            CniCommand::Del => "DEL",
            CniCommand::Check => "CHECK",
            CniCommand::Gc => "GC",
            CniCommand::Status => "STATUS",
        }
    }
}

/// One CNI call, as the plugin forwards it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CniRequest {
    /// [`CNI_PROTOCOL_VERSION`].
    pub v: u32,
    pub command: CniCommand,
    /// `CNI_CONTAINERID` (empty for GC and STATUS).
    #[serde(default)]
    pub container_id: String,
    /// `CNI_NETNS`: a path; may be empty for DEL (the sandbox is gone).
    #[serde(default)]
    pub netns: String,
    /// `CNI_IFNAME` (empty for GC and STATUS).
    #[serde(default)]
    pub ifname: String,
    /// `CNI_ARGS`, split into key/value pairs (`K8S_POD_NAMESPACE`,
    /// `K8S_POD_NAME`, `K8S_POD_INFRA_CONTAINER_ID`, `K8S_POD_UID`...).
    #[serde(default)]
    pub args: BTreeMap<String, String>,
    /// The network configuration exactly as read on stdin (with
    /// `prevResult`, `runtimeConfig`, `cni.dev/valid-attachments`...), already
    /// checked by the plugin to be a JSON object with a `cniVersion` it
    /// supports and a `name`.
    pub config: Value,
}

impl CniRequest {
    /// Kubernetes pod namespace and name from `CNI_ARGS`, if given.
    pub fn pod(&self) -> Option<(&str, &str)> {
        Some((
            self.args.get("K8S_POD_NAMESPACE")?.as_str(),
            self.args.get("K8S_POD_NAME")?.as_str(),
        ))
    }
}

/// A CNI error (the spec's error object, without `cniVersion`, which the
/// plugin adds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub fn with_details(mut self, details: impl Into<String>) -> CniError {
        self.details = details.into();
        self
    }
}

impl std::fmt::Display for CniError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CNI error {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}

/// The agent's answer: `{"v":1,"ok":true,"result":{...}}` (ADD: a
/// [`CniResult`]; DEL, CHECK, GC, STATUS: `null`) or
/// `{"v":1,"ok":false,"error":{"code":..,"msg":..,"details":..}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CniResponse {
    pub v: u32,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CniError>,
    /// The agent serves as many connections as its cap allows and did not
    /// read the request: retry after a short wait. Always with an error of
    /// code 11 (try again later), so a plugin that does not know this
    /// field still reports the right thing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub busy: bool,
}

impl CniResponse {
    pub fn success(result: Option<Value>) -> CniResponse {
        CniResponse {
            v: CNI_PROTOCOL_VERSION,
            ok: true,
            result,
            error: None,
            busy: false,
        }
    }

    pub fn failure(error: CniError) -> CniResponse {
        CniResponse {
            v: CNI_PROTOCOL_VERSION,
            ok: false,
            result: None,
            error: Some(error),
            busy: false,
        }
    }

    /// "Busy, retry" (see [`CniResponse::busy`]).
    pub fn busy(msg: impl Into<String>) -> CniResponse {
        CniResponse {
            busy: true,
            ..CniResponse::failure(CniError::new(code::TRY_AGAIN_LATER, msg))
        }
    }
}

/// A CNI result in the 1.1.0 shape (`cniVersion` is added on output).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniResult {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<CniInterface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<CniIp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<CniRoute>,
    #[serde(default, skip_serializing_if = "CniDns::is_empty")]
    pub dns: CniDns,
}

/// `interfaces[]` of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniInterface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// 1.1.0 only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The netns path for a container interface; absent for host ones.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
}

/// `ips[]` of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniIp {
    /// CIDR notation: `10.244.0.5/24`.
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// `routes[]` of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniRoute {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
    /// The route's path MTU (CNI 1.1.0), when below the interface's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
}

/// `dns` of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniDns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl CniDns {
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_strictness() {
        let line = r#"{"v":1,"command":"ADD","container_id":"c1","netns":"/proc/1/ns/net","ifname":"eth0","args":{"K8S_POD_NAME":"a","K8S_POD_NAMESPACE":"x"},"config":{"cniVersion":"1.1.0","name":"oxvs","type":"oxvs"}}"#;
        let r: CniRequest = serde_json::from_str(line).unwrap();
        assert_eq!(r.command, CniCommand::Add);
        assert_eq!(r.pod(), Some(("x", "a")));
        let back: CniRequest = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(serde_json::from_str::<CniRequest>(
            r#"{"v":1,"command":"ADD","config":{},"bogus":1}"#
        )
        .is_err());
        assert!(
            serde_json::from_str::<CniRequest>(r#"{"v":1,"command":"VERSION","config":{}}"#)
                .is_err()
        );
    }

    #[test]
    fn result_serialises_in_the_1_1_0_shape() {
        let r = CniResult {
            interfaces: vec![CniInterface {
                name: "eth0".into(),
                mac: "0a:58:0a:f4:00:05".into(),
                mtu: Some(1450),
                sandbox: "/proc/1/ns/net".into(),
            }],
            ips: vec![CniIp {
                address: "10.244.0.5/24".into(),
                gateway: Some("10.244.0.1".into()),
                interface: Some(0),
            }],
            routes: vec![CniRoute {
                dst: "0.0.0.0/0".into(),
                gw: Some("10.244.0.1".into()),
                mtu: None,
            }],
            dns: CniDns::default(),
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["ips"][0]["interface"], 0);
        assert!(v.get("dns").is_none());
        let e = CniResponse::failure(CniError::new(code::TRY_AGAIN_LATER, "agent down"));
        let s = serde_json::to_string(&e).unwrap();
        assert!(s.contains(r#""code":11"#), "{s}");
    }
}
