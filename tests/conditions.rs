//! Conditional writes that hold on every store (CONTRACT §8), made atomic
//! by fencegate's object hold: on Garage, which ignores every condition,
//! and on the embedded store, which checks and then writes.
//!
//! - racing put-if-absent writers: exactly one wins each round, on an
//!   unfenced prefix and on a fenced key where all send one token;
//! - `If-Match` swaps: exactly one winner per version;
//! - a wrong condition refuses the write and changes nothing, a right one
//!   lets it through: PutObject, CopyObject's destination,
//!   CompleteMultipartUpload, DeleteObject (ETag, time, size) and each key
//!   of DeleteObjects;
//! - the backend's own support is probed and shown on `/readyz`;
//! - CreateBucket's location constraint is rewritten for the backend.
//!
//! `FENCEGATE_UNSAFE_NO_HOLD=1` (for the fencegate under test) takes the
//! hold away: the races then have several winners.

mod common;

use aws_sdk_s3::Client;
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use common::Store;
use std::sync::Arc;

const FREE: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"free/\"\nmode = \"unfenced\"\n";

/// The status and S3 code of a failed call, or `(200, "")`.
fn outcome<T, E: ProvideErrorMetadata>(
    r: Result<T, aws_sdk_s3::error::SdkError<E, aws_smithy_runtime_api::http::Response>>,
) -> (u16, String) {
    match r {
        Ok(_) => (200, String::new()),
        Err(e) => {
            let status = e.raw_response().map_or(0, |r| r.status().as_u16());
            (status, e.code().unwrap_or_default().to_string())
        }
    }
}

async fn body_of(c: &Client, key: &str) -> Option<String> {
    let got = c.get_object().bucket("demo").key(key).send().await.ok()?;
    let bytes = got
        .body
        .collect()
        .await
        .unwrap_or_else(|e| panic!("GET {key}: {e:?}"))
        .into_bytes();
    Some(String::from_utf8(bytes.to_vec()).unwrap())
}

async fn etag_of(c: &Client, key: &str) -> String {
    let h = c
        .head_object()
        .bucket("demo")
        .key(key)
        .send()
        .await
        .unwrap();
    h.e_tag().unwrap().to_string()
}

fn put(
    c: &Client,
    key: &str,
    body: &str,
    token: Option<u64>,
) -> aws_sdk_s3::operation::put_object::builders::PutObjectFluentBuilder {
    let p = c
        .put_object()
        .bucket("demo")
        .key(key)
        .body(ByteStream::from(body.as_bytes().to_vec()));
    match token {
        Some(t) => p.metadata("fencing-token", t.to_string()),
        None => p,
    }
}

/// `writers` PUTs with `If-None-Match: *` of one fresh key at once; the
/// bodies that were answered 200.
async fn race_if_absent(
    c: &Arc<Client>,
    key: &str,
    writers: usize,
    token: Option<u64>,
) -> Vec<String> {
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (c, key) = (c.clone(), key.to_string());
        tasks.push(tokio::spawn(async move {
            let body = format!("writer {w} of {key}");
            let r = put(&c, &key, &body, token).if_none_match("*").send().await;
            match outcome(r) {
                (200, _) => Some(body),
                (412, code) if code == "PreconditionFailed" => None,
                other => panic!("put-if-absent of {key}: {other:?}"),
            }
        }));
    }
    let mut won = Vec::new();
    for t in tasks {
        won.extend(t.await.unwrap());
    }
    won
}

/// Rounds of racing put-if-absent writers, on an unfenced key and on a
/// fenced key where every writer has the same token: one winner a round,
/// and the object holds the winner's bytes.
async fn racing_put_if_absent_has_one_winner(store: Store) {
    let run = store.start(FREE);
    let c = Arc::new(common::sdk(&run.fg.endpoint()));
    common::ensure_bucket(&c, "demo").await;
    for round in 0..20 {
        for (key, token) in [
            (format!("free/race-{round}"), None),
            (format!("fenced/race-{round}"), Some(7)),
        ] {
            let won = race_if_absent(&c, &key, 16, token).await;
            assert_eq!(won.len(), 1, "round {round}, {key}: {} winners", won.len());
            assert_eq!(body_of(&c, &key).await.as_deref(), Some(won[0].as_str()));
        }
    }
}

/// Writers that read the object's ETag and then swap it with `If-Match`:
/// of the writers that read one version, exactly one replaces it.
async fn if_match_swaps_have_one_winner_per_version(store: Store) {
    let run = store.start(FREE);
    let c = Arc::new(common::sdk(&run.fg.endpoint()));
    common::ensure_bucket(&c, "demo").await;
    let key = "free/counter";
    put(&c, key, "version 0", None).send().await.unwrap();
    for round in 1..=10 {
        let etag = etag_of(&c, key).await;
        let mut tasks = Vec::new();
        for w in 0..8 {
            let (c, etag) = (c.clone(), etag.clone());
            tasks.push(tokio::spawn(async move {
                let body = format!("version {round} by {w}");
                let r = put(&c, key, &body, None).if_match(etag).send().await;
                match outcome(r) {
                    (200, _) => Some(body),
                    (412, _) => None,
                    other => panic!("swap: {other:?}"),
                }
            }));
        }
        let mut won = Vec::new();
        for t in tasks {
            won.extend(t.await.unwrap());
        }
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        assert_eq!(body_of(&c, key).await, Some(won[0].clone()));
    }
}

/// PutObject: wrong conditions refuse and change nothing, `If-Match: *`
/// and both conditions at once are not implemented, a right `If-Match`
/// writes. The ETags of `free/k`'s first and second versions.
async fn put_object_conditions(c: &Client, wrong: &str) -> (String, String) {
    put(c, "free/k", "v1", None).send().await.unwrap();
    let v1 = etag_of(c, "free/k").await;

    // PutObject.
    let r = put(c, "free/k", "x", None).if_none_match("*").send().await;
    assert_eq!(outcome(r), (412, "PreconditionFailed".into()));
    let r = put(c, "free/k", "x", None).if_match(wrong).send().await;
    assert_eq!(outcome(r), (412, "PreconditionFailed".into()));
    let r = put(c, "free/missing", "x", None).if_match(&v1).send().await;
    assert_eq!(outcome(r), (404, "NoSuchKey".into()));
    assert_eq!(body_of(c, "free/missing").await, None);
    assert_eq!(body_of(c, "free/k").await.as_deref(), Some("v1"));
    // What AWS does not implement: `If-Match: *` on a write, both at once.
    let r = put(c, "free/k", "x", None).if_match("*").send().await;
    assert_eq!(outcome(r), (501, "NotImplemented".into()));
    let r = put(c, "free/k", "x", None).if_match(&v1).if_none_match("*");
    assert_eq!(outcome(r.send().await), (501, "NotImplemented".into()));
    put(c, "free/k", "v2", None)
        .if_match(&v1)
        .send()
        .await
        .unwrap();
    let v2 = etag_of(c, "free/k").await;
    (v1, v2)
}

/// CopyObject: the destination's conditions refuse or let the copy
/// onto `free/k` (at version `v2`) through.
async fn copy_object_conditions(c: &Client, v1: &str, v2: &str) {
    put(c, "free/src", "copied", None).send().await.unwrap();
    let copy = || {
        c.copy_object()
            .bucket("demo")
            .key("free/k")
            .copy_source("demo/free/src")
    };
    assert_eq!(
        outcome(copy().if_none_match("*").send().await),
        (412, "PreconditionFailed".into())
    );
    assert_eq!(
        outcome(copy().if_match(v1).send().await),
        (412, "PreconditionFailed".into())
    );
    assert_eq!(body_of(c, "free/k").await.as_deref(), Some("v2"));
    copy().if_match(v2).send().await.unwrap();
    assert_eq!(body_of(c, "free/k").await.as_deref(), Some("copied"));
    let to_new = c
        .copy_object()
        .bucket("demo")
        .key("free/new")
        .copy_source("demo/free/src");
    to_new.if_none_match("*").send().await.unwrap();
}

/// DeleteObject: a wrong ETag, size or time refuses and keeps the object,
/// right ones delete it; once gone, `If-Match` fails and a size alone holds.
async fn delete_object_conditions(c: &Client, wrong: &str) {
    let del = || c.delete_object().bucket("demo").key("free/k");
    assert_eq!(
        outcome(del().if_match(wrong).send().await),
        (412, "PreconditionFailed".into())
    );
    assert_eq!(
        outcome(del().if_match_size(999).send().await),
        (412, "PreconditionFailed".into())
    );
    let head = c
        .head_object()
        .bucket("demo")
        .key("free/k")
        .send()
        .await
        .unwrap();
    let modified = *head.last_modified().unwrap();
    let earlier = aws_sdk_s3::primitives::DateTime::from_secs(modified.secs() - 3600);
    let r = del().if_match_last_modified_time(earlier).send().await;
    assert_eq!(outcome(r), (412, "PreconditionFailed".into()));
    assert_eq!(body_of(c, "free/k").await.as_deref(), Some("copied"));
    let size = head.content_length().unwrap();
    let etag = head.e_tag().unwrap();
    let r = del()
        .if_match(etag)
        .if_match_size(size)
        .if_match_last_modified_time(modified);
    r.send().await.unwrap();
    assert_eq!(body_of(c, "free/k").await, None);
    // Gone: `If-Match` (even `*`) cannot hold; a size alone holds.
    assert_eq!(
        outcome(del().if_match("*").send().await),
        (404, "NoSuchKey".into())
    );
    del().if_match_size(5).send().await.unwrap();
}

/// DeleteObjects: each key's conditions decide that key alone, and each
/// key is answered, also when every key is refused.
async fn delete_objects_conditions(c: &Client, wrong: &str) {
    put(c, "free/d1", "one", None).send().await.unwrap();
    put(c, "free/d2", "two", None).send().await.unwrap();
    let d1 = etag_of(c, "free/d1").await;
    let obj = |k: &str| aws_sdk_s3::types::ObjectIdentifier::builder().key(k);
    let delete = aws_sdk_s3::types::Delete::builder()
        .objects(obj("free/d1").e_tag(&d1).build().unwrap())
        .objects(obj("free/d2").e_tag(wrong).build().unwrap())
        .objects(obj("free/d3").build().unwrap())
        .build()
        .unwrap();
    let res = c
        .delete_objects()
        .bucket("demo")
        .delete(delete)
        .send()
        .await
        .unwrap();
    let deleted: Vec<&str> = res.deleted().iter().filter_map(|d| d.key()).collect();
    let errors: Vec<(&str, &str)> = res
        .errors()
        .iter()
        .map(|e| (e.key().unwrap_or_default(), e.code().unwrap_or_default()))
        .collect();
    assert!(
        deleted.contains(&"free/d1") && deleted.contains(&"free/d3"),
        "{deleted:?}"
    );
    assert_eq!(errors, [("free/d2", "PreconditionFailed")]);
    assert_eq!(body_of(c, "free/d1").await, None);
    assert_eq!(body_of(c, "free/d2").await.as_deref(), Some("two"));
    // Only refused keys: nothing reaches the backend, the answer is whole.
    let delete = aws_sdk_s3::types::Delete::builder()
        .objects(obj("free/d2").e_tag(wrong).build().unwrap())
        .build()
        .unwrap();
    let res = c
        .delete_objects()
        .bucket("demo")
        .delete(delete)
        .send()
        .await
        .unwrap();
    assert_eq!(res.errors().len(), 1);
    assert_eq!(body_of(c, "free/d2").await.as_deref(), Some("two"));
}

/// A condition that does not hold refuses the write and changes nothing;
/// one that holds lets it through. Each operation S3 gives conditions.
async fn wrong_conditions_refuse_and_right_ones_pass(store: Store) {
    let run = store.start(FREE);
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    let wrong = "\"0123456789abcdef0123456789abcdef\"";
    let (v1, v2) = put_object_conditions(&c, wrong).await;

    // CopyObject: the destination's conditions.
    copy_object_conditions(&c, &v1, &v2).await;

    // DeleteObject: ETag, last-modified time and size.
    delete_object_conditions(&c, wrong).await;

    // DeleteObjects: each key's conditions, each key answered.
    delete_objects_conditions(&c, wrong).await;
}

/// CompleteMultipartUpload's conditions are decided when it completes; a
/// refused one keeps its upload, which completes once the condition holds.
async fn complete_multipart_upload_conditions(store: Store) {
    let run = store.start(FREE);
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    // (Garage drops an upload begun before the key's latest version: the
    // object is written first.)
    put(&c, "free/mp", "already here", None)
        .send()
        .await
        .unwrap();
    let up = c
        .create_multipart_upload()
        .bucket("demo")
        .key("free/mp")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap().to_string();
    let part = c
        .upload_part()
        .bucket("demo")
        .key("free/mp")
        .upload_id(&id)
        .part_number(1)
        .body(ByteStream::from_static(b"multipart body"))
        .send()
        .await
        .unwrap();
    let parts = aws_sdk_s3::types::CompletedMultipartUpload::builder()
        .parts(
            aws_sdk_s3::types::CompletedPart::builder()
                .part_number(1)
                .e_tag(part.e_tag().unwrap())
                .build(),
        )
        .build();
    let complete = || {
        c.complete_multipart_upload()
            .bucket("demo")
            .key("free/mp")
            .upload_id(&id)
            .multipart_upload(parts.clone())
    };
    assert_eq!(
        outcome(complete().if_none_match("*").send().await),
        (412, "PreconditionFailed".into())
    );
    assert_eq!(
        body_of(&c, "free/mp").await.as_deref(),
        Some("already here")
    );
    let here = etag_of(&c, "free/mp").await;
    complete().if_match(&here).send().await.unwrap();
    assert_eq!(
        body_of(&c, "free/mp").await.as_deref(),
        Some("multipart body")
    );
}

/// On a fenced key the token is checked first (a stale writer learns it is
/// stale whatever the object is), then the condition.
async fn token_and_condition_both_apply(store: Store) {
    let run = store.start("");
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    put(&c, "k", "by 5", Some(5))
        .if_none_match("*")
        .send()
        .await
        .unwrap();
    let r = put(&c, "k", "by 4", Some(4))
        .if_none_match("*")
        .send()
        .await;
    assert_eq!(outcome(r), (409, "StaleFencingToken".into()));
    let r = put(&c, "k", "by 6", Some(6))
        .if_none_match("*")
        .send()
        .await;
    assert_eq!(outcome(r), (412, "PreconditionFailed".into()));
    let r = put(&c, "k", "by 6", None).if_none_match("*").send().await;
    assert_eq!(outcome(r), (428, "MissingFencingToken".into()));
    assert_eq!(body_of(&c, "k").await.as_deref(), Some("by 5"));
}

on_both_stores!(
    racing_put_if_absent_has_one_winner,
    if_match_swaps_have_one_winner_per_version,
    wrong_conditions_refuse_and_right_ones_pass,
    token_and_condition_both_apply,
    complete_multipart_upload_conditions,
);

/// Whether the store honours conditions itself is probed and shown: Garage
/// applies every write whose condition fails.
#[tokio::test]
async fn the_probe_tells_that_garage_ignores_conditions() {
    let garage = common::garage::Garage::start();
    let fg = common::fencegate::Fencegate::start_full(
        garage.backend(),
        "",
        "probe_conditions = true",
        "",
        &[],
    );
    let url = format!("http://{}/readyz", fg.admin);
    let mut ready = String::new();
    for _ in 0..100 {
        ready = common::http_call("GET", &url, None, None).await.1;
        if ready.contains("\"delete_if_match\":false") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    for answer in [
        "\"if_none_match\":false",
        "\"if_match\":false",
        "\"delete_if_match\":false",
    ] {
        assert!(ready.contains(answer), "{ready}");
    }
    let metrics =
        common::http_call("GET", &format!("http://{}/metrics", fg.admin), None, None).await;
    assert!(
        metrics
            .1
            .contains("fencegate_backend_honours_condition{condition=\"if-none-match\"} 0"),
        "{}",
        metrics.1
    );
    // The probe's object is gone again.
    let c = common::sdk(&fg.endpoint());
    let listed = c.list_objects_v2().bucket("demo").send().await.unwrap();
    assert_eq!(listed.key_count(), Some(0), "{listed:?}");
}

/// CreateBucket names fencegate's region; Garage makes buckets only in its
/// own, and gets that.
#[tokio::test]
async fn create_bucket_names_the_backends_region() {
    use aws_sdk_s3::types::{BucketLocationConstraint, CreateBucketConfiguration};
    let garage = common::garage::Garage::start();
    let fg = common::fencegate::Fencegate::start(garage.backend(), "");
    let c = common::sdk(&fg.endpoint());
    let config = |region: &str| {
        CreateBucketConfiguration::builder()
            .location_constraint(BucketLocationConstraint::from(region))
            .build()
    };
    let made = c
        .create_bucket()
        .bucket("made-here")
        .create_bucket_configuration(config("us-east-1"));
    made.send().await.unwrap();
    c.head_bucket().bucket("made-here").send().await.unwrap();
    let elsewhere = c
        .create_bucket()
        .bucket("not-here")
        .create_bucket_configuration(config("eu-west-1"));
    let r = outcome(elsewhere.send().await);
    assert_eq!(r, (400, "IllegalLocationConstraintException".into()));
}
