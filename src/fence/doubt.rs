//! Writes in doubt: writes whose whole body a remote backend had, whose
//! answer fencegate never read, because the answer was lost or because
//! the process that sent them died (CONTRACT §4; docs/how-it-works.md,
//! "When fencegate itself dies").
//!
//! Such a write may still land, up to `fence.quarantine_ms` after it was
//! lost (or after the restart that found it in the landing record,
//! `landing.rs`). Until then it keeps its place, as a write in flight
//! would, with one difference the backend makes possible:
//!
//! - **Not orderable** (it went without a condition, or to a backend that
//!   ignores them): a request with a newer token on its resource waits,
//!   and a write to its object waits where the object hold would have
//!   made it wait (`hold.rs`): for the quarantine.
//! - **Orderable**: a PutObject that went with `If-Match: <etag>` or
//!   `If-None-Match: *` to a backend the probe found honouring both. The
//!   backend judges that condition when it applies the write, so once a
//!   newer write has changed the object, the write in doubt can never
//!   land. A newer request on its resource is forwarded at once when the
//!   backend orders the two: a read; a PutObject of the same object (after
//!   an `If-Match` doubt, only if its body's MD5, which is the ETag it
//!   leaves, is not the one the doubt expects: otherwise the object would
//!   come back to what the doubt's condition wants, and it could land
//!   after); a delete of the object after an `If-Match` doubt; a request
//!   that changes no object (a multipart upload's parts). Anything else
//!   (a copy or a completed upload, whose ETag cannot be known before;
//!   a delete after an `If-None-Match` doubt; a write to another object
//!   of a shared resource) waits for the quarantine.
//!
//! A **blanket** doubt is what a start with an untrustworthy record
//! leaves: nothing is known, so every fenced request and every write to an
//! object waits until the quarantine from the start is over.
//!
//! Nothing here costs a request anything while nothing is in doubt: one
//! atomic load.

use super::landing::{Landing, Record, Sent, Write};
use crate::metric_names as m;
use dashmap::DashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How often expired doubts are swept (and their records let go).
const SWEEP: Duration = Duration::from_millis(500);

/// What a fenced request does, as far as a write in doubt on its resource
/// is concerned.
#[derive(Debug, Clone, Copy)]
pub enum Touch<'a> {
    /// A read carrying a token.
    Read,
    /// A PutObject of this object; `md5_etag`: whether the ETag it leaves
    /// is its body's MD5 (no customer or KMS key named).
    Put { object: &'a str, md5_etag: bool },
    /// A DeleteObject (or one key of DeleteObjects) of this object.
    Delete { object: &'a str },
    /// A request that changes no object (a multipart upload's create,
    /// parts and abort).
    Keeps,
    /// Anything else: waits for every doubt.
    Other,
}

/// The answer to a request on a resource with writes in doubt.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forwarded, as long as its body's MD5 is none of these ETags.
    Admit(Vec<Box<str>>),
    /// Not before this instant.
    WaitUntil(Instant),
}

/// Whether the backend judges the conditions it is sent: set from the
/// probe (`upstream::probe`), read here.
#[derive(Default)]
pub struct BackendJudges(AtomicU8);

impl BackendJudges {
    const WRITES: u8 = 1;
    const DELETES: u8 = 2;

    /// `writes`: `If-Match` and `If-None-Match` on PutObject;
    /// `deletes`: `If-Match` on DeleteObject.
    pub fn set(&self, writes: bool, deletes: bool) {
        let v = (u8::from(writes) * Self::WRITES) | (u8::from(deletes) * Self::DELETES);
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn writes(&self) -> bool {
        self.0.load(Ordering::Relaxed) & Self::WRITES != 0
    }

    pub fn deletes(&self) -> bool {
        self.0.load(Ordering::Relaxed) & Self::DELETES != 0
    }
}

/// A write in doubt, on its resource.
struct Doubt {
    token: u64,
    object: u64,
    sent: Sent,
    orderable: bool,
    until: Instant,
    _record: Option<Arc<Record>>,
}

/// A write in doubt, on its object.
struct ObjectDoubt {
    alone: bool,
    orderable: bool,
    until: Instant,
    _record: Option<Arc<Record>>,
}

/// Every write in doubt in this process.
pub struct Doubts {
    any: AtomicBool,
    resources: DashMap<u64, Vec<Doubt>>,
    objects: DashMap<u64, Vec<ObjectDoubt>>,
    blanket: Mutex<Option<Instant>>,
    /// The record the doubts' slots are in, and the hash of names.
    landing: Option<Arc<Landing>>,
    judges: Arc<BackendJudges>,
}

impl Doubts {
    /// `landing`: the record of a remote backend's writes (none for the
    /// embedded store, whose writes die with the process: nothing is ever
    /// in doubt there).
    pub fn new(landing: Option<Arc<Landing>>) -> Doubts {
        Doubts {
            any: AtomicBool::new(false),
            resources: DashMap::new(),
            objects: DashMap::new(),
            blanket: Mutex::new(None),
            landing,
            judges: Arc::default(),
        }
    }

    /// What the backend judges (shared with the probe).
    pub fn judges(&self) -> &Arc<BackendJudges> {
        &self.judges
    }

    /// The record of writes that may land, if there is one.
    pub fn landing(&self) -> Option<&Arc<Landing>> {
        self.landing.as_ref()
    }

    fn hash(&self, name: &str) -> u64 {
        self.landing.as_ref().map_or(1, |l| l.hash(name))
    }

    /// Whether anything is in doubt now (one atomic load).
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// `write` is in doubt until `until`; `record` (its slot in the
    /// landing record) is let go then.
    pub fn add(&self, write: &Write, record: Option<Arc<Record>>, until: Instant) {
        if let (Some(token), true) = (write.token, write.resource != 0) {
            self.resources
                .entry(write.resource)
                .or_default()
                .push(Doubt {
                    token,
                    object: write.object,
                    sent: write.sent.clone(),
                    orderable: write.orderable,
                    until,
                    _record: record.clone(),
                });
        }
        if write.object != 0 {
            self.objects
                .entry(write.object)
                .or_default()
                .push(ObjectDoubt {
                    alone: write.alone,
                    orderable: write.orderable,
                    until,
                    _record: record,
                });
        }
        self.any.store(true, Ordering::Release);
        metrics::counter!(m::WRITES_IN_DOUBT).increment(1);
    }

    /// Nothing is known of what may land: every fenced request and every
    /// write to an object waits until `until`.
    pub fn blanket(&self, until: Instant) {
        *self.blanket.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
        self.any.store(true, Ordering::Release);
        metrics::gauge!(m::STARTUP_QUARANTINE).set(1.0);
    }

    /// The end of a blanket doubt still running.
    pub fn blanket_until(&self) -> Option<Instant> {
        let b = *self.blanket.lock().unwrap_or_else(|p| p.into_inner());
        b.filter(|until| *until > Instant::now())
    }

    /// Writes in doubt now (not counting a blanket one).
    pub fn count(&self) -> usize {
        let now = Instant::now();
        let resources: usize = self
            .resources
            .iter()
            .map(|e| e.value().iter().filter(|d| d.until > now).count())
            .sum();
        let objects_only: usize = self
            .objects
            .iter()
            .map(|e| e.value().iter().filter(|d| d.until > now).count())
            .sum();
        resources.max(objects_only)
    }

    /// Whether any write is in doubt on `resource` (or nothing is known).
    pub fn on(&self, resource: &str) -> bool {
        if !self.any() {
            return false;
        }
        if self.blanket_until().is_some() {
            return true;
        }
        let now = Instant::now();
        self.resources
            .get(&self.hash(resource))
            .is_some_and(|ds| ds.iter().any(|d| d.until > now))
    }

    /// Whether a write in doubt on `resource` may still land after a
    /// newer write the backend does not order against it (cluster mode:
    /// an owner keeps its in-flight marker for it).
    pub fn unordered_on(&self, resource: &str) -> bool {
        if !self.any() {
            return false;
        }
        if self.blanket_until().is_some() {
            return true;
        }
        let now = Instant::now();
        self.resources.get(&self.hash(resource)).is_some_and(|ds| {
            ds.iter()
                .any(|d| d.until > now && (!d.orderable || matches!(d.sent, Sent::IfNoneMatch)))
        })
    }

    /// Whether a request with `token` on `resource`, doing `touch`, is
    /// forwarded now past the writes in doubt there.
    pub fn admits(&self, resource: &str, token: u64, touch: Touch<'_>) -> Verdict {
        if !self.any() {
            return Verdict::Admit(Vec::new());
        }
        if let Some(until) = self.blanket_until() {
            return Verdict::WaitUntil(until);
        }
        let Some(ds) = self.resources.get(&self.hash(resource)) else {
            return Verdict::Admit(Vec::new());
        };
        let now = Instant::now();
        let mut guards = Vec::new();
        let mut wait: Option<Instant> = None;
        for d in ds.iter().filter(|d| d.until > now && d.token < token) {
            match self.passes(d, touch) {
                Pass::Yes => {}
                Pass::Unless(etag) => guards.push(etag),
                Pass::No => wait = wait.max(Some(d.until)),
            }
        }
        match wait {
            Some(until) => Verdict::WaitUntil(until),
            None => Verdict::Admit(guards),
        }
    }

    /// The rule of the module doc, for one doubt.
    fn passes(&self, d: &Doubt, touch: Touch<'_>) -> Pass {
        if !d.orderable {
            return Pass::No;
        }
        match (touch, &d.sent) {
            (Touch::Read | Touch::Keeps, _) => Pass::Yes,
            (Touch::Put { object, md5_etag }, sent) if self.hash(object) == d.object => {
                match sent {
                    Sent::IfNoneMatch => Pass::Yes,
                    Sent::IfMatch(etag) if md5_etag => Pass::Unless(etag.clone()),
                    _ => Pass::No,
                }
            }
            (Touch::Delete { object }, Sent::IfMatch(_)) if self.hash(object) == d.object => {
                Pass::Yes
            }
            _ => Pass::No,
        }
    }

    /// Whether a write to `object` takes its hold now past the writes in
    /// doubt there (`None`), or waits until the instant returned.
    /// `alone`: it has conditions of its own; `judged`: the backend is
    /// sent them and judges them when it applies the write.
    pub fn holds(&self, object: &str, alone: bool, judged: bool) -> Option<Instant> {
        if !self.any() {
            return None;
        }
        if let Some(until) = self.blanket_until() {
            return Some(until);
        }
        let ds = self.objects.get(&self.hash(object))?;
        let now = Instant::now();
        ds.iter()
            .filter(|d| d.until > now)
            // The backend keeps each side's check and write one step when
            // it judges both: the doubt's (or it had none), and this one's
            // (or it has none). Else this write waits.
            .filter(|d| (d.alone && !d.orderable) || (alone && !judged))
            .map(|d| d.until)
            .max()
    }

    /// Drops the doubts whose time is over (their records let go), every
    /// [`SWEEP`], for as long as the doubts live.
    pub fn sweep(self: &Arc<Self>) {
        let doubts = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP).await;
                let Some(d) = doubts.upgrade() else { return };
                d.sweep_once();
            }
        });
    }

    fn sweep_once(&self) {
        if !self.any() {
            return;
        }
        let now = Instant::now();
        self.resources.retain(|_, ds| {
            ds.retain(|d| d.until > now);
            !ds.is_empty()
        });
        self.objects.retain(|_, ds| {
            ds.retain(|d| d.until > now);
            !ds.is_empty()
        });
        let blanket = {
            let mut b = self.blanket.lock().unwrap_or_else(|p| p.into_inner());
            if b.is_some_and(|until| until <= now) {
                *b = None;
                if let Some(l) = &self.landing {
                    l.blanket_over();
                }
                metrics::gauge!(m::STARTUP_QUARANTINE).set(0.0);
                tracing::info!("the start-up quarantine is over: newer tokens are admitted again");
            }
            b.is_some()
        };
        let any = blanket || !self.resources.is_empty() || !self.objects.is_empty();
        self.any.store(any, Ordering::Release);
        metrics::gauge!(m::IN_DOUBT).set(self.count() as f64);
    }
}

enum Pass {
    Yes,
    /// Yes, unless the body's MD5 is this ETag.
    Unless(Box<str>),
    No,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doubts() -> (tempfile::TempDir, Doubts) {
        let dir = tempfile::tempdir().unwrap();
        let landing = Landing::open(dir.path(), false).unwrap().landing;
        (dir, Doubts::new(Some(landing)))
    }

    fn write(d: &Doubts, token: u64, sent: Sent, orderable: bool) -> Write {
        Write {
            token: Some(token),
            resource: d.hash("b/k"),
            object: d.hash("b/k"),
            sent,
            orderable,
            alone: false,
        }
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[tokio::test]
    async fn an_unorderable_doubt_holds_every_newer_token_back() {
        let (_dir, d) = doubts();
        let until = later();
        d.add(&write(&d, 33, Sent::Plain, false), None, until);
        let put = Touch::Put {
            object: "b/k",
            md5_etag: true,
        };
        for touch in [put, Touch::Read, Touch::Keeps, Touch::Other] {
            assert_eq!(d.admits("b/k", 34, touch), Verdict::WaitUntil(until));
        }
        // Its own token, and other resources, go on.
        assert_eq!(d.admits("b/k", 33, put), Verdict::Admit(vec![]));
        assert_eq!(d.admits("b/j", 34, put), Verdict::Admit(vec![]));
    }

    #[tokio::test]
    async fn an_orderable_doubt_lets_through_what_the_backend_orders() {
        let (_dir, d) = doubts();
        let until = later();
        d.add(
            &write(&d, 33, Sent::IfMatch("e0".into()), true),
            None,
            until,
        );
        let put = |md5_etag| Touch::Put {
            object: "b/k",
            md5_etag,
        };
        assert_eq!(d.admits("b/k", 34, Touch::Read), Verdict::Admit(vec![]));
        assert_eq!(
            d.admits("b/k", 34, put(true)),
            Verdict::Admit(vec!["e0".into()])
        );
        assert_eq!(d.admits("b/k", 34, put(false)), Verdict::WaitUntil(until));
        let delete = Touch::Delete { object: "b/k" };
        assert_eq!(d.admits("b/k", 34, delete), Verdict::Admit(vec![]));
        assert_eq!(d.admits("b/k", 34, Touch::Other), Verdict::WaitUntil(until));
        // Another object of the resource is not ordered by the backend.
        let other = Touch::Put {
            object: "b/other",
            md5_etag: true,
        };
        assert_eq!(d.admits("b/k", 34, other), Verdict::WaitUntil(until));
    }

    #[tokio::test]
    async fn after_a_put_if_absent_in_doubt_a_delete_waits() {
        let (_dir, d) = doubts();
        let until = later();
        d.add(&write(&d, 33, Sent::IfNoneMatch, true), None, until);
        let put = Touch::Put {
            object: "b/k",
            md5_etag: false,
        };
        assert_eq!(d.admits("b/k", 34, put), Verdict::Admit(vec![]));
        let delete = Touch::Delete { object: "b/k" };
        assert_eq!(d.admits("b/k", 34, delete), Verdict::WaitUntil(until));
        assert!(d.unordered_on("b/k"));
    }

    #[tokio::test]
    async fn object_doubts_hold_writes_as_the_hold_would() {
        let (_dir, d) = doubts();
        let until = later();
        let mut w = write(&d, 1, Sent::IfNoneMatch, false);
        w.token = None;
        w.alone = true;
        d.add(&w, None, until);
        // A conditional write in doubt at a store that ignores conditions:
        // every write to the object waits.
        assert_eq!(d.holds("b/k", false, false), Some(until));
        assert_eq!(d.holds("b/k", true, true), Some(until));
        assert_eq!(d.holds("b/other", true, false), None);
        let (_dir2, d) = doubts();
        let mut w = write(&d, 1, Sent::Plain, false);
        w.token = None;
        d.add(&w, None, until);
        // An unconditional one: only conditional writes the store does not
        // judge wait.
        assert_eq!(d.holds("b/k", false, false), None);
        assert_eq!(d.holds("b/k", true, true), None);
        assert_eq!(d.holds("b/k", true, false), Some(until));
    }

    #[tokio::test(start_paused = true)]
    async fn doubts_end_with_their_time_and_let_their_records_go() {
        let dir = tempfile::tempdir().unwrap();
        let landing = Landing::open(dir.path(), false).unwrap().landing;
        let d = Arc::new(Doubts::new(Some(landing.clone())));
        d.sweep();
        let w = write(&d, 33, Sent::Plain, false);
        let record = landing.record(&w).unwrap();
        d.add(
            &w,
            Some(Arc::new(record)),
            Instant::now() + Duration::from_secs(2),
        );
        d.blanket(Instant::now() + Duration::from_secs(1));
        assert_eq!(landing.taken(), 1);
        assert!(matches!(
            d.admits("b/j", 1, Touch::Read),
            Verdict::WaitUntil(_)
        ));
        tokio::time::sleep(Duration::from_millis(1600)).await;
        assert_eq!(d.admits("b/j", 1, Touch::Read), Verdict::Admit(vec![]));
        assert!(d.any());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(landing.taken(), 0);
        assert!(!d.any());
    }
}
