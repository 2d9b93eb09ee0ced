//! The check of CONTRACT §3, seen by a client: stale writes refused with 409,
//! missing tokens 428, malformed tokens 400, prefix resources, reads that
//! advance the fence, and the fence surviving kill -9.

mod common;

use common::backend::{TestBackend, saw_key};
use common::fencegate::Fencegate;
use common::raw::{RawClient, RawRequest};
use common::{Store, ensure_bucket, put_with_token, sdk};

async fn get_sdk(c: &aws_sdk_s3::Client, key: &str) -> (String, Option<String>) {
    let o = c.get_object().bucket("demo").key(key).send().await.unwrap();
    let token = o.metadata().and_then(|m| m.get("fencing-token")).cloned();
    let body = o.body.collect().await.unwrap().into_bytes();
    (String::from_utf8(body.to_vec()).unwrap(), token)
}

on_both_stores!(
    stale_writes_are_refused,
    a_read_with_a_higher_token_fences_off_older_writes,
    fences_survive_kill_9
);

async fn stale_writes_are_refused(store: Store) {
    let run = store.start("");
    let c = sdk(&run.fg.endpoint());
    ensure_bucket(&c, "demo").await;

    put_with_token(&c, "k", "thirty-four", 34).await.unwrap();
    let refused = put_with_token(&c, "k", "thirty-three", 33)
        .await
        .unwrap_err();
    assert_eq!(
        refused,
        (409, "StaleFencingToken".into(), Some("34".into()))
    );
    assert_eq!(
        get_sdk(&c, "k").await,
        ("thirty-four".into(), Some("34".into()))
    );
    put_with_token(&c, "k", "thirty-four again", 34)
        .await
        .unwrap();
    put_with_token(&c, "k", "thirty-five", 35).await.unwrap();
    assert_eq!(
        get_sdk(&c, "k").await,
        ("thirty-five".into(), Some("35".into()))
    );
    assert_eq!(put_with_token(&c, "k", "x", 34).await.unwrap_err().0, 409);
    assert_eq!(get_sdk(&c, "k").await.0, "thirty-five");
}

#[tokio::test]
async fn missing_and_malformed_tokens_never_reach_the_backend() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());

    let r = raw
        .send(RawRequest::put("/demo/missing", "x"))
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (428, Some("MissingFencingToken")));
    assert!(!saw_key(&be.events(), "demo/missing"));

    malformed_tokens_are_refused(&raw, &be).await;

    // Two headers, or two carriers that disagree.
    let r = raw
        .send(RawRequest::put("/demo/two", "x").token(5).token(5))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    let r = raw
        .send(
            RawRequest::put("/demo/disagree", "x")
                .token(5)
                .header("x-amz-meta-fencing-token", "6"),
        )
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (400, Some("InvalidFencingToken")));
    let mut req = RawRequest::put("/demo/disagree", "x").token(5);
    req.query = "x-fencing-token=6".into();
    assert_eq!(raw.send(req).await.unwrap().status, 400);
    assert!(!saw_key(&be.events(), "demo/two"));
    assert!(!saw_key(&be.events(), "demo/disagree"));

    // Agreeing carriers are fine, and the token is stamped, not forwarded.
    let r = raw
        .send(
            RawRequest::put("/demo/agree", "x")
                .token(5)
                .header("x-amz-meta-fencing-token", "0005"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(saw_key(&be.events(), "demo/agree"));
}

/// Each malformed token, in either header and in the query, is refused
/// with 400 InvalidFencingToken and never reaches the backend.
async fn malformed_tokens_are_refused(raw: &RawClient, be: &TestBackend) {
    // (HTTP strips whitespace around header values, so " 7" is tested in
    // the query carrier only.)
    let malformed = [
        "",
        "-1",
        "+1",
        "1e3",
        "0x10",
        "18446744073709551616",
        " 7",
        "3.0",
    ];
    for (i, bad) in malformed.iter().enumerate() {
        for carrier in ["x-fencing-token", "x-amz-meta-fencing-token"] {
            if bad.starts_with(' ') {
                continue;
            }
            let key = format!("demo/bad{i}");
            let req = RawRequest::put(&format!("/{key}"), "x").header(carrier, bad);
            let r = raw.send(req).await.unwrap();
            assert_eq!(
                (r.status, r.code()),
                (400, Some("InvalidFencingToken")),
                "{carrier}: {bad:?}"
            );
            assert!(!saw_key(&be.events(), &key), "{bad:?} reached the backend");
        }
        // As a query parameter (the presigned-URL carrier).
        let mut req = RawRequest::put(&format!("/demo/q{i}"), "x");
        req.query = format!(
            "x-fencing-token={}",
            percent_encoding::utf8_percent_encode(bad, percent_encoding::NON_ALPHANUMERIC)
        );
        let r = raw.send(req).await.unwrap();
        assert_eq!(
            (r.status, r.code()),
            (400, Some("InvalidFencingToken")),
            "query {bad:?}"
        );
    }
}

#[tokio::test]
async fn prefix_rule_shares_one_fence() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(
        be.as_fencegate_backend(),
        r#"
[[rules]]
bucket = "demo"
prefix = "tables/orders/"
mode = "shared"
resource = "orders"

[[rules]]
bucket = "demo"
prefix = "scratch/"
mode = "unfenced"
"#,
    );
    let raw = RawClient::new(&fg.endpoint());
    let put = |k: &str, t: Option<u64>| {
        let r = RawRequest::put(&format!("/demo/{k}"), "x");
        match t {
            Some(t) => r.token(t),
            None => r,
        }
    };
    assert_eq!(
        raw.send(put("tables/orders/a", Some(34)))
            .await
            .unwrap()
            .status,
        200
    );
    let r = raw.send(put("tables/orders/b", Some(33))).await.unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
    assert_eq!(r.headers["x-fencing-highest-token"], "34");
    assert!(!saw_key(&be.events(), "demo/tables/orders/b"));
    // Unrelated keys have fences of their own.
    assert_eq!(
        raw.send(put("tables/other", Some(1))).await.unwrap().status,
        200
    );
    assert_eq!(raw.send(put("c", Some(33))).await.unwrap().status, 200);
    // Unfenced prefixes need no token.
    assert_eq!(raw.send(put("scratch/x", None)).await.unwrap().status, 200);
}

async fn a_read_with_a_higher_token_fences_off_older_writes(store: Store) {
    let run = store.start("");
    let c = sdk(&run.fg.endpoint());
    ensure_bucket(&c, "demo").await;
    put_with_token(&c, "rmw", "v1", 38).await.unwrap();
    let raw = RawClient::new(&run.fg.endpoint());
    let r = raw
        .send(RawRequest::new(http::Method::GET, "/demo/rmw").token(40))
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "v1"));
    let refused = put_with_token(&c, "rmw", "v2", 39).await.unwrap_err();
    assert_eq!(refused.0, 409);
    assert_eq!(refused.2.as_deref(), Some("40"));
    // A stale read is refused too.
    let r = raw
        .send(RawRequest::new(http::Method::GET, "/demo/rmw").token(39))
        .await
        .unwrap();
    assert_eq!(r.status, 409);
    put_with_token(&c, "rmw", "v3", 40).await.unwrap();
    assert_eq!(get_sdk(&c, "rmw").await.0, "v3");
}

async fn fences_survive_kill_9(store: Store) {
    let mut run = store.start("");
    let c = sdk(&run.fg.endpoint());
    ensure_bucket(&c, "demo").await;
    put_with_token(&c, "k", "a", 34).await.unwrap();
    run.fg.kill9_and_restart();
    let c = sdk(&run.fg.endpoint());
    assert_eq!(put_with_token(&c, "k", "b", 33).await.unwrap_err().0, 409);
    assert_eq!(get_sdk(&c, "k").await.0, "a");
    put_with_token(&c, "k", "c", 34).await.unwrap();
}

on_both_stores!(refused_requests_land_nothing);

/// Every refusal of the core contract, against a real store: afterwards the
/// bucket holds only what was accepted.
async fn refused_requests_land_nothing(store: Store) {
    use common::raw::{Damage, Form, Source};
    let run = store.start("");
    let c = sdk(&run.fg.endpoint());
    ensure_bucket(&c, "demo").await;
    let raw = RawClient::new(&run.fg.endpoint());
    assert_eq!(
        raw.send(RawRequest::put("/demo/k", "ok").token(34))
            .await
            .unwrap()
            .status,
        200
    );

    let mut refused = vec![
        ("stale", RawRequest::put("/demo/k", "stale").token(33)),
        ("missing", RawRequest::put("/demo/missing", "x")),
        (
            "malformed",
            RawRequest::put("/demo/malformed", "x").header("x-fencing-token", "1e3"),
        ),
        (
            "disagree",
            RawRequest::put("/demo/disagree", "x")
                .token(1)
                .header("x-amz-meta-fencing-token", "2"),
        ),
    ];
    let mut bad_sig = RawRequest::put("/demo/badsig", "x").token(1);
    bad_sig.secret = "wrong".into();
    refused.push(("bad signature", bad_sig));
    let mut flipped = RawRequest::new(http::Method::PUT, "/demo/flipped").token(1);
    flipped.form = Form::Chunked { trailer: false };
    flipped.body = Some(Source::bytes(vec![b'q'; 100_000]));
    flipped.damage = Damage {
        flip_at: Some(99_000),
        cut_at: None,
    };
    refused.push(("flipped chunk", flipped));
    for (what, req) in refused {
        let r = raw.send(req).await.unwrap();
        assert!(
            (400..500).contains(&r.status),
            "{what}: {} {}",
            r.status,
            r.body
        );
    }
    let listed = c.list_objects_v2().bucket("demo").send().await.unwrap();
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, vec!["k"], "{store:?}");
    let got = c.get_object().bucket("demo").key("k").send().await.unwrap();
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().as_ref(),
        b"ok"
    );
}
