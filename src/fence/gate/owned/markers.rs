//! The in-flight markers of the resources owned here. A resource's
//! `owned/<r>` marker in etcd says that its owner may have a write in
//! flight: the next owner, finding it without an owner key, waits out the
//! quarantine (`fence.quarantine_ms`, counted from its take) before it
//! admits. The take puts it. A quiet sweep (every
//! [`QUIET_SWEEP`](super::QUIET_SWEEP)) deletes it, guarded by the epoch,
//! from a resource with no write in flight and none admitted since the sweep
//! before; the next write puts it back before it is admitted (one etcd
//! request, under the slot's `raising` lock, which the sweep holds too).
//! So a steady writer costs etcd nothing, and an owner that dies quiet for
//! a sweep or two leaves no wait. Writes of [`Kind::Conditioned`](crate::fence::gate::Kind::Conditioned), which the
//! backend itself refuses once overtaken, neither need nor keep it.

use super::{Owned, drop_tenure, landing, unavailable};
use crate::fence::cluster::{Cluster, Tenure};
use crate::fence::gate::{Gate, Permit, Refusal, Slot};
use std::sync::Arc;
use tokio::time::Instant;

impl Gate {
    /// Puts the in-flight marker of `slot`'s resource back, under its
    /// `raising` lock (a quiet sweep's deletion is then over), guarded by
    /// `tenure`'s epoch: [`Refusal::TenureLost`] when the tenure is over.
    pub(super) async fn mark(
        &self,
        c: &Cluster,
        slot: &Slot,
        resource: &str,
        tenure: Tenure,
        deadline: Instant,
    ) -> Result<(), Refusal> {
        let _g = slot.raising.lock().await;
        let mine = |o: &Owned| o.tenure == tenure;
        if slot.lock().owned.is_some_and(|o| mine(&o) && o.marked) {
            return Ok(());
        }
        if !c
            .mark(resource, tenure.epoch, deadline)
            .await
            .map_err(unavailable)?
        {
            drop_tenure(slot, tenure);
            return Err(Refusal::TenureLost);
        }
        if let Some(o) = slot.lock().owned.as_mut().filter(|o| mine(o)) {
            // Busy too: the next sweep leaves the marker to the write that
            // asked for it, which is admitted after this returns.
            (o.marked, o.busy) = (true, true);
        }
        Ok(())
    }

    /// A write admitted as [`Kind::Conditioned`](crate::fence::gate::Kind::Conditioned) that goes to the backend
    /// with `If-None-Match: *` after all (its object was absent): a delete
    /// at the next owner would leave that condition true, so the store
    /// would not refuse it once overtaken. It keeps `resource`'s marker from
    /// here on like any write, put back first if a sweep took it.
    pub async fn needs_marker(&self, resource: &str, permit: &Permit) -> Result<(), Refusal> {
        let Some((c, tenure)) = permit.tenure.clone() else {
            return Ok(());
        };
        {
            let mut st = permit.slot.lock();
            let st = &mut *st;
            let Some(e) = st.inflight.iter_mut().find(|e| e.id == permit.id) else {
                return Ok(());
            };
            e.conditioned = false;
            match st.owned.as_mut().filter(|o| o.tenure == tenure) {
                Some(o) if o.marked => {
                    o.busy = true;
                    return Ok(());
                }
                Some(o) => o.busy = true,
                None => return Err(Refusal::TenureLost),
            }
        }
        let deadline = Instant::now() + self.wait_bound;
        self.mark(&c, &permit.slot, resource, tenure, deadline)
            .await
    }

    /// Deletes the in-flight markers of the resources owned here with no
    /// write needing one in flight, nor admitted since the sweep before.
    /// A slot being raised or taken is left for the next sweep.
    pub(super) async fn unmark_quiet(&self, c: &Cluster) {
        let slots: Vec<(String, Arc<Slot>)> = self
            .slots
            .iter()
            .filter(|s| s.value().lock().owned.is_some_and(|o| o.marked))
            .map(|s| (s.key().clone(), s.value().clone()))
            .collect();
        let mut guards = Vec::new();
        let mut quiet = Vec::new();
        for (resource, slot) in &slots {
            let Ok(g) = slot.raising.try_lock() else {
                continue;
            };
            let mut st = slot.lock();
            let needing = landing(&st) || st.inflight.iter().any(|e| !e.conditioned);
            let Some(o) = st.owned.as_mut() else { continue };
            if !std::mem::take(&mut o.busy) && !needing && o.marked {
                // From here a write puts it back first (`try_admit`).
                o.marked = false;
                quiet.push((resource.as_str(), o.tenure.epoch));
                guards.push(g);
            }
        }
        if quiet.is_empty() {
            return;
        }
        // Failed: the markers may still be there, which only makes a
        // successor wait; the next writes put them back anyway.
        if let Err(e) = c.unmark(&quiet).await {
            tracing::debug!("cluster: deleting in-flight markers: {e}");
        }
    }
}
