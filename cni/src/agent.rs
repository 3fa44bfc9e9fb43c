//! The plugin's side of the agent's CNI socket: one [`CniRequest`] line
//! out, one [`CniResponse`] line back, under one deadline.
//!
//! The deadline covers connect, write and read together. A blocking
//! `connect(2)` on a Unix socket has no timeout of its own (it waits while
//! the listener's backlog is full), so the exchange runs on a helper thread
//! and the caller waits for it with `recv_timeout`; the socket also gets
//! read/write timeouts of the remaining time so the helper ends by itself.
//! On a timeout the helper is abandoned (the plugin process exits right
//! after). An answer is limited to [`MAX_RESPONSE_BYTES`].
//!
//! Busy: an agent serving as many connections as its cap allows answers a
//! new one `"busy": true` (code 11) without reading the request
//! ([`oxvs_api::listen`]). [`call`] then retries on a new connection after
//! [`oxvs_api::listen::backoff`] (20 ms doubling to 1 s, with jitter), at
//! most [`MAX_BUSY_ATTEMPTS`] attempts in all and never past the deadline;
//! only when they are used up does the runtime see the error: code 11
//! (try again later), or 50 for STATUS, saying how long it tried.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use oxvs_api::cni::{code, CniError, CniRequest, CniResponse, CNI_PROTOCOL_VERSION};

/// Largest answer accepted from the agent.
pub const MAX_RESPONSE_BYTES: u64 = 4 << 20;

/// Most attempts at an agent that answers busy, the first included
/// (about 7 s of backoff in all).
pub const MAX_BUSY_ATTEMPTS: u32 = 12;

/// Why the exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the oxvs agent is not reachable at {}: {source}", path.display())]
    Unreachable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the oxvs agent at {} did not answer within {timeout:?}", path.display())]
    Timeout { path: PathBuf, timeout: Duration },
    #[error("the oxvs agent at {} closed the connection without answering", path.display())]
    Closed { path: PathBuf },
    #[error("I/O error talking to the oxvs agent at {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot decode the oxvs agent's answer: {0}")]
    Decode(String),
}

impl AgentError {
    /// Failures that a later retry may cure (agent down, restarting, slow).
    pub fn is_transient(&self) -> bool {
        !matches!(self, AgentError::Decode(_))
    }
}

/// Sends `req` to the agent at `path` and returns its answer, all within
/// `timeout`; a busy answer is retried (see the module doc).
pub fn call(path: &Path, timeout: Duration, req: &CniRequest) -> Result<CniResponse, AgentError> {
    call_with(path, timeout, req, MAX_BUSY_ATTEMPTS)
}

/// [`call`] with at most `attempts` attempts at a busy agent.
pub fn call_with(
    path: &Path,
    timeout: Duration,
    req: &CniRequest,
    attempts: u32,
) -> Result<CniResponse, AgentError> {
    let started = Instant::now();
    let mut made = 0u32;
    loop {
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(AgentError::Timeout {
                path: path.to_path_buf(),
                timeout,
            });
        }
        let resp = call_once(path, left, req).map_err(|e| match e {
            AgentError::Timeout { path, .. } => AgentError::Timeout { path, timeout },
            e => e,
        })?;
        if !resp.busy {
            return Ok(resp);
        }
        made += 1;
        let wait = oxvs_api::listen::backoff(made - 1);
        if made >= attempts.max(1) || started.elapsed() + wait >= timeout {
            return Ok(gave_up(path, resp, made, started.elapsed(), req.command));
        }
        std::thread::sleep(wait);
    }
}

/// The answer after the last busy attempt: code 11 (50 for STATUS), what
/// was tried, and the agent's own message as details.
fn gave_up(
    path: &Path,
    last: CniResponse,
    attempts: u32,
    spent: Duration,
    command: oxvs_api::cni::CniCommand,
) -> CniResponse {
    let c = if command == oxvs_api::cni::CniCommand::Status {
        code::NOT_AVAILABLE
    } else {
        code::TRY_AGAIN_LATER
    };
    let said = last.error.map(|e| e.msg).unwrap_or_default();
    let mut r = CniResponse::failure(
        CniError::new(
            c,
            format!(
                "the oxvs agent at {} stayed busy (its connection cap was reached): {attempts} attempts in {:.1} s",
                path.display(),
                spent.as_secs_f64()
            ),
        )
        .with_details(said),
    );
    r.busy = true;
    r
}

fn call_once(path: &Path, timeout: Duration, req: &CniRequest) -> Result<CniResponse, AgentError> {
    let mut line = serde_json::to_vec(req).map_err(|e| AgentError::Decode(e.to_string()))?;
    line.push(b'\n');
    let deadline = Instant::now() + timeout;
    let (tx, rx) = mpsc::channel();
    let owned = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("oxvs-cni-agent".into())
        .spawn(move || {
            let _ = tx.send(exchange(&owned, deadline, &line));
        });
    if let Err(e) = spawned {
        return Err(AgentError::Io {
            path: path.to_path_buf(),
            source: e,
        });
    }
    let answer = match rx.recv_timeout(timeout) {
        Ok(r) => r.map_err(|e| match e {
            AgentError::Timeout { path, .. } => AgentError::Timeout { path, timeout },
            e => e,
        })?,
        Err(_) => {
            return Err(AgentError::Timeout {
                path: path.to_path_buf(),
                timeout,
            })
        }
    };
    let resp: CniResponse = serde_json::from_slice(&answer)
        .map_err(|e| AgentError::Decode(format!("{e} (answer: {})", preview(&answer))))?;
    if resp.v != CNI_PROTOCOL_VERSION {
        return Err(AgentError::Decode(format!(
            "agent speaks CNI socket protocol v{}, this plugin v{CNI_PROTOCOL_VERSION}",
            resp.v
        )));
    }
    Ok(resp)
}

fn exchange(path: &Path, deadline: Instant, line: &[u8]) -> Result<Vec<u8>, AgentError> {
    let timeout = |path: &Path| AgentError::Timeout {
        path: path.to_path_buf(),
        timeout: Duration::ZERO,
    };
    let stream = UnixStream::connect(path).map_err(|source| AgentError::Unreachable {
        path: path.to_path_buf(),
        source,
    })?;
    let remaining = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    let io = |source: std::io::Error| {
        if matches!(
            source.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            timeout(path)
        } else {
            AgentError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    };
    let left = remaining().ok_or_else(|| timeout(path))?;
    stream.set_write_timeout(Some(left)).map_err(io)?;
    // An agent that turned the connection away (busy) may have closed it
    // before the request went out; its answer is still there to read.
    let written = (&stream).write_all(line).and_then(|()| (&stream).flush());
    let write_failed = match written {
        Ok(()) => None,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            Some(e)
        }
        Err(e) => return Err(io(e)),
    };
    let left = remaining().ok_or_else(|| timeout(path))?;
    stream.set_read_timeout(Some(left)).map_err(io)?;
    let mut reader = BufReader::new((&stream).take(MAX_RESPONSE_BYTES));
    let mut answer = Vec::new();
    let read = reader.read_until(b'\n', &mut answer);
    if let Some(e) = write_failed {
        if read.is_err() || answer.iter().all(u8::is_ascii_whitespace) {
            return Err(io(e));
        }
    }
    read.map_err(io)?;
    if answer.iter().all(u8::is_ascii_whitespace) {
        return Err(AgentError::Closed {
            path: path.to_path_buf(),
        });
    }
    Ok(answer)
}

fn preview(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxvs_api::cni::CniCommand;
    use std::os::unix::net::UnixListener;

    fn req() -> CniRequest {
        CniRequest {
            v: CNI_PROTOCOL_VERSION,
            command: CniCommand::Status,
            container_id: String::new(),
            netns: String::new(),
            ifname: String::new(),
            args: Default::default(),
            config: serde_json::json!({}),
        }
    }

    fn serve_once(
        answer: &'static [u8],
    ) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<Vec<u8>>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.sock");
        let l = UnixListener::bind(&path).unwrap();
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut line = Vec::new();
            BufReader::new(&s).read_until(b'\n', &mut line).unwrap();
            (&s).write_all(answer).unwrap();
            line
        });
        (dir, path, h)
    }

    #[test]
    fn round_trip() {
        let (_d, path, h) = serve_once(b"{\"v\":1,\"ok\":true}\n");
        let r = call(&path, Duration::from_secs(5), &req()).unwrap();
        assert!(r.ok);
        let sent: CniRequest = serde_json::from_slice(&h.join().unwrap()).unwrap();
        assert_eq!(sent, req());
    }

    #[test]
    fn failures() {
        let dir = tempfile::tempdir().unwrap();
        let e = call(
            &dir.path().join("none.sock"),
            Duration::from_secs(1),
            &req(),
        )
        .unwrap_err();
        assert!(matches!(e, AgentError::Unreachable { .. }), "{e}");
        assert!(e.to_string().contains("none.sock"));
        let (_d, path, _h) = serve_once(b"");
        let e = call(&path, Duration::from_secs(5), &req()).unwrap_err();
        assert!(matches!(e, AgentError::Closed { .. }), "{e}");
        let (_d, path, _h) = serve_once(b"garbage\n");
        let e = call(&path, Duration::from_secs(5), &req()).unwrap_err();
        assert!(
            !e.is_transient() && e.to_string().contains("garbage"),
            "{e}"
        );
        let (_d, path, _h) = serve_once(b"{\"v\":2,\"ok\":true}\n");
        let e = call(&path, Duration::from_secs(5), &req()).unwrap_err();
        assert!(e.to_string().contains("v2"), "{e}");
    }

    /// An agent whose first `busy` connections are turned away busy
    /// (without reading the request, as the real one does when its
    /// connection cap is reached) and the rest answered `ok`.
    fn busy_then_ok(
        busy: usize,
        total: usize,
    ) -> (tempfile::TempDir, PathBuf, std::thread::JoinHandle<usize>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("busy.sock");
        let l = UnixListener::bind(&path).unwrap();
        let h = std::thread::spawn(move || {
            for n in 0..total {
                let (s, _) = l.accept().unwrap();
                if n < busy {
                    let r = CniResponse::busy("busy: 1 CNI connection already; retry");
                    let mut line = serde_json::to_vec(&r).unwrap();
                    line.push(b'\n');
                    let _ = (&s).write_all(&line);
                    continue; // closed unread
                }
                let mut line = Vec::new();
                BufReader::new(&s).read_until(b'\n', &mut line).unwrap();
                (&s).write_all(b"{\"v\":1,\"ok\":true}\n").unwrap();
                return n + 1;
            }
            total
        });
        (dir, path, h)
    }

    #[test]
    fn busy_is_retried_until_the_agent_has_room() {
        let (_d, path, h) = busy_then_ok(3, 10);
        let t0 = Instant::now();
        let r = call(&path, Duration::from_secs(10), &req()).unwrap();
        assert!(r.ok && !r.busy, "{r:?}");
        assert_eq!(h.join().unwrap(), 4, "three busy answers, then served");
        // 20 + 40 + 80 ms of backoff at least
        assert!(
            t0.elapsed() >= Duration::from_millis(140),
            "{:?}",
            t0.elapsed()
        );
    }

    #[test]
    fn busy_until_the_attempts_are_used_up_is_code_11() {
        let (_d, path, h) = busy_then_ok(100, 4);
        let r = call_with(&path, Duration::from_secs(10), &req_add(), 4).unwrap();
        assert_eq!(h.join().unwrap(), 4);
        let e = r.error.expect("an error");
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
        assert!(
            e.msg.contains("stayed busy") && e.msg.contains("4 attempts"),
            "{e}"
        );
        assert!(e.details.contains("busy: 1 CNI connection"), "{e}");
        // STATUS: not available, 50
        let (_d, path, _h) = busy_then_ok(100, 2);
        let r = call_with(&path, Duration::from_secs(10), &req(), 2).unwrap();
        assert_eq!(r.error.map(|e| e.code), Some(code::NOT_AVAILABLE));
    }

    fn req_add() -> CniRequest {
        CniRequest {
            command: CniCommand::Add,
            ..req()
        }
    }

    #[test]
    fn silent_agent_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slow.sock");
        let _l = UnixListener::bind(&path).unwrap(); // never accepts, never answers
        let t0 = Instant::now();
        let e = call(&path, Duration::from_millis(200), &req()).unwrap_err();
        assert!(matches!(e, AgentError::Timeout { .. }), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3));
    }
}
