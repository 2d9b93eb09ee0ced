//! Cluster mode (`[cluster]`, docs/cluster.md): three replicas on a real
//! 3-member etcd on loopback behave as one fencegate. A newer write through
//! one replica fences a stale one through another; the ordering barrier
//! spans replicas; a replica killed, paused or cut off from etcd mid-write
//! neither blocks the others past its lease nor completes its write after
//! it; one etcd member lost changes nothing; etcd gone refuses fenced
//! requests with 503 and lets token-less reads pass.
//!
//! With the cluster switched off (each replica on its own fence file, the
//! same processes otherwise) every test here fails: the replicas do not
//! know each other's fences or writes.

mod common;

use bytes::Bytes;
use common::backend::{Event, TestBackend};
use common::etcd::EtcdCluster;
use common::fencegate::Fencegate;
use common::raw::{RawClient, RawRequest, RawResponse, Source};
use common::{http_call, put_with_token};
use std::sync::Arc;
use std::time::Duration;

use common::replicas::{ADMIN, SHORT_HOLD, TTL_MS, ready_status, replica_with, replicas};

fn started(token: u64) -> impl Fn(&Event) -> bool {
    move |e| matches!(e, Event::Start { token: Some(t), method, .. } if *t == token && method == "PUT")
}

fn body_complete(token: u64) -> impl Fn(&Event) -> bool {
    move |e| matches!(e, Event::BodyComplete { token: Some(t), .. } if *t == token)
}

type Pending = tokio::task::JoinHandle<Result<RawResponse, String>>;

/// A token-33 PUT to /demo/k through `raw` whose body the test sends.
async fn streaming_33(
    be: &TestBackend,
    raw: &Arc<RawClient>,
) -> (tokio::sync::mpsc::Sender<Bytes>, Pending) {
    let (tx, source) = Source::channel(8);
    let mut req = RawRequest::new(http::Method::PUT, "/demo/k").token(33);
    req.body = Some(source);
    let raw = raw.clone();
    let pending = tokio::spawn(async move { raw.send(req).await });
    tx.send(Bytes::from_static(b"old-")).await.unwrap();
    be.wait_for("33 forwarded", |ev| ev.iter().any(started(33)))
        .await;
    (tx, pending)
}

fn put(raw: &Arc<RawClient>, body: &'static str, token: u64) -> Pending {
    let raw = raw.clone();
    tokio::spawn(async move {
        raw.send(RawRequest::put("/demo/k", body).token(token))
            .await
    })
}

/// Sends what `req` makes, again after a 502 or 503 (up to three times),
/// as the SDKs' standard retry mode does.
async fn send_retrying(raw: &RawClient, req: impl Fn() -> RawRequest) -> RawResponse {
    let mut r = raw.send(req()).await.unwrap();
    for _ in 0..3 {
        if r.status != 503 && r.status != 502 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        r = raw.send(req()).await.unwrap();
    }
    r
}

/// What a stale or cut-off 33 may end as: an error answer, or a closed
/// connection; never a 200.
async fn refused(pending: Pending) -> Option<u16> {
    match pending.await.unwrap() {
        Ok(r) => {
            assert_ne!(r.status, 200, "33 succeeded: {}", r.body);
            Some(r.status)
        }
        Err(e) => {
            eprintln!("33's client saw: {e}");
            None
        }
    }
}

#[tokio::test]
async fn a_stale_write_through_one_replica_is_refused_after_a_newer_one_through_another() {
    let etcd = EtcdCluster::start();
    let garage = common::garage::Garage::start();
    let fg = replicas(&garage.backend(), &etcd.endpoints_toml(), 3);
    let c: Vec<_> = fg.iter().map(|f| common::sdk(&f.endpoint())).collect();
    common::ensure_bucket(&c[0], "demo").await;

    put_with_token(&c[0], "k", "ten-a", 10).await.unwrap();
    let stale = put_with_token(&c[1], "k", "nine-b", 9).await.unwrap_err();
    assert_eq!(stale, (409, "StaleFencingToken".into(), Some("10".into())));
    put_with_token(&c[2], "k", "ten-c", 10).await.unwrap();
    let got = c[1]
        .get_object()
        .bucket("demo")
        .key("k")
        .send()
        .await
        .unwrap();
    assert_eq!(
        &got.body.collect().await.unwrap().into_bytes()[..],
        b"ten-c"
    );

    // A raise by hand at one replica refuses at all of them.
    let url = |f: &Fencegate| format!("http://{}/fences/demo%2Fk", f.admin);
    let (s, body) = http_call("POST", &url(&fg[2]), Some(ADMIN), Some(r#"{"token":20}"#)).await;
    assert_eq!(s, 200, "{body}");
    let stale = put_with_token(&c[0], "k", "fifteen-a", 15)
        .await
        .unwrap_err();
    assert_eq!(stale.0, 409);
    let (s, body) = http_call("GET", &url(&fg[1]), None, None).await;
    assert_eq!(s, 200);
    assert!(body.contains("\"highest\":20"), "{body}");
    let (_, list) = http_call("GET", &format!("http://{}/fences", fg[0].admin), None, None).await;
    assert!(list.contains("demo/k"), "{list}");

    // A multipart upload begun at one replica goes on at the others: the
    // token that created it is shared too.
    let up = c[0]
        .create_multipart_upload()
        .bucket("demo")
        .key("mp")
        .metadata("fencing-token", "30")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap();
    let part = c[1]
        .upload_part()
        .bucket("demo")
        .key("mp")
        .upload_id(id)
        .part_number(1)
        .body(aws_sdk_s3::primitives::ByteStream::from_static(b"part one"))
        .send()
        .await
        .unwrap();
    let done = aws_sdk_s3::types::CompletedMultipartUpload::builder()
        .parts(
            aws_sdk_s3::types::CompletedPart::builder()
                .part_number(1)
                .e_tag(part.e_tag().unwrap())
                .build(),
        )
        .build();
    c[2].complete_multipart_upload()
        .bucket("demo")
        .key("mp")
        .upload_id(id)
        .multipart_upload(done)
        .send()
        .await
        .unwrap();
    let stale = put_with_token(&c[1], "mp", "late", 29).await.unwrap_err();
    assert_eq!(stale.0, 409);
}

#[tokio::test]
async fn the_ordering_barrier_spans_replicas() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let fg = replicas(&be.as_fencegate_backend(), &etcd.endpoints_toml(), 2);
    let a = Arc::new(RawClient::new(&fg[0].endpoint()));
    let b = Arc::new(RawClient::new(&fg[1].endpoint()));

    // 33's whole body is at the backend, stalled: 34 through the other
    // replica waits for its answer.
    be.stall_after_body(33);
    let r33 = put(&a, "old", 33);
    be.wait_body_complete(33).await;
    let r34 = put(&b, "new", 34);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !be.events().iter().any(started(34)),
        "34 was forwarded while 33 was in flight at the other replica: {:?}",
        be.events()
    );
    be.release(33);
    assert_eq!(r33.await.unwrap().unwrap().status, 200);
    assert_eq!(r34.await.unwrap().unwrap().status, 200);
    let ev = be.events();
    let answered33 = ev.iter().position(|e| {
        matches!(
            e,
            Event::Responded {
                token: Some(33),
                ..
            }
        )
    });
    assert!(answered33.unwrap() < ev.iter().position(started(34)).unwrap());

    // 35 at one replica while 36 streams... the other way round: a lower
    // write still streaming at A is aborted by a higher one through B.
    let (tx, r) = {
        let (tx, source) = Source::channel(8);
        let mut req = RawRequest::new(http::Method::PUT, "/demo/k").token(35);
        req.body = Some(source);
        let a = a.clone();
        let r = tokio::spawn(async move { a.send(req).await });
        tx.send(Bytes::from_static(b"old-")).await.unwrap();
        be.wait_for("35 forwarded", |ev| ev.iter().any(started(35)))
            .await;
        (tx, r)
    };
    let r36 = b.send(RawRequest::put("/demo/k", "newer").token(36)).await;
    assert_eq!(r36.unwrap().status, 200);
    let _ = tx.send(Bytes::from_static(b"body")).await;
    drop(tx);
    if let Some(status) = refused(r).await {
        assert_eq!(status, 409);
    }
    assert!(
        !be.events().iter().any(body_complete(35)),
        "{:?}",
        be.events()
    );
    assert_eq!(
        be.object("demo", "k").unwrap(),
        Bytes::from_static(b"newer")
    );
}

/// A replica killed with a write whose whole body the backend has: newer
/// writes wait for its lease to expire, then for the rest of the
/// quarantine (the backend may still apply that body), never less.
#[tokio::test]
async fn a_replica_killed_mid_write_holds_newer_writes_until_its_write_can_no_longer_land() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    // quarantine 5 s, lease 2 s: after the expiry, the 5 s of quarantine.
    let fence = |wait: u64| format!("admission_wait_ms = {wait}\nquarantine_ms = 5000\n");
    let mut a = replica_with(&backend, &etcd.endpoints_toml(), &fence(8000), TTL_MS);
    // B waits less than A's lease: while A's registration stands, B
    // answers 503 rather than forward.
    let b_short = replica_with(&backend, &etcd.endpoints_toml(), &fence(300), TTL_MS);
    let b = replica_with(&backend, &etcd.endpoints_toml(), &fence(9000), TTL_MS);
    let ra = Arc::new(RawClient::new(&a.endpoint()));

    be.finish_stalled_writes_of_departed_clients();
    be.stall_after_body(33);
    let _r33 = put(&ra, "old", 33);
    be.wait_body_complete(33).await;
    let short = RawClient::new(&b_short.endpoint());
    let busy = short
        .send(RawRequest::put("/demo/k", "new").token(34))
        .await;
    let busy = busy.unwrap();
    assert_eq!(
        (busy.status, busy.code()),
        (503, Some("SlowDown")),
        "{}",
        busy.body
    );
    assert!(!be.events().iter().any(started(34)));

    a.kill9();
    let rb = Arc::new(RawClient::new(&b.endpoint()));
    let r34 = put(&rb, "new", 34);
    // The backend applies 33 after A's lease has expired (2 s) but within
    // the quarantine. (The sleep only places the release; the assertions
    // are about order.)
    tokio::time::sleep(Duration::from_millis(3000)).await;
    be.release(33);
    assert_eq!(r34.await.unwrap().unwrap().status, 200);
    let applied = |e: &Event| {
        matches!(
            e,
            Event::Responded {
                token: Some(33),
                ..
            }
        )
    };
    be.wait_for("the backend to apply 33", |ev| ev.iter().any(applied))
        .await;
    let ev = be.events();
    let applied33 = ev.iter().position(applied).unwrap();
    let start34 = ev.iter().position(started(34)).unwrap();
    assert!(
        applied33 < start34,
        "34 was forwarded before 33 could land: {ev:?}"
    );
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"new"));
}

#[tokio::test]
async fn a_replica_paused_past_its_lease_does_not_complete_its_write() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let fg: Vec<_> = (0..2)
        .map(|_| {
            replica_with(
                &be.as_fencegate_backend(),
                &etcd.endpoints_toml(),
                SHORT_HOLD,
                TTL_MS,
            )
        })
        .collect();
    let a = Arc::new(RawClient::new(&fg[0].endpoint()));
    let b = RawClient::new(&fg[1].endpoint());

    let (tx, r33) = streaming_33(&be, &a).await;
    fg[0].signal("STOP");
    // 34 waits for A's lease to expire, then goes. (A owns the resource:
    // B forwards 34 there, and answers 502 when A's lease ends with 34 in
    // A's socket, since B cannot know whether A acted on it; the retry, as
    // the SDKs make, is B's.)
    let r34 = send_retrying(&b, || RawRequest::put("/demo/k", "new").token(34)).await;
    assert_eq!(r34.status, 200, "{}", r34.body);
    // The rest of 33's body is waiting in A's socket when A wakes up.
    tx.send(Bytes::from_static(b"body")).await.unwrap();
    drop(tx);
    fg[0].signal("CONT");
    refused(r33).await;
    assert!(
        !be.events().iter().any(body_complete(33)),
        "{:?}",
        be.events()
    );
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"new"));
    // A recovers: a new lease, and writes again.
    common::wait_until(20, "A to be ready again", || ready_status(&fg[0]) == 200);
    let r = a.send(RawRequest::put("/demo/k", "newest").token(35)).await;
    assert_eq!(r.unwrap().status, 200);
}

#[tokio::test]
async fn a_replica_cut_off_from_etcd_fails_its_write_before_the_last_bytes() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    // A reaches etcd through a relay the test freezes: a partition between
    // A and etcd, while A still reaches the backend and its client. No
    // raise can reach A then; only its lease's clock can tell it.
    let leader = etcd.leader();
    let relay = common::relay::Relay::start(etcd.endpoint(leader).trim_start_matches("http://"));
    let a = replica_with(
        &backend,
        &format!("[\"{}\"]", relay.url()),
        SHORT_HOLD,
        TTL_MS,
    );
    let b = replica_with(&backend, &etcd.endpoints_toml(), SHORT_HOLD, TTL_MS);
    let ra = Arc::new(RawClient::new(&a.endpoint()));
    let rb = RawClient::new(&b.endpoint());
    // A has heard of B before the cut (a replica learns its peers' addresses
    // from etcd; here for sure, through a write A forwards to B, its owner).
    let known = || RawRequest::put("/demo/known", "x").token(1);
    assert_eq!(rb.send(known()).await.unwrap().status, 200);
    assert_eq!(ra.send(known()).await.unwrap().status, 200);

    let (tx, r33) = streaming_33(&be, &ra).await;
    relay.freeze(true);
    // A owns the resource: B forwards 34 there, and A, cut off, answers
    // it `Moved` once its tenure lapses; B then waits for A's lease to end
    // and admits 34 itself (or, sent and unanswered, answers 502 and the
    // client's retry is B's).
    let r34 = send_retrying(&rb, || RawRequest::put("/demo/k", "new").token(34)).await;
    assert_eq!(r34.status, 200, "{}", r34.body);
    tx.send(Bytes::from_static(b"body")).await.unwrap();
    drop(tx);
    if let Some(status) = refused(r33).await {
        assert_eq!(status, 503);
    }
    assert!(
        !be.events().iter().any(body_complete(33)),
        "{:?}",
        be.events()
    );
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"new"));
    assert_eq!(ready_status(&a), 503);
    // Cut off, A admits nothing itself: a write for a resource whose owner
    // it does not know is relayed to B, which admits it
    // (tests/cluster_partitions.rs).
    let r = ra.send(RawRequest::put("/demo/other", "x").token(1)).await;
    let r = r.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        be.object("demo", "other").unwrap(),
        Bytes::from_static(b"x")
    );

    relay.freeze(false);
    common::wait_until(30, "A to be ready again", || ready_status(&a) == 200);
    let r = ra.send(RawRequest::put("/demo/k", "x").token(33)).await;
    assert_eq!(r.unwrap().status, 409, "A knows the fence again");
}

#[tokio::test]
async fn losing_one_etcd_member_keeps_everything_working() {
    let mut etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    // The default lease (5 s): a leader election (about a second here)
    // must not make a replica doubt its lease. With 2 s it can, and then
    // writes in flight fail with 503 while etcd elects.
    let fg = default_lease_pair(&be, &etcd, 8000);
    let a = RawClient::new(&fg[0].endpoint());
    let b = RawClient::new(&fg[1].endpoint());
    assert_eq!(
        a.send(RawRequest::put("/demo/k", "1").token(1))
            .await
            .unwrap()
            .status,
        200
    );

    etcd.kill(etcd.leader());
    for t in 2..8u64 {
        let via = if t % 2 == 0 { &a } else { &b };
        let r = via
            .send(RawRequest::put("/demo/k", "v").token(t))
            .await
            .unwrap();
        if r.status != 200 {
            eprintln!("A:\n{}\nB:\n{}", fg[0].logs(), fg[1].logs());
        }
        assert_eq!(r.status, 200, "token {t}: {}", r.body);
    }
    // 7 went through B; A's own last was 6, which only the shared fence
    // makes stale.
    let r = a
        .send(RawRequest::put("/demo/k", "old").token(6))
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
    assert_eq!(ready_status(&fg[0]), 200);
    assert_eq!(ready_status(&fg[1]), 200);
}

/// Two replicas with the default lease (5 s) and `wait_ms` of admission
/// wait.
fn default_lease_pair(be: &TestBackend, etcd: &EtcdCluster, wait_ms: u64) -> Vec<Fencegate> {
    let backend = be.as_fencegate_backend();
    let wait = format!("admission_wait_ms = {wait_ms}");
    (0..2)
        .map(|_| replica_with(&backend, &etcd.endpoints_toml(), &wait, 5000))
        .collect()
}

/// An election that outlasts every replica's lease (etcd's survivors
/// stalled, as on a host starved of CPU or disk): the writes sent meanwhile
/// wait until etcd answers the replicas' keep-alives again and land, in
/// token order, none lost and none answered 503.
#[tokio::test]
async fn an_election_longer_than_the_leases_stalls_writes_and_loses_none() {
    let mut etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let fg = default_lease_pair(&be, &etcd, 20_000);
    let a = Arc::new(RawClient::new(&fg[0].endpoint()));
    let b = Arc::new(RawClient::new(&fg[1].endpoint()));
    let put = |via: &Arc<RawClient>, body: &'static str, t: u64| {
        let via = via.clone();
        tokio::spawn(async move { via.send(RawRequest::put("/demo/k", body).token(t)).await })
    };
    assert_eq!(put(&a, "1", 1).await.unwrap().unwrap().status, 200);

    let leader = etcd.leader();
    etcd.kill(leader);
    // No leader for 6 s: past the 4 s a 5 s lease stays fresh after its
    // last keep-alive, so both replicas lose theirs.
    let survivors: Vec<i32> = (0..3)
        .filter(|&i| i != leader)
        .map(|i| etcd.pid(i))
        .collect();
    for &pid in &survivors {
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    let two = put(&a, "2", 2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let three = put(&b, "3", 3);
    // A DeleteObjects takes its own admission, after its body: it waits too.
    let keys = "<Delete><Object><Key>gone</Key></Object></Delete>";
    let delete = RawRequest::delete_objects("/demo", keys);
    let deleted = {
        let b = b.clone();
        tokio::spawn(async move { b.send(delete.token(2)).await })
    };
    tokio::time::sleep(Duration::from_millis(5500)).await;
    for &pid in &survivors {
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    // Both waited out the election; whichever was admitted first, 3 is the
    // one that stays. 2, admitted after 3, is refused as stale.
    let (two, three) = (two.await.unwrap().unwrap(), three.await.unwrap().unwrap());
    if three.status != 200 || !matches!(two.code(), None | Some("StaleFencingToken")) {
        eprintln!("A:\n{}\nB:\n{}", fg[0].logs(), fg[1].logs());
    }
    assert_eq!(three.status, 200, "token 3: {}", three.body);
    assert!(
        two.status == 200 || (two.status, two.code()) == (409, Some("StaleFencingToken")),
        "token 2: {} {}",
        two.status,
        two.body
    );
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"3"));
    let deleted = deleted.await.unwrap().unwrap();
    assert_eq!(deleted.status, 200, "DeleteObjects: {}", deleted.body);
    assert!(!deleted.body.contains("<Error>"), "{}", deleted.body);
    let posted = be
        .events()
        .iter()
        .any(|e| matches!(e, Event::Start { method, .. } if method == "POST"));
    assert!(posted, "the DeleteObjects never reached the store");
    let r = a.send(RawRequest::put("/demo/k", "old").token(2)).await;
    let r = r.unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
    for (t, body) in [(4, "4"), (5, "5"), (6, "6")] {
        let via = if t % 2 == 0 { &b } else { &a };
        let r = put(via, body, t).await.unwrap().unwrap();
        assert_eq!(r.status, 200, "token {t}: {}", r.body);
    }
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"6"));
    // etcd extends every lease at an election: each replica kept its own,
    // and with it what it owned, rather than starting over.
    for replica in &fg {
        assert!(
            replica.logs().contains("stood all along"),
            "{}",
            replica.logs()
        );
    }
    common::wait_until(30, "both replicas ready", || {
        ready_status(&fg[0]) == 200 && ready_status(&fg[1]) == 200
    });
}

#[tokio::test]
async fn with_etcd_down_fenced_requests_get_503_and_tokenless_reads_pass() {
    let mut etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let fg = replicas(&be.as_fencegate_backend(), &etcd.endpoints_toml(), 2);
    let a = RawClient::new(&fg[0].endpoint());
    let b = RawClient::new(&fg[1].endpoint());
    assert_eq!(
        a.send(RawRequest::put("/demo/k", "five").token(5))
            .await
            .unwrap()
            .status,
        200
    );

    for i in 0..3 {
        etcd.kill(i);
    }
    let r = a
        .send(RawRequest::put("/demo/k", "six").token(6))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.code()),
        (503, Some("ServiceUnavailable")),
        "{}",
        r.body
    );
    let read = || RawRequest::new(http::Method::GET, "/demo/k");
    let r = b.send(read().token(6)).await.unwrap();
    assert_eq!(
        r.status, 503,
        "a read with a token raises the fence: {}",
        r.body
    );
    let r = b.send(read()).await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "five"));
    assert_eq!(be.object("demo", "k").unwrap(), Bytes::from_static(b"five"));
    assert_eq!(ready_status(&fg[0]), 503);

    for i in 0..3 {
        etcd.restart(i);
    }
    etcd.wait_healthy();
    common::wait_until(30, "the replicas to be ready again", || {
        ready_status(&fg[0]) == 200 && ready_status(&fg[1]) == 200
    });
    let r = a
        .send(RawRequest::put("/demo/k", "six").token(6))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = b
        .send(RawRequest::put("/demo/k", "five").token(5))
        .await
        .unwrap();
    assert_eq!(r.status, 409);
}
