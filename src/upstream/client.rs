//! Forwarding to the backend over hyper: the upstream URL, header filtering,
//! re-signing with the backend's credentials (`s3::sign`, the same SigV4
//! code that verifies clients), and a streaming body both ways.

use super::pool::Pool;
use crate::s3::chunked::FrameStream;
use crate::s3::error::S3Error;
use crate::s3::headers::{
    X_AMZ_CONTENT_SHA256, X_AMZ_COPY_SOURCE, X_AMZ_DATE, X_AMZ_DECODED_CONTENT_LENGTH,
    X_AMZ_SECURITY_TOKEN, X_AMZ_TRAILER, number_value,
};
use crate::s3::query::Param;
use crate::s3::sign::HeaderSigner;
use crate::s3::sigv4::{EMPTY_SHA256, push_encoded};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, header};
use http_body_util::{BodyExt, Empty, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Incoming;
use std::time::{Duration, SystemTime};

pub type UpstreamBody = UnsyncBoxBody<Bytes, S3Error>;

/// How the upstream body is protected, for the signature.
pub enum UpstreamPayload {
    Empty,
    Unsigned,
    Sha256Hex(String),
    StreamingUnsignedTrailer,
}

/// A request ready to go upstream (everything but the signature).
pub struct Outgoing {
    pub method: Method,
    pub bucket: Option<String>,
    pub key: Option<String>,
    /// Decoded query pairs to forward.
    pub query: Vec<Param<'static>>,
    pub headers: HeaderMap,
    pub body: Option<FrameStream>,
    pub content_length: Option<u64>,
    pub payload: UpstreamPayload,
    /// Sent without a signature: anonymous reads and CORS preflights, which
    /// the backend must judge as the anonymous requests they are, never
    /// with fencegate's credential.
    pub anonymous: bool,
}

/// Where and as whom fencegate talks to the backend.
#[derive(Clone)]
pub struct BackendTarget {
    pub endpoint: Uri,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Name the bucket in the Host header (`bucket.<endpoint host>`) instead
    /// of the path. fencegate still connects to the endpoint's address.
    pub virtual_host: bool,
}

pub struct Upstream {
    pool: Pool,
    target: BackendTarget,
    host: HeaderValue,
    timeout: Duration,
    signer: HeaderSigner,
}

/// Hop-by-hop headers: they describe one connection, so they go neither
/// upstream nor back to the client.
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Request headers that never go upstream besides the hop-by-hop ones: the
/// client's signature, and what fencegate sets itself.
static DROPPED: [HeaderName; 12] = [
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::EXPECT,
    header::HOST,
    header::CONTENT_LENGTH,
    X_AMZ_DATE,
    X_AMZ_CONTENT_SHA256,
    X_AMZ_SECURITY_TOKEN,
    X_AMZ_DECODED_CONTENT_LENGTH,
    X_AMZ_TRAILER,
    // Forwarded only as fencegate parsed it, on copies (see s3::names).
    X_AMZ_COPY_SOURCE,
    // Between replicas only (`proxy/to_owner.rs`).
    HeaderName::from_static("x-fencegate-forwarded"),
];

/// Copies the client's headers minus the dropped ones and `extra_drop`,
/// with room for the headers fencegate adds (host, length, stamp, copy
/// source, and the signature's three), so that the map never regrows.
pub fn forwarded_headers(from: &HeaderMap, extra_drop: &[&str]) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(from.len() + 7);
    for (name, value) in from {
        if HOP_BY_HOP.contains(name)
            || DROPPED.contains(name)
            || extra_drop.contains(&name.as_str())
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

impl Upstream {
    /// `ca_file`: an extra CA to trust for an `https://` backend.
    pub fn new(
        target: BackendTarget,
        timeout: Duration,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Upstream, String> {
        let authority = target
            .endpoint
            .authority()
            .ok_or("backend endpoint has no host")?
            .clone();
        let host = HeaderValue::from_str(authority.as_str()).map_err(|e| e.to_string())?;
        let tls = if target.endpoint.scheme_str() == Some("https") {
            crate::tls::client_config(ca_file)?
        } else {
            crate::tls::client_config_without_roots()?
        };
        let pool = Pool::new(tls, target.endpoint.clone(), Duration::from_secs(30));
        let signer = HeaderSigner::new(
            &target.access_key_id,
            &target.secret_access_key,
            &target.region,
        );
        Ok(Upstream {
            pool,
            signer,
            target,
            host,
            timeout,
        })
    }

    /// How long a backend may take to answer (and, for an answer's body,
    /// between two pieces of it).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn target(&self) -> &BackendTarget {
        &self.target
    }

    /// The path and query as they go on the wire (origin form), parsed
    /// once: the signature covers this path, and hyper sends it as is.
    fn uri(&self, out: &Outgoing) -> Result<Uri, S3Error> {
        let mut uri = String::with_capacity(64);
        uri.push('/');
        if let Some(b) = &out.bucket {
            if !self.target.virtual_host {
                push_encoded(&mut uri, b, false);
                if out.key.is_some() {
                    uri.push('/');
                }
            }
            if let Some(k) = &out.key {
                push_encoded(&mut uri, k, true);
            }
        }
        for (i, (k, v)) in out.query.iter().enumerate() {
            uri.push(if i == 0 { '?' } else { '&' });
            push_encoded(&mut uri, k, false);
            uri.push('=');
            push_encoded(&mut uri, v, false);
        }
        Uri::try_from(uri)
            .map_err(|e| S3Error::InvalidArgument(format!("cannot build upstream URL: {e}")))
    }

    /// Signs (unless anonymous) and sends `out`; resolves with the backend's
    /// response head.
    pub async fn send(&self, out: Outgoing) -> Result<Response<Incoming>, S3Error> {
        let uri = self.uri(&out)?;
        let mut headers = out.headers;
        let host = match (&out.bucket, self.target.virtual_host) {
            (Some(b), true) => {
                HeaderValue::from_str(&format!("{b}.{}", self.host.to_str().unwrap_or_default()))
                    .map_err(|_| {
                        S3Error::InvalidBucketName(format!("{b:?} cannot be a host name"))
                    })?
            }
            _ => self.host.clone(),
        };
        headers.insert(http::header::HOST, host);
        if let Some(len) = out.content_length {
            headers.insert(http::header::CONTENT_LENGTH, number_value(len));
        }
        let body: UpstreamBody = match out.body {
            Some(frames) => BodyExt::boxed_unsync(StreamBody::new(frames)),
            None => Empty::new().map_err(|never| match never {}).boxed_unsync(),
        };
        if !out.anonymous {
            let payload = match &out.payload {
                UpstreamPayload::Empty => EMPTY_SHA256,
                UpstreamPayload::Unsigned => "UNSIGNED-PAYLOAD",
                UpstreamPayload::Sha256Hex(h) => h.as_str(),
                UpstreamPayload::StreamingUnsignedTrailer => "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            };
            let (method, path) = (out.method.as_str(), uri.path());
            let now = SystemTime::now();
            (self.signer).sign(method, path, &out.query, &mut headers, payload, now)?;
        }
        let mut req = Request::new(body);
        *req.method_mut() = out.method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        match tokio::time::timeout(self.timeout, self.pool.send(req)).await {
            Err(_) => Err(S3Error::BadGateway("backend timed out".into())),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(e)) => Err(body_error(&*e)
                .unwrap_or_else(|| S3Error::BadGateway(format!("{e}: {}", error_chain(&*e))))),
        }
    }
}

/// If the upstream request failed because our own body stream failed, the
/// reason (stale abort, bad signature, short body) is in the error chain.
fn body_error(e: &(dyn std::error::Error + 'static)) -> Option<S3Error> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(s3) = err.downcast_ref::<S3Error>() {
            return Some(s3.clone());
        }
        cur = err.source();
    }
    None
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut cur = e.source();
    while let Some(err) = cur {
        parts.push(err.to_string());
        cur = err.source();
    }
    parts.join(": ")
}

/// Strips hop-by-hop headers from a backend response.
pub fn clean_response_headers(headers: &mut HeaderMap) {
    // A scan of the few headers an answer has, cheaper than a lookup per
    // hop-by-hop name when (as nearly always) there is none.
    if headers.keys().any(|n| HOP_BY_HOP.contains(n)) {
        for h in &HOP_BY_HOP {
            headers.remove(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the backend must never get from the client: hop-by-hop framing
    /// (a second reading of where the body ends), the client's signature
    /// and session token, and the headers fencegate writes itself from what
    /// it parsed (the copy source among them).
    #[test]
    fn dropped_headers_never_go_upstream() {
        let mut from = HeaderMap::new();
        for name in HOP_BY_HOP.iter().chain(&DROPPED) {
            from.append(name.clone(), HeaderValue::from_static("client"));
        }
        // As a client spells them: parsed, not built from the constants.
        for name in ["Transfer-Encoding", "X-Amz-Copy-Source", "Keep-Alive"] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            from.append(name, HeaderValue::from_static("client"));
        }
        from.insert("x-amz-meta-kept", HeaderValue::from_static("yes"));
        from.insert("content-type", HeaderValue::from_static("text/plain"));
        from.insert("x-fencing-token", HeaderValue::from_static("7"));
        let out = forwarded_headers(&from, &["x-fencing-token"]);
        let mut names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-type", "x-amz-meta-kept"]);
    }

    /// A backend's hop-by-hop headers describe its connection to fencegate,
    /// not fencegate's to the client: they are not passed back.
    #[test]
    fn hop_by_hop_answers_stay_behind() {
        let mut headers = HeaderMap::new();
        for name in [
            "Connection",
            "Keep-Alive",
            "Transfer-Encoding",
            "ETag",
            "Content-Length",
        ] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            headers.append(name, HeaderValue::from_static("backend"));
        }
        clean_response_headers(&mut headers);
        let mut names: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-length", "etag"]);
    }
}
