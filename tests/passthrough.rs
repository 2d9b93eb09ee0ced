//! What is not a fenced write passes through untouched: ranged GETs, HEAD
//! and listings, on both stores; a tagging write, which is one, still
//! needs a token.

mod common;

on_both_stores!(reads_and_listings_pass_through);

use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{Tag, Tagging};

async fn reads_and_listings_pass_through(store: common::Store) {
    let run = store.start("");
    let c = common::sdk(&run.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    let body: Vec<u8> = (0..100u8).collect();
    c.put_object()
        .bucket("demo")
        .key("dir/obj")
        .metadata("fencing-token", "1")
        .body(ByteStream::from(body.clone()))
        .send()
        .await
        .unwrap();

    let ranged = c
        .get_object()
        .bucket("demo")
        .key("dir/obj")
        .range("bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(ranged.content_range(), Some("bytes 10-19/100"));
    assert_eq!(
        ranged.body.collect().await.unwrap().into_bytes().as_ref(),
        &body[10..20]
    );

    let head = c
        .head_object()
        .bucket("demo")
        .key("dir/obj")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_length(), Some(100));

    let v2 = c
        .list_objects_v2()
        .bucket("demo")
        .prefix("dir/")
        .send()
        .await
        .unwrap();
    assert_eq!(v2.contents().len(), 1);
    assert_eq!(v2.contents()[0].key(), Some("dir/obj"));
    let v1 = c.list_objects().bucket("demo").send().await.unwrap();
    assert!(v1.contents().iter().any(|o| o.key() == Some("dir/obj")));
    let uploads = c.list_multipart_uploads().bucket("demo").send().await;
    let uploads = uploads.unwrap_or_else(|e| panic!("{store:?}: {e:?}"));
    assert!(uploads.uploads().is_empty());

    // Tagging is a fenced write (neither store implements it, so only the
    // refusal is checked here).
    let e = c
        .put_object_tagging()
        .bucket("demo")
        .key("dir/obj")
        .tagging(
            Tagging::builder()
                .tag_set(Tag::builder().key("team").value("orders").build().unwrap())
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_s3::error::ProvideErrorMetadata::code(&e),
        Some("MissingFencingToken")
    );
    let buckets = c.list_buckets().send().await.unwrap();
    assert!(buckets.buckets().iter().any(|b| b.name() == Some("demo")));
}
