//! A write's place in the landing record (`fence::landing`), so that a
//! restarted process knows what may still land (taken in phase 7, after
//! the object's hold), and the looks at the objects of writes in doubt
//! that settle them (`fence::doubt`). What a request does for the writes
//! in doubt on its resource is judged at its admission (`admit_here.rs`,
//! `touch`), and the MD5 check of a body that must not give its object
//! back an ETag a write in doubt expects is in its body pipeline
//! (`outgoing.rs`, `md5_guarded`).

use super::Proxy;
use crate::fence::doubt::ToProbe;
use crate::fence::hold::{ObjectHold, object_name};
use crate::fence::landing::{Record, Sent, Write};
use crate::s3::conditions::{Conditions, bare_etag};
use crate::s3::op::{Op, Operation};
use http::HeaderMap;
use http::header::{IF_MATCH, IF_NONE_MATCH};
use std::sync::Arc;

/// The condition `headers` send the backend.
pub(super) fn sent(headers: &HeaderMap) -> Sent {
    if let Some(v) = headers.get(IF_MATCH).and_then(|v| v.to_str().ok()) {
        return Sent::IfMatch(bare_etag(v).into());
    }
    match headers.get(IF_NONE_MATCH) {
        Some(v) if v.as_bytes() == b"*" => Sent::IfNoneMatch,
        _ => Sent::Plain,
    }
}

/// How often the object of an orderable write in doubt is looked at: soon
/// after the first look (a store that applies what it has promptly is
/// settled within tens of milliseconds), then every half second.
const PROBE_FIRST: std::time::Duration = std::time::Duration::from_millis(25);
const PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

impl Proxy {
    /// Looks at the object of each orderable write in doubt (a HEAD at
    /// once, then after [`PROBE_FIRST`], doubling up to [`PROBE_EVERY`])
    /// until it is no longer what the
    /// write's condition wants, which settles the doubt
    /// (`fence::doubt`), or until the doubt's quarantine is over. For as
    /// long as the proxy lives.
    pub fn settle_doubts(self: &Arc<Self>) {
        let Some(mut probes) = self.gate.doubts().take_probes() else {
            return;
        };
        let proxy = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(probe) = probes.recv().await {
                let Some(proxy) = proxy.upgrade() else { return };
                tokio::spawn(async move { proxy.probe_doubt(probe).await });
            }
        });
    }

    async fn probe_doubt(&self, p: ToProbe) {
        let Some((bucket, key)) = p.object.split_once('/') else {
            return;
        };
        let mut pause = PROBE_FIRST;
        while tokio::time::Instant::now() < p.until {
            match self.current(bucket, key, &HeaderMap::new()).await {
                Ok(current) => {
                    let wanted = match (&p.sent, current) {
                        (Sent::IfMatch(e), Some((c, _))) => *c.etag == **e,
                        (Sent::IfMatch(_), None) => false,
                        (Sent::IfNoneMatch, found) => found.is_none(),
                        (Sent::Plain, _) => return,
                    };
                    if !wanted {
                        self.gate.doubts().settle(&p.object, &p.sent);
                        return;
                    }
                }
                Err(e) => tracing::debug!(object = &*p.object, "looking at a write in doubt: {e}"),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(PROBE_EVERY);
        }
    }

    /// Whether the backend applies `op`'s conditions as it applies the
    /// write (so that a write sent with one is ordered by the backend).
    fn backend_orders(&self, op: Op, sent: &Sent) -> bool {
        op == Op::PutObject && *sent != Sent::Plain && self.gate.doubts().judges().writes()
    }

    /// The write's slot in the landing record, for a write to a remote
    /// backend that is fenced or replaces or deletes an object; taken
    /// before its body goes, marked whole just before its last bytes do.
    pub(super) fn record_write(
        &self,
        op: &Operation,
        fenced: &super::Fenced,
        hold: &ObjectHold,
        conditions: Option<&Conditions>,
        headers: &HeaderMap,
    ) -> Option<Arc<Record>> {
        let landing = self.gate.doubts().landing()?;
        if (fenced.permit.is_none() && hold.is_empty()) || op.op == Op::DeleteObjects {
            return None;
        }
        let name = match (&op.bucket, &op.key) {
            (Some(b), Some(k)) if op.op.changes_object() => Some(object_name(b, k)),
            _ => None,
        };
        let object = name.as_deref().map_or(0, |n| landing.hash(n));
        let (token, resource) = match (&fenced.permit, &fenced.resource) {
            (Some(p), Some(r)) => (Some(p.token()), landing.hash(r)),
            _ => (None, 0),
        };
        let sent = sent(headers);
        let write = Write {
            token,
            resource,
            object,
            name: name.map(Box::from),
            orderable: self.backend_orders(op.op, &sent),
            sent,
            alone: conditions.is_some(),
        };
        landing.record(&write).map(Arc::new)
    }

    /// The condition fencegate settled for the write goes in its slot.
    pub(super) fn record_sent(&self, record: &Record, op: Op, headers: &HeaderMap) {
        let sent = sent(headers);
        record.sent(&sent, self.backend_orders(op, &sent));
    }

    /// DeleteObjects: a slot per key, whole at once (its body was read
    /// whole, and goes as soon as the request does).
    pub(super) fn record_keys<'a>(
        &self,
        bucket: &str,
        keys: impl Iterator<Item = (&'a str, Option<&'a str>)>,
        token: Option<u64>,
    ) -> Vec<Arc<Record>> {
        let Some(landing) = self.gate.doubts().landing() else {
            return Vec::new();
        };
        keys.filter_map(|(key, resource)| {
            let name = object_name(bucket, key);
            let write = Write {
                token: resource.and(token),
                resource: resource.map_or(0, |r| landing.hash(r)),
                object: landing.hash(&name),
                name: Some(name.into()),
                sent: Sent::Plain,
                orderable: false,
                alone: false,
            };
            let record = landing.record(&write)?;
            record.whole();
            Some(Arc::new(record))
        })
        .collect()
    }
}
