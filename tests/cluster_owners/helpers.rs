//! The helpers that `tests/cluster_owners.rs`'s tests share: replicas
//! started with an owner or side by side, their metrics, and requests sent
//! with retries or as a DeleteObjects. Kept apart so that the test file
//! stays short.

use crate::common::backend::TestBackend;
use crate::common::etcd::EtcdCluster;
use crate::common::fencegate::Fencegate;
use crate::common::http_call;
use crate::common::raw::{RawClient, RawRequest, RawResponse};
use crate::common::replicas::{SHORT_HOLD, TTL_MS, replica_with, replicas};
use std::sync::Arc;

/// The value of `name` (with its labels) in `replica`'s metrics.
pub async fn metric(fg: &Fencegate, name: &str) -> f64 {
    let (_, text) = http_call("GET", &format!("http://{}/metrics", fg.admin), None, None).await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// etcd requests `replica` made on a write's behalf (not its lease, its
/// watches or its sweep).
pub async fn etcd_per_write(fg: &Fencegate) -> f64 {
    let mut n = 0.0;
    for op in [
        "admit",
        "take",
        "raise",
        "mark",
        "hold",
        "get",
        "acknowledged",
    ] {
        let name = format!("fencegate_etcd_requests_total{{op=\"{op}\"}}");
        n += metric(fg, &name).await;
    }
    n
}

/// Sends what `req` makes, again after a 503 (up to five times), as S3
/// clients do.
pub async fn send_retrying(raw: &RawClient, req: impl Fn() -> RawRequest) -> RawResponse {
    let mut r = raw.send(req()).await.unwrap();
    for _ in 0..5 {
        if r.status != 503 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        r = raw.send(req()).await.unwrap();
    }
    r
}

/// Three replicas with a short hold after an expiry, the first the owner of
/// /demo/k (a token-1 write through it), and a client of each.
pub async fn three_with_an_owner(
    etcd: &EtcdCluster,
    be: &TestBackend,
) -> (Vec<Fencegate>, Vec<Arc<RawClient>>) {
    let (backend, ep) = (be.as_fencegate_backend(), etcd.endpoints_toml());
    let fg: Vec<_> = (0..3)
        .map(|_| replica_with(&backend, &ep, SHORT_HOLD, TTL_MS))
        .collect();
    let c: Vec<_> = fg
        .iter()
        .map(|f| Arc::new(RawClient::new(&f.endpoint())))
        .collect();
    let first = c[0].send(RawRequest::put("/demo/k", "1").token(1)).await;
    assert_eq!(first.unwrap().status, 200);
    (fg, c)
}

/// DeleteObjects of `keys` in bucket `demo` with `token`: how many were
/// deleted, or the S3 error code.
pub async fn delete_objects(
    c: &aws_sdk_s3::Client,
    keys: &[&str],
    token: u64,
) -> Result<usize, String> {
    use aws_sdk_s3::types::{Delete, ObjectIdentifier};
    let objects = keys
        .iter()
        .map(|k| ObjectIdentifier::builder().key(*k).build().unwrap());
    let delete = Delete::builder()
        .set_objects(Some(objects.collect()))
        .build()
        .unwrap();
    let req = c.delete_objects().bucket("demo").delete(delete).customize();
    let req = req.mutate_request(move |r| {
        r.headers_mut().insert("x-fencing-token", token.to_string());
    });
    req.send().await.map(|o| o.deleted().len()).map_err(|e| {
        let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&e);
        code.unwrap_or("?").to_string()
    })
}

/// Two replicas on a fresh etcd and backend, and a client of each.
pub async fn two_replicas() -> (
    EtcdCluster,
    TestBackend,
    Vec<Fencegate>,
    RawClient,
    RawClient,
) {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let fg = replicas(&be.as_fencegate_backend(), &etcd.endpoints_toml(), 2);
    let (a, b) = (
        RawClient::new(&fg[0].endpoint()),
        RawClient::new(&fg[1].endpoint()),
    );
    (etcd, be, fg, a, b)
}

/// Two idle sweeps (5 s each) and a margin: an owner has let go.
pub async fn idle_release() {
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
}
