//! Admission here, the step of phase 6 (`route.rs`) that admits a request
//! here: its resource from the rules, and its admission through the gate
//! (check, durable raise, ordering barrier). In cluster mode without
//! owners one etcd round trip both admits the write and shares its
//! object's hold; with owners the admission may name the replica that
//! owns the resource instead.

use super::{Fenced, Proxy, RequestCtx, Signed};
use crate::fence::doubt::Touch;
use crate::fence::gate::{Admission, Kind};
use crate::fence::hold::object_name;
use crate::fence::resource::Fencing;
use crate::metric_names as m;
use crate::s3::error::S3Error;
use crate::s3::headers::{X_AMZ_SSE, X_AMZ_SSE_CUSTOMER_ALGORITHM};
use crate::s3::op::{Effect, Op, Operation};
use http::HeaderMap;
use http::request::Parts;
use std::sync::Arc;
use std::time::Instant;

/// Whether a PutObject with these headers leaves its body's MD5 as its
/// ETag: it names no customer key and no KMS key.
fn etag_is_md5(headers: &HeaderMap) -> bool {
    let kms = headers
        .get(X_AMZ_SSE)
        .is_some_and(|v| v.as_bytes().starts_with(b"aws:kms"));
    !kms && !headers.contains_key(X_AMZ_SSE_CUSTOMER_ALGORITHM)
}

/// What a fenced request on `object` does, for the writes in doubt on its
/// resource (`fence::doubt`). `md5_etag`: a PutObject whose ETag will be
/// its body's MD5 (`etag_is_md5`).
fn touch(op: Op, object: &str, read: bool, md5_etag: bool) -> Touch<'_> {
    match op {
        _ if read => Touch::Read,
        Op::PutObject => Touch::Put { object, md5_etag },
        Op::DeleteObject => Touch::Delete { object },
        Op::CopyObject | Op::CompleteMultipartUpload => Touch::Replace { object },
        Op::CreateMultipartUpload
        | Op::UploadPart
        | Op::UploadPartCopy
        | Op::AbortMultipartUpload => Touch::Keeps,
        _ => Touch::Other,
    }
}

impl Proxy {
    /// Whether a fenced `op` goes to the backend with a condition on its
    /// object as admitted (`per_op.rs`), which the backend honours: the
    /// store then refuses it once overtaken.
    fn conditioned_at_backend(&self, op: &Operation) -> bool {
        self.conditions_on_backend(op.op) && self.probe.honours_writes()
    }

    /// How the gate admits `op` on `resource`, if it does. The backend
    /// refuses a conditioned write once overtaken only on its own object:
    /// on a resource of several objects it is a write like any other.
    fn kind(&self, op: &Operation, resource: &str, object: &str) -> Option<Kind> {
        match op.effect() {
            Effect::ObjectWrite if self.conditioned_at_backend(op) && resource == object => {
                Some(Kind::Conditioned)
            }
            Effect::ObjectWrite => Some(Kind::Write),
            Effect::ObjectRead => Some(Kind::Read),
            _ => None,
        }
    }

    /// Phase 6: admission through the gate, for `token` (phase 5's). An
    /// unconditional write that replaces or deletes its object shares the
    /// object's hold in the same step where that saves a round trip
    /// (cluster mode).
    pub(super) async fn admit_here(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        signed: &Signed<'_>,
        token: Option<u64>,
    ) -> Result<Fenced, S3Error> {
        let (op, via) = (&signed.op, signed.via);
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
        if token.is_none() && matches!(op.effect(), Effect::ObjectRead) {
            // A read without a token passes as it is: the log line names
            // its resource, and nothing else is made for it.
            ctx.resource = Some(resource);
            return Ok(none);
        }
        let object = object_name(bucket, key);
        let Some(kind) = self.kind(op, &resource, &object) else {
            return Ok(none);
        };
        ctx.resource = Some(resource.clone());
        // A token-less read returned above: a write without one is refused.
        let Some(token) = token else {
            return Err(S3Error::MissingFencingToken(resource));
        };
        // Forwarded to a tenure that no longer stands here (a lease not
        // fresh, a resource let go): `Moved` at once, nothing done, rather
        // than an attempt to take the resource back.
        if via.forwarded.is_some() {
            self.check_forwarded(via, &resource)?;
        }
        let admitting = Instant::now();
        let sharing = kind.writes()
            && signed.conditions.is_none()
            && op.op.changes_object()
            && self.gate.holds().put_by_admission();
        let admitted = match sharing {
            true => self.gate.admit_sharing(&resource, token, &object).await,
            false => {
                let md5_etag = op.op == Op::PutObject && etag_is_md5(&head.headers);
                let touch = touch(op.op, &object, kind == Kind::Read, md5_etag);
                let admitted = self.gate.admit_touching(&resource, token, kind, touch);
                admitted.await.map(|a| (a, None))
            }
        };
        m::handles::admission_wait().record(admitting.elapsed().as_secs_f64());
        // Forwarded, and its tenure lapsed meanwhile (also while a raise
        // waited for etcd and failed): `Moved`, nothing done, for the
        // forwarder to route again.
        if !matches!(admitted, Ok((Admission::AtOwner(..), _))) {
            self.check_forwarded(via, &resource)?;
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
