//! The body gate: where a fenced write's permit meets its body. The last
//! item of the body is held back until the body has ended cleanly and the
//! permit still stands, so a backend never holds a complete body that the
//! fence has aborted. The write's object hold is asked too: in cluster
//! mode it no longer stands once the replica's lease may have lapsed. It
//! knows nothing of S3: the item and error types are the caller's, and the
//! caller says what error a stop ends the body with.

use super::gate::Permit;
use super::hold::ObjectHold;
use super::landing::Record;
use futures_util::{Stream, StreamExt};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

/// A body on its way to the backend, item by item.
pub type Items<T, E> = Pin<Box<dyn Stream<Item = Result<T, E>> + Send>>;

/// Why the gate stopped a body.
pub enum Stop<'a> {
    /// A higher token aborted the write (or, in cluster mode, the
    /// permit's lease may have lapsed: see `Permit::lease_lost`).
    Aborted(&'a Permit),
    /// The object hold no longer stands (cluster mode: the lease).
    HoldLapsed,
}

/// Holds back the last item of `input` until the stream has ended cleanly
/// (so every check upstream of the gate has passed) and, for a fenced write,
/// until the permit confirms the write was not aborted. Until then the
/// backend cannot have a complete body; the object `hold` is asked last,
/// and the write's slot in the landing `record` is marked whole before the
/// last item goes. An abort while streaming ends the body with `stop(..)`,
/// which aborts the upstream request.
pub fn body_gate<T, E, F>(
    input: Items<T, E>,
    permit: Option<Arc<Permit>>,
    hold: Option<Arc<ObjectHold>>,
    record: Option<Arc<Record>>,
    stop: F,
) -> Items<T, E>
where
    T: Send + 'static,
    E: Send + 'static,
    F: Fn(Stop<'_>) -> E + Send + 'static,
{
    Box::pin(Gate {
        input,
        held: None,
        permit,
        hold,
        record,
        stop,
        abort: None,
        done: false,
    })
}

/// The gate's state. The abort signal is checked (an atomic load) before
/// every item; a waiter on it is registered only while the body has
/// nothing ready, so a body that streams without waiting never takes the
/// signal's lock.
struct Gate<T, E, F> {
    input: Items<T, E>,
    held: Option<T>,
    permit: Option<Arc<Permit>>,
    hold: Option<Arc<ObjectHold>>,
    record: Option<Arc<Record>>,
    stop: F,
    /// Resolves when the permit is aborted: set up at the first wait.
    abort: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    done: bool,
}

impl<T, E, F: Fn(Stop<'_>) -> E> Gate<T, E, F> {
    fn end(&mut self, e: E) -> Poll<Option<Result<T, E>>> {
        self.done = true;
        Poll::Ready(Some(Err(e)))
    }

    fn stale(&mut self) -> Poll<Option<Result<T, E>>> {
        let p = self.permit.as_ref().expect("only fenced writes abort");
        let e = (self.stop)(Stop::Aborted(p));
        self.end(e)
    }

    fn lapsed(&mut self) -> Poll<Option<Result<T, E>>> {
        let e = (self.stop)(Stop::HoldLapsed);
        self.end(e)
    }

    fn aborted(&self) -> bool {
        self.permit
            .as_ref()
            .is_some_and(|p| p.abort_signal().is_fired())
    }
}

impl<T, E, F> Stream for Gate<T, E, F>
where
    F: Fn(Stop<'_>) -> E,
{
    type Item = Result<T, E>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        loop {
            if this.aborted() {
                return this.stale();
            }
            match this.input.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(item))) => {
                    if let Some(prev) = this.held.replace(item) {
                        return Poll::Ready(Some(Ok(prev)));
                    }
                }
                Poll::Ready(Some(Err(e))) => return this.end(e),
                Poll::Ready(None) => {
                    this.done = true;
                    if let Some(p) = &this.permit
                        && !p.body_complete()
                    {
                        return this.stale();
                    }
                    if let Some(h) = &this.hold
                        && !h.body_complete()
                    {
                        return this.lapsed();
                    }
                    if let Some(r) = &this.record {
                        r.whole();
                    }
                    return Poll::Ready(this.held.take().map(Ok));
                }
                Poll::Pending => {
                    let Some(p) = &this.permit else {
                        return Poll::Pending;
                    };
                    let abort = this.abort.get_or_insert_with(|| {
                        let signal = p.abort_signal();
                        Box::pin(async move { signal.fired().await })
                    });
                    ready!(abort.as_mut().poll(cx));
                    return this.stale();
                }
            }
        }
    }
}

// No field is ever pinned: the input and the waiter are boxed, and the
// held item and the closure are moved and called freely.
impl<T, E, F> Unpin for Gate<T, E, F> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gate_never_releases_last_frame_before_a_clean_end() {
        let parts: Vec<Result<&str, &str>> = vec![Ok("a"), Ok("b"), Err("incomplete body")];
        let out: Vec<_> = body_gate(
            Box::pin(futures_util::stream::iter(parts)),
            None,
            None,
            None,
            |_| "stale",
        )
        .collect()
        .await;
        assert_eq!(out.len(), 2, "only the first frame and the error");
        assert!(out[1].is_err());
    }
}
