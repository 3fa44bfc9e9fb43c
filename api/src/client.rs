//! A blocking client for the control socket.
//!
//! One [`Client`] is one connection; calls are sequential (a request line,
//! then its response line). Every call has a deadline ([`Client::set_timeout`],
//! default [`DEFAULT_TIMEOUT`]; a `packet-in` call adds its `wait_ms`): the
//! whole response must arrive before it, however slowly it trickles in.
//! Errors say which socket and why, and tell "the switch refused"
//! ([`ClientError::Refused`]) from "cannot talk to the switch" (every other
//! variant).
//!
//! Busy: a switch serving as many control connections as its cap allows
//! answers a new one `"busy": true` and closes it ([`crate::listen`]). The
//! client then reconnects after [`listen::backoff`] and sends the request
//! again, until the call's deadline; only then is it
//! [`ClientError::Busy`]. Nothing was done on a connection turned away
//! busy, so the retry cannot apply a request twice.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::listen;
use crate::protocol::{Request, Response, MAX_LINE, MAX_PACKET_IN_WAIT_MS};

/// Deadline of a call unless set otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection could be made.
    #[error("cannot reach oxvs-switchd at {}: {}", .path.display(), connect_reason(.source))]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The connection broke while sending or receiving.
    #[error("lost the connection to oxvs-switchd at {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// No (complete) response before the deadline.
    #[error("oxvs-switchd at {} did not answer within {after:?}", .path.display())]
    Timeout { path: PathBuf, after: Duration },
    /// The switch closed the connection without answering.
    #[error("oxvs-switchd at {} closed the connection without answering", .path.display())]
    Closed { path: PathBuf },
    /// The answer was not a protocol response (or not the expected result).
    #[error("bad response from oxvs-switchd at {}: {msg}", .path.display())]
    BadResponse { path: PathBuf, msg: String },
    /// The switch answered with an error: the request was refused.
    #[error("{0}")]
    Refused(String),
    /// The switch turned every attempt away as busy until the deadline.
    #[error("oxvs-switchd at {} stayed busy for {after:?} ({attempts} attempts): {msg}", .path.display())]
    Busy {
        path: PathBuf,
        after: Duration,
        attempts: u32,
        msg: String,
    },
}

impl ClientError {
    /// True when the switch could not be talked to (as opposed to refusing).
    pub fn is_unreachable(&self) -> bool {
        !matches!(self, ClientError::Refused(_))
    }
}

fn connect_reason(e: &std::io::Error) -> String {
    match e.kind() {
        ErrorKind::NotFound => "no such socket (is oxvs-switchd running?)".into(),
        ErrorKind::ConnectionRefused => {
            "connection refused (stale socket: no oxvs-switchd is listening)".into()
        }
        ErrorKind::PermissionDenied => "permission denied (the socket is mode 0600, root)".into(),
        _ => e.to_string(),
    }
}

/// A connection to oxvs-switchd's control socket.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    stream: UnixStream,
    timeout: Duration,
    /// Bytes received after the last response line (normally none).
    pending: Vec<u8>,
}

impl Client {
    /// Connects to the socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let path = path.as_ref().to_path_buf();
        match UnixStream::connect(&path) {
            Ok(stream) => Ok(Client {
                path,
                stream,
                timeout: DEFAULT_TIMEOUT,
                pending: Vec::new(),
            }),
            Err(source) => Err(ClientError::Connect { path, source }),
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the deadline of each following call.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sends `req`; the result value on success, [`ClientError::Refused`]
    /// with the switch's message on refusal.
    pub fn call(&mut self, req: &Request) -> Result<Value, ClientError> {
        let mut timeout = self.timeout;
        if let Request::PacketIn { wait_ms, .. } = req {
            timeout += Duration::from_millis((*wait_ms).min(MAX_PACKET_IN_WAIT_MS));
        }
        let resp = self.exchange_retrying_busy(&req.to_line(), timeout)?;
        resp.into_result().map_err(ClientError::Refused)
    }

    /// [`Client::exchange`]; a busy answer is retried on a new connection
    /// after a backoff, as long as the deadline allows.
    fn exchange_retrying_busy(
        &mut self,
        line: &str,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            let resp = self.exchange(line, left.max(Duration::from_millis(1)))?;
            if !resp.busy {
                return Ok(resp);
            }
            let wait = listen::backoff(attempt);
            attempt += 1;
            if started.elapsed() + wait >= timeout {
                return Err(ClientError::Busy {
                    path: self.path.clone(),
                    after: started.elapsed(),
                    attempts: attempt,
                    msg: resp.error.unwrap_or_default(),
                });
            }
            std::thread::sleep(wait);
            self.stream =
                UnixStream::connect(&self.path).map_err(|source| ClientError::Connect {
                    path: self.path.clone(),
                    source,
                })?;
            self.pending.clear();
        }
    }

    /// [`Client::call`], decoding the result as `T`.
    pub fn call_as<T: DeserializeOwned>(&mut self, req: &Request) -> Result<T, ClientError> {
        let v = self.call(req)?;
        serde_json::from_value(v).map_err(|e| ClientError::BadResponse {
            path: self.path.clone(),
            msg: format!("unexpected result for '{}': {e}", req.op()),
        })
    }

    /// Sends one raw line (which must not contain a newline) and returns the
    /// response as received, refusal or not. For tests and debugging.
    pub fn call_raw(&mut self, line: &str) -> Result<Response, ClientError> {
        self.exchange(line, self.timeout)
    }

    fn io_err(&self, source: std::io::Error) -> ClientError {
        ClientError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn exchange(&mut self, line: &str, timeout: Duration) -> Result<Response, ClientError> {
        let deadline = Instant::now() + timeout;
        let timed_out = |path: &Path| ClientError::Timeout {
            path: path.to_path_buf(),
            after: timeout,
        };
        self.stream
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(|e| self.io_err(e))?;
        let mut msg = Vec::with_capacity(line.len() + 1);
        msg.extend_from_slice(line.as_bytes());
        msg.push(b'\n');
        // A server that turned the connection away (busy) may have closed
        // it before the request went out: the write then fails, but its
        // answer is waiting to be read.
        let mut write_failed = None;
        if let Err(e) = self
            .stream
            .write_all(&msg)
            .and_then(|()| self.stream.flush())
        {
            match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => return Err(timed_out(&self.path)),
                ErrorKind::BrokenPipe | ErrorKind::ConnectionReset => write_failed = Some(e),
                _ => return Err(self.io_err(e)),
            }
        }
        if let Some(e) = write_failed {
            return match self.read_response(deadline, timeout) {
                Ok(r) if r.busy => Ok(r),
                _ => Err(self.io_err(e)),
            };
        }
        self.read_response(deadline, timeout)
    }

    fn read_response(
        &mut self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Response, ClientError> {
        let timed_out = |path: &Path| ClientError::Timeout {
            path: path.to_path_buf(),
            after: timeout,
        };
        let mut buf = std::mem::take(&mut self.pending);
        let mut chunk = vec![0u8; 64 * 1024];
        let line_end = loop {
            if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                break pos;
            }
            if buf.len() > MAX_LINE {
                return Err(ClientError::BadResponse {
                    path: self.path.clone(),
                    msg: format!("response longer than {MAX_LINE} bytes"),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(&self.path));
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| self.io_err(e))?;
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    return Err(ClientError::Closed {
                        path: self.path.clone(),
                    })
                }
                Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(timed_out(&self.path))
                }
                Err(e) => return Err(self.io_err(e)),
            }
        };
        self.pending = buf.split_off(line_end + 1);
        buf.truncate(line_end);
        serde_json::from_slice(&buf).map_err(|e| ClientError::BadResponse {
            path: self.path.clone(),
            msg: format!("not a protocol response: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::UnixListener;

    fn temp_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("oxvs-api-{tag}-{}.sock", std::process::id()))
    }

    #[test]
    fn connect_errors_name_socket_and_reason() {
        let p = temp_path("absent");
        let _ = std::fs::remove_file(&p);
        let e = Client::connect(&p).unwrap_err();
        assert!(e.is_unreachable());
        let s = e.to_string();
        assert!(s.contains(&p.display().to_string()), "{s}");
        assert!(s.contains("no such socket"), "{s}");
    }

    #[test]
    fn deadline_and_closed_connection() {
        let p = temp_path("slow");
        let _ = std::fs::remove_file(&p);
        let l = UnixListener::bind(&p).unwrap();
        let server = std::thread::spawn(move || {
            // First connection: read the request, never answer, then hang up.
            let (s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            drop(r);
            // Second: answer in two pieces, then a refusal.
            let (mut s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            s.write_all(br#"{"v":1,"ok":tr"#).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            s.write_all(b"ue,\"result\":{\"version\":\"x\",\"protocol\":1}}\n")
                .unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            s.write_all(b"{\"v\":1,\"ok\":false,\"error\":\"nope\"}\n")
                .unwrap();
            line.clear();
            r.read_line(&mut line).unwrap();
            s.write_all(b"garbage\n").unwrap();
        });
        let mut c = Client::connect(&p).unwrap();
        c.set_timeout(Duration::from_millis(100));
        let e = c.call(&Request::Version).unwrap_err();
        assert!(matches!(e, ClientError::Timeout { .. }), "{e}");
        assert!(e.is_unreachable());

        let mut c = Client::connect(&p).unwrap();
        let v: crate::VersionResult = c.call_as(&Request::Version).unwrap();
        assert_eq!(v.protocol, 1);
        let e = c.call(&Request::Stats).unwrap_err();
        assert!(matches!(&e, ClientError::Refused(m) if m == "nope"), "{e}");
        assert!(!e.is_unreachable());
        let e = c.call(&Request::Stats).unwrap_err();
        assert!(matches!(e, ClientError::BadResponse { .. }), "{e}");
        server.join().unwrap();
        let _ = std::fs::remove_file(&p);
    }
}
