//! DeleteObjects: every key it names is checked against its own resource,
//! all or nothing. The body is small (at most 1000 keys), so it is read
//! whole (capped), verified like any body, parsed, and then sent upstream as
//! one buffer.

use super::{LogCtx, Proxy};
use crate::fence::gate::{Kind, Permit, Refusal};
use crate::fence::resource::Fencing;
use crate::s3::error::S3Error;
use crate::s3::multi_delete::{MAX_BODY, parse_keys};
use crate::s3::op::Operation;
use crate::upstream::client::{Outgoing, UpstreamPayload};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

impl Proxy {
    /// Reads the body of `out`, fences every resource it names, and puts the
    /// body back as a buffer. Returns the permits, held until the backend
    /// answered.
    pub(super) async fn fence_multi_delete(
        &self,
        op: &Operation,
        token: Option<u64>,
        out: &mut Outgoing,
        log: &mut LogCtx,
    ) -> Result<Vec<Permit>, S3Error> {
        let bucket = op.bucket.as_deref().unwrap_or_default();
        let mut body = BytesMut::new();
        let mut trailers = http::HeaderMap::new();
        if let Some(mut frames) = out.body.take() {
            while let Some(frame) = frames.next().await {
                match frame?.into_data() {
                    Ok(d) => {
                        if body.len() + d.len() > MAX_BODY {
                            return Err(S3Error::MalformedXML(format!(
                                "DeleteObjects body over {MAX_BODY} bytes"
                            )));
                        }
                        body.extend_from_slice(&d);
                    }
                    Err(f) => {
                        if let Ok(t) = f.into_trailers() {
                            trailers.extend(t);
                        }
                    }
                }
            }
        }
        let body = body.freeze();
        let keys = parse_keys(&body)?;

        let resources: BTreeSet<String> = keys
            .iter()
            .filter_map(|k| match self.resolver.resolve(bucket, k) {
                Fencing::Fenced(r) => Some(r),
                Fencing::Unfenced => None,
            })
            .collect();
        let mut permits = Vec::new();
        if let Some(first) = resources.iter().next() {
            let Some(t) = token else {
                return Err(S3Error::MissingFencingToken(first.clone()));
            };
            log.resource = Some(format!("{first} (+{} more)", resources.len() - 1));
            // Check every resource before raising any, so that a request
            // refused for one key leaves the others' fences alone.
            for r in &resources {
                if let Some(h) = self
                    .gate
                    .highest(r)
                    .await
                    .map_err(|e| S3Error::Internal(e.to_string()))?
                    && t < h
                {
                    return Err(S3Error::from_refusal(
                        Refusal::Stale {
                            token: t,
                            highest: h,
                        },
                        r,
                    ));
                }
            }
            for r in &resources {
                let admitted = self.gate.admit(r, t, Kind::Write).await;
                permits.extend(admitted.map_err(|e| S3Error::from_refusal(e, r))?);
            }
            for p in &permits {
                if !p.body_complete() {
                    return Err(S3Error::aborted(p, "one of the keys"));
                }
            }
        }

        // Upstream: the buffered body, plain, its checksums as headers.
        out.headers.remove(http::header::CONTENT_ENCODING);
        out.headers.remove("x-amz-decoded-content-length");
        out.headers.remove("x-amz-trailer");
        for (name, value) in &trailers {
            out.headers.insert(name.clone(), value.clone());
        }
        out.content_length = Some(body.len() as u64);
        out.payload = UpstreamPayload::Sha256Hex(hex::encode(Sha256::digest(&body)));
        let frame: Result<http_body::Frame<Bytes>, S3Error> = Ok(http_body::Frame::data(body));
        out.body = Some(Box::pin(futures_util::stream::iter([frame])));
        Ok(permits)
    }
}
