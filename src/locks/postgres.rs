//! PostgreSQL: a session advisory lock, with a fencing token from a
//! sequence, and a watcher of `pg_locks` for eager fencing.
//!
//! - The lock is `pg_advisory_lock(hashtext(NAME))`: the single-bigint-key
//!   advisory lock on the 32-bit `hashtext` of the name, sign-extended,
//!   computed by the server. `SELECT pg_advisory_lock(hashtext('orders'))`
//!   in psql takes the same lock. Two names with the same hash share a lock
//!   (more exclusion, never less).
//! - The token is `nextval` of a sequence (default `fencegate_tokens`,
//!   created if missing: the only schema object), called in the same
//!   session once the lock is granted. A sequence never goes back, even
//!   after a crash. The same statement publishes the token as the session's
//!   `application_name` (`fencegate token N`), so that eager fencing knows
//!   the holder's token exactly.
//! - The lock lasts as long as the session. The helper sets
//!   `idle_session_timeout` to the TTL and pings (`SELECT 1`) every TTL/3:
//!   a paused or partitioned helper's session is ended by the server after
//!   the TTL, which releases the lock; the helper counts the lock lost when
//!   no ping was answered for a TTL or the connection closes.

use super::issued::Holding;
use super::watch::{Broken, Report, Watch};
use super::{LockError, Seen};
use crate::access::PgTls;
use crate::config::access::AccessConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_postgres::Client;

/// `application_name` prefix under which a holder publishes its token.
const PUBLISHED: &str = "fencegate token ";

fn svc(e: tokio_postgres::Error) -> LockError {
    LockError::Service(crate::access::postgres_error(&e))
}

/// Connects, and runs the connection on its own task; the returned receiver
/// gets the reason when the connection ends. The TLS connector comes back
/// too, for cancelling a statement over the same kind of connection.
async fn connect(
    url: &str,
    access: &AccessConfig,
) -> Result<(Client, watch::Receiver<Option<String>>, PgTls), LockError> {
    let (mut config, tls) =
        crate::access::postgres_config(url, access).map_err(LockError::Service)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(3));
    }
    config.keepalives_idle(Duration::from_secs(5));
    let (client, connection) = config.connect(tls.clone()).await.map_err(|e| {
        let shown = crate::access::redacted_url(url);
        LockError::Service(crate::access::failure(
            "postgres",
            &shown,
            crate::access::postgres_error(&e),
        ))
    })?;
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let why = match connection.await {
            Ok(()) => "connection closed".to_string(),
            Err(e) => format!("connection lost: {e}"),
        };
        let _ = tx.send(Some(why));
    });
    Ok((client, rx, tls))
}

/// One connection, for the start-up check: `(permanent, why)` on
/// failure, permanent when retrying cannot help (password, certificate,
/// pg_hba refusal).
pub async fn check(url: &str, access: &AccessConfig) -> Result<(), (bool, String)> {
    match connect(url, access).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let e = e.to_string();
            let permanent = [
                "28P01",
                "28000",
                "certificate",
                "TLS",
                "does not support TLS",
                "sslmode",
            ]
            .iter()
            .any(|s| e.contains(s));
            Err((permanent, e))
        }
    }
}

/// `schema.name` or `name`, each part quoted as an identifier.
fn quoted(sequence: &str) -> String {
    sequence
        .split('.')
        .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

/// Creates the token sequence unless it exists.
async fn ensure_sequence(client: &Client, sequence: &str) -> Result<(), tokio_postgres::Error> {
    let sql = format!("CREATE SEQUENCE IF NOT EXISTS {}", quoted(sequence));
    match client.batch_execute(&sql).await {
        Ok(()) => Ok(()),
        // Two creators at once: one of them loses the race on the catalog.
        Err(e)
            if client
                .query_opt("SELECT to_regclass($1)::text", &[&quoted(sequence)])
                .await
                .ok()
                .flatten()
                .and_then(|r| r.get::<_, Option<String>>(0))
                .is_some() =>
        {
            let _ = e;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// A held advisory lock: the session that holds it, and its pinger.
pub struct PgLock {
    pub token: u64,
    pub key: String,
    client: Arc<Client>,
    lost: watch::Receiver<Option<String>>,
    task: tokio::task::JoinHandle<()>,
}

/// Takes lock `name` at `url`, waiting up to `wait` (forever if `None`);
/// the token comes from `sequence`.
pub async fn acquire(
    url: &str,
    access: &AccessConfig,
    name: &str,
    sequence: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<PgLock, LockError> {
    let (client, mut closed, tls) = connect(url, access).await?;
    let client = Arc::new(client);
    let ttl_ms = ttl.as_millis().max(1000) as u64;
    if let Err(e) = client
        .batch_execute(&format!("SET idle_session_timeout = {ttl_ms}"))
        .await
    {
        eprintln!(
            "fencegate lock: warning: cannot set idle_session_timeout ({e}; PostgreSQL 14 or \
             later has it): a paused holder keeps the lock until TCP keepalives end its session"
        );
    }
    ensure_sequence(&client, sequence).await.map_err(svc)?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&name];
    let take = client.execute("SELECT pg_advisory_lock(hashtext($1))", &params);
    let taken = tokio::select! {
        r = take => r.map(|_| ()).map_err(svc),
        _ = super::sleep_opt(wait) => Err(LockError::Timeout),
        _ = closed.wait_for(Option::is_some) => Err(LockError::Service("connection lost while waiting".into())),
    };
    if let Err(e) = taken {
        // Stop the waiting statement; ending the session drops any lock.
        let _ = client.cancel_token().cancel_query(tls).await;
        return Err(e);
    }
    let row = client
        .query_one(
            "SELECT set_config('application_name', $2 || nextval($1::text::regclass), false)",
            &[&quoted(sequence), &PUBLISHED],
        )
        .await
        .map_err(svc)?;
    let published: String = row.get(0);
    let token = published_token(&published)
        .ok_or_else(|| LockError::Service(format!("unexpected token {published:?}")))?;
    let (tx, lost) = watch::channel(None);
    let task = tokio::spawn(ping(client.clone(), closed, ttl, tx));
    Ok(PgLock {
        token,
        key: name.to_string(),
        client,
        lost,
        task,
    })
}

fn published_token(application_name: &str) -> Option<u64> {
    application_name.strip_prefix(PUBLISHED)?.parse().ok()
}

impl PgLock {
    pub async fn lost(&mut self) -> String {
        super::lost_reason(&mut self.lost, "session watcher stopped").await
    }

    pub async fn release(self) {
        self.task.abort();
        let _ = self
            .client
            .execute("SELECT pg_advisory_unlock(hashtext($1))", &[&self.key])
            .await;
    }
}

/// Pings the session every `ttl / 3`. The lock is lost when the connection
/// closes (the session, and with it the lock, is gone), or when no ping was
/// answered for `ttl` counted from when it was sent: by then the server's
/// `idle_session_timeout` may have ended the session.
async fn ping(
    client: Arc<Client>,
    mut closed: watch::Receiver<Option<String>>,
    ttl: Duration,
    lost: watch::Sender<Option<String>>,
) {
    let every = ttl / 3;
    let mut last_ok = Instant::now();
    let mut pause = every;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            r = closed.wait_for(Option::is_some) => {
                let why = r.map(|w| w.clone().unwrap_or_default()).unwrap_or_default();
                let _ = lost.send(Some(format!("session ended: {why}")));
                return;
            }
        }
        let sent = Instant::now();
        match tokio::time::timeout(every, client.simple_query("SELECT 1")).await {
            Ok(Ok(_)) => {
                last_ok = sent;
                pause = every.saturating_sub(sent.elapsed());
            }
            _ => pause = Duration::from_millis(100),
        }
        if last_ok.elapsed() >= ttl {
            let _ = lost.send(Some(format!(
                "no ping answered for {} ms (the TTL)",
                ttl.as_millis()
            )));
            return;
        }
    }
}

/// Who holds the lock, as `pg_locks` and `pg_stat_activity` tell.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    /// The session: backend pid and start time (pids are reused).
    session: (i32, String),
    /// The token it published, once it has.
    token: Option<u64>,
}

/// The fence once `old` has lost the lock: one above its token when it
/// published one (every later holder's `nextval` is above it); otherwise one
/// above `last`, the sequence read before the lock was, but never above the
/// published token of a new holder.
fn fence_for(old: &Holder, last: u64, new: Option<&Holder>) -> u64 {
    if let Some(t) = old.token {
        return t + 1;
    }
    let f = last + 1;
    match new.and_then(|h| h.token) {
        Some(t) => f.min(t),
        None => f,
    }
}

const HOLDER: &str = "\
WITH k AS (SELECT hashtext($1)::bigint AS k)
SELECT l.pid, a.backend_start::text, a.application_name
FROM pg_locks l CROSS JOIN k
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid::bigint = ((k.k >> 32) & 4294967295)
  AND l.objid::bigint = (k.k & 4294967295)";

async fn token_and_holder(
    client: &Client,
    name: &str,
    sequence: &str,
) -> Result<(u64, Option<Holder>), tokio_postgres::Error> {
    // The sequence first: a holder granted after this read takes a token
    // above it.
    let last: i64 = client
        .query_one(&format!("SELECT last_value FROM {}", quoted(sequence)), &[])
        .await?
        .get(0);
    let row = client.query_opt(HOLDER, &[&name]).await?;
    let holder = row.map(|r| Holder {
        session: (r.get(0), r.get::<_, Option<String>>(1).unwrap_or_default()),
        token: r
            .get::<_, Option<String>>(2)
            .as_deref()
            .and_then(published_token),
    });
    Ok((last.max(0) as u64, holder))
}

/// Watches lock `name` at `url` by polling `pg_locks` every `every`, and
/// reports each time its holder's session lets go of it (ended, or
/// unlocked). The fence: see `fence_for`.
/// The token of lock `name`'s holder now, as its session published it,
/// asked of the server (`None`: nobody holds it, or its holder has not
/// published its token yet, which it does before it can know it).
pub async fn holder_now(
    client: &Client,
    name: &str,
    sequence: &str,
) -> Result<Option<Holding>, String> {
    let (_, holder) = token_and_holder(client, name, sequence)
        .await
        .map_err(|e| {
            format!(
                "cannot read lock {name}: {}",
                crate::access::postgres_error(&e)
            )
        })?;
    Ok(holder.and_then(|h| h.token).map(Holding::exact))
}

/// A connection for [`holder_now`], and the receiver that says when it
/// closed.
pub async fn client_for(
    url: &str,
    access: &AccessConfig,
) -> Result<(Client, watch::Receiver<Option<String>>), String> {
    let (client, closed, _) = connect(url, access).await.map_err(|e| e.to_string())?;
    Ok((client, closed))
}

pub async fn watch_holder(
    url: String,
    access: AccessConfig,
    name: String,
    sequence: String,
    every: Duration,
    seen: impl Fn(Seen) + Sync,
) {
    let watch = HolderWatch {
        url,
        access,
        name,
        sequence,
        every,
        known: None,
    };
    super::watch::run(watch, seen).await
}

/// The polls of one advisory lock, for [`watch_holder`].
struct HolderWatch {
    url: String,
    access: AccessConfig,
    name: String,
    sequence: String,
    every: Duration,
    /// The holder, as last read.
    known: Option<Holder>,
}

/// A connection whose first poll has been answered: the watch is up once
/// the lock could be read.
struct Polling {
    client: Client,
    closed: watch::Receiver<Option<String>>,
    first: (u64, Option<Holder>),
}

impl Watch for HolderWatch {
    const SERVICE: &'static str = "postgres";
    type Session = Polling;

    fn lock(&self) -> &str {
        &self.name
    }

    async fn connect(&mut self, _: Report<'_>) -> Result<Polling, Broken> {
        let (client, closed, _) = connect(&self.url, &self.access).await?;
        if let Err(e) = ensure_sequence(&client, &self.sequence).await {
            let (sequence, why) = (&self.sequence, crate::access::postgres_error(&e));
            return Err(Broken::new(format!(
                "cannot create the sequence {sequence}: {why}"
            )));
        }
        let first = self.poll(&client, &closed).await?;
        Ok(Polling {
            client,
            closed,
            first,
        })
    }

    async fn follow(&mut self, session: Polling, seen: Report<'_>) -> Broken {
        let mut answered = Some(session.first);
        loop {
            let (last, holder) = match answered.take() {
                Some(r) => r,
                None => match self.poll(&session.client, &session.closed).await {
                    Ok(r) => r,
                    Err(broken) => return broken,
                },
            };
            if let Some(old) = &self.known
                && holder.as_ref().map(|h| &h.session) != Some(&old.session)
            {
                seen(Seen::Raise {
                    token: fence_for(old, last, holder.as_ref()),
                    why: format!("holder session {} let go of the lock", old.session.0),
                });
            }
            seen(Seen::Holder(
                holder.as_ref().and_then(|h| h.token).map(Holding::exact),
            ));
            self.known = holder;
            tokio::time::sleep(self.every).await;
        }
    }
}

impl HolderWatch {
    /// One poll: the sequence and the holder, unless the connection closed
    /// or the server does not answer in time.
    async fn poll(
        &self,
        client: &Client,
        closed: &watch::Receiver<Option<String>>,
    ) -> Result<(u64, Option<Holder>), Broken> {
        let ended = closed.borrow().clone();
        if let Some(why) = ended {
            return Err(Broken::new(why));
        }
        let wait = self.every.max(Duration::from_secs(2));
        match tokio::time::timeout(wait, token_and_holder(client, &self.name, &self.sequence)).await
        {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(Broken::new(format!(
                "cannot read the lock: {}",
                crate::access::postgres_error(&e)
            ))),
            Err(_) => Err(Broken::new(format!(
                "no answer within {} ms",
                wait.as_millis()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pid: i32, token: Option<u64>) -> Holder {
        Holder {
            session: (pid, "t".into()),
            token,
        }
    }

    #[test]
    fn the_fence_keeps_out_the_old_holder_and_lets_the_new_one_in() {
        // The old holder published its token: one above it.
        assert_eq!(fence_for(&h(1, Some(7)), 9, None), 8);
        assert_eq!(fence_for(&h(1, Some(7)), 9, Some(&h(2, Some(9)))), 8);
        // It did not: one above the sequence, never above the new holder.
        assert_eq!(fence_for(&h(1, None), 9, None), 10);
        assert_eq!(fence_for(&h(1, None), 9, Some(&h(2, Some(9)))), 9);
    }

    #[test]
    fn names() {
        assert_eq!(quoted("fencegate_tokens"), "\"fencegate_tokens\"");
        assert_eq!(quoted("s.t"), "\"s\".\"t\"");
        assert_eq!(published_token("fencegate token 42"), Some(42));
        assert_eq!(published_token("psql"), None);
    }
}
