//! A node for the agent's end-to-end tests: a network namespace holding
//! oxvs-switchd (with its gateway) and oxvs-agent, and pods made by calling
//! the real `oxvs-cni` binary exactly as a container runtime does (env +
//! stdin, from the node's namespace).
//!
//! Everything is owned by guards: the node namespace (and so the gateway,
//! the pods' host ends and every process in it) goes on drop; each pod's
//! namespace is its own [`Netns`]. Names are unique per process and call.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{unique, workspace_bin, Bg, Netns, Switchd};

/// A directory removed (with its contents) on drop.
pub struct RmDir(pub PathBuf);

impl Drop for RmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The gateway interface inside every test node.
pub const GW: &str = "oxgw0";

pub struct Node {
    pub sw: Switchd,
    agent: Option<Bg>,
    /// Extra agent flags (e.g. `--manifests DIR`), kept across restarts.
    extra: Vec<String>,
    /// Whether the agent gets `--mtu 1450` (else it sizes the MTU itself).
    fixed_mtu: bool,
    pub dir: PathBuf,
    pub cidr: String,
    // Dropped last: the namespace takes the processes and links with it.
    pub ns: Netns,
}

/// What one plugin call gave.
#[derive(Debug)]
pub struct CniOut {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
    pub json: Value,
}

impl CniOut {
    pub fn code(&self) -> u64 {
        self.json.get("code").and_then(Value::as_u64).unwrap_or(0)
    }
    pub fn msg(&self) -> String {
        self.json
            .get("msg")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }
}

pub struct Pod {
    pub cid: String,
    pub ip: String,
    pub result: Value,
    pub ns: Netns,
}

impl Pod {
    pub fn netns_path(&self) -> String {
        format!("/var/run/netns/{}", self.ns.name)
    }
}

impl Node {
    /// Starts switchd (with gateway `oxgw0`) and the agent for `cidr`.
    pub fn start(tag: &str, cidr: &str) -> Node {
        Node::start_with(tag, cidr, &[])
    }

    /// [`Node::start`] with extra agent flags (kept across restarts).
    pub fn start_with(tag: &str, cidr: &str, extra: &[&str]) -> Node {
        Node::start_prepared(tag, cidr, extra, true, |_| {})
    }

    /// [`Node::start_with`], `prepare` run in the node's namespace before
    /// switchd and the agent start (links, addresses); without
    /// `fixed_mtu` the agent gets no `--mtu`.
    pub fn start_prepared(
        tag: &str,
        cidr: &str,
        extra: &[&str],
        fixed_mtu: bool,
        prepare: impl FnOnce(&Netns),
    ) -> Node {
        let ns = Netns::new(tag);
        prepare(&ns);
        let dir = std::env::temp_dir().join(unique("agent"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let sw = Switchd::start_with(&ns, &["--gateway", GW]);
        let mut node = Node {
            sw,
            agent: None,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            fixed_mtu,
            dir,
            cidr: cidr.to_string(),
            ns,
        };
        node.start_agent();
        node
    }

    pub fn cni_socket(&self) -> String {
        self.dir.join("cni.sock").to_string_lossy().into_owned()
    }

    /// Starts the agent and waits until STATUS says it is ready.
    pub fn start_agent(&mut self) {
        let bin = workspace_bin("oxvs-agent");
        let bin = bin.to_string_lossy().into_owned();
        let sock = self.cni_socket();
        let sw = self.sw.sock.to_string_lossy().into_owned();
        let state = self.dir.join("state").to_string_lossy().into_owned();
        let mut args: Vec<&str> = vec![
            &bin,
            "--pod-cidr",
            &self.cidr,
            "--cni-socket",
            &sock,
            "--switchd-socket",
            &sw,
            "--state-dir",
            &state,
            "--gateway",
            GW,
            "--resync-interval",
            "1",
            "--log-level",
            "oxvs_agent=debug,info",
        ];
        if self.fixed_mtu {
            args.extend(["--mtu", "1450"]);
        }
        args.extend(self.extra.iter().map(String::as_str));
        let p = Bg::spawn(Some(&self.ns.name), &args);
        self.agent = Some(p);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let st = self.cni("STATUS", "", "", "", "", &self.config("1.1.0"));
            if st.ok {
                return;
            }
            let a = self.agent.as_mut().expect("just started");
            assert!(
                a.running(),
                "oxvs-agent exited at start-up:\n{}",
                a.stderr_text()
            );
            assert!(
                Instant::now() < deadline,
                "agent not ready within 20 s: {st:?}\n{}",
                a.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM to the agent; whether it exited cleanly.
    pub fn stop_agent(&mut self) -> bool {
        match self.agent.take() {
            Some(mut a) => a.terminate(Duration::from_secs(5)),
            None => true,
        }
    }

    pub fn agent_log(&self) -> String {
        self.agent
            .as_ref()
            .map(|a| a.stderr_text())
            .unwrap_or_default()
    }

    /// The network configuration for `version`.
    pub fn config(&self, version: &str) -> Value {
        json!({"cniVersion": version, "name": "oxvs-test", "type": "oxvs", "agentSocket": self.cni_socket()})
    }

    /// Runs `oxvs-cni` in the node's namespace as a runtime does.
    pub fn cni(
        &self,
        verb: &str,
        cid: &str,
        netns: &str,
        ifname: &str,
        args: &str,
        config: &Value,
    ) -> CniOut {
        run_plugin(
            &self.ns.name,
            &workspace_bin("oxvs-cni").to_string_lossy(),
            &[
                ("CNI_COMMAND", verb),
                ("CNI_CONTAINERID", cid),
                ("CNI_NETNS", netns),
                ("CNI_IFNAME", ifname),
                ("CNI_ARGS", args),
                ("CNI_PATH", "/usr/lib/cni"),
            ],
            config,
        )
    }

    /// ADD of container `cid`'s `eth0` in namespace `ns`, with `CNI_ARGS`
    /// `args`; the outcome, whatever it is.
    pub fn try_add(&self, cid: &str, ns: &Netns, args: &str) -> CniOut {
        let path = format!("/var/run/netns/{}", ns.name);
        self.cni("ADD", cid, &path, "eth0", args, &self.config("1.0.0"))
    }

    /// Makes a pod namespace and ADDs it; panics if ADD fails.
    pub fn add_pod(&self, name: &str) -> Pod {
        let ns = Netns::new(name);
        let cid = format!("{}-{}", ns.name, "c0");
        let out = self.try_add(
            &cid,
            &ns,
            &format!("K8S_POD_NAMESPACE=test;K8S_POD_NAME={name}"),
        );
        assert!(
            out.ok,
            "ADD {name} failed: {out:?}\n--- agent ---\n{}",
            self.agent_log()
        );
        let ip = out.json["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .expect("result has an address")
            .to_string();
        Pod {
            cid,
            ip,
            result: out.json,
            ns,
        }
    }

    /// DELs a pod (the namespace stays until the Pod drops).
    pub fn del_pod(&self, pod: &Pod) -> CniOut {
        self.cni(
            "DEL",
            &pod.cid,
            &pod.netns_path(),
            "eth0",
            "",
            &self.config("1.0.0"),
        )
    }

    /// Interface names in the node's namespace.
    pub fn links(&self) -> Vec<String> {
        let out = self.ns.must(&["ip", "-o", "link", "show"]);
        out.lines()
            .filter_map(|l| l.split(':').nth(1))
            .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
            .collect()
    }

    /// Port names the switch has.
    pub fn ports(&self) -> Vec<String> {
        let out = self.sw.ctl_ok(&["--json", "dump-ports"]);
        let v: Value = serde_json::from_str(&out).expect("dump-ports --json");
        v["ports"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Number of flows in the switch.
    pub fn n_flows(&self) -> usize {
        let out = self.sw.ctl_ok(&["--json", "show"]);
        let v: Value = serde_json::from_str(&out).expect("show --json");
        v["n_flows"].as_u64().unwrap_or(0) as usize
    }

    /// IPAM records on disk (one file per allocated address, both
    /// families).
    pub fn ipam_records(&self) -> Vec<String> {
        let mut v = Vec::new();
        let root = self.dir.join("state/ipam");
        if let Ok(rd) = std::fs::read_dir(&root) {
            for sub in rd.flatten().filter(|e| e.path().is_dir()) {
                if let Ok(files) = std::fs::read_dir(sub.path()) {
                    for f in files.flatten() {
                        let n = f.file_name().to_string_lossy().into_owned();
                        if n.parse::<std::net::IpAddr>().is_ok() {
                            v.push(n);
                        }
                    }
                }
            }
        }
        v
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("OXVS_TEST_LOGS").is_some() {
            eprintln!("--- oxvs-agent log ---\n{}", self.agent_log());
            eprintln!("--- oxvs-switchd log (tail) ---\n{}", self.sw.log_tail(40));
        }
        self.stop_agent();
        self.sw.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a CNI plugin binary in namespace `ns` with exactly `env` (plus
/// PATH) and `config` on stdin.
pub fn run_plugin(ns: &str, bin: &str, env: &[(&str, &str)], config: &Value) -> CniOut {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, bin])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("run the plugin");
    let input = serde_json::to_vec(config).expect("config json");
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(&input);
    }
    let out = child.wait_with_output().expect("plugin output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    CniOut {
        ok: out.status.success(),
        json: serde_json::from_str(&stdout).unwrap_or(Value::Null),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
