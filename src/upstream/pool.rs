//! The backend's connections, kept open between requests: one list of
//! HTTP/1 connections (hyper's `client::conn::http1`), each driven by a
//! task of its own, handed out last-used first.
//!
//! It replaces hyper-util's general-purpose pool, which, for one backend,
//! did more per request than the request needed (a checkout future keyed
//! by scheme and host, a task spawned per response to return the
//! connection; docs/benchmarks-log.md, "CPU per request"). The rules:
//!
//! - A connection is out of the list while a request is being sent on it,
//!   and back in as soon as the answer's head came; hyper reports it ready
//!   again once that answer's body has been read to its end, and only a
//!   ready connection is handed out. One whose answer was dropped halfway
//!   is closed by hyper and leaves the list.
//! - A request that hyper hands back unsent (the backend closed a kept
//!   connection just as it was picked) is sent again, on the next kept
//!   connection or a new one; one that was sent, even in part, is never
//!   sent twice.
//! - Connections idle for longer than `idle` are closed when the list is
//!   next looked at; the list never keeps more than `MAX_KEPT`.
//! - Each serving thread (`workers`) has a list of its own: a connection
//!   is driven by a task on the thread that opened it, and only that
//!   thread sends on it again, so a request's exchange with the backend
//!   wakes no other thread. The other threads (the main runtime's) share
//!   list 0.

use crate::per_thread::PerThread;
use crate::s3::error::S3Error;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::{Request, Response, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tower_service::Service;

/// The body of a request sent on a pooled connection: to the backend
/// (`client.rs`), or to another replica (`proxy::peers`).
pub type UpstreamBody = UnsyncBoxBody<Bytes, S3Error>;

type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
type Sender = http1::SendRequest<UpstreamBody>;
/// Kept connections: (last used, connection), most recently used last.
type List = Mutex<Vec<(Instant, Sender)>>;

/// More connections than this are closed after their answer rather than
/// kept.
const MAX_KEPT: usize = 1024;

pub struct Pool {
    connector: Connector,
    endpoint: Uri,
    idle: Duration,
    /// A list a serving thread.
    kept: PerThread<List>,
}

/// Why a request got no answer.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

impl Pool {
    /// Connections to `endpoint` (TCP with `TCP_NODELAY`, and TLS with
    /// `tls` when it is `https://`).
    pub fn new(tls: rustls::ClientConfig, endpoint: Uri, idle: Duration) -> Pool {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        tcp.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        Pool {
            connector,
            endpoint,
            idle,
            kept: PerThread::default(),
        }
    }

    /// Sends `req` (origin-form URI, `Host` set) on a kept connection, or
    /// on a new one; resolves with the answer's head.
    pub async fn send(&self, mut req: Request<UpstreamBody>) -> Result<Response<Incoming>, Error> {
        loop {
            let (mut sender, reused) = match self.checkout() {
                Some(s) => (s, true),
                None => (self.connect().await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    self.keep(sender);
                    return Ok(resp);
                }
                Err(mut e) => match e.take_message() {
                    // Unsent on a kept connection that went away: again,
                    // on the next kept connection or a new one.
                    Some(unsent) if reused => req = unsent,
                    _ => return Err(e.into_error().into()),
                },
            }
        }
    }

    /// [`Pool::send`] of the request `build` makes, made only once a
    /// connection is there: when none can be made, `build` is not called
    /// (whatever it would consume is still the caller's). The error says
    /// whether the request was built.
    pub async fn send_when_connected(
        &self,
        build: impl FnOnce() -> Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, (Error, bool)> {
        let mut sender = match self.checkout() {
            Some(s) => s,
            None => self.connect().await.map_err(|e| (e, false))?,
        };
        match sender.try_send_request(build()).await {
            Ok(resp) => {
                self.keep(sender);
                Ok(resp)
            }
            // A kept connection gone: the request, unsent, on the next
            // kept connection or a new one.
            Err(mut e) => match e.take_message() {
                Some(unsent) => self.send(unsent).await.map_err(|e| (e, true)),
                None => Err((e.into_error().into(), true)),
            },
        }
    }

    /// Sends `req` on a connection of its own, closed after the answer's
    /// head: whether the other end answers at all now, whatever the kept
    /// connections are stuck on.
    pub async fn send_fresh(
        &self,
        req: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, Error> {
        let mut sender = self.connect().await?;
        Ok(sender.send_request(req).await?)
    }

    /// The most recently used ready connection, if any; drops closed and
    /// expired ones on the way. The lock covers a scan of the list.
    fn checkout(&self) -> Option<Sender> {
        let mut kept = self.kept.mine().lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let expired = |used: Instant, s: &Sender| s.is_ready() && now - used > self.idle;
        kept.retain(|(used, s)| !(s.is_closed() || expired(*used, s)));
        let i = kept.iter().rposition(|(_, s)| s.is_ready())?;
        Some(kept.remove(i).1)
    }

    fn keep(&self, sender: Sender) {
        let mut kept = self.kept.mine().lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() < MAX_KEPT {
            kept.push((Instant::now(), sender));
        }
    }

    /// A new connection, its task spawned. Boxed: a connection is rarely
    /// made (they are kept), and its future, over a KB, would otherwise
    /// size every request's future that may await it (moved at each await
    /// above it).
    fn connect(&self) -> Pin<Box<impl Future<Output = Result<Sender, Error>> + '_>> {
        Box::pin(async move {
            let io = self.connector.clone().call(self.endpoint.clone()).await?;
            let (sender, conn) = http1::Builder::new().handshake(io).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("backend connection ended: {e}");
                }
            });
            Ok(sender)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A backend that answers every request on a connection with an empty
    /// 200 and counts its connections; with `close_after_answer` it closes
    /// each connection, silently, right after its first answer.
    async fn backend(close_after_answer: bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match sock.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.clear();
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if sock.write_all(answer).await.is_err() || close_after_answer {
                            return;
                        }
                    }
                });
            }
        });
        (uri, accepted)
    }

    fn pool(endpoint: Uri) -> Pool {
        let tls = crate::tls::client_config_without_roots().unwrap();
        Pool::new(tls, endpoint, Duration::from_secs(30))
    }

    async fn get(pool: &Pool, endpoint: &Uri) -> http::StatusCode {
        let req = Request::builder()
            .uri("/bucket/key")
            .header("host", endpoint.authority().unwrap().as_str())
            .body(Empty::new().map_err(|never| match never {}).boxed_unsync())
            .unwrap();
        let resp = pool.send(req).await.expect("an answer");
        let status = resp.status();
        resp.into_body().collect().await.unwrap();
        status
    }

    #[tokio::test]
    async fn one_connection_serves_requests_one_after_another() {
        let (endpoint, accepted) = backend(false).await;
        let pool = pool(endpoint.clone());
        for _ in 0..10 {
            assert_eq!(get(&pool, &endpoint).await, 200);
            // hyper marks the connection ready once it has read the end
            // of the answer, on its own task.
            tokio::task::yield_now().await;
        }
        assert!(accepted.load(Ordering::SeqCst) <= 2, "{accepted:?}");
    }

    #[tokio::test]
    async fn a_connection_the_backend_closed_is_not_used_again() {
        let (endpoint, accepted) = backend(true).await;
        let pool = pool(endpoint.clone());
        for _ in 0..5 {
            assert_eq!(get(&pool, &endpoint).await, 200);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn concurrent_requests_each_get_an_answer() {
        let (endpoint, accepted) = backend(false).await;
        let pool = Arc::new(pool(endpoint.clone()));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (pool, endpoint) = (pool.clone(), endpoint.clone());
                tokio::spawn(async move { get(&pool, &endpoint).await })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), 200);
        }
        let opened = accepted.load(Ordering::SeqCst);
        assert!((1..=16).contains(&opened), "{opened}");
        // Afterwards they are all kept and reused, none opened anew.
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..8 {
            assert_eq!(get(&pool, &endpoint).await, 200);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), opened);
    }

    /// Two serving threads, each on a runtime of its own, each reuse the
    /// connection they opened, and never the other's, even while both are
    /// kept and ready.
    #[tokio::test]
    async fn each_serving_thread_reuses_its_own_connections() {
        let (endpoint, accepted) = backend(false).await;
        let pool = Arc::new(pool(endpoint.clone()));
        // gets, then (when given) waits for `go` and gets again, its
        // runtime running meanwhile.
        let on_thread = |slot: usize, go: Option<tokio::sync::oneshot::Receiver<()>>| {
            let (pool, endpoint) = (pool.clone(), endpoint.clone());
            let (done, done_rx) = tokio::sync::oneshot::channel();
            let thread = std::thread::spawn(move || {
                crate::per_thread::set(slot);
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let gets = || async {
                        for _ in 0..5 {
                            assert_eq!(get(&pool, &endpoint).await, 200);
                            tokio::task::yield_now().await;
                        }
                    };
                    gets().await;
                    done.send(()).unwrap();
                    if let Some(go) = go {
                        go.await.unwrap();
                        gets().await;
                    }
                })
            });
            (thread, done_rx)
        };
        // The test's own runtime serves the backend: it is never blocked.
        let join = |t: std::thread::JoinHandle<()>| tokio::task::spawn_blocking(move || t.join());
        let (go, wait) = tokio::sync::oneshot::channel();
        let (first, done) = on_thread(1, Some(wait));
        done.await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        // The first thread's connection is kept and ready; the second
        // thread's list is empty, so it opens its own.
        let (second, done) = on_thread(2, None);
        done.await.unwrap();
        join(second).await.unwrap().unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        go.send(()).unwrap();
        join(first).await.unwrap().unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
