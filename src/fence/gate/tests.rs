//! The gate's tests, on paused time, over a fence table in memory.

use super::super::table::{FenceRecord, TableError};
use super::*;
use futures_util::future::BoxFuture;
use std::collections::HashMap;

/// A fence table in memory: the gate's tests run on paused time, where a
/// file's blocking I/O would let the clock jump.
#[derive(Default)]
pub(crate) struct MemStore {
    fences: Mutex<HashMap<String, u64>>,
    uploads: Mutex<HashMap<String, u64>>,
}

impl FenceTable for MemStore {
    fn get(&self, r: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>> {
        let h = self.fences.lock().unwrap().get(r).copied();
        Box::pin(async move { Ok(h) })
    }
    fn raise(&self, r: &str, token: u64) -> BoxFuture<'_, Result<u64, TableError>> {
        let mut f = self.fences.lock().unwrap();
        let h = f.entry(r.to_string()).or_insert(token);
        *h = (*h).max(token);
        let h = *h;
        Box::pin(async move { Ok(h) })
    }
    fn list(
        &self,
        _: &str,
        _: Option<&str>,
        _: usize,
    ) -> BoxFuture<'_, Result<Vec<FenceRecord>, TableError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn record_upload(&self, u: &str, t: u64) -> BoxFuture<'_, Result<(), TableError>> {
        self.uploads.lock().unwrap().insert(u.to_string(), t);
        Box::pin(async { Ok(()) })
    }
    fn upload_token(&self, u: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>> {
        let t = self.uploads.lock().unwrap().get(u).copied();
        Box::pin(async move { Ok(t) })
    }
    fn forget_upload(&self, u: &str) -> BoxFuture<'_, Result<(), TableError>> {
        self.uploads.lock().unwrap().remove(u);
        Box::pin(async { Ok(()) })
    }
}

pub(crate) fn gate(wait: Duration) -> Gate {
    Gate::new(Arc::new(MemStore::default()), wait)
}

#[tokio::test(start_paused = true)]
async fn check_table() {
    let g = gate(Duration::from_secs(1));
    drop(g.admit("r", 34, Kind::Write).await.unwrap());
    assert!(matches!(
        g.admit("r", 33, Kind::Write).await,
        Err(Refusal::Stale { highest: 34, .. })
    ));
    drop(g.admit("r", 34, Kind::Write).await.unwrap());
    assert!(
        g.admit("r", 40, Kind::Read)
            .await
            .unwrap()
            .permit()
            .is_none()
    );
    assert!(matches!(
        g.admit("r", 39, Kind::Write).await,
        Err(Refusal::Stale { highest: 40, .. })
    ));
    assert_eq!(g.highest("r").await.unwrap(), Some(40));
}

#[tokio::test(start_paused = true)]
async fn raise_aborts_streaming_lower_write() {
    let g = gate(Duration::from_secs(5));
    let old = g
        .admit("r", 33, Kind::Write)
        .await
        .unwrap()
        .permit()
        .unwrap();
    let signal = old.abort_signal();
    let g = Arc::new(g);
    let g2 = g.clone();
    let newer = tokio::spawn(async move { g2.admit("r", 34, Kind::Write).await });
    signal.fired().await;
    assert!(!old.body_complete(), "aborted write may not complete");
    assert!(!newer.is_finished());
    drop(old);
    assert!(newer.await.unwrap().unwrap().permit().is_some());
}

#[tokio::test(start_paused = true)]
async fn complete_lower_write_is_awaited_then_busy() {
    let g = gate(Duration::from_secs(10));
    let old = g
        .admit("r", 33, Kind::Write)
        .await
        .unwrap()
        .permit()
        .unwrap();
    assert!(old.body_complete());
    // The newer write waits for the older one, and gives up at the bound
    // (on paused time: the bound passes at once, and exactly).
    let waiting = tokio::time::Instant::now();
    assert!(matches!(
        g.admit("r", 34, Kind::Write).await,
        Err(Refusal::Busy)
    ));
    assert_eq!(waiting.elapsed(), Duration::from_secs(10));
    assert!(!old.abort_signal().is_fired());
    drop(old);
    assert!(
        g.admit("r", 34, Kind::Write)
            .await
            .unwrap()
            .permit()
            .is_some()
    );
    // The raise stayed: 33 is now stale.
    assert!(matches!(
        g.admit("r", 33, Kind::Write).await,
        Err(Refusal::Stale { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn idle_slots_are_evicted_and_reload_their_fence() {
    let mut g = gate(Duration::from_millis(100));
    g.set_max_slots(10);
    let busy = g
        .admit("busy", 5, Kind::Write)
        .await
        .unwrap()
        .permit()
        .unwrap();
    for i in 0..100 {
        drop(
            g.admit(&format!("r{i}"), 10 + i, Kind::Write)
                .await
                .unwrap(),
        );
    }
    assert!(g.cached_slots() <= 11, "{} slots cached", g.cached_slots());
    // Evicted fences come back from the fence table.
    assert!(matches!(
        g.admit("r0", 9, Kind::Write).await,
        Err(Refusal::Stale { highest: 10, .. })
    ));
    // The slot with a write in flight was kept: a newer token still
    // waits for it and aborts it.
    let g = Arc::new(g);
    let g2 = g.clone();
    let newer = tokio::spawn(async move { g2.admit("busy", 6, Kind::Write).await });
    busy.abort_signal().fired().await;
    drop(busy);
    assert!(newer.await.unwrap().unwrap().permit().is_some());
}

#[tokio::test(start_paused = true)]
async fn equal_tokens_do_not_wait_for_each_other() {
    let g = gate(Duration::from_millis(100));
    let a = g
        .admit("r", 7, Kind::Write)
        .await
        .unwrap()
        .permit()
        .unwrap();
    assert!(a.body_complete());
    let b = g.admit("r", 7, Kind::Write).await.unwrap().permit();
    assert!(b.is_some());
}
