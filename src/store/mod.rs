//! fencegate's own embedded object store: the default backend, behind the
//! `s3s` crate's `S3` trait (s3s reads and writes S3's HTTP forms), which
//! `upstream::embedded` calls in-process, with no socket (and serves alone
//! on a socket for `fencegate bench store`). It keeps every write it
//! acknowledged (CONTRACT §9) by construction:
//!
//! - bytes go to blob files (`blobs.rs`), written whole and made durable
//!   before anything points at them;
//! - what exists is an index in redb (`index.rs`): buckets, objects,
//!   uploads, parts, and which blobs they use;
//! - every change is one step of a group-committed write transaction
//!   (`commit.rs`), so a write becomes visible whole, in one durable
//!   commit, or not at all; `kill -9` at any moment leaves the old object
//!   or the new one, never a torn one;
//! - conditions (`If-None-Match`, `If-Match`, a delete's) are checked in
//!   the step that commits the write, so they are atomic here too: the
//!   second guard under fencegate's own hold;
//! - a full disk refuses the write (`507`) and changes nothing; reads go
//!   on; once there is room, writes go through again without a restart
//!   (`redb_file.rs`).
//!
//! The S3 operations: `buckets.rs`, `acl.rs` (one owner, private),
//! `objects.rs` (PutObject, and the object record every write puts),
//! `read.rs` (GetObject, HeadObject, their ranges and conditions),
//! `delete.rs` (DeleteObject, DeleteObjects), `copy.rs` (CopyObject),
//! `multipart.rs` (with `checksums.rs`, a multipart object's checksums),
//! `listing.rs` (every listing but ListBuckets, which is in `buckets.rs`), `s3.rs` (the trait, one line per
//! operation). What the writes share: `save.rs` (a body saved in a new
//! blob and checked against what its request declared), `digests.rs` (a
//! body's MD5 and checksums) and `conditions.rs` (`If-None-Match`,
//! `If-Match`). `import.rs` brings in a
//! data directory the earlier s3s-fs store wrote.

mod acl;
mod blobs;
mod buckets;
mod checksums;
mod commit;
mod conditions;
mod copy;
mod delete;
mod digests;
mod import;
mod index;
mod listing;
mod multipart;
mod objects;
mod open_blobs;
mod read;
mod s3;
mod save;

use crate::redb_file::DbFile;
use blobs::{Blobs, WriteError};
use commit::Committer;
use index::{BLOBS, BUCKETS, OBJECTS, PARTS, UPLOADS};
use redb::{ReadTransaction, ReadableDatabase, ReadableTable, WriteTransaction};
use s3s::{S3Error, S3ErrorCode, S3Result, s3_error};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// redb's page cache for the index.
const INDEX_CACHE: usize = 64 << 20;

/// The embedded store on one directory: `index.redb` and `blobs/`.
#[derive(Clone)]
pub struct Store {
    index: Arc<DbFile>,
    blobs: Blobs,
    committer: Committer,
}

impl Store {
    /// Opens the store in `dir` (made if missing): the blob directories,
    /// the index, the commit thread, and, in the background, the
    /// collection of blob files nothing points at. A damaged index stops
    /// start-up. `legacy`: a data directory of the earlier s3s-fs store,
    /// imported first (`import.rs`) when it is there.
    pub fn open(dir: &Path, legacy: Option<&Path>) -> Result<Store, String> {
        let cannot = |e: std::io::Error| format!("cannot create {}: {e}", dir.display());
        let new_dir = !dir.exists();
        std::fs::create_dir_all(dir).map_err(cannot)?;
        let blobs = Blobs::open(dir.join("blobs")).map_err(cannot)?;
        let index = DbFile::open(&dir.join("index.redb"), INDEX_CACHE)?;
        // The entries of `blobs/` and `index.redb` in `dir` (and of `dir` in
        // its parent, when it was made now) are made durable once, here.
        blobs::sync_dir(dir).map_err(cannot)?;
        if new_dir {
            let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
            blobs::sync_dir(parent.unwrap_or(Path::new("."))).map_err(cannot)?;
        }
        let db = index.write()?;
        let made = (|| -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(BUCKETS)?;
            txn.open_table(OBJECTS)?;
            txn.open_table(UPLOADS)?;
            txn.open_table(PARTS)?;
            txn.open_table(BLOBS)?;
            txn.commit()?;
            Ok(())
        })();
        made.map_err(|e| format!("{}: {e}", index.path().display()))?;
        drop(db);
        if let Some(old) = legacy.filter(|d| d.is_dir()) {
            import::import_s3s_fs(&index, &blobs, old)?;
        }
        let committer = Committer::start(index.clone(), blobs.clone());
        let store = Store {
            index,
            blobs,
            committer,
        };
        // Only files older than a second before the open: a file's time
        // comes from the kernel's coarse clock, which lags `now()` by up to
        // a tick, so a blob written just after the open (its record not yet
        // committed) could look older than the open and be removed under
        // its record. A blob orphaned in the last second before a restart
        // is collected at the next start.
        store.collect_garbage_later(SystemTime::now() - Duration::from_secs(1));
        Ok(store)
    }

    /// Starts the task that keeps the index file writable after a disk
    /// error (needs a runtime).
    pub fn spawn_recovery(&self) {
        self.index.spawn_recovery(Duration::from_secs(1));
    }

    /// Why the store cannot write now, if it cannot (for readiness).
    pub fn failing(&self) -> Option<String> {
        self.index.failing()
    }

    /// Removes, in the background, the blob files older than `before` that
    /// the index does not point at.
    fn collect_garbage_later(&self, before: SystemTime) {
        let store = self.clone();
        std::thread::spawn(move || {
            match store.blobs.collect_garbage(before, |id| store.live(id)) {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    removed = n,
                    "embedded store: blob files nothing pointed at were removed"
                ),
                Err(e) => tracing::warn!("embedded store: collecting unused blob files: {e}"),
            }
        });
    }

    /// Whether the index points at blob `id`.
    fn live(&self, id: u128) -> Result<bool, String> {
        let db = self.index.database()?;
        let txn = db.begin_read().map_err(|e| e.to_string())?;
        let t = txn.open_table(BLOBS).map_err(|e| e.to_string())?;
        Ok(t.get(id).map_err(|e| e.to_string())?.is_some())
    }

    /// Runs `f` on a read transaction, off the async threads.
    async fn in_read_txn<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ReadTransaction) -> Result<T, S3Error> + Send + 'static,
    ) -> S3Result<T> {
        let index = self.index.clone();
        tokio::task::spawn_blocking(move || {
            let db = index.database().map_err(unavailable)?;
            let txn = db.begin_read().map_err(internal)?;
            f(&txn)
        })
        .await
        .map_err(internal)?
    }

    /// [`Store::in_read_txn`] on this thread, with no hop to a blocking
    /// thread and back: for a point lookup (one record, and at most
    /// `READ_HERE` bytes of blob, `read.rs`), which on a warm index and
    /// page cache takes a few microseconds, less than the two context
    /// switches of the hop (BENCHMARKS log, "Cores"). Cold pages block
    /// this thread for the disk reads of one B-tree lookup and one blob.
    /// `None` while the index must be opened again after a disk error,
    /// which is left to a blocking thread.
    fn in_read_txn_here<T>(
        &self,
        f: impl FnOnce(&ReadTransaction) -> Result<T, S3Error>,
    ) -> Option<S3Result<T>> {
        let db = self.index.open_now()?;
        let txn = db.begin_read().map_err(internal);
        Some(txn.and_then(|txn| f(&txn)))
    }

    /// Refuses a request on a bucket that does not exist (a write checks
    /// again in the step that commits it).
    async fn bucket_must_exist(&self, bucket: String) -> S3Result<()> {
        self.in_read_txn(move |txn| {
            let buckets = txn.open_table(BUCKETS).map_err(internal)?;
            bucket_exists(&buckets, &bucket).map_err(internal)?
        })
        .await
    }
}

/// Unix time in milliseconds.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// An S3 timestamp from unix milliseconds.
fn timestamp(ms: i64) -> s3s::dto::Timestamp {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    s3s::dto::Timestamp::from(t)
}

fn internal(e: impl std::fmt::Display) -> S3Error {
    S3Error::with_message(S3ErrorCode::InternalError, format!("embedded store: {e}"))
}

/// The store cannot write now (a disk error it is recovering from).
fn unavailable(e: impl std::fmt::Display) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::ServiceUnavailable,
        format!("embedded store: {e}; retry"),
    )
}

/// The disk is full: `507 InsufficientStorage`, nothing written.
fn full(e: impl std::fmt::Display) -> S3Error {
    let mut err = S3Error::with_message(
        S3ErrorCode::Custom("InsufficientStorage".into()),
        format!(
            "embedded store: the disk is full ({e}); nothing was written, retry once there is room"
        ),
    );
    err.set_status_code(http::StatusCode::INSUFFICIENT_STORAGE);
    err
}

/// A body write's error as S3 answers it.
fn write_error(e: WriteError) -> S3Error {
    match e {
        WriteError::Body(e) => s3_error!(IncompleteBody, "the request body broke off: {e}"),
        WriteError::Full(e) => full(e),
        WriteError::Io(e) => internal(e),
    }
}

/// `NoSuchBucket` unless `bucket` is in `buckets`, the table as a read or
/// a write transaction sees it. The outer error is the index's own: a step
/// fails its transaction with it, a read answers it `500`.
fn bucket_exists(
    buckets: &impl ReadableTable<&'static str, u64>,
    bucket: &str,
) -> Result<S3Result<()>, redb::StorageError> {
    Ok(match buckets.get(bucket)? {
        Some(_) => Ok(()),
        None => Err(s3_error!(
            NoSuchBucket,
            "the bucket {bucket} does not exist"
        )),
    })
}

/// A blob's references go up by one (a new record points at it).
fn blob_ref(txn: &WriteTransaction, id: u128) -> Result<(), redb::Error> {
    let mut t = txn.open_table(BLOBS)?;
    let n = t.get(id)?.map_or(0, |v| v.value());
    t.insert(id, n + 1)?;
    Ok(())
}

/// A blob's references go down by one; returns whether it is now unused
/// (its file is then removed after the commit).
fn blob_unref(txn: &WriteTransaction, id: u128) -> Result<bool, redb::Error> {
    let mut t = txn.open_table(BLOBS)?;
    let n = t.get(id)?.map_or(0, |v| v.value());
    if n <= 1 {
        t.remove(id)?;
        Ok(true)
    } else {
        t.insert(id, n - 1)?;
        Ok(false)
    }
}

/// An ETag without the quotes a client may have kept on it.
fn unquote(etag: &str) -> &str {
    let t = etag.trim();
    t.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(t)
}

/// S3's limit on a key's length, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

fn check_key(key: &str) -> S3Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(s3_error!(
            KeyTooLongError,
            "a key is 1 to {MAX_KEY_BYTES} bytes of UTF-8; this one is {}",
            key.len()
        ));
    }
    Ok(())
}

/// Only the one version an unversioned bucket has: `null`.
fn check_version(v: Option<&str>) -> S3Result<()> {
    match v {
        None | Some("null") => Ok(()),
        Some(_) => Err(s3_error!(
            NoSuchVersion,
            "this store keeps one version per key, `null`"
        )),
    }
}
