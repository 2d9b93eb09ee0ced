//! A redb file that comes back by itself after a full disk (CONTRACT §9).
//!
//! redb refuses every write after one failed with an I/O error ("Previous
//! I/O error occurred. Please close and re-open the database"), until the
//! database is closed and opened again. fencegate keeps two redb files, the
//! fence table (`fences.redb`) and the embedded store's index; a disk that
//! fills up and is then freed must not leave either refusing writes until
//! a restart. So each sits behind a [`DbFile`]:
//!
//! - a write that fails with a storage error marks the file failing, with
//!   the reason, and the handle is dropped;
//! - the next use opens the file again, once nothing uses the old handle
//!   any more (redb lets a file be open once), and a durable probe write
//!   (a row in a table of its own) tells whether it can write again; until
//!   it can, every write is refused with the reason, and readiness says it;
//! - a task retries the probe every second while the file is failing, so
//!   that it recovers without waiting for traffic.
//!
//! Reads go on from the open handle while writes fail, and are refused only
//! in the moment of reopening. A leaf: it knows redb and nothing of the
//! crate.

use redb::{Database, TableDefinition};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The probe's own table: one row, rewritten.
const PROBE: TableDefinition<&str, u64> = TableDefinition::new("fencegate_probe");

pub struct DbFile {
    path: PathBuf,
    cache_bytes: usize,
    state: Mutex<State>,
}

struct State {
    db: Option<Arc<Database>>,
    /// The handle given up after a failure, until nothing uses it.
    old: Weak<Database>,
    /// Why writes fail now, if they do.
    failing: Option<String>,
}

/// Whether a redb error means the file must be opened again: any storage
/// error (an I/O error, or redb remembering one).
pub fn needs_reopen(e: &redb::Error) -> bool {
    matches!(
        e,
        redb::Error::Io(_) | redb::Error::PreviousIo | redb::Error::Corrupted(_)
    )
}

impl DbFile {
    /// Opens (or creates) `path`. A file that cannot be opened is an error
    /// for the caller to report; it is never reset.
    pub fn open(path: &Path, cache_bytes: usize) -> Result<Arc<DbFile>, String> {
        let db = open_db(path, cache_bytes)?;
        Ok(Arc::new(DbFile {
            path: path.to_path_buf(),
            cache_bytes,
            state: Mutex::new(State {
                db: Some(Arc::new(db)),
                old: Weak::new(),
                failing: None,
            }),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every critical section is a few field updates: poisoning is
        // harmless.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The database, reopened first after a disk error.
    pub fn database(&self) -> Result<Arc<Database>, String> {
        let mut st = self.lock();
        if let Some(db) = &st.db {
            return Ok(db.clone());
        }
        self.reopen(&mut st)
    }

    /// The database if it is open, without waiting: `None` while it is
    /// to be opened again, or while another thread holds the state (a
    /// reopening holds it for as long as redb takes to open the file). For
    /// a caller that must not block.
    pub fn open_now(&self) -> Option<Arc<Database>> {
        let st = match self.state.try_lock() {
            Ok(st) => st,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        st.db.clone()
    }

    /// The database for a write: refused with the reason while the file
    /// cannot write (its reopening and probe are tried first).
    pub fn write(&self) -> Result<Arc<Database>, String> {
        let db = self.database()?;
        if self.lock().failing.is_none() {
            return Ok(db);
        }
        drop(db);
        self.recover()?;
        self.database()
    }

    /// Opens the file again, unless the old handle is still in use.
    fn reopen(&self, st: &mut State) -> Result<Arc<Database>, String> {
        let why = st.failing.clone().unwrap_or_default();
        if st.old.upgrade().is_some() {
            return Err(format!("{why} (reopening {})", self.path.display()));
        }
        let db =
            Arc::new(open_db(&self.path, self.cache_bytes).map_err(|e| format!("{why}; {e}"))?);
        st.db = Some(db.clone());
        Ok(db)
    }

    /// A write through `db` failed with `e`: when redb needs it, the
    /// handle is given up, to be opened again, and writes are refused
    /// until the probe succeeds.
    pub fn failed(&self, e: &redb::Error) {
        let mut st = self.lock();
        st.failing = Some(format!("{}: {e}", self.path.display()));
        if needs_reopen(e)
            && let Some(db) = st.db.take()
        {
            st.old = Arc::downgrade(&db);
        }
    }

    /// Why writes fail now, if they do (for readiness).
    pub fn failing(&self) -> Option<String> {
        self.lock().failing.clone()
    }

    /// Tries a durable write of the probe row; clears the failure if it
    /// goes through.
    pub fn recover(&self) -> Result<(), String> {
        let db = self.database()?;
        let probe = || -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(PROBE)?.insert("probe", crate_now_ms())?;
            txn.commit()?;
            Ok(())
        };
        match probe() {
            Ok(()) => {
                let mut st = self.lock();
                if st.failing.take().is_some() {
                    tracing::warn!(path = %self.path.display(), "writes go through again");
                }
                Ok(())
            }
            Err(e) => {
                drop(db);
                self.failed(&e);
                Err(self.failing().unwrap_or_default())
            }
        }
    }

    /// While the file is failing, tries to recover every `every`.
    pub fn spawn_recovery(self: &Arc<Self>, every: Duration) {
        let file = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(file) = file.upgrade() else { return };
                if file.failing().is_some() {
                    let _ = tokio::task::spawn_blocking(move || file.recover()).await;
                }
            }
        });
    }
}

fn open_db(path: &Path, cache_bytes: usize) -> Result<Database, String> {
    Database::builder()
        .set_cache_size(cache_bytes)
        .create(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))
}

fn crate_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
