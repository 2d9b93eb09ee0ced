//! The gate in cluster mode: check, raise and barrier through the shared
//! table in etcd ([`crate::fence::cluster`]); the slot keeps this replica's
//! writes in flight so that a raise from anywhere can abort them.

use super::{Gate, Kind, Permit, Refusal, push_entry};
use crate::fence::cluster::{Cluster, WaitError, keys::Outcome};
use crate::metric_names as m;
use std::sync::Arc;

impl Gate {
    /// Cluster mode: fences, registrations and the barrier are shared
    /// through `cluster`, which is also the store.
    pub fn shared(cluster: Arc<Cluster>, wait_bound: std::time::Duration) -> Gate {
        let mut gate = Gate::new(cluster.clone(), wait_bound);
        gate.cluster = Some(cluster);
        gate
    }

    /// Cluster mode: why this replica cannot admit writes now, if it cannot.
    pub fn not_ready(&self) -> Option<String> {
        self.cluster.as_ref().and_then(|c| c.not_ready())
    }

    /// Cluster mode: follows raises made at every replica for as long as the
    /// process runs, aborting this replica's lower-token writes that are
    /// still streaming.
    pub fn follow_cluster(self: &Arc<Self>) {
        let Some(c) = self.cluster.clone() else {
            return;
        };
        let gate = Arc::downgrade(self);
        tokio::spawn(c.follow_raises(move |resource, token| {
            if let Some(gate) = gate.upgrade()
                && let Some(slot) = gate.slots.get(resource).map(|s| s.clone())
            {
                gate.note_raise(&slot, token);
            }
        }));
    }

    pub(super) async fn raise_shared(
        &self,
        c: &Cluster,
        resource: &str,
        token: u64,
    ) -> Result<u64, Refusal> {
        let slot = self.cached_slot(resource);
        match c.admit(resource, token, None).await {
            Err(e) => Err(Refusal::Unavailable(e.to_string())),
            Ok(Outcome::Stale(h)) => {
                self.note_raise(&slot, h);
                Err(Refusal::Stale { token, highest: h })
            }
            Ok(Outcome::Admitted { raised, .. }) => {
                if raised {
                    metrics::counter!(m::RAISES).increment(1);
                }
                Ok(self.note_raise(&slot, token).max(token))
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
        let outcome = match c.admit(resource, token, reg.as_ref()).await {
            Ok(o) => o,
            Err(e) => {
                // The transaction may have been applied: take the key back.
                if let Some(r) = reg {
                    c.deregister(r.key);
                }
                return Err(unavailable(&e));
            }
        };
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
        // Registered in etcd before it is known here: a raise between the
        // two is caught by `body_complete`, which compares with the highest.
        let permit = reg.map(|r| {
            let mut st = slot.lock();
            push_entry(&slot, &mut st, token, Some((c.clone(), r)))
        });
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
