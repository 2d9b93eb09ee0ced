//! The admin listener, on its own address (loopback by default), never on
//! the S3 port:
//!
//! - `GET /healthz`: the process is up;
//! - `GET /readyz`: the fence table answers and can write, the embedded
//!   store (if it is the backend) can write, and the backend accepts
//!   connections; it also shows whether the backend honours conditional
//!   writes itself (`upstream::probe`), and the writes in doubt
//!   (`fence::doubt`): how many, and how long a start-up quarantine has
//!   left; and the verified resources whose lock holder has a token below
//!   the fence (`locks::issued`: the lock service's tokens went back);
//! - `GET /fences?prefix=&limit=&after=`: recorded fences, paginated;
//! - `GET /fences/{resource}`: one fence;
//! - `POST /fences/{resource}` with `{"token": N}` and
//!   `Authorization: Bearer <server.admin_token>`: raise by hand (never lowers);
//! - `POST /credentials` with `{"token": N, "lock": L, "scope": [..],
//!   "ttl_secs": S}` and the admin bearer: session credentials
//!   bound to the token (`s3::session`, docs/credentials.md), answered in
//!   the JSON of AWS's `credential_process`;
//! - `GET /metrics`: Prometheus text.

pub mod client;
pub mod metrics;
pub mod transfer;

use crate::body::{ProxyBody, full};
use crate::config::Secret;
use crate::fence::gate::{Gate, Refusal};
use crate::fence::issued::Whose;
use crate::metric_names as m;
use crate::s3::query;
use crate::s3::session::{SessionIssuer, rfc3339};
use crate::s3::sigv4::same_signature;
use crate::store::Store;
use crate::upstream::probe::Probe;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use metrics_exporter_prometheus::PrometheusHandle;
use percent_encoding::percent_decode_str;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

pub struct Admin {
    pub gate: Arc<Gate>,
    pub metrics: Option<PrometheusHandle>,
    pub bearer: Option<Secret>,
    /// `host:port` of the backend, for readiness.
    /// Where readiness connects to the backend; none in-process.
    pub backend_addr: Option<String>,
    /// Whether the backend honours conditional writes itself.
    pub probe: Arc<Probe>,
    /// The embedded store, when it is the backend (for readiness).
    pub store: Option<Store>,
    /// Issues session credentials; none when sessions are off.
    pub sessions: Option<SessionIssuer>,
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<ProxyBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<ProxyBody> {
    respond(status, "application/json", value.to_string())
}

impl Admin {
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        match (&method, path.as_str()) {
            (&Method::GET, "/healthz") => json(StatusCode::OK, json!({"status": "ok"})),
            (&Method::GET, "/readyz") => self.ready().await,
            (&Method::GET, "/metrics") => match &self.metrics {
                Some(h) => {
                    m::handles::fold();
                    respond(StatusCode::OK, "text/plain; version=0.0.4", h.render())
                }
                None => json(StatusCode::NOT_FOUND, json!({"error": "metrics are off"})),
            },
            (&Method::GET, "/fences") => self.list(req.uri().query()).await,
            (&Method::POST, "/credentials") => self.credentials(req).await,
            (_, p) if p.starts_with("/fences/") => {
                let resource = percent_decode_str(&p["/fences/".len()..])
                    .decode_utf8_lossy()
                    .into_owned();
                if resource.is_empty() {
                    return json(StatusCode::NOT_FOUND, json!({"error": "no resource named"}));
                }
                match method {
                    Method::GET => self.get(&resource).await,
                    Method::POST => self.raise(&resource, req).await,
                    _ => json(
                        StatusCode::METHOD_NOT_ALLOWED,
                        json!({"error": "use GET or POST"}),
                    ),
                }
            }
            _ => json(StatusCode::NOT_FOUND, json!({"error": "not found"})),
        }
    }

    async fn ready(&self) -> Response<ProxyBody> {
        if let Some(why) = self.gate.not_ready() {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "not ready", "cluster": why}),
            );
        }
        if let Err(e) = self.gate.table().get("").await {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "not ready", "store": e.to_string()}),
            );
        }
        if let Some(why) = self.gate.table().failing() {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "not ready", "store": why}),
            );
        }
        if let Some(why) = self.store.as_ref().and_then(Store::failing) {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "not ready", "embedded_store": why}),
            );
        }
        let ready = || {
            let doubts = self.gate.doubts();
            let startup = doubts
                .blanket_until()
                .map(|until| until.saturating_duration_since(tokio::time::Instant::now()));
            let behind = self.gate.issuers().map(|i| i.behind()).unwrap_or_default();
            json!({
                "status": "ready",
                "backend_conditions": self.probe.found(),
                "in_doubt": {
                    "writes": doubts.count(),
                    "startup_quarantine_ms": startup.map(|d| d.as_millis() as u64),
                },
                "lock_tokens_behind": behind,
            })
        };
        let Some(addr) = &self.backend_addr else {
            return json(StatusCode::OK, ready());
        };
        let connect = tokio::net::TcpStream::connect(addr);
        match tokio::time::timeout(Duration::from_secs(2), connect).await {
            Ok(Ok(_)) => json(StatusCode::OK, ready()),
            Ok(Err(e)) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "not ready", "backend": e.to_string()}),
            ),
            Err(_) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "not ready", "backend": "connect timed out"}),
            ),
        }
    }

    async fn list(&self, query: Option<&str>) -> Response<ProxyBody> {
        let query = query::decode_query(query);
        let prefix = query::query_param(&query, "prefix").unwrap_or_default();
        let after = query::query_param(&query, "after");
        let limit = match query::query_param(&query, "limit").map(|l| l.parse::<usize>()) {
            None => DEFAULT_PAGE,
            Some(Ok(l)) if (1..=MAX_PAGE).contains(&l) => l,
            Some(_) => {
                return json(
                    StatusCode::BAD_REQUEST,
                    json!({"error": format!("limit must be 1..={MAX_PAGE}")}),
                );
            }
        };
        match self.gate.table().list(prefix, after, limit).await {
            Ok(page) => {
                let next = (page.len() == limit)
                    .then(|| page.last().map(|r| r.resource.clone()))
                    .flatten();
                json(StatusCode::OK, json!({"fences": page, "next_after": next}))
            }
            Err(e) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": e.to_string()}),
            ),
        }
    }

    async fn get(&self, resource: &str) -> Response<ProxyBody> {
        match self.gate.table().list(resource, None, 1).await {
            Ok(page) => match page.into_iter().find(|r| r.resource == resource) {
                Some(r) => json(StatusCode::OK, json!(r)),
                None => json(
                    StatusCode::NOT_FOUND,
                    json!({"resource": resource, "error": "no fence recorded"}),
                ),
            },
            Err(e) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": e.to_string()}),
            ),
        }
    }

    /// The admin bearer's check: `Err` is the answer to send.
    fn authorized(
        &self,
        req: &Request<Incoming>,
        what: &str,
    ) -> Result<(), Box<Response<ProxyBody>>> {
        let Some(expected) = &self.bearer else {
            return Err(Box::new(json(
                StatusCode::FORBIDDEN,
                json!({"error": format!("no admin token is configured (server.admin_token); {what} is off")}),
            )));
        };
        let given = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same_signature(given, expected.expose()) {
            let mut r = json(
                StatusCode::UNAUTHORIZED,
                json!({"error": "a valid admin bearer token is required"}),
            );
            r.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
            return Err(Box::new(r));
        }
        Ok(())
    }

    async fn raise(&self, resource: &str, req: Request<Incoming>) -> Response<ProxyBody> {
        if let Err(r) = self.authorized(&req, "raising by hand") {
            return *r;
        }
        let body = match Limited::new(req.into_body(), 4096).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return json(StatusCode::BAD_REQUEST, json!({"error": e.to_string()}));
            }
        };
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RaiseBody {
            token: u64,
        }
        let token = match serde_json::from_slice::<RaiseBody>(&body) {
            Ok(b) => b.token,
            Err(e) => {
                return json(
                    StatusCode::BAD_REQUEST,
                    json!({"error": format!("expected {{\"token\": N}} with N an unsigned 64-bit integer: {e}")}),
                );
            }
        };
        match self.gate.raise(resource, token).await {
            Ok(highest) => {
                tracing::warn!(resource, token, highest, "fence raised by hand");
                json(
                    StatusCode::OK,
                    json!({"resource": resource, "highest": highest}),
                )
            }
            Err(Refusal::Stale { highest, .. }) => json(
                StatusCode::CONFLICT,
                json!({"resource": resource, "highest": highest,
                       "error": "a fence is never lowered"}),
            ),
            Err(e) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": e.to_string()}),
            ),
        }
    }

    /// A credential named for a verified lock (`[[eager]] verify`) is
    /// issued only for the token its holder has now, as the lock service
    /// confirms it; for another lock, or none named, as the caller says.
    async fn confirmed(&self, lock: &str, token: u64) -> Result<(), Response<ProxyBody>> {
        let Some(issuers) = self.gate.issuers() else {
            return Ok(());
        };
        let Some(resource) = issuers.resource_of_lock(lock) else {
            return Ok(());
        };
        match issuers.check(resource, token).await {
            Ok(Whose::Holder) => Ok(()),
            Ok(
                Whose::Earlier { holder }
                | Whose::NotIssued {
                    holder: Some(holder),
                },
            ) => Err(json(
                StatusCode::FORBIDDEN,
                json!({"error": format!("lock {lock}'s holder has token {holder}, not {token}: \
                                         no credential is issued for a token the lock's \
                                         holder does not have")}),
            )),
            Ok(Whose::NotIssued { holder: None }) => Err(json(
                StatusCode::FORBIDDEN,
                json!({"error": format!("lock {lock} has no holder now: no credential is \
                                         issued for token {token}")}),
            )),
            Err(why) => Err(json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": format!("lock {lock}'s service cannot be asked whether \
                                         token {token} is its holder's: {why}")}),
            )),
        }
    }

    /// `POST /credentials`: session credentials for a token the caller
    /// holds. The answer is the only place their secret and session token
    /// appear; the log line names the access key id, token, lock and scope.
    async fn credentials(&self, req: Request<Incoming>) -> Response<ProxyBody> {
        if let Err(r) = self.authorized(&req, "issuing credentials") {
            return *r;
        }
        let Some(issuer) = &self.sessions else {
            return json(
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"error": "session credentials are off: in cluster mode every replica \
                                 needs the same [sessions] key_file"}),
            );
        };
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Ask {
            token: u64,
            #[serde(default)]
            lock: String,
            #[serde(default)]
            scope: Vec<String>,
            ttl_secs: Option<u64>,
        }
        let body = match Limited::new(req.into_body(), 64 * 1024).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return json(StatusCode::BAD_REQUEST, json!({"error": e.to_string()})),
        };
        let ask: Ask = match serde_json::from_slice(&body) {
            Ok(a) => a,
            Err(e) => {
                return json(
                    StatusCode::BAD_REQUEST,
                    json!({"error": format!("expected {{\"token\": N, \"lock\": NAME, \"scope\": \
                                             [\"bucket/prefix\", ...], \"ttl_secs\": S}}: {e}")}),
                );
            }
        };
        if let Err(refused) = self.confirmed(&ask.lock, ask.token).await {
            return refused;
        }
        let now = std::time::SystemTime::now();
        let issued = match issuer.issue(ask.token, &ask.lock, &ask.scope, ask.ttl_secs, now) {
            Ok(i) => i,
            Err(e) => return json(StatusCode::BAD_REQUEST, json!({"error": e})),
        };
        let s = &issued.session;
        let scope: Vec<String> = s.scope.iter().map(|x| x.to_string()).collect();
        tracing::info!(
            access_key_id = %issued.access_key_id,
            token = s.token,
            lock = %s.lock,
            scope = %scope.join(","),
            expires = s.expires,
            "session credential issued"
        );
        json(
            StatusCode::OK,
            json!({
                "Version": 1,
                "AccessKeyId": issued.access_key_id,
                "SecretAccessKey": issued.secret_access_key,
                "SessionToken": issued.session_token,
                "Expiration": rfc3339(s.expires),
                "FencingToken": s.token,
                "Lock": s.lock,
                "Scope": scope,
            }),
        )
    }
}
