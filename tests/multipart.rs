//! Multipart uploads are fenced at every step, and the parts and Complete of
//! an upload inherit the token that created it (so `aws s3 cp --metadata
//! fencing-token=N` works for large files). A holder that lost the fence
//! between UploadPart and Complete is refused at Complete.

mod common;

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use common::fencegate::{Backend, Fencegate};

const PART: usize = 5 * 1024 * 1024;

async fn start_upload(c: &aws_sdk_s3::Client, key: &str, token: u64) -> (String, CompletedPart) {
    let up = c
        .create_multipart_upload()
        .bucket("demo")
        .key(key)
        .metadata("fencing-token", token.to_string())
        .send()
        .await
        .unwrap();
    let id = up.upload_id().unwrap().to_string();
    let part = c
        .upload_part()
        .bucket("demo")
        .key(key)
        .upload_id(&id)
        .part_number(1)
        .body(ByteStream::from(vec![b'p'; PART]))
        .send()
        .await
        .unwrap();
    let done = CompletedPart::builder()
        .part_number(1)
        .set_e_tag(part.e_tag().map(str::to_string))
        .set_checksum_crc32(part.checksum_crc32().map(str::to_string))
        .build();
    (id, done)
}

async fn complete(
    c: &aws_sdk_s3::Client,
    key: &str,
    id: &str,
    part: CompletedPart,
) -> Result<(), String> {
    c.complete_multipart_upload()
        .bucket("demo")
        .key(key)
        .upload_id(id)
        .multipart_upload(CompletedMultipartUpload::builder().parts(part).build())
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            aws_sdk_s3::error::ProvideErrorMetadata::code(&e)
                .unwrap_or("?")
                .to_string()
        })
}

#[tokio::test]
async fn parts_inherit_the_creating_token_and_a_stale_complete_is_refused() {
    let fg = Fencegate::start(Backend::Embedded, "");
    let c = common::sdk(&fg.endpoint());
    c.create_bucket().bucket("demo").send().await.unwrap();

    // A whole upload with the token given once, at Create.
    let (id, part) = start_upload(&c, "big", 10).await;
    complete(&c, "big", &id, part).await.unwrap();
    let head = c
        .head_object()
        .bucket("demo")
        .key("big")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_length(), Some(PART as i64));
    assert_eq!(head.metadata().unwrap()["fencing-token"], "10");

    // Holder 11 uploads its parts, then loses the lock: 12 writes.
    let (id, part) = start_upload(&c, "big", 11).await;
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
