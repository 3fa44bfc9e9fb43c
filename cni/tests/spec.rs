//! Spec tests: the BUILT `oxvs-cni` binary invoked exactly as a container
//! runtime does (a cleared environment with only the `CNI_*` variables,
//! the network configuration on stdin, stdout and exit status read back),
//! against a fake agent: a thread listening on a Unix socket in a temporary
//! directory that records each request and answers with a canned line.
//!
//! ADD and CHECK need a real network namespace (the plugin checks that
//! `CNI_NETNS` exists and is not its own): [`TestNetns`] runs
//! `unshare --net sleep 60` and uses `/proc/PID/ns/net`; its Drop kills the
//! child, so nothing is left behind (and the sleep ends by itself anyway).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_oxvs-cni");
const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// What the fake agent does with a connection.
#[derive(Clone)]
enum Reply {
    /// Reads the request line, writes this line back, closes.
    Line(String),
    /// Reads the request line, then holds the connection without answering.
    Silent,
}

struct FakeAgent {
    _dir: tempfile::TempDir,
    path: PathBuf,
    requests: Arc<Mutex<Vec<Value>>>,
}

impl FakeAgent {
    fn start(reply: Reply) -> FakeAgent {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cni.sock");
        let listener = UnixListener::bind(&path).expect("bind fake agent");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let rec = requests.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let mut line = Vec::new();
                if BufReader::new(&conn).read_until(b'\n', &mut line).is_err() {
                    continue;
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                    rec.lock().unwrap().push(v);
                }
                match &reply {
                    Reply::Line(l) => {
                        let _ = (&conn).write_all(l.as_bytes());
                        let _ = (&conn).write_all(b"\n");
                    }
                    Reply::Silent => std::thread::sleep(Duration::from_secs(5)),
                }
            }
        });
        FakeAgent {
            _dir: dir,
            path,
            requests,
        }
    }

    fn ok(result: Option<Value>) -> FakeAgent {
        let mut r = json!({"v": 1, "ok": true});
        if let Some(res) = result {
            r["result"] = res;
        }
        FakeAgent::start(Reply::Line(r.to_string()))
    }

    fn socket(&self) -> &str {
        self.path.to_str().expect("utf-8 tempdir")
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// A network namespace held by a child process.
struct TestNetns {
    child: Child,
    path: String,
}

impl TestNetns {
    fn new() -> TestNetns {
        let child = Command::new("unshare")
            .args(["--net", "sleep", "60"])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn unshare --net (needs root)");
        let own = std::fs::metadata("/proc/self/ns/net")
            .expect("own netns")
            .ino();
        let path = format!("/proc/{}/ns/net", child.id());
        let mut ns = TestNetns { child, path };
        let t0 = Instant::now();
        loop {
            if let Ok(m) = std::fs::metadata(&ns.path) {
                if m.ino() != own {
                    return ns;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "unshare --net did not make a namespace"
            );
            if let Ok(Some(st)) = ns.child.try_wait() {
                panic!("unshare exited early: {st}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {:?} / {}",
                self.stdout, self.stderr
            )
        })
    }

    /// Asserts a CNI error with `code` and returns the error JSON.
    fn err(&self, code: u64) -> Value {
        assert_eq!(self.code, 1, "exit status; stdout {}", self.stdout);
        let j = self.json();
        assert_eq!(j["code"], code, "{j}");
        assert!(j["msg"].as_str().is_some_and(|m| !m.is_empty()), "{j}");
        assert!(j["cniVersion"].is_string(), "{j}");
        j
    }

    fn ok_silent(&self) {
        assert_eq!(
            (self.code, self.stdout.as_str()),
            (0, ""),
            "stderr: {}",
            self.stderr
        );
    }
}

/// Runs the plugin with only `env` set and `stdin` on standard input.
fn invoke(env: &[(&str, &str)], stdin: &str) -> Out {
    let mut child = Command::new(BIN)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn oxvs-cni");
    {
        let mut si = child.stdin.take().expect("stdin");
        // The plugin may exit before reading (env errors): ignore EPIPE.
        let _ = si.write_all(stdin.as_bytes());
    }
    let out = child.wait_with_output().expect("wait");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn conf(version: &str, socket: &str) -> Value {
    json!({"cniVersion": version, "name": "pods", "type": "oxvs", "agentSocket": socket})
}

/// The environment of ADD/CHECK/DEL.
fn env_for<'a>(cmd: &'a str, netns: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("CNI_COMMAND", cmd),
        ("CNI_CONTAINERID", "0123456789abcdef"),
        ("CNI_NETNS", netns),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0",
        ),
    ]
}

fn env_path_only(cmd: &str) -> Vec<(&str, &str)> {
    vec![("CNI_COMMAND", cmd), ("CNI_PATH", "/opt/cni/bin")]
}

/// What the agent answers to ADD, in the 1.1.0 shape.
fn agent_result(netns: &str) -> Value {
    json!({
        "interfaces": [
            {"name": "oxvs-web0-1a2b", "mac": "aa:bb:cc:00:00:01", "mtu": 1450},
            {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "mtu": 1450, "sandbox": netns}
        ],
        "ips": [{"address": "10.244.0.5/24", "gateway": "10.244.0.1", "interface": 1}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.0.1"}]
    })
}

// ---------------------------------------------------------------- ADD

#[test]
fn add_result_shape_per_version() {
    let ns = TestNetns::new();
    for v in VERSIONS {
        let agent = FakeAgent::ok(Some(agent_result(&ns.path)));
        let mut c = conf(v, agent.socket());
        c["someVendorKey"] = json!({"nested": [1, 2]});
        c["runtimeConfig"] = json!({"portMappings": []});
        let out = invoke(&env_for("ADD", &ns.path), &c.to_string());
        assert_eq!(out.code, 0, "{v}: {} {}", out.stdout, out.stderr);
        let r = out.json();
        assert_eq!(r["cniVersion"], v);
        let ip = &r["ips"][0];
        assert_eq!(ip["address"], "10.244.0.5/24");
        assert_eq!(ip["gateway"], "10.244.0.1");
        assert_eq!(ip["interface"], 1);
        assert_eq!(
            r["interfaces"][ip["interface"].as_u64().unwrap() as usize]["name"],
            "eth0"
        );
        assert_eq!(r["interfaces"][1]["sandbox"], ns.path.as_str());
        if v.starts_with("0.") {
            assert_eq!(ip["version"], "4", "{v}: {r}");
        } else {
            assert!(ip.get("version").is_none(), "{v}: {r}");
        }
        if v == "1.1.0" {
            assert_eq!(r["interfaces"][1]["mtu"], 1450);
        } else {
            assert!(r["interfaces"][1].get("mtu").is_none(), "{v}: {r}");
        }
        // What reached the agent: the call, and the config unchanged.
        let reqs = agent.requests();
        assert_eq!(reqs.len(), 1);
        let q = &reqs[0];
        assert_eq!(q["v"], 1);
        assert_eq!(q["command"], "ADD");
        assert_eq!(q["container_id"], "0123456789abcdef");
        assert_eq!(q["netns"], ns.path.as_str());
        assert_eq!(q["ifname"], "eth0");
        assert_eq!(q["args"]["K8S_POD_NAME"], "web-0");
        assert_eq!(q["args"]["K8S_POD_NAMESPACE"], "default");
        assert_eq!(q["args"]["IgnoreUnknown"], "1");
        assert_eq!(q["config"], c, "config must reach the agent unchanged");
    }
}

#[test]
fn add_ipv6_version_field() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(Some(json!({
        "interfaces": [{"name": "eth0", "sandbox": ns.path}],
        "ips": [{"address": "fd00:10::5/64", "interface": 0}]
    })));
    let out = invoke(
        &env_for("ADD", &ns.path),
        &conf("0.4.0", agent.socket()).to_string(),
    );
    assert_eq!(out.json()["ips"][0]["version"], "6", "{}", out.stdout);
}

#[test]
fn add_agent_answer_without_result_is_an_error() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(None);
    let out = invoke(
        &env_for("ADD", &ns.path),
        &conf("1.1.0", agent.socket()).to_string(),
    );
    out.err(6);
}

// ------------------------------------------------------------ chaining

fn prev_040() -> Value {
    json!({
        "cniVersion": "0.4.0",
        "interfaces": [{"name": "lo"}, {"name": "net0", "mac": "aa:aa:aa:aa:aa:aa", "sandbox": "/x"}],
        "ips": [{"version": "4", "address": "192.168.5.2/24", "gateway": "192.168.5.1", "interface": 1}],
        "routes": [{"dst": "192.168.0.0/16", "gw": "192.168.5.1"}],
        "dns": {"nameservers": ["192.168.5.1"]}
    })
}

fn prev_100() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "lo"}, {"name": "net0", "mac": "aa:aa:aa:aa:aa:aa", "sandbox": "/x"}],
        "ips": [{"address": "192.168.5.2/24", "gateway": "192.168.5.1", "interface": 1}],
        "routes": [{"dst": "192.168.0.0/16", "gw": "192.168.5.1"}],
        "dns": {"nameservers": ["192.168.5.1"]}
    })
}

#[test]
fn add_merges_prev_result() {
    let ns = TestNetns::new();
    for (prev, version) in [
        (prev_040(), "0.4.0"),
        (prev_100(), "1.0.0"),
        (prev_040(), "1.1.0"),
        (prev_100(), "0.3.1"),
    ] {
        let agent = FakeAgent::ok(Some(agent_result(&ns.path)));
        let mut c = conf(version, agent.socket());
        c["prevResult"] = prev.clone();
        let out = invoke(&env_for("ADD", &ns.path), &c.to_string());
        assert_eq!(out.code, 0, "{}", out.stdout);
        let r = out.json();
        assert_eq!(r["cniVersion"], version);
        let names: Vec<&str> = r["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["lo", "net0", "oxvs-web0-1a2b", "eth0"], "{r}");
        let ips = r["ips"].as_array().unwrap();
        assert_eq!(ips.len(), 2);
        assert_eq!(ips[0]["address"], "192.168.5.2/24");
        assert_eq!(ips[0]["interface"], 1);
        assert_eq!(ips[1]["address"], "10.244.0.5/24");
        assert_eq!(ips[1]["interface"], 3, "oxvs's eth0 index re-based: {r}");
        for ip in ips {
            assert_eq!(
                ip.get("version").is_some(),
                version.starts_with("0."),
                "{r}"
            );
        }
        assert_eq!(r["routes"].as_array().unwrap().len(), 2);
        assert_eq!(r["dns"]["nameservers"][0], "192.168.5.1");
        // The agent saw the prevResult unchanged.
        assert_eq!(agent.requests()[0]["config"]["prevResult"], prev);
    }
}

#[test]
fn add_with_undecodable_prev_result_is_code_6() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(Some(agent_result(&ns.path)));
    let mut c = conf("1.0.0", agent.socket());
    c["prevResult"] = json!({"ips": [{"address": "not-an-ip"}]});
    let j = invoke(&env_for("ADD", &ns.path), &c.to_string()).err(6);
    assert!(j["msg"].as_str().unwrap().contains("prevResult"), "{j}");
    assert!(agent.requests().is_empty(), "nothing forwarded");
}

// ----------------------------------------------------- DEL, CHECK, GC, STATUS

#[test]
fn del_succeeds_silently_even_without_netns() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(None);
    let mut c = conf("1.1.0", agent.socket());
    c["prevResult"] = prev_100();
    invoke(&env_for("DEL", &ns.path), &c.to_string()).ok_silent();
    // containerd: DEL with an empty netns after the sandbox is gone.
    let mut env = env_for("DEL", "");
    env.retain(|(k, _)| *k != "CNI_NETNS");
    invoke(&env, &c.to_string()).ok_silent();
    invoke(&env_for("DEL", ""), &c.to_string()).ok_silent();
    invoke(
        &env_for("DEL", "/run/netns/oxvs-gone-for-good"),
        &c.to_string(),
    )
    .ok_silent();
    let reqs = agent.requests();
    assert_eq!(reqs.len(), 4);
    assert!(reqs.iter().all(|q| q["command"] == "DEL"));
    assert_eq!(reqs[1]["netns"], "");
    assert_eq!(reqs[0]["config"]["prevResult"], prev_100());
}

#[test]
fn del_in_the_plugins_own_netns_is_refused() {
    let agent = FakeAgent::ok(None);
    let j = invoke(
        &env_for("DEL", "/proc/self/ns/net"),
        &conf("1.1.0", agent.socket()).to_string(),
    )
    .err(8);
    assert!(j["msg"].as_str().unwrap().contains("CNI_NETNS"));
    assert!(agent.requests().is_empty());
}

#[test]
fn check_forwards_prev_result_unchanged() {
    let ns = TestNetns::new();
    for v in ["0.4.0", "1.0.0", "1.1.0"] {
        let agent = FakeAgent::ok(None);
        let mut c = conf(v, agent.socket());
        c["prevResult"] = prev_040();
        invoke(&env_for("CHECK", &ns.path), &c.to_string()).ok_silent();
        let q = &agent.requests()[0];
        assert_eq!(q["command"], "CHECK");
        assert_eq!(q["config"]["prevResult"], prev_040());
    }
}

#[test]
fn check_with_old_versions_is_refused() {
    let ns = TestNetns::new();
    for v in ["0.3.0", "0.3.1"] {
        let agent = FakeAgent::ok(None);
        let j = invoke(
            &env_for("CHECK", &ns.path),
            &conf(v, agent.socket()).to_string(),
        )
        .err(1);
        assert_eq!(j["msg"], "config version does not allow CHECK");
        assert_eq!(j["cniVersion"], v);
        assert!(agent.requests().is_empty());
    }
}

#[test]
fn gc_forwards_valid_attachments() {
    let agent = FakeAgent::ok(None);
    let mut c = conf("1.1.0", agent.socket());
    let valid = json!([{"containerID": "abc", "ifname": "eth0"}]);
    c["cni.dev/valid-attachments"] = valid.clone();
    c["cni.dev/attachments"] = valid.clone();
    invoke(&env_path_only("GC"), &c.to_string()).ok_silent();
    let q = &agent.requests()[0];
    assert_eq!(q["command"], "GC");
    assert_eq!(q["container_id"], "");
    assert_eq!(q["config"]["cni.dev/valid-attachments"], valid);
    // A malformed list never reaches the agent.
    c["cni.dev/valid-attachments"] = json!({"abc": "eth0"});
    invoke(&env_path_only("GC"), &c.to_string()).err(7);
    assert_eq!(agent.requests().len(), 1);
}

#[test]
fn status_succeeds_silently() {
    let agent = FakeAgent::ok(None);
    invoke(
        &env_path_only("STATUS"),
        &conf("1.1.0", agent.socket()).to_string(),
    )
    .ok_silent();
    assert_eq!(agent.requests()[0]["command"], "STATUS");
}

#[test]
fn gc_and_status_need_1_1_0() {
    for cmd in ["GC", "STATUS"] {
        for v in ["0.4.0", "1.0.0"] {
            let agent = FakeAgent::ok(None);
            let j = invoke(&env_path_only(cmd), &conf(v, agent.socket()).to_string()).err(1);
            assert_eq!(j["msg"], format!("config version does not allow {cmd}"));
            assert!(agent.requests().is_empty());
        }
    }
}

// ------------------------------------------------------------- VERSION

#[test]
fn version_answers_without_agent() {
    let out = invoke(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
    assert_eq!(out.code, 0);
    assert_eq!(
        out.json(),
        json!({"cniVersion": "1.0.0", "supportedVersions": VERSIONS})
    );
    let out = invoke(&[("CNI_COMMAND", "VERSION")], "");
    assert_eq!(out.code, 0);
    assert_eq!(out.json()["cniVersion"], "1.1.0");
    assert_eq!(out.json()["supportedVersions"], json!(VERSIONS));
}

// ------------------------------------------------------- environment

#[test]
fn every_required_variable_missing_in_turn() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(Some(agent_result(&ns.path)));
    let cases: [(&str, &[&str]); 5] = [
        (
            "ADD",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
        ),
        (
            "CHECK",
            &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
        ),
        ("DEL", &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"]),
        ("GC", &["CNI_PATH"]),
        ("STATUS", &["CNI_PATH"]),
    ];
    let c = conf("1.1.0", agent.socket()).to_string();
    for (cmd, required) in cases {
        for missing in required {
            for how in ["unset", "empty"] {
                let mut env = env_for(cmd, &ns.path);
                if how == "unset" {
                    env.retain(|(k, _)| k != missing);
                } else {
                    for (k, v) in env.iter_mut() {
                        if k == missing {
                            *v = "";
                        }
                    }
                }
                let j = invoke(&env, &c).err(4);
                let msg = j["msg"].as_str().unwrap();
                assert!(
                    msg.contains(missing),
                    "{cmd} without {missing} ({how}): {msg}"
                );
            }
        }
    }
    let j = invoke(&[], &c).err(4);
    assert!(j["msg"].as_str().unwrap().contains("CNI_COMMAND"));
    assert!(agent.requests().is_empty(), "no call may reach the agent");
}

#[test]
fn unknown_command_is_code_4() {
    let j = invoke(&[("CNI_COMMAND", "UPDATE"), ("CNI_PATH", "/x")], "{}").err(4);
    assert!(j["msg"].as_str().unwrap().contains("UPDATE"));
}

#[test]
fn invalid_ifname() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(Some(agent_result(&ns.path)));
    let c = conf("1.1.0", agent.socket()).to_string();
    for bad in ["eth0123456789012", "a/b", "..", "a b"] {
        for cmd in ["ADD", "DEL", "CHECK"] {
            let mut env = env_for(cmd, &ns.path);
            env[3] = ("CNI_IFNAME", bad);
            let j = invoke(&env, &c).err(4);
            let msg = j["msg"].as_str().unwrap();
            assert!(msg.contains("CNI_IFNAME") && msg.contains(bad), "{msg}");
        }
    }
    // 15 bytes is the limit, and allowed.
    let mut env = env_for("ADD", &ns.path);
    env[3] = ("CNI_IFNAME", "eth012345678901");
    assert_eq!(invoke(&env, &c).code, 0);
}

#[test]
fn invalid_container_id() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(None);
    let mut env = env_for("DEL", &ns.path);
    env[1] = ("CNI_CONTAINERID", "../../etc");
    let j = invoke(&env, &conf("1.1.0", agent.socket()).to_string()).err(4);
    assert!(j["msg"].as_str().unwrap().contains("CNI_CONTAINERID"));
}

#[test]
fn netns_that_does_not_exist() {
    let agent = FakeAgent::ok(Some(json!({})));
    for cmd in ["ADD", "CHECK"] {
        let path = "/run/netns/oxvs-cni-test-does-not-exist";
        let j = invoke(
            &env_for(cmd, path),
            &conf("1.1.0", agent.socket()).to_string(),
        )
        .err(4);
        let msg = j["msg"].as_str().unwrap();
        assert!(msg.contains("CNI_NETNS") && msg.contains(path), "{msg}");
        // A plain file is not a namespace either.
        let j = invoke(
            &env_for(cmd, "/etc/hostname"),
            &conf("1.1.0", agent.socket()).to_string(),
        )
        .err(4);
        assert!(j["msg"]
            .as_str()
            .unwrap()
            .contains("not a network namespace"));
    }
    assert!(agent.requests().is_empty());
}

#[test]
fn cni_args_parsing() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(None);
    let c = conf("1.1.0", agent.socket()).to_string();
    let mut env = env_for("DEL", &ns.path);
    env[5] = ("CNI_ARGS", "A=1;B=;K8S_POD_UID=1234-5678;");
    invoke(&env, &c).ok_silent();
    assert_eq!(
        agent.requests()[0]["args"],
        json!({"A": "1", "B": "", "K8S_POD_UID": "1234-5678"})
    );
    for bad in ["A", "A=1;=2", "A=1=2"] {
        env[5] = ("CNI_ARGS", bad);
        let j = invoke(&env, &c).err(4);
        assert!(j["msg"].as_str().unwrap().contains("CNI_ARGS"), "{j}");
    }
    assert_eq!(agent.requests().len(), 1);
}

// --------------------------------------------------------- configuration

#[test]
fn unsupported_versions_are_code_1() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(None);
    for v in ["0.1.0", "0.2.0", "1.2.0", "2.0.0", "latest"] {
        let j = invoke(
            &env_for("ADD", &ns.path),
            &conf(v, agent.socket()).to_string(),
        )
        .err(1);
        let text = format!("{} {}", j["msg"], j["details"]);
        assert!(text.contains(v), "{j}");
        for s in VERSIONS {
            assert!(text.contains(s), "supported {s} listed: {j}");
        }
    }
    assert!(agent.requests().is_empty());
}

#[test]
fn malformed_and_non_object_stdin() {
    let ns = TestNetns::new();
    for stdin in ["", "{", "{\"cniVersion\":", "not json", "\u{0}"] {
        invoke(&env_for("ADD", &ns.path), stdin).err(6);
    }
    for stdin in ["[]", "\"1.1.0\"", "42", "null", "true"] {
        let j = invoke(&env_for("ADD", &ns.path), stdin).err(6);
        assert!(j["msg"].as_str().unwrap().contains("object"), "{j}");
    }
}

#[test]
fn missing_name_is_code_7() {
    let ns = TestNetns::new();
    let agent = FakeAgent::ok(None);
    let mut c = conf("1.0.0", agent.socket());
    c.as_object_mut().unwrap().remove("name");
    let j = invoke(&env_for("ADD", &ns.path), &c.to_string()).err(7);
    assert!(j["msg"].as_str().unwrap().contains("name"));
    assert_eq!(j["cniVersion"], "1.0.0");
}

#[test]
fn wrong_types_of_oxvs_keys_are_code_7() {
    let ns = TestNetns::new();
    for (k, v) in [
        ("agentSocket", json!(5)),
        ("agentTimeoutSeconds", json!("10")),
        ("agentTimeoutSeconds", json!(-2)),
        ("type", json!("bridge")),
    ] {
        let mut c = conf("1.1.0", "/nonexistent.sock");
        c[k] = v;
        let j = invoke(&env_for("ADD", &ns.path), &c.to_string()).err(7);
        let msg = j["msg"].as_str().unwrap();
        assert!(
            msg.contains(k) || k == "type" && msg.contains("bridge"),
            "{msg}"
        );
    }
}

// ----------------------------------------------------------------- agent

#[test]
fn agent_absent() {
    let ns = TestNetns::new();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("no-agent.sock");
    let sock = sock.to_str().unwrap();
    for cmd in ["ADD", "DEL", "CHECK"] {
        let j = invoke(&env_for(cmd, &ns.path), &conf("1.1.0", sock).to_string()).err(11);
        let msg = j["msg"].as_str().unwrap();
        assert!(msg.contains("not reachable") && msg.contains(sock), "{msg}");
    }
    invoke(&env_path_only("GC"), &conf("1.1.0", sock).to_string()).err(11);
    let j = invoke(&env_path_only("STATUS"), &conf("1.1.0", sock).to_string()).err(50);
    assert!(j["msg"].as_str().unwrap().contains(sock));
    // A socket file nobody listens on: connection refused, same answer.
    let dead = dir.path().join("dead.sock");
    drop(UnixListener::bind(&dead).unwrap());
    let dead = dead.to_str().unwrap();
    invoke(&env_for("ADD", &ns.path), &conf("1.1.0", dead).to_string()).err(11);
    invoke(&env_path_only("STATUS"), &conf("1.1.0", dead).to_string()).err(50);
}

#[test]
fn agent_timeout() {
    let ns = TestNetns::new();
    let agent = FakeAgent::start(Reply::Silent);
    let mut c = conf("1.1.0", agent.socket());
    c["agentTimeoutSeconds"] = json!(0.3);
    let t0 = Instant::now();
    let j = invoke(&env_for("ADD", &ns.path), &c.to_string()).err(11);
    assert!(t0.elapsed() < Duration::from_secs(3), "deadline honoured");
    assert!(j["msg"].as_str().unwrap().contains(agent.socket()), "{j}");
    let j = invoke(&env_path_only("STATUS"), &c.to_string()).err(50);
    assert!(j["msg"].as_str().unwrap().contains("did not answer"), "{j}");
}

#[test]
fn agent_errors_pass_through() {
    let ns = TestNetns::new();
    let agent = FakeAgent::start(Reply::Line(
        json!({"v": 1, "ok": false, "error": {"code": 101, "msg": "no free address in 10.244.0.0/24", "details": "254 allocated"}})
            .to_string(),
    ));
    let j = invoke(
        &env_for("ADD", &ns.path),
        &conf("0.4.0", agent.socket()).to_string(),
    )
    .err(101);
    assert_eq!(
        j,
        json!({"cniVersion": "0.4.0", "code": 101, "msg": "no free address in 10.244.0.0/24", "details": "254 allocated"})
    );
    let agent = FakeAgent::start(Reply::Line(
        json!({"v": 1, "ok": false, "error": {"code": 50, "msg": "switch not connected"}})
            .to_string(),
    ));
    let j = invoke(
        &env_path_only("STATUS"),
        &conf("1.1.0", agent.socket()).to_string(),
    )
    .err(50);
    assert_eq!(
        j,
        json!({"cniVersion": "1.1.0", "code": 50, "msg": "switch not connected"})
    );
}
