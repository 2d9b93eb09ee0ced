//! The ordering barrier of CONTRACT §4, against a backend that stalls:
//! a newer write is not forwarded while an older one with a complete body is
//! still being answered; an older one still streaming is aborted and never
//! lands; past the wait bound the newer one gets 503 SlowDown. The first
//! holds with the writes on two serving threads and on one.

mod common;

use bytes::Bytes;
use common::backend::{Event, TestBackend};
use common::fencegate::Fencegate;
use common::raw::{RawClient, RawRequest, Source};
use std::sync::Arc;
use std::time::Duration;

fn position(events: &[Event], pred: impl Fn(&Event) -> bool) -> Option<usize> {
    events.iter().position(pred)
}

fn started(token: u64) -> impl Fn(&Event) -> bool {
    move |e| matches!(e, Event::Start { token: Some(t), method, .. } if *t == token && method == "PUT")
}

type Pending = tokio::task::JoinHandle<Result<common::raw::RawResponse, String>>;

/// Sends a token-33 PUT of "old" to /demo/k and waits until its whole body
/// is at the backend (which stalls it there).
async fn start_stalled_33(be: &TestBackend, raw: &Arc<RawClient>) -> Pending {
    let r33 = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "old").token(33)).await })
    };
    be.wait_body_complete(33).await;
    r33
}

#[tokio::test]
async fn newer_write_waits_for_older_write_with_complete_body() {
    newer_write_waits("").await;
}

/// The two writes' connections on two serving threads (each new connection
/// goes to the thread with the fewest), and both on one: the barrier holds
/// across threads, and a write waiting on the same thread as the older one
/// does not hold that thread up.
#[tokio::test]
async fn the_barrier_holds_across_serving_threads_and_on_one() {
    newer_write_waits("threads = 4\n").await;
    newer_write_waits("threads = 1\n").await;
}

async fn newer_write_waits(server_lines: &str) {
    let be = TestBackend::start().await;
    be.stall_after_body(33);
    let fg = Fencegate::start_with(be.as_fencegate_backend(), server_lines, "");
    let raw = Arc::new(RawClient::new(&fg.endpoint()));

    let r33 = start_stalled_33(&be, &raw).await;

    let r34 = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "new").token(34)).await })
    };
    // Give a broken barrier every chance to forward 34 early. (This sleep
    // only widens the window; the assertion is about order, not time.)
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        position(&be.events(), started(34)).is_none(),
        "34 was forwarded while 33 was still in flight: {:?}",
        be.events()
    );
    assert!(!r34.is_finished());

    be.release(33);
    assert_eq!(r33.await.unwrap().unwrap().status, 200);
    assert_eq!(r34.await.unwrap().unwrap().status, 200);

    let ev = be.events();
    let answered33 = position(&ev, |e| {
        matches!(
            e,
            Event::Responded {
                token: Some(33),
                ..
            }
        )
    })
    .unwrap();
    let start34 = position(&ev, started(34)).unwrap();
    assert!(answered33 < start34, "{ev:?}");
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"new"));
}

#[tokio::test]
async fn older_write_still_streaming_is_aborted_and_never_lands() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = Arc::new(RawClient::new(&fg.endpoint()));

    let (tx, source) = Source::channel(8);
    let mut req = RawRequest::new(http::Method::PUT, "/demo/k").token(33);
    req.body = Some(source);
    let r33 = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.send(req).await })
    };
    tx.send(Bytes::from_static(b"old-")).await.unwrap();
    be.wait_for("33 forwarded", |ev| ev.iter().any(started(33)))
        .await;

    let r34 = raw
        .send(RawRequest::put("/demo/k", "new").token(34))
        .await
        .unwrap();
    assert_eq!(r34.status, 200, "{}", r34.body);

    // The rest of 33's body comes too late.
    let _ = tx.send(Bytes::from_static(b"body")).await;
    drop(tx);
    match r33.await.unwrap() {
        Ok(resp) => {
            assert_eq!(resp.status, 409, "{}", resp.body);
            assert_eq!(resp.code(), Some("StaleFencingToken"));
        }
        // The proxy may close the connection before the client reads the
        // 409; what matters is below.
        Err(e) => eprintln!("33's client saw: {e}"),
    }
    let ev = be.events();
    assert!(
        !ev.iter().any(|e| matches!(
            e,
            Event::BodyComplete {
                token: Some(33),
                ..
            }
        )),
        "33's body completed at the backend: {ev:?}"
    );
    assert!(
        ev.iter().any(|e| matches!(
            e,
            Event::BodyAborted {
                token: Some(33),
                ..
            }
        )),
        "{ev:?}"
    );
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"new"));
}

#[tokio::test]
async fn past_the_wait_bound_the_newer_write_gets_slowdown() {
    let be = TestBackend::start().await;
    be.stall_after_body(33);
    let fg = Fencegate::start(
        be.as_fencegate_backend(),
        "[fence]\nadmission_wait_ms = 300\n",
    );
    let raw = Arc::new(RawClient::new(&fg.endpoint()));
    let r33 = start_stalled_33(&be, &raw).await;
    let r = raw
        .send(RawRequest::put("/demo/k", "new").token(34))
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (503, Some("SlowDown")));
    assert!(r.headers.contains_key("retry-after"));
    assert!(position(&be.events(), started(34)).is_none());
    // The fence did rise: nothing below 34 is admitted any more.
    let r = raw
        .send(RawRequest::put("/demo/k", "x").token(33))
        .await
        .unwrap();
    assert_eq!(r.status, 409);
    be.release(33);
    assert_eq!(r33.await.unwrap().unwrap().status, 200);
    let r = raw
        .send(RawRequest::put("/demo/k", "new").token(34))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"new"));
}
