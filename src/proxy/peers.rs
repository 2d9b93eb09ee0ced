//! The other replicas, as a forwarder sees them (cluster mode with owners,
//! `to_owner.rs`): one connection pool per replica's URL, and whether the
//! replica still answers.
//!
//! An owner that keeps its lease but that this replica cannot reach (a
//! partition between replicas only) would hold a forwarded request for as
//! long as the partition lasts. So each replica forwarded to has a
//! watchdog: every [`PING_AFTER`], while forwards to it are in flight, it
//! pings the replica on a connection of its own ([`PING`]); a ping not
//! answered within [`PING_WAIT`] tells every forward in flight there to
//! give up; when the ping went unanswered (a partition, not a replica
//! that refuses connections, which has died), new forwards there are
//! refused at once (`503`, nothing sent) until a ping is answered again. A replica that is only slow (a
//! large body, a slow backend) answers its pings, and its forwards go on. Per forward this costs a
//! counter and a channel subscription, not a timer.
//!
//! A ping may carry a successor's question ([`LANDED`]): a replica that
//! took a resource whose owner seemed to die (its lease expired with its
//! in-flight marker) asks that owner whether anything of its own can still
//! land there. An owner that was only paused or cut off from etcd answers
//! that nothing is in flight, and the successor's quarantine ends
//! (`fence/gate/owned.rs`, `ask_predecessor`).

use crate::body::ProxyBody;
use crate::fence::gate::{Gate, Mode, Predecessors};
use crate::s3::error::S3Error;
use crate::upstream::pool::{Pool, UpstreamBody};
use dashmap::DashMap;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::watch;

/// The header of a replica's ping of another (`GET /`), answered `200` at
/// once, before authentication: it says only that the replica answers.
pub const PING: &str = "x-fencegate-ping";

/// How often a replica with forwards in flight is pinged.
pub const PING_AFTER: Duration = Duration::from_secs(1);

/// How long a ping may take before the replica counts as unreachable.
pub const PING_WAIT: Duration = Duration::from_secs(2);

/// Connections to the other replicas, one [`Peer`] per URL.
pub struct Peers {
    tls: rustls::ClientConfig,
    peers: DashMap<String, Arc<Peer>>,
}

/// One other replica.
pub struct Peer {
    pub pool: Pool,
    /// Forwards in flight to it.
    forwards: AtomicUsize,
    /// Why it stopped answering, each time a ping finds it so.
    unanswered: watch::Sender<String>,
    /// The last ping found it unreachable: new forwards are refused at
    /// once (nothing sent) until a ping is answered again.
    down: std::sync::atomic::AtomicBool,
}

/// A forward in flight to a [`Peer`]: counted while it lives.
pub struct Forward<'a> {
    peer: &'a Peer,
    unanswered: watch::Receiver<String>,
}

impl Peers {
    pub fn new(ca: Option<&std::path::Path>) -> Result<Peers, String> {
        let tls = match crate::tls::client_config_named(ca, "cluster.peer_ca_file") {
            Ok(tls) => tls,
            // No system roots and no CA given: fine while the replicas
            // speak plain HTTP (an https:// peer then fails its handshake).
            Err(_) if ca.is_none() => crate::tls::client_config_without_roots()?,
            Err(e) => return Err(e),
        };
        Ok(Peers {
            tls,
            peers: DashMap::new(),
        })
    }

    /// The replica at `url`, its watchdog started the first time.
    pub fn get(&self, url: &str) -> Result<Arc<Peer>, S3Error> {
        if let Some(p) = self.peers.get(url) {
            return Ok(p.clone());
        }
        let uri = url
            .parse()
            .map_err(|e| S3Error::Internal(format!("replica address {url:?}: {e}")))?;
        let entry = self.peers.entry(url.to_string()).or_insert_with(|| {
            let peer = Arc::new(Peer {
                pool: Pool::new(self.tls.clone(), uri, Duration::from_secs(30)),
                forwards: AtomicUsize::new(0),
                unanswered: watch::channel(String::new()).0,
                down: Default::default(),
            });
            tokio::spawn(watchdog(Arc::downgrade(&peer), url.to_string()));
            peer
        });
        Ok(entry.clone())
    }
}

impl Peer {
    /// Why a forward there would be given up at once: its last ping was
    /// not answered (a partition between replicas), so a request sent now
    /// would only wait for the next ping to fail. Refusing it at once
    /// (nothing sent) lets the balancer or the client try another replica,
    /// maybe the owner itself.
    pub fn down(&self) -> Option<String> {
        self.down
            .load(Ordering::Relaxed)
            .then(|| self.unanswered.borrow().clone())
    }

    /// Counts a forward in flight until the returned guard drops.
    pub fn forward(&self) -> Forward<'_> {
        self.forwards.fetch_add(1, Ordering::Relaxed);
        Forward {
            peer: self,
            unanswered: self.unanswered.subscribe(),
        }
    }
}

impl Forward<'_> {
    /// Resolves once a ping finds the replica unreachable; says why.
    pub async fn unanswered(&mut self) -> String {
        match self.unanswered.changed().await {
            Ok(()) => self.unanswered.borrow().clone(),
            // The peer is gone with its sender: never.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Forward<'_> {
    fn drop(&mut self) {
        self.peer.forwards.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Pings the replica at `url` every [`PING_AFTER`] while forwards to it are
/// in flight, for as long as its [`Peer`] lives.
async fn watchdog(peer: Weak<Peer>, url: String) {
    loop {
        tokio::time::sleep(PING_AFTER).await;
        let Some(peer) = peer.upgrade() else { return };
        let down = peer.down.load(Ordering::Relaxed);
        if peer.forwards.load(Ordering::Relaxed) == 0 && !down {
            continue;
        }
        // Only a ping left unanswered marks the replica down: one that
        // refuses connections has died, and its resources are taken here
        // once its lease ends, which a forward waits for.
        let (why, silent) =
            match tokio::time::timeout(PING_WAIT, peer.pool.send_fresh(ping(&url))).await {
                Ok(Ok(_)) => {
                    peer.down.store(false, Ordering::Relaxed);
                    continue;
                }
                Ok(Err(e)) => (format!("stopped answering ({e})"), false),
                Err(_) => (
                    format!("did not answer a ping within {} s", PING_WAIT.as_secs()),
                    true,
                ),
            };
        if !down {
            tracing::warn!(
                replica = url,
                "forwards to another replica given up until it answers again: it {why}"
            );
        }
        peer.unanswered.send_replace(why);
        peer.down.store(silent, Ordering::Relaxed);
    }
}

/// The header of a successor's question in a ping (`?landed=<resource>`):
/// the replica it asks about; the answer's header of the same name says
/// [`CLEAR`] when nothing of that replica's can still land there.
pub const LANDED: &str = "x-fencegate-landed";
pub const CLEAR: &str = "clear";

impl Predecessors for Peers {
    fn nothing_landing(
        &self,
        url: &str,
        replica: &str,
        resource: &str,
    ) -> BoxFuture<'static, bool> {
        let Ok(peer) = self.get(url) else {
            return Box::pin(async { false });
        };
        let mut ask = ping(url);
        let query = utf8_percent_encode(resource, NON_ALPHANUMERIC);
        *ask.uri_mut() = match format!("/?landed={query}").parse() {
            Ok(uri) => uri,
            Err(_) => return Box::pin(async { false }),
        };
        match HeaderValue::from_str(replica) {
            Ok(v) => ask.headers_mut().insert(LANDED, v),
            Err(_) => return Box::pin(async { false }),
        };
        Box::pin(async move {
            let answer = tokio::time::timeout(PING_WAIT, peer.pool.send_fresh(ask)).await;
            let Ok(Ok(resp)) = answer else { return false };
            resp.headers().get(LANDED).is_some_and(|v| v == CLEAR)
        })
    }
}

/// The header of a ping's answer that says whether the replica holds a
/// fresh lease ([`FRESH`]), so that a replica cut off from etcd relays a
/// request only to a peer that can admit it (`route.rs`).
pub const LEASE: &str = "x-fencegate-lease";
pub const FRESH: &str = "fresh";

impl Peer {
    /// Whether the replica at `url` says, answering a ping, that its lease
    /// is fresh; `None` when it does not answer. One that says nothing of
    /// its lease (an older version) is taken as fresh.
    pub async fn lease_fresh(&self, url: &str) -> Option<bool> {
        let answer = tokio::time::timeout(PING_WAIT, self.pool.send_fresh(ping(url))).await;
        let Ok(Ok(resp)) = answer else { return None };
        Some(resp.headers().get(LEASE).is_none_or(|v| v == FRESH))
    }
}

/// The answer to a ping: `200`, with whether this replica's lease is
/// fresh ([`LEASE`]), and to a successor's question
/// ([`LANDED`]) whether anything of this replica's can still land on the
/// resource it names.
pub fn answer(head: &http::request::Parts, gate: &Gate) -> Response<ProxyBody> {
    let mut resp = Response::new(crate::body::full(bytes::Bytes::new()));
    if let Mode::Owners(c) | Mode::PerWrite(c) = gate.mode() {
        let lease = if c.not_ready().is_none() {
            FRESH
        } else {
            "lapsed"
        };
        resp.headers_mut()
            .insert(LEASE, HeaderValue::from_static(lease));
    }
    let asked = head.headers.get(LANDED).and_then(|v| v.to_str().ok());
    // Decoded strictly, not by `s3::query` (which would turn bad UTF-8
    // into U+FFFD): another name than the successor's would find no slot
    // here and be answered clear.
    let resource = head.uri.query().and_then(|q| {
        let v = q.strip_prefix("landed=")?;
        percent_encoding::percent_decode_str(v).decode_utf8().ok()
    });
    if let (Some(replica), Some(resource)) = (asked, resource) {
        let clear = gate.nothing_landing(replica, &resource);
        let says = HeaderValue::from_static(if clear { CLEAR } else { "busy" });
        resp.headers_mut().insert(LANDED, says);
    }
    resp
}

/// A ping of the replica at `url`.
fn ping(url: &str) -> Request<UpstreamBody> {
    let mut ping = Request::new(
        http_body_util::Empty::new()
            .map_err(|n| match n {})
            .boxed_unsync(),
    );
    *ping.uri_mut() = http::Uri::from_static("/");
    if let Ok(host) = HeaderValue::from_str(url.split("://").last().unwrap_or(url)) {
        ping.headers_mut().insert(http::header::HOST, host);
    }
    ping.headers_mut()
        .insert(PING, HeaderValue::from_static("1"));
    ping
}
