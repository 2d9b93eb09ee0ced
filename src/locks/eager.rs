//! Eager fencing: each `[[eager]]` resource follows a lock, and its fence is
//! raised the moment the lock's holder loses it (release, lease expiry,
//! session loss), durably, before any new holder has written. The old
//! holder is then refused even if nobody else ever writes.
//!
//! While a watch is down, the plain scheme still applies; the gauge
//! `fencegate_eager_fencing_up{resource}` is 0 and a warning is logged.

use super::Seen;
use crate::config::locks::{EagerConfig, LockRef, LocksConfig};
use crate::fence::gate::{Gate, Refusal};
use crate::metric_names as m;
use std::sync::Arc;
use std::sync::Mutex;

/// Starts one watcher task per `[[eager]]` entry.
pub fn spawn_all(locks: &LocksConfig, eager: &[EagerConfig], gate: Arc<Gate>) {
    for e in eager {
        let fencer = Arc::new(Fencer {
            gate: gate.clone(),
            resource: e.resource.clone(),
            lock: e.lock(),
            watch: Mutex::new(Watch::Unknown),
        });
        metrics::gauge!(m::EAGER_UP, "resource" => e.resource.clone()).set(0.0);
        match e.lock() {
            LockRef::Etcd(name) => {
                let endpoints = locks.etcd_endpoints.clone();
                tokio::spawn(async move {
                    let f = fencer.clone();
                    super::etcd::watch_holder(endpoints, name, move |s| f.seen(s)).await
                });
            }
            LockRef::Redis(key) => {
                let url = locks.redis.clone().unwrap_or_default();
                tokio::spawn(async move {
                    let f = fencer.clone();
                    super::redis::watch_holder(url, key, move |s| f.seen(s)).await
                });
            }
            LockRef::Postgres(name) => {
                let url = locks.postgres.clone().unwrap_or_default();
                let sequence = locks.postgres_sequence.clone();
                let every = locks.postgres_poll();
                tokio::spawn(async move {
                    let f = fencer.clone();
                    super::postgres::watch_holder(url, name, sequence, every, move |s| f.seen(s))
                        .await
                });
            }
            LockRef::ZooKeeper(path) => {
                let servers = locks.zookeeper.clone().unwrap_or_default();
                let session = locks.zookeeper_session_timeout();
                tokio::spawn(async move {
                    let f = fencer.clone();
                    super::zookeeper::watch_holder(servers, session, path, move |s| f.seen(s)).await
                });
            }
        }
    }
}

/// The state of a resource's lock watch, as last reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// Nothing reported yet (the gauge starts at 0).
    Unknown,
    Up,
    Down,
}

/// Turns what a watcher sees into fence raises, metrics and logs.
struct Fencer {
    gate: Arc<Gate>,
    resource: String,
    lock: LockRef,
    watch: Mutex<Watch>,
}

impl Fencer {
    fn seen(self: &Arc<Self>, s: Seen) {
        match s {
            Seen::Up | Seen::Down => {
                let up = s == Seen::Up;
                let now = if up { Watch::Up } else { Watch::Down };
                let was = std::mem::replace(
                    &mut *self.watch.lock().unwrap_or_else(|p| p.into_inner()),
                    now,
                );
                if was == now {
                    return;
                }
                metrics::gauge!(m::EAGER_UP, "resource" => self.resource.clone()).set(if up {
                    1.0
                } else {
                    0.0
                });
                if up {
                    tracing::info!(resource = %self.resource, lock = ?self.lock, "eager fencing is watching the lock");
                } else {
                    tracing::warn!(resource = %self.resource, lock = ?self.lock,
                        "eager fencing degraded: lock watch is down; the plain token check still applies");
                }
            }
            Seen::Raise { token, why } => {
                // Raises only ever go up, so they may complete in any order.
                let this = self.clone();
                tokio::spawn(async move { this.raise(token, &why).await });
            }
        }
    }

    async fn raise(&self, token: u64, why: &str) {
        loop {
            match self.gate.raise_to(&self.resource, token).await {
                // Another replica (or an earlier event) raised it already.
                Ok((h, false)) => {
                    tracing::info!(resource = %self.resource, token, highest = h, why, "lock holder lost the lock; fence already raised");
                    return;
                }
                Ok((h, true)) => {
                    metrics::counter!(m::EAGER_RAISES).increment(1);
                    tracing::warn!(resource = %self.resource, lock = ?self.lock, token, highest = h, why,
                        "lock holder lost the lock: fence raised");
                    return;
                }
                // Already at or above: nothing to do.
                Err(Refusal::Stale { highest, .. }) => {
                    tracing::info!(resource = %self.resource, token, highest, why, "lock holder lost the lock; fence already higher");
                    return;
                }
                Err(e) => {
                    tracing::error!(resource = %self.resource, token, error = ?e, "eager fence raise failed; retrying");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        }
    }
}
