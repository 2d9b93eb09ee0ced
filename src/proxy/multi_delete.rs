//! DeleteObjects: every key it names is checked against its own resource,
//! all or nothing. The body is small (at most 1000 keys), so it is read
//! whole (capped), verified like any body, parsed, and the backend gets a
//! body rebuilt from the keys fencegate read (`s3::multi_delete`), never
//! the client's XML.

use super::{Proxy, RequestCtx};
use crate::fence::gate::{Kind, Permit, Refusal};
use crate::fence::resource::Fencing;
use crate::s3::error::S3Error;
use crate::s3::multi_delete::{Delete, MAX_BODY};
use crate::s3::op::Operation;
use crate::upstream::client::{Outgoing, UpstreamPayload};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;

impl Proxy {
    /// Reads the body of `out`, fences every resource it names, and puts a
    /// canonical body in its place. Returns the permits, held until the
    /// backend answered.
    pub(super) async fn fence_multi_delete(
        &self,
        op: &Operation,
        token: Option<u64>,
        out: &mut Outgoing,
        ctx: &mut RequestCtx,
    ) -> Result<Vec<Permit>, S3Error> {
        let bucket = op.bucket.as_deref().unwrap_or_default();
        let delete = Delete::parse(&read_body(out).await?)?;
        let resources: BTreeSet<String> = delete
            .objects
            .iter()
            .filter_map(|o| match self.resolver.resolve(bucket, &o.key) {
                Fencing::Fenced(r) => Some(r),
                Fencing::Unfenced => None,
            })
            .collect();
        let permits = match resources.iter().next() {
            None => Vec::new(),
            Some(first) => {
                let t = token.ok_or_else(|| S3Error::MissingFencingToken(first.clone()))?;
                ctx.resource = Some(format!("{first} (+{} more)", resources.len() - 1));
                self.admit_all(&resources, t).await?
            }
        };
        send_canonical(out, &delete)?;
        Ok(permits)
    }

    /// Admits `token` on every resource, all or nothing: every resource is
    /// checked before any is raised, so that a request refused for one key
    /// leaves the others' fences alone.
    async fn admit_all(
        &self,
        resources: &BTreeSet<String>,
        token: u64,
    ) -> Result<Vec<Permit>, S3Error> {
        for r in resources {
            let highest = self.gate.highest(r).await;
            if let Some(h) = highest.map_err(|e| S3Error::ServiceUnavailable(e.to_string()))?
                && token < h
            {
                let stale = Refusal::Stale { token, highest: h };
                return Err(S3Error::from_refusal(stale, r));
            }
        }
        let mut permits = Vec::new();
        for r in resources {
            let admitted = self.gate.admit(r, token, Kind::Write).await;
            permits.extend(admitted.map_err(|e| S3Error::from_refusal(e, r))?);
        }
        // The body was read whole: it is complete unless a newer token
        // arrived meanwhile.
        for p in &permits {
            if !p.body_complete() {
                return Err(S3Error::aborted(p, "one of the keys"));
            }
        }
        Ok(permits)
    }
}

/// The whole (verified) request body, at most [`MAX_BODY`] bytes. Checksum
/// trailers are dropped: the backend gets a new body with its own.
async fn read_body(out: &mut Outgoing) -> Result<Bytes, S3Error> {
    let mut body = BytesMut::new();
    if let Some(mut frames) = out.body.take() {
        while let Some(frame) = frames.next().await {
            if let Ok(d) = frame?.into_data() {
                if body.len() + d.len() > MAX_BODY {
                    return Err(S3Error::MalformedXML(format!(
                        "DeleteObjects body over {MAX_BODY} bytes"
                    )));
                }
                body.extend_from_slice(&d);
            }
        }
    }
    Ok(body.freeze())
}

/// Upstream: the canonical body, plain, with its own checksum (the client's
/// checksums are of the client's XML).
fn send_canonical(out: &mut Outgoing, delete: &Delete) -> Result<(), S3Error> {
    let body = Bytes::from(delete.to_xml());
    let sha = Sha256::digest(&body);
    out.headers.remove(http::header::CONTENT_ENCODING);
    out.headers.remove("content-md5");
    out.headers.remove("x-amz-sdk-checksum-algorithm");
    let checksums: Vec<_> = out
        .headers
        .keys()
        .filter(|n| n.as_str().starts_with("x-amz-checksum-"))
        .cloned()
        .collect();
    for n in checksums {
        out.headers.remove(n);
    }
    out.headers.insert(
        "x-amz-checksum-sha256",
        http::HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(sha))
            .map_err(|e| S3Error::Internal(e.to_string()))?,
    );
    out.content_length = Some(body.len() as u64);
    out.payload = UpstreamPayload::Sha256Hex(hex::encode(sha));
    let frame: Result<http_body::Frame<Bytes>, S3Error> = Ok(http_body::Frame::data(body));
    out.body = Some(Box::pin(futures_util::stream::iter([frame])));
    Ok(())
}
