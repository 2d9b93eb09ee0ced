//! The object hold across replicas (CONTRACT §8; `fence::hold` is the
//! single-node one): etcd's read-write lock recipe, under the replica's
//! lease.
//!
//! A write puts its key under the object's prefix and reads the prefix in
//! one transaction (its own here; for a fenced write without conditions,
//! its admission's, `keys::admission`). Keys made before its own (a lower create revision) are
//! the writes it must follow: every one of them when it holds alone, only
//! those holding alone when it shares. It then waits until those are gone
//! (their write ended, or their replica's lease expired, after which the
//! quarantine is waited out too, as for the ordering barrier). Revisions
//! order every hold of the object, so waits never go round in a circle.

use super::keys::{ALONE, HoldSeen, SHARED, holds_before};
use super::{Cluster, ClusterError, Lower, Registration, WaitError, call};
use etcd_client::{GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

impl Cluster {
    /// Holds `object` (`bucket/key`) until the registration returned is
    /// dropped: alone, or beside other shared holds. Gives up at
    /// `deadline`.
    pub async fn hold(
        self: &Arc<Self>,
        object: &str,
        alone: bool,
        deadline: Instant,
    ) -> Result<Registration, WaitError> {
        let failed = WaitError::Failed;
        let reg = self.hold_key(object).map_err(failed)?;
        let (before, revision) = self
            .put_hold(&reg, object, alone, deadline)
            .await
            .map_err(failed)?;
        self.wait_holds_gone(object, before, revision, deadline)
            .await?;
        Ok(reg)
    }

    /// A hold on `object`, made under the current lease, for an admission
    /// to put together with its registration ([`super::keys::Puts`]).
    pub fn hold_key(self: &Arc<Self>, object: &str) -> Result<Registration, ClusterError> {
        self.register(|keys, replica, seq| keys.hold(object, replica, seq))
    }

    /// Waits until every hold in `before` (read on `object` at `revision`)
    /// is gone, plus the expiry hold if one went with its lease.
    pub async fn wait_holds_gone(
        &self,
        object: &str,
        before: Lower,
        revision: i64,
        deadline: Instant,
    ) -> Result<(), WaitError> {
        if before.is_empty() {
            return Ok(());
        }
        let (base, end) = self.keys.holds_of(object);
        self.wait_range_gone(object, (&base, &end), before, revision, deadline)
            .await
    }

    /// Puts the hold's key and reads the object's other holds, retried
    /// through a member's loss (the put is idempotent for one key).
    /// Returns the holds to wait for and the revision they were read at.
    async fn put_hold(
        &self,
        reg: &Registration,
        object: &str,
        alone: bool,
        deadline: Instant,
    ) -> Result<(Lower, i64), ClusterError> {
        let mode = if alone { ALONE } else { SHARED };
        let (base, end) = self.keys.holds_of(object);
        let txn = Txn::new().and_then([
            TxnOp::put(
                reg.key.as_str(),
                mode,
                Some(PutOptions::new().with_lease(reg.lease)),
            ),
            TxnOp::get(base.as_str(), Some(GetOptions::new().with_range(end))),
        ]);
        let give_up = deadline.min(Instant::now() + super::ADMIT_RETRY_FOR);
        loop {
            if !reg.fresh() {
                return Err(ClusterError::NoLease);
            }
            let mut kv = self.client.kv_client();
            let err = match call("hold", kv.txn(txn.clone())).await {
                Ok(resp) => return read_holds(&resp, &reg.key, alone),
                Err(e) => e,
            };
            if Instant::now() >= give_up {
                return Err(err);
            }
            tracing::debug!("holding {base} failed, retrying: {err}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// From the answer of the hold transaction: the holds made before `mine`
/// that a hold of this kind must wait for, and the revision of the read.
fn read_holds(
    resp: &etcd_client::TxnResponse,
    mine: &str,
    alone: bool,
) -> Result<(Lower, i64), ClusterError> {
    let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
    let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().nth(1) else {
        return Err(ClusterError::Etcd("hold answer without its range".into()));
    };
    let seen: Vec<HoldSeen> = got.kvs().iter().map(HoldSeen::of).collect();
    let before = holds_before(&seen, mine, alone).map_err(ClusterError::Etcd)?;
    Ok((before, revision))
}
