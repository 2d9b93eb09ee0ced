//! Start-up and shutdown: opens the fence store, starts the backend (the
//! embedded store or a remote one), binds the S3 and admin listeners, serves
//! until SIGINT/SIGTERM, then drains in-flight requests.

use crate::admin::Admin;
use crate::metric_names as m;
use crate::config::{BackendKind, Config};
use crate::fence::gate::Gate;
use crate::fence::store::RedbStore;
use crate::proxy::Proxy;
use crate::upstream::client::{BackendTarget, Upstream};
use crate::upstream::embedded;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// A start-up failure, with the message the operator sees.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(pub String);

async fn backend_target(cfg: &Config) -> Result<BackendTarget, StartError> {
    match cfg.backend.kind {
        BackendKind::Embedded => {
            let dir = &cfg.server.data_dir;
            embedded::start(
                &dir.join("objects"),
                &dir.join("embedded.key"),
                &cfg.server.region,
            )
            .await
            .map_err(StartError)
        }
        BackendKind::S3 => {
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            let access_key_id = cfg
                .backend
                .access_key_id
                .clone()
                .or_else(|| env("AWS_ACCESS_KEY_ID"))
                .ok_or_else(|| {
                    StartError(
                        "backend credentials: set backend.access_key_id or AWS_ACCESS_KEY_ID"
                            .into(),
                    )
                })?;
            let secret_access_key = cfg
                .backend
                .secret_access_key
                .as_ref()
                .map(|s| s.expose().to_string())
                .or_else(|| env("AWS_SECRET_ACCESS_KEY"))
                .ok_or_else(|| StartError("backend credentials: set backend.secret_access_key or AWS_SECRET_ACCESS_KEY".into()))?;
            let region = cfg
                .backend
                .region
                .clone()
                .or_else(|| env("AWS_REGION"))
                .unwrap_or_else(|| cfg.server.region.clone());
            Ok(BackendTarget {
                endpoint: cfg
                    .backend
                    .endpoint
                    .as_deref()
                    .unwrap_or_default()
                    .parse()
                    .map_err(|e| StartError(format!("backend.endpoint: {e}")))?,
                region,
                access_key_id,
                secret_access_key,
                virtual_host: cfg.backend.addressing == crate::config::Addressing::VirtualHost,
            })
        }
    }
}

/// Runs fencegate until a shutdown signal.
pub async fn run(cfg: Config) -> Result<(), StartError> {
    std::fs::create_dir_all(&cfg.server.data_dir).map_err(|e| {
        StartError(format!(
            "cannot create data dir {}: {e}",
            cfg.server.data_dir.display()
        ))
    })?;
    let store_path = cfg.server.data_dir.join("fences.redb");
    let store = RedbStore::open(&store_path).map_err(|e| {
        StartError(format!(
            "{e}\nThe fence store is damaged or unreadable. fencegate will not start with an empty \
             one, because that would let stale writers through. Restore {} from a backup, or \
             move it away deliberately if you accept that risk.",
            store_path.display()
        ))
    })?;
    let mut gate = Gate::new(Arc::new(store), cfg.admission_wait());
    gate.set_max_slots(cfg.fence.max_cached_resources);
    if std::env::var("FENCEGATE_UNSAFE_UNORDERED").as_deref() == Ok("1") {
        tracing::warn!("FENCEGATE_UNSAFE_UNORDERED=1: the ordering barrier is OFF (debug only)");
        gate.set_ordered(false);
    }
    let gate = Arc::new(gate);
    let metrics = match crate::admin::metrics::install() {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!("metrics are off: {e}");
            None
        }
    };
    // After the recorder: the watchers report their state as metrics.
    crate::locks::eager::spawn_all(&cfg.locks, &cfg.eager, gate.clone());
    let target = backend_target(&cfg).await?;
    let backend_desc = target.endpoint.to_string();
    let backend_addr = target
        .endpoint
        .authority()
        .map(|a| {
            if a.port().is_some() {
                a.to_string()
            } else {
                format!("{}:80", a.host())
            }
        })
        .unwrap_or_default();
    let upstream = Upstream::new(
        target,
        Duration::from_millis(cfg.backend.timeout_ms),
        cfg.backend.ca_file.as_deref(),
    )
    .map_err(StartError)?;
    let tls = match (&cfg.server.tls_cert, &cfg.server.tls_key) {
        (Some(cert), Some(key)) => Some(tokio_rustls::TlsAcceptor::from(
            crate::tls::server_config(cert, key).map_err(StartError)?,
        )),
        _ => None,
    };
    let proxy = Arc::new(Proxy::new(&cfg, gate.clone(), Arc::new(upstream)));
    let admin = Arc::new(Admin {
        gate,
        metrics,
        admin_token: cfg.admin_token(),
        backend_addr,
    });

    let s3_listener = TcpListener::bind(cfg.server.listen).await.map_err(|e| {
        StartError(format!(
            "cannot listen on {} (server.listen): {e}",
            cfg.server.listen
        ))
    })?;
    let admin_listener = TcpListener::bind(cfg.server.admin_listen)
        .await
        .map_err(|e| {
            StartError(format!(
                "cannot listen on {} (server.admin_listen): {e}",
                cfg.server.admin_listen
            ))
        })?;
    let s3_addr = s3_listener
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?;
    tracing::info!(%s3_addr, %admin_addr, backend = %backend_desc, kind = ?cfg.backend.kind, "fencegate started");
    // One machine-readable line on stdout, for scripts and tests.
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("fencegate listening s3={s3_addr} admin={admin_addr} scheme={scheme}");
    let _ = std::io::stdout().flush();

    let mut http = http1::Builder::new();
    // fencegate answers a header section over max_header_bytes itself, with
    // an S3 error; hyper's own limit is only the backstop.
    http.max_buf_size((cfg.server.max_header_bytes * 2).max(400 * 1024))
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(cfg.server.idle_timeout_ms));
    let idle_timeout = Duration::from_millis(cfg.server.idle_timeout_ms);
    let mut refusing = http1::Builder::new();
    refusing.keep_alive(false);
    let connections = Arc::new(tokio::sync::Semaphore::new(cfg.server.max_connections));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = s3_listener.accept() => {
                let Ok((sock, _)) = accepted else { continue };
                let _ = sock.set_nodelay(true);
                let Ok(slot) = connections.clone().try_acquire_owned() else {
                    // Over the connection limit: one S3 error, then close.
                    metrics::counter!(m::CONNECTIONS_REFUSED).increment(1);
                    let svc = service_fn(|_req| async {
                        let e = crate::s3::error::S3Error::SlowDown("this server (connection limit)".into());
                        let (parts, body) = e.to_response("/", "-").into_parts();
                        let body = http_body_util::Full::new(body);
                        Ok::<_, std::convert::Infallible>(http::Response::from_parts(parts, body))
                    });
                    let conn = refusing.serve_connection(TokioIo::new(sock), svc);
                    tokio::spawn(async move { let _ = conn.await; });
                    continue;
                };
                let proxy = proxy.clone();
                let svc = service_fn(move |req| {
                    let proxy = proxy.clone();
                    async move { Ok::<_, std::convert::Infallible>(proxy.handle(req).await) }
                });
                metrics::gauge!(m::CONNECTIONS).increment(1.0);
                match &tls {
                    None => {
                        let conn = graceful.watch(http.serve_connection(TokioIo::new(sock), svc));
                        tokio::spawn(async move {
                            let _ = conn.await;
                            metrics::gauge!(m::CONNECTIONS).decrement(1.0);
                            drop(slot);
                        });
                    }
                    Some(acceptor) => {
                        // The handshake runs in the connection's task, bounded
                        // by the idle timeout like a header section.
                        let accept = acceptor.accept(sock);
                        let http = http.clone();
                        let watcher = graceful.watcher();
                        tokio::spawn(async move {
                            if let Ok(Ok(stream)) = tokio::time::timeout(idle_timeout, accept).await {
                                let conn = http.serve_connection(TokioIo::new(stream), svc);
                                let _ = watcher.watch(conn).await;
                            }
                            metrics::gauge!(m::CONNECTIONS).decrement(1.0);
                            drop(slot);
                        });
                    }
                }
            }
            accepted = admin_listener.accept() => {
                let Ok((sock, _)) = accepted else { continue };
                let admin = admin.clone();
                let svc = service_fn(move |req| {
                    let admin = admin.clone();
                    async move { Ok::<_, std::convert::Infallible>(admin.handle(req).await) }
                });
                let conn = graceful.watch(http.serve_connection(TokioIo::new(sock), svc));
                tokio::spawn(async move { let _ = conn.await; });
            }
        }
    }
    tracing::info!("shutting down: no new connections, waiting for in-flight requests");
    drop(s3_listener);
    drop(admin_listener);
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within 30s; exiting anyway");
    }
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
