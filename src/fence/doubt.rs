//! Writes in doubt: writes whose whole body a remote backend had, whose
//! answer fencegate never read, because the answer was lost or because
//! the process that sent them died (CONTRACT §4; docs/how-it-works.md,
//! "When fencegate itself dies").
//!
//! Such a write may still land, up to `fence.quarantine_ms` after it was
//! lost (or after the restart that found it in the landing record,
//! `landing.rs`). Until then it keeps its place, as a write in flight
//! would: a request with a newer token on its resource waits, and a write
//! to its object waits where the object hold would have made it wait
//! (`hold.rs`). What the backend can settle sooner:
//!
//! - **Not orderable** (it went without a condition, or to a backend that
//!   ignores them): nothing; the quarantine is waited out.
//! - **Orderable**: a PutObject that went with `If-Match: <etag>` or
//!   `If-None-Match: *` to a backend the probe found honouring both. The
//!   backend judges that condition when it applies the write: once the
//!   object is no longer what the condition wants, the write can never
//!   land, unless the object comes back to it.
//!   - A PutObject of the same object is forwarded at once: if it lands
//!     first, the write in doubt cannot land after it. After an `If-Match`
//!     doubt, its body's MD5 (the ETag it leaves) must not be the one the
//!     doubt expects, or the object would come back to it (checked before
//!     its last bytes go: `Permit::guards`), and a PutObject whose ETag is
//!     not its MD5 (SSE-C, KMS) waits. A copy or completed upload, whose
//!     ETag cannot be known before, waits after an `If-Match` doubt and
//!     goes at once after an `If-None-Match` one (it takes the key either
//!     way); a delete waits after an `If-None-Match` doubt (the key would
//!     be free again).
//!   - The doubt is **settled** once a look at the object (a HEAD, by the
//!     proxy, `proxy/in_doubt.rs`) finds it no longer what the condition
//!     wants: the write landed, or never can. Until then a read with a
//!     newer token, and a write to another object of a shared resource,
//!     wait; from then on they go. (What would give the object back the
//!     ETag the doubt expects still waits, until the quarantine.)
//!   - A request that changes no object (a multipart upload's create,
//!     parts and abort) goes at once.
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
use tokio::sync::mpsc;
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
    /// A DeleteObject of this object. (DeleteObjects admits each key as
    /// `Other`, which waits where this would pass.)
    Delete { object: &'a str },
    /// A CopyObject or CompleteMultipartUpload to this object: it replaces
    /// it with an ETag not known before.
    Replace { object: &'a str },
    /// A request that changes no object (a multipart upload's create,
    /// parts and abort).
    Keeps,
    /// Anything else (tagging, ACLs...).
    Other,
}

impl Touch<'_> {
    /// The object the request changes, if it names one.
    fn object(&self) -> Option<&str> {
        match self {
            Touch::Put { object, .. } | Touch::Delete { object } | Touch::Replace { object } => {
                Some(object)
            }
            _ => None,
        }
    }
}

/// The answer to a request on a resource with writes in doubt.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forwarded, as long as its body's MD5 is none of these ETags.
    Admit(Vec<Box<str>>),
    /// Not before this instant; or sooner, when `settles`, once the doubt
    /// is settled ([`Doubts::settled`] wakes the waiters).
    WaitUntil { until: Instant, settles: bool },
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

/// An orderable doubt to look at: its object, and what its condition
/// wants the object to be (`Sent::IfMatch`, or `Sent::IfNoneMatch`:
/// absent). Settled by [`Doubts::settle`] when it no longer is.
#[derive(Debug, Clone)]
pub struct ToProbe {
    pub object: Box<str>,
    pub sent: Sent,
    pub until: Instant,
}

/// A write in doubt, on its resource.
struct Doubt {
    token: u64,
    object: u64,
    sent: Sent,
    orderable: bool,
    /// An orderable doubt whose object was seen to be no longer what its
    /// condition wants.
    settled: Arc<AtomicBool>,
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

enum Pass {
    Yes,
    /// Yes, unless the body's MD5 is this ETag.
    Unless(Box<str>),
    No,
}

/// Every write in doubt in this process.
pub struct Doubts {
    any: AtomicBool,
    resources: DashMap<u64, Vec<Doubt>>,
    objects: DashMap<u64, Vec<ObjectDoubt>>,
    /// The settled flags of orderable doubts, by object.
    settling: DashMap<u64, Vec<(Sent, Arc<AtomicBool>)>>,
    blanket: Mutex<Option<Instant>>,
    /// The record the doubts' slots are in, and the hash of names.
    landing: Option<Arc<Landing>>,
    judges: Arc<BackendJudges>,
    probes: mpsc::UnboundedSender<ToProbe>,
    to_probe: Mutex<Option<mpsc::UnboundedReceiver<ToProbe>>>,
    /// Woken whenever a doubt is settled.
    settled: tokio::sync::Notify,
}

impl Doubts {
    /// `landing`: the record of a remote backend's writes (none for the
    /// embedded store, whose writes die with the process: nothing is ever
    /// in doubt there).
    pub fn new(landing: Option<Arc<Landing>>) -> Doubts {
        let (probes, to_probe) = mpsc::unbounded_channel();
        Doubts {
            any: AtomicBool::new(false),
            resources: DashMap::new(),
            objects: DashMap::new(),
            settling: DashMap::new(),
            blanket: Mutex::new(None),
            landing,
            judges: Arc::default(),
            probes,
            to_probe: Mutex::new(Some(to_probe)),
            settled: tokio::sync::Notify::new(),
        }
    }

    /// Resolves at the next settlement (enable it before looking).
    pub fn settled(&self) -> tokio::sync::futures::Notified<'_> {
        self.settled.notified()
    }

    /// What the backend judges (shared with the probe).
    pub fn judges(&self) -> &Arc<BackendJudges> {
        &self.judges
    }

    /// The record of writes that may land, if there is one.
    pub fn landing(&self) -> Option<&Arc<Landing>> {
        self.landing.as_ref()
    }

    /// The orderable doubts to look at, as they come (taken once, by
    /// whoever can send the backend a HEAD).
    pub fn take_probes(&self) -> Option<mpsc::UnboundedReceiver<ToProbe>> {
        self.to_probe
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
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
        let settled = Arc::new(AtomicBool::new(false));
        if let (Some(token), true) = (write.token, write.resource != 0) {
            self.resources
                .entry(write.resource)
                .or_default()
                .push(Doubt {
                    token,
                    object: write.object,
                    sent: write.sent.clone(),
                    orderable: write.orderable,
                    settled: settled.clone(),
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
        if let (true, Some(name)) = (write.orderable, &write.name) {
            let entry = (write.sent.clone(), settled);
            self.settling.entry(write.object).or_default().push(entry);
            let probe = ToProbe {
                object: name.clone(),
                sent: write.sent.clone(),
                until,
            };
            let _ = self.probes.send(probe);
        }
        self.any.store(true, Ordering::Release);
        metrics::counter!(m::WRITES_IN_DOUBT).increment(1);
    }

    /// `object` was seen to be no longer what `sent` wants: the orderable
    /// doubts on it that went with `sent` are settled.
    pub fn settle(&self, object: &str, sent: &Sent) {
        if let Some(ds) = self.settling.get(&self.hash(object)) {
            for (s, settled) in ds.iter().filter(|(s, _)| s == sent) {
                settled.store(true, Ordering::Release);
                tracing::info!(object, condition = ?s, "a write in doubt is settled: its object is no longer what its condition wants");
            }
        }
        self.settled.notify_waiters();
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
        let on = |ds: &[ObjectDoubt]| ds.iter().filter(|d| d.until > now).count();
        let objects: usize = self.objects.iter().map(|e| on(e.value())).sum();
        let fenced: usize = self
            .resources
            .iter()
            .map(|e| e.value().iter().filter(|d| d.until > now).count())
            .sum();
        objects.max(fenced)
    }

    /// Whether any write is in doubt on `resource` (or nothing is known).
    pub fn on(&self, resource: &str) -> bool {
        self.any_on(resource, |_| true)
    }

    /// Whether a write in doubt on `resource` may still land after a
    /// newer request that knows nothing of it: at another replica (cluster
    /// mode). Only a settled `If-Match` doubt cannot (the successor guards
    /// no ETag, which is the limit cluster.md states).
    pub fn unordered_on(&self, resource: &str) -> bool {
        self.any_on(resource, |d| {
            !(d.orderable
                && matches!(d.sent, Sent::IfMatch(_))
                && d.settled.load(Ordering::Acquire))
        })
    }

    fn any_on(&self, resource: &str, counts: impl Fn(&Doubt) -> bool) -> bool {
        if !self.any() {
            return false;
        }
        if self.blanket_until().is_some() {
            return true;
        }
        let now = Instant::now();
        self.resources
            .get(&self.hash(resource))
            .is_some_and(|ds| ds.iter().any(|d| d.until > now && counts(d)))
    }

    /// Whether a request with `token` on `resource`, doing `touch`, is
    /// forwarded now past the writes in doubt there.
    pub fn admits(&self, resource: &str, token: u64, touch: Touch<'_>) -> Verdict {
        if !self.any() {
            return Verdict::Admit(Vec::new());
        }
        if let Some(until) = self.blanket_until() {
            let settles = false;
            return Verdict::WaitUntil { until, settles };
        }
        let Some(ds) = self.resources.get(&self.hash(resource)) else {
            return Verdict::Admit(Vec::new());
        };
        let now = Instant::now();
        let object = touch.object().map(|o| self.hash(o));
        let mut guards = Vec::new();
        let mut wait: Option<Instant> = None;
        let mut settles = true;
        for d in ds.iter().filter(|d| d.until > now && d.token <= token) {
            let same_object = object == Some(d.object);
            let pass = match d.token < token {
                true => passes(d, touch, same_object),
                // The same token is not ordered against its own writes;
                // but it must not give the object back what the doubt's
                // condition wants either.
                false => match (touch, &d.sent) {
                    (Touch::Put { .. }, Sent::IfMatch(e)) if same_object && d.orderable => {
                        Pass::Unless(e.clone())
                    }
                    _ => Pass::Yes,
                },
            };
            match pass {
                Pass::Yes => {}
                Pass::Unless(etag) => guards.push(etag),
                Pass::No => {
                    wait = wait.max(Some(d.until));
                    settles &= passes_once_settled(d, touch, same_object);
                }
            }
        }
        match wait {
            Some(until) => Verdict::WaitUntil { until, settles },
            None => Verdict::Admit(guards),
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
        // A settling flag outlives its doubt only while a probe holds it.
        self.settling.retain(|_, ds| {
            ds.retain(|(_, s)| Arc::strong_count(s) > 1);
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

/// Whether `touch`, waiting for `d`, would go once `d` is settled.
fn passes_once_settled(d: &Doubt, touch: Touch<'_>, same_object: bool) -> bool {
    d.orderable && !d.settled.load(Ordering::Acquire) && {
        let settled = AtomicBool::new(true);
        let as_settled = Doubt {
            token: d.token,
            object: d.object,
            sent: d.sent.clone(),
            orderable: true,
            settled: Arc::new(settled),
            until: d.until,
            _record: None,
        };
        !matches!(passes(&as_settled, touch, same_object), Pass::No)
    }
}

/// The rule of the module doc, for one doubt with a lower token.
fn passes(d: &Doubt, touch: Touch<'_>, same_object: bool) -> Pass {
    if !d.orderable {
        return Pass::No;
    }
    let settled = d.settled.load(Ordering::Acquire);
    match (touch, &d.sent) {
        (Touch::Keeps, _) => Pass::Yes,
        (Touch::Put { md5_etag, .. }, Sent::IfMatch(etag)) if same_object => match md5_etag {
            true => Pass::Unless(etag.clone()),
            false => Pass::No,
        },
        (Touch::Put { .. } | Touch::Replace { .. }, Sent::IfNoneMatch) if same_object => Pass::Yes,
        (Touch::Delete { .. }, Sent::IfMatch(_)) if same_object => Pass::Yes,
        // What would give the object back what the doubt wants.
        (Touch::Replace { .. }, _) | (Touch::Delete { .. }, Sent::IfNoneMatch) if same_object => {
            Pass::No
        }
        _ if settled => Pass::Yes,
        _ => Pass::No,
    }
}

#[cfg(test)]
mod tests;
