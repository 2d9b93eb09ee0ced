//! Verified raises (CONTRACT §7; docs/lock-services.md, "Verified raises"):
//! a resource tied to its lock with `[[eager]] verify = true`, on each of
//! the four lock services, really started, holders run by `fencegate lock`:
//!
//! - made-up tokens (above the holder's, 2^64-1, another lock's) raise
//!   nothing: `403 FencingTokenNotIssued`, or, for one below the holder's,
//!   `409` with the fence at the holder's token; the holder is never
//!   refused;
//! - a new holder that writes the moment it has the lock is admitted, 20
//!   handoffs in a row (its watch event may not have arrived: the service
//!   is asked);
//! - a lock service whose tokens went back (Redis restarted without
//!   persistence, a PostgreSQL sequence set back) is reported on `/readyz`
//!   and in the metric as soon as the next holder takes the lock, and the
//!   documented way back (the counter or the sequence set to the highest
//!   fence `fencegate fences highest` prints) lets the next holder write.

mod common;

use common::etcd::Etcd;
use common::fencegate::{Backend, Fencegate};
use common::lock_holder::{Holder, fence, wait_for_eager};
use common::postgres::Postgres;
use common::raw::{RawClient, RawRequest};
use common::redis::Redis;
use common::zookeeper::ZooKeeper;
use std::time::Duration;

const RULE: &str = "[[rules]]\nbucket = \"demo\"\nprefix = \"orders/\"\nmode = \"shared\"\nresource = \"orders\"\n";

/// A lock service a test started, and how fencegate and `fencegate lock`
/// reach it.
enum Server {
    Etcd(Etcd),
    ZooKeeper(ZooKeeper),
    Redis(Redis),
    Postgres(Postgres),
}

impl Server {
    fn args(&self) -> Vec<String> {
        match self {
            Server::Etcd(e) => vec!["--etcd".into(), e.endpoint.clone()],
            Server::ZooKeeper(z) => vec!["--zookeeper".into(), z.connect.clone()],
            Server::Redis(r) => vec!["--redis".into(), r.url.clone()],
            Server::Postgres(p) => vec!["--postgres".into(), p.url.clone()],
        }
    }

    /// The lock `name` as `fencegate lock` and `[[eager]]` name it.
    fn lock(&self, name: &str) -> String {
        match self {
            Server::ZooKeeper(_) => format!("/locks/{name}"),
            _ => name.to_string(),
        }
    }

    /// `[locks]` and the verified `[[eager]]` entry of resource `orders`.
    fn toml(&self) -> String {
        let (locks, field) = match self {
            Server::Etcd(e) => (
                format!("etcd_endpoints = [\"{}\"]", e.endpoint),
                "etcd_lock",
            ),
            Server::ZooKeeper(z) => (
                format!(
                    "zookeeper = \"{}\"\nzookeeper_session_timeout_ms = 2000",
                    z.connect
                ),
                "zookeeper_lock",
            ),
            Server::Redis(r) => (format!("redis = \"{}\"", r.url), "redis_lock"),
            Server::Postgres(p) => (
                format!("postgres = \"{}\"\npostgres_poll_ms = 100", p.url),
                "postgres_lock",
            ),
        };
        format!(
            "[locks]\n{locks}\n\n[[eager]]\nresource = \"orders\"\n{field} = \"{}\"\nverify = true\n",
            self.lock("orders")
        )
    }

    fn take(&self, name: &str) -> Holder {
        Holder::take_at(&self.args(), &self.lock(name), 2)
    }
}

async fn fencegate(server: &Server) -> (Fencegate, RawClient) {
    let fg = Fencegate::start(Backend::Embedded, &format!("{RULE}\n{}", server.toml()));
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo").await;
    wait_for_eager(&fg, true).await;
    let raw = RawClient::new(&fg.endpoint());
    (fg, raw)
}

async fn put(raw: &RawClient, token: u64) -> common::raw::RawResponse {
    let req = RawRequest::put("/demo/orders/log", format!("t{token}")).token(token);
    raw.send(req).await.unwrap()
}

async fn made_up_tokens_raise_nothing_and_the_holder_writes(server: &Server) {
    let (fg, raw) = fencegate(server).await;
    let a = server.take("orders");
    assert_eq!(put(&raw, a.token).await.status, 200, "the holder");
    // Another lock's holder: a token this lock never gave.
    let other = server.take("other");
    for t in [a.token + 1000, u64::MAX, other.token] {
        if t == a.token {
            continue;
        }
        let r = put(&raw, t).await;
        match t > a.token {
            true => {
                assert_eq!(
                    (r.status, r.code()),
                    (403, Some("FencingTokenNotIssued")),
                    "{t}: {}",
                    r.body
                );
                assert!(r.body.contains(&format!("token {}", a.token)), "{}", r.body);
            }
            // Below the holder's: an earlier holder's, refused as stale.
            false => assert_eq!(r.status, 409, "{t}: {}", r.body),
        }
        assert_eq!(fence(&fg).await, Some(a.token), "{t} raised the fence");
    }
    assert_eq!(
        put(&raw, a.token).await.status,
        200,
        "the holder is never refused"
    );
    let metrics = format!("http://{}/metrics", fg.admin);
    let m = common::http_call("GET", &metrics, None, None).await.1;
    assert!(
        m.contains("fencegate_tokens_not_issued_total{resource=\"orders\"}"),
        "{m}"
    );
    drop(other);
    // 20 handoffs: the next holder waits for the lock, and writes the
    // moment it has it.
    let mut holder = a;
    for i in 0..20 {
        let args = server.args();
        let lock = server.lock("orders");
        let next = std::thread::spawn(move || Holder::take_at(&args, &lock, 2));
        std::thread::sleep(Duration::from_millis(200));
        let old = holder.token;
        holder.release();
        holder = next.join().unwrap();
        let r = put(&raw, holder.token).await;
        assert_eq!(
            r.status, 200,
            "handoff {i}: {old} -> {}: {}",
            holder.token, r.body
        );
    }
}

/// A held the lock and let it go before fencegate started, B holds it now:
/// A's token is above the fence (none yet) and below B's, an earlier
/// holder's. It raises the fence to B's token and is refused as stale.
async fn an_earlier_holders_token_fences_it_off_at_the_holders(server: &Server) {
    let a = server.take("orders");
    let a_token = a.token;
    a.release();
    let b = server.take("orders");
    assert!(b.token > a_token);
    let (fg, raw) = fencegate(server).await;
    let r = put(&raw, a_token).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(fence(&fg).await, Some(b.token));
    assert_eq!(put(&raw, b.token).await.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd() {
    let s = Server::Etcd(Etcd::start());
    an_earlier_holders_token_fences_it_off_at_the_holders(&s).await;
    made_up_tokens_raise_nothing_and_the_holder_writes(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn zookeeper() {
    let s = Server::ZooKeeper(ZooKeeper::start());
    an_earlier_holders_token_fences_it_off_at_the_holders(&s).await;
    made_up_tokens_raise_nothing_and_the_holder_writes(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn redis() {
    let s = Server::Redis(Redis::start());
    an_earlier_holders_token_fences_it_off_at_the_holders(&s).await;
    made_up_tokens_raise_nothing_and_the_holder_writes(&s).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres() {
    let s = Server::Postgres(Postgres::start());
    an_earlier_holders_token_fences_it_off_at_the_holders(&s).await;
    made_up_tokens_raise_nothing_and_the_holder_writes(&s).await;
}

/// Waits (up to 10 s) until `/readyz` does (`behind`) or does not list
/// the lock of `orders` among those whose holder is below the fence;
/// returns how long it took.
async fn until_readyz_says_behind(fg: &Fencegate, behind: bool) -> Duration {
    let url = format!("http://{}/readyz", fg.admin);
    let started = std::time::Instant::now();
    loop {
        let body = common::http_call("GET", &url, None, None).await.1;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let listed = v["lock_tokens_behind"]
            .as_array()
            .is_some_and(|a| a.iter().any(|b| b["resource"] == "orders"));
        if listed == behind {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "readyz never said behind={behind}: {body}\n{}",
            fg.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `fencegate fences highest`: the highest fence, what the lock service
/// must be bumped to.
fn highest(fg: &Fencegate) -> u64 {
    let out = common::fencegate::run_bin(
        fg.config_path(),
        &[
            "fences",
            "--admin",
            &format!("http://{}", fg.admin),
            "highest",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["highest"].as_u64().unwrap()
}

/// The story of a lock service whose tokens went back: holders write, the
/// service forgets (`forget`), the next holder's token is below the fence:
/// reported, refused; the service is bumped to `fencegate fences highest`
/// (`bump`), and the next holder writes.
async fn tokens_go_back_and_the_way_back(
    server: &mut Server,
    forget: impl Fn(&mut Server),
    bump: impl Fn(&Server, u64),
) {
    let (fg, raw) = fencegate(server).await;
    for _ in 0..3 {
        let h = server.take("orders");
        assert_eq!(put(&raw, h.token).await.status, 200);
        h.release();
    }
    let before = fence(&fg).await.unwrap();
    forget(server);
    let back = server.take("orders");
    assert!(
        back.token < before,
        "{} should be below {before}",
        back.token
    );
    let took = until_readyz_says_behind(&fg, true).await;
    println!(
        "tokens went back ({} below {before}): on /readyz {took:?} after the holder took the lock",
        back.token
    );
    let metrics = format!("http://{}/metrics", fg.admin);
    let m = common::http_call("GET", &metrics, None, None).await.1;
    assert!(
        m.contains(&format!("holder=\"{}\"", back.token))
            && m.contains("fencegate_lock_tokens_behind"),
        "{m}"
    );
    assert!(fg.logs().contains("tokens went back"), "{}", fg.logs());
    assert_eq!(
        put(&raw, back.token).await.status,
        409,
        "a fence is never lowered"
    );
    back.release();
    // The way back: the service past the highest fence.
    let top = highest(&fg);
    assert!(top >= before);
    bump(server, top);
    let next = server.take("orders");
    assert!(next.token >= top, "{} after the bump to {top}", next.token);
    let r = put(&raw, next.token).await;
    assert_eq!(r.status, 200, "{}", r.body);
    until_readyz_says_behind(&fg, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_restarted_without_persistence_is_reported_and_bumped_back() {
    // No AOF, no snapshots: a restart forgets the counter.
    let mut s = Server::Redis(Redis::start_with("notify-keyspace-events Kgxe\n"));
    let forget = |s: &mut Server| {
        let Server::Redis(r) = s else { unreachable!() };
        r.stop();
        r.restart();
    };
    let bump = |s: &Server, top: u64| {
        let Server::Redis(r) = s else { unreachable!() };
        r.cli(&["SET", "redisson_lock_token:{orders}", &top.to_string()]);
    };
    tokens_go_back_and_the_way_back(&mut s, forget, bump).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_postgres_sequence_set_back_is_reported_and_bumped_back() {
    let mut s = Server::Postgres(Postgres::start());
    let set = |s: &Server, v: u64| {
        let Server::Postgres(p) = s else {
            unreachable!()
        };
        p.psql(&format!("SELECT setval('fencegate_tokens', {v})"));
    };
    tokens_go_back_and_the_way_back(&mut s, |s| set(s, 1), set).await;
}

/// Session credentials named for a verified lock are issued only for the
/// token its holder has, as the lock service confirms it; for a lock no
/// `[[eager]] verify` entry follows, as before.
#[tokio::test(flavor = "multi_thread")]
async fn credentials_for_a_verified_lock_only_for_its_holders_token() {
    const ADMIN: &str = "verified-admin-token-0123456789";
    let server = Server::Etcd(Etcd::start());
    let fg = Fencegate::start_with(
        Backend::Embedded,
        &format!("admin_token = \"{ADMIN}\"\n"),
        &format!("{RULE}\n{}", server.toml()),
    );
    wait_for_eager(&fg, true).await;
    let a = server.take("orders");
    let url = format!("http://{}/credentials", fg.admin);
    let ask = |token: u64, lock: &str| {
        let body = serde_json::json!({"token": token, "lock": lock, "scope": ["demo/orders/"]});
        let url = url.clone();
        async move { common::http_call("POST", &url, Some(ADMIN), Some(&body.to_string())).await }
    };
    // By the lock's name, and by the holder's key as `fencegate lock`
    // gives it.
    for lock in ["orders", "etcd:orders", a.key.as_str()] {
        let (status, body) = ask(a.token, lock).await;
        assert_eq!(status, 200, "{lock}: {body}");
        let (status, body) = ask(a.token + 7, lock).await;
        assert_eq!(status, 403, "{lock}: {body}");
        assert!(body.contains(&format!("token {}", a.token)), "{body}");
    }
    // Another lock: not verified, issued as asked.
    let (status, body) = ask(a.token + 7, "nightly").await;
    assert_eq!(status, 200, "{body}");
}
