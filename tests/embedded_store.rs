//! The embedded store (src/store/) through fencegate, as an S3 client sees
//! it: every key S3 allows, multipart as AWS does it, DeleteBucket only
//! when empty, reads that honour their conditions and get their bytes,
//! errors that name their request, blob files let go when their object
//! goes (its digests are in `embedded_digests.rs`). The bucket is unfenced here: what is tested is the
//! store's answer, not the fence.

mod common;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};

use common::embedded::{get, outcome, put, store};

/// Every key S3 allows, through fencegate: `k` beside `k/x` and the folder
/// marker `k/`, keys of 1024 bytes (ASCII and multi-byte), keys that begin
/// or end with a space, each its own object, written, read, listed and
/// deleted, by DeleteObject and by DeleteObjects.
#[tokio::test]
async fn every_key_s3_allows_is_its_own_object() {
    let (fg, c) = store().await;
    let long_ascii = "k".repeat(1024);
    let long_utf8 = "é".repeat(512);
    let keys: Vec<String> = ["k", "k/x", "k/", "d/x", "d", "_ ", " lead", "trail ", "a b"]
        .iter()
        .map(|k| k.to_string())
        .chain([long_ascii.clone(), long_utf8.clone()])
        .collect();
    for k in &keys {
        let body = format!("object {k:?}").into_bytes();
        let r = c
            .put_object()
            .bucket("demo")
            .key(k)
            .body(ByteStream::from(body))
            .send()
            .await;
        if let Err(e) = r {
            panic!("put {k:?}: {e:?}");
        }
    }
    for k in &keys {
        let want = format!("object {k:?}").into_bytes();
        assert_eq!(get(&c, k).await.unwrap(), want, "{k:?}");
    }
    let listed = c.list_objects_v2().bucket("demo").send().await.unwrap();
    let mut names: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    let mut want: Vec<&str> = keys.iter().map(String::as_str).collect();
    want.sort_unstable();
    names.sort_unstable();
    assert_eq!(names, want);
    // A key that is one space (the Rust SDK cannot name it: raw requests).
    a_one_space_key_round_trips(&fg).await;
    // Over 1024 bytes: refused (by fencegate, before the store).
    let over = "k".repeat(1025);
    assert_eq!(put(&c, &over, b"x").await.unwrap_err().0, 400);

    // One by DeleteObject, the rest (spaces at either end included) in
    // one DeleteObjects.
    c.delete_object()
        .bucket("demo")
        .key("k/")
        .send()
        .await
        .unwrap();
    assert_eq!(get(&c, "k").await.unwrap(), b"object \"k\"");
    let rest: Vec<ObjectIdentifier> = keys
        .iter()
        .filter(|k| k.as_str() != "k/")
        .map(|k| ObjectIdentifier::builder().key(k).build().unwrap())
        .collect();
    let deleted = c
        .delete_objects()
        .bucket("demo")
        .delete(Delete::builder().set_objects(Some(rest)).build().unwrap())
        .send()
        .await
        .unwrap();
    assert!(deleted.errors().is_empty(), "{:?}", deleted.errors());
    assert_eq!(deleted.deleted().len(), keys.len() - 1);
    let listed = c.list_objects_v2().bucket("demo").send().await.unwrap();
    assert_eq!(listed.key_count(), Some(0), "{listed:?}");
}

/// Puts, gets and deletes the key " " with raw requests.
async fn a_one_space_key_round_trips(fg: &common::fencegate::Fencegate) {
    let raw = common::raw::RawClient::new(&fg.endpoint());
    let r = raw
        .send(common::raw::RawRequest::put("/demo/%20", "space"))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = raw
        .send(common::raw::RawRequest::new(http::Method::GET, "/demo/%20"))
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "space"));
    let r = raw
        .send(common::raw::RawRequest::new(
            http::Method::DELETE,
            "/demo/%20",
        ))
        .await
        .unwrap();
    assert_eq!(r.status, 204);
}

/// Multipart as AWS does it: a part under 5 MiB (but the last) fails the
/// completion with EntityTooSmall, a wrong part ETag with InvalidPart, and
/// either leaves the upload to complete once it is right; the ETag is the
/// MD5 of the parts' MD5s and their count.
#[tokio::test]
async fn multipart_rules_as_aws_has_them() {
    let (_fg, c) = store().await;
    let up = c
        .create_multipart_upload()
        .bucket("demo")
        .key("p")
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap();
    let five_mib = vec![7u8; 5 << 20];
    let upload = |n: i32, body: Vec<u8>| {
        c.upload_part()
            .bucket("demo")
            .key("p")
            .upload_id(id)
            .part_number(n)
            .body(ByteStream::from(body))
            .send()
    };
    let small = upload(1, b"small".to_vec()).await.unwrap();
    let last = upload(2, b"last".to_vec()).await.unwrap();
    let part = |n: i32, etag: &str| CompletedPart::builder().part_number(n).e_tag(etag).build();
    let complete = |parts: Vec<CompletedPart>| {
        c.complete_multipart_upload()
            .bucket("demo")
            .key("p")
            .upload_id(id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
    };
    let too_small = complete(vec![
        part(1, small.e_tag().unwrap()),
        part(2, last.e_tag().unwrap()),
    ]);
    assert_eq!(
        outcome(too_small.await),
        Err((400, "EntityTooSmall".to_string()))
    );
    let big = upload(1, five_mib.clone()).await.unwrap();
    let wrong = complete(vec![
        part(1, small.e_tag().unwrap()),
        part(2, last.e_tag().unwrap()),
    ]);
    assert_eq!(outcome(wrong.await), Err((400, "InvalidPart".to_string())));
    let done = complete(vec![
        part(1, big.e_tag().unwrap()),
        part(2, last.e_tag().unwrap()),
    ])
    .await
    .unwrap();
    let md5 = |b: &[u8]| {
        use md5::Digest;
        md5::Md5::digest(b).to_vec()
    };
    let mut both = md5(&five_mib);
    both.extend(md5(b"last"));
    let want = format!("\"{}-2\"", hex::encode(md5(&both)));
    assert_eq!(done.e_tag(), Some(want.as_str()));
    let mut body = five_mib;
    body.extend_from_slice(b"last");
    assert!(
        get(&c, "p").await.unwrap() == body,
        "the object is its parts, in order"
    );
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

/// A GET reads an object in one of three ways by its size (`store/read.rs`):
/// on the async thread with its record (up to 16 KiB), on a blocking thread
/// with its record (up to 256 KiB), or streamed. Each size at and past each
/// bound gets its bytes, whole and by range.
#[tokio::test]
async fn reads_of_every_size_get_their_bytes() {
    let (_fg, c) = store().await;
    for size in [
        0usize,
        1,
        16 << 10,
        (16 << 10) + 1,
        256 << 10,
        (256 << 10) + 1,
    ] {
        let body: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let key = format!("sized-{size}");
        c.put_object()
            .bucket("demo")
            .key(&key)
            .body(ByteStream::from(body.clone()))
            .send()
            .await
            .unwrap();
        assert_eq!(get(&c, &key).await.unwrap(), body, "{size} bytes, whole");
        if size > 2 {
            let (first, last) = (1, size - 2);
            let ranged = c
                .get_object()
                .bucket("demo")
                .key(&key)
                .range(format!("bytes={first}-{last}"))
                .send()
                .await
                .unwrap();
            let got = ranged.body.collect().await.unwrap().into_bytes();
            assert_eq!(got.as_ref(), &body[first..=last], "{size} bytes, ranged");
        }
    }
}

/// Found by running the whole of ceph/s3-tests (docs/embedded-store.md):
/// an error names its request id in the body and in `x-amz-request-id`,
/// alike, and an object stored without a Content-Type is read back as
/// `binary/octet-stream`, as S3 answers (boto3's `ContentType` is there).
#[tokio::test]
async fn errors_name_their_request_id_and_objects_have_a_content_type() {
    let (fg, c) = store().await;
    let raw = common::raw::RawClient::new(&fg.endpoint());
    let r = raw
        .send(common::raw::RawRequest::new(
            http::Method::GET,
            "/demo/missing",
        ))
        .await
        .unwrap();
    assert_eq!(r.status, 404);
    let header = r.headers["x-amz-request-id"].to_str().unwrap();
    let at = r.body.find("<RequestId>").expect("a RequestId") + 11;
    assert_eq!(&r.body[at..at + header.len()], header, "{}", r.body);

    // The SDK sends a type of its own; a raw PUT sends none.
    let typeless = common::raw::RawRequest::put("/demo/typeless", "x");
    assert_eq!(raw.send(typeless).await.unwrap().status, 200);
    let head = c
        .head_object()
        .bucket("demo")
        .key("typeless")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_type(), Some("binary/octet-stream"));
    let typed = c
        .put_object()
        .bucket("demo")
        .key("typed")
        .content_type("text/plain")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await;
    typed.unwrap();
    let head = c
        .head_object()
        .bucket("demo")
        .key("typed")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_type(), Some("text/plain"));
}

/// The files the fencegate process has open under a `blobs/` directory,
/// as `/proc` names them (a removed file's name ends in ` (deleted)`).
fn open_blob_files(pid: u32) -> Vec<String> {
    (std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten())
    .filter_map(|e| std::fs::read_link(e.path()).ok())
    .map(|p| p.to_string_lossy().into_owned())
    .filter(|p| p.contains("/blobs/"))
    .collect()
}

/// Small reads keep their blob files open for the next read
/// (`store/open_blobs.rs`), but never a removed object's: once a replaced
/// and a deleted object's blobs are removed, no file of theirs is open,
/// so their space is given back to the disk.
#[tokio::test]
async fn a_removed_objects_file_is_not_kept_open() {
    let (fg, c) = store().await;
    for k in ["a", "b", "c"] {
        put(&c, k, b"a small body").await.unwrap();
        assert_eq!(get(&c, k).await.unwrap(), b"a small body");
    }
    let kept = open_blob_files(fg.pid());
    assert_eq!(kept.len(), 3, "each small read keeps its file: {kept:?}");
    put(&c, "a", b"replaced").await.unwrap();
    c.delete_object()
        .bucket("demo")
        .key("b")
        .send()
        .await
        .unwrap();
    // Their blobs go after a grace of 5 s (`Blobs::remove_later`).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while kept
        .iter()
        .filter(|p| std::path::Path::new(p).exists())
        .count()
        > 1
    {
        assert!(std::time::Instant::now() < deadline, "blobs never removed");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let open = open_blob_files(fg.pid());
    let held: Vec<_> = open.iter().filter(|p| p.ends_with(" (deleted)")).collect();
    assert!(held.is_empty(), "removed blobs still open: {held:?}");
    assert_eq!(get(&c, "a").await.unwrap(), b"replaced");
    assert_eq!(get(&c, "c").await.unwrap(), b"a small body");
}
