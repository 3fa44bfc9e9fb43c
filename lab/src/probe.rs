//! Reachability probes: one real connection attempt from inside a pod's
//! namespace.
//!
//! Each probe runs on a worker thread that first `setns`es into the source
//! pod's network namespace (only that thread moves; sockets it opens live
//! there) and then tries the destination. Workers are never returned to
//! the root namespace: they take the next job's namespace or exit. The
//! matrix runs with at most `parallel` workers, so a 9x9 matrix with 1 s
//! timeouts takes about ceil(81 / parallel) timeouts in the worst case.
//!
//! What "reachable" means, per protocol:
//! - TCP: the handshake completes within the timeout.
//! - UDP: a datagram comes back from the destination's echo server (the
//!   probe resends every 200 ms until the timeout, so a first packet lost
//!   to ARP resolution does not count as blocked).
//! - SCTP: the association is established. A kernel without SCTP gives
//!   `EPROTONOSUPPORT` when the socket is made: the outcome is
//!   [`Outcome::Unsupported`], not blocked.
//!
//! A refused connection (RST or ICMP port unreachable) is reported as
//! blocked with the detail `refused`: the pod answered, but nothing serves
//! that port.

use std::fs::File;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};
use serde::Serialize;
use socket2::{Domain, Protocol as SockProto, Socket, Type};

/// IPPROTO_SCTP.
pub const IPPROTO_SCTP: i32 = 132;

/// An L4 protocol to probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    pub fn api_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Reachable,
    /// Timed out or refused; the detail says which.
    Blocked(String),
    /// The protocol cannot be used here (e.g. no SCTP in the kernel).
    Unsupported(String),
    /// The probe itself failed (e.g. the source namespace is gone).
    Error(String),
}

impl Outcome {
    /// `Some(bool)` when the probe decided, `None` otherwise.
    pub fn reachable(&self) -> Option<bool> {
        match self {
            Outcome::Reachable => Some(true),
            Outcome::Blocked(_) => Some(false),
            Outcome::Unsupported(_) | Outcome::Error(_) => None,
        }
    }
    pub fn detail(&self) -> Option<&str> {
        match self {
            Outcome::Reachable => None,
            Outcome::Blocked(d) | Outcome::Unsupported(d) | Outcome::Error(d) => Some(d),
        }
    }
}

/// Whether the running kernel lets us make SCTP sockets (in the current
/// namespace; the protocol is kernel-wide).
pub fn sctp_supported() -> Result<(), String> {
    Socket::new(
        Domain::IPV4,
        Type::STREAM,
        Some(SockProto::from(IPPROTO_SCTP)),
    )
    .map(|_| ())
    .map_err(|e| format!("SCTP sockets unavailable in this kernel: {e}"))
}

/// One probe from the current thread's namespace.
pub fn probe(dst: impl Into<IpAddr>, proto: Protocol, port: u16, timeout: Duration) -> Outcome {
    let addr = SocketAddr::new(dst.into(), port);
    match proto {
        Protocol::Tcp => match TcpStream::connect_timeout(&addr, timeout) {
            Ok(_) => Outcome::Reachable,
            Err(e) => blocked(&e),
        },
        Protocol::Sctp => {
            let s = match Socket::new(
                Domain::for_address(addr),
                Type::STREAM,
                Some(SockProto::from(IPPROTO_SCTP)),
            ) {
                Ok(s) => s,
                Err(e) => return Outcome::Unsupported(format!("SCTP sockets unavailable: {e}")),
            };
            match s.connect_timeout(&addr.into(), timeout) {
                Ok(()) => Outcome::Reachable,
                Err(e) => blocked(&e),
            }
        }
        Protocol::Udp => udp_probe(addr, timeout),
    }
}

fn blocked(e: &std::io::Error) -> Outcome {
    match e.kind() {
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset => {
            Outcome::Blocked("refused".into())
        }
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Outcome::Blocked("timeout".into()),
        _ if e.raw_os_error() == Some(nix::libc::EHOSTUNREACH) => {
            Outcome::Blocked("host unreachable".into())
        }
        _ => Outcome::Blocked(e.to_string()),
    }
}

fn udp_probe(addr: SocketAddr, timeout: Duration) -> Outcome {
    let any: IpAddr = match addr {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock =
        match UdpSocket::bind(SocketAddr::new(any, 0)).and_then(|s| s.connect(addr).map(|()| s)) {
            Ok(s) => s,
            Err(e) => return Outcome::Error(format!("UDP socket: {e}")),
        };
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 512];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Outcome::Blocked("timeout".into());
        }
        let _ = sock.send(b"probe\n");
        let wait = (deadline - now).min(Duration::from_millis(200));
        if sock.set_read_timeout(Some(wait)).is_err() {
            return Outcome::Error("cannot set a read timeout".into());
        }
        match sock.recv(&mut buf) {
            Ok(_) => return Outcome::Reachable,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                return Outcome::Blocked("refused".into())
            }
            Err(e) => return Outcome::Blocked(e.to_string()),
        }
    }
}

/// Reads the server's greeting on a connected TCP stream (used by tests
/// and `probe --verbose`-like checks).
pub fn tcp_greeting(
    dst: impl Into<IpAddr>,
    port: u16,
    timeout: Duration,
) -> std::io::Result<String> {
    let addr = SocketAddr::new(dst.into(), port);
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    let _ = s.write_all(b"hello\n");
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// One probe to run: from the pod whose namespace file is `netns_path`.
#[derive(Clone, Debug)]
pub struct Job {
    pub from: String,
    pub to: String,
    pub netns_path: String,
    pub dst: IpAddr,
}

/// Runs every job with at most `parallel` threads; results in job order.
pub fn run_matrix(
    jobs: &[Job],
    proto: Protocol,
    port: u16,
    timeout: Duration,
    parallel: usize,
) -> Vec<Outcome> {
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new(vec![None; jobs.len()]);
    let workers = parallel.clamp(1, jobs.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = {
                    let Ok(mut n) = next.lock() else { return };
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(job) = jobs.get(i) else { return };
                let out = match enter(&job.netns_path) {
                    Ok(()) => probe(job.dst, proto, port, timeout),
                    Err(e) => Outcome::Error(e),
                };
                if let Ok(mut r) = results.lock() {
                    if let Some(slot) = r.get_mut(i) {
                        *slot = Some(out);
                    }
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Outcome::Error("probe did not run".into())))
        .collect()
}

/// Moves the calling thread into the network namespace at `path`.
fn enter(path: &str) -> Result<(), String> {
    let f = File::open(path).map_err(|e| format!("cannot open namespace {path}: {e}"))?;
    setns(f, CloneFlags::CLONE_NEWNET).map_err(|e| format!("cannot enter namespace {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_and_udp_probes_on_loopback() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let port = l.local_addr().expect("addr").port();
        let t = Duration::from_millis(500);
        assert_eq!(
            probe(Ipv4Addr::LOCALHOST, Protocol::Tcp, port, t),
            Outcome::Reachable
        );
        drop(l);
        assert_eq!(
            probe(Ipv4Addr::LOCALHOST, Protocol::Tcp, port, t),
            Outcome::Blocked("refused".into())
        );
        let u = UdpSocket::bind("127.0.0.1:0").expect("udp");
        let uport = u.local_addr().expect("addr").port();
        let echo = std::thread::spawn(move || {
            let mut b = [0u8; 64];
            if let Ok((n, from)) = u.recv_from(&mut b) {
                let _ = u.send_to(&b[..n], from);
            }
        });
        assert_eq!(
            probe(Ipv4Addr::LOCALHOST, Protocol::Udp, uport, t),
            Outcome::Reachable
        );
        echo.join().expect("echo thread");
        // Nobody there now: refused (ICMP port unreachable on loopback).
        let o = probe(Ipv4Addr::LOCALHOST, Protocol::Udp, uport, t);
        assert_eq!(o.reachable(), Some(false), "{o:?}");
    }

    #[test]
    fn sctp_is_reachable_or_unsupported_never_an_error() {
        let o = probe(
            Ipv4Addr::LOCALHOST,
            Protocol::Sctp,
            9,
            Duration::from_millis(300),
        );
        match sctp_supported() {
            Ok(()) => assert_eq!(o.reachable(), Some(false), "{o:?}"),
            Err(_) => assert!(matches!(o, Outcome::Unsupported(_)), "{o:?}"),
        }
    }

    #[test]
    fn a_missing_namespace_is_an_error_not_blocked() {
        let jobs = vec![Job {
            from: "a".into(),
            to: "b".into(),
            netns_path: "/var/run/netns/oxvs-lab-no-such-ns".into(),
            dst: Ipv4Addr::LOCALHOST.into(),
        }];
        let r = run_matrix(&jobs, Protocol::Tcp, 1, Duration::from_millis(100), 4);
        assert!(
            matches!(&r[0], Outcome::Error(m) if m.contains("oxvs-lab-no-such-ns")),
            "{r:?}"
        );
    }
}
