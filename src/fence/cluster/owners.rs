//! Owners (docs/cluster.md, "Owners"): each resource is admitted by one
//! replica at a time, so that the common write costs etcd nothing.
//!
//! - **Take.** One transaction: if `owners/<r>` is absent, put it under
//!   this replica's lease, put the `owned/<r>` marker, and read the fence
//!   and the marker as they were. The key's create revision is the
//!   owner's *epoch*. A marker found without an owner key means the last
//!   owner died (its lease took the key, not a release) with a write that
//!   may still land at the backend: the new owner waits out the quarantine,
//!   counted from its take, before it admits.
//! - **Admit.** While its lease is fresh (`lease.rs`), the owner admits
//!   with the single-node gate: nothing in etcd.
//! - **Raise.** A token above the fence is put only if the owner key
//!   still has this epoch: a former owner whose lease lapsed cannot raise.
//! - **Markers.** The owner deletes the marker while the resource is quiet
//!   and puts it back before the next write that needs it, both guarded by
//!   its epoch (`gate/owned.rs`, "Markers"): an owner that dies quiet
//!   leaves no wait either.
//! - **Release.** An idle or evicted resource's keys are deleted, guarded
//!   by the epoch: the next owner needs no wait.
//! - **Raises made elsewhere** (the admin API, eager fencing at a replica
//!   that does not own the resource) are put in etcd and then acknowledged
//!   by the owner: it applies the raise to its writes in flight and puts
//!   the revision it has reached at `seen/<replica>`. The raiser waits for
//!   that, or for the owner's key to go with its lease.

use super::keys::{pad, parse_fence};
use super::{Cluster, ClusterError, call};
use crate::fence::table::now_ms;
use etcd_client::{
    Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use std::time::Duration;
use tokio::time::Instant;

/// In-flight markers deleted per transaction (etcd allows 128 operations
/// in one by default).
const UNMARK_BATCH: usize = 64;

/// A replica's hold on one resource: the epoch of its owner key and the
/// lease generation the key was put under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tenure {
    pub epoch: i64,
    generation: u64,
}

/// What a take found.
pub enum Take {
    /// This replica owns the resource now. `after_death`: the previous
    /// owner's lease expired while it owned it, leaving its in-flight
    /// marker, which names it.
    Mine {
        tenure: Tenure,
        highest: Option<u64>,
        after_death: Option<Predecessor>,
    },
    /// Another replica owns it: its name, and its epoch.
    Theirs(String, i64),
    /// This replica's own key is still there, on its way out (a release
    /// in flight): ask again shortly.
    Leaving,
    /// This replica's own key, put under a lease it gave up on (etcd
    /// unreachable for a while), with that epoch: it goes when its lease
    /// expires, or when this replica, knowing it has nothing in flight
    /// there, releases it; keeping the marker when it is a dead
    /// predecessor's that the take inherited (true).
    Stale(i64, bool),
}

/// An owner that died with its in-flight marker in etcd, as the marker
/// names it: its replica name, and where it listened (markers put before
/// the address was known, or by older versions, have none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Predecessor {
    pub replica: String,
    pub url: Option<String>,
}

impl Predecessor {
    fn of_marker(value: &[u8]) -> Predecessor {
        let value = String::from_utf8_lossy(value);
        match value.split_once(' ') {
            Some((replica, url)) => Predecessor {
                replica: replica.to_string(),
                url: Some(url.to_string()),
            },
            None => Predecessor {
                replica: value.into_owned(),
                url: None,
            },
        }
    }
}

/// What an owner's raise found.
#[derive(Debug, PartialEq, Eq)]
pub enum OwnedRaise {
    /// The fence is at the token now: put by this raise, or already there
    /// (put by a raise at another replica).
    At { put: bool },
    /// The fence is above the token.
    Above(u64),
    /// The owner key is not this tenure's any more.
    Lost,
}

/// A raise made at a replica that does not own the resource.
pub struct UnownedRaise {
    pub highest: u64,
    pub raised: bool,
    /// The owner then (replica, epoch), and the raise's revision.
    pub owner: Option<(String, i64)>,
    pub revision: i64,
}

/// The gets of a transaction's branch, nested transactions followed.
fn gets(resp: &TxnResponse) -> (bool, Vec<Option<KeyValue>>) {
    let mut out = Vec::new();
    let mut ok = resp.succeeded();
    for op in resp.op_responses() {
        match op {
            TxnOpResponse::Get(g) => out.push(g.kvs().first().cloned()),
            TxnOpResponse::Txn(t) => {
                let (inner, more) = gets(&t);
                ok = ok || inner;
                out.extend(more);
            }
            _ => {}
        }
    }
    (ok, out)
}

fn fence_of(kv: &Option<KeyValue>) -> Option<u64> {
    kv.as_ref()
        .and_then(|kv| parse_fence(kv.value()))
        .map(|(t, _)| t)
}

/// Puts `token` as `fence` when it is missing or below, else runs `other`.
fn raise_or(fence: &str, token: u64, guard: Option<Compare>, other: Vec<TxnOp>) -> Txn {
    let put = TxnOp::put(fence, format!("{} {}", pad(token.into()), now_ms()), None);
    let when = |c: Compare| guard.iter().cloned().chain([c]).collect::<Vec<_>>();
    let below = Txn::new()
        .when(when(Compare::value(
            fence,
            CompareOp::Less,
            pad(token.into()),
        )))
        .and_then([put.clone()])
        .or_else(other);
    Txn::new()
        .when(when(Compare::create_revision(fence, CompareOp::Equal, 0)))
        .and_then([put])
        .or_else([TxnOp::txn(below)])
}

impl Cluster {
    /// Whether `tenure` still stands: its lease is the current one and
    /// surely alive.
    pub fn tenure_stands(&self, tenure: &Tenure) -> bool {
        self.lease.fresh(tenure.generation)
    }

    /// Whether `tenure` may stand again: its lease lapsed (etcd did not
    /// answer in time) but is not known gone (`lease.rs`). Its owner key
    /// stays in etcd for as long as the lease does, so nobody else can take
    /// the resource meanwhile.
    pub fn tenure_may_return(&self, tenure: &Tenure) -> bool {
        self.lease.is_current(tenure.generation)
    }

    /// How long a new owner waits after its predecessor's lease expired.
    pub fn expired_hold(&self) -> Duration {
        self.expired_hold
    }

    pub fn replica_name(&self) -> &str {
        &self.replica
    }

    /// The name of the process that used this data directory before, if
    /// the directory named one (`incarnation.rs`).
    pub fn previous_name(&self) -> Option<&str> {
        self.claim.as_ref()?.previous.as_deref()
    }

    /// An in-flight marker's value: this replica's name, and the URL the
    /// others reach it at once it is known (a successor asks there whether
    /// anything of this replica's can still land: `gate/owned.rs`).
    fn marker(&self) -> String {
        match self.advertised.get() {
            Some(url) => format!("{} {url}", self.replica),
            None => self.replica.clone(),
        }
    }

    /// Takes `resource` if nobody owns it ([`Take`]). Tried again on
    /// failure until `deadline`: a take applied whose answer was lost is
    /// found again as this replica's, and adopted.
    pub async fn take(
        &self,
        resource: &str,
        leaving: bool,
        deadline: Instant,
    ) -> Result<Take, ClusterError> {
        let (lease, generation) = self.lease.current().ok_or(ClusterError::NoLease)?;
        let owner = self.keys.owner(resource);
        let owned = self.keys.owned(resource);
        let fence = self.keys.fence(resource);
        let mine = PutOptions::new().with_lease(lease);
        let txn = Txn::new()
            .when([Compare::create_revision(
                owner.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::get(owned.as_str(), None),
                TxnOp::get(fence.as_str(), None),
                TxnOp::put(owner.as_str(), self.replica.as_str(), Some(mine)),
                TxnOp::put(owned, self.marker(), None),
            ])
            .or_else([
                TxnOp::get(owner, None),
                TxnOp::get(fence, None),
                TxnOp::get(self.keys.owned(resource), None),
            ]);
        let resp = self
            .retrying_leased("take", deadline, || txn.clone())
            .await?;
        let (took, got) = gets(&resp);
        if took {
            let epoch = resp.header().map(|h| h.revision()).unwrap_or_default();
            return Ok(Take::Mine {
                tenure: Tenure { epoch, generation },
                highest: fence_of(&got[1]),
                after_death: got[0].as_ref().map(|kv| Predecessor::of_marker(kv.value())),
            });
        }
        let holder = got[0].as_ref().ok_or(ClusterError::Etcd(
            "owner key vanished inside a transaction".into(),
        ))?;
        if holder.value() != self.replica.as_bytes() {
            return Ok(Take::Theirs(
                String::from_utf8_lossy(holder.value()).into_owned(),
                holder.create_revision(),
            ));
        }
        // Ours: a take whose answer was lost, under the lease held now, is
        // adopted (nobody else can have it, and nothing was admitted under
        // it); a key of an older lease, or one being released, must go
        // first.
        if leaving {
            return Ok(Take::Leaving);
        }
        // A marker older than our key was a dead predecessor's, found by
        // the take whose answer was lost (which put ours over it, keeping
        // its create revision): its quarantine is ours to wait, in full
        // (whom to ask is gone with its value).
        let inherited = got
            .get(2)
            .and_then(|kv| kv.as_ref())
            .is_some_and(|m| m.create_revision() < holder.create_revision());
        if holder.lease() != lease {
            return Ok(Take::Stale(holder.create_revision(), inherited));
        }
        Ok(Take::Mine {
            tenure: Tenure {
                epoch: holder.create_revision(),
                generation,
            },
            highest: fence_of(&got[1]),
            after_death: inherited.then(|| Predecessor {
                replica: String::new(),
                url: None,
            }),
        })
    }

    /// The owner's raise of `resource` to `token`, guarded by its epoch.
    pub async fn raise_owned(
        &self,
        resource: &str,
        token: u64,
        tenure: Tenure,
        deadline: Instant,
    ) -> Result<OwnedRaise, ClusterError> {
        let owner = self.keys.owner(resource);
        let fence = self.keys.fence(resource);
        let guard = Compare::create_revision(owner.as_str(), CompareOp::Equal, tenure.epoch);
        let read = vec![TxnOp::get(owner, None), TxnOp::get(fence.as_str(), None)];
        let txn = raise_or(&fence, token, Some(guard), read);
        let resp = self
            .retrying_leased("raise", deadline, || txn.clone())
            .await?;
        let (raised, got) = gets(&resp);
        if raised {
            return Ok(OwnedRaise::At { put: true });
        }
        let ours = got[0]
            .as_ref()
            .is_some_and(|kv| kv.create_revision() == tenure.epoch);
        Ok(match fence_of(&got[1]) {
            _ if !ours => OwnedRaise::Lost,
            Some(h) if h > token => OwnedRaise::Above(h),
            _ => OwnedRaise::At { put: false },
        })
    }

    /// A raise at a replica that does not own `resource`: put when above
    /// the fence, and the owner read in the same transaction.
    pub async fn raise_unowned(
        &self,
        resource: &str,
        token: u64,
        deadline: Instant,
    ) -> Result<UnownedRaise, ClusterError> {
        let owner = self.keys.owner(resource);
        let fence = self.keys.fence(resource);
        let read = vec![TxnOp::get(fence.as_str(), None)];
        let raise = raise_or(&fence, token, None, read);
        let txn = Txn::new()
            .when([])
            .and_then([TxnOp::get(owner, None), TxnOp::txn(raise)]);
        let resp = self.retrying("raise", deadline, || txn.clone()).await?;
        let (_, got) = gets(&resp);
        let raised = match resp.op_responses().pop() {
            Some(TxnOpResponse::Txn(t)) => gets(&t).0,
            _ => return Err(ClusterError::Etcd("raise answer has no branch".into())),
        };
        let fence = got.get(1).and_then(|kv| kv.as_ref());
        // What the owner must have applied: this raise, or the one that
        // put the fence where it is.
        let revision = match fence {
            Some(kv) => kv.mod_revision(),
            None => resp.header().map(|h| h.revision()).unwrap_or_default(),
        };
        let highest = fence
            .and_then(|kv| parse_fence(kv.value()))
            .map_or(token, |(h, _)| h.max(token));
        Ok(UnownedRaise {
            highest,
            raised,
            owner: got[0].as_ref().map(|kv| {
                let name = String::from_utf8_lossy(kv.value()).into_owned();
                (name, kv.create_revision())
            }),
            revision,
        })
    }

    /// Waits until `owner` (at `epoch`) has applied everything up to
    /// `revision`, or no longer owns `resource`.
    pub async fn wait_acknowledged(
        &self,
        resource: &str,
        (owner, epoch): (&str, i64),
        revision: i64,
        deadline: Instant,
    ) -> Result<(), ClusterError> {
        // An owner that took the resource after the raise read it then.
        if epoch > revision {
            return Ok(());
        }
        let txn = Txn::new().when([]).and_then([
            TxnOp::get(self.keys.seen(owner), None),
            TxnOp::get(self.keys.owner(resource), None),
        ]);
        loop {
            let resp = self
                .retrying("acknowledged", deadline, || txn.clone())
                .await?;
            let (_, got) = gets(&resp);
            let seen = got[0]
                .as_ref()
                .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse::<i64>().ok());
            let still = got[1]
                .as_ref()
                .is_some_and(|kv| kv.create_revision() == epoch);
            if !still || seen.is_some_and(|s| s >= revision) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ClusterError::Etcd(format!(
                    "replica {owner}, which owns {resource}, did not acknowledge the raise in time"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Lets `resource` go, if `epoch` is still its owner's; its in-flight
    /// marker too, unless `keep_marker` (a dead predecessor's write may
    /// still land: the next owner must wait again).
    pub async fn release(
        &self,
        resource: &str,
        epoch: i64,
        keep_marker: bool,
    ) -> Result<(), ClusterError> {
        let owner = self.keys.owner(resource);
        let mut deletes = vec![TxnOp::delete(owner.as_str(), None)];
        if !keep_marker {
            deletes.push(TxnOp::delete(self.keys.owned(resource), None));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                owner.as_str(),
                CompareOp::Equal,
                epoch,
            )])
            .and_then(deletes);
        let deadline = Instant::now() + Duration::from_secs(10);
        self.retrying("release", deadline, || txn.clone()).await?;
        Ok(())
    }

    /// Puts `resource`'s in-flight marker back if `epoch` is still its
    /// owner's; false when it is not.
    pub async fn mark(
        &self,
        resource: &str,
        epoch: i64,
        deadline: Instant,
    ) -> Result<bool, ClusterError> {
        let owner = self.keys.owner(resource);
        let txn = Txn::new()
            .when([Compare::create_revision(owner, CompareOp::Equal, epoch)])
            .and_then([TxnOp::put(self.keys.owned(resource), self.marker(), None)]);
        Ok(self
            .retrying_leased("mark", deadline, || txn.clone())
            .await?
            .succeeded())
    }

    /// Deletes the in-flight markers of `quiet` resources, each only if
    /// its epoch is still its owner's: one transaction per [`UNMARK_BATCH`].
    pub async fn unmark(&self, quiet: &[(&str, i64)]) -> Result<(), ClusterError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        for batch in quiet.chunks(UNMARK_BATCH) {
            let guarded = batch.iter().map(|(resource, epoch)| {
                let owner = self.keys.owner(resource);
                let delete = Txn::new()
                    .when([Compare::create_revision(owner, CompareOp::Equal, *epoch)])
                    .and_then([TxnOp::delete(self.keys.owned(resource), None)]);
                TxnOp::txn(delete)
            });
            let txn = Txn::new().and_then(guarded.collect::<Vec<_>>());
            self.retrying("unmark", deadline, || txn.clone()).await?;
        }
        Ok(())
    }

    /// Says this replica has applied every raise up to `revision`.
    pub async fn acknowledge(&self, revision: i64) -> Result<(), ClusterError> {
        let (lease, _) = self.lease.current().ok_or(ClusterError::NoLease)?;
        let opts = PutOptions::new().with_lease(lease);
        let mut kv = self.client.kv_client();
        let put = kv.put(
            self.keys.seen(&self.replica),
            revision.to_string(),
            Some(opts),
        );
        call("acknowledge", put).await?;
        Ok(())
    }

    /// The revision etcd is at now.
    pub async fn revision(&self) -> Result<i64, ClusterError> {
        let mut kv = self.client.kv_client();
        let resp = call("get", kv.get(self.keys.seen(&self.replica), None)).await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or_default())
    }

    /// [`Cluster::retrying`] for what only a replica with a fresh lease
    /// may do (take, raise, mark): given up at once when the lease is not
    /// fresh (etcd cut off), so that the client hears `503` now rather
    /// than when its wait runs out.
    async fn retrying_leased(
        &self,
        what: &'static str,
        deadline: Instant,
        txn: impl Fn() -> Txn,
    ) -> Result<TxnResponse, ClusterError> {
        self.retry(what, deadline, true, txn).await
    }

    /// One transaction, tried again on failure until `deadline` (every
    /// one of them may be applied twice).
    async fn retrying(
        &self,
        what: &'static str,
        deadline: Instant,
        txn: impl Fn() -> Txn,
    ) -> Result<TxnResponse, ClusterError> {
        self.retry(what, deadline, false, txn).await
    }

    /// The loop of both: with `leased`, each try first checks that the
    /// lease is fresh.
    async fn retry(
        &self,
        what: &'static str,
        deadline: Instant,
        leased: bool,
        txn: impl Fn() -> Txn,
    ) -> Result<TxnResponse, ClusterError> {
        loop {
            if leased {
                self.lease.current().ok_or(ClusterError::NoLease)?;
            }
            let mut kv = self.client.kv_client();
            match call(what, kv.txn(txn())).await {
                Ok(r) => return Ok(r),
                Err(e) if Instant::now() + Duration::from_millis(100) >= deadline => return Err(e),
                Err(e) => tracing::debug!("{what} failed, retrying: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
