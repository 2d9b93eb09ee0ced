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

mod copy;
mod multi_delete;
mod outgoing;

use crate::admin::metrics as m;
use crate::config::Config;
use crate::fence::gate::{Gate, Kind, Permit};
use crate::fence::resource::{Fencing, Resolver};
use crate::fence::token::Carriers;
use crate::fence::uploads::{self, Uploads};
use crate::s3::auth::{self, Credentials, Verified};
use crate::s3::error::S3Error;
use crate::s3::op::{self, Access, Operation};
use crate::upstream::client::{Upstream, clean_response_headers};
use bytes::Bytes;
use http::{Request, Response};
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

/// Reads a small backend answer (an XML document) whole, up to `limit`.
async fn read_small_body(body: Incoming, limit: usize) -> Result<Bytes, S3Error> {
    Ok(http_body_util::Limited::new(body, limit)
        .collect()
        .await
        .map_err(|e| S3Error::BadGateway(format!("reading the backend's answer: {e}")))?
        .to_bytes())
}

/// A ListAllMyBucketsResult with only the `<Bucket>` entries whose name
/// passes `allowed`.
fn keep_buckets(xml: &[u8], allowed: impl Fn(&str) -> bool) -> String {
    let text = String::from_utf8_lossy(xml);
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_ref();
    while let Some(start) = rest.find("<Bucket>") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find("</Bucket>") else {
            break;
        };
        let end = start + len + "</Bucket>".len();
        let entry = &rest[start..end];
        let name = entry
            .split_once("<Name>")
            .and_then(|(_, r)| r.split_once("</Name>"))
            .map(|(n, _)| n)
            .unwrap_or_default();
        if allowed(name) {
            out.push_str(entry);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
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
            + parts.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
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
        self.authorize(&verified, &op, &parts.headers)?;

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

        let mut outgoing = outgoing;
        if op.name == "CopyObject" && fenced.token.is_some() {
            self.keep_source_metadata(&mut outgoing, &parts.headers)
                .await?;
        }
        let others = if op.access == Access::MultiDelete {
            self.fence_multi_delete(&op, token, &mut outgoing, log)
                .await?
        } else {
            Vec::new()
        };

        // 6. forward
        let upstream = self.upstream.clone();
        let permit = fenced.permit;
        let exchange = tokio::spawn(async move {
            let sent = Instant::now();
            let result = upstream.send(outgoing).await;
            metrics::histogram!(m::UPSTREAM_LATENCY).record(sent.elapsed().as_secs_f64());
            // The write is finished upstream: answered, or aborted.
            drop(permit);
            drop(others);
            result
        });
        let resp = exchange
            .await
            .map_err(|e| S3Error::Internal(format!("forwarding task: {e}")))??;

        // 7. respond
        let (mut parts, body) = resp.into_parts();
        clean_response_headers(&mut parts.headers);
        if op.name == "ListBuckets"
            && parts.status.is_success()
            && !verified.credential.allows_bucket("*")
        {
            // Show a limited credential only the buckets it may use.
            let bytes = read_small_body(body, 8 << 20).await?;
            let kept = keep_buckets(&bytes, |b| verified.credential.allows_bucket(b));
            parts.headers.remove(http::header::CONTENT_LENGTH);
            return Ok(Response::from_parts(parts, full(Bytes::from(kept))));
        }
        if let (Some(b), Some(k)) = (&op.bucket, &op.key)
            && parts.status.is_success()
        {
            match (op.name, &upload_id, fenced.token) {
                ("CreateMultipartUpload", _, Some(t)) => {
                    // A small XML document: read it to learn the upload id.
                    let bytes = read_small_body(body, 1 << 20).await?;
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

    fn authorize(
        &self,
        v: &Verified,
        op: &Operation,
        headers: &http::HeaderMap,
    ) -> Result<(), S3Error> {
        let Some(bucket) = &op.bucket else {
            return Ok(());
        };
        if !v.credential.allows_bucket(bucket) {
            return Err(S3Error::AccessDenied(format!(
                "access key {} may not use bucket {bucket}",
                v.credential.access_key_id
            )));
        }
        if let (Some(Ok((src, _, _))), Some(_)) = (op::copy_source(headers), &op.key)
            && !v.credential.allows_bucket(&src)
        {
            return Err(S3Error::AccessDenied(format!(
                "access key {} may not read the copy source bucket {src}",
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
        let permit = admitted.map_err(|r| S3Error::from_refusal(r, &resource))?;
        Ok(Fenced {
            resource: Some(resource),
            token: Some(token),
            permit: permit.map(Arc::new),
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keep_buckets_filters_entries() {
        let xml = b"<ListAllMyBucketsResult><Owner><ID>o</ID></Owner><Buckets><Bucket><Name>a</Name><CreationDate>d</CreationDate></Bucket><Bucket><Name>b</Name><CreationDate>d</CreationDate></Bucket></Buckets></ListAllMyBucketsResult>";
        let kept = super::keep_buckets(xml, |b| b == "b");
        assert!(!kept.contains("<Name>a</Name>"));
        assert!(kept.contains("<Name>b</Name>"));
        assert!(kept.ends_with("</Buckets></ListAllMyBucketsResult>"));
    }
}
