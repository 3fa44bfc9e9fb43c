//! The daemons' Unix sockets, black box through the built binaries: the
//! socket files never have group or other permissions, not even for an
//! instant, whatever the umask; the agent's CNI and API sockets answer
//! "busy, retry" over their connection cap and close idle connections.
//!
//! "Never, not even for an instant": each daemon runs under `umask 000`
//! (what a careless init would leave) and under `strace`, which delays
//! the return of every `bind(2)` by 300 ms. Binding first and `chmod`-ing
//! after leaves the new file `0777` for
//! those 300 ms, and the watcher, which `lstat`s the paths every
//! millisecond, sees it. A socket born `0600` (`fchmod` before `bind`,
//! `oxvs_api::listen::bind_private_unix`) shows nothing else. Skipped
//! (with a message; a failure with `OXVS_TESTS_NO_SKIP=1`) when `strace` is
//! missing or cannot trace here.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oxvs_api::cni::{code, CniResponse};
use oxvs_api::Response;

/// A daemon in a process group of its own (with strace, if traced), the
/// whole group killed on drop: killing strace alone would leave the
/// daemon running, detached.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.wait();
    }
}

/// `bin` next to this test's `oxvs-agent` (the workspace's target dir).
fn sibling_bin(bin: &str) -> Option<PathBuf> {
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_oxvs-agent"));
    let p = agent.parent()?.join(bin);
    p.is_file().then_some(p)
}

fn agent_args(dir: &Path, extra: &[&str]) -> Vec<String> {
    let d = |f: &str| dir.join(f).display().to_string();
    let mut a: Vec<String> = [
        "--node-name",
        "sockets-test",
        "--pod-cidr",
        "10.250.9.0/24",
        "--node-ip",
        "127.0.0.1",
        "--mtu",
        "1450",
        "--no-masquerade",
    ]
    .map(String::from)
    .to_vec();
    if !extra.contains(&"--metrics-addr") {
        a.extend(["--metrics-addr".into(), "none".into()]);
    }
    for (flag, file) in [
        ("--cni-socket", "cni.sock"),
        ("--api-socket", "agent.sock"),
        ("--switchd-socket", "no-switch.sock"),
        ("--state-dir", "state"),
    ] {
        a.push(flag.into());
        a.push(d(file));
    }
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Runs `bin args` under `umask 000`, optionally under strace delaying
/// every bind by 300 ms.
fn spawn(bin: &Path, args: &[String], delay_binds: bool) -> Daemon {
    let mut cmd = if delay_binds {
        let mut c = Command::new("strace");
        c.args([
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=bind",
            "-e",
            "inject=bind:delay_exit=300000",
            "sh",
        ]);
        c
    } else {
        Command::new("sh")
    };
    cmd.process_group(0)
        .args(["-c", "umask 000; exec \"$0\" \"$@\""])
        .arg(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Daemon(cmd.spawn().expect("spawn"))
}

fn strace_works() -> bool {
    Command::new("strace")
        .args(["-qq", "-o", "/dev/null", "-e", "trace=bind", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Watches `paths` (every millisecond) until each exists and has been seen
/// for 200 ms, or `timeout`; returns every mode seen per path.
fn watch_modes(paths: &[PathBuf], timeout: Duration) -> Vec<(PathBuf, Vec<u32>)> {
    let mut seen: Vec<(PathBuf, Vec<u32>, Option<Instant>)> = paths
        .iter()
        .map(|p| (p.clone(), Vec::new(), None))
        .collect();
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        for (p, modes, first) in &mut seen {
            if let Ok(m) = std::fs::symlink_metadata(&*p) {
                let mode = m.permissions().mode() & 0o777;
                if modes.last() != Some(&mode) {
                    modes.push(mode);
                }
                first.get_or_insert_with(Instant::now);
            }
        }
        let settled = seen
            .iter()
            .all(|(_, _, f)| f.is_some_and(|t| t.elapsed() > Duration::from_millis(200)));
        if settled {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    seen.into_iter().map(|(p, m, _)| (p, m)).collect()
}

fn assert_never_open(what: &str, seen: &[(PathBuf, Vec<u32>)]) {
    for (p, modes) in seen {
        assert!(!modes.is_empty(), "{what}: {} never appeared", p.display());
        assert!(
            modes.iter().all(|m| m & 0o077 == 0),
            "{what}: {} had modes {:?} (group/other bits while the daemon set it up)",
            p.display(),
            modes.iter().map(|m| format!("{m:04o}")).collect::<Vec<_>>()
        );
        assert_eq!(modes.last(), Some(&0o600), "{what}: {}", p.display());
    }
}

#[test]
fn agent_sockets_are_never_accessible_to_others() {
    if !strace_works() {
        oxvs_testutil::skip_or_fail("strace is not installed or cannot trace here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_oxvs-agent"));
    let _agent = spawn(&bin, &agent_args(dir.path(), &[]), true);
    let seen = watch_modes(
        &[dir.path().join("cni.sock"), dir.path().join("agent.sock")],
        Duration::from_secs(30),
    );
    assert_never_open("oxvs-agent", &seen);
}

#[test]
fn switchd_socket_is_never_accessible_to_others() {
    let Some(bin) = sibling_bin("oxvs-switchd") else {
        oxvs_testutil::skip_or_fail("oxvs-switchd not built (cargo build -p oxvs-switch)");
        return;
    };
    if !strace_works() {
        oxvs_testutil::skip_or_fail("strace is not installed or cannot trace here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("switchd.sock");
    let args: Vec<String> = [
        "--socket",
        &sock.display().to_string(),
        "--metrics-addr",
        "none",
        "--ct-state-file",
        "",
    ]
    .map(String::from)
    .to_vec();
    let _sw = spawn(&bin, &args, true);
    let seen = watch_modes(&[sock], Duration::from_secs(30));
    assert_never_open("oxvs-switchd", &seen);
}

/// Waits for a socket to accept connections.
fn wait_socket(p: &Path) {
    let end = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(p).is_err() {
        assert!(Instant::now() < end, "{} never served", p.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection that sent nothing yet.
fn idle_conn(p: &Path) -> UnixStream {
    let s = UnixStream::connect(p).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Everything the server sends on a new connection that sends `req`.
fn exchange(p: &Path, req: &str) -> String {
    let mut s = UnixStream::connect(p).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(req.as_bytes());
    let mut line = String::new();
    let _ = BufReader::new(&s).read_line(&mut line);
    line
}

const STATUS: &str = r#"{"v":1,"command":"STATUS","config":{"cniVersion":"1.1.0","name":"oxvs","type":"oxvs"}}
"#;
const INFO: &str = "{\"v\":1,\"op\":\"info\"}\n";

/// Over the cap: a typed busy answer (CNI: code 11 and `busy`; API:
/// `busy`), and the idle connection holding the place is closed after
/// the timeout, after which requests are served again.
#[test]
fn agent_sockets_are_capped_and_close_idle_connections() {
    let dir = tempfile::tempdir().unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_oxvs-agent"));
    let limits = [
        "--cni-max-connections",
        "1",
        "--cni-idle-timeout",
        "400ms",
        "--api-max-connections",
        "1",
        "--api-idle-timeout",
        "400ms",
    ];
    let _agent = spawn(&bin, &agent_args(dir.path(), &limits), false);
    let cni = dir.path().join("cni.sock");
    let api = dir.path().join("agent.sock");
    wait_socket(&cni);
    wait_socket(&api);
    std::thread::sleep(Duration::from_millis(500)); // the probes' connections closed idle

    // CNI
    let held = idle_conn(&cni);
    std::thread::sleep(Duration::from_millis(50));
    let busy: CniResponse = serde_json::from_str(&exchange(&cni, STATUS)).expect("a CNI answer");
    assert!(busy.busy && !busy.ok, "{busy:?}");
    let e = busy.error.expect("error");
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(e.msg.contains("--cni-max-connections"), "{}", e.msg);
    let t0 = Instant::now();
    let mut rest = Vec::new();
    (&held)
        .read_to_end(&mut rest)
        .expect("closed, not timed out here");
    assert!(rest.is_empty(), "no answer to a silent client: {rest:?}");
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(3), "closed after {waited:?}");
    std::thread::sleep(Duration::from_millis(50));
    let served: CniResponse = serde_json::from_str(&exchange(&cni, STATUS)).expect("an answer");
    assert!(!served.busy, "served once the idle one is gone: {served:?}");

    // API
    let held = idle_conn(&api);
    std::thread::sleep(Duration::from_millis(50));
    let busy: Response = serde_json::from_str(&exchange(&api, INFO)).expect("an API answer");
    assert!(busy.busy && !busy.ok, "{busy:?}");
    assert!(
        busy.error
            .unwrap_or_default()
            .contains("--api-max-connections"),
        "names the flag"
    );
    let mut rest = Vec::new();
    (&held)
        .read_to_end(&mut rest)
        .expect("closed, not timed out here");
    std::thread::sleep(Duration::from_millis(50));
    let served: Response = serde_json::from_str(&exchange(&api, INFO)).expect("an answer");
    assert!(!served.busy, "{served:?}");
}

/// A free TCP port on 127.0.0.1.
use oxvs_testutil::free_port;

fn http_get(addr: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

/// The agent's `/metrics` over its cap: 503 with `Retry-After`; an idle
/// client is answered 408 after the timeout; the listeners' counters are
/// exported, by socket.
#[test]
fn agent_metrics_endpoint_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_oxvs-agent"));
    let addr = format!("127.0.0.1:{}", free_port());
    let extra = [
        "--metrics-addr",
        &addr,
        "--metrics-max-connections",
        "1",
        "--metrics-idle-timeout",
        "400ms",
    ];
    let _agent = spawn(&bin, &agent_args(dir.path(), &extra), false);
    let end = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < end, "{addr} never served");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100)); // the probe connection ended (EOF)
    let mut idle = std::net::TcpStream::connect(&addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let busy = http_get(&addr);
    assert!(busy.starts_with("HTTP/1.1 503"), "{busy}");
    assert!(busy.contains("Retry-After: 1"), "{busy}");
    let mut out = String::new();
    idle.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    std::thread::sleep(Duration::from_millis(50));
    let ok = http_get(&addr);
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    for line in [
        "oxvs_listener_busy_total{socket=\"metrics\"} 1",
        "oxvs_listener_idle_closed_total{socket=\"metrics\"} 1",
        "oxvs_listener_busy_total{socket=\"cni\"} 0",
        "oxvs_listener_busy_total{socket=\"api\"} 0",
    ] {
        assert!(ok.contains(line), "no '{line}' in\n{ok}");
    }
}

/// Bad limits are refused at start with a message naming the flag.
#[test]
fn bad_limits_are_refused_naming_the_flag() {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_oxvs-agent"));
    for (args, says) in [
        (&["--cni-idle-timeout", "0s"][..], "idle timeout of 0"),
        (&["--cni-idle-timeout", "10"][..], "no unit"),
        (&["--api-idle-timeout", "5h"][..], "unknown unit 'h'"),
        (&["--cni-max-connections", "0"][..], "--cni-max-connections"),
    ] {
        let out = Command::new(&bin).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let Some(sw) = sibling_bin("oxvs-switchd") else {
        return;
    };
    for (args, says) in [
        (&["--control-idle-timeout", "0ms"][..], "idle timeout of 0"),
        (&["--metrics-idle-timeout", "fast"][..], "not a duration"),
        (
            &["--control-max-connections", "0"][..],
            "--control-max-connections",
        ),
    ] {
        let out = Command::new(&sw).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "switchd {args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "switchd {args:?}: {err}");
    }
}

/// Everything the server sends on a new connection that sends `req` and
/// closes its side, until the server closes the connection. (A server
/// that closes with part of the request unread resets the connection
/// after its answer: the end too.)
fn exchange_all(p: &Path, req: &[u8]) -> String {
    let mut s = UnixStream::connect(p).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the agent did not close the connection: {e}"),
        }
    }
    String::from_utf8(out).unwrap()
}

/// Both line sockets (one server, `socket_server.rs`): an oversize line
/// is answered, not read on, and closes the connection; a line that is
/// not UTF-8 is refused in the socket's own protocol; the CNI socket takes
/// one request per connection, the API socket many.
#[test]
fn agent_line_sockets_refuse_oversize_and_garbage_lines() {
    let dir = tempfile::tempdir().unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_oxvs-agent"));
    let _agent = spawn(&bin, &agent_args(dir.path(), &[]), false);
    let cni = dir.path().join("cni.sock");
    let api = dir.path().join("agent.sock");
    wait_socket(&cni);
    wait_socket(&api);

    // CNI: one answer per connection, even to two requests.
    let out = exchange_all(&cni, format!("{STATUS}{STATUS}").as_bytes());
    assert_eq!(out.lines().count(), 1, "{out}");
    let r: CniResponse = serde_json::from_str(&out).expect("a CNI answer");
    assert!(!r.busy, "{r:?}");
    let cni_error = |req: &[u8]| {
        let out = exchange_all(&cni, req);
        let r: CniResponse = serde_json::from_str(&out).expect("a CNI answer");
        assert!(!r.ok, "{r:?}");
        r.error.expect("an error")
    };
    let e = cni_error(b"\xff\xfe\n");
    assert_eq!(
        (e.code, e.msg.as_str()),
        (code::DECODE_FAILURE, "request is not UTF-8")
    );
    let e = cni_error(b"{\"v\":1,\n");
    assert_eq!(e.code, code::DECODE_FAILURE, "{e:?}");
    assert!(e.msg.contains("bad request from the plugin"), "{e:?}");
    let huge = vec![b'x'; (4 << 20) + 1];
    let e = cni_error(&huge);
    assert_eq!(e.code, code::DECODE_FAILURE, "{e:?}");
    assert_eq!(e.msg, format!("request line longer than {} bytes", 4 << 20));

    // API: many requests per connection, a bad line does not end it.
    let out = exchange_all(&api, format!("{INFO}\u{0}\n{INFO}").as_bytes());
    let answers: Vec<Response> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("an API answer"))
        .collect();
    assert_eq!(answers.len(), 3, "{out}");
    assert!(answers[0].ok && !answers[1].ok && answers[2].ok, "{out}");
    let mut req = b"\xff\n".to_vec();
    req.extend_from_slice(INFO.as_bytes());
    let out = exchange_all(&api, &req);
    let answers: Vec<Response> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("an API answer"))
        .collect();
    assert_eq!(answers.len(), 2, "{out}");
    assert_eq!(answers[0].error.as_deref(), Some("request is not UTF-8"));
    assert!(answers[1].ok, "{out}");
    let max = oxvs_api::agent::MAX_AGENT_LINE;
    let huge = vec![b'x'; max + 1];
    let out = exchange_all(&api, &huge);
    let r: Response = serde_json::from_str(&out).expect("one API answer, then closed");
    assert_eq!(
        r.error.as_deref(),
        Some(format!("request line longer than {max} bytes").as_str())
    );
}
