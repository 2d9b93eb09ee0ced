//! One S3 connection on the serving thread `workers` chose for it, after
//! `server` accepted it under the connection limit: counted in
//! `fencegate_connections`, the TLS handshake if the port speaks HTTPS
//! (bounded by the idle timeout, like a header section), then HTTP/1, each
//! request into `Proxy::handle`, until the client or the graceful shutdown
//! closes it.

use crate::metric_names as m;
use crate::proxy::Proxy;
use crate::shutdown::Watcher;
use crate::workers::Place;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;

/// How a connection is served, taken to its serving thread.
#[derive(Clone)]
pub struct Serving {
    pub proxy: Arc<Proxy>,
    pub http: http1::Builder,
    pub tls: Option<TlsAcceptor>,
    /// Bounds the TLS handshake, like a header section.
    pub idle_timeout: Duration,
}

impl Serving {
    /// On its serving thread: serves `sock` in a task of its own, which
    /// lets go of its `slot` under the connection limit and its `place` on
    /// the thread when the connection ends.
    pub fn start(
        self,
        sock: std::net::TcpStream,
        watcher: Watcher,
        slot: OwnedSemaphorePermit,
        place: Place,
    ) {
        tokio::spawn(async move {
            metrics::gauge!(m::CONNECTIONS).increment(1.0);
            self.serve(sock, watcher).await;
            metrics::gauge!(m::CONNECTIONS).decrement(1.0);
            drop((slot, place));
        });
    }

    /// The TLS handshake if the port speaks HTTPS, then HTTP/1 until the
    /// client or the graceful shutdown closes the connection.
    async fn serve(self, sock: std::net::TcpStream, watcher: Watcher) {
        let Ok(sock) = TcpStream::from_std(sock) else {
            return;
        };
        let proxy = self.proxy;
        let svc = service_fn(move |req| {
            let proxy = proxy.clone();
            async move { Ok::<_, Infallible>(proxy.handle(req).await) }
        });
        match self.tls {
            None => {
                let conn = self.http.serve_connection(TokioIo::new(sock), svc);
                let _ = watcher.watch(conn).await;
            }
            Some(acceptor) => {
                let handshake = acceptor.accept(sock);
                if let Ok(Ok(stream)) = tokio::time::timeout(self.idle_timeout, handshake).await {
                    let conn = self.http.serve_connection(TokioIo::new(stream), svc);
                    let _ = watcher.watch(conn).await;
                }
            }
        }
    }
}
