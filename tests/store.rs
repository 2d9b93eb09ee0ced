//! The embedded store (src/store/) straight, with no fencegate in front and
//! so without fencegate's own hold: it must keep its conditions and answer
//! listings as S3 does by itself.
//!
//! - racing put-if-absent and `If-Match` swaps: one winner each round;
//! - listings: v1 and v2, prefix, any delimiter (an empty one means none),
//!   marker, start-after and continuation token, max-keys 0, url encoding,
//!   UTF-8 byte order, common prefixes, ListObjectVersions, uploads and
//!   parts;
//! - checksums (CRC32, CRC32C, CRC64NVME, SHA-1, SHA-256) stored and
//!   returned, a wrong one refused before anything is visible;
//! - UploadPartCopy by range.

mod common;

use aws_sdk_s3::Client;
use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{ChecksumAlgorithm, ChecksumMode, CompletedMultipartUpload, CompletedPart};
use std::sync::Arc;

/// A fresh store in its own directory, a client for it, bucket `bkt`.
async fn store() -> (tempfile::TempDir, Arc<Client>) {
    let dir = tempfile::tempdir().unwrap();
    let (target, _store) = fencegate::upstream::embedded::start(dir.path(), "us-east-1")
        .await
        .unwrap();
    let c = common::sdk_as(
        &target.endpoint.to_string(),
        &target.access_key_id,
        &target.secret_access_key,
    );
    c.create_bucket().bucket("bkt").send().await.unwrap();
    (dir, Arc::new(c))
}

async fn put(c: &Client, key: &str, body: &str) {
    let b = ByteStream::from(body.as_bytes().to_vec());
    c.put_object()
        .bucket("bkt")
        .key(key)
        .body(b)
        .send()
        .await
        .unwrap();
}

async fn body_of(c: &Client, key: &str) -> Option<String> {
    let got = c.get_object().bucket("bkt").key(key).send().await.ok()?;
    Some(String::from_utf8(got.body.collect().await.unwrap().into_bytes().to_vec()).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn conditions_hold_straight_at_the_store() {
    let (_dir, c) = store().await;
    for round in 0..20 {
        let key = format!("race-{round}");
        let mut tasks = Vec::new();
        for w in 0..16 {
            let (c, key) = (c.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let body = format!("writer {w}");
                let r = c
                    .put_object()
                    .bucket("bkt")
                    .key(&key)
                    .if_none_match("*")
                    .body(ByteStream::from(body.clone().into_bytes()))
                    .send()
                    .await;
                match r {
                    Ok(_) => Some(body),
                    Err(e) if e.code() == Some("PreconditionFailed") => None,
                    Err(e) => panic!("{e:?}"),
                }
            }));
        }
        let mut won = Vec::new();
        for t in tasks {
            won.extend(t.await.unwrap());
        }
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
        assert_eq!(body_of(&c, &key).await, Some(won[0].clone()));
    }
    put(&c, "counter", "0").await;
    for round in 1..=10 {
        let etag = c
            .head_object()
            .bucket("bkt")
            .key("counter")
            .send()
            .await
            .unwrap();
        let etag = etag.e_tag().unwrap().to_string();
        let mut tasks = Vec::new();
        for w in 0..8 {
            let (c, etag) = (c.clone(), etag.clone());
            tasks.push(tokio::spawn(async move {
                let body = format!("{round} by {w}");
                let r = c
                    .put_object()
                    .bucket("bkt")
                    .key("counter")
                    .if_match(etag)
                    .body(ByteStream::from(body.clone().into_bytes()))
                    .send()
                    .await;
                r.ok().map(|_| body)
            }));
        }
        let mut won = Vec::new();
        for t in tasks {
            won.extend(t.await.unwrap());
        }
        assert_eq!(won.len(), 1, "round {round}: {won:?}");
    }
}

/// What a ListObjectsV2 shows: (keys, common prefixes).
async fn v2(c: &Client, prefix: &str, delimiter: Option<&str>) -> (Vec<String>, Vec<String>) {
    let r = c
        .list_objects_v2()
        .bucket("bkt")
        .prefix(prefix)
        .set_delimiter(delimiter.map(str::to_string))
        .send()
        .await
        .unwrap();
    let keys = r
        .contents()
        .iter()
        .filter_map(|o| o.key().map(str::to_string))
        .collect();
    let prefixes = r
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix().map(str::to_string))
        .collect();
    (keys, prefixes)
}

/// Every key and common prefix of ListObjectsV2 with delimiter `/`, read
/// in pages of two by continuation token.
async fn v2_pages_of_two(c: &Client) -> Vec<String> {
    let mut seen = Vec::new();
    let mut token = None;
    loop {
        let r = c
            .list_objects_v2()
            .bucket("bkt")
            .delimiter("/")
            .max_keys(2)
            .set_continuation_token(token)
            .send()
            .await
            .unwrap();
        seen.extend(
            r.contents()
                .iter()
                .filter_map(|o| o.key().map(str::to_string)),
        );
        seen.extend(
            r.common_prefixes()
                .iter()
                .filter_map(|p| p.prefix().map(str::to_string)),
        );
        token = r.next_continuation_token().map(str::to_string);
        if !r.is_truncated().unwrap_or(false) {
            break;
        }
    }
    seen
}

/// ListObjectsV2's start-after, ListObjects' (v1) marker and
/// `encoding-type=url` each give what S3 gives.
async fn start_after_marker_and_url_encoding(c: &Client) {
    // start-after, and v1's marker.
    let after = c
        .list_objects_v2()
        .bucket("bkt")
        .start_after("b")
        .send()
        .await
        .unwrap();
    let first = after.contents().first().and_then(|o| o.key());
    assert_eq!(first, Some("x y"));
    let v1 = c
        .list_objects()
        .bucket("bkt")
        .marker("z/")
        .send()
        .await
        .unwrap();
    let keys: Vec<&str> = v1.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, ["é", "😀"]);
    // encoding-type=url: keys percent-encoded (the Rust SDK leaves them so).
    let url = c
        .list_objects_v2()
        .bucket("bkt")
        .prefix("x")
        .encoding_type(aws_sdk_s3::types::EncodingType::Url)
        .send()
        .await
        .unwrap();
    assert_eq!(url.contents()[0].key(), Some("x%20y"));
}

/// ListObjectVersions under `a/`: one version per key, `null`, the latest.
async fn versions_are_null_and_latest(c: &Client) {
    let versions = c
        .list_object_versions()
        .bucket("bkt")
        .prefix("a/")
        .send()
        .await
        .unwrap();
    let v: Vec<(&str, &str, bool)> = versions
        .versions()
        .iter()
        .map(|v| {
            (
                v.key().unwrap(),
                v.version_id().unwrap(),
                v.is_latest().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        v,
        [
            ("a/b", "null", true),
            ("a/c/d", "null", true),
            ("a/c/e", "null", true)
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn listings_as_s3_gives_them() {
    let (_dir, c) = store().await;
    let keys = [
        "a", "a/b", "a/c/d", "a/c/e", "b", "Z", "é", "😀", "x y", "z/",
    ];
    for k in keys {
        put(&c, k, k).await;
    }
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // UTF-8 byte order, no delimiter (or an empty one).
    let all = s(&[
        "Z", "a", "a/b", "a/c/d", "a/c/e", "b", "x y", "z/", "é", "😀",
    ]);
    assert_eq!(v2(&c, "", None).await, (all.clone(), vec![]));
    assert_eq!(v2(&c, "", Some("")).await, (all, vec![]));
    // Prefix and delimiter; a delimiter of several characters.
    assert_eq!(v2(&c, "a/", Some("/")).await, (s(&["a/b"]), s(&["a/c/"])));
    assert_eq!(v2(&c, "", Some("/")).await.1, s(&["a/", "z/"]));
    assert_eq!(
        v2(&c, "a", Some("/c/")).await,
        (s(&["a", "a/b"]), s(&["a/c/"]))
    );
    // max-keys 0: nothing, and not truncated.
    let none = c
        .list_objects_v2()
        .bucket("bkt")
        .max_keys(0)
        .send()
        .await
        .unwrap();
    assert_eq!(
        (none.key_count(), none.is_truncated()),
        (Some(0), Some(false))
    );
    // Pages of two, by continuation token, with a delimiter: each key or
    // common prefix once.
    let mut seen = v2_pages_of_two(&c).await;
    seen.sort();
    assert_eq!(seen, s(&["Z", "a", "a/", "b", "x y", "z/", "é", "😀"]));
    // start-after, v1's marker, encoding-type=url.
    start_after_marker_and_url_encoding(&c).await;
    // ListObjectVersions: one version per key, `null`, the latest.
    versions_are_null_and_latest(&c).await;
}

/// Starts uploads of `u/1`, `u/2` and `v` in bucket `bkt`, and uploads
/// parts 1 to 3 of `v`'s; the three upload ids.
async fn start_uploads(c: &Client) -> Vec<String> {
    let mut ids = Vec::new();
    for k in ["u/1", "u/2", "v"] {
        let up = c
            .create_multipart_upload()
            .bucket("bkt")
            .key(k)
            .send()
            .await
            .unwrap();
        ids.push(up.upload_id().unwrap().to_string());
    }
    for n in 1..=3 {
        c.upload_part()
            .bucket("bkt")
            .key("v")
            .upload_id(&ids[2])
            .part_number(n)
            .body(ByteStream::from_static(b"part"))
            .send()
            .await
            .unwrap();
    }
    ids
}

/// ListParts of upload `id` of `v` in pages of two: parts 1 and 2, then 3.
async fn parts_are_listed_by_page(c: &Client, id: &str) {
    let page = c
        .list_parts()
        .bucket("bkt")
        .key("v")
        .upload_id(id)
        .max_parts(2)
        .send()
        .await
        .unwrap();
    let numbers: Vec<i32> = page
        .parts()
        .iter()
        .filter_map(|p| p.part_number())
        .collect();
    assert_eq!((numbers, page.is_truncated()), (vec![1, 2], Some(true)));
    let rest = c
        .list_parts()
        .bucket("bkt")
        .key("v")
        .upload_id(id)
        .part_number_marker(page.next_part_number_marker().unwrap())
        .send()
        .await
        .unwrap();
    let numbers: Vec<i32> = rest
        .parts()
        .iter()
        .filter_map(|p| p.part_number())
        .collect();
    assert_eq!(numbers, [3]);
}

/// Uploads part 4 of upload `id` of `v` as bytes 2 to 5 of a copied
/// object, and completes the upload with that part alone.
async fn complete_with_a_part_copied_by_range(c: &Client, id: &str) {
    put(c, "src", "0123456789").await;
    let copied = c
        .upload_part_copy()
        .bucket("bkt")
        .key("v")
        .upload_id(id)
        .part_number(4)
        .copy_source("bkt/src")
        .copy_source_range("bytes=2-5")
        .send()
        .await
        .unwrap();
    let etag = copied
        .copy_part_result()
        .unwrap()
        .e_tag()
        .unwrap()
        .to_string();
    let done = CompletedMultipartUpload::builder()
        .parts(CompletedPart::builder().part_number(4).e_tag(etag).build())
        .build();
    c.complete_multipart_upload()
        .bucket("bkt")
        .key("v")
        .upload_id(id)
        .multipart_upload(done)
        .send()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_and_parts_are_listed() {
    let (_dir, c) = store().await;
    let ids = start_uploads(&c).await;
    let ups = c
        .list_multipart_uploads()
        .bucket("bkt")
        .delimiter("/")
        .send()
        .await
        .unwrap();
    let keys: Vec<&str> = ups.uploads().iter().filter_map(|u| u.key()).collect();
    let prefixes: Vec<&str> = ups
        .common_prefixes()
        .iter()
        .filter_map(|p| p.prefix())
        .collect();
    assert_eq!((keys, prefixes), (vec!["v"], vec!["u/"]));
    parts_are_listed_by_page(&c, &ids[2]).await;
    // A part copied by range, then the upload completed.
    complete_with_a_part_copied_by_range(&c, &ids[2]).await;
    assert_eq!(body_of(&c, "v").await.as_deref(), Some("2345"));
    let ups = c
        .list_multipart_uploads()
        .bucket("bkt")
        .send()
        .await
        .unwrap();
    assert_eq!(ups.uploads().len(), 2, "the completed upload is gone");
}

#[tokio::test(flavor = "multi_thread")]
async fn checksums_are_stored_returned_and_checked() {
    let (_dir, c) = store().await;
    for alg in [
        ChecksumAlgorithm::Crc32,
        ChecksumAlgorithm::Crc32C,
        ChecksumAlgorithm::Crc64Nvme,
        ChecksumAlgorithm::Sha1,
        ChecksumAlgorithm::Sha256,
    ] {
        let key = format!("sum-{}", alg.as_str());
        let put = c
            .put_object()
            .bucket("bkt")
            .key(&key)
            .checksum_algorithm(alg.clone())
            .body(ByteStream::from_static(b"checked bytes"))
            .send()
            .await
            .unwrap();
        let got = c
            .head_object()
            .bucket("bkt")
            .key(&key)
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        let stored = [
            (put.checksum_crc32(), got.checksum_crc32()),
            (put.checksum_crc32_c(), got.checksum_crc32_c()),
            (put.checksum_crc64_nvme(), got.checksum_crc64_nvme()),
            (put.checksum_sha1(), got.checksum_sha1()),
            (put.checksum_sha256(), got.checksum_sha256()),
        ];
        assert!(
            stored.iter().any(|(p, g)| p.is_some() && p == g),
            "{alg:?}: {stored:?}"
        );
        // And a GET with validation reads it back whole.
        let get = c
            .get_object()
            .bucket("bkt")
            .key(&key)
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .unwrap();
        assert_eq!(
            &get.body.collect().await.unwrap().into_bytes()[..],
            b"checked bytes"
        );
    }
    // A wrong checksum: refused, and the old object stays.
    put(&c, "kept", "the good version").await;
    let wrong = c
        .put_object()
        .bucket("bkt")
        .key("kept")
        .checksum_crc32("AAAAAA==")
        .body(ByteStream::from_static(b"a corrupt upload"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Some("BadDigest"));
    assert_eq!(
        body_of(&c, "kept").await.as_deref(),
        Some("the good version")
    );
}
