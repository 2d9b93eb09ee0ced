//! The writers of the torture harness: tokio tasks that contend for etcd
//! locks on a few resources and, while holding one, append to its log
//! objects by read-modify-write, sending the lock's token on every read and
//! write. Each writer has its own etcd client and a fresh lease per lock
//! session; the token is the revision in the lock's answer (what
//! `etcdctl lock` exports as `ETCD_LOCK_REV`).
//!
//! Writer-side faults, each switchable:
//! - **stall**: the holder pauses (keep-alives stop too, as in a GC pause)
//!   for longer than its lease, before a read or between a read and its
//!   write, then carries on as if it still held the lock;
//! - **session loss**: the holder's lease is revoked from the side while it
//!   works, and nobody tells it.
//!
//! A session ends at its first request that is not `ok`, so an entry only
//! reaches a log through its own write (see checker.rs).

use super::history::{Entry, History, Kind, Op, Outcome, parse_log};
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{Credentials, Region, ResponseChecksumValidation};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use etcd_client::{Client as Etcd, LockOptions, PutOptions};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

pub const TOKEN_HEADER: &str = "x-fencing-token";

/// One lock and the objects it protects.
#[derive(Clone, Debug)]
pub struct Resource {
    /// The etcd lock name; the history groups by it.
    pub name: String,
    pub keys: Vec<String>,
}

/// The resources of an arm: `logs` single-object logs (`<prefix>log-N`,
/// per-object fence resources) and `multis` prefixes (`<prefix>multi-N/`)
/// whose three objects share a lock, and under fencegate one fence resource
/// (see [`shared_rules`]).
pub fn resources(arm: &str, prefix: &str, logs: usize, multis: usize) -> Vec<Resource> {
    let mut v: Vec<Resource> = (0..logs)
        .map(|i| Resource {
            name: format!("torture/{arm}/log-{i}"),
            keys: vec![format!("{prefix}log-{i}")],
        })
        .collect();
    v.extend((0..multis).map(|i| {
        Resource {
            name: format!("torture/{arm}/multi-{i}"),
            keys: ["a", "b", "c"]
                .iter()
                .map(|k| format!("{prefix}multi-{i}/{k}"))
                .collect(),
        }
    }));
    v
}

/// fencegate rules making each `<prefix>multi-N/` one shared resource.
pub fn shared_rules(bucket: &str, prefix: &str, multis: usize) -> String {
    (0..multis)
        .map(|i| {
            format!(
                "[[rules]]\nbucket = \"{bucket}\"\nprefix = \"{prefix}multi-{i}/\"\nmode = \"shared\"\nresource = \"{prefix}multi-{i}\"\n\n"
            )
        })
        .collect()
}

#[derive(Clone, Debug)]
pub struct WriterFaults {
    /// Probability, per read-modify-write round, of a stall between the
    /// read and the write (and half that, of one before the read).
    pub stall_p: f64,
    /// Probability, per lock session, that its lease is revoked from the side.
    pub session_loss_p: f64,
    /// Lease TTL range asked for, in seconds (etcd raises it to its minimum).
    pub ttl_s: (i64, i64),
}

/// An aws-sdk-s3 client without retries (a retried write would blur its
/// outcome) and with a short timeout (2.5 s): a writer whose answer is held
/// gives up (indeterminate) and releases its lock while its write is still
/// in flight, which is what fencegate's ordering barrier is for. It does not
/// validate response checksums, and the log format is checked line by line
/// instead: the embedded store of the time (s3s-fs) could serve a new
/// object with the old checksum after a kill -9 (docs/torture.md, "Found
/// on the way"); fencegate's own store commits both in one record now.
pub fn s3_client(endpoint: &str, key: &str, secret: &str, region: &str) -> aws_sdk_s3::Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version_latest()
        .endpoint_url(endpoint)
        .region(Region::new(region.to_string()))
        .credentials_provider(Credentials::new(key, secret, None, None, "torture"))
        .force_path_style(true)
        .retry_config(RetryConfig::disabled())
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(3))
                .operation_timeout(Duration::from_millis(2_500))
                .build(),
        )
        .build();
    aws_sdk_s3::Client::from_conf(conf)
}

/// 409 StaleFencingToken, 428, 503 SlowDown and fencegate's 503
/// ServiceUnavailable (cluster mode: the shared table unreachable, or the
/// replica's lease lapsed before the last bytes) promise that nothing
/// happened; anything else without a 2xx might have.
fn classify<E: ProvideErrorMetadata>(e: &SdkError<E>) -> Outcome {
    match e {
        SdkError::ServiceError(se) => {
            let status = se.raw().status().as_u16();
            let code = se.err().code().unwrap_or("").to_string();
            let d = format!("{status} {code}");
            match (status, code.as_str()) {
                (409, "StaleFencingToken")
                | (428, _)
                | (503, "SlowDown")
                | (503, "ServiceUnavailable") => Outcome::Refused(d),
                _ => Outcome::Indeterminate(d),
            }
        }
        SdkError::TimeoutError(_) => Outcome::Indeterminate("timeout".into()),
        SdkError::DispatchFailure(_) => Outcome::Indeterminate("dispatch failure".into()),
        SdkError::ResponseError(_) => Outcome::Indeterminate("response error".into()),
        _ => Outcome::Indeterminate("other".into()),
    }
}

pub struct Workload {
    pub arm: String,
    pub s3: aws_sdk_s3::Client,
    pub bucket: String,
    pub etcd: String,
    pub resources: Vec<Resource>,
    pub writers: u32,
    pub faults: WriterFaults,
    pub hist: Arc<History>,
    pub seed: u64,
    /// Requests a 503 answer may take in all (1: no retry). Above 1, a
    /// request answered 503 is sent again as the SDKs' standard retry
    /// mode does: the n-th wait is a random part of 2^(n-1) s. The history
    /// keeps the last attempt (every earlier one was refused).
    pub attempts: u32,
}

/// What a holder tells the history about one request.
struct Req<'a> {
    writer: u32,
    session: u64,
    resource: &'a str,
    key: &'a str,
    token: u64,
}

impl<'a> Req<'a> {
    fn new(writer: u32, session: u64, res: &'a Resource, key: &'a str, token: u64) -> Req<'a> {
        Req {
            writer,
            session,
            resource: &res.name,
            key,
            token,
        }
    }
}

impl Workload {
    /// Runs the writers until `stop` turns true.
    pub async fn run(self: Arc<Self>, stop: watch::Receiver<bool>) {
        let tasks: Vec<_> = (0..self.writers)
            .map(|w| tokio::spawn(self.clone().writer(w, stop.clone())))
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }

    async fn writer(self: Arc<Self>, w: u32, mut stop: watch::Receiver<bool>) {
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ (w as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let stopped = |s: &watch::Receiver<bool>| *s.borrow();
        let mut etcd = loop {
            match Etcd::connect([self.etcd.as_str()], None).await {
                Ok(c) => break c,
                Err(_) if !stopped(&stop) => tokio::time::sleep(Duration::from_millis(200)).await,
                Err(_) => return,
            }
        };
        while !stopped(&stop) {
            let res = self.resources[rng.random_range(0..self.resources.len())].clone();
            let ttl = rng.random_range(self.faults.ttl_s.0..=self.faults.ttl_s.1);
            let lease = match etcd.lease_grant(ttl, None).await {
                Ok(l) => l,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let (lease_id, granted) = (lease.id(), lease.ttl().max(1));
            let paused = Arc::new(AtomicBool::new(false));
            let ka = tokio::spawn(keep_alive(etcd.clone(), lease_id, granted, paused.clone()));
            let opts = LockOptions::new().with_lease(lease_id);
            let locked = tokio::select! {
                r = tokio::time::timeout(Duration::from_secs(30), etcd.lock(res.name.as_str(), Some(opts))) => r.ok().and_then(Result::ok),
                _ = stop.wait_for(|s| *s) => None,
            };
            if let Some(l) = locked
                && let Some(h) = l.header()
            {
                let token = h.revision() as u64;
                // As `fencegate lock` does: the token in the holder's key,
                // where a verifying fencegate reads it (`[[eager]] verify`).
                let put = PutOptions::new().with_lease(lease_id);
                let _ = etcd.put(l.key(), token.to_string(), Some(put)).await;
                self.session(
                    w, &mut rng, &etcd, &res, token, lease_id, granted, &paused, &stop,
                )
                .await;
            }
            ka.abort();
            let _ = etcd.lease_revoke(lease_id).await;
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn session(
        &self,
        w: u32,
        rng: &mut StdRng,
        etcd: &Etcd,
        res: &Resource,
        token: u64,
        lease_id: i64,
        granted_ttl: i64,
        paused: &AtomicBool,
        stop: &watch::Receiver<bool>,
    ) {
        let session = self.hist.next_session();
        if rng.random_bool(self.faults.session_loss_p) {
            let mut side = etcd.clone();
            let hist = self.hist.clone();
            let after = Duration::from_millis(rng.random_range(0..800));
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                hist.event(format!(
                    "session-loss writer={w} session={session} token={token}"
                ));
                let _ = side.lease_revoke(lease_id).await;
            });
        }
        let stall = |rng: &mut StdRng, at: &str| {
            let ms = granted_ttl as u64 * 1000 + rng.random_range(1000..2500);
            self.hist.event(format!(
                "stall writer={w} session={session} token={token} {at} ms={ms}"
            ));
            ms
        };
        for _ in 0..rng.random_range(1..=6) {
            if *stop.borrow() {
                return;
            }
            if rng.random_bool(self.faults.stall_p / 2.0) {
                let ms = stall(rng, "before-read");
                pause(paused, ms).await;
            }
            let mut logs = Vec::new();
            for key in &res.keys {
                match self.read(Req::new(w, session, res, key, token)).await {
                    Some(text) => logs.push((key, text)),
                    None => return,
                }
            }
            if rng.random_bool(self.faults.stall_p) {
                let ms = stall(rng, "before-write");
                pause(paused, ms).await;
            }
            let pick = rng.random_range(0..logs.len());
            for (i, (key, mut text)) in logs.into_iter().enumerate() {
                if i != pick && !rng.random_bool(0.6) {
                    continue;
                }
                let id = self.hist.next_id();
                text.push_str(
                    &Entry {
                        id,
                        writer: w,
                        token,
                    }
                    .line(),
                );
                if !self
                    .write(Req::new(w, session, res, key, token), id, text)
                    .await
                {
                    return;
                }
            }
        }
    }

    /// GET with the token. The log text, or None (recorded) when the
    /// session must end.
    async fn read(&self, r: Req<'_>) -> Option<String> {
        let id = self.hist.next_id();
        let token = r.token;
        let (start_us, resp) = self
            .send_retrying(|| {
                self.s3
                    .get_object()
                    .bucket(&self.bucket)
                    .key(r.key)
                    .customize()
                    .mutate_request(move |q| {
                        q.headers_mut().insert(TOKEN_HEADER, token.to_string());
                    })
                    .send()
            })
            .await;
        let got: Result<String, Outcome> = match resp {
            Ok(o) => match o.body.collect().await {
                Ok(b) => String::from_utf8(b.into_bytes().to_vec())
                    .map_err(|_| Outcome::Indeterminate("body not UTF-8".into())),
                Err(e) => Err(Outcome::Indeterminate(format!("body: {e}"))),
            },
            Err(SdkError::ServiceError(se)) if se.err().is_no_such_key() => Ok(String::new()),
            Err(e) => Err(classify(&e)),
        };
        let end_us = self.hist.now_us();
        let mut op = Op {
            id,
            writer: r.writer,
            session: r.session,
            resource: r.resource.to_string(),
            key: r.key.to_string(),
            token,
            kind: Kind::Read,
            start_us,
            end_us,
            outcome: Outcome::Ok,
            log_len: None,
            new_entries: vec![],
        };
        let text = match got {
            Ok(text) => match parse_log(&text) {
                Ok(entries) => {
                    let ids: Vec<u64> = entries.iter().map(|e| e.id).collect();
                    op.log_len = Some(ids.len());
                    op.new_entries = self.hist.first_seen(&ids);
                    Some(text)
                }
                Err(e) => {
                    self.hist.event(format!("corrupt-read key={} {e}", r.key));
                    None
                }
            },
            Err(outcome) => {
                op.outcome = outcome;
                None
            }
        };
        self.hist.record(op);
        text
    }

    /// Sends what `send` makes, again after a 503 (up to `attempts` in
    /// all). Returns when the last attempt started, and its answer.
    async fn send_retrying<T, E, F, Fut>(&self, send: F) -> (u64, Result<T, SdkError<E>>)
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, SdkError<E>>>,
    {
        let mut attempt = 1;
        loop {
            let start_us = self.hist.now_us();
            let r = send().await;
            let again =
                matches!(&r, Err(SdkError::ServiceError(se)) if se.raw().status().as_u16() == 503);
            if !again || attempt >= self.attempts {
                return (start_us, r);
            }
            let ms = rand::random_range(0..(1000u64 << (attempt - 1)).min(20_000));
            self.hist
                .event(format!("retry-503 attempt={attempt} after_ms={ms}"));
            tokio::time::sleep(Duration::from_millis(ms)).await;
            attempt += 1;
        }
    }

    /// PUT of the whole log with the token; true if acknowledged.
    async fn write(&self, r: Req<'_>, id: u64, body: String) -> bool {
        let token = r.token;
        let body = bytes::Bytes::from(body.into_bytes());
        let (start_us, resp) = self
            .send_retrying(|| {
                self.s3
                    .put_object()
                    .bucket(&self.bucket)
                    .key(r.key)
                    .body(ByteStream::from(body.clone()))
                    .customize()
                    .mutate_request(move |q| {
                        q.headers_mut().insert(TOKEN_HEADER, token.to_string());
                    })
                    .send()
            })
            .await;
        let outcome = match resp {
            Ok(_) => Outcome::Ok,
            Err(e) => classify(&e),
        };
        let ok = outcome == Outcome::Ok;
        self.hist.record(Op {
            id,
            writer: r.writer,
            session: r.session,
            resource: r.resource.to_string(),
            key: r.key.to_string(),
            token,
            kind: Kind::Write,
            start_us,
            end_us: self.hist.now_us(),
            outcome,
            log_len: None,
            new_entries: vec![],
        });
        ok
    }
}

/// A pause of the whole holder: its keep-alives stop too.
async fn pause(paused: &AtomicBool, ms: u64) {
    paused.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    paused.store(false, Ordering::SeqCst);
}

/// Keeps the lease alive every third of its TTL, except while paused.
async fn keep_alive(mut etcd: Etcd, id: i64, ttl: i64, paused: Arc<AtomicBool>) {
    let Ok((mut keeper, mut stream)) = etcd.lease_keep_alive(id).await else {
        return;
    };
    let every = Duration::from_millis(ttl as u64 * 1000 / 3);
    loop {
        tokio::time::sleep(every).await;
        if paused.load(Ordering::SeqCst) {
            continue;
        }
        if keeper.keep_alive().await.is_err() {
            return;
        }
        match stream.message().await {
            Ok(Some(r)) if r.ttl() > 0 => {}
            _ => return,
        }
    }
}

/// Reads the final logs (no token, retried: reads change nothing).
pub async fn final_logs(
    s3: &aws_sdk_s3::Client,
    bucket: &str,
    resources: &[Resource],
) -> std::collections::BTreeMap<String, Result<Vec<Entry>, String>> {
    let mut out = std::collections::BTreeMap::new();
    for key in resources.iter().flat_map(|r| r.keys.iter()) {
        let mut attempt = 0;
        let text = loop {
            attempt += 1;
            match s3.get_object().bucket(bucket).key(key).send().await {
                Ok(o) => match o.body.collect().await {
                    Ok(b) => break String::from_utf8_lossy(&b.into_bytes()).into_owned(),
                    Err(e) if attempt > 10 => panic!("final read of {key}: {e:?}"),
                    Err(_) => {}
                },
                Err(SdkError::ServiceError(se)) if se.err().is_no_such_key() => {
                    break String::new();
                }
                Err(e) if attempt > 10 => panic!("final read of {key}: {e:?}"),
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        out.insert(key.clone(), parse_log(&text));
    }
    out
}
