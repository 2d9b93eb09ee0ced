//! A store that applies a write some time after its whole body arrived,
//! whether or not its client is still connected, as a loaded store does
//! (issue #56): an HTTP hop in front of a real store (Garage, which ignores
//! conditions; moto, which judges them) that reads each request whole and,
//! for a share of the writes, sends it on only after a delay, from a task
//! of its own. The answer goes back to the client if it is still there. A
//! request whose body never arrived whole is never sent on, as a store
//! never applies a cut body. Since the store sees the write only when it
//! is applied, it judges the write's conditions then.
//!
//! With fencegate `kill -9`'d while such a write waits here, the write
//! lands after the restart: what the landing record is for.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// Which writes wait, and how long.
#[derive(Clone, Debug)]
pub struct LateConfig {
    /// Probability that a PUT, POST or DELETE is applied late.
    pub late_p: f64,
    pub late_ms: (u64, u64),
}

#[derive(Default, Debug)]
pub struct LateStats {
    pub writes: AtomicU64,
    pub late: AtomicU64,
    /// Late writes applied after their client had gone.
    pub applied_orphaned: AtomicU64,
}

impl LateStats {
    pub fn summary(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "writes={} applied_late={} applied_after_the_client_left={}",
            g(&self.writes),
            g(&self.late),
            g(&self.applied_orphaned)
        )
    }
}

pub struct LateApply {
    pub addr: SocketAddr,
    pub stats: Arc<LateStats>,
}

struct Shared {
    target: SocketAddr,
    config: LateConfig,
    rng: Mutex<StdRng>,
    client: Client<HttpConnector, Full<Bytes>>,
    stats: Arc<LateStats>,
}

type Answer = Response<Full<Bytes>>;

impl LateApply {
    /// Starts the hop in front of `target`, on a thread of its own (so that
    /// a test blocking its own threads does not stop it).
    pub fn start(target: SocketAddr, config: LateConfig, seed: u64) -> LateApply {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(LateStats::default());
        let st = stats.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).unwrap();
                let shared = Arc::new(Shared {
                    target,
                    config,
                    rng: Mutex::new(StdRng::seed_from_u64(seed)),
                    client: Client::builder(TokioExecutor::new()).build_http(),
                    stats: st,
                });
                loop {
                    let Ok((sock, _)) = listener.accept().await else {
                        continue;
                    };
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req| {
                            let shared = shared.clone();
                            async move { Ok::<_, std::convert::Infallible>(serve(shared, req).await) }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(sock), svc)
                            .await;
                    });
                }
            });
        });
        LateApply { addr, stats }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

fn bad_gateway(why: String) -> Answer {
    Response::builder()
        .status(502)
        .body(Full::new(Bytes::from(why)))
        .unwrap()
}

async fn serve(shared: Arc<Shared>, req: Request<Incoming>) -> Answer {
    let (parts, body) = req.into_parts();
    // A body cut off is never applied.
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return bad_gateway("the request's body broke off".into());
    };
    let write = matches!(parts.method.as_str(), "PUT" | "POST" | "DELETE");
    let delay = match write {
        false => None,
        true => {
            shared.stats.writes.fetch_add(1, Ordering::Relaxed);
            let mut rng = shared.rng.lock().unwrap();
            let (lo, hi) = shared.config.late_ms;
            rng.random_bool(shared.config.late_p)
                .then(|| Duration::from_millis(rng.random_range(lo..=hi)))
        }
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    let uri: http::Uri = format!("http://{}{path}", shared.target).parse().unwrap();
    let mut out = Request::from_parts(parts, Full::new(body));
    *out.uri_mut() = uri;
    let (tx, rx) = tokio::sync::oneshot::channel();
    // A task of its own: the write is applied whether or not this
    // request's future (its client's connection) lives on.
    let sh = shared.clone();
    tokio::spawn(async move {
        if let Some(d) = delay {
            sh.stats.late.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(d).await;
        }
        let answer = match sh.client.request(out).await {
            Ok(resp) => {
                let (parts, body) = resp.into_parts();
                match body.collect().await {
                    Ok(b) => Response::from_parts(parts, Full::new(b.to_bytes())),
                    Err(e) => bad_gateway(e.to_string()),
                }
            }
            Err(e) => bad_gateway(e.to_string()),
        };
        if tx.send(answer).is_err() && delay.is_some() {
            sh.stats.applied_orphaned.fetch_add(1, Ordering::Relaxed);
        }
    });
    rx.await
        .unwrap_or_else(|_| bad_gateway("the store's answer was lost".into()))
}
