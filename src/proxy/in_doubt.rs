//! A write's place in the landing record (`fence::landing`), so that a
//! restarted process knows what may still land, and what a request does
//! for the writes in doubt on its resource (`fence::doubt`): the touch
//! its admission is judged by, and the MD5 check of a body that must not
//! give its object back an ETag a write in doubt expects.

use super::Proxy;
use crate::fence::doubt::{ToProbe, Touch};
use crate::fence::gate::Permit;
use crate::fence::hold::{ObjectHold, object_name};
use crate::fence::landing::{Record, Sent, Write};
use crate::s3::chunked::FrameStream;
use crate::s3::conditions::{Conditions, bare_etag};
use crate::s3::error::S3Error;
use crate::s3::op::{Op, Operation};
use futures_util::StreamExt;
use http::HeaderMap;
use http::header::{IF_MATCH, IF_NONE_MATCH};
use md5::{Digest, Md5};
use std::sync::Arc;

/// Whether a PutObject with these headers leaves its body's MD5 as its
/// ETag: it names no customer key and no KMS key.
pub(super) fn etag_is_md5(headers: &HeaderMap) -> bool {
    let kms = headers
        .get("x-amz-server-side-encryption")
        .is_some_and(|v| v.as_bytes().starts_with(b"aws:kms"));
    !kms && !headers.contains_key("x-amz-server-side-encryption-customer-algorithm")
}

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

/// What a fenced request on `object` does, for the writes in doubt on its
/// resource.
pub(super) fn touch(op: Op, object: &str, read: bool, etag_is_md5: bool) -> Touch<'_> {
    match op {
        _ if read => Touch::Read,
        Op::PutObject => Touch::Put {
            object,
            md5_etag: etag_is_md5,
        },
        Op::DeleteObject => Touch::Delete { object },
        Op::CopyObject | Op::CompleteMultipartUpload => Touch::Replace { object },
        Op::CreateMultipartUpload
        | Op::UploadPart
        | Op::UploadPartCopy
        | Op::AbortMultipartUpload => Touch::Keeps,
        _ => Touch::Other,
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

    /// Whether the backend is sent the conditions a write holds its
    /// object alone for, and judges them when it applies it.
    pub(super) fn backend_judges(&self, op: Op, conditions: Option<&Conditions>) -> bool {
        let judges = self.gate.doubts().judges();
        match (op, conditions) {
            (Op::PutObject, Some(c)) => c.only_etag_conditions() && judges.writes(),
            (Op::DeleteObject, Some(c)) => c.only_etag_conditions() && judges.deletes(),
            _ => false,
        }
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

/// `frames` whose MD5 must be none of `guards` (the ETags writes in doubt
/// on its object expect, `Permit::guards`): the stream ends with an error
/// instead of its end if it is one, so that the body gate never lets its
/// last bytes go.
pub(super) fn md5_guarded(frames: FrameStream, permit: Option<&Permit>) -> FrameStream {
    let Some(guards) = permit.map(Permit::guards).filter(|g| !g.is_empty()) else {
        return frames;
    };
    let guards: Vec<Box<str>> = guards.to_vec();
    let mut md5 = Some(Md5::new());
    let mut frames = frames;
    Box::pin(futures_util::stream::poll_fn(move |cx| {
        let next = std::task::ready!(frames.poll_next_unpin(cx));
        let Some(hasher) = md5.as_mut() else {
            return std::task::Poll::Ready(next);
        };
        match next {
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    hasher.update(d);
                }
                std::task::Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => std::task::Poll::Ready(Some(Err(e))),
            None => {
                let digest = hex::encode(md5.take().expect("taken once").finalize());
                let Some(etag) = guards.iter().find(|g| g.eq_ignore_ascii_case(&digest)) else {
                    return std::task::Poll::Ready(None);
                };
                std::task::Poll::Ready(Some(Err(S3Error::SlowDown(format!(
                    "this write would give its object back the ETag {etag}, which an earlier \
                     write whose outcome is unknown (its answer was lost, or fencegate \
                     restarted while it was in flight) expects: that write could then land \
                     after this one. Nothing was done; it goes once that write's quarantine \
                     is over"
                )))))
            }
        }
    }))
}
