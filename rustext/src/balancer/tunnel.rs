//! Upgraded connections (WebSocket after a `101`): bytes copied both ways
//! until either side closes or nothing moved, in either direction, for the
//! tunnel timeout (HAProxy's `timeout tunnel`). The client connection's
//! keep-alive and header timeouts no longer apply to it.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// When bytes last moved, shared by both sides of one tunnel.
struct Activity {
    start: Instant,
    /// Milliseconds since `start`.
    last: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        self.last.store(self.start.elapsed().as_millis() as u64, Relaxed);
    }
    fn idle_since(&self) -> Instant {
        self.start + Duration::from_millis(self.last.load(Relaxed))
    }
}

/// One side of the tunnel: counts what is read from it, notes activity.
struct Side<T> {
    io: T,
    seen: Arc<Activity>,
    read: u64,
}

impl<T: AsyncRead + Unpin> AsyncRead for Side<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            me.read += n as u64;
            me.seen.touch();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Side<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = Pin::new(&mut me.io).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            me.seen.touch();
        }
        r
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Both sides closed (or one failed).
    Closed,
    /// Nothing moved for the tunnel timeout.
    Idle,
}

/// Copy between `client` and `backend` until the tunnel ends; `idle` zero:
/// no inactivity limit. Returns (bytes client → backend, backend → client).
pub async fn relay<C, B>(client: C, backend: B, idle: Duration) -> (u64, u64, End)
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let seen = Arc::new(Activity { start: Instant::now(), last: AtomicU64::new(0) });
    let mut c = Side { io: client, seen: seen.clone(), read: 0 };
    let mut b = Side { io: backend, seen: seen.clone(), read: 0 };
    let end = {
        let copy = tokio::io::copy_bidirectional(&mut c, &mut b);
        tokio::pin!(copy);
        if idle.is_zero() {
            let _ = copy.await;
            End::Closed
        } else {
            loop {
                // One timer for the tunnel, re-armed from the last activity
                // only when it fires (not on every read or write).
                let deadline = seen.idle_since() + idle;
                tokio::select! {
                    _ = &mut copy => break End::Closed,
                    _ = tokio::time::sleep_until(deadline) => {
                        if seen.idle_since() + idle <= Instant::now() {
                            break End::Idle;
                        }
                    }
                }
            }
        }
    };
    (c.read, b.read, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn closes_after_inactivity_in_both_directions() {
        let (client, mut far_client) = tokio::io::duplex(1024);
        let (backend, mut far_backend) = tokio::io::duplex(1024);
        let t = tokio::spawn(relay(client, backend, Duration::from_secs(10)));
        let mut buf = [0u8; 5];
        for _ in 0..3 {
            // activity every 6 s, one direction then the other: never 10 s idle
            tokio::time::sleep(Duration::from_secs(6)).await;
            far_client.write_all(b"hello").await.unwrap();
            far_backend.read_exact(&mut buf).await.unwrap();
            tokio::time::sleep(Duration::from_secs(6)).await;
            far_backend.write_all(b"world").await.unwrap();
            far_client.read_exact(&mut buf).await.unwrap();
        }
        assert!(!t.is_finished());
        tokio::time::sleep(Duration::from_secs(11)).await;
        let (up, down, end) = t.await.unwrap();
        assert_eq!((up, down, end), (15, 15, End::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_limit_it_lasts_until_closed() {
        let (client, far_client) = tokio::io::duplex(1024);
        let (backend, far_backend) = tokio::io::duplex(1024);
        let t = tokio::spawn(relay(client, backend, Duration::ZERO));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!t.is_finished());
        drop(far_client);
        drop(far_backend);
        assert_eq!(t.await.unwrap().2, End::Closed);
    }
}
