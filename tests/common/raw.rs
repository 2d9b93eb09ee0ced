//! A hand-driven S3 client for tests that need control no SDK gives: each
//! payload form (unsigned, hex SHA-256, aws-chunked signed), bodies fed by
//! the test at its own pace, damaged signatures, bytes and clocks. Signing
//! is done by the aws-sigv4 crate, independently of fencegate's verifier.

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use std::pin::Pin;
use std::time::{Duration, SystemTime};

pub type ByteStream = Pin<Box<dyn Stream<Item = Bytes> + Send>>;
type WireBody = UnsyncBoxBody<Bytes, std::io::Error>;

pub const CHUNK: usize = 64 * 1024;

/// How the payload is signed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    Unsigned,
    Sha256,
    /// STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER] with 64 KiB chunks.
    Chunked {
        trailer: bool,
    },
    /// STREAMING-UNSIGNED-PAYLOAD-TRAILER with a SHA-256 trailer, sent with
    /// `Transfer-Encoding: chunked` and no Content-Length, as botocore does.
    UnsignedTrailer,
}

/// A body: its decoded length, its bytes as a stream, and (for the SHA-256
/// form) its hash.
pub struct Source {
    pub len: u64,
    pub sha256: Option<String>,
    pub stream: ByteStream,
}

impl Source {
    pub fn bytes(b: impl Into<Bytes>) -> Source {
        let b: Bytes = b.into();
        Source {
            len: b.len() as u64,
            sha256: Some(hex::encode(Sha256::digest(&b))),
            stream: Box::pin(futures_util::stream::iter(if b.is_empty() {
                vec![]
            } else {
                vec![b]
            })),
        }
    }

    /// `len` bytes of a repeating pattern, generated as they are sent.
    pub fn pattern(len: u64, with_hash: bool) -> Source {
        let block = Bytes::from((0..CHUNK).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        let pieces = |block: Bytes| {
            let full = len / CHUNK as u64;
            let rest = (len % CHUNK as u64) as usize;
            futures_util::stream::iter(0..full)
                .map(move |_| block.clone())
                .chain(futures_util::stream::iter(if rest > 0 {
                    vec![Bytes::from(
                        (0..rest).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
                    )]
                } else {
                    vec![]
                }))
        };
        let sha256 = with_hash.then(|| {
            let mut h = Sha256::new();
            let full = len / CHUNK as u64;
            for _ in 0..full {
                h.update(&block[..]);
            }
            let rest = (len % CHUNK as u64) as usize;
            h.update((0..rest).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
            hex::encode(h.finalize())
        });
        Source {
            len,
            sha256,
            stream: Box::pin(pieces(block.clone())),
        }
    }

    /// A body the test feeds through the returned sender.
    pub fn channel(len: u64) -> (tokio::sync::mpsc::Sender<Bytes>, Source) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|b| (b, rx)) },
            );
        (
            tx,
            Source {
                len,
                sha256: None,
                stream: Box::pin(stream),
            },
        )
    }
}

/// Damage applied to the bytes on the wire.
#[derive(Clone, Copy, Debug, Default)]
pub struct Damage {
    /// Flip the byte at this offset of the encoded body.
    pub flip_at: Option<u64>,
    /// Send only this many bytes of the encoded body, then break off.
    pub cut_at: Option<u64>,
}

pub struct RawRequest {
    pub method: Method,
    /// Encoded path, e.g. `/bucket/key`.
    pub path: String,
    /// Encoded query string without `?`.
    pub query: String,
    pub headers: Vec<(String, String)>,
    pub form: Form,
    pub body: Option<Source>,
    pub time: SystemTime,
    pub key: String,
    pub secret: String,
    pub damage: Damage,
    /// Headers changed after signing.
    pub after_signing: Vec<(String, String)>,
    /// Sign as a presigned URL valid this long (query parameters), instead
    /// of the Authorization header.
    pub presign: Option<Duration>,
    /// Raw text appended to the query after signing.
    pub query_after_signing: String,
    /// Host header to send (and sign) instead of the endpoint's.
    pub host: Option<String>,
    /// Change the last hex digit of the signature after signing (in the
    /// Authorization header, or a presigned URL's X-Amz-Signature).
    pub last_signature_digit_changed: bool,
}

impl RawRequest {
    pub fn new(method: Method, path: &str) -> RawRequest {
        RawRequest {
            method,
            path: path.into(),
            query: String::new(),
            headers: vec![],
            form: Form::Unsigned,
            body: None,
            time: SystemTime::now(),
            key: super::fencegate::DEMO_KEY.into(),
            secret: super::fencegate::DEMO_SECRET.into(),
            damage: Damage::default(),
            after_signing: vec![],
            presign: None,
            query_after_signing: String::new(),
            host: None,
            last_signature_digit_changed: false,
        }
    }

    pub fn put(path: &str, body: impl Into<Bytes>) -> RawRequest {
        let mut r = RawRequest::new(Method::PUT, path);
        r.body = Some(Source::bytes(body));
        r
    }

    pub fn header(mut self, name: &str, value: &str) -> RawRequest {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn token(self, t: u64) -> RawRequest {
        self.header("x-fencing-token", &t.to_string())
    }
}

#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl RawResponse {
    /// The S3 error code in the body, if any.
    pub fn code(&self) -> Option<&str> {
        let start = self.body.find("<Code>")? + 6;
        let end = self.body[start..].find("</Code>")? + start;
        Some(&self.body[start..end])
    }
}

pub struct RawClient {
    base: String,
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, WireBody>,
}

fn chunk_sig_len() -> u64 {
    ";chunk-signature=".len() as u64 + 64
}

/// Encoded length of a signed aws-chunked body in CHUNK-sized chunks.
fn signed_chunked_len(len: u64, trailer: Option<&str>) -> u64 {
    let piece = |n: u64| format!("{n:x}").len() as u64 + chunk_sig_len() + 2 + n + 2;
    let full = len / CHUNK as u64;
    let rest = len % CHUNK as u64;
    let mut total = full * piece(CHUNK as u64) + if rest > 0 { piece(rest) } else { 0 };
    total += 1 + chunk_sig_len() + 2; // final chunk header
    match trailer {
        None => total + 2,
        Some(line) => {
            total + line.len() as u64 + 2 + "x-amz-trailer-signature:".len() as u64 + 64 + 2 + 2
        }
    }
}

impl RawClient {
    pub fn new(endpoint: &str) -> RawClient {
        Self::with_ca(endpoint, None)
    }

    /// A client that trusts `ca_pem` (a PEM file) for `https://` endpoints.
    pub fn with_ca(endpoint: &str, ca_pem: Option<&std::path::Path>) -> RawClient {
        let tls = match ca_pem {
            Some(p) => fencegate::tls::client_config_with(p).unwrap(),
            None => fencegate::tls::client_config_without_roots().unwrap(),
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        RawClient {
            base: endpoint.trim_end_matches('/').to_string(),
            http: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    pub async fn send(&self, req: RawRequest) -> Result<RawResponse, String> {
        let url = if req.query.is_empty() {
            format!("{}{}", self.base, req.path)
        } else {
            format!("{}{}?{}", self.base, req.path, req.query)
        };
        let host = url
            .split("://")
            .nth(1)
            .unwrap()
            .split('/')
            .next()
            .unwrap()
            .to_string();
        let host = req.host.clone().unwrap_or(host);
        let mut headers: Vec<(String, String)> = vec![("host".into(), host)];
        headers.extend(req.headers.iter().cloned());
        let trailer_line = "x-amz-checksum-sha256:".to_string();
        let (content_sha, wire_len) = match (&req.body, req.form) {
            (None, _) => ("UNSIGNED-PAYLOAD".to_string(), Some(0)),
            (Some(s), Form::Unsigned) => ("UNSIGNED-PAYLOAD".to_string(), Some(s.len)),
            (Some(s), Form::Sha256) => (s.sha256.clone().expect("hash"), Some(s.len)),
            (Some(s), Form::Chunked { trailer: false }) => {
                headers.push(("content-encoding".into(), "aws-chunked".into()));
                headers.push(("x-amz-decoded-content-length".into(), s.len.to_string()));
                (
                    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD".to_string(),
                    Some(signed_chunked_len(s.len, None)),
                )
            }
            (Some(s), Form::UnsignedTrailer) => {
                headers.push(("content-encoding".into(), "aws-chunked".into()));
                headers.push(("x-amz-decoded-content-length".into(), s.len.to_string()));
                headers.push(("x-amz-trailer".into(), "x-amz-checksum-sha256".into()));
                ("STREAMING-UNSIGNED-PAYLOAD-TRAILER".to_string(), None)
            }
            (Some(s), Form::Chunked { trailer: true }) => {
                headers.push(("content-encoding".into(), "aws-chunked".into()));
                headers.push(("x-amz-decoded-content-length".into(), s.len.to_string()));
                headers.push(("x-amz-trailer".into(), "x-amz-checksum-sha256".into()));
                let line = format!("{trailer_line}{}", "A".repeat(44));
                (
                    "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER".to_string(),
                    Some(signed_chunked_len(s.len, Some(&line))),
                )
            }
        };
        if let Some(n) = wire_len {
            headers.push(("content-length".into(), n.to_string()));
        }
        if req.presign.is_none() {
            headers.push(("x-amz-content-sha256".into(), content_sha.clone()));
        }

        let identity: Identity = Credentials::new(&req.key, &req.secret, None, None, "test").into();
        let mut presign_params = v4_params(&identity, req.time);
        if let Some(expiry) = req.presign {
            let mut settings = presign_settings();
            settings.expires_in = Some(expiry);
            presign_params = v4::SigningParams::builder()
                .identity(&identity)
                .region("us-east-1")
                .name("s3")
                .time(req.time)
                .settings(settings)
                .build()
                .unwrap();
        }
        let params = presign_params.into();
        let signable_body = if req.presign.is_some() {
            SignableBody::UnsignedPayload
        } else {
            SignableBody::Precomputed(content_sha.clone())
        };
        // The wire carries `req.path` byte for byte (`..`, `//`, `%2F` and
        // all); the signature covers its canonical form.
        let signing_url = if req.query.is_empty() {
            format!("{}{}", self.base, canonical_path(&req.path))
        } else {
            format!("{}{}?{}", self.base, canonical_path(&req.path), req.query)
        };
        let signable = SignableRequest::new(
            req.method.as_str(),
            signing_url.as_str(),
            headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            signable_body,
        )
        .unwrap();
        let (instructions, seed) = sign(signable, &params).unwrap().into_parts();

        let body: WireBody = match req.body {
            None => http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
            Some(src) => {
                let wire: ByteStream = match req.form {
                    Form::Chunked { trailer } => {
                        signed_chunks(src, seed, identity.clone(), req.time, trailer)
                    }
                    Form::UnsignedTrailer => unsigned_trailer_chunks(src),
                    _ => src.stream,
                };
                let damaged = damage(wire, req.damage);
                BodyExt::boxed_unsync(StreamBody::new(damaged))
            }
        };
        let mut builder = Request::builder().method(req.method).uri(&url);
        for (k, v) in &headers {
            if k != "host" || req.host.is_some() {
                builder = builder.header(k, v);
            }
        }
        let mut http_req = builder.body(body).unwrap();
        instructions.apply_to_request_http1x(&mut http_req);
        if !req.query_after_signing.is_empty() {
            let uri = http_req.uri().to_string();
            let sep = if uri.contains('?') { '&' } else { '?' };
            *http_req.uri_mut() = format!("{uri}{sep}{}", req.query_after_signing)
                .parse()
                .unwrap();
        }
        if req.last_signature_digit_changed {
            change_last_signature_digit(&mut http_req);
        }
        for (k, v) in &req.after_signing {
            http_req.headers_mut().insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let resp = tokio::time::timeout(Duration::from_secs(600), self.http.request(http_req))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| format!("request failed: {e:?}"))?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        Ok(RawResponse {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// Changes the last hex digit of a signed request's signature: every other
/// byte of the request, and of the signature, stays as signed.
fn change_last_signature_digit<B>(req: &mut Request<B>) {
    let other = |c: char| if c == '0' { '1' } else { '0' };
    if let Some(v) = req.headers().get(http::header::AUTHORIZATION) {
        let mut v = v.to_str().unwrap().to_string();
        let last = v.pop().unwrap();
        v.push(other(last));
        req.headers_mut()
            .insert(http::header::AUTHORIZATION, v.parse().unwrap());
        return;
    }
    let uri = req.uri().to_string();
    let at = uri.find("X-Amz-Signature=").expect("a signature") + "X-Amz-Signature=".len() + 63;
    let mut changed = uri.clone();
    let last = uri[at..].chars().next().unwrap();
    changed.replace_range(at..at + 1, &other(last).to_string());
    *req.uri_mut() = changed.parse().unwrap();
}

/// The canonical URI SigV4 signs for S3 (and fencegate verifies): the path
/// percent-decoded, then every byte but the unreserved ones and `/`
/// encoded as `%XX`. No `.`/`..` or `//` normalisation: S3 keys keep them.
/// aws-sigv4 (single-encoding mode) signs the path it is given as it is, so
/// a raw path such as `/b/a%2Fb`, `/b/a+b` or `/b/%2e/k` must be signed in
/// this form while it goes on the wire untouched.
pub fn canonical_path(raw: &str) -> String {
    let decoded: Vec<u8> = percent_encoding::percent_decode_str(raw).collect();
    let mut out = String::with_capacity(decoded.len() * 3);
    for b in decoded {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() { "/".into() } else { out }
}

/// A presigned URL for `method` on `base` + `path?query` with the demo
/// credential, valid five minutes: what a server hands a browser.
pub fn presigned_url(base: &str, method: &str, path: &str, query: &str) -> String {
    let url = match query {
        "" => format!("{base}{path}"),
        q => format!("{base}{path}?{q}"),
    };
    let host = url.split("://").nth(1).unwrap().split('/').next().unwrap();
    let identity: Identity = Credentials::new(
        super::fencegate::DEMO_KEY,
        super::fencegate::DEMO_SECRET,
        None,
        None,
        "test",
    )
    .into();
    let mut settings = presign_settings();
    settings.expires_in = Some(Duration::from_secs(300));
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(SystemTime::now())
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let headers = [("host", host)];
    let signable = SignableRequest::new(
        method,
        url.as_str(),
        headers.into_iter(),
        SignableBody::UnsignedPayload,
    )
    .unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    let mut req = Request::builder()
        .method(method)
        .uri(&url)
        .body(())
        .unwrap();
    instructions.apply_to_request_http1x(&mut req);
    req.uri().to_string()
}

fn presign_settings() -> SigningSettings {
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    settings.signature_location = aws_sigv4::http_request::SignatureLocation::QueryParams;
    settings
}

fn v4_params(identity: &Identity, time: SystemTime) -> v4::SigningParams<'_, SigningSettings> {
    let mut settings = SigningSettings::default();
    settings.percent_encoding_mode = PercentEncodingMode::Single;
    settings.payload_checksum_kind = PayloadChecksumKind::NoHeader;
    settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    v4::SigningParams::builder()
        .identity(identity)
        .region("us-east-1")
        .name("s3")
        .time(time)
        .settings(settings)
        .build()
        .unwrap()
}

/// Re-chunks `src` into CHUNK-sized signed chunks, signing as it goes.
fn signed_chunks(
    src: Source,
    seed: String,
    identity: Identity,
    time: SystemTime,
    trailer: bool,
) -> ByteStream {
    struct St {
        input: ByteStream,
        buf: BytesMut,
        prev: String,
        identity: Identity,
        time: SystemTime,
        hasher: Sha256,
        done: bool,
        trailer: bool,
    }
    fn chunk(st: &mut St, data: Bytes) -> Bytes {
        let sig = v4::sign_chunk(&data, &st.prev, &v4_params(&st.identity, st.time))
            .unwrap()
            .signature()
            .to_string();
        st.prev = sig.clone();
        let mut out = BytesMut::with_capacity(data.len() + 100);
        out.extend_from_slice(format!("{:x};chunk-signature={sig}\r\n", data.len()).as_bytes());
        out.extend_from_slice(&data);
        if !data.is_empty() || !st.trailer {
            out.extend_from_slice(b"\r\n");
        }
        out.freeze()
    }
    let st = St {
        input: src.stream,
        buf: BytesMut::new(),
        prev: seed,
        identity,
        time,
        hasher: Sha256::new(),
        done: false,
        trailer,
    };
    Box::pin(futures_util::stream::unfold(st, |mut st| async move {
        loop {
            if st.done {
                return None;
            }
            if st.buf.len() >= CHUNK {
                let data = st.buf.split_to(CHUNK).freeze();
                let c = chunk(&mut st, data);
                return Some((c, st));
            }
            match st.input.next().await {
                Some(b) => {
                    st.hasher.update(&b);
                    st.buf.extend_from_slice(&b);
                }
                None => {
                    st.done = true;
                    let mut out = BytesMut::new();
                    if !st.buf.is_empty() {
                        let data = st.buf.split().freeze();
                        out.extend_from_slice(&chunk(&mut st, data));
                    }
                    out.extend_from_slice(&chunk(&mut st, Bytes::new()));
                    if st.trailer {
                        use base64::Engine;
                        let sum = base64::engine::general_purpose::STANDARD
                            .encode(std::mem::take(&mut st.hasher).finalize());
                        let mut h = aws_smithy_runtime_api::http::Headers::new();
                        h.insert("x-amz-checksum-sha256", sum.clone());
                        let sig = v4::sign_trailer(&h, &st.prev, &v4_params(&st.identity, st.time))
                            .unwrap()
                            .signature()
                            .to_string();
                        out.extend_from_slice(
                            format!(
                                "x-amz-checksum-sha256:{sum}\r\nx-amz-trailer-signature:{sig}\r\n\r\n"
                            )
                            .as_bytes(),
                        );
                    }
                    return Some((out.freeze(), st));
                }
            }
        }
    }))
}

/// Unsigned aws-chunked: each piece of `src` one chunk, then a SHA-256 trailer.
fn unsigned_trailer_chunks(src: Source) -> ByteStream {
    use base64::Engine;
    let hasher = std::sync::Arc::new(std::sync::Mutex::new(Sha256::new()));
    let h2 = hasher.clone();
    let chunks = src.stream.map(move |b| {
        h2.lock().unwrap().update(&b);
        let mut out = BytesMut::new();
        out.extend_from_slice(format!("{:x}\r\n", b.len()).as_bytes());
        out.extend_from_slice(&b);
        out.extend_from_slice(b"\r\n");
        out.freeze()
    });
    let tail = futures_util::stream::once(async move {
        let sum = base64::engine::general_purpose::STANDARD
            .encode(std::mem::take(&mut *hasher.lock().unwrap()).finalize());
        Bytes::from(format!("0\r\nx-amz-checksum-sha256:{sum}\r\n\r\n"))
    });
    Box::pin(chunks.chain(tail))
}

/// Applies `d` to a wire stream; a cut ends the stream with an I/O error.
fn damage(
    wire: ByteStream,
    d: Damage,
) -> impl Stream<Item = Result<http_body::Frame<Bytes>, std::io::Error>> + Send {
    let mut offset = 0u64;
    let mut cut = false;
    wire.map(move |b| {
        let start = offset;
        offset += b.len() as u64;
        let mut b = b;
        if let Some(at) = d.flip_at
            && at >= start
            && at < offset
        {
            let mut m = BytesMut::from(&b[..]);
            m[(at - start) as usize] ^= 0x01;
            b = m.freeze();
        }
        (start, b)
    })
    .take_while(move |(start, _)| {
        let go = !cut;
        if let Some(at) = d.cut_at
            && *start >= at
        {
            cut = true;
        }
        std::future::ready(go || d.cut_at.is_none())
    })
    .map(move |(start, b)| {
        if let Some(at) = d.cut_at {
            if start >= at {
                return Err(std::io::Error::other("cut"));
            }
            if start + b.len() as u64 > at {
                return Ok(http_body::Frame::data(b.slice(..(at - start) as usize)));
            }
        }
        Ok(http_body::Frame::data(b))
    })
}
