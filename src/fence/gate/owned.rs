//! The gate in cluster mode with owners (`fence::cluster::owners`): the
//! replica that owns a resource admits it with the single-node steps
//! (check, raise, barrier in its slot), its raises put in etcd under its
//! epoch; for a resource owned elsewhere the admission names its owner
//! ([`Admission::AtOwner`]), for the proxy to forward to. Raises not made
//! by a write (the admin API, eager fencing) at a replica that does not
//! own the resource go to etcd and wait for the owner's acknowledgement.
//!
//! A tenure stands while the replica's lease is fresh. Idle resources are
//! let go (a sweep every [`IDLE_SWEEP`]), as are evicted ones, so that
//! ownership stays bounded like the slots, and a replica that dies leaves
//! few resources waiting for its quarantine.
//!
//! **Markers** (`owned/markers.rs`): a resource's `owned/<r>` marker in
//! etcd says that its owner may have a write in flight.

use super::{Admission, Gate, Kind, OwnerTenure, Refusal, Slot, SlotState};
use crate::fence::cluster::{Cluster, OwnedRaise, Predecessor, Take, Tenure};
use crate::fence::doubt::Touch;
use crate::metric_names as m;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// A resource not admitted for this long (at most twice) is let go.
pub const IDLE_SWEEP: Duration = Duration::from_secs(5);

/// A resource without a write in flight, or one admitted, for this long
/// (at most twice) loses its in-flight marker.
pub const QUIET_SWEEP: Duration = Duration::from_secs(1);

/// How often a successor asks its predecessor (`ask_predecessor`).
pub const ASK_EVERY: Duration = Duration::from_millis(500);

mod markers;

/// How the gate asks another replica whether anything of its own can still
/// land on a resource (the proxy's peer connections answer it).
pub trait Predecessors: Send + Sync {
    /// True only when `replica`, reached at `url`, says so.
    fn nothing_landing(
        &self,
        url: &str,
        replica: &str,
        resource: &str,
    ) -> futures_util::future::BoxFuture<'static, bool>;
}

/// This replica's ownership of a slot's resource.
#[derive(Clone, Copy, Debug)]
pub(super) struct Owned {
    pub tenure: Tenure,
    /// Admitted since the last idle sweep.
    pub touched: bool,
    /// The `owned/<r>` marker may be in etcd: put by the take or by
    /// [`Gate::mark`]; false from the moment a quiet sweep decides to
    /// delete it (a write must then put it back first).
    pub marked: bool,
    /// A write needing the marker was admitted since the last quiet sweep.
    pub busy: bool,
}

/// Whether a dead predecessor's write may still land (its quarantine is
/// not over): then the marker is neither deleted nor released.
fn landing(st: &SlotState) -> bool {
    st.landing_until.is_some_and(|at| at > Instant::now())
}

/// Whether a write of this replica's on the slot's resource may still
/// land (one in flight, conditioned or not: one whose answer was lost
/// keeps its entry for the quarantine), or a dead predecessor's.
fn may_land(st: &SlotState) -> bool {
    landing(st) || !st.inflight.is_empty()
}

/// Notes a predecessor's answer on `slot`: the quarantine that ends at
/// `until` ends now when it said `clear`. True when it did end.
fn answered(slot: &Slot, clear: bool, until: Instant) -> bool {
    let mut st = slot.lock();
    st.asking = false;
    let ends = clear && st.landing_until == Some(until);
    if ends {
        st.landing_until = None;
    }
    ends
}

/// Forgets `tenure` on `slot`, unless a newer one has replaced it.
fn drop_tenure(slot: &Slot, tenure: Tenure) {
    let mut st = slot.lock();
    if st.owned.is_some_and(|o| o.tenure == tenure) {
        st.owned = None;
    }
}

/// Who owns a resource, as [`Gate::own`] found it.
enum Owning {
    /// This replica, in this tenure, with the resource's slot.
    Here(Arc<Slot>, Tenure),
    /// Another replica (its name), at this epoch.
    By(String, i64),
}

fn unavailable(e: impl std::fmt::Display) -> Refusal {
    Refusal::Unavailable(e.to_string())
}

impl Gate {
    /// Admission by the owner; the resource taken first if nobody owns it.
    pub(super) async fn admit_owned(
        &self,
        c: &Arc<Cluster>,
        (resource, touch): (&str, Touch<'_>),
        token: u64,
        kind: Kind,
    ) -> Result<Admission, Refusal> {
        let deadline = Instant::now() + self.wait_bound;
        loop {
            let (slot, tenure) = match self.own(c, resource, deadline).await? {
                Owning::Here(slot, tenure) => (slot, tenure),
                Owning::By(replica, epoch) => return Ok(Admission::AtOwner(replica, epoch)),
            };
            let owner = Some((c, tenure));
            if self.verifies(resource) {
                let fence = slot.lock().highest;
                self.verify_raise(resource, token, fence).await?;
            }
            let admitted = match self.raise_slot(&slot, resource, token, owner).await {
                Ok(_) => {
                    self.barrier(&slot, (resource, touch), token, kind, owner)
                        .await
                }
                Err(e) => Err(e),
            };
            match admitted {
                Err(Refusal::TenureLost) if Instant::now() < deadline => drop_tenure(&slot, tenure),
                Err(Refusal::Unmarked) => {
                    match self.mark(c, &slot, resource, tenure, deadline).await {
                        Err(Refusal::TenureLost) if Instant::now() >= deadline => {
                            return Err(Refusal::TenureLost);
                        }
                        Ok(()) | Err(Refusal::TenureLost) => {}
                        Err(e) => return Err(e),
                    }
                }
                other => return other.map(Admission::Here),
            }
        }
    }

    /// Forgets which replica owns `resource` (a request forwarded there
    /// was not admitted, or it did not answer): the next request asks etcd.
    pub fn forget_owner(&self, resource: &str) {
        if let Some(slot) = self.slots.get(resource) {
            slot.lock().elsewhere = None;
        }
    }

    /// The epoch of this replica's standing ownership of `resource`.
    pub fn owner_epoch(&self, resource: &str) -> Option<i64> {
        let c = self.cluster.as_ref()?;
        let slot = self.slots.get(resource)?.clone();
        self.owned_here(c, &slot).map(|o| o.tenure.epoch)
    }

    /// This replica's standing ownership of `slot`, if any. One that lapsed
    /// with the lease is kept (not standing) while etcd may yet answer that
    /// the lease stood all along: it stands again then, and a request
    /// forwarded here at its epoch is admitted rather than `Moved`.
    pub(super) fn owned_here(&self, c: &Cluster, slot: &Slot) -> Option<Owned> {
        let mut st = slot.lock();
        match st.owned {
            Some(o) if c.tenure_stands(&o.tenure) => Some(o),
            Some(o) if c.tenure_may_return(&o.tenure) => None,
            Some(_) => {
                st.owned = None;
                None
            }
            None => None,
        }
    }

    /// The slot of `resource`, owned here: taken if nobody owns it, and
    /// ready (its predecessor's quarantine over); or the replica that owns
    /// it.
    async fn own(
        &self,
        c: &Arc<Cluster>,
        resource: &str,
        deadline: Instant,
    ) -> Result<Owning, Refusal> {
        let slot = self.cached_slot(resource);
        loop {
            if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(unavailable("this replica is stopping"));
            }
            if let Some(o) = self.owned_here(c, &slot) {
                match landing_wait(&slot, deadline)? {
                    Some(until) => tokio::time::sleep_until(until).await,
                    None => return Ok(Owning::Here(slot, o.tenure)),
                }
                continue;
            }
            // The owner seen last, while its lease stands: no etcd.
            let seen = slot.lock().elsewhere.clone();
            if let Some((replica, epoch)) = seen
                && !c.is_departed(&replica)
            {
                return Ok(Owning::By(replica, epoch));
            }
            let guard = slot.raising.lock().await;
            if self.owned_here(c, &slot).is_some() {
                continue;
            }
            let leaving = self.releasing.contains_key(resource);
            match c
                .take(resource, leaving, deadline)
                .await
                .map_err(unavailable)?
            {
                Take::Mine {
                    tenure,
                    highest,
                    after_death,
                } => self.took(c, &slot, resource, tenure, highest, after_death),
                Take::Theirs(replica, epoch) => {
                    slot.lock().elsewhere = Some((replica.clone(), epoch));
                    return Ok(Owning::By(replica, epoch));
                }
                // Nothing of this replica's in flight there: no write of
                // the old tenure can land any more (a dead predecessor's
                // still may: its marker stays then).
                Take::Stale(epoch, inherited) if slot.lock().inflight.is_empty() => {
                    let keep = inherited || landing(&slot.lock());
                    let released = c.release(resource, epoch, keep).await;
                    released.map_err(unavailable)?;
                }
                Take::Stale(..) | Take::Leaving => {
                    drop(guard);
                    if Instant::now() >= deadline {
                        return Err(Refusal::Busy);
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// `resource` was taken here (`Take::Mine`): its slot owned under
    /// `tenure`, and, after a dead owner, waiting out its quarantine while
    /// its predecessor is asked whether anything of its was in flight.
    fn took(
        &self,
        c: &Arc<Cluster>,
        slot: &Arc<Slot>,
        resource: &str,
        tenure: Tenure,
        highest: Option<u64>,
        after_death: Option<Predecessor>,
    ) {
        metrics::counter!(m::CLUSTER_TAKES).increment(1);
        let mut st = slot.lock();
        st.highest = st.highest.max(highest);
        st.loaded = true;
        st.elsewhere = None;
        if let Some(dead) = after_death {
            let until = Instant::now() + c.expired_hold();
            st.landing_until = st.landing_until.max(Some(until));
            st.asking = self.ask_predecessor(c, slot, resource, dead, until);
        }
        st.owned = Some(Owned {
            tenure,
            touched: true,
            marked: true,
            busy: false,
        });
    }

    /// While `slot` waits out a dead predecessor's quarantine (`until`),
    /// asks that replica every [`ASK_EVERY`] whether anything of its own
    /// can still land on `resource`: a replica that was only paused or cut
    /// off from etcd, and answers that nothing is in flight there, ends
    /// the wait. A replica killed and not restarted never answers, and the
    /// wait runs its course; one restarted on its data directory has
    /// another name, and answers for its predecessor from the landing
    /// record (`nothing_landing`). True when it asks (the caller,
    /// holding the slot's lock, marks it `asking`).
    fn ask_predecessor(
        &self,
        c: &Cluster,
        slot: &Arc<Slot>,
        resource: &str,
        dead: Predecessor,
        until: Instant,
    ) -> bool {
        let (Some(ask), Some(url)) = (self.predecessors.get().cloned(), dead.url) else {
            return false;
        };
        if dead.replica == c.replica_name() {
            return false;
        }
        let (slot, resource) = (Arc::downgrade(slot), resource.to_string());
        tokio::spawn(async move {
            while Instant::now() < until {
                let clear = ask.nothing_landing(&url, &dead.replica, &resource).await;
                let Some(slot) = slot.upgrade() else { return };
                if answered(&slot, clear, until) {
                    tracing::info!(
                        resource,
                        previous = dead.replica,
                        "cluster: the previous owner, alive, has nothing in flight here: \
                         its quarantine ends now"
                    );
                }
                if clear {
                    return;
                }
                tokio::time::sleep(ASK_EVERY).await;
            }
        });
        true
    }

    /// Whether nothing of this replica's can still land on `resource`,
    /// asked by a successor about `replica` (`ask_predecessor`): this is
    /// that replica, it holds no standing tenure there, and no write of
    /// its own (conditioned or not) is in flight there (a write whose
    /// outcome is unknown keeps its entry for the quarantine; a tenure that
    /// no longer stands admits nothing more: `try_admit`). Or `replica` is
    /// the process that used this data directory before, and none of its
    /// writes in doubt (from the landing record) may still land there
    /// (`Doubts::unordered_on`).
    pub fn nothing_landing(&self, replica: &str, resource: &str) -> bool {
        let Some(c) = &self.cluster else { return false };
        if replica != c.replica_name() {
            // This data directory's process before, which died: the
            // landing record says what of its own may still land.
            return c.previous_name() == Some(replica) && !self.doubts.unordered_on(resource);
        }
        let Some(slot) = self.slots.get(resource).map(|s| s.clone()) else {
            return true;
        };
        if self.owned_here(c, &slot).is_some() {
            return false;
        }
        // Conditioned writes count too, and writes in doubt: the store
        // refuses one only on its own object, and may still apply it.
        !may_land(&slot.lock()) && !self.doubts.on(resource)
    }

    /// Lets the gate ask a dead-looking owner whether its writes can still
    /// land (`ask_predecessor`); set once, by the proxy.
    pub fn set_predecessors(&self, ask: Arc<dyn Predecessors>) {
        let _ = self.predecessors.set(ask);
    }

    /// The owner's durable raise ([`Gate::raise_slot`]): the fence it
    /// recorded and whether this raise put it, or [`Refusal::TenureLost`] when
    /// its tenure is over.
    pub(super) async fn raise_owned(
        &self,
        slot: &Slot,
        resource: &str,
        token: u64,
        (c, tenure): OwnerTenure<'_>,
    ) -> Result<(u64, bool), Refusal> {
        let deadline = Instant::now() + self.wait_bound;
        match c.raise_owned(resource, token, tenure, deadline).await {
            Err(e) => Err(unavailable(e)),
            Ok(OwnedRaise::At { put }) => Ok((token, put)),
            Ok(OwnedRaise::Above(h)) => Ok((h, false)),
            Ok(OwnedRaise::Lost) => {
                drop_tenure(slot, tenure);
                Err(Refusal::TenureLost)
            }
        }
    }

    /// A raise not made by a write: by the owner if that is this replica;
    /// else in etcd, acknowledged by the owner before it is done.
    pub(super) async fn raise_anywhere(
        &self,
        c: &Arc<Cluster>,
        resource: &str,
        token: u64,
    ) -> Result<(u64, bool), Refusal> {
        let deadline = Instant::now() + self.wait_bound;
        let slot = self.cached_slot(resource);
        if let Some(o) = self.owned_here(c, &slot) {
            match self
                .raise_slot(&slot, resource, token, Some((c, o.tenure)))
                .await
            {
                Err(Refusal::TenureLost) => {}
                other => return other,
            }
        }
        let r = c
            .raise_unowned(resource, token, deadline)
            .await
            .map_err(unavailable)?;
        self.note_raise(&slot, r.highest);
        if r.highest > token {
            return Err(Refusal::Stale {
                token,
                highest: r.highest,
            });
        }
        if r.raised {
            metrics::counter!(m::RAISES).increment(1);
        }
        if let Some((owner, epoch)) = &r.owner {
            c.wait_acknowledged(resource, (owner, *epoch), r.revision, deadline)
                .await
                .map_err(unavailable)?;
        }
        Ok((r.highest, r.raised))
    }

    /// Drops the slots `drop` picks, and lets go of those owned here. The
    /// release is marked in `releasing` under the map's shard lock, so a
    /// take that comes after the slot left waits for it.
    /// A slot whose resource a dead predecessor's write may still reach
    /// is kept: what it knows of that is nowhere else here.
    pub(super) fn drop_slots(&self, mut drop: impl FnMut(&Arc<Slot>) -> bool) {
        let mut owned = Vec::new();
        self.slots.retain(|r, s| {
            // Its own statement: `drop` may lock the slot too.
            let landing_now = landing(&s.lock());
            if landing_now || !drop(s) {
                return true;
            }
            if let Some(o) = s.lock().owned {
                self.releasing.insert(r.clone(), ());
                owned.push((r.clone(), o.tenure.epoch));
            }
            false
        });
        let Some(c) = &self.cluster else { return };
        for (resource, epoch) in owned {
            let (c, releasing) = (c.clone(), self.releasing.clone());
            tokio::spawn(async move {
                if let Err(e) = c.release(&resource, epoch, false).await {
                    tracing::warn!("cluster: letting {resource} go: {e}");
                }
                releasing.remove(&resource);
            });
        }
    }

    /// Lets go of the resources owned here, not admitted since the last
    /// sweep, and idle now.
    fn release_idle(&self) {
        self.drop_slots(|s| {
            let mut st = s.lock();
            match st.owned.as_mut() {
                None => false,
                Some(o) => !std::mem::take(&mut o.touched) && Arc::strong_count(s) == 1,
            }
        });
    }

    /// Lets go of every resource owned here (at shutdown). From here on
    /// this replica takes no resource, and its tenures end here before
    /// their keys go: a connection still open admits nothing more (its
    /// lease alone would still say the tenure stands).
    pub async fn release_all(&self) {
        let Some(c) = &self.cluster else { return };
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let owned: Vec<(String, i64, bool)> = self
            .slots
            .iter()
            .filter_map(|s| {
                let mut st = s.value().lock();
                let epoch = st.owned.take()?.tenure.epoch;
                let keep = may_land(&st) || self.doubts.unordered_on(s.key());
                Some((s.key().clone(), epoch, keep))
            })
            .collect();
        // A write of this replica's still in flight (one whose answer was
        // lost holds its permit for the quarantine), or a dead
        // predecessor's, may still land: the marker stays, and the next
        // owner waits.
        for (r, epoch, keep) in owned {
            if let Err(e) = c.release(&r, epoch, keep).await {
                tracing::warn!("cluster: letting {r} go at shutdown: {e}");
            }
        }
    }

    /// Cluster mode with owners: puts the revision up to which this
    /// replica has applied raises (`seen/<replica>`) whenever the channel
    /// returned gets a new one, for as long as the process runs.
    pub(super) fn acknowledger(c: Arc<Cluster>) -> Arc<watch::Sender<i64>> {
        let (acks, mut acked) = watch::channel(0i64);
        tokio::spawn(async move {
            while acked.changed().await.is_ok() {
                let revision = *acked.borrow_and_update();
                // Until it is put, or a later revision is to be.
                while let Err(e) = c.acknowledge(revision).await {
                    tracing::debug!("cluster: acknowledging raises: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if acked.has_changed().unwrap_or(true) {
                        break;
                    }
                }
            }
        });
        Arc::new(acks)
    }

    /// Cluster mode with owners: deletes quiet resources' markers every
    /// [`QUIET_SWEEP`] and lets idle resources go every [`IDLE_SWEEP`],
    /// for as long as the gate lives.
    pub(super) fn sweep_idle(self: &Arc<Self>, c: Arc<Cluster>) {
        let gate = Arc::downgrade(self);
        let every = (IDLE_SWEEP.as_millis() / QUIET_SWEEP.as_millis()).max(1);
        tokio::spawn(async move {
            for n in 1u128.. {
                tokio::time::sleep(QUIET_SWEEP).await;
                let Some(gate) = gate.upgrade() else { return };
                if n % every == 0 {
                    gate.release_idle();
                }
                gate.unmark_quiet(&c).await;
            }
        });
    }
}

/// Whether a slot owned here may admit now: `None` when it may; the
/// instant to look again while a dead predecessor's quarantine runs; a
/// refusal when that quarantine outlasts `deadline`.
fn landing_wait(slot: &Slot, deadline: Instant) -> Result<Option<Instant>, Refusal> {
    let (landing, asking) = {
        let st = slot.lock();
        (st.landing_until, st.asking)
    };
    let now = Instant::now();
    match landing {
        // The dead-looking owner is being asked whether it is alive with
        // nothing in flight: its first answer (at most `PING_WAIT`) is
        // worth the wait.
        Some(at) if at > deadline && asking => match now >= deadline {
            true => Err(Refusal::Landing(at - now)),
            false => Ok(Some(now + Duration::from_millis(20))),
        },
        // Past the wait: refused at once (nothing was done), rather than
        // held until the wait runs out.
        Some(at) if at > deadline => Err(Refusal::Landing(at - now)),
        Some(at) if at > now => Ok(Some(at)),
        _ => Ok(None),
    }
}
