//! Start-up and serving, apart as in mini-redis: [`start`] opens the fence
//! store, starts the backend (the embedded store or a remote one) and builds
//! the S3 and admin services; [`serve`] takes the bound [`Listeners`] and a
//! shutdown future, accepts through a `Listener` (connection limit), and
//! the `Handler` hands each connection to one of the serving threads
//! (`workers`, `Handler::spawn`), where `connection` serves it (the TLS
//! handshake, bounded by the idle timeout, then HTTP/1 into
//! `Proxy::handle`); then it drains in-flight requests. [`run`] is the two
//! with SIGINT/SIGTERM.

use crate::admin::Admin;
use crate::body::full;
use crate::config::{BackendKind, Config, ServerConfig};
use crate::connection::Serving;
use crate::fence::doubt::Doubts;
use crate::fence::gate::Gate;
use crate::fence::landing::Landing;
use crate::fence::table::RedbTable;
use crate::metric_names as m;
use crate::proxy::Proxy;
use crate::s3::error::S3Error;
use crate::shutdown::Shutdown;
use crate::store::Store;
use crate::upstream::client::Upstream;
use crate::upstream::embedded;
use crate::upstream::probe::Probe;
use crate::upstream::target::BackendTarget;
use crate::workers::Workers;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

/// A start-up failure, with the message the operator sees.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(pub String);

/// The backend to forward to: how fencegate reaches it, what to call it in
/// the start-up line, the address readiness connects to (none in-process),
/// and the embedded store when it is that.
struct Backend {
    upstream: Upstream,
    desc: String,
    addr: Option<String>,
    store: Option<Store>,
}

fn backend(cfg: &Config) -> Result<Backend, StartError> {
    let timeout = Duration::from_millis(cfg.backend.timeout_ms);
    if cfg.backend.kind == BackendKind::Embedded {
        let (store, key, opened) = embedded::open(&cfg.server.data_dir).map_err(StartError)?;
        return Ok(Backend {
            upstream: Upstream::in_process(store, key, &cfg.server.region, timeout),
            desc: format!("embedded, in-process ({})", cfg.server.data_dir.display()),
            addr: None,
            store: Some(opened),
        });
    }
    let target = backend_target(cfg)?;
    let desc = target.endpoint.to_string();
    let addr = readiness_addr(&target.endpoint);
    let upstream =
        Upstream::new(target, timeout, cfg.backend.ca_file.as_deref()).map_err(StartError)?;
    Ok(Backend {
        upstream,
        desc,
        addr,
        store: None,
    })
}

/// The address `/readyz` connects to for a backend at `endpoint`: its port,
/// or the scheme's (443 for `https`, else 80).
fn readiness_addr(endpoint: &http::Uri) -> Option<String> {
    let default = if endpoint.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    endpoint.authority().map(|a| match a.port() {
        Some(_) => a.to_string(),
        None => format!("{}:{default}", a.host()),
    })
}

/// Where an S3 backend is and who fencegate is to it.
fn backend_target(cfg: &Config) -> Result<BackendTarget, StartError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let access_key_id = cfg
        .backend
        .access_key_id
        .clone()
        .or_else(|| env("AWS_ACCESS_KEY_ID"))
        .ok_or_else(|| {
            StartError("backend credentials: set backend.access_key_id or AWS_ACCESS_KEY_ID".into())
        })?;
    let secret_access_key = cfg
        .backend
        .secret_access_key
        .as_ref()
        .map(|s| s.expose().to_string())
        .or_else(|| env("AWS_SECRET_ACCESS_KEY"))
        .ok_or_else(|| {
            StartError(
                "backend credentials: set backend.secret_access_key or AWS_SECRET_ACCESS_KEY"
                    .into(),
            )
        })?;
    let region = cfg
        .backend
        .region
        .clone()
        .or_else(|| env("AWS_REGION"))
        .unwrap_or_else(|| cfg.server.region.clone());
    let target = BackendTarget {
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
    };
    Ok(target)
}

/// Runs fencegate until a shutdown signal: start-up, the listeners bound,
/// the start-up line, then [`serve`] until SIGINT or SIGTERM.
pub async fn run(cfg: Config) -> Result<(), StartError> {
    let services = start(&cfg).await?;
    let listeners = Listeners::bind(&cfg).await?;
    let s3_addr = listeners
        .s3
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?;
    let admin_addr = listeners
        .admin
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?;
    tracing::info!(%s3_addr, %admin_addr, backend = %services.backend_desc, kind = ?cfg.backend.kind, threads = services.workers.threads(), "fencegate started");
    // One machine-readable line on stdout, for scripts and tests.
    let scheme = if services.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let gate = services.admin.gate.clone();
    if let (Some(c), Some(cc)) = (gate.cluster(), &cfg.cluster) {
        c.advertise(advertised(cc, scheme, s3_addr)?);
    }
    println!("fencegate listening s3={s3_addr} admin={admin_addr} scheme={scheme}");
    let _ = std::io::stdout().flush();
    serve(listeners, services, &cfg.server, shutdown_signal()).await;
    // The next owners of this replica's resources need not wait for its
    // lease to run out.
    gate.release_all().await;
    // What is still in flight stays recorded for the next start; with
    // nothing in flight, it holds nothing back.
    if let Some(l) = gate.doubts().landing()
        && let Err(e) = l.close()
    {
        tracing::warn!("the landing record could not be closed cleanly: {e}");
    }
    Ok(())
}

/// Cluster mode: the URL other replicas forward requests to.
fn advertised(
    c: &crate::config::ClusterConfig,
    scheme: &str,
    s3_addr: std::net::SocketAddr,
) -> Result<String, StartError> {
    if let Some(url) = &c.advertise {
        return Ok(url.clone());
    }
    if s3_addr.ip().is_unspecified() {
        return Err(StartError(format!(
            "cluster.advertise: the S3 listener is on {s3_addr}, which the other replicas \
             cannot reach as such; set the address they should forward to, \
             e.g. \"{scheme}://10.0.0.5:{}\"",
            s3_addr.port()
        )));
    }
    Ok(format!("{scheme}://{s3_addr}"))
}

/// What start-up builds and serving uses: the S3 side, the admin side, and
/// how the S3 port speaks.
pub struct Services {
    pub proxy: Arc<Proxy>,
    pub admin: Arc<Admin>,
    /// Set when the S3 port speaks HTTPS.
    pub tls: Option<TlsAcceptor>,
    /// The backend, for the start-up log line.
    pub backend_desc: String,
    /// The threads that serve S3 connections.
    pub workers: Workers,
}

/// Start-up: the fence table and gate, the metrics recorder, eager fencing,
/// the backend, the S3 and admin services. Nothing is listening yet.
pub async fn start(cfg: &Config) -> Result<Services, StartError> {
    let metrics = match crate::admin::metrics::install() {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!("metrics are off: {e}");
            None
        }
    };
    let doubts = open_doubts(cfg)?;
    let gate = match &cfg.cluster {
        Some(c) => cluster_gate(cfg, c, doubts.clone()).await?,
        None => open_gate(cfg, doubts.clone())?,
    };
    crate::locks::eager::check_access(&cfg.locks, &cfg.eager)
        .await
        .map_err(StartError)?;
    // After the recorder: the watchers report their state as metrics.
    crate::locks::eager::spawn_all(&cfg.locks, &cfg.eager, gate.clone());
    let Backend {
        upstream,
        desc: backend_desc,
        addr: backend_addr,
        store,
    } = backend(cfg)?;
    let tls = match (&cfg.server.tls_cert, &cfg.server.tls_key) {
        (Some(cert), Some(key)) => Some(TlsAcceptor::from(
            crate::tls::server_config(cert, key).map_err(StartError)?,
        )),
        _ => None,
    };
    let upstream = Arc::new(upstream);
    let probe = Arc::new(Probe::default());
    let judges = doubts.judges().clone();
    probe.on_found(move |h| {
        let writes = h.if_none_match == Some(true) && h.if_match == Some(true);
        judges.set(writes, h.delete_if_match == Some(true));
    });
    if cfg.backend.probe_conditions {
        let bucket = cfg.backend.probe_bucket.clone();
        probe.spawn(upstream.clone(), bucket, Duration::from_secs(60));
    }
    let sessions = crate::s3::session::keys_from_config(cfg)
        .map_err(StartError)?
        .map(Arc::new);
    let proxy = Proxy::new(cfg, gate.clone(), upstream, sessions.clone(), probe.clone());
    let proxy = proxy.map_err(StartError)?;
    let proxy = Arc::new(proxy);
    proxy.settle_doubts();
    let admin = Arc::new(Admin {
        gate,
        metrics,
        bearer: cfg.admin_bearer(),
        backend_addr,
        probe,
        store,
        sessions: sessions.map(|keys| crate::s3::session::SessionIssuer {
            keys,
            max_ttl_secs: cfg.sessions.max_ttl_secs,
            default_ttl_secs: cfg.sessions.default_ttl_secs,
        }),
    });
    let threads = crate::workers::count(cfg.server.threads);
    let workers = Workers::start(threads)
        .map_err(|e| StartError(format!("cannot start {threads} serving threads: {e}")))?;
    Ok(Services {
        proxy,
        admin,
        tls,
        backend_desc,
        workers,
    })
}

/// The writes in doubt, and, in front of a remote backend, the record of
/// what may still land (`fence::landing`): what the process before left
/// there is in doubt from now on, for the quarantine, or, when the record
/// cannot say, every newer token waits that long (a blanket doubt).
fn open_doubts(cfg: &Config) -> Result<Arc<Doubts>, StartError> {
    let dir = &cfg.server.data_dir;
    let used_before = dir.join("fences.redb").exists()
        || dir.join(crate::fence::cluster::incarnation::FILE).exists();
    std::fs::create_dir_all(dir)
        .map_err(|e| StartError(format!("cannot create data dir {}: {e}", dir.display())))?;
    if cfg.backend.kind == BackendKind::Embedded {
        // Its writes die with the process: nothing is ever in doubt.
        return Ok(Arc::new(Doubts::new(None)));
    }
    let mut opened = Landing::open(dir, used_before).map_err(StartError)?;
    if crate::proxy::unsafe_switch(
        "FENCEGATE_UNSAFE_FORGET_IN_FLIGHT",
        "what the process before left in flight",
    ) {
        opened.inherited.clear();
        opened.blanket = None;
        opened.landing.blanket_over();
    }
    let doubts = Arc::new(Doubts::new(Some(opened.landing)));
    let quarantine = Duration::from_millis(cfg.fence.quarantine_ms);
    let until = tokio::time::Instant::now() + quarantine;
    if let Some(why) = &opened.blanket {
        tracing::warn!(
            quarantine_ms = cfg.fence.quarantine_ms,
            "start-up quarantine: {why}; every newer token (and every write to an object) \
             waits until the quarantine is over, since a write the process before sent may \
             still land"
        );
        doubts.blanket(until);
    }
    if !opened.inherited.is_empty() {
        let orderable = opened.inherited.iter().filter(|(w, _)| w.orderable).count();
        tracing::warn!(
            writes = opened.inherited.len(),
            orderable,
            quarantine_ms = cfg.fence.quarantine_ms,
            "the process before stopped with writes the backend had whole and may still \
             apply: they are in doubt until the quarantine is over, and newer tokens on \
             their resources wait for them but for what the backend orders after them"
        );
    }
    for (write, record) in opened.inherited {
        doubts.add(&write, Some(Arc::new(record)), until);
    }
    doubts.sweep();
    Ok(doubts)
}

/// The data directory, the fence table in it (a damaged one stops
/// start-up), and the gate over it.
fn open_gate(cfg: &Config, doubts: Arc<Doubts>) -> Result<Arc<Gate>, StartError> {
    let store_path = cfg.server.data_dir.join("fences.redb");
    let store = RedbTable::open(&store_path).map_err(|e| {
        StartError(format!(
            "{e}\nThe fence table is damaged or unreadable. fencegate will not start with an empty \
             one, because that would let stale writers through. Restore {} from a backup, or \
             move it away deliberately if you accept that risk.",
            store_path.display()
        ))
    })?;
    store.spawn_recovery();
    let mut gate = Gate::new(Arc::new(store), cfg.admission_wait());
    gate.set_max_slots(cfg.fence.max_cached_resources);
    gate.set_doubts(doubts);
    unsafe_switches(&mut gate);
    Ok(Arc::new(gate))
}

/// Cluster mode: no fence file; the gate shares its table and barrier with
/// the other replicas through etcd, and follows their raises.
async fn cluster_gate(
    cfg: &Config,
    c: &crate::config::ClusterConfig,
    doubts: Arc<Doubts>,
) -> Result<Arc<Gate>, StartError> {
    let quarantine = Duration::from_millis(cfg.fence.quarantine_ms);
    let dir = &cfg.server.data_dir;
    let cluster = crate::fence::cluster::Cluster::start(c, quarantine, dir, doubts.clone())
        .await
        .map_err(StartError)?;
    let mut gate = Gate::clustered(cluster, cfg.admission_wait());
    gate.set_max_slots(cfg.fence.max_cached_resources);
    gate.set_doubts(doubts);
    unsafe_switches(&mut gate);
    let gate = Arc::new(gate);
    gate.follow_cluster();
    Ok(gate)
}

/// The debug switches that take a guarantee away, to show its tests fail.
fn unsafe_switches(gate: &mut Gate) {
    if crate::proxy::unsafe_switch("FENCEGATE_UNSAFE_UNORDERED", "the ordering barrier") {
        gate.set_ordered(false);
    }
    if crate::proxy::unsafe_switch("FENCEGATE_UNSAFE_NO_HOLD", "the conditional writes' hold") {
        gate.holds_mut().set_off(true);
    }
}

/// The two bound ports.
pub struct Listeners {
    pub s3: TcpListener,
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds `server.listen` and `server.admin_listen`.
    pub async fn bind(cfg: &Config) -> Result<Listeners, StartError> {
        let bind = |addr, field: &'static str| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| StartError(format!("cannot listen on {addr} ({field}): {e}")))
        };
        Ok(Listeners {
            s3: bind(cfg.server.listen, "server.listen").await?,
            admin: bind(cfg.server.admin_listen, "server.admin_listen").await?,
        })
    }
}

/// Serves both ports until `shutdown` completes, then stops accepting and
/// waits (30 s at most) for the requests in flight.
pub async fn serve(
    listeners: Listeners,
    services: Services,
    server: &ServerConfig,
    shutdown: impl Future<Output = ()>,
) {
    let idle_timeout = Duration::from_millis(server.idle_timeout_ms);
    let mut http = http1::Builder::new();
    // fencegate answers a header section over max_header_bytes itself, with
    // an S3 error; hyper's own limit is only the backstop.
    http.max_buf_size((server.max_header_bytes * 2).max(400 * 1024))
        .timer(TokioTimer::new())
        .header_read_timeout(idle_timeout);
    let s3 = Listener::new(listeners.s3, server.max_connections);
    let handler = Handler {
        serving: Serving {
            proxy: services.proxy,
            http: http.clone(),
            tls: services.tls,
            idle_timeout,
        },
        workers: services.workers,
    };
    let graceful = Shutdown::default();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = s3.accept() => {
                if let Some(conn) = accepted {
                    handler.spawn(conn, &graceful);
                }
            }
            accepted = listeners.admin.accept() => {
                let Ok((sock, _)) = accepted else { continue };
                let admin = services.admin.clone();
                let svc = service_fn(move |req| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(admin.handle(req).await) }
                });
                let conn = graceful.watcher().watch(http.serve_connection(TokioIo::new(sock), svc));
                tokio::spawn(async move { let _ = conn.await; });
            }
        }
    }
    tracing::info!("shutting down: no new connections, waiting for in-flight requests");
    drop(s3);
    drop(listeners.admin);
    if tokio::time::timeout(Duration::from_secs(30), graceful.wait())
        .await
        .is_err()
    {
        tracing::warn!("in-flight requests did not finish within 30s; exiting anyway");
    }
    tracing::info!("stopped");
}

/// The S3 port: accepts connections up to `server.max_connections`, and
/// answers one over the limit with a 503 SlowDown before closing it.
struct Listener {
    tcp: TcpListener,
    connections: Arc<Semaphore>,
    /// HTTP/1 without keep-alive, for the refusals.
    refusing: http1::Builder,
}

/// An accepted S3 connection and its place under the connection limit.
struct Connection {
    sock: TcpStream,
    slot: OwnedSemaphorePermit,
}

impl Listener {
    fn new(tcp: TcpListener, max_connections: usize) -> Listener {
        let mut refusing = http1::Builder::new();
        refusing.keep_alive(false);
        Listener {
            tcp,
            connections: Arc::new(Semaphore::new(max_connections)),
            refusing,
        }
    }

    /// The next connection under the limit; `None` when accepting failed or
    /// the connection was over the limit (and refused).
    async fn accept(&self) -> Option<Connection> {
        let (sock, _) = self.tcp.accept().await.ok()?;
        let _ = sock.set_nodelay(true);
        match self.connections.clone().try_acquire_owned() {
            Ok(slot) => Some(Connection { sock, slot }),
            Err(_) => {
                self.refuse(sock);
                None
            }
        }
    }

    /// Over the connection limit: one S3 error, then close.
    fn refuse(&self, sock: TcpStream) {
        metrics::counter!(m::CONNECTIONS_REFUSED).increment(1);
        let connection_limit = service_fn(|_req| async {
            let e = S3Error::SlowDown("this server is at its connection limit".into());
            let (parts, body) = e.to_response("/", "-").into_parts();
            Ok::<_, Infallible>(http::Response::from_parts(parts, full(body)))
        });
        let conn = self
            .refusing
            .serve_connection(TokioIo::new(sock), connection_limit);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// Serves accepted S3 connections, each in a task of its own on the
/// serving thread that has the fewest.
struct Handler {
    serving: Serving,
    workers: Workers,
}

impl Handler {
    /// Hands `conn` to the serving thread with the fewest connections
    /// (`workers`), where it is served (`connection`); it counts under the
    /// connection limit while it lasts.
    fn spawn(&self, conn: Connection, graceful: &Shutdown) {
        let Connection { sock, slot } = conn;
        // Registered again on the serving thread's runtime, whose driver
        // then wakes that thread alone.
        let Ok(sock) = sock.into_std() else { return };
        let serving = self.serving.clone();
        let watcher = graceful.watcher();
        self.workers
            .run(move |place| serving.start(sock, watcher, slot, place));
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::readiness_addr;

    #[test]
    fn readiness_connects_to_the_endpoints_port_or_its_schemes() {
        let addr = |u: &str| readiness_addr(&u.parse().unwrap());
        assert_eq!(
            addr("http://s3.example:9000").as_deref(),
            Some("s3.example:9000")
        );
        assert_eq!(addr("http://s3.example").as_deref(), Some("s3.example:80"));
        assert_eq!(
            addr("https://s3.example").as_deref(),
            Some("s3.example:443")
        );
    }
}
