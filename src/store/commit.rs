//! Group commit: every change to the embedded store's index is one step of
//! a write transaction, applied by one thread in the order it came, and
//! the steps that arrive while a transaction commits go into the next one.
//! One fsync then makes many writes durable, and each step sees the index
//! as every step before it left it: a condition checked in a step holds for
//! the change that step makes (CONTRACT §8, §9).
//!
//! A step checks what it must before it changes anything, so that a refusal
//! (a failed condition, a missing bucket) leaves the transaction as it was
//! for the steps after it. A storage error in a step, or in the commit,
//! fails the whole transaction: every step of it is refused, nothing of it
//! is visible, and the index file is reopened (`redb_file.rs`).
//!
//! Before the commit, the directories of the blobs the steps point at are
//! made durable, so that the index never points at a file a crash could
//! lose.
//!
//! The store's operations hand their steps here: `Store::commit`, and
//! `Store::commit_fresh` for a step that points at a blob the request
//! just wrote (which is kept or removed by what becomes of the step);
//! `Committer::commit` sends a step to the commit thread (`run`).

use super::blobs::{Blobs, FreshBlob};
use super::{Store, full, unavailable};
use crate::metric_names as m;
use crate::redb_file::DbFile;
use redb::WriteTransaction;
use s3s::{S3Error, S3Result};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Steps in one transaction, at most.
const MAX_BATCH: usize = 256;

/// How long the blob of a failed commit waits for the index to write
/// again, to be removed if the index does not point at it.
const SETTLE_WAIT: Duration = Duration::from_secs(600);

/// What a step gives back: its own answer (a refusal is an answer), or a
/// storage error that fails the transaction.
pub type Applied<T> = Result<T, redb::Error>;

/// One step: applies itself to the transaction and says which new blobs
/// it points at; once the transaction's fate is known, it is told.
trait Step: Send {
    fn apply(&mut self, txn: &WriteTransaction) -> Result<Vec<u128>, redb::Error>;
    fn done(self: Box<Self>, committed: Result<(), String>);
}

struct Typed<F, T> {
    f: Option<F>,
    answer: Option<T>,
    reply: oneshot::Sender<Result<T, String>>,
}

impl<F, T> Step for Typed<F, T>
where
    F: FnOnce(&WriteTransaction) -> Applied<(T, Vec<u128>)> + Send,
    T: Send,
{
    fn apply(&mut self, txn: &WriteTransaction) -> Result<Vec<u128>, redb::Error> {
        let f = self.f.take().expect("applied once");
        let (answer, blobs) = f(txn)?;
        self.answer = Some(answer);
        Ok(blobs)
    }

    fn done(self: Box<Self>, committed: Result<(), String>) {
        let result = match (committed, self.answer) {
            (Ok(()), Some(a)) => Ok(a),
            (Ok(()), None) => Err("a step was not applied".to_string()),
            (Err(e), _) => Err(e),
        };
        let _ = self.reply.send(result);
    }
}

/// The committing thread's address.
#[derive(Clone)]
pub struct Committer {
    tx: mpsc::Sender<Box<dyn Step>>,
}

impl Committer {
    /// Starts the thread that applies steps to `index`.
    pub fn start(index: Arc<DbFile>, blobs: Blobs) -> Committer {
        let (tx, rx) = mpsc::channel::<Box<dyn Step>>();
        std::thread::Builder::new()
            .name("fencegate-store-commit".into())
            .spawn(move || run(index, blobs, rx))
            .expect("a thread for the store's commits");
        Committer { tx }
    }

    /// Applies `f` in the next transaction and returns its answer once the
    /// transaction is durable. `f` returns its answer and the new blobs it
    /// points at. `Err`: the transaction failed, and nothing of `f` is
    /// visible (though a commit whose last fsync failed may be read back
    /// when the index file is opened again: `Store::remove_unless_live_later`).
    /// The step is sent when this future is first polled, and from then on
    /// it is applied and committed even if the future is dropped; only its
    /// answer is lost.
    pub async fn commit<T, F>(&self, f: F) -> Result<T, String>
    where
        F: FnOnce(&WriteTransaction) -> Applied<(T, Vec<u128>)> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let step = Box::new(Typed {
            f: Some(f),
            answer: None,
            reply,
        });
        self.tx
            .send(step)
            .map_err(|_| "the store's commit thread is gone".to_string())?;
        answer
            .await
            .map_err(|_| "the store's commit thread is gone".to_string())?
    }
}

impl Store {
    /// Applies `f` in the next group commit (see `commit.rs`): its answer
    /// once durable. A step that points at a new blob goes through
    /// [`Store::commit_fresh`] instead.
    pub(super) async fn commit<T: Send + 'static>(
        &self,
        f: impl FnOnce(&WriteTransaction) -> Applied<S3Result<T>> + Send + 'static,
    ) -> S3Result<T> {
        let step = move |txn: &WriteTransaction| Ok((f(txn)?, vec![]));
        self.committer.commit(step).await.map_err(commit_failed)?
    }

    /// Applies `f`, a step that points at the new blob `fresh` guards, in
    /// the next group commit, as [`Store::commit`] does, and settles the
    /// blob. `f` answers `Ok` only if what it commits points at the blob;
    /// a refusal (`Err`) must leave nothing that does.
    ///
    /// - Committed: a record points at the blob, which stays.
    /// - Refused: nothing points at it; the guard removes it.
    /// - The transaction failed: it may be in the index all the same (see
    ///   `remove_unless_live_later`), so the blob is removed only once the
    ///   index says that nothing points at it.
    /// - This future dropped while it waits (the client left): the blob is
    ///   left be, as reasoned below.
    pub(super) async fn commit_fresh<T: Send + 'static>(
        &self,
        mut fresh: FreshBlob,
        f: impl FnOnce(&WriteTransaction) -> Applied<S3Result<T>> + Send + 'static,
    ) -> S3Result<T> {
        let id = fresh.id();
        // The step goes to the commit thread when the future below is first
        // polled, and from then on the thread applies and commits it
        // whether or not anyone still waits for its answer (`commit.rs`:
        // `Committer::commit` sends the step, `run` applies every step it
        // receives, and `Typed::done` drops an answer nobody receives). So
        // once it is sent, this future can be dropped (the client left)
        // while a record that points at the blob is still committed: the
        // guard must not remove the blob then. It stops removing here,
        // before the step is sent, with no `await` in between (the step is
        // sent in the same poll). So a request that leaves while its step
        // is on its way leaves its blob to the start-up collection
        // (`collect_garbage`), which removes it only if the index does not
        // point at it.
        fresh.committing();
        let answer = self
            .committer
            .commit(move |txn| Ok((f(txn)?, vec![id])))
            .await;
        match answer {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(refused)) => {
                fresh.refused();
                Err(refused)
            }
            Err(e) => {
                self.remove_unless_live_later(id);
                Err(commit_failed(e))
            }
        }
    }

    /// Removes blob `id`, which a failed commit was to point at, once the
    /// index writes again, if it does not point at it. A commit that
    /// failed may be in the index all the same: redb writes the new header
    /// before the fsync that makes it durable, and a file reopened after
    /// that fsync failed (`redb_file.rs`) can read the commit back. Once a
    /// later commit of the commit thread went through, the index is past
    /// the failed one and says what it holds. Until then, for at most
    /// `SETTLE_WAIT`, or if the index cannot say, the blob stays, and the
    /// next start-up's collection takes it.
    fn remove_unless_live_later(&self, id: u128) {
        let store = self.clone();
        tokio::spawn(async move {
            let every = Duration::from_secs(1);
            for _ in 0..SETTLE_WAIT.as_secs() {
                if store.committer.commit(|_| Ok(((), vec![]))).await.is_ok() {
                    let _ = tokio::task::spawn_blocking(move || {
                        if let Ok(false) = store.live(id) {
                            store.blobs.remove(id);
                        }
                    })
                    .await;
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
    }
}

/// The answer to a transaction that failed: the disk is full, or the index
/// cannot write now.
fn commit_failed(e: String) -> S3Error {
    if e.contains("(os error 28)") {
        full(&e)
    } else {
        unavailable(e)
    }
}

fn run(index: Arc<DbFile>, blobs: Blobs, rx: mpsc::Receiver<Box<dyn Step>>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(s) => batch.push(s),
                Err(_) => break,
            }
        }
        let result = apply_all(&index, &blobs, &mut batch);
        if let Err(e) = &result {
            tracing::warn!(
                "the store's index could not commit {} writes: {e}",
                batch.len()
            );
        }
        for step in batch {
            step.done(result.clone());
        }
    }
}

fn apply_all(index: &DbFile, blobs: &Blobs, batch: &mut [Box<dyn Step>]) -> Result<(), String> {
    let db = index.write()?;
    let mut attempt = || -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        let mut new_blobs = Vec::new();
        for step in batch.iter_mut() {
            new_blobs.extend(step.apply(&txn)?);
        }
        blobs.sync_dirs(new_blobs).map_err(redb::Error::Io)?;
        txn.commit()?;
        Ok(())
    };
    attempt().map_err(|e| {
        drop(db);
        index.failed(&e);
        metrics::counter!(m::STORE_WRITE_FAILURES, "store" => "objects").increment(1);
        e.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::super::blob_ref;
    use super::*;
    use bytes::Bytes;
    use futures_util::FutureExt;
    use s3s::s3_error;

    async fn written(store: &Store) -> FreshBlob {
        let fresh = store.blobs.fresh();
        let body = futures_util::stream::iter([Ok::<_, String>(Bytes::from_static(b"x"))]);
        store.blobs.write(fresh.id(), body, |_| {}).await.unwrap();
        fresh
    }

    #[tokio::test]
    async fn a_fresh_blob_stays_once_its_step_is_sent_and_goes_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), None).unwrap();

        // Dropped before any commit: removed.
        let fresh = written(&store).await;
        let path = store.blobs.path_of(fresh.id());
        drop(fresh);
        assert!(!path.exists());

        // Refused by its step: removed.
        let fresh = written(&store).await;
        let path = store.blobs.path_of(fresh.id());
        let refused = store
            .commit_fresh(fresh, |_| {
                Ok::<S3Result<()>, _>(Err(s3_error!(InvalidRequest)))
            })
            .await;
        assert!(refused.is_err() && !path.exists());

        // Its request dropped once the step went to the commit thread (the
        // first poll sends it): the step is committed all the same, and the
        // blob it points at stays.
        let fresh = written(&store).await;
        let (id, path) = (fresh.id(), store.blobs.path_of(fresh.id()));
        let points_at = move |txn: &WriteTransaction| Ok(Ok(blob_ref(txn, id)?));
        let mut request = Box::pin(store.commit_fresh(fresh, points_at));
        let _ = (&mut request).now_or_never();
        drop(request);
        // A later step is applied after it: its transaction is done.
        store.commit(|_| Ok(Ok(()))).await.unwrap();
        assert!(store.live(id).unwrap(), "the step was committed");
        assert!(path.exists(), "and its blob is there");
    }
}
