//! Phase 8, the upstream exchange, and when a write lets go of its place in
//! the ordering barrier (CONTRACT §4; docs/how-it-works.md).
//!
//! A write's permits are released on the backend's final word only: when
//! its whole answer has been read. S3 answers CompleteMultipartUpload and
//! copies with an early `200` head, white space while it works, and the real
//! result (maybe an `<Error>`) at the end of the body, so the head is not
//! the final word. The exchange therefore runs in a task of its own that
//! reads the backend's answer to the end, passing it on to the client as it
//! comes (and reading on if the client left), and only then drops the
//! permits.
//!
//! If the answer is lost (timeout, broken connection) after the backend
//! had the whole body, the write may still be applied: not having an answer
//! does not mean it did not happen. The permits are then held for the
//! quarantine (`fence.quarantine_ms`), so the resource stays closed to newer
//! tokens (`503 SlowDown`) for as long as the backend may still apply what
//! it has. Logged and counted (`fencegate_quarantines_total`).

use super::Proxy;
use crate::body::{BoxError, ProxyBody};
use crate::fence::gate::Permit;
use crate::metric_names as m;
use crate::s3::error::S3Error;
use crate::upstream::client::Outgoing;
use bytes::Bytes;
use http::Response;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

type FrameResult = Result<Frame<Bytes>, BoxError>;

impl Proxy {
    pub(super) async fn forward(
        &self,
        out: Outgoing,
        permits: Vec<Arc<Permit>>,
    ) -> Result<Response<ProxyBody>, S3Error> {
        let upstream = self.upstream.clone();
        if permits.is_empty() {
            // Nothing to hold: a read, or an unfenced write.
            let resp = upstream.send(out).await?;
            return Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed()));
        }
        let idle = upstream.timeout();
        let quarantine = self.quarantine;
        let (head_tx, head_rx) = oneshot::channel();
        tokio::spawn(async move {
            let sent = Instant::now();
            let result = upstream.send(out).await;
            metrics::histogram!(m::UPSTREAM_LATENCY).record(sent.elapsed().as_secs_f64());
            let resp = match result {
                Ok(resp) => resp,
                Err(e) => {
                    let e = match settle(permits, Some(&e.to_string()), quarantine) {
                        true => S3Error::BadGateway(format!(
                            "{e}; the backend had the whole body, so the write may still be \
                             applied: newer writes wait up to {} ms",
                            quarantine.as_millis()
                        )),
                        false => e,
                    };
                    let _ = head_tx.send(Err(e));
                    return;
                }
            };
            let (parts, mut body) = resp.into_parts();
            let (tx, rx) = mpsc::channel::<FrameResult>(8);
            let mut rx = rx;
            let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
            let client_body = BodyExt::boxed(StreamBody::new(stream));
            let _ = head_tx.send(Ok(Response::from_parts(parts, client_body)));
            let lost = pump(&mut body, &tx, idle).await;
            settle(permits, lost.as_deref(), quarantine);
        });
        head_rx
            .await
            .map_err(|e| S3Error::Internal(format!("forwarding task: {e}")))?
    }
}

/// Reads the backend's answer to its end, passing every frame to the
/// client while it listens. Returns why the answer was lost, if it was.
async fn pump(
    body: &mut hyper::body::Incoming,
    tx: &mpsc::Sender<FrameResult>,
    idle: Duration,
) -> Option<String> {
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Ok(None) => return None,
            Ok(Some(Ok(frame))) => {
                // A client that left is no reason to stop reading.
                let _ = tx.send(Ok(frame)).await;
            }
            Ok(Some(Err(e))) => {
                let why = format!("the backend's answer broke off: {e}");
                let _ = tx.send(Err(why.clone().into())).await;
                return Some(why);
            }
            Err(_) => {
                let why = "the backend's answer stalled".to_string();
                let _ = tx.send(Err(why.clone().into())).await;
                return Some(why);
            }
        }
    }
}

/// Lets go of a finished exchange's permits: at once, or after the
/// quarantine when the answer was `lost` after a complete body (then it
/// returns true: the outcome is unknown).
fn settle(permits: Vec<Arc<Permit>>, lost: Option<&str>, quarantine: Duration) -> bool {
    let unknown = lost.is_some() && permits.iter().any(|p| p.body_was_complete());
    if !unknown {
        return false;
    }
    metrics::counter!(m::QUARANTINES).increment(1);
    tracing::warn!(
        token = permits.first().map(|p| p.token()).unwrap_or_default(),
        quarantine_ms = quarantine.as_millis() as u64,
        "a write's outcome is unknown ({}): the backend had its whole body; its resource is closed to newer tokens until the quarantine ends",
        lost.unwrap_or_default()
    );
    tokio::spawn(async move {
        tokio::time::sleep(quarantine).await;
        drop(permits);
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fence::gate::tests::gate;
    use crate::fence::gate::{Kind, Refusal};

    /// A write whose answer was lost after its whole body went upstream keeps
    /// its resource closed for the quarantine, and not a moment longer.
    #[tokio::test(start_paused = true)]
    async fn a_lost_answer_holds_the_resource_for_the_quarantine() {
        let g = gate(Duration::from_millis(100));
        let old = g.admit("r", 33, Kind::Write).await.unwrap().unwrap();
        assert!(old.body_complete());
        assert!(settle(
            vec![Arc::new(old)],
            Some("timed out"),
            Duration::from_secs(30)
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
        assert!(g.admit("r", 34, Kind::Write).await.unwrap().is_some());
        assert_eq!(admitted.elapsed(), Duration::ZERO);
    }

    /// Without a complete body (or with an answer) nothing is held.
    #[tokio::test(start_paused = true)]
    async fn an_incomplete_body_or_an_answer_releases_at_once() {
        let g = gate(Duration::from_secs(1));
        let streaming = g.admit("r", 33, Kind::Write).await.unwrap().unwrap();
        assert!(!settle(
            vec![Arc::new(streaming)],
            Some("reset"),
            Duration::from_secs(30)
        ));
        let answered = g.admit("r", 34, Kind::Write).await.unwrap().unwrap();
        assert!(answered.body_complete());
        assert!(!settle(
            vec![Arc::new(answered)],
            None,
            Duration::from_secs(30)
        ));
        let waiting = tokio::time::Instant::now();
        assert!(g.admit("r", 35, Kind::Write).await.unwrap().is_some());
        assert_eq!(waiting.elapsed(), Duration::ZERO);
    }
}
