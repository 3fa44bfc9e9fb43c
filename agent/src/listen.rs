//! The agent's listeners (CNI socket, API socket, `/metrics`) under a
//! connection cap and an idle timeout: the tokio side of
//! [`oxvs_api::listen`].
//!
//! [`serve_gated`] accepts connections, admits at most the cap at once
//! ([`Gate`]) and answers one more with the listener's "busy, retry" bytes
//! (read first, briefly, so that closing does not reset a TCP connection
//! with the request unread and lose the answer). An admitted connection is
//! handed to the handler wrapped in an [`IdleStream`]: a read or write
//! that makes no progress for the idle timeout fails with an [`Idle`]
//! error, which ends the handler (it propagates with `?`) and is counted
//! in the listener's [`oxvs_api::listen::ListenStats`].
//!
//! The timer runs only while an operation is pending: the time a handler
//! spends working on a request (an ADD can take seconds) is not idleness.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use oxvs_api::listen::Gate;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::time::Sleep;

/// How long a turned-away connection may take to send its request and
/// take the busy answer.
const BUSY_IO_TIMEOUT: Duration = Duration::from_millis(100);

/// The error a read or write of an [`IdleStream`] fails with when the
/// peer sat idle for the timeout (kind `TimedOut`; see [`is_idle`]).
#[derive(Debug, thiserror::Error)]
#[error("the peer sent or took nothing for {0:?} (idle timeout)")]
pub struct Idle(pub Duration);

/// Whether `e` is an [`Idle`] error.
pub fn is_idle(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Idle>())
}

/// A stream whose reads and writes fail with [`Idle`] after `idle` without
/// progress.
#[derive(Debug)]
pub struct IdleStream<S> {
    inner: S,
    idle: Duration,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_timer: Option<Pin<Box<Sleep>>>,
}

impl<S> IdleStream<S> {
    pub fn new(inner: S, idle: Duration) -> IdleStream<S> {
        IdleStream {
            inner,
            idle,
            read_timer: None,
            write_timer: None,
        }
    }
}

/// Pending: arm the timer (from the first pending poll of this wait) and
/// fail once it fires. Ready: disarm it.
fn watch<T>(
    r: Poll<io::Result<T>>,
    timer: &mut Option<Pin<Box<Sleep>>>,
    idle: Duration,
    cx: &mut Context<'_>,
) -> Poll<io::Result<T>> {
    match r {
        Poll::Ready(r) => {
            *timer = None;
            Poll::Ready(r)
        }
        Poll::Pending => {
            let t = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
            match t.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    *timer = None;
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, Idle(idle))))
                }
                Poll::Pending => Poll::Pending,
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        watch(r, &mut this.read_timer, this.idle, cx)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        watch(r, &mut this.write_timer, this.idle, cx)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        watch(r, &mut this.write_timer, this.idle, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        watch(r, &mut this.write_timer, this.idle, cx)
    }
}

/// A listener [`serve_gated`] can accept from.
pub trait Accept: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept_one(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

impl Accept for tokio::net::TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn accept_one(&self) -> io::Result<Self::Stream> {
        self.accept().await.map(|(s, _)| s)
    }
}

/// Serves `listener` forever: each admitted connection runs `handler` on
/// a task of its own; beyond the gate's cap a connection gets `busy` and
/// is closed. `what` names the listener in logs.
pub async fn serve_gated<L, F, Fut>(
    listener: L,
    gate: Gate,
    what: &'static str,
    busy: Vec<u8>,
    handler: F,
) where
    L: Accept,
    F: Fn(IdleStream<L::Stream>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<()>> + Send + 'static,
{
    let handler = Arc::new(handler);
    let busy: Arc<[u8]> = busy.into();
    loop {
        let stream = match listener.accept_one().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(socket = what, error = %e, "accept failed");
                // EMFILE and friends: do not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(permit) = gate.try_enter() else {
            tracing::debug!(
                socket = what,
                max = gate.limits().max_connections,
                "busy: a connection turned away"
            );
            tokio::spawn(turn_away(stream, busy.clone()));
            continue;
        };
        let idle = gate.limits().idle_timeout;
        let stats = gate.stats();
        let handler = handler.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match handler(IdleStream::new(stream, idle)).await {
                Ok(()) => {}
                Err(e) if is_idle(&e) => {
                    stats.idle_closed();
                    tracing::debug!(socket = what, "idle connection closed");
                }
                Err(e) => tracing::debug!(socket = what, error = %e, "connection ended badly"),
            }
        });
    }
}

/// Reads what the client sent (briefly), answers `busy`, closes.
async fn turn_away<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, busy: Arc<[u8]>) {
    let mut buf = [0u8; 2048];
    let _ = tokio::time::timeout(BUSY_IO_TIMEOUT, s.read(&mut buf)).await;
    let _ = tokio::time::timeout(BUSY_IO_TIMEOUT, async {
        s.write_all(&busy).await?;
        s.shutdown().await
    })
    .await;
    let _ = tokio::time::timeout(BUSY_IO_TIMEOUT, s.read(&mut buf)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt as _;

    #[tokio::test]
    async fn idle_reads_fail_and_work_time_is_not_idleness() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut s = IdleStream::new(a, Duration::from_millis(100));
        b.write_all(b"x\n").await.unwrap();
        let mut line = String::new();
        tokio::io::BufReader::new(&mut s)
            .read_line(&mut line)
            .await
            .unwrap();
        // "work" longer than the timeout between two reads
        tokio::time::sleep(Duration::from_millis(150)).await;
        b.write_all(b"y").await.unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one)
            .await
            .expect("not idle: it was working");
        let t0 = std::time::Instant::now();
        let e = s.read_exact(&mut one).await.unwrap_err();
        assert!(is_idle(&e), "{e}");
        assert!(t0.elapsed() >= Duration::from_millis(90));
        assert!(e.to_string().contains("idle"), "{e}");
    }
}
