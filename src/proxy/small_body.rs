//! Request and answer bodies small enough to read whole: an XML document
//! fencegate reads once and sends again in the form it read (DeleteObjects,
//! CreateBucket), and a backend's small XML answers.

use super::Proxy;
use crate::body::ProxyBody;
use crate::s3::bucket_config;
use crate::s3::error::S3Error;
use crate::upstream::client::{Outgoing, UpstreamPayload};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};

/// The whole (verified) request body of `out`, at most `limit` bytes, for
/// `what`. Checksum trailers are dropped: the backend gets a new body.
pub(super) async fn read_body(
    out: &mut Outgoing,
    limit: usize,
    what: &str,
) -> Result<Bytes, S3Error> {
    let mut body = BytesMut::new();
    if let Some(mut frames) = out.body.take() {
        while let Some(frame) = frames.next().await {
            if let Ok(d) = frame?.into_data() {
                if body.len() + d.len() > limit {
                    return Err(S3Error::MalformedXML(format!(
                        "{what} body over {limit} bytes"
                    )));
                }
                body.extend_from_slice(&d);
            }
        }
    }
    Ok(body.freeze())
}

/// Whether a rebuilt body goes with a checksum of its own.
pub(super) enum Checksum {
    /// `x-amz-checksum-sha256` (DeleteObjects needs one on AWS).
    Sha256,
    None,
}

/// Upstream: `body` in place of the client's, plain, with its SHA-256 as
/// the payload hash (the client's checksums were of the client's body).
pub(super) fn send_body(
    out: &mut Outgoing,
    body: Bytes,
    checksum: Checksum,
) -> Result<(), S3Error> {
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
    if let Checksum::Sha256 = checksum {
        out.headers.insert(
            "x-amz-checksum-sha256",
            http::HeaderValue::from_str(&base64::engine::general_purpose::STANDARD.encode(sha))
                .map_err(|e| S3Error::Internal(e.to_string()))?,
        );
    }
    out.content_length = Some(body.len() as u64);
    if body.is_empty() {
        out.payload = UpstreamPayload::Empty;
        out.body = None;
        return Ok(());
    }
    out.payload = UpstreamPayload::Sha256Hex(hex::encode(sha));
    let frame: Result<http_body::Frame<Bytes>, S3Error> = Ok(http_body::Frame::data(body));
    out.body = Some(Box::pin(futures_util::stream::iter([frame])));
    Ok(())
}

/// Reads a small backend answer (an XML document) whole, up to `limit`.
pub(super) async fn read_small_body(mut body: ProxyBody, limit: usize) -> Result<Bytes, S3Error> {
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| S3Error::BadGateway(format!("reading the backend's answer: {e}")))?;
        if let Ok(d) = frame.into_data() {
            if buf.len() + d.len() > limit {
                return Err(S3Error::BadGateway(format!(
                    "the backend's answer is over {limit} bytes"
                )));
            }
            buf.extend_from_slice(&d);
        }
    }
    Ok(buf.freeze())
}

impl Proxy {
    /// CreateBucket: the backend gets the location constraint of its own
    /// region (`s3::bucket_config`); a client that names a region other
    /// than fencegate's is refused (`400 IllegalLocationConstraintException`).
    pub(super) async fn create_bucket_body(&self, out: &mut Outgoing) -> Result<(), S3Error> {
        let xml = read_body(out, bucket_config::MAX_BODY, "CreateBucket").await?;
        let backend_region = &self.upstream.target().region;
        let body = bucket_config::for_backend(&xml, &self.region, backend_region)?;
        send_body(out, Bytes::from(body), Checksum::None)
    }
}
