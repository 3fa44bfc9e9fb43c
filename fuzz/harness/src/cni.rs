//! `cni`: one call of the `oxvs-cni` plugin, [`oxvs_cni::run`], with the
//! environment (`CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`,
//! `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`; values from a dictionary or raw
//! bytes, not necessarily UTF-8), stdin (raw bytes, or a network
//! configuration built from the input with a `prevResult`) and the agent's
//! answer all taken from the input.
//!
//! The agent is a fake served by the harness on its own Unix socket: a
//! configuration that parses as a JSON object gets its `agentSocket`
//! pointed there, so no call can reach a real agent, and the fake answers
//! with the input's bytes (a built [`CniResponse`] or raw). It records the
//! request line it got.
//!
//! Checked: exit status 0 or 1; on 1, stdout is one line holding the spec's
//! error object (`cniVersion`, numeric `code`, `msg`); on 0, VERSION prints
//! its version object, ADD one JSON object with a `cniVersion`, and other
//! verbs nothing; any request that reached the agent is one line of JSON
//! that decodes as a [`CniRequest`] whose container id, ifname and command
//! are those of the environment.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use oxvs_api::cni::{CniRequest, CniResponse};
use oxvs_cni::{run as cni_run, Invocation};
use serde_json::{json, Value};

use crate::input::Input;

/// The fake agent: its socket, the answer to give, the requests it got.
struct FakeAgent {
    path: PathBuf,
    answer: Arc<Mutex<Vec<u8>>>,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Held while a call is in flight: one input at a time.
    turn: Mutex<()>,
}

fn agent() -> &'static FakeAgent {
    static A: OnceLock<FakeAgent> = OnceLock::new();
    A.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("oxvs-fuzz-cni-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).expect("bind the fake agent");
        let answer = Arc::new(Mutex::new(Vec::new()));
        let got = Arc::new(Mutex::new(Vec::new()));
        let (a, g) = (answer.clone(), got.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut s) = conn else { continue };
                let mut line = Vec::new();
                let _ = BufReader::new(&s).read_until(b'\n', &mut line);
                g.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                let reply = a.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let _ = s.write_all(&reply);
            }
        });
        FakeAgent {
            path,
            answer,
            got,
            turn: Mutex::new(()),
        }
    })
}

const VARS: [&str; 6] = [
    "CNI_COMMAND",
    "CNI_CONTAINERID",
    "CNI_NETNS",
    "CNI_IFNAME",
    "CNI_ARGS",
    "CNI_PATH",
];

fn dictionary(var: &str) -> &'static [&'static str] {
    match var {
        "CNI_COMMAND" => &[
            "ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION", "add", "UPDATE",
        ],
        "CNI_CONTAINERID" => &["c0ffee", "a_b.c-d", "-x", "has space", "x/y"],
        "CNI_NETNS" => &[
            "/proc/self/ns/net",
            "/proc/self/ns/uts",
            "/nonexistent/netns",
            "relative/netns",
            "/",
        ],
        "CNI_IFNAME" => &[
            "eth0",
            "net1",
            ".",
            "..",
            "way-too-long-ifname",
            "a/b",
            "a:b",
        ],
        "CNI_ARGS" => &[
            "K8S_POD_NAMESPACE=x;K8S_POD_NAME=a",
            "IgnoreUnknown=1;FOO=bar",
            "K8S_POD_NAME",
            "=x",
            ";;",
            "K8S_POD_NAMESPACE=x;K8S_POD_NAMESPACE=y",
        ],
        _ => &["/opt/cni/bin", "/opt/cni/bin:/usr/lib/cni"],
    }
}

fn env_value(i: &mut Input<'_>, var: &str) -> Option<OsString> {
    match i.u8() % 8 {
        0 => None,
        1 => Some(OsString::new()),
        2 => Some(OsString::from_vec(i.short_bytes().to_vec())),
        _ => Some(OsString::from(*i.pick(dictionary(var)))),
    }
}

fn junk(i: &mut Input<'_>) -> Value {
    match i.u8() % 8 {
        0 => Value::Null,
        1 => json!(i.u32()),
        2 => json!(String::from_utf8_lossy(i.short_bytes())),
        3 => json!([]),
        4 => json!({}),
        5 => json!(-1.5),
        6 => json!(true),
        _ => serde_json::from_slice(i.short_bytes()).unwrap_or(Value::Null),
    }
}

/// A CNI result (as `prevResult` or the agent's answer), mostly well formed.
fn result(i: &mut Input<'_>) -> Value {
    let mut ips = Vec::new();
    for _ in 0..i.below(3) {
        let mut ip = json!({
            "address": *i.pick(&["10.244.0.3/24", "fd00::3/64", "10.244.0.3", "300.1.1.1/8", "10.0.0.1/33"]),
            "gateway": *i.pick(&["10.244.0.1", "fd00::1", "bad"]),
        });
        if i.bool() {
            ip["interface"] = if i.bool() { json!(i.below(4)) } else { junk(i) };
        }
        if i.u8() < 16 {
            ip["version"] = json!(*i.pick(&["4", "6", "5"]));
        }
        ips.push(ip);
    }
    let mut r = json!({
        "interfaces": (0..i.below(3)).map(|k| json!({
            "name": format!("eth{k}"),
            "mac": "0a:58:0a:f4:00:03",
            "sandbox": "/var/run/netns/x",
        })).collect::<Vec<_>>(),
        "ips": ips,
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.0.1"}],
        "dns": {"nameservers": ["10.96.0.10"]},
    });
    if i.bool() {
        r["cniVersion"] = json!(*i.pick(&["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "0.2.0"]));
    }
    if i.u8() < 32 {
        let k = *i.pick(&["interfaces", "ips", "routes", "dns"]);
        r[k] = junk(i);
    }
    r
}

fn config(i: &mut Input<'_>) -> Value {
    let mut c = json!({
        "cniVersion": *i.pick(&["1.1.0", "1.0.0", "0.4.0", "0.3.1", "0.3.0", "0.2.0", "2.0.0", ""]),
        "name": *i.pick(&["oxvs", "k8s-pod-network", "", "-bad", "x y"]),
        "type": *i.pick(&["oxvs", "bridge"]),
    });
    if i.bool() {
        c["prevResult"] = result(i);
    }
    if i.u8() < 64 {
        c["agentTimeoutSeconds"] = json!(*i.pick(&[0.5, 0.0, -1.0, 1e300, 30.0]));
    }
    if i.u8() < 48 {
        let k = *i.pick(&["cni.dev/valid-attachments", "cni.dev/attachments"]);
        c[k] = if i.bool() {
            json!([{"containerID": "c0ffee", "ifname": "eth0"}])
        } else {
            junk(i)
        };
    }
    if i.u8() < 32 {
        let k = *i.pick(&["cniVersion", "name", "type", "agentSocket", "runtimeConfig"]);
        c[k] = junk(i);
    }
    c
}

fn answer(i: &mut Input<'_>) -> Vec<u8> {
    let mut line = match i.u8() % 6 {
        0 => i.long_bytes().to_vec(),
        1 => serde_json::to_vec(&CniResponse::success(None)).expect("json"),
        2 => {
            let e = oxvs_api::cni::CniError::new(
                *i.pick(&[3, 7, 11, 100, 0, u32::MAX]),
                String::from_utf8_lossy(i.short_bytes()),
            );
            serde_json::to_vec(&CniResponse::failure(e)).expect("json")
        }
        3 => {
            let mut r = CniResponse::success(Some(junk(i)));
            r.v = u32::from(i.u8() % 3);
            serde_json::to_vec(&r).expect("json")
        }
        _ => serde_json::to_vec(&CniResponse::success(Some(result(i)))).expect("json"),
    };
    line.push(b'\n');
    line
}

pub fn run(data: &[u8]) {
    let mut i = Input::new(data);
    let mut env: BTreeMap<&str, OsString> = BTreeMap::new();
    for var in VARS {
        if let Some(v) = env_value(&mut i, var) {
            env.insert(var, v);
        }
    }
    let stdin_is_terminal = i.u8() == 0xff;
    let mut stdin: Vec<u8> = if i.u8() < 200 {
        serde_json::to_vec(&config(&mut i)).expect("json")
    } else {
        i.long_bytes().to_vec()
    };
    let reply = answer(&mut i);

    let fake = agent();
    let _turn = fake.turn.lock().unwrap_or_else(|e| e.into_inner());
    if let Ok(Value::Object(mut obj)) = serde_json::from_slice::<Value>(&stdin) {
        obj.insert("agentSocket".into(), json!(fake.path.to_string_lossy()));
        stdin = serde_json::to_vec(&obj).expect("json");
    }
    *fake.answer.lock().unwrap_or_else(|e| e.into_inner()) = reply;
    fake.got.lock().unwrap_or_else(|e| e.into_inner()).clear();

    let getenv = |k: &str| env.get(k).cloned();
    let mut input = stdin.as_slice();
    let out = cni_run(Invocation {
        getenv: &getenv,
        stdin: &mut input,
        stdin_is_terminal,
    });

    let command = env
        .get("CNI_COMMAND")
        .and_then(|c| c.to_str())
        .unwrap_or_default()
        .to_string();
    match out.exit_code {
        1 => {
            assert!(out.stdout.ends_with('\n') && out.stdout.matches('\n').count() == 1);
            let e: Value = serde_json::from_str(&out.stdout).expect("the error is JSON");
            assert!(e["cniVersion"].is_string(), "{e}");
            assert!(e["code"].is_u64(), "{e}");
            assert!(e["msg"].is_string(), "{e}");
        }
        0 => match command.as_str() {
            "VERSION" => {
                let v: Value = serde_json::from_str(&out.stdout).expect("VERSION is JSON");
                assert!(v["supportedVersions"].is_array());
            }
            "ADD" => {
                let v: Value = serde_json::from_str(&out.stdout).expect("ADD's result is JSON");
                assert!(v["cniVersion"].is_string(), "{v}");
            }
            _ => assert_eq!(out.stdout, "", "{command} printed something"),
        },
        other => panic!("exit status {other}"),
    }
    // What reached the agent.
    let got = fake.got.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(got.len() <= 1, "more than one call to the agent");
    if let Some(line) = got.first() {
        assert!(line.ends_with(b"\n") && !line[..line.len() - 1].contains(&b'\n'));
        let req: CniRequest = serde_json::from_slice(line).expect("the request decodes");
        assert_eq!(
            serde_json::to_value(req.command).expect("json"),
            json!(command),
            "the command forwarded"
        );
        let var = |k: &str| env.get(k).and_then(|v| v.to_str()).unwrap_or_default();
        if matches!(command.as_str(), "ADD" | "DEL" | "CHECK") {
            assert_eq!(req.container_id, var("CNI_CONTAINERID"));
            assert_eq!(req.ifname, var("CNI_IFNAME"));
        }
        assert!(req.config.is_object());
    }
}
