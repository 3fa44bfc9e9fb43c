//! Probing Services from pods, nodes and the underlay with real traffic:
//! each path a thread `setns`-ed into its source namespace, all of a phase
//! in parallel, a table of results, and the evidence at the first failure.
//! Shared by the kube-proxy and the in-pipeline proxy tests.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use super::Lab;

/// A Pod manifest on `node` with `labels` (a YAML flow map); with
/// `ports`, the lab's server answers on 8080 TCP (`http`) and UDP
/// (`http-udp`).
pub fn pod(ns: &str, name: &str, node: &str, labels: &str, ports: bool) -> String {
    let ports = if ports {
        "    ports:\n    - {containerPort: 8080, name: http}\n    - {containerPort: 8080, protocol: UDP, name: http-udp}\n"
    } else {
        ""
    };
    format!(
        "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {labels}}}\nspec:\n  nodeName: {node}\n  containers:\n  - name: c\n{ports}"
    )
}

/// How long a probe that must succeed may take (one SYN retransmission).
pub const OK_TIMEOUT: Duration = Duration::from_millis(2500);
/// How long a probe that must not be answered is given.
pub const SILENT_TIMEOUT: Duration = Duration::from_millis(1500);
/// Rejections must come this quickly.
pub const QUICK: Duration = Duration::from_millis(500);

/// How soon a host's IPv6 REJECT refuses ([`Want::RefusedByHost6`]).
pub const HOST_REJECT6: Duration = Duration::from_millis(1500);

pub fn enter(ns: &str) -> Result<(), String> {
    let path = format!("/var/run/netns/{ns}");
    let f = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("setns {path}: {e}"))
}

pub fn err_word(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset => "refused".into(),
        ErrorKind::TimedOut | ErrorKind::WouldBlock => "timeout".into(),
        _ => e.to_string(),
    }
}

pub fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().expect("ip"), port)
}

/// TCP: connects and reads the server's greeting (the backend's id).
pub fn tcp_id(dst: SocketAddr, timeout: Duration) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&dst, timeout).map_err(|e| err_word(&e))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read: {}", err_word(&e)))?;
    Ok(out.trim().to_string())
}

/// TCP handshake only.
pub fn tcp_connect(dst: SocketAddr, timeout: Duration) -> Result<String, String> {
    TcpStream::connect_timeout(&dst, timeout)
        .map(|_| "connected".to_string())
        .map_err(|e| err_word(&e))
}

/// UDP: the echo of a datagram comes back (resent every 200 ms).
pub fn udp_echo(dst: SocketAddr, timeout: Duration) -> Result<String, String> {
    let any = if dst.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let s = UdpSocket::bind(any).map_err(|e| e.to_string())?;
    s.connect(dst).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 512];
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err("timeout".into());
        }
        let _ = s.send(b"kube-proxy-test\n");
        s.set_read_timeout(Some((deadline - now).min(Duration::from_millis(200))))
            .map_err(|e| e.to_string())?;
        match s.recv(&mut buf) {
            Ok(n) if &buf[..n] == b"kube-proxy-test\n" => return Ok("echo".into()),
            Ok(n) => return Err(format!("unexpected answer {:?}", &buf[..n])),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(err_word(&e)),
        }
    }
}

/// The name the DNS paths ask for.
pub const DNS_NAME: &str = "web.svc.test";
/// What the test's DNS server answers for [`DNS_NAME`]: its A record
/// (dnsmasq `--address=/svc.test/10.1.2.3`) and its AAAA record
/// ([`DNS_AAAA`], `--address=/svc.test/fd00:1:2::3`).
pub const DNS_A: &str = "10.1.2.3";
pub const DNS_AAAA: &str = "fd00:1:2::3";

/// DNS record types asked for.
pub const QTYPE_A: u16 = 1;
pub const QTYPE_AAAA: u16 = 28;

pub fn dns_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut q = Vec::new();
    for v in [id, 0x0100, 1, 0, 0, 0] {
        q.extend_from_slice(&v.to_be_bytes());
    }
    for label in name.split('.') {
        q.push(u8::try_from(label.len()).expect("short label"));
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    q
}

/// The A or AAAA record of a DNS answer to query `id` (one answer, the
/// last 4 or 16 bytes).
pub fn dns_answer(id: u16, r: &[u8], qtype: u16) -> Result<IpAddr, String> {
    if r.len() < 16 || r[0..2] != id.to_be_bytes() {
        return Err(format!("not an answer to query {id}: {r:02x?}"));
    }
    let rcode = r[3] & 0x0f;
    let answers = u16::from_be_bytes([r[6], r[7]]);
    if rcode != 0 || answers != 1 {
        return Err(format!("rcode {rcode}, {answers} answers"));
    }
    let n = r.len();
    if qtype == QTYPE_AAAA {
        let b: [u8; 16] = r[n - 16..].try_into().map_err(|_| "short AAAA")?;
        return Ok(IpAddr::V6(Ipv6Addr::from(b)));
    }
    Ok(IpAddr::V4(Ipv4Addr::new(
        r[n - 4],
        r[n - 3],
        r[n - 2],
        r[n - 1],
    )))
}

/// A DNS query of type `qtype` for `name` over UDP or TCP; the address
/// answered.
pub fn dns(
    server: SocketAddr,
    name: &str,
    qtype: u16,
    tcp: bool,
    timeout: Duration,
) -> Result<String, String> {
    let id = 0x4b50;
    let q = dns_query(id, name, qtype);
    let mut buf = [0u8; 512];
    let ip = if tcp {
        let mut s = TcpStream::connect_timeout(&server, timeout).map_err(|e| err_word(&e))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| e.to_string())?;
        let mut msg = u16::try_from(q.len())
            .expect("short")
            .to_be_bytes()
            .to_vec();
        msg.extend_from_slice(&q);
        s.write_all(&msg).map_err(|e| e.to_string())?;
        let mut len = [0u8; 2];
        s.read_exact(&mut len)
            .map_err(|e| format!("read: {}", err_word(&e)))?;
        let n = usize::from(u16::from_be_bytes(len)).min(buf.len());
        s.read_exact(&mut buf[..n])
            .map_err(|e| format!("read: {}", err_word(&e)))?;
        dns_answer(id, &buf[..n], qtype)?
    } else {
        let any = if server.is_ipv6() {
            "[::]:0"
        } else {
            "0.0.0.0:0"
        };
        let s = UdpSocket::bind(any).map_err(|e| e.to_string())?;
        s.connect(server).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + timeout;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err("timeout".into());
            }
            let _ = s.send(&q);
            s.set_read_timeout(Some((deadline - now).min(Duration::from_millis(300))))
                .map_err(|e| e.to_string())?;
            match s.recv(&mut buf) {
                Ok(n) => break dns_answer(id, &buf[..n], qtype)?,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(err_word(&e)),
            }
        }
    };
    Ok(ip.to_string())
}

/// What a path must do.
#[derive(Clone, Debug)]
pub enum Want {
    /// Answered (TCP: by one of these backends; empty: any answer).
    Answer(Vec<&'static str>),
    /// Refused, within [`QUICK`].
    Refused,
    /// Refused by a host's IPv6 REJECT rule, within [`HOST_REJECT6`]: the
    /// host's first ICMPv6 error to a pod may be held by its neighbour
    /// discovery or its ICMPv6 rate limit, and TCP is refused at the
    /// SYN's first retransmission (1 s). Still not a silent drop.
    RefusedByHost6,
    /// No answer at all.
    Silent,
    /// Not answered: no answer or refused (a NetworkPolicy drop).
    Blocked,
    /// `n` connections, all answered by one backend.
    Sticky(usize),
    /// `n` connections, answered by every one of these backends.
    Spread(usize, Vec<&'static str>),
}

#[derive(Clone, Copy, Debug)]
pub enum Proto {
    Tcp,
    /// TCP handshake only (a server that does not greet).
    TcpConnect,
    Udp,
    DnsUdp,
    DnsTcp,
    /// DNS asking for an AAAA record (answer [`DNS_AAAA`]).
    DnsAaaaUdp,
    DnsAaaaTcp,
}

impl Proto {
    /// The record type and the address a DNS path must be answered.
    fn dns(self) -> Option<(u16, &'static str)> {
        match self {
            Proto::DnsUdp | Proto::DnsTcp => Some((QTYPE_A, DNS_A)),
            Proto::DnsAaaaUdp | Proto::DnsAaaaTcp => Some((QTYPE_AAAA, DNS_AAAA)),
            _ => None,
        }
    }
}

pub struct Path {
    pub name: String,
    pub from: String,
    pub dst: SocketAddr,
    pub proto: Proto,
    pub want: Want,
}

pub fn path(name: &str, from: &str, dst: (&str, u16), proto: Proto, want: Want) -> Path {
    Path {
        name: name.to_string(),
        from: from.to_string(),
        dst: addr(dst.0, dst.1),
        proto,
        want,
    }
}

/// Runs one path (in the current thread's namespace); `Ok(detail)` when
/// it did what it must.
pub fn run_path(p: &Path) -> Result<String, String> {
    let once = |timeout: Duration| -> Result<String, String> {
        match p.proto {
            Proto::Tcp => tcp_id(p.dst, timeout),
            Proto::TcpConnect => tcp_connect(p.dst, timeout),
            Proto::Udp => udp_echo(p.dst, timeout),
            Proto::DnsUdp => dns(p.dst, DNS_NAME, QTYPE_A, false, timeout),
            Proto::DnsTcp => dns(p.dst, DNS_NAME, QTYPE_A, true, timeout),
            Proto::DnsAaaaUdp => dns(p.dst, DNS_NAME, QTYPE_AAAA, false, timeout),
            Proto::DnsAaaaTcp => dns(p.dst, DNS_NAME, QTYPE_AAAA, true, timeout),
        }
    };
    match &p.want {
        Want::Answer(who) => {
            let got = once(OK_TIMEOUT)?;
            if let Some((_, want)) = p.proto.dns() {
                if got != want {
                    return Err(format!("resolved to {got}, not {want}"));
                }
            }
            if who.is_empty() || who.contains(&got.as_str()) {
                Ok(got)
            } else {
                Err(format!("answered by {got:?}, expected one of {who:?}"))
            }
        }
        Want::Refused | Want::RefusedByHost6 => {
            let within = match &p.want {
                Want::RefusedByHost6 => HOST_REJECT6,
                _ => QUICK,
            };
            let t = Instant::now();
            match once(SILENT_TIMEOUT) {
                Err(e) if e == "refused" && t.elapsed() < within => {
                    Ok(format!("refused in {} ms", t.elapsed().as_millis()))
                }
                Err(e) => Err(format!(
                    "{e} after {} ms, expected a quick refusal",
                    t.elapsed().as_millis()
                )),
                Ok(got) => Err(format!("answered ({got}), expected a refusal")),
            }
        }
        Want::Blocked => match once(SILENT_TIMEOUT) {
            Err(e) if e == "timeout" || e == "refused" => Ok(e),
            Err(e) => Err(format!("{e}, expected a drop")),
            Ok(got) => Err(format!("answered ({got}), expected a drop")),
        },
        Want::Silent => match once(SILENT_TIMEOUT) {
            Err(e) if e == "timeout" => Ok("no answer".into()),
            Err(e) => Err(format!("{e}, expected no answer at all")),
            Ok(got) => Err(format!("answered ({got}), expected no answer")),
        },
        Want::Sticky(n) => {
            let mut seen = BTreeSet::new();
            for _ in 0..*n {
                seen.insert(once(OK_TIMEOUT)?);
            }
            if seen.len() == 1 {
                Ok(format!("{n} connections, all to {seen:?}"))
            } else {
                Err(format!(
                    "{n} connections went to {seen:?}, expected one backend"
                ))
            }
        }
        Want::Spread(n, who) => {
            let mut seen = BTreeSet::new();
            for _ in 0..*n {
                seen.insert(once(OK_TIMEOUT)?);
            }
            let want: BTreeSet<String> = who.iter().map(|s| s.to_string()).collect();
            if seen == want {
                Ok(format!("{n} connections spread over {seen:?}"))
            } else {
                Err(format!(
                    "{n} connections went to {seen:?}, expected {want:?}"
                ))
            }
        }
    }
}

/// Runs every path in parallel, each in its own thread in its source
/// namespace; results in order.
pub fn run_paths(paths: &[Path]) -> Vec<Result<String, String>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = paths
            .iter()
            .map(|p| {
                s.spawn(move || {
                    enter(&p.from)?;
                    run_path(p)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("probe thread panicked".into()))
            })
            .collect()
    })
}

/// The failed paths of every phase (the test goes on after a failure, so
/// that one broken path does not hide the others), and the evidence taken
/// at the first failure.
pub struct Report {
    failures: Vec<String>,
    evidence: Option<String>,
    /// What to show about the lab at the first failure.
    evidence_of: fn(&Lab) -> String,
}

impl Report {
    /// A report that shows `evidence_of(lab)` at the first failure.
    pub fn new(evidence_of: fn(&Lab) -> String) -> Report {
        Report {
            failures: Vec::new(),
            evidence: None,
            evidence_of,
        }
    }

    /// Runs `paths` in parallel, prints the table, records the failures.
    pub fn check(&mut self, lab: &Lab, phase: &str, paths: &[Path]) {
        let evidence = self.evidence_of;
        let t = Instant::now();
        let results = run_paths(paths);
        let mut table = String::new();
        for (p, r) in paths.iter().zip(&results) {
            let (mark, detail) = match r {
                Ok(d) => ("ok  ", d.clone()),
                Err(e) => {
                    self.failures.push(format!("{phase}: {}: {e}", p.name));
                    ("FAIL", e.clone())
                }
            };
            table += &format!("{mark} {:<66} {detail}\n", p.name);
        }
        eprintln!(
            "{phase}: {} paths in {} ms\n{table}",
            paths.len(),
            t.elapsed().as_millis()
        );
        if !self.failures.is_empty() && self.evidence.is_none() {
            self.evidence = Some(evidence(lab));
        }
    }

    /// Polls `first` until it does what it must (an agent applying a
    /// policy: within 8 s), then checks it with `rest`.
    pub fn converge(&mut self, lab: &Lab, phase: &str, first: Path, rest: Vec<Path>) {
        let deadline = Instant::now() + Duration::from_secs(8);
        let t = Instant::now();
        while run_paths(std::slice::from_ref(&first)).remove(0).is_err() {
            if Instant::now() > deadline {
                break;
            }
        }
        eprintln!(
            "{phase}: {} after {} ms",
            first.name,
            t.elapsed().as_millis()
        );
        let mut all = vec![first];
        all.extend(rest);
        self.check(lab, phase, &all);
    }

    pub fn finish(self) {
        if !self.failures.is_empty() {
            panic!(
                "{} paths failed:\n{}\n\nevidence at the first failure:\n{}",
                self.failures.len(),
                self.failures.join("\n"),
                self.evidence.unwrap_or_default()
            );
        }
    }
}

/// The switches' view for a test's evidence: `oxvsctl ARGS` on each of
/// `nodes` for each of `commands`, headed by node and command (a command
/// that fails shows nothing: the evidence must not fail the test itself).
pub fn switch_evidence(lab: &Lab, nodes: &[&str], commands: &[&[&str]]) -> String {
    let mut s = String::new();
    for node in nodes {
        for args in commands {
            let sock = lab.root().join(node).join("switchd.sock");
            let out = std::process::Command::new(super::oxvsctl())
                .arg("--socket")
                .arg(&sock)
                .args(*args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            s += &format!("--- {node}: oxvsctl {} ---\n{out}", args.join(" "));
        }
    }
    s
}
