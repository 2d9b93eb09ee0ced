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

/// Starts one watcher task per `[[eager]]` entry, and ties the entries
/// with `verify` to their locks at the gate (`super::issued`).
pub fn spawn_all(locks: &LocksConfig, eager: &[EagerConfig], gate: Arc<Gate>) {
    let holders = super::issued::Holders::of(locks, eager).map(Arc::new);
    if let Some(h) = &holders {
        gate.set_issuers(h.clone());
    }
    for e in eager {
        let fencer = Arc::new(Fencer {
            gate: gate.clone(),
            resource: e.resource.clone(),
            lock: e.lock(),
            watch: Mutex::new(Watch::Unknown),
            followed: holders.as_ref().and_then(|h| h.followed(&e.resource)),
        });
        metrics::gauge!(m::EAGER_UP, "resource" => e.resource.clone()).set(0.0);
        match e.lock() {
            LockRef::Etcd(name) => {
                let endpoints = locks.etcd_endpoints.clone();
                let access = locks.etcd_access.clone();
                tokio::spawn(async move {
                    let f = fencer.clone();
                    super::etcd::watch_holder(endpoints, access, name, move |s| f.seen(s)).await
                });
            }
            LockRef::Redis(key) => {
                let url = locks.redis.clone().unwrap_or_default();
                let access = locks.redis_access.clone();
                tokio::spawn(async move {
                    let f = fencer.clone();
                    super::redis::watch_holder(url, access, key, move |s| f.seen(s)).await
                });
            }
            LockRef::Postgres(name) => {
                let url = locks.postgres.clone().unwrap_or_default();
                let sequence = locks.postgres_sequence.clone();
                let every = locks.postgres_poll();
                let access = locks.postgres_access.clone();
                tokio::spawn(async move {
                    let f = fencer.clone();
                    let seen = move |s| f.seen(s);
                    super::postgres::watch_holder(url, access, name, sequence, every, seen).await
                });
            }
            LockRef::ZooKeeper(path) => {
                let servers = locks.zookeeper.clone().unwrap_or_default();
                let session = locks.zookeeper_session_timeout();
                let access = locks.zookeeper_access.clone();
                tokio::spawn(async move {
                    let f = fencer.clone();
                    let seen = move |s| f.seen(s);
                    super::zookeeper::watch_holder(servers, access, session, path, seen).await
                });
            }
        }
    }
}

/// At start-up, reaches once each service an `[[eager]]` entry follows. A
/// refused password or certificate stops start-up with the service, the
/// endpoint and the reason; a service that is merely down does not (its
/// watch reports down, and retries).
pub async fn check_access(locks: &LocksConfig, eager: &[EagerConfig]) -> Result<(), String> {
    let used = |f: fn(&LockRef) -> bool| eager.iter().any(|e| f(&e.lock()));
    let mut failures = Vec::new();
    if used(|l| matches!(l, LockRef::Etcd(_))) {
        let base = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_secs(3));
        let r = crate::access::etcd_connect(&locks.etcd_endpoints, base, &locks.etcd_access).await;
        let r = match r {
            Ok(mut c) => c.status().await.map(|_| ()).map_err(|e| {
                crate::access::etcd_failure(&locks.etcd_endpoints, &locks.etcd_access, &e)
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            failures.push((crate::access::etcd_error_is_permanent(&e), e));
        }
    }
    if used(|l| matches!(l, LockRef::Redis(_))) {
        let url = locks.redis.as_deref().unwrap_or_default();
        if let Err(e) = super::redis::check(url, &locks.redis_access).await {
            failures.push(e);
        }
    }
    if used(|l| matches!(l, LockRef::Postgres(_))) {
        let url = locks.postgres.as_deref().unwrap_or_default();
        if let Err(e) = super::postgres::check(url, &locks.postgres_access).await {
            failures.push(e);
        }
    }
    if used(|l| matches!(l, LockRef::ZooKeeper(_))) {
        let servers = locks.zookeeper.as_deref().unwrap_or_default();
        if let Err(e) = super::zookeeper::check(servers, &locks.zookeeper_access).await {
            failures.push(e);
        }
    }
    for (permanent, e) in failures {
        if permanent {
            return Err(format!("eager fencing: {e}"));
        }
        tracing::warn!(error = %e, "eager fencing: lock service not reachable at start-up");
    }
    Ok(())
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
    /// With `verify`: the lock's holder as the gate's checks read it.
    followed: Option<Arc<super::issued::Followed>>,
}

impl Fencer {
    fn seen(self: &Arc<Self>, s: Seen) {
        match s {
            Seen::Holder(token) => {
                let Some(f) = self.followed.clone() else {
                    return;
                };
                f.holder_seen(token);
                // Below the fence: the service's tokens went back.
                let gate = self.gate.clone();
                let resource = self.resource.clone();
                tokio::spawn(async move {
                    if let Ok(fence) = gate.highest(&resource).await {
                        f.compare(token, fence);
                    }
                });
            }
            Seen::Up | Seen::Down => {
                let up = s == Seen::Up;
                if let (false, Some(f)) = (up, &self.followed) {
                    f.watch_down();
                }
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
