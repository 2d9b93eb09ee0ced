//! Cluster mode: several fencegate replicas sharing one fence table and one
//! ordering barrier through etcd (`[cluster]`; docs/cluster.md).
//!
//! - The fence and the admission are one etcd transaction per request
//!   ([`keys::admission`]): compare, raise, register, and read the lower
//!   writes in flight, linearizably, in one round trip.
//! - Every write in flight is registered under this replica's lease. A newer
//!   write waits until the lower registrations are gone: deleted when their
//!   write ends, or gone with the lease of a replica that died.
//! - A replica knows how fresh its lease is from a monotonic clock and its
//!   last acknowledged keep-alive ([`Cluster::fresh`]); a write whose lease
//!   may have lapsed (a pause, a partition) is failed before its last bytes
//!   go upstream.
//! - Raises made anywhere reach every replica through a watch, which aborts
//!   local lower-token writes still streaming (the gate does the aborting).
//!
//! It knows nothing of the gate: `gate.rs` calls it.

pub mod keys;
mod lease;
mod store;

use crate::config::ClusterConfig;
use crate::metric_names as m;
use etcd_client::{Client, ConnectOptions, EventType, TxnOp, WatchOptions};
use keys::{Keys, Outcome};
use lease::Lease;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// One etcd request gives up after this long (and counts as a failure).
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// Admission retries a failed transaction (a member going away, a leader
/// election) for up to this long before it answers 503.
const ADMIT_RETRY_FOR: Duration = Duration::from_secs(3);
/// Most deletions in one transaction (etcd's default cap is 128 operations).
const DEREGISTER_BATCH: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("this replica holds no current lease in etcd (etcd unreachable?)")]
    NoLease,
}

/// Why a wait for lower writes ended without them gone.
pub enum WaitError {
    TimedOut,
    Failed(ClusterError),
}

/// A write's in-flight registration: its key, and the lease generation it
/// was made under.
#[derive(Debug, Clone)]
pub struct Registration {
    pub key: String,
    lease: i64,
    pub generation: u64,
}

pub struct Cluster {
    client: Client,
    keys: Keys,
    /// This process's name in registration keys: random, fresh each start.
    replica: String,
    seq: AtomicU64,
    lease: Arc<Lease>,
    deregister: mpsc::UnboundedSender<String>,
}

fn etcd(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Etcd(e.to_string())
}

/// Runs one etcd request with [`OP_TIMEOUT`], counting it.
async fn call<T>(
    what: &'static str,
    f: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ClusterError> {
    metrics::counter!(m::ETCD_REQUESTS, "op" => what).increment(1);
    match tokio::time::timeout(OP_TIMEOUT, f).await {
        Ok(r) => r.map_err(etcd),
        Err(_) => Err(ClusterError::Etcd(format!("{what} timed out"))),
    }
}

impl Cluster {
    /// Connects (lazily: etcd may be down at start-up; the replica is then
    /// not ready) and starts the lease keeper and the deregistration worker.
    pub async fn start(cfg: &ClusterConfig) -> Result<Arc<Cluster>, String> {
        let (cluster, deregistered) = Cluster::connect(cfg).await?;
        tokio::spawn(cluster.lease.clone().keep(cluster.client.clone()));
        tokio::spawn(deregister_worker(
            cluster.client.clone(),
            deregistered,
            cluster.lease.ttl() * 2,
        ));
        tracing::info!(
            replica = cluster.replica,
            prefix = cfg.prefix,
            "cluster mode: fences in etcd"
        );
        Ok(Arc::new(cluster))
    }

    /// The shared table only, for tools (`fencegate fences import`): no
    /// lease, so it admits no write of its own, but reads and raises.
    pub async fn open_table(cfg: &ClusterConfig) -> Result<Arc<Cluster>, String> {
        Ok(Arc::new(Cluster::connect(cfg).await?.0))
    }

    async fn connect(
        cfg: &ClusterConfig,
    ) -> Result<(Cluster, mpsc::UnboundedReceiver<String>), String> {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let client = Client::connect(&cfg.etcd_endpoints, Some(opts))
            .await
            .map_err(|e| format!("cluster: cannot set up the etcd client: {e}"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let cluster = Cluster {
            client,
            keys: Keys::new(&cfg.prefix),
            replica: format!("{:016x}", rand::random::<u64>()),
            seq: AtomicU64::new(0),
            lease: Lease::new(Duration::from_millis(cfg.replica_ttl_ms)),
            deregister: tx,
        };
        Ok((cluster, rx))
    }

    /// Whether a write registered under `generation` may still let its last
    /// bytes go: its lease is the current one and cannot have expired.
    pub fn fresh(&self, generation: u64) -> bool {
        self.lease.fresh(generation)
    }

    /// Why this replica cannot fence right now, if it cannot.
    pub fn not_ready(&self) -> Option<String> {
        match self.lease.current() {
            Some(_) => None,
            None => Some(ClusterError::NoLease.to_string()),
        }
    }

    /// A registration key for a write of `token` on `resource`, under the
    /// current lease.
    pub fn registration(&self, resource: &str, token: u64) -> Result<Registration, ClusterError> {
        let (lease, generation) = self.lease.current().ok_or(ClusterError::NoLease)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        Ok(Registration {
            key: self.keys.registration(resource, token, &self.replica, seq),
            lease,
            generation,
        })
    }

    /// The registration is over (its write ended): deleted in the
    /// background, in batches, retried while etcd is away.
    pub fn deregister(&self, key: String) {
        let _ = self.deregister.send(key);
    }

    /// The admission transaction ([`keys::admission`]), retried on failure
    /// for a few seconds (it is idempotent for one registration).
    pub async fn admit(
        &self,
        resource: &str,
        token: u64,
        registration: Option<&Registration>,
    ) -> Result<Outcome, ClusterError> {
        let txn = keys::admission(
            &self.keys,
            resource,
            token,
            registration.map(|r| (r.key.as_str(), r.lease)),
            store::now_ms(),
        );
        let give_up = Instant::now() + ADMIT_RETRY_FOR;
        loop {
            let mut kv = self.client.kv_client();
            let result = call("admit", kv.txn(txn.clone())).await;
            let err = match result {
                Ok(resp) => return keys::outcome(&resp).map_err(ClusterError::Etcd),
                Err(e) => e,
            };
            if Instant::now() >= give_up {
                return Err(err);
            }
            tracing::debug!("admission on {resource} failed, retrying: {err}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every registration in `lower` (found by an admission at
    /// `revision`) is gone, or `deadline`.
    pub async fn wait_gone(
        &self,
        resource: &str,
        token: u64,
        lower: Vec<Vec<u8>>,
        revision: i64,
        deadline: tokio::time::Instant,
    ) -> Result<(), WaitError> {
        let mut left: HashSet<Vec<u8>> = lower.into_iter().collect();
        let (low, high) = self.keys.inflight_below(resource, token);
        let mut from = revision + 1;
        let wait = async {
            while !left.is_empty() {
                match self.watch_deletes(&low, &high, from, &mut left).await {
                    Ok(()) => {}
                    Err(e) => {
                        // The watch broke: read what is left, and go on from there.
                        tracing::debug!("watch on {resource} broke: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let (rev, still) = self.lower_now(&low, &high).await?;
                        left.retain(|k| still.contains(k));
                        from = rev + 1;
                    }
                }
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
        left: &mut HashSet<Vec<u8>>,
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

    async fn lower_now(
        &self,
        low: &str,
        high: &str,
    ) -> Result<(i64, HashSet<Vec<u8>>), ClusterError> {
        let opts = etcd_client::GetOptions::new()
            .with_range(high)
            .with_keys_only();
        let mut kv = self.client.kv_client();
        let resp = call("get", kv.get(low, Some(opts))).await?;
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        Ok((rev, resp.kvs().iter().map(|kv| kv.key().to_vec()).collect()))
    }

    /// Calls `raised(resource, token)` for every fence put in etcd by any
    /// replica, for as long as the process runs (the watch is re-made after
    /// a failure; a raise missed meanwhile only delays an abort, since a
    /// newer write still waits for the lower registrations to go).
    pub async fn follow_raises(self: Arc<Self>, raised: impl Fn(&str, u64) + Send) {
        let fences = self.keys.fences();
        loop {
            let mut w = self.client.watch_client();
            let opts = WatchOptions::new().with_prefix();
            let stream = call("watch", w.watch(fences.clone(), Some(opts))).await;
            if let Ok(mut stream) = stream {
                while let Ok(Some(resp)) = stream.message().await {
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        if ev.event_type() != EventType::Put {
                            continue;
                        }
                        if let (Some(r), Some((t, _))) = (
                            self.keys.resource_of(kv.key()),
                            keys::parse_fence(kv.value()),
                        ) {
                            raised(r, t);
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Deletes ended registrations in batches. A batch that fails is retried
/// until `give_up` has passed: by then a lease that etcd could not be told
/// about has expired, and its keys with it.
async fn deregister_worker(
    client: Client,
    mut rx: mpsc::UnboundedReceiver<String>,
    give_up: Duration,
) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, DEREGISTER_BATCH).await > 0 {
        let ops: Vec<TxnOp> = batch.drain(..).map(|k| TxnOp::delete(k, None)).collect();
        let txn = etcd_client::Txn::new().and_then(ops);
        let started = Instant::now();
        loop {
            let mut kv = client.kv_client();
            match call("deregister", kv.txn(txn.clone())).await {
                Ok(_) => break,
                Err(e) if started.elapsed() > give_up => {
                    tracing::warn!(
                        "giving up deleting in-flight registrations (their lease expires): {e}"
                    );
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}
