//! Conditional writes across replicas (CONTRACT §8, docs/cluster.md): the
//! object hold is a key in etcd (an object outside any fenced resource) or
//! the owner's (one of a fenced resource, with owners, as here), so racing
//! put-if-absent writers spread over three replicas still have one winner,
//! and an unconditional write at one replica never lands between a
//! conditional write's check and its write at another. Garage, which
//! ignores every condition, is the store.
//!
//! With the cluster switched off (`FENCEGATE_TEST_CLUSTER_OFF=1`: each
//! replica holds objects for itself only) these tests fail.

mod common;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;
use common::etcd::EtcdCluster;
use common::raw::{RawClient, RawRequest, Source};
use common::replicas::{ADMIN, TTL_MS, cluster_toml};
use std::sync::Arc;
use std::time::Duration;

const FREE: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"free/\"\nmode = \"unfenced\"\n";

fn replicas(
    garage: &common::garage::Garage,
    etcd: &EtcdCluster,
) -> Vec<common::fencegate::Fencegate> {
    let server = format!("admin_token = \"{ADMIN}\"\n");
    let toml = cluster_toml(&etcd.endpoints_toml(), "admission_wait_ms = 8000\n", TTL_MS);
    (0..3)
        .map(|_| {
            let fg = common::fencegate::Fencegate::start_with(
                garage.backend(),
                &server,
                &format!("{toml}\n{FREE}"),
            );
            common::wait_until(20, "the replica to hold a lease", || {
                common::replicas::ready_status(&fg) == 200
            });
            fg
        })
        .collect()
}

#[tokio::test]
async fn racing_put_if_absent_over_three_replicas_has_one_winner() {
    let etcd = EtcdCluster::start();
    let garage = common::garage::Garage::start();
    let fg = replicas(&garage, &etcd);
    let c: Vec<_> = fg
        .iter()
        .map(|f| Arc::new(common::sdk(&f.endpoint())))
        .collect();
    common::ensure_bucket(&c[0], "demo").await;
    for round in 0..8 {
        for (key, token) in [
            (format!("free/race-{round}"), None),
            (format!("fenced/race-{round}"), Some(7)),
        ] {
            let mut tasks = Vec::new();
            for w in 0..16 {
                let c = c[w % 3].clone();
                let key = key.clone();
                tasks.push(tokio::spawn(async move {
                    let body = format!("writer {w}");
                    let mut put = c
                        .put_object()
                        .bucket("demo")
                        .key(&key)
                        .if_none_match("*")
                        .body(ByteStream::from(body.clone().into_bytes()));
                    if let Some(t) = token {
                        put = put.metadata("fencing-token", t.to_string());
                    }
                    match put.send().await {
                        Ok(_) => Some(body),
                        Err(e) if e.code() == Some("PreconditionFailed") => None,
                        Err(e) => panic!("{key}: {e:?}"),
                    }
                }));
            }
            let mut won = Vec::new();
            for t in tasks {
                won.extend(t.await.unwrap());
            }
            assert_eq!(won.len(), 1, "round {round}, {key}: {won:?}");
            let got = c[1]
                .get_object()
                .bucket("demo")
                .key(&key)
                .send()
                .await
                .unwrap();
            let got = got.body.collect().await.unwrap().into_bytes();
            assert_eq!(got, won[0].as_bytes());
        }
    }
}

#[tokio::test]
async fn an_unconditional_write_at_one_replica_waits_for_a_conditional_one_at_another() {
    unconditional_waits_for_conditional("free/k", None).await;
}

/// The same on a fenced key: there both writes go to the resource's owner,
/// whose hold is in memory (docs/cluster.md).
#[tokio::test]
async fn a_fenced_write_at_one_replica_waits_for_a_conditional_one_at_another() {
    unconditional_waits_for_conditional("fenced/k", Some(7)).await;
}

async fn unconditional_waits_for_conditional(key: &str, token: Option<u64>) {
    let etcd = EtcdCluster::start();
    let garage = common::garage::Garage::start();
    let fg = replicas(&garage, &etcd);
    common::ensure_bucket(&common::sdk(&fg[0].endpoint()), "demo").await;
    let a = Arc::new(RawClient::new(&fg[0].endpoint()));
    let b = Arc::new(RawClient::new(&fg[1].endpoint()));
    let path = format!("/demo/{key}");
    let tokened = |req: RawRequest| match token {
        Some(t) => req.header("x-amz-meta-fencing-token", &t.to_string()),
        None => req,
    };

    // A: put-if-absent, its body held open by the test after the first
    // bytes, so that it holds the object (checked, writing).
    let (tx, source) = Source::channel(10);
    let mut req = tokened(RawRequest::new(http::Method::PUT, &path)).header("if-none-match", "*");
    req.body = Some(source);
    let pending_a = tokio::spawn(async move { a.send(req).await });
    tx.send(Bytes::from_static(b"by A")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;

    // B: an unconditional write of the same object at another replica. It
    // must not land while A holds the object.
    let req = tokened(RawRequest::put(&path, "by B"));
    let pending_b = tokio::spawn(async move { b.send(req).await });
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(
        !pending_b.is_finished(),
        "B landed between A's check and A's write"
    );

    tx.send(Bytes::from_static(b", done")).await.unwrap();
    drop(tx);
    let a = pending_a.await.unwrap().unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    let b = pending_b.await.unwrap().unwrap();
    assert_eq!(b.status, 200, "{}", b.body);
    let c = common::sdk(&fg[2].endpoint());
    let got = c.get_object().bucket("demo").key(key).send().await.unwrap();
    assert_eq!(
        &got.body.collect().await.unwrap().into_bytes()[..],
        b"by B",
        "B came after A"
    );
}
