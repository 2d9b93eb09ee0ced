//! The names of fencegate's Prometheus metrics, each with what it counts.
//! A leaf module: the modules that record metrics (`fence`, `s3`, `proxy`,
//! `locks`, `server`) import only these names, and the admin listener,
//! which installs the recorder and renders it, imports them too
//! (`admin::metrics`).

/// Requests by `op` and `outcome` (forwarded, stale, missing, invalid,
/// auth, busy, upstream_error, bad_request, internal).
pub const REQUESTS: &str = "fencegate_requests_total";
/// Fences raised (a durable write of a higher token).
pub const RAISES: &str = "fencegate_fence_raises_total";
/// Time a request spent in admission (check, raise, barrier).
pub const ADMISSION_WAIT: &str = "fencegate_admission_wait_seconds";
/// Writes currently admitted and not yet finished upstream.
pub const INFLIGHT_WRITES: &str = "fencegate_inflight_writes";
/// Time from sending upstream to the backend's response head.
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

/// Resources whose fence is cached in memory (idle ones are evicted).
pub const CACHED_FENCES: &str = "fencegate_cached_fences";
/// Writes whose outcome upstream is unknown (timeout or lost connection
/// after a complete body): their resource was closed to newer tokens for
/// `fence.quarantine_ms`.
pub const QUARANTINES: &str = "fencegate_quarantines_total";

/// Cluster mode: requests fencegate sent etcd, by `op` (admit, deregister,
/// watch, get, lease_grant, keep_alive, ...).
pub const ETCD_REQUESTS: &str = "fencegate_etcd_requests_total";
/// Cluster mode: 1 while this replica's lease is surely alive, 0 while it
/// is not (then no write is admitted here).
pub const CLUSTER_LEASE_FRESH: &str = "fencegate_cluster_lease_fresh";
