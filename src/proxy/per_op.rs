//! Phase 8, its second part: what an operation adds to its upstream request, in one
//! `match`: a conditional write made to hold on any backend
//! (`conditional.rs`), a fenced copy that keeps its source's metadata
//! (`copy.rs`), CreateBucket's location as the backend's region
//! (`small_body.rs`), and DeleteObjects' keys fenced and held one by one
//! (`multi_delete.rs`), which may send it to their owner or answer it here.
//! What the exchange then keeps (its permits and object holds) leaves here
//! as one [`Exchange`].

use super::multi_delete::To;
use super::to_owner::Toward;
use super::{Admitted, Proxy, RequestCtx, multi_delete};
use crate::body::ProxyBody;
use crate::fence::gate::Permit;
use crate::fence::hold::ObjectHold;
use crate::fence::landing::Record;
use crate::s3::conditions::Failed;
use crate::s3::error::S3Error;
use crate::s3::op::Op;
use crate::upstream::client::Outgoing;
use http::Response;
use http::request::Parts;
use std::sync::Arc;
use tokio::time::Instant;

/// What a request keeps while its exchange runs, and DeleteObjects' keys
/// refused here (merged into the backend's answer).
pub(super) struct Exchange {
    pub permits: Vec<Arc<Permit>>,
    pub hold: Arc<ObjectHold>,
    /// The write's slots in the landing record (a remote backend).
    pub records: Vec<Arc<Record>>,
    pub refused: Vec<(String, Failed)>,
    /// The object, and the owner's epoch (0 on a single node), when the
    /// write goes with a condition of fencegate's own
    /// (`fence.conditional_writes`): its answer says what the object is
    /// now (`respond.rs`, `after_own_condition`).
    pub own_condition: Option<(String, i64)>,
}

impl Exchange {
    /// The request's own admission and hold, as phases 6 and 7 left them.
    fn of(admitted: &Admitted) -> Exchange {
        Exchange {
            permits: admitted.fenced.permit.iter().cloned().collect(),
            hold: admitted.hold.clone(),
            records: admitted.record.iter().cloned().collect(),
            refused: Vec::new(),
            own_condition: None,
        }
    }
}

/// The outcome of the second part of phase 8.
pub(super) enum Prepared {
    /// To the backend, keeping this.
    Forward(Exchange),
    /// Answered without the backend here: by the keys' owner, or every
    /// key refused.
    Answered(Response<ProxyBody>),
}

impl Proxy {
    /// Phase 8's second part for a request it adds nothing to (most): its
    /// exchange at once, with no future. `None`: the request takes
    /// [`Proxy::per_op`].
    pub(super) fn nothing_per_op(&self, admitted: &Admitted) -> Option<Exchange> {
        let needed = match admitted.op.op {
            Op::CopyObject => self.held_on_backend(admitted) || admitted.fenced.token.is_some(),
            Op::CreateBucket | Op::DeleteObjects => true,
            _ => self.held_on_backend(admitted),
        };
        (!needed).then(|| Exchange::of(admitted))
    }

    /// Whether a write's condition is made to hold on the backend too
    /// (`fence.conditional_writes`, a fenced write).
    fn held_on_backend(&self, admitted: &Admitted) -> bool {
        self.conditions_on_backend(admitted.op.op) && admitted.fenced.permit.is_some()
    }

    /// A conditioned write is guarded by the store only with `If-Match`:
    /// with `If-None-Match: *` (its object was absent), a delete after it
    /// leaves the condition true, so it keeps its resource's in-flight
    /// marker like any write (`Gate::needs_marker`).
    /// `sent`: the headers it goes with.
    async fn guarded_by_its_etag(
        &self,
        admitted: &Admitted<'_>,
        sent: [&http::HeaderMap; 2],
    ) -> Result<(), S3Error> {
        let if_match = sent.iter().any(|h| h.contains_key(http::header::IF_MATCH));
        let (Some(permit), Some(resource)) = (&admitted.fenced.permit, &admitted.fenced.resource)
        else {
            return Ok(());
        };
        if if_match {
            return Ok(());
        }
        let marked = self.gate.needs_marker(resource, permit).await;
        marked.map_err(|r| S3Error::from_refusal(r, resource))
    }

    /// Phase 8, its second part (see the module doc).
    pub(super) async fn per_op(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        admitted: &Admitted<'_>,
        out: &mut Outgoing,
    ) -> Result<Prepared, S3Error> {
        let mut exchange = Exchange::of(admitted);
        let op = &admitted.op;
        if self.held_on_backend(admitted) {
            let epoch = admitted.fenced.permit.as_ref().and_then(|p| p.epoch());
            let epoch = epoch.unwrap_or(0);
            let own = self.condition_on_current(out, &head.headers, op, epoch);
            exchange.own_condition = own.await?.map(|object| (object, epoch));
            self.guarded_by_its_etag(admitted, [&out.headers, &head.headers])
                .await?;
            if let Some(r) = &admitted.record {
                self.record_sent(r, op.op, &out.headers);
            }
        }
        match op.op {
            Op::CopyObject if admitted.fenced.token.is_some() => {
                self.keep_source_metadata(out, op).await?;
            }
            Op::CreateBucket => self.create_bucket_body(out).await?,
            Op::DeleteObjects => {
                return self
                    .delete_objects(ctx, head, admitted, out, exchange)
                    .await;
            }
            _ => {}
        }
        Ok(Prepared::Forward(exchange))
    }

    /// DeleteObjects: every key fenced and held; the request goes to the
    /// keys' owner when another replica owns their resources.
    async fn delete_objects(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        admitted: &Admitted<'_>,
        out: &mut Outgoing,
        mut exchange: Exchange,
    ) -> Result<Prepared, S3Error> {
        let multi = self.fence_multi_delete(admitted, out, ctx).await?;
        if let Some(elsewhere) = multi.elsewhere {
            // What was read of an aws-chunked body is not what was signed.
            let chunked = admitted.verified.payload.is_chunked();
            let answer = match elsewhere.to {
                To::Peer(_, why) if chunked => return Err(why),
                To::Peer(peer, why) => {
                    let relayed = self.relay(ctx, head, elsewhere.body, peer, why);
                    Box::pin(relayed).await?
                }
                To::Owner(owner, _) if chunked => {
                    return Err(S3Error::SlowDown(format!(
                        "the keys' resources are owned by replica {owner}; an aws-chunked \
                         DeleteObjects is not forwarded: send it there"
                    )));
                }
                To::Owner(owner, epoch) => {
                    let toward = Toward {
                        owner: (owner, epoch),
                        resource: &elsewhere.resources,
                        via: admitted.via,
                        deadline: Instant::now() + self.gate.wait_bound(),
                    };
                    let sent = self.multi_delete_to_owner(ctx, head, toward, elsewhere.body);
                    sent.await?
                }
            };
            return Ok(Prepared::Answered(answer));
        }
        exchange
            .permits
            .extend(multi.permits.into_iter().map(Arc::new));
        exchange.hold = Arc::new(multi.hold);
        exchange.records.extend(multi.records);
        exchange.refused = multi.refused;
        if multi.nothing_left {
            return Ok(Prepared::Answered(multi_delete::refused_only(
                &exchange.refused,
            )));
        }
        Ok(Prepared::Forward(exchange))
    }
}
