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

use super::blobs::Blobs;
use crate::metric_names as m;
use crate::redb_file::DbFile;
use redb::WriteTransaction;
use std::sync::Arc;
use std::sync::mpsc;
use tokio::sync::oneshot;

/// Steps in one transaction, at most.
const MAX_BATCH: usize = 256;

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
