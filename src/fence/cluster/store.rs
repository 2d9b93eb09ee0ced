//! The cluster's [`FenceStore`]: fences and open uploads in etcd, read
//! linearizably, for the admin API, the multipart token lookups and
//! `fencegate fences import`.

use super::keys::{self, Outcome, pad, parse_fence, prefix_end};
use super::{Cluster, call};
use crate::fence::store::{FenceRecord, FenceStore, MAX_OPEN_UPLOADS, StoreError};
use etcd_client::GetOptions;
use futures_util::future::BoxFuture;
use std::time::{SystemTime, UNIX_EPOCH};

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Raises by tools and the admin API retry for the usual few seconds.
fn far_deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + std::time::Duration::from_secs(60)
}

fn store_err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl Cluster {
    async fn get_value(&self, key: String) -> Result<Option<Vec<u8>>, StoreError> {
        let mut kv = self.client.kv_client();
        let resp = call("get", kv.get(key, None)).await.map_err(store_err)?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }
}

impl FenceStore for Cluster {
    fn get(&self, resource: &str) -> BoxFuture<'_, Result<Option<u64>, StoreError>> {
        let key = self.keys.fence(resource);
        Box::pin(async move {
            let v = self.get_value(key).await?;
            Ok(v.and_then(|v| parse_fence(&v)).map(|(t, _)| t))
        })
    }

    fn raise(&self, resource: &str, token: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        let resource = resource.to_string();
        Box::pin(async move {
            match self
                .admit(&resource, token, None, far_deadline())
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
    ) -> BoxFuture<'_, Result<Vec<FenceRecord>, StoreError>> {
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
            Ok(resp
                .kvs()
                .iter()
                .filter_map(|kv| {
                    let resource = self.keys.resource_of(kv.key())?;
                    let (highest, raised_at_ms) = parse_fence(kv.value())?;
                    Some(FenceRecord {
                        resource: resource.to_string(),
                        highest,
                        raised_at_ms,
                    })
                })
                .collect())
        })
    }

    fn record_upload(&self, upload: &str, token: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        let key = self.keys.upload(upload);
        let all = self.keys.uploads();
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
            Ok(())
        })
    }

    fn upload_token(&self, upload: &str) -> BoxFuture<'_, Result<Option<u64>, StoreError>> {
        let key = self.keys.upload(upload);
        Box::pin(async move {
            let v = self.get_value(key).await?;
            Ok(v.and_then(|v| keys::parse_fence(&v)).map(|(t, _)| t))
        })
    }

    fn forget_upload(&self, upload: &str) -> BoxFuture<'_, Result<(), StoreError>> {
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
