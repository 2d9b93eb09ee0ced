//! The gate in cluster mode: check, raise and barrier through the shared
//! table in etcd ([`crate::fence::cluster`]); the slot keeps this replica's
//! writes in flight so that a raise from anywhere can abort them.

use super::{Admission, Gate, Kind, Permit, Refusal, push_entry};
use crate::fence::cluster::keys::{Outcome, holds_before};
use crate::fence::cluster::{Cluster, Registration, Seen, WaitError};
use crate::fence::hold::ObjectHold;
use crate::metric_names as m;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::watch;

impl Gate {
    /// [`Gate::admit`] for a write that replaces or deletes `object`
    /// without conditions. In cluster mode without owners (and with holds
    /// on), its shared hold on the object is put by the admission's own
    /// transaction (one etcd round trip for both) and returned; elsewhere,
    /// owners included, the hold is `None` and taken apart.
    pub async fn admit_sharing(
        &self,
        resource: &str,
        token: u64,
        object: &str,
    ) -> Result<(Admission, Option<ObjectHold>), Refusal> {
        match &self.cluster {
            Some(c) if self.holds.put_by_admission() => {
                if self.verifies(resource) {
                    let fence = self.table.get(resource).await?;
                    self.verify_raise(resource, token, fence).await?;
                }
                let admitted = self.admit_per_write(c, resource, token, Kind::Write, Some(object));
                let (permit, hold) = Box::pin(admitted).await?;
                Ok((Admission::Here(permit), hold.map(ObjectHold::in_cluster)))
            }
            _ => Ok((self.admit(resource, token, Kind::Write).await?, None)),
        }
    }

    /// Cluster mode: fences, registrations and the barrier are shared
    /// through `cluster`, which is also the fence table.
    pub fn clustered(cluster: Arc<Cluster>, wait_bound: std::time::Duration) -> Gate {
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
    /// the resources with writes in flight here, or owned here, again.
    /// With owners it also acknowledges the raises of resources it owns
    /// (`owned.rs`), and lets idle resources go.
    pub fn follow_cluster(self: &Arc<Self>) {
        let Some(c) = self.cluster.clone() else {
            return;
        };
        let acks = c.owning.then(|| Gate::acknowledger(c.clone()));
        if c.owning {
            self.sweep_idle(c.clone());
        }
        let gate = Arc::downgrade(self);
        let owned_raise = AtomicBool::new(false);
        tokio::spawn(c.follow_raises(move |seen| {
            let Some(gate) = gate.upgrade() else { return };
            match seen {
                Seen::Raised(resource, token) => {
                    if let Some(slot) = gate.slots.get(resource).map(|s| s.clone()) {
                        gate.note_raise(&slot, token);
                        if slot.lock().owned.is_some() {
                            owned_raise.store(true, Ordering::SeqCst);
                        }
                    }
                }
                Seen::Through(revision) => {
                    if let Some(acks) = &acks
                        && owned_raise.swap(false, Ordering::SeqCst)
                    {
                        acks.send_replace(revision);
                    }
                }
                Seen::Gap => {
                    let acks = acks.clone();
                    tokio::spawn(async move { gate.reread_after_gap(acks).await });
                }
            }
        }));
    }

    /// After a gap: the fences of resources busy or owned here read again,
    /// then (with owners) the revision read before them acknowledged.
    async fn reread_after_gap(&self, acks: Option<Arc<watch::Sender<i64>>>) {
        let revision = match (&acks, &self.cluster) {
            (Some(_), Some(c)) => c.revision().await.ok(),
            _ => None,
        };
        self.reread_busy_fences().await;
        if let (Some(acks), Some(revision)) = (acks, revision) {
            acks.send_replace(revision);
        }
    }

    /// Reads again the fence of every resource with a write in flight
    /// here, or owned here.
    async fn reread_busy_fences(&self) {
        let busy: Vec<String> = self
            .slots
            .iter()
            .filter(|s| {
                let st = s.value().lock();
                !st.inflight.is_empty() || st.owned.is_some()
            })
            .map(|s| s.key().clone())
            .collect();
        for r in busy {
            if let (Ok(Some(h)), Some(slot)) = (self.table.get(&r).await, self.slots.get(&r)) {
                self.note_raise(&slot, h);
            }
        }
    }

    pub(super) async fn raise_per_write(
        &self,
        c: &Cluster,
        resource: &str,
        token: u64,
    ) -> Result<(u64, bool), Refusal> {
        let slot = self.cached_slot(resource);
        let deadline = tokio::time::Instant::now() + self.wait_bound;
        match c.admit(resource, token, None, None, deadline).await {
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
    /// writes in flight anywhere; for a write of `object`, also share its
    /// hold), then the wait for those to be gone. Returns the permit of a
    /// write, and the hold it put.
    pub(super) async fn admit_per_write(
        &self,
        c: &Arc<Cluster>,
        resource: &str,
        token: u64,
        kind: Kind,
        object: Option<&str>,
    ) -> Result<(Option<Permit>, Option<Registration>), Refusal> {
        let unavailable = |e: &dyn std::fmt::Display| Refusal::Unavailable(e.to_string());
        let deadline = tokio::time::Instant::now() + self.wait_bound;
        let slot = self.cached_slot(resource);
        let (reg, hold) = match (kind, object) {
            (Kind::Write | Kind::Conditioned, object) => {
                let reg = c.registration(resource, token);
                let hold = object.map(|o| c.hold_key(o).map(|h| (h, o))).transpose();
                let unavailable = |e| unavailable(&e);
                (Some(reg.map_err(unavailable)?), hold.map_err(unavailable)?)
            }
            (Kind::Read, _) => (None, None),
        };
        // On any way out before the permit exists (an error, a refusal,
        // the request dropped), `reg` and `hold` drop and delete their keys.
        let hold_ref = hold.as_ref().map(|(h, o)| (h, *o));
        let outcome = c
            .admit(resource, token, reg.as_ref(), hold_ref, deadline)
            .await
            .map_err(|e| unavailable(&e))?;
        let (raised, lower, holds, revision) = match outcome {
            Outcome::Stale(h) => {
                self.note_raise(&slot, h);
                return Err(Refusal::Stale { token, highest: h });
            }
            Outcome::Admitted {
                raised,
                lower,
                holds,
                revision,
            } => (raised, lower, holds, revision),
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
                Some(push_entry(&slot, &mut st, (token, kind), Some(r), None))
            }
            None => None,
        };
        let waited = |r: Result<(), WaitError>| match r {
            Ok(()) => Ok(()),
            Err(WaitError::TimedOut) => Err(Refusal::Busy),
            Err(WaitError::Failed(e)) => Err(unavailable(&e)),
        };
        if self.ordered && !lower.is_empty() {
            waited(
                c.wait_gone(resource, token, lower, revision, deadline)
                    .await,
            )?;
        }
        let Some((hold, object)) = hold else {
            return Ok((permit, None));
        };
        // The hold shares the object: it follows only the writes that hold
        // it alone and were there first (`fence::cluster::holds`).
        let before = holds_before(&holds, &hold.key, false).map_err(|e| unavailable(&e))?;
        match c.wait_holds_gone(object, before, revision, deadline).await {
            Err(WaitError::TimedOut) => return Err(Refusal::Held(object.to_string())),
            other => waited(other)?,
        }
        Ok((permit, Some(hold)))
    }
}
