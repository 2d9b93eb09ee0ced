//! fencegate replicas in cluster mode for the tests: the config tables,
//! start-up until the replica holds its lease, and its readiness.

use super::fencegate::{Backend, Fencegate};
use super::http_call;

pub const ADMIN: &str = "cluster-admin-token-0123";
/// The replicas' lease in most tests: short, so that the tests that wait
/// for a dead replica's lease are quick.
pub const TTL_MS: u64 = 2000;

/// A short quarantine: newer writes wait 1 s after an expiry. For the
/// tests whose lower write never had its whole body at the backend (the
/// replica stops it first); the hold has a test of its own.
pub const SHORT_HOLD: &str = "admission_wait_ms = 8000\nquarantine_ms = 1000\n";

/// The config tables of a replica: `[fence]` with `fence_lines`, and
/// `[cluster]`. `FENCEGATE_TEST_CLUSTER_OFF=1` leaves `[cluster]` out: each
/// replica then keeps its own fences, which every test here must catch.
pub fn cluster_toml(endpoints: &str, fence_lines: &str, ttl_ms: u64) -> String {
    let fence = format!("[fence]\n{fence_lines}\n");
    if std::env::var("FENCEGATE_TEST_CLUSTER_OFF").as_deref() == Ok("1") {
        return fence;
    }
    format!(
        "{fence}\n[cluster]\netcd_endpoints = {endpoints}\nprefix = \"t/\"\nreplica_ttl_ms = {ttl_ms}\n"
    )
}

pub fn replica(backend: &Backend, endpoints: &str, wait_ms: u64) -> Fencegate {
    let fence = format!("admission_wait_ms = {wait_ms}\n");
    replica_with(backend, endpoints, &fence, TTL_MS)
}

pub fn replica_with(
    backend: &Backend,
    endpoints: &str,
    fence_lines: &str,
    ttl_ms: u64,
) -> Fencegate {
    replica_full(backend, "", endpoints, fence_lines, ttl_ms)
}

/// [`replica_with`], with `backend_lines` added to its `[backend]` table.
pub fn replica_full(
    backend: &Backend,
    backend_lines: &str,
    endpoints: &str,
    fence_lines: &str,
    ttl_ms: u64,
) -> Fencegate {
    let server = format!("admin_token = \"{ADMIN}\"\n");
    let toml = cluster_toml(endpoints, fence_lines, ttl_ms);
    let fg = Fencegate::start_full(backend.clone(), &server, backend_lines, &toml, &[]);
    super::wait_until(20, "the replica to hold a lease", || {
        ready_status(&fg) == 200
    });
    fg
}

pub fn replicas(backend: &Backend, endpoints: &str, n: usize) -> Vec<Fencegate> {
    (0..n).map(|_| replica(backend, endpoints, 8000)).collect()
}

pub fn ready_status(fg: &Fencegate) -> u16 {
    let url = format!("http://{}/readyz", fg.admin);
    // Its own thread and runtime: callable from sync code and from tests.
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(http_call("GET", &url, None, None)).0
        })
        .join()
    })
    .unwrap()
}
