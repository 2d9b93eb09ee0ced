//! Browsers and public buckets, without a browser (`tests/browser.rs` has
//! the real one): CORS preflights reach the backend, fencegate's own errors
//! carry the CORS headers the backend allows, anonymous reads are forwarded
//! unsigned under the backend's own policy when switched on (and refused by
//! the in-process embedded store, which has no public buckets), and
//! stamping can be switched off.

mod common;

use common::raw::{RawClient, RawRequest};
use std::collections::HashMap;

on_both_stores!(with_stamping_off_objects_keep_only_their_own_metadata);

async fn user_metadata(c: &aws_sdk_s3::Client, key: &str) -> HashMap<String, String> {
    let head = c.head_object().bucket("demo").key(key).send().await;
    head.unwrap().metadata().cloned().unwrap_or_default()
}

async fn with_stamping_off_objects_keep_only_their_own_metadata(store: common::Store) {
    let run = store.start("[fence]\nstamp_metadata = \"\"\n");
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    let raw = RawClient::new(&run.fg.endpoint());
    let alice = HashMap::from([("owner".to_string(), "alice".to_string())]);

    let put = RawRequest::put("/demo/k", "v5").token(5);
    let r = raw.send(put.header("x-amz-meta-owner", "alice")).await;
    assert_eq!(r.unwrap().status, 200);
    assert_eq!(user_metadata(&c, "k").await, alice, "no stamp");

    // The fence works as ever.
    let r = raw.send(RawRequest::put("/demo/k", "v4").token(4)).await;
    let r = r.unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
    let got = c.get_object().bucket("demo").key("k").send().await.unwrap();
    assert_eq!(&got.body.collect().await.unwrap().into_bytes()[..], b"v5");

    // A copy is forwarded as sent: the source's metadata, no stamp.
    let copy = RawRequest::new(http::Method::PUT, "/demo/dst")
        .header("x-amz-copy-source", "demo/k")
        .token(6);
    assert_eq!(raw.send(copy).await.unwrap().status, 200);
    assert_eq!(user_metadata(&c, "dst").await, alice);

    // A token the client puts in its metadata is the client's metadata.
    common::put_with_token(&c, "m", "x", 7).await.unwrap();
    let meta = user_metadata(&c, "m").await;
    assert_eq!(meta.get("fencing-token").map(String::as_str), Some("7"));
    let stale = common::put_with_token(&c, "m", "y", 6).await.unwrap_err();
    assert_eq!(stale.0, 409);
}

/// An unsigned HTTP request, as a browser or `curl` sends it.
async fn unsigned(method: &str, url: &str, headers: &[(&str, &str)]) -> common::raw::RawResponse {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<bytes::Bytes>>();
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = client
        .request(req.body(Full::default()).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    common::raw::RawResponse {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// moto with a bucket `pub` whose policy lets anyone get and head objects,
/// and a private bucket `priv`, each holding `k` (written through
/// fencegate, token 5); fencegate in front, `server_lines` in `[server]`.
async fn public_and_private(
    server_lines: &str,
) -> (common::moto::Moto, common::fencegate::Fencegate) {
    let moto = common::moto::Moto::start();
    let direct = common::sdk_as(&moto.endpoint, common::moto::KEY, common::moto::SECRET);
    let fg = common::fencegate::Fencegate::start_with(moto.backend(), server_lines, "");
    let c = common::sdk(&fg.endpoint());
    for bucket in ["pub", "priv"] {
        common::ensure_bucket(&c, bucket).await;
        c.put_object()
            .bucket(bucket)
            .key("k")
            .metadata("fencing-token", "5")
            .body(aws_sdk_s3::primitives::ByteStream::from_static(b"v5"))
            .send()
            .await
            .unwrap();
    }
    let policy = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":"*",
        "Action":["s3:GetObject","s3:HeadObject"],"Resource":"arn:aws:s3:::pub/*"}]}"#;
    direct
        .put_bucket_policy()
        .bucket("pub")
        .policy(policy)
        .send()
        .await
        .unwrap();
    (moto, fg)
}

#[tokio::test]
async fn anonymous_reads_are_forwarded_unsigned_under_the_backends_policy() {
    let (_moto, fg) = public_and_private("anonymous_reads = true\n").await;
    let base = fg.endpoint();
    let get = |path: &str| format!("{base}{path}");

    let r = unsigned("GET", &get("/pub/k"), &[]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "v5"));
    assert_eq!(unsigned("HEAD", &get("/pub/k"), &[]).await.status, 200);
    assert_eq!(unsigned("GET", &get("/pub/missing"), &[]).await.status, 404);
    let list = unsigned("GET", &get("/pub?list-type=2"), &[]).await;
    assert_eq!(list.status, 200, "{}", list.body);
    // The private bucket stays private: fencegate never lends its own
    // credential to an anonymous caller (re-signed, this would be a 200).
    let r = unsigned("GET", &get("/priv/k"), &[]).await;
    assert_eq!(r.status, 403, "{}", r.body);

    // Writes stay refused, by fencegate (moto itself would take an
    // anonymous PUT of a new key).
    let r = unsigned("PUT", &get("/priv/new"), &[]).await;
    assert_eq!((r.status, r.code()), (403, Some("AccessDenied")));
    let c = common::sdk(&base);
    assert!(
        c.head_object()
            .bucket("priv")
            .key("new")
            .send()
            .await
            .is_err()
    );
    let r = unsigned("DELETE", &get("/pub/k"), &[]).await;
    assert_eq!((r.status, r.code()), (403, Some("AccessDenied")));

    // A token on an anonymous read is refused: a read raises the fence,
    // which only a signed request may do.
    let r = unsigned("GET", &get("/pub/k?x-fencing-token=99"), &[]).await;
    assert_eq!((r.status, r.code()), (400, Some("InvalidFencingToken")));
    let r = unsigned("GET", &get("/pub/k"), &[("x-fencing-token", "99")]).await;
    assert_eq!(r.status, 400);
    let put = c
        .put_object()
        .bucket("pub")
        .key("k")
        .metadata("fencing-token", "6");
    let put = put.body(aws_sdk_s3::primitives::ByteStream::from_static(b"v6"));
    put.send().await.expect("the fence on pub/k is still 5");
}

#[tokio::test]
async fn anonymous_requests_are_refused_by_default() {
    let (_moto, fg) = public_and_private("").await;
    let r = unsigned("GET", &format!("{}/pub/k", fg.endpoint()), &[]).await;
    assert_eq!((r.status, r.code()), (403, Some("AccessDenied")));
}

#[tokio::test]
async fn preflights_reach_the_backend_and_own_errors_carry_only_the_origins_it_allows() {
    let run = common::Store::Garage.start("");
    let base = run.fg.endpoint();
    let c = common::sdk(&base);
    common::allow_cors(&c, "http://app.example", &["PUT"]).await;
    common::put_with_token(&c, "k", "v5", 5).await.unwrap();
    let allow = "access-control-allow-origin";

    // The preflight is the backend's answer, unsigned: allowed or not.
    let ask = |origin: &'static str| {
        let url = format!("{base}/demo/k");
        async move {
            let h = [("origin", origin), ("access-control-request-method", "PUT")];
            unsigned("OPTIONS", &url, &h).await
        }
    };
    let ok = ask("http://app.example").await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.headers[allow], "http://app.example");
    let other = ask("http://evil.example").await;
    assert_eq!(other.status, 403, "{}", other.body);

    // A stale write from the allowed origin: readable by its page.
    let raw = RawClient::new(&base);
    let stale = |origin: &str| {
        RawRequest::put("/demo/k", "v4")
            .token(4)
            .header("origin", origin)
    };
    let r = raw.send(stale("http://app.example")).await.unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
    assert_eq!(r.headers[allow], "http://app.example");
    let exposed = r.headers["access-control-expose-headers"].to_str().unwrap();
    assert!(exposed.contains("x-fencing-highest-token"), "{exposed}");
    // From an origin the rules do not name: no CORS headers at all.
    let r = raw.send(stale("http://evil.example")).await.unwrap();
    assert_eq!(r.status, 409);
    assert!(r.headers.get(allow).is_none(), "{:?}", r.headers);
}

/// On the embedded default, which has no public buckets, an anonymous read
/// is refused by the store even though the store is called in-process:
/// fencegate's own credential (a mark no request from the wire can carry)
/// is never lent to it.
#[tokio::test]
async fn anonymous_reads_on_the_embedded_store_stay_refused() {
    let fg = common::fencegate::Fencegate::start_with(
        common::fencegate::Backend::Embedded,
        "anonymous_reads = true\n",
        "",
    );
    let c = common::sdk(&fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    let put = RawRequest::put("/demo/k", "v5").token(5);
    let r = RawClient::new(&fg.endpoint()).send(put).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = unsigned("GET", &format!("{}/demo/k", fg.endpoint()), &[]).await;
    assert_eq!(
        (r.status, r.code()),
        (403, Some("AccessDenied")),
        "{}",
        r.body
    );
}
