//! Cluster mode with owners: a request for a resource that another replica
//! owns is sent there, as it came (method, URI, headers with the Host and
//! the signature, body streamed), and the owner's answer streamed back.
//! The owner authenticates and fences it as any request.
//!
//! A forwarded request carries [`FORWARDED`]: the forwarder's name and the
//! owner's epoch it saw. A replica that gets one for a resource it does
//! not own at that epoch (ownership moved meanwhile) answers `503
//! SlowDown` rather than admit or forward it, so a request never loops,
//! and a request given up by its forwarder is never admitted later by a
//! new tenure of the same replica.
//!
//! A forwarded request the owner did not admit because ownership moved
//! (it let the resource go while idle, and the forwarder did not know) is
//! answered [`S3Error::Moved`]: nothing was done. A body of at most
//! [`REPLAYABLE`](super::route::REPLAYABLE) bytes is read whole before it is forwarded, so the
//! forwarder can route such a request again, to the new owner or here,
//! instead of passing the 503 on; a larger body is streamed, and its
//! client gets the 503 and retries.
//!
//! An owner that cannot be reached (it died, and its lease has not run out
//! yet) is tried again until `admission_wait_ms`: by then its lease has
//! usually gone, and the resource is taken here. An owner that stops
//! answering (paused) while it holds a forwarded request: the request is
//! given up when the owner's lease ends (it can no longer admit it),
//! answered `502` once any of it was sent (the owner may have had it all)
//! or `503 SlowDown` when nothing was, and the client's retry goes to the
//! next owner.
//!
//! An owner that keeps its lease but stops answering its pings
//! (`peers.rs`; a partition between replicas only) ends the forwards in
//! flight there: `502` (the owner may have had the whole request, so its
//! outcome is unknown), or `503` when nothing was sent.

use super::peers::Peer;
use super::{Proxy, RequestCtx};
use crate::body::ProxyBody;
use crate::fence::gate::Mode;
use crate::metric_names as m;
use crate::s3::error::{MOVED, S3Error};
use crate::upstream::pool::UpstreamBody;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The header a request forwarded by a replica carries (its name).
pub const FORWARDED: &str = "x-fencegate-forwarded";

/// The header a request relayed by a replica cut off from etcd carries
/// (its name): the peer serves it as its own, but never relays it again.
pub const RELAYED: &str = "x-fencegate-relayed";

/// How a request came: from a client, or from another replica (cluster
/// mode with owners; read from the head, `head.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Via {
    /// Forwarded by a replica: the owner's epoch it saw ([`FORWARDED`]).
    pub forwarded: Option<i64>,
    /// Relayed by a replica cut off from etcd ([`RELAYED`]).
    pub relayed: bool,
}

impl Via {
    pub(super) fn of(headers: &http::HeaderMap) -> Via {
        Via {
            forwarded: forwarded_epoch(headers),
            relayed: headers.contains_key(RELAYED),
        }
    }
}

/// A request on its way to the owner of its resource.
pub(super) struct Toward<'a> {
    /// The owner, and its epoch.
    pub owner: (String, i64),
    pub resource: &'a str,
    pub via: Via,
    /// When the admission wait runs out.
    pub deadline: Instant,
}

/// What became of a request sent towards its owner.
pub(super) enum Sent<B> {
    Answered(Response<ProxyBody>),
    /// The owner could not be reached: the body is still here, and the
    /// request is routed again.
    Unreached(B),
    /// The owner did not own the resource at the epoch it was sent and did
    /// nothing ([`S3Error::Moved`]): the body is still here, and the
    /// request is routed again, but not sent there at that epoch.
    Moved(B),
}

/// A request's body as the client sent it: still streaming, or read whole
/// (a DeleteObjects, whose keys name the owner).
pub(super) trait ClientBody: Sized {
    fn upstream(self) -> UpstreamBody;
    /// The same body again, when it was read whole.
    fn replay(&self) -> Option<Self>;
}

impl ClientBody for Incoming {
    fn upstream(self) -> UpstreamBody {
        self.map_err(|e| {
            tracing::debug!("forwarded request body: {e}");
            S3Error::IncompleteBody
        })
        .boxed_unsync()
    }

    fn replay(&self) -> Option<Self> {
        None
    }
}

impl ClientBody for Bytes {
    fn upstream(self) -> UpstreamBody {
        http_body_util::Full::new(self)
            .map_err(|never| match never {})
            .boxed_unsync()
    }

    fn replay(&self) -> Option<Self> {
        Some(self.clone())
    }
}

impl Proxy {
    /// A DeleteObjects whose keys' resources `owner` owns goes there with
    /// the body it read (a body that is not aws-chunked: what was read is
    /// what the client sent, and its signature still holds).
    pub(super) async fn multi_delete_to_owner(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        toward: Toward<'_>,
        body: Bytes,
    ) -> Result<Response<ProxyBody>, S3Error> {
        let name = toward.owner.0.clone();
        let mut sends = 0;
        let sent = self.to_owner(ctx, head, body, toward, &mut sends).await;
        ctx.forward_sends = sends;
        match sent? {
            Sent::Answered(resp) => Ok(resp),
            Sent::Unreached(_) | Sent::Moved(_) => Err(S3Error::SlowDown(format!(
                "the keys' resources are owned by replica {name}, which cannot be reached"
            ))),
        }
    }

    /// Sends the request toward the owner of its resource; `sends` counts
    /// it when it went.
    pub(super) async fn to_owner<B: ClientBody>(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        body: B,
        toward: Toward<'_>,
        sends: &mut u32,
    ) -> Result<Sent<B>, S3Error> {
        let (owner, epoch) = (toward.owner.0.as_str(), toward.owner.1);
        let (resource, deadline) = (toward.resource, toward.deadline);
        if toward.via.forwarded.is_some() {
            return Err(moved(resource));
        }
        let Mode::Owners(c) = self.gate.mode() else {
            return Err(S3Error::Internal("forwarding outside cluster mode".into()));
        };
        let unreached = |why: String| {
            S3Error::SlowDown(format!(
                "{resource} is owned by replica {owner}, which cannot be reached: {why}"
            ))
        };
        let Some(peer) = self.owner_peer(owner, resource).await? else {
            return pause(body, deadline, || unreached("its lease has ended".into())).await;
        };
        let mut forward = peer.forward();
        let replay = body.replay();
        let mut body = Some(body);
        let built = std::sync::atomic::AtomicBool::new(false);
        let build = || {
            built.store(true, std::sync::atomic::Ordering::Relaxed);
            let me = format!("{} {epoch}", c.replica_name());
            let me = HeaderValue::from_str(&me).expect("hex name and digits");
            let body = body.take().expect("built once").upstream();
            outgoing(head, body, (FORWARDED, me))
        };
        let was_sent = || built.load(std::sync::atomic::Ordering::Relaxed);
        let sent = tokio::select! {
            sent = peer.pool.send_when_connected(build) => sent,
            () = c.gone(owner) => return Err(given_up(was_sent(), self.gone(resource, owner))),
            why = forward.unanswered() => {
                self.gate.forget_owner(resource);
                let why = format!("replica {owner}, which owns {resource}, {why}");
                return Err(given_up(was_sent(), why));
            }
        };
        if was_sent() {
            *sends += 1;
        }
        match sent {
            Ok(resp) => {
                self.owner_answered(ctx, resource, resp, replay, deadline)
                    .await
            }
            Err((e, false)) => {
                c.forget_address(owner);
                self.gate.forget_owner(resource);
                let body = body.take().expect("not built");
                pause(body, deadline, || unreached(e.to_string())).await
            }
            Err((e, true)) => {
                // The exchange broke with the request sent (an owner that
                // moved refuses before it reads a large body, and closes):
                // ask afresh next time rather than meet the same end.
                self.gate.forget_owner(resource);
                Err(S3Error::BadGateway(format!(
                    "replica {owner}, which owns {resource}: {e}"
                )))
            }
        }
    }

    /// The connection to replica `owner`, which owns `resource`; `None`
    /// when it has no address in etcd (its lease is gone: the resource is
    /// free soon). An owner this replica sees down is `SlowDown`.
    async fn owner_peer(&self, owner: &str, resource: &str) -> Result<Option<Arc<Peer>>, S3Error> {
        let (Mode::Owners(c), Some(peers)) = (self.gate.mode(), &self.peers) else {
            return Err(S3Error::Internal("forwarding outside cluster mode".into()));
        };
        let url = c
            .address_of(owner)
            .await
            .map_err(|e| S3Error::ServiceUnavailable(e.to_string()))?;
        let Some(url) = url else {
            self.gate.forget_owner(resource);
            return Ok(None);
        };
        let peer = peers.get(&url)?;
        if let Some(why) = peer.down() {
            return Err(S3Error::SlowDown(format!(
                "replica {owner}, which owns {resource}, {why}; nothing was done"
            )));
        }
        Ok(Some(peer))
    }

    /// Whether replica `owner` says its lease is fresh (a ping); `None`
    /// when it cannot be asked.
    pub(super) async fn owner_lease_fresh(&self, owner: &str) -> Option<bool> {
        let (Mode::Owners(c), Some(peers)) = (self.gate.mode(), &self.peers) else {
            return None;
        };
        let url = c.address_of(owner).await.ok()??;
        peers.get(&url).ok()?.lease_fresh(&url).await
    }

    /// The owner's answer: passed on, or, when it says `Moved` and the
    /// body can be sent again, [`Sent::Moved`] (nothing was done there).
    async fn owner_answered<B>(
        &self,
        ctx: &mut RequestCtx,
        resource: &str,
        mut resp: Response<Incoming>,
        replay: Option<B>,
        deadline: Instant,
    ) -> Result<Sent<B>, S3Error> {
        metrics::counter!(m::CLUSTER_FORWARDED).increment(1);
        if resp.status() == http::StatusCode::SERVICE_UNAVAILABLE {
            self.gate.forget_owner(resource);
        }
        ctx.decision = "forwarded_to_owner";
        if resp.headers_mut().remove(MOVED).is_some()
            && let Some(again) = replay
            && Instant::now() < deadline
        {
            // Read its short answer (the connection goes back to the pool)
            // and route again.
            let _ = resp.into_body().collect().await;
            return Ok(Sent::Moved(again));
        }
        Ok(Sent::Answered(resp.map(|b| b.map_err(Into::into).boxed())))
    }

    /// Sends a request this replica cannot admit (cut off from etcd) to
    /// the peer at `url`, marked [`RELAYED`]: the peer admits it, or
    /// forwards it to the owner, as a request of its own, but never relays
    /// it again. `why` is the answer when the peer cannot be reached.
    pub(super) async fn relay(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        body: impl ClientBody,
        url: String,
        why: S3Error,
    ) -> Result<Response<ProxyBody>, S3Error> {
        let (Mode::Owners(c), Some(peers)) = (self.gate.mode(), &self.peers) else {
            return Err(why);
        };
        let peer = peers.get(&url)?;
        if peer.down().is_some() {
            return Err(why);
        }
        let mut forward = peer.forward();
        let built = std::sync::atomic::AtomicBool::new(false);
        let me = HeaderValue::from_str(c.replica_name()).expect("a hex name");
        let build = || {
            built.store(true, std::sync::atomic::Ordering::Relaxed);
            outgoing(head, body.upstream(), (RELAYED, me))
        };
        let sent = tokio::select! {
            sent = peer.pool.send_when_connected(build) => sent,
            lost = forward.unanswered() => {
                return Err(match built.load(std::sync::atomic::Ordering::Relaxed) {
                    true => S3Error::BadGateway(format!(
                        "relayed to replica {url}, which {lost}; the request's outcome is unknown"
                    )),
                    false => why,
                });
            }
        };
        match sent {
            Ok(resp) => {
                ctx.decision = "relayed_to_peer";
                metrics::counter!(m::CLUSTER_FORWARDED).increment(1);
                Ok(resp.map(|b| b.map_err(Into::into).boxed()))
            }
            Err((_, false)) => Err(why),
            Err((e, true)) => Err(S3Error::BadGateway(format!(
                "relayed to replica {url}: {e}; the request's outcome is unknown"
            ))),
        }
    }

    /// A forwarded request is admitted only by the owner's tenure it was
    /// sent to: refused when `resource` is not owned here at that epoch.
    pub(super) fn check_forwarded(&self, via: Via, resource: &str) -> Result<(), S3Error> {
        match via.forwarded {
            Some(epoch) if self.gate.owner_epoch(resource) != Some(epoch) => Err(moved(resource)),
            _ => Ok(()),
        }
    }

    /// Why a request was given up because its owner's lease ended while
    /// the owner held it.
    fn gone(&self, resource: &str, owner: &str) -> String {
        self.gate.forget_owner(resource);
        format!(
            "replica {owner}, which owned {resource}, stopped answering and its lease ended: \
             it cannot admit this request any more"
        )
    }
}

/// A forward given up for `why`: `502` when it was sent (the owner may
/// have acted on it, so its outcome is unknown, and nothing may resend
/// it), else `503 SlowDown` (nothing was done).
fn given_up(sent: bool, why: String) -> S3Error {
    match sent {
        true => S3Error::BadGateway(format!("{why}; the request's outcome is unknown")),
        false => S3Error::SlowDown(why),
    }
}

/// The client's request as it came, with the body `body` and the header
/// that marks it as sent on by a replica.
fn outgoing(
    head: &Parts,
    body: UpstreamBody,
    (name, value): (&'static str, HeaderValue),
) -> Request<UpstreamBody> {
    let mut headers = head.headers.clone();
    headers.insert(name, value);
    let path = head.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = Request::new(body);
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = path.parse().expect("a path and query that parsed before");
    *req.headers_mut() = headers;
    req
}

/// The epoch a forwarded request was sent under, from [`FORWARDED`].
fn forwarded_epoch(headers: &http::HeaderMap) -> Option<i64> {
    let v = headers.get(FORWARDED)?.to_str().ok()?;
    // A header that does not parse never matches an epoch.
    Some(v.rsplit(' ').next()?.parse().unwrap_or(-1))
}

/// The answer to a forwarded request whose resource is not owned here at
/// the epoch its forwarder saw.
pub(super) fn moved(resource: &str) -> S3Error {
    S3Error::Moved(format!(
        "{resource} moved to another replica while this request was forwarded"
    ))
}

/// Waits a little before the caller tries again, or gives up at
/// `deadline` with `error`.
async fn pause<B>(
    body: B,
    deadline: Instant,
    error: impl FnOnce() -> S3Error,
) -> Result<Sent<B>, S3Error> {
    if Instant::now() >= deadline {
        return Err(error());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(Sent::Unreached(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forwarded_request_names_its_epoch_and_a_bad_stamp_matches_none() {
        let with = |v: &str| {
            let mut h = http::HeaderMap::new();
            h.insert(FORWARDED, HeaderValue::from_str(v).unwrap());
            forwarded_epoch(&h)
        };
        assert_eq!(with("0123456789abcdef 42"), Some(42));
        // Stamped, but with nothing an owner's epoch (always > 0) equals.
        assert_eq!(with("0123456789abcdef"), Some(-1));
        assert_eq!(with("x y"), Some(-1));
        assert_eq!(forwarded_epoch(&http::HeaderMap::new()), None);
    }
}
