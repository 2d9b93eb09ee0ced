//! Where tokens come from (CONTRACT §7), shown against real lock services:
//! etcd's `ETCD_LOCK_REV` rises across holders, and ZooKeeper's czxid rises
//! where the sequence suffix of the lock node resets.

mod common;

use common::etcd::Etcd;
use common::zookeeper::ZooKeeper;
use std::time::Duration;
use zookeeper_client as zk;

/// `etcdctl lock NAME -- sh -c 'echo $ETCD_LOCK_REV'`, parsed.
fn etcd_lock_rev(etcd: &Etcd, name: &str) -> u64 {
    let out = etcd.etcdctl(&["lock", name, "--", "sh", "-c", "echo $ETCD_LOCK_REV"]);
    assert!(out.status.success(), "etcdctl lock: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a revision")
}

#[test]
fn etcd_lock_rev_rises_across_holders() {
    let etcd = Etcd::start();
    let revs: Vec<u64> = (0..3).map(|_| etcd_lock_rev(&etcd, "orders")).collect();
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");

    // A contended hand-over: B queues behind A and gets a higher revision.
    let holder = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            &etcd.endpoint,
            "lock",
            "orders",
            "--",
            "sleep",
            "1",
        ])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let b = etcd_lock_rev(&etcd, "orders");
    let mut holder = holder;
    assert!(holder.wait().unwrap().success());
    assert!(b > revs[2], "{b} after {revs:?}");
}

async fn zk_client(z: &ZooKeeper) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(2))
        .connect(&z.connect)
        .await
        .expect("connect to ZooKeeper")
}

/// Takes the lock under `dir` (Curator's recipe), returns (node name, czxid)
/// and releases it.
async fn zk_take(client: &zk::Client, dir: &str) -> (String, u64) {
    let options = zk::LockOptions::new(zk::Acls::anyone_all())
        .with_ancestor_options(zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()))
        .unwrap();
    let lock = client
        .lock(
            zk::LockPrefix::new_curator(dir, "lock-").unwrap(),
            b"",
            options,
        )
        .await
        .unwrap();
    let path = lock.lock_path().to_string();
    let stat = client.check_stat(&path).await.unwrap().unwrap();
    client.delete(&path, None).await.unwrap();
    std::mem::forget(lock);
    (
        path.rsplit('/').next().unwrap().to_string(),
        stat.czxid as u64,
    )
}

#[tokio::test]
async fn zookeeper_czxid_rises_where_the_sequence_resets() {
    let z = ZooKeeper::start();
    let client = zk_client(&z).await;
    let (first, c1) = zk_take(&client, "/locks/orders").await;
    let (second, c2) = zk_take(&client, "/locks/orders").await;
    assert!(c1 < c2);
    assert!(first.ends_with("lock-0000000000"), "{first}");
    assert!(second.ends_with("lock-0000000001"), "{second}");

    // The parent is a container: empty, ZooKeeper deletes it (every 100 ms
    // in this server), and the next lock node starts again at sequence 0.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while client.check_stat("/locks/orders").await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "container never reaped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (third, c3) = zk_take(&client, "/locks/orders").await;
    assert!(
        third.ends_with("lock-0000000000"),
        "sequence reset: {third}"
    );
    assert!(c3 > c2, "czxid keeps rising: {c2} then {c3}");
}
