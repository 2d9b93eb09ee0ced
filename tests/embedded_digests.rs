//! The embedded store's digests, through fencegate: a PUT, a part or a
//! completion whose Content-MD5 or checksum does not match its body lands
//! nothing and replaces nothing; a full-object CRC is the CRC of the whole
//! body; a body fencegate finds damaged as it streams in is refused with
//! fencegate's reason. The bucket is unfenced (`common::embedded`): what
//! is tested is the store's answer, not the fence.

mod common;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use common::embedded::{get, outcome, put, store};

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

/// A completion's checksums are checked against what was uploaded: a part
/// listed with a checksum it was not uploaded with is an `InvalidPart`, a
/// whole-object checksum that is not the parts' composite is a
/// `BadDigest`, and neither completes the upload, which then completes
/// with the right ones (ceph/s3-tests' `test_multipart_checksum_sha256`).
#[tokio::test]
async fn a_completion_whose_checksums_do_not_match_is_refused() {
    use aws_sdk_s3::types::ChecksumAlgorithm;
    let (_fg, c) = store().await;
    let up = c
        .create_multipart_upload()
        .bucket("demo")
        .key("sums")
        .checksum_algorithm(ChecksumAlgorithm::Sha256)
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap();
    let sent = c
        .upload_part()
        .bucket("demo")
        .key("sums")
        .upload_id(id)
        .part_number(1)
        .checksum_algorithm(ChecksumAlgorithm::Sha256)
        .body(ByteStream::from_static(b"one part"))
        .send()
        .await
        .unwrap();
    let part_sum = sent.checksum_sha256().unwrap().to_string();
    let complete = |part_sha256: &str, object_sha256: Option<&str>| {
        let part = CompletedPart::builder()
            .part_number(1)
            .set_e_tag(sent.e_tag().map(str::to_string))
            .checksum_sha256(part_sha256)
            .build();
        c.complete_multipart_upload()
            .bucket("demo")
            .key("sums")
            .upload_id(id)
            .set_checksum_sha256(object_sha256.map(str::to_string))
            .multipart_upload(CompletedMultipartUpload::builder().parts(part).build())
            .send()
    };
    let other = "mrHwOfjTL5Zwfj74F05HOQGLdUb7E5szdCbxgUSq6NM=";
    assert_eq!(
        outcome(complete(other, None).await),
        Err((400, "InvalidPart".to_string()))
    );
    assert_eq!(
        outcome(complete(&part_sum, Some("bad")).await),
        Err((400, "BadDigest".to_string()))
    );
    assert_eq!(get(&c, "sums").await, Err((404, "NoSuchKey".to_string())));
    let done = complete(&part_sum, None).await.unwrap();
    let composite = done.checksum_sha256().unwrap().to_string();
    assert!(composite.ends_with("-1"), "{composite}");
    assert_eq!(get(&c, "sums").await.unwrap(), b"one part");
}

/// A `FULL_OBJECT` CRC upload: the object's checksum is the CRC of its
/// whole body (combined from the parts'), returned by the completion and
/// by HEAD, and a completion that declares another is a `BadDigest`.
#[tokio::test]
async fn a_full_object_crc_is_the_crc_of_the_whole_body() {
    use aws_sdk_s3::types::{ChecksumAlgorithm, ChecksumMode, ChecksumType};
    use base64::Engine;
    use s3s::crypto::Checksum;
    let (_fg, c) = store().await;
    let up = c
        .create_multipart_upload()
        .bucket("demo")
        .key("full")
        .checksum_algorithm(ChecksumAlgorithm::Crc32)
        .checksum_type(ChecksumType::FullObject)
        .send()
        .await
        .unwrap();
    assert_eq!(up.checksum_type(), Some(&ChecksumType::FullObject));
    let id = up.upload_id().unwrap();
    let bodies = [vec![1u8; 5 << 20], b"the last part".to_vec()];
    let mut parts = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let n = i as i32 + 1;
        let sent = c
            .upload_part()
            .bucket("demo")
            .key("full")
            .upload_id(id)
            .part_number(n)
            .checksum_algorithm(ChecksumAlgorithm::Crc32)
            .body(ByteStream::from(body.clone()))
            .send()
            .await
            .unwrap();
        let part = CompletedPart::builder()
            .part_number(n)
            .set_e_tag(sent.e_tag().map(str::to_string))
            .set_checksum_crc32(sent.checksum_crc32().map(str::to_string));
        parts.push(part.build());
    }
    let mut crc = s3s::crypto::Crc32::new();
    bodies.iter().for_each(|b| crc.update(b));
    let whole = base64::engine::general_purpose::STANDARD.encode(crc.finalize().as_ref());
    let complete = |crc32: &str| {
        c.complete_multipart_upload()
            .bucket("demo")
            .key("full")
            .upload_id(id)
            .checksum_crc32(crc32)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts.clone()))
                    .build(),
            )
            .send()
    };
    let first = parts[0].checksum_crc32().unwrap();
    assert_eq!(
        outcome(complete(first).await),
        Err((400, "BadDigest".to_string()))
    );
    let done = complete(&whole).await.unwrap();
    assert_eq!(done.checksum_type(), Some(&ChecksumType::FullObject));
    assert_eq!(done.checksum_crc32(), Some(whole.as_str()));
    let head = c
        .head_object()
        .bucket("demo")
        .key("full")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert_eq!(head.checksum_crc32(), Some(whole.as_str()));
    assert_eq!(head.checksum_type(), Some(&ChecksumType::FullObject));
}

/// A body fencegate finds damaged as it streams it into the store (in the
/// same process, with no socket between) is answered with fencegate's own
/// refusal, as on any backend, and nothing lands: the store only saw a
/// body that broke off.
#[tokio::test]
async fn a_damaged_body_is_refused_with_fencegates_reason() {
    use common::raw::{Damage, Form, RawClient, RawRequest, Source};
    let (fg, c) = store().await;
    let raw = RawClient::new(&fg.endpoint());
    let cases = [
        ("flip-sha", Form::Sha256, 400, "XAmzContentSHA256Mismatch"),
        (
            "flip-chunked",
            Form::Chunked { trailer: false },
            403,
            "SignatureDoesNotMatch",
        ),
    ];
    for (name, form, status, code) in cases {
        let mut req = RawRequest::new(http::Method::PUT, &format!("/demo/{name}"));
        req.form = form;
        req.body = Some(Source::bytes(vec![b'z'; 300_000]));
        req.damage = Damage {
            flip_at: Some(150_000),
            cut_at: None,
        };
        let r = raw.send(req).await.unwrap();
        assert_eq!(
            (r.status, r.code()),
            (status, Some(code)),
            "{name}: {}",
            r.body
        );
        assert_eq!(
            get(&c, name).await,
            Err((404, "NoSuchKey".into())),
            "{name}"
        );
    }
}
