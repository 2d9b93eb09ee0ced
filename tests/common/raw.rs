//! A hand-driven S3 client for tests that need control no SDK gives: each
//! payload form (unsigned, hex SHA-256, aws-chunked signed), bodies fed by
//! the test at its own pace, damaged signatures, bytes and clocks. Signing
//! is done by the aws-sigv4 crate, independently of fencegate's verifier.
//! The bodies and their encodings on the wire are `raw_body`'s.

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningInstructions,
    SigningSettings, UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::time::{Duration, SystemTime};

pub use super::raw_body::{Damage, Form, Source};
use super::raw_body::{payload_headers, wire_stream};

type WireBody = UnsyncBoxBody<Bytes, std::io::Error>;

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

    /// A DeleteObjects (`POST <bucket>?delete`) with `body` as its XML.
    pub fn delete_objects(bucket: &str, body: impl Into<Bytes>) -> RawRequest {
        let mut r = RawRequest::new(Method::POST, bucket);
        r.query = "delete".into();
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

    /// `base` + `path`, with `?query` when there is one.
    fn url(&self, path: &str, query: &str) -> String {
        if query.is_empty() {
            format!("{}{}", self.base, path)
        } else {
            format!("{}{}?{}", self.base, path, query)
        }
    }

    pub async fn send(&self, mut req: RawRequest) -> Result<RawResponse, String> {
        let url = self.url(&req.path, &req.query);
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
        let content_sha = payload_headers(req.body.as_ref(), req.form, &mut headers);
        if req.presign.is_none() {
            headers.push(("x-amz-content-sha256".into(), content_sha.clone()));
        }

        let identity: Identity = Credentials::new(&req.key, &req.secret, None, None, "test").into();
        let (instructions, seed) = self.sign_request(&req, &headers, content_sha, &identity);

        let body: WireBody = match req.body.take() {
            None => http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed_unsync(),
            Some(src) => {
                let wire = wire_stream(src, req.form, seed, identity.clone(), req.time, req.damage);
                BodyExt::boxed_unsync(StreamBody::new(wire))
            }
        };
        let mut builder = Request::builder().method(req.method.clone()).uri(&url);
        for (k, v) in &headers {
            if k != "host" || req.host.is_some() {
                builder = builder.header(k, v);
            }
        }
        let mut http_req = builder.body(body).unwrap();
        instructions.apply_to_request_http1x(&mut http_req);
        change_after_signing(&req, &mut http_req);
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

    /// Signs `req` with `headers` and the payload hash `content_sha`: in
    /// the Authorization header, or as a presigned URL when `req.presign`
    /// says so. Returns what to add to the request, and the signature (the
    /// seed of an aws-chunked body's chunk signatures).
    fn sign_request(
        &self,
        req: &RawRequest,
        headers: &[(String, String)],
        content_sha: String,
        identity: &Identity,
    ) -> (SigningInstructions, String) {
        let mut presign_params = v4_params(identity, req.time);
        if let Some(expiry) = req.presign {
            let mut settings = presign_settings();
            settings.expires_in = Some(expiry);
            presign_params = v4::SigningParams::builder()
                .identity(identity)
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
            SignableBody::Precomputed(content_sha)
        };
        // The wire carries `req.path` byte for byte (`..`, `//`, `%2F` and
        // all); the signature covers its canonical form.
        let signing_url = self.url(&canonical_path(&req.path), &req.query);
        let signable = SignableRequest::new(
            req.method.as_str(),
            signing_url.as_str(),
            headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            signable_body,
        )
        .unwrap();
        sign(signable, &params).unwrap().into_parts()
    }
}

/// Makes the changes `req` asks for after signing: text appended to the
/// query, the signature's last digit changed, headers set.
fn change_after_signing<B>(req: &RawRequest, http_req: &mut Request<B>) {
    if !req.query_after_signing.is_empty() {
        let uri = http_req.uri().to_string();
        let sep = if uri.contains('?') { '&' } else { '?' };
        *http_req.uri_mut() = format!("{uri}{sep}{}", req.query_after_signing)
            .parse()
            .unwrap();
    }
    if req.last_signature_digit_changed {
        change_last_signature_digit(http_req);
    }
    for (k, v) in &req.after_signing {
        http_req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
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

pub(super) fn v4_params(
    identity: &Identity,
    time: SystemTime,
) -> v4::SigningParams<'_, SigningSettings> {
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
