//! Black-box: the real `oxvs-switchd` on a temporary socket, driven by the
//! real `oxvsctl`. No ports or namespaces: flows, dumps, traces, exit
//! codes, `--json`, the socket's life cycle.
//!
//! `oxvs-switchd` belongs to another package, so the first test to need it
//! runs `cargo build -p oxvs-switch --bin oxvs-switchd` (fast when up to
//! date) into the same target directory as `oxvsctl`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{ok, oxvsctl, stderr as err};

fn switchd_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let ctl = PathBuf::from(env!("CARGO_BIN_EXE_oxvsctl"));
        let dir = ctl.parent().expect("bin dir");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--quiet",
                "-p",
                "oxvs-switch",
                "--bin",
                "oxvs-switchd",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building oxvs-switchd failed");
        let bin = dir.join("oxvs-switchd");
        assert!(bin.exists(), "{} missing", bin.display());
        bin
    })
    .clone()
}

/// A running oxvs-switchd, killed (and its directory removed) on drop.
struct Switchd {
    child: Option<Child>,
    dir: PathBuf,
    sock: PathBuf,
}

impl Switchd {
    fn start(tag: &str) -> Switchd {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "oxvs-online-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let sock = dir.join("switchd.sock");
        let child = spawn_switchd(&sock);
        let mut d = Switchd {
            child: Some(child),
            dir,
            sock,
        };
        d.wait_ready();
        d
    }

    fn wait_ready(&mut self) {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) {
            if std::os::unix::net::UnixStream::connect(&self.sock).is_ok() {
                return;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("oxvs-switchd exited early: {st}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("oxvs-switchd did not create {}", self.sock.display());
    }

    fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_stdin(args, None)
    }

    fn ctl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut full = vec!["--socket", self.sock.to_str().expect("utf-8 path")];
        full.extend_from_slice(args);
        oxvsctl(&full, stdin)
    }

    fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_string_lossy().into_owned()
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                panic!("oxvs-switchd ignored SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Switchd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn_switchd(sock: &Path) -> Child {
    Command::new(switchd_bin())
        .args(["--socket", sock.to_str().unwrap(), "--log-level", "warn"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("oxvs-switchd runs")
}

const FLOWS: &str = "\
# Classifier: IP goes on, the rest is dropped
table=0, priority=10, ip actions=goto_table:10
table=0, priority=0 actions=drop
table=10, priority=5, tcp, tp_dst=80 actions=output:2
table=10, priority=0 actions=drop
";

#[test]
fn add_dump_delete_replace_round_trip() {
    let s = Switchd::start("flows");
    assert_eq!(ok(&s.ctl(&["dump-flows"])), "");
    let f = s.file("a.flows", FLOWS);
    assert_eq!(ok(&s.ctl(&["add-flows", &f])), "");
    let dump = ok(&s.ctl(&["dump-flows", "--no-stats"]));
    assert_eq!(
        dump,
        " priority=10,ip actions=goto_table:10\n priority=0 actions=drop\n table=10, priority=5,tcp,tp_dst=80 actions=output:2\n table=10, priority=0 actions=drop\n"
    );
    // With stats, names and a table filter by name.
    let d = ok(&s.ctl(&["dump-flows", "--names", "--table", "SpoofGuard"]));
    assert_eq!(d.lines().count(), 2, "{d}");
    assert!(d.starts_with(" cookie=0x0, duration="), "{d}");
    assert!(
        d.contains("table=SpoofGuard, n_packets=0, n_bytes=0"),
        "{d}"
    );
    // The same from stdin is idempotent; add-flow adds one.
    ok(&s.ctl_stdin(&["add-flows", "-"], Some(FLOWS)));
    ok(&s.ctl(&["add-flow", "table=20, priority=1, arp actions=drop"]));
    assert_eq!(ok(&s.ctl(&["dump-flows", "--no-stats"])).lines().count(), 5);
    // mod-flows, del-flows with and without --strict.
    ok(&s.ctl(&["mod-flows", "table=10,tcp actions=output:3"]));
    assert!(ok(&s.ctl(&["dump-flows", "--no-stats", "--table", "10"])).contains("actions=output:3"));
    ok(&s.ctl(&["del-flows", "--strict", "table=10,priority=0"]));
    ok(&s.ctl(&["del-flows", "table=20"]));
    assert_eq!(ok(&s.ctl(&["dump-flows", "--no-stats"])).lines().count(), 3);
    // replace-flows: exactly the file.
    let g = s.file("b.flows", "table=0 actions=drop\n");
    ok(&s.ctl(&["replace-flows", &g]));
    assert_eq!(ok(&s.ctl(&["dump-flows", "--no-stats"])), " actions=drop\n");
    ok(&s.ctl(&["del-flows"]));
    assert_eq!(ok(&s.ctl(&["dump-flows"])), "");
}

#[test]
fn a_file_with_one_bad_flow_changes_nothing() {
    let s = Switchd::start("atomic");
    let f = s.file("a.flows", FLOWS);
    ok(&s.ctl(&["add-flows", &f]));
    let before = ok(&s.ctl(&["dump-flows", "--no-stats"]));
    let bad = s.file(
        "bad.flows",
        "table=0 actions=drop\n\n# comment\ntable=1, nw_dts=10.0.0.1 actions=drop\n",
    );
    for cmd in ["add-flows", "replace-flows"] {
        let o = s.ctl(&[cmd, &bad]);
        assert_eq!(o.status.code(), Some(1), "{cmd}");
        assert_eq!(
            err(&o).trim(),
            format!("oxvsctl: {bad}:4:10: unknown keyword (token 'nw_dts')"),
            "{cmd}"
        );
    }
    // A table-level error names its line too.
    let bad2 = s.file(
        "bad2.flows",
        "table=1 actions=drop\ntable=5 actions=goto_table:1\n",
    );
    let o = s.ctl(&["add-flows", &bad2]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains(&format!("{bad2}:2:")), "{}", err(&o));
    assert_eq!(ok(&s.ctl(&["dump-flows", "--no-stats"])), before);
}

#[test]
fn trace_and_json() {
    let s = Switchd::start("trace");
    let f = s.file("a.flows", FLOWS);
    ok(&s.ctl(&["add-flows", &f]));
    let t = ok(&s.ctl(&[
        "trace",
        "--names",
        "in_port=1,tcp,nw_dst=10.0.0.2,tp_dst=80",
    ]));
    assert!(t.contains("goto_table:SpoofGuard"), "{t}");
    // The switch has no port at all: port 2 does not exist (OVS's words).
    assert!(t.contains(">> Nonexistent output port"), "{t}");
    assert!(t.trim_end().ends_with("Datapath actions: drop"), "{t}");
    let t = ok(&s.ctl(&["trace", "in_port=1,udp"]));
    assert!(t.trim_end().ends_with("Datapath actions: drop"), "{t}");
    // Offline trace: without --ports the ports are not known, and port 2
    // is sent to.
    let off = ok(&oxvsctl(
        &[
            "trace",
            "--flows",
            &f,
            "in_port=1,tcp,nw_dst=10.0.0.2,tp_dst=80",
        ],
        None,
    ));
    assert!(off.contains("Datapath actions: 2"), "{off}");
    // With the switch's ports (none but one that is not 2), the same
    // trace as the switch's own.
    let off = ok(&oxvsctl(
        &[
            "trace",
            "--ports",
            "1",
            "--flows",
            &f,
            "in_port=1,tcp,nw_dst=10.0.0.2,tp_dst=80",
        ],
        None,
    ));
    let on = ok(&s.ctl(&["trace", "in_port=1,tcp,nw_dst=10.0.0.2,tp_dst=80"]));
    assert_eq!(off, on);

    // --json on read commands: the raw result.
    let j = ok(&s.ctl(&["--json", "dump-flows"]));
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v["flows"].as_array().unwrap().len(), 4);
    assert_eq!(v["flows"][2]["match"], "tcp,tp_dst=80");
    assert_eq!(v["flows"][2]["table"], 10);
    assert_eq!(v["lines"].as_array().unwrap().len(), 4);
    let j = ok(&s.ctl(&["trace", "--json", "in_port=1,udp"]));
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v["injected"], false);
    for cmd in [
        &["stats"][..],
        &["show"],
        &["dump-ports"],
        &["dump-conntrack"],
        &["packet-in"],
    ] {
        let mut args = vec!["--json"];
        args.extend_from_slice(cmd);
        let j = ok(&s.ctl(&args));
        let v: serde_json::Value =
            serde_json::from_str(&j).unwrap_or_else(|e| panic!("{cmd:?}: {e}: {j}"));
        assert!(v.is_object(), "{cmd:?}: {j}");
    }
    // Text forms.
    assert!(ok(&s.ctl(&["show"])).starts_with("oxvs-switchd "));
    assert_eq!(ok(&s.ctl(&["dump-ports"])), "OFPST_PORT reply: 0 ports\n");
    let st = ok(&s.ctl(&["stats"]));
    assert!(
        st.contains("emc hits: 0") && st.contains("flows: 4"),
        "{st}"
    );
    assert_eq!(ok(&s.ctl(&["dump-conntrack"])), "");
    ok(&s.ctl(&["flush-conntrack", "--zone", "3"]));
    assert_eq!(ok(&s.ctl(&["packet-in", "--wait-ms", "10"])), "");
}

#[test]
fn exit_codes() {
    let s = Switchd::start("codes");
    // 1: the switch refused.
    let o = s.ctl(&["del-port", "nope"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("no port named 'nope'"), "{}", err(&o));
    let o = s.ctl(&["add-flow", "table=0, bogus actions=drop"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("'bogus'"), "{}", err(&o));
    let o = s.ctl(&["trace", "in_port=1,tcp", "--ct-next", "est"]);
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    // 2: usage.
    assert_eq!(
        s.ctl(&["dump-flows", "--table", "Nope"]).status.code(),
        Some(2)
    );
    assert_eq!(
        s.ctl(&["trace", "--ports", "1", "in_port=1"]).status.code(),
        Some(2)
    );
    assert_eq!(
        s.ctl(&["add-port", "t", "--type", "vxlan"]).status.code(),
        Some(2)
    );
    assert_eq!(
        s.ctl(&["trace", "--flows", "-", "--inject", "in_port=1"])
            .status
            .code(),
        Some(2)
    );
    // 3: unreachable, naming the socket and why.
    let gone = s.dir.join("nothing.sock");
    let o = oxvsctl(&["--socket", gone.to_str().unwrap(), "show"], None);
    assert_eq!(o.status.code(), Some(3));
    assert!(err(&o).contains(gone.to_str().unwrap()), "{}", err(&o));
    assert!(err(&o).contains("no such socket"), "{}", err(&o));
    // The environment variable names the socket too.
    let o = Command::new(env!("CARGO_BIN_EXE_oxvsctl"))
        .arg("dump-flows")
        .env("OXVS_SWITCHD_SOCKET", &s.sock)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
}

#[test]
fn second_switchd_refused_and_sigterm_removes_the_socket() {
    let mut s = Switchd::start("life");
    let second = spawn_switchd(&s.sock);
    let o = second.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let msg = err(&o);
    assert!(
        msg.contains(&format!(
            "another oxvs-switchd is serving {}",
            s.sock.display()
        )),
        "{msg}"
    );
    // The first one is unharmed.
    ok(&s.ctl(&["show"]));
    let st = s.terminate();
    assert!(st.success(), "{st}");
    assert!(!s.sock.exists());
    assert_eq!(s.ctl(&["show"]).status.code(), Some(3));

    // A stale socket left behind (SIGKILL) is replaced by the next switchd.
    let mut s2 = Switchd::start("stale");
    s2.child.as_mut().unwrap().kill().unwrap();
    s2.child.as_mut().unwrap().wait().unwrap();
    assert!(s2.sock.exists());
    let o = s2.ctl(&["show"]);
    assert_eq!(o.status.code(), Some(3));
    assert!(err(&o).contains("connection refused"), "{}", err(&o));
    s2.child = Some(spawn_switchd(&s2.sock));
    s2.wait_ready();
    ok(&s2.ctl(&["show"]));
}

#[test]
fn conntrack_limits() {
    let s = Switchd::start("ctlimits");
    // The default: a quarter of the table.
    assert_eq!(
        ok(&s.ctl(&["ct-get-limits"])),
        "connections: 0 of 262144\ndefault limit=65536\n"
    );
    assert_eq!(
        ok(&s.ctl(&["ct-set-limits", "default=100"])),
        "connections: 0 of 262144\ndefault limit=100\n"
    );
    let j = ok(&s.ctl(&["--json", "ct-get-limits"]));
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v["default_limit"], 100);
    assert_eq!(v["max_entries"], 262144);
    // A port that does not exist: refused by the switch, nothing changes.
    let o = s.ctl(&["ct-set-limits", "default=5", "port=pod-x,limit=3"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("no port 'pod-x'"), "{}", err(&o));
    assert!(ok(&s.ctl(&["ct-get-limits"])).contains("default limit=100"));
    let o = s.ctl(&["ct-get-limits", "port=7"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("no port '7'"), "{}", err(&o));
    // Bad syntax: a usage error naming the argument, before any call.
    let o = s.ctl(&["ct-set-limits", "port=a,limt=3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("bad part 'limt=3'"), "{}", err(&o));
    let o = s.ctl(&["ct-set-limits", "default=lots"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("'lots' is not a number"), "{}", err(&o));
    let o = s.ctl(&["ct-del-limits", "zone=3"]);
    assert_eq!(o.status.code(), Some(2));
    // stats carries the counters.
    let st = ok(&s.ctl(&["stats"]));
    assert!(st.contains("early drops: 0"), "{st}");
}

const GROUPS: &str = "# a mirror and a next hop\n\
group_id=1,type=all,bucket=output:2,bucket=output:3\n\
group_id=2,type=indirect,bucket=actions=mod_dl_dst:aa:bb:cc:dd:ee:ff,output:4\n";

#[test]
fn groups_add_dump_modify_delete() {
    let s = Switchd::start("groups");
    assert_eq!(ok(&s.ctl(&["dump-groups"])), "");
    let g = s.file("a.groups", GROUPS);
    assert_eq!(ok(&s.ctl(&["add-groups", &g])), "");
    assert_eq!(
        ok(&s.ctl(&["dump-groups"])),
        " group_id=1,type=all,bucket=bucket_id:0,actions=output:2,bucket=bucket_id:1,actions=output:3\n \
         group_id=2,type=indirect,bucket=bucket_id:0,actions=set_field:aa:bb:cc:dd:ee:ff->eth_dst,output:4\n"
    );
    assert_eq!(ok(&s.ctl(&["dump-groups", "2"])).lines().count(), 1);
    // An existing id: the whole file is refused, naming the line.
    let o = s.ctl(&["add-groups", &g]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("already exists"), "{}", err(&o));
    assert!(err(&o).contains(&format!("{g}:2")), "{}", err(&o));
    let o = s.ctl(&[
        "add-group",
        "group_id=3,type=indirect,bucket=output:1,bucket=output:2",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("at most one bucket"), "{}", err(&o));
    // Flows may name the groups; a missing group is refused.
    ok(&s.ctl(&["add-flow", "priority=5,in_port=1 actions=group:1"]));
    ok(&s.ctl(&["add-flow", "priority=6,in_port=5 actions=group:2"]));
    let o = s.ctl(&["add-flow", "priority=7,in_port=6 actions=group:9"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("group 9"), "{}", err(&o));
    // The trace runs every bucket of the all group.
    let t = ok(&s.ctl(&["trace", "in_port=1,ip"]));
    assert!(t.contains("group:1"), "{t}");
    // mod-group replaces; a missing one needs --may-create.
    ok(&s.ctl(&["mod-group", "group_id=1,type=select,bucket=output:5"]));
    assert!(ok(&s.ctl(&["dump-groups", "1"])).contains("type=select"));
    let o = s.ctl(&["mod-group", "group_id=7,type=all,bucket=output:5"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("does not exist"), "{}", err(&o));
    ok(&s.ctl(&[
        "mod-group",
        "--may-create",
        "group_id=7,type=all,bucket=output:5",
    ]));
    // --json: structured entries, with the flows that name each group.
    let j: serde_json::Value =
        serde_json::from_str(&ok(&s.ctl(&["--json", "dump-groups"]))).unwrap();
    assert_eq!(j["groups"][0]["group_id"], 1);
    assert_eq!(j["groups"][0]["n_flows"], 1);
    assert_eq!(j["groups"].as_array().unwrap().len(), 3);
    // del-groups: the flows naming the group go with it.
    let j: serde_json::Value =
        serde_json::from_str(&ok(&s.ctl(&["--json", "del-groups", "group_id=1"]))).unwrap();
    assert_eq!(
        (j["deleted"].as_u64(), j["flows_deleted"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(ok(&s.ctl(&["dump-flows", "--no-stats"])).lines().count(), 1);
    ok(&s.ctl(&["del-groups"]));
    assert_eq!(ok(&s.ctl(&["dump-groups"])), "");
    assert_eq!(ok(&s.ctl(&["dump-flows"])), "");
}

#[test]
fn replace_flows_with_groups_is_one_version() {
    let s = Switchd::start("replace-groups");
    let g = s.file("a.groups", GROUPS);
    ok(&s.ctl(&["add-groups", &g]));
    ok(&s.ctl(&["add-group", "group_id=9,type=all"]));
    let flows = s.file(
        "a.flows",
        "in_port=1 actions=group:1\nin_port=2 actions=group:3\n",
    );
    let groups = s.file(
        "b.groups",
        "group_id=1,type=all,bucket=output:2,bucket=output:3\ngroup_id=3,type=indirect,bucket=output:4\n",
    );
    // Without --groups, group 3 does not exist: refused, naming the flow's line.
    let o = s.ctl(&["replace-flows", &flows]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains(&format!("{flows}:2: ")), "{}", err(&o));
    let j: serde_json::Value = serde_json::from_str(&ok(&s.ctl(&[
        "--json",
        "replace-flows",
        &flows,
        "--groups",
        &groups,
    ])))
    .unwrap();
    assert_eq!(j["groups"]["added"], 1);
    assert_eq!(j["groups"]["deleted"], 2);
    assert_eq!(j["groups"]["n_groups"], 2);
    assert_eq!(j["flows"]["added"], 2);
    let dump = ok(&s.ctl(&["dump-groups"]));
    assert!(dump.starts_with(" group_id=1,type=all,"), "{dump}");
    assert!(dump.contains(" group_id=3,type=indirect,"), "{dump}");
    assert_eq!(dump.lines().count(), 2);
    // A bad group file: located in it, and nothing changes.
    let bad = s.file(
        "bad.groups",
        "group_id=1,type=all\n\ngroup_id=3,type=nope\n",
    );
    let o = s.ctl(&["replace-flows", &flows, "--groups", &bad]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains(&format!("{bad}:3:17: ")), "{}", err(&o));
    assert_eq!(ok(&s.ctl(&["dump-groups"])), dump);
}
