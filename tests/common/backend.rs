//! A controllable S3 backend for tests: stores PUT bodies in memory (or
//! discards them), records what it saw and when, and can stall a write
//! after its body arrived until the test releases it. It does not check
//! signatures: it stands in for the store, not for fencegate. It can judge
//! `If-Match` / `If-None-Match` when it applies a write (as AWS S3 does),
//! or ignore them (as Garage does, the default).

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Notify;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A request head arrived.
    Start {
        method: String,
        key: String,
        token: Option<u64>,
        /// The request path as sent (virtual-host style omits the bucket).
        raw_path: String,
    },
    /// A PUT body arrived complete.
    BodyComplete { key: String, token: Option<u64> },
    /// A PUT body broke off before it was complete.
    BodyAborted { key: String, token: Option<u64> },
    /// The answer to a PUT went out (the write is done).
    Responded { key: String, token: Option<u64> },
    /// A PUT whose condition did not hold when it was applied: refused
    /// (412), nothing changed. (A refused DELETE answers 412 and records
    /// nothing.)
    Refused { key: String, token: Option<u64> },
}

#[derive(Default)]
struct State {
    objects: Mutex<HashMap<String, Bytes>>,
    events: Mutex<Vec<Event>>,
    stalled_tokens: Mutex<HashSet<u64>>,
    early_tokens: Mutex<HashSet<u64>>,
    released: Mutex<HashSet<u64>>,
    bytes_received: Mutex<u64>,
    changed: Notify,
    discard: bool,
    /// Stalled writes go on when their client leaves, as S3's do.
    finish_detached: std::sync::atomic::AtomicBool,
    /// Conditions are judged when a write is applied.
    judge: std::sync::atomic::AtomicBool,
}

#[derive(Clone)]
pub struct TestBackend {
    pub addr: SocketAddr,
    state: Arc<State>,
}

fn token_of(req: &Request<Incoming>) -> Option<u64> {
    req.headers()
        .get("x-amz-meta-fencing-token")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

impl TestBackend {
    /// A backend that keeps objects in memory.
    pub async fn start() -> TestBackend {
        Self::start_with(false).await
    }

    /// A backend that counts PUT bytes and throws them away.
    pub async fn start_discarding() -> TestBackend {
        Self::start_with(true).await
    }

    /// A backend that keeps objects in memory, over TLS with `cert`/`key`.
    pub async fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> TestBackend {
        let acceptor =
            tokio_rustls::TlsAcceptor::from(fencegate::tls::server_config(cert, key).unwrap());
        Self::start_inner(false, Some(acceptor)).await
    }

    async fn start_with(discard: bool) -> TestBackend {
        Self::start_inner(discard, None).await
    }

    async fn start_inner(discard: bool, tls: Option<tokio_rustls::TlsAcceptor>) -> TestBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            discard,
            ..Default::default()
        });
        let st = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    continue;
                };
                let st = st.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let st = st.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(st, req).await) }
                    });
                    match tls {
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(sock), svc)
                                .await;
                        }
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(sock).await {
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), svc)
                                    .await;
                            }
                        }
                    }
                });
            }
        });
        TestBackend { addr, state }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn as_fencegate_backend(&self) -> super::fencegate::Backend {
        super::fencegate::Backend::S3 {
            endpoint: self.endpoint(),
            access_key: "backend-key".into(),
            secret_key: "backend-secret-never-logged".into(),
        }
    }

    /// Writes stamped with `token` wait after their body until released.
    pub fn stall_after_body(&self, token: u64) {
        self.state.stalled_tokens.lock().unwrap().insert(token);
    }

    /// Stalled writes with `token` are answered the way S3 answers a copy
    /// or CompleteMultipartUpload: a `200` head at once, white space while
    /// stalled, and the result at the end of the body, once released.
    pub fn answer_early(&self, token: u64) {
        self.state.early_tokens.lock().unwrap().insert(token);
    }

    /// A stalled write whose client (fencegate) goes away is still applied
    /// when released, as S3 applies a request whose body it has. By
    /// default hyper drops it with its connection.
    pub fn finish_stalled_writes_of_departed_clients(&self) {
        self.state
            .finish_detached
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// `If-Match` and `If-None-Match` are judged when a write is applied
    /// (a stalled one: when it is released), as AWS S3 judges them.
    pub fn judge_conditions(&self) {
        self.state
            .judge
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn release(&self, token: u64) {
        self.state.released.lock().unwrap().insert(token);
        self.state.changed.notify_waiters();
    }

    pub fn events(&self) -> Vec<Event> {
        self.state.events.lock().unwrap().clone()
    }

    pub fn object(&self, bucket: &str, key: &str) -> Option<Bytes> {
        self.state
            .objects
            .lock()
            .unwrap()
            .get(&format!("{bucket}/{key}"))
            .cloned()
    }

    pub fn bytes_received(&self) -> u64 {
        *self.state.bytes_received.lock().unwrap()
    }

    /// Whether a request stamped with `token` reached the backend at all.
    pub fn started(&self, token: u64) -> bool {
        self.events()
            .iter()
            .any(|e| matches!(e, Event::Start { token: Some(t), .. } if *t == token))
    }

    /// Waits until the whole body of the write stamped `token` arrived.
    pub async fn wait_body_complete(&self, token: u64) {
        self.wait_for(&format!("{token}'s body at the backend"), |ev| {
            ev.iter()
                .any(|e| matches!(e, Event::BodyComplete { token: Some(t), .. } if *t == token))
        })
        .await
    }

    /// Waits (up to 20 s) until `pred` holds for the event log.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[Event]) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let notified = self.state.changed.notified();
            if pred(&self.events()) {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("timed out waiting for: {what}; events: {:?}", self.events());
            }
        }
    }
}

/// An object's ETag: its bytes' MD5, as S3 gives a single-part object.
pub fn etag_of(data: &[u8]) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(data))
}

/// The conditions a write came with.
#[derive(Clone, Default)]
struct Conditions {
    if_match: Option<String>,
    if_none_match: bool,
}

impl Conditions {
    fn of(req: &Request<Incoming>) -> Conditions {
        let h = req.headers();
        Conditions {
            if_match: h
                .get("if-match")
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim_matches('"').to_string()),
            if_none_match: h.get("if-none-match").is_some_and(|v| v == "*"),
        }
    }

    /// Whether they hold on `current`, the object as it is now.
    fn hold(&self, current: Option<&Bytes>) -> bool {
        if self.if_none_match && current.is_some() {
            return false;
        }
        match (&self.if_match, current) {
            (Some(_), None) => false,
            (Some(e), Some(c)) => *e == etag_of(c),
            (None, _) => true,
        }
    }
}

/// Applies a PUT, judging its conditions when the backend does: the ETag,
/// or `None` when refused.
fn apply(
    st: &State,
    key: &str,
    data: Vec<u8>,
    c: &Conditions,
    token: Option<u64>,
) -> Option<String> {
    let mut objects = st.objects.lock().unwrap();
    if st.judge.load(std::sync::atomic::Ordering::SeqCst) && !c.hold(objects.get(key)) {
        drop(objects);
        record(
            st,
            Event::Refused {
                key: key.to_string(),
                token,
            },
        );
        return None;
    }
    let etag = etag_of(&data);
    objects.insert(key.to_string(), Bytes::from(data));
    drop(objects);
    record(
        st,
        Event::Responded {
            key: key.to_string(),
            token,
        },
    );
    Some(etag)
}

/// The answer to an applied (or refused) write.
fn answer(etag: Option<String>) -> Response<Full<Bytes>> {
    match etag {
        Some(e) => Response::builder()
            .status(200)
            .header("etag", format!("\"{e}\""))
            .body(Full::default())
            .unwrap(),
        None => Response::builder()
            .status(412)
            .body(Full::new(Bytes::from_static(
                b"<Error><Code>PreconditionFailed</Code></Error>",
            )))
            .unwrap(),
    }
}

fn record(st: &State, e: Event) {
    st.events.lock().unwrap().push(e);
    st.changed.notify_waiters();
}

type TestBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Response<TestBody> {
    match handle_write_or_read(st, req).await {
        Ok(full) => full.map(BodyExt::boxed),
        Err(streaming) => streaming,
    }
}

/// Waits until `token` is released.
async fn released(st: &State, token: u64) {
    loop {
        let notified = st.changed.notified();
        if st.released.lock().unwrap().contains(&token) {
            return;
        }
        notified.await;
    }
}

/// The early-answer form of a stalled write (see `answer_early`).
fn answer_early(st: Arc<State>, key: String, data: Vec<u8>, token: u64) -> Response<TestBody> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        let _ = tx.send(Bytes::from_static(b" \n")).await;
        released(&st, token).await;
        st.objects
            .lock()
            .unwrap()
            .insert(key.clone(), Bytes::from(data));
        record(
            &st,
            Event::Responded {
                key,
                token: Some(token),
            },
        );
        let _ = tx
            .send(Bytes::from_static(
                b"<CopyObjectResult><ETag>\"e\"</ETag></CopyObjectResult>",
            ))
            .await;
    });
    let frames = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
        .map(|b| Ok::<_, std::convert::Infallible>(http_body::Frame::data(b)));
    Response::new(BodyExt::boxed(http_body_util::StreamBody::new(frames)))
}

/// `Err` carries an answer whose body streams (the early-answer form).
async fn handle_write_or_read(
    st: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Response<TestBody>> {
    let method = req.method().to_string();
    let (raw_path, key) = key_of(&req);
    let token = token_of(&req);
    let conditions = Conditions::of(&req);
    record(
        &st,
        Event::Start {
            method: method.clone(),
            key: key.clone(),
            token,
            raw_path,
        },
    );
    match method.as_str() {
        "PUT" if key.contains('/') => handle_put(st, req, key, token, conditions).await,
        "HEAD" if key.contains('/') => Ok(handle_head(&st, &key)),
        "DELETE" if key.contains('/') => Ok(handle_delete(&st, &key, &conditions)),
        "GET" => Ok(handle_get(&st, &key)),
        _ => Ok(Response::new(Full::default())),
    }
}

/// The request's raw path and its decoded `bucket/key` (a virtual-host
/// style `Host: bucket.127.0.0.1:port` supplies the bucket).
fn key_of(req: &Request<Incoming>) -> (String, String) {
    let raw_path = req.uri().path().to_string();
    let mut path = raw_path.trim_start_matches('/').to_string();
    // Virtual-host style: `Host: bucket.127.0.0.1:port`.
    if let Some(host) = req.headers().get("host").and_then(|h| h.to_str().ok())
        && let Some((bucket, rest)) = host.split_once('.')
        && rest.starts_with("127.0.0.1")
    {
        path = format!("{bucket}/{path}");
    }
    let key = percent_encoding::percent_decode_str(&path)
        .decode_utf8_lossy()
        .into_owned();
    (raw_path, key)
}

/// A PUT: reads the body whole, waits while its token is stalled (or
/// answers early, or finishes detached), then applies it.
async fn handle_put(
    st: Arc<State>,
    req: Request<Incoming>,
    key: String,
    token: Option<u64>,
    conditions: Conditions,
) -> Result<Response<Full<Bytes>>, Response<TestBody>> {
    let mut body = req.into_body();
    let mut data = Vec::new();
    loop {
        match body.frame().await {
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    *st.bytes_received.lock().unwrap() += d.len() as u64;
                    if !st.discard {
                        data.extend_from_slice(&d);
                    }
                }
            }
            Some(Err(_)) => {
                record(&st, Event::BodyAborted { key, token });
                return Ok(Response::builder()
                    .status(400)
                    .body(Full::default())
                    .unwrap());
            }
            None => break,
        }
    }
    record(
        &st,
        Event::BodyComplete {
            key: key.clone(),
            token,
        },
    );
    if let Some(t) = token
        && st.stalled_tokens.lock().unwrap().contains(&t)
    {
        if st.early_tokens.lock().unwrap().contains(&t) {
            return Err(answer_early(st.clone(), key, data, t));
        }
        if st.finish_detached.load(std::sync::atomic::Ordering::SeqCst) {
            // In a task of its own: dropping this request's future
            // (its connection closed) does not stop it.
            let (st2, key2) = (st.clone(), key.clone());
            let applied = tokio::spawn(async move {
                released(&st2, t).await;
                apply(&st2, &key2, data, &conditions, token)
            });
            return Ok(answer(applied.await.unwrap()));
        }
        released(&st, t).await;
    }
    Ok(answer(apply(&st, &key, data, &conditions, token)))
}

/// A HEAD: the object's ETag and length, or 404.
fn handle_head(st: &State, key: &str) -> Response<Full<Bytes>> {
    match st.objects.lock().unwrap().get(key) {
        Some(b) => Response::builder()
            .status(200)
            .header("etag", format!("\"{}\"", etag_of(b)))
            .header("content-length", b.len())
            .body(Full::default())
            .unwrap(),
        None => Response::builder()
            .status(404)
            .body(Full::default())
            .unwrap(),
    }
}

/// A DELETE: 204, or 412 where judging is on and its If-Match fails.
fn handle_delete(st: &State, key: &str, conditions: &Conditions) -> Response<Full<Bytes>> {
    let mut objects = st.objects.lock().unwrap();
    let judge = st.judge.load(std::sync::atomic::Ordering::SeqCst);
    if judge && conditions.if_match.is_some() && !conditions.hold(objects.get(key)) {
        return answer(None);
    }
    objects.remove(key);
    Response::builder()
        .status(204)
        .body(Full::default())
        .unwrap()
}

/// A GET: the object's bytes, or 404 NoSuchKey.
fn handle_get(st: &State, key: &str) -> Response<Full<Bytes>> {
    match st.objects.lock().unwrap().get(key) {
        Some(b) => Response::new(Full::new(b.clone())),
        None => Response::builder()
            .status(404)
            .body(Full::new(Bytes::from_static(
                b"<Error><Code>NoSuchKey</Code></Error>",
            )))
            .unwrap(),
    }
}

/// Whether the backend saw any request at all for `key`.
pub fn saw_key(events: &[Event], key: &str) -> bool {
    events.iter().any(|e| match e {
        Event::Start { key: k, .. } => k == key,
        _ => false,
    })
}
