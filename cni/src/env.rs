//! The `CNI_*` environment of a call: which verb, and the parameters each
//! verb requires (CNI spec 1.1.0, section 2, and the reference `skel`).
//!
//! | verb    | required                                         |
//! |---------|--------------------------------------------------|
//! | ADD     | CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH |
//! | CHECK   | CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH |
//! | DEL     | CNI_CONTAINERID, CNI_IFNAME, CNI_PATH            |
//! | GC      | CNI_PATH                                         |
//! | STATUS  | CNI_PATH                                         |
//! | VERSION | (none)                                           |
//!
//! An empty variable counts as missing. All missing variables of a call are
//! named in one error (code 4); then the present ones are validated one by
//! one (code 4 naming the variable and its value). `CNI_ARGS` is optional
//! for every verb and parsed as `K=V;K2=V2`. Nothing here panics on any
//! input; non-UTF-8 values are rejected as invalid.

use std::collections::BTreeMap;
use std::ffi::OsString;

use oxvs_api::cni::{code, CniCommand, CniError};

/// The value of `CNI_COMMAND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// A verb forwarded to the agent.
    Agent(CniCommand),
    /// `VERSION`, answered by the plugin itself.
    Version,
}

impl Verb {
    /// Parses `CNI_COMMAND` (exact, upper case, as the spec spells it).
    pub fn parse(s: &str) -> Option<Verb> {
        Some(match s {
            "ADD" => Verb::Agent(CniCommand::Add),
            "DEL" => Verb::Agent(CniCommand::Del),
            "CHECK" => Verb::Agent(CniCommand::Check),
            "GC" => Verb::Agent(CniCommand::Gc),
            "STATUS" => Verb::Agent(CniCommand::Status),
            "VERSION" => Verb::Version,
            _ => return None,
        })
    }
}

/// Maximum length of a Linux interface name in bytes (IFNAMSIZ - 1).
pub const MAX_IFNAME_LEN: usize = 15;

/// The validated environment of an agent verb.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallEnv {
    /// `CNI_CONTAINERID` (empty for GC and STATUS).
    pub container_id: String,
    /// `CNI_NETNS` (may be empty for DEL; empty for GC and STATUS).
    pub netns: String,
    /// `CNI_IFNAME` (empty for GC and STATUS).
    pub ifname: String,
    /// `CNI_ARGS`, split.
    pub args: BTreeMap<String, String>,
    /// `CNI_PATH` (checked present, otherwise unused: oxvs delegates to no
    /// other plugin).
    pub path: String,
}

/// Reads one variable: `Ok(None)` if unset or empty, an error (code 4) if it
/// is not UTF-8.
pub fn var(
    getenv: &dyn Fn(&str) -> Option<OsString>,
    name: &str,
) -> Result<Option<String>, CniError> {
    match getenv(name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v.into_string().map(Some).map_err(|v| {
            CniError::new(
                code::INVALID_ENV,
                format!("env variable {name} is not valid UTF-8"),
            )
            .with_details(format!("{name}={}", v.to_string_lossy()))
        }),
    }
}

/// Which variables `command` requires, in the order they are reported.
pub fn required(command: CniCommand) -> &'static [&'static str] {
    match command {
        CniCommand::Add | CniCommand::Check => {
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
        }
        CniCommand::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
        CniCommand::Gc | CniCommand::Status => &["CNI_PATH"],
    }
}

/// Reads and validates the environment of an agent verb. The netns itself
/// is checked separately ([`crate::netns`]), as it touches the filesystem.
pub fn read(
    getenv: &dyn Fn(&str) -> Option<OsString>,
    command: CniCommand,
) -> Result<CallEnv, CniError> {
    let need = required(command);
    let mut values = BTreeMap::new();
    let mut missing = Vec::new();
    for name in need {
        match var(getenv, name)? {
            Some(v) => {
                values.insert(*name, v);
            }
            None => missing.push(*name),
        }
    }
    if !missing.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("required env variables [{}] missing", missing.join(",")),
        ));
    }
    let mut env = CallEnv {
        path: values.remove("CNI_PATH").unwrap_or_default(),
        ..CallEnv::default()
    };
    if matches!(
        command,
        CniCommand::Add | CniCommand::Check | CniCommand::Del
    ) {
        env.container_id = values.remove("CNI_CONTAINERID").unwrap_or_default();
        validate_container_id(&env.container_id)?;
        env.ifname = values.remove("CNI_IFNAME").unwrap_or_default();
        validate_ifname(&env.ifname)?;
        // Required for ADD/CHECK (checked above), optional for DEL.
        env.netns = match values.remove("CNI_NETNS") {
            Some(v) => v,
            None => var(getenv, "CNI_NETNS")?.unwrap_or_default(),
        };
    }
    if let Some(args) = var(getenv, "CNI_ARGS")? {
        env.args = parse_args(&args)?;
    }
    Ok(env)
}

/// `CNI_CONTAINERID`: non-empty, `[A-Za-z0-9][A-Za-z0-9_.-]*`.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_CONTAINERID {id:?}"),
        )
        .with_details(
            "CNI_CONTAINERID must start with a letter or digit, followed by letters, digits, '_', '.' or '-'",
        ))
    }
}

/// `CNI_IFNAME`: 1 to 15 bytes, not `.` or `..`, no `/`, `:` or whitespace
/// (the kernel's `dev_valid_name`, plus `:` as the reference library does).
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let bad = |why: &str| {
        Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_IFNAME {name:?}: {why}"),
        ))
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > MAX_IFNAME_LEN {
        return bad(&format!(
            "{} bytes long, at most {MAX_IFNAME_LEN} allowed",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return bad("'.' and '..' are not interface names");
    }
    if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return bad("contains '/', ':' or whitespace");
    }
    Ok(())
}

/// `CNI_ARGS`: `K=V` pairs separated by `;`. Empty segments (a trailing
/// `;`) are skipped; a segment without exactly one `=`, or with an empty
/// key, is an error (code 4). A repeated key keeps its last value, as the
/// reference library does.
pub fn parse_args(s: &str) -> Result<BTreeMap<String, String>, CniError> {
    let mut out = BTreeMap::new();
    for pair in s.split(';') {
        if pair.is_empty() {
            continue;
        }
        let mut kv = pair.split('=');
        match (kv.next(), kv.next(), kv.next()) {
            (Some(k), Some(v), None) if !k.is_empty() => {
                out.insert(k.to_string(), v.to_string());
            }
            _ => {
                return Err(CniError::new(
                    code::INVALID_ENV,
                    format!("invalid CNI_ARGS: pair {pair:?} is not KEY=VALUE"),
                )
                .with_details(format!("CNI_ARGS={s}")))
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn getenv(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(*v))
        }
    }

    #[test]
    fn verbs() {
        assert_eq!(Verb::parse("ADD"), Some(Verb::Agent(CniCommand::Add)));
        assert_eq!(Verb::parse("VERSION"), Some(Verb::Version));
        assert_eq!(Verb::parse("add"), None);
        assert_eq!(Verb::parse("UPDATE"), None);
    }

    #[test]
    fn all_missing_variables_are_named_once() {
        let e = read(&getenv(&[("CNI_IFNAME", "eth0")]), CniCommand::Add).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert_eq!(
            e.msg,
            "required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_PATH] missing"
        );
        let e = read(&getenv(&[("CNI_PATH", "")]), CniCommand::Gc).unwrap_err();
        assert!(e.msg.contains("[CNI_PATH]"), "{}", e.msg);
    }

    #[test]
    fn del_does_not_need_netns_and_gc_needs_only_path() {
        let env = read(
            &getenv(&[
                ("CNI_CONTAINERID", "abc"),
                ("CNI_IFNAME", "eth0"),
                ("CNI_PATH", "/opt/cni/bin"),
            ]),
            CniCommand::Del,
        )
        .unwrap();
        assert_eq!(env.netns, "");
        assert_eq!(env.container_id, "abc");
        let env = read(&getenv(&[("CNI_PATH", "/x")]), CniCommand::Status).unwrap();
        assert_eq!(env.container_id, "");
    }

    #[test]
    fn container_id_rules() {
        for ok in ["a", "0", "abc-DEF_1.2", "9f86d081884c7d65"] {
            validate_container_id(ok).unwrap();
        }
        for bad in ["", "-a", ".a", "a/b", "a b", "a;b", "é"] {
            let e = validate_container_id(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{bad}");
            assert!(e.msg.contains("CNI_CONTAINERID"));
        }
    }

    #[test]
    fn ifname_rules() {
        for ok in ["eth0", "a", "net1", "123456789012345"] {
            validate_ifname(ok).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a b",
            "a\tb",
            "1234567890123456",
        ] {
            let e = validate_ifname(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{bad}");
            assert!(e.msg.contains("CNI_IFNAME"), "{}", e.msg);
        }
        // 15 bytes, not 15 characters.
        assert!(validate_ifname("ééééééééé").is_err());
    }

    #[test]
    fn args_parse() {
        let a = parse_args("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;").unwrap();
        assert_eq!(a.len(), 3);
        assert_eq!(a["K8S_POD_NAME"], "p");
        assert_eq!(parse_args("A=").unwrap()["A"], "");
        assert_eq!(parse_args("A=1;A=2").unwrap()["A"], "2");
        for bad in ["A", "=1", "A=1=2", "A=1;B"] {
            let e = parse_args(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_ENV, "{bad}");
            assert!(e.msg.contains("CNI_ARGS"));
        }
    }

    #[test]
    fn non_utf8_is_invalid_not_a_panic() {
        use std::os::unix::ffi::OsStringExt;
        let g = |k: &str| (k == "CNI_PATH").then(|| OsString::from_vec(vec![0xff, 0xfe]));
        let e = read(&g, CniCommand::Status).unwrap_err();
        assert_eq!(e.code, code::INVALID_ENV);
        assert!(e.msg.contains("CNI_PATH"));
    }
}
