//! A replica restarted on the same data directory ends what its earlier
//! incarnation left in etcd, instead of leaving it until that lease runs
//! out (docs/cluster.md, "A replica restarted").
//!
//! Each start takes a fresh random replica name. The data directory keeps
//! the name of the process that last used it, in `cluster-replica`, which
//! the process holds under an exclusive `flock` for as long as it runs: a
//! second process on the same directory is refused at start, and a start
//! that gets the lock knows the process named in the file has ended.
//!
//! At start, in the background until etcd answers:
//!
//! - each resource the old name owns **without** an in-flight marker is let
//!   go (the owner key deleted, guarded by its epoch and by the marker's
//!   absence, in one transaction): nothing of the old process can land
//!   there, so the resource is served again at once, here or elsewhere;
//! - so is one **with** the marker when the landing record
//!   (`fence::landing`) shows that the old process had no write there that
//!   may still land unordered by the backend (the marker is deleted with
//!   the owner key, guarded by its epoch): a marker stays a second or two
//!   after the last write, and a write that went with a condition the
//!   backend judges needs none;
//! - a resource with a write that may still land (or every one, when the
//!   record cannot say) keeps its owner key until that lease expires, and
//!   its next owner waits out the quarantine as after any death, unless
//!   it asks this process about the old name (`Gate::nothing_landing`),
//!   which answers from the record once the write's doubt is over;
//! - its `replicas/` and `seen/` keys are deleted, so other replicas give
//!   up forwards to it at once (the watch of `replicas/`).
//!
//! The lock is what makes this safe: it proves the process named in the
//! file has ended. A live old process whose owner key went could not put
//! its marker back (guarded by its epoch), but while its lease stays fresh
//! it would still admit a write that needs none (`Kind::Conditioned`) at
//! its old highest token, and a raise made elsewhere would count as
//! acknowledged by it. So a data directory copied to a second live
//! replica, or one on a filesystem whose `flock` holds on one host only,
//! is outside what this promises (docs/cluster.md).

use super::keys::prefix_end;
use super::{Cluster, call};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

/// The file in the data directory that names its last process.
pub const FILE: &str = "cluster-replica";

/// Owner keys let go per transaction.
const BATCH: usize = 64;

/// This process's claim on its data directory: the lock lives as long as
/// the file stays open.
pub struct Claim {
    _file: std::fs::File,
    /// The replica name of the process that used the directory before.
    pub previous: Option<String>,
}

/// Locks `<dir>/cluster-replica`, reads the name of the process before,
/// and writes `name` there (durably) as this process's.
pub fn claim(dir: &Path, name: &str) -> Result<Claim, String> {
    let path = dir.join(FILE);
    let fail = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    std::fs::create_dir_all(dir).map_err(|e| fail("cannot create the directory of", e))?;
    let mut file = crate::fence::landing::open_locked(dir, &path)?;
    let mut old = String::new();
    file.read_to_string(&mut old)
        .map_err(|e| fail("cannot read", e))?;
    let previous = Some(old.trim().to_string()).filter(|n| is_name(n));
    file.set_len(0).map_err(|e| fail("cannot write", e))?;
    file.rewind().map_err(|e| fail("cannot write", e))?;
    file.write_all(format!("{name}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| fail("cannot write", e))?;
    Ok(Claim {
        _file: file,
        previous,
    })
}

/// A replica name as this module writes it (16 hex digits).
fn is_name(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Cluster {
    /// Ends what the process named `old` left in etcd (the module doc),
    /// trying again until etcd answers; says how many resources it let go
    /// and how many it left to their quarantine.
    pub(super) async fn end_incarnation(&self, old: &str) -> (usize, usize) {
        let mut wait = Duration::from_millis(100);
        loop {
            match self.end_once(old).await {
                Ok(counts) => return counts,
                Err(e) => tracing::debug!("cluster: ending replica {old}'s keys: {e}"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(2));
        }
    }

    async fn end_once(&self, old: &str) -> Result<(usize, usize), super::ClusterError> {
        let owners = format!("{}owners/", self.keys.prefix());
        let mut kv = self.client.kv_client();
        let opts = GetOptions::new().with_range(prefix_end(&owners));
        let resp = call("get", kv.get(owners.as_str(), Some(opts))).await?;
        let mine: Vec<(String, i64)> = resp
            .kvs()
            .iter()
            .filter(|kv| kv.value() == old.as_bytes())
            .filter_map(|kv| {
                let rest = std::str::from_utf8(&kv.key()[owners.len()..]).ok()?;
                let (_, resource) = rest.split_once(':')?;
                Some((resource.to_string(), kv.create_revision()))
            })
            .collect();
        let mut let_go = 0;
        // Without a record of what was in flight, every marker is kept.
        let may_land = |r: &str| self.doubts.as_ref().is_none_or(|d| d.unordered_on(r));
        for batch in mine.chunks(BATCH) {
            let guarded = batch.iter().map(|(resource, epoch)| {
                let owner = self.keys.owner(resource);
                let marker = self.keys.owned(resource);
                let mine = Compare::create_revision(owner.as_str(), CompareOp::Equal, *epoch);
                let txn = match may_land(resource) {
                    true => Txn::new()
                        .when([mine, Compare::create_revision(marker, CompareOp::Equal, 0)])
                        .and_then([TxnOp::delete(owner, None)]),
                    false => Txn::new()
                        .when([mine])
                        .and_then([TxnOp::delete(owner, None), TxnOp::delete(marker, None)]),
                };
                TxnOp::txn(txn)
            });
            let txn = Txn::new().and_then(guarded.collect::<Vec<_>>());
            let resp = call("end_incarnation", kv.txn(txn)).await?;
            let_go += resp
                .op_responses()
                .iter()
                .filter(|r| matches!(r, etcd_client::TxnOpResponse::Txn(t) if t.succeeded()))
                .count();
        }
        let gone = Txn::new().and_then([
            TxnOp::delete(self.keys.replica(old), None),
            TxnOp::delete(self.keys.seen(old), None),
        ]);
        call("end_incarnation", kv.txn(gone)).await?;
        Ok((let_go, mine.len() - let_go))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_names_its_last_process_and_admits_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let first = claim(dir.path(), "0123456789abcdef").unwrap();
        assert_eq!(first.previous, None);
        let err = claim(dir.path(), "fedcba9876543210").err().unwrap();
        assert!(err.contains("another fencegate process"), "{err}");
        drop(first);
        let second = claim(dir.path(), "fedcba9876543210").unwrap();
        assert_eq!(second.previous.as_deref(), Some("0123456789abcdef"));
        drop(second);
        std::fs::write(dir.path().join(FILE), "not a name\n").unwrap();
        assert_eq!(
            claim(dir.path(), "0123456789abcdef").unwrap().previous,
            None
        );
    }
}
