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
//! Waiters are served in the order they came (tokio's `RwLock` is fair),
//! so neither kind starves the other. A request that needs several objects
//! (DeleteObjects) takes them one at a time in key order, which cannot
//! deadlock: whoever waits at an object holds only objects before it. A
//! wait longer than `admission_wait_ms` ends in `503 SlowDown`.
//!
//! The table holds an entry only while some request holds or waits for
//! its object, so memory follows the writes in flight, not the objects
//! written. In cluster mode the hold is a key in etcd instead, under the
//! replica's lease (`cluster/holds.rs`), so that it spans the replicas.

use super::cluster::{Cluster, Registration, WaitError};
use dashmap::DashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};
use tokio::time::Instant;

/// How a write holds its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// An unconditional write: beside other unconditional writes.
    Shared,
    /// A conditional write: alone, from its look at the object to its end.
    Alone,
}

/// Why an object could not be held.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error("other writes to {0} are still in progress")]
    Busy(String),
    #[error("the shared hold table cannot be reached: {0}")]
    Unavailable(String),
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

type Table = DashMap<String, Arc<RwLock<()>>>;

/// Every object held now, on this replica or (in cluster mode) on all.
pub struct Holds {
    table: Arc<Table>,
    wait: Duration,
    cluster: Option<Arc<Cluster>>,
    /// Debug switch: hold nothing (`FENCEGATE_UNSAFE_NO_HOLD=1`).
    off: bool,
}

enum Guard {
    Shared(#[allow(dead_code)] OwnedRwLockReadGuard<()>),
    Alone(#[allow(dead_code)] OwnedRwLockWriteGuard<()>),
}

/// One object held in this process.
struct Local {
    table: Arc<Table>,
    name: String,
    guard: Option<Guard>,
}

impl Drop for Local {
    fn drop(&mut self) {
        self.guard = None;
        // The entry goes when nobody else holds or waits for it. A new
        // reference is only ever taken under the shard lock `remove_if`
        // holds while it counts, so an entry in use is never removed.
        self.table
            .remove_if(&self.name, |_, lock| Arc::strong_count(lock) == 1);
    }
}

/// A write's hold on its objects, let go when dropped. It travels with
/// the upstream exchange, as the gate's permits do, and is kept for the
/// quarantine when the exchange's outcome is unknown.
pub struct ObjectHold {
    local: Vec<Local>,
    shared: Vec<Registration>,
    /// The backend was given the whole body (or a body-less request went).
    sent: AtomicBool,
}

impl ObjectHold {
    /// A hold of nothing (a request that changes no object).
    pub fn none() -> ObjectHold {
        ObjectHold {
            local: Vec::new(),
            shared: Vec::new(),
            sent: AtomicBool::new(false),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.local.is_empty() && self.shared.is_empty()
    }

    /// Called before the last bytes of the write go upstream. In cluster
    /// mode, false when this replica's lease may have lapsed: another
    /// replica may then hold the object, and the write must not complete.
    pub fn body_complete(&self) -> bool {
        if !self.shared.iter().all(Registration::fresh) {
            return false;
        }
        self.sent.store(true, Ordering::SeqCst);
        true
    }

    /// Whether the backend was given the whole request: after that, a lost
    /// answer does not mean the write did not happen.
    pub fn body_was_complete(&self) -> bool {
        self.sent.load(Ordering::SeqCst)
    }
}

impl Holds {
    pub fn new(wait: Duration, cluster: Option<Arc<Cluster>>) -> Holds {
        Holds {
            table: Arc::new(DashMap::new()),
            wait,
            cluster,
            off: false,
        }
    }

    /// Debug switch: hold nothing, so that a conditional write's check and
    /// write are two steps again. Unsafe; exists to show what the hold does.
    pub fn set_off(&mut self, off: bool) {
        self.off = off;
    }

    /// Objects held or waited for in this process now (tests, memory).
    pub fn entries(&self) -> usize {
        self.table.len()
    }

    /// Holds every object of `objects` (names from [`object_name`]), one at
    /// a time in name order; an object named twice is held once, alone if
    /// either asks for that. Gives up after `admission_wait_ms`.
    pub async fn hold(&self, mut objects: Vec<(String, Mode)>) -> Result<ObjectHold, HoldError> {
        if self.off {
            return Ok(ObjectHold::none());
        }
        objects.sort();
        // Sorted by name, then Shared before Alone: keep the last of each.
        objects.reverse();
        objects.dedup_by(|later, kept| later.0 == kept.0);
        objects.reverse();
        let deadline = Instant::now() + self.wait;
        let mut held = ObjectHold::none();
        for (name, mode) in objects {
            match &self.cluster {
                Some(c) => match c.hold(&name, mode == Mode::Alone, deadline).await {
                    Ok(r) => held.shared.push(r),
                    Err(WaitError::TimedOut) => return Err(HoldError::Busy(name)),
                    Err(WaitError::Failed(e)) => return Err(HoldError::Unavailable(e.to_string())),
                },
                None => held.local.push(self.hold_here(name, mode, deadline).await?),
            }
        }
        Ok(held)
    }

    async fn hold_here(
        &self,
        name: String,
        mode: Mode,
        deadline: Instant,
    ) -> Result<Local, HoldError> {
        let lock = self.table.entry(name.clone()).or_default().clone();
        // Dropped on every way out, so that a timed-out or cancelled wait
        // also removes an entry nobody else uses.
        let mut local = Local {
            table: self.table.clone(),
            name,
            guard: None,
        };
        let guard = match mode {
            Mode::Shared => tokio::time::timeout_at(deadline, lock.read_owned())
                .await
                .map(Guard::Shared),
            Mode::Alone => tokio::time::timeout_at(deadline, lock.write_owned())
                .await
                .map(Guard::Alone),
        };
        match guard {
            Ok(g) => {
                local.guard = Some(g);
                Ok(local)
            }
            Err(_) => Err(HoldError::Busy(local.name.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holds() -> Arc<Holds> {
        Arc::new(Holds::new(Duration::from_secs(5), None))
    }

    fn one(name: &str, mode: Mode) -> Vec<(String, Mode)> {
        vec![(name.to_string(), mode)]
    }

    #[tokio::test(start_paused = true)]
    async fn shared_holds_go_together_and_alone_waits_for_them() {
        let h = holds();
        let a = h.hold(one("b/k", Mode::Shared)).await.unwrap();
        let b = h.hold(one("b/k", Mode::Shared)).await.unwrap();
        let h2 = h.clone();
        let alone = tokio::spawn(async move { h2.hold(one("b/k", Mode::Alone)).await });
        tokio::task::yield_now().await;
        assert!(!alone.is_finished());
        drop(a);
        tokio::task::yield_now().await;
        assert!(!alone.is_finished());
        drop(b);
        let alone = alone.await.unwrap().unwrap();
        // Another object is not held up.
        drop(h.hold(one("b/other", Mode::Alone)).await.unwrap());
        drop(alone);
        assert_eq!(h.entries(), 0, "nothing held, nothing kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_shared_write_waits_for_a_conditional_one_and_gives_up_at_the_bound() {
        let h = holds();
        let alone = h.hold(one("b/k", Mode::Alone)).await.unwrap();
        let waited = Instant::now();
        assert!(matches!(
            h.hold(one("b/k", Mode::Shared)).await,
            Err(HoldError::Busy(_))
        ));
        assert_eq!(waited.elapsed(), Duration::from_secs(5));
        drop(alone);
        assert!(h.hold(one("b/k", Mode::Shared)).await.is_ok());
        assert_eq!(h.entries(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_in_order() {
        // A shared write that comes after a waiting conditional one does not
        // overtake it (else a stream of unconditional writes could starve it).
        let h = holds();
        let first = h.hold(one("b/k", Mode::Shared)).await.unwrap();
        let h2 = h.clone();
        let alone = tokio::spawn(async move { h2.hold(one("b/k", Mode::Alone)).await });
        tokio::task::yield_now().await;
        let h3 = h.clone();
        let late = tokio::spawn(async move { h3.hold(one("b/k", Mode::Shared)).await });
        tokio::task::yield_now().await;
        assert!(
            !late.is_finished(),
            "a later shared write overtook a waiting alone"
        );
        drop(first);
        let alone = alone.await.unwrap().unwrap();
        tokio::task::yield_now().await;
        assert!(!late.is_finished());
        drop(alone);
        assert!(late.await.unwrap().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn several_objects_are_held_in_order_without_deadlock() {
        let h = holds();
        let mut tasks = Vec::new();
        for i in 0..8 {
            let h = h.clone();
            tasks.push(tokio::spawn(async move {
                let mut names = vec![
                    ("b/x".to_string(), Mode::Alone),
                    ("b/y".to_string(), Mode::Alone),
                    ("b/x".to_string(), Mode::Shared),
                ];
                if i % 2 == 0 {
                    names.reverse();
                }
                let held = h.hold(names).await.unwrap();
                assert_eq!(held.local.len(), 2, "b/x named twice is held once");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(h.entries(), 0);
    }
}
