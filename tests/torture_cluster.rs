//! The torture harness through a load balancer (issue #15; docs/torture.md,
//! "Cluster mode"): writers on etcd locks append to log objects in Garage
//! through `scripts/balancer` (nginx, round robin) in front of three
//! fencegate replicas, while replicas are killed (`kill -9`, then started
//! again) and paused (`SIGSTOP` for up to 3 s, past their 2 s lease) at
//! random.
//!
//! Two arms side by side, with the same faults: `cluster`, whose replicas
//! share their fences through a 3-member etcd, must show no violation;
//! `control`, the same replicas each with its own fence file, must show
//! some, or the run proves nothing.
//!
//! - `cluster_short_run`: 60 s with twice the writer faults, part of the
//!   suite.
//! - `cluster_long_run` (ignored): ≥ 10,000 requests through the cluster
//!   arm; `scripts/torture-cluster`.

#[path = "torture/checker.rs"]
mod checker;
mod common;
// The hop's fault injection and statistics are the single-node runs'.
#[allow(dead_code)]
#[path = "torture/faults.rs"]
mod faults;
#[path = "torture/history.rs"]
mod history;
#[path = "torture/run.rs"]
mod run;
#[path = "torture/workload.rs"]
mod workload;

use common::etcd::{Etcd, EtcdCluster};
use common::fencegate::{DEMO_KEY, DEMO_SECRET, Fencegate};
use common::garage::Garage;
use faults::{FaultConfig, Hop};
use history::History;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use run::{ArmResult, Budget, drive, env_u64, judge};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use workload::{Workload, WriterFaults, resources, s3_client, shared_rules};

const LOGS: usize = 6;
const MULTIS: usize = 2;
const REPLICAS: usize = 3;

/// nginx from `scripts/balancer`, stopped on drop.
struct Balancer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Balancer {
    fn start(replicas: &[std::net::SocketAddr]) -> Balancer {
        let dir = tempfile::tempdir().unwrap();
        let port = common::free_port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/balancer");
        let child = Command::new(script)
            .arg(format!("127.0.0.1:{port}"))
            .arg(dir.path())
            .args(replicas.iter().map(|a| a.to_string()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("scripts/balancer (Debian nginx)");
        common::wait_until(20, "the balancer to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Balancer {
            child,
            port,
            _dir: dir,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        // TERM: nginx's master stops its workers; KILL would orphan them.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// One arm's replicas, each behind a hop whose address stays put across
/// restarts, and the balancer over the hops.
struct Replicas {
    fgs: Vec<Arc<Mutex<Fencegate>>>,
    hops: Vec<Arc<Hop>>,
    balancer: Balancer,
}

async fn replicas(garage: &Garage, toml: &str, seed: u64) -> Replicas {
    let mut fgs = Vec::new();
    let mut hops = Vec::new();
    for i in 0..REPLICAS {
        let fg = Fencegate::start(garage.backend(), toml);
        let hop = Hop::start(fg.s3, FaultConfig::none(), seed ^ (i as u64 + 10)).await;
        fgs.push(Arc::new(Mutex::new(fg)));
        hops.push(Arc::new(hop));
    }
    let addrs: Vec<_> = hops.iter().map(|h| h.addr).collect();
    let balancer = Balancer::start(&addrs);
    Replicas {
        fgs,
        hops,
        balancer,
    }
}

/// Kills (and restarts) or pauses a random replica of every arm, the same
/// choice in each, every `every_ms`. Returns (kills, pauses) per arm.
async fn chaos(
    arms: Vec<(Arc<Replicas>, Arc<History>)>,
    every_ms: (u64, u64),
    seed: u64,
    mut stop: watch::Receiver<bool>,
) -> (u32, u32) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0063_6861_6f73);
    let (mut kills, mut pauses) = (0, 0);
    loop {
        let wait = Duration::from_millis(rng.random_range(every_ms.0..=every_ms.1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return (kills, pauses),
        }
        let i = rng.random_range(0..REPLICAS);
        if rng.random_bool(0.5) {
            for (r, hist) in &arms {
                hist.event(format!("kill9 replica {i}"));
                faults::kill9_behind(&r.fgs[i], &r.hops[i]).await;
            }
            kills += 1;
        } else {
            let pause = Duration::from_millis(rng.random_range(500..=3_000));
            for (r, hist) in &arms {
                hist.event(format!("pause replica {i} for {} ms", pause.as_millis()));
                r.fgs[i].lock().unwrap().signal("STOP");
            }
            tokio::time::sleep(pause).await;
            for (r, _) in &arms {
                r.fgs[i].lock().unwrap().signal("CONT");
            }
            pauses += 1;
        }
    }
}

fn arm(
    name: &str,
    prefix: &str,
    lb: &Balancer,
    etcd: &Etcd,
    (seed, fault_p): (u64, f64),
    start: Instant,
) -> Arc<Workload> {
    let writers = env_u64("TORTURE_WRITERS").unwrap_or(8) as u32;
    Arc::new(Workload {
        arm: name.to_string(),
        s3: s3_client(&lb.endpoint(), DEMO_KEY, DEMO_SECRET, "us-east-1"),
        bucket: "demo".into(),
        etcd: etcd.endpoint.clone(),
        resources: resources(name, prefix, LOGS, MULTIS),
        writers,
        faults: WriterFaults {
            stall_p: fault_p,
            session_loss_p: fault_p,
            ttl_s: (1, 3),
        },
        hist: Arc::new(History::new(start)),
        seed,
    })
}

/// Sets up both arms, runs them under `budget` with the chaos schedule,
/// and judges them.
/// `fault_p`: each writer's chance per round of a stall, and per lock
/// session of losing it (the same in both arms).
async fn run_arms(
    budget: Budget,
    (seed, fault_p): (u64, f64),
    stem: &str,
) -> (ArmResult, ArmResult) {
    let locks = Etcd::start();
    let fences = EtcdCluster::start();
    let garage = Garage::start();
    let rules = shared_rules("demo", "fenced/", MULTIS) + &shared_rules("demo", "control/", MULTIS);
    // A short barrier bound and quarantine, so that a killed replica's
    // resources reopen within seconds (Garage applies a PUT it has at once).
    let fence = "[fence]\nadmission_wait_ms = 3000\nquarantine_ms = 3000\n";
    let shared = format!(
        "{fence}\n[cluster]\netcd_endpoints = {}\nprefix = \"torture/\"\nreplica_ttl_ms = 2000\n\n{rules}",
        fences.endpoints_toml()
    );
    let cluster = Arc::new(replicas(&garage, &shared, seed).await);
    let control = Arc::new(replicas(&garage, &format!("{fence}\n{rules}"), seed ^ 1).await);
    common::ensure_bucket(&common::sdk(&cluster.balancer.endpoint()), "demo").await;
    let start = Instant::now();
    let arms = [
        arm(
            "cluster",
            "fenced/",
            &cluster.balancer,
            &locks,
            (seed, fault_p),
            start,
        ),
        arm(
            "control",
            "control/",
            &control.balancer,
            &locks,
            (seed ^ 1, fault_p),
            start,
        ),
    ];
    let (stop_tx, stop_rx) = watch::channel(false);
    let chaos = tokio::spawn(chaos(
        vec![
            (cluster.clone(), arms[0].hist.clone()),
            (control.clone(), arms[1].hist.clone()),
        ],
        (3_000, 8_000),
        seed,
        stop_rx,
    ));
    drive(&arms, budget, None, seed).await;
    stop_tx.send_replace(true);
    let (kills, pauses) = chaos.await.unwrap();
    println!(
        "cluster torture: {}s, per arm {kills} kill -9 and {pauses} pauses of a replica",
        start.elapsed().as_secs()
    );
    let reader = s3_client(&garage.endpoint, &garage.key_id, &garage.secret, "garage");
    let fenced = judge(&arms[0], &reader, stem).await;
    let unfenced = judge(&arms[1], &reader, stem).await;
    (fenced, unfenced)
}

fn verdict(fenced: &ArmResult, control: &ArmResult) {
    // A cluster that refused everything would have no violation either.
    assert!(
        fenced.counts.ok * 2 >= fenced.counts.ops,
        "the cluster arm served only {} of {} requests",
        fenced.counts.ok,
        fenced.counts.ops
    );
    assert!(
        fenced.violations.is_empty(),
        "{} violation(s) through the cluster: {:#?}",
        fenced.violations.len(),
        &fenced.violations[..fenced.violations.len().min(20)]
    );
    assert!(
        !control.violations.is_empty(),
        "INCONCLUSIVE: the control arm (replicas with their own fences) found no violation"
    );
    println!("cluster torture verdict: PASS (cluster arm clean, control arm caught violations)");
}

fn seed() -> u64 {
    let seed = env_u64("TORTURE_SEED").unwrap_or(0xc1_05_7e_12);
    println!("torture seed={seed} (TORTURE_SEED repeats the random choices; timing still varies)");
    seed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_short_run() {
    let budget = Budget {
        secs: env_u64("TORTURE_SECS").unwrap_or(60),
        ops: u64::MAX,
    };
    // Twice the long run's faults: in 60 s the control arm must still show
    // its violations, even on a loaded machine.
    let (fenced, control) = run_arms(budget, (seed(), 0.08), "cluster-short").await;
    verdict(&fenced, &control);
}

/// ≥ 10,000 requests through the cluster arm (scripts/torture-cluster).
/// Settings: TORTURE_OPS (default 10000), TORTURE_WRITERS, TORTURE_SEED,
/// TORTURE_MAX_SECS (default 3600).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "long: run by scripts/torture-cluster"]
async fn cluster_long_run() {
    let ops = env_u64("TORTURE_OPS").unwrap_or(10_000);
    let budget = Budget {
        secs: env_u64("TORTURE_MAX_SECS").unwrap_or(3600),
        ops,
    };
    let seed = seed();
    let (fenced, control) = run_arms(budget, (seed, 0.04), "cluster-history").await;
    let summary = format!("seed={seed}\n{}\n{}\n", fenced.summary(), control.summary());
    std::fs::write(run::out_dir().join("cluster-summary.txt"), summary).unwrap();
    assert!(
        fenced.counts.ops as u64 >= ops,
        "only {} requests",
        fenced.counts.ops
    );
    verdict(&fenced, &control);
}
