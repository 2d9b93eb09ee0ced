//! Knowing the store: whether the backend itself honours conditional
//! writes. fencegate makes `If-None-Match` and `If-Match` hold on every
//! store (CONTRACT §8), but only for writes that go through it; what a
//! store does with a write that goes around fencegate is what its users
//! most need to know, and nothing else tells them.
//!
//! The probe writes one object of its own, `.fencegate-probe/<random>`, in
//! a bucket (`backend.probe_bucket`, else the first the backend lists),
//! straight to the backend, and asks three questions of it:
//!
//! 1. a PUT with `If-None-Match: *` of the existing key: refused (412)?
//! 2. a PUT with `If-Match` of a wrong ETag: refused?
//! 3. a DELETE with `If-Match` of a wrong ETag: refused?
//!
//! then deletes the object. It runs at start-up, in the background, and
//! again every minute until it could decide (a fresh store has no bucket
//! yet). The answers are logged, exported as
//! `fencegate_backend_honours_condition{condition}` and shown on `/readyz`.

use super::client::{Outgoing, Upstream, UpstreamPayload};
use crate::metric_names as m;
use crate::s3::sigv4::hex_lower;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The probe's answers so far.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Honours {
    /// `true`: the backend refused the write; `false`: it applied it.
    pub if_none_match: Option<bool>,
    pub if_match: Option<bool>,
    pub delete_if_match: Option<bool>,
    /// The bucket the probe wrote in.
    pub bucket: Option<String>,
    /// Why the probe could not decide, if it could not.
    pub error: Option<String>,
}

/// Told what the probe found, each time it finds something.
type Listener = Box<dyn Fn(&Honours) + Send + Sync>;

/// What the probe found, shared with the admin listener and the proxy.
#[derive(Default)]
pub struct Probe {
    found: Mutex<Honours>,
    /// Both PUT conditions refused, as found last (read per write).
    writes: AtomicBool,
    listeners: Mutex<Vec<Listener>>,
}

impl Probe {
    pub fn found(&self) -> Honours {
        self.found.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the backend was found refusing PUTs whose `If-Match` or
    /// `If-None-Match` fails: a write sent with one is refused by the
    /// store itself once overtaken.
    pub fn honours_writes(&self) -> bool {
        self.writes.load(Ordering::Relaxed)
    }

    /// Calls `f` with what the probe finds, from now on.
    pub fn on_found(&self, f: impl Fn(&Honours) + Send + Sync + 'static) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners.push(Box::new(f));
    }

    fn set(&self, h: Honours) {
        let writes = h.if_none_match == Some(true) && h.if_match == Some(true);
        self.writes.store(writes, Ordering::Relaxed);
        for f in self
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            f(&h);
        }
        *self.found.lock().unwrap_or_else(|p| p.into_inner()) = h;
    }

    /// Probes the backend now and every `every` until it could decide.
    pub fn spawn(
        self: &Arc<Self>,
        upstream: Arc<Upstream>,
        bucket: Option<String>,
        every: Duration,
    ) {
        let probe = self.clone();
        tokio::spawn(async move {
            loop {
                let found = match ask(&upstream, bucket.as_deref()).await {
                    Ok(h) => h,
                    Err(e) => Honours {
                        error: Some(e),
                        ..Honours::default()
                    },
                };
                report(&found);
                let decided = found.error.is_none();
                probe.set(found);
                if decided {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
    }
}

fn report(h: &Honours) {
    let Some(bucket) = &h.bucket else {
        tracing::info!(
            "cannot yet tell whether the backend honours conditional writes: {}",
            h.error.as_deref().unwrap_or("no answer")
        );
        return;
    };
    for (name, v) in [
        ("if-none-match", h.if_none_match),
        ("if-match", h.if_match),
        ("delete-if-match", h.delete_if_match),
    ] {
        if let Some(v) = v {
            metrics::gauge!(m::BACKEND_HONOURS, "condition" => name).set(f64::from(u8::from(v)));
        }
    }
    let all = [h.if_none_match, h.if_match, h.delete_if_match];
    if all.iter().all(|v| *v == Some(true)) {
        tracing::info!(bucket, "the backend honours conditional writes itself");
    } else {
        tracing::warn!(
            bucket,
            if_none_match = ?h.if_none_match,
            if_match = ?h.if_match,
            delete_if_match = ?h.delete_if_match,
            error = h.error.as_deref().unwrap_or(""),
            "the backend does not honour every conditional write itself: fencegate makes them \
             hold for writes through it, but a write that goes around fencegate is not checked"
        );
    }
}

/// A small request straight to the backend.
fn request(method: Method, bucket: &str, key: Option<&str>, body: &'static [u8]) -> Outgoing {
    let mut out = Outgoing {
        method,
        bucket: Some(bucket.to_string()),
        key: key.map(str::to_string),
        query: Vec::new(),
        headers: HeaderMap::new(),
        body: None,
        content_length: None,
        payload: UpstreamPayload::Empty,
        anonymous: false,
    };
    if !body.is_empty() {
        out.payload = UpstreamPayload::Sha256Hex(hex_lower(&Sha256::digest(body)));
        out.content_length = Some(body.len() as u64);
        let frame = Ok(http_body::Frame::data(Bytes::from_static(body)));
        out.body = Some(Box::pin(futures_util::stream::iter([frame])));
    }
    out
}

fn with(mut out: Outgoing, name: &'static str, value: &'static str) -> Outgoing {
    out.headers.insert(name, HeaderValue::from_static(value));
    out
}

/// The status of `out`, its answer read to the end.
async fn status(upstream: &Upstream, out: Outgoing) -> Result<StatusCode, String> {
    let resp = upstream.send(out).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map_err(|e| e.to_string())?;
    Ok(status)
}

/// Refused (412), applied (2xx), or something else (an error).
fn refused(what: &str, s: StatusCode) -> Result<bool, String> {
    match s {
        StatusCode::PRECONDITION_FAILED => Ok(true),
        s if s.is_success() => Ok(false),
        s => Err(format!("the backend answered {s} to {what}")),
    }
}

/// One probe (see the module doc).
async fn ask(upstream: &Upstream, bucket: Option<&str>) -> Result<Honours, String> {
    let bucket = match bucket {
        Some(b) => b.to_string(),
        None => first_bucket(upstream)
            .await?
            .ok_or("the backend has no bucket to probe in (set backend.probe_bucket)")?,
    };
    let key = format!(".fencegate-probe/{:016x}", rand::random::<u64>());
    let put = || request(Method::PUT, &bucket, Some(&key), b"fencegate probe");
    let s = status(upstream, put()).await?;
    if !s.is_success() {
        return Err(format!(
            "the probe's PUT in bucket {bucket} was answered {s}"
        ));
    }
    let wrong = "\"00000000000000000000000000000000\"";
    let mut h = Honours {
        bucket: Some(bucket.clone()),
        ..Honours::default()
    };
    let questions = async {
        let s = status(upstream, with(put(), "if-none-match", "*")).await?;
        h.if_none_match = Some(refused("PUT If-None-Match: *", s)?);
        let s = status(upstream, with(put(), "if-match", wrong)).await?;
        h.if_match = Some(refused("PUT If-Match", s)?);
        let del = request(Method::DELETE, &bucket, Some(&key), b"");
        let s = status(upstream, with(del, "if-match", wrong)).await?;
        h.delete_if_match = Some(refused("DELETE If-Match", s)?);
        Ok::<(), String>(())
    };
    let asked = questions.await;
    let del = request(Method::DELETE, &bucket, Some(&key), b"");
    if let Err(e) = status(upstream, del).await {
        tracing::warn!("could not delete the probe object {bucket}/{key}: {e}");
    }
    if let Err(e) = asked {
        h.error = Some(e);
    }
    Ok(h)
}

/// The first bucket the backend lists, if any.
async fn first_bucket(upstream: &Upstream) -> Result<Option<String>, String> {
    let mut out = request(Method::GET, "", None, b"");
    out.bucket = None;
    let resp = upstream.send(out).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("the backend answered {status} to ListBuckets"));
    }
    Ok(crate::s3::xml::bucket_names(&body).into_iter().next())
}
