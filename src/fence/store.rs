//! Durable fences. The check keeps fences in memory; this is where a raise is
//! made durable before anything is forwarded or answered (CONTRACT §5).
//!
//! The store sits behind [`FenceStore`] so that a store shared by several
//! fencegate replicas (etcd, say) can replace the embedded one without
//! touching the check in `gate.rs`.

use futures_util::future::BoxFuture;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// resource → (highest token, unix millis when it last rose)
const FENCES: TableDefinition<&str, (u64, u64)> = TableDefinition::new("fences");

/// One resource's recorded fence.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FenceRecord {
    pub resource: String,
    pub highest: u64,
    /// Unix time in milliseconds of the last raise.
    pub raised_at_ms: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("fence store: {0}")]
pub struct StoreError(pub String);

pub trait FenceStore: Send + Sync + 'static {
    /// The recorded highest token of `resource`, if any.
    fn get(&self, resource: &str) -> BoxFuture<'_, Result<Option<u64>, StoreError>>;

    /// Records `max(current, token)` for `resource` and returns once that is
    /// durable. Returns the highest now recorded (which may exceed `token`
    /// if another writer of a shared store got there first).
    fn raise(&self, resource: &str, token: u64) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Records in resource order, starting after `after`, at most `limit`.
    fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<FenceRecord>, StoreError>>;
}

/// The embedded store: one redb file, `fences.redb`, in the data directory.
pub struct RedbStore {
    db: Arc<Database>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn store_err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl RedbStore {
    /// Opens or creates the store. Any problem with an existing file is an
    /// error for the caller to report; the file is never reset.
    pub fn open(path: &Path) -> Result<RedbStore, StoreError> {
        let db = Database::create(path)
            .map_err(|e| StoreError(format!("cannot open {}: {e}", path.display())))?;
        // Make sure the table exists and is readable now, not on first use.
        let txn = db.begin_write().map_err(store_err)?;
        txn.open_table(FENCES)
            .map_err(|e| StoreError(format!("{}: {e}", path.display())))?;
        txn.commit().map_err(store_err)?;
        let read = db.begin_read().map_err(store_err)?;
        let table = read.open_table(FENCES).map_err(store_err)?;
        // Walk every entry once so a damaged table is found at start-up.
        for entry in table.iter().map_err(store_err)? {
            entry.map_err(|e| StoreError(format!("{}: {e}", path.display())))?;
        }
        drop(table);
        drop(read);
        Ok(RedbStore { db: Arc::new(db) })
    }

    fn get_blocking(db: &Database, resource: &str) -> Result<Option<u64>, StoreError> {
        let txn = db.begin_read().map_err(store_err)?;
        let table = txn.open_table(FENCES).map_err(store_err)?;
        Ok(table.get(resource).map_err(store_err)?.map(|v| v.value().0))
    }

    fn raise_blocking(db: &Database, resource: &str, token: u64) -> Result<u64, StoreError> {
        let txn = db.begin_write().map_err(store_err)?;
        let highest = {
            let mut table = txn.open_table(FENCES).map_err(store_err)?;
            let current = table.get(resource).map_err(store_err)?.map(|v| v.value().0);
            match current {
                Some(h) if h >= token => h,
                _ => {
                    table
                        .insert(resource, (token, now_ms()))
                        .map_err(store_err)?;
                    token
                }
            }
        };
        // redb commits with immediate durability (fsync) by default.
        txn.commit().map_err(store_err)?;
        Ok(highest)
    }

    fn list_blocking(
        db: &Database,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<FenceRecord>, StoreError> {
        let txn = db.begin_read().map_err(store_err)?;
        let table = txn.open_table(FENCES).map_err(store_err)?;
        let start = match after {
            Some(a) if a >= prefix => a,
            _ => prefix,
        };
        let mut out = Vec::new();
        for entry in table.range(start..).map_err(store_err)? {
            let (k, v) = entry.map_err(store_err)?;
            let key = k.value();
            if Some(key) == after {
                continue;
            }
            if !key.starts_with(prefix) || out.len() >= limit {
                break;
            }
            let (highest, raised_at_ms) = v.value();
            out.push(FenceRecord {
                resource: key.to_string(),
                highest,
                raised_at_ms,
            });
        }
        Ok(out)
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError(format!("store task failed: {e}")))?
}

impl FenceStore for RedbStore {
    fn get(&self, resource: &str) -> BoxFuture<'_, Result<Option<u64>, StoreError>> {
        let db = self.db.clone();
        let resource = resource.to_string();
        Box::pin(blocking(move || Self::get_blocking(&db, &resource)))
    }

    fn raise(&self, resource: &str, token: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        let db = self.db.clone();
        let resource = resource.to_string();
        Box::pin(blocking(move || {
            Self::raise_blocking(&db, &resource, token)
        }))
    }

    fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<FenceRecord>, StoreError>> {
        let db = self.db.clone();
        let prefix = prefix.to_string();
        let after = after.map(str::to_string);
        Box::pin(blocking(move || {
            Self::list_blocking(&db, &prefix, after.as_deref(), limit)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn raise_never_lowers_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fences.redb");
        {
            let s = RedbStore::open(&path).unwrap();
            assert_eq!(s.raise("b/k", 34).await.unwrap(), 34);
            assert_eq!(s.raise("b/k", 33).await.unwrap(), 34);
            assert_eq!(s.raise("b/j", 7).await.unwrap(), 7);
        }
        let s = RedbStore::open(&path).unwrap();
        assert_eq!(s.get("b/k").await.unwrap(), Some(34));
        assert_eq!(s.get("nope").await.unwrap(), None);
        let page = s.list("b/", None, 1).await.unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].resource, "b/j");
        let page = s.list("b/", Some("b/j"), 10).await.unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].resource, "b/k");
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fences.redb");
        std::fs::write(&path, vec![0xA5u8; 64 * 1024]).unwrap();
        assert!(RedbStore::open(&path).is_err());
        // The file is still there, untouched.
        assert_eq!(std::fs::read(&path).unwrap(), vec![0xA5u8; 64 * 1024]);
    }
}
