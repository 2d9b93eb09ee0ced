//! Cluster mode: several fencegate replicas sharing one fence table and one
//! ordering barrier through etcd (`[cluster]`; docs/cluster.md). There are
//! two modes, chosen by `cluster.ownership`.
//!
//! With owners (the default, `owners.rs`), each resource is admitted by one
//! replica at a time, and etcd is asked only when a fence or an owner moves:
//!
//! - A replica takes a resource nobody owns in one transaction; the owner
//!   key's create revision is its epoch. While its lease is fresh, the
//!   owner admits with the single-node steps, in memory.
//! - A raise by the owner is put only if the owner key still has its epoch.
//!   Raises made at another replica (the admin API, eager fencing) are put
//!   in etcd and acknowledged by the owner before they are answered.
//! - Other replicas forward the resource's requests to the owner, found at
//!   `replicas/<owner>` (`directory.rs`; the proxy's `to_owner.rs` sends them).
//! - An idle or evicted resource is released. When an owner dies, its key
//!   goes with its lease; the next owner waits out the quarantine (counted
//!   from its take) before it admits only if the owner's in-flight marker is
//!   still there (a write may still land; `gate/owned.rs`, "Markers").
//!
//! Without owners (`ownership = false`), every fenced request goes to etcd:
//!
//! - The fence and the admission are one etcd transaction per request
//!   ([`keys::admission`]): compare, raise, register, and read the lower
//!   writes in flight, linearizably, in one round trip. Admissions of
//!   distinct resources that arrive while one is on its way go together in
//!   the next transaction (`batch.rs`).
//! - Every write in flight is registered under this replica's lease. A newer
//!   write waits until the lower registrations are gone (`wait.rs`): deleted
//!   when their write ends, or gone with the lease of a replica that died.
//!
//! In both modes:
//!
//! - A replica knows how fresh its lease is from a monotonic clock and its
//!   last acknowledged keep-alive (`lease.rs`, [`Registration::fresh`]); a
//!   write whose lease may have lapsed (a pause, a partition) is failed
//!   before its last bytes go upstream.
//! - Raises made anywhere reach every replica through a watch, which aborts
//!   local lower-token writes still streaming (the gate does the aborting).
//! - The object holds of conditional writes (`holds.rs`) are keys under
//!   the replica's lease, waited for as registrations are. Without owners,
//!   a fenced write without conditions puts its shared hold in its
//!   admission transaction ([`keys::Puts`]); the others take theirs apart.
//!   With owners, an object of a fenced resource is held by its owner, in
//!   memory: only holds on objects outside any fenced resource are in
//!   etcd.
//! - `table.rs` makes the fences and the open uploads' tokens a
//!   `FenceTable` (the admin API's listing, `fences import`, multipart
//!   uploads).
//!
//! It knows nothing of the gate: `gate/owned.rs` and `gate/cluster.rs`
//! call it.

mod background;
mod batch;
mod directory;
mod holds;
pub mod incarnation;
pub mod keys;
mod lease;
mod owners;
mod table;
mod wait;

pub use background::Seen;
pub use owners::{OwnedRaise, Predecessor, Take, Tenure, UnownedRaise};
pub use wait::Lower;

use crate::config::ClusterConfig;
use crate::metric_names as m;
use etcd_client::{Client, ConnectOptions};
use keys::{Keys, Outcome};
use lease::Lease;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// One etcd request gives up after this long (and counts as a failure).
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a start waits for the previous incarnation's keys to be ended
/// before it serves (they are ended in the background after that).
const END_INCARNATION_FOR: Duration = Duration::from_secs(3);
/// Admission retries a failed transaction (a member going away, a leader
/// election) for up to this long, within `admission_wait_ms`, before it
/// answers 503.
const ADMIT_RETRY_FOR: Duration = Duration::from_secs(6);

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
/// was made under. Dropping it deletes the key (in the background), so an
/// admission that fails or is cancelled halfway cannot leave it behind.
pub struct Registration {
    pub key: String,
    lease: i64,
    generation: u64,
    cluster: Arc<Cluster>,
}

impl Registration {
    /// Whether the write may still let its last bytes go: its lease is the
    /// current one and cannot have expired.
    pub fn fresh(&self) -> bool {
        self.cluster.lease.fresh(self.generation)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.cluster.live().remove(&self.key);
        let key = std::mem::take(&mut self.key);
        let _ = self.cluster.deregister.send((key, self.generation));
    }
}

pub struct Cluster {
    client: Client,
    keys: Keys,
    /// This process's name in registration keys: random, fresh each start.
    replica: String,
    seq: AtomicU64,
    lease: Arc<Lease>,
    /// To the batching task (`batch.rs`).
    admissions: mpsc::UnboundedSender<batch::Admission>,
    deregister: mpsc::UnboundedSender<(String, u64)>,
    /// This replica's registrations now: the sweep deletes any other key of
    /// this replica it finds in etcd (a transaction applied after its
    /// admission had given up on it).
    live: std::sync::Mutex<HashSet<String>>,
    /// How long newer writes still wait after a lower write's replica lost
    /// its lease: the backend may still apply a body it already had.
    expired_hold: Duration,
    /// `cluster.ownership`: resources are owned by one replica at a time
    /// (`owners.rs`) rather than admitted in etcd write by write.
    pub owning: bool,
    /// This replica's S3 URL for the others, once advertised (`directory.rs`).
    advertised: std::sync::OnceLock<String>,
    /// Other replicas' S3 URLs (`directory.rs`).
    addresses: dashmap::DashMap<String, String>,
    /// Replicas whose lease has ended, and a count bumped at each.
    departed: dashmap::DashMap<String, ()>,
    departures: tokio::sync::watch::Sender<u64>,
    /// Open uploads' tokens read or put here (`table.rs`).
    upload_tokens: dashmap::DashMap<String, u64>,
    /// The data directory's lock, held while the process runs
    /// (`incarnation.rs`); none for tools.
    claim: Option<incarnation::Claim>,
    /// The writes in doubt, among them those the previous process on the
    /// data directory left (`incarnation.rs` lets go of what they do not
    /// keep).
    doubts: Option<Arc<crate::fence::doubt::Doubts>>,
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

/// The cluster's etcd client. Plain, it connects lazily (etcd may be
/// down at start-up: the replica is then not ready). With a user, the
/// client authenticates at once: a wrong password, or a certificate either
/// side refuses, stops start-up; etcd merely unreachable does not (the
/// client authenticates on its first request instead).
async fn connect_etcd(cfg: &ClusterConfig, base: ConnectOptions) -> Result<Client, String> {
    use crate::access::{
        etcd_connect, etcd_error, etcd_error_is_permanent, etcd_failure, etcd_options,
    };
    let cannot = |e: String| format!("cluster: cannot reach etcd: {e}");
    let access = &cfg.etcd_access;
    let e = match etcd_connect(&cfg.etcd_endpoints, base.clone(), access).await {
        Ok(mut c) => {
            // A client without a user connects lazily: one request finds a
            // certificate either side refuses now rather than later.
            let probe = tokio::time::timeout(Duration::from_secs(3), c.status()).await;
            match probe {
                Ok(Err(e)) => {
                    let e = etcd_failure(&cfg.etcd_endpoints, access, &e);
                    if etcd_error_is_permanent(&e) {
                        return Err(cannot(e));
                    }
                    tracing::warn!(error = %e, "cluster: etcd not reachable at start-up; not ready until it is");
                }
                Err(_) => tracing::warn!(
                    "cluster: etcd did not answer at start-up; not ready until it does"
                ),
                Ok(Ok(_)) => {}
            }
            return Ok(c);
        }
        Err(e) => e,
    };
    let Some((user, password)) = access.credentials().map_err(cannot)? else {
        return Err(cannot(e));
    };
    if etcd_error_is_permanent(&e) {
        return Err(cannot(e));
    }
    tracing::warn!(error = %e, "cluster: etcd not reachable at start-up; not ready until it is");
    let anonymous = crate::config::access::AccessConfig {
        user: None,
        password_file: None,
        password_env: None,
        ..access.clone()
    };
    let opts = etcd_options(&cfg.etcd_endpoints, base, &anonymous)
        .map_err(cannot)?
        .with_auto_token_refresh(true);
    let client = Client::connect(&cfg.etcd_endpoints, Some(opts))
        .await
        .map_err(|e| cannot(etcd_error(&e)))?;
    // The user is set once etcd answers; until then requests fail as
    // they would with etcd down.
    let mut c = client.clone();
    let password = password.expose().to_string();
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        while let Err(e) = c.update_user(Some((user.clone(), password.clone()))).await {
            tracing::debug!(error = %etcd_error(&e), "cluster: etcd authentication");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    });
    Ok(client)
}

impl Cluster {
    /// Connects (lazily: etcd may be down at start-up; the replica is then
    /// not ready) and starts the lease keeper, the deregistration worker
    /// and the sweep.
    ///
    /// `quarantine` is `fence.quarantine_ms`: the longest the backend may
    /// take to apply a request it already has. A write whose replica lost
    /// its lease had its body at the backend by the expiry, at the latest
    /// (a replica cut off from etcd sends while its lease is fresh), so
    /// newer writes wait the quarantine after the expiry
    /// ([`Lease::hold_after_expiry`]).
    ///
    /// `data_dir` names the process that used it before
    /// (`incarnation.rs`): what that one left in etcd is ended first, for
    /// up to [`END_INCARNATION_FOR`], then in the background. `doubts`
    /// holds what that process left in flight (`fence::landing`).
    pub async fn start(
        cfg: &ClusterConfig,
        quarantine: Duration,
        data_dir: &std::path::Path,
        doubts: Arc<crate::fence::doubt::Doubts>,
    ) -> Result<Arc<Cluster>, String> {
        let (mut cluster, deregistered) = Cluster::connect(cfg).await?;
        let ttl = cluster.lease.ttl();
        cluster.expired_hold = Lease::hold_after_expiry(quarantine);
        cluster.claim = Some(incarnation::claim(data_dir, &cluster.replica)?);
        cluster.doubts = Some(doubts);
        let cluster = Arc::new(cluster);
        cluster.clone().end_previous().await;
        tokio::spawn(cluster.lease.clone().keep(cluster.client.clone()));
        tokio::spawn(background::deregister_worker(cluster.clone(), deregistered));
        tokio::spawn(cluster.clone().sweep(ttl));
        if cluster.owning {
            tokio::spawn(cluster.clone().follow_replicas());
        }
        tracing::info!(
            replica = cluster.replica,
            prefix = cfg.prefix,
            "cluster mode: fences in etcd"
        );
        Ok(cluster)
    }

    /// Ends the previous incarnation's keys, if the data directory named
    /// one: waits for it up to [`END_INCARNATION_FOR`], so that its
    /// resources are served at once, and lets it go on after that.
    async fn end_previous(self: Arc<Self>) {
        let previous = self.claim.as_ref().and_then(|c| c.previous.clone());
        let Some(old) = previous else { return };
        let ending = tokio::spawn(async move {
            let (let_go, kept) = self.end_incarnation(&old).await;
            tracing::info!(
                previous = old,
                let_go,
                kept_for_quarantine = kept,
                "cluster: ended this data directory's previous replica in etcd"
            );
        });
        let _ = tokio::time::timeout(END_INCARNATION_FOR, ending).await;
    }

    /// The shared table only, for tools (`fencegate fences import`): no
    /// lease, so it admits no write of its own, but reads and raises.
    pub async fn open_table(cfg: &ClusterConfig) -> Result<Arc<Cluster>, String> {
        Ok(Arc::new(Cluster::connect(cfg).await?.0))
    }

    async fn connect(
        cfg: &ClusterConfig,
    ) -> Result<(Cluster, mpsc::UnboundedReceiver<(String, u64)>), String> {
        // A member without a leader fails a request at once (rather than
        // holding it until an election ends), so that it is retried.
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_require_leader(true);
        let client = connect_etcd(cfg, opts).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (admissions, batched) = mpsc::unbounded_channel();
        tokio::spawn(batch::run(client.clone(), batched));
        let cluster = Cluster {
            admissions,
            client,
            keys: Keys::new(&cfg.prefix),
            replica: format!("{:016x}", rand::random::<u64>()),
            seq: AtomicU64::new(0),
            lease: Lease::new(Duration::from_millis(cfg.replica_ttl_ms)),
            deregister: tx,
            live: Default::default(),
            expired_hold: Duration::ZERO,
            owning: cfg.ownership,
            advertised: Default::default(),
            addresses: Default::default(),
            departed: Default::default(),
            departures: tokio::sync::watch::Sender::new(0),
            upload_tokens: Default::default(),
            claim: None,
            doubts: None,
        };
        Ok((cluster, rx))
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // A set insert or remove per critical section: poisoning is harmless.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why this replica cannot fence right now, if it cannot.
    pub fn not_ready(&self) -> Option<String> {
        match self.lease.current() {
            Some(_) => None,
            None => Some(ClusterError::NoLease.to_string()),
        }
    }

    /// Whether the lease, lapsed moments ago (within [`ADMIT_RETRY_FOR`]),
    /// is fresh again before `deadline`: an election that outlasted it ended
    /// and etcd answered. An admission refused meanwhile may be tried again.
    pub async fn lease_back_by(&self, deadline: tokio::time::Instant) -> bool {
        self.lease.fresh_within(deadline, ADMIT_RETRY_FOR).await
    }

    /// A registration for a write of `token` on `resource`, under the
    /// current lease.
    pub fn registration(
        self: &Arc<Self>,
        resource: &str,
        token: u64,
    ) -> Result<Registration, ClusterError> {
        self.register(|keys, replica, seq| keys.registration(resource, token, replica, seq))
    }

    /// A registration of the key `make` names (from this replica's name and
    /// a sequence number), under the current lease.
    fn register(
        self: &Arc<Self>,
        make: impl FnOnce(&Keys, &str, u64) -> String,
    ) -> Result<Registration, ClusterError> {
        let (lease, generation) = self.lease.current().ok_or(ClusterError::NoLease)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let key = make(&self.keys, &self.replica, seq);
        self.live().insert(key.clone());
        Ok(Registration {
            key,
            lease,
            generation,
            cluster: self.clone(),
        })
    }

    /// The admission transaction ([`keys::admission`]), retried on failure
    /// for a few seconds (it is idempotent for one registration). `hold`
    /// is the write's shared hold on `object`, put in the same transaction.
    pub async fn admit(
        &self,
        resource: &str,
        token: u64,
        registration: Option<&Registration>,
        hold: Option<(&Registration, &str)>,
        deadline: tokio::time::Instant,
    ) -> Result<Outcome, ClusterError> {
        let puts = keys::Puts {
            registration: registration.map(|r| (r.key.as_str(), r.lease)),
            hold: hold.map(|(r, object)| (r.key.as_str(), r.lease, object)),
        };
        let txn = keys::admission(
            &self.keys,
            resource,
            token,
            puts,
            crate::fence::table::now_ms(),
        );
        let give_up = deadline.min(tokio::time::Instant::now() + ADMIT_RETRY_FOR);
        loop {
            // A key under a lease that is gone can never be put.
            let lapsed = |r: &Registration| !r.fresh();
            if registration.is_some_and(lapsed) || hold.is_some_and(|(r, _)| lapsed(r)) {
                return Err(ClusterError::NoLease);
            }
            let (reply, answer) = tokio::sync::oneshot::channel();
            let sent = self.admissions.send(batch::Admission {
                resource: resource.to_string(),
                txn: txn.clone(),
                reply,
            });
            let result = match sent {
                Ok(()) => match tokio::time::timeout_at(give_up, answer).await {
                    Ok(Ok(r)) => r,
                    Ok(Err(_)) => Err(ClusterError::Etcd("admission task gone".into())),
                    Err(_) => return Err(ClusterError::Etcd("admission timed out".into())),
                },
                Err(_) => Err(ClusterError::Etcd("admission task gone".into())),
            };
            let err = match result {
                Ok(outcome) => return Ok(outcome),
                Err(e) => e,
            };
            if tokio::time::Instant::now() >= give_up {
                return Err(err);
            }
            tracing::debug!("admission on {resource} failed, retrying: {err}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
