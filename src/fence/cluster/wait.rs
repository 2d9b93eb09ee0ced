//! The cross-replica barrier: waiting until the lower-token writes an
//! admission found in flight (at any replica) are gone, and, when one went
//! with its replica's lease rather than by its own end, the quarantine on
//! top, slept from when the lease is found expired (the backend may still
//! apply a body it already had).

use super::{Cluster, ClusterError, WaitError, call, etcd};
use etcd_client::{EventType, GetOptions, WatchOptions};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tokio::time::Instant;

/// In-flight registrations below a token: key → the lease it is under.
pub type Lower = HashMap<Vec<u8>, i64>;

impl Cluster {
    /// Waits until every registration in `lower` (found by an admission at
    /// `revision`) is gone, plus the expiry hold if one went with its
    /// lease; gives up at `deadline`.
    pub async fn wait_gone(
        &self,
        resource: &str,
        token: u64,
        lower: Lower,
        revision: i64,
        deadline: Instant,
    ) -> Result<(), WaitError> {
        let (low, high) = self.keys.inflight_below(resource, token);
        self.wait_range_gone(resource, (&low, &high), lower, revision, deadline)
            .await
    }

    /// Waits until every key of `lower`, all in the range `[low, high)`
    /// and found there at `revision`, is gone, plus the expiry hold if one
    /// went with its lease; gives up at `deadline`. `what` names them in
    /// logs.
    pub(super) async fn wait_range_gone(
        &self,
        what: &str,
        (low, high): (&str, &str),
        lower: Lower,
        revision: i64,
        deadline: Instant,
    ) -> Result<(), WaitError> {
        let leases: HashSet<i64> = lower.values().copied().collect();
        let mut left = lower;
        let mut from = revision + 1;
        // etcd errors (a member gone, an election) are retried until the
        // deadline: the wait ends only when the writes are surely gone.
        let wait = async {
            while !left.is_empty() {
                if let Err(e) = self.watch_deletes(low, high, from, &mut left).await {
                    // The watch broke (or history was compacted): read
                    // what is left, and go on from there.
                    tracing::debug!("watch on {what} broke: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    match self.lower_now(low, high).await {
                        Ok((rev, still)) => {
                            left.retain(|k, _| still.contains(k));
                            from = rev + 1;
                        }
                        Err(e) => tracing::debug!("reading {what}'s writes in flight: {e}"),
                    }
                }
            }
            let expired = loop {
                if self.expired_hold.is_zero() {
                    break false;
                }
                match self.any_expired(&leases).await {
                    Ok(x) => break x,
                    Err(e) => {
                        tracing::debug!("asking etcd for leases: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            };
            if expired {
                tracing::info!(
                    resource = what,
                    hold_ms = self.expired_hold.as_millis() as u64,
                    "a write's replica lost its lease: holding the writes after it for the quarantine"
                );
                tokio::time::sleep(self.expired_hold).await;
            }
            Ok::<(), ClusterError>(())
        };
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(WaitError::Failed(e)),
            Err(_) => Err(WaitError::TimedOut),
        }
    }

    /// Follows deletions in `[low, high)` from revision `from` until none
    /// of `left` remains.
    async fn watch_deletes(
        &self,
        low: &str,
        high: &str,
        from: i64,
        left: &mut Lower,
    ) -> Result<(), ClusterError> {
        let opts = WatchOptions::new()
            .with_range(high)
            .with_start_revision(from);
        let mut w = self.client.watch_client();
        let mut stream = call("watch", w.watch(low, Some(opts))).await?;
        while !left.is_empty() {
            let Some(resp) = stream.message().await.map_err(etcd)? else {
                return Err(ClusterError::Etcd("watch ended".into()));
            };
            if resp.canceled() {
                return Err(ClusterError::Etcd(format!(
                    "watch canceled: {}",
                    resp.cancel_reason()
                )));
            }
            for ev in resp.events() {
                if ev.event_type() == EventType::Delete
                    && let Some(kv) = ev.kv()
                {
                    left.remove(kv.key());
                }
            }
        }
        Ok(())
    }

    /// The registrations in `[low, high)` now, and the revision read at.
    async fn lower_now(
        &self,
        low: &str,
        high: &str,
    ) -> Result<(i64, HashSet<Vec<u8>>), ClusterError> {
        let opts = GetOptions::new().with_range(high).with_keys_only();
        let mut kv = self.client.kv_client();
        let resp = call("get", kv.get(low, Some(opts))).await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        Ok((rev, resp.kvs().iter().map(|kv| kv.key().to_vec()).collect()))
    }

    /// Whether any of `leases` has expired (its replica died, paused, or
    /// was cut off), rather than being alive with its writes ended.
    async fn any_expired(&self, leases: &HashSet<i64>) -> Result<bool, ClusterError> {
        for &id in leases {
            let mut lc = self.client.lease_client();
            match call("lease_ttl", lc.time_to_live(id, None)).await {
                Ok(r) if r.ttl() > 0 => {}
                Ok(_) => return Ok(true),
                Err(e) if e.to_string().contains("not found") => return Ok(true),
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}
