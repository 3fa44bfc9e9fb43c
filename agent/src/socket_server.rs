//! The agent's line-protocol socket server, shared by the CNI socket
//! ([`crate::agent::cni::CniSocket`]) and the API socket
//! ([`crate::api::ApiSocket`]). A protocol ([`LineProtocol`]) gives its
//! limits, its "busy" and refusal answers, and a handler from one request
//! line to one response line; [`serve`] does everything else:
//!
//! - **Accepting, the cap, idleness** ([`crate::listen::serve_gated`],
//!   which `/metrics` uses too): one task per connection; beyond the
//!   listener's [`Gate`] a connection is answered the protocol's busy line
//!   and closed; a connection that sends or takes nothing for the idle
//!   timeout while the server waits for it is closed without an answer.
//! - **Framing**: a request is one line ending in `\n`, read with a bound
//!   of [`LineProtocol::MAX_LINE`] bytes, the newline included. A longer
//!   line is answered "request line longer than N bytes" (read no further)
//!   and the connection closed; a line that is not UTF-8 is answered
//!   "request is not UTF-8". Both answers are the protocol's
//!   ([`LineProtocol::refused`]); the handler sees neither. It gets the
//!   line without its trailing whitespace.
//! - **Requests per connection** ([`Requests`]): one (the connection is
//!   closed after the answer) or any number (until the client closes its
//!   side, an oversize line, or a last line without a newline, which is
//!   answered, then the connection closed).
//! - A client that closes before sending anything gets no answer.
//!
//! The server closes a connection with `shutdown` after its last answer.

use std::future::Future;
use std::io;
use std::sync::Arc;

use oxvs_api::listen::Gate;
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufReader,
};

use crate::listen::{serve_gated, Accept};

/// How many requests one connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requests {
    /// One: the connection is closed after its answer.
    One,
    /// Any number, each answered in turn, until the client closes.
    Many,
}

/// A line protocol [`serve`] serves: one request line in, one response
/// line out (both without the newline here).
pub trait LineProtocol: Send + Sync + 'static {
    /// What the handler works on (the agent).
    type State: Send + Sync + 'static;
    /// The socket's name in logs and in the listener metrics (`cni`, `api`).
    const NAME: &'static str;
    /// Longest request line accepted, its newline included.
    const MAX_LINE: usize;
    /// One request per connection, or many.
    const REQUESTS: Requests;
    /// The answer to a connection turned away because `max_connections`
    /// are being served ("busy, retry"; names the flag that sets the cap).
    fn busy(max_connections: usize) -> String;
    /// The answer to a line refused before the handler sees it (`why`:
    /// too long, not UTF-8).
    fn refused(why: &str) -> String;
    /// The answer to one request line (trailing whitespace removed).
    fn handle(state: &Self::State, line: &str) -> impl Future<Output = String> + Send;
}

/// Serves `P` on `listener` until the task is dropped.
pub async fn serve<P: LineProtocol, L: Accept>(state: Arc<P::State>, listener: L, gate: Gate) {
    let mut busy = P::busy(gate.limits().max_connections).into_bytes();
    busy.push(b'\n');
    serve_gated(listener, gate, P::NAME, busy, move |stream| {
        let state = state.clone();
        async move { serve_connection::<P, _>(&state, stream).await }
    })
    .await
}

/// Serves one admitted connection: reads request lines and writes the
/// answers, as the module doc says. An I/O error (the idle timeout's
/// included) ends it.
async fn serve_connection<P: LineProtocol, S>(state: &P::State, stream: S) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite,
{
    let (r, mut w) = tokio::io::split(stream);
    let mut reader = BufReader::new(r);
    loop {
        let mut line = Vec::new();
        let n = (&mut reader)
            .take(P::MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            // The client closed its side: nothing (more) to answer.
            return Ok(());
        }
        let too_long = line.len() > P::MAX_LINE;
        let answer = if too_long {
            refuse::<P>(&format!("request line longer than {} bytes", P::MAX_LINE))
        } else {
            match std::str::from_utf8(&line) {
                Ok(text) => P::handle(state, text.trim_end()).await,
                Err(_) => refuse::<P>("request is not UTF-8"),
            }
        };
        let mut out = answer.into_bytes();
        out.push(b'\n');
        w.write_all(&out).await?;
        if P::REQUESTS == Requests::One || too_long || !line.ends_with(b"\n") {
            return w.shutdown().await;
        }
    }
}

/// `P`'s answer to a line the handler does not see.
fn refuse<P: LineProtocol>(why: &str) -> String {
    tracing::debug!(socket = P::NAME, "request refused: {why}");
    P::refused(why)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use oxvs_api::listen::Limits;

    use super::*;

    /// Echoes each line; `ONE`: one request per connection.
    struct Echo<const ONE: bool>;

    impl<const ONE: bool> LineProtocol for Echo<ONE> {
        type State = ();
        const NAME: &'static str = "echo";
        const MAX_LINE: usize = 8;
        const REQUESTS: Requests = if ONE { Requests::One } else { Requests::Many };
        fn busy(max_connections: usize) -> String {
            format!("busy:{max_connections}")
        }
        fn refused(why: &str) -> String {
            format!("refused:{why}")
        }
        async fn handle(_: &(), line: &str) -> String {
            format!("echo:{line}")
        }
    }

    /// What a connection served by `P` answers to `sent` (the client
    /// closes its side after sending when `close`).
    async fn exchange<P: LineProtocol<State = ()>>(sent: &[u8], close: bool) -> String {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(async move { serve_connection::<P, _>(&(), server).await });
        client.write_all(sent).await.unwrap();
        if close {
            client.shutdown().await.unwrap();
        }
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut got))
            .await
            .expect("the server closes the connection")
            .unwrap();
        task.await.unwrap().unwrap();
        String::from_utf8(got).unwrap()
    }

    #[tokio::test]
    async fn many_requests_are_answered_until_the_client_closes() {
        let got = exchange::<Echo<false>>(b"a\n b \r\n\nc\n", true).await;
        assert_eq!(got, "echo:a\necho: b\necho:\necho:c\n");
    }

    #[tokio::test]
    async fn one_request_per_connection_then_closed() {
        // Not closed by the client: the server closes after one answer.
        let got = exchange::<Echo<true>>(b"a\nb\n", false).await;
        assert_eq!(got, "echo:a\n");
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_refused_and_closes_the_connection() {
        // 8 bytes with the newline: the limit.
        assert_eq!(
            exchange::<Echo<false>>(b"1234567\n", true).await,
            "echo:1234567\n"
        );
        let got = exchange::<Echo<false>>(b"12345678\nnext\n", false).await;
        assert_eq!(got, "refused:request line longer than 8 bytes\n");
        let got = exchange::<Echo<true>>(b"0123456789abcdef", false).await;
        assert_eq!(got, "refused:request line longer than 8 bytes\n");
    }

    #[tokio::test]
    async fn a_line_that_is_not_utf8_is_refused_and_the_next_served() {
        let got = exchange::<Echo<false>>(b"\xff\xfe\nok\n", true).await;
        assert_eq!(got, "refused:request is not UTF-8\necho:ok\n");
        let got = exchange::<Echo<true>>(b"\xc3\n", false).await;
        assert_eq!(got, "refused:request is not UTF-8\n");
    }

    #[tokio::test]
    async fn a_last_line_without_newline_is_answered_and_a_silent_client_is_not() {
        assert_eq!(
            exchange::<Echo<false>>(b"a\nb", true).await,
            "echo:a\necho:b\n"
        );
        assert_eq!(exchange::<Echo<false>>(b"", true).await, "");
        assert_eq!(exchange::<Echo<true>>(b"", true).await, "");
    }

    /// Through a real socket: over the cap a connection gets the busy
    /// line; the idle one holding the place is closed without an answer,
    /// and the place is free again.
    #[tokio::test]
    async fn over_the_cap_busy_and_idle_connections_closed() {
        use tokio::io::AsyncBufReadExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("echo.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let idle = Duration::from_millis(300);
        let gate = Gate::new(Limits::new("--echo", 1, idle).unwrap());
        let stats = gate.stats();
        let server = tokio::spawn(serve::<Echo<false>, _>(Arc::new(()), listener, gate));
        let ask = |req: &'static str| {
            let path = path.clone();
            async move {
                let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
                s.write_all(req.as_bytes()).await.unwrap();
                let mut line = String::new();
                tokio::io::BufReader::new(s)
                    .read_line(&mut line)
                    .await
                    .unwrap();
                line
            }
        };
        let mut held = tokio::net::UnixStream::connect(&path).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(ask("x\n").await, "busy:1\n");
        let t0 = std::time::Instant::now();
        let mut rest = Vec::new();
        held.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "no answer to a silent client: {rest:?}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(ask("x\n").await, "echo:x\n");
        use std::sync::atomic::Ordering::Relaxed;
        assert_eq!(stats.busy_total.load(Relaxed), 1);
        assert_eq!(stats.idle_closed_total.load(Relaxed), 1);
        server.abort();
    }
}
