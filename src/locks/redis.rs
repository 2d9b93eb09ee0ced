//! Redis: the ordinary single-instance Redis lock, with a fencing token
//! from a counter raised in the same script that takes the lock, and a
//! watcher of keyspace notifications for eager fencing.
//!
//! - The lock is the string key `NAME`, set with `SET NAME <random> NX PX
//!   <ttl>`; it is renewed by a compare-and-extend script and released by a
//!   compare-and-delete script, both keyed on the random value.
//! - The token is `INCR` of the counter `redisson_lock_token:{NAME}` (the
//!   key Redisson's `RFencedLock` keeps its token in), run in the same Lua
//!   script as the `SET NX`: a script is atomic, so whoever holds the lock
//!   holds the latest increment, and holder and token never disagree.
//!
//! What the counter promises depends on the server's persistence and
//! replication: see docs/lock-services.md ("Redis: the honest part").

use super::issued::Holding;
use super::watch::{Broken, Report, Watch};
use super::{LockError, Seen};
use crate::config::access::AccessConfig;
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// The counter of lock `name`: Redisson's `prefixName("redisson_lock_token",
/// name)`, so the hash tag keeps it in the lock key's cluster slot.
pub fn counter_key(name: &str) -> String {
    if name.contains('{') {
        format!("redisson_lock_token:{name}")
    } else {
        format!("redisson_lock_token:{{{name}}}")
    }
}

/// KEYS: lock, counter. ARGV: value, ttl ms. Returns the token, or 0 when
/// somebody else holds the lock.
const TAKE: &str = r"
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('incr', KEYS[2])
end
return 0";

/// KEYS: lock. ARGV: value, ttl ms. 1 if extended, 0 if no longer ours.
const EXTEND: &str = r"
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0";

/// KEYS: lock. ARGV: value. 1 if deleted, 0 if no longer ours.
const RELEASE: &str = r"
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0";

/// KEYS: lock, counter. Returns {counter, holder}: the holder is the lock
/// key's value ('' when nobody holds it; a Redisson hash lock's fields).
const STATE: &str = r"
local c = tonumber(redis.call('get', KEYS[2]) or '0')
local t = redis.call('type', KEYS[1])['ok']
local h = ''
if t == 'string' then
  h = redis.call('get', KEYS[1])
elseif t == 'hash' then
  h = table.concat(redis.call('hkeys', KEYS[1]), ',')
end
return {c, h}";

fn svc(e: redis::RedisError) -> LockError {
    LockError::Service(crate::access::redis_error(&e))
}

fn client(url: &str, access: &AccessConfig) -> Result<redis::Client, LockError> {
    crate::access::redis_client(url, access).map_err(LockError::Service)
}

async fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> Result<MultiplexedConnection, redis::RedisError> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

/// One connection and a PING, for the start-up check: `(permanent, why)`
/// on failure, permanent when retrying cannot help (password, certificate).
pub async fn check(url: &str, access: &AccessConfig) -> Result<(), (bool, String)> {
    let client = client(url, access).map_err(|e| (true, e.to_string()))?;
    let shown = crate::access::redacted_url(url);
    let r = match connect(&client, Duration::from_secs(3)).await {
        Ok(mut c) => redis::cmd("PING")
            .query_async::<String>(&mut c)
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    r.map_err(|e| {
        let text = e.to_string();
        let permanent = e.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
            || text.contains("certificate")
            || text.contains("InvalidContentType");
        let why = crate::access::failure("redis", &shown, crate::access::redis_error(&e));
        (permanent, why)
    })
}

/// A held Redis lock: the key, our value in it, and the renewing task.
pub struct RedisLock {
    pub token: u64,
    pub key: String,
    value: String,
    conn: MultiplexedConnection,
    lost: watch::Receiver<Option<String>>,
    task: tokio::task::JoinHandle<()>,
}

/// Takes lock `name` at `url`, waiting up to `wait` (forever if `None`),
/// with a key TTL of `ttl` renewed every `ttl / 3`.
pub async fn acquire(
    url: &str,
    access: &AccessConfig,
    name: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<RedisLock, LockError> {
    let client = client(url, access)?;
    let mut conn = connect(&client, Duration::from_secs(3))
        .await
        .map_err(|e| {
            let shown = crate::access::redacted_url(url);
            LockError::Service(crate::access::failure(
                "redis",
                &shown,
                crate::access::redis_error(&e),
            ))
        })?;
    for w in reuse_warnings(&mut conn).await {
        eprintln!("fencegate lock: warning: {w}");
    }
    let value = format!("{:032x}", rand::random::<u128>());
    let ttl_ms = ttl.as_millis() as u64;
    let take = redis::Script::new(TAKE);
    let deadline = wait.map(|w| Instant::now() + w);
    let counter = counter_key(name);
    // The ordinary Redis lock has no queue: poll, a few times per TTL.
    let every = (ttl / 10).clamp(Duration::from_millis(50), Duration::from_millis(500));
    let token = loop {
        let token: u64 = take
            .key(name)
            .key(&counter)
            .arg(&value)
            .arg(ttl_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(svc)?;
        if token > 0 {
            break token;
        }
        if deadline.is_some_and(|d| Instant::now() + every > d) {
            return Err(LockError::Timeout);
        }
        tokio::time::sleep(every).await;
    };
    let (tx, lost) = watch::channel(None);
    let task = tokio::spawn(keep(
        client,
        conn.clone(),
        name.to_string(),
        value.clone(),
        ttl,
        tx,
    ));
    Ok(RedisLock {
        token,
        key: name.to_string(),
        value,
        conn,
        lost,
        task,
    })
}

impl RedisLock {
    pub async fn lost(&mut self) -> String {
        super::lost_reason(&mut self.lost, "lock keeper stopped").await
    }

    pub async fn release(mut self) {
        self.task.abort();
        let _: Result<i64, _> = redis::Script::new(RELEASE)
            .key(&self.key)
            .arg(&self.value)
            .invoke_async(&mut self.conn)
            .await;
    }
}

/// Extends the key every `ttl / 3` if it still holds our value. The lock is
/// lost when the key no longer holds it (expired, deleted, taken by someone
/// else), or when no extension was acknowledged for `ttl` counted from when
/// it was sent: by then the key may have expired on the server.
async fn keep(
    client: redis::Client,
    mut conn: MultiplexedConnection,
    key: String,
    value: String,
    ttl: Duration,
    lost: watch::Sender<Option<String>>,
) {
    let every = ttl / 3;
    let extend = redis::Script::new(EXTEND);
    let mut last_ok = Instant::now();
    let mut broken = false;
    loop {
        let pause = if broken {
            Duration::from_millis(100)
        } else {
            every.saturating_sub(last_ok.elapsed().min(every))
        };
        tokio::time::sleep(pause).await;
        let sent = Instant::now();
        if broken {
            match connect(&client, every).await {
                Ok(c) => {
                    conn = c;
                    broken = false;
                }
                Err(_) => {
                    if last_ok.elapsed() >= ttl {
                        break;
                    }
                    continue;
                }
            }
        }
        let answer = tokio::time::timeout(
            every,
            extend
                .key(&key)
                .arg(&value)
                .arg(ttl.as_millis() as u64)
                .invoke_async::<i64>(&mut conn),
        )
        .await;
        match answer {
            Ok(Ok(1)) => last_ok = sent,
            Ok(Ok(_)) => {
                let _ = lost.send(Some(format!(
                    "lock key {key} no longer holds our value (expired, deleted or taken)"
                )));
                return;
            }
            _ => broken = true,
        }
        if last_ok.elapsed() >= ttl {
            break;
        }
    }
    let _ = lost.send(Some(format!(
        "no extension acknowledged for {} ms (the key's TTL)",
        ttl.as_millis()
    )));
}

/// Why the server `conn` talks to could hand a token out twice: its
/// persistence, eviction policy and replication, as far as CONFIG and INFO
/// tell. Empty when it looks right.
pub async fn reuse_warnings(conn: &mut MultiplexedConnection) -> Vec<String> {
    let mut out = Vec::new();
    let config = |conn: &mut MultiplexedConnection, p: &'static str| {
        let mut conn = conn.clone();
        async move {
            let v: Result<Vec<String>, _> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(p)
                .query_async(&mut conn)
                .await;
            v.ok().and_then(|v| v.get(1).cloned())
        }
    };
    match (
        config(conn, "appendonly").await,
        config(conn, "appendfsync").await,
    ) {
        (Some(aof), Some(fsync)) => {
            if aof != "yes" || fsync != "always" {
                out.push(format!(
                    "the Redis server has appendonly {aof}, appendfsync {fsync}: after a crash \
                     or restart its token counter can go back and hand out tokens again \
                     (safe: appendonly yes, appendfsync always)"
                ));
            }
        }
        _ => out.push(
            "cannot read the Redis server's persistence settings (CONFIG GET refused): \
             its token counter may go back after a restart"
                .into(),
        ),
    }
    if let Some(policy) = config(conn, "maxmemory-policy").await
        && policy.starts_with("allkeys")
    {
        out.push(format!(
            "the Redis server has maxmemory-policy {policy}: it may evict the token \
             counter, and tokens start again from 1 (safe: noeviction or volatile-*)"
        ));
    }
    let info: Result<String, _> = redis::cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await;
    if let Ok(info) = info {
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let replicas: u64 = field("connected_slaves")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if field("role") == Some("slave") {
            out.push(
                "the Redis server is a replica: its data, the token counter included, \
                 lags its primary"
                    .into(),
            );
        } else if replicas > 0 {
            out.push(format!(
                "the Redis server has {replicas} replica(s), replicated asynchronously: a \
                 failover can lose the last increments of the token counter and hand a \
                 token out again"
            ));
        }
    }
    out
}

/// Which events `notify-keyspace-events` must include: keyspace channel
/// (K), generic commands such as DEL (g), expiry (x) and eviction (e).
/// `A` stands for every class.
fn notifications_missing(flags: &str) -> Option<String> {
    let has = |c: char| flags.contains(c) || (c != 'K' && flags.contains('A'));
    let missing: String = ['K', 'g', 'x', 'e']
        .into_iter()
        .filter(|c| !has(*c))
        .collect();
    (!missing.is_empty()).then_some(missing)
}

/// The fence that keeps out every holder before the current one: the
/// counter when someone holds the lock (the latest increment is theirs),
/// one above it when nobody does (the next holder's increment).
fn fence_for(counter: u64, holder: &str) -> u64 {
    if holder.is_empty() {
        counter + 1
    } else {
        counter
    }
}

/// The token of lock `name`'s holder now: the counter, while the lock key
/// is held (the script that takes the lock raises the counter), asked of
/// Redis (`None`: nobody holds it).
pub async fn holder_now(
    conn: &mut MultiplexedConnection,
    name: &str,
) -> Result<Option<Holding>, String> {
    let (c, holder) = read_state(conn, name, &counter_key(name))
        .await
        .map_err(|e| {
            format!(
                "cannot read lock {name}: {}",
                crate::access::redis_error(&e)
            )
        })?;
    Ok((!holder.is_empty()).then_some(Holding::exact(c)))
}

/// A connection for [`holder_now`].
pub async fn connection_for(
    url: &str,
    access: &AccessConfig,
) -> Result<MultiplexedConnection, String> {
    let c = client(url, access).map_err(|e| e.to_string())?;
    connect(&c, WATCH_TIMEOUT)
        .await
        .map_err(|e| crate::access::redis_error(&e))
}

async fn read_state(
    conn: &mut MultiplexedConnection,
    name: &str,
    counter: &str,
) -> Result<(u64, String), redis::RedisError> {
    redis::Script::new(STATE)
        .key(name)
        .key(counter)
        .invoke_async(conn)
        .await
}

/// Watches lock `name` at `url` through keyspace notifications and reports
/// each time its holder loses it (`del`, `expired`, `evicted`).
///
/// After each such event the lock key and the counter are read together in
/// one script: the fence goes one above the counter when nobody holds the
/// lock (the next holder's `INCR` reaches it), or to the counter when a new
/// holder already does (the latest increment is the new holder's own token).
///
/// fencegate does not change `notify-keyspace-events` (a server-wide
/// setting): when it lacks what is needed, eager fencing reports itself
/// degraded and checks again every few seconds. While the subscription is
/// down, events are lost; on resubscribing the lock is read afresh and a
/// holder that changed meanwhile is fenced off the same way.
pub async fn watch_holder(
    url: String,
    access: AccessConfig,
    name: String,
    seen: impl Fn(Seen) + Sync,
) {
    let watch = HolderWatch {
        url,
        access,
        counter: counter_key(&name),
        name,
        known: None,
    };
    super::watch::run(watch, seen).await
}

/// How long the watch waits for the server to answer.
const WATCH_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the watch checks that the server answers and that
/// notifications are on (again, while they are off).
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// The watch of one lock key, for [`watch_holder`].
struct HolderWatch {
    url: String,
    access: AccessConfig,
    name: String,
    counter: String,
    /// The holder (the lock key's value), as last read.
    known: Option<String>,
}

/// A connection for commands, and one subscribed to the lock's keyspace
/// channel.
struct Subscribed {
    conn: MultiplexedConnection,
    pubsub: redis::aio::PubSub,
}

impl Watch for HolderWatch {
    const SERVICE: &'static str = "redis";
    type Session = Subscribed;

    fn lock(&self) -> &str {
        &self.name
    }

    async fn connect(&mut self, seen: Report<'_>) -> Result<Subscribed, Broken> {
        let client = client(&self.url, &self.access)?;
        let (mut conn, mut pubsub) = match (
            connect(&client, WATCH_TIMEOUT).await,
            client.get_async_pubsub().await,
        ) {
            (Ok(c), Ok(p)) => (c, p),
            (Err(e), _) | (_, Err(e)) => {
                let why = crate::access::redis_error(&e);
                return Err(Broken::new(format!("cannot connect: {why}")));
            }
        };
        let flags = notify_flags(&mut conn)
            .await
            .map_err(|e| Broken::new(format!("cannot read notify-keyspace-events: {e}")))?;
        if let Some(missing) = notifications_missing(&flags) {
            let why = format!(
                "notify-keyspace-events is {flags:?}, lacking {missing:?}: set it to include \
                 Kgxe (fencegate does not change it)"
            );
            return Err(Broken::new(why).again_in(CHECK_EVERY));
        }
        let db = client.get_connection_info().redis_settings().db();
        let channel = format!("__keyspace@{db}__:{}", self.name);
        if let Err(e) = pubsub.subscribe(&channel).await {
            return Err(Broken::new(format!("cannot subscribe to {channel}: {e}")));
        }
        // Subscribed first, read second: nothing falls between the two.
        let (c, holder) = read_state(&mut conn, &self.name, &self.counter)
            .await
            .map_err(|e| Broken::new(format!("cannot read the lock: {e}")))?;
        if let Some(old) = &self.known
            && !old.is_empty()
            && *old != holder
        {
            seen(Seen::Raise {
                token: fence_for(c, &holder),
                why: "the holder changed while the subscription was down".into(),
            });
        }
        seen(Seen::Holder(
            (!holder.is_empty()).then_some(Holding::exact(c)),
        ));
        self.known = Some(holder);
        Ok(Subscribed { conn, pubsub })
    }

    async fn follow(&mut self, session: Subscribed, seen: Report<'_>) -> Broken {
        let Subscribed {
            mut conn,
            mut pubsub,
        } = session;
        let mut messages = pubsub.on_message();
        let mut check = tokio::time::interval(CHECK_EVERY);
        loop {
            tokio::select! {
                msg = messages.next() => {
                    let Some(msg) = msg else { return Broken::new("the subscription ended") };
                    let event: String = msg.get_payload().unwrap_or_default();
                    let (c, holder) = match read_state(&mut conn, &self.name, &self.counter).await {
                        Ok(s) => s,
                        Err(e) => return Broken::new(format!("cannot read the lock: {e}")),
                    };
                    if matches!(event.as_str(), "del" | "expired" | "evicted") {
                        seen(Seen::Raise {
                            token: fence_for(c, &holder),
                            why: format!("lock key {}: {event}", self.name),
                        });
                    }
                    seen(Seen::Holder((!holder.is_empty()).then_some(Holding::exact(c))));
                    self.known = Some(holder);
                }
                _ = check.tick() => {
                    // A server that stopped answering, or notifications
                    // turned off: both leave the watch blind.
                    match tokio::time::timeout(WATCH_TIMEOUT, notify_flags(&mut conn)).await {
                        Ok(Ok(flags)) => if let Some(missing) = notifications_missing(&flags) {
                            return Broken::new(format!(
                                "notify-keyspace-events is now {flags:?}, lacking {missing:?}"
                            ));
                        },
                        Ok(Err(e)) => return Broken::new(format!("lost the connection: {e}")),
                        Err(_) => return Broken::new("the server stopped answering"),
                    }
                }
            }
        }
    }
}

async fn notify_flags(conn: &mut MultiplexedConnection) -> Result<String, redis::RedisError> {
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(conn)
        .await?;
    Ok(v.get(1).cloned().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_key_is_redissons() {
        assert_eq!(counter_key("orders"), "redisson_lock_token:{orders}");
        assert_eq!(
            counter_key("{app}:orders"),
            "redisson_lock_token:{app}:orders"
        );
    }

    #[test]
    fn notification_flags() {
        assert_eq!(notifications_missing(""), Some("Kgxe".into()));
        assert_eq!(notifications_missing("KA"), None);
        assert_eq!(notifications_missing("Kgxe"), None);
        assert_eq!(notifications_missing("Ex"), Some("Kge".into()));
        assert_eq!(notifications_missing("A"), Some("K".into()));
    }

    #[test]
    fn the_fence_keeps_out_every_earlier_holder() {
        // Nobody holds the lock: the next INCR reaches the fence.
        assert_eq!(fence_for(7, ""), 8);
        // A new holder already took it: its token is the counter.
        assert_eq!(fence_for(8, "f00"), 8);
    }
}
