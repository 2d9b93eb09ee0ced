//! Lock services end to end (CONTRACT §7): real etcd and ZooKeeper, lock
//! holders run by `fencegate lock`, paused with SIGSTOP the way a GC pause
//! or a partition pauses a writer, and fencegate refusing them afterwards —
//! with the plain token check, and with eager fencing before anyone else
//! writes.

mod common;

use common::etcd::{Etcd, etcdctl};
use common::fencegate::{Backend, Fencegate};
use common::lock_holder::{
    Holder, Server, Service, fence, run_lock, wait_for_eager, wait_for_fence_above,
};
use common::zookeeper::ZooKeeper;
use common::{ensure_bucket, put_with_token, sdk};
use std::time::Duration;

/// Every key under `orders/` shares the resource `orders`.
const RULE: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"orders/\"\nmode = \"shared\"\nresource = \"orders\"\n";

async fn fencegate(svc: Option<&Service>) -> (Fencegate, aws_sdk_s3::Client) {
    let extra = match svc {
        Some(s) => format!("{RULE}\n{}", s.eager_toml()),
        None => RULE.to_string(),
    };
    let fg = Fencegate::start(Backend::Embedded, &extra);
    let c = sdk(&fg.endpoint());
    ensure_bucket(&c, "demo").await;
    if svc.is_some() {
        wait_for_eager(&fg, true).await;
    }
    (fg, c)
}

/// fencegate (with eager fencing on `orders` if `eager`), and holder A
/// (lease or session of `ttl` seconds) having written `orders/log`.
async fn a_has_written(
    svc: &Service,
    eager: bool,
    ttl: u64,
) -> (Fencegate, aws_sdk_s3::Client, Holder) {
    let (fg, c) = fencegate(eager.then_some(svc)).await;
    let a = Holder::take(svc, ttl);
    put_with_token(&c, "orders/log", "from A", a.token)
        .await
        .unwrap();
    (fg, c, a)
}

/// Waits until nobody holds or waits for the test lock.
async fn wait_until_lock_free(svc: &Service) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let zk = match svc {
        Service::ZooKeeper(z) => Some(
            zookeeper_client::Client::connect(z)
                .await
                .expect("connect to ZooKeeper"),
        ),
        Service::Etcd(_) => None,
    };
    loop {
        let free = match (svc, &zk) {
            (Service::Etcd(e), _) => {
                let out = etcdctl(e, &["get", "orders/", "--prefix", "--keys-only"]);
                out.status.success() && String::from_utf8_lossy(&out.stdout).trim().is_empty()
            }
            (Service::ZooKeeper(_), Some(zk)) => match zk.list_children("/locks/orders").await {
                Ok(children) => children.is_empty(),
                Err(zookeeper_client::Error::NoNode) => true,
                Err(e) => panic!("{e}"),
            },
            _ => unreachable!(),
        };
        if free {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock never became free"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

macro_rules! on_both_services {
    ($($name:ident),* $(,)?) => {
        mod etcd {
            $(#[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                let mut s = super::Server::Etcd(super::Etcd::start());
                super::$name(&mut s).await;
            })*
        }
        mod zookeeper {
            $(#[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                let mut s = super::Server::ZooKeeper(super::ZooKeeper::start());
                super::$name(&mut s).await;
            })*
        }
    };
}

on_both_services!(
    a_paused_holder_is_refused_after_the_next_holder_writes,
    eager_fencing_refuses_an_expired_holder_before_anyone_else_writes,
    without_eager_fencing_the_expired_holder_writes_until_someone_else_does,
    a_waiter_giving_up_does_not_fence_off_the_holder,
    fencegate_lock_tokens_rise_across_runs,
    losing_the_lock_stops_the_command,
    eager_fencing_survives_a_lock_service_restart,
);

async fn a_paused_holder_is_refused_after_the_next_holder_writes(server: &mut Server) {
    let svc = server.service();
    let (_fg, c, a) = a_has_written(&svc, false, 2).await;

    a.pause();
    // B queues, and gets the lock once A's lease or session expires.
    let s = svc.clone();
    let b = tokio::task::spawn_blocking(move || Holder::take(&s, 10));
    let b = b.await.unwrap();
    assert!(b.token > a.token, "B {} after A {}", b.token, a.token);
    put_with_token(&c, "orders/log", "from B", b.token)
        .await
        .unwrap();

    a.resume();
    let refused = put_with_token(&c, "orders/log", "late A", a.token)
        .await
        .unwrap_err();
    assert_eq!(refused.0, 409);
    assert_eq!(refused.1, "StaleFencingToken");
    assert_eq!(refused.2, Some(b.token.to_string()));
}

async fn eager_fencing_refuses_an_expired_holder_before_anyone_else_writes(server: &mut Server) {
    let svc = server.service();
    let (fg, c, a) = a_has_written(&svc, true, 2).await;

    a.pause();
    // Nobody else takes the lock; the expiry alone fences A off.
    let h = wait_for_fence_above(&fg, a.token).await;
    let refused = put_with_token(&c, "orders/log", "late A", a.token)
        .await
        .unwrap_err();
    assert_eq!((refused.0, refused.1.as_str()), (409, "StaleFencingToken"));

    // The next holder's token is at or above the eager fence: the helper
    // and the watcher agree on what the token is.
    let b = Holder::take(&svc, 10);
    assert!(
        b.token >= h,
        "next holder {} below the eager fence {h}",
        b.token
    );
    put_with_token(&c, "orders/log", "from B", b.token)
        .await
        .unwrap();
    if let Service::Etcd(e) = &svc {
        // B's helper dies without releasing; its lease runs out, the fence
        // follows, and etcdctl's next token is at or above it.
        drop(b);
        wait_until_lock_free(&svc).await;
        let h = wait_for_fence_above(&fg, h).await;
        let out = etcdctl(
            e,
            &["lock", "orders", "--", "sh", "-c", "echo $ETCD_LOCK_REV"],
        );
        let rev: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        assert!(rev >= h, "etcdctl's token {rev} below the eager fence {h}");
    }
}

async fn without_eager_fencing_the_expired_holder_writes_until_someone_else_does(
    server: &mut Server,
) {
    let svc = server.service();
    let (_fg, c, a) = a_has_written(&svc, false, 2).await;
    a.pause();
    wait_until_lock_free(&svc).await;
    // The lock is gone, yet the plain scheme has nothing newer to compare
    // with: this is the window eager fencing closes.
    put_with_token(&c, "orders/log", "late A", a.token)
        .await
        .unwrap();
}

async fn a_waiter_giving_up_does_not_fence_off_the_holder(server: &mut Server) {
    let svc = server.service();
    let (fg, c, a) = a_has_written(&svc, true, 10).await;

    let s = svc.clone();
    let out = tokio::task::spawn_blocking(move || run_lock(&s, &["--timeout", "1"], &["true"]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    // Give a wrong watcher time to (wrongly) react to the waiter leaving.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fence(&fg).await, Some(a.token));
    put_with_token(&c, "orders/log", "A again", a.token)
        .await
        .unwrap();
}

async fn fencegate_lock_tokens_rise_across_runs(server: &mut Server) {
    let svc = server.service();
    let token = || {
        let out = run_lock(&svc, &[], &["sh", "-c", "echo $FENCING_TOKEN"]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let mut tokens = vec![token(), token()];
    if let Service::Etcd(e) = &svc {
        // etcdctl and the helper take the same lock and the same token.
        let out = etcdctl(
            e,
            &["lock", "orders", "--", "sh", "-c", "echo $ETCD_LOCK_REV"],
        );
        tokens.push(String::from_utf8_lossy(&out.stdout).trim().parse().unwrap());
    }
    tokens.push(token());
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");

    // The command's exit status comes back.
    let out = run_lock(&svc, &[], &["sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
}

async fn losing_the_lock_stops_the_command(server: &mut Server) {
    let svc = server.service();
    let mut a = Holder::take(&svc, 2);
    assert!(a.command_alive());
    match &svc {
        Service::Etcd(e) => {
            // Revoke the lease from outside, as an operator or an expiry would.
            let lease = a.key.rsplit('/').next().unwrap().to_string();
            assert!(etcdctl(e, &["lease", "revoke", &lease]).status.success());
        }
        // The service goes away for longer than the session timeout.
        Service::ZooKeeper(_) => server.stop(),
    }
    let code = tokio::task::spawn_blocking(move || {
        let code = a.wait_exit(30);
        (code, a.command_alive())
    })
    .await
    .unwrap();
    assert_eq!(code, (Some(75), false));
    // And a lock that cannot be taken is its own exit status.
    if let Service::ZooKeeper(_) = &svc {
        let out = run_lock(&svc, &["--timeout", "2"], &["true"]);
        assert_eq!(out.status.code(), Some(69), "{out:?}");
    }
}

async fn eager_fencing_survives_a_lock_service_restart(server: &mut Server) {
    let svc = server.service();
    let (fg, c) = fencegate(Some(&svc)).await;
    server.stop();
    // Blind while the service is down: the gauge says so.
    wait_for_eager(&fg, false).await;
    assert!(fg.logs().contains("eager fencing degraded"));
    server.restart();
    wait_for_eager(&fg, true).await;

    let a = Holder::take(&svc, 2);
    put_with_token(&c, "orders/log", "from A", a.token)
        .await
        .unwrap();
    a.pause();
    wait_for_fence_above(&fg, a.token).await;
    let refused = put_with_token(&c, "orders/log", "late A", a.token)
        .await
        .unwrap_err();
    assert_eq!(refused.0, 409);
}
