//! The cluster's [`FenceTable`]: fences and open uploads in etcd, read
//! linearizably, for the admin API, the multipart token lookups and
//! `fencegate fences import`. An upload's token never changes once put, so
//! each replica keeps the ones it read or put (a bounded cache): the parts
//! of an upload cost etcd one read per replica, not one each.

use super::keys::{self, Outcome, pad, parse_fence, prefix_end};
use super::{Cluster, call};
use crate::fence::table::{FenceRecord, FenceTable, MAX_OPEN_UPLOADS, TableError};
use etcd_client::GetOptions;
use futures_util::future::BoxFuture;

/// Raises by tools and the admin API retry for the usual few seconds.
fn far_deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + std::time::Duration::from_secs(60)
}

fn store_err(e: impl std::fmt::Display) -> TableError {
    TableError(e.to_string())
}

/// Upload tokens a replica keeps; past this many it forgets them all.
const CACHED_UPLOADS: usize = 10_000;

impl Cluster {
    fn remember_upload(&self, upload: &str, token: u64) {
        if self.upload_tokens.len() >= CACHED_UPLOADS {
            self.upload_tokens.clear();
        }
        self.upload_tokens.insert(upload.to_string(), token);
    }

    /// A linearizable read, tried up to three times: a member that just
    /// went away fails the requests already routed to it.
    pub(super) async fn get_value(&self, key: String) -> Result<Option<Vec<u8>>, TableError> {
        let mut last = None;
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            }
            let mut kv = self.client.kv_client();
            match call("get", kv.get(key.clone(), None)).await {
                Ok(resp) => return Ok(resp.kvs().first().map(|kv| kv.value().to_vec())),
                Err(e) => last = Some(e),
            }
        }
        Err(store_err(last.expect("three attempts")))
    }
}

impl FenceTable for Cluster {
    fn get(&self, resource: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>> {
        let key = self.keys.fence(resource);
        Box::pin(async move {
            let v = self.get_value(key).await?;
            Ok(v.and_then(|v| parse_fence(&v)).map(|(t, _)| t))
        })
    }

    fn raise(&self, resource: &str, token: u64) -> BoxFuture<'_, Result<u64, TableError>> {
        let resource = resource.to_string();
        Box::pin(async move {
            match self
                .admit(&resource, token, None, None, far_deadline())
                .await
                .map_err(store_err)?
            {
                Outcome::Stale(h) => Ok(h),
                Outcome::Admitted { .. } => Ok(token),
            }
        })
    }

    fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<FenceRecord>, TableError>> {
        let first = self.keys.fence(prefix);
        let start = match after {
            // The first key after `after`.
            Some(a) if a >= prefix => format!("{}\0", self.keys.fence(a)),
            _ => first.clone(),
        };
        let end = prefix_end(&first);
        Box::pin(async move {
            let opts = GetOptions::new().with_range(end).with_limit(limit as i64);
            let mut kv = self.client.kv_client();
            let resp = call("list", kv.get(start, Some(opts)))
                .await
                .map_err(store_err)?;
            // A key that does not parse is an error, not a gap: a short page
            // would read as the end of the list.
            resp.kvs()
                .iter()
                .map(|kv| {
                    let bad = || {
                        TableError(format!(
                            "etcd key {:?} is not a fence fencegate wrote",
                            String::from_utf8_lossy(kv.key())
                        ))
                    };
                    let resource = self.keys.resource_of(kv.key()).ok_or_else(bad)?;
                    let (highest, raised_at_ms) = parse_fence(kv.value()).ok_or_else(bad)?;
                    Ok(FenceRecord {
                        resource: resource.to_string(),
                        highest,
                        raised_at_ms,
                    })
                })
                .collect()
        })
    }

    fn record_upload(&self, upload: &str, token: u64) -> BoxFuture<'_, Result<(), TableError>> {
        let key = self.keys.upload(upload);
        let all = self.keys.uploads();
        let upload = upload.to_string();
        Box::pin(async move {
            let mut kv = self.client.kv_client();
            let count = GetOptions::new()
                .with_range(prefix_end(&all))
                .with_count_only();
            let open = call("get", kv.get(all, Some(count)))
                .await
                .map_err(store_err)?
                .count();
            if open as u64 >= MAX_OPEN_UPLOADS {
                return Ok(());
            }
            call("put", kv.put(key, pad(token.into()), None))
                .await
                .map_err(store_err)?;
            self.remember_upload(&upload, token);
            Ok(())
        })
    }

    fn upload_token(&self, upload: &str) -> BoxFuture<'_, Result<Option<u64>, TableError>> {
        let key = self.keys.upload(upload);
        let upload = upload.to_string();
        Box::pin(async move {
            if let Some(t) = self.upload_tokens.get(&upload) {
                return Ok(Some(*t));
            }
            let v = self.get_value(key).await?;
            let token = v.and_then(|v| keys::parse_fence(&v)).map(|(t, _)| t);
            if let Some(t) = token {
                self.remember_upload(&upload, t);
            }
            Ok(token)
        })
    }

    fn forget_upload(&self, upload: &str) -> BoxFuture<'_, Result<(), TableError>> {
        self.upload_tokens.remove(upload);
        let key = self.keys.upload(upload);
        Box::pin(async move {
            let mut kv = self.client.kv_client();
            call("delete", kv.delete(key, None))
                .await
                .map_err(store_err)?;
            Ok(())
        })
    }
}
