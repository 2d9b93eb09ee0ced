//! The Prometheus recorder: installed once, each metric described, rendered
//! at `/metrics` on the admin listener. The names are in
//! [`crate::metric_names`], which the recording modules import.
//!
//! The recorder keeps each histogram sample (two per request: admission
//! wait and upstream latency) until it is folded into its histogram. A
//! scrape folds them, and so does a thread of fencegate's own every
//! `UPKEEP_EVERY`: without it, a fencegate nobody scrapes would grow by
//! about 40 bytes per request, without bound (measured: 35 MB in 30 s at
//! 23,000 requests a second).

use metrics::{describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::metric_names::*;
use std::time::Duration;

/// How often the histogram samples recorded since the last fold are
/// folded, scrape or not.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Sends to owners per forwarded request: 1 normally, at most
/// `proxy::route::MAX_SENDS`.
const SENDS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 16.0];

const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Installs the global recorder and returns the handle that renders it.
/// Call once per process.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = builder()?
        .install_recorder()
        .map_err(|e| format!("metrics recorder: {e}"))?;
    spawn_upkeep(handle.clone(), UPKEEP_EVERY);
    describe_all();
    // Publish the counters at zero so that a scrape sees them before the
    // first event.
    metrics::counter!(RAISES).absolute(0);
    metrics::gauge!(INFLIGHT_WRITES).set(0.0);
    metrics::counter!(EAGER_RAISES).absolute(0);
    metrics::counter!(QUARANTINES).absolute(0);
    metrics::counter!(WRITES_IN_DOUBT).absolute(0);
    metrics::gauge!(IN_DOUBT).set(0.0);
    Ok(handle)
}

/// Each metric's `# HELP` line (`scripts/check-links` finds one for each
/// name in [`crate::metric_names`]).
fn describe_all() {
    describe_counter!(REQUESTS, "S3 requests by operation and outcome");
    describe_counter!(RAISES, "fence raises made durable");
    describe_histogram!(ADMISSION_WAIT, "seconds spent in admission");
    describe_gauge!(INFLIGHT_WRITES, "writes admitted and not finished upstream");
    describe_histogram!(
        UPSTREAM_LATENCY,
        "seconds until the backend's response head"
    );
    describe_counter!(BYTES_IN, "request body bytes from clients");
    describe_counter!(BYTES_OUT, "response body bytes to clients");
    describe_counter!(CONNECTIONS_REFUSED, "connections refused at the limit");
    describe_gauge!(CONNECTIONS, "open S3 connections");
    describe_gauge!(
        EAGER_UP,
        "1 while eager fencing watches the resource's lock"
    );
    describe_counter!(
        EAGER_RAISES,
        "fences raised because a lock holder lost its lock"
    );
    describe_gauge!(CACHED_FENCES, "resources whose fence is cached in memory");
    describe_counter!(
        CLUSTER_TAKES,
        "resources this replica took ownership of (cluster mode)"
    );
    describe_counter!(
        CLUSTER_FORWARDED,
        "forwards to the replica owning a request's resource that it answered, one a send, and relays to a peer"
    );
    describe_histogram!(
        CLUSTER_FORWARD_SENDS,
        "per client request forwarded, how many times it was sent to an owner"
    );
    describe_counter!(
        QUARANTINES,
        "writes with an unknown outcome whose resource was held closed"
    );
    describe_counter!(
        WRITES_IN_DOUBT,
        "writes whose whole body a remote backend had and whose answer was lost \
         or whose sender died: they may land until their quarantine ends"
    );
    describe_gauge!(IN_DOUBT, "writes in doubt now");
    describe_counter!(
        TOKENS_NOT_ISSUED,
        "requests refused because their lock never issued their token, by resource"
    );
    describe_gauge!(
        LOCK_TOKENS_BEHIND,
        "1 while a verified resource's lock holder has a token below its fence"
    );
    describe_gauge!(
        BACKEND_HONOURS,
        "1 where the backend itself refused a failed conditional write, by condition"
    );
    describe_counter!(
        STORE_WRITE_FAILURES,
        "failed writes to a redb file, by store (fences, objects)"
    );
    describe_counter!(ETCD_REQUESTS, "requests sent to etcd, by op (cluster mode)");
    describe_gauge!(
        CLUSTER_LEASE_FRESH,
        "1 while this replica's lease is surely alive (cluster mode)"
    );
    describe_gauge!(
        STARTUP_QUARANTINE,
        "1 while a start-up quarantine holds every newer token back"
    );
}

/// The recorder's configuration: latency histograms with fixed buckets.
pub fn builder() -> Result<PrometheusBuilder, String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .and_then(|b| {
            b.set_buckets_for_metric(Matcher::Full(CLUSTER_FORWARD_SENDS.into()), SENDS_BUCKETS)
        })
        .map_err(|e| e.to_string())
}

/// Folds `handle`'s pending histogram samples every `every`, on a thread
/// of its own, for as long as the process lives (test:
/// `tests/metrics_upkeep.rs`).
pub fn spawn_upkeep(handle: PrometheusHandle, every: Duration) {
    let spawned = std::thread::Builder::new()
        .name("fencegate-metrics".into())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                handle.run_upkeep();
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("metrics upkeep thread: {e}; histograms fold only when scraped");
    }
}
