//! Cluster mode beyond the request path, on a real 3-member etcd: moving
//! fences between a single node and a cluster with `fencegate fences
//! export` and `import` (docs/cluster.md, "Moving a node over"), and eager
//! fencing with several replicas watching one lock. Both fail with
//! `FENCEGATE_TEST_CLUSTER_OFF=1`.

mod common;

use common::backend::TestBackend;
use common::etcd::EtcdCluster;
use common::fencegate::{Backend, Fencegate};
use common::http_call;
use common::lock_holder::{Holder, wait_for_eager, wait_for_fence_above};
use common::raw::{RawClient, RawRequest};
use common::replicas::{SHORT_HOLD, TTL_MS, cluster_toml, replicas};
use std::time::Duration;

/// `fencegate fences export` / `import` with `args`; the output on success.
fn fences(config: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["fences"];
    all.extend_from_slice(args);
    let out = common::fencegate::run_bin(config, &all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fences {args:?}: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn a_single_node_moves_into_the_cluster_and_back_without_losing_a_fence() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let backend = be.as_fencegate_backend();
    let mut node = Fencegate::start(backend.clone(), "");
    let raw = RawClient::new(&node.endpoint());
    for (key, t) in [("k", 10), ("j", 5)] {
        let r = raw
            .send(RawRequest::put(&format!("/demo/{key}"), "v").token(t))
            .await;
        assert_eq!(r.unwrap().status, 200);
    }
    // A tool config naming the cluster (the same file the replicas use).
    let dir = tempfile::tempdir().unwrap();
    let cluster_cfg = cluster_config(dir.path(), &backend, &etcd);

    // 1. While the node serves: export through its admin API, import.
    let first = dir.path().join("first.jsonl");
    let admin = format!("http://{}", node.admin);
    std::fs::write(
        &first,
        fences(node.config_path(), &["--admin", &admin, "export"]),
    )
    .unwrap();
    assert_eq!(std::fs::read_to_string(&first).unwrap().lines().count(), 2);
    fences(&cluster_cfg, &["import", first.to_str().unwrap()]);
    // The node goes on taking writes meanwhile.
    let r = raw.send(RawRequest::put("/demo/k", "v12").token(12)).await;
    assert_eq!(r.unwrap().status, 200);
    // 2. Stop it, import its final store (only the raise of k is new).
    node.terminate();
    let last = dir.path().join("last.jsonl");
    std::fs::write(&last, fences(node.config_path(), &["export"])).unwrap();
    fences(&cluster_cfg, &["import", last.to_str().unwrap()]);

    // 3. The replicas know every fence the node had.
    let fg = replicas(&backend, &etcd.endpoints_toml(), 2);
    let a = RawClient::new(&fg[0].endpoint());
    let b = RawClient::new(&fg[1].endpoint());
    let r = a
        .send(RawRequest::put("/demo/k", "x").token(11))
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.code()),
        (409, Some("StaleFencingToken")),
        "{}",
        r.body
    );
    let r = b
        .send(RawRequest::put("/demo/j", "x").token(4))
        .await
        .unwrap();
    assert_eq!(r.status, 409);
    assert_eq!(
        b.send(RawRequest::put("/demo/k", "x").token(13))
            .await
            .unwrap()
            .status,
        200
    );

    // And back: from etcd into a single node's store.
    back_into_a_single_node(dir.path(), &cluster_cfg, &backend).await;
}

/// Writes `dir/cluster.toml`, a tool config naming the cluster on `etcd`
/// in front of `backend`.
fn cluster_config(
    dir: &std::path::Path,
    backend: &Backend,
    etcd: &EtcdCluster,
) -> std::path::PathBuf {
    let cluster_cfg = dir.join("cluster.toml");
    let Backend::S3 { endpoint, .. } = backend else {
        unreachable!()
    };
    std::fs::write(
        &cluster_cfg,
        format!(
            "[backend]\nkind = \"s3\"\nendpoint = \"{endpoint}\"\n\n{}",
            cluster_toml(&etcd.endpoints_toml(), "", TTL_MS)
        ),
    )
    .unwrap();
    cluster_cfg
}

/// Exports the cluster's fences into a fresh single node's store and
/// checks the node then refuses k's token 12.
async fn back_into_a_single_node(
    dir: &std::path::Path,
    cluster_cfg: &std::path::Path,
    backend: &Backend,
) {
    let back = dir.join("back.jsonl");
    std::fs::write(&back, fences(cluster_cfg, &["export"])).unwrap();
    let mut single = Fencegate::start(backend.clone(), "");
    single.terminate();
    fences(single.config_path(), &["import", back.to_str().unwrap()]);
    single.kill9_and_restart();
    let s = RawClient::new(&single.endpoint());
    let r = s
        .send(RawRequest::put("/demo/k", "x").token(12))
        .await
        .unwrap();
    assert_eq!((r.status, r.code()), (409, Some("StaleFencingToken")));
}

/// The `fencegate_eager_raises_total` of one replica.
async fn eager_raises(fg: &Fencegate) -> u64 {
    let (_, text) = http_call("GET", &format!("http://{}/metrics", fg.admin), None, None).await;
    text.lines()
        .find_map(|l| l.strip_prefix("fencegate_eager_raises_total "))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

#[tokio::test]
async fn eager_fencing_raises_once_per_holder_change_however_many_replicas_watch() {
    let etcd = EtcdCluster::start();
    let be = TestBackend::start().await;
    let endpoints = etcd.endpoints_toml();
    let eager = format!(
        "[locks]\netcd_endpoints = {endpoints}\n\n[[eager]]\nresource = \"orders\"\n\
         etcd_lock = \"orders\"\n\n[[rules]]\nbucket = \"demo\"\nprefix = \"orders/\"\n\
         mode = \"shared\"\nresource = \"orders\"\n"
    );
    let fg: Vec<Fencegate> = (0..3)
        .map(|_| {
            let toml = format!("{}\n{eager}", cluster_toml(&endpoints, SHORT_HOLD, TTL_MS));
            Fencegate::start(be.as_fencegate_backend(), &toml)
        })
        .collect();
    for f in &fg {
        wait_for_eager(f, true).await;
    }
    let service = ["--etcd".to_string(), etcd.endpoint(0).to_string()];
    let holder = Holder::take_at(&service, "orders", 2);
    let raw = RawClient::new(&fg[1].endpoint());
    let r = raw
        .send(RawRequest::put("/demo/orders/log", "a").token(holder.token))
        .await;
    assert_eq!(r.unwrap().status, 200);

    // The holder freezes; its lease runs out; all three replicas see it.
    holder.pause();
    let h = wait_for_fence_above(&fg[0], holder.token).await;
    // Every replica saw the lock go within milliseconds; give a second
    // raise, were there one, time to land.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut total = 0;
    for f in &fg {
        total += eager_raises(f).await;
    }
    assert_eq!(
        total, 1,
        "one raise for one holder change, by whichever replica came first"
    );
    // Every replica refuses the old holder now.
    for f in &fg {
        let r = RawClient::new(&f.endpoint())
            .send(RawRequest::put("/demo/orders/log", "late").token(holder.token))
            .await
            .unwrap();
        assert_eq!(
            (r.status, r.code()),
            (409, Some("StaleFencingToken")),
            "highest {h}"
        );
    }
    holder.resume();
}
