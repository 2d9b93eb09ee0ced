//! Batched admissions: admissions on distinct resources that arrive while one
//! etcd transaction is on its way go together in the next one, each as a
//! nested transaction of its own. Under load this makes one raft commit
//! serve many writes; alone, a request still goes at once, in one round
//! trip.
//!
//! Nested transactions of one batch must not put the same key (etcd refuses
//! such a transaction whole), so a batch holds at most one admission per
//! resource; another for the same resource goes in the next batch. Up to
//! [`IN_FLIGHT`] batches are on their way at once, so that writes to one
//! hot resource are not queued one round trip each. The nested transactions
//! are applied in order, atomically, so each is exactly what it would have
//! been alone. A batch that fails is sent again one admission at a time, so
//! that one bad admission (a registration under a lease that just expired)
//! fails only itself.

use super::keys::{self, Outcome};
use super::{ClusterError, call};
use etcd_client::{Client, Txn, TxnOp, TxnOpResponse};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Admissions in one transaction, at most. etcd limits the operations of a
/// transaction (`--max-txn-ops`, 128 by default) and gives a nested one
/// what its parents left: a batch of 64 admissions, each three
/// transactions deep with up to 5, 5 and 4 operations (`keys::admission`),
/// needs `--max-txn-ops` of at least 78.
const MAX_BATCH: usize = 64;
/// Batches on their way at once.
const IN_FLIGHT: usize = 2;

pub(super) struct Admission {
    pub resource: String,
    pub txn: Txn,
    pub reply: oneshot::Sender<Result<Outcome, ClusterError>>,
}

/// Sends the admissions it receives, batched, until every sender is gone.
pub(super) async fn run(client: Client, mut rx: mpsc::UnboundedReceiver<Admission>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut waiting: VecDeque<Admission> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match rx.recv().await {
                Some(a) => waiting.push_back(a),
                None => return,
            }
        }
        // While every slot is busy, more admissions gather for the batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        while let Ok(a) = rx.try_recv() {
            waiting.push_back(a);
        }
        let batch = take_batch(&mut waiting);
        if batch.is_empty() {
            continue;
        }
        let client = client.clone();
        tokio::spawn(async move {
            send(&client, batch).await;
            drop(slot);
        });
    }
}

/// The first admissions of `waiting` on distinct resources, up to
/// [`MAX_BATCH`]; the rest stay, in order.
fn take_batch(waiting: &mut VecDeque<Admission>) -> Vec<Admission> {
    let mut batch = Vec::new();
    let mut resources = HashSet::new();
    let mut later = VecDeque::new();
    while let Some(a) = waiting.pop_front() {
        // Its request is gone (answered with an error, or the client left):
        // its registration must not be put after the request deleted it.
        if a.reply.is_closed() {
            continue;
        }
        if batch.len() < MAX_BATCH && resources.insert(a.resource.clone()) {
            batch.push(a);
        } else {
            later.push_back(a);
        }
    }
    *waiting = later;
    batch
}

async fn send(client: &Client, batch: Vec<Admission>) {
    if batch.len() == 1 {
        let a = batch.into_iter().next().expect("one");
        let _ = a.reply.send(send_one(client, a.txn).await);
        return;
    }
    let mut kv = client.kv_client();
    let ops: Vec<TxnOp> = batch.iter().map(|a| TxnOp::txn(a.txn.clone())).collect();
    match call("admit", kv.txn(Txn::new().and_then(ops))).await {
        Ok(resp) => {
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            let mut answers = resp.op_responses().into_iter();
            for a in batch {
                let result = match answers.next() {
                    Some(TxnOpResponse::Txn(r)) => {
                        keys::outcome(&r, rev).map_err(ClusterError::Etcd)
                    }
                    _ => Err(ClusterError::Etcd(
                        "a batched admission has no answer".into(),
                    )),
                };
                let _ = a.reply.send(result);
            }
        }
        Err(e) => {
            tracing::debug!(
                "a batch of {} admissions failed ({e}); sending them one by one",
                batch.len()
            );
            for a in batch {
                if !a.reply.is_closed() {
                    let _ = a.reply.send(send_one(client, a.txn).await);
                }
            }
        }
    }
}

/// One admission in a transaction of its own.
async fn send_one(client: &Client, txn: Txn) -> Result<Outcome, ClusterError> {
    let mut kv = client.kv_client();
    let resp = call("admit", kv.txn(txn)).await?;
    let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
    keys::outcome(&resp, rev).map_err(ClusterError::Etcd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(resource: &str) -> (Admission, oneshot::Receiver<Result<Outcome, ClusterError>>) {
        let (reply, rx) = oneshot::channel();
        let a = Admission {
            resource: resource.into(),
            txn: Txn::new(),
            reply,
        };
        (a, rx)
    }

    #[test]
    fn a_batch_holds_one_admission_per_resource_and_the_rest_keep_their_order() {
        let names = ["a", "b", "a", "c", "a", "b"];
        let (mut waiting, _replies): (VecDeque<_>, Vec<_>) =
            names.iter().map(|r| admission(r)).unzip();
        let first: Vec<String> = take_batch(&mut waiting)
            .into_iter()
            .map(|a| a.resource)
            .collect();
        assert_eq!(first, ["a", "b", "c"]);
        let second: Vec<String> = take_batch(&mut waiting)
            .into_iter()
            .map(|a| a.resource)
            .collect();
        assert_eq!(second, ["a", "b"]);
        let third: Vec<String> = take_batch(&mut waiting)
            .into_iter()
            .map(|a| a.resource)
            .collect();
        assert_eq!(third, ["a"]);
        assert!(waiting.is_empty());
    }

    #[test]
    fn a_batch_is_at_most_max_batch_long() {
        let (mut waiting, _replies): (VecDeque<_>, Vec<_>) = (0..MAX_BATCH + 5)
            .map(|i| admission(&format!("r{i}")))
            .unzip();
        assert_eq!(take_batch(&mut waiting).len(), MAX_BATCH);
        assert_eq!(waiting.len(), 5);
        assert_eq!(waiting.front().unwrap().resource, format!("r{MAX_BATCH}"));
    }

    #[test]
    fn an_admission_whose_request_is_gone_is_not_sent() {
        let (gone, reply) = admission("a");
        drop(reply);
        let (kept, _reply) = admission("b");
        let mut waiting = VecDeque::from([gone, kept]);
        let batch: Vec<String> = take_batch(&mut waiting)
            .into_iter()
            .map(|a| a.resource)
            .collect();
        assert_eq!(batch, ["b"]);
        assert!(waiting.is_empty());
    }
}
