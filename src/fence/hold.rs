//! The object hold (CONTRACT §8): the writes to one object, serialized
//! where a condition needs it.
//!
//! A conditional write (`If-None-Match: *`, `If-Match`, a conditional
//! DeleteObject or DeleteObjects key) looks at the object as it is, then
//! writes. For the look and the write to be one step, nothing else may land
//! on the object in between, conditional or not. So every write that
//! changes what an object is (PutObject, CopyObject's destination,
//! CompleteMultipartUpload, DeleteObject, each key of DeleteObjects) holds
//! its object from before the look until its upstream exchange is over:
//!
//! - a conditional write holds it alone ([`Mode::Alone`]);
//! - an unconditional write shares it with other unconditional writes
//!   ([`Mode::Shared`]), so those still go on side by side, as they would
//!   without fencegate, but never while a conditional write holds it.
//!
//! Unconditional writes are nearly every write, so sharing must cost next
//! to nothing: objects hash to one of [`STRIPES`] stripes, and an
//! unconditional write only counts itself in its object's stripe (an
//! atomic add and, when done, a subtract, with two loads of the stripe's
//! conditional count around the add; no allocation, no table entry). A
//! conditional write announces itself in the stripe, which turns newer unconditional writes
//! there away to wait, waits until the stripe's count is zero, then takes
//! its object's own lock (a table entry that lives while someone holds or
//! waits for it), since other conditional writes in the stripe go on
//! beside it. Objects that merely share a stripe wait for each other at
//! most for one conditional write's duration.
//!
//! Deadlock: a request takes its stripes in stripe order, and in a stripe
//! first the announcement, then the object locks in name order, so whoever
//! waits holds only what comes before. A request that writes several
//! objects of one stripe (DeleteObjects) counts itself there once; if one
//! of them is conditional, it holds all of them there alone. A wait longer
//! than `admission_wait_ms` ends in `503 SlowDown`.
//!
//! In cluster mode the hold is a key in etcd instead, under the replica's
//! lease (`cluster/holds.rs`), so that it spans the replicas; except, with
//! owners, for the objects of fenced resources: every write to those
//! reaches the resource's owner, so their holds are the owner's, here.

use super::cluster::{Cluster, Registration, WaitError};
use super::doubt::Doubts;
use dashmap::DashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::time::Duration;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard};
use tokio::time::Instant;

/// Stripes objects hash to: a conditional write makes unconditional
/// writes to the other objects of its stripe wait, so there are many.
pub const STRIPES: usize = 1 << 14;

/// How a write holds its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// An unconditional write: beside other unconditional writes.
    Shared,
    /// A conditional write: alone, from its look at the object to its end.
    Alone,
}

/// Whose an object's hold is, which says where it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The owner of the object's resource, which is this replica: every
    /// write of the object reaches it, so the hold is in this process.
    ThisOwner,
    /// Whichever replica the write reached: in cluster mode the hold is in
    /// etcd, shared by the replicas; on a single node, in this process.
    AnyReplica,
}

/// Why an object could not be held.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error("other writes to {0} are still in progress")]
    Busy(String),
    #[error("the shared hold table cannot be reached: {0}")]
    Unavailable(String),
    /// A write to the object whose outcome is unknown may still land for
    /// this long, past the wait (`fence::doubt`).
    #[error("an earlier write to {0} whose outcome is unknown may still land for {1:?}")]
    InDoubt(String, Duration),
}

/// An object as the hold names it: `bucket/key` (a bucket name has no
/// `/`, so the first one ends it).
pub fn object_name(bucket: &str, key: &str) -> String {
    let mut s = String::with_capacity(bucket.len() + 1 + key.len());
    s.push_str(bucket);
    s.push('/');
    s.push_str(key);
    s
}

#[derive(Default)]
struct Stripe {
    /// Unconditional writes holding an object of this stripe.
    shared: AtomicU32,
    /// Conditional writes holding, or waiting to hold, objects of it.
    alone: AtomicU32,
    /// Woken when `shared` or `alone` comes down to zero.
    changed: Notify,
}

impl Stripe {
    /// Counts an unconditional write in, unless a conditional one is
    /// announced. Both sides write their own count, then read the other's
    /// (all sequentially consistent), so at least one sees the other.
    fn try_share(&self) -> bool {
        if self.alone.load(SeqCst) != 0 {
            return false;
        }
        self.shared.fetch_add(1, SeqCst);
        if self.alone.load(SeqCst) == 0 {
            return true;
        }
        self.unshare();
        false
    }

    fn unshare(&self) {
        if self.shared.fetch_sub(1, SeqCst) == 1 {
            self.changed.notify_waiters();
        }
    }

    fn unannounce(&self) {
        if self.alone.fetch_sub(1, SeqCst) == 1 {
            self.changed.notify_waiters();
        }
    }

    /// Waits until `ready` holds (checked again after every change), up
    /// to `deadline`.
    async fn wait_until(&self, deadline: Instant, ready: impl Fn(&Stripe) -> bool) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if ready(self) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return ready(self);
            }
        }
    }
}

struct Table {
    stripes: Box<[Stripe]>,
    /// Objects held alone, or waited for, and their locks.
    objects: DashMap<String, Arc<Mutex<()>>>,
    hasher: std::hash::RandomState,
}

impl Table {
    /// The stripe of `bucket/key`, hashed without building the name.
    fn stripe_of_parts(&self, bucket: &str, key: &str) -> u32 {
        let mut h = self.hasher.build_hasher();
        h.write(bucket.as_bytes());
        h.write_u8(b'/');
        h.write(key.as_bytes());
        (h.finish() % STRIPES as u64) as u32
    }

    /// The stripe of an [`object_name`].
    fn stripe_of(&self, object: &str) -> u32 {
        let (bucket, key) = object.split_once('/').unwrap_or((object, ""));
        self.stripe_of_parts(bucket, key)
    }
}

/// One object's lock, held by a conditional write. Dropping it removes the
/// table entry when nobody else holds or waits for it: a new reference is
/// only ever taken under the shard lock `remove_if` holds while it counts.
struct ObjectLock {
    table: Arc<Table>,
    name: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for ObjectLock {
    fn drop(&mut self) {
        self.guard = None;
        self.table
            .objects
            .remove_if(&self.name, |_, lock| Arc::strong_count(lock) == 1);
    }
}

/// A stripe a request counts itself in (shared) or is announced in (alone).
struct StripeHold {
    table: Arc<Table>,
    stripe: u32,
    alone: bool,
}

impl Drop for StripeHold {
    fn drop(&mut self) {
        let s = &self.table.stripes[self.stripe as usize];
        if self.alone {
            s.unannounce();
        } else {
            s.unshare();
        }
    }
}

/// A write's hold on its objects, let go when dropped. It travels with
/// the upstream exchange, as the gate's permits do, and is kept for the
/// quarantine when the exchange's outcome is unknown.
pub struct ObjectHold {
    // Field order is drop order: the object locks before the stripes.
    locks: Vec<ObjectLock>,
    /// The one stripe of a single object (no allocation for it).
    stripe: Option<StripeHold>,
    /// The others, when a request writes objects of several stripes.
    stripes: Vec<StripeHold>,
    shared: Vec<Registration>,
    /// The backend was given the whole body (or a body-less request went).
    sent: AtomicBool,
}

impl ObjectHold {
    /// A hold of nothing (a request that changes no object).
    pub fn none() -> ObjectHold {
        ObjectHold {
            locks: Vec::new(),
            stripe: None,
            stripes: Vec::new(),
            shared: Vec::new(),
            sent: AtomicBool::new(false),
        }
    }

    /// Cluster mode: the shared hold a write's admission put in etcd
    /// together with its registration (`Gate::admit_sharing`).
    pub fn in_cluster(hold: Registration) -> ObjectHold {
        let mut held = ObjectHold::none();
        held.shared.push(hold);
        held
    }

    pub fn is_empty(&self) -> bool {
        self.stripe.is_none() && self.shared.is_empty()
    }

    /// Adds what `other` holds to this hold.
    pub fn merge(&mut self, mut other: ObjectHold) {
        self.locks.append(&mut other.locks);
        if let Some(s) = other.stripe.take() {
            self.push(s);
        }
        for s in other.stripes.drain(..) {
            self.push(s);
        }
        self.shared.append(&mut other.shared);
    }

    fn push(&mut self, s: StripeHold) {
        match self.stripe {
            None => self.stripe = Some(s),
            Some(_) => self.stripes.push(s),
        }
    }

    /// Called before the last bytes of the write go upstream. In cluster
    /// mode, false when this replica's lease may have lapsed: another
    /// replica may then hold the object, and the write must not complete.
    pub fn body_complete(&self) -> bool {
        if !self.shared.iter().all(Registration::fresh) {
            return false;
        }
        self.sent.store(true, SeqCst);
        true
    }

    /// Whether the backend was given the whole request: after that, a lost
    /// answer does not mean the write did not happen.
    pub fn body_was_complete(&self) -> bool {
        self.sent.load(SeqCst)
    }
}

/// Every object held now, on this replica or (in cluster mode) on all.
pub struct Holds {
    table: Arc<Table>,
    wait: Duration,
    cluster: Option<Arc<Cluster>>,
    /// Debug switch: hold nothing (`FENCEGATE_UNSAFE_NO_HOLD=1`).
    off: bool,
    /// Writes in doubt: each holds its object, as it did in flight, until
    /// its quarantine ends or the backend orders what comes after it.
    doubts: Option<Arc<Doubts>>,
}

impl Holds {
    pub fn new(wait: Duration, cluster: Option<Arc<Cluster>>) -> Holds {
        let stripes = (0..STRIPES).map(|_| Stripe::default()).collect();
        Holds {
            table: Arc::new(Table {
                stripes,
                objects: DashMap::new(),
                hasher: std::hash::RandomState::new(),
            }),
            wait,
            cluster,
            off: false,
            doubts: None,
        }
    }

    /// The writes in doubt that hold objects (`Gate::set_doubts`).
    pub fn set_doubts(&mut self, doubts: Arc<Doubts>) {
        self.doubts = Some(doubts);
    }

    /// The doubts, when any is held now.
    fn in_doubt(&self) -> Option<&Doubts> {
        self.doubts.as_deref().filter(|d| d.any())
    }

    /// Debug switch: hold nothing, so that a conditional write's check and
    /// write are two steps again. Unsafe; exists to show what the hold does.
    pub fn set_off(&mut self, off: bool) {
        self.off = off;
    }

    /// Cluster mode without owners: whether a fenced write's shared hold
    /// is put by its admission, in the same etcd transaction, rather than
    /// by a transaction of its own.
    pub fn put_by_admission(&self) -> bool {
        !self.off && self.cluster.as_ref().is_some_and(|c| !c.owning)
    }

    /// Objects held alone or waited for in this process now (tests).
    pub fn entries(&self) -> usize {
        self.table.objects.len()
    }

    /// The unconditional write's way: shares `bucket/key` at once, without
    /// waiting, when nothing conditional is in its stripe. `None`: take
    /// [`Holds::hold`].
    pub fn try_share(&self, bucket: &str, key: &str, holder: Holder) -> Option<ObjectHold> {
        if self.off {
            return Some(ObjectHold::none());
        }
        if self.cluster.is_some() && holder == Holder::AnyReplica {
            return None;
        }
        if let Some(d) = self.in_doubt()
            && d.holds(&object_name(bucket, key), false, false).is_some()
        {
            return None;
        }
        let stripe = self.table.stripe_of_parts(bucket, key);
        if !self.table.stripes[stripe as usize].try_share() {
            return None;
        }
        let mut held = ObjectHold::none();
        held.stripe = Some(StripeHold {
            table: self.table.clone(),
            stripe,
            alone: false,
        });
        Some(held)
    }

    /// Holds every object of `objects` (names from [`object_name`]); an
    /// object named twice is held once, alone if either asks for that.
    /// Gives up after `admission_wait_ms`.
    pub async fn hold(
        &self,
        objects: Vec<(String, Mode)>,
        holder: Holder,
    ) -> Result<ObjectHold, HoldError> {
        self.hold_judged(objects, holder, false).await
    }

    /// [`Holds::hold`], where `judged` says whether the backend is sent
    /// the conditions of the writes held alone, and judges them when it
    /// applies them: a write in doubt on the object then lets them by.
    pub async fn hold_judged(
        &self,
        objects: Vec<(String, Mode)>,
        holder: Holder,
        judged: bool,
    ) -> Result<ObjectHold, HoldError> {
        if self.off || objects.is_empty() {
            return Ok(ObjectHold::none());
        }
        let deadline = Instant::now() + self.wait;
        if let Some(d) = self.in_doubt() {
            for (name, mode) in &objects {
                while let Some(until) = d.holds(name, *mode == Mode::Alone, judged) {
                    if until > deadline {
                        let left = until - Instant::now();
                        return Err(HoldError::InDoubt(name.clone(), left));
                    }
                    tokio::time::sleep_until(until).await;
                }
            }
        }
        match &self.cluster {
            Some(c) if holder == Holder::AnyReplica => hold_in_etcd(c, objects, deadline).await,
            _ => self.hold_here(objects, deadline).await,
        }
    }

    async fn hold_here(
        &self,
        objects: Vec<(String, Mode)>,
        deadline: Instant,
    ) -> Result<ObjectHold, HoldError> {
        let t = &self.table;
        let mut plan: Vec<(u32, String, Mode)> = objects
            .into_iter()
            .map(|(name, mode)| (t.stripe_of(&name), name, mode))
            .collect();
        plan.sort();
        let mut held = ObjectHold::none();
        let mut i = 0;
        while i < plan.len() {
            let stripe = plan[i].0;
            let end = plan[i..]
                .iter()
                .position(|p| p.0 != stripe)
                .map_or(plan.len(), |n| i + n);
            let here = &plan[i..end];
            if here.iter().any(|p| p.2 == Mode::Alone) {
                let mut names: Vec<&str> = here.iter().map(|p| p.1.as_str()).collect();
                names.dedup();
                self.hold_alone(stripe, &names, deadline, &mut held).await?;
            } else {
                self.hold_shared(stripe, &here[0].1, deadline, &mut held)
                    .await?;
            }
            i = end;
        }
        Ok(held)
    }

    /// Counts the request in `stripe`, waiting while a conditional write
    /// is announced there.
    async fn hold_shared(
        &self,
        stripe: u32,
        name: &str,
        deadline: Instant,
        held: &mut ObjectHold,
    ) -> Result<(), HoldError> {
        let s = &self.table.stripes[stripe as usize];
        while !s.try_share() {
            if !s.wait_until(deadline, |s| s.alone.load(SeqCst) == 0).await {
                return Err(HoldError::Busy(name.to_string()));
            }
        }
        held.push(StripeHold {
            table: self.table.clone(),
            stripe,
            alone: false,
        });
        Ok(())
    }

    /// Announces the request in `stripe`, waits until no unconditional
    /// write holds anything there, then takes the locks of `names`.
    async fn hold_alone(
        &self,
        stripe: u32,
        names: &[&str],
        deadline: Instant,
        held: &mut ObjectHold,
    ) -> Result<(), HoldError> {
        let s = &self.table.stripes[stripe as usize];
        s.alone.fetch_add(1, SeqCst);
        // Counted from here on: dropped on every way out.
        held.push(StripeHold {
            table: self.table.clone(),
            stripe,
            alone: true,
        });
        let busy = || HoldError::Busy(names[0].to_string());
        if !s.wait_until(deadline, |s| s.shared.load(SeqCst) == 0).await {
            return Err(busy());
        }
        for name in names {
            let lock = self
                .table
                .objects
                .entry(name.to_string())
                .or_default()
                .clone();
            let mut object = ObjectLock {
                table: self.table.clone(),
                name: name.to_string(),
                guard: None,
            };
            let guard = tokio::time::timeout_at(deadline, lock.lock_owned()).await;
            object.guard = Some(guard.map_err(|_| busy())?);
            held.locks.push(object);
        }
        Ok(())
    }
}

/// Cluster mode: each object's key in etcd, one at a time in name order.
async fn hold_in_etcd(
    c: &Arc<Cluster>,
    mut objects: Vec<(String, Mode)>,
    deadline: Instant,
) -> Result<ObjectHold, HoldError> {
    objects.sort();
    // Sorted by name, then Shared before Alone: keep the last of each.
    objects.reverse();
    objects.dedup_by(|later, kept| later.0 == kept.0);
    objects.reverse();
    let mut held = ObjectHold::none();
    for (name, mode) in objects {
        match c.hold(&name, mode == Mode::Alone, deadline).await {
            Ok(r) => held.shared.push(r),
            Err(WaitError::TimedOut) => return Err(HoldError::Busy(name)),
            Err(WaitError::Failed(e)) => return Err(HoldError::Unavailable(e.to_string())),
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests;
