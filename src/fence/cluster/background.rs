//! What a replica runs beside its requests: following raises made anywhere,
//! deleting ended registrations in batches, and sweeping its own leftovers.

use super::{Cluster, call, keys};
use etcd_client::{EventType, GetOptions, TxnOp, WatchOptions, WatchResponse};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Most deletions in one transaction (etcd's default cap is 128 operations).
const DEREGISTER_BATCH: usize = 100;

/// What [`Cluster::follow_raises`] reports.
pub enum Seen<'a> {
    /// A fence was put, by any replica.
    Raised(&'a str, u64),
    /// Every raise up to this revision has been reported.
    Through(i64),
    /// Raises may have been missed (history compacted while the watch was
    /// down): re-read what matters.
    Gap,
}

impl Cluster {
    /// Reports every fence put in etcd by any replica, for as long as the
    /// process runs. The watch resumes after the last revision it saw; if
    /// that history is gone it reports a [`Seen::Gap`].
    pub async fn follow_raises(self: Arc<Self>, seen: impl Fn(Seen<'_>) + Send) {
        let fences = self.keys.fences();
        self.watch_prefix(fences, None, |resp| {
            let Some(resp) = resp else {
                return seen(Seen::Gap);
            };
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                if ev.event_type() != EventType::Put {
                    continue;
                }
                if let (Some(r), Some((t, _))) = (
                    self.keys.resource_of(kv.key()),
                    keys::parse_fence(kv.value()),
                ) {
                    seen(Seen::Raised(r, t));
                }
            }
            if let Some(h) = resp.header() {
                seen(Seen::Through(h.revision()));
            }
        })
        .await
    }

    /// Hands every answer of a watch of `prefix` to `each`, for as long as
    /// the process runs. The watch resumes after the last revision it saw;
    /// if that history is gone (compacted) it starts again from now and
    /// hands `None` first.
    pub(super) async fn watch_prefix(
        &self,
        prefix: String,
        from: Option<i64>,
        mut each: impl FnMut(Option<&WatchResponse>),
    ) {
        let mut next: Option<i64> = from;
        loop {
            let mut opts = WatchOptions::new().with_prefix();
            if let Some(rev) = next {
                opts = opts.with_start_revision(rev);
            }
            let mut w = self.client.watch_client();
            if let Ok(mut stream) = call("watch", w.watch(prefix.clone(), Some(opts))).await {
                while let Ok(Some(resp)) = stream.message().await {
                    if resp.canceled() {
                        if resp.compact_revision() > 0 {
                            next = None;
                            each(None);
                        }
                        break;
                    }
                    if let Some(h) = resp.header() {
                        next = Some(h.revision() + 1);
                    }
                    each(Some(&resp));
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Every `every`, deletes this replica's registrations and holds that
    /// etcd has but no write here does: a transaction applied after its
    /// request had given up on it.
    pub(super) async fn sweep(self: Arc<Self>, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            for kind in ["inflight/", "holds/"] {
                self.sweep_one(&format!("{}{kind}", self.keys.prefix()))
                    .await;
            }
        }
    }

    /// Deletes this replica's stray keys under `all`.
    async fn sweep_one(&self, all: &str) {
        let mine = format!("/{}-", self.replica);
        let opts = GetOptions::new()
            .with_range(keys::prefix_end(all))
            .with_keys_only();
        let mut kv = self.client.kv_client();
        let Ok(resp) = call("sweep", kv.get(all, Some(opts))).await else {
            return;
        };
        let stray: Vec<String> = {
            let live = self.live();
            resp.kvs()
                .iter()
                .filter_map(|kv| std::str::from_utf8(kv.key()).ok())
                .filter(|k| k.contains(&mine) && !live.contains(*k))
                .map(str::to_string)
                .collect()
        };
        if !stray.is_empty() {
            tracing::info!(count = stray.len(), "deleting stray keys under {all}");
            let generation = self.lease.current().map_or(0, |(_, g)| g);
            for k in stray {
                let _ = self.deregister.send((k, generation));
            }
        }
    }
}

/// How long deletions of a lease that is no longer current are still
/// retried. An etcd that restarts gives every lease a fresh TTL, so keys
/// of a lease this replica gave up on during the outage would otherwise
/// hold newer writes for that TTL, and then for the expiry hold.
const RETRY_AFTER_LEASE_LOST: Duration = Duration::from_secs(60);

/// Deletes ended registrations in batches. Their writes have ended, so a
/// deletion is always right; a batch that fails is retried for as long as
/// the lease its keys were made under is the current one, and for
/// [`RETRY_AFTER_LEASE_LOST`] after that (then etcd expires them with it).
pub(super) async fn deregister_worker(
    cluster: Arc<Cluster>,
    mut rx: mpsc::UnboundedReceiver<(String, u64)>,
) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, DEREGISTER_BATCH).await > 0 {
        let started = Instant::now();
        let mut warned = Instant::now();
        loop {
            let recent = started.elapsed() < RETRY_AFTER_LEASE_LOST;
            batch.retain(|(_, g)| recent || cluster.lease.is_current(*g));
            if batch.is_empty() {
                break;
            }
            let ops: Vec<TxnOp> = batch
                .iter()
                .map(|(k, _)| TxnOp::delete(k.as_str(), None))
                .collect();
            let mut kv = cluster.client.kv_client();
            match call("deregister", kv.txn(etcd_client::Txn::new().and_then(ops))).await {
                Ok(_) => break,
                Err(e) => {
                    if warned.elapsed() > Duration::from_secs(10) {
                        tracing::warn!("deleting in-flight registrations keeps failing: {e}");
                        warned = Instant::now();
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        batch.clear();
    }
}
