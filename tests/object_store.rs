//! The `object_store` crate (what delta-rs, SlateDB, Lance and DataFusion
//! write S3 through), unmodified, through fencegate on Garage: the recipe of
//! docs/conditional-writes.md, tested.
//!
//! - `PutMode::Create` (`If-None-Match: *`) from racing writers: one wins,
//!   the others get `Error::AlreadyExists`;
//! - `PutMode::Update` (`If-Match`) from two writers that read one version:
//!   one wins, the other gets `Error::Precondition`;
//! - a fencing token in a default header: a stale writer's 409
//!   `StaleFencingToken` surfaces as `Error::AlreadyExists`, as object_store
//!   maps every 409, and is not retried.

mod common;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{
    ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion,
};
use std::sync::Arc;

const FREE: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"free/\"\nmode = \"unfenced\"\n";

/// An object_store client for fencegate, with `token` in a default header.
fn store(endpoint: &str, token: Option<u64>) -> AmazonS3 {
    let mut headers = http::HeaderMap::new();
    if let Some(t) = token {
        headers.insert("x-fencing-token", t.to_string().parse().unwrap());
    }
    // Client options first: `with_client_options` replaces them whole,
    // `allow_http` among them.
    AmazonS3Builder::new()
        .with_client_options(ClientOptions::new().with_default_headers(headers))
        .with_endpoint(endpoint)
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_bucket_name("demo")
        .with_access_key_id(common::fencegate::DEMO_KEY)
        .with_secret_access_key(common::fencegate::DEMO_SECRET)
        .build()
        .unwrap()
}

fn mode(mode: PutMode) -> PutOptions {
    PutOptions {
        mode,
        ..PutOptions::default()
    }
}

#[tokio::test]
async fn object_store_conditional_puts_hold_and_a_stale_token_is_already_exists() {
    let garage = common::garage::Garage::start();
    let fg = common::fencegate::Fencegate::start(garage.backend(), FREE);
    let s = Arc::new(store(&fg.endpoint(), None));

    // Create: racing writers, one winner.
    let mut tasks = Vec::new();
    for w in 0..16u8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let path = Path::from("free/manifest-1");
            s.put_opts(&path, vec![w].into(), mode(PutMode::Create))
                .await
        }));
    }
    let (mut won, mut exists) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => won += 1,
            Err(object_store::Error::AlreadyExists { .. }) => exists += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!((won, exists), (1, 15));

    // Update: two writers that read one version, one winner.
    let path = Path::from("free/state");
    let first = s.put(&path, "v1".into()).await.unwrap();
    let version = UpdateVersion {
        e_tag: first.e_tag.clone(),
        version: None,
    };
    let a = s.put_opts(&path, "by a".into(), mode(PutMode::Update(version.clone())));
    a.await.unwrap();
    let b = s.put_opts(&path, "by b".into(), mode(PutMode::Update(version)));
    assert!(matches!(
        b.await,
        Err(object_store::Error::Precondition { .. })
    ));
    let got = s.get(&path).await.unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], b"by a");

    // A fencing token in a default header: a stale writer's 409.
    let fenced = Path::from("orders/table");
    store(&fg.endpoint(), Some(5))
        .put(&fenced, "by 5".into())
        .await
        .unwrap();
    let stale = store(&fg.endpoint(), Some(4))
        .put(&fenced, "by 4".into())
        .await;
    match stale {
        Err(object_store::Error::AlreadyExists { source, .. }) => {
            let text = source.to_string();
            assert!(
                text.contains("409") && text.contains("StaleFencingToken"),
                "{text}"
            );
        }
        other => panic!("a stale token surfaced as {other:?}"),
    }
}
