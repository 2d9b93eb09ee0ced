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
            st.safe_until = sent + ttl - Self::margin(ttl);
        }
        metrics::gauge!(m::CLUSTER_LEASE_FRESH).set(1.0);
    }

    fn lost(&self, why: &str) {
        let mut st = self.lock();
        if st.id != 0 {
            tracing::warn!(
                lease = st.id,
                "cluster lease lost: {why}; writes in flight here fail"
            );
        }
        st.id = 0;
        metrics::gauge!(m::CLUSTER_LEASE_FRESH).set(0.0);
    }

    /// Grants a lease and keeps it alive every `ttl / 5`, for as long as the
    /// process runs. A lease that cannot be renewed in time is given up and
    /// a new one granted: writes registered under the old one fail.
    pub async fn keep(self: Arc<Self>, client: Client) {
        let secs = self.ttl.as_millis().div_ceil(1000).max(1) as i64;
        let every = self.ttl / 5;
        loop {
            let sent = now();
            let mut lc = client.lease_client();
            let granted = match super::call("lease_grant", lc.grant(secs, None)).await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!("cluster: cannot get a lease: {e}");
                    tokio::time::sleep(every).await;
                    continue;
                }
            };
            let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
            {
                let mut st = self.lock();
                st.id = granted.id();
                st.generation += 1;
                st.safe_until = sent + ttl - Self::margin(ttl);
            }
            metrics::gauge!(m::CLUSTER_LEASE_FRESH).set(1.0);
            let why = self.renew(&client, granted.id(), ttl, every).await;
            self.lost(&why);
        }
    }

    /// Renews lease `id` until that fails past its freshness; says why.
    async fn renew(&self, client: &Client, id: i64, ttl: Duration, every: Duration) -> String {
        // After a failure (a member gone, an election) try again soon: the
        // lease must be renewed within its margin, not at the next tick.
        let soon = (every / 5).max(Duration::from_millis(100));
        let mut wait = every;
        let mut stream = None;
        loop {
            tokio::time::sleep(wait).await;
            wait = soon;
            if self.current().is_none() {
                return "no keep-alive answered in time".into();
            }
            if stream.is_none() {
                let mut lc = client.lease_client();
                match super::call("keep_alive", lc.keep_alive(id)).await {
                    Ok(s) => stream = Some(s),
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
                    wait = every;
                }
                Ok(Ok(Some(_))) => return "etcd says the lease has expired".into(),
                _ => stream = None,
            }
        }
    }
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
