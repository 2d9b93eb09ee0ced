//! The last phase of a request (`Proxy::process`): the backend's answer
//! on its way to the client, with the little fencegate changes or learns
//! from it (a limited credential's bucket list, an upload's token, the
//! ETag a write with fencegate's own condition left its object).

use super::etags::Known;
use super::small_body::read_small_body;
use super::{Proxy, upload_key};
use crate::body::{ProxyBody, full};
use crate::fence::hold::object_name;
use crate::s3::auth::Verified;
use crate::s3::error::S3Error;
use crate::s3::op::{Op, Operation};
use crate::s3::xml;
use crate::upstream::client::clean_response_headers;
use bytes::Bytes;
use http::header::ETAG;
use http::{Response, StatusCode};

impl Proxy {
    /// Phase 10: the backend's answer (phase 9's) to the client. `token`
    /// is phase 5's; `own_condition`, the object and epoch of fencegate's
    /// own condition (`fence.conditional_writes`), when the write went
    /// with one.
    pub(super) async fn respond(
        &self,
        answer: Result<Response<ProxyBody>, S3Error>,
        op: &Operation,
        verified: &Verified,
        token: Option<u64>,
        own_condition: Option<(String, i64)>,
    ) -> Result<Response<ProxyBody>, S3Error> {
        let resp = match &own_condition {
            Some(own) => self.after_own_condition(answer, op.op, own)?,
            None => {
                self.after_other_write(op);
                answer?
            }
        };
        let (mut parts, body) = resp.into_parts();
        clean_response_headers(&mut parts.headers);
        let ok = parts.status.is_success();
        let cred = &verified.credential;
        if op.op == Op::ListBuckets && ok && !cred.allows_bucket("*") {
            // Show a limited credential only the buckets it may use.
            let bytes = read_small_body(body, 8 << 20).await?;
            let kept = xml::keep_buckets(&bytes, |b| cred.allows_bucket(b)).ok_or_else(|| {
                S3Error::BadGateway("the backend's bucket list does not parse".into())
            })?;
            parts.headers.remove(http::header::CONTENT_LENGTH);
            return Ok(Response::from_parts(parts, full(Bytes::from(kept))));
        }
        let (Some(b), Some(k)) = (&op.bucket, &op.key) else {
            return Ok(Response::from_parts(parts, body));
        };
        let store = self.gate.table();
        let upload = op.upload_id.as_deref().map(|u| upload_key(b, k, u));
        match (op.op, token) {
            (Op::CreateMultipartUpload, Some(t)) if ok => {
                // A small XML document: read it to learn the upload id.
                let bytes = read_small_body(body, 1 << 20).await?;
                if let Some(id) = xml::upload_id(&bytes) {
                    let upload = upload_key(b, k, &id);
                    store
                        .record_upload(&upload, t)
                        .await
                        .map_err(|e| S3Error::ServiceUnavailable(e.to_string()))?;
                }
                return Ok(Response::from_parts(parts, full(bytes)));
            }
            (Op::CompleteMultipartUpload | Op::AbortMultipartUpload, _) if ok => {
                if let Some(upload) = upload
                    && let Err(e) = store.forget_upload(&upload).await
                {
                    tracing::warn!("forgetting upload {upload:?}: {e}");
                }
            }
            _ => {}
        }
        Ok(Response::from_parts(parts, body))
    }

    /// The answer to a write sent with fencegate's own condition on
    /// `object`: its ETag kept for the next write, or forgotten. A `412`
    /// means the object was not what fencegate sent the condition on (a
    /// write landed in between: one whose outcome was unknown, one that a
    /// replica paused past its lease let go, or one around fencegate):
    /// nothing was written, which the client is told as `503 SlowDown`,
    /// never as a `PreconditionFailed` it did not ask for; tried again,
    /// the write looks at the object afresh.
    fn after_own_condition(
        &self,
        answer: Result<Response<ProxyBody>, S3Error>,
        op: Op,
        (object, epoch): &(String, i64),
    ) -> Result<Response<ProxyBody>, S3Error> {
        let resp = match answer {
            Ok(resp) => resp,
            Err(e) => {
                self.etags.forget(object);
                return Err(e);
            }
        };
        let etag = resp.headers().get(ETAG);
        match (resp.status(), etag) {
            (StatusCode::PRECONDITION_FAILED, _) => {
                self.etags.forget(object);
                Err(S3Error::SlowDown(format!(
                    "{object} changed after fencegate looked at it, so the store refused \
                     the write fencegate sent with a condition on what it saw; nothing was \
                     written"
                )))
            }
            (s, Some(etag)) if s.is_success() && op == Op::PutObject => {
                self.etags.put(object, *epoch, Known::Etag(etag.clone()));
                Ok(resp)
            }
            _ => {
                self.etags.forget(object);
                Ok(resp)
            }
        }
    }

    /// Any other write to an object leaves it in a state fencegate did not
    /// read from the answer: the next conditioned write looks again.
    fn after_other_write(&self, op: &Operation) {
        if !op.op.changes_object() || !self.conditions_on_backend(Op::PutObject) {
            return;
        }
        if let (Some(b), Some(k)) = (&op.bucket, &op.key) {
            self.etags.forget(&object_name(b, k));
        }
    }
}
