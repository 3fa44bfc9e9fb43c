//! `oxvs-cni`: the CNI plugin of oxvs (`"type": "oxvs"`), CNI spec 1.1.0.
//!
//! The plugin is thin. [`run`] reads one call (the `CNI_*` environment and
//! the network configuration on stdin), checks what the specification
//! requires of the caller, answers `VERSION` itself, and forwards ADD, DEL,
//! CHECK, GC and STATUS to `oxvs-agent` over its Unix socket
//! ([`oxvs_api::cni`]), then prints the answer the way the runtime expects.
//!
//! Order of checks (first failure wins; codes are the spec's):
//! 1. `CNI_COMMAND` present (4) and known (4);
//! 2. VERSION: answered from here, whatever the rest of the call;
//! 3. the verb's required variables, all missing ones named at once (4),
//!    then `CNI_CONTAINERID`, `CNI_IFNAME`, `CNI_ARGS` (4);
//! 4. stdin read (5) and the configuration checked ([`config`]: 6, 1, 7);
//! 5. `CNI_NETNS` ([`netns`]: 4, or 8 for the plugin's own namespace);
//! 6. ADD with `prevResult`: it must decode (6);
//! 7. the agent: transport failures give 11 (try again later), or 50 for
//!    STATUS; an undecodable answer gives 6 (50 for STATUS); an agent error
//!    is printed with the agent's code, msg and details.
//!
//! Output: ADD success prints the result in the configuration's version
//! ([`result`]); other verbs print nothing on success. Errors print
//! `{"cniVersion","code","msg","details"}` (details omitted when empty) on
//! stdout, in the configuration's version once it is known (1.1.0 before),
//! and exit with status 1, as the reference `skel` does.
//!
//! Chaining: when ADD's configuration has a `prevResult` (oxvs is not the
//! first plugin), the output is that `prevResult`, converted to the
//! configuration's version, with oxvs's interfaces, IPs (their `interface`
//! index shifted past the earlier interfaces) and routes appended
//! ([`result::AddResult::chained_after`]). For DEL and CHECK the
//! `prevResult` travels to the agent unchanged inside `config`.
//!
//! Nothing here panics on any input; there is no global state, so [`run`]
//! is testable in-process with a fake environment.
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod agent;
pub mod config;
pub mod env;
pub mod netns;
pub mod result;
pub mod version;

use std::ffi::OsString;
use std::io::Read;

use oxvs_api::cni::{code, CniCommand, CniError, CniRequest, CNI_PROTOCOL_VERSION};
use serde::Serialize;
use serde_json::Value;

use crate::env::Verb;
use crate::result::AddResult;
use crate::version::CniVersion;

/// One line for humans, printed on stderr when `CNI_COMMAND` is missing.
pub const ABOUT: &str = concat!("CNI plugin oxvs v", env!("CARGO_PKG_VERSION"));

/// What the process should do at the end: print `stdout`, `stderr`, exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
}

/// The call's input, as the process received it.
pub struct Invocation<'a> {
    /// Reads one environment variable.
    pub getenv: &'a dyn Fn(&str) -> Option<OsString>,
    /// Standard input.
    pub stdin: &'a mut dyn Read,
    /// Whether stdin is a terminal (VERSION then does not wait for it).
    pub stdin_is_terminal: bool,
}

/// The error JSON of the spec, in field order.
#[derive(Serialize)]
struct ErrorJson<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'a str,
    code: u32,
    msg: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    details: &'a str,
}

/// The VERSION answer.
#[derive(Serialize)]
struct VersionJson<'a> {
    #[serde(rename = "cniVersion")]
    cni_version: &'a str,
    #[serde(rename = "supportedVersions")]
    supported_versions: Vec<&'static str>,
}

/// Runs one plugin call.
pub fn run(inv: Invocation<'_>) -> Outcome {
    let mut version = CniVersion::LATEST;
    let mut stderr = String::new();
    match run_inner(inv, &mut version, &mut stderr) {
        Ok(stdout) => Outcome {
            stdout,
            stderr,
            exit_code: 0,
        },
        Err(e) => Outcome {
            stdout: error_json(&e, version.as_str()),
            stderr,
            exit_code: 1,
        },
    }
}

/// The spec's error JSON for `e`, one line.
pub fn error_json(e: &CniError, cni_version: &str) -> String {
    let j = ErrorJson {
        cni_version,
        code: e.code,
        msg: &e.msg,
        details: &e.details,
    };
    // Serialising a struct of strings and integers cannot fail; the fallback
    // keeps this total anyway.
    let mut s = serde_json::to_string(&j).unwrap_or_else(|_| {
        format!(
            r#"{{"cniVersion":"{cni_version}","code":{},"msg":"error"}}"#,
            e.code
        )
    });
    s.push('\n');
    s
}

fn run_inner(
    inv: Invocation<'_>,
    version: &mut CniVersion,
    stderr: &mut String,
) -> Result<String, CniError> {
    let Some(cmd) = env::var(inv.getenv, "CNI_COMMAND")? else {
        stderr.push_str(ABOUT);
        stderr.push_str("\nCNI protocol versions supported: ");
        stderr.push_str(&CniVersion::supported_strings().join(", "));
        stderr.push('\n');
        return Err(CniError::new(
            code::INVALID_ENV,
            "required env variables [CNI_COMMAND] missing",
        ));
    };
    let command = match Verb::parse(&cmd) {
        Some(Verb::Agent(c)) => c,
        Some(Verb::Version) => return Ok(version_answer(inv)),
        None => {
            return Err(
                CniError::new(code::INVALID_ENV, format!("unknown CNI_COMMAND: {cmd:?}"))
                    .with_details(
                        "CNI_COMMAND must be one of ADD, DEL, CHECK, GC, STATUS, VERSION",
                    ),
            )
        }
    };
    let call_env = env::read(inv.getenv, command)?;
    let mut stdin = Vec::new();
    inv.stdin.read_to_end(&mut stdin).map_err(|e| {
        CniError::new(
            code::IO_FAILURE,
            format!("error reading network config from stdin: {e}"),
        )
    })?;
    let conf = config::parse(&stdin, command, version)?;
    match command {
        CniCommand::Add | CniCommand::Check => netns::check(&call_env.netns, netns::Need::Exists)?,
        CniCommand::Del => netns::check(&call_env.netns, netns::Need::MayBeGone)?,
        CniCommand::Gc | CniCommand::Status => {}
    }
    let prev = match (command, conf.prev_result()) {
        (CniCommand::Add, Some(p)) => Some(
            AddResult::parse(p, "prevResult")
                .map_err(|m| CniError::new(code::DECODE_FAILURE, m))?,
        ),
        _ => None,
    };
    let is_status = command == CniCommand::Status;
    let request = CniRequest {
        v: CNI_PROTOCOL_VERSION,
        command,
        container_id: call_env.container_id,
        netns: call_env.netns,
        ifname: call_env.ifname,
        args: call_env.args,
        config: conf.raw.clone(),
    };
    let response = agent::call(&conf.agent_socket, conf.agent_timeout, &request).map_err(|e| {
        let c = if is_status {
            code::NOT_AVAILABLE
        } else if e.is_transient() {
            code::TRY_AGAIN_LATER
        } else {
            code::DECODE_FAILURE
        };
        CniError::new(c, e.to_string())
    })?;
    if !response.ok {
        return Err(response.error.unwrap_or_else(|| {
            CniError::new(
                if is_status {
                    code::NOT_AVAILABLE
                } else {
                    code::DECODE_FAILURE
                },
                "the oxvs agent reported a failure without an error",
            )
        }));
    }
    if command != CniCommand::Add {
        return Ok(String::new());
    }
    let bad_answer = |m: String| CniError::new(code::DECODE_FAILURE, m);
    let ours = match &response.result {
        Some(r) if !r.is_null() => {
            AddResult::parse(r, "the oxvs agent's ADD result").map_err(bad_answer)?
        }
        _ => {
            return Err(bad_answer(
                "the oxvs agent answered ADD without a result".into(),
            ))
        }
    };
    let out = match prev {
        Some(prev) => ours.chained_after(prev),
        None => ours,
    };
    Ok(json_line(&out.to_json(conf.version)))
}

/// VERSION: `cniVersion` echoes the stdin's `cniVersion` when stdin is a
/// JSON object with a string `cniVersion` (the spec); otherwise (empty,
/// unreadable, undecodable stdin, as the reference `skel` ignores stdin for
/// VERSION) it is the plugin's own 1.1.0. Never an error.
fn version_answer(inv: Invocation<'_>) -> String {
    let mut stdin = Vec::new();
    if !inv.stdin_is_terminal {
        let _ = inv.stdin.take(1 << 20).read_to_end(&mut stdin);
    }
    let asked = serde_json::from_slice::<Value>(&stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(str::to_owned))
        .filter(|s| !s.is_empty());
    let j = VersionJson {
        cni_version: asked.as_deref().unwrap_or(CniVersion::LATEST.as_str()),
        supported_versions: CniVersion::supported_strings(),
    };
    json_line(&j)
}

fn json_line<T: Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string(v).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn run_with(vars: &[(&str, &str)], stdin: &str) -> Outcome {
        let map: BTreeMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        let getenv = move |k: &str| map.get(k).cloned();
        let mut input = stdin.as_bytes();
        run(Invocation {
            getenv: &getenv,
            stdin: &mut input,
            stdin_is_terminal: false,
        })
    }

    fn parse(o: &Outcome) -> Value {
        serde_json::from_str(&o.stdout).unwrap()
    }

    #[test]
    fn no_command_is_code_4_with_about_on_stderr() {
        let o = run_with(&[], "");
        assert_eq!(o.exit_code, 1);
        let j = parse(&o);
        assert_eq!(j["code"], 4);
        assert_eq!(j["cniVersion"], "1.1.0");
        assert!(j["msg"].as_str().unwrap().contains("CNI_COMMAND"));
        assert!(j.get("details").is_none());
        assert!(o.stderr.contains("oxvs"));
    }

    #[test]
    fn unknown_command() {
        let o = run_with(&[("CNI_COMMAND", "UPDATE")], "{}");
        let j = parse(&o);
        assert_eq!(j["code"], 4);
        assert!(j["msg"].as_str().unwrap().contains("UPDATE"));
    }

    #[test]
    fn version_echoes_or_defaults() {
        let o = run_with(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(o.exit_code, 0);
        let j = parse(&o);
        assert_eq!(j["cniVersion"], "0.4.0");
        assert_eq!(
            j["supportedVersions"],
            serde_json::json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
        );
        for stdin in ["", "not json", "[]", r#"{"cniVersion":7}"#] {
            let j = parse(&run_with(&[("CNI_COMMAND", "VERSION")], stdin));
            assert_eq!(j["cniVersion"], "1.1.0", "{stdin}");
        }
    }

    #[test]
    fn errors_use_the_config_version_once_known() {
        let vars = [
            ("CNI_COMMAND", "CHECK"),
            ("CNI_CONTAINERID", "c"),
            ("CNI_NETNS", "/proc/self/ns/uts"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ];
        let j = parse(&run_with(
            &vars,
            r#"{"cniVersion":"0.3.1","name":"n","type":"oxvs"}"#,
        ));
        assert_eq!(j["code"], 1);
        assert_eq!(j["cniVersion"], "0.3.1");
        assert_eq!(j["msg"], "config version does not allow CHECK");
    }
}
