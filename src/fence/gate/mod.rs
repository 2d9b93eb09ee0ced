//! The gate: the check of CONTRACT §3 and the ordered admission of §4.
//!
//! Per resource it keeps the highest token and the writes currently
//! in flight upstream. A request is admitted in three steps:
//!
//! 1. **check**: a token below the highest is stale and refused;
//! 2. **raise**: a higher token is made durable in the fence table, becomes the
//!    highest, and every lower-token write still streaming its body is
//!    told to abort (its body never completes upstream);
//! 3. **barrier**: the request waits until no lower-token write is in flight
//!    (a complete body must be answered first), up to a bound; past the bound
//!    it is refused as busy rather than forwarded where it could be overtaken.
//!
//! A write is then registered in flight and holds a [`Permit`] until its
//! upstream exchange is over. The body stream calls
//! [`Permit::body_complete`] before it lets the last bytes go, which is the
//! point after which an abort can no longer be promised.
//!
//! In cluster mode with owners (`owned.rs`, the default) a replica admits
//! the resources it owns with these same steps, its raises put in etcd
//! under its epoch, and answers the others with the replica that owns
//! them ([`Admission::AtOwner`]), for the proxy to forward to. Without owners (`cluster.rs`) the check, the raise
//! and the barrier are one etcd transaction shared by every replica; the
//! slots then only keep this replica's writes in flight (to abort them)
//! and a hint of the fence.

mod barrier;
mod cluster;
mod outcome;
mod owned;
mod verified;

use barrier::push_entry;
pub use outcome::{Admission, Refusal};
pub use owned::Predecessors;

use super::cluster::{Cluster, Registration, Tenure};
use super::doubt::{Doubts, Touch};
use super::hold::Holds;
use super::table::{FenceTable, TableError};
use crate::metric_names as m;
use dashmap::DashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// How the gate admits, in one place: the gate and the proxy both ask
/// [`Gate::mode`] rather than look at the cluster themselves.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// A single node: its fence file and its own barrier.
    Single,
    /// Cluster mode with owners (`owned.rs`): one replica at a time admits
    /// a resource's writes, the others forward them to it.
    Owners(&'a Arc<Cluster>),
    /// Cluster mode without owners (`cluster.rs`): every write is admitted
    /// in etcd, at any replica.
    PerWrite(&'a Arc<Cluster>),
}

/// Whether the admitted request is tracked in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A write: registered, holds a permit until its upstream exchange ends.
    Write,
    /// A read that carries a token: checked, may raise, waits for older
    /// writes to finish, but is not itself tracked.
    Read,
    /// A write the backend itself refuses once overtaken: it goes with a
    /// condition on the object as admitted (`fence.conditional_writes`) to
    /// a backend the probe found honouring it. Admitted as a write; with
    /// owners, a replica that dies with one in flight leaves its successor
    /// nothing to wait for (`owned.rs`, "Markers").
    Conditioned,
}

impl Kind {
    /// Whether the request is a write (tracked in flight, holds a permit).
    pub fn writes(self) -> bool {
        self != Kind::Read
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Streaming,
    BodyComplete,
    Aborted,
}

struct Entry {
    id: u64,
    token: u64,
    phase: Phase,
    abort: Arc<AbortSignal>,
    /// Admitted as [`Kind::Conditioned`]: the backend refuses it once
    /// overtaken, so it needs no in-flight marker.
    conditioned: bool,
}

#[derive(Default)]
struct SlotState {
    loaded: bool,
    highest: Option<u64>,
    inflight: Vec<Entry>,
    next_id: u64,
    /// Cluster mode with owners: this replica's tenure on the resource.
    owned: Option<owned::Owned>,
    /// Cluster mode with owners: the replica that owns it (and its epoch)
    /// when another does, as last seen.
    elsewhere: Option<(String, i64)>,
    /// Cluster mode with owners: the resource's last owner died with a
    /// write that may land at the backend until then (the quarantine,
    /// counted from this replica's take); nothing newer is admitted
    /// before. Kept across this replica's tenures, and the slot with it.
    landing_until: Option<tokio::time::Instant>,
    /// Cluster mode with owners: that owner is being asked whether it is
    /// alive with nothing in flight (`owned.rs`, `ask_predecessor`), and
    /// has not answered yet.
    asking: bool,
}

#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    /// Serialises loads and durable raises of one resource.
    raising: tokio::sync::Mutex<()>,
    /// Fired whenever an in-flight entry leaves.
    changed: Notify,
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // A panic while holding the lock leaves consistent state (every
        // critical section is a few field updates), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Tells a streaming body to stop.
#[derive(Default)]
pub struct AbortSignal {
    fired: AtomicBool,
    notify: Notify,
}

impl AbortSignal {
    fn fire(&self) {
        self.fired.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// Resolves once the signal has fired.
    pub async fn fired(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_fired() {
                return;
            }
            notified.await;
        }
    }
}

/// An admitted write. Dropping it marks the write finished upstream.
pub struct Permit {
    slot: Arc<Slot>,
    id: u64,
    token: u64,
    abort: Arc<AbortSignal>,
    /// Cluster mode: the write's registration in etcd, deleted on drop.
    shared: Option<Registration>,
    /// Cluster mode with owners: the tenure the write was admitted under.
    tenure: Option<(Arc<Cluster>, Tenure)>,
    /// Cluster mode: failed because this replica's lease may have lapsed.
    lease_lost: AtomicBool,
    /// ETags the write's body must not leave: writes in doubt on its object
    /// expect them (`fence::doubt`, an MD5 body is checked against them).
    guards: Vec<Box<str>>,
}

impl Permit {
    /// Called before the last bytes of the body go upstream. Returns false if
    /// the write was aborted: the caller must then fail the body instead.
    pub fn body_complete(&self) -> bool {
        let mut st = self.slot.lock();
        let raised_past = st.highest.is_some_and(|h| h > self.token);
        let lapsed = self.shared.as_ref().is_some_and(|r| !r.fresh())
            || self
                .tenure
                .as_ref()
                .is_some_and(|(c, t)| !c.tenure_stands(t));
        match st.inflight.iter_mut().find(|e| e.id == self.id) {
            Some(e) if e.phase == Phase::Aborted => false,
            Some(e) if raised_past || lapsed => {
                e.phase = Phase::Aborted;
                self.lease_lost.store(lapsed, Ordering::SeqCst);
                false
            }
            Some(e) => {
                e.phase = Phase::BodyComplete;
                true
            }
            None => false,
        }
    }

    /// Whether the backend was given the whole body: after that, a lost
    /// answer does not mean the write did not happen.
    pub fn body_was_complete(&self) -> bool {
        let st = self.slot.lock();
        st.inflight
            .iter()
            .any(|e| e.id == self.id && e.phase == Phase::BodyComplete)
    }

    pub fn abort_signal(&self) -> Arc<AbortSignal> {
        self.abort.clone()
    }

    pub fn token(&self) -> u64 {
        self.token
    }

    /// Whether the write failed because this replica's cluster lease may
    /// have lapsed (rather than because a newer token came).
    pub fn lease_lost(&self) -> bool {
        self.lease_lost.load(Ordering::SeqCst)
    }

    /// Cluster mode with owners: the epoch of the tenure it was admitted
    /// under.
    pub fn epoch(&self) -> Option<i64> {
        self.tenure.as_ref().map(|(_, t)| t.epoch)
    }

    /// ETags this write must not leave its object with: a write in doubt
    /// there went with `If-Match` one of them (`fence::doubt`).
    pub fn guards(&self) -> &[Box<str>] {
        &self.guards
    }

    /// The resource's highest token now (for the error of an aborted write).
    pub fn highest(&self) -> u64 {
        self.slot.lock().highest.unwrap_or(self.token)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        {
            let mut st = self.slot.lock();
            st.inflight.retain(|e| e.id != self.id);
        }
        m::handles::add_inflight_writes(-1);
        self.slot.changed.notify_waiters();
        // The registration, if any, deletes itself as it drops.
    }
}

/// The fences of every resource, in front of the durable fence table.
///
/// Slots are a cache: the fence table holds every fence, so a slot nobody is
/// using (no write in flight, nobody admitting or loading) can be dropped
/// and loaded again on demand. When more than `max_slots` are cached, the
/// idle ones are dropped, which keeps memory bounded however many distinct
/// resources are written.
pub struct Gate {
    table: Arc<dyn FenceTable>,
    slots: DashMap<String, Arc<Slot>>,
    wait_bound: Duration,
    max_slots: usize,
    ordered: bool,
    /// Cluster mode: the shared fence table and barrier.
    cluster: Option<Arc<Cluster>>,
    /// The object holds of conditional writes (CONTRACT §8).
    holds: Holds,
    /// Cluster mode with owners: resources whose release is in flight.
    releasing: Arc<DashMap<String, ()>>,
    /// Cluster mode with owners: asks a dead-looking owner whether its
    /// writes can still land (`owned.rs`).
    predecessors: std::sync::OnceLock<Arc<dyn owned::Predecessors>>,
    /// Writes that may still land though nobody waits for their answer.
    doubts: Arc<Doubts>,
    /// Cluster mode with owners: stopping, every resource let go; no
    /// resource is taken again (`owned.rs`, `release_all`).
    closing: AtomicBool,
    /// The locks of resources whose raises are verified (`verified.rs`).
    issuers: std::sync::OnceLock<Arc<dyn crate::fence::issued::Issuers>>,
}

/// Default for [`Gate::set_max_slots`].
pub const DEFAULT_MAX_SLOTS: usize = crate::config::DEFAULT_MAX_CACHED_RESOURCES;

impl Gate {
    pub fn new(table: Arc<dyn FenceTable>, wait_bound: Duration) -> Gate {
        Gate {
            table,
            slots: DashMap::new(),
            wait_bound,
            max_slots: DEFAULT_MAX_SLOTS,
            ordered: true,
            cluster: None,
            holds: Holds::new(wait_bound, None),
            releasing: Default::default(),
            predecessors: Default::default(),
            doubts: Arc::new(Doubts::new(None)),
            closing: AtomicBool::new(false),
            issuers: Default::default(),
        }
    }

    /// The writes in doubt, shared with the object holds (set before the
    /// gate is shared).
    pub fn set_doubts(&mut self, doubts: Arc<Doubts>) {
        self.holds.set_doubts(doubts.clone());
        self.doubts = doubts;
    }

    /// Writes that may still land though nobody waits for their answer.
    pub fn doubts(&self) -> &Arc<Doubts> {
        &self.doubts
    }

    /// The object holds: where a conditional write's check and write
    /// become one step, on this replica or across all of them.
    pub fn holds(&self) -> &Holds {
        &self.holds
    }

    pub fn holds_mut(&mut self) -> &mut Holds {
        &mut self.holds
    }

    /// How many resources' slots are cached before idle ones are dropped.
    pub fn set_max_slots(&mut self, max: usize) {
        self.max_slots = max.max(1);
    }

    /// Slots cached now (for tests and metrics).
    pub fn cached_slots(&self) -> usize {
        self.slots.len()
    }

    /// Drops every idle slot. A slot is idle when the map holds its only
    /// reference: a permit, a waiting admission and a load each hold one,
    /// and a new reference can only be taken under the shard lock that
    /// `retain` holds while it looks, so nothing is dropped in use.
    /// (With owners, an evicted resource owned here is let go.)
    fn evict_idle(&self) {
        self.drop_slots(|s| Arc::strong_count(s) == 1);
        metrics::gauge!(m::CACHED_FENCES).set(self.slots.len() as f64);
    }

    /// Debug switch: forward right after the check, without aborting or
    /// waiting for older writes. Unsafe; exists to show what the barrier does.
    pub fn set_ordered(&mut self, ordered: bool) {
        self.ordered = ordered;
    }

    pub fn table(&self) -> &Arc<dyn FenceTable> {
        &self.table
    }

    /// Cluster mode: the replicas' shared state.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// How this gate admits.
    pub fn mode(&self) -> Mode<'_> {
        match &self.cluster {
            None => Mode::Single,
            Some(c) if c.owning => Mode::Owners(c),
            Some(c) => Mode::PerWrite(c),
        }
    }

    /// `admission_wait_ms`: how long a request may wait to be admitted.
    pub fn wait_bound(&self) -> Duration {
        self.wait_bound
    }

    /// The slot of `resource`, made if missing (its fence not loaded).
    fn cached_slot(&self, resource: &str) -> Arc<Slot> {
        match self.slots.get(resource) {
            Some(s) => s.clone(),
            None => {
                let slot = self.slots.entry(resource.to_string()).or_default().clone();
                if self.slots.len() > self.max_slots {
                    self.evict_idle();
                }
                slot
            }
        }
    }

    async fn slot(&self, resource: &str) -> Result<Arc<Slot>, TableError> {
        let slot = self.cached_slot(resource);
        if !slot.lock().loaded {
            let _g = slot.raising.lock().await;
            if !slot.lock().loaded {
                let h = self.table.get(resource).await?;
                let mut st = slot.lock();
                st.highest = h;
                st.loaded = true;
            }
        }
        Ok(slot)
    }

    /// The highest token recorded for `resource`.
    pub async fn highest(&self, resource: &str) -> Result<Option<u64>, TableError> {
        if let Some(c) = &self.cluster {
            // An owner's slot is the fence; any other is a hint.
            if let Some(slot) = self.slots.get(resource).map(|s| s.clone())
                && self.owned_here(c, &slot).is_some()
            {
                return Ok(slot.lock().highest);
            }
            return self.table.get(resource).await;
        }
        Ok(self.slot(resource).await?.lock().highest)
    }

    /// Raises `resource` to at least `token`, durably, aborting lower-token
    /// writes still streaming. Refuses (without change) a token below the
    /// highest. Returns the highest afterwards.
    pub async fn raise(&self, resource: &str, token: u64) -> Result<u64, Refusal> {
        Ok(self.raise_to(resource, token).await?.0)
    }

    /// [`Gate::raise`], also saying whether this call moved the fence (in
    /// cluster mode, false when another replica got there first).
    pub async fn raise_to(&self, resource: &str, token: u64) -> Result<(u64, bool), Refusal> {
        match self.mode() {
            Mode::Owners(c) => return Box::pin(self.raise_anywhere(c, resource, token)).await,
            Mode::PerWrite(c) => return self.raise_per_write(c, resource, token).await,
            Mode::Single => {}
        }
        let slot = self.slot(resource).await?;
        self.raise_slot(&slot, resource, token, None).await
    }

    /// Raises `slot` when `token` is above its fence: in the fence table, or,
    /// for an `owner` (with owners in cluster mode), in etcd under its
    /// epoch.
    async fn raise_slot(
        &self,
        slot: &Slot,
        resource: &str,
        token: u64,
        owner: Option<OwnerTenure<'_>>,
    ) -> Result<(u64, bool), Refusal> {
        let stale = |highest| Refusal::Stale { token, highest };
        let needs_raise = |h: Option<u64>| -> Result<bool, Refusal> {
            match h {
                Some(h) if token < h => Err(stale(h)),
                Some(h) => Ok(token > h),
                None => Ok(true),
            }
        };
        if !needs_raise(slot.lock().highest)? {
            return Ok((token, false));
        }
        let _g = slot.raising.lock().await;
        if !needs_raise(slot.lock().highest)? {
            return Ok((token, false));
        }
        // One process raises a single node's fence table; an owner's fence may
        // also be raised by another replica (the admin API, eager fencing).
        // Boxed: its etcd transaction is a future of several KB that would
        // otherwise size (and be moved with) every request's future, on a
        // single node too.
        let (recorded, put) = match owner {
            Some(o) => Box::pin(self.raise_owned(slot, resource, token, o)).await?,
            None => (self.table.raise(resource, token).await?, true),
        };
        if put {
            metrics::counter!(m::RAISES).increment(1);
        }
        let h = self.note_raise(slot, recorded.max(token));
        if token < h {
            return Err(stale(h));
        }
        Ok((h, put))
    }

    /// The fence of `slot` is at least `token` now: remember it, and tell
    /// every lower-token write still streaming to abort. Returns the
    /// highest known.
    fn note_raise(&self, slot: &Slot, token: u64) -> u64 {
        let mut st = slot.lock();
        let h = st.highest.map_or(token, |h| h.max(token));
        st.highest = Some(h);
        if self.ordered {
            for e in st.inflight.iter_mut() {
                if e.token < h && e.phase == Phase::Streaming {
                    e.phase = Phase::Aborted;
                    e.abort.fire();
                }
            }
        }
        h
    }

    /// Admits a request carrying `token` on `resource` (see the module doc):
    /// here, with a permit for a write, or by the replica owning it. A
    /// write in doubt there lets it through only where the backend orders
    /// the two, which `admit` does not know: [`Gate::admit_touching`] says
    /// what the request does.
    pub async fn admit(
        &self,
        resource: &str,
        token: u64,
        kind: Kind,
    ) -> Result<Admission, Refusal> {
        let touch = match kind {
            Kind::Read => Touch::Read,
            _ => Touch::Other,
        };
        self.admit_touching(resource, token, kind, touch).await
    }

    /// [`Gate::admit`] for a request that does `touch` (`fence::doubt`).
    pub async fn admit_touching(
        &self,
        resource: &str,
        token: u64,
        kind: Kind,
        touch: Touch<'_>,
    ) -> Result<Admission, Refusal> {
        // Boxed: their etcd transactions are futures of several KB, which
        // would otherwise size every request's future, clustered or not.
        match self.mode() {
            Mode::Owners(c) => {
                return Box::pin(self.admit_owned(c, (resource, touch), token, kind)).await;
            }
            Mode::PerWrite(c) => {
                if self.verifies(resource) {
                    let fence = self.table.get(resource).await?;
                    self.verify_raise(resource, token, fence).await?;
                }
                let admitted = Box::pin(self.admit_per_write(c, resource, token, kind, None)).await;
                return admitted.map(|(permit, _)| Admission::Here(permit));
            }
            Mode::Single => {}
        }
        let slot = self.slot(resource).await?;
        if self.verifies(resource) {
            let fence = slot.lock().highest;
            self.verify_raise(resource, token, fence).await?;
        }
        self.raise_slot(&slot, resource, token, None).await?;
        self.barrier(&slot, (resource, touch), token, kind, None)
            .await
            .map(Admission::Here)
    }
}

/// An owner's admission: its cluster and its tenure on the resource.
type OwnerTenure<'a> = (&'a Arc<Cluster>, Tenure);

#[cfg(test)]
pub(crate) mod tests;
