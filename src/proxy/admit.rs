//! Phases 5 and 6 of a request (`Proxy::process`): its token, and its
//! admission through the gate. Apart from the rest because cluster mode
//! makes the admission do two things in one etcd round trip: admit the
//! write and share its object's hold.

use super::{Fenced, Proxy, RequestCtx, upload_key};
use crate::fence::gate::{Kind, Refusal};
use crate::fence::hold::object_name;
use crate::fence::resource::Fencing;
use crate::metric_names as m;
use crate::s3::auth::Verified;
use crate::s3::error::S3Error;
use crate::s3::op::{Access, Operation};
use crate::s3::query::Param;
use http::request::Parts;
use std::sync::Arc;
use std::time::Instant;

impl Proxy {
    /// Phase 5: the request's token, from a carrier its signature covers,
    /// or inherited from the multipart upload it belongs to.
    pub(super) async fn token(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        query: &[Param<'_>],
        verified: &Verified,
        op: &Operation,
    ) -> Result<Option<u64>, S3Error> {
        // An unsigned token header is never used where a signature is
        // required of it: it is ignored beside a signed carrier (rclone
        // sends both), and refused alone (anyone holding a presigned URL
        // could otherwise raise a fence for good).
        let header = &self.carriers.header;
        let unsigned_header =
            head.headers.contains_key(header) && !verified.signs_header(header.as_str());
        let token = if unsigned_header && (verified.presigned || self.require_signed_token) {
            let signed = self
                .carriers
                .extract_without_header(&head.headers, query)
                .map_err(|e| S3Error::InvalidFencingToken(e.to_string()))?;
            Some(signed.ok_or_else(|| {
                S3Error::InvalidFencingToken(format!(
                    "the {header} header is not covered by the request's signature: sign it, \
                     or carry the token in the {} query parameter (covered by a presigned \
                     URL's signature) or in the {} header (always signed)",
                    self.carriers.query, self.carriers.meta_header,
                ))
            })?)
        } else {
            self.carriers
                .extract(&head.headers, query)
                .map_err(|e| S3Error::InvalidFencingToken(e.to_string()))?
        };
        // A session credential carries its token: every request signed
        // with it has that token, and one that says another is refused.
        let session = (verified.session.as_ref()).filter(|_| !self.session_token_ignored);
        let token = match (session, token) {
            (Some(s), Some(t)) if t != s.token => {
                return Err(S3Error::InvalidFencingToken(format!(
                    "the request's fencing token {t} differs from the token {} of its session \
                     credential {} (lock {:?})",
                    s.token, s.access_key_id, s.lock
                )));
            }
            (Some(s), _) => Some(s.token),
            (None, t) => t,
        };
        // (No tuple of borrows is held across an await here: that makes the
        // future's Send-ness unprovable to rustc.)
        let upload = match (token, &op.upload_id, &op.bucket, &op.key) {
            (None, Some(u), Some(b), Some(k)) => Some(upload_key(b, k, u)),
            _ => None,
        };
        let token = match upload {
            Some(upload) => self
                .gate
                .store()
                .upload_token(&upload)
                .await
                .map_err(|e| S3Error::ServiceUnavailable(e.to_string()))?,
            None => token,
        };
        ctx.token = token;
        Ok(token)
    }

    /// Whether a fenced `op` goes to the backend with a condition on its
    /// object as admitted (`per_op.rs`), which the backend honours: the
    /// store then refuses it once overtaken.
    fn conditioned_at_backend(&self, op: &Operation) -> bool {
        self.conditions_on_backend(op.op) && self.probe.honours_writes()
    }

    /// Phase 6: admission through the gate. An unconditional write that
    /// replaces or deletes its object shares the object's hold in the same
    /// step where that saves a round trip (cluster mode).
    pub(super) async fn fence(
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
        let kind = match op.access() {
            Access::ObjectWrite if self.conditioned_at_backend(op) => Kind::Conditioned,
            Access::ObjectWrite => Kind::Write,
            Access::ObjectRead => Kind::Read,
            _ => return Ok(none),
        };
        let Fencing::Fenced(resource) = self.resolver.resolve(bucket, key) else {
            return Ok(none);
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
            true => {
                let object = object_name(bucket, key);
                self.gate.admit_sharing(&resource, token, &object).await
            }
            false => self
                .gate
                .admit(&resource, token, kind)
                .await
                .map(|p| (p, None)),
        };
        m::handles::admission_wait().record(admitting.elapsed().as_secs_f64());
        // Forwarded, and its tenure lapsed meanwhile (also while a raise
        // waited for etcd and failed): `Moved`, nothing done, for the
        // forwarder to route again.
        if !matches!(admitted, Err(Refusal::Elsewhere(..))) {
            self.check_forwarded(ctx, &resource)?;
        }
        let (permit, hold, owner) = match admitted {
            Ok((permit, hold)) => (permit, hold, None),
            Err(Refusal::Elsewhere(owner, epoch)) => (None, None, Some((owner, epoch))),
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
