//! Issue #56's crash runs: a store that applies a share of the writes
//! late, whether or not fencegate is still there, and fencegate `kill -9`'d
//! and started again at once, with the fix in (`remembered`) and taken out
//! (`forgotten`), on Garage and on moto (`crash_in_flight_is_caught_*` in
//! tests/torture.rs).

use super::common;
use super::common::etcd::Etcd;
use super::common::fencegate::{Backend, DEMO_KEY, DEMO_SECRET, Fencegate};
use super::common::garage::Garage;
use super::faults::{FaultConfig, Hop, kill9_loop};
use super::late_apply::{LateApply, LateConfig};
use super::run::{Budget, Kill9, drive, env_u64, judge, until_the_control_catches};
use super::workload::{s3_client, shared_rules};
use super::{MULTIS, assert_clean, garage_reader, off, socket_of, two_arms, writer_faults};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The store behind a crash run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// Ignores conditions: a write in doubt is waited out.
    Garage,
    /// Judges them when it applies a write: settled by the store.
    Moto,
}

/// Issue #56: a store that applies a share of the writes 0.5-2.5 s after
/// their whole body arrived, whether or not fencegate is still there, and
/// fencegate `kill -9`'d every 1.5-4 s and started again at once. Two
/// arms, each with its own fencegate and late hop in front of the same
/// store: `remembered` (fencegate as it is) must show no violation;
/// `forgotten` (`FENCEGATE_UNSAFE_FORGET_IN_FLIGHT=1`, and on moto without
/// conditions of fencegate's own, `conditional_writes = false`: the fix
/// taken out) must show some, or the run proves nothing. A round in which
/// the forgotten arm caught nothing (chance and timing) is followed by
/// another on the next seed, with fresh services
/// ([`until_the_control_catches`]).
pub async fn crash_run(store: Store) {
    // A fixed seed unless TORTURE_SEED says otherwise (timing still varies).
    let fixed = match store {
        Store::Garage => 0x0c4a_5401,
        Store::Moto => 0x0c4a_5402,
    };
    let seed = env_u64("TORTURE_SEED").unwrap_or(fixed);
    println!("torture seed={seed} (TORTURE_SEED repeats the random choices)");
    until_the_control_catches(seed, "forgotten", |seed| crash_round(store, seed)).await;
}

/// One round of [`crash_run`]: asserts the remembered arm clean and returns
/// the forgotten arm's violations.
async fn crash_round(store: Store, seed: u64) -> usize {
    println!("round seed={seed}");
    let secs = env_u64("TORTURE_SECS").unwrap_or(35);
    let writers = env_u64("TORTURE_WRITERS").unwrap_or(8) as u32;
    let etcd = Etcd::start();
    let backing = Backing::start(store).await;
    let (late_hops, fgs) = start_fencegates(&backing, seed).await;
    let mut fronts = Vec::new();
    let mut shared = Vec::new();
    for (i, fg) in fgs.into_iter().enumerate() {
        fronts.push(Arc::new(
            Hop::start(fg.s3, FaultConfig::none(), seed ^ (7 + i as u64)).await,
        ));
        shared.push(Arc::new(Mutex::new(fg)));
    }
    let client = |hop: &Hop| s3_client(&hop.endpoint(), DEMO_KEY, DEMO_SECRET, "us-east-1");
    let start = Instant::now();
    let faults = writer_faults(0.02, 0.02);
    let arms = two_arms(
        ("remembered", "remembered/", client(&fronts[0])),
        ("forgotten", "forgotten/", client(&fronts[1])),
        &etcd,
        writers,
        faults,
        seed,
        start,
    );
    // The second arm's fencegate dies on a schedule of its own.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let second = tokio::spawn(kill9_loop(
        shared[1].clone(),
        fronts[1].clone(),
        (1_500, 4_000),
        seed ^ 9,
        vec![arms[1].hist.clone()],
        stop_rx,
    ));
    let kill9 = Kill9 {
        fg: shared[0].clone(),
        hop: fronts[0].clone(),
        every_ms: (1_500, 4_000),
    };
    let budget = Budget {
        secs,
        ops: u64::MAX,
    };
    let kills = drive(&arms, budget, (!off("kill9")).then_some(kill9), seed).await;
    stop_tx.send_replace(true);
    let kills2 = second.await.unwrap();
    println!(
        "crash run ({}): {}s, {kills} + {kills2} kill -9\n  remembered: {}\n  forgotten: {}",
        match store {
            Store::Garage => "garage, ignores conditions",
            Store::Moto => "moto, judges conditions when it applies a write",
        },
        start.elapsed().as_secs(),
        late_hops[0].stats.summary(),
        late_hops[1].stats.summary()
    );
    let stem = match store {
        Store::Garage => "crash-garage-history",
        Store::Moto => "crash-moto-history",
    };
    let remembered = judge(&arms[0], &backing.reader, stem).await;
    let forgotten = judge(&arms[1], &backing.reader, stem).await;
    assert_clean(&remembered);
    forgotten.violations.len()
}

/// The two arms' late hops and fencegates: `remembered` as it is,
/// `forgotten` with the fix taken out.
async fn start_fencegates(backing: &Backing, seed: u64) -> ([LateApply; 2], [Fencegate; 2]) {
    let late = LateConfig {
        late_p: 0.3,
        late_ms: (500, 2_500),
    };
    let rules =
        shared_rules("demo", "remembered/", MULTIS) + &shared_rules("demo", "forgotten/", MULTIS);
    let late_hops = [
        LateApply::start(backing.target, late.clone(), seed ^ 5),
        LateApply::start(backing.target, late, seed ^ 6),
    ];
    let fgs = [
        backing.fencegate(&late_hops[0], false, &rules),
        backing.fencegate(&late_hops[1], true, &rules),
    ];
    assert!(
        fgs[1].logs().contains("FORGET_IN_FLIGHT=1"),
        "{}",
        fgs[1].logs()
    );
    common::ensure_bucket(&common::sdk(&fgs[0].endpoint()), "demo").await;
    if backing.store == Store::Moto {
        wait_until_conditions_are_seen(&fgs[0]).await;
    }
    (late_hops, fgs)
}

/// Waits until fencegate's probe found the store judging conditions, so
/// that its fenced writes go with them (`fence.conditional_writes`).
async fn wait_until_conditions_are_seen(fg: &Fencegate) {
    let url = format!("http://{}/readyz", fg.admin);
    for _ in 0..300 {
        let ready = common::http_call("GET", &url, None, None).await.1;
        if ready.contains("\"if_match\":true") && ready.contains("\"if_none_match\":true") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the probe never found moto judging conditions");
}

/// The store of a crash run, started, with its address for the late hops
/// and a client that reads the final logs straight from it.
struct Backing {
    store: Store,
    garage: Option<Garage>,
    _moto: Option<common::moto::Moto>,
    target: std::net::SocketAddr,
    reader: aws_sdk_s3::Client,
}

/// The quarantine covers the store's longest delay.
const FENCE: &str = "[fence]
admission_wait_ms = 1000
quarantine_ms = 3500
";

impl Backing {
    async fn start(store: Store) -> Backing {
        if store == Store::Garage {
            let g = Garage::start();
            let (target, reader) = (socket_of(&g), garage_reader(&g));
            return Backing {
                store,
                garage: Some(g),
                _moto: None,
                target,
                reader,
            };
        }
        let m = common::moto::Moto::start();
        let target = m.endpoint.strip_prefix("http://").unwrap().parse().unwrap();
        let reader = s3_client(
            &m.endpoint,
            common::moto::KEY,
            common::moto::SECRET,
            "us-east-1",
        );
        common::ensure_bucket(&reader, "demo").await;
        Backing {
            store,
            garage: None,
            _moto: Some(m),
            target,
            reader,
        }
    }

    /// A fencegate in front of `hop`; with `forget`, the fix taken out
    /// (`FENCEGATE_UNSAFE_FORGET_IN_FLIGHT=1`, and on moto no conditions
    /// of fencegate's own).
    fn fencegate(&self, hop: &LateApply, forget: bool, rules: &str) -> Fencegate {
        let (backend, probe) = match &self.garage {
            Some(g) => (
                Backend::Garage {
                    endpoint: hop.endpoint(),
                    access_key: g.key_id.clone(),
                    secret_key: g.secret.clone(),
                },
                "",
            ),
            None => (
                Backend::S3 {
                    endpoint: hop.endpoint(),
                    access_key: common::moto::KEY.into(),
                    secret_key: common::moto::SECRET.into(),
                },
                "probe_conditions = true\nprobe_bucket = \"demo\"\n",
            ),
        };
        let forget_env: &[(&str, &str)] = &[("FENCEGATE_UNSAFE_FORGET_IN_FLIGHT", "1")];
        let (fence, env): (String, &[(&str, &str)]) = match (forget, self.store) {
            (false, _) => (FENCE.into(), &[]),
            (true, Store::Garage) => (FENCE.into(), forget_env),
            (true, Store::Moto) => (format!("{FENCE}conditional_writes = false\n"), forget_env),
        };
        Fencegate::start_full(backend, "", probe, &format!("{fence}\n{rules}"), env)
    }
}
