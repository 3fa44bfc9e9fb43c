//! The control socket's connection cap ("busy, retry") and idle timeout,
//! in-process: a `Switch` with no ports served on a temporary socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oxvs_api::listen::Limits;
use oxvs_api::{Client, ClientError, Request, Response, VersionResult};
use oxvs_pipeline::tables::Pipeline;
use oxvs_switch::control::ControlServer;
use oxvs_switch::engine::{Switch, SwitchConfig};

/// A fresh directory for one test's socket (removed on drop).
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("oxvs-limits-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn switch() -> Arc<Switch> {
    Arc::new(Switch::start(SwitchConfig::default(), Arc::new(Pipeline::new())).unwrap())
}

fn limits(max: usize, idle_ms: u64) -> Limits {
    Limits::new("test", max, Duration::from_millis(idle_ms)).unwrap()
}

/// One response line read from a raw connection.
fn read_line(s: &UnixStream) -> String {
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    line
}

/// A raw connection that is served (it answered a request).
fn served(path: &std::path::Path) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"{\"v\":1,\"op\":\"version\"}\n").unwrap();
    let r: Response = serde_json::from_str(&read_line(&s)).unwrap();
    assert!(r.ok && !r.busy, "{r:?}");
    s
}

#[test]
fn over_the_cap_a_client_is_told_busy_and_gets_in_once_others_close() {
    let dir = Dir::new("cap");
    let path = dir.path().join("switchd.sock");
    let server = ControlServer::start_with(&path, switch(), limits(2, 60_000)).unwrap();
    let a = served(&path);
    let b = served(&path);

    // A third raw connection gets a typed busy line, unasked, and EOF.
    let c = UnixStream::connect(&path).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut all = String::new();
    (&c).read_to_string(&mut all).unwrap();
    let r: Response = serde_json::from_str(all.trim_end()).unwrap();
    assert!(r.busy && !r.ok, "{all}");
    let msg = r.error.unwrap_or_default();
    assert!(
        msg.contains("busy") && msg.contains("2") && msg.contains("--control-max-connections"),
        "{msg}"
    );
    assert_eq!(server.stats().busy_total.load(Ordering::Relaxed), 1);

    // The client retries while busy and succeeds once a place frees up.
    let freer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(a);
    });
    let t0 = Instant::now();
    let mut client = Client::connect(&path).unwrap();
    client.set_timeout(Duration::from_secs(10));
    let v: VersionResult = client.call_as(&Request::Version).unwrap();
    assert_eq!(v.protocol, 1);
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    freer.join().unwrap();
    assert!(server.stats().busy_total.load(Ordering::Relaxed) >= 2);

    // With the cap still reached until the deadline: Busy, naming why.
    let mut blocked = Client::connect(&path).unwrap();
    blocked.set_timeout(Duration::from_millis(300));
    let e = blocked.call(&Request::Version).unwrap_err();
    assert!(matches!(e, ClientError::Busy { .. }), "{e}");
    assert!(e.is_unreachable());
    assert!(e.to_string().contains("busy"), "{e}");
    drop((b, client));
}

#[test]
fn an_idle_connection_is_closed_after_the_timeout() {
    let dir = Dir::new("idle");
    let path = dir.path().join("switchd.sock");
    let server = ControlServer::start_with(&path, switch(), limits(1, 300)).unwrap();
    let idle = served(&path);
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // It holds the only place: meanwhile others are busy...
    let mut c = Client::connect(&path).unwrap();
    c.set_timeout(Duration::from_millis(100));
    assert!(matches!(
        c.call(&Request::Version),
        Err(ClientError::Busy { .. })
    ));
    // ...until the server closes it for idling.
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    let n = (&idle).read(&mut buf).unwrap();
    assert_eq!(n, 0, "EOF from the server");
    let waited = t0.elapsed();
    assert!(waited < Duration::from_secs(3), "closed after {waited:?}");
    let mut c = Client::connect(&path).unwrap();
    c.set_timeout(Duration::from_secs(5));
    c.call(&Request::Version).expect("the place is free again");
    assert_eq!(server.stats().idle_closed_total.load(Ordering::Relaxed), 1);
    // Half a request line, then silence: closed all the same, unanswered.
    drop(c);
    std::thread::sleep(Duration::from_millis(100)); // its thread sees EOF, frees the place
    let mut slow = UnixStream::connect(&path).unwrap();
    slow.write_all(b"{\"v\":1,").unwrap();
    let mut rest = Vec::new();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = slow.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no answer to half a request: {rest:?}");
}
