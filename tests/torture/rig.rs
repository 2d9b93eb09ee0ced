//! The cluster torture's rig (issues #15, #43, #48, #56): an arm's
//! replicas, each behind a hop whose address stays put across restarts,
//! the balancer over them, and the chaos that kills, pauses and cuts them
//! off. Shared by `tests/torture_cluster.rs` and
//! `tests/torture_cluster_crash.rs`.

use super::balancer::Balancer;
use super::faults::{self, FaultConfig, Hop};
use super::history::History;
use super::sends::{self, Sends};
use crate::common::etcd::EtcdCluster;
use crate::common::fencegate::{Backend, Fencegate};
use crate::common::relay::Relay;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Replicas of a cluster arm (the three of the story).
pub const REPLICAS: usize = 3;

/// The store the replicas forward to: how each reaches it, and the
/// `[backend]` lines it adds (the probe of conditions on moto).
pub struct Store {
    pub backend: Backend,
    pub backend_lines: String,
}

/// One arm's replicas, each behind a hop whose address stays put across
/// restarts, and the balancer over the hops. A cluster arm's replicas also
/// reach etcd through relays of their own (`etcd[i]`, one per member) and
/// are reached by their peers through `peer[i]`, both frozen to cut the
/// replica off. `sends`: a cluster arm's readings of its replicas'
/// forward sends, taken before each kill.
pub struct Replicas {
    pub fgs: Vec<Arc<Mutex<Fencegate>>>,
    pub hops: Vec<Arc<Hop>>,
    pub etcd: Vec<Vec<Relay>>,
    pub peer: Vec<Relay>,
    pub balancer: Balancer,
    pub sends: Mutex<Sends>,
}

/// Starts `n` replicas of `toml` (plus, with `fences`, each one's
/// `[cluster]` table over relays) in front of `store`, with `env`, behind
/// hops and a balancer.
/// `fences`: etcd, and the prefix of the arm's keys there.
pub async fn replicas(
    store: &Store,
    toml: &str,
    fences: Option<(&EtcdCluster, &str)>,
    (n, seed): (usize, u64),
    env: &[(&str, &str)],
) -> Replicas {
    let (mut fgs, mut hops, mut etcd, mut peer) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let mut config = toml.to_string();
        if let Some((fences, prefix)) = fences {
            let relays: Vec<Relay> = (0..3)
                .map(|m| Relay::start(fences.endpoint(m).trim_start_matches("http://")))
                .collect();
            let to_peer = Relay::start("127.0.0.1:9");
            let urls: Vec<String> = relays.iter().map(|r| format!("\"{}\"", r.url())).collect();
            config += &format!(
                "\n[cluster]\netcd_endpoints = [{}]\nadvertise = \"{}\"\nprefix = \"{prefix}\"\nreplica_ttl_ms = {}\n",
                urls.join(", "),
                to_peer.url(),
                settings().ttl_ms
            );
            etcd.push(relays);
            peer.push(to_peer);
        }
        let fg = Fencegate::start_full(
            store.backend.clone(),
            "",
            &store.backend_lines,
            &config,
            env,
        );
        if let Some(p) = peer.last() {
            p.set_target(&fg.s3.to_string());
        }
        let hop = Hop::start(fg.s3, FaultConfig::none(), seed ^ (i as u64 + 10)).await;
        fgs.push(Arc::new(Mutex::new(fg)));
        hops.push(Arc::new(hop));
    }
    let addrs: Vec<_> = hops.iter().map(|h| h.addr).collect();
    let balancer = Balancer::start(&addrs);
    Replicas {
        fgs,
        hops,
        etcd,
        peer,
        balancer,
        sends: Mutex::default(),
    }
}

impl Replicas {
    /// `kill -9` of replica `i`, started again behind its hop and relay;
    /// a cluster replica's forward sends are read first (the kill resets
    /// them).
    pub async fn kill9(&self, i: usize) {
        if !self.etcd.is_empty() {
            self.scrape(i).await;
        }
        let addr = faults::kill9_behind(&self.fgs[i], &self.hops[i]).await;
        if let Some(p) = self.peer.get(i) {
            p.set_target(&addr.to_string());
        }
    }

    /// Adds replica `i`'s forward sends so far to `sends`.
    async fn scrape(&self, i: usize) {
        let admin = self.fgs[i].lock().unwrap().admin;
        let got = sends::scrape(admin).await;
        self.sends.lock().unwrap().add(got);
    }

    /// The forward sends of the run: every replica read once more.
    pub async fn sends_total(&self) -> Sends {
        for i in 0..self.fgs.len() {
            self.scrape(i).await;
        }
        *self.sends.lock().unwrap()
    }

    /// Cuts replica `i` off from etcd and/or from its peers (`on`), or
    /// joins it again (`!on`). Nothing happens to an arm without relays.
    fn cut(&self, i: usize, (etcd, peers): (bool, bool), on: bool) {
        for r in self.etcd.get(i).into_iter().flatten().filter(|_| etcd) {
            r.freeze(on);
        }
        if let Some(p) = self.peer.get(i).filter(|_| peers) {
            p.freeze(on);
        }
    }
}

/// The fault counts of a run, per arm.
#[derive(Default, Debug)]
pub struct Chaos {
    pub kills: u32,
    pub pauses: u32,
    pub partitions: u32,
}

/// Which faults the chaos picks from (`TORTURE_CHAOS`: `all`, the
/// default; `kills-pauses`; `kills`; `pauses`; `cuts`; `none`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Faults {
    All,
    KillsPauses,
    Kills,
    Pauses,
    Cuts,
    None,
}

impl Faults {
    pub fn from_env() -> Faults {
        match std::env::var("TORTURE_CHAOS").as_deref() {
            Ok("kills-pauses") => Faults::KillsPauses,
            Ok("kills") => Faults::Kills,
            Ok("pauses") => Faults::Pauses,
            Ok("cuts") => Faults::Cuts,
            Ok("none") => Faults::None,
            Ok("all") | Err(_) => Faults::All,
            Ok(other) => {
                panic!("TORTURE_CHAOS={other:?}: all, kills-pauses, kills, pauses, cuts or none")
            }
        }
    }

    /// The kinds of fault it picks from: 0 a kill, 1 a pause, 2 a cut.
    fn kinds(self) -> &'static [u32] {
        match self {
            Faults::All => &[0, 1, 2],
            Faults::KillsPauses => &[0, 1],
            Faults::Kills => &[0],
            Faults::Pauses => &[1],
            Faults::Cuts => &[2],
            Faults::None => &[],
        }
    }
}

/// The order of a run's first faults (0 a kill, 1 a pause, 2 a cut).
const FIRST: [u32; 3] = [1, 0, 2];

/// The kind of the next fault: each kind once before any is drawn (a
/// pause, a kill -9, a cut), then the one `drawn` (0..3) picks. A short
/// run's schedule then always holds a pause and a kill, which are what
/// make the control arm's replicas collide; a seed that drew only
/// partitions left the control arm's violations to the writers' timing,
/// and a loaded machine could find none.
fn next_fault(faults: Faults, done: &Chaos, drawn: usize) -> u32 {
    let kinds = faults.kinds();
    let n = (done.kills + done.pauses + done.partitions) as usize;
    (FIRST.iter().filter(|k| kinds.contains(k)))
        .nth(n)
        .copied()
        .unwrap_or(kinds[drawn % kinds.len()])
}

/// Every `every_ms`, one fault on a random replica of every arm, the same
/// choice in each: a `kill -9` (started again), a pause of 0.5-3 s, or a
/// partition of 3-8 s from etcd, from its peers, or from both, for the
/// arms that have them. The first faults take each kind once (`FIRST`);
/// the rest are drawn.
pub async fn chaos(
    arms: Vec<(Arc<Replicas>, Arc<History>)>,
    (every_ms, faults): ((u64, u64), Faults),
    seed: u64,
    mut stop: watch::Receiver<bool>,
) -> Chaos {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0063_6861_6f73);
    let mut done = Chaos::default();
    if faults == Faults::None {
        let _ = stop.wait_for(|s| *s).await;
        return done;
    }
    loop {
        let wait = Duration::from_millis(rng.random_range(every_ms.0..=every_ms.1));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return done,
        }
        let drawn = rng.random_range(0..3usize);
        let fault = next_fault(faults, &done, drawn);
        let pick = rng.random_range(0..REPLICAS);
        // An arm of fewer replicas (the single node) takes the same fault.
        let of = |r: &Replicas| pick % r.fgs.len();
        match fault {
            0 => {
                for (r, hist) in &arms {
                    hist.event(format!("kill9 replica {}", of(r)));
                    r.kill9(of(r)).await;
                }
                done.kills += 1;
            }
            1 => {
                let pause = Duration::from_millis(rng.random_range(500..=3_000));
                for (r, hist) in &arms {
                    hist.event(format!(
                        "pause replica {} for {} ms",
                        of(r),
                        pause.as_millis()
                    ));
                    r.fgs[of(r)].lock().unwrap().signal("STOP");
                }
                tokio::time::sleep(pause).await;
                for (r, _) in &arms {
                    r.fgs[of(r)].lock().unwrap().signal("CONT");
                }
                done.pauses += 1;
            }
            _ => {
                let cut = Duration::from_millis(rng.random_range(3_000..=8_000));
                let (etcd, peers) =
                    [(true, false), (false, true), (true, true)][rng.random_range(0..3)];
                let from = match (etcd, peers) {
                    (true, false) => "etcd",
                    (false, _) => "its peers",
                    _ => "etcd and its peers",
                };
                for (r, hist) in arms.iter().filter(|(r, _)| !r.etcd.is_empty()) {
                    hist.event(format!(
                        "cut replica {} off from {from} for {} ms",
                        of(r),
                        cut.as_millis()
                    ));
                    r.cut(of(r), (etcd, peers), true);
                }
                tokio::time::sleep(cut).await;
                for (r, _) in &arms {
                    r.cut(of(r), (etcd, peers), false);
                }
                done.partitions += 1;
            }
        }
    }
}

/// The fence settings of a run: the short ones by default (a killed
/// replica's resources reopen within seconds), fencegate's own defaults
/// with `TORTURE_DEFAULTS=1`.
pub struct Settings {
    pub fence: &'static str,
    pub ttl_ms: u64,
}

pub fn settings() -> Settings {
    match std::env::var("TORTURE_DEFAULTS").as_deref() {
        Ok("1") => Settings {
            fence: "",
            ttl_ms: 5000,
        },
        // A short barrier bound and quarantine (Garage applies a PUT it
        // has at once).
        _ => Settings {
            fence: "[fence]\nadmission_wait_ms = 3000\nquarantine_ms = 3000\n",
            ttl_ms: 2000,
        },
    }
}
