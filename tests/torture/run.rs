//! One torture experiment: both arms' writers at once, the kill -9
//! schedule, then the final read, the checker, the summary lines and the
//! history files. The test entry points (tests/torture.rs) only set up the
//! stores, the hops and the arms.

use super::checker::{Violation, by_kind, check};
use super::faults::{Hop, kill9_loop};
use super::history::{Counts, counts};
use super::workload::{Workload, final_logs};
use crate::common::fencegate::Fencegate;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Reads a number from the environment (the long run's settings).
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// Where history files go: `<target dir>/torture/`.
pub fn out_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("torture")
}

/// When to stop: after `secs`, or once the first arm made `ops` requests.
#[derive(Clone, Copy)]
pub struct Budget {
    pub secs: u64,
    pub ops: u64,
}

pub struct Kill9 {
    pub fg: Arc<Mutex<Fencegate>>,
    pub hop: Arc<Hop>,
    pub every_ms: (u64, u64),
}

/// Runs every arm's writers together (and the kill -9 schedule) until the
/// budget is spent, then lets what is still in flight end.
pub async fn drive(arms: &[Arc<Workload>], budget: Budget, kill9: Option<Kill9>, seed: u64) -> u32 {
    let started = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);
    let writers: Vec<_> = arms
        .iter()
        .map(|a| tokio::spawn(a.clone().run(stop_rx.clone())))
        .collect();
    let killer = kill9.map(|k| {
        let hists = arms.iter().map(|a| a.hist.clone()).collect();
        tokio::spawn(kill9_loop(
            k.fg,
            k.hop,
            k.every_ms,
            seed,
            hists,
            stop_rx.clone(),
        ))
    });
    let mut last_print = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let n = arms[0].hist.op_count() as u64;
        if started.elapsed() >= Duration::from_secs(budget.secs) || n >= budget.ops {
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(10) {
            last_print = Instant::now();
            let progress: Vec<String> = arms
                .iter()
                .map(|a| format!("{}={}", a.arm, a.hist.op_count()))
                .collect();
            println!(
                "torture t={}s ops: {}",
                started.elapsed().as_secs(),
                progress.join(" ")
            );
        }
    }
    stop_tx.send(true).unwrap();
    let kills = match killer {
        Some(k) => k.await.unwrap(),
        None => 0,
    };
    for w in writers {
        w.await.unwrap();
    }
    // Answers held by a stalling hop, writes whose clients gave up: let
    // them finish before the final read.
    tokio::time::sleep(Duration::from_secs(4)).await;
    kills
}

pub struct ArmResult {
    pub arm: String,
    pub counts: Counts,
    pub violations: Vec<Violation>,
}

impl ArmResult {
    /// `arm=… ops=… ok=… (…%) refused=… (503: …) indeterminate=…
    /// available=…% violations=…`; the share after `ok` is of the requests
    /// that succeeded; `available`: [`Counts::available`].
    pub fn summary(&self) -> String {
        let c = self.counts;
        format!(
            "arm={} ops={} ok={} ({:.1}%) refused={} (503: {}) indeterminate={} available={:.1}% violations={}",
            self.arm,
            c.ops,
            c.ok,
            100.0 * c.ok as f64 / c.ops.max(1) as f64,
            c.refused,
            c.unavailable,
            c.indeterminate,
            100.0 * c.available(),
            self.violations.len()
        )
    }
}

/// Reads an arm's final logs through `reader`, checks them against its
/// history, writes `<out_dir>/<file_stem>-<arm>.jsonl` and prints the
/// summary, the fault counts and a few violations.
pub async fn judge(arm: &Workload, reader: &aws_sdk_s3::Client, file_stem: &str) -> ArmResult {
    let finals = final_logs(reader, &arm.bucket, &arm.resources).await;
    let ops = arm.hist.ops();
    let events = arm.hist.events();
    let corrupt: Vec<String> = events
        .iter()
        .filter(|e| e.event.starts_with("corrupt-read"))
        .map(|e| e.event.clone())
        .collect();
    let violations = check(&ops, &finals, &arm.hist.seen(), &corrupt);
    let path = out_dir().join(format!("{file_stem}-{}.jsonl", arm.arm));
    arm.hist.write_jsonl(&path).unwrap();
    let r = ArmResult {
        arm: arm.arm.clone(),
        counts: counts(&ops),
        violations,
    };
    let count = |p: &str| events.iter().filter(|e| e.event.starts_with(p)).count();
    let writes = ops
        .iter()
        .filter(|o| o.kind == super::history::Kind::Write)
        .count();
    let entries: usize = finals
        .values()
        .map(|l| l.as_ref().map_or(0, Vec::len))
        .sum();
    println!("{}", r.summary());
    println!(
        "  arm={} writes={writes} final_entries={entries} writer_stalls={} session_losses={} kill9={} retried_503={} violation_kinds: {}",
        r.arm,
        count("stall"),
        count("session-loss"),
        count("kill9"),
        count("retry-503"),
        by_kind(&r.violations)
    );
    for v in r.violations.iter().take(5) {
        println!("  violation {} [{}] {}", v.kind, v.resource, v.detail);
    }
    println!("  history: {}", path.display());
    r
}

/// At most how many rounds a slice runs while its control arm catches
/// nothing. A control arm's violations take chance and timing (a stale
/// write must meet a store that has not yet seen the newer one), so one
/// clean round can happen on a loaded machine; three in a row mean the
/// faults no longer test the fence.
pub const CONTROL_ROUNDS: u64 = 3;

/// Runs `round` with the seeds `first`, `first + 1`, … until one returns
/// a control arm's violations, at most [`CONTROL_ROUNDS`] times. Each
/// round starts its own services and asserts its own clean arms; the
/// control arm (`control` names it) only has to catch something once.
pub async fn until_the_control_catches<F, Fut>(first: u64, control: &str, mut round: F)
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    for n in 1..=CONTROL_ROUNDS {
        let caught = round(first.wrapping_add(n - 1)).await;
        if caught > 0 {
            println!(
                "torture verdict: PASS (the clean arms clean, the {control} arm caught \
                 {caught} violation(s) in round {n})"
            );
            return;
        }
        println!("round {n}: the {control} arm found no violation");
    }
    panic!(
        "INCONCLUSIVE: the {control} arm found no violation in {CONTROL_ROUNDS} rounds, so \
         this run shows nothing about fencegate; make the faults more frequent or the run longer"
    );
}
