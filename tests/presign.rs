//! Presigned URLs (query SigV4): they work for PUT and GET, carry the token
//! in the signed query, and are refused when expired, over the 7-day cap,
//! tampered with, or when a token was added after signing. Nothing lands.

mod common;

use common::backend::{TestBackend, saw_key};
use common::fencegate::Fencegate;
use common::raw::{RawClient, RawRequest};
use std::time::{Duration, SystemTime};

fn presigned_put(key: &str, body: &str, token: Option<u64>) -> RawRequest {
    let mut r = RawRequest::put(&format!("/demo/{key}"), body.to_string());
    r.presign = Some(Duration::from_secs(300));
    if let Some(t) = token {
        r.query = format!("x-fencing-token={t}");
    }
    r
}

#[tokio::test]
async fn presigned_requests_are_verified_and_fenced() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());

    let r = raw.send(presigned_put("k", "v34", Some(34))).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "k").unwrap(), "v34");
    let mut get = RawRequest::new(http::Method::GET, "/demo/k");
    get.presign = Some(Duration::from_secs(60));
    let r = raw.send(get).await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "v34"));

    // A stale presigned PUT is refused like any other write.
    let r = raw.send(presigned_put("k", "v33", Some(33))).await.unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
    let r = raw.send(presigned_put("nokey", "x", None)).await.unwrap();
    assert_eq!(r.status, 428);

    // Expired.
    let mut old = presigned_put("expired", "x", Some(40));
    old.time = SystemTime::now() - Duration::from_secs(600);
    let r = raw.send(old).await.unwrap();
    assert_eq!(r.status, 403, "{}", r.body);
    // Over the 7-day cap.
    let mut long = presigned_put("long", "x", Some(40));
    long.presign = Some(Duration::from_secs(8 * 24 * 3600));
    let r = raw.send(long).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (400, Some("AuthorizationQueryParametersError"))
    );
    // Tampered: the signed token changed after signing.
    let mut tampered = presigned_put("tampered", "x", Some(40));
    tampered.query = String::new();
    tampered.query_after_signing = "x-fencing-token=41".into();
    let r = raw.send(tampered).await.unwrap();
    assert_eq!((r.status, r.code()), (403, Some("SignatureDoesNotMatch")));
    // A token the signature does not cover is refused, not honoured.
    let mut unsigned_token = presigned_put("unsigned", "x", None);
    unsigned_token.query_after_signing = "x-fencing-token=40".into();
    let r = raw.send(unsigned_token).await.unwrap();
    assert_eq!(r.status, 403);

    for key in [
        "demo/expired",
        "demo/long",
        "demo/tampered",
        "demo/unsigned",
        "demo/nokey",
    ] {
        assert!(!saw_key(&be.events(), key), "{key} reached the backend");
    }
    // None of the refused ones moved the fence.
    let r = raw
        .send(presigned_put("k", "v34b", Some(34)))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn virtual_host_and_path_style_reach_the_same_object() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start_with(
        be.as_fencegate_backend(),
        "domains = [\"s3.fencegate.test\"]\n",
        "",
    );
    let raw = RawClient::new(&fg.endpoint());
    let port = fg.s3.port();
    let mut put = RawRequest::put("/dir/k", "via vhost").token(5);
    put.host = Some(format!("demo.s3.fencegate.test:{port}"));
    let r = raw.send(put).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "dir/k").unwrap(), "via vhost");
    // The same object, and the same fence, by path style.
    let r = raw
        .send(RawRequest::new(http::Method::GET, "/demo/dir/k"))
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "via vhost"));
    let r = raw
        .send(RawRequest::put("/demo/dir/k", "x").token(4))
        .await
        .unwrap();
    assert_eq!(r.status, 409);
    let mut get = RawRequest::new(http::Method::GET, "/dir/k");
    get.host = Some(format!("demo.s3.fencegate.test:{port}"));
    let r = raw.send(get).await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "via vhost"));
}

#[tokio::test]
async fn the_backend_can_be_addressed_virtual_host_style() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(
        common::fencegate::Backend::S3Vhost {
            endpoint: be.endpoint(),
        },
        "",
    );
    let raw = RawClient::new(&fg.endpoint());
    let r = raw
        .send(RawRequest::put("/demo/a/b", "vhost style").token(1))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "a/b").unwrap(), "vhost style");
    let paths: Vec<String> = be
        .events()
        .into_iter()
        .filter_map(|e| match e {
            common::backend::Event::Start { raw_path, .. } => Some(raw_path),
            _ => None,
        })
        .collect();
    assert_eq!(
        paths,
        vec!["/a/b".to_string()],
        "the bucket went in the Host header"
    );
}
