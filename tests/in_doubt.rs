//! A write whose sender dies (CONTRACT §4, "It holds across fencegate's own
//! death"; docs/how-it-works.md, "When fencegate itself dies"): fencegate
//! in front of a backend that applies a write some time after its whole
//! body arrived, whether or not its client is still there, as a loaded
//! store does. Holder 33's write is whole at the backend, fencegate is
//! `kill -9`'d and started again at once, and holder 34 writes:
//!
//! - on a backend that ignores conditions, 34 waits until 33 can no
//!   longer land (the quarantine), and the object ends as 34's; with the
//!   landing record ignored (`FENCEGATE_UNSAFE_FORGET_IN_FLIGHT=1`), 34
//!   goes at once and 33 lands over it: the control that shows the test
//!   can fail;
//! - on a backend that judges conditions when it applies a write (as AWS
//!   S3 does), with `fence.conditional_writes`, 33 went with one, so 34
//!   goes at once and the backend refuses 33; a 34 of exactly the bytes
//!   33's condition expects is refused, since 33 could then land after it;
//! - a lost answer, without a restart, is the same: in doubt, and ordered
//!   by the backend where it can be;
//! - a clean stop, or a `kill -9` with nothing in flight, holds nothing
//!   back; a record that cannot be read holds every newer token back for
//!   the quarantine;
//! - a put-if-absent whose sender died holds its object: a second
//!   put-if-absent after the restart does not win beside it.

mod common;

use bytes::Bytes;
use common::backend::{Event, TestBackend, etag_of};
use common::fencegate::Fencegate;
use common::raw::{RawClient, RawRequest};
use std::sync::Arc;
use std::time::{Duration, Instant};

const FORGET: (&str, &str) = ("FENCEGATE_UNSAFE_FORGET_IN_FLIGHT", "1");

fn position(events: &[Event], pred: impl Fn(&Event) -> bool) -> Option<usize> {
    events.iter().position(pred)
}

fn started(token: u64) -> impl Fn(&Event) -> bool {
    move |e| matches!(e, Event::Start { token: Some(t), method, .. } if *t == token && method == "PUT")
}

fn answered(token: u64) -> impl Fn(&Event) -> bool {
    move |e| matches!(e, Event::Responded { token: Some(t), .. } if *t == token)
}

/// The fence settings of these tests: a short quarantine, and a wait that
/// outlasts it (so a newer write waits it out rather than being refused).
fn fence(quarantine_ms: u64, wait_ms: u64) -> String {
    format!("[fence]\nquarantine_ms = {quarantine_ms}\nadmission_wait_ms = {wait_ms}\n")
}

/// Holder 33 PUTs `old` to demo/k; the backend has its whole body and
/// holds it (released by the test).
async fn stall_33(be: &TestBackend, fg: &Fencegate) {
    be.stall_after_body(33);
    be.finish_stalled_writes_of_departed_clients();
    let raw = RawClient::new(&fg.endpoint());
    tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "old").token(33)).await });
    be.wait_body_complete(33).await;
}

/// The single-node story on a backend that ignores conditions: what the
/// object ends as, and the backend's events.
async fn killed_with_a_write_whole_at_the_backend(env: &[(&str, &str)]) -> (Bytes, Vec<Event>) {
    let be = TestBackend::start().await;
    let mut fg = Fencegate::start_env(be.as_fencegate_backend(), "", &fence(3000, 6000), env);
    stall_33(&be, &fg).await;
    fg.kill9_and_restart();
    let raw = Arc::new(RawClient::new(&fg.endpoint()));
    let r34 = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "new").token(34)).await })
    };
    // A broken restart forwards 34 at once: give it the time to.
    tokio::time::sleep(Duration::from_millis(500)).await;
    be.release(33);
    be.wait_for("33 applied", |ev| ev.iter().any(answered(33)))
        .await;
    let r = r34.await.unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    // What a late 33 would do, it has done: the object is final.
    tokio::time::sleep(Duration::from_millis(200)).await;
    (be.object("demo", "k").unwrap(), be.events())
}

#[tokio::test]
async fn a_restart_waits_for_the_write_the_dead_process_left_whole_at_the_backend() {
    let (object, ev) = killed_with_a_write_whole_at_the_backend(&[]).await;
    assert_eq!(object, Bytes::from_static(b"new"), "{ev:?}");
    let landed33 = position(&ev, answered(33)).unwrap();
    let start34 = position(&ev, started(34)).unwrap();
    assert!(
        landed33 < start34,
        "34 went before 33 could no longer land: {ev:?}"
    );

    // The control: the record ignored, 34 goes at once and 33 lands over
    // it, which is what the test above would see without the fix.
    let (object, ev) = killed_with_a_write_whole_at_the_backend(&[FORGET]).await;
    assert_eq!(object, Bytes::from_static(b"old"), "{ev:?}");
    assert!(position(&ev, started(34)) < position(&ev, answered(33)));
}

/// A restart after a clean stop, or after a `kill -9` with nothing in
/// flight, holds nothing back: with a wait far shorter than the
/// quarantine, any doubt would answer 503 at once.
#[tokio::test]
async fn a_restart_with_nothing_in_flight_holds_nothing_back() {
    let be = TestBackend::start().await;
    let mut fg = Fencegate::start(be.as_fencegate_backend(), &fence(30_000, 300));
    let put = |t: u64| RawRequest::put("/demo/k", format!("v{t}")).token(t);
    let r = RawClient::new(&fg.endpoint()).send(put(33)).await.unwrap();
    assert_eq!(r.status, 200);
    fg.terminate_and_restart();
    let r = RawClient::new(&fg.endpoint()).send(put(34)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    fg.kill9_and_restart();
    let r = RawClient::new(&fg.endpoint()).send(put(35)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!fg.logs().contains("start-up quarantine"), "{}", fg.logs());
}

/// A landing record that cannot be read (here: overwritten) cannot say
/// what may land: every newer token waits for the quarantine from the
/// start, and then goes.
#[tokio::test]
async fn a_record_that_cannot_be_read_holds_every_newer_token_for_the_quarantine() {
    let be = TestBackend::start().await;
    let mut fg = Fencegate::start(be.as_fencegate_backend(), &fence(3000, 300));
    let put = |t: u64| RawRequest::put("/demo/k", format!("v{t}")).token(t);
    assert_eq!(
        RawClient::new(&fg.endpoint())
            .send(put(33))
            .await
            .unwrap()
            .status,
        200
    );
    fg.kill9();
    std::fs::write(fg.dir.path().join("data/landing"), b"not a record").unwrap();
    let started = Instant::now();
    fg.kill9_and_restart();
    let raw = RawClient::new(&fg.endpoint());
    let r = raw.send(put(34)).await.unwrap();
    assert_eq!((r.status, r.code()), (503, Some("SlowDown")), "{}", r.body);
    assert!(fg.logs().contains("start-up quarantine"), "{}", fg.logs());
    let ready = format!("http://{}/readyz", fg.admin);
    let ready = common::http_call("GET", &ready, None, None).await.1;
    assert!(ready.contains("\"startup_quarantine_ms\":"), "{ready}");
    assert!(!ready.contains("\"startup_quarantine_ms\":null"), "{ready}");
    let metrics = format!("http://{}/metrics", fg.admin);
    let metrics = common::http_call("GET", &metrics, None, None).await.1;
    assert!(
        metrics.contains("fencegate_startup_quarantine 1"),
        "{metrics}"
    );
    // Once the quarantine from the start is over, it goes.
    let r = loop {
        let r = raw.send(put(34)).await.unwrap();
        if r.status != 503 || started.elapsed() > Duration::from_secs(20) {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(started.elapsed() >= Duration::from_millis(3000));
}

/// Starts fencegate on `be` with `fence.conditional_writes` and waits
/// until its probe found the backend judging conditions.
async fn judging(be: &TestBackend, fence: &str, env: &[(&str, &str)]) -> Fencegate {
    be.judge_conditions();
    let fence = format!("{fence}conditional_writes = true\n");
    let backend = "probe_conditions = true\nprobe_bucket = \"demo\"\n";
    let fg = Fencegate::start_full(be.as_fencegate_backend(), "", backend, &fence, env);
    wait_for_probe(&fg).await;
    fg
}

async fn wait_for_probe(fg: &Fencegate) {
    let url = format!("http://{}/readyz", fg.admin);
    for _ in 0..100 {
        let ready = common::http_call("GET", &url, None, None).await.1;
        if ready.contains("\"if_match\":true") && ready.contains("\"if_none_match\":true") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the probe never found the backend judging conditions");
}

/// On a backend that judges conditions when it applies a write, a write
/// whose sender died went with one (`If-Match` of the object it saw): a
/// newer PUT of the object goes at once after the restart, and the backend
/// refuses the older one once the newer one landed. A newer PUT of exactly
/// the bytes the older one's condition expects would let it land after:
/// refused, nothing done.
#[tokio::test]
async fn a_backend_that_judges_conditions_orders_a_newer_put_at_once() {
    let be = TestBackend::start().await;
    // A quarantine far past the wait: a newer PUT that waited for it would
    // be refused at once, not forwarded.
    let mut fg = judging(&be, &fence(30_000, 1000), &[]).await;
    let v0 = RawRequest::put("/demo/k", "v0").token(32);
    let r = RawClient::new(&fg.endpoint()).send(v0).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    stall_33(&be, &fg).await;
    fg.kill9_and_restart();
    wait_for_probe(&fg).await;
    let raw = RawClient::new(&fg.endpoint());
    // The bytes 33's If-Match expects: refused before its last bytes go.
    let r = raw
        .send(RawRequest::put("/demo/k", "v0").token(34))
        .await
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.body.contains(&etag_of(b"v0")), "{}", r.body);
    // Anything else: at once.
    let r = raw
        .send(RawRequest::put("/demo/k", "new").token(34))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    be.release(33);
    be.wait_for("33 refused", |ev| {
        ev.iter().any(|e| {
            matches!(
                e,
                Event::Refused {
                    token: Some(33),
                    ..
                }
            )
        })
    })
    .await;
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"new"));
    // Another resource, or a read, was never held back either.
    let r = raw.send(RawRequest::new(http::Method::GET, "/demo/k").token(35));
    assert_eq!(r.await.unwrap().status, 200);
}

/// Without a restart: a write whose answer is lost (the backend's answer
/// outlasts `backend.timeout_ms`) is in doubt. On a backend that ignores
/// conditions the resource is closed for the quarantine; on one that
/// judges them, a newer PUT of the object goes at once.
#[tokio::test]
async fn a_lost_answer_is_in_doubt_and_ordered_where_the_backend_can() {
    for judge in [false, true] {
        let be = TestBackend::start().await;
        let fence = fence(30_000, 500);
        let fg = match judge {
            true => {
                let backend =
                    "timeout_ms = 1000\nprobe_conditions = true\nprobe_bucket = \"demo\"\n";
                be.judge_conditions();
                let fence = format!("{fence}conditional_writes = true\n");
                let fg = Fencegate::start_full(be.as_fencegate_backend(), "", backend, &fence, &[]);
                wait_for_probe(&fg).await;
                fg
            }
            false => Fencegate::start_full(
                be.as_fencegate_backend(),
                "",
                "timeout_ms = 1000\n",
                &fence,
                &[],
            ),
        };
        let raw = RawClient::new(&fg.endpoint());
        be.stall_after_body(33);
        be.finish_stalled_writes_of_departed_clients();
        let r = raw
            .send(RawRequest::put("/demo/k", "old").token(33))
            .await
            .unwrap();
        assert_eq!(r.status, 502, "{}", r.body);
        let r = raw
            .send(RawRequest::put("/demo/k", "new").token(34))
            .await
            .unwrap();
        match judge {
            false => assert_eq!((r.status, r.code()), (503, Some("SlowDown")), "{}", r.body),
            true => assert_eq!(r.status, 200, "{}", r.body),
        }
        be.release(33);
    }
}

/// A put-if-absent whose whole body a store that ignores conditions had
/// when fencegate died holds its object: a second put-if-absent after the
/// restart waits (here: refused at once, the wait being short), then sees
/// the object and is refused 412. Without the record, both win.
#[tokio::test]
async fn a_put_if_absent_in_doubt_leaves_one_winner() {
    for forget in [false, true] {
        let be = TestBackend::start().await;
        let unfenced = "[[rules]]\nbucket = \"demo\"\nprefix = \"\"\nmode = \"unfenced\"\n";
        let extra = format!("{}{unfenced}", fence(2000, 300));
        let env: &[(&str, &str)] = if forget { &[FORGET] } else { &[] };
        let mut fg = Fencegate::start_env(be.as_fencegate_backend(), "", &extra, env);
        be.stall_after_body(1);
        be.finish_stalled_writes_of_departed_clients();
        let first = RawRequest::put("/demo/lock", "first")
            .header("if-none-match", "*")
            .header("x-amz-meta-fencing-token", "1");
        let raw = RawClient::new(&fg.endpoint());
        tokio::spawn(async move { raw.send(first).await });
        be.wait_body_complete(1).await;
        fg.kill9_and_restart();
        let raw = RawClient::new(&fg.endpoint());
        let second = || RawRequest::put("/demo/lock", "second").header("if-none-match", "*");
        let r = raw.send(second()).await.unwrap();
        if forget {
            // Both win: the second is told it created the object, and the
            // first lands over it.
            assert_eq!(r.status, 200, "{}", r.body);
            be.release(1);
            be.wait_for("1 applied", |ev| ev.iter().any(answered(1)))
                .await;
            assert_eq!(
                be.object("demo", "lock").unwrap(),
                Bytes::from_static(b"first")
            );
            continue;
        }
        assert_eq!((r.status, r.code()), (503, Some("SlowDown")), "{}", r.body);
        be.release(1);
        be.wait_for("1 applied", |ev| ev.iter().any(answered(1)))
            .await;
        let r = loop {
            let r = raw.send(second()).await.unwrap();
            if r.status != 503 {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert_eq!(r.status, 412, "{}", r.body);
        assert_eq!(
            be.object("demo", "lock").unwrap(),
            Bytes::from_static(b"first")
        );
    }
}

/// With `fence.conditional_writes`, fencegate knows the ETag its last
/// conditioned write left: the next write to the object goes with it,
/// without a HEAD. A delete, which says nothing of what is left, makes the
/// next write look again.
#[tokio::test]
async fn a_conditioned_write_needs_no_head_when_fencegate_knows_the_etag() {
    let be = TestBackend::start().await;
    let fg = judging(&be, &fence(30_000, 1000), &[]).await;
    let raw = RawClient::new(&fg.endpoint());
    let heads = || {
        be.events()
            .iter()
            .filter(|e| matches!(e, Event::Start { method, key, .. } if method == "HEAD" && key == "demo/k"))
            .count()
    };
    for (t, v) in [(1, "v1"), (2, "v2"), (2, "v3")] {
        let r = raw
            .send(RawRequest::put("/demo/k", v).token(t))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(heads(), 1, "only the first write looked");
    let r = raw
        .send(RawRequest::new(http::Method::DELETE, "/demo/k").token(2))
        .await
        .unwrap();
    assert_eq!(r.status, 204, "{}", r.body);
    let r = raw
        .send(RawRequest::put("/demo/k", "v4").token(2))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(heads(), 2);
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"v4"));
}

/// A read with a newer token is not forwarded while a write in doubt on
/// its resource may still land, even where the backend would order a
/// newer write after it: it waits until a look at the object finds it no
/// longer what the write's condition wants (here: the write landed, when
/// the backend let it go), and so it sees that write.
#[tokio::test]
async fn a_newer_read_waits_until_the_write_in_doubt_is_settled() {
    let be = TestBackend::start().await;
    let mut fg = judging(&be, &fence(30_000, 8000), &[]).await;
    let r = RawClient::new(&fg.endpoint())
        .send(RawRequest::put("/demo/k", "v0").token(32))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    stall_33(&be, &fg).await;
    fg.kill9_and_restart();
    wait_for_probe(&fg).await;
    let raw = Arc::new(RawClient::new(&fg.endpoint()));
    let read = {
        let raw = raw.clone();
        tokio::spawn(async move {
            let get = RawRequest::new(http::Method::GET, "/demo/k").token(34);
            raw.send(get).await
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !read.is_finished(),
        "the read went before 33 could no longer land"
    );
    be.release(33);
    let r = read.await.unwrap().unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "old"));
}

/// Issue #56's targets, measured (not asserted): after a restart, how long
/// a newer token waits. On a store that ignores conditions, with the write
/// in doubt applied at once after the restart: the quarantine (3 s here).
/// On one that judges them: a newer PUT of the object not at all, a newer
/// read until a look settles the doubt. After a clean stop: not at all.
#[tokio::test]
#[ignore = "a measurement: cargo test --test in_doubt -- --ignored --nocapture restart_waits"]
async fn restart_waits() {
    let timed = |label: &str, started: Instant, r: &common::raw::RawResponse| {
        println!(
            "{label}: {} after the restart ({})",
            fmt(started.elapsed()),
            r.status
        );
    };
    for round in 0..3 {
        // A store that ignores conditions.
        let be = TestBackend::start().await;
        let mut fg = Fencegate::start(be.as_fencegate_backend(), &fence(3000, 6000));
        stall_33(&be, &fg).await;
        fg.kill9_and_restart();
        let started = Instant::now();
        be.release(33);
        let raw = RawClient::new(&fg.endpoint());
        let r = raw
            .send(RawRequest::put("/demo/k", "new").token(34))
            .await
            .unwrap();
        timed(
            &format!("round {round}, ignores conditions, a newer PUT"),
            started,
            &r,
        );

        // One that judges them (the read also with the write applied 1 s
        // after the restart).
        for (read, late) in [(false, 0), (true, 0), (true, 1000)] {
            let be = TestBackend::start().await;
            let mut fg = judging(&be, &fence(30_000, 8000), &[]).await;
            let v0 = RawRequest::put("/demo/k", "v0").token(32);
            RawClient::new(&fg.endpoint()).send(v0).await.unwrap();
            stall_33(&be, &fg).await;
            fg.kill9_and_restart();
            let started = Instant::now();
            let applier = be.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(late)).await;
                applier.release(33);
            });
            let raw = RawClient::new(&fg.endpoint());
            let (what, req) = match read {
                false => ("a newer PUT", RawRequest::put("/demo/k", "new").token(34)),
                true => (
                    "a newer read",
                    RawRequest::new(http::Method::GET, "/demo/k").token(34),
                ),
            };
            let r = raw.send(req).await.unwrap();
            let what = format!("round {round}, judges conditions, {what}, applied after {late} ms");
            timed(&what, started, &r);
        }

        // A clean stop.
        let be = TestBackend::start().await;
        let mut fg = Fencegate::start(be.as_fencegate_backend(), &fence(3000, 6000));
        let raw = RawClient::new(&fg.endpoint());
        raw.send(RawRequest::put("/demo/k", "old").token(33))
            .await
            .unwrap();
        fg.terminate_and_restart();
        let started = Instant::now();
        let raw = RawClient::new(&fg.endpoint());
        let r = raw
            .send(RawRequest::put("/demo/k", "new").token(34))
            .await
            .unwrap();
        timed(
            &format!("round {round}, a clean stop, a newer PUT"),
            started,
            &r,
        );
    }
}

fn fmt(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}
