//! Phase 7 of a request (`Proxy::process`): a write's hold on its object,
//! and its conditions judged by fencegate (CONTRACT §8); and the condition
//! `fence.conditional_writes` sends (`condition_on_current`, asked in
//! phase 8 by `per_op.rs`, its answer learnt in phase 10, `respond.rs`).
//!
//! Every write that replaces or deletes an object holds the object
//! (`fence::hold`) from here until its exchange is over. One with
//! conditions holds it alone, reads the object as it is (a HEAD), and is
//! refused `412`/`404` when its conditions do not hold, so the check and
//! the write are one step on every backend. Its conditions still go to
//! the backend too: a store that honours them is a second guard.
//!
//! `fence.conditional_writes`: a fenced per-object write (PutObject,
//! CopyObject, CompleteMultipartUpload) goes to the backend with a
//! condition on the object as it was once the write was admitted:
//! `If-Match: <its ETag>`, or `If-None-Match: *` when there was none. If
//! anything else lands on the key between the admission and the moment the
//! backend applies this write (the window a paused replica leaves, see
//! docs/cluster.md), the backend refuses it with `412`, and the newer write
//! stays. It costs a HEAD per such write when fencegate does not know the
//! object's ETag already (`etags.rs` keeps the ones its writes left), and needs a backend that
//! honours conditional writes (AWS S3, MinIO, moto; not Garage).
//!
//! A write that carries its own `If-Match` or `If-None-Match` is sent with
//! the client's condition only. Two writes of byte-identical bodies have
//! the same ETag, so a newer write of the very bytes the object held at the
//! admission does not fail the condition (a lost update nobody can see in
//! the content, but the stamp of the newer token is overwritten).

use super::etags::Known;
use super::{Fenced, Proxy, Signed};
use crate::fence::gate;
use crate::fence::hold::{Holder, Mode, ObjectHold, object_name};
use crate::s3::conditions::{Conditions, Current, bare_etag, parse_time};
use crate::s3::error::S3Error;
use crate::s3::headers::X_AMZ_SSE_CUSTOMER_ALGORITHM;
use crate::s3::op::{Op, Operation};
use crate::upstream::client::{Outgoing, UpstreamPayload};
use http::header::{CONTENT_LENGTH, ETAG, IF_MATCH, IF_NONE_MATCH, LAST_MODIFIED};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use std::sync::Arc;

/// Headers of the write that its HEAD needs too: a customer-key encrypted
/// object is only readable with its key, a requester-pays bucket only with
/// the request-payer header.
const HEAD_NEEDS: [HeaderName; 5] = [
    X_AMZ_SSE_CUSTOMER_ALGORITHM,
    HeaderName::from_static("x-amz-server-side-encryption-customer-key"),
    HeaderName::from_static("x-amz-server-side-encryption-customer-key-md5"),
    HeaderName::from_static("x-amz-request-payer"),
    HeaderName::from_static("x-amz-expected-bucket-owner"),
];

impl Proxy {
    /// Phase 7: the hold on the object of a write that replaces or deletes
    /// it (none for other requests): the one its admission put (cluster
    /// mode), else one shared at once, else [`Proxy::hold_object`].
    pub(super) async fn hold(
        &self,
        headers: &HeaderMap,
        signed: &Signed<'_>,
        fenced: &Fenced,
    ) -> Result<Arc<ObjectHold>, S3Error> {
        let holder = self.holder(fenced.resource.is_some());
        let conditions = signed.conditions.as_ref();
        if let Some(hold) = &fenced.hold {
            return Ok(hold.clone());
        }
        match self.hold_at_once(&signed.op, conditions, holder) {
            Some(hold) => Ok(hold),
            None => Box::pin(self.hold_object(headers, &signed.op, conditions, holder)).await,
        }
    }

    /// Whose a write's hold on its object is: with owners, every write to
    /// an object of a fenced resource reaches the resource's owner, which
    /// is this replica (it got this far), so the hold is the owner's.
    pub(super) fn holder(&self, fenced: bool) -> Holder {
        match matches!(self.gate.mode(), gate::Mode::Owners(_)) && fenced {
            true => Holder::ThisOwner,
            false => Holder::AnyReplica,
        }
    }

    /// A write that replaces or deletes its object holds it
    /// (alone when it has conditions, shared otherwise), and its
    /// conditions are judged under the hold, on the object as the backend
    /// has it now. The hold is kept until the write's exchange is over.
    /// `holder`: whose the hold is (`Proxy::holder`).
    pub(super) async fn hold_object(
        &self,
        headers: &HeaderMap,
        op: &Operation,
        conditions: Option<&Conditions>,
        holder: Holder,
    ) -> Result<Arc<ObjectHold>, S3Error> {
        let (Some(bucket), Some(key)) = (&op.bucket, &op.key) else {
            return Ok(Arc::new(ObjectHold::none()));
        };
        let object = object_name(bucket, key);
        let mode = if conditions.is_some() {
            Mode::Alone
        } else {
            Mode::Shared
        };
        let judged = self.backend_judges(op.op, conditions);
        let hold = self
            .gate
            .holds()
            .hold_judged(vec![(object.clone(), mode)], holder, judged)
            .await
            .map_err(S3Error::from_hold)?;
        if let Some(c) = conditions {
            let current = self.current(bucket, key, headers).await?;
            c.judge(current.as_ref().map(|(c, _)| c))
                .map_err(|f| f.error(&object))?;
        }
        Ok(Arc::new(hold))
    }

    /// Whether the backend is sent the conditions a write holds its
    /// object alone for, and judges them when it applies it.
    fn backend_judges(&self, op: Op, conditions: Option<&Conditions>) -> bool {
        let judges = self.gate.doubts().judges();
        match (op, conditions) {
            (Op::PutObject, Some(c)) => c.only_etag_conditions() && judges.writes(),
            (Op::DeleteObject, Some(c)) => c.only_etag_conditions() && judges.deletes(),
            _ => false,
        }
    }

    /// The common case of phase 7, without an await: a request that
    /// changes no object holds none, and an unconditional write shares its
    /// object at once when nothing conditional is near it. `None`: the
    /// request takes [`Proxy::hold_object`].
    pub(super) fn hold_at_once(
        &self,
        op: &Operation,
        conditions: Option<&Conditions>,
        holder: Holder,
    ) -> Option<Arc<ObjectHold>> {
        let (Some(bucket), Some(key)) = (&op.bucket, &op.key) else {
            return Some(Arc::new(ObjectHold::none()));
        };
        if !op.op.changes_object() {
            return Some(Arc::new(ObjectHold::none()));
        }
        if conditions.is_some() {
            return None;
        }
        self.gate
            .holds()
            .try_share(bucket, key, holder)
            .map(Arc::new)
    }

    /// The object as the backend has it now, by a HEAD with fencegate's
    /// credential (and the write's headers a HEAD needs), with its ETag as
    /// the backend wrote it; `None` when there is none.
    pub(super) async fn current(
        &self,
        bucket: &str,
        key: &str,
        headers: &HeaderMap,
    ) -> Result<Option<(Current, HeaderValue)>, S3Error> {
        let mut head_headers = HeaderMap::new();
        for name in HEAD_NEEDS {
            if let Some(v) = headers.get(&name) {
                head_headers.insert(name, v.clone());
            }
        }
        let head = Outgoing {
            method: Method::HEAD,
            bucket: Some(bucket.to_string()),
            key: Some(key.to_string()),
            query: Vec::new(),
            headers: head_headers,
            body: None,
            content_length: None,
            payload: UpstreamPayload::Empty,
            anonymous: false,
        };
        let resp = self.upstream.send(head).await?;
        match resp.status() {
            StatusCode::OK => {
                let h = resp.headers();
                let etag = h.get(ETAG).cloned().ok_or_else(|| {
                    S3Error::BadGateway("the backend's HEAD of the object has no ETag".into())
                })?;
                let text = |name| h.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
                let current = Current {
                    etag: bare_etag(etag.to_str().unwrap_or_default()).to_string(),
                    last_modified: text(LAST_MODIFIED).and_then(parse_time),
                    size: text(CONTENT_LENGTH).and_then(|v| v.parse().ok()),
                };
                Ok(Some((current, etag)))
            }
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::FORBIDDEN => Err(S3Error::BadGateway(
                "the backend refused the HEAD before a conditional write (403): \
                 fencegate's backend credential needs s3:GetObject, and s3:ListBucket \
                 (without it a missing key answers 403)"
                    .into(),
            )),
            s => Err(S3Error::BadGateway(format!(
                "the backend answered {s} to the HEAD before a conditional write"
            ))),
        }
    }

    /// `fence.conditional_writes`: adds the condition on the object's
    /// current state to `out`: the state its last write through fencegate
    /// left under `epoch` (`etags.rs`), else a HEAD's. Returns the object
    /// when it did (a write with conditions of its own goes with those).
    pub(super) async fn condition_on_current(
        &self,
        out: &mut Outgoing,
        headers: &HeaderMap,
        op: &Operation,
        epoch: i64,
    ) -> Result<Option<String>, S3Error> {
        if headers.contains_key(IF_MATCH) || headers.contains_key(IF_NONE_MATCH) {
            return Ok(None);
        }
        let (Some(bucket), Some(key)) = (&op.bucket, &op.key) else {
            return Ok(None);
        };
        let object = object_name(bucket, key);
        let known = match self.etags.get(&object, epoch) {
            Some(known) => known,
            None => match self.current(bucket, key, headers).await? {
                Some((_, etag)) => Known::Etag(etag),
                None => Known::Absent,
            },
        };
        match known {
            Known::Etag(etag) => out.headers.insert(IF_MATCH, etag),
            Known::Absent => out
                .headers
                .insert(IF_NONE_MATCH, HeaderValue::from_static("*")),
        };
        Ok(Some(object))
    }
}
