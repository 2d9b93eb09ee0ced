//! A request's life in fencegate, as named phases:
//!
//! 1. `authenticate`: SigV4 against fencegate's credential table;
//! 2. `classify`: operation, bucket, key;
//! 3. `authorize`: the credential may use the bucket (and administer it for
//!    bucket-level writes);
//! 4. `fence`: token from its carriers, resource from the rules, admission
//!    through the gate (check, durable raise, ordering barrier);
//! 5. `upstream_request`: the body pipeline (verify, hold back, re-encode)
//!    and the headers the backend gets, token stamped;
//! 6. `forward`: the upstream exchange, in a task of its own that keeps the
//!    write's permit until the backend answered, even if the client leaves;
//! 7. `respond`: the backend's response streamed back, or an S3 XML error.
//!
//! One log event per request is written at the end.

use crate::admin::metrics as m;
use crate::config::Config;
use crate::fence::gate::{Gate, Kind, Permit, Refusal};
use crate::fence::resource::{Fencing, Resolver};
use crate::fence::token::Carriers;
use crate::fence::uploads::{self, Uploads};
use crate::s3::auth::{self, Credentials, Payload, Verified};
use crate::s3::body;
use crate::s3::chunked::{self, ChunkedSpec};
use crate::s3::error::S3Error;
use crate::s3::op::{self, Access, Operation};
use crate::upstream::client::{
    Outgoing, Upstream, UpstreamPayload, clean_response_headers, forwarded_headers,
};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = BoxBody<Bytes, BoxError>;

/// Chunk size of aws-chunked bodies sent upstream.
const UPSTREAM_CHUNK: usize = 64 * 1024;

pub struct Proxy {
    region: String,
    creds: Credentials,
    resolver: Resolver,
    carriers: Carriers,
    stamp_header: String,
    gate: Arc<Gate>,
    upstream: Arc<Upstream>,
    uploads: Uploads,
    max_header_bytes: usize,
    domains: Vec<String>,
    body_idle: Duration,
    next_id: AtomicU64,
    id_prefix: u32,
}

/// What the request log line says about a request.
#[derive(Default)]
struct LogCtx {
    op: &'static str,
    bucket: Option<String>,
    key: Option<String>,
    access_key: Option<String>,
    resource: Option<String>,
    token: Option<u64>,
    highest: Option<u64>,
    decision: &'static str,
    payload: &'static str,
}

/// The outcome of the fence phase.
struct Fenced {
    resource: Option<String>,
    token: Option<u64>,
    permit: Option<Arc<Permit>>,
}

fn is_presign_param(k: &str) -> bool {
    matches!(
        k,
        "X-Amz-Algorithm"
            | "X-Amz-Credential"
            | "X-Amz-Date"
            | "X-Amz-Expires"
            | "X-Amz-SignedHeaders"
            | "X-Amz-Signature"
            | "X-Amz-Security-Token"
    )
}

fn full(b: Bytes) -> ProxyBody {
    Full::new(b).map_err(|never| match never {}).boxed()
}

impl Proxy {
    pub fn new(cfg: &Config, gate: Arc<Gate>, upstream: Arc<Upstream>) -> Proxy {
        let meta = format!("x-amz-meta-{}", cfg.fence.stamp_metadata);
        Proxy {
            region: cfg.server.region.clone(),
            creds: Credentials::new(&cfg.credentials),
            resolver: Resolver::new(&cfg.rules),
            carriers: Carriers {
                header: cfg.fence.token_header.clone(),
                meta_header: meta.clone(),
                query: cfg.fence.token_query.clone(),
            },
            stamp_header: meta,
            gate,
            upstream,
            uploads: Uploads::default(),
            max_header_bytes: cfg.server.max_header_bytes,
            domains: cfg.server.domains.clone(),
            body_idle: Duration::from_millis(cfg.server.request_timeout_ms),
            next_id: AtomicU64::new(1),
            id_prefix: rand::random(),
        }
    }

    fn request_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{:08X}{:08X}", self.id_prefix, n)
    }

    /// Handles one request; never fails (errors become S3 XML responses).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        let started = Instant::now();
        let rid = self.request_id();
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        let bytes_in = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        let mut log = LogCtx {
            op: "Unknown",
            decision: "forwarded",
            ..Default::default()
        };
        let resp = match self.process(req, &mut log).await {
            Ok(r) => r,
            Err(e) => {
                log.decision = e.outcome();
                if let S3Error::StaleFencingToken { highest, .. } = &e {
                    log.highest = Some(*highest);
                }
                let (parts, b) = e.to_response(&path, &rid).into_parts();
                Response::from_parts(parts, full(b))
            }
        };
        let status = resp.status().as_u16();
        metrics::counter!(m::REQUESTS, "op" => log.op, "outcome" => log.decision).increment(1);
        let resp = resp.map(|b| {
            b.map_frame(|f| {
                if let Some(d) = f.data_ref() {
                    metrics::counter!(m::BYTES_OUT).increment(d.len() as u64);
                }
                f
            })
            .boxed()
        });
        let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
        macro_rules! event {
            ($level:ident) => {
                tracing::$level!(
                    request_id = %rid,
                    method = %method,
                    op = log.op,
                    bucket = log.bucket.as_deref().unwrap_or(""),
                    key = log.key.as_deref().unwrap_or(""),
                    access_key = log.access_key.as_deref().unwrap_or(""),
                    resource = log.resource.as_deref().unwrap_or(""),
                    token = log.token.map(|t| t.to_string()).unwrap_or_default(),
                    highest = log.highest.map(|t| t.to_string()).unwrap_or_default(),
                    decision = log.decision,
                    payload = log.payload,
                    status,
                    bytes_in,
                    duration_ms = elapsed_ms,
                    "request"
                )
            };
        }
        if log.decision == "stale" {
            event!(warn);
        } else {
            event!(info);
        }
        resp
    }

    async fn process(
        &self,
        req: Request<Incoming>,
        log: &mut LogCtx,
    ) -> Result<Response<ProxyBody>, S3Error> {
        let (parts, incoming) = req.into_parts();
        let header_bytes: usize = parts
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>()
            + parts.uri.to_string().len();
        if header_bytes > self.max_header_bytes {
            return Err(S3Error::RequestHeaderSectionTooLarge);
        }
        let query = auth::decode_query(parts.uri.query());

        // 1. authenticate
        let verified = auth::verify(
            &auth::Head {
                method: parts.method.as_str(),
                raw_path: parts.uri.path(),
                query: &query,
                headers: &parts.headers,
            },
            &self.creds,
            &self.region,
            SystemTime::now(),
        )?;
        log.access_key = Some(verified.credential.access_key_id.clone());
        log.payload = verified.payload.name();

        // 2. classify
        let host = parts
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok());
        let (bucket, key) = op::split_request(host, parts.uri.path(), &self.domains)?;
        let op = op::classify(&parts.method, bucket, key, &query, &parts.headers)?;
        log.op = op.name;
        log.bucket = op.bucket.clone();
        log.key = op.key.clone();

        // 3. authorize
        self.authorize(&verified, &op)?;

        // 4. fence
        let token = self
            .carriers
            .extract(&parts.headers, &query)
            .map_err(|e| S3Error::InvalidFencingToken(e.to_string()))?;
        let upload_id = query
            .iter()
            .find(|(k, _)| k == "uploadId")
            .map(|(_, v)| v.clone());
        let token = match (token, &upload_id, &op.bucket, &op.key) {
            (None, Some(u), Some(b), Some(k)) => self.uploads.token(b, k, u),
            (t, ..) => t,
        };
        log.token = token;
        let fenced = self.fence(&op, token, log).await?;

        // 5. upstream request
        let outgoing = self.upstream_request(
            parts.method.clone(),
            &parts.headers,
            query,
            &op,
            &verified,
            &fenced,
            incoming,
        )?;

        // 6. forward
        let upstream = self.upstream.clone();
        let permit = fenced.permit;
        let exchange = tokio::spawn(async move {
            let sent = Instant::now();
            let result = upstream.send(outgoing).await;
            metrics::histogram!(m::UPSTREAM_LATENCY).record(sent.elapsed().as_secs_f64());
            // The write is finished upstream: answered, or aborted.
            drop(permit);
            result
        });
        let resp = exchange
            .await
            .map_err(|e| S3Error::Internal(format!("forwarding task: {e}")))??;

        // 7. respond
        let (mut parts, body) = resp.into_parts();
        clean_response_headers(&mut parts.headers);
        if let (Some(b), Some(k)) = (&op.bucket, &op.key)
            && parts.status.is_success()
        {
            match (op.name, &upload_id, fenced.token) {
                ("CreateMultipartUpload", _, Some(t)) => {
                    // A small XML document: read it to learn the upload id.
                    let limited = http_body_util::Limited::new(body, 1 << 20);
                    let bytes = limited
                        .collect()
                        .await
                        .map_err(|e| {
                            S3Error::BadGateway(format!("reading the backend's answer: {e}"))
                        })?
                        .to_bytes();
                    if let Some(id) = uploads::upload_id_from_xml(&bytes) {
                        self.uploads.record(b, k, &id, t);
                    }
                    return Ok(Response::from_parts(parts, full(bytes)));
                }
                ("CompleteMultipartUpload" | "AbortMultipartUpload", Some(u), _) => {
                    self.uploads.forget(b, k, u);
                }
                _ => {}
            }
        }
        let body = body.map_err(|e| Box::new(e) as BoxError).boxed();
        Ok(Response::from_parts(parts, body))
    }

    fn authorize(&self, v: &Verified, op: &Operation) -> Result<(), S3Error> {
        let Some(bucket) = &op.bucket else {
            return Ok(());
        };
        if !v.credential.allows_bucket(bucket) {
            return Err(S3Error::AccessDenied(format!(
                "access key {} may not use bucket {bucket}",
                v.credential.access_key_id
            )));
        }
        if op.access == Access::BucketWrite && !v.credential.bucket_admin {
            return Err(S3Error::AccessDenied(format!(
                "access key {} may not administer bucket {bucket}",
                v.credential.access_key_id
            )));
        }
        Ok(())
    }

    async fn fence(
        &self,
        op: &Operation,
        token: Option<u64>,
        log: &mut LogCtx,
    ) -> Result<Fenced, S3Error> {
        let none = Fenced {
            resource: None,
            token,
            permit: None,
        };
        let (bucket, key) = match (&op.bucket, &op.key) {
            (Some(b), Some(k)) => (b, k),
            _ if op.access == Access::MultiDelete => {
                return Err(S3Error::NotImplemented(
                    "DeleteObjects is not supported yet; delete keys one by one".into(),
                ));
            }
            _ => return Ok(none),
        };
        let kind = match op.access {
            Access::ObjectWrite => Kind::Write,
            Access::ObjectRead => Kind::Read,
            _ => return Ok(none),
        };
        let Fencing::Fenced(resource) = self.resolver.resolve(bucket, key) else {
            return Ok(none);
        };
        log.resource = Some(resource.clone());
        let token = match (token, kind) {
            (Some(t), _) => t,
            (None, Kind::Read) => return Ok(none),
            (None, Kind::Write) => return Err(S3Error::MissingFencingToken(resource)),
        };
        let admitting = Instant::now();
        let admitted = self.gate.admit(&resource, token, kind).await;
        metrics::histogram!(m::ADMISSION_WAIT).record(admitting.elapsed().as_secs_f64());
        match admitted {
            Ok(permit) => Ok(Fenced {
                resource: Some(resource),
                token: Some(token),
                permit: permit.map(Arc::new),
            }),
            Err(Refusal::Stale { token, highest }) => Err(S3Error::StaleFencingToken {
                token,
                highest,
                resource,
            }),
            Err(Refusal::Busy) => Err(S3Error::SlowDown(resource)),
            Err(Refusal::Store(e)) => Err(S3Error::Internal(e.to_string())),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn upstream_request(
        &self,
        method: http::Method,
        headers: &HeaderMap,
        mut query: Vec<(String, String)>,
        op: &Operation,
        verified: &Verified,
        fenced: &Fenced,
        incoming: Incoming,
    ) -> Result<Outgoing, S3Error> {
        // The token and a presigned URL's signature are fencegate's; the
        // backend gets its own header signature.
        query.retain(|(k, _)| *k != self.carriers.query && !is_presign_param(k));
        let mut out_headers = forwarded_headers(
            headers,
            &[self.carriers.header.as_str(), self.stamp_header.as_str()],
        );
        if op.stamps_token
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
        let gated = |frames| body::commit_gate(frames, fenced.permit.clone(), resource.clone());

        let mut out = Outgoing {
            method,
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
                return Err(S3Error::StaleFencingToken {
                    token: p.token(),
                    highest: p.highest(),
                    resource,
                });
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
            .get("x-amz-decoded-content-length")
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
                .get_all("x-amz-trailer")
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
        out.headers.insert(
            "x-amz-decoded-content-length",
            HeaderValue::from(decoded_len),
        );
        out.headers.insert(
            "x-amz-trailer",
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
