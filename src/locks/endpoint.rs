//! `fencegate lock --credentials-endpoint`: session credentials for the
//! lock's token, for as long as the lock is held, served the way the AWS
//! SDKs fetch container credentials (docs/credentials.md).
//!
//! A program started with `AWS_CONTAINER_CREDENTIALS_FULL_URI` and
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN` (or `..._TOKEN_FILE`) in its
//! environment asks that URL for `{AccessKeyId, SecretAccessKey, Token,
//! Expiration}`, sending the token as its `Authorization` header, and asks
//! again before `Expiration`. So credentials can be short and still last
//! a compactor's days:
//!
//! - the endpoint listens on a loopback address of its own, behind a random
//!   authorization token; a caller without it gets `401`;
//! - it has credentials issued (by the caller's [`CredsSource`]: fencegate's
//!   admin API) at start and again each half of their lifetime, and serves
//!   the current ones;
//! - the moment the lock is lost it stops: every later fetch gets `503`
//!   with a `LockLost` error, and the credentials it served run out within
//!   their short lifetime (the fence refuses their token before that, once
//!   the next holder writes).

use futures_util::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// Session credentials as the endpoint serves them.
#[derive(Clone, Debug)]
pub struct Creds {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
    /// ISO 8601, as issued.
    pub expiration: String,
}

/// Where the endpoint gets fresh credentials for the lock's token (in
/// `fencegate lock`, issued by the admin API).
pub type CredsSource = Arc<dyn Fn() -> BoxFuture<'static, Result<Creds, String>> + Send + Sync>;

/// The endpoint, running until dropped.
pub struct Endpoint {
    pub url: String,
    pub token: String,
    pub token_file: PathBuf,
    server: tokio::task::JoinHandle<()>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    /// The program's environment: where to fetch and the token to show.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "AWS_CONTAINER_CREDENTIALS_FULL_URI".into(),
                self.url.clone(),
            ),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN".into(),
                self.token.clone(),
            ),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE".into(),
                self.token_file.display().to_string(),
            ),
        ]
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.server.abort();
        self.renewer.abort();
        let _ = std::fs::remove_file(&self.token_file);
    }
}

/// What the endpoint serves: the current credentials, or why none.
struct State {
    auth: String,
    current: Mutex<Result<Creds, String>>,
}

/// Starts the endpoint on `listen` (a loopback address; port 0 picks one),
/// with credentials of `ttl` from `issue`, renewed each half of `ttl`
/// until `lost` says the lock is gone. `token_file`: where to write the
/// authorization token (a new private file in the temporary directory when
/// `None`). Fails when the first credentials cannot be issued.
pub async fn start(
    listen: SocketAddr,
    token_file: Option<PathBuf>,
    issue: CredsSource,
    ttl: Duration,
    mut lost: watch::Receiver<bool>,
) -> Result<Endpoint, String> {
    if !listen.ip().is_loopback() {
        return Err(format!(
            "--credentials-listen {listen}: the endpoint listens on loopback only"
        ));
    }
    let first = issue().await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("credentials endpoint on {listen}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let auth = format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    let token_file = write_token(token_file, &auth)?;
    let state = Arc::new(State {
        auth: auth.clone(),
        current: Mutex::new(Ok(first)),
    });
    let renewing = state.clone();
    let renewer = tokio::spawn(async move {
        let mut every = ttl / 2;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = lost.wait_for(|l| *l) => {
                    *renewing.lock() = Err("the lock was lost".into());
                    return;
                }
            }
            every = match issue().await {
                Ok(c) => {
                    *renewing.lock() = Ok(c);
                    ttl / 2
                }
                Err(e) => {
                    tracing::warn!("credentials endpoint: renewing: {e}; trying again in 1 s");
                    Duration::from_secs(1)
                }
            };
        }
    });
    let server = tokio::spawn(serve(listener, state));
    Ok(Endpoint {
        url: format!("http://{addr}/credentials"),
        token: auth,
        token_file,
        server,
        renewer,
    })
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, Result<Creds, String>> {
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer to one fetch.
    fn answer(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        let shown = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if shown != Some(self.auth.as_bytes()) {
            return json(
                StatusCode::UNAUTHORIZED,
                serde_json::json!({"Code": "Unauthorized",
                    "Message": "the Authorization header must be AWS_CONTAINER_AUTHORIZATION_TOKEN"}),
            );
        }
        match &*self.lock() {
            Ok(c) => json(
                StatusCode::OK,
                serde_json::json!({
                    "AccessKeyId": c.access_key_id,
                    "SecretAccessKey": c.secret_access_key,
                    "Token": c.session_token,
                    "Expiration": c.expiration,
                }),
            ),
            Err(why) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"Code": "LockLost",
                    "Message": format!("fencegate lock issues no more credentials: {why}")}),
            ),
        }
    }
}

fn json(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

/// Serves fetches until the task is aborted.
async fn serve(listener: tokio::net::TcpListener, state: Arc<State>) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = state.answer(&req);
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(sock), service)
                .await;
        });
    }
}

/// Writes the authorization token to `path` (or a new file in the
/// temporary directory), readable by its owner only (mode 0600) whether or
/// not `path` was there before: the token goes into a new file of that
/// mode beside it, which then takes its name. Writing into a file that
/// was there would keep its mode (a world-readable one stays readable),
/// and anyone who had it open would read the token.
fn write_token(path: Option<PathBuf>, token: &str) -> Result<PathBuf, String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = path.unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "fencegate-lock-{}-{:08x}.token",
            std::process::id(),
            rand::random::<u32>()
        ))
    });
    let failed = |e: std::io::Error| format!("cannot write the token file {}: {e}", path.display());
    let name = path.file_name().ok_or_else(|| {
        format!(
            "cannot write the token file {}: not a file name",
            path.display()
        )
    })?;
    let mut fresh_name = std::ffi::OsString::from(".");
    fresh_name.push(name);
    fresh_name.push(format!(".{:08x}.new", rand::random::<u32>()));
    let fresh = path.with_file_name(fresh_name);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&fresh)
        .and_then(|mut f| f.write_all(token.as_bytes()))
        .and_then(|()| std::fs::rename(&fresh, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&fresh);
        return Err(failed(e));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(n: Arc<std::sync::atomic::AtomicU32>) -> CredsSource {
        Arc::new(move || {
            let i = n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Box::pin(async move {
                Ok(Creds {
                    access_key_id: format!("FGS{i}"),
                    secret_access_key: "s".into(),
                    session_token: "t".into(),
                    expiration: "2030-01-01T00:00:00Z".into(),
                })
            })
        })
    }

    async fn fetch(url: &str, auth: Option<&str>) -> (u16, serde_json::Value) {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http::<Full<Bytes>>();
        let mut req = Request::get(url);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = client.request(req.body(Full::default()).unwrap()).await;
        let resp = resp.unwrap();
        let status = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap()
            .to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn it_serves_renewed_credentials_to_the_token_only_until_the_lock_is_lost() {
        let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (lost, rx) = watch::channel(false);
        let ttl = Duration::from_millis(400);
        let ep = start("127.0.0.1:0".parse().unwrap(), None, source(n), ttl, rx)
            .await
            .unwrap();
        assert_eq!(std::fs::read_to_string(&ep.token_file).unwrap(), ep.token);
        let (status, _) = fetch(&ep.url, None).await;
        assert_eq!(status, 401);
        let (status, _) = fetch(&ep.url, Some("wrong")).await;
        assert_eq!(status, 401);
        let (status, first) = fetch(&ep.url, Some(&ep.token)).await;
        assert_eq!(status, 200);
        assert_eq!(first["AccessKeyId"], "FGS0");
        assert_eq!(first["Token"], "t");
        tokio::time::sleep(ttl).await;
        let (_, later) = fetch(&ep.url, Some(&ep.token)).await;
        assert_ne!(later["AccessKeyId"], "FGS0", "renewed within its lifetime");
        lost.send_replace(true);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (status, gone) = fetch(&ep.url, Some(&ep.token)).await;
        assert_eq!(status, 503);
        assert_eq!(gone["Code"], "LockLost");
        let file = ep.token_file.clone();
        drop(ep);
        assert!(!file.exists());
    }

    /// The token file is its owner's alone also when the path named was
    /// there before, readable by all (its mode was kept, the token written
    /// into it).
    #[tokio::test]
    async fn the_token_file_is_private_even_over_a_readable_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "an older, longer content than a token").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (_lost, rx) = watch::channel(false);
        let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let at = "127.0.0.1:0".parse().unwrap();
        let ep = start(
            at,
            Some(path.clone()),
            source(n),
            Duration::from_secs(60),
            rx,
        )
        .await
        .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), ep.token);
        // Nothing is left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let default = start(
            at,
            None,
            source(Arc::default()),
            Duration::from_secs(60),
            watch::channel(false).1,
        )
        .await
        .unwrap();
        let mode = std::fs::metadata(&default.token_file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }

    #[tokio::test]
    async fn it_listens_on_loopback_only() {
        let (_lost, rx) = watch::channel(false);
        let n = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let at = "0.0.0.0:0".parse().unwrap();
        let err = start(at, None, source(n), Duration::from_secs(60), rx).await;
        assert!(err.err().unwrap().contains("loopback only"));
    }
}
