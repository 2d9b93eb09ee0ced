//! The embedded store across `kill -9` (CONTRACT §9): writers PUT and
//! DELETE their own keys through fencegate while the process is killed at
//! random moments and started again on the same data directory. After each
//! restart every key reads back as its last acknowledged write left it, or
//! as a write that was still in flight when the process died (its answer
//! never came, so either outcome is allowed), byte for byte: never an
//! older version, never a torn body, never an object without its bytes.
//!
//! A short run here (a few kills); `FENCEGATE_CRASH_ROUNDS=N` runs more.

mod common;

use common::fencegate::{Backend, Fencegate};
use common::raw::{RawClient, RawRequest};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const UNFENCED: &str = "[[rules]]\nbucket = \"crash\"\nprefix = \"\"\nmode = \"unfenced\"\n";
const WRITERS: usize = 6;
const KEYS_PER_WRITER: usize = 3;

/// Version `v` of `key`'s body: its own bytes, 1 to ~200 KiB long.
fn body(key: &str, v: u64) -> Vec<u8> {
    let unit = format!("{key}#{v};");
    let len = 1024 + (v as usize * 7919 + key.len() * 104_729) % (200 * 1024);
    unit.bytes().cycle().take(len).collect()
}

/// What a key may hold: `None` deleted, `Some(v)` version v.
#[derive(Default, Clone)]
struct Allowed {
    /// The last acknowledged write.
    acked: Option<Option<u64>>,
    /// Writes sent after it whose answer never came.
    pending: Vec<Option<u64>>,
}

type Book = Arc<Mutex<HashMap<String, Allowed>>>;

/// One writer's loop until `stop`: PUTs of new versions, now and then a
/// DELETE, each booked as pending before it goes and as acknowledged when
/// its 2xx comes.
async fn writer(
    raw: Arc<RawClient>,
    w: usize,
    book: Book,
    stop: Arc<tokio::sync::Notify>,
    start: u64,
) {
    let mut v = start;
    let stopped = stop.notified();
    tokio::pin!(stopped);
    loop {
        for k in 0..KEYS_PER_WRITER {
            v += 1;
            let key = format!("w{w}/k{k}");
            let delete = v.is_multiple_of(9);
            let what = if delete { None } else { Some(v) };
            book.lock()
                .unwrap()
                .entry(key.clone())
                .or_default()
                .pending
                .push(what);
            let req = match what {
                Some(v) => RawRequest::put(&format!("/crash/{key}"), body(&key, v)),
                None => RawRequest::new(http::Method::DELETE, &format!("/crash/{key}")),
            };
            let sent = raw.send(req);
            tokio::select! {
                r = sent => {
                    if let Ok(r) = r && (200..300).contains(&r.status) {
                        let mut b = book.lock().unwrap();
                        let a = b.get_mut(&key).unwrap();
                        // Acknowledged: it and everything sent before it
                        // is settled; what was sent after stays pending.
                        let i = a.pending.iter().position(|p| *p == what).unwrap();
                        a.pending.drain(..=i);
                        a.acked = Some(what);
                    }
                }
                _ = &mut stopped => return,
            }
        }
    }
}

/// Every key as the book allows it.
async fn check(raw: &RawClient, book: &Book) -> usize {
    let book = book.lock().unwrap().clone();
    let mut checked = 0;
    for (key, a) in book {
        let r = raw
            .send(RawRequest::new(http::Method::GET, &format!("/crash/{key}")))
            .await
            .unwrap();
        let got: Option<u64> = match r.status {
            404 => None,
            200 => {
                let named = r
                    .body
                    .strip_prefix(&format!("{key}#"))
                    .and_then(|rest| rest.split(';').next())
                    .and_then(|v| v.parse().ok());
                let v: u64 = named.unwrap_or_else(|| panic!("{key}: a body that names no version"));
                assert_eq!(
                    r.body.as_bytes(),
                    body(&key, v),
                    "{key}: a torn or foreign body"
                );
                Some(v)
            }
            s => panic!("{key}: GET answered {s}: {}", r.body),
        };
        let mut allowed: Vec<Option<u64>> = a.pending.clone();
        match a.acked {
            Some(acked) => allowed.push(acked),
            None => allowed.push(None),
        }
        assert!(
            allowed.contains(&got),
            "{key}: holds {got:?}, but the last acknowledged was {:?} and {:?} were in flight",
            a.acked,
            a.pending
        );
        checked += 1;
    }
    checked
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_kill_9_whole() {
    let rounds: usize = std::env::var("FENCEGATE_CRASH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(4);
    let mut fg = Fencegate::start(Backend::Embedded, UNFENCED);
    common::ensure_bucket(&common::sdk(&fg.endpoint()), "crash").await;
    let book: Book = Default::default();
    let mut rng = 0x2545F4914F6CDD1Du64;
    for round in 0..rounds {
        let raw = Arc::new(RawClient::new(&fg.endpoint()));
        let stop = Arc::new(tokio::sync::Notify::new());
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let start = (round as u64 + 1) * 1_000_000;
                tokio::spawn(writer(raw.clone(), w, book.clone(), stop.clone(), start))
            })
            .collect();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(300 + rng % 1500)).await;
        fg.kill9_and_restart();
        stop.notify_waiters();
        for w in writers {
            w.await.unwrap();
        }
        let raw = RawClient::new(&fg.endpoint());
        let checked = check(&raw, &book).await;
        assert_eq!(checked, WRITERS * KEYS_PER_WRITER, "round {round}");
    }
}
