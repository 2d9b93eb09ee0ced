//! Phase 8, the upstream request: which headers the backend gets (token
//! stamped, fencegate's own parameters removed) and the body pipeline for
//! each payload form (verify, check its MD5 against the writes in doubt,
//! hold back the last frame, re-encode).

use super::route::RequestBody;
use super::{Admitted, Proxy, UPSTREAM_CHUNK, is_presign_param};
use crate::fence::body_gate::{Stop, body_gate};
use crate::fence::gate::Permit;
use crate::s3::auth::{Payload, Verified};
use crate::s3::body;
use crate::s3::chunked::{self, ChunkedSpec, FrameStream};
use crate::s3::error::S3Error;
use crate::s3::headers::{
    X_AMZ_COPY_SOURCE, X_AMZ_DECODED_CONTENT_LENGTH, X_AMZ_METADATA_DIRECTIVE, X_AMZ_TRAILER,
    number_value,
};
use crate::s3::{query, range};
use crate::upstream::client::{Outgoing, UpstreamPayload, forwarded_headers};
use futures_util::StreamExt;
use http::request::Parts;
use http::{HeaderMap, HeaderValue};
use md5::{Digest, Md5};

/// Header values fencegate builds: a failure is a request it cannot forward.
fn header_value(s: &str) -> Result<HeaderValue, S3Error> {
    HeaderValue::from_str(s).map_err(|e| S3Error::InvalidArgument(e.to_string()))
}

/// The comma-separated members of every `name` header, trimmed.
fn list_header(headers: &HeaderMap, name: impl http::header::AsHeaderName) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

impl Proxy {
    /// The request the backend gets: the bucket, key, query and copy source
    /// as fencegate parsed them (never the client's raw forms), the client's
    /// other headers, the token stamped, and the body pipeline.
    pub(super) fn upstream_request(
        &self,
        head: &Parts,
        admitted: &Admitted,
        incoming: RequestBody,
    ) -> Result<Outgoing, S3Error> {
        let out = self.upstream_head(head, admitted)?;
        let fenced = &admitted.fenced;
        let resource = fenced.resource.clone().unwrap_or_default();
        let hold = (!admitted.hold.is_empty()).then(|| admitted.hold.clone());
        let record = admitted.record.clone();
        let gated = |frames| {
            body_gate(
                md5_guarded(frames, fenced.permit.as_deref()),
                fenced.permit.clone(),
                hold,
                record,
                move |stop| match stop {
                    Stop::Aborted(p) => S3Error::aborted(p, &resource),
                    Stop::HoldLapsed => S3Error::lease_lapsed("the object"),
                },
            )
        };
        if admitted.verified.payload.is_chunked() {
            return self.chunked_body(out, &head.headers, &admitted.verified, incoming, gated);
        }
        self.plain_body(out, &head.headers, admitted, incoming, gated)
    }

    /// Everything but the body: what fencegate parsed, the client's other
    /// headers, and the stamp.
    fn upstream_head(&self, head: &Parts, admitted: &Admitted) -> Result<Outgoing, S3Error> {
        let Admitted {
            op, query, fenced, ..
        } = admitted;
        // The token and a presigned URL's signature are fencegate's; the
        // backend gets its own header signature.
        let query = query
            .iter()
            .filter(|(k, _)| *k != self.carriers.query && !is_presign_param(k))
            .map(query::owned)
            .collect();
        // With stamping on, the stamp replaces the token's metadata carrier;
        // with it off, a token the client put in its metadata stays there as
        // the client's own metadata.
        let mut headers = match &self.stamp_header {
            Some(stamp) => forwarded_headers(
                &head.headers,
                &[
                    self.carriers.header.as_str(),
                    self.carriers.meta_header.as_str(),
                    stamp.as_str(),
                ],
            ),
            None => forwarded_headers(&head.headers, &[self.carriers.header.as_str()]),
        };
        range::forward_range(op.op, &mut headers);
        if let Some(src) = &op.copy_source {
            headers.insert(X_AMZ_COPY_SOURCE, header_value(&src.to_header())?);
        }
        if let Some(replace) = op.replace_metadata {
            let directive = if replace { "REPLACE" } else { "COPY" };
            let value = http::HeaderValue::from_static(directive);
            headers.insert(X_AMZ_METADATA_DIRECTIVE, value);
        }
        if let (true, Some(t), Some(stamp)) =
            (op.op.stamps_token(), fenced.token, &self.stamp_header)
        {
            headers.insert(stamp.clone(), number_value(t));
        }
        Ok(Outgoing {
            method: head.method.clone(),
            bucket: op.bucket.clone(),
            key: op.key.clone(),
            query,
            headers,
            body: None,
            content_length: None,
            payload: UpstreamPayload::Empty,
            anonymous: false,
        })
    }

    /// A body sent as is (`UNSIGNED-PAYLOAD` or a hex SHA-256, checked as it
    /// streams), or no body.
    fn plain_body(
        &self,
        mut out: Outgoing,
        headers: &HeaderMap,
        admitted: &Admitted,
        incoming: RequestBody,
        gated: impl FnOnce(chunked::FrameStream) -> chunked::FrameStream,
    ) -> Result<Outgoing, S3Error> {
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
        let payload = &admitted.verified.payload;
        if !has_body {
            if let Payload::Sha256(h) = payload
                && *h != crate::s3::sigv4::EMPTY_SHA256_BYTES
            {
                return Err(S3Error::ContentSha256Mismatch);
            }
            if let Some(p) = &admitted.fenced.permit
                && !p.body_complete()
            {
                let resource = admitted.fenced.resource.as_deref().unwrap_or_default();
                return Err(S3Error::aborted(p, resource));
            }
            if !admitted.hold.body_complete() {
                let key = admitted.op.key.as_deref().unwrap_or_default();
                return Err(S3Error::lease_lapsed(key));
            }
            if content_length == Some(0) {
                out.content_length = Some(0);
            }
            return Ok(out);
        }
        let Some(len) = content_length else {
            return Err(S3Error::MissingContentLength);
        };
        let frames = match payload {
            Payload::Sha256(h) => {
                out.payload = UpstreamPayload::Sha256Hex(crate::s3::sigv4::hex_lower(h));
                body::sha256_checked(incoming.stream(self.body_idle), *h)
            }
            _ => {
                out.payload = UpstreamPayload::Unsigned;
                body::plain(incoming.stream(self.body_idle))
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
        incoming: RequestBody,
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
        let trailers: Vec<String> = match has_trailer {
            true => list_header(headers, X_AMZ_TRAILER)
                .into_iter()
                .map(|s| s.to_ascii_lowercase())
                .collect(),
            false => Vec::new(),
        };
        let spec = ChunkedSpec {
            signing: verified.signing.as_deref().cloned(),
            trailers: trailers.clone(),
            has_trailer,
            decoded_len,
        };
        let decoded = chunked::decode(incoming.stream(self.body_idle), spec);
        let frames = gated(decoded);
        // Content-Encoding without its aws-chunked member.
        let mut encodings = list_header(headers, http::header::CONTENT_ENCODING);
        encodings.retain(|s| !s.eq_ignore_ascii_case("aws-chunked"));
        out.headers.remove(http::header::CONTENT_ENCODING);
        if trailers.is_empty() {
            if !encodings.is_empty() {
                out.headers.insert(
                    http::header::CONTENT_ENCODING,
                    header_value(&encodings.join(","))?,
                );
            }
            out.payload = UpstreamPayload::Unsigned;
            out.content_length = Some(decoded_len);
            out.body = Some(Box::pin(body::data_only(frames)));
            return Ok(out);
        }
        rechunk_with_trailers(out, frames, encodings, trailers, decoded_len)
    }
}

/// The decoded body re-encoded as unsigned aws-chunked, so that its checksum
/// trailers reach the backend.
fn rechunk_with_trailers(
    mut out: Outgoing,
    frames: chunked::FrameStream,
    encodings: Vec<String>,
    trailers: Vec<String>,
    decoded_len: u64,
) -> Result<Outgoing, S3Error> {
    let mut lines = Vec::new();
    for t in &trailers {
        let len = body::checksum_value_len(t)
            .ok_or_else(|| S3Error::InvalidRequest(format!("unsupported trailer {t:?}")))?;
        lines.push((t.clone(), len));
    }
    let mut enc = vec!["aws-chunked".to_string()];
    enc.extend(encodings);
    out.headers.insert(
        http::header::CONTENT_ENCODING,
        header_value(&enc.join(","))?,
    );
    out.headers
        .insert(X_AMZ_DECODED_CONTENT_LENGTH, number_value(decoded_len));
    out.headers
        .insert(X_AMZ_TRAILER, header_value(&trailers.join(","))?);
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

/// `frames` whose MD5 must be none of `guards` (the ETags writes in doubt
/// on its object expect, `Permit::guards`): the stream ends with an error
/// instead of its end if it is one, so that the body gate never lets its
/// last bytes go.
fn md5_guarded(frames: FrameStream, permit: Option<&Permit>) -> FrameStream {
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
