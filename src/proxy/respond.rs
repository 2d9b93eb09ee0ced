//! The last phase of a request (`Proxy::process`): the backend's answer
//! on its way to the client, with the little fencegate changes or learns
//! from it (a limited credential's bucket list, an upload's token).

use super::small_body::read_small_body;
use super::{Proxy, upload_key};
use crate::body::{ProxyBody, full};
use crate::s3::auth::Verified;
use crate::s3::error::S3Error;
use crate::s3::op::{Op, Operation};
use crate::s3::xml;
use crate::upstream::client::clean_response_headers;
use bytes::Bytes;
use http::Response;

impl Proxy {
    /// Phase 10: the backend's answer to the client.
    pub(super) async fn respond(
        &self,
        resp: Response<ProxyBody>,
        op: &Operation,
        verified: &Verified,
        token: Option<u64>,
    ) -> Result<Response<ProxyBody>, S3Error> {
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
}
