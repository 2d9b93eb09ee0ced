//! The `object_store` crate (what delta-rs, SlateDB, Lance and DataFusion
//! write S3 through), unmodified, through fencegate on its embedded store
//! and on Garage: the recipe of docs/conditional-writes.md, tested.
//!
//! - `PutMode::Create` (`If-None-Match: *`) from racing writers: one wins,
//!   the others get `Error::AlreadyExists`;
//! - `PutMode::Update` (`If-Match`) from two writers that read one version:
//!   one wins, the other gets `Error::Precondition`;
//! - a fencing token in a default header: a stale writer's 409
//!   `StaleFencingToken` surfaces as `Error::AlreadyExists`, as object_store
//!   maps every 409, and is not retried;
//! - ranged reads, which object_store refuses unless they are answered
//!   `206` with the `Content-Range` asked for: a range covering the whole
//!   object, one past its end, a suffix longer than it, an open one (how
//!   Parquet footers and manifests are read).

mod common;

use common::Store;
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

on_both_stores!(
    object_store_conditional_puts_hold_and_a_stale_token_is_already_exists,
    object_store_ranged_reads_get_the_bytes_they_ask_for,
);

/// fencegate on `which`, with bucket `demo`.
async fn start(which: Store) -> common::Running {
    let running = which.start(FREE);
    let c = common::sdk(&running.fg.endpoint());
    common::ensure_bucket(&c, "demo").await;
    running
}

async fn object_store_conditional_puts_hold_and_a_stale_token_is_already_exists(which: Store) {
    let running = start(which).await;
    let fg = &running.fg;
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

async fn object_store_ranged_reads_get_the_bytes_they_ask_for(which: Store) {
    use object_store::{GetOptions, GetRange};
    let running = start(which).await;
    let s = store(&running.fg.endpoint(), None);
    let body: Vec<u8> = (0..3893u32).map(|i| (i % 251) as u8).collect();
    let path = Path::from("free/footer");
    s.put(&path, body.clone().into()).await.unwrap();
    let n = body.len() as u64;
    let ranges = [
        (GetRange::Bounded(0..10), 0..10),
        (GetRange::Bounded(0..n), 0..n),
        (GetRange::Bounded(0..999_999), 0..n),
        (GetRange::Offset(0), 0..n),
        (GetRange::Offset(n - 1), n - 1..n),
        (GetRange::Suffix(8), n - 8..n),
        (GetRange::Suffix(99_999), 0..n),
    ];
    for (range, want) in ranges {
        let opts = GetOptions {
            range: Some(range.clone()),
            ..GetOptions::default()
        };
        let got = s.get_opts(&path, opts).await;
        let got = got.unwrap_or_else(|e| panic!("{which:?} {range:?}: {e}"));
        assert_eq!(got.range, want.clone(), "{which:?} {range:?}");
        let bytes = got.bytes().await.unwrap();
        let want = &body[want.start as usize..want.end as usize];
        assert_eq!(&bytes[..], want, "{which:?} {range:?}");
    }
    // A range that starts past the end is an error, not the object.
    let past = GetOptions {
        range: Some(GetRange::Offset(n)),
        ..GetOptions::default()
    };
    assert!(s.get_opts(&path, past).await.is_err(), "{which:?}");
    // The whole object in one get_range, as a reader of small files does.
    let all = s.get_range(&path, 0..n).await.unwrap();
    assert_eq!(&all[..], &body[..]);
}
