//! Group commit: admissions on distinct resources that arrive while one
//! etcd transaction is on its way go together in the next one, each as a
//! nested transaction of its own. Under load this makes one raft commit
//! serve many writes; alone, a request still goes at once, in one round
//! trip.
//!
//! Nested transactions of one batch must not put the same key (etcd refuses
//! such a transaction whole), so a batch holds at most one admission per
//! resource; another for the same resource waits for the next batch. The
//! nested transactions are applied in order, atomically, so each is exactly
//! what it would have been alone.

use super::keys::{self, Outcome};
use super::{ClusterError, call};
use etcd_client::{Client, Txn, TxnOp, TxnOpResponse};
use std::collections::{HashSet, VecDeque};
use tokio::sync::{mpsc, oneshot};

/// Admissions in one transaction, at most (etcd's default `--max-txn-ops`
/// is 128 operations per level).
const MAX_BATCH: usize = 64;

pub(super) struct Admission {
    pub resource: String,
    pub txn: Txn,
    pub reply: oneshot::Sender<Result<Outcome, ClusterError>>,
}

/// Sends the admissions it receives, batched, until every sender is gone.
pub(super) async fn run(client: Client, mut rx: mpsc::UnboundedReceiver<Admission>) {
    let mut waiting: VecDeque<Admission> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            match rx.recv().await {
                Some(a) => waiting.push_back(a),
                None => return,
            }
        }
        while let Ok(a) = rx.try_recv() {
            waiting.push_back(a);
        }
        let batch = take_batch(&mut waiting);
        send(&client, batch).await;
    }
}

/// The first admissions of `waiting` on distinct resources, up to
/// [`MAX_BATCH`]; the rest stay, in order.
fn take_batch(waiting: &mut VecDeque<Admission>) -> Vec<Admission> {
    let mut batch = Vec::new();
    let mut resources = HashSet::new();
    let mut later = VecDeque::new();
    while let Some(a) = waiting.pop_front() {
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
    let mut kv = client.kv_client();
    if batch.len() == 1 {
        let a = batch.into_iter().next().expect("one");
        let result = call("admit", kv.txn(a.txn)).await.and_then(|r| {
            let rev = r.header().map(|h| h.revision()).unwrap_or(0);
            keys::outcome(&r, rev).map_err(ClusterError::Etcd)
        });
        let _ = a.reply.send(result);
        return;
    }
    let ops: Vec<TxnOp> = batch.iter().map(|a| TxnOp::txn(a.txn.clone())).collect();
    match call("admit", kv.txn(Txn::new().and_then(ops))).await {
        Ok(resp) => {
            let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            let answers = resp.op_responses();
            for (a, answer) in batch
                .into_iter()
                .zip(answers.into_iter().map(Some).chain(std::iter::repeat(None)))
            {
                let result = match answer {
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
            for a in batch {
                let _ = a.reply.send(Err(ClusterError::Etcd(e.to_string())));
            }
        }
    }
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
        let mut waiting: VecDeque<Admission> = names.iter().map(|r| admission(r).0).collect();
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
        let mut waiting: VecDeque<Admission> = (0..MAX_BATCH + 5)
            .map(|i| admission(&format!("r{i}")).0)
            .collect();
        assert_eq!(take_batch(&mut waiting).len(), MAX_BATCH);
        assert_eq!(waiting.len(), 5);
        assert_eq!(waiting.front().unwrap().resource, format!("r{MAX_BATCH}"));
    }
}
