//! A request's life in fencegate, as named phases. `Proxy::process` reads
//! as this table; each phase is a function in the file named, handed what
//! the phases before it established and handing on what it establishes,
//! as pingora's phases are:
//!
//! | # | phase | file::function | in → out | what it does |
//! |---|---|---|---|---|
//! | 1 | head | `head.rs::check_head` | head → query | size limit, query parsed once; a CORS preflight and (with `server.anonymous_reads`) an unsigned read leave here, unsigned (`public.rs`) |
//! | 2 | authenticate | `head.rs::authenticate` | head, query → `Verified` | SigV4 against the credential table |
//! | 3 | classify | `head.rs::classify` | head, query → `Operation` | operation, bucket, key and copy source, each in the one form that is fenced *and* forwarded (`s3::names`) |
//! | 4 | authorize | `head.rs::authorize` | `Verified`, `Operation` → () | the credential may use the bucket(s), administer it for bucket writes, and a session credential's scope holds |
//! | 5 | token | `token.rs::token` | `Signed` → the token | the fencing token from a signed carrier, the session credential, or the multipart upload it belongs to |
//! | 6 | route | `route.rs::route` | `Signed`, the token → `Fenced` (or the owner's answer) | where it is served: here through `admit_here.rs::admit_here` (resource from the rules; the gate's check, durable raise and ordering barrier), or at the owner (`to_owner.rs::to_owner`), or at a peer when cut off from etcd (`to_owner.rs::relay`) |
//! | 7 | hold | `conditional.rs::hold`, then `in_doubt.rs::record_write` | `Signed`, `Fenced` → the object's hold, the landing slot | a write that replaces or deletes its object holds it; its conditions are judged under the hold (CONTRACT §8). In cluster mode an unconditional write's hold is put by its admission. In front of a remote store, the write's slot in the landing record |
//! | 8 | upstream request | `outgoing.rs::upstream_request`, then `per_op.rs::nothing_per_op` or `per_op.rs::per_op` | `Admitted` → `Outgoing`, `Exchange` | the body pipeline (behind the body gate) and the headers the backend gets, token stamped; what one operation adds (a condition made to hold on the backend, a fenced copy, CreateBucket, DeleteObjects) |
//! | 9 | forward | `forward.rs::forward` | `Outgoing`, what the exchange keeps → the answer | the exchange, keeping the write's permits until the answer is complete, even if the client leaves; a quarantine when the answer is lost after a complete body |
//! | 10 | respond | `respond.rs::respond` | the answer → the response | the answer streamed back (a limited credential's bucket list filtered, an upload's token recorded, the ETag a write with fencegate's own condition left learnt) |
//!
//! Phases 1 to 4 run in `head.rs::head_phases`, whose output is `Signed`.
//! The token leaves phase 5 as its output and goes into phase 6, whose
//! `Fenced` carries it on (the stamp, the copy, the upload's record).
//! `RequestCtx` is no phase's input: the phases write into it what the log
//! line says, and only the error exit, the log line and the request
//! metrics (`Proxy::handle`) read it.
//!
//! Where a PutObject becomes durable, in order:
//!
//! - **its token**, when it raises the fence: phase 6,
//!   `Gate::admit_touching` → `raise_slot` → `FenceTable::raise`
//!   (`fence/table.rs`: one redb commit, fsynced, before the write is
//!   admitted; in cluster mode an etcd transaction,
//!   `fence/cluster/owners.rs`);
//! - **its body** only once its permit still stands: the body gate
//!   (`fence/body_gate.rs`) holds the last frame until then (phase 8);
//! - **its bytes**, on the embedded store: the blob file fsynced
//!   (`store/blobs.rs`), then the index entry in the store's group commit
//!   (`store/commit.rs`), before the store answers; on an S3 backend,
//!   when the backend answers (phase 9);
//! - **a multipart upload's token**, in phase 10
//!   (`FenceTable::record_upload`).
//!
//! Every phase that can fail returns `Result<_, S3Error>`; the one error
//! exit in [`Proxy::handle`] renders it as S3 XML (with the CORS headers
//! the backend allows a browser's origin), and one log event per request
//! is written there at the end.

mod admit_here;
mod conditional;
mod copy;
mod etags;
mod forward;
mod head;
mod in_doubt;
mod multi_delete;
mod outgoing;
mod peers;
mod per_op;
mod public;
mod respond;
mod route;
mod small_body;
mod to_owner;
mod token;

use crate::body::{ProxyBody, full};
use crate::config::{ConditionalWrites, Config, Credential};
use crate::fence::gate::{Gate, Permit};
use crate::fence::hold::ObjectHold;
use crate::fence::landing::Record;
use crate::fence::resource::Resolver;
use crate::fence::token::Carriers;
use crate::metric_names as m;
use crate::s3::auth::{Credentials, Verified};
use crate::s3::conditions::Conditions;
use crate::s3::error::S3Error;
use crate::s3::op::{Op, Operation};
use crate::s3::query::Param;
use crate::s3::session::SessionKeys;
use crate::upstream::client::Upstream;
use crate::upstream::probe::Probe;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use per_op::{Exchange, Prepared};
use route::Route;
use small_body::read_small_body;
use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use to_owner::Via;

/// Chunk size of aws-chunked bodies sent upstream.
const UPSTREAM_CHUNK: usize = 64 * 1024;

pub struct Proxy {
    region: String,
    creds: Credentials,
    resolver: Resolver,
    carriers: Carriers,
    /// `None`: stamping is off (`fence.stamp_metadata = ""`).
    stamp_header: Option<http::HeaderName>,
    require_signed_token: bool,
    anonymous_reads: bool,
    gate: Arc<Gate>,
    upstream: Arc<Upstream>,
    max_header_bytes: usize,
    domains: Vec<String>,
    body_idle: Duration,
    quarantine: Duration,
    /// `fence.conditional_writes` (`conditional.rs`).
    conditional_writes: ConditionalWrites,
    /// What fencegate's conditioned writes last left each object as.
    etags: etags::Etags,
    /// Whether the backend honours conditional writes itself.
    probe: Arc<Probe>,
    /// Debug switch: a session credential's token is not used
    /// (`FENCEGATE_UNSAFE_SESSION_NO_TOKEN=1`), to see its tests fail.
    session_fencing_off: bool,
    /// Cluster mode with owners: the other replicas (`peers.rs`).
    peers: Option<Arc<peers::Peers>>,
    id_prefix: u32,
}

/// What the log line says of one request (and what its error answer and
/// its metrics need: the URI, the `Origin`, the sends to owners). The
/// phases write it as they learn things, and never read it: what a phase
/// needs comes in as its input, and what it establishes goes out as its
/// output (the structs below), as in pingora's phases.
struct RequestCtx {
    request_id: String,
    started: Instant,
    method: http::Method,
    /// The request's path as sent (for an error's `Resource`): the URI
    /// shares its bytes, so keeping it copies nothing.
    uri: http::Uri,
    /// The `Origin` of a cross-origin (browser) request.
    origin: Option<http::HeaderValue>,
    bytes_in: u64,
    op: &'static str,
    bucket: Option<String>,
    key: Option<String>,
    /// Who signed (shared with the credential table: no copy per request).
    credential: Option<Arc<Credential>>,
    /// A session credential's claims (its lock goes to the access log).
    session: Option<Arc<crate::s3::session::Session>>,
    resource: Option<String>,
    /// Phase 5's token, as the log line says it (the phases after it are
    /// handed the token itself).
    token: Option<u64>,
    highest: Option<u64>,
    decision: &'static str,
    payload: &'static str,
    /// Cluster mode with owners: how many times this request was sent to
    /// an owner (`route.rs`, at most [`route::MAX_SENDS`]), for
    /// `fencegate_cluster_forward_sends`.
    forward_sends: u32,
}

/// What phases 1 to 4 make of a request's head (`head.rs::head_phases`).
// Returned once a request, and nearly always `Signed`: boxed, that would be
// an allocation each.
#[allow(clippy::large_enum_variant)]
enum Signing<'h> {
    /// Signed and allowed: on to phase 5.
    Signed(Signed<'h>),
    /// A CORS preflight, forwarded unsigned (`public.rs`).
    Preflight,
    /// An unsigned read, with `server.anonymous_reads` (`public.rs`).
    Anonymous(Vec<Param<'h>>),
}

/// A signed request as its head says, the output of phases 1 to 4.
struct Signed<'h> {
    query: Vec<Param<'h>>,
    verified: Verified,
    op: Operation,
    /// Its `If-None-Match` / `If-Match` (or a delete's) conditions.
    conditions: Option<Conditions>,
    /// How it came: from a client, or from another replica.
    via: Via,
}

/// What the phases before the upstream request established.
struct Admitted<'a> {
    verified: Verified,
    op: Operation,
    query: Vec<Param<'a>>,
    via: Via,
    fenced: Fenced,
    /// The write's hold on its object (empty for other requests).
    hold: Arc<ObjectHold>,
    /// Its slot in the landing record (a write to a remote backend).
    record: Option<Arc<Record>>,
}

impl<'a> Admitted<'a> {
    fn new(
        signed: Signed<'a>,
        fenced: Fenced,
        hold: Arc<ObjectHold>,
        record: Option<Arc<Record>>,
    ) -> Admitted<'a> {
        Admitted {
            verified: signed.verified,
            op: signed.op,
            query: signed.query,
            via: signed.via,
            fenced,
            hold,
            record,
        }
    }
}

/// The outcome of phase 6's admission here (`admit_here.rs`).
struct Fenced {
    resource: Option<String>,
    /// Phase 5's token: the one place the phases after phase 6 read it.
    token: Option<u64>,
    permit: Option<Arc<Permit>>,
    /// Cluster mode: the object's shared hold, put by the admission.
    hold: Option<Arc<ObjectHold>>,
    /// Cluster mode with owners: the replica that owns the resource, and
    /// its epoch, when it is not this one (the request goes there).
    owner: Option<(String, i64)>,
}

fn is_presign_param(k: &str) -> bool {
    matches!(
        k,
        "X-Amz-Algorithm"
            | "X-Amz-Credential"
            | "X-Amz-Date"
            | "X-Amz-Expires"
            | "X-Amz-SignedHeaders"
            | "X-Amz-Signature"
            | "X-Amz-Security-Token"
    )
}

/// The key under which an open multipart upload's token is stored.
fn upload_key(bucket: &str, key: &str, upload_id: &str) -> String {
    format!("{bucket}/{key}\n{upload_id}")
}

/// A debug switch that takes `what` away, read once at start, to see the
/// tests of a guarantee fail: `NAME=1`, said loudly.
pub(crate) fn unsafe_switch(name: &str, what: &str) -> bool {
    let on = std::env::var(name).as_deref() == Ok("1");
    if on {
        tracing::warn!("{name}=1: {what} is OFF (debug only)");
    }
    on
}

/// A number for the next request on this thread, unique in the process.
/// Each thread takes a block of numbers from a shared counter once, and
/// counts within it: nothing shared is written per request.
fn request_number() -> u64 {
    const BLOCK: u64 = 1 << 32;
    static BLOCKS: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static NEXT: Cell<u64> = const { Cell::new(0) };
    }
    NEXT.with(|next| {
        let mut n = next.get();
        if n % BLOCK == 0 {
            n = BLOCKS.fetch_add(1, Ordering::Relaxed) * BLOCK + 1;
        }
        next.set(n + 1);
        n
    })
}

/// A header name from the configuration, which `config::validate` checked.
fn header_name(name: &str) -> http::HeaderName {
    http::HeaderName::from_bytes(name.as_bytes()).expect("a validated header name")
}

impl Proxy {
    /// `sessions`: the keys session credentials are verified with (none:
    /// they are refused).
    pub fn new(
        cfg: &Config,
        gate: Arc<Gate>,
        upstream: Arc<Upstream>,
        sessions: Option<Arc<SessionKeys>>,
        probe: Arc<Probe>,
    ) -> Result<Proxy, String> {
        let stamp_header = cfg.fence.stamp_header().map(|h| header_name(&h));
        let peers = match &cfg.cluster {
            Some(c) if c.ownership => Some(Arc::new(peers::Peers::new(c.peer_ca_file.as_deref())?)),
            _ => None,
        };
        if let Some(p) = &peers {
            gate.set_predecessors(p.clone());
        }
        Ok(Proxy {
            region: cfg.server.region.clone(),
            creds: Credentials::new(&cfg.credentials).with_sessions(sessions),
            resolver: Resolver::new(&cfg.rules),
            carriers: Carriers {
                header: header_name(&cfg.fence.token_header),
                meta_header: header_name(&cfg.fence.token_meta_header()),
                query: cfg.fence.token_query.clone(),
            },
            stamp_header,
            require_signed_token: cfg.fence.require_signed_token,
            anonymous_reads: cfg.server.anonymous_reads,
            gate,
            upstream,
            max_header_bytes: cfg.server.max_header_bytes,
            domains: cfg.server.domains.clone(),
            body_idle: Duration::from_millis(cfg.server.request_timeout_ms),
            quarantine: Duration::from_millis(cfg.fence.quarantine_ms),
            conditional_writes: cfg.fence.conditional_writes,
            etags: Default::default(),
            probe,
            session_fencing_off: unsafe_switch(
                "FENCEGATE_UNSAFE_SESSION_NO_TOKEN",
                "the token of session credentials",
            ),
            peers,
            id_prefix: rand::random(),
        })
    }

    /// The operations that `fence.conditional_writes` sends with a
    /// condition on their object as admitted. The gate's
    /// [`Kind::Conditioned`](crate::fence::gate::Kind) is chosen by the
    /// same rule (`admit_here.rs`).
    pub(super) fn conditions_on_backend(&self, op: Op) -> bool {
        let per_object = matches!(
            op,
            Op::PutObject | Op::CopyObject | Op::CompleteMultipartUpload
        );
        per_object
            && match self.conditional_writes {
                ConditionalWrites::On => true,
                ConditionalWrites::Off => false,
                // A remote backend (the embedded store's writes die with
                // the process, and it honours conditions anyway).
                ConditionalWrites::Auto => {
                    self.gate.doubts().landing().is_some() && self.probe.honours_writes()
                }
            }
    }

    fn request_id(&self) -> String {
        let n = request_number();
        // `{:08X}{:08X}` of the prefix and the count, without `format!`.
        let digits = 8.max(16 - n.leading_zeros() as usize / 4);
        let mut id = [0u8; 24];
        let hex = |v: u64, out: &mut [u8]| {
            for (i, d) in out.iter_mut().rev().enumerate() {
                *d = b"0123456789ABCDEF"[(v >> (i * 4)) as usize & 0xf];
            }
        };
        hex(self.id_prefix.into(), &mut id[..8]);
        hex(n, &mut id[8..8 + digits]);
        std::str::from_utf8(&id[..8 + digits])
            .expect("hex digits are ASCII")
            .to_string()
    }

    /// Handles one request; never fails (errors become S3 XML responses).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ProxyBody> {
        let mut ctx = RequestCtx {
            request_id: self.request_id(),
            started: Instant::now(),
            method: req.method().clone(),
            uri: req.uri().clone(),
            origin: req.headers().get(http::header::ORIGIN).cloned(),
            bytes_in: req
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0),
            op: "Unknown",
            bucket: None,
            key: None,
            credential: None,
            session: None,
            resource: None,
            token: None,
            highest: None,
            decision: "forwarded",
            payload: "",
            forward_sends: 0,
        };
        let resp = match self.process(req, &mut ctx).await {
            Ok(r) => r,
            Err(e) => {
                ctx.decision = e.outcome();
                if let S3Error::StaleFencingToken { highest, .. } = &e {
                    ctx.highest = Some(*highest);
                }
                let (mut parts, b) = e.to_response(ctx.uri.path(), &ctx.request_id).into_parts();
                // Boxed, as process()'s rare paths are (see there).
                if let Some(cors) = Box::pin(self.cors_for_error(&ctx, &e)).await {
                    parts.headers.extend(cors);
                }
                Response::from_parts(parts, full(b))
            }
        };
        m::handles::count_request(ctx.op, ctx.decision);
        if ctx.forward_sends > 0 {
            metrics::histogram!(m::CLUSTER_FORWARD_SENDS).record(ctx.forward_sends);
        }
        let resp = resp.map(|b| {
            b.map_frame(|f| {
                if let Some(d) = f.data_ref() {
                    m::handles::add_bytes_out(d.len() as u64);
                }
                f
            })
            .boxed()
        });
        ctx.log(resp.status().as_u16());
        resp
    }

    /// The phases, in order (see the module doc): each is handed what the
    /// phases before it established, and hands on what it establishes.
    async fn process(
        &self,
        req: Request<Incoming>,
        ctx: &mut RequestCtx,
    ) -> Result<Response<ProxyBody>, S3Error> {
        // The paths not every request takes (CORS, anonymous reads, the
        // conditional and copy HEADs, DeleteObjects) are boxed: each is a
        // future of several KB, and unboxed they would size (and have
        // hyper move) every request's future.
        let (head, body) = req.into_parts();
        if self.peers.is_some() && head.headers.contains_key(peers::PING) {
            (ctx.op, ctx.decision) = ("Ping", "answered");
            return Ok(peers::answer(&head, &self.gate));
        }
        // Phases 1 to 4 (`head.rs`).
        let signed = match self.head_phases(ctx, &head)? {
            Signing::Signed(signed) => signed,
            Signing::Preflight => return Box::pin(self.preflight(ctx, &head)).await,
            Signing::Anonymous(query) => {
                return Box::pin(self.anonymous_read(ctx, &head, query)).await;
            }
        };
        // Phase 5: the token, handed on from here (the log line says it).
        let token = self.token(&head, &signed).await?;
        ctx.token = token;
        // Phase 6: served here, or by the owner.
        let (fenced, body) = match self.route(ctx, &head, body, &signed, token).await? {
            Route::Here(fenced, body) => (fenced, body),
            Route::AtOwner(answer) => return Ok(answer),
        };
        // Phase 7: the object's hold, then the write's landing slot.
        let hold = self.hold(&head.headers, &signed, &fenced).await?;
        let conditions = signed.conditions.as_ref();
        let record = self.record_write(&signed.op, &fenced, &hold, conditions, &head.headers);
        let admitted = Admitted::new(signed, fenced, hold, record);
        // Phase 8: the upstream request, and what its operation adds.
        let mut out = self.upstream_request(&head, &admitted, body)?;
        let exchange = match self.nothing_per_op(&admitted) {
            Some(exchange) => exchange,
            None => match Box::pin(self.per_op(ctx, &head, &admitted, &mut out)).await? {
                Prepared::Forward(exchange) => exchange,
                Prepared::Answered(answer) => return Ok(answer),
            },
        };
        if out.body.is_none() {
            still_stands(&admitted, &exchange)?;
        }
        drop(admitted.fenced.permit);
        drop(admitted.hold);
        drop(admitted.record);
        let Exchange {
            permits,
            hold,
            records,
            refused,
            own_condition,
        } = exchange;
        // Phases 9 and 10: the exchange, and the answer to the client.
        let answer = self.forward(out, permits, hold, records).await;
        let (op, verified) = (&admitted.op, &admitted.verified);
        let resp = self.respond(answer, op, verified, admitted.fenced.token, own_condition);
        let resp = resp.await?;
        match refused.is_empty() {
            true => Ok(resp),
            false => multi_delete::with_refused(resp, &refused).await,
        }
    }
}

/// A write without a body had its last check in `upstream_request`; the
/// HEADs after it took time, in which a newer token or a lapsed lease may
/// have come: it is checked again right before it goes.
fn still_stands(admitted: &Admitted, exchange: &Exchange) -> Result<(), S3Error> {
    if let Some(p) = &admitted.fenced.permit
        && !p.body_complete()
    {
        let resource = admitted.fenced.resource.as_deref().unwrap_or_default();
        return Err(S3Error::aborted(p, resource));
    }
    if !exchange.hold.body_complete() {
        let key = admitted.op.key.as_deref().unwrap_or_default();
        return Err(S3Error::lease_lapsed(key));
    }
    for r in &exchange.records {
        r.whole();
    }
    Ok(())
}

impl RequestCtx {
    /// The one log event of a request.
    fn log(&self, status: u16) {
        crate::access_log::write(&crate::access_log::Line {
            request_id: &self.request_id,
            method: self.method.as_str(),
            op: self.op,
            bucket: self.bucket.as_deref().unwrap_or(""),
            key: self.key.as_deref().unwrap_or(""),
            access_key: self.credential.as_ref().map_or("", |c| &c.access_key_id),
            lock: self.session.as_ref().map_or("", |s| &s.lock),
            resource: self.resource.as_deref().unwrap_or(""),
            token: self.token,
            highest: self.highest,
            decision: self.decision,
            payload: self.payload,
            status,
            bytes_in: self.bytes_in,
            elapsed: self.started.elapsed(),
            warn: self.decision == "stale",
        });
    }
}

#[cfg(test)]
mod tests {
    use super::request_number;
    use std::collections::HashSet;

    /// Request numbers from many threads, each counting in its own block,
    /// never repeat.
    #[test]
    fn request_numbers_are_unique_across_threads() {
        let threads: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| request_number()).collect::<Vec<_>>()))
            .collect();
        let mut seen = HashSet::new();
        for t in threads {
            for n in t.join().unwrap() {
                assert!(seen.insert(n), "{n} twice");
            }
        }
        assert_eq!(seen.len(), 8000);
    }
}
