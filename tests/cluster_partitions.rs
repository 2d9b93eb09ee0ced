//! A replica restarted, or cut off from etcd (issue #48; docs/cluster.md,
//! "A replica restarted" and "Cut off from etcd"): what it costs must be
//! only what it must, on a real 3-member etcd.
//!
//! - a replica killed and started again on its data directory ends its
//!   old incarnation's keys: a resource it left quiet is served at once
//!   (here a lease of 10 s outlives the admission wait of 3 s, so without
//!   that the write waits for the old lease and gets 503), and so is one
//!   it had just written but had no write in flight on (its marker is
//!   still there; the landing record says nothing may land); one with a
//!   write whose whole body the backend had at the kill keeps its owner
//!   key and its quarantine, and the write still lands;
//! - an owner cut off from etcd answers a forward `Moved`, and its
//!   forwarder does not send there again at that epoch: the write is sent
//!   once, waits for the owner's lease to end, and is admitted by the next
//!   owner, whose quarantine ends when the old owner, alive, says that
//!   nothing of its own is in flight there (a quarantine of 600 s would
//!   refuse it otherwise);
//! - a replica cut off from etcd relays a write it cannot admit to a peer,
//!   which admits it; a DeleteObjects too; and, when one peer's lease
//!   lapsed as well, to the one whose lease is fresh.

mod common;

use common::backend::TestBackend;
use common::etcd::EtcdCluster;
use common::fencegate::Fencegate;
use common::http_call;
use common::raw::{RawClient, RawRequest};
use common::relay::Relay;
use common::replicas::{TTL_MS, ready_status, replica_with};
use std::time::Duration;

/// The value of `name` (with its labels) in `replica`'s metrics.
async fn metric(fg: &Fencegate, name: &str) -> f64 {
    let (_, text) = http_call("GET", &format!("http://{}/metrics", fg.admin), None, None).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Waits (up to 20 s) until `replica` has made an etcd request of kind
/// `op`.
async fn wait_etcd_op(fg: &Fencegate, op: &str) {
    let name = format!("fencegate_etcd_requests_total{{op=\"{op}\"}}");
    for _ in 0..200 {
        if metric(fg, &name).await >= 1.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("replica made no {op} request in 20 s");
}

/// Waits (up to 20 s) until `replica`'s `/readyz` says `status`.
fn wait_ready(fg: &Fencegate, status: u16) {
    common::wait_until(20, "the replica's readiness", || ready_status(fg) == status);
}

/// Waits (up to 20 s) until `replica`'s lease is no longer fresh: it
/// admits nothing from then on.
async fn wait_lease_lapsed(fg: &Fencegate) {
    for _ in 0..200 {
        if metric(fg, "fencegate_cluster_lease_fresh").await == 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the replica's lease stayed fresh for 20 s");
}

fn put(key: &str, t: u64) -> RawRequest {
    RawRequest::put(&format!("/demo/{key}"), format!("v{t}")).token(t)
}

#[tokio::test]
async fn a_replica_restarted_on_its_data_directory_ends_its_old_incarnation() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    let fence = "admission_wait_ms = 3000\nquarantine_ms = 600000\n";
    let mut a = replica_with(&backend, &etcd.endpoints_toml(), fence, 10_000);
    let b = replica_with(&backend, &etcd.endpoints_toml(), fence, 10_000);
    let ca = std::sync::Arc::new(RawClient::new(&a.endpoint()));
    let cb = RawClient::new(&b.endpoint());
    assert_eq!(ca.send(put("quiet", 3)).await.unwrap().status, 200);
    wait_etcd_op(&a, "unmark").await;
    // Written again just before the kill: its marker is back, though
    // nothing of it is in flight any more.
    assert_eq!(ca.send(put("busy", 3)).await.unwrap().status, 200);
    // And one whose whole body the backend has, applied later, whether or
    // not A is still there.
    be.stall_after_body(7);
    be.finish_stalled_writes_of_departed_clients();
    let landing = {
        let ca = ca.clone();
        tokio::spawn(async move { ca.send(put("landing", 7)).await })
    };
    be.wait_body_complete(7).await;
    a.kill9_and_restart();
    drop(landing);
    wait_ready(&a, 200);

    let r = cb.send(put("quiet", 4)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = RawClient::new(&a.endpoint())
        .send(put("quiet", 5))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "quiet").as_deref(), Some(&b"v5"[..]));

    // The marker without a write that may still land (the landing record
    // of A's data directory says so): let go at once too.
    let r = cb.send(put("busy", 4)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    // The write that may still land keeps its resource: B waits (here
    // past its admission wait: 503), and the owner key stays.
    let r = cb.send(put("landing", 8)).await.unwrap();
    assert_eq!(r.status, 503, "{}", r.body);
    let owners = etcd.etcdctl(&["get", "--prefix", "--keys-only", "t/owners/"]);
    let owners = String::from_utf8_lossy(&owners.stdout);
    assert!(owners.contains("landing"), "{owners}");
    be.release(7);
    be.wait_for("7 applied", |ev| {
        ev.iter().any(
            |e| matches!(e, common::backend::Event::Responded { key, .. } if key == "demo/landing"),
        )
    })
    .await;
    assert_eq!(be.object("demo", "landing").as_deref(), Some(&b"v7"[..]));
    let r = cb.send(put("landing", 8)).await.unwrap();
    assert_eq!(r.status, 503, "until the quarantine: {}", r.body);
}

/// Replica A reaching etcd through relays the test freezes, replica B
/// directly; both with a quarantine far past the admission wait, and a
/// lease of `ttl_ms`.
fn one_cut_off(
    backend: &common::fencegate::Backend,
    etcd: &EtcdCluster,
    ttl_ms: u64,
) -> (Fencegate, Fencegate, Vec<Relay>) {
    let (a, relays) = behind_relays(backend, etcd, ttl_ms);
    let b = replica_with(backend, &etcd.endpoints_toml(), FENCE, ttl_ms);
    (a, b, relays)
}

const FENCE: &str = "admission_wait_ms = 15000\nquarantine_ms = 600000\n";

/// A replica reaching etcd through relays the test freezes.
fn behind_relays(
    backend: &common::fencegate::Backend,
    etcd: &EtcdCluster,
    ttl_ms: u64,
) -> (Fencegate, Vec<Relay>) {
    let relays: Vec<Relay> = (0..3)
        .map(|m| Relay::start(etcd.endpoint(m).trim_start_matches("http://")))
        .collect();
    let urls: Vec<String> = relays.iter().map(|r| format!("\"{}\"", r.url())).collect();
    let endpoints = format!("[{}]", urls.join(", "));
    (replica_with(backend, &endpoints, FENCE, ttl_ms), relays)
}

#[tokio::test]
async fn an_owner_cut_off_from_etcd_is_sent_to_once_and_hands_over_when_its_lease_ends() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    // A lease of 10 s: A stops admitting 8 s after its last keep-alive,
    // and its lease ends 2 s later, after B has forwarded to it.
    let (a, b, relays) = one_cut_off(&be.as_fencegate_backend(), &etcd, 10_000);
    let (ca, cb) = (RawClient::new(&a.endpoint()), RawClient::new(&b.endpoint()));
    assert_eq!(ca.send(put("k", 3)).await.unwrap().status, 200);
    assert_eq!(cb.send(put("k", 3)).await.unwrap().status, 200);
    let sends = "fencegate_cluster_forward_sends_sum";
    let before = metric(&b, sends).await;
    assert_eq!(before, 1.0, "the write through B went to its owner A once");

    relays.iter().for_each(|r| r.freeze(true));
    wait_lease_lapsed(&a).await;
    let r = cb.send(put("k", 4)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "k").as_deref(), Some(&b"v4"[..]));
    assert_eq!(
        metric(&b, sends).await - before,
        1.0,
        "sent to the cut-off owner once, then admitted by B"
    );
    relays.iter().for_each(|r| r.freeze(false));
}

#[tokio::test]
async fn a_replica_cut_off_from_etcd_relays_what_it_cannot_admit_to_a_peer() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let (a, b, relays) = one_cut_off(&be.as_fencegate_backend(), &etcd, TTL_MS);
    let (ca, cb) = (RawClient::new(&a.endpoint()), RawClient::new(&b.endpoint()));
    // A has heard of B (a replica knows its peers from etcd; here, before
    // the cut, through a write forwarded to B).
    assert_eq!(cb.send(put("b", 1)).await.unwrap().status, 200);
    assert_eq!(ca.send(put("b", 1)).await.unwrap().status, 200);
    relays.iter().for_each(|r| r.freeze(true));
    wait_lease_lapsed(&a).await;
    let r = ca.send(put("fresh", 1)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "fresh").as_deref(), Some(&b"v1"[..]));
    let r = ca.send(put("fresh", 0)).await.unwrap();
    assert_eq!(r.status, 409, "{}", r.body);
    // A DeleteObjects, admitted after its body was read, is relayed too;
    // B admits it, and refuses it when its token is stale.
    let r = ca.send(delete_objects("fresh", 2)).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains("<Error>"), "{}", r.body);
    let r = ca.send(delete_objects("fresh", 1)).await.unwrap();
    assert_eq!(r.code(), Some("StaleFencingToken"), "{}", r.body);
    relays.iter().for_each(|r| r.freeze(false));
}

#[tokio::test]
async fn a_cut_off_replica_relays_to_the_peer_whose_lease_is_fresh() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    // A and C cut off; B, the one peer whose lease stays fresh.
    let (a, b, relays_a) = one_cut_off(&backend, &etcd, TTL_MS);
    let (c, relays_c) = behind_relays(&backend, &etcd, TTL_MS);
    let (ca, cb, cc) = (
        RawClient::new(&a.endpoint()),
        RawClient::new(&b.endpoint()),
        RawClient::new(&c.endpoint()),
    );
    // A has heard of both peers: writes it forwards to each before the cut.
    for (owner, key) in [(&cb, "b"), (&cc, "c")] {
        assert_eq!(owner.send(put(key, 1)).await.unwrap().status, 200);
        assert_eq!(ca.send(put(key, 1)).await.unwrap().status, 200);
    }
    relays_a
        .iter()
        .chain(&relays_c)
        .for_each(|r| r.freeze(true));
    wait_lease_lapsed(&a).await;
    wait_lease_lapsed(&c).await;
    // Each write through A goes to B, whichever peer A asks first: C says
    // its lease lapsed, and A asks B next.
    for i in 0..6 {
        let r = ca.send(put(&format!("r{i}"), 1)).await.unwrap();
        assert_eq!(r.status, 200, "write {i}: {}", r.body);
    }
    relays_a
        .iter()
        .chain(&relays_c)
        .for_each(|r| r.freeze(false));
}

/// A DeleteObjects of `key` with token `t`.
fn delete_objects(key: &str, t: u64) -> RawRequest {
    let body = format!("<Delete><Object><Key>{key}</Key></Object></Delete>");
    RawRequest::delete_objects("/demo", body).token(t)
}

/// The measurement behind docs/cluster.md's restart figure (ignored: a
/// timing, not a pass/fail): at the default lease (5 s), a replica killed
/// and started again on its data directory, its resource quiet; the time
/// from the new process listening to the first write accepted through it
/// and through another replica. Three restarts.
#[tokio::test]
#[ignore = "a measurement (docs/cluster.md): cargo test --test cluster_partitions -- --ignored --nocapture"]
async fn restart_serve_times() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    let mut a = replica_with(&backend, &etcd.endpoints_toml(), "", 5000);
    let b = replica_with(&backend, &etcd.endpoints_toml(), "", 5000);
    let cb = RawClient::new(&b.endpoint());
    let mut token = 1;
    for round in 0..3 {
        let key = format!("restart-{round}");
        token += 1;
        let ca = RawClient::new(&a.endpoint());
        assert_eq!(ca.send(put(&key, token)).await.unwrap().status, 200);
        wait_etcd_op(&a, "unmark").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let killed = std::time::Instant::now();
        a.kill9_and_restart();
        let listening = std::time::Instant::now();
        let ca = RawClient::new(&a.endpoint());
        let mut through = Vec::new();
        for client in [&ca, &cb] {
            token += 1;
            loop {
                let r = client.send(put(&key, token)).await.unwrap();
                if r.status == 200 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            through.push(listening.elapsed());
        }
        println!(
            "restart {round}: listening {:.0} ms after the kill; first write accepted {:.0} ms \
             after listening through the restarted replica, {:.0} ms through the other",
            (listening - killed).as_secs_f64() * 1000.0,
            through[0].as_secs_f64() * 1000.0,
            through[1].as_secs_f64() * 1000.0
        );
    }
}
