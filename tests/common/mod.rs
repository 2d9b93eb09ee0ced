//! Shared helpers for the integration tests: the fencegate process, a
//! controllable test backend, a hand-driven SigV4 client, and an SDK client.
#![allow(dead_code)]

pub mod backend;
pub mod embedded;
pub mod etcd;
pub mod fencegate;
pub mod garage;
pub mod jobs;
pub mod lock_holder;
pub mod moto;
pub mod postgres;
pub mod raw;
pub mod raw_body;
pub mod redis;
pub mod relay;
pub mod replicas;
pub mod secure;
pub mod zookeeper;

/// A free loopback port for a service a test starts (Garage, etcd, moto, ...).
///
/// Ports come from below the kernel's ephemeral range, so that no outgoing
/// connection of this or any other process can take the port between this
/// check and the service's own bind (a port from `bind(0)` could, and once
/// did in CI: Garage panicked with AddrInUse). Each test binary starts at
/// an offset drawn from its pid and counts up, and a port is only handed out
/// when it can be bound right now.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&h| h > LOW + 1_000)
        .unwrap_or(32_768);
    let span = high - LOW;
    let start = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let port = (LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {LOW} and {high}");
}

/// Polls `ok` every 50 ms until it holds or `secs` pass; panics with `what`.
pub fn wait_until(secs: u64, what: &str, ok: impl FnMut() -> bool) {
    assert!(poll_until(secs, ok), "timed out waiting for {what}");
}

/// Polls `ok` every 50 ms until it holds (true) or `secs` pass (false), for
/// callers that explain a timeout with what they know (a service's log).
pub fn poll_until(secs: u64, mut ok: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !ok() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    true
}

/// A scratch directory for a service's data: in `/dev/shm` when the machine
/// has one with at least 2 GiB free, so that services which preallocate and
/// fsync (etcd writes 64 MiB WAL files) neither wait on nor fill the disk
/// the build shares; in the temporary directory otherwise.
pub fn scratch_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if free_bytes(shm) >= 2 << 30
        && let Ok(d) = tempfile::Builder::new().prefix("fg-test").tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().expect("a temporary directory")
}

/// Bytes free to an unprivileged writer on the file system holding `dir`
/// (0 when it cannot be told).
fn free_bytes(dir: &std::path::Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` a writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    st.f_bavail as u64 * st.f_frsize as u64
}

/// The last `n` lines of `text`, for failure messages.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

use aws_sdk_s3::config::{Credentials, Region};

/// An aws-sdk-s3 client for `endpoint` with the demo credential.
pub fn sdk(endpoint: &str) -> aws_sdk_s3::Client {
    sdk_as(endpoint, fencegate::DEMO_KEY, fencegate::DEMO_SECRET)
}

pub fn sdk_as(endpoint: &str, key: &str, secret: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version_latest()
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(key, secret, None, None, "test"))
        .force_path_style(true)
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// PutObject to bucket `demo` with `token` as user metadata; on refusal,
/// (status, error code, x-fencing-highest-token).
pub async fn put_with_token(
    c: &aws_sdk_s3::Client,
    key: &str,
    body: &str,
    token: u64,
) -> Result<(), (u16, String, Option<String>)> {
    c.put_object()
        .bucket("demo")
        .key(key)
        .metadata("fencing-token", token.to_string())
        .body(aws_sdk_s3::primitives::ByteStream::from(
            body.as_bytes().to_vec(),
        ))
        .send()
        .await
        .map(|_| ())
        .map_err(|e| {
            let raw = e.raw_response().expect("a response");
            let status = raw.status().as_u16();
            let highest = raw
                .headers()
                .get("x-fencing-highest-token")
                .map(str::to_string);
            let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&e)
                .unwrap_or_default()
                .to_string();
            (status, code, highest)
        })
}

/// A plain (unsigned) HTTP call, for the admin API. Returns status and body.
pub async fn http_call(
    method: &str,
    url: &str,
    bearer: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<bytes::Bytes>>();
    let mut req = http::Request::builder().method(method).uri(url);
    if let Some(t) = bearer {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(
            body.unwrap_or("").to_string(),
        )))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The real stores the store-facing tests run against.
#[derive(Clone, Copy, Debug)]
pub enum Store {
    /// fencegate's own embedded store (the default backend).
    Embedded,
    /// A Garage process.
    Garage,
}

/// fencegate, and the Garage behind it when there is one.
pub struct Running {
    pub fg: fencegate::Fencegate,
    pub garage: Option<garage::Garage>,
}

impl Store {
    pub fn start(self, extra: &str) -> Running {
        match self {
            Store::Embedded => Running {
                fg: fencegate::Fencegate::start(fencegate::Backend::Embedded, extra),
                garage: None,
            },
            Store::Garage => {
                let g = garage::Garage::start();
                Running {
                    fg: fencegate::Fencegate::start(g.backend(), extra),
                    garage: Some(g),
                }
            }
        }
    }
}

/// Gives bucket `demo` one CORS rule: `origin` may use `methods` with any
/// request header, and read `ETag`.
pub async fn allow_cors(c: &aws_sdk_s3::Client, origin: &str, methods: &[&str]) {
    use aws_sdk_s3::types::{CorsConfiguration, CorsRule};
    let mut rule = CorsRule::builder()
        .allowed_origins(origin)
        .allowed_headers("*")
        .expose_headers("ETag");
    for m in methods {
        rule = rule.allowed_methods(*m);
    }
    let rule = rule.build().unwrap();
    let cors = CorsConfiguration::builder().cors_rules(rule).build();
    let put = c.put_bucket_cors().bucket("demo");
    put.cors_configuration(cors.unwrap()).send().await.unwrap();
}

/// Creates `bucket` unless the store already has it.
pub async fn ensure_bucket(c: &aws_sdk_s3::Client, bucket: &str) {
    if let Err(e) = c.create_bucket().bucket(bucket).send().await {
        let code = aws_sdk_s3::error::ProvideErrorMetadata::code(&e).unwrap_or_default();
        assert!(
            code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists",
            "create bucket {bucket}: {e:?}"
        );
    }
}

/// Runs an async test body `fn(Store)` once on each store.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn embedded() {
                    super::$name($crate::common::Store::Embedded).await
                }
                #[tokio::test]
                async fn garage() {
                    super::$name($crate::common::Store::Garage).await
                }
            }
        )*
    };
}

/// Runs a blocking test body `fn(Store)` once on each store:
/// `name::embedded` and `name::garage`.
#[macro_export]
macro_rules! on_both_stores_sync {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn embedded() {
                    super::$name($crate::common::Store::Embedded)
                }
                #[test]
                fn garage() {
                    super::$name($crate::common::Store::Garage)
                }
            }
        )*
    };
}
