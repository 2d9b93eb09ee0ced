//! The body type every response fencegate sends has, in a leaf module of its
//! own so that the S3 side (`proxy`), the admin listener and the server's
//! connection-limit answer share it without importing each other; and the
//! idle timer that bounds the waits of the bodies fencegate streams (the
//! client's to the backend, the backend's answer to the client).

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The error a response body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: streamed from the backend, or whole.
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// A whole body from bytes.
pub fn full(b: impl Into<Bytes>) -> ProxyBody {
    Full::new(b.into()).map_err(|never| match never {}).boxed()
}

/// The longest wait for a streamed body's next piece. The timer is armed
/// when a wait begins, not per piece: a body whose pieces are there when
/// asked for never touches tokio's timer wheel (a clock read and a runtime
/// lookup per piece, measured in docs/benchmarks-log.md, "Third round").
pub struct IdleTimer {
    idle: Duration,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `sleep` counts the current wait (a piece since disarms it).
    armed: bool,
}

impl IdleTimer {
    pub fn new(idle: Duration) -> IdleTimer {
        IdleTimer {
            idle,
            sleep: None,
            armed: false,
        }
    }

    /// A piece came: the next wait gets a full `idle` again.
    pub fn progress(&mut self) {
        self.armed = false;
    }

    /// For a body that has nothing ready: ready once this wait has lasted
    /// `idle`, else registers `cx` to be woken then.
    pub fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let idle = self.idle;
        match &mut self.sleep {
            None => self.sleep = Some(Box::pin(tokio::time::sleep(idle))),
            Some(sleep) if !self.armed => sleep.as_mut().reset(tokio::time::Instant::now() + idle),
            Some(_) => {}
        }
        self.armed = true;
        let sleep = self.sleep.as_mut().expect("set above");
        sleep.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each wait is bounded by `idle` from its own start: a piece resets
    /// the count, and a wait without one expires exactly at `idle`.
    #[tokio::test(start_paused = true)]
    async fn each_wait_gets_idle_from_its_start() {
        async fn pending(t: &mut IdleTimer) -> bool {
            std::future::poll_fn(|cx| Poll::Ready(t.poll_expired(cx).is_pending())).await
        }
        let mut t = IdleTimer::new(Duration::from_secs(10));
        assert!(pending(&mut t).await, "a fresh wait has not expired");
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(pending(&mut t).await, "9 s into a 10 s wait");
        t.progress();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(pending(&mut t).await, "a piece came: a new wait began");
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(pending(&mut t).await, "9 s into the new wait");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!pending(&mut t).await, "10 s into the new wait: expired");
    }
}
