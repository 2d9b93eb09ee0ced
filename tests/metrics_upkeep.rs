//! Histogram samples recorded while nobody scrapes `/metrics` must not pile
//! up: the recorder keeps each one until it is folded into its histogram,
//! two per request, and fencegate folds them on a timer of its own
//! (`admin::metrics::spawn_upkeep`). Without that fold, memory grows with
//! every request (the control arm below shows the growth this test would
//! see). One test in its own binary, so that the process's resident size
//! is this test's alone.

use fencegate::admin::metrics::{builder, spawn_upkeep};
use std::time::Duration;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Growth of the resident size, in KiB, while 4 M latency samples (the
/// histograms of 2 M requests) are recorded in bursts, with or without the
/// upkeep thread running.
fn growth_kib(upkeep: bool) -> u64 {
    let recorder = builder().unwrap().build_recorder();
    if upkeep {
        spawn_upkeep(recorder.handle(), Duration::from_millis(5));
    }
    let before = rss_kib();
    metrics::with_local_recorder(&recorder, || {
        let h = metrics::histogram!("fencegate_upstream_latency_seconds");
        for burst in 0..400 {
            for i in 0..10_000 {
                h.record(f64::from(burst * 10_000 + i) * 1e-9);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    rss_kib().saturating_sub(before)
}

#[test]
fn histogram_samples_do_not_pile_up_without_a_scrape() {
    let with = growth_kib(true);
    let without = growth_kib(false);
    eprintln!("resident growth: {with} KiB with the upkeep thread, {without} KiB without");
    assert!(
        with < 8 * 1024,
        "pending samples piled up even with the upkeep thread: +{with} KiB"
    );
    // The control arm: what the first assertion guards against.
    assert!(
        without > 24 * 1024,
        "without upkeep the samples should pile up (+{without} KiB): this test no longer sees the growth it guards against"
    );
}
