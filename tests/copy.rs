//! CopyObject fences the destination only, stamps the copy with its own
//! token, and keeps the source's metadata and content headers.

mod common;

on_both_stores!(copy_stamps_the_new_token_and_keeps_the_rest);

use aws_sdk_s3::Client;
use aws_sdk_s3::operation::copy_object::builders::CopyObjectFluentBuilder;
use aws_sdk_s3::primitives::ByteStream;
use common::fencegate::{LIMITED_KEY, LIMITED_SECRET};

/// Puts `demo/src`: a CSV body with its content type, cache control,
/// metadata `owner` and fencing token 50.
async fn put_source(c: &Client) {
    c.put_object()
        .bucket("demo")
        .key("src")
        .content_type("text/csv")
        .cache_control("max-age=60")
        .metadata("owner", "alice")
        .metadata("fencing-token", "50")
        .body(ByteStream::from_static(b"a,b\n"))
        .send()
        .await
        .unwrap();
}

/// A CopyObject of `demo/src` onto `demo/dst` with fencing token `token`.
fn copy_to_dst(c: &Client, token: &str) -> CopyObjectFluentBuilder {
    c.copy_object()
        .bucket("demo")
        .key("dst")
        .copy_source("demo/src")
        .metadata("fencing-token", token.to_string())
}

/// Asserts `demo/dst` has token 7 and the source's metadata, content
/// headers and body.
async fn dst_is_the_source_stamped_7(c: &Client) {
    let head = c
        .head_object()
        .bucket("demo")
        .key("dst")
        .send()
        .await
        .unwrap();
    let meta = head.metadata().unwrap();
    assert_eq!(meta["fencing-token"], "7");
    assert_eq!(meta["owner"], "alice");
    assert_eq!(head.content_type(), Some("text/csv"));
    assert_eq!(head.cache_control(), Some("max-age=60"));
    let got = c
        .get_object()
        .bucket("demo")
        .key("dst")
        .send()
        .await
        .unwrap();
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().as_ref(),
        b"a,b\n"
    );
}

async fn copy_stamps_the_new_token_and_keeps_the_rest(store: common::Store) {
    let run = store.start("");
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    put_source(&c).await;
    // The destination's fence is its own: 7 is fine there although the
    // source's is 50.
    copy_to_dst(&c, "7").send().await.unwrap();
    dst_is_the_source_stamped_7(&c).await;

    // `replace` in lower case is REPLACE for fencegate, and goes on as
    // `REPLACE`: the copy is stamped with its own token, not the source's
    // (a store that knows only `REPLACE` would copy the source's 50).
    use aws_sdk_s3::types::MetadataDirective;
    copy_to_dst(&c, "8")
        .metadata_directive(MetadataDirective::from("replace"))
        .send()
        .await
        .unwrap();
    let head = c.head_object().bucket("demo").key("dst").send().await;
    assert_eq!(head.unwrap().metadata().unwrap()["fencing-token"], "8");
    // A directive that is neither is refused, not read one way here and
    // another at the store.
    let e = copy_to_dst(&c, "9")
        .metadata_directive(MetadataDirective::from("MOVE"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&e),
        Some("InvalidArgument")
    );

    // A stale copy onto dst is refused; the source's fence is untouched.
    let e = copy_to_dst(&c, "7").send().await.unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&e),
        Some("StaleFencingToken")
    );

    // A credential limited to bucket "shared" cannot copy out of "demo".
    let limited = common::sdk_as(&run.fg.endpoint(), LIMITED_KEY, LIMITED_SECRET);
    let e = limited
        .copy_object()
        .bucket("shared")
        .key("stolen")
        .copy_source("demo/src")
        .metadata("fencing-token", "1")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&e),
        Some("AccessDenied")
    );
}
