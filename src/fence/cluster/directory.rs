//! Where the other replicas are: each puts the URL of its S3 listener at
//! `replicas/<replica>` under its lease, and a replica that does not own a
//! resource looks its owner up there to forward the request
//! (`proxy/to_owner.rs`). A watch of those keys tells when a replica's
//! lease has ended ([`Cluster::gone`]): a request forwarded to it then is
//! given up, since the replica can no longer admit it.

use super::{Cluster, ClusterError, call};
use etcd_client::{EventType, PutOptions};
use std::sync::Arc;
use std::time::Duration;

impl Cluster {
    /// Puts `url` at `replicas/<this replica>` under every lease this
    /// replica holds, for as long as the process runs.
    pub fn advertise(self: &Arc<Self>, url: String) {
        let _ = self.advertised.set(url.clone());
        let cluster = self.clone();
        tokio::spawn(async move {
            let mut put_under = 0;
            loop {
                if let Some((lease, generation)) = cluster.lease.current()
                    && generation != put_under
                {
                    let opts = PutOptions::new().with_lease(lease);
                    let key = cluster.keys.replica(&cluster.replica);
                    let mut kv = cluster.client.kv_client();
                    match call("advertise", kv.put(key, url.as_str(), Some(opts))).await {
                        Ok(_) => put_under = generation,
                        Err(e) => tracing::debug!("cluster: advertising {url}: {e}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// The URL of `replica`'s S3 listener, cached; `None` when its lease
    /// is gone.
    pub async fn address_of(&self, replica: &str) -> Result<Option<String>, ClusterError> {
        if let Some(url) = self.addresses.get(replica) {
            return Ok(Some(url.clone()));
        }
        let value = self.get_value(self.keys.replica(replica)).await;
        let Some(value) = value.map_err(|e| ClusterError::Etcd(e.to_string()))? else {
            return Ok(None);
        };
        let url = String::from_utf8_lossy(&value).into_owned();
        self.addresses.insert(replica.to_string(), url.clone());
        Ok(Some(url))
    }

    /// Forgets where `replica` is (it did not answer there).
    pub fn forget_address(&self, replica: &str) {
        self.addresses.remove(replica);
    }

    /// Whether `replica`'s lease has ended.
    pub fn is_departed(&self, replica: &str) -> bool {
        self.departed.contains_key(replica)
    }

    /// Resolves once `replica`'s lease has ended (seen by the watch of
    /// `replicas/`).
    pub async fn gone(&self, replica: &str) {
        let mut changed = self.departures.subscribe();
        while !self.departed.contains_key(replica) {
            if changed.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Follows `replicas/` for as long as the process runs: a deleted key
    /// is a replica whose lease ended (replica names are never reused).
    pub(super) async fn follow_replicas(self: Arc<Self>) {
        let all = self.keys.replica("");
        let listed = self.list_replicas(&all).await;
        self.watch_prefix(all.clone(), listed.map(|r| r + 1), |resp| {
            // After a gap, every address is looked up again.
            let Some(resp) = resp else {
                return self.addresses.clear();
            };
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                if ev.event_type() != EventType::Delete {
                    self.note_replica(&all, kv);
                    continue;
                }
                let name = String::from_utf8_lossy(&kv.key()[all.len()..]).into_owned();
                self.addresses.remove(&name);
                self.departed.insert(name, ());
                self.departures.send_modify(|n| *n += 1);
            }
        })
        .await
    }

    /// Reads every replica's address once, so that a replica cut off from
    /// etcd later knows its peers ([`Cluster::peers_from_any`]); the revision
    /// read at, from which the watch then follows them.
    async fn list_replicas(&self, all: &str) -> Option<i64> {
        let opts = etcd_client::GetOptions::new().with_prefix();
        for _ in 0..20 {
            let mut kv = self.client.kv_client();
            if let Ok(resp) = call("get", kv.get(all, Some(opts.clone()))).await {
                for kv in resp.kvs() {
                    self.note_replica(all, kv);
                }
                return resp.header().map(|h| h.revision());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        None
    }

    /// Remembers the replica whose `replicas/` key (under `all`) `kv` is.
    fn note_replica(&self, all: &str, kv: &etcd_client::KeyValue) {
        let name = String::from_utf8_lossy(&kv.key()[all.len()..]).into_owned();
        let url = String::from_utf8_lossy(kv.value()).into_owned();
        self.addresses.insert(name, url);
    }

    /// The URLs of the other replicas whose leases stood when last heard
    /// of, from one picked at random: where a replica cut off from etcd
    /// relays what it cannot admit itself (`proxy/route.rs`), trying them
    /// in this order, so that its load spreads over them.
    pub fn peers_from_any(&self) -> Vec<String> {
        let mine = self.advertised.get();
        let mut others: Vec<String> = self
            .addresses
            .iter()
            .filter(|e| *e.key() != self.replica && Some(e.value()) != mine)
            .filter(|e| !self.departed.contains_key(e.key()))
            .map(|e| e.value().clone())
            .collect();
        let first = rand::random::<u64>() as usize % others.len().max(1);
        others.rotate_left(first);
        others
    }
}
