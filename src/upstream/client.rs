//! Forwarding to the backend: the upstream URL, header filtering,
//! re-signing with the backend's credentials (`s3::sign`, the same SigV4
//! code that verifies clients), and a streaming body both ways. A real
//! store is reached over hyper; the embedded one is called in-process
//! (`upstream::embedded`), with the same request and no signature but
//! for the one form s3s decodes only when signed (a body with checksum
//! trailers).

use super::embedded::{InProcess, Trusted};
use super::pool::{Pool, UpstreamBody};
use super::target::BackendTarget;
use crate::body::BoxError;
use crate::s3::chunked::FrameStream;
use crate::s3::error::S3Error;
use crate::s3::headers::{
    X_AMZ_CONTENT_SHA256, X_AMZ_COPY_SOURCE, X_AMZ_DATE, X_AMZ_DECODED_CONTENT_LENGTH,
    X_AMZ_METADATA_DIRECTIVE, X_AMZ_SECURITY_TOKEN, X_AMZ_TRAILER, number_value,
};
use crate::s3::query::Param;
use crate::s3::sign::HeaderSigner;
use crate::s3::sigv4::{EMPTY_SHA256, push_encoded};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, Uri, header};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody};
use hyper::body::Incoming;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime};

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

pub struct Upstream {
    transport: Transport,
    target: BackendTarget,
    host: HeaderValue,
    timeout: Duration,
    signer: HeaderSigner,
}

/// How a request reaches the backend.
enum Transport {
    /// Over HTTP(S), from a pool of connections.
    Wire(Pool),
    /// The embedded store, called in-process.
    InProcess(InProcess),
}

/// A backend's answer body: off the wire, or from the embedded store.
pub enum AnswerBody {
    Wire(Incoming),
    InProcess(s3s::Body),
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            AnswerBody::Wire(b) => Pin::new(b).poll_frame(cx).map_err(Into::into),
            AnswerBody::InProcess(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnswerBody::Wire(b) => b.is_end_stream(),
            AnswerBody::InProcess(b) => http_body::Body::is_end_stream(b),
        }
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self {
            AnswerBody::Wire(b) => b.size_hint(),
            AnswerBody::InProcess(b) => http_body::Body::size_hint(b),
        }
    }
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
static DROPPED: [HeaderName; 16] = [
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
    // Forwarded only as fencegate parsed them (s3::names, s3::op).
    X_AMZ_COPY_SOURCE,
    X_AMZ_METADATA_DIRECTIVE,
    // Between replicas only: a request forwarded to its owner or relayed
    // to a peer (`proxy/to_owner.rs`), a ping and a successor's question
    // (`proxy/peers.rs`).
    HeaderName::from_static("x-fencegate-forwarded"),
    HeaderName::from_static("x-fencegate-relayed"),
    HeaderName::from_static("x-fencegate-ping"),
    HeaderName::from_static("x-fencegate-landed"),
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
        Ok(Self::with_transport(
            Transport::Wire(pool),
            target,
            host,
            timeout,
        ))
    }

    /// The embedded store, called in-process with its credential.
    pub fn in_process(
        store: InProcess,
        (access_key_id, secret_access_key): (String, String),
        region: &str,
        timeout: Duration,
    ) -> Upstream {
        let target = BackendTarget {
            endpoint: Uri::from_static("http://embedded.fencegate.invalid"),
            region: region.to_string(),
            access_key_id,
            secret_access_key,
            virtual_host: false,
        };
        let host = HeaderValue::from_static("embedded.fencegate.invalid");
        Self::with_transport(Transport::InProcess(store), target, host, timeout)
    }

    fn with_transport(
        transport: Transport,
        target: BackendTarget,
        host: HeaderValue,
        timeout: Duration,
    ) -> Self {
        let signer = HeaderSigner::new(
            &target.access_key_id,
            &target.secret_access_key,
            &target.region,
        );
        Upstream {
            transport,
            signer,
            target,
            host,
            timeout,
        }
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

    /// Signs and sends `out`; resolves with the backend's response head.
    /// Not signed: an anonymous request, and to the embedded store in
    /// process, any but the aws-chunked trailer form (see there).
    pub async fn send(&self, out: Outgoing) -> Result<Response<AnswerBody>, S3Error> {
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
        // In-process, only the form s3s decodes for an authenticated
        // request alone is signed (see `upstream::embedded`).
        let sign = !out.anonymous
            && (matches!(self.transport, Transport::Wire(_))
                || matches!(out.payload, UpstreamPayload::StreamingUnsignedTrailer));
        if sign {
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
        let mut req = Request::new(());
        *req.method_mut() = out.method;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        let sending = async {
            match &self.transport {
                Transport::Wire(pool) => Self::over_wire(pool, req, out.body).await,
                Transport::InProcess(store) => {
                    let trusted = !out.anonymous;
                    let call =
                        Self::in_process_call(store, req, out.body, out.content_length, trusted);
                    Box::pin(call).await
                }
            }
        };
        match tokio::time::timeout(self.timeout, sending).await {
            Err(_) => Err(S3Error::BadGateway("backend timed out".into())),
            Ok(answer) => answer,
        }
    }

    async fn over_wire(
        pool: &Pool,
        req: Request<()>,
        frames: Option<FrameStream>,
    ) -> Result<Response<AnswerBody>, S3Error> {
        let body: UpstreamBody = match frames {
            Some(frames) => BodyExt::boxed_unsync(StreamBody::new(frames)),
            None => Empty::new().map_err(|never| match never {}).boxed_unsync(),
        };
        match pool.send(req.map(|()| body)).await {
            Ok(resp) => Ok(resp.map(AnswerBody::Wire)),
            Err(e) => Err(body_error(&*e)
                .unwrap_or_else(|| S3Error::BadGateway(format!("{e}: {}", error_chain(&*e))))),
        }
    }

    /// The embedded store's answer. If fencegate's own body stream failed
    /// (a stale abort, a bad digest, a short body), that failure is the
    /// answer, as it is when a socket's send fails: the store only saw a
    /// broken body.
    async fn in_process_call(
        store: &InProcess,
        mut req: Request<()>,
        frames: Option<FrameStream>,
        len: Option<u64>,
        trusted: bool,
    ) -> Result<Response<AnswerBody>, S3Error> {
        if trusted {
            req.extensions_mut().insert(Trusted);
        }
        // Only a body can fail: a request without one (most reads) keeps
        // no slot for its failure.
        let failure = frames
            .as_ref()
            .map(|_| Arc::new(std::sync::Mutex::new(None)));
        let body = match (frames, &failure) {
            (Some(frames), Some(failure)) => s3s::Body::http_body_unsync(LocalBody {
                frames,
                left: len,
                failure: failure.clone(),
            }),
            _ => s3s::Body::empty(),
        };
        let resp = store.call(req.map(|()| body)).await;
        // The store has read all of the body it will read: a failure of
        // fencegate's stream is recorded by now.
        let failed = failure.and_then(|f| f.lock().expect("never poisoned").take());
        match failed {
            Some(e) => Err(e),
            None => Ok(resp.map(AnswerBody::InProcess)),
        }
    }
}

/// A request body handed to the embedded store: its exact length known
/// (the store and s3s see what a socket's `Content-Length` told them), and
/// its stream's failure kept for the caller.
struct LocalBody {
    frames: FrameStream,
    left: Option<u64>,
    failure: Arc<std::sync::Mutex<Option<S3Error>>>,
}

impl http_body::Body for LocalBody {
    type Data = Bytes;
    type Error = S3Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, S3Error>>> {
        let polled = ready!(self.frames.as_mut().poll_next(cx));
        match &polled {
            Some(Ok(frame)) => {
                if let (Some(left), Some(d)) = (&mut self.left, frame.data_ref()) {
                    *left = left.saturating_sub(d.len() as u64);
                }
            }
            Some(Err(e)) => *self.failure.lock().expect("never poisoned") = Some(e.clone()),
            None => {}
        }
        Poll::Ready(polled)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.left {
            Some(n) => http_body::SizeHint::with_exact(n),
            None => http_body::SizeHint::default(),
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
    /// and session token, the headers fencegate writes itself from what
    /// it parsed (the copy source among them), and the replicas' own.
    #[test]
    fn dropped_headers_never_go_upstream() {
        let mut from = HeaderMap::new();
        for name in HOP_BY_HOP.iter().chain(&DROPPED) {
            from.append(name.clone(), HeaderValue::from_static("client"));
        }
        // As a client spells them: parsed, not built from the constants.
        // The replicas' own headers among them: a relayed request reached
        // the backend with `x-fencegate-relayed` once.
        for name in [
            "Transfer-Encoding",
            "X-Amz-Copy-Source",
            "Keep-Alive",
            "X-Fencegate-Forwarded",
            "X-Fencegate-Relayed",
            "X-Fencegate-Ping",
            "X-Fencegate-Landed",
        ] {
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
