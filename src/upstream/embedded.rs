//! The embedded default backend: fencegate's own object store (`store`),
//! started in-process on a loopback port with a random credential, so that
//! fencegate forwards to it exactly as it forwards to a real store. The
//! credential is kept in the data directory (`embedded.key`, mode 0600):
//! a new key per start would be harmless today, but a stable one lets an
//! operator reach the store for repairs.
//!
//! The store keeps its index and blobs in `<data_dir>/store/`. A data
//! directory the earlier default (s3s-fs) wrote, `<data_dir>/objects/`, is
//! imported on the first start (`store/import.rs`).

use super::client::BackendTarget;
use crate::store::Store;
use http::header::{CONTENT_RANGE, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use rand::RngExt;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;
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

/// Serves `store` as S3 on `listener` to the one credential given, until
/// the process ends. `fencegate bench store` calls it too.
pub async fn serve(listener: TcpListener, store: Store, access_key_id: String, secret: String) {
    let service = {
        let mut b = S3ServiceBuilder::new(store);
        b.set_auth(SimpleAuth::from_single(access_key_id, secret));
        b.build()
    };
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
        .insert(http::header::CONTENT_LENGTH, text.len().into());
    http::Response::from_parts(parts, s3s::Body::from(text))
}

/// Starts the embedded store on `data_dir` and returns how to reach it,
/// and the store (for readiness).
pub async fn start(data_dir: &Path, region: &str) -> Result<(BackendTarget, Store), String> {
    let legacy = data_dir.join("objects");
    let store_dir = data_dir.join("store");
    let store = tokio::task::block_in_place(|| Store::open(&store_dir, Some(&legacy)))?;
    store.spawn_recovery();
    let (access_key_id, secret_access_key) = credential(&data_dir.join("embedded.key"))?;
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
