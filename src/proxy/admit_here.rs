//! Admission here, the step of phase 6 (`route.rs`) that admits a request
//! here: its resource from the rules, and its admission through the gate
//! (check, durable raise, ordering barrier). In cluster mode without
//! owners one etcd round trip both admits the write and shares its
//! object's hold; with owners the admission may name the replica that
//! owns the resource instead.

use super::{Fenced, Proxy, RequestCtx, in_doubt};
use crate::fence::gate::{Admission, Kind};
use crate::fence::hold::object_name;
use crate::fence::resource::Fencing;
use crate::metric_names as m;
use crate::s3::error::S3Error;
use crate::s3::op::{Effect, Operation};
use std::sync::Arc;
use std::time::Instant;

impl Proxy {
    /// Whether a fenced `op` goes to the backend with a condition on its
    /// object as admitted (`per_op.rs`), which the backend honours: the
    /// store then refuses it once overtaken.
    fn conditioned_at_backend(&self, op: &Operation) -> bool {
        self.conditions_on_backend(op.op) && self.probe.honours_writes()
    }

    /// Phase 6: admission through the gate. An unconditional write that
    /// replaces or deletes its object shares the object's hold in the same
    /// step where that saves a round trip (cluster mode).
    pub(super) async fn admit_here(
        &self,
        ctx: &mut RequestCtx,
        op: &Operation,
        token: Option<u64>,
        unconditional: bool,
    ) -> Result<Fenced, S3Error> {
        let none = Fenced {
            resource: None,
            token,
            permit: None,
            hold: None,
            owner: None,
        };
        let (bucket, key) = match (&op.bucket, &op.key) {
            (Some(b), Some(k)) => (b, k),
            _ => return Ok(none),
        };
        let Fencing::Fenced(resource) = self.resolver.resolve(bucket, key) else {
            return Ok(none);
        };
        let object = object_name(bucket, key);
        // The backend refuses a conditioned write once overtaken only on
        // its own object: on a resource of several objects it is a write
        // like any other.
        let kind = match op.effect() {
            Effect::ObjectWrite if self.conditioned_at_backend(op) && resource == object => {
                Kind::Conditioned
            }
            Effect::ObjectWrite => Kind::Write,
            Effect::ObjectRead => Kind::Read,
            _ => return Ok(none),
        };
        ctx.resource = Some(resource.clone());
        let token = match (token, kind) {
            (Some(t), _) => t,
            (None, Kind::Read) => return Ok(none),
            (None, _) => return Err(S3Error::MissingFencingToken(resource)),
        };
        // Forwarded to a tenure that no longer stands here (a lease not
        // fresh, a resource let go): `Moved` at once, nothing done, rather
        // than an attempt to take the resource back.
        if ctx.forwarded.is_some() {
            self.check_forwarded(ctx, &resource)?;
        }
        let admitting = Instant::now();
        let sharing = kind.writes()
            && unconditional
            && op.op.changes_object()
            && self.gate.holds().put_by_admission();
        let admitted = match sharing {
            true => self.gate.admit_sharing(&resource, token, &object).await,
            false => {
                let touch = in_doubt::touch(op.op, &object, kind == Kind::Read, ctx.etag_is_md5);
                let admitted = self.gate.admit_touching(&resource, token, kind, touch);
                admitted.await.map(|a| (a, None))
            }
        };
        m::handles::admission_wait().record(admitting.elapsed().as_secs_f64());
        // Forwarded, and its tenure lapsed meanwhile (also while a raise
        // waited for etcd and failed): `Moved`, nothing done, for the
        // forwarder to route again.
        if !matches!(admitted, Ok((Admission::AtOwner(..), _))) {
            self.check_forwarded(ctx, &resource)?;
        }
        let (permit, hold, owner) = match admitted {
            Ok((Admission::Here(permit), hold)) => (permit, hold, None),
            Ok((Admission::AtOwner(owner, epoch), _)) => (None, None, Some((owner, epoch))),
            Err(r) => return Err(S3Error::from_refusal(r, &resource)),
        };
        Ok(Fenced {
            resource: Some(resource),
            token: Some(token),
            permit: permit.map(Arc::new),
            hold: hold.map(Arc::new),
            owner,
        })
    }
}
