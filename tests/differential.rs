//! Differential test: fencegate's reading of a request against what real
//! backends actually did with it. A review found requests that fencegate
//! and the store behind it read two different ways (keys a store rewrites:
//! `x/../k`, `./k`, `//k`, `../oth/loot`; DeleteObjects keys split by CDATA
//! or comments; copy sources like `oth%2Fpayroll`), so that a write fenced
//! under one name lands under another, or in a bucket the sender may not
//! use. Rather than list those shapes one by one, this test generates many
//! request shapes from a seed (`differential/shapes.rs`), sends each through
//! fencegate to three backends (the embedded store, Garage, moto), and
//! judges by effects (`differential/check.rs`): every object that changed
//! must have been fenced under its own name with the case's token, by a
//! credential allowed on its bucket.
//!
//! `DIFF_SEED` and `DIFF_CASES` (per backend) override the defaults,
//! `DIFF_VERBOSE=1` prints every case;
//! `scripts/differential` runs many cases; docs/testing-differential.md.

#[path = "differential/check.rs"]
mod check;
mod common;
#[path = "differential/shapes.rs"]
mod shapes;
#[path = "differential/world.rs"]
mod world;

use check::Observed;
use shapes::{Case, SECRET, SEEDS, Shape, seed_body};
use std::collections::BTreeMap;
use std::time::Instant;
use world::{Exchange, Snapshot, Which, World};

/// Defaults of a plain `cargo test`: fixed, so that it is deterministic.
const DEFAULT_SEED: u64 = 20_240_611;
const DEFAULT_CASES: usize = 300;
/// Tokens below this are the seeding's.
const FIRST_TOKEN: u64 = 100;

fn env_num(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded() {
    differential(Which::Embedded).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garage() {
    differential(Which::Garage).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto() {
    differential(Which::Moto).await
}

async fn differential(which: Which) {
    let seed = env_num("DIFF_SEED", DEFAULT_SEED);
    let cases = env_num("DIFF_CASES", DEFAULT_CASES as u64) as usize;
    // DIFF_VERBOSE=1: one line per case, violating or not.
    let verbose = env_num("DIFF_VERBOSE", 0) != 0;
    let started = Instant::now();
    let world = World::start(which).await;
    let mut before = world.snapshot().await;
    let mut reports = Vec::new();
    let mut caught: BTreeMap<String, usize> = BTreeMap::new();
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    for index in 0..cases {
        let case = shapes::case(seed, index);
        // Two tokens per case: `t` for the case, `t + 1` for the clean-up.
        let t = FIRST_TOKEN + 2 * index as u64;
        let touches_config = case.query.iter().any(|q| q.contains("lifecycle"));
        let lc_before = if touches_config {
            Some(world.lifecycles().await)
        } else {
            None
        };
        let exchanges = world.send(&case, t).await;
        for e in &exchanges {
            *statuses.entry(e.status).or_default() += 1;
        }
        let after = world.snapshot().await;
        let fences = world.fences().await;
        let lifecycle = match lc_before {
            Some(b) => Some((b, world.lifecycles().await)),
            None => None,
        };

        // Copies move content: find `oth`'s secret wherever it landed.
        let leaked = leaked_secrets(&world, &case, &before, &after).await;
        let observed = Observed {
            case: &case,
            t,
            exchanges: &exchanges,
            before: &before,
            after: &after,
            fences: &fences,
            lifecycle,
            leaked: &leaked,
        };
        let violations = check::judge(&observed);
        if verbose {
            print_case(which, index, &case, &exchanges, &violations);
        }
        if !violations.is_empty() {
            let r = check::report(seed, &observed, &violations);
            eprintln!("[{which:?}] {r}");
            reports.push(r);
            *caught.entry(check::cause(&case)).or_default() += 1;
        }

        // Clean up for the next case: `shared` never keeps `oth`'s secret
        // (so that finding it proves a leak), and the seeds are back.
        before = clean_up(&world, &leaked, after, t).await;
    }

    let elapsed = started.elapsed();
    report_and_assert(which, seed, cases, &reports, &caught, &statuses, elapsed);
}

/// After a copy (`Copy`, `PartCopy`), the objects outside `oth` that changed
/// from `before` to `after` and now hold `oth`'s secret.
async fn leaked_secrets(
    world: &World,
    case: &Case,
    before: &Snapshot,
    after: &Snapshot,
) -> Vec<(String, String)> {
    let mut leaked = Vec::new();
    if matches!(case.shape, Shape::Copy | Shape::PartCopy) {
        for (bucket, key, _, now) in check::changes(before, after) {
            if bucket != "oth"
                && now.is_some()
                && let Some(b) = world.body(&bucket, &key).await
                && String::from_utf8_lossy(&b).contains(SECRET)
            {
                leaked.push((bucket, key));
            }
        }
    }
    leaked
}

/// Prints one line for a case: its request, the answers and how many
/// violations it has (`DIFF_VERBOSE=1`).
fn print_case(
    which: Which,
    index: usize,
    case: &Case,
    exchanges: &[Exchange],
    violations: &[String],
) {
    let got: Vec<String> = exchanges
        .iter()
        .map(|e| format!("{} {}", e.status, e.code.as_deref().unwrap_or("")))
        .collect();
    eprintln!(
        "[{which:?}] case {index} {:?} {:?} {} {}?{} host={:?} -> {got:?}, {} violation(s)",
        case.shape,
        case.cred,
        case.method,
        case.path,
        case.query.join("&"),
        case.host,
        violations.len()
    );
}

/// Deletes the `leaked` copies of `oth`'s secret and puts back the seeds
/// missing from `after` or leaked over, with token `t + 1`; the snapshot
/// the next case starts from.
async fn clean_up(world: &World, leaked: &[(String, String)], after: Snapshot, t: u64) -> Snapshot {
    let mut touched = false;
    for (bucket, key) in leaked {
        world.delete(bucket, key, t + 1).await;
        touched = true;
    }
    for (bucket, key) in SEEDS {
        if !after
            .objects
            .contains_key(&(bucket.to_string(), key.to_string()))
            || leaked.iter().any(|(b, k)| b == bucket && k == key)
        {
            world.put(bucket, key, seed_body(bucket, key), t + 1).await;
            touched = true;
        }
    }
    if touched {
        world.snapshot().await
    } else {
        after
    }
}

/// Prints the run's summary, writes it and every report to a file under
/// `CARGO_TARGET_TMPDIR`, and asserts no case was violating.
fn report_and_assert(
    which: Which,
    seed: u64,
    cases: usize,
    reports: &[String],
    caught: &BTreeMap<String, usize>,
    statuses: &BTreeMap<u16, usize>,
    elapsed: std::time::Duration,
) {
    let mut summary = format!(
        "[{which:?}] differential: seed {seed}, {cases} cases, {} violating, {:.1}s\n  statuses: {statuses:?}\n",
        reports.len(),
        elapsed.as_secs_f64()
    );
    if !reports.is_empty() {
        summary.push_str("  violating cases by what the request contains:\n");
        for (cause, n) in caught {
            summary.push_str(&format!("    {n:5} {cause}\n"));
        }
    }
    eprintln!("{summary}");
    let out_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = out_dir.join(format!("differential-{which:?}-{seed}.txt").to_lowercase());
    let _ = std::fs::write(&file, format!("{summary}\n{}", reports.join("\n")));
    assert!(
        reports.is_empty(),
        "{summary}  (full list in {})\n\n{}",
        file.display(),
        reports
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The raw client must put paths on the wire exactly as written (no `.`,
/// `..` or `//` normalisation), or this test would test nothing.
#[tokio::test]
async fn raw_client_sends_paths_verbatim() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let paths = [
        "/b/x/../k",
        "/b//k",
        "/b/./k/.",
        "/b/../oth/loot",
        "/b/%2E%2e/k%2F",
        "/b/a+b",
        "/b/x\\..\\k",
        "/b//",
    ];
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..paths.len() * 2 {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = sock.read(&mut chunk).await.unwrap();
                assert!(n > 0);
                buf.extend_from_slice(&chunk[..n]);
            }
            let head = String::from_utf8_lossy(&buf).into_owned();
            seen.push(head.split(' ').nth(1).unwrap().to_string());
            sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await
                .unwrap();
        }
        seen
    });
    let raw = common::raw::RawClient::new(&format!("http://{addr}"));
    for p in paths {
        raw.send(common::raw::RawRequest::new(http::Method::DELETE, p))
            .await
            .unwrap();
        let mut pre = common::raw::RawRequest::new(http::Method::DELETE, p);
        pre.presign = Some(std::time::Duration::from_secs(60));
        raw.send(pre).await.unwrap();
    }
    let seen = server.await.unwrap();
    for (i, p) in paths.iter().enumerate() {
        assert_eq!(seen[2 * i], *p, "header-signed");
        assert!(
            seen[2 * i + 1].starts_with(&format!("{p}?X-Amz-")),
            "presigned: {}",
            seen[2 * i + 1]
        );
    }
}
