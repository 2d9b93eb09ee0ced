//! The load generator: `concurrency` workers, each a loop of SigV4-signed
//! requests on one keep-alive connection, timed from the first byte sent to
//! the last byte of the answer read. It must not be the bottleneck, so the
//! per-request work is small: the body is slices of one generated block, its
//! SHA-256 is computed once, the signing key once a day, the date once a
//! second; a request costs one canonical string, one SHA-256 and one HMAC.
//! Bodies above `--sha256-limit` go as UNSIGNED-PAYLOAD and stream, so memory
//! stays flat at 2 GiB.

use super::GenBody;
use super::report::{Report, Tally};
use crate::s3::headers::{X_AMZ_CONTENT_SHA256, X_AMZ_DATE};
use crate::s3::signing_key::{KeyCache, signing_key};
use crate::s3::sigv4::{self, EMPTY_SHA256};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::BodyExt;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    Put,
    Get,
    /// A HEAD of the object a GET would read.
    Head,
}

/// The condition each PUT carries (docs/conditional-writes.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Condition {
    None,
    /// `If-None-Match: *` on a fresh key each time (every PUT creates).
    IfNoneMatch,
    /// `If-Match` on the ETag of the worker's key, learnt from its
    /// previous PUT (the first goes without).
    IfMatch,
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// S3 endpoint, e.g. http://127.0.0.1:9000 (path-style addressing).
    #[arg(long, required = true)]
    pub endpoint: Option<String>,
    #[arg(long, default_value = "bench")]
    pub bucket: String,
    #[arg(long, value_enum, default_value = "put")]
    pub op: Op,
    /// Object size: bytes, or with KiB, MiB, GiB.
    #[arg(long, default_value = "4KiB", value_parser = super::parse_size)]
    pub size: u64,
    /// Requests in flight at once (one connection each).
    #[arg(short, long, default_value_t = 1)]
    pub concurrency: usize,
    /// Run for this many seconds (the default, 10, unless --requests is given).
    #[arg(long, conflicts_with = "requests")]
    pub duration: Option<f64>,
    /// Send this many requests in all, then stop.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Fencing token sent in the token header on every request.
    #[arg(long)]
    pub token: Option<u64>,
    /// The condition every PUT carries.
    #[arg(long, value_enum, default_value = "none")]
    pub condition: Condition,
    #[arg(long, default_value = "x-fencing-token")]
    pub token_header: String,
    #[arg(long, env = "AWS_ACCESS_KEY_ID", default_value = "fencegate-demo")]
    pub access_key: String,
    #[arg(
        long,
        env = "AWS_SECRET_ACCESS_KEY",
        default_value = "fencegate-demo-secret-key",
        hide_env_values = true
    )]
    pub secret_key: String,
    #[arg(long, env = "AWS_DEFAULT_REGION", default_value = "us-east-1")]
    pub region: String,
    /// Objects up to this size are signed with their SHA-256; larger ones
    /// go as UNSIGNED-PAYLOAD.
    #[arg(long, default_value = "16MiB", value_parser = super::parse_size)]
    pub sha256_limit: u64,
    /// Keys are `PREFIX/<size>/w<worker>`: each worker rewrites its own key.
    #[arg(long, default_value = "bench")]
    pub key_prefix: String,
    /// Send CreateBucket first (an error answer is ignored).
    #[arg(long)]
    pub create_bucket: bool,
    /// GETs: read the keys as they are, without PUTting them first (a
    /// server that has them already, such as nginx serving files).
    #[arg(long)]
    pub no_setup: bool,
    /// Runtime worker threads of the generator.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Print the JSON line on stdout (the human line goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// KEY=VALUE added to the JSON line (repeatable), e.g. path=fencegate.
    #[arg(long = "tag", value_parser = parse_tag)]
    pub tags: Vec<(String, String)>,
}

fn parse_tag(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

/// Signs requests of one worker: the signing key is derived once per day,
/// the date string once per second. A token header is signed with the rest
/// (fencegate refuses one the signature does not cover on a presigned URL,
/// and with `fence.require_signed_token`).
struct Signer {
    access_key: String,
    secret_key: String,
    region: String,
    host: String,
    /// `(lower-case name, value)` of the token header, if any.
    token: Option<(String, String)>,
    /// The day's key and the second's begun signature, as the proxy keeps
    /// them.
    keys: KeyCache,
    /// The second last signed in, with its `x-amz-date` and scope.
    stamp: Option<(u64, String, String)>,
}

impl Signer {
    fn new(access_key: &str, secret_key: &str, region: &str, host: &str) -> Signer {
        Signer {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            region: region.into(),
            host: host.into(),
            token: None,
            keys: KeyCache::default(),
            stamp: None,
        }
    }

    /// The `x-amz-date` and `Authorization` values for a request.
    fn sign(&mut self, method: &str, path: &str, content_sha: &str) -> (String, String) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.sign_at(now, method, path, content_sha)
    }

    /// The same, for a request made at `now` (Unix seconds).
    fn sign_at(
        &mut self,
        now: u64,
        method: &str,
        path: &str,
        content_sha: &str,
    ) -> (String, String) {
        if self
            .stamp
            .as_ref()
            .is_none_or(|(second, ..)| *second != now)
        {
            let date = sigv4::amz_date(now);
            let scope = format!("{}/{}/s3/aws4_request", &date[..8], self.region);
            self.stamp = Some((now, date, scope));
        }
        let (_, amz_date, scope) = self.stamp.as_ref().expect("set above");
        let (sha_name, date_name) = (X_AMZ_CONTENT_SHA256, X_AMZ_DATE);
        let mut headers = vec![
            ("host", self.host.as_str()),
            (sha_name.as_str(), content_sha),
            (date_name.as_str(), amz_date.as_str()),
        ];
        if let Some((name, value)) = &self.token {
            headers.push((name.as_str(), value.as_str()));
        }
        headers.sort_unstable();
        let mut canonical = format!("{method}\n{path}\n\n");
        for (name, value) in &headers {
            canonical.push_str(&format!("{name}:{value}\n"));
        }
        let signed_headers = headers
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>()
            .join(";");
        canonical.push_str(&format!("\n{signed_headers}\n{content_sha}"));
        let day = &amz_date[..8];
        let derive = || signing_key(&self.secret_key, day, &self.region, "s3");
        let started = self.keys.start(scope, amz_date, derive);
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope},SignedHeaders={signed_headers},Signature={}",
            self.access_key,
            sigv4::hex_lower(&started.finish(canonical.as_bytes()))
        );
        (amz_date.clone(), authorization)
    }
}

type HttpClient = Client<HttpConnector, GenBody>;

/// What every worker shares.
struct Plan {
    client: HttpClient,
    base: String,
    args: LoadArgs,
    block: Bytes,
    /// The PUT body's content hash (hex), or UNSIGNED-PAYLOAD.
    put_sha: String,
    /// Set when the timed part starts (after a GET run's uploads).
    deadline: OnceLock<Instant>,
    remaining: AtomicU64,
}

/// Runs the load described by `args` and reports what it measured.
pub async fn run(args: LoadArgs) -> Result<Report, String> {
    let endpoint = args.endpoint.clone().unwrap_or_default();
    let uri: Uri = endpoint
        .parse()
        .map_err(|e| format!("--endpoint {endpoint:?}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!("--endpoint {endpoint:?} must be http://host:port"));
    }
    let block = super::pattern_block();
    let sha256 = args.op == Op::Put && args.size <= args.sha256_limit;
    let payload = if sha256 { "sha256" } else { "unsigned" };
    let put_sha = match sha256 {
        true => body_sha256(args.size, &block).await,
        false => "UNSIGNED-PAYLOAD".to_string(),
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(Duration::from_secs(60))
        .build(connector);
    let concurrency = args.concurrency.max(1);
    let plan = Arc::new(Plan {
        client,
        base: format!("http://{}", uri.authority().expect("checked")),
        deadline: OnceLock::new(),
        remaining: AtomicU64::new(args.requests.unwrap_or(u64::MAX)),
        args,
        block,
        put_sha,
    });
    if plan.args.create_bucket {
        let mut w = Worker::new(&plan, usize::MAX);
        let path = format!("/{}", plan.args.bucket);
        let _ = w.send(Method::PUT, &path, 0, EMPTY_SHA256).await;
    }
    if matches!(plan.args.op, Op::Get | Op::Head) && !plan.args.no_setup {
        put_objects(&plan, concurrency).await?;
    }
    let duration = match (plan.args.duration, plan.args.requests) {
        (Some(d), _) => Some(d),
        (None, None) => Some(10.0),
        (None, Some(_)) => None,
    };
    if let Some(d) = duration {
        let _ = plan
            .deadline
            .set(Instant::now() + Duration::from_secs_f64(d));
    }
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency)
        .map(|i| tokio::spawn(Worker::new(&plan, i).run()))
        .collect();
    let mut tally = Tally::default();
    for w in workers {
        tally.merge(w.await.map_err(|e| format!("worker failed: {e}"))?);
    }
    let elapsed = started.elapsed();
    Ok(Report {
        op: match plan.args.op {
            Op::Put => "put",
            Op::Get => "get",
            Op::Head => "head",
        },
        size: plan.args.size,
        concurrency,
        payload,
        elapsed,
        tally,
        tags: plan.args.tags.clone(),
    })
}

/// The hex SHA-256 of the body a PUT of `size` sends.
async fn body_sha256(size: u64, block: &Bytes) -> String {
    let mut h = <sha2::Sha256 as sha2::Digest>::new();
    let mut body = GenBody::new(size, block);
    while let Some(Ok(f)) = body.frame().await {
        sha2::Digest::update(&mut h, f.data_ref().expect("data frames"));
    }
    hex::encode(sha2::Digest::finalize(h))
}

/// Puts each worker's object, which must exist before GETs are timed.
async fn put_objects(plan: &Arc<Plan>, workers: usize) -> Result<(), String> {
    for i in 0..workers {
        let mut w = Worker::new(plan, i);
        let key = w.key.clone();
        match w
            .send(Method::PUT, &key, plan.args.size, "UNSIGNED-PAYLOAD")
            .await
        {
            Ok(200) => {}
            Ok(s) => return Err(format!("setting up {}: status {s}", w.key)),
            Err(e) => return Err(format!("setting up {}: {e}", w.key)),
        }
    }
    Ok(())
}

impl Plan {
    /// Takes one request from the budget; false when the run is over.
    fn take(&self) -> bool {
        if let Some(d) = self.deadline.get()
            && Instant::now() >= *d
        {
            return false;
        }
        self.remaining
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

struct Worker {
    plan: Arc<Plan>,
    signer: Signer,
    key: String,
    token: Option<HeaderValue>,
    /// The ETag of the worker's key after its last PUT (`--condition if-match`).
    etag: Option<HeaderValue>,
    /// PUTs sent (`--condition if-none-match` names a fresh key by it).
    sent: u64,
}

impl Worker {
    fn new(plan: &Arc<Plan>, i: usize) -> Worker {
        let a = &plan.args;
        let key = format!(
            "/{}/{}/{}/w{i}",
            a.bucket,
            a.key_prefix,
            super::size_name(a.size)
        );
        Worker {
            plan: plan.clone(),
            signer: Signer {
                token: a
                    .token
                    .map(|t| (a.token_header.to_ascii_lowercase(), t.to_string())),
                ..Signer::new(
                    &a.access_key,
                    &a.secret_key,
                    &a.region,
                    plan.base.trim_start_matches("http://"),
                )
            },
            key: sigv4::canonical_uri(&key),
            token: a.token.map(HeaderValue::from),
            etag: None,
            sent: 0,
        }
    }

    /// The path and condition of the next timed PUT.
    fn next_put(&mut self) -> (String, Option<(http::HeaderName, HeaderValue)>) {
        self.sent += 1;
        match self.plan.args.condition {
            Condition::None => (self.key.clone(), None),
            Condition::IfNoneMatch => (
                format!("{}-{}", self.key, self.sent),
                Some((http::header::IF_NONE_MATCH, HeaderValue::from_static("*"))),
            ),
            Condition::IfMatch => (
                self.key.clone(),
                self.etag.clone().map(|e| (http::header::IF_MATCH, e)),
            ),
        }
    }

    async fn run(mut self) -> Tally {
        let mut tally = Tally::default();
        let (method, size, sha) = match self.plan.args.op {
            Op::Put => (Method::PUT, self.plan.args.size, self.plan.put_sha.clone()),
            Op::Get => (Method::GET, 0, EMPTY_SHA256.to_string()),
            Op::Head => (Method::HEAD, 0, EMPTY_SHA256.to_string()),
        };
        while self.plan.take() {
            let (key, condition) = match method {
                Method::PUT => self.next_put(),
                _ => (self.key.clone(), None),
            };
            let t0 = Instant::now();
            match self
                .send_with(method.clone(), &key, size, &sha, condition)
                .await
            {
                Ok(s) if (200..300).contains(&s) => tally.record_ok(t0.elapsed()),
                Ok(s) => tally.record_status(s, || format!("status {s} on {method} {key}")),
                Err(e) => {
                    tally.record_transport(e);
                    // Do not spin on a dead endpoint.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        tally
    }

    /// One request; the answer's body is read to the end (and dropped) so
    /// that the connection is reused. Returns the status.
    async fn send(
        &mut self,
        method: Method,
        path: &str,
        len: u64,
        sha: &str,
    ) -> Result<u16, String> {
        self.send_with(method, path, len, sha, None).await
    }

    /// [`Worker::send`] with a condition header (not signed: only `x-amz-*`
    /// headers must be). A 2xx answer's ETag is remembered for the next.
    async fn send_with(
        &mut self,
        method: Method,
        path: &str,
        len: u64,
        sha: &str,
        condition: Option<(http::HeaderName, HeaderValue)>,
    ) -> Result<u16, String> {
        let (date, authorization) = self.signer.sign(method.as_str(), path, sha);
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.plan.base))
            .header(http::header::HOST, self.signer.host.as_str())
            .header(X_AMZ_DATE, date)
            .header(X_AMZ_CONTENT_SHA256, sha)
            .header(http::header::AUTHORIZATION, authorization);
        if let Some(t) = &self.token {
            req = req.header(self.plan.args.token_header.as_str(), t.clone());
        }
        if len > 0 {
            req = req.header(http::header::CONTENT_LENGTH, len);
        }
        if let Some((name, value)) = condition {
            req = req.header(name, value);
        }
        let req = req
            .body(GenBody::new(len, &self.plan.block))
            .map_err(|e| e.to_string())?;
        let resp = self
            .plan
            .client
            .request(req)
            .await
            .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))?;
        let status = resp.status().as_u16();
        if resp.status().is_success()
            && let Some(e) = resp.headers().get(http::header::ETAG)
        {
            self.etag = Some(e.clone());
        }
        let mut body = resp.into_body();
        while let Some(frame) = body.frame().await {
            frame.map_err(|e| format!("reading the answer: {e}"))?;
        }
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::auth;

    fn signer(secret: &str) -> Signer {
        Signer::new("AK", secret, "us-east-1", "127.0.0.1:9000")
    }

    /// fencegate's verifier on a GET of /b/k signed as `(date, authorization)`.
    fn verify_get(
        creds: &auth::Credentials,
        (date, authz): (String, String),
        now: SystemTime,
    ) -> Result<(), crate::s3::error::S3Error> {
        let mut h = http::HeaderMap::new();
        h.insert("host", "127.0.0.1:9000".parse().unwrap());
        h.insert("x-amz-date", date.parse().unwrap());
        h.insert("x-amz-content-sha256", EMPTY_SHA256.parse().unwrap());
        h.insert("authorization", authz.parse().unwrap());
        let head = auth::Head {
            method: "GET",
            raw_path: "/b/k",
            query: &[],
            headers: &h,
        };
        auth::verify(&head, creds, "us-east-1", now).map(|_| ())
    }

    fn credentials() -> auth::Credentials {
        auth::Credentials::new(&[crate::config::Credential {
            access_key_id: "AK".into(),
            secret_access_key: "SK".into(),
            buckets: vec!["*".into()],
            bucket_admin: false,
        }])
    }

    #[test]
    fn signatures_verify_with_fencegate_verifier() {
        let signed = signer("SK").sign("GET", "/b/k", EMPTY_SHA256);
        verify_get(&credentials(), signed, SystemTime::now()).unwrap();
    }

    /// The kept timestamp, key and begun signature follow the clock: twice
    /// in one second, then the next second, the next day and an hour on
    /// (a stale timestamp would be an hour off, past the allowed skew).
    #[test]
    fn signatures_over_seconds_and_days_verify() {
        let mut s = signer("SK");
        let midnight = 1_795_000_000 - 1_795_000_000 % 86_400;
        for now in [midnight - 1, midnight - 1, midnight, midnight + 3600] {
            let at = UNIX_EPOCH + Duration::from_secs(now);
            let signed = s.sign_at(now, "GET", "/b/k", EMPTY_SHA256);
            verify_get(&credentials(), signed, at).unwrap();
        }
    }
}
