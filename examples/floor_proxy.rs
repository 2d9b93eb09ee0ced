//! The floor under fencegate's CPU per request (BENCHMARKS.md, "What the
//! throughput target asks"): a proxy on fencegate's own stack that does
//! none of fencegate's work. It has tokio's default runtime, hyper's HTTP/1
//! server with the same timer and header-read timeout, fencegate's backend
//! pool (`upstream::pool`) and jemalloc. Each request goes to the backend
//! as it came, with its headers, and the answer comes back: no signature
//! checked or made, no fence, no log line, no metric.
//!
//! `scripts/bench-wrk` runs it as the path `floor`. What fencegate costs
//! above it is fencegate's work; what it costs itself is what any proxy on
//! this stack pays.
//!
//!     cargo run --release --example floor_proxy -- 127.0.0.1:PORT http://BACKEND

use fencegate::s3::error::S3Error;
use fencegate::upstream::client::UpstreamBody;
use fencegate::upstream::pool::Pool;
use http_body_util::BodyExt;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::time::Duration;

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
        let (pool, http) = (pool.clone(), http.clone());
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let pool = pool.clone();
                async move {
                    if let Some(spin) = spin {
                        let until = std::time::Instant::now() + spin;
                        while std::time::Instant::now() < until {
                            std::hint::spin_loop();
                        }
                    }
                    let (head, body) = req.into_parts();
                    let body: UpstreamBody = body
                        .map_err(|e| S3Error::Internal(e.to_string()))
                        .boxed_unsync();
                    let answer = pool.send(Request::from_parts(head, body)).await;
                    answer.map_err(|e| std::io::Error::other(e.to_string()))
                }
            });
            let _ = http.serve_connection(TokioIo::new(sock), svc).await;
        });
    }
}
