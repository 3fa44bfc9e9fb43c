//! Calling `oxvs-cni` the way containerd does.
//!
//! The plugin runs in the node's namespace (where containerd would run it)
//! with a clean environment: `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//! `CNI_IFNAME=eth0`, `CNI_PATH`, and `CNI_ARGS` with the `K8S_POD_*` keys
//! (preceded by `IgnoreUnknown=1`, as containerd sends them), plus `PATH`.
//! Stdin carries the plugin's entry of the conflist, completed as libcni
//! does: `name` and `cniVersion` from the list, and `runtimeConfig`.

use std::io::Write as _;
use std::process::{Command, Stdio};

use anyhow::Context as _;
use serde_json::{json, Value};

/// The network name in the lab's conflist.
pub const NETWORK_NAME: &str = "oxvs";

/// One plugin call's outcome.
#[derive(Clone, Debug)]
pub struct CniOut {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub json: Value,
}

impl CniOut {
    /// The error the plugin printed, for messages.
    pub fn describe(&self) -> String {
        let msg = self.json.get("msg").and_then(Value::as_str).unwrap_or("");
        let details = self
            .json
            .get("details")
            .and_then(Value::as_str)
            .unwrap_or("");
        let code = self.json.get("code").and_then(Value::as_u64).unwrap_or(0);
        if msg.is_empty() {
            format!(
                "stdout: {} stderr: {}",
                self.stdout.trim(),
                self.stderr.trim()
            )
        } else if details.is_empty() {
            format!("code {code}: {msg}")
        } else {
            format!("code {code}: {msg} ({details})")
        }
    }

    /// The first IPv4 address of an ADD result.
    pub fn ip(&self) -> Option<String> {
        self.address_where(|a| a.is_ipv4())
    }

    /// The first IPv6 address of an ADD result.
    pub fn ip6(&self) -> Option<String> {
        self.address_where(|a| a.is_ipv6())
    }

    fn address_where(&self, want: impl Fn(&std::net::IpAddr) -> bool) -> Option<String> {
        self.json
            .get("ips")?
            .as_array()?
            .iter()
            .filter_map(|i| i.get("address").and_then(Value::as_str))
            .filter_map(|a| a.split('/').next())
            .find(|a| a.parse::<std::net::IpAddr>().is_ok_and(|ip| want(&ip)))
            .map(str::to_string)
    }
}

/// The plugin configuration sent on stdin.
pub fn config(version: &str, agent_socket: &str) -> Value {
    json!({
        "cniVersion": version,
        "name": NETWORK_NAME,
        "type": "oxvs",
        "agentSocket": agent_socket,
        "runtimeConfig": {},
    })
}

/// What a call is about.
pub struct Call<'a> {
    pub plugin: &'a str,
    /// The node namespace to run the plugin in.
    pub node_netns: &'a str,
    pub command: &'a str,
    pub container_id: &'a str,
    pub netns_path: &'a str,
    /// `(namespace, name, uid)` of the pod, for `CNI_ARGS`.
    pub pod: Option<(&'a str, &'a str, &'a str)>,
    pub config: Value,
}

/// Runs the plugin; fails only when it cannot be run at all.
pub fn call(c: &Call<'_>) -> anyhow::Result<CniOut> {
    let args = match c.pod {
        Some((ns, name, uid)) => format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={uid}",
            c.container_id
        ),
        None => String::new(),
    };
    let plugin_dir = std::path::Path::new(c.plugin)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let mut child = Command::new("ip")
        .args(["netns", "exec", c.node_netns, c.plugin])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", c.command)
        .env("CNI_CONTAINERID", c.container_id)
        .env("CNI_NETNS", c.netns_path)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", plugin_dir)
        .env("CNI_ARGS", args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {} in {}", c.plugin, c.node_netns))?;
    let input = serde_json::to_vec(&c.config).context("cannot encode the CNI config")?;
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin that fails before reading stdin closes it: its output says why.
        let _ = stdin.write_all(&input);
    }
    let out = child
        .wait_with_output()
        .with_context(|| format!("cannot wait for {}", c.plugin))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Ok(CniOut {
        ok: out.status.success(),
        json: serde_json::from_str(&stdout).unwrap_or(Value::Null),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
