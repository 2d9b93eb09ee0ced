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
//! give up. A replica that is only slow (a large body, a slow backend)
//! answers its pings, and its forwards go on. Per forward this costs a
//! counter and a channel subscription, not a timer.

use crate::s3::error::S3Error;
use crate::upstream::client::UpstreamBody;
use crate::upstream::pool::Pool;
use dashmap::DashMap;
use http::{HeaderValue, Request};
use http_body_util::BodyExt;
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
            });
            tokio::spawn(watchdog(Arc::downgrade(&peer), url.to_string()));
            peer
        });
        Ok(entry.clone())
    }
}

impl Peer {
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
        if peer.forwards.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let why = match tokio::time::timeout(PING_WAIT, peer.pool.send_fresh(ping(&url))).await {
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => format!("stopped answering ({e})"),
            Err(_) => format!("did not answer a ping within {} s", PING_WAIT.as_secs()),
        };
        tracing::warn!(
            replica = url,
            "forwards to another replica given up: it {why}"
        );
        peer.unanswered.send_replace(why);
    }
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
