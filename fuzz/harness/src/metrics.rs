//! `metrics_http`: the `/metrics` endpoint's HTTP request handling.
//!
//! Most inputs go, as bytes on a TCP connection, to a real
//! [`MetricsServer`] of `oxvs-switchd` on 127.0.0.1 (its read loop, the
//! head-size limit, then [`prom::respond`]); the harness writes the input,
//! closes its sending side and reads the answer. Checked: an answer is one
//! well-formed HTTP/1.1 response whose `Content-Length` is its body's length
//! (or, for HEAD, what GET would send); its status is the one
//! [`prom::respond`] gives the same head (413 for a head over
//! [`prom::MAX_REQUEST_HEAD`]); a 200 body is a valid exposition
//! ([`prom::parse`]); and a request whose head ends within the limit always
//! gets an answer.
//!
//! Inputs starting with 0xff instead exercise the pure halves directly:
//! [`prom::request_head_end`], [`prom::parse_request_head`] and
//! [`prom::respond`] on the rest of the input, and [`prom::parse`] on it as
//! exposition text.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use oxvs_api::metrics as prom;
use oxvs_switch::metrics::MetricsServer;

fn server() -> SocketAddr {
    static S: OnceLock<(MetricsServer, SocketAddr)> = OnceLock::new();
    S.get_or_init(|| {
        let switch = Arc::new(crate::common::start_switch());
        let s = MetricsServer::start("127.0.0.1:0".parse().expect("addr"), switch)
            .expect("start the metrics server");
        let a = s.local_addr();
        (s, a)
    })
    .1
}

/// A parsed response: status, headers (lower-case names), body.
struct Http {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn parse_response(bytes: &[u8]) -> Http {
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head ending in CRLF CRLF");
    let head = std::str::from_utf8(&bytes[..end]).expect("an ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("a status line");
    let mut parts = status_line.splitn(3, ' ');
    assert_eq!(parts.next(), Some("HTTP/1.1"), "{status_line}");
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .expect("a numeric status");
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(": ").expect("a header line");
            (k.to_ascii_lowercase(), v.to_string())
        })
        .collect();
    Http {
        status,
        headers,
        body: bytes[end + 4..].to_vec(),
    }
}

fn header<'a>(h: &'a Http, name: &str) -> Option<&'a str> {
    h.headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Checks `resp` as the answer to a request whose head is `head` (`None`:
/// a head over the limit).
fn check(resp: &[u8], head: Option<&[u8]>) {
    let h = parse_response(resp);
    let len: usize = header(&h, "content-length")
        .and_then(|v| v.parse().ok())
        .expect("a Content-Length");
    let is_head = head
        .and_then(|hd| prom::parse_request_head(hd).ok())
        .is_some_and(|r| r.method == "HEAD");
    if is_head {
        assert!(h.body.is_empty(), "a body in the answer to HEAD");
    } else {
        assert_eq!(h.body.len(), len, "Content-Length is not the body's length");
    }
    let want = match head {
        None => 413,
        Some(hd) => parse_response(&prom::respond(hd, String::new)).status,
    };
    assert_eq!(
        h.status,
        want,
        "status for {:?}",
        head.map(String::from_utf8_lossy)
    );
    if h.status == 200 && !is_head {
        let text = std::str::from_utf8(&h.body).expect("UTF-8 metrics");
        if let Err(e) = prom::parse(text) {
            panic!("the metrics are not a valid exposition: {e}");
        }
    }
}

pub fn run(data: &[u8]) {
    if let Some((0xff, rest)) = data.split_first() {
        pure(rest);
        return;
    }
    let addr = server();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.set_write_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    // The server may answer and close before reading everything (413):
    // a failed write or a reset read is then expected, not a finding.
    let wrote = s.write_all(data).is_ok();
    let _ = s.shutdown(Shutdown::Write);
    let mut resp = Vec::new();
    let read_ok = s.read_to_end(&mut resp).is_ok();
    let head_end = prom::request_head_end(data);
    match head_end {
        Some(n) if n <= prom::MAX_REQUEST_HEAD => {
            // Bytes after the head are never read: closing on them resets
            // the connection, which may lose the answer.
            if n == data.len() {
                assert!(wrote && read_ok, "connection failed for a complete head");
                assert!(!resp.is_empty(), "no answer to a complete request head");
            }
            if !resp.is_empty() {
                check(&resp, Some(&data[..n]));
            }
        }
        _ if resp.is_empty() => {
            // Closed before a full head, or the reset lost the answer.
            assert!(
                head_end.is_some() || data.len() <= prom::MAX_REQUEST_HEAD || !read_ok || !wrote,
                "no answer to an over-long head"
            );
        }
        _ => {
            // An over-long head: 413, or, when the head still ended within
            // what the server had read, the normal answer.
            let h = parse_response(&resp);
            if h.status != 413 {
                let n = head_end.expect("a non-413 answer needs a head");
                check(&resp, Some(&data[..n]));
            } else {
                check(&resp, None);
            }
        }
    }
}

fn pure(data: &[u8]) {
    let end = prom::request_head_end(data);
    if let Some(n) = end {
        assert!(n <= data.len());
        let head = &data[..n];
        assert!(head.ends_with(b"\n\n") || head.ends_with(b"\r\n\r\n"));
        let _ = prom::parse_request_head(head);
        let resp = prom::respond(head, || {
            "# HELP x_total X.\n# TYPE x_total counter\nx_total 1\n".to_string()
        });
        check(&resp, Some(head));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = prom::parse(text) {
            std::hint::black_box(p);
        }
    }
}
