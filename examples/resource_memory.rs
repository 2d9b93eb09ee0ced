//! Memory per resource (docs/benchmarks-log.md, "Memory and distinct resources"):
//! the RSS of the gate and its redb store after N distinct per-object
//! resources have each seen one write, with the slot cache bounded (the
//! default) or not.
//!
//!     cargo run --release --example resource_memory -- N MAX_CACHED [DIR]
//!
//! `MAX_CACHED` 0 means unbounded. `DIR` is where its temporary directory,
//! and `fences.redb` in it, goes (default: /dev/shm, so that a million
//! fsyncs measure memory, not the disk). Prints one line per tenth of the run.

use fencegate::fence::gate::{Gate, Kind};
use fencegate::fence::table::RedbTable;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u64 = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let max: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let tmp = tempfile::Builder::new()
        .prefix("fencegate-mem-")
        .tempdir_in(args.get(3).map(String::as_str).unwrap_or("/dev/shm"))
        .expect("a directory for the store");
    let path = tmp.path().join("fences.redb");
    let store = RedbTable::open(&path).expect("store");
    let mut gate = Gate::new(Arc::new(store), Duration::from_secs(10));
    gate.set_max_slots(if max == 0 { usize::MAX } else { max });
    let started = Instant::now();
    println!("resources,cached_slots,rss_kib,peak_rss_kib,store_bytes,seconds");
    for i in 1..=n {
        let resource = format!("bucket/objects/{i:012}.json");
        let permit = gate
            .admit(&resource, i, Kind::Write)
            .await
            .expect("admitted");
        drop(permit);
        if i % (n / 10).max(1) == 0 {
            println!(
                "{i},{},{},{},{},{:.1}",
                gate.cached_slots(),
                status_kib("VmRSS:"),
                status_kib("VmHWM:"),
                std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
                started.elapsed().as_secs_f64()
            );
        }
    }
}
