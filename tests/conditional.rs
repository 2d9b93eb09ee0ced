//! `fence.conditional_writes` against moto, which honours `If-Match` and
//! `If-None-Match` on writes (Garage ignores them). A write is admitted, and
//! while its body streams, another write lands on the key behind
//! fencegate's back: the write that a paused cluster replica can still
//! complete after its lease (docs/cluster.md). With the setting on the
//! backend refuses the admitted write (fencegate's own condition failed:
//! `503 SlowDown`, nothing written) and the other write stays; with it off
//! the admitted write overwrites it. Ordinary writes pass, the second
//! without a HEAD (fencegate knows the ETag its first left).

mod common;

use bytes::Bytes;
use common::raw::{RawClient, RawRequest, Source};

async fn body_of(c: &aws_sdk_s3::Client, key: &str) -> String {
    let got = c.get_object().bucket("demo").key(key).send().await.unwrap();
    String::from_utf8(got.body.collect().await.unwrap().into_bytes().to_vec()).unwrap()
}

/// A token-`token` PUT of "admitted" to /demo/k through fencegate, whose
/// body is held until "intruder" was written straight to moto. Returns
/// the admitted write's status and what the object holds afterwards.
async fn overtaken_write(conditional: bool) -> (u16, String) {
    let moto = common::moto::Moto::start();
    let direct = common::sdk_as(&moto.endpoint, common::moto::KEY, common::moto::SECRET);
    let fence = format!("[fence]\nconditional_writes = {conditional}\n");
    let fg = common::fencegate::Fencegate::start(moto.backend(), &fence);
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo").await;
    let raw = std::sync::Arc::new(RawClient::new(&fg.endpoint()));

    // Ordinary writes pass: a new key (If-None-Match: *), then an
    // existing one (If-Match: its ETag).
    for (t, v) in [(5, "v5"), (6, "v6")] {
        let r = raw
            .send(RawRequest::put("/demo/k", v).token(t))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(body_of(&direct, "k").await, "v6");

    let (tx, source) = Source::channel(8);
    let mut req = RawRequest::new(http::Method::PUT, "/demo/k").token(7);
    req.body = Some(source);
    let pending = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.send(req).await })
    };
    tx.send(Bytes::from_static(b"admit")).await.unwrap();
    // Admitted once fencegate has raised the fence to 7; its HEAD of the
    // object follows at once, before the first byte goes to moto. (The
    // pause after only gives that HEAD time on a loaded machine.)
    let url = format!("http://{}/fences/demo%2Fk", fg.admin);
    for _ in 0..400 {
        let (_, body) = common::http_call("GET", &url, None, None).await;
        if body.contains("\"highest\":7") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1000)).await;
    direct
        .put_object()
        .bucket("demo")
        .key("k")
        .body(aws_sdk_s3::primitives::ByteStream::from_static(b"intruder"))
        .send()
        .await
        .unwrap();
    tx.send(Bytes::from_static(b"ted")).await.unwrap();
    drop(tx);
    let status = pending.await.unwrap().unwrap().status;
    (status, body_of(&direct, "k").await)
}

#[tokio::test]
async fn with_conditional_writes_the_backend_refuses_a_write_overtaken_after_admission() {
    let (status, object) = overtaken_write(true).await;
    assert_eq!(status, 503);
    assert_eq!(object, "intruder", "the write that landed in between stays");
}

#[tokio::test]
async fn without_conditional_writes_an_overtaken_write_lands() {
    // The window the setting closes: fencegate alone cannot see a write
    // that did not go through it (or that a paused replica lets go late).
    let (status, object) = overtaken_write(false).await;
    assert_eq!(status, 200);
    assert_eq!(object, "admitted");
}

/// moto honours conditional writes itself: the probe says so.
#[tokio::test]
async fn the_probe_tells_that_moto_honours_conditions() {
    let moto = common::moto::Moto::start();
    let direct = common::sdk_as(&moto.endpoint, common::moto::KEY, common::moto::SECRET);
    common::ensure_bucket(&direct, "demo").await;
    let fg = common::fencegate::Fencegate::start_full(
        moto.backend(),
        "",
        "probe_conditions = true\nprobe_bucket = \"demo\"",
        "",
        &[],
    );
    let url = format!("http://{}/readyz", fg.admin);
    let mut ready = String::new();
    for _ in 0..100 {
        ready = common::http_call("GET", &url, None, None).await.1;
        if ready.contains("delete_if_match\":true") || ready.contains("\"error\":\"") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for answer in [
        "\"if_none_match\":true",
        "\"if_match\":true",
        "\"delete_if_match\":true",
    ] {
        assert!(ready.contains(answer), "{ready}");
    }
}
