//! The daemons' listening sockets: created private, with a connection cap
//! and an idle timeout.
//!
//! Used by every listener of oxvs-switchd (control socket, `/metrics`) and
//! oxvs-agent (CNI socket, API socket, `/metrics`): one implementation of
//! "who may connect, how many at once, how long may they sit idle", so the
//! five listeners cannot drift apart.
//!
//! ## Private from the first instant: [`bind_private_unix`]
//!
//! A Unix socket file takes its mode when `bind(2)` creates it. Binding
//! with the standard library and `chmod`-ing afterwards leaves a window in
//! which the file carries `0777 & ~umask` (with umask 000 or 002 anyone, or
//! the group, could connect in that window and keep the connection). The
//! ways to close the window, and why this one:
//!
//! - `umask(077)` before `bind`: the umask is per process, not per thread.
//!   In a multithreaded daemon (tokio's workers, switchd's datapath and
//!   control threads) another thread creating a file at the same moment
//!   would get the restrictive mask, or, worse, the restore would race a
//!   concurrent bind. Only safe before any thread exists, which ties
//!   listener creation to process start (the agent serves its API socket
//!   after the runtime is up; tests create servers in threaded harnesses).
//! - bind inside a fresh `0700` directory, `chmod`, then `rename(2)` into
//!   place: correct on every POSIX system, but leaves temporary
//!   directories behind on a crash and the listener's own address is the
//!   temporary path.
//! - **`fchmod(2)` on the socket before `bind(2)`** (chosen): on Linux,
//!   `unix_bind` creates the file with the mode of the socket's own inode
//!   masked by the umask (`net/unix/af_unix.c`: `S_IFSOCK |
//!   (SOCK_INODE(sock)->i_mode & ~current_umask())`), so after
//!   `fchmod(fd, 0600)` the file is born `0600` (or stricter): there is no
//!   instant at which it has group or other bits, whatever the umask, and
//!   nothing process-wide is touched. oxvs is Linux-only (AF_XDP). As a
//!   belt, the mode is checked right after `bind`; a kernel that ignored
//!   the socket inode's mode would make the bind fail
//!   ([`ListenError::NotPrivate`]) instead of serving a world-accessible
//!   socket.
//!
//! Before binding, [`claim`] refuses a path held by a live server (one that
//! accepts a connection) and a path that is not a socket, and removes a
//! stale socket (connection refused).
//!
//! ## Caps and idle timeouts: [`Limits`], [`Gate`]
//!
//! Every accepted connection must enter the listener's [`Gate`] (at most
//! [`Limits::max_connections`] at once). One that cannot is answered "busy,
//! retry" in the listener's protocol (a `busy: true` response line on the
//! NDJSON sockets, code 11 plus `busy` on the CNI socket, HTTP 503 with
//! `Retry-After` on `/metrics`) and closed: clients retry with
//! [`backoff`] instead of failing. A connection that sends nothing for
//! [`Limits::idle_timeout`] while the server waits for a request is
//! closed. [`ListenStats`] counts both, for `/metrics`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
use nix::sys::stat::Mode;

/// The mode of every socket file the daemons create: owner only (root).
pub const SOCKET_MODE: u32 = 0o600;

/// Why a Unix socket could not be listened on.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("another server is listening on {}", .0.display())]
    AlreadyServing(PathBuf),
    #[error("{} exists and is not a socket; refusing to replace it", .0.display())]
    NotASocket(PathBuf),
    #[error("cannot create the socket directory {}: {source}", .dir.display())]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot remove the stale socket {}: {source}", .path.display())]
    RemoveStale {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {}: {step}: {source}", .path.display())]
    Socket {
        path: PathBuf,
        step: &'static str,
        source: std::io::Error,
    },
    #[error(
        "{} was created mode {mode:04o}, not {SOCKET_MODE:04o} (the kernel ignored the socket's mode); not serving it",
        .path.display()
    )]
    NotPrivate { path: PathBuf, mode: u32 },
}

/// Makes `path` free to bind: refuses a live server or a non-socket,
/// removes a stale socket. Creates the parent directory if missing.
pub fn claim(path: &Path) -> Result<(), ListenError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ListenError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ListenError::Socket {
                path: path.into(),
                step: "stat",
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ListenError::NotASocket(path.into()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ListenError::AlreadyServing(path.into())),
        Err(_) => std::fs::remove_file(path).map_err(|source| ListenError::RemoveStale {
            path: path.into(),
            source,
        }),
    }
}

/// Wakes the thread blocked in `accept` on listening socket `fd` (of any
/// family) for good: after `shutdown(2)` a pending `accept` and every later
/// one fail at once (`EINVAL`). Unlike connecting to the listener to wake
/// it, this works when its path is gone (or someone else's) or its address
/// unreachable. The caller sets its stop flag first.
pub fn wake_accept(fd: std::os::fd::RawFd) {
    let _ = socket::shutdown(fd, socket::Shutdown::Both);
}

/// [`claim`]s `path`, then creates a listening Unix stream socket there
/// whose file is mode [`SOCKET_MODE`] from the moment it exists (see the
/// module doc), close-on-exec, with the system's maximum backlog.
pub fn bind_private_unix(path: &Path) -> Result<UnixListener, ListenError> {
    claim(path)?;
    let err = |step: &'static str| {
        move |e: nix::Error| ListenError::Socket {
            path: path.into(),
            step,
            source: e.into(),
        }
    };
    let fd: OwnedFd = socket::socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(err("socket"))?;
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(SOCKET_MODE)).map_err(err("fchmod"))?;
    let addr = UnixAddr::new(path).map_err(err("address"))?;
    socket::bind(fd.as_raw_fd(), &addr).map_err(err("bind"))?;
    let mode = std::fs::symlink_metadata(path)
        .map_err(|source| ListenError::Socket {
            path: path.into(),
            step: "stat after bind",
            source,
        })?
        .permissions()
        .mode()
        & 0o777;
    if mode & !SOCKET_MODE != 0 {
        let _ = std::fs::remove_file(path);
        return Err(ListenError::NotPrivate {
            path: path.into(),
            mode,
        });
    }
    socket::listen(&fd, Backlog::MAXCONN).map_err(err("listen"))?;
    Ok(UnixListener::from(fd))
}

/// A listener's cap on simultaneous connections and its idle timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most connections served at once (>= 1); one more is answered busy.
    pub max_connections: usize,
    /// A connection that sends nothing for this long while a request is
    /// awaited is closed (> 0).
    pub idle_timeout: Duration,
}

impl Limits {
    /// `Limits`, refusing a zero cap or a zero timeout with a message that
    /// names the flag (`what`) and the value.
    pub fn new(
        what: &str,
        max_connections: usize,
        idle_timeout: Duration,
    ) -> Result<Limits, String> {
        if max_connections == 0 {
            return Err(format!(
                "{what}: a connection cap of 0 would refuse every client (at least 1)"
            ));
        }
        if idle_timeout.is_zero() {
            return Err(format!(
                "{what}: an idle timeout of 0 would close every connection at once"
            ));
        }
        Ok(Limits {
            max_connections,
            idle_timeout,
        })
    }
}

/// Parses a duration flag: a whole number with a unit, `ms`, `s` or `m`
/// (`500ms`, `30s`, `2m`). The error names the value and the form.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() || !t.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(format!(
            "'{s}' is not a duration (a whole number and ms, s or m: 30s)"
        ));
    }
    let split = t
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("'{s}' has no unit: write e.g. {t}s or {t}ms"))?;
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (a whole number and ms, s or m: 30s)"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        _ => {
            return Err(format!(
                "'{s}': unknown unit '{unit}' (ms, s or m: 500ms, 30s, 2m)"
            ))
        }
    };
    if d > Duration::from_secs(24 * 3600) {
        return Err(format!("'{s}' is longer than a day"));
    }
    Ok(d)
}

/// What a listener did, for `/metrics`.
#[derive(Debug, Default)]
pub struct ListenStats {
    /// Connections being served now.
    pub active: AtomicU64,
    /// Connections admitted since start.
    pub accepted_total: AtomicU64,
    /// Connections answered "busy, retry" because the cap was reached.
    pub busy_total: AtomicU64,
    /// Connections closed because they sat idle past the timeout.
    pub idle_closed_total: AtomicU64,
}

impl ListenStats {
    /// Counts one idle disconnection.
    pub fn idle_closed(&self) {
        self.idle_closed_total.fetch_add(1, Ordering::Relaxed);
    }
}

/// Admission of connections under a cap ([`Gate::try_enter`]).
#[derive(Clone, Debug)]
pub struct Gate {
    limits: Limits,
    stats: Arc<ListenStats>,
}

/// A connection's place in its [`Gate`]; freed on drop.
#[derive(Debug)]
pub struct Permit {
    stats: Arc<ListenStats>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.stats.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gate {
    pub fn new(limits: Limits) -> Gate {
        Gate {
            limits,
            stats: Arc::default(),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The counters, shared with whoever exports them.
    pub fn stats(&self) -> Arc<ListenStats> {
        self.stats.clone()
    }

    /// A permit if fewer than the cap are being served; `None` (counted as
    /// busy) otherwise.
    pub fn try_enter(&self) -> Option<Permit> {
        let max = self.limits.max_connections as u64;
        let admitted = self
            .stats
            .active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            self.stats.accepted_total.fetch_add(1, Ordering::Relaxed);
            Some(Permit {
                stats: self.stats.clone(),
            })
        } else {
            self.stats.busy_total.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// How long a client waits before its `attempt`-th retry (0-based) after
/// a "busy" answer: 20 ms doubling to at most 1 s, plus up to 50% jitter
/// so that clients turned away together do not come back together.
pub fn backoff(attempt: u32) -> Duration {
    let base = 20u64.saturating_mul(1u64 << attempt.min(6)).min(1000);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0) as u64;
    let jitter = (nanos ^ u64::from(std::process::id())) % (base / 2 + 1);
    Duration::from_millis(base + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for (bad, says) in [
            ("30", "no unit"),
            ("x", "not a duration"),
            ("5h", "unknown unit 'h'"),
            ("-1s", "not a duration"),
            ("99999m", "longer than a day"),
            ("", "not a duration"),
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn limits_refuse_zero() {
        assert!(Limits::new("--x", 0, Duration::from_secs(1))
            .unwrap_err()
            .contains("--x"));
        assert!(Limits::new("--x", 1, Duration::ZERO)
            .unwrap_err()
            .contains("idle timeout"));
    }

    #[test]
    fn gate_caps_and_frees() {
        let g = Gate::new(Limits::new("t", 2, Duration::from_secs(1)).unwrap());
        let a = g.try_enter().expect("first");
        let b = g.try_enter().expect("second");
        assert!(g.try_enter().is_none(), "third is busy");
        drop(a);
        let c = g.try_enter().expect("a place was freed");
        let s = g.stats();
        assert_eq!(s.active.load(Ordering::Relaxed), 2);
        assert_eq!(s.accepted_total.load(Ordering::Relaxed), 3);
        assert_eq!(s.busy_total.load(Ordering::Relaxed), 1);
        drop((b, c));
        assert_eq!(s.active.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn backoff_grows_and_is_bounded() {
        assert!(backoff(0) >= Duration::from_millis(20) && backoff(0) <= Duration::from_millis(30));
        assert!(backoff(3) >= Duration::from_millis(160));
        assert!(backoff(40) <= Duration::from_millis(1500));
    }

    #[test]
    fn claim_refuses_live_servers_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(
            bind_private_unix(&file),
            Err(ListenError::NotASocket(_))
        ));
        let sock = dir.path().join("sub/s.sock");
        let live = bind_private_unix(&sock).expect("bind, parent created");
        let e = bind_private_unix(&sock).unwrap_err();
        assert!(matches!(e, ListenError::AlreadyServing(_)), "{e}");
        drop(live);
        // stale now: replaced
        let _again = bind_private_unix(&sock).expect("a stale socket is replaced");
        let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
    }
}
