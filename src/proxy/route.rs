//! Phase 6 of a request (`Proxy::process`), the route: where the request
//! is served. Here, admitted through the gate (`admit_here.rs`); or, in cluster
//! mode with owners, by the replica that owns its resource, the request
//! sent there (`to_owner.rs`) and its answer passed back; or, by a replica
//! cut off from etcd, by a peer it relays the request to. An owner that
//! cannot be reached, or answers `Moved`, is tried again until the
//! resource is taken here (its owner gone) or the wait runs out; a client
//! request is sent at most [`MAX_SENDS`] times.

use super::to_owner::{ClientBody, Sent, Toward, Via};
use super::{Fenced, Proxy, RequestCtx, Signed};
use crate::body::ProxyBody;
use crate::fence::gate::Mode;
use crate::s3::error::S3Error;
use crate::upstream::pool::UpstreamBody;
use bytes::Bytes;
use http::Response;
use http::request::Parts;
use hyper::body::Incoming;
use std::time::Duration;
use tokio::time::Instant;

/// The largest body a forwarder reads whole, so that it can send the
/// request again when its owner moved (a few writes in flight at an
/// ownership change: memory stays small).
pub const REPLAYABLE: u64 = 256 * 1024;

/// The client's request body: streaming, or read whole by a forwarder.
pub(super) enum RequestBody {
    Streaming(Incoming),
    Whole(Bytes),
}

impl RequestBody {
    /// Its bytes as they come, with `idle` the longest wait for the next.
    pub(super) fn stream(self, idle: Duration) -> crate::s3::chunked::ByteStream {
        match self {
            RequestBody::Streaming(b) => crate::s3::body::incoming(b, idle),
            RequestBody::Whole(b) => crate::s3::body::whole(b),
        }
    }
}

/// Where a request is served, decided in phase 6.
pub(super) enum Route {
    /// Here: admitted (or not fenced), the client's body still to send.
    Here(Fenced, RequestBody),
    /// By the resource's owner, another replica, which answered.
    AtOwner(Response<ProxyBody>),
}

/// The most times one client request is sent to owners; past it the
/// client gets `503 SlowDown` (nothing was done) and retries. Each send is
/// to another owner or epoch (a `Moved` one is never sent to again), so
/// this is reached only while ownership moves quickly.
pub const MAX_SENDS: u32 = 3;

/// The first wait after an owner said `Moved` and etcd still names it at
/// that epoch (a restarted replica's old incarnation, an owner cut off from
/// etcd): doubled each time, up to [`MOVED_WAIT_MAX`], until the owner key
/// changes or the admission wait runs out.
const MOVED_WAIT: Duration = Duration::from_millis(50);
const MOVED_WAIT_MAX: Duration = Duration::from_secs(1);

impl ClientBody for RequestBody {
    fn upstream(self) -> UpstreamBody {
        match self {
            RequestBody::Streaming(b) => b.upstream(),
            RequestBody::Whole(b) => b.upstream(),
        }
    }

    fn replay(&self) -> Option<Self> {
        match self {
            RequestBody::Streaming(_) => None,
            RequestBody::Whole(b) => Some(RequestBody::Whole(b.clone())),
        }
    }
}

impl Proxy {
    /// Phase 6, the route: the admission here, or, for a resource another
    /// replica owns, the owner's answer. An owner that cannot be reached
    /// is tried again (`to_owner`) until the resource is taken here (its
    /// owner gone) or the wait runs out.
    pub(super) async fn route(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        body: Incoming,
        signed: &Signed<'_>,
        token: Option<u64>,
    ) -> Result<Route, S3Error> {
        let admission_ends = Instant::now() + self.gate.wait_bound();
        let mut fenced = match self.admit_here(ctx, head, signed, token).await {
            Ok(fenced) => fenced,
            Err(e) => {
                if let Some(peer) = self.relay_to(signed.via, &e).await {
                    return Box::pin(self.relay(ctx, head, body, peer, e))
                        .await
                        .map(Route::AtOwner);
                }
                if !self.lease_back(&e, admission_ends).await {
                    return Err(e);
                }
                self.admit_here(ctx, head, signed, token).await?
            }
        };
        if fenced.owner.is_none() {
            return Ok(Route::Here(fenced, RequestBody::Streaming(body)));
        }
        // Boxed: the forwarding is a future of several KB that a request
        // served here never needs.
        Box::pin(async move {
            let deadline = Instant::now() + self.gate.wait_bound();
            let mut body = self.replayable(head, body).await?;
            // The owner (and epoch) that answered `Moved`: not sent to
            // again until etcd names another owner or epoch, or, when its
            // own lease had lapsed then, until it says the lease is fresh.
            let mut moved_at: Option<(String, i64)> = None;
            let mut owner_lapsed = false;
            let mut wait = MOVED_WAIT;
            let mut sends = 0;
            while let Some(owner) = fenced.owner.take() {
                let resource = fenced.resource.clone().unwrap_or_default();
                if moved_at.as_ref() == Some(&owner) {
                    if Instant::now() + wait >= deadline {
                        return Err(still_moved(&resource, &owner.0));
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(MOVED_WAIT_MAX);
                    // Its lease back (an etcd election that outlasted every
                    // lease ended), its tenure may stand again: once more.
                    if owner_lapsed && self.owner_lease_fresh(&owner.0).await == Some(true) {
                        (moved_at, owner_lapsed) = (None, false);
                    }
                    self.gate.forget_owner(&resource);
                } else if sends >= MAX_SENDS {
                    return Err(S3Error::SlowDown(format!(
                        "the owner of {resource} moved {MAX_SENDS} times while this request \
                         was forwarded; nothing was done"
                    )));
                } else {
                    let toward = Toward {
                        owner: owner.clone(),
                        resource: &resource,
                        via: signed.via,
                        deadline,
                    };
                    let sent = self.to_owner(ctx, head, body, toward, &mut sends).await;
                    ctx.forward_sends = sends;
                    match sent? {
                        Sent::Answered(resp) => return Ok(Route::AtOwner(resp)),
                        Sent::Unreached(b) => body = b,
                        Sent::Moved(b) => {
                            owner_lapsed = self.owner_lease_fresh(&owner.0).await == Some(false);
                            (body, moved_at) = (b, Some(owner));
                        }
                    }
                }
                fenced = self.admit_here(ctx, head, signed, token).await?;
            }
            Ok(Route::Here(fenced, body))
        })
        .await
    }

    /// The body of a request to forward: read whole when it is small
    /// enough to send again ([`REPLAYABLE`]), else streamed.
    async fn replayable(&self, head: &Parts, body: Incoming) -> Result<RequestBody, S3Error> {
        let len = head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if len.is_none_or(|n| n > REPLAYABLE) {
            return Ok(RequestBody::Streaming(body));
        }
        let mut read = bytes::BytesMut::new();
        let mut pieces = crate::s3::body::incoming(body, self.body_idle);
        while let Some(piece) = futures_util::StreamExt::next(&mut pieces).await {
            read.extend_from_slice(&piece?);
            if read.len() as u64 > REPLAYABLE {
                return Err(S3Error::IncompleteBody);
            }
        }
        Ok(RequestBody::Whole(read.freeze()))
    }

    /// Whether a request refused because this replica's lease lapsed (no
    /// peer to relay it to, or relayed or forwarded here) may be admitted
    /// again: the lease lapsed moments ago and is fresh again before
    /// `deadline` (an etcd election that outlasted it, `lease.rs`).
    pub(super) async fn lease_back(&self, e: &S3Error, deadline: Instant) -> bool {
        let (Mode::Owners(c) | Mode::PerWrite(c)) = self.gate.mode() else {
            return false;
        };
        matches!(e, S3Error::ServiceUnavailable(_))
            && c.not_ready().is_some()
            && c.lease_back_by(deadline).await
    }

    /// Where a request this replica cannot admit goes instead: to a peer,
    /// when this replica is cut off from etcd (its lease not fresh), the
    /// request came from a client, not from another replica, and the peer
    /// says its own lease is fresh; the peers are asked in turn, from one
    /// picked at random, until one does. (When every replica's lease
    /// lapsed, an etcd election outlasting them, each waits for its own
    /// instead.)
    pub(super) async fn relay_to(&self, via: Via, e: &S3Error) -> Option<String> {
        let (Mode::Owners(c), Some(peers)) = (self.gate.mode(), &self.peers) else {
            return None;
        };
        let from_client = via.forwarded.is_none() && !via.relayed;
        let unavailable = matches!(e, S3Error::ServiceUnavailable(_));
        if !from_client || !unavailable || c.not_ready().is_none() {
            return None;
        }
        for url in c.peers_from_any() {
            let Ok(peer) = peers.get(&url) else { continue };
            if peer.lease_fresh(&url).await == Some(true) {
                return Some(url);
            }
        }
        None
    }
}

/// The answer to a request whose owner said it moved, while etcd still
/// names that owner at that epoch when the admission wait runs out.
fn still_moved(resource: &str, owner: &str) -> S3Error {
    S3Error::SlowDown(format!(
        "replica {owner} no longer admits {resource}, and its ownership has not ended \
         yet (its lease still runs); nothing was done"
    ))
}
