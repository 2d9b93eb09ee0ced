//! Lock services: etcd, ZooKeeper, Redis and PostgreSQL, the sources of fencing tokens
//! that fencegate knows by name (CONTRACT §7).
//!
//! - [`etcd`] and [`zookeeper`] take a lock (for `fencegate lock`) and watch
//!   one (for eager fencing), each in the recipe its own tools use: etcd's
//!   lock service (`etcdctl lock`), Curator's mutex for ZooKeeper.
//! - [`redis`]: the ordinary Redis lock (`SET NX PX`) with a token counter
//!   raised in the same script, watched through keyspace notifications.
//! - [`postgres`]: a session advisory lock with a token from a sequence,
//!   watched by polling `pg_locks`.
//! - `watch` is the one loop every holder watch runs in: connect, follow,
//!   back off, log; each service above brings its own way of following.
//! - [`helper`] is `fencegate lock`: hold a lock while a command runs.
//! - [`endpoint`]: `fencegate lock --credentials-endpoint`, session
//!   credentials for the lock's token served as the AWS container
//!   credentials, renewed while the lock is held.
//! - [`eager`] raises a resource's fence the moment its lock holder loses the
//!   lock, before any new holder writes.
//! - [`issued`]: the locks of verified resources (`[[eager]] verify`), which
//!   say whether a token that would raise a fence is the holder's: from
//!   what the watch saw, else by asking the service.
//!
//! The `[locks]` table and the `[[eager]]` entries they read are in
//! [`crate::config::locks`].

pub mod eager;
pub mod endpoint;
pub mod etcd;
pub mod helper;
pub mod issued;
pub mod postgres;
pub mod redis;
mod watch;
pub mod zookeeper;

use std::time::Duration;

/// What a lock watcher reports to eager fencing.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// The watch is (re)established: eager fencing is up.
    Up,
    /// The watch is down (no connection, session lost): eager fencing is
    /// degraded until the next `Up`.
    Down,
    /// The holder lost the lock: raise the fence to this token.
    Raise { token: u64, why: String },
    /// What is known of the token of the lock's holder now (`None`: nobody
    /// holds it, or its token is not known yet), as the watch sees it;
    /// reported when the watch is set up and whenever it may have changed.
    Holder(Option<issued::Holding>),
}

/// Why a lock could not be taken, or stopped being held.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("lock service: {0}")]
    Service(String),
    #[error("timed out waiting for the lock")]
    Timeout,
    #[error("lock lost: {0}")]
    Lost(String),
}

/// A lock taken for `fencegate lock`, held until it is released or lost.
pub enum TakenLock {
    Etcd(Box<etcd::EtcdLock>),
    ZooKeeper(zookeeper::ZkLock),
    Redis(Box<redis::RedisLock>),
    Postgres(Box<postgres::PgLock>),
}

impl TakenLock {
    /// The fencing token the lock gave.
    pub fn token(&self) -> u64 {
        match self {
            TakenLock::Etcd(l) => l.token,
            TakenLock::ZooKeeper(l) => l.token,
            TakenLock::Redis(l) => l.token,
            TakenLock::Postgres(l) => l.token,
        }
    }

    /// The lock's key in the service: the etcd key, the ZooKeeper node
    /// path, the Redis key, or PostgreSQL's lock name.
    pub fn key(&self) -> &str {
        match self {
            TakenLock::Etcd(l) => &l.key,
            TakenLock::ZooKeeper(l) => &l.node,
            TakenLock::Redis(l) => &l.key,
            TakenLock::Postgres(l) => &l.key,
        }
    }

    /// Resolves when the lock is lost, with the reason.
    pub async fn lost(&mut self) -> String {
        match self {
            TakenLock::Etcd(l) => l.lost().await,
            TakenLock::ZooKeeper(l) => l.lost().await,
            TakenLock::Redis(l) => l.lost().await,
            TakenLock::Postgres(l) => l.lost().await,
        }
    }

    /// Gives the lock up (best effort: a lease or session that is already
    /// gone has released it anyway).
    pub async fn release(self) {
        match self {
            TakenLock::Etcd(l) => l.release().await,
            TakenLock::ZooKeeper(l) => l.release().await,
            TakenLock::Redis(l) => l.release().await,
            TakenLock::Postgres(l) => l.release().await,
        }
    }
}

/// Retry pacing for watches and keep-alives: doubles up to a cap.
pub(crate) struct Backoff(Duration);

impl Backoff {
    pub fn new() -> Backoff {
        Backoff(Duration::from_millis(100))
    }

    pub async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Duration::from_secs(5));
    }

    pub fn reset(&mut self) {
        self.0 = Duration::from_millis(100);
    }
}

/// Why a held lock was lost, once its keeper says so (`rx` becomes `Some`);
/// `stopped` if the keeper ended without a word.
async fn lost_reason(
    rx: &mut tokio::sync::watch::Receiver<Option<String>>,
    stopped: &str,
) -> String {
    match rx.wait_for(Option::is_some).await {
        Ok(r) => r.clone().unwrap_or_default(),
        Err(_) => stopped.into(),
    }
}

/// Sleeps `d`, or forever without one.
async fn sleep_opt(d: Option<std::time::Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
