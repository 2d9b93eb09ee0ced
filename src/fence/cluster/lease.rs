//! This replica's lease in etcd, and how sure it is that the lease still
//! stands.
//!
//! etcd expires a lease `ttl` after the last keep-alive it received, and
//! never earlier (a leader change extends leases). A keep-alive is received
//! after it was sent, so a lease whose keep-alive sent at `s` was answered
//! stands at least until `s + ttl` by etcd's clock. The replica counts on
//! its own monotonic clock from `s`, keeps a margin of `ttl / 5` for the
//! clocks' rates and for the bytes still to leave, and calls the lease
//! fresh until `s + ttl - margin` ([`Lease::fresh`]). A paused process sees
//! that time pass when it wakes up, before it can act on stale belief.
//!
//! The clock is `CLOCK_BOOTTIME`, not Rust's `Instant` (`CLOCK_MONOTONIC`),
//! which stops while the machine is suspended: a suspended replica must see
//! that its lease may have gone. (A VM paused by its hypervisor sees the
//! time pass only if its clock source catches up; docs/cluster.md.)

use crate::metric_names as m;
use etcd_client::Client;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Time since boot, suspend included.
pub fn now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to; CLOCK_BOOTTIME exists
    // on every Linux fencegate runs on.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[derive(Clone, Copy)]
struct State {
    /// The lease id, 0 when there is none.
    id: i64,
    /// Bumped at each new lease: a registration made under an older one
    /// is gone with it.
    generation: u64,
    /// Until when (on [`now`]'s clock) the lease is surely alive, less
    /// the margin.
    safe_until: Duration,
}

pub struct Lease {
    ttl: Duration,
    state: Mutex<State>,
    /// Woken each time the lease is fresh again ([`Lease::fresh_within`]).
    fresh_again: tokio::sync::Notify,
}

impl Lease {
    pub fn new(ttl: Duration) -> Arc<Lease> {
        Arc::new(Lease {
            ttl,
            state: Mutex::new(State {
                id: 0,
                generation: 0,
                safe_until: Duration::ZERO,
            }),
            fresh_again: tokio::sync::Notify::new(),
        })
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section is a copy or a few stores: poisoning is
        // harmless.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn margin(ttl: Duration) -> Duration {
        ttl / 5
    }

    /// How long newer writes wait after a lease of `ttl` expired, for the
    /// writes its replica may have left at the backend: the whole
    /// `quarantine` (the longest the backend takes to apply what it has).
    /// A replica cut off from etcd but not from the backend goes on
    /// sending last bytes while its lease is fresh, up to `ttl - margin`
    /// after its last keep-alive was sent; the margin covers those bytes on
    /// their way and the clocks, so they are at the backend by the expiry,
    /// and not earlier. (A hold of the quarantine less 4/5 of the TTL
    /// assumed the bytes went before the last keep-alive, which holds only
    /// for a replica killed.)
    pub fn hold_after_expiry(quarantine: Duration) -> Duration {
        quarantine
    }

    /// The current lease and its generation, when it is fresh.
    pub fn current(&self) -> Option<(i64, u64)> {
        let st = *self.lock();
        (st.id != 0 && now() < st.safe_until).then_some((st.id, st.generation))
    }

    /// Whether the lease of `generation` is the current one and surely
    /// still alive in etcd.
    pub fn fresh(&self, generation: u64) -> bool {
        self.current().is_some_and(|(_, g)| g == generation)
    }

    /// Whether `generation` is the lease held now (fresh or not): its
    /// registrations are still worth deleting one by one.
    pub fn is_current(&self, generation: u64) -> bool {
        let st = *self.lock();
        st.id != 0 && st.generation == generation
    }

    /// A keep-alive sent at `sent` was answered with `ttl` left.
    fn renewed(&self, id: i64, sent: Duration, ttl: Duration) {
        let mut st = self.lock();
        if st.id == id {
            if now() >= st.safe_until {
                tracing::info!(
                    lease = id,
                    "cluster lease answered again: it stood all along"
                );
            }
            st.safe_until = sent + ttl - Self::margin(ttl);
        }
        drop(st);
        metrics::gauge!(m::CLUSTER_LEASE_FRESH).set(1.0);
        self.fresh_again.notify_waiters();
    }

    /// etcd said the lease is gone (or a new one is due): registrations
    /// made under it are gone with it.
    fn lost(&self, why: &str) {
        let mut st = self.lock();
        if st.id != 0 {
            tracing::warn!(lease = st.id, "cluster lease lost: {why}");
        }
        st.id = 0;
        metrics::gauge!(m::CLUSTER_LEASE_FRESH).set(0.0);
    }

    /// Waits, when the lease lapsed less than `patience` ago, until it is
    /// fresh again (etcd answered its keep-alive, or granted a new one),
    /// but not past `until`. Whether it is fresh. A lease that lapsed
    /// longer ago (etcd unreachable for a while) is not waited for: the
    /// request is answered `503` at once.
    pub async fn fresh_within(&self, until: tokio::time::Instant, patience: Duration) -> bool {
        loop {
            let again = self.fresh_again.notified();
            tokio::pin!(again);
            again.as_mut().enable();
            if self.current().is_some() {
                return true;
            }
            let lapsed = self.lock().safe_until;
            let Some(left) = (lapsed + patience).checked_sub(now()) else {
                return false;
            };
            let stop = until.min(tokio::time::Instant::now() + left);
            if tokio::time::timeout_at(stop, again).await.is_err() {
                return self.current().is_some();
            }
        }
    }

    /// Grants a lease and keeps it alive every `ttl / 5`, for as long as the
    /// process runs. A lease whose keep-alives go unanswered past its
    /// freshness has *lapsed*: writes in flight here fail, but the lease
    /// may stand (etcd electing a leader extends every lease), so its
    /// keep-alives go on; answered, the lease is fresh again, with every
    /// key put under it. Only when etcd says it expired is a new one
    /// granted: what was registered under the old one is gone.
    pub async fn keep(self: Arc<Self>, client: Client) {
        let secs = self.ttl.as_millis().div_ceil(1000).max(1) as i64;
        let every = self.ttl / 5;
        let mut retry = Duration::from_millis(100);
        loop {
            let sent = now();
            let mut lc = client.lease_client();
            let granted = match super::call("lease_grant", lc.grant(secs, None)).await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!("cluster: cannot get a lease: {e}");
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(every);
                    continue;
                }
            };
            retry = Duration::from_millis(100);
            let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
            {
                let mut st = self.lock();
                st.id = granted.id();
                st.generation += 1;
                st.safe_until = sent + ttl - Self::margin(ttl);
            }
            metrics::gauge!(m::CLUSTER_LEASE_FRESH).set(1.0);
            self.fresh_again.notify_waiters();
            let why = self.renew(&client, granted.id(), ttl, every).await;
            self.lost(&why);
        }
    }

    /// Renews lease `id` until etcd says it has expired; says so.
    async fn renew(&self, client: &Client, id: i64, ttl: Duration, every: Duration) -> String {
        // After a failure (a member gone, an election) try again soon: the
        // lease must be renewed within its margin, not at the next tick.
        let soon = (every / 5).max(Duration::from_millis(100));
        let mut wait = every;
        let mut stream = None;
        let mut lapsed = false;
        loop {
            tokio::time::sleep(wait).await;
            wait = soon;
            if self.current().is_none() && !std::mem::replace(&mut lapsed, true) {
                tracing::warn!(
                    lease = id,
                    "cluster lease lapsed: no keep-alive answered in time; writes in flight \
                     here fail, and etcd is still asked whether the lease stands"
                );
                metrics::gauge!(m::CLUSTER_LEASE_FRESH).set(0.0);
            }
            if stream.is_none() {
                let mut lc = client.lease_client();
                match super::call("keep_alive", lc.keep_alive(id)).await {
                    Ok(s) => stream = Some(s),
                    Err(e) if expired(&e) => return format!("etcd says it has expired ({e})"),
                    Err(e) => {
                        tracing::debug!("cluster: keep-alive stream: {e}");
                        continue;
                    }
                }
            }
            let (keeper, answers) = stream.as_mut().expect("just set");
            let sent = now();
            let answer = tokio::time::timeout(every.max(Duration::from_millis(500)), async {
                keeper.keep_alive().await?;
                answers.message().await
            })
            .await;
            match answer {
                Ok(Ok(Some(a))) if a.ttl() > 0 => {
                    self.renewed(id, sent, ttl.min(Duration::from_secs(a.ttl() as u64)));
                    (wait, lapsed) = (every, false);
                }
                Ok(Ok(Some(_))) => return "etcd says it has expired".into(),
                Ok(Err(e)) if expired(&e) => {
                    return format!("etcd says it has expired ({e})");
                }
                _ => stream = None,
            }
        }
    }
}

/// Whether etcd's answer to a keep-alive says the lease is gone: the
/// client reads an answer with no time left as this error.
fn expired(e: &impl std::fmt::Display) -> bool {
    e.to_string().contains("lease not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last bytes a replica may send under a lease (while it is
    /// fresh), applied by the backend as late as the quarantine allows,
    /// land before the newer writes that wait the hold after the lease's
    /// earliest expiry, `ttl` after its last keep-alive was sent.
    #[test]
    fn what_a_lapsing_lease_sent_lands_before_the_hold_after_its_expiry_ends() {
        for (ttl_ms, quarantine_ms) in [(2000, 5000), (5000, 30000), (5000, 1000), (10000, 0)] {
            let (ttl, quarantine) = (
                Duration::from_millis(ttl_ms),
                Duration::from_millis(quarantine_ms),
            );
            let lease = Lease::new(ttl);
            lease.lock().id = 1;
            let sent = Duration::from_secs(100);
            lease.renewed(1, sent, ttl);
            let last_bytes = lease.lock().safe_until;
            let expiry = sent + ttl;
            let newer = expiry + Lease::hold_after_expiry(quarantine);
            assert!(
                last_bytes + quarantine <= newer,
                "ttl {ttl_ms} ms, quarantine {quarantine_ms} ms: a write sent at {last_bytes:?} \
                 may land at {:?}, after newer writes go at {newer:?}",
                last_bytes + quarantine
            );
        }
    }
}
