//! The pod server (`oxvs-lab serve`, hidden): what runs "in the
//! container" so that probes have something to reach.
//!
//! One process per pod, one thread per declared port:
//! - TCP: accept, write `<id>\n`, close.
//! - UDP: echo every datagram back to its sender, prefixed by nothing
//!   (the probe only needs an answer).
//! - SCTP (one-to-one style socket): accept, send `<id>\n`, close. When the
//!   kernel has no SCTP, the port is skipped with a log line
//!   `SCTP unsupported: ...` and the other ports still serve.
//!
//! When every listener is bound the server prints `ready` on its output,
//! which `apply` waits for, so probes right after `apply` do not race the
//! server's start. It runs until killed. The process is tiny and
//! single-purpose, so it writes plain lines to stderr instead of carrying
//! a `tracing` subscriber.

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, UdpSocket};

use socket2::{Domain, Protocol as SockProto, Socket, Type};

use crate::probe::IPPROTO_SCTP;

/// What to serve.
#[derive(Clone, Debug, Default)]
pub struct ServeConfig {
    pub id: String,
    /// The address to listen on (default: every address). A host-network
    /// server on a node with several addresses binds one, so that UDP
    /// answers leave from the address the request was sent to. Either
    /// family (an IPv6-only node's server binds its IPv6 address).
    pub address: Option<IpAddr>,
    pub tcp: Vec<u16>,
    pub udp: Vec<u16>,
    pub sctp: Vec<u16>,
    /// TCP, UDP and SCTP on one dual-stack socket on `::` (IPv4 clients
    /// seen as IPv4-mapped addresses): a dual-stack or IPv6-only pod.
    pub dual: bool,
}

impl ServeConfig {
    /// Where to listen on `port`: `::` when dual, else the address given,
    /// else IPv4's any address.
    fn at(&self, port: u16) -> SocketAddr {
        let ip = match (self.dual, self.address) {
            (true, _) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            (false, Some(a)) => a,
            (false, None) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        SocketAddr::new(ip, port)
    }

    /// A bound socket of type `ty` and `proto` for `port`, on
    /// [`ServeConfig::at`] (dual-stack on `::` when asked).
    fn bind(&self, ty: Type, proto: Option<SockProto>, port: u16) -> std::io::Result<Socket> {
        let at = self.at(port);
        let s = Socket::new(Domain::for_address(at), ty, proto)?;
        if self.dual {
            s.set_only_v6(false)?;
        }
        // As std's `TcpListener::bind` (a restarted server rebinds at once).
        if ty == Type::STREAM {
            s.set_reuse_address(true)?;
        }
        s.bind(&at.into())?;
        Ok(s)
    }
}

/// Binds everything, says `ready`, and serves forever. Fails only when no
/// port at all could be served.
pub fn serve(cfg: &ServeConfig) -> anyhow::Result<()> {
    let mut threads = Vec::new();
    let greeting = format!("{}\n", cfg.id).into_bytes();
    for &port in &cfg.tcp {
        let listener = cfg.bind(Type::STREAM, None, port).and_then(|s| {
            s.listen(128)?;
            Ok(TcpListener::from(s))
        });
        match listener {
            Ok(l) => {
                let g = greeting.clone();
                threads.push(std::thread::spawn(move || {
                    for mut s in l.incoming().flatten() {
                        let _ = s.write_all(&g);
                    }
                }));
            }
            Err(e) => eprintln!("TCP {port}: cannot listen: {e}"),
        }
    }
    for &port in &cfg.udp {
        match cfg.bind(Type::DGRAM, None, port).map(UdpSocket::from) {
            Ok(u) => threads.push(std::thread::spawn(move || {
                // Large enough for any datagram: the fragment tests echo 4000+ bytes.
                let mut buf = vec![0u8; 65536];
                loop {
                    match u.recv_from(&mut buf) {
                        Ok((n, from)) => {
                            let _ = u.send_to(&buf[..n], from);
                        }
                        Err(e) => eprintln!("UDP {port}: {e}"),
                    }
                }
            })),
            Err(e) => eprintln!("UDP {port}: cannot bind: {e}"),
        }
    }
    for &port in &cfg.sctp {
        match sctp_listener(cfg, port) {
            Ok(l) => {
                let g = greeting.clone();
                threads.push(std::thread::spawn(move || loop {
                    if let Ok((s, _)) = l.accept() {
                        let _ = s.send(&g);
                    }
                }));
            }
            Err(e) => eprintln!("SCTP {port}: {e}"),
        }
    }
    let wanted = cfg.tcp.len() + cfg.udp.len() + cfg.sctp.len();
    if wanted > 0 && threads.is_empty() {
        anyhow::bail!("no port could be served");
    }
    crate::say!("ready ({} of {wanted} ports serving)", threads.len());
    let _ = std::io::stdout().flush();
    for t in threads {
        let _ = t.join();
    }
    // No ports: stay alive anyway, like a container with nothing to serve.
    loop {
        std::thread::park();
    }
}

fn sctp_listener(cfg: &ServeConfig, port: u16) -> Result<Socket, String> {
    let s = cfg
        .bind(Type::STREAM, Some(SockProto::from(IPPROTO_SCTP)), port)
        .map_err(
            |e| match e.raw_os_error().map(nix::errno::Errno::from_raw) {
                Some(
                    nix::errno::Errno::EPROTONOSUPPORT
                    | nix::errno::Errno::ESOCKTNOSUPPORT
                    | nix::errno::Errno::EAFNOSUPPORT,
                ) => format!("SCTP unsupported: {e}"),
                _ => format!("cannot bind: {e}"),
            },
        )?;
    s.listen(64).map_err(|e| format!("cannot listen: {e}"))?;
    Ok(s)
}
