//! The embedded store keeps keys as file paths (s3s-fs), so `k` and `k/x`
//! cannot both be objects, and a directory is not an object. What a client
//! sees where the layout runs out: a clear 4xx that SDKs do not retry, never
//! `500 InternalError`, never another object's bytes, and nothing lost
//! (src/upstream/layout.rs). The bucket is unfenced here: what is tested is
//! the store's answer, not the fence.

mod common;

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use common::fencegate::{Backend, Fencegate};

const UNFENCED: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"\"\nmode = \"unfenced\"\n";

/// fencegate on a fresh embedded store, and a client with bucket `demo`.
async fn store() -> (Fencegate, aws_sdk_s3::Client) {
    let fg = Fencegate::start(Backend::Embedded, UNFENCED);
    let c = common::sdk(&fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    (fg, c)
}

async fn put(c: &aws_sdk_s3::Client, key: &str, body: &'static [u8]) -> Result<(), (u16, String)> {
    let r = c
        .put_object()
        .bucket("demo")
        .key(key)
        .body(ByteStream::from_static(body))
        .send()
        .await;
    outcome(r)
}

/// Ok, or the status and the error code of a refused request.
fn outcome<T, E: ProvideErrorMetadata>(
    r: Result<T, aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>>,
) -> Result<(), (u16, String)> {
    r.map(|_| ()).map_err(|e| refusal(&e))
}

/// The status and the error code of a refused request.
fn refusal<E: ProvideErrorMetadata>(
    e: &aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> (u16, String) {
    let status = e.raw_response().map_or(0, |r| r.status().as_u16());
    (status, e.code().unwrap_or_default().to_string())
}

async fn get(c: &aws_sdk_s3::Client, key: &str) -> Result<Vec<u8>, (u16, String)> {
    match c.get_object().bucket("demo").key(key).send().await {
        Ok(o) => Ok(o.body.collect().await.unwrap().into_bytes().to_vec()),
        Err(e) => Err(refusal(&e)),
    }
}

async fn head(c: &aws_sdk_s3::Client, key: &str) -> u16 {
    match c.head_object().bucket("demo").key(key).send().await {
        Ok(_) => 200,
        Err(e) => refusal(&e).0,
    }
}

#[tokio::test]
async fn keys_the_file_layout_cannot_hold_get_clear_answers_and_lose_nothing() {
    let (_fg, c) = store().await;
    put(&c, "k", b"object k").await.unwrap();
    put(&c, "d/x", b"object d/x").await.unwrap();

    // Writes the layout cannot hold: refused, with what to do about it.
    let parent = (400, "XMinioParentIsObject".to_string());
    let as_dir = (409, "XMinioObjectExistsAsDirectory".to_string());
    assert_eq!(put(&c, "k/x", b"under k").await, Err(parent.clone()));
    assert_eq!(put(&c, "k/", b"").await, Err(parent.clone()));
    assert_eq!(put(&c, "d", b"over d/").await, Err(as_dir.clone()));
    let copy = |dst: &'static str, src: &'static str| {
        c.copy_object()
            .bucket("demo")
            .key(dst)
            .copy_source(format!("demo/{src}"))
            .send()
    };
    assert_eq!(outcome(copy("k/y", "d/x").await), Err(parent.clone()));
    assert_eq!(outcome(copy("d", "k").await), Err(as_dir.clone()));
    let create = c
        .create_multipart_upload()
        .bucket("demo")
        .key("k/z")
        .send()
        .await;
    assert_eq!(outcome(create), Err(parent));

    // Reads of a key that is a directory, or of `k/` (the path of `k`):
    // no such key, never a 500 and never k's bytes.
    let no_such_key = (404, "NoSuchKey".to_string());
    assert_eq!(get(&c, "d").await, Err(no_such_key.clone()));
    assert_eq!(get(&c, "k/").await, Err(no_such_key.clone()));
    assert_eq!(get(&c, "d/").await, Err(no_such_key.clone()));
    assert_eq!((head(&c, "d").await, head(&c, "k/").await), (404, 404));
    assert_eq!(outcome(copy("copied", "d").await), Err(no_such_key));

    // Deletes of such keys: nothing to delete, and nothing else touched.
    c.delete_object()
        .bucket("demo")
        .key("d")
        .send()
        .await
        .unwrap();
    c.delete_object()
        .bucket("demo")
        .key("k/")
        .send()
        .await
        .unwrap();
    put(&c, "gone", b"to delete").await.unwrap();
    let keys = ["d", "k/", "gone", "never"];
    let objects = keys.map(|k| ObjectIdentifier::builder().key(k).build().unwrap());
    let deleted = c
        .delete_objects()
        .bucket("demo")
        .delete(
            Delete::builder()
                .set_objects(Some(objects.to_vec()))
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let mut said: Vec<&str> = deleted.deleted().iter().filter_map(|d| d.key()).collect();
    said.sort_unstable();
    assert_eq!(said, ["d", "gone", "k/", "never"]);
    assert!(deleted.errors().is_empty(), "{:?}", deleted.errors());
    assert_eq!(get(&c, "gone").await, Err((404, "NoSuchKey".to_string())));
    assert_eq!(get(&c, "k").await.unwrap(), b"object k");
    assert_eq!(get(&c, "d/x").await.unwrap(), b"object d/x");
}

/// A conflict that appears while a multipart upload is open is refused at
/// Complete before the parts are consumed: the upload can be completed
/// once the conflict is gone.
#[tokio::test]
async fn a_complete_refused_by_the_layout_keeps_its_parts() {
    let (_fg, c) = store().await;
    let up = c
        .create_multipart_upload()
        .bucket("demo")
        .key("p")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap();
    let part = c
        .upload_part()
        .bucket("demo")
        .key("p")
        .upload_id(id)
        .part_number(1)
        .body(ByteStream::from_static(b"the only part"))
        .send()
        .await
        .unwrap();
    let parts = CompletedMultipartUpload::builder()
        .parts(
            CompletedPart::builder()
                .part_number(1)
                .set_e_tag(part.e_tag().map(str::to_string))
                .build(),
        )
        .build();
    let complete = || {
        c.complete_multipart_upload()
            .bucket("demo")
            .key("p")
            .upload_id(id)
            .multipart_upload(parts.clone())
            .send()
    };

    put(&c, "p/q", b"makes p a directory").await.unwrap();
    let refused = outcome(complete().await);
    assert_eq!(
        refused,
        Err((409, "XMinioObjectExistsAsDirectory".to_string()))
    );
    let listed = c
        .list_parts()
        .bucket("demo")
        .key("p")
        .upload_id(id)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.parts().len(), 1, "the part is still there");

    c.delete_object()
        .bucket("demo")
        .key("p/q")
        .send()
        .await
        .unwrap();
    complete().await.unwrap();
    assert_eq!(get(&c, "p").await.unwrap(), b"the only part");
}

/// s3s-fs names two metadata files after each key, in base64, so in bucket
/// `demo` it can hold keys of up to 164 bytes (131 for a multipart upload,
/// whose names carry the upload's id). A longer key is refused before
/// anything is written; left alone, s3s-fs wrote the object's bytes and
/// then answered 500.
#[tokio::test]
async fn a_key_too_long_for_the_stores_file_names_is_refused_before_it_lands() {
    let (_fg, c) = store().await;
    let too_long = (400, "KeyTooLongError".to_string());

    let longest = "k".repeat(164);
    put(&c, &longest, b"fits").await.unwrap();
    assert_eq!(get(&c, &longest).await.unwrap(), b"fits");
    let over = "k".repeat(165);
    assert_eq!(put(&c, &over, b"does not fit").await, Err(too_long.clone()));
    assert_eq!(get(&c, &over).await, Err((404, "NoSuchKey".to_string())));
    let segment = format!("{}/x", "s".repeat(256));
    assert_eq!(put(&c, &segment, b"x").await, Err(too_long.clone()));

    let create = |key: String| c.create_multipart_upload().bucket("demo").key(key).send();
    create("u".repeat(131)).await.unwrap();
    let refused = outcome(create("u".repeat(132)).await);
    assert_eq!(refused, Err(too_long));
}

/// s3s-fs removed a bucket with every object in it, and made a missing
/// bucket on the first write into it. S3 deletes only an empty bucket and
/// answers no such bucket.
#[tokio::test]
async fn delete_bucket_keeps_objects_and_writes_need_the_bucket() {
    let (_fg, c) = store().await;
    put(&c, "a/b/c", b"kept").await.unwrap();

    let refused = outcome(c.delete_bucket().bucket("demo").send().await);
    let not_empty = (409, "BucketNotEmpty".to_string());
    assert_eq!(refused, Err(not_empty));
    assert_eq!(get(&c, "a/b/c").await.unwrap(), b"kept");

    // Deleted keys leave empty directories; they are not objects.
    c.delete_object()
        .bucket("demo")
        .key("a/b/c")
        .send()
        .await
        .unwrap();
    c.delete_bucket().bucket("demo").send().await.unwrap();
    let gone = outcome(c.head_bucket().bucket("demo").send().await);
    assert_eq!(gone.map_err(|e| e.0), Err(404));

    // A write into a bucket that does not exist does not make it.
    let no_bucket = (404, "NoSuchBucket".to_string());
    assert_eq!(put(&c, "k", b"x").await, Err(no_bucket.clone()));
    let create = c
        .create_multipart_upload()
        .bucket("demo")
        .key("k")
        .send()
        .await;
    assert_eq!(outcome(create), Err(no_bucket.clone()));
    assert_eq!(get(&c, "k").await, Err(no_bucket));
    let buckets = c.list_buckets().send().await.unwrap();
    assert!(buckets.buckets().is_empty(), "{:?}", buckets.buckets());
}

/// GET and HEAD honour their conditions, which s3s-fs ignored: a
/// transfer manager's ranged GETs with `If-Match` fail with 412 once the
/// object has been replaced, instead of joining two versions.
#[tokio::test]
async fn reads_honour_their_conditions() {
    let (_fg, c) = store().await;
    put(&c, "big", b"version one, first half and second half")
        .await
        .unwrap();
    let first = c
        .head_object()
        .bucket("demo")
        .key("big")
        .send()
        .await
        .unwrap();
    let etag = first.e_tag().unwrap().to_string();

    let ranged = |etag: String| {
        c.get_object()
            .bucket("demo")
            .key("big")
            .range("bytes=0-11")
            .if_match(etag)
            .send()
    };
    let part = ranged(etag.clone()).await.unwrap();
    assert_eq!(
        part.body.collect().await.unwrap().into_bytes().as_ref(),
        b"version one,"
    );
    put(&c, "big", b"version two, replaced midway")
        .await
        .unwrap();
    let refused = outcome(ranged(etag.clone()).await);
    assert_eq!(refused, Err((412, "PreconditionFailed".to_string())));

    let again = c
        .get_object()
        .bucket("demo")
        .key("big")
        .if_none_match(&etag)
        .send()
        .await;
    assert!(again.is_ok(), "a changed object is sent: {again:?}");
    let now = c
        .head_object()
        .bucket("demo")
        .key("big")
        .send()
        .await
        .unwrap();
    let unchanged = c
        .get_object()
        .bucket("demo")
        .key("big")
        .if_none_match(now.e_tag().unwrap())
        .send()
        .await;
    assert_eq!(outcome(unchanged).map_err(|e| e.0), Err(304));
}

/// s3s-fs moved a PUT's object into place before checking its Content-MD5
/// and checksums: a corrupt body was answered 400 and replaced the good
/// version all the same. Now nothing lands.
#[tokio::test]
async fn a_put_that_fails_its_digest_replaces_nothing() {
    use base64::Engine;
    let (_fg, c) = store().await;
    put(&c, "v", b"the good version").await.unwrap();
    let other_md5 = {
        use md5::Digest;
        base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(b"another body"))
    };
    let refused = c
        .put_object()
        .bucket("demo")
        .key("v")
        .content_md5(other_md5)
        .body(ByteStream::from_static(b"a corrupted body"))
        .send()
        .await;
    assert_eq!(outcome(refused), Err((400, "BadDigest".to_string())));
    assert_eq!(get(&c, "v").await.unwrap(), b"the good version");

    let refused = c
        .put_object()
        .bucket("demo")
        .key("v")
        .checksum_crc32("AAAAAA==")
        .body(ByteStream::from_static(b"a corrupted body"))
        .send()
        .await;
    assert_eq!(outcome(refused), Err((400, "BadDigest".to_string())));
    assert_eq!(get(&c, "v").await.unwrap(), b"the good version");

    // The right digests still go through, the SDK's default trailer too.
    c.put_object()
        .bucket("demo")
        .key("v")
        .checksum_algorithm(aws_sdk_s3::types::ChecksumAlgorithm::Crc32)
        .body(ByteStream::from_static(b"the next version"))
        .send()
        .await
        .unwrap();
    assert_eq!(get(&c, "v").await.unwrap(), b"the next version");
}

/// s3s-fs did not check an UploadPart's digests at all: a corrupt part was
/// answered 200 and completed into the object. Now it is refused and the
/// upload goes on with the part sent again.
#[tokio::test]
async fn a_part_that_fails_its_digest_is_refused() {
    use base64::Engine;
    let (_fg, c) = store().await;
    let up = c
        .create_multipart_upload()
        .bucket("demo")
        .key("mp")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap();
    let md5_of = |body: &[u8]| {
        use md5::Digest;
        base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(body))
    };
    let part = |body: &'static [u8], md5: String| {
        c.upload_part()
            .bucket("demo")
            .key("mp")
            .upload_id(id)
            .part_number(1)
            .content_md5(md5)
            .body(ByteStream::from_static(body))
            .send()
    };
    let refused = part(b"a corrupted part", md5_of(b"the part sent")).await;
    assert_eq!(outcome(refused), Err((400, "BadDigest".to_string())));
    let listed = c
        .list_parts()
        .bucket("demo")
        .key("mp")
        .upload_id(id)
        .send()
        .await
        .unwrap();
    assert!(listed.parts().is_empty(), "{:?}", listed.parts());

    let sent = part(b"the part sent", md5_of(b"the part sent"))
        .await
        .unwrap();
    let parts = CompletedMultipartUpload::builder()
        .parts(
            CompletedPart::builder()
                .part_number(1)
                .set_e_tag(sent.e_tag().map(str::to_string))
                .build(),
        )
        .build();
    c.complete_multipart_upload()
        .bucket("demo")
        .key("mp")
        .upload_id(id)
        .multipart_upload(parts)
        .send()
        .await
        .unwrap();
    assert_eq!(get(&c, "mp").await.unwrap(), b"the part sent");
}
