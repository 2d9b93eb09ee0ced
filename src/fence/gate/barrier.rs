//! The gate's third step, the ordering barrier (CONTRACT §4): a request is
//! admitted once no write with a lower token is in flight on its resource,
//! in this process or in doubt (`fence::doubt`: answered by nobody, it may
//! still land); a write is then registered in flight and given its
//! [`Permit`].

use super::{Entry, Gate, Kind, OwnerTenure, Permit, Phase, Refusal, Slot, SlotState};
use crate::fence::cluster::{Cluster, Registration, Tenure};
use crate::fence::doubt::{Touch, Verdict};
use crate::metric_names as m;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use tokio::time::Instant;

/// One admission attempt's outcome.
enum Attempt {
    Done(Result<Option<Permit>, Refusal>),
    /// A lower-token write is in flight here: wait for one to leave.
    Inflight,
    /// A lower-token write in doubt may land until then (or, when it can
    /// be settled, until it is).
    Doubt(Instant, bool),
}

impl Gate {
    /// Waits until no lower-token write is in flight in `slot`, up to the
    /// bound, nor in doubt on `resource`, and admits. A doubt that cannot
    /// be settled sooner and lasts past the bound is refused at once
    /// ([`Refusal::InDoubt`]): nothing was done, and waiting would not
    /// change the answer. One the backend can settle is waited for up to
    /// the bound, then refused alike.
    pub(super) async fn barrier(
        &self,
        slot: &Arc<Slot>,
        (resource, touch): (&str, Touch<'_>),
        token: u64,
        kind: Kind,
        owner: Option<OwnerTenure<'_>>,
    ) -> Result<Option<Permit>, Refusal> {
        // The common case (nothing older in flight) admits at once, without
        // reading the clock or arming a wake-up.
        let mut attempt = match self.try_admit(slot, (resource, touch), token, kind, owner) {
            Attempt::Done(done) => return done,
            waiting => waiting,
        };
        let deadline = Instant::now() + self.wait_bound;
        loop {
            let notified = slot.changed.notified();
            tokio::pin!(notified);
            match attempt {
                Attempt::Done(done) => return done,
                Attempt::Doubt(until, false) if until > deadline => {
                    return Err(Refusal::InDoubt(until - Instant::now()));
                }
                Attempt::Doubt(until, _) if Instant::now() >= deadline => {
                    return Err(Refusal::InDoubt(until - Instant::now()));
                }
                Attempt::Doubt(until, settles) => {
                    let settled = self.doubts.settled();
                    tokio::pin!(settled);
                    settled.as_mut().enable();
                    // Settled before the wake-up was armed: look again.
                    if settles {
                        attempt = self.try_admit(slot, (resource, touch), token, kind, owner);
                        if !matches!(attempt, Attempt::Doubt(..)) {
                            continue;
                        }
                    }
                    let wake = until.min(deadline);
                    tokio::select! {
                        _ = tokio::time::sleep_until(wake) => {}
                        _ = settled, if settles => {}
                    }
                }
                Attempt::Inflight => {
                    notified.as_mut().enable();
                    attempt = self.try_admit(slot, (resource, touch), token, kind, owner);
                    if !matches!(attempt, Attempt::Inflight) {
                        continue;
                    }
                    if tokio::time::timeout_at(deadline, notified).await.is_err() {
                        return Err(Refusal::Busy);
                    }
                }
            }
            attempt = self.try_admit(slot, (resource, touch), token, kind, owner);
        }
    }

    /// One admission attempt under the slot's lock: refused, admitted, or
    /// to wait for an older write in flight or in doubt. An `owner` admits
    /// only while its tenure stands.
    fn try_admit(
        &self,
        slot: &Arc<Slot>,
        (resource, touch): (&str, Touch<'_>),
        token: u64,
        kind: Kind,
        owner: Option<OwnerTenure<'_>>,
    ) -> Attempt {
        let mut st = slot.lock();
        if let Some((c, tenure)) = owner {
            match &mut st.owned {
                Some(o) if o.tenure == tenure && c.tenure_stands(&tenure) => o.touched = true,
                _ => return Attempt::Done(Err(Refusal::TenureLost)),
            }
        }
        if let Some(h) = st.highest
            && token < h
        {
            return Attempt::Done(Err(Refusal::Stale { token, highest: h }));
        }
        if self.ordered && st.inflight.iter().any(|e| e.token < token) {
            return Attempt::Inflight;
        }
        let guards = match self.ordered && self.doubts.any() {
            false => Vec::new(),
            true => match self.doubts.admits(resource, token, touch) {
                Verdict::Admit(guards) => guards,
                Verdict::WaitUntil { until, settles } => return Attempt::Doubt(until, settles),
            },
        };
        if kind == Kind::Read {
            return Attempt::Done(Ok(None));
        }
        // In the same critical section as the entry's push: a quiet sweep
        // sees either this write in flight or `busy`.
        if let Some(o) = st
            .owned
            .as_mut()
            .filter(|_| kind == Kind::Write && owner.is_some())
        {
            if !o.marked {
                return Attempt::Done(Err(Refusal::Unmarked));
            }
            o.busy = true;
        }
        let tenure = owner.map(|(c, t)| (c.clone(), t));
        let mut permit = push_entry(slot, &mut st, (token, kind), None, tenure);
        permit.guards = guards;
        Attempt::Done(Ok(Some(permit)))
    }
}

/// Registers a write of `token` (of `kind`) in flight in `slot` (whose state `st` is)
/// and returns its permit.
pub(super) fn push_entry(
    slot: &Arc<Slot>,
    st: &mut SlotState,
    (token, kind): (u64, Kind),
    shared: Option<Registration>,
    tenure: Option<(Arc<Cluster>, Tenure)>,
) -> Permit {
    let id = st.next_id;
    st.next_id += 1;
    let abort = Arc::new(super::AbortSignal::default());
    m::handles::add_inflight_writes(1);
    st.inflight.push(Entry {
        id,
        token,
        phase: Phase::Streaming,
        abort: abort.clone(),
        conditioned: kind == Kind::Conditioned,
    });
    Permit {
        slot: slot.clone(),
        id,
        token,
        abort,
        shared,
        tenure,
        lease_lost: AtomicBool::new(false),
        guards: Vec::new(),
    }
}
