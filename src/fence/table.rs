//! Durable fences. The check keeps fences in memory; on a single node this
//! is where a raise is made durable before anything is forwarded or
//! answered (CONTRACT §5).
//!
//! [`FenceTable`] has two implementations: [`RedbTable`] here
//! (`fences.redb`, a single node's), and the cluster's, in etcd
//! (`cluster/table.rs`). The gate (`gate/mod.rs`) raises through the fence table
//! only on a single node. In cluster mode it makes its raises in etcd
//! itself: an owner's under its epoch (`gate/owned.rs`), or, without
//! owners, in the one admission transaction that also checks and orders
//! (`gate/cluster.rs`). The fence table then serves the gate's reads of fences,
//! the admin API's listing, `fencegate fences import` and the multipart
//! uploads' tokens.

use crate::metric_names as m;
use crate::redb_file::DbFile;
use futures_util::future::BoxFuture;
use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// resource → (highest token, unix millis when it last rose)
const FENCES: TableDefinition<&str, (u64, u64)> = TableDefinition::new("fences");
/// open multipart upload (`bucket/key\nuploadId`) → the token that created it
const UPLOADS: TableDefinition<&str, u64> = TableDefinition::new("uploads");

/// At most this many open uploads are remembered; beyond it, their parts
/// must carry a token of their own (they get 428 otherwise, never a pass).
pub const MAX_OPEN_UPLOADS: u64 = 100_000;

/// One resource's recorded fence.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FenceRecord {
    pub resource: String,
    pub highest: u64,
    /// Unix time in milliseconds of the last raise.
    pub raised_at_ms: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("fence table: {0}")]
pub struct TableError(pub String);

pub trait FenceTable: Send + Sync + 'static {
    /// The recorded highest token of `resource`, if any.
    fn get(&self, resource: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>>;

    /// Records `max(current, token)` for `resource` and returns once that is
    /// durable. Returns the highest now recorded (which may exceed `token`
    /// if another writer of a shared fence table got there first).
    fn raise(&self, resource: &str, token: u64) -> BoxFuture<'_, Result<u64, TableError>>;

    /// Records in resource order, starting after `after`, at most `limit`.
    fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<FenceRecord>, TableError>>;

    /// Remembers, durably, the token that created multipart upload `upload`
    /// (`bucket/key\nuploadId`), unless [`MAX_OPEN_UPLOADS`] are open.
    fn record_upload(&self, upload: &str, token: u64) -> BoxFuture<'_, Result<(), TableError>>;

    /// The token that created `upload`, if it is remembered.
    fn upload_token(&self, upload: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>>;

    /// Forgets `upload` (completed or aborted).
    fn forget_upload(&self, upload: &str) -> BoxFuture<'_, Result<(), TableError>>;

    /// Why raises cannot be made durable now, if they cannot (a full
    /// disk: readiness says it until they can).
    fn failing(&self) -> Option<String> {
        None
    }
}

/// A single node's fence table: one redb file, `fences.redb`, in the data directory,
/// reopened by itself after a disk error (`redb_file.rs`).
pub struct RedbTable {
    file: Arc<DbFile>,
}

/// redb's page cache. Fences are looked up once per resource and then kept
/// by the gate, so a small cache does; memory stays bounded however many
/// resources the file holds.
const CACHE_BYTES: usize = 16 << 20;

/// Unix time in milliseconds (the raise time kept with a fence).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn table_err(e: impl std::fmt::Display) -> TableError {
    TableError(e.to_string())
}

impl RedbTable {
    /// Opens or creates the fence table. Any problem with an existing file is an
    /// error for the caller to report; the file is never reset.
    pub fn open(path: &Path) -> Result<RedbTable, TableError> {
        // redb treats an empty file as a new database; for fencegate an
        // existing empty fence table is a lost one (truncated, or its disk
        // contents gone), and starting empty would admit stale writers.
        if let Ok(meta) = std::fs::metadata(path)
            && meta.len() == 0
        {
            return Err(TableError(format!(
                "{} exists but is empty: the fence table was truncated or lost. \
                 Restore it from a backup, or remove it only if no stale writer can still write",
                path.display()
            )));
        }
        let file = DbFile::open(path, CACHE_BYTES).map_err(TableError)?;
        let db = file.database().map_err(TableError)?;
        // Make sure the table exists and is readable now, not on first use.
        let txn = db.begin_write().map_err(table_err)?;
        txn.open_table(FENCES)
            .map_err(|e| TableError(format!("{}: {e}", path.display())))?;
        txn.open_table(UPLOADS)
            .map_err(|e| TableError(format!("{}: {e}", path.display())))?;
        txn.commit().map_err(table_err)?;
        let read = db.begin_read().map_err(table_err)?;
        let table = read.open_table(FENCES).map_err(table_err)?;
        // Walk every entry once so a damaged table is found at start-up.
        for entry in table.iter().map_err(table_err)? {
            entry.map_err(|e| TableError(format!("{}: {e}", path.display())))?;
        }
        drop(table);
        drop(read);
        drop(db);
        Ok(RedbTable { file })
    }

    /// Keeps the file writable after a disk error, by itself (needs a
    /// runtime).
    pub fn spawn_recovery(&self) {
        self.file.spawn_recovery(std::time::Duration::from_secs(1));
    }

    /// Runs a read on the current handle.
    fn reading<T>(
        file: &DbFile,
        f: impl FnOnce(&Database) -> Result<T, TableError>,
    ) -> Result<T, TableError> {
        let db = file.database().map_err(TableError)?;
        f(&db)
    }

    /// Runs a write on the current handle; a storage error marks the file
    /// failing (and to be reopened), and is counted.
    fn writing<T>(
        file: &DbFile,
        f: impl FnOnce(&Database) -> Result<T, redb::Error>,
    ) -> Result<T, TableError> {
        let db = file.write().map_err(TableError)?;
        f(&db).map_err(|e| {
            drop(db);
            file.failed(&e);
            metrics::counter!(m::STORE_WRITE_FAILURES, "store" => "fences").increment(1);
            TableError(format!("{}: {e}", file.path().display()))
        })
    }

    fn get_blocking(db: &Database, resource: &str) -> Result<Option<u64>, TableError> {
        let txn = db.begin_read().map_err(table_err)?;
        let table = txn.open_table(FENCES).map_err(table_err)?;
        Ok(table.get(resource).map_err(table_err)?.map(|v| v.value().0))
    }

    fn raise_blocking(db: &Database, resource: &str, token: u64) -> Result<u64, redb::Error> {
        let txn = db.begin_write()?;
        let highest = {
            let mut table = txn.open_table(FENCES)?;
            let current = table.get(resource)?.map(|v| v.value().0);
            match current {
                Some(h) if h >= token => h,
                _ => {
                    table.insert(resource, (token, now_ms()))?;
                    token
                }
            }
        };
        // redb commits with immediate durability (fsync) by default.
        txn.commit()?;
        Ok(highest)
    }

    fn list_blocking(
        db: &Database,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<FenceRecord>, TableError> {
        let txn = db.begin_read().map_err(table_err)?;
        let table = txn.open_table(FENCES).map_err(table_err)?;
        let start = match after {
            Some(a) if a >= prefix => a,
            _ => prefix,
        };
        let mut out = Vec::new();
        for entry in table.range(start..).map_err(table_err)? {
            let (k, v) = entry.map_err(table_err)?;
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

impl RedbTable {
    fn record_upload_blocking(db: &Database, upload: &str, token: u64) -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        {
            let mut table = txn.open_table(UPLOADS)?;
            if table.len()? >= MAX_OPEN_UPLOADS {
                return Ok(());
            }
            table.insert(upload, token)?;
        }
        Ok(txn.commit()?)
    }

    fn upload_token_blocking(db: &Database, upload: &str) -> Result<Option<u64>, TableError> {
        let txn = db.begin_read().map_err(table_err)?;
        let table = txn.open_table(UPLOADS).map_err(table_err)?;
        Ok(table.get(upload).map_err(table_err)?.map(|v| v.value()))
    }

    fn forget_upload_blocking(db: &Database, upload: &str) -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        txn.open_table(UPLOADS)?.remove(upload)?;
        Ok(txn.commit()?)
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TableError> + Send + 'static,
) -> Result<T, TableError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TableError(format!("fence table task failed: {e}")))?
}

impl FenceTable for RedbTable {
    fn get(&self, resource: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>> {
        let (file, resource) = (self.file.clone(), resource.to_string());
        Box::pin(blocking(move || {
            Self::reading(&file, |db| Self::get_blocking(db, &resource))
        }))
    }

    fn raise(&self, resource: &str, token: u64) -> BoxFuture<'_, Result<u64, TableError>> {
        let (file, resource) = (self.file.clone(), resource.to_string());
        Box::pin(blocking(move || {
            Self::writing(&file, |db| Self::raise_blocking(db, &resource, token))
        }))
    }

    fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<FenceRecord>, TableError>> {
        let (file, prefix) = (self.file.clone(), prefix.to_string());
        let after = after.map(str::to_string);
        Box::pin(blocking(move || {
            Self::reading(&file, |db| {
                Self::list_blocking(db, &prefix, after.as_deref(), limit)
            })
        }))
    }

    fn record_upload(&self, upload: &str, token: u64) -> BoxFuture<'_, Result<(), TableError>> {
        let (file, upload) = (self.file.clone(), upload.to_string());
        Box::pin(blocking(move || {
            Self::writing(&file, |db| Self::record_upload_blocking(db, &upload, token))
        }))
    }

    fn upload_token(&self, upload: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>> {
        let (file, upload) = (self.file.clone(), upload.to_string());
        Box::pin(blocking(move || {
            Self::reading(&file, |db| Self::upload_token_blocking(db, &upload))
        }))
    }

    fn forget_upload(&self, upload: &str) -> BoxFuture<'_, Result<(), TableError>> {
        let (file, upload) = (self.file.clone(), upload.to_string());
        Box::pin(blocking(move || {
            Self::writing(&file, |db| Self::forget_upload_blocking(db, &upload))
        }))
    }

    fn failing(&self) -> Option<String> {
        self.file.failing()
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
            let s = RedbTable::open(&path).unwrap();
            assert_eq!(s.raise("b/k", 34).await.unwrap(), 34);
            assert_eq!(s.raise("b/k", 33).await.unwrap(), 34);
            assert_eq!(s.raise("b/j", 7).await.unwrap(), 7);
        }
        let s = RedbTable::open(&path).unwrap();
        assert_eq!(s.get("b/k").await.unwrap(), Some(34));
        assert_eq!(s.get("nope").await.unwrap(), None);
        let page = s.list("b/", None, 1).await.unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].resource, "b/j");
        let page = s.list("b/", Some("b/j"), 10).await.unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].resource, "b/k");
    }

    #[tokio::test]
    async fn upload_tokens_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fences.redb");
        {
            let s = RedbTable::open(&path).unwrap();
            s.record_upload("b/k\nu1", 7).await.unwrap();
            s.record_upload("b/k\nu2", 8).await.unwrap();
            s.forget_upload("b/k\nu2").await.unwrap();
        }
        let s = RedbTable::open(&path).unwrap();
        assert_eq!(s.upload_token("b/k\nu1").await.unwrap(), Some(7));
        assert_eq!(s.upload_token("b/k\nu2").await.unwrap(), None);
    }

    #[test]
    fn empty_file_is_an_error_not_a_new_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fences.redb");
        std::fs::write(&path, b"").unwrap();
        let e = RedbTable::open(&path)
            .err()
            .expect("an empty fence table must not open");
        assert!(e.0.contains("empty"), "{e}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    }

    #[test]
    fn corrupt_file_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fences.redb");
        std::fs::write(&path, vec![0xA5u8; 64 * 1024]).unwrap();
        assert!(RedbTable::open(&path).is_err());
        // The file is still there, untouched.
        assert_eq!(std::fs::read(&path).unwrap(), vec![0xA5u8; 64 * 1024]);
    }
}
