//! Phase 9, the upstream exchange, and when a write lets go of its place in
//! the ordering barrier (CONTRACT §4; docs/how-it-works.md).
//!
//! A write's permits are released on the backend's final word only: when
//! its whole answer has been read. S3 answers CompleteMultipartUpload and
//! copies with an early `200` head, white space while it works, and the real
//! result (maybe an `<Error>`) at the end of the body, so the head is not
//! the final word. The permits therefore travel with the exchange: with
//! the pending request until the head arrives, then with the answer's body
//! ([`KeptBody`]) until its end has been read. If the client leaves first,
//! whatever is left of the exchange (the pending request, or the rest of
//! the answer) goes on in a task of its own and lets go of the permits when
//! it ends. The common case, a client that stays, needs no task, channel
//! or wake-up of its own.
//!
//! If the answer is lost (timeout, broken connection) after the backend
//! had the whole body, the write may still be applied: not having an answer
//! does not mean it did not happen. The write is then put in doubt
//! (`fence::doubt`) for the quarantine (`fence.quarantine_ms`), so the
//! resource stays closed to newer tokens (`503 SlowDown`) for as long as
//! the backend may still apply what it has, but for the requests the
//! backend itself orders after it (a write that went with a condition the
//! backend judges). Logged and counted (`fencegate_quarantines_total`).

use super::Proxy;
use crate::body::{BoxError, IdleTimer, ProxyBody};
use crate::fence::doubt::Doubts;
use crate::fence::gate::{Mode, Permit};
use crate::fence::hold::ObjectHold;
use crate::fence::landing::Record;
use crate::metric_names as m;
use crate::s3::error::S3Error;
use crate::upstream::client::{AnswerBody, Outgoing};
use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame};
use http_body_util::BodyExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

type Answer = Result<Response<AnswerBody>, S3Error>;
type Sending = Pin<Box<dyn Future<Output = Answer> + Send>>;

/// What a fenced write's exchange needs to end well on its own.
struct Keep {
    permits: Vec<Arc<Permit>>,
    /// The write's hold on its objects (CONTRACT §8), let go with the
    /// permits.
    objects: Arc<ObjectHold>,
    /// Its slots in the landing record (a remote backend).
    records: Vec<Arc<Record>>,
    /// Where a write whose answer is lost is put in doubt; `None` (cluster
    /// mode without owners, whose replicas wait for one another's
    /// registrations): its permits are kept for the quarantine instead.
    doubts: Option<Arc<Doubts>>,
    /// Whether a write the backend does not order is put in doubt too
    /// (a single node). An owner keeps its permits instead: they keep the
    /// resource, and its in-flight marker, for the quarantine.
    unordered_too: bool,
    quarantine: Duration,
    idle: Duration,
}

impl Proxy {
    pub(super) async fn forward(
        &self,
        out: Outgoing,
        permits: Vec<Arc<Permit>>,
        objects: Arc<ObjectHold>,
        records: Vec<Arc<Record>>,
    ) -> Result<Response<ProxyBody>, S3Error> {
        let upstream = self.upstream.clone();
        if permits.is_empty() && objects.is_empty() {
            // Nothing to keep: a read, or an unfenced write to no object. Boxed as the
            // fenced write's is: unboxed, the upstream request's future
            // (~3 KB) would size every request's future.
            let resp = Box::pin(upstream.send(out)).await?;
            return Ok(resp.map(BodyExt::boxed));
        }
        let (doubts, unordered_too) = match self.gate.mode() {
            Mode::PerWrite(_) => (None, false),
            Mode::Owners(_) => (Some(self.gate.doubts().clone()), false),
            Mode::Single => (Some(self.gate.doubts().clone()), true),
        };
        let keep = Keep {
            permits,
            objects,
            records,
            doubts,
            unordered_too,
            quarantine: self.quarantine,
            idle: upstream.timeout(),
        };
        // Timed for fenced writes, as before object holds: an unconditional write
        // that only shares its object costs no clock reads here.
        let sent = (!keep.permits.is_empty()).then(Instant::now);
        let mut pending = PendingHead {
            sending: Some(Box::pin(async move { upstream.send(out).await })),
            keep: Some(keep),
        };
        let result = std::future::poll_fn(|cx| pending.poll_head(cx)).await;
        if let Some(sent) = sent {
            m::handles::upstream_latency().record(sent.elapsed().as_secs_f64());
        }
        let keep = pending.keep.take().expect("kept until the head arrives");
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                let quarantine = keep.quarantine;
                return Err(match settle(keep, Some(&e.to_string())) {
                    true => S3Error::BadGateway(format!(
                        "{e}; the backend had the whole body, so the write may still be \
                         applied: newer writes wait up to {} ms",
                        quarantine.as_millis()
                    )),
                    false => e,
                });
            }
        };
        let (parts, body) = resp.into_parts();
        let kept = KeptBody {
            inner: Some(body),
            stall: IdleTimer::new(keep.idle),
            keep: Some(keep),
        };
        Ok(Response::from_parts(parts, kept.boxed()))
    }
}

/// The upstream request of a fenced write until its answer's head arrives.
/// Dropped before that (the client left), it sends the request on in a
/// task of its own, which reads the answer to its end and then settles.
struct PendingHead {
    sending: Option<Sending>,
    keep: Option<Keep>,
}

impl PendingHead {
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<Answer> {
        let sending = self.sending.as_mut().expect("polled until ready, once");
        let answer = ready!(sending.as_mut().poll(cx));
        self.sending = None;
        Poll::Ready(answer)
    }
}

impl Drop for PendingHead {
    fn drop(&mut self) {
        let (Some(sending), Some(keep)) = (self.sending.take(), self.keep.take()) else {
            return;
        };
        spawn(async move {
            match sending.await {
                Ok(resp) => drain(resp.into_body(), keep).await,
                Err(e) => {
                    settle(keep, Some(&e.to_string()));
                }
            }
        });
    }
}

/// The backend's answer to a fenced write, passed to the client frame by
/// frame; it keeps the permits until the answer's end has been read (or the
/// answer is lost: see `settle`). Dropped before that (the client left), it
/// reads the rest in a task of its own.
struct KeptBody {
    /// Taken by `drop` when the rest must be read in a task.
    inner: Option<AnswerBody>,
    /// The longest wait for the answer's next frame.
    stall: IdleTimer,
    keep: Option<Keep>,
}

impl Body for KeptBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let (Some(_), Some(inner)) = (&this.keep, &mut this.inner) else {
            return Poll::Ready(None);
        };
        let lost = match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.stall.progress();
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(None) => None,
            Poll::Ready(Some(Err(e))) => Some(format!("the backend's answer broke off: {e}")),
            Poll::Pending => {
                ready!(this.stall.poll_expired(cx));
                Some("the backend's answer stalled".to_string())
            }
        };
        let keep = this.keep.take().expect("checked above");
        settle(keep, lost.as_deref());
        Poll::Ready(lost.map(|why| Err(why.into())))
    }

    fn is_end_stream(&self) -> bool {
        // An answer complete at its head (no body) is not polled at all: its
        // keep is settled when it is dropped, as a complete answer's is.
        self.keep.is_none() || self.inner.as_ref().is_some_and(Body::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.as_ref().map(Body::size_hint).unwrap_or_default()
    }
}

impl Drop for KeptBody {
    fn drop(&mut self) {
        let Some(keep) = self.keep.take() else {
            return;
        };
        match self.inner.take() {
            Some(rest) if !rest.is_end_stream() => spawn(drain(rest, keep)),
            _ => {
                settle(keep, None);
            }
        }
    }
}

/// Runs what is left of an exchange on its own. (Without a runtime, the
/// process is ending: the permits go with it.)
fn spawn(rest: impl Future<Output = ()> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(rest);
    }
}

/// Reads what is left of an answer the client no longer listens to, then
/// settles.
async fn drain(mut body: AnswerBody, keep: Keep) {
    let lost = loop {
        match tokio::time::timeout(keep.idle, body.frame()).await {
            Ok(None) => break None,
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(e))) => break Some(format!("the backend's answer broke off: {e}")),
            Err(_) => break Some("the backend's answer stalled".to_string()),
        }
    };
    settle(keep, lost.as_deref());
}

/// Lets go of a finished exchange's permits and object holds: at once, or,
/// when the answer was `lost` after a complete body, not before the
/// quarantine (then it returns true: the outcome is unknown). The write is
/// then put in doubt (`fence::doubt`): it keeps its place for the
/// quarantine, and its slot in the landing record with it, except where
/// the backend orders what comes after it. Without a record (the embedded
/// store) or a place for doubts, the permits themselves are kept.
fn settle(keep: Keep, lost: Option<&str>) -> bool {
    let Keep {
        permits,
        objects,
        records,
        doubts,
        unordered_too,
        quarantine,
        ..
    } = keep;
    let complete = permits.iter().any(|p| p.body_was_complete()) || objects.body_was_complete();
    if !(lost.is_some() && complete) {
        return false;
    }
    metrics::counter!(m::QUARANTINES).increment(1);
    let orderable = !records.is_empty() && records.iter().all(|r| r.write().orderable);
    tracing::warn!(
        token = permits.first().map(|p| p.token()).unwrap_or_default(),
        quarantine_ms = quarantine.as_millis() as u64,
        orderable,
        "a write's outcome is unknown ({}): the backend had its whole body; its resource is \
         closed to newer tokens until the quarantine ends, but for what the backend orders \
         after it (orderable: it went with a condition the backend judges)",
        lost.unwrap_or_default()
    );
    match doubts {
        Some(doubts) if !records.is_empty() && (orderable || unordered_too) => {
            let until = tokio::time::Instant::now() + quarantine;
            for r in records {
                doubts.add(&r.write(), Some(r), until);
            }
            // Their place is the doubts' now.
            drop((permits, objects));
        }
        _ => {
            tokio::spawn(async move {
                tokio::time::sleep(quarantine).await;
                drop((permits, objects, records));
            });
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::gate::tests::gate;
    use crate::fence::gate::{Kind, Refusal};
    use crate::fence::hold::{HoldError, Holder, Holds, Mode};

    fn kept(permits: Vec<Permit>, objects: ObjectHold) -> Keep {
        Keep {
            permits: permits.into_iter().map(Arc::new).collect(),
            objects: Arc::new(objects),
            records: Vec::new(),
            doubts: None,
            unordered_too: true,
            quarantine: Duration::from_secs(30),
            idle: Duration::from_secs(1),
        }
    }

    /// A write whose answer was lost after its whole body went upstream keeps
    /// its resource closed for the quarantine, and not a moment longer.
    #[tokio::test(start_paused = true)]
    async fn a_lost_answer_keeps_the_resource_for_the_quarantine() {
        let g = gate(Duration::from_millis(100));
        let old = g
            .admit("r", 33, Kind::Write)
            .await
            .unwrap()
            .permit()
            .unwrap();
        assert!(old.body_complete());
        assert!(settle(
            kept(vec![old], ObjectHold::none()),
            Some("timed out")
        ));
        assert!(matches!(
            g.admit("r", 34, Kind::Write).await,
            Err(Refusal::Busy)
        ));
        // 29 s after the loss: still closed.
        tokio::time::sleep(Duration::from_millis(28_800)).await;
        assert!(matches!(
            g.admit("r", 34, Kind::Write).await,
            Err(Refusal::Busy)
        ));
        // 30.5 s after the loss the quarantine is over.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let admitted = tokio::time::Instant::now();
        assert!(
            g.admit("r", 34, Kind::Write)
                .await
                .unwrap()
                .permit()
                .is_some()
        );
        assert_eq!(admitted.elapsed(), Duration::ZERO);
    }

    /// Without a complete body (or with an answer) nothing is kept.
    #[tokio::test(start_paused = true)]
    async fn an_incomplete_body_or_an_answer_releases_at_once() {
        let g = gate(Duration::from_secs(1));
        let streaming = g
            .admit("r", 33, Kind::Write)
            .await
            .unwrap()
            .permit()
            .unwrap();
        assert!(!settle(
            kept(vec![streaming], ObjectHold::none()),
            Some("reset")
        ));
        let answered = g
            .admit("r", 34, Kind::Write)
            .await
            .unwrap()
            .permit()
            .unwrap();
        assert!(answered.body_complete());
        assert!(!settle(kept(vec![answered], ObjectHold::none()), None));
        let waiting = tokio::time::Instant::now();
        assert!(
            g.admit("r", 35, Kind::Write)
                .await
                .unwrap()
                .permit()
                .is_some()
        );
        assert_eq!(waiting.elapsed(), Duration::ZERO);
    }

    /// An unfenced write has no permit: its object hold alone says that the
    /// backend had the whole body, and is kept for the quarantine, so that
    /// a conditional write cannot look at the object before that write
    /// may have landed.
    #[tokio::test(start_paused = true)]
    async fn a_lost_answer_keeps_the_object_held_for_the_quarantine() {
        let holds = Holds::new(Duration::from_secs(1), None);
        let one = |m| vec![("b/k".to_string(), m)];
        let streaming = holds
            .hold(one(Mode::Shared), Holder::AnyReplica)
            .await
            .unwrap();
        assert!(!settle(kept(vec![], streaming), Some("reset")));
        let sent = holds
            .hold(one(Mode::Shared), Holder::AnyReplica)
            .await
            .unwrap();
        assert!(sent.body_complete());
        assert!(settle(kept(vec![], sent), Some("timed out")));
        assert!(matches!(
            holds.hold(one(Mode::Alone), Holder::AnyReplica).await,
            Err(HoldError::Busy(_))
        ));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            holds
                .hold(one(Mode::Alone), Holder::AnyReplica)
                .await
                .is_ok()
        );
    }
}
