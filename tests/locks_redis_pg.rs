//! Redis and PostgreSQL as lock services end to end (CONTRACT §7), the
//! stories of tests/locks.rs told again: real servers (Debian's
//! `redis-server` and `postgresql`), holders run by `fencegate lock`, paused
//! with SIGSTOP past their TTL, and fencegate refusing them afterwards, with
//! the plain token check and with eager fencing.

mod common;

use common::fencegate::{Backend, Fencegate};
use common::lock_holder::{Holder, run_lock_at, wait_for_eager, wait_for_fence_above};
use common::postgres::Postgres;
use common::redis::Redis;
use common::{ensure_bucket, put_with_token, sdk};
use std::process::Output;
use std::time::Duration;

/// Every key under `orders/` shares the resource `orders`.
const RULE: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"orders/\"\nmode = \"shared\"\nresource = \"orders\"\n";

/// A lock server a test started.
enum Server {
    Redis(Redis),
    Postgres(Postgres),
}

impl Server {
    fn args(&self) -> Vec<String> {
        match self {
            Server::Redis(r) => vec!["--redis".into(), r.url.clone()],
            Server::Postgres(p) => vec!["--postgres".into(), p.url.clone()],
        }
    }

    fn eager_toml(&self) -> String {
        match self {
            Server::Redis(r) => format!(
                "[locks]\nredis = \"{}\"\n\n[[eager]]\nresource = \"orders\"\nredis_lock = \"orders\"\n",
                r.url
            ),
            Server::Postgres(p) => format!(
                "[locks]\npostgres = \"{}\"\npostgres_poll_ms = 100\n\n[[eager]]\nresource = \"orders\"\npostgres_lock = \"orders\"\n",
                p.url
            ),
        }
    }

    fn stop(&mut self) {
        match self {
            Server::Redis(r) => r.stop(),
            Server::Postgres(p) => p.stop(),
        }
    }

    fn restart(&mut self) {
        match self {
            Server::Redis(r) => r.restart(),
            Server::Postgres(p) => p.restart(),
        }
    }

    /// Whether nobody holds the test lock.
    fn lock_free(&self) -> bool {
        match self {
            Server::Redis(r) => r.cli(&["EXISTS", "orders"]).trim() == "0",
            Server::Postgres(p) => {
                p.psql(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
                     AND objid::bigint = (hashtext('orders')::bigint & 4294967295)",
                )
                .trim()
                    == "0"
            }
        }
    }

    fn take(&self, ttl: u64) -> Holder {
        Holder::take_at(&self.args(), "orders", ttl)
    }

    fn run(&self, extra: &[&str], cmd: &[&str]) -> Output {
        run_lock_at(&self.args(), "orders", extra, cmd)
    }

    fn token(&self) -> u64 {
        let out = self.run(&[], &["sh", "-c", "echo $FENCING_TOKEN"]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

async fn fencegate(server: Option<&Server>) -> (Fencegate, aws_sdk_s3::Client) {
    let extra = match server {
        Some(s) => format!("{RULE}\n{}", s.eager_toml()),
        None => RULE.to_string(),
    };
    let fg = Fencegate::start(Backend::Embedded, &extra);
    let c = sdk(&fg.endpoint());
    ensure_bucket(&c, "demo").await;
    if server.is_some() {
        wait_for_eager(&fg, true).await;
    }
    (fg, c)
}

async fn a_has_written(
    server: &Server,
    eager: bool,
    ttl: u64,
) -> (Fencegate, aws_sdk_s3::Client, Holder) {
    let (fg, c) = fencegate(eager.then_some(server)).await;
    let a = server.take(ttl);
    put_with_token(&c, "orders/log", "from A", a.token)
        .await
        .unwrap();
    (fg, c, a)
}

async fn wait_until_lock_free(server: &Server) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !server.lock_free() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lock never became free"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

macro_rules! on_servers {
    ($($name:ident),* $(,)?) => {
        mod redis {
            $(#[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                let mut s = super::Server::Redis(super::Redis::start());
                super::$name(&mut s).await;
            })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread")]
            async fn $name() {
                let mut s = super::Server::Postgres(super::Postgres::start());
                super::$name(&mut s).await;
            })*
        }
    };
}

on_servers!(
    a_paused_holder_is_refused_after_the_next_holder_writes,
    eager_fencing_refuses_an_expired_holder_before_anyone_else_writes,
    without_eager_fencing_the_expired_holder_writes_until_someone_else_does,
    tokens_rise_across_holders_and_a_server_restart,
    a_killed_server_stops_the_command,
    eager_fencing_survives_a_server_restart,
);

async fn a_paused_holder_is_refused_after_the_next_holder_writes(server: &mut Server) {
    let (_fg, c, a) = a_has_written(server, false, 2).await;
    a.pause();
    // B waits, and gets the lock once A's TTL runs out.
    let args = server.args();
    let b = tokio::task::spawn_blocking(move || Holder::take_at(&args, "orders", 10))
        .await
        .unwrap();
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
    let (fg, c, a) = a_has_written(server, true, 2).await;
    a.pause();
    // Nobody else takes the lock; the expiry alone fences A off.
    let h = wait_for_fence_above(&fg, a.token).await;
    let refused = put_with_token(&c, "orders/log", "late A", a.token)
        .await
        .unwrap_err();
    assert_eq!((refused.0, refused.1.as_str()), (409, "StaleFencingToken"));
    // The next holder's token is at or above the eager fence.
    let b = server.take(10);
    assert!(
        b.token >= h,
        "next holder {} below the eager fence {h}",
        b.token
    );
    put_with_token(&c, "orders/log", "from B", b.token)
        .await
        .unwrap();
}

async fn without_eager_fencing_the_expired_holder_writes_until_someone_else_does(
    server: &mut Server,
) {
    let (_fg, c, a) = a_has_written(server, false, 2).await;
    a.pause();
    wait_until_lock_free(server).await;
    put_with_token(&c, "orders/log", "late A", a.token)
        .await
        .unwrap();
}

async fn tokens_rise_across_holders_and_a_server_restart(server: &mut Server) {
    let before = [server.token(), server.token()];
    server.restart();
    let after = [server.token(), server.token()];
    let all: Vec<u64> = before.iter().chain(&after).copied().collect();
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{all:?}");
    // The command's exit status comes back.
    let out = server.run(&[], &["sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
}

async fn a_killed_server_stops_the_command(server: &mut Server) {
    let mut a = server.take(2);
    assert!(a.command_alive());
    server.stop();
    let code = tokio::task::spawn_blocking(move || {
        let code = a.wait_exit(30);
        (code, a.command_alive())
    })
    .await
    .unwrap();
    assert_eq!(code, (Some(75), false));
    // And a lock that cannot be taken is its own exit status.
    let out = server.run(&["--timeout", "1"], &["true"]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
}

async fn eager_fencing_survives_a_server_restart(server: &mut Server) {
    let (fg, c) = fencegate(Some(server)).await;
    server.stop();
    wait_for_eager(&fg, false).await;
    assert!(fg.logs().contains("eager fencing degraded"));
    server.restart();
    wait_for_eager(&fg, true).await;
    let a = server.take(2);
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

/// Without keyspace notifications fencegate cannot see a holder go: eager
/// fencing says it is degraded (and why) instead of pretending.
#[tokio::test(flavor = "multi_thread")]
async fn redis_without_keyspace_notifications_eager_fencing_is_degraded() {
    let server = Server::Redis(Redis::start_with("appendonly yes\nappendfsync always\n"));
    let extra = format!("{RULE}\n{}", server.eager_toml());
    let fg = Fencegate::start(Backend::Embedded, &extra);
    wait_for_eager(&fg, false).await;
    common::wait_until(30, "the reason in the log", || {
        fg.logs().contains("notify-keyspace-events")
    });
}

/// `fencegate lock --redis` warns when the server can hand a token out
/// again, and stays quiet when it cannot.
#[tokio::test(flavor = "multi_thread")]
async fn redis_helper_warns_about_a_server_that_can_reuse_tokens() {
    let safe = Server::Redis(Redis::start());
    let out = safe.run(&[], &["true"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{out:?}"
    );

    let risky = Server::Redis(Redis::start_with("appendonly no\n"));
    let out = risky.run(&[], &["true"]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning") && err.contains("appendonly no"),
        "{err}"
    );
}
