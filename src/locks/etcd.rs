//! etcd: taking a lock the way `etcdctl lock` does, and watching who holds one.
//!
//! The lock is etcd's own lock service (the `concurrency` mutex): each
//! contender puts `NAME/<lease id in hex>` under its lease, and the key with
//! the lowest create revision holds the lock. The token is the revision at
//! which the lock was confirmed (the Lock response's header revision), which
//! is exactly what `etcdctl lock` exports as `ETCD_LOCK_REV`. It is not the
//! key's create revision: a contender that waited is confirmed after the
//! previous holder's key was deleted, so its token is at least the revision
//! of that deletion — the value eager fencing raises the fence to.

use super::issued::Holding;
use super::watch::{Broken, Report, Watch};
use super::{Backoff, LockError, Seen};
use crate::config::access::AccessConfig;
use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, LockOptions, PutOptions, WatchOptions,
    WatchStream,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tokio::sync::watch;

fn service_error(e: etcd_client::Error) -> LockError {
    LockError::Service(e.to_string())
}

async fn connect(endpoints: &[String], access: &AccessConfig) -> Result<Client, LockError> {
    // HTTP/2 pings find a dead server while a watch is quiet. etcd answers
    // pings more often than every 5 s (its default
    // --grpc-keepalive-min-time) by closing the connection.
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
    crate::access::etcd_connect(endpoints, opts, access)
        .await
        .map_err(LockError::Service)
}

/// A held etcd lock: a lease kept alive by a background task, and the lock
/// key under it.
pub struct EtcdLock {
    pub token: u64,
    pub key: String,
    lease: i64,
    client: Client,
    lost: watch::Receiver<Option<String>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Takes lock `name`, waiting up to `wait` (forever if `None`), under a lease
/// of `ttl` that a background task keeps alive every `ttl / 3`.
pub async fn acquire(
    endpoints: &[String],
    access: &AccessConfig,
    name: &str,
    ttl: Duration,
    wait: Option<Duration>,
) -> Result<EtcdLock, LockError> {
    let mut client = connect(endpoints, access).await?;
    let ttl_secs = ttl.as_secs().max(1) as i64;
    let lease = client
        .lease_grant(ttl_secs, None)
        .await
        .map_err(service_error)?
        .id();
    let (lost_tx, mut lost) = watch::channel(None);
    let keeper = tokio::spawn(keep_alive(client.clone(), lease, ttl, lost_tx.clone()));
    let take = client.lock(name, Some(LockOptions::new().with_lease(lease)));
    let taken = tokio::select! {
        r = take => r.map_err(service_error),
        _ = super::sleep_opt(wait) => Err(LockError::Timeout),
        _ = lost.wait_for(Option::is_some) => Err(LockError::Lost("lease lost while waiting".into())),
    };
    let resp = match taken {
        Ok(r) => r,
        Err(e) => {
            keeper.abort();
            // Revoking the lease deletes our waiting key, if any.
            let _ = client.lease_revoke(lease).await;
            return Err(e);
        }
    };
    let key = String::from_utf8_lossy(resp.key()).into_owned();
    let token = resp.header().map(|h| h.revision()).unwrap_or(0) as u64;
    // The token goes in the key (under its lease, which it keeps), where a
    // verifying fencegate reads it: etcd keeps no other trace of it
    // (`issued.rs`). Without it a check is only as exact as a revision range.
    let put = client.put(
        resp.key(),
        token.to_string(),
        Some(PutOptions::new().with_lease(lease)),
    );
    if let Err(e) = put.await {
        tracing::warn!(key, "cannot write the token into the lock key: {e}");
    }
    let guard = tokio::spawn(watch_own_key(client.clone(), key.clone(), token, lost_tx));
    Ok(EtcdLock {
        token,
        key,
        lease,
        client,
        lost,
        tasks: vec![keeper, guard],
    })
}

impl EtcdLock {
    pub async fn lost(&mut self) -> String {
        super::lost_reason(&mut self.lost, "lock watcher stopped").await
    }

    pub async fn release(mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let _ = self.client.unlock(self.key.as_bytes()).await;
        let _ = self.client.lease_revoke(self.lease).await;
    }
}

/// Keeps `lease` alive every `ttl / 3`. Declares the lock lost when etcd
/// says the lease is gone, or when no keep-alive was acknowledged for `ttl`
/// counted from when it was sent (the server may have expired it by then).
async fn keep_alive(
    mut client: Client,
    lease: i64,
    ttl: Duration,
    lost: watch::Sender<Option<String>>,
) {
    let every = ttl / 3;
    let mut last_ok = Instant::now();
    let mut stream = None;
    loop {
        if stream.is_none() {
            stream = client.lease_keep_alive(lease).await.ok();
        }
        let sent = Instant::now();
        let answer = match stream.as_mut() {
            Some((keeper, replies)) => match keeper.keep_alive().await {
                Ok(()) => tokio::time::timeout(every, replies.message()).await.ok(),
                Err(_) => None,
            },
            None => None,
        };
        match answer {
            Some(Ok(Some(r))) if r.ttl() > 0 => last_ok = sent,
            Some(Ok(Some(_))) => {
                let _ = lost.send(Some(format!("lease {lease:x} expired")));
                return;
            }
            _ => stream = None,
        }
        if last_ok.elapsed() >= ttl {
            let _ = lost.send(Some(format!(
                "no keep-alive acknowledged for {} s (the lease TTL)",
                ttl.as_secs()
            )));
            return;
        }
        tokio::time::sleep(every.saturating_sub(sent.elapsed())).await;
    }
}

/// Declares the lock lost when its key is deleted (by `etcdctl del`, a
/// revoked lease, or an expiry the keep-alive has not noticed yet).
async fn watch_own_key(
    mut client: Client,
    key: String,
    from: u64,
    lost: watch::Sender<Option<String>>,
) {
    let mut backoff = Backoff::new();
    loop {
        let opts = WatchOptions::new().with_start_revision(from as i64);
        if let Ok(mut stream) = client.watch(key.as_bytes(), Some(opts)).await {
            backoff.reset();
            while let Ok(Some(resp)) = stream.message().await {
                let deleted = resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete);
                if deleted || resp.compact_revision() > 0 {
                    let _ = lost.send(Some(format!("lock key {key} was deleted")));
                    return;
                }
            }
        }
        backoff.wait().await;
    }
}

/// The contenders of one lock: key → create revision, and the tokens
/// `fencegate lock` holders wrote into their keys.
#[derive(Default)]
struct Queue {
    by_rev: BTreeMap<i64, String>,
    by_key: BTreeMap<String, i64>,
    tokens: BTreeMap<String, u64>,
    /// The revision at which the holder became it, when a deletion seen
    /// made it so (its token is at least that).
    since: i64,
}

impl Queue {
    fn holder(&self) -> Option<(&i64, &String)> {
        self.by_rev.iter().next()
    }

    fn insert(&mut self, key: String, rev: i64, value: &[u8]) {
        if let Some(t) = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
            self.tokens.insert(key.clone(), t);
        }
        if self.by_key.insert(key.clone(), rev).is_none() {
            self.by_rev.insert(rev, key);
        }
    }

    /// Removes `key`, deleted at revision `at`; true if it was the holder.
    fn remove(&mut self, key: &str, at: i64) -> bool {
        let was_holder = self.holder().map(|(_, k)| k.as_str()) == Some(key);
        if let Some(rev) = self.by_key.remove(key) {
            self.by_rev.remove(&rev);
        }
        self.tokens.remove(key);
        if was_holder {
            self.since = at;
        }
        was_holder
    }

    /// What the holder's token is: the one its key holds (at least the
    /// key's revision: a value below it is not a token), else at least the
    /// key's revision and the deletion that made it the holder.
    fn holding(&self) -> Option<Holding> {
        let (rev, key) = self.holder()?;
        Some(match self.tokens.get(key) {
            Some(t) if *t >= *rev as u64 => Holding::exact(*t),
            _ => Holding {
                token: (*rev).max(self.since) as u64,
                exact: false,
                ceiling: None,
            },
        })
    }
}

/// Watches lock `name` and reports each time its holder's key goes away.
///
/// Only the holder's key counts (the lowest create revision under
/// `NAME/`): a waiter that gives up deletes its own key, which must not
/// fence off the holder. The fence goes to the deletion's revision: the old
/// holder's token is below it, the next holder's is at or above it.
///
/// When the watch breaks it is resumed from the last revision seen. If etcd
/// compacted that history, the lock is read afresh: if the holder we knew is
/// gone, the fence goes to the new holder's create revision (its token is at
/// least that; the old holder's may be higher, so this case is logged as a
/// gap), or to the read's revision when nobody holds the lock.
pub async fn watch_holder(
    endpoints: Vec<String>,
    access: AccessConfig,
    name: String,
    seen: impl Fn(Seen) + Sync,
) {
    let watch = HolderWatch {
        endpoints,
        access,
        prefix: format!("{name}/"),
        name,
        queue: None,
        next_rev: 0,
    };
    super::watch::run(watch, seen).await
}

/// The watch of one lock's contenders, for [`watch_holder`].
struct HolderWatch {
    endpoints: Vec<String>,
    access: AccessConfig,
    name: String,
    prefix: String,
    /// The contenders as last seen; `None` until the lock is first read.
    queue: Option<Queue>,
    /// The revision the watch resumes from; 0 to read the lock afresh.
    next_rev: i64,
}

impl Watch for HolderWatch {
    const SERVICE: &'static str = "etcd";
    /// The client is kept while its watch runs.
    type Session = (Client, WatchStream);

    fn lock(&self) -> &str {
        &self.name
    }

    async fn connect(&mut self, seen: Report<'_>) -> Result<Self::Session, Broken> {
        let mut client = connect(&self.endpoints, &self.access).await?;
        if self.queue.is_none() || self.next_rev == 0 {
            let (fresh, rev) = read_queue(&mut client, &self.prefix)
                .await
                .map_err(|e| Broken::new(format!("cannot read the lock: {e}")))?;
            if let Some(old) = &self.queue {
                resync(old, &fresh, rev, &seen);
            }
            self.queue = Some(fresh);
            self.next_rev = rev + 1;
        }
        let q = self.queue.as_ref().expect("read above");
        seen(Seen::Holder(q.holding()));
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.next_rev);
        match client.watch(self.prefix.as_bytes(), Some(opts)).await {
            Ok(stream) => Ok((client, stream)),
            Err(e) => Err(Broken::new(format!("cannot watch the lock: {e}"))),
        }
    }

    async fn follow(&mut self, (_client, mut stream): Self::Session, seen: Report<'_>) -> Broken {
        let q = self.queue.as_mut().expect("read by connect");
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => return Broken::new("the watch ended"),
                Err(e) => return Broken::new(format!("the watch failed: {e}")),
            };
            if resp.compact_revision() > 0 || resp.canceled() {
                // History is gone: read the lock afresh.
                self.next_rev = 0;
                let why = match resp.compact_revision() {
                    0 => "etcd cancelled the watch".to_string(),
                    r => format!("etcd compacted the history up to revision {r}"),
                };
                return Broken::new(format!("{why}: reading the lock afresh"));
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                match ev.event_type() {
                    EventType::Put => q.insert(key, kv.create_revision(), kv.value()),
                    EventType::Delete => {
                        if q.remove(&key, kv.mod_revision()) {
                            seen(Seen::Raise {
                                token: kv.mod_revision() as u64,
                                why: format!("holder key {key} deleted"),
                            });
                        }
                    }
                }
                self.next_rev = self.next_rev.max(kv.mod_revision() + 1);
            }
            seen(Seen::Holder(q.holding()));
        }
    }
}

/// What lock `name`'s holder's token is now, asked of etcd: the token its
/// key holds, else between the key's create revision and etcd's revision
/// (`None`: nobody holds it).
pub async fn holder_now(client: &mut Client, name: &str) -> Result<Option<Holding>, String> {
    let (q, rev) = read_queue(client, &format!("{name}/"))
        .await
        .map_err(|e| format!("cannot read lock {name}: {e}"))?;
    Ok(q.holding().map(|h| match h.exact {
        true => h,
        false => Holding {
            ceiling: Some(rev as u64),
            ..h
        },
    }))
}

/// A client for [`holder_now`].
pub async fn client_for(endpoints: &[String], access: &AccessConfig) -> Result<Client, String> {
    connect(endpoints, access).await.map_err(|e| e.to_string())
}

async fn read_queue(client: &mut Client, prefix: &str) -> Result<(Queue, i64), etcd_client::Error> {
    let resp = client
        .get(prefix.as_bytes(), Some(GetOptions::new().with_prefix()))
        .await?;
    let mut q = Queue::default();
    for kv in resp.kvs() {
        q.insert(
            String::from_utf8_lossy(kv.key()).into_owned(),
            kv.create_revision(),
            kv.value(),
        );
    }
    Ok((q, resp.header().map(|h| h.revision()).unwrap_or(0)))
}

/// After a gap in the history: raise if the holder we knew is gone.
fn resync(old: &Queue, fresh: &Queue, rev: i64, seen: &impl Fn(Seen)) {
    let Some((old_rev, old_key)) = old.holder() else {
        return;
    };
    if fresh.by_key.get(old_key) == Some(old_rev) {
        return;
    }
    match fresh.holder() {
        None => seen(Seen::Raise {
            token: rev as u64,
            why: format!("holder key {old_key} gone while the watch was down"),
        }),
        Some((new_rev, new_key)) => {
            tracing::warn!(
                old = %old_key, new = %new_key,
                "lock changed hands while the etcd watch was down and its history was compacted: \
                 fencing to the new holder's create revision only"
            );
            seen(Seen::Raise {
                token: *new_rev as u64,
                why: format!("holder key {old_key} replaced by {new_key} while the watch was down"),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_holder_leaving_counts() {
        let mut q = Queue::default();
        q.insert("l/a".into(), 5, b"");
        q.insert("l/b".into(), 7, b"");
        q.insert("l/c".into(), 9, b"");
        assert!(!q.remove("l/b", 10), "a waiter leaving is not the holder");
        assert!(q.remove("l/a", 11));
        assert_eq!(q.holder().map(|(_, k)| k.as_str()), Some("l/c"));
        // A put to an existing key (a refresh) keeps its place.
        q.insert("l/c".into(), 12, b"");
        assert_eq!(q.holder(), Some((&9, &"l/c".to_string())));
        // Its token is at least the deletion that made it the holder...
        let h = q.holding().unwrap();
        assert_eq!((h.token, h.exact), (11, false));
        // ...and exactly what its holder wrote into its key.
        q.insert("l/c".into(), 9, b"13");
        assert_eq!(q.holding(), Some(Holding::exact(13)));
        // A value below the key's revision is no token.
        q.insert("l/c".into(), 9, b"3");
        assert!(!q.holding().unwrap().exact);
    }

    fn queue(keys: &[(&str, i64)]) -> Queue {
        let mut q = Queue::default();
        for (k, r) in keys {
            q.insert(k.to_string(), *r, b"");
        }
        q
    }

    fn resynced(old: &Queue, fresh: &Queue, rev: i64) -> Vec<u64> {
        let raised = std::cell::RefCell::new(Vec::new());
        resync(old, fresh, rev, &|s| {
            if let Seen::Raise { token, .. } = s {
                raised.borrow_mut().push(token)
            }
        });
        raised.into_inner()
    }

    #[test]
    fn after_a_gap_only_a_changed_holder_raises() {
        let old = queue(&[("l/a", 5), ("l/b", 7)]);
        // Same holder, a waiter gone: nothing.
        assert!(resynced(&old, &queue(&[("l/a", 5)]), 20).is_empty());
        // Nobody holds the lock now: the read's revision bounds every
        // later token from below.
        assert_eq!(resynced(&old, &queue(&[]), 20), vec![20]);
        // Someone else holds it: its create revision, never more (its
        // token may be lower than the read's revision).
        assert_eq!(
            resynced(&old, &queue(&[("l/b", 7), ("l/c", 15)]), 20),
            vec![7]
        );
        // Nothing was held before: nothing to fence.
        assert!(resynced(&queue(&[]), &queue(&[("l/c", 15)]), 20).is_empty());
    }
}
