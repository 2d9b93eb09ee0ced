//! The floor under fencegate's CPU per request (docs/benchmarks-log.md, "What the
//! throughput target asks"): a proxy on fencegate's libraries that does
//! none of fencegate's work. It has hyper's HTTP/1 server with the same
//! timer and header-read timeout, fencegate's backend pool
//! (`upstream::pool`) and jemalloc, but tokio's default (work-stealing)
//! runtime, where fencegate runs a single-threaded runtime per serving
//! thread (`workers`). Each request goes to the backend
//! as it came, with its headers, and the answer comes back: no signature
//! checked or made, no fence, no log line, no metric.
//!
//! `scripts/bench-wrk` runs it as the path `floor`. What fencegate costs
//! above it is fencegate's work; what it costs itself is what any proxy on
//! this stack pays.
//!
//! With `FLOOR_SIGV4` set (to any value) it also does the one part of
//! fencegate's work no fencing proxy can skip, with fencegate's own code:
//! it checks the client's SigV4 signature (`s3::auth::verify`, the demo
//! credential), checks a body signed by its SHA-256 against that hash as
//! it streams (`s3::body::sha256_checked`, its last bytes held back until
//! the check passes: `fence::body_gate::body_gate`, without a permit), and
//! re-signs the request for the backend (`s3::sign::HeaderSigner`, the
//! sink's credential), and nothing else (path `floor+sigv4`).
//!
//!     cargo run --release --example floor_proxy -- 127.0.0.1:PORT http://BACKEND

use fencegate::config::Credential;
use fencegate::fence::body_gate::body_gate;
use fencegate::s3::auth::{self, Credentials};
use fencegate::s3::error::S3Error;
use fencegate::s3::sign::HeaderSigner;
use fencegate::s3::sigv4::Head;
use fencegate::upstream::pool::{Pool, UpstreamBody};
use http_body_util::{BodyExt, StreamBody};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::time::Duration;

/// The longest wait for the next piece of a request's body.
const IDLE: Duration = Duration::from_secs(60);

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(listen), Some(backend)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: floor_proxy LISTEN_ADDR BACKEND_URL");
        std::process::exit(2);
    };
    let backend: Uri = backend.parse().expect("a backend URL");
    // FLOOR_SPIN_US: CPU burnt per request before forwarding it, to see how
    // the costs of the rest of the path (the kernel's, the backend's)
    // change with the work a proxy does per request.
    let spin = std::env::var("FLOOR_SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_micros);
    let sigv4 = std::env::var_os("FLOOR_SIGV4").is_some().then(|| {
        let client = Credentials::new(&[Credential {
            access_key_id: "fencegate-demo".into(),
            secret_access_key: "fencegate-demo-secret-key".into(),
            buckets: vec!["*".into()],
            bucket_admin: false,
        }]);
        Arc::new((
            client,
            HeaderSigner::new("sink", "sink-secret", "us-east-1"),
        ))
    });
    let tls = fencegate::tls::client_config_without_roots().expect("a TLS config");
    let pool = Arc::new(Pool::new(tls, backend, Duration::from_secs(30)));
    let listener = tokio::net::TcpListener::bind(listen.as_str())
        .await
        .expect("bind");
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(60));
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let _ = sock.set_nodelay(true);
        let (pool, http, sigv4) = (pool.clone(), http.clone(), sigv4.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let (pool, sigv4) = (pool.clone(), sigv4.clone());
                async move {
                    if let Some(spin) = spin {
                        let until = std::time::Instant::now() + spin;
                        while std::time::Instant::now() < until {
                            std::hint::spin_loop();
                        }
                    }
                    let (mut head, body) = req.into_parts();
                    let mut hash = None;
                    if let Some(keys) = &sigv4 {
                        hash = signatures_only(&mut head, &keys.0, &keys.1)
                            .map_err(|e| std::io::Error::other(e.to_string()))?;
                    }
                    let body: UpstreamBody = match hash {
                        Some(h) => {
                            let bytes = fencegate::s3::body::incoming(body, IDLE);
                            let frames = fencegate::s3::body::sha256_checked(bytes, h);
                            // The last bytes wait for the check, as in
                            // fencegate: a body that fails it never lands.
                            let held = body_gate(frames, None, None, None, |_| {
                                S3Error::ContentSha256Mismatch
                            });
                            StreamBody::new(held).boxed_unsync()
                        }
                        None => body
                            .map_err(|e| S3Error::Internal(e.to_string()))
                            .boxed_unsync(),
                    };
                    let answer = pool.send(Request::from_parts(head, body)).await;
                    answer.map_err(|e| std::io::Error::other(e.to_string()))
                }
            });
            let _ = http.serve_connection(TokioIo::new(sock), svc).await;
        });
    }
}

/// Checks the client's signature and re-signs the head for the backend, as
/// fencegate does, and does nothing else: the path without its query goes
/// upstream (a PutObject's whole query is the presigned signature and the
/// token), with the headers it came with. Returns the body's signed
/// SHA-256, for the body to be checked against.
fn signatures_only(
    head: &mut http::request::Parts,
    client: &Credentials,
    backend: &HeaderSigner,
) -> Result<Option<[u8; 32]>, S3Error> {
    let now = std::time::SystemTime::now();
    let query = fencegate::s3::query::decode_query(head.uri.query());
    let verified = auth::verify(
        &Head {
            method: head.method.as_str(),
            raw_path: head.uri.path(),
            query: &query,
            headers: &head.headers,
        },
        client,
        "us-east-1",
        now,
    )?;
    let (payload, hash) = match verified.payload {
        auth::Payload::Sha256(hash) => (fencegate::s3::sigv4::hex_lower(&hash), Some(hash)),
        _ => ("UNSIGNED-PAYLOAD".to_string(), None),
    };
    let uri: http::Uri = (head.uri.path().parse()).map_err(|_| S3Error::Internal("path".into()))?;
    let method = head.method.as_str();
    backend.sign(method, uri.path(), &[], &mut head.headers, &payload, now)?;
    head.uri = uri;
    Ok(hash)
}
