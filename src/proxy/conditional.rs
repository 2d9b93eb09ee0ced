//! `fence.conditional_writes`: a fenced per-object write (PutObject,
//! CopyObject, CompleteMultipartUpload) goes to the backend with a
//! condition on the object as it was once the write was admitted:
//! `If-Match: <its ETag>`, or `If-None-Match: *` when there was none. If
//! anything else lands on the key between the admission and the moment the
//! backend applies this write (the window a paused replica leaves, see
//! docs/cluster.md), the backend refuses it with `412`, and the newer write
//! stays. It costs one HEAD per such write, and needs a backend that
//! honours conditional writes (AWS S3, MinIO, moto; not Garage).
//!
//! A write that carries its own `If-Match` or `If-None-Match` is sent with
//! the client's condition only. Two writes of byte-identical bodies have
//! the same ETag, so a newer write of the very bytes the object held at the
//! admission does not fail the condition (a lost update nobody can see in
//! the content, but the stamp of the newer token is overwritten).

use super::Proxy;
use crate::s3::error::S3Error;
use crate::s3::op::Operation;
use crate::upstream::client::{Outgoing, UpstreamPayload};
use http::header::{ETAG, IF_MATCH, IF_NONE_MATCH};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

/// Headers of the write that its HEAD needs too: a customer-key encrypted
/// object is only readable with its key, a requester-pays bucket only with
/// the request-payer header.
const HEAD_NEEDS: &[&str] = &[
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key",
    "x-amz-server-side-encryption-customer-key-md5",
    "x-amz-request-payer",
    "x-amz-expected-bucket-owner",
];

impl Proxy {
    /// Adds the condition on the object's current state to `out`.
    pub(super) async fn condition_on_current(
        &self,
        out: &mut Outgoing,
        headers: &HeaderMap,
        op: &Operation,
    ) -> Result<(), S3Error> {
        if headers.contains_key(IF_MATCH) || headers.contains_key(IF_NONE_MATCH) {
            return Ok(());
        }
        let mut head_headers = HeaderMap::new();
        for name in HEAD_NEEDS {
            if let Some(v) = headers.get(*name) {
                head_headers.insert(*name, v.clone());
            }
        }
        let head = Outgoing {
            method: Method::HEAD,
            bucket: op.bucket.clone(),
            key: op.key.clone(),
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
                let etag = resp.headers().get(ETAG).cloned().ok_or_else(|| {
                    S3Error::BadGateway("the backend's HEAD of the object has no ETag".into())
                })?;
                out.headers.insert(IF_MATCH, etag);
            }
            StatusCode::NOT_FOUND => {
                out.headers
                    .insert(IF_NONE_MATCH, HeaderValue::from_static("*"));
            }
            StatusCode::FORBIDDEN => {
                return Err(S3Error::BadGateway(
                    "the backend refused the HEAD before a conditional write (403): \
                     fencegate's backend credential needs s3:GetObject, and s3:ListBucket \
                     (without it a missing key answers 403)"
                        .into(),
                ));
            }
            s => {
                return Err(S3Error::BadGateway(format!(
                    "the backend answered {s} to the HEAD before a conditional write"
                )));
            }
        }
        Ok(())
    }
}
