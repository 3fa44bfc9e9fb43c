//! End-to-end with a real container runtime as the caller: containerd's
//! `ctr run --cni` (through `../shared/tools/ctr-cni.sh`) runs busybox
//! containers whose network is the oxvs conflist (oxvs, then the reference
//! `portmap` plugin, so libcni chains them with prevResult).
//!
//! ctr runs the plugin in the root network namespace, so this test's
//! switchd and agent run there too, with a uniquely named gateway and a
//! pod CIDR no other test uses; both (and so the gateway and its route) go
//! when the test ends. Container traffic stays between the containers.

#[path = "../../switch/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{oxvsctl, unique, workspace_bin, Bg};

fn tools_dir() -> Option<PathBuf> {
    oxvs_testutil::shared_tools_dir("ctr-cni.sh")
}

struct Host {
    agent: Option<Bg>,
    switchd: Option<Bg>,
    dir: PathBuf,
    tools: PathBuf,
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new(self.tools.join("ctr-cni.sh"))
            .arg("stop")
            .output();
        if let Some(mut a) = self.agent.take() {
            if std::thread::panicking() {
                eprintln!("--- agent ---\n{}", a.stderr_text());
            }
            a.terminate(Duration::from_secs(5));
        }
        if let Some(mut s) = self.switchd.take() {
            if std::thread::panicking() {
                eprintln!("--- switchd ---\n{}", s.stderr_text());
            }
            s.terminate(Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn ctr_run(tools: &Path, env: &[(&str, String)], name: &str, cmd: &[&str]) -> Command {
    let mut c = Command::new(tools.join("ctr-cni.sh"));
    c.arg("run").arg(name).arg("--").args(cmd);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

#[test]
fn containerd_runs_two_containers_that_reach_each_other_and_cleans_up() {
    skip_unless_capable!();
    let Some(tools) = tools_dir() else {
        oxvs_testutil::skip_or_fail("../shared/tools/ctr-cni.sh not found (set OXVS_SHARED_TOOLS)");
        return;
    };
    let dir = std::env::temp_dir().join(unique("ctr"));
    let conf = dir.join("net.d");
    let bin = dir.join("bin");
    let shared = dir.join("shared");
    for d in [&conf, &bin, &shared] {
        std::fs::create_dir_all(d).expect("temp dirs");
    }
    let mut host = Host {
        agent: None,
        switchd: None,
        dir: dir.clone(),
        tools: tools.clone(),
    };
    let gw = format!("oxct{}", std::process::id() % 100_000);
    let sw_sock = dir.join("sw.sock");
    let cni_sock = dir.join("cni.sock");
    host.switchd = Some(Bg::spawn(
        None,
        &[
            &workspace_bin("oxvs-switchd").to_string_lossy(),
            "--socket",
            &sw_sock.to_string_lossy(),
            "--gateway",
            &gw,
        ],
    ));
    wait_for("switchd", 10, || {
        oxvsctl(&sw_sock, &["show"]).status.success()
    });
    host.agent = Some(Bg::spawn(
        None,
        &[
            &workspace_bin("oxvs-agent").to_string_lossy(),
            "--pod-cidr",
            "10.231.250.0/24",
            "--cni-socket",
            &cni_sock.to_string_lossy(),
            "--switchd-socket",
            &sw_sock.to_string_lossy(),
            "--state-dir",
            &dir.join("state").to_string_lossy(),
            "--gateway",
            &gw,
            "--mtu",
            "1450",
        ],
    ));
    wait_for("agent socket", 10, || cni_sock.exists());

    std::os::unix::fs::symlink(workspace_bin("oxvs-cni"), bin.join("oxvs")).expect("symlink");
    std::os::unix::fs::symlink("/usr/lib/cni/portmap", bin.join("portmap")).expect("symlink");
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "oxvs-ctr-test",
        "plugins": [
            {"type": "oxvs", "agentSocket": cni_sock},
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    std::fs::write(conf.join("10-oxvs.conflist"), conflist.to_string()).expect("conflist");
    let env = vec![
        ("OXVS_CNI_CONF_DIR", conf.to_string_lossy().into_owned()),
        ("OXVS_CNI_BIN_DIR", bin.to_string_lossy().into_owned()),
        ("OXVS_CTR_TIMEOUT", "40".to_string()),
        (
            "OXVS_CTR_RUN_ARGS",
            format!(
                "--mount type=bind,src={},dst=/x,options=rbind",
                shared.display()
            ),
        ),
    ];
    let a_name = unique("a");
    let b_name = unique("b");
    let mut a = ctr_run(
        &tools,
        &env,
        &a_name,
        &["sh", "-c", "ip -4 -o addr show eth0 > /x/a.ip; sleep 20"],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("ctr-cni.sh run a");
    // The first run may build the busybox image: allow time.
    let ip_file = shared.join("a.ip");
    let deadline = Instant::now() + Duration::from_secs(600);
    while !ip_file.exists()
        || std::fs::read_to_string(&ip_file)
            .unwrap_or_default()
            .is_empty()
    {
        if let Ok(Some(st)) = a.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = a.stderr.take() {
                use std::io::Read as _;
                let _ = e.read_to_string(&mut err);
            }
            panic!("container a exited early ({st}):\n{err}");
        }
        assert!(Instant::now() < deadline, "container a did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    let line = std::fs::read_to_string(&ip_file).unwrap_or_default();
    let a_ip = line
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|c| c.split('/').next())
        .unwrap_or_default()
        .to_string();
    assert!(
        a_ip.starts_with("10.231.250."),
        "container a's address: {line}"
    );
    let b = ctr_run(
        &tools,
        &env,
        &b_name,
        &[
            "sh",
            "-c",
            &format!("ip -4 -o addr show eth0; ping -c 3 -W 2 {a_ip}"),
        ],
    )
    .output()
    .expect("ctr-cni.sh run b");
    let b_out =
        String::from_utf8_lossy(&b.stdout).into_owned() + &String::from_utf8_lossy(&b.stderr);
    assert!(
        b.status.success(),
        "container b could not ping a ({a_ip}):\n{b_out}"
    );
    assert!(b_out.contains("3 packets received"), "{b_out}");
    let _ = a.wait();
    // ctr DELs (with an empty netns) after each task exits: all gone.
    wait_for("the pods' ports to go", 15, || {
        let out = oxvsctl(&sw_sock, &["--json", "dump-ports"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v["ports"].as_array().map(Vec::len))
            == Some(1)
    });
    let records = std::fs::read_dir(dir.join("state/pods"))
        .map(|r| r.count())
        .unwrap_or(0);
    assert_eq!(records, 0, "attachment records left");
}
