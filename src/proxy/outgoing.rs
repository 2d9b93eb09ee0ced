//! Phase 5, the upstream request: which headers the backend gets (token
//! stamped, fencegate's own parameters removed) and the body pipeline for
//! each payload form (verify, hold back the last frame, re-encode).

use super::{Admitted, Proxy, UPSTREAM_CHUNK, is_presign_param};
use crate::fence::commit::commit_gate;
use crate::s3::auth::{Payload, Verified};
use crate::s3::body;
use crate::s3::chunked::{self, ChunkedSpec};
use crate::s3::error::S3Error;
use crate::s3::headers::{X_AMZ_COPY_SOURCE, X_AMZ_DECODED_CONTENT_LENGTH, X_AMZ_TRAILER};
use crate::upstream::client::{Outgoing, UpstreamPayload, forwarded_headers};
use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use hyper::body::Incoming;

impl Proxy {
    /// The request the backend gets: the bucket, key, query and copy source
    /// as fencegate parsed them (never the client's raw forms), the client's
    /// other headers, the token stamped, and the body pipeline.
    pub(super) fn upstream_request(
        &self,
        head: &Parts,
        admitted: &Admitted,
        incoming: Incoming,
    ) -> Result<Outgoing, S3Error> {
        let Admitted {
            verified,
            op,
            query,
            fenced,
        } = admitted;
        let headers = &head.headers;
        // The token and a presigned URL's signature are fencegate's; the
        // backend gets its own header signature.
        let query: Vec<(String, String)> = query
            .iter()
            .filter(|(k, _)| *k != self.carriers.query && !is_presign_param(k))
            .cloned()
            .collect();
        let mut out_headers = forwarded_headers(
            headers,
            &[self.carriers.header.as_str(), self.stamp_header.as_str()],
        );
        if let Some(src) = &op.copy_source {
            out_headers.insert(
                X_AMZ_COPY_SOURCE,
                HeaderValue::from_str(&src.to_header())
                    .map_err(|e| S3Error::Internal(e.to_string()))?,
            );
        }
        if op.op.stamps_token()
            && let Some(t) = fenced.token
        {
            out_headers.insert(
                http::HeaderName::from_bytes(self.stamp_header.as_bytes())
                    .map_err(|e| S3Error::Internal(e.to_string()))?,
                HeaderValue::from(t),
            );
        }
        let content_length = match headers.get(http::header::CONTENT_LENGTH) {
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| S3Error::InvalidArgument("bad Content-Length".into()))?,
            ),
            None => None,
        };
        let has_body = content_length.is_some_and(|n| n > 0)
            || headers.contains_key(http::header::TRANSFER_ENCODING);
        let resource = fenced.resource.clone().unwrap_or_default();
        let gated = |frames| {
            let resource = resource.clone();
            commit_gate(frames, fenced.permit.clone(), move |p| {
                S3Error::aborted(p, &resource)
            })
        };

        let mut out = Outgoing {
            method: head.method.clone(),
            bucket: op.bucket.clone(),
            key: op.key.clone(),
            query,
            headers: out_headers,
            body: None,
            content_length: None,
            payload: UpstreamPayload::Empty,
        };

        if verified.payload.is_chunked() {
            return self.chunked_body(out, headers, verified, incoming, gated);
        }
        if !has_body {
            if let Payload::Sha256(h) = &verified.payload
                && h[..] != <sha2::Sha256 as sha2::Digest>::digest(b"")[..]
            {
                return Err(S3Error::ContentSha256Mismatch);
            }
            if let Some(p) = &fenced.permit
                && !p.body_complete()
            {
                return Err(S3Error::aborted(p, &resource));
            }
            if content_length == Some(0) {
                out.content_length = Some(0);
            }
            return Ok(out);
        }
        let Some(len) = content_length else {
            return Err(S3Error::MissingContentLength);
        };
        let frames = match &verified.payload {
            Payload::Sha256(h) => {
                out.payload = UpstreamPayload::Sha256Hex(hex::encode(h));
                body::sha256_checked(body::incoming(incoming, self.body_idle), *h)
            }
            _ => {
                out.payload = UpstreamPayload::Unsigned;
                body::plain(body::incoming(incoming, self.body_idle))
            }
        };
        out.body = Some(gated(frames));
        out.content_length = Some(len);
        Ok(out)
    }

    /// aws-chunked bodies: decoded and verified here; forwarded plain, or
    /// re-chunked unsigned when checksum trailers must reach the backend.
    fn chunked_body(
        &self,
        mut out: Outgoing,
        headers: &HeaderMap,
        verified: &Verified,
        incoming: Incoming,
        gated: impl FnOnce(chunked::FrameStream) -> chunked::FrameStream,
    ) -> Result<Outgoing, S3Error> {
        let decoded_len = headers
            .get(X_AMZ_DECODED_CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| {
                S3Error::InvalidRequest(
                    "aws-chunked bodies need x-amz-decoded-content-length".into(),
                )
            })?;
        let has_trailer = matches!(
            verified.payload,
            Payload::StreamingSigned { trailer: true } | Payload::StreamingUnsignedTrailer
        );
        let trailers: Vec<String> = if has_trailer {
            headers
                .get_all(X_AMZ_TRAILER)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(|s| s.trim().to_ascii_lowercase())
                .filter(|s| !s.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        let mut lines = Vec::new();
        for t in &trailers {
            let len = body::checksum_value_len(t)
                .ok_or_else(|| S3Error::InvalidRequest(format!("unsupported trailer {t:?}")))?;
            lines.push((t.clone(), len));
        }
        let signing = match verified.payload {
            Payload::StreamingSigned { .. } => Some(verified.signing.clone()),
            _ => None,
        };
        let decoded = chunked::decode(
            body::incoming(incoming, self.body_idle),
            ChunkedSpec {
                signing,
                trailers: trailers.clone(),
                has_trailer,
                decoded_len,
            },
        );
        let frames = gated(decoded);
        // Content-Encoding without its aws-chunked member.
        let encodings: Vec<String> = headers
            .get_all(http::header::CONTENT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty() && !s.eq_ignore_ascii_case("aws-chunked"))
            .collect();
        out.headers.remove(http::header::CONTENT_ENCODING);
        if lines.is_empty() {
            if !encodings.is_empty() {
                out.headers.insert(
                    http::header::CONTENT_ENCODING,
                    HeaderValue::from_str(&encodings.join(","))
                        .map_err(|e| S3Error::InvalidArgument(e.to_string()))?,
                );
            }
            out.payload = UpstreamPayload::Unsigned;
            out.content_length = Some(decoded_len);
            out.body = Some(Box::pin(body::data_only(frames)));
            return Ok(out);
        }
        let mut enc = vec!["aws-chunked".to_string()];
        enc.extend(encodings);
        out.headers.insert(
            http::header::CONTENT_ENCODING,
            HeaderValue::from_str(&enc.join(","))
                .map_err(|e| S3Error::InvalidArgument(e.to_string()))?,
        );
        out.headers
            .insert(X_AMZ_DECODED_CONTENT_LENGTH, HeaderValue::from(decoded_len));
        out.headers.insert(
            X_AMZ_TRAILER,
            HeaderValue::from_str(&trailers.join(","))
                .map_err(|e| S3Error::InvalidArgument(e.to_string()))?,
        );
        out.payload = UpstreamPayload::StreamingUnsignedTrailer;
        out.content_length = Some(body::chunked_encoded_len(
            decoded_len,
            UPSTREAM_CHUNK as u64,
            &lines,
        ));
        let encoded = body::chunked_encode(frames, UPSTREAM_CHUNK);
        out.body = Some(Box::pin(futures_util::StreamExt::map(encoded, |r| {
            r.map(http_body::Frame::data)
        })));
        Ok(out)
    }
}
