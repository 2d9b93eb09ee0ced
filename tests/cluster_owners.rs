//! Cluster mode with owners (docs/cluster.md, "Owners"): a resource is
//! admitted by the one replica that owns it, with nothing asked of etcd
//! while its token stays the highest; the other replicas forward its
//! requests there. What ownership adds, tested on a real 3-member etcd:
//!
//! - the steady state costs etcd nothing, and forwarded writes are fenced
//!   as local ones;
//! - a forwarded request is admitted only by the tenure it was sent to;
//! - writes streaming through the two other replicas while the owner is
//!   killed stay in token order at the backend;
//! - a burst of raises at replicas that do not own the resource, while its
//!   owner dies and the resource moves, each refuses lower tokens at once;
//! - a raise at a replica that does not own the resource is answered only
//!   once the owner has applied it, however late the owner hears of it;
//! - a DeleteObjects goes to the owner of its keys' resources;
//! - replicas whose S3 listener is HTTPS forward to each other over TLS,
//!   trusting `peer_ca_file`;
//! - an idle resource is let go, and taken by the next writer elsewhere
//!   without a wait;
//! - a write forwarded to an owner that let its resource go is routed
//!   again, not refused;
//! - an owner stopped with SIGTERM hands its resources over with no wait
//!   (an owner killed: `tests/cluster_takeover.rs`).
//!
//! The owner killed, paused past its lease, or cut off from etcd with a
//! write admitted locally are `tests/cluster.rs`'s tests: the first write
//! of a resource makes its replica the owner, so those writes are.

mod common;
#[path = "cluster_owners/helpers.rs"]
mod helpers;

use common::backend::{Event, TestBackend};
use common::etcd::EtcdCluster;
use common::fencegate::Fencegate;
use common::http_call;
use common::raw::{RawClient, RawRequest};
use common::replicas::{
    ADMIN, SHORT_HOLD, TTL_MS, cluster_toml, ready_status, replica_with, replicas,
};
use helpers::{
    delete_objects, etcd_per_write, idle_release, metric, send_retrying, three_with_an_owner,
    two_replicas,
};
use std::sync::Arc;

#[tokio::test]
async fn the_owner_admits_without_etcd_and_the_others_forward_to_it() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let fg = replicas(&be.as_fencegate_backend(), &etcd.endpoints_toml(), 3);
    let c: Vec<_> = fg.iter().map(|f| RawClient::new(&f.endpoint())).collect();
    let put = |t: u64| RawRequest::put("/demo/k", format!("v{t}")).token(t);

    // The first write makes A the owner (a take and a raise); B and C
    // learn where it is at their first forward (a take and a lookup).
    for raw in &c {
        assert_eq!(raw.send(put(10)).await.unwrap().status, 200);
    }
    let before: Vec<f64> = futures_util::future::join_all(fg.iter().map(etcd_per_write)).await;
    for i in 0..30 {
        let r = c[i % 3].send(put(10)).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let after: Vec<f64> = futures_util::future::join_all(fg.iter().map(etcd_per_write)).await;
    let asked: f64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    assert_eq!(
        asked, 0.0,
        "30 writes at the highest token asked etcd {asked} times"
    );
    let forwarded = metric(&fg[1], "fencegate_cluster_forwarded_total").await
        + metric(&fg[2], "fencegate_cluster_forwarded_total").await;
    assert_eq!(forwarded, 22.0);

    // Forwarded writes are fenced by the owner like its own.
    let stale = c[2].send(put(9)).await.unwrap();
    assert_eq!(
        (stale.status, stale.code()),
        (409, Some("StaleFencingToken"))
    );
    assert_eq!(c[1].send(put(11)).await.unwrap().status, 200);
    assert_eq!(c[0].send(put(10)).await.unwrap().status, 409);
    assert_eq!(be.object("demo", "k").unwrap(), "v11");
    // A token-carrying read goes to the owner too, and raises there.
    let read = RawRequest::new(http::Method::GET, "/demo/k").token(12);
    assert_eq!(c[2].send(read).await.unwrap().status, 200);
    assert_eq!(c[0].send(put(11)).await.unwrap().status, 409);
}

#[tokio::test]
async fn a_forwarded_request_is_admitted_only_by_the_tenure_it_was_sent_to() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let fg = replicas(&be.as_fencegate_backend(), &etcd.endpoints_toml(), 2);
    let a = RawClient::new(&fg[0].endpoint());
    let b = RawClient::new(&fg[1].endpoint());
    assert_eq!(
        a.send(RawRequest::put("/demo/k", "a").token(5))
            .await
            .unwrap()
            .status,
        200
    );

    // As a replica would forward it after A's tenure ended: the owner
    // (A) and a replica that does not own the resource (B) both refuse it.
    let stamped = || {
        RawRequest::put("/demo/k", "late")
            .token(5)
            .header("x-fencegate-forwarded", "0123456789abcdef 1")
    };
    for (who, raw) in [("the owner", &a), ("another replica", &b)] {
        let r = raw.send(stamped()).await.unwrap();
        assert_eq!(
            (r.status, r.code()),
            (503, Some("SlowDown")),
            "{who}: {}",
            r.body
        );
    }
    assert_eq!(be.object("demo", "k").unwrap(), "a");
    // Unstamped, the same write goes through either.
    assert_eq!(
        b.send(RawRequest::put("/demo/k", "b").token(5))
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(be.object("demo", "k").unwrap(), "b");
}

/// Writes with rising tokens go through the two replicas that do not own
/// the resource, in turn, while the owner is killed: every write answered 200 reached the backend in token
/// order, and the last one is what the backend keeps.
#[tokio::test]
async fn writes_stay_in_token_order_while_their_owner_is_killed() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let (mut fg, c) = three_with_an_owner(&etcd, &be).await;

    let writer = |via: Vec<Arc<RawClient>>| {
        tokio::spawn(async move {
            let mut ok = Vec::new();
            for t in 2..40u64 {
                let raw = &via[t as usize % via.len()];
                let r = send_retrying(raw, || RawRequest::put("/demo/k", t.to_string()).token(t));
                if r.await.status == 200 {
                    ok.push(t);
                }
            }
            ok
        })
    };
    let streaming = writer(vec![c[1].clone(), c[2].clone()]);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    fg[0].kill9();
    let ok = streaming.await.unwrap();
    assert!(ok.len() > 20, "only {ok:?} went through");

    let applied: Vec<u64> = be
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Responded { token: Some(t), .. } => Some(*t),
            _ => None,
        })
        .collect();
    assert!(
        applied.windows(2).all(|w| w[0] <= w[1]),
        "applied out of token order: {applied:?}"
    );
    let last = ok.last().unwrap().to_string();
    assert_eq!(be.object("demo", "k").unwrap(), last.as_bytes());
}

/// Raises by hand at replicas that do not own the resource, while its
/// owner is killed and the resource moves: when a raise is answered, the
/// token below it is refused at once, wherever it is sent.
#[tokio::test]
async fn a_burst_of_raises_while_ownership_moves_refuses_lower_tokens_at_once() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let (mut fg, c) = three_with_an_owner(&etcd, &be).await;

    for t in 2..30u64 {
        if t == 10 {
            fg[0].kill9();
        }
        let (raiser, writer) = match t % 2 {
            0 => (&fg[1], &c[2]),
            _ => (&fg[2], &c[1]),
        };
        let url = format!("http://{}/fences/demo%2Fk", raiser.admin);
        let body = format!("{{\"token\":{t}}}");
        let mut answer = http_call("POST", &url, Some(ADMIN), Some(&body)).await;
        for _ in 0..10 {
            if answer.0 != 503 {
                break;
            }
            answer = http_call("POST", &url, Some(ADMIN), Some(&body)).await;
        }
        assert_eq!(answer.0, 200, "raise to {t}: {}", answer.1);
        let lower = || RawRequest::put("/demo/k", "lower").token(t - 1);
        let r = send_retrying(writer, lower).await;
        assert_eq!(
            r.status,
            409,
            "token {} after the raise to {t}: {}",
            t - 1,
            r.body
        );
    }
    assert_eq!(be.object("demo", "k").unwrap(), "1");
}

/// The owner hears from etcd late (its link to etcd delays every chunk):
/// a raise made at another replica is answered only once the owner has
/// applied it, so the owner refuses the lower token right after.
#[tokio::test]
async fn a_raise_elsewhere_is_answered_only_once_the_owner_applied_it() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    let leader = etcd.leader();
    let relay = common::relay::Relay::start(etcd.endpoint(leader).trim_start_matches("http://"));
    let a = replica_with(
        &backend,
        &format!("[\"{}\"]", relay.url()),
        SHORT_HOLD,
        5000,
    );
    let b = replica_with(&backend, &etcd.endpoints_toml(), SHORT_HOLD, 5000);
    let ra = RawClient::new(&a.endpoint());
    assert_eq!(
        ra.send(RawRequest::put("/demo/k", "1").token(1))
            .await
            .unwrap()
            .status,
        200
    );

    relay.delay(150);
    let url = format!("http://{}/fences/demo%2Fk", b.admin);
    for t in 2..6u64 {
        let body = format!("{{\"token\":{t}}}");
        let (s, answer) = http_call("POST", &url, Some(ADMIN), Some(&body)).await;
        assert_eq!(s, 200, "raise to {t}: {answer}");
        let r = ra
            .send(RawRequest::put("/demo/k", "lower").token(t - 1))
            .await
            .unwrap();
        assert_eq!(
            r.status,
            409,
            "token {} at the owner after the raise to {t}: {}",
            t - 1,
            r.body
        );
    }
    assert_eq!(be.object("demo", "k").unwrap(), "1");
}

#[tokio::test]
async fn a_delete_objects_goes_to_the_owner_of_its_keys() {
    let etcd = EtcdCluster::start();
    let garage = common::garage::Garage::start();
    let fg = replicas(&garage.backend(), &etcd.endpoints_toml(), 2);
    let c: Vec<_> = fg.iter().map(|f| common::sdk(&f.endpoint())).collect();
    common::ensure_bucket(&c[0], "demo").await;
    common::put_with_token(&c[0], "k", "a", 5).await.unwrap();
    common::put_with_token(&c[1], "j", "b", 5).await.unwrap();
    let exists = |i: usize, k: &'static str| {
        let c = c[i].clone();
        async move { c.head_object().bucket("demo").key(k).send().await.is_ok() }
    };

    // k is A's: at B, the request goes to A, which fences it.
    assert_eq!(
        delete_objects(&c[1], &["k"], 4).await.unwrap_err(),
        "StaleFencingToken"
    );
    assert!(exists(0, "k").await);
    assert_eq!(delete_objects(&c[1], &["k"], 5).await, Ok(1));
    assert!(!exists(1, "k").await);
    // Keys of resources owned by two replicas: refused, nothing deleted.
    common::put_with_token(&c[0], "k", "a", 5).await.unwrap();
    assert_eq!(
        delete_objects(&c[0], &["j", "k"], 5).await.unwrap_err(),
        "SlowDown"
    );
    assert!(exists(0, "j").await && exists(0, "k").await);
}

/// Two replicas serving HTTPS: `peer_ca_file` names the CA of their
/// certificates, and writes at the replica that does not own the resource
/// go to the owner over TLS.
#[tokio::test]
async fn replicas_forward_to_each_other_over_tls() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let dir = tempfile::tempdir().unwrap();
    let names = vec!["localhost".into(), "127.0.0.1".into()];
    let ck = rcgen::generate_simple_self_signed(names).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let server = format!(
        "admin_token = \"{ADMIN}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n",
        cert.display(),
        key.display()
    );
    let cluster = format!(
        "{}peer_ca_file = \"{}\"\n",
        cluster_toml(&etcd.endpoints_toml(), SHORT_HOLD, TTL_MS),
        cert.display()
    );
    let fg: Vec<_> = (0..2)
        .map(|_| Fencegate::start_with(be.as_fencegate_backend(), &server, &cluster))
        .collect();
    for f in &fg {
        common::wait_until(20, "a lease", || ready_status(f) == 200);
    }
    let client = |f: &Fencegate| {
        let url = format!("https://127.0.0.1:{}", f.s3.port());
        RawClient::with_ca(&url, Some(&cert))
    };
    let (a, b) = (client(&fg[0]), client(&fg[1]));
    let put = |body: &str, t: u64| RawRequest::put("/demo/k", body.to_string()).token(t);
    assert_eq!(a.send(put("a", 5)).await.unwrap().status, 200);
    let r = b.send(put("b", 5)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "k").unwrap(), "b");
    let stale = b.send(put("stale", 4)).await.unwrap();
    assert_eq!(stale.code(), Some("StaleFencingToken"));
    assert_eq!(
        metric(&fg[1], "fencegate_cluster_forwarded_total").await,
        2.0
    );
}

/// A resource left idle is let go by its owner: the next write, at another
/// replica, takes it there (no forward), and without the wait that follows
/// an owner's death (the default quarantine is longer than the admission
/// bound: a wait would answer 503).
#[tokio::test]
async fn an_idle_resource_is_let_go_and_taken_by_the_next_writer() {
    let (_etcd, _be, fg, a, b) = two_replicas().await;
    let put = |t: u64| RawRequest::put("/demo/idle", format!("v{t}")).token(t);
    assert_eq!(a.send(put(3)).await.unwrap().status, 200);
    idle_release().await;
    let r = b.send(put(3)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(metric(&fg[1], "fencegate_cluster_takes_total").await, 1.0);
    assert_eq!(
        metric(&fg[1], "fencegate_cluster_forwarded_total").await,
        0.0
    );
    // A, which let it go, now forwards to B, and the fence moved with it.
    assert_eq!(
        a.send(put(2)).await.unwrap().code(),
        Some("StaleFencingToken")
    );
    assert_eq!(
        metric(&fg[0], "fencegate_cluster_forwarded_total").await,
        1.0
    );
}

/// A healthy cluster answers no 503 when an owner lets its resource go
/// between bursts: a replica that forwarded there before, and still
/// thinks it the owner, learns that it moved and routes the write again,
/// instead of passing the old owner's refusal to the client.
#[tokio::test]
async fn a_write_after_an_idle_release_is_not_refused() {
    let (_etcd, be, fg, a, b) = two_replicas().await;
    let put = |t: u64| RawRequest::put("/demo/burst", format!("v{t}")).token(t);
    assert_eq!(a.send(put(3)).await.unwrap().status, 200);
    // B forwards to A, and remembers A as the owner.
    assert_eq!(b.send(put(3)).await.unwrap().status, 200);
    assert_eq!(
        metric(&fg[1], "fencegate_cluster_forwarded_total").await,
        1.0
    );
    idle_release().await; // A lets the resource go.
    let r = b.send(put(4)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = a.send(put(4)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "burst").as_deref(), Some(&b"v4"[..]));
}

/// A body too large to read before forwarding streams to the owner, so a
/// write that meets an owner that let its resource go cannot be routed
/// again: its client gets an error once, and the forwarder asks afresh
/// for the next write rather than send it to the same place.
#[tokio::test]
async fn a_large_write_after_an_idle_release_fails_at_most_once() {
    let (_etcd, _be, _fg, a, b) = two_replicas().await;
    let big = |t: u64| RawRequest::put("/demo/large", vec![b'x'; 64 << 20]).token(t);
    assert_eq!(a.send(big(3)).await.unwrap().status, 200);
    assert_eq!(b.send(big(3)).await.unwrap().status, 200);
    idle_release().await;
    // The first may fail (the old owner refuses it, having let go).
    let _ = b.send(big(4)).await;
    let r = b.send(big(4)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
}

/// An owner stopped with SIGTERM lets its resources go on the way out, so
/// the next writer takes them at once: no quarantine (the default is longer
/// than the admission bound, so a wait would answer 503), even at a
/// replica that forwarded to the stopped owner before.
#[tokio::test]
async fn an_owner_stopped_with_sigterm_hands_over_without_a_wait() {
    let (_etcd, be, mut fg, a, b) = two_replicas().await;
    let put = |t: u64| RawRequest::put("/demo/handover", format!("v{t}")).token(t);
    assert_eq!(a.send(put(3)).await.unwrap().status, 200);
    assert_eq!(b.send(put(3)).await.unwrap().status, 200);
    assert_eq!(fg[0].terminate(), Some(0));
    let r = b.send(put(4)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "handover").as_deref(), Some(&b"v4"[..]));
}

/// A forward waits for as long as its owner answers, and no longer: an
/// owner slow to answer (its backend holds the write) but answering its
/// pings keeps the forward, while one its peers cannot reach any more (a
/// partition between replicas; it keeps its lease) is given up within
/// seconds, `502` since it may have had the request, rather than held for
/// as long as the partition lasts.
#[tokio::test]
async fn a_forward_is_given_up_when_its_owner_stops_answering_pings() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    // A is reached by its peers through a relay the test freezes.
    let relay = common::relay::Relay::start("127.0.0.1:9");
    let behind = format!("{}\nadvertise = \"{}\"", etcd.endpoints_toml(), relay.url());
    let a = replica_with(&backend, &behind, "admission_wait_ms = 8000\n", TTL_MS);
    relay.set_target(&a.s3.to_string());
    let b = replica_with(
        &backend,
        &etcd.endpoints_toml(),
        "admission_wait_ms = 8000\n",
        TTL_MS,
    );
    let (ra, rb) = (
        RawClient::new(&a.endpoint()),
        Arc::new(RawClient::new(&b.endpoint())),
    );
    let put = |t: u64| RawRequest::put("/demo/cut", format!("v{t}")).token(t);
    assert_eq!(ra.send(put(3)).await.unwrap().status, 200);

    // Slow: the backend holds 4 for 5 s, through several pings.
    be.stall_after_body(4);
    let slow = tokio::spawn({
        let rb = rb.clone();
        async move { rb.send(put(4)).await }
    });
    be.wait_body_complete(4).await;
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    be.release(4);
    let r = slow.await.unwrap().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(metric(&b, "fencegate_cluster_forwarded_total").await, 1.0);

    // Cut off from its peers: answered, not held.
    relay.freeze(true);
    let answer = tokio::time::timeout(std::time::Duration::from_secs(60), rb.send(put(5))).await;
    let r = answer.expect("no answer within 60 s").unwrap();
    assert_eq!(
        (r.status, r.code()),
        (502, Some("BadGateway")),
        "{}",
        r.body
    );
    assert!(r.body.contains("did not answer a ping"), "{}", r.body);
    assert!(!be.started(5));
}

/// At a clean stop an owner's tenures end before their owner keys go
/// (`Gate::release_all`): a request that still reaches it (on a connection
/// left open past the shutdown's grace) is not admitted under a tenure
/// whose key another replica may already have taken, and it takes no
/// resource again. Its lease alone would still say the tenure stands.
#[tokio::test]
async fn after_letting_go_at_a_clean_stop_an_owner_admits_nothing() {
    use fencegate::fence::cluster::Cluster;
    use fencegate::fence::doubt::Doubts;
    use fencegate::fence::gate::{Gate, Kind, Refusal};
    use std::time::Duration;
    let etcd = EtcdCluster::start();
    let cfg = fencegate::config::ClusterConfig {
        etcd_endpoints: (0..3).map(|i| etcd.endpoint(i).to_string()).collect(),
        prefix: "stopping/".into(),
        replica_ttl_ms: 2000,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let doubts = Arc::new(Doubts::new(None));
    let quarantine = Duration::from_secs(3);
    let c = Cluster::start(&cfg, quarantine, dir.path(), doubts)
        .await
        .unwrap();
    let gate = Arc::new(Gate::clustered(c, Duration::from_secs(2)));
    gate.follow_cluster();
    for _ in 0..100 {
        if gate.not_ready().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let admitted = gate.admit("demo/r", 5, Kind::Write).await.unwrap();
    drop(admitted.permit().expect("admitted here, the owner"));
    assert!(gate.owner_epoch("demo/r").is_some());
    gate.release_all().await;
    assert_eq!(gate.owner_epoch("demo/r"), None);
    for resource in ["demo/r", "demo/new"] {
        match gate.admit(resource, 5, Kind::Write).await {
            Err(Refusal::Unavailable(why)) => assert!(why.contains("stopping"), "{why}"),
            Err(e) => panic!("{resource}: {e}"),
            Ok(_) => panic!("{resource} admitted after the owner let everything go"),
        }
    }
}
