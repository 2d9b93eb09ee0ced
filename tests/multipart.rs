//! Multipart uploads are fenced at every step, and the parts and Complete of
//! an upload inherit the token that created it (so `aws s3 cp --metadata
//! fencing-token=N` works for large files). A holder that lost the fence
//! between UploadPart and Complete is refused at Complete.

mod common;

on_both_stores!(
    parts_inherit_the_creating_token_and_a_stale_complete_is_refused,
    delete_objects_is_all_or_nothing,
    delete_objects_takes_keys_with_spaces_at_either_end
);

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};

const PART: usize = 5 * 1024 * 1024;

/// Creates an upload with `token` and uploads `parts` parts of 5 MiB.
async fn start_upload(
    c: &aws_sdk_s3::Client,
    key: &str,
    token: u64,
    parts: i32,
) -> (String, Vec<CompletedPart>) {
    let up = c
        .create_multipart_upload()
        .bucket("demo")
        .key(key)
        .metadata("fencing-token", token.to_string())
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap().to_string();
    // Parts are listed by ETag only: Garage refuses part checksums at
    // Complete for an upload created without a checksum algorithm
    // (InvalidDigest), as it is entitled to.
    let mut done = Vec::new();
    for n in 1..=parts {
        let part = c
            .upload_part()
            .bucket("demo")
            .key(key)
            .upload_id(&id)
            .part_number(n)
            .body(ByteStream::from(vec![b'0' + n as u8; PART]))
            .send()
            .await
            .unwrap();
        done.push(
            CompletedPart::builder()
                .part_number(n)
                .set_e_tag(part.e_tag().map(str::to_string))
                .build(),
        );
    }
    (id, done)
}

async fn complete(
    c: &aws_sdk_s3::Client,
    key: &str,
    id: &str,
    parts: Vec<CompletedPart>,
) -> Result<(), String> {
    c.complete_multipart_upload()
        .bucket("demo")
        .key(key)
        .upload_id(id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            aws_sdk_s3::error::ProvideErrorMetadata::code(&e)
                .unwrap_or("?")
                .to_string()
        })
}

async fn parts_inherit_the_creating_token_and_a_stale_complete_is_refused(store: common::Store) {
    let run = store.start("");
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;

    // A whole upload with the token given once, at Create.
    // 40 MiB in 8 parts.
    let (id, part) = start_upload(&c, "big", 10, 8).await;
    complete(&c, "big", &id, part).await.unwrap();
    let head = c
        .head_object()
        .bucket("demo")
        .key("big")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_length(), Some(8 * PART as i64));
    assert_eq!(head.metadata().unwrap()["fencing-token"], "10");

    // Holder 11 uploads its parts, then loses the lock: 12 writes.
    let (id, part) = start_upload(&c, "big", 11, 1).await;
    c.put_object()
        .bucket("demo")
        .key("big")
        .metadata("fencing-token", "12")
        .body(ByteStream::from_static(b"twelve"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        complete(&c, "big", &id, part).await.unwrap_err(),
        "StaleFencingToken"
    );
    let got = c
        .get_object()
        .bucket("demo")
        .key("big")
        .send()
        .await
        .unwrap();
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().as_ref(),
        b"twelve"
    );

    // An upload part without any token and no known upload is refused.
    let r = c
        .upload_part()
        .bucket("demo")
        .key("big")
        .upload_id("unknown-upload")
        .part_number(1)
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&r),
        Some("MissingFencingToken")
    );
}

async fn delete_objects(
    c: &aws_sdk_s3::Client,
    keys: &[&str],
    token: Option<u64>,
) -> Result<usize, String> {
    use aws_sdk_s3::types::{Delete, ObjectIdentifier};
    let objects: Vec<ObjectIdentifier> = keys
        .iter()
        .map(|k| ObjectIdentifier::builder().key(*k).build().unwrap())
        .collect();
    let req = c
        .delete_objects()
        .bucket("demo")
        .delete(
            Delete::builder()
                .set_objects(Some(objects))
                .build()
                .unwrap(),
        )
        .customize()
        .mutate_request(move |r| {
            if let Some(t) = token {
                r.headers_mut().insert("x-fencing-token", t.to_string());
            }
        });
    req.send().await.map(|o| o.deleted().len()).map_err(|e| {
        aws_sdk_s3::error::ProvideErrorMetadata::code(&e)
            .unwrap_or("?")
            .to_string()
    })
}

async fn delete_objects_is_all_or_nothing(store: common::Store) {
    let run = store.start("[[rules]]\nbucket = \"demo\"\nprefix = \"tmp/\"\nmode = \"unfenced\"\n");
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    for (k, t) in [("a", 10), ("b", 30), ("tmp/x", 0)] {
        c.put_object()
            .bucket("demo")
            .key(k)
            .metadata("fencing-token", t.to_string())
            .body(ByteStream::from_static(b"x"))
            .send()
            .await
            .unwrap();
    }
    let exists = |k: &'static str| {
        let c = c.clone();
        async move { c.head_object().bucket("demo").key(k).send().await.is_ok() }
    };
    // Token 20 is fine for "a" but fenced off for "b": nothing is deleted.
    assert_eq!(
        delete_objects(&c, &["a", "b"], Some(20)).await.unwrap_err(),
        "StaleFencingToken"
    );
    assert!(exists("a").await && exists("b").await);
    // ... and "a"'s fence did not move: 15 is still good there.
    c.put_object()
        .bucket("demo")
        .key("a")
        .metadata("fencing-token", "15")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        delete_objects(&c, &["a", "b"], None).await.unwrap_err(),
        "MissingFencingToken"
    );
    assert!(exists("a").await && exists("b").await);
    // Unfenced keys need no token.
    assert_eq!(delete_objects(&c, &["tmp/x"], None).await, Ok(1));
    assert!(!exists("tmp/x").await);
    // With a current token, all go.
    assert_eq!(delete_objects(&c, &["a", "b"], Some(30)).await, Ok(2));
    assert!(!exists("a").await && !exists("b").await);
}

/// Keys that begin or end with a space are keys like any other: a
/// DeleteObjects naming them deletes them, and not the key without the
/// spaces (the backend gets them as character references, which no
/// reader trims).
async fn delete_objects_takes_keys_with_spaces_at_either_end(store: common::Store) {
    let run = store.start("[[rules]]\nbucket = \"demo\"\nprefix = \"\"\nmode = \"unfenced\"\n");
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    for k in ["k", " k", "k ", "_ "] {
        let body = ByteStream::from(k.as_bytes().to_vec());
        c.put_object()
            .bucket("demo")
            .key(k)
            .body(body)
            .send()
            .await
            .unwrap();
    }
    assert_eq!(delete_objects(&c, &[" k", "k ", "_ "], None).await, Ok(3));
    let listed = c.list_objects_v2().bucket("demo").send().await.unwrap();
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, ["k"]);
}
