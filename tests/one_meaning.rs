//! One meaning per request: each way around the fence found in review, as
//! a test. Token 34 is accepted on an object, then a token-33 request (or a
//! credential without the right) tries another shape of the same request;
//! afterwards the object is still the token-34 one and nothing else moved.
//! The generated, many-shaped version is `tests/differential.rs`.

mod common;

use common::backend::{TestBackend, saw_key};
use common::fencegate::{Fencegate, LIMITED_KEY, LIMITED_SECRET};
use common::raw::{RawClient, RawRequest};
use common::{Store, ensure_bucket};
use std::sync::Arc;
use std::time::Duration;

async fn get(raw: &RawClient, path: &str) -> (u16, String) {
    let r = raw
        .send(RawRequest::new(http::Method::GET, path))
        .await
        .unwrap();
    (r.status, r.body)
}

fn limited(mut r: RawRequest) -> RawRequest {
    r.key = LIMITED_KEY.into();
    r.secret = LIMITED_SECRET.into();
    r
}

/// Buckets `demo`, `oth` and `shared`, and `demo/k` written with token 34.
async fn setup(store: Store) -> (common::Running, RawClient) {
    let run = store.start("");
    let sdk = common::sdk(&run.fg.endpoint());
    for b in ["demo", "oth", "shared"] {
        ensure_bucket(&sdk, b).await;
    }
    let raw = RawClient::new(&run.fg.endpoint());
    let r = raw
        .send(RawRequest::put("/demo/k", "v34").token(34))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    (run, raw)
}

async fn keys_a_store_would_rewrite_are_refused(store: Store) {
    let (_run, raw) = setup(store).await;
    for path in ["/demo/x/../k", "/demo/./k", "/demo/k/.", "/demo//k"] {
        let r = raw
            .send(RawRequest::put(path, "v33").token(33))
            .await
            .unwrap();
        assert_eq!(
            (r.status, r.code()),
            (400, Some("InvalidObjectName")),
            "{path}: {}",
            r.body
        );
        assert_eq!(get(&raw, "/demo/k").await, (200, "v34".into()), "{path}");
    }
}

async fn a_path_cannot_climb_into_another_bucket(store: Store) {
    let (_run, raw) = setup(store).await;
    let r = raw
        .send(limited(
            RawRequest::put("/shared/../oth/loot", "x").token(1),
        ))
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(get(&raw, "/oth/loot").await.0, 404);
    // `/shared//?lifecycle` is bucket-level to Garage; for fencegate it is
    // no object write either: refused, not forwarded as one.
    let mut lc = limited(RawRequest::put("/shared//", "<LifecycleConfiguration/>"));
    lc.query = "lifecycle".into();
    let r = raw.send(lc.token(1)).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (400, Some("InvalidObjectName")),
        "{}",
        r.body
    );
}

fn delete_objects(body: &str, token: u64) -> RawRequest {
    RawRequest::delete_objects("/demo", body.to_string()).token(token)
}

async fn delete_objects_keys_are_read_once(store: Store) {
    let (_run, raw) = setup(store).await;
    for key in ["k<![CDATA[x]]>", "k<!---->x", "k<?pi?>x"] {
        let body = format!("<Delete><Object><Key>{key}</Key></Object></Delete>");
        let r = raw.send(delete_objects(&body, 1)).await.unwrap();
        // fencegate read `kx` (unfenced), and the backend deleted `kx`.
        assert_eq!(r.status, 200, "{key}: {}", r.body);
        assert_eq!(get(&raw, "/demo/k").await, (200, "v34".into()), "{key}");
    }
    // And plain `k` with a stale token is refused.
    let r = raw
        .send(delete_objects(
            "<Delete><Object><Key>k</Key></Object></Delete>",
            33,
        ))
        .await
        .unwrap();
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(get(&raw, "/demo/k").await, (200, "v34".into()));
}

async fn copy_sources_are_decoded_then_checked(store: Store) {
    let (_run, raw) = setup(store).await;
    let r = raw
        .send(RawRequest::put("/oth/payroll", "secret").token(1))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    for source in ["oth%2Fpayroll", "/oth/payroll", "%2Foth%2Fpayroll"] {
        let copy = limited(RawRequest::new(http::Method::PUT, "/shared/loot"))
            .header("x-amz-copy-source", source)
            .header("x-amz-metadata-directive", "REPLACE")
            .token(5);
        let r = raw.send(copy).await.unwrap();
        assert_eq!(
            (r.status, r.code()),
            (403, Some("AccessDenied")),
            "{source}: {}",
            r.body
        );
    }
    // UploadPartCopy checks the source bucket too.
    let mut part = limited(RawRequest::new(http::Method::PUT, "/shared/loot"))
        .header("x-amz-copy-source", "oth%2Fpayroll")
        .token(5);
    part.query = "partNumber=1&uploadId=u".into();
    let r = raw.send(part).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (403, Some("AccessDenied")),
        "{}",
        r.body
    );
    // A source that names no object is a clear 400.
    let bad = RawRequest::new(http::Method::PUT, "/demo/c")
        .header("x-amz-copy-source", "oth")
        .token(5);
    assert_eq!(raw.send(bad).await.unwrap().status, 400);
    let sdk = common::sdk(&_run.fg.endpoint());
    assert!(
        sdk.head_object()
            .bucket("shared")
            .key("loot")
            .send()
            .await
            .is_err()
    );
}

/// An upload lends its token to its numbered parts alone. Garage took a
/// part with an empty `partNumber` for a PutObject, and s3s and Garage a
/// part that also names `?tagging` for a tagging write: both borrowed the
/// upload's token without one of their own. Both are refused now, and the
/// object is still the token-34 one.
async fn an_upload_lends_its_token_to_numbered_parts_alone(store: Store) {
    let (run, raw) = setup(store).await;
    let sdk = common::sdk(&run.fg.endpoint());
    let up = sdk
        .create_multipart_upload()
        .bucket("demo")
        .key("k")
        .metadata("fencing-token", "34")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap();
    for (query, code) in [
        (format!("partNumber=&uploadId={id}"), "InvalidArgument"),
        (format!("partNumber=0&uploadId={id}"), "InvalidArgument"),
        (
            format!("partNumber=1&uploadId={id}&tagging="),
            "InvalidRequest",
        ),
    ] {
        let mut put = RawRequest::put("/demo/k", "v0");
        put.query = query.clone();
        let r = raw.send(put).await.unwrap();
        assert_eq!(
            (r.status, r.code()),
            (400, Some(code)),
            "{query}: {}",
            r.body
        );
        assert_eq!(get(&raw, "/demo/k").await, (200, "v34".into()), "{query}");
    }
}

on_both_stores!(
    keys_a_store_would_rewrite_are_refused,
    a_path_cannot_climb_into_another_bucket,
    delete_objects_keys_are_read_once,
    copy_sources_are_decoded_then_checked,
    an_upload_lends_its_token_to_numbered_parts_alone,
);

/// A backend answer lost after the whole body arrived: the write may still
/// land, so a newer token is not forwarded until the quarantine is over.
#[tokio::test]
async fn a_lost_answer_after_a_complete_body_keeps_the_resource_closed() {
    let be = TestBackend::start().await;
    be.stall_after_body(33);
    let fg = Fencegate::start_full(
        be.as_fencegate_backend(),
        "",
        "timeout_ms = 1000",
        "[fence]\nadmission_wait_ms = 300\nquarantine_ms = 60000\n",
        &[],
    );
    let raw = RawClient::new(&fg.endpoint());
    let r = raw
        .send(RawRequest::put("/demo/k", "old").token(33))
        .await
        .unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("may still be applied"), "{}", r.body);
    let r = raw
        .send(RawRequest::put("/demo/k", "new").token(34))
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (503, Some("SlowDown")), "{}", r.body);
    let started_34 = be.started(34);
    assert!(
        !started_34,
        "34 forwarded while 33 may still land: {:?}",
        be.events()
    );
    let (_, metrics) =
        common::http_call("GET", &format!("http://{}/metrics", fg.admin), None, None).await;
    assert!(
        metrics.contains("fencegate_quarantines_total 1"),
        "{metrics}"
    );
}

/// An early `200` head is not the backend's final word: the write keeps its
/// place until the answer's body is complete.
#[tokio::test]
async fn a_write_holds_its_place_until_the_answer_body_is_complete() {
    let be = TestBackend::start().await;
    be.stall_after_body(33);
    be.answer_early(33);
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = Arc::new(RawClient::new(&fg.endpoint()));
    let r33 = {
        let raw = raw.clone();
        tokio::spawn(async move {
            let copy = RawRequest::new(http::Method::PUT, "/demo/k")
                .header("x-amz-copy-source", "/demo/src")
                .header("x-amz-metadata-directive", "REPLACE")
                .token(33);
            raw.send(copy).await
        })
    };
    be.wait_body_complete(33).await;
    let r34 = {
        let raw = raw.clone();
        tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "new").token(34)).await })
    };
    // Widen the window for a broken barrier; the assertion is about order.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started_34 = be.started(34);
    assert!(
        !started_34,
        "34 forwarded before 33's answer was complete: {:?}",
        be.events()
    );
    be.release(33);
    assert_eq!(r33.await.unwrap().unwrap().status, 200);
    assert_eq!(r34.await.unwrap().unwrap().status, 200);
    assert_eq!(be.object("demo", "k").unwrap(), "new");
}

/// A token header that no signature covers cannot raise a fence: on a
/// presigned URL it is refused alone and ignored beside a signed token.
#[tokio::test]
async fn unsigned_token_headers_do_not_raise_fences() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());
    let unsigned = |t: u64| vec![("x-fencing-token".to_string(), t.to_string())];
    // A presigned GET plus a header the URL does not sign.
    let mut get = RawRequest::new(http::Method::GET, "/demo/k");
    get.presign = Some(Duration::from_secs(60));
    get.after_signing = unsigned(u64::MAX);
    let r = raw.send(get).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (400, Some("InvalidFencingToken")),
        "{}",
        r.body
    );
    // Beside a signed query token, the unsigned header is ignored.
    let mut put = RawRequest::put("/demo/k", "v5");
    put.presign = Some(Duration::from_secs(60));
    put.query = "x-fencing-token=5".into();
    put.after_signing = unsigned(99);
    let r = raw.send(put).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    // The fence is 5, not 99 nor the maximum: token 6 writes.
    let r = raw
        .send(RawRequest::put("/demo/k", "v6").token(6))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(be.object("demo", "k").unwrap(), "v6");
}

/// With `require_signed_token`, header-signed requests get the presigned
/// rule; without it (the default, for rclone) the header is taken.
#[tokio::test]
async fn require_signed_token_extends_the_rule_to_header_signed_requests() {
    let be = TestBackend::start().await;
    let strict = Fencegate::start(
        be.as_fencegate_backend(),
        "[fence]\nadmission_wait_ms = 5000\nrequire_signed_token = true\n",
    );
    let mut put = RawRequest::put("/demo/s", "x");
    put.after_signing = vec![("x-fencing-token".into(), "99".into())];
    let r = RawClient::new(&strict.endpoint()).send(put).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (400, Some("InvalidFencingToken")),
        "{}",
        r.body
    );
    assert!(!saw_key(&be.events(), "demo/s"));

    let lax = Fencegate::start(be.as_fencegate_backend(), "");
    let mut put = RawRequest::put("/demo/s", "x");
    put.after_signing = vec![("x-fencing-token".into(), "99".into())];
    let r = RawClient::new(&lax.endpoint()).send(put).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Begins a multipart upload of `demo/big` with token 50 (as metadata, the
/// way `aws s3 cp --metadata` sends it); returns its upload id.
async fn begin_upload(fg: &Fencegate) -> String {
    let sdk = common::sdk(&fg.endpoint());
    ensure_bucket(&sdk, "demo").await;
    let up = sdk
        .create_multipart_upload()
        .bucket("demo")
        .key("big")
        .metadata("fencing-token", "50")
        .send()
        .await
        .unwrap();
    up.upload_id().unwrap().to_string()
}

/// Only requests of a multipart upload inherit its token.
#[tokio::test]
async fn upload_ids_lend_their_token_to_multipart_requests_only() {
    let fg = Fencegate::start(common::fencegate::Backend::Embedded, "");
    let id = begin_upload(&fg).await;
    let raw = RawClient::new(&fg.endpoint());
    // A token-less ListParts is a read: it passes.
    let mut list = RawRequest::new(http::Method::GET, "/demo/big");
    list.query = format!("uploadId={id}");
    assert_eq!(raw.send(list).await.unwrap().status, 200);
    // A PutObject with a stray uploadId borrows nothing.
    let mut put = RawRequest::put("/demo/big", "x");
    put.query = format!("uploadId={id}");
    let r = raw.send(put).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (428, Some("MissingFencingToken")),
        "{}",
        r.body
    );
}

/// The token an upload was created with survives a crash.
#[tokio::test]
async fn upload_tokens_survive_a_restart() {
    let mut fg = Fencegate::start(common::fencegate::Backend::Embedded, "");
    let id = begin_upload(&fg).await;
    fg.kill9_and_restart();
    let raw = RawClient::new(&fg.endpoint());
    let mut part = RawRequest::put("/demo/big", vec![7u8; 1024]);
    part.query = format!("partNumber=1&uploadId={id}");
    let r = raw.send(part).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
}

/// An empty fence table is a lost one: start-up stops.
#[test]
fn an_empty_fence_table_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fences.redb"), b"").unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fencegate"))
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A fencegate that starts anyway would serve forever: give it 20 s.
    let mut exited = None;
    for _ in 0..200 {
        if let Some(status) = child.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let status = exited.expect("fencegate started on an empty fence table");
    assert!(!status.success());
    assert!(stderr.contains("empty"), "{stderr}");
    assert_eq!(
        std::fs::metadata(dir.path().join("fences.redb"))
            .unwrap()
            .len(),
        0
    );
}

/// A backend might read either copy of a repeated parameter: refused.
#[tokio::test]
async fn a_query_parameter_given_twice_is_refused() {
    let be = TestBackend::start().await;
    let fg = Fencegate::start(be.as_fencegate_backend(), "");
    let raw = RawClient::new(&fg.endpoint());
    let mut put = RawRequest::put("/demo/k", "x").token(1);
    put.query = "tagging&tagging".into();
    let r = raw.send(put).await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (400, Some("InvalidArgument")),
        "{}",
        r.body
    );
    assert!(!saw_key(&be.events(), "demo/k"));
}

/// A client that leaves mid-exchange does not take the write's place with
/// it: the rest of the exchange goes on without the client (before the
/// answer's head, and after an early head), and a newer token waits for it.
#[tokio::test]
async fn a_client_that_leaves_does_not_free_its_writes_place() {
    for early in [false, true] {
        let be = TestBackend::start().await;
        be.stall_after_body(33);
        if early {
            be.answer_early(33);
        }
        let fg = Fencegate::start(be.as_fencegate_backend(), "");
        let raw = Arc::new(RawClient::new(&fg.endpoint()));
        let r33 = {
            let raw = raw.clone();
            tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "old").token(33)).await })
        };
        be.wait_body_complete(33).await;
        // The client leaves: its connection is dropped.
        r33.abort();
        let _ = r33.await;
        let r34 = {
            let raw = raw.clone();
            tokio::spawn(async move { raw.send(RawRequest::put("/demo/k", "new").token(34)).await })
        };
        // Widen the window for a broken hold; the assertion is about order.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(
            !be.started(34),
            "early head {early}: 34 forwarded while 33 could still land: {:?}",
            be.events()
        );
        be.release(33);
        assert_eq!(r34.await.unwrap().unwrap().status, 200);
        assert_eq!(be.object("demo", "k").unwrap(), "new");
    }
}
