//! The embedded default backend: fencegate's own object store (`store`)
//! behind s3s, called in-process. fencegate hands it the request it built
//! for a backend ([`InProcess::call`]): no socket, no HTTP parse, and no
//! second signature, since nothing but fencegate can reach it. Nothing on
//! the wire can mark a request as fencegate's own: the mark is a request
//! extension ([`Trusted`]), so an anonymous read stays anonymous and the
//! store refuses it, as a store on a socket would.
//!
//! A plain GET or HEAD (the whole object, nothing else asked) is answered
//! without s3s ([`super::plain_read`]), as s3s would have answered it.
//!
//! One form is still signed: a body with checksum trailers
//! (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`), because s3s decodes aws-chunked
//! and hands the store its trailers only for a request it authenticated.
//!
//! The same store can be served alone on a socket ([`serve`]:
//! `fencegate bench store`, and the tests of the store straight). Its
//! credential is kept in the data directory (`embedded.key`, mode 0600), so
//! an operator can serve it for repairs with a stable key.
//!
//! The store keeps its index and blobs in `<data_dir>/store/`. A data
//! directory the earlier default (s3s-fs) wrote, `<data_dir>/objects/`, is
//! imported on the first start (`store/import.rs`).

use super::plain_read;
use super::target::BackendTarget;
use crate::s3::headers::number_value;
use crate::store::Store;
use http::header::{CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use rand::RngExt;
use s3s::access::{S3Access, S3AccessContext};
use s3s::auth::SimpleAuth;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{S3Result, s3_error};
use std::path::Path;
use tokio::net::TcpListener;

fn random_token(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The embedded store's credential: read from `path`, or made and saved
/// there on first start.
fn credential(path: &Path) -> Result<(String, String), String> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let mut lines = text.lines();
        return match (lines.next(), lines.next()) {
            (Some(k), Some(s)) if !k.is_empty() && !s.is_empty() => Ok((k.into(), s.into())),
            _ => Err(format!(
                "{} is damaged: remove it to make a new one",
                path.display()
            )),
        };
    }
    let key = (format!("EMB{}", random_token(17)), random_token(40));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    std::io::Write::write_all(&mut f, format!("{}\n{}\n", key.0, key.1).as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(key)
}

/// Marks an in-process request as fencegate's own, signed or not. Only
/// code can set a request extension; a request from the wire never has it.
#[derive(Clone, Copy)]
pub struct Trusted;

/// Who may call the store: a request signed with its credential, or one
/// fencegate marked as its own. Anything else is anonymous, and refused.
struct SignedOrTrusted;

#[async_trait::async_trait]
impl S3Access for SignedOrTrusted {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        if cx.credentials().is_some() || cx.extensions_mut().get::<Trusted>().is_some() {
            return Ok(());
        }
        Err(s3_error!(AccessDenied, "Signature is required"))
    }
}

fn service(store: Store, access_key_id: String, secret: String) -> S3Service {
    let mut b = S3ServiceBuilder::new(store);
    b.set_auth(SimpleAuth::from_single(access_key_id, secret));
    b.set_access(SignedOrTrusted);
    b.build()
}

/// The store as fencegate calls it, in-process.
#[derive(Clone)]
pub struct InProcess {
    service: S3Service,
    store: Store,
}

impl InProcess {
    /// The store's answer to `req`: what it would have answered on a
    /// socket, with no socket. `req` carries [`Trusted`] unless it is to be
    /// judged as anonymous. A plain read is answered without s3s
    /// (`plain_read.rs`), with what s3s would have answered.
    pub async fn call(&self, req: http::Request<s3s::Body>) -> s3s::HttpResponse {
        let trusted = req.extensions().get::<Trusted>().is_some();
        if trusted
            && let Some(read) = plain_read::plain(&req)
            && let Some(resp) = plain_read::answer(&self.store, &read).await
        {
            return as_s3_answers(false, resp).await;
        }
        self.call_through_s3s(req).await
    }

    /// [`InProcess::call`] with every request through s3s, plain reads
    /// too: the answer a plain read must equal (tests/plain_reads.rs).
    pub async fn call_through_s3s(&self, req: http::Request<s3s::Body>) -> s3s::HttpResponse {
        let head = req.method() == http::Method::HEAD;
        let resp = match self.service.call(req).await {
            Ok(resp) => resp,
            // s3s renders every S3 error itself: what is left is its own
            // failure, which a socket would have shown as a broken answer.
            Err(e) => {
                tracing::error!("embedded store: {e:?}");
                let mut resp = http::Response::new(s3s::Body::empty());
                *resp.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                resp
            }
        };
        let mut resp = as_s3_answers(head, resp).await;
        // What hyper writes on a socket from the body's exact size, for a
        // HEAD too (an error's length: its body is not sent).
        let exact = http_body::Body::size_hint(resp.body()).exact();
        if let (false, Some(n)) = (resp.headers().contains_key(CONTENT_LENGTH), exact) {
            resp.headers_mut().insert(CONTENT_LENGTH, number_value(n));
        }
        resp
    }
}

/// Serves `store` as S3 on `listener` to the one credential given, until
/// the process ends: the store alone, for `fencegate bench store`, tests,
/// and repairs.
pub async fn serve(listener: TcpListener, store: Store, access_key_id: String, secret: String) {
    let service = service(store, access_key_id, secret);
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let _ = sock.set_nodelay(true);
        let service = service.clone();
        let service = hyper::service::service_fn(move |req: http::Request<_>| {
            let head = req.method() == http::Method::HEAD;
            let s3 = service.clone();
            async move {
                let resp = s3.call(req.map(s3s::Body::from)).await?;
                Ok::<_, s3s::HttpError>(as_s3_answers(head, resp).await)
            }
        });
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(sock), service)
                .await;
        });
    }
}

/// Where s3s's answer differs from S3's in what a client sees:
/// - every answer has an `x-amz-request-id`, and an error body names it in
///   `<RequestId>` (SDKs report it; s3s writes neither);
/// - a HEAD of a range is `206`, as its GET is: s3s writes the
///   `Content-Range` of a HEAD but leaves its status `200`.
async fn as_s3_answers(head: bool, mut resp: s3s::HttpResponse) -> s3s::HttpResponse {
    let id = format!("{:016X}", rand::random::<u64>());
    let value = http::HeaderValue::from_str(&id).expect("hex is a header value");
    resp.headers_mut().insert("x-amz-request-id", value);
    let status = resp.status();
    if head && status == http::StatusCode::OK && resp.headers().contains_key(CONTENT_RANGE) {
        *resp.status_mut() = http::StatusCode::PARTIAL_CONTENT;
    }
    let xml = (resp.headers().get(CONTENT_TYPE)).is_some_and(|v| v.as_bytes().ends_with(b"/xml"));
    if head || status.as_u16() < 400 || !xml {
        return resp;
    }
    // An error body is a few hundred bytes: read whole, the id put in.
    let (mut parts, body) = resp.into_parts();
    let limited = http_body_util::Limited::new(body, 64 * 1024);
    let Ok(body) = http_body_util::BodyExt::collect(limited).await else {
        return http::Response::from_parts(parts, s3s::Body::empty());
    };
    let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    let text = match text.rfind("</Error>") {
        Some(at) if !text.contains("<RequestId>") => {
            format!("{}<RequestId>{id}</RequestId>{}", &text[..at], &text[at..])
        }
        _ => text,
    };
    parts
        .headers
        .insert(CONTENT_LENGTH, number_value(text.len() as u64));
    http::Response::from_parts(parts, s3s::Body::from(text))
}

/// Opens the store on `data_dir` (recovering what a crash left) with its
/// credential.
fn open_store(data_dir: &Path) -> Result<(Store, (String, String)), String> {
    let legacy = data_dir.join("objects");
    let store_dir = data_dir.join("store");
    let store = tokio::task::block_in_place(|| Store::open(&store_dir, Some(&legacy)))?;
    store.spawn_recovery();
    Ok((store, credential(&data_dir.join("embedded.key"))?))
}

/// Opens the embedded store on `data_dir` for fencegate to call in-process:
/// the caller, its credential (for the one signed form), and the store
/// (for readiness).
pub fn open(data_dir: &Path) -> Result<(InProcess, (String, String), Store), String> {
    let (store, (key, secret)) = open_store(data_dir)?;
    let service = service(store.clone(), key.clone(), secret.clone());
    let in_process = InProcess {
        service,
        store: store.clone(),
    };
    Ok((in_process, (key, secret), store))
}

/// Opens the embedded store on `data_dir` and serves it alone on a
/// loopback port: how to reach it, and the store.
pub async fn start(data_dir: &Path, region: &str) -> Result<(BackendTarget, Store), String> {
    let (store, (access_key_id, secret_access_key)) = open_store(data_dir)?;
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| format!("embedded store: cannot listen: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("embedded store: {e}"))?;
    tokio::spawn(serve(
        listener,
        store.clone(),
        access_key_id.clone(),
        secret_access_key.clone(),
    ));
    let target = BackendTarget {
        endpoint: format!("http://{addr}")
            .parse()
            .map_err(|e| format!("{e}"))?,
        region: region.to_string(),
        access_key_id,
        secret_access_key,
        virtual_host: false,
    };
    Ok((target, store))
}
