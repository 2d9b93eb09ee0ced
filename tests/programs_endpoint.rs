//! Programs nobody here wrote, unmodified, fetching their credentials from
//! `fencegate lock --credentials-endpoint` (issue #49;
//! docs/credentials.md): the AWS container-credentials protocol, served
//! by the lock helper for as long as it holds the lock, with credentials
//! of [`TTL`] seconds renewed each half of that. Each program runs past
//! [`LIFETIMES`] lifetimes of its credentials without a failed request:
//!
//! - boto3 (one client for the whole run), obstore (one store) and the aws
//!   CLI; then the zombie, as in `tests/programs.rs`: paused past its
//!   lock, the next holder writes, and nothing the old holder sends after
//!   that lands;
//! - rclone `copy` with `env_auth = true` (aws-sdk-go), then a `sync`
//!   playing the zombie;
//! - restic `backup` (minio-go), then a backup playing the zombie against
//!   the next holder's prune (restic#3126).
//!
//! Each on fencegate's embedded store and in front of Garage.

mod common;

use common::Store;
use common::jobs::{Rig, access_key_of, random_files, rclone_env, venv_bin, writes_landed};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

/// The credentials' lifetime, in seconds.
const TTL: u64 = 4;
/// How many lifetimes each program outlives.
const LIFETIMES: u64 = 3;

/// The lines of `path` once one contains `needle` (up to `secs`).
fn lines_once(path: &std::path::Path, needle: &str, secs: u64) -> Vec<String> {
    common::wait_until(secs, needle, || {
        std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle))
    });
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().map(str::to_string).collect()
}

/// The access keys that `lock` wrote with (PUTs answered 200), from the
/// access log: each renewal is a new key.
fn keys_of(rig: &Rig, lock: &str) -> HashSet<String> {
    let lock = format!("lock=\"{lock}\"");
    let puts = rig.log_lines(0, &[&lock, "method=PUT", "status=200"]);
    puts.iter().map(|l| access_key_of(l)).collect()
}

fn boto3_obstore_and_the_aws_cli_outlive_their_credentials_and_their_zombie_lands_nothing(
    store: Store,
) {
    let rig = Rig::start(store, "jobs/").with_endpoint(TTL);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/endpoint_clients.py");
    let run = |name: &str, secs: u64| {
        format!(
            "exec {} {} {name} {secs} {name}.go {name}.results",
            venv_bin("python"),
            script.display()
        )
    };
    let env = [
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
        ("PATH", format!("{}:/usr/bin:/bin", venv_bin(""))),
    ];
    let a = rig.spawn("a", "demo/jobs/", &run("a", TTL * LIFETIMES + 1), &env);
    let a_results = rig.path("a.results");
    let phase1 = lines_once(&a_results, "a phase-1 done", 120);
    let failed: Vec<_> = phase1.iter().filter(|l| l.contains("failed")).collect();
    assert!(failed.is_empty(), "A's requests failed: {failed:?}");
    assert!(phase1.len() > 3 * 3, "{phase1:?}");
    let a_lock = std::fs::read_to_string(rig.path("a.lock")).unwrap();
    let renewed = keys_of(&rig, &a_lock).len();
    assert!(
        renewed as u64 >= LIFETIMES,
        "A wrote with {renewed} credentials in {LIFETIMES} lifetimes"
    );

    rig.pause_past_its_lock(&a);
    std::fs::write(rig.path("b.go"), "").unwrap();
    let (code, out) = rig.run("b", "demo/jobs/", &run("b", 0), &env);
    assert_eq!(code, 0, "{out}");
    let b = lines_once(&rig.path("b.results"), "cli last", 10);
    let b_last = b.iter().filter(|l| l.contains(" last "));
    assert!(b_last.clone().count() == 3, "B: {b:?}");
    assert!(b_last.clone().all(|l| l.ends_with(" ok")), "B: {b:?}");

    // A's program wakes while its supervisor (and the endpoint) sleeps:
    // whatever it sends now lands nowhere.
    std::fs::write(rig.path("a.go"), "").unwrap();
    zombie_lands_nothing(&rig, a, &a_lock);
    let last = std::fs::read_to_string(&a_results).unwrap();
    let last: Vec<_> = last.lines().filter(|l| l.contains(" last ")).collect();
    assert!(last.iter().all(|l| l.contains("failed")), "{last:?}");
}

fn rclone_outlives_its_endpoint_credentials_and_its_zombie_lands_nothing(store: Store) {
    let rig = Rig::start(store, "mirror/").with_endpoint(TTL);
    // 1.2 MB at 80 KiB/s: about 15 s, past three lifetimes of 4 s.
    random_files(&rig.path("src"), 6, 200_000);
    let env = rclone_env(rig.fg.endpoint());
    let copy = "exec rclone copy src fg:demo/mirror --transfers 1 --bwlimit 80k \
                --retries 1 --low-level-retries 1";
    let started = std::time::Instant::now();
    let (code, out) = rig.run("a", "demo/mirror/", copy, &env);
    assert_eq!(code, 0, "{out}");
    assert!(started.elapsed() > Duration::from_secs(TTL * LIFETIMES));
    let (code, out) = rig.run(
        "check",
        "demo/mirror/",
        "exec rclone check src fg:demo/mirror",
        &env,
    );
    assert_eq!(code, 0, "{out}");
    let puts = rig.log_lines(0, &["method=PUT", "key=\"mirror/", "status=200"]);
    let keys: HashSet<String> = puts.iter().map(|l| access_key_of(l)).collect();
    assert!(keys.len() >= 2, "rclone renewed its credentials: {keys:?}");

    // The zombie: a sync paused past its lock, the next holder's sync,
    // and the paused one resumed: nothing of it lands, and the mirror is
    // the next holder's copy.
    let (a, a_put) = rig.rclone_sync_overtaken("a2", &env);
    let a_lock = lock_in(&a_put);
    zombie_lands_nothing(&rig, a, &a_lock);
    let check = "exec rclone check src-b fg:demo/mirror";
    let (code, out) = rig.run("check2", "demo/mirror/", check, &env);
    assert_eq!(code, 0, "{out}");
}

/// The lock a request was made under, from its access log line.
fn lock_in(line: &str) -> String {
    let at = line.find(" lock=\"").expect("a lock") + 7;
    line[at..].split('"').next().unwrap().to_string()
}

/// The zombie under the endpoint: `job`'s program wakes while its
/// supervisor, and the endpoint with it, sleeps; nothing it sends from
/// then on lands (it cannot renew, and what it still holds carries a
/// stale token). Then its supervisor wakes, finds the lock lost and stops
/// it (exit 75).
fn zombie_lands_nothing(rig: &Rig, job: common::jobs::Job, lock: &str) {
    let from = rig.log_len();
    job.resume_program();
    std::thread::sleep(Duration::from_secs(6));
    let (code, out) = job.finish();
    assert_eq!(code, Some(75), "the helper stops it, the lock lost: {out}");
    let after = rig.log_lines(from, &[&format!("lock=\"{lock}\"")]);
    assert!(
        writes_landed(&after).is_empty(),
        "the zombie's writes landed: {after:?}"
    );
}

fn restic_outlives_its_endpoint_credentials_and_its_zombie_lands_nothing(store: Store) {
    let rig = Rig::start(store, "repo/").with_endpoint(TTL);
    let repo = format!("s3:{}/demo/repo", rig.fg.endpoint());
    let env = [
        ("RESTIC_REPOSITORY", repo),
        ("RESTIC_PASSWORD", "fencegate-test".to_string()),
    ];
    // 4 MB at 300 KiB/s: about 14 s, past three lifetimes of 4 s.
    random_files(&rig.path("data"), 4, 1_000_000);
    let started = std::time::Instant::now();
    let script = "restic init && restic backup --limit-upload 300 data && restic check";
    let (code, out) = rig.run("a", "demo/repo/", script, &env);
    assert_eq!(code, 0, "{out}");
    assert!(started.elapsed() > Duration::from_secs(TTL * LIFETIMES));
    assert!(out.contains("no errors were found"), "{out}");

    // The zombie, as in tests/programs.rs: a backup paused with packs up
    // and no index, the next holder's prune deletes them, the backup
    // resumes: nothing of it lands, and the repository is whole.
    random_files(&rig.path("more"), 6, 4_000_000);
    let from = rig.log_len();
    let backup = "exec restic backup --pack-size 4 --limit-upload 4000 more";
    let a = rig.spawn("a2", "demo/repo/", backup, &env);
    let data_put = ["method=PUT", "key=\"repo/data/", "status=200"];
    rig.wait_log(from, &data_put, 2, "A to upload two packs");
    rig.pause_past_its_lock(&a);
    let a_lock = lock_in(&rig.log_lines(from, &data_put)[0]);
    let prune = "restic unlock --remove-all && restic prune";
    let (code, out) = rig.run("b", "demo/repo/", prune, &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("deleting unreferenced packs"), "{out}");
    zombie_lands_nothing(&rig, a, &a_lock);
    let check = "restic check --read-data && restic snapshots";
    let (code, out) = rig.run("check", "demo/repo/", check, &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no errors were found"), "{out}");
}

on_both_stores_sync!(
    boto3_obstore_and_the_aws_cli_outlive_their_credentials_and_their_zombie_lands_nothing,
    rclone_outlives_its_endpoint_credentials_and_its_zombie_lands_nothing,
    restic_outlives_its_endpoint_credentials_and_its_zombie_lands_nothing,
);
