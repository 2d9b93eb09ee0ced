//! The gate in cluster mode: check, raise and barrier through the shared
//! table in etcd ([`crate::fence::cluster`]); the slot keeps this replica's
//! writes in flight so that a raise from anywhere can abort them.

use super::{Gate, Kind, Permit, Refusal, push_entry};
use crate::fence::cluster::{Cluster, Seen, WaitError, keys::Outcome};
use crate::metric_names as m;
use std::sync::Arc;

impl Gate {
    /// Cluster mode: fences, registrations and the barrier are shared
    /// through `cluster`, which is also the store.
    pub fn shared(cluster: Arc<Cluster>, wait_bound: std::time::Duration) -> Gate {
        let mut gate = Gate::new(cluster.clone(), wait_bound);
        gate.holds = crate::fence::hold::Holds::new(wait_bound, Some(cluster.clone()));
        gate.cluster = Some(cluster);
        gate
    }

    /// Cluster mode: why this replica cannot admit writes now, if it cannot.
    pub fn not_ready(&self) -> Option<String> {
        self.cluster.as_ref().and_then(|c| c.not_ready())
    }

    /// Cluster mode: follows raises made at every replica for as long as the
    /// process runs, aborting this replica's lower-token writes that are
    /// still streaming. After a gap in what it saw, it reads the fences of
    /// the resources with writes in flight here again.
    pub fn follow_cluster(self: &Arc<Self>) {
        let Some(c) = self.cluster.clone() else {
            return;
        };
        let gate = Arc::downgrade(self);
        tokio::spawn(c.follow_raises(move |seen| {
            let Some(gate) = gate.upgrade() else { return };
            match seen {
                Seen::Raised(resource, token) => {
                    if let Some(slot) = gate.slots.get(resource).map(|s| s.clone()) {
                        gate.note_raise(&slot, token);
                    }
                }
                Seen::Gap => {
                    tokio::spawn(async move { gate.reread_busy_fences().await });
                }
            }
        }));
    }

    /// Reads again the fence of every resource with a write in flight here.
    async fn reread_busy_fences(&self) {
        let busy: Vec<String> = self
            .slots
            .iter()
            .filter(|s| !s.value().lock().inflight.is_empty())
            .map(|s| s.key().clone())
            .collect();
        for r in busy {
            if let (Ok(Some(h)), Some(slot)) = (self.store.get(&r).await, self.slots.get(&r)) {
                self.note_raise(&slot, h);
            }
        }
    }

    pub(super) async fn raise_shared(
        &self,
        c: &Cluster,
        resource: &str,
        token: u64,
    ) -> Result<(u64, bool), Refusal> {
        let slot = self.cached_slot(resource);
        let deadline = tokio::time::Instant::now() + self.wait_bound;
        match c.admit(resource, token, None, deadline).await {
            Err(e) => Err(Refusal::Unavailable(e.to_string())),
            Ok(Outcome::Stale(h)) => {
                self.note_raise(&slot, h);
                Err(Refusal::Stale { token, highest: h })
            }
            Ok(Outcome::Admitted { raised, .. }) => {
                if raised {
                    metrics::counter!(m::RAISES).increment(1);
                }
                Ok((self.note_raise(&slot, token).max(token), raised))
            }
        }
    }

    /// One admission transaction (check, raise, register, read the lower
    /// writes in flight anywhere), then the wait for those to be gone.
    pub(super) async fn admit_shared(
        &self,
        c: &Arc<Cluster>,
        resource: &str,
        token: u64,
        kind: Kind,
    ) -> Result<Option<Permit>, Refusal> {
        let unavailable = |e: &dyn std::fmt::Display| Refusal::Unavailable(e.to_string());
        let deadline = tokio::time::Instant::now() + self.wait_bound;
        let slot = self.cached_slot(resource);
        let reg = match kind {
            Kind::Write => Some(
                c.registration(resource, token)
                    .map_err(|e| unavailable(&e))?,
            ),
            Kind::Read => None,
        };
        // On any way out before the permit exists (an error, a refusal,
        // the request dropped), `reg` drops and deletes its key.
        let outcome = c
            .admit(resource, token, reg.as_ref(), deadline)
            .await
            .map_err(|e| unavailable(&e))?;
        let (raised, lower, revision) = match outcome {
            Outcome::Stale(h) => {
                self.note_raise(&slot, h);
                return Err(Refusal::Stale { token, highest: h });
            }
            Outcome::Admitted {
                raised,
                lower,
                revision,
            } => (raised, lower, revision),
        };
        if raised {
            metrics::counter!(m::RAISES).increment(1);
        }
        self.note_raise(&slot, token);
        let permit = match reg {
            Some(r) => {
                let mut st = slot.lock();
                // Registered in etcd before it is known here: a raise seen
                // in between refuses it now rather than at its last bytes.
                if let Some(h) = st.highest.filter(|h| *h > token) {
                    return Err(Refusal::Stale { token, highest: h });
                }
                Some(push_entry(&slot, &mut st, token, Some(r)))
            }
            None => None,
        };
        if self.ordered && !lower.is_empty() {
            match c
                .wait_gone(resource, token, lower, revision, deadline)
                .await
            {
                Ok(()) => {}
                Err(WaitError::TimedOut) => return Err(Refusal::Busy),
                Err(WaitError::Failed(e)) => return Err(unavailable(&e)),
            }
        }
        Ok(permit)
    }
}
