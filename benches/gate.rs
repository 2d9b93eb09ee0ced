//! Engine microbenchmarks (docs/benchmarks-log.md, "Engine"): the fence check on a
//! hot resource and across 1 M resources, a write's admission beside 1000
//! writers in flight, what verified raises and writes in doubt add to a
//! write at the fence, and the durable raise (redb, fsync'd).
//!
//! Everything runs on a current-thread runtime: one core. The checks use an
//! in-memory store (they never touch it once a resource is loaded); the
//! raise uses the real redb store in a temporary directory. Criterion gives
//! means; the raise's p50 and p99 come from individual samples, printed
//! after the criterion lines.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use fencegate::fence::doubt::Doubts;
use fencegate::fence::gate::{Gate, Kind};
use fencegate::fence::issued::{Behind, Issuers, Whose};
use fencegate::fence::landing::{Landing, Sent, Write};
use fencegate::fence::table::{FenceRecord, FenceTable, RedbTable, TableError};
use futures_util::future::BoxFuture;
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A store that remembers nothing: every resource starts unfenced.
struct MemoryStore;

impl FenceTable for MemoryStore {
    fn get(&self, _: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>> {
        Box::pin(async { Ok(None) })
    }
    fn raise(&self, _: &str, token: u64) -> BoxFuture<'_, Result<u64, TableError>> {
        Box::pin(async move { Ok(token) })
    }
    fn list(
        &self,
        _: &str,
        _: Option<&str>,
        _: usize,
    ) -> BoxFuture<'_, Result<Vec<FenceRecord>, TableError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn record_upload(&self, _: &str, _: u64) -> BoxFuture<'_, Result<(), TableError>> {
        Box::pin(async { Ok(()) })
    }
    fn upload_token(&self, _: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>> {
        Box::pin(async { Ok(None) })
    }
    fn forget_upload(&self, _: &str) -> BoxFuture<'_, Result<(), TableError>> {
        Box::pin(async { Ok(()) })
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Every slot stays cached (the store remembers nothing to reload from).
fn memory_gate() -> Gate {
    let mut g = Gate::new(Arc::new(MemoryStore), Duration::from_secs(10));
    g.set_max_slots(usize::MAX);
    g
}

fn checks(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("check");
    g.throughput(Throughput::Elements(1));

    let gate = memory_gate();
    rt.block_on(gate.admit("bench/hot", 7, Kind::Read)).unwrap();
    g.bench_function("hot resource, read with token == highest", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(gate.admit("bench/hot", 7, Kind::Read).await.unwrap()) })
    });
    g.bench_function("hot resource, write admitted and released", |b| {
        b.to_async(&rt).iter(|| async {
            let p = gate
                .admit("bench/hot", 7, Kind::Write)
                .await
                .unwrap()
                .permit();
            black_box(p.as_ref().map(|p| p.body_complete()));
        })
    });

    const N: usize = 1_000_000;
    let names: Vec<String> = (0..N).map(|i| format!("bench/obj-{i:07}")).collect();
    rt.block_on(async {
        for n in &names {
            gate.admit(n, 7, Kind::Read).await.unwrap();
        }
    });
    let next = AtomicU64::new(0);
    g.bench_function("1M distinct resources, read with token == highest", |b| {
        b.to_async(&rt).iter(|| async {
            // A stride through the table, so lookups miss the CPU cache.
            let i = next.fetch_add(7919, Ordering::Relaxed) as usize % N;
            black_box(gate.admit(&names[i], 7, Kind::Read).await.unwrap())
        })
    });
    g.finish();
}

fn admission_beside_inflight(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("admission");
    g.throughput(Throughput::Elements(1));
    for inflight in [0usize, 1000] {
        let gate = memory_gate();
        let held: Vec<_> = rt.block_on(async {
            let mut v = Vec::new();
            for _ in 0..inflight {
                v.push(gate.admit("bench/busy", 7, Kind::Write).await.unwrap());
            }
            v
        });
        g.bench_with_input(
            BenchmarkId::new("write on a resource with N in flight", inflight),
            &inflight,
            |b, _| {
                b.to_async(&rt).iter(|| async {
                    let p = gate
                        .admit("bench/busy", 7, Kind::Write)
                        .await
                        .unwrap()
                        .permit();
                    black_box(p.as_ref().map(|p| p.body_complete()));
                })
            },
        );
        drop(held);
    }
    g.finish();
}

/// A lock that every token would be the holder's of (none is ever asked:
/// the benchmark writes at the fence).
struct EveryToken;

impl Issuers for EveryToken {
    fn lock_of(&self, resource: &str) -> Option<&str> {
        (resource == "bench/hot").then_some("etcd:bench")
    }
    fn check<'a>(&'a self, _: &'a str, _: u64) -> BoxFuture<'a, Result<Whose, String>> {
        Box::pin(async { Ok(Whose::Holder) })
    }
    fn resource_of_lock(&self, _: &str) -> Option<&str> {
        None
    }
    fn behind(&self) -> Vec<Behind> {
        Vec::new()
    }
}

/// What verified raises (`[[eager]] verify`) and writes in doubt add to a
/// write at the fence, where nothing is raised or in doubt on its resource
/// (issues #56, #57): each beside the same write without them.
fn verified_and_in_doubt(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("write at the fence");
    g.throughput(Throughput::Elements(1));
    macro_rules! write_at_the_fence {
        ($gate:expr) => {
            |b: &mut criterion::Bencher| {
                b.to_async(&rt).iter(|| async {
                    let p = $gate
                        .admit("bench/hot", 7, Kind::Write)
                        .await
                        .unwrap()
                        .permit();
                    black_box(p.as_ref().map(|p| p.body_complete()));
                })
            }
        };
    }
    let plain = memory_gate();
    rt.block_on(plain.admit("bench/hot", 7, Kind::Read))
        .unwrap();
    g.bench_function("plain", write_at_the_fence!(plain));
    let verified = memory_gate();
    verified.set_issuers(Arc::new(EveryToken));
    rt.block_on(verified.admit("bench/hot", 7, Kind::Read))
        .unwrap();
    g.bench_function("verified resource", write_at_the_fence!(verified));
    let dir = tempfile::tempdir().unwrap();
    let landing = Landing::open(dir.path(), false).unwrap().landing;
    let doubts = Arc::new(Doubts::new(Some(landing)));
    let elsewhere = Write {
        token: Some(3),
        resource: 1,
        object: 1,
        name: None,
        sent: Sent::Plain,
        orderable: false,
        alone: false,
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(3600);
    rt.block_on(async { doubts.add(&elsewhere, None, until) });
    let mut in_doubt = memory_gate();
    in_doubt.set_doubts(doubts);
    rt.block_on(in_doubt.admit("bench/hot", 7, Kind::Read))
        .unwrap();
    g.bench_function(
        "a write in doubt on another resource",
        write_at_the_fence!(in_doubt),
    );
    g.finish();
}

fn durable_raise(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let store = RedbTable::open(&dir.path().join("fences.redb")).unwrap();
    let gate = Gate::new(Arc::new(store), Duration::from_secs(10));
    let token = AtomicU64::new(1);
    let mut g = c.benchmark_group("raise");
    g.sample_size(20);
    g.bench_function("durable raise through the gate (redb, fsync)", |b| {
        b.to_async(&rt).iter(|| async {
            let t = token.fetch_add(1, Ordering::Relaxed);
            drop(gate.admit("bench/raised", t, Kind::Write).await.unwrap());
        })
    });
    g.finish();

    // Criterion reports means; the target is on the median, so time
    // individual raises as well.
    let mut samples: Vec<Duration> = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..500 {
            let t = token.fetch_add(1, Ordering::Relaxed);
            let t0 = Instant::now();
            drop(gate.admit("bench/raised", t, Kind::Write).await.unwrap());
            v.push(t0.elapsed());
        }
        v
    });
    samples.sort();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
    println!(
        "raise/durable raise samples: n={} p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        samples.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
}

criterion_group!(
    benches,
    checks,
    admission_beside_inflight,
    verified_and_in_doubt,
    durable_raise
);
criterion_main!(benches);
