//! The names of fencegate's Prometheus metrics, each with what it counts.
//! The modules that record metrics (`fence`, `s3`, `proxy`, `locks`,
//! `server`, `connection`, `store`, `upstream`) import only these names
//! and [`handles`], and the admin listener, which installs the recorder
//! and renders it, imports them too (`admin::metrics`). It depends on
//! `per_thread` alone.

/// Requests by `op` and `outcome`: forwarded, `S3Error::outcome`'s words
/// (stale, not_issued, missing, invalid, condition_failed, auth, busy,
/// unavailable, moved, upstream_error, bad_request, internal), in cluster
/// mode forwarded_to_owner and relayed_to_peer, and answered for a peer's
/// ping (op `Ping`).
pub const REQUESTS: &str = "fencegate_requests_total";
/// Fences raised (a durable write of a higher token).
pub const RAISES: &str = "fencegate_fence_raises_total";
/// Time a request spent in admission (check, raise, barrier).
pub const ADMISSION_WAIT: &str = "fencegate_admission_wait_seconds";
/// Writes currently admitted and not yet finished upstream.
pub const INFLIGHT_WRITES: &str = "fencegate_inflight_writes";
/// Time from sending a fenced write upstream to the backend's response
/// head.
pub const UPSTREAM_LATENCY: &str = "fencegate_upstream_seconds";
/// Request body bytes received from clients.
pub const BYTES_IN: &str = "fencegate_bytes_in_total";
/// Response body bytes sent to clients.
pub const BYTES_OUT: &str = "fencegate_bytes_out_total";
/// Connections turned away at the connection limit.
pub const CONNECTIONS_REFUSED: &str = "fencegate_connections_refused_total";
/// Open S3 connections.
pub const CONNECTIONS: &str = "fencegate_connections";
/// 1 while eager fencing watches a resource's lock, 0 while degraded.
pub const EAGER_UP: &str = "fencegate_eager_fencing_up";
/// Fences raised because a lock holder lost its lock.
pub const EAGER_RAISES: &str = "fencegate_eager_raises_total";
/// Requests refused because their token would have raised a verified
/// resource's fence and the lock never gave it to its holder, by
/// `resource`.
pub const TOKENS_NOT_ISSUED: &str = "fencegate_tokens_not_issued_total";
/// 1 while a verified resource's lock holder has a token below the
/// resource's fence (the lock service's tokens went back), by `resource`,
/// `lock`, `holder` (its token) and `fence`; 0 once it is over.
pub const LOCK_TOKENS_BEHIND: &str = "fencegate_lock_tokens_behind";

/// Whether the backend itself honours a conditional write, by
/// `condition` (`if-none-match`, `if-match`, `delete-if-match`): 1 it
/// refused the write whose condition failed, 0 it applied it anyway
/// (`upstream::probe`). fencegate makes them hold either way, for writes
/// through it.
pub const BACKEND_HONOURS: &str = "fencegate_backend_honours_condition";

/// Writes to a redb file that failed (a full disk, an I/O error), by
/// `store`: `fences` (`fences.redb`) or `objects` (the embedded store's
/// index). The file is reopened and retried by itself; `/readyz` says 503
/// until a write goes through again.
pub const STORE_WRITE_FAILURES: &str = "fencegate_store_write_failures_total";

/// Resources whose fence is cached in memory (idle ones are evicted).
pub const CACHED_FENCES: &str = "fencegate_cached_fences";
/// Writes whose outcome upstream is unknown (timeout or lost connection
/// after a complete body): their resource was closed to newer tokens for
/// `fence.quarantine_ms`.
pub const QUARANTINES: &str = "fencegate_quarantines_total";
/// Writes put in doubt (`fence::doubt`): whole at a remote backend, their
/// answer lost or their sender gone; each may land until its quarantine
/// ends. Counted when it is lost, or when a start finds it in the landing
/// record.
pub const WRITES_IN_DOUBT: &str = "fencegate_writes_in_doubt_total";
/// Writes in doubt now.
pub const IN_DOUBT: &str = "fencegate_writes_in_doubt";
/// 1 while a start-up quarantine holds every newer token back (the
/// landing record could not say what the process before left in flight).
pub const STARTUP_QUARANTINE: &str = "fencegate_startup_quarantine";

/// Cluster mode: requests fencegate sent etcd, by `op` (admit, deregister,
/// watch, get, lease_grant, keep_alive, ...).
pub const ETCD_REQUESTS: &str = "fencegate_etcd_requests_total";
/// Cluster mode: 1 while this replica's lease is surely alive, 0 while it
/// is not (then no write is admitted here).
pub const CLUSTER_LEASE_FRESH: &str = "fencegate_cluster_lease_fresh";
/// Resources this replica took ownership of (cluster mode with owners).
pub const CLUSTER_TAKES: &str = "fencegate_cluster_takes_total";
/// Forwards of requests to the owner of their resource that it answered,
/// one a send (a request sent again after `Moved` counts again), and
/// relays to a peer that it answered, while cut off from etcd.
pub const CLUSTER_FORWARDED: &str = "fencegate_cluster_forwarded_total";
/// Cluster mode with owners: per client request sent towards an owner, how
/// many times it was sent (a histogram: 1 unless ownership moved).
pub const CLUSTER_FORWARD_SENDS: &str = "fencegate_cluster_forward_sends";

/// The metrics recorded on every request. Histograms are handles looked up
/// in the recorder once per process rather than per event (a lookup hashes
/// the name and labels into a sharded map, which cost more than the
/// observation: docs/benchmarks-log.md, "CPU per request"); this holds
/// because `server::start` installs the recorder before the first request,
/// and a process without one gets no-op handles, as it would anyway.
/// Counters and the in-flight gauge are tallies of each serving thread's
/// own, folded into the recorder when it renders.
pub mod handles {
    use crate::per_thread::PerThread;
    use metrics::Histogram;
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
    use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

    macro_rules! handle {
        ($fn:ident, $ty:ty, $macro:ident, $name:expr) => {
            pub fn $fn() -> &'static $ty {
                static H: OnceLock<$ty> = OnceLock::new();
                H.get_or_init(|| metrics::$macro!($name))
            }
        };
    }
    handle!(
        upstream_latency,
        Histogram,
        histogram,
        super::UPSTREAM_LATENCY
    );
    handle!(admission_wait, Histogram, histogram, super::ADMISSION_WAIT);

    /// What every request adds to `fencegate_requests_total`, the byte
    /// counters and `fencegate_inflight_writes`, kept apart for each
    /// serving thread (`per_thread`) and handed to the recorder by
    /// [`fold`], which `/metrics` calls before it renders. In the
    /// recorder's own counters each request would write atomics (a count
    /// and its generation) that every serving thread writes: a cache line
    /// passed between cores at every request.
    #[repr(align(128))]
    #[derive(Default)]
    struct Tally {
        bytes_in: AtomicU64,
        bytes_out: AtomicU64,
        /// Admitted minus finished writes: one thread's piece can be
        /// negative (a write finished on another thread); the sum is not.
        inflight_writes: AtomicI64,
        /// Requests by (op, outcome), not yet folded. Both labels are
        /// static strings, found by their addresses and lengths (one label
        /// spelt at two addresses takes two entries for the same counter,
        /// which is harmless); bounded by the labels in the binary. Locked
        /// by the threads of this piece (a serving thread's own; piece 0
        /// is every other thread's), and by `fold`.
        requests: Mutex<Vec<(&'static str, &'static str, u64)>>,
    }

    /// A piece's requests. A panic while one is locked leaves nothing
    /// half-done (each entry is a label pair and a count), so a poisoned
    /// lock is taken as it is rather than failing every later request.
    fn lock_requests(tally: &Tally) -> MutexGuard<'_, Vec<(&'static str, &'static str, u64)>> {
        tally
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn same(a: &str, b: &str) -> bool {
        (a.as_ptr(), a.len()) == (b.as_ptr(), b.len())
    }

    fn tallies() -> &'static PerThread<Tally> {
        static T: OnceLock<PerThread<Tally>> = OnceLock::new();
        T.get_or_init(PerThread::default)
    }

    pub fn add_bytes_in(n: u64) {
        tallies().mine().bytes_in.fetch_add(n, Relaxed);
    }

    pub fn add_bytes_out(n: u64) {
        tallies().mine().bytes_out.fetch_add(n, Relaxed);
    }

    /// `delta` is 1 when a write is admitted, -1 when it finishes.
    pub fn add_inflight_writes(delta: i64) {
        tallies().mine().inflight_writes.fetch_add(delta, Relaxed);
    }

    /// Counts one request in `fencegate_requests_total{op, outcome}`.
    pub fn count_request(op: &'static str, outcome: &'static str) {
        let mut requests = lock_requests(tallies().mine());
        match requests
            .iter_mut()
            .find(|(o, d, _)| same(o, op) && same(d, outcome))
        {
            Some((_, _, n)) => *n += 1,
            None => requests.push((op, outcome, 1)),
        }
    }

    /// Hands every thread's tally to the recorder: what it counted since
    /// the last fold, and the writes in flight now. That gauge is a
    /// sample: a write admitted on a piece already read and finished on
    /// one not yet read counts -1 in this sum, so it is kept at 0 or more.
    pub fn fold() {
        let (mut bytes_in, mut bytes_out, mut inflight) = (0, 0, 0);
        let mut counted = Vec::new();
        for tally in tallies().all() {
            bytes_in += tally.bytes_in.swap(0, Relaxed);
            bytes_out += tally.bytes_out.swap(0, Relaxed);
            inflight += tally.inflight_writes.load(Relaxed);
            // Taken under the lock, handed over after it.
            let mut requests = lock_requests(tally);
            for (op, outcome, n) in requests.iter_mut().filter(|r| r.2 > 0) {
                counted.push((*op, *outcome, std::mem::take(n)));
            }
        }
        if bytes_in > 0 {
            metrics::counter!(super::BYTES_IN).increment(bytes_in);
        }
        if bytes_out > 0 {
            metrics::counter!(super::BYTES_OUT).increment(bytes_out);
        }
        for (op, outcome, n) in counted {
            let labels = [("op", op), ("outcome", outcome)];
            metrics::counter!(super::REQUESTS, &labels).increment(n);
        }
        metrics::gauge!(super::INFLIGHT_WRITES).set(inflight.max(0) as f64);
    }
}
