//! The torture harness (issue #6): writers contend for etcd locks and
//! append to log objects by read-modify-write under stalls, lock-session
//! loss, fencegate kill -9 and a faulty network; a checker then reads the
//! final logs against the recorded history. Two arms run side by side: one
//! through fencegate, which must show no violation, and a control arm whose
//! tokens are ignored, which must show some, or the run proves nothing.
//! docs/torture.md explains the workload, the faults, the checks and the
//! results.
//!
//! - `short_run`: about a minute on the embedded store, part of the suite.
//! - `barrier_off_is_caught`: the harness must find violations through a
//!   fencegate whose ordering barrier is switched off, and none through one
//!   whose barrier is on, in front of a backend that delivers requests late.
//! - `crash_in_flight_is_caught_on_garage`, `..._on_moto` (issue #56):
//!   fencegate `kill -9`'d while a store that applies writes late still
//!   holds some: through a fencegate that keeps the landing record the
//!   harness finds nothing, through one that forgets it (and, on moto,
//!   sends no condition of its own) it must find the stale writes landing.
//! - `long_run` (ignored): ≥ 10,000 requests against Garage; `scripts/torture`.

#[path = "torture/checker.rs"]
mod checker;
mod common;
#[path = "torture/crash.rs"]
mod crash;
#[path = "torture/faults.rs"]
mod faults;
#[path = "torture/forger.rs"]
mod forger;
#[path = "torture/history.rs"]
mod history;
#[path = "torture/late_apply.rs"]
mod late_apply;
#[path = "torture/run.rs"]
mod run;
#[path = "torture/workload.rs"]
mod workload;

use common::etcd::Etcd;
use common::fencegate::{Backend, DEMO_KEY, DEMO_SECRET, Fencegate};
use common::garage::Garage;
use faults::{FaultConfig, Hop};
use history::History;
use run::{ArmResult, Budget, Kill9, drive, env_u64, judge};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use workload::{Workload, WriterFaults, resources, s3_client, shared_rules};

/// Resources per arm: single-object logs, and three-object prefixes.
const LOGS: usize = 6;
const MULTIS: usize = 2;

fn seed() -> u64 {
    let seed = env_u64("TORTURE_SEED").unwrap_or_else(rand::random);
    println!(
        "torture seed={seed} (TORTURE_SEED={seed} repeats the random choices; timing still varies)"
    );
    seed
}

/// Whether `fault` is switched off for this run:
/// `TORTURE_OFF=stall,session-loss,kill9,delay,hold,late,reset` (any of them).
fn off(fault: &str) -> bool {
    const KNOWN: [&str; 7] = [
        "stall",
        "session-loss",
        "kill9",
        "delay",
        "hold",
        "late",
        "reset",
    ];
    let v = std::env::var("TORTURE_OFF").unwrap_or_default();
    let listed: Vec<&str> = v
        .split(',')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect();
    for f in &listed {
        assert!(
            KNOWN.contains(f),
            "TORTURE_OFF: unknown fault {f:?} (known: {KNOWN:?})"
        );
    }
    listed.contains(&fault)
}

fn writer_faults(stall_p: f64, session_loss_p: f64) -> WriterFaults {
    WriterFaults {
        stall_p: if off("stall") { 0.0 } else { stall_p },
        session_loss_p: if off("session-loss") {
            0.0
        } else {
            session_loss_p
        },
        ttl_s: (1, 3),
    }
}

fn network_faults(mut f: FaultConfig) -> FaultConfig {
    if off("delay") {
        f.delay_max_ms = 0;
    }
    if off("hold") {
        f.stall_p = 0.0;
    }
    if off("late") {
        f.late_p = 0.0;
    }
    if off("reset") {
        f.reset_p = 0.0;
    }
    f
}

#[allow(clippy::too_many_arguments)]
fn arm(
    name: &str,
    prefix: &str,
    s3: aws_sdk_s3::Client,
    etcd: &Etcd,
    writers: u32,
    faults: WriterFaults,
    seed: u64,
    start: Instant,
) -> Arc<Workload> {
    Arc::new(Workload {
        arm: name.to_string(),
        s3,
        bucket: "demo".into(),
        etcd: etcd.endpoint.clone(),
        resources: resources(name, prefix, LOGS, MULTIS),
        writers,
        faults,
        hist: Arc::new(History::new(start)),
        seed,
        attempts: 1,
    })
}

/// A run's two arms, each `(name, prefix, client)`: the first seeded with
/// `seed`, the second (the control) with `seed ^ 1`.
fn two_arms(
    first: (&str, &str, aws_sdk_s3::Client),
    second: (&str, &str, aws_sdk_s3::Client),
    etcd: &Etcd,
    writers: u32,
    faults: WriterFaults,
    seed: u64,
    start: Instant,
) -> [Arc<Workload>; 2] {
    [
        arm(
            first.0,
            first.1,
            first.2,
            etcd,
            writers,
            faults.clone(),
            seed,
            start,
        ),
        arm(
            second.0,
            second.1,
            second.2,
            etcd,
            writers,
            faults,
            seed ^ 1,
            start,
        ),
    ]
}

/// The verdict: no violation through fencegate, at least one in the control
/// arm (otherwise the run could not have caught anything: inconclusive).
fn verdict(fenced: &ArmResult, control: &ArmResult) {
    assert_clean(fenced);
    assert!(
        !control.violations.is_empty(),
        "INCONCLUSIVE: the control arm ({}) found no violation, so this run shows nothing \
         about fencegate; make the faults more frequent or the run longer",
        control.arm
    );
    println!(
        "torture verdict: PASS ({} arm clean, {} arm caught violations)",
        fenced.arm, control.arm
    );
}

/// No violation through fencegate.
fn assert_clean(fenced: &ArmResult) {
    assert!(
        fenced.violations.is_empty(),
        "{} violation(s) through fencegate (arm {}): {:#?}",
        fenced.violations.len(),
        fenced.arm,
        &fenced.violations[..fenced.violations.len().min(20)]
    );
}

/// About a minute on the embedded store. The control arm shares the same
/// fencegate (the embedded store has no address of its own) under an
/// `unfenced` rule for its prefix, so its tokens are ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn short_run() {
    let seed = seed();
    let secs = env_u64("TORTURE_SECS").unwrap_or(45);
    let writers = env_u64("TORTURE_WRITERS").unwrap_or(8) as u32;
    let etcd = Etcd::start();
    let fg = short_run_fencegate(&etcd).await;
    // Between the writers and fencegate: a stable address across restarts,
    // a little delay, and now and then a reset connection.
    let front = network_faults(FaultConfig {
        delay_max_ms: 2,
        reset_p: 0.005,
        ..FaultConfig::none()
    });
    let hop = Arc::new(Hop::start(fg.s3, front, seed).await);
    let fg = Arc::new(Mutex::new(fg));
    let faults = writer_faults(0.04, 0.04);
    let client = || s3_client(&hop.endpoint(), DEMO_KEY, DEMO_SECRET, "us-east-1");
    let start = Instant::now();
    let arms = two_arms(
        ("fencegate", "fenced/", client()),
        ("control", "control/", client()),
        &etcd,
        writers,
        faults,
        seed,
        start,
    );
    let kill9 = Kill9 {
        fg: fg.clone(),
        hop: hop.clone(),
        every_ms: (6_000, 12_000),
    };
    // Beside the holders, a writer with made-up tokens (issue #57).
    let (forger_stop, forger_rx) = tokio::sync::watch::channel(false);
    let forger = tokio::spawn(forger::forge(
        client(),
        "demo".into(),
        etcd.endpoint.clone(),
        arms[0].resources.clone(),
        arms[0].hist.clone(),
        seed,
        forger_rx,
    ));
    let kills = drive(
        &arms,
        Budget {
            secs,
            ops: u64::MAX,
        },
        (!off("kill9")).then_some(kill9),
        seed,
    )
    .await;
    forger_stop.send_replace(true);
    no_made_up_token_went_through(&forger.await.unwrap(), &arms[0].hist);
    // Nor did one raise a fence past what etcd ever issued.
    let admin = fg.lock().unwrap().admin;
    no_fence_above_etcd_revision(admin, &etcd).await;
    println!(
        "torture short run: {}s, {kills} kill -9, front hop {}",
        start.elapsed().as_secs(),
        hop.stats.summary()
    );
    let reader = s3_client(
        &fg.lock().unwrap().endpoint(),
        DEMO_KEY,
        DEMO_SECRET,
        "us-east-1",
    );
    let fenced = judge(&arms[0], &reader, "short-history").await;
    let control = judge(&arms[1], &reader, "short-history").await;
    verdict(&fenced, &control);
}

/// The short run's fencegate on the embedded store: the fencegate arm's
/// rules (verified against etcd) and the control arm's prefix unfenced.
async fn short_run_fencegate(etcd: &Etcd) -> Fencegate {
    let rules = format!(
        "{}[[rules]]\nbucket = \"demo\"\nprefix = \"control/\"\nmode = \"unfenced\"\n\n{}",
        shared_rules("demo", "fenced/", MULTIS),
        verified(etcd, &resources("fencegate", "fenced/", LOGS, MULTIS))
    );
    let fg = Fencegate::start(Backend::Embedded, &rules);
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "demo").await;
    fg
}

/// Prints what the forger sent and asserts none of its made-up tokens went
/// through.
fn no_made_up_token_went_through(forged: &forger::Forged, hist: &History) {
    println!(
        "torture short run: forger sent {} made-up tokens, answered {:?} ({} of them the token a \
         holder of the resource had too, {} acknowledged across a handoff)",
        forged.sent,
        forged.answers,
        forged.acknowledged.len(),
        forged.in_handoff
    );
    let made_up = forged.made_up(hist);
    assert!(
        made_up.is_empty(),
        "made-up tokens went through: {made_up:?}"
    );
}

/// Lists fencegate's fences and asserts none is above etcd's revision.
async fn no_fence_above_etcd_revision(admin: std::net::SocketAddr, etcd: &Etcd) {
    let (_, listed) = common::http_call(
        "GET",
        &format!("http://{admin}/fences?limit=1000"),
        None,
        None,
    )
    .await;
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let revision = etcd_revision(&etcd.endpoint).await;
    for f in listed["fences"].as_array().unwrap() {
        let h = f["highest"].as_u64().unwrap();
        assert!(h <= revision, "fence {f} above etcd's revision {revision}");
    }
}

/// Proof that the harness tests the ordering barrier (CONTRACT §4), not only
/// the check: two fencegates in front of Garage, each behind a hop that
/// delivers some requests up to 2 s late, one of them started with
/// `FENCEGATE_UNSAFE_UNORDERED=1` (forward right after the check). Lock
/// holders lose their lease often, mid-write, so a new holder's read and
/// write race the old holder's late write. Through the unordered fencegate
/// the late write lands after the new holder's and the checker must see it;
/// through the ordered one the new holder waits, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barrier_off_is_caught() {
    let seed = seed();
    let secs = env_u64("TORTURE_SECS").unwrap_or(40);
    let writers = env_u64("TORTURE_WRITERS").unwrap_or(8) as u32;
    let etcd = Etcd::start();
    let garage = Garage::start();
    let garage_addr = socket_of(&garage);
    let late = FaultConfig {
        late_p: 0.05,
        late_ms: (300, 2_000),
        ..FaultConfig::none()
    };
    let backend = |hop: &Hop| Backend::Garage {
        endpoint: hop.endpoint(),
        access_key: garage.key_id.clone(),
        secret_key: garage.secret.clone(),
    };
    let rules =
        shared_rules("demo", "ordered/", MULTIS) + &shared_rules("demo", "unordered/", MULTIS);
    let ordered_hop = Hop::start(garage_addr, late.clone(), seed ^ 2).await;
    let ordered = Fencegate::start(backend(&ordered_hop), &rules);
    let unordered_hop = Hop::start(garage_addr, late, seed ^ 3).await;
    let unordered = Fencegate::start_env(
        backend(&unordered_hop),
        "",
        &rules,
        &[("FENCEGATE_UNSAFE_UNORDERED", "1")],
    );
    assert!(
        unordered.logs().contains("ordering barrier is OFF"),
        "the debug switch was not taken: {}",
        unordered.logs()
    );
    // No writer stalls (they would let the check alone catch the old
    // holder); frequent lease loss, 0-0.8 s into a session.
    let faults = WriterFaults {
        stall_p: 0.0,
        session_loss_p: 0.5,
        ttl_s: (1, 3),
    };
    let start = Instant::now();
    let client = |fg: &Fencegate| s3_client(&fg.endpoint(), DEMO_KEY, DEMO_SECRET, "us-east-1");
    let arms = two_arms(
        ("ordered", "ordered/", client(&ordered)),
        ("unordered", "unordered/", client(&unordered)),
        &etcd,
        writers,
        faults,
        seed,
        start,
    );
    let budget = Budget {
        secs,
        ops: u64::MAX,
    };
    drive(&arms, budget, None, seed).await;
    println!(
        "barrier run: {}s\n  ordered hop: {}\n  unordered hop: {}",
        start.elapsed().as_secs(),
        ordered_hop.stats.summary(),
        unordered_hop.stats.summary()
    );
    let reader = garage_reader(&garage);
    let with = judge(&arms[0], &reader, "barrier-history").await;
    let without = judge(&arms[1], &reader, "barrier-history").await;
    // The unordered arm is this run's control: with the barrier off and
    // requests delivered late, it must lose updates.
    verdict(&with, &without);
}

/// The long run against Garage (scripts/torture). Settings: TORTURE_OPS
/// (requests of the fencegate arm, default 10000), TORTURE_WRITERS (per arm,
/// default 8), TORTURE_SEED, TORTURE_MAX_SECS (default 3600), TORTURE_OFF.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long: run by scripts/torture"]
async fn long_run() {
    let seed = seed();
    let ops = env_u64("TORTURE_OPS").unwrap_or(10_000);
    let writers = env_u64("TORTURE_WRITERS").unwrap_or(8) as u32;
    let max_secs = env_u64("TORTURE_MAX_SECS").unwrap_or(3600);
    let etcd = Etcd::start();
    let garage = Garage::start();
    let garage_addr = socket_of(&garage);
    // Between fencegate and Garage (and between the control arm and
    // Garage): delays, answers held for 1-5 s, resets.
    let network = network_faults(FaultConfig {
        delay_max_ms: 5,
        stall_p: 0.01,
        stall_ms: (1_000, 5_000),
        reset_p: 0.005,
        ..FaultConfig::none()
    });
    let back = Hop::start(garage_addr, network.clone(), seed ^ 2).await;
    let fg = long_run_fencegate(&back, &garage);
    let front = Arc::new(Hop::start(fg.s3, FaultConfig::none(), seed ^ 3).await);
    let control_hop = Hop::start(garage_addr, network, seed ^ 4).await;
    let fg = Arc::new(Mutex::new(fg));
    let faults = writer_faults(0.04, 0.03);
    let start = Instant::now();
    let fenced = s3_client(&front.endpoint(), DEMO_KEY, DEMO_SECRET, "us-east-1");
    let control = s3_client(
        &control_hop.endpoint(),
        &garage.key_id,
        &garage.secret,
        "garage",
    );
    let arms = two_arms(
        ("fencegate", "fenced/", fenced),
        ("control", "control/", control),
        &etcd,
        writers,
        faults,
        seed,
        start,
    );
    let kill9 = Kill9 {
        fg: fg.clone(),
        hop: front.clone(),
        every_ms: (5_000, 15_000),
    };
    let budget = Budget {
        secs: max_secs,
        ops,
    };
    let kills = drive(&arms, budget, (!off("kill9")).then_some(kill9), seed).await;
    println!(
        "torture long run: {}s, {kills} kill -9\n  fencegate->garage hop: {}\n  control->garage hop: {}",
        start.elapsed().as_secs(),
        back.stats.summary(),
        control_hop.stats.summary()
    );
    // Both arms' final logs are read straight from Garage.
    let reader = garage_reader(&garage);
    let fenced = judge(&arms[0], &reader, "history").await;
    let control = judge(&arms[1], &reader, "history").await;
    let summary = format!("seed={seed}\n{}\n{}\n", fenced.summary(), control.summary());
    std::fs::write(run::out_dir().join("summary.txt"), summary).unwrap();
    assert!(
        fenced.counts.ops as u64 >= ops,
        "only {} requests in {max_secs}s",
        fenced.counts.ops
    );
    verdict(&fenced, &control);
}

/// The long run's fencegate in front of Garage, through the hop `back`.
fn long_run_fencegate(back: &Hop, garage: &Garage) -> Fencegate {
    Fencegate::start(
        Backend::Garage {
            endpoint: back.endpoint(),
            access_key: garage.key_id.clone(),
            secret_key: garage.secret.clone(),
        },
        // A short barrier bound, so that answers held by the hop also end
        // in 503 SlowDown for the next holder.
        &format!(
            "[fence]\nadmission_wait_ms = 1000\n\n{}",
            shared_rules("demo", "fenced/", MULTIS)
        ),
    )
}

/// etcd's revision now.
async fn etcd_revision(endpoint: &str) -> u64 {
    let mut c = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let r = c.get("torture-revision", None).await.unwrap();
    r.header().unwrap().revision() as u64
}

/// `[[eager]]` entries with `verify = true` for an arm's resources (each
/// follows its etcd lock), and the `[locks]` table.
fn verified(etcd: &Etcd, resources: &[workload::Resource]) -> String {
    let mut out = format!("[locks]\netcd_endpoints = [\"{}\"]\n\n", etcd.endpoint);
    for r in resources {
        // A log's resource is its object; a prefix's, the rule's name.
        let resource = match r.keys.as_slice() {
            [one] => format!("demo/{one}"),
            keys => keys[0].rsplit_once('/').unwrap().0.to_string(),
        };
        out += &format!(
            "[[eager]]\nresource = \"{resource}\"\netcd_lock = \"{}\"\nverify = true\n\n",
            r.name
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_in_flight_is_caught_on_garage() {
    crash::crash_run(crash::Store::Garage).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_in_flight_is_caught_on_moto() {
    crash::crash_run(crash::Store::Moto).await;
}

/// Garage's S3 address, for a hop to forward to.
fn socket_of(garage: &Garage) -> std::net::SocketAddr {
    let addr = garage.endpoint.strip_prefix("http://").unwrap();
    addr.parse().unwrap()
}

/// A client that reads the final logs straight from Garage.
fn garage_reader(garage: &Garage) -> aws_sdk_s3::Client {
    s3_client(&garage.endpoint, &garage.key_id, &garage.secret, "garage")
}
