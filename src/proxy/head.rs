//! Phases 1 to 4 of a request (`Proxy::process`), in `head_phases`:
//! everything fencegate learns from the request's head alone, before any
//! state is asked: its size and query, who signed it, what it does to
//! which bucket and key (and on what conditions), and whether the signer
//! may.

use super::to_owner::Via;
use super::{Proxy, RequestCtx, Signed, Signing};
use crate::fence::gate::Mode;
use crate::s3::auth::{self, Verified};
use crate::s3::conditions::Conditions;
use crate::s3::error::S3Error;
use crate::s3::names;
use crate::s3::op::{self, Effect, Operation};
use crate::s3::query::{self, Param};
use http::request::Parts;
use std::time::SystemTime;

impl Proxy {
    /// Phases 1 to 4, in order: the head checked, its signature, what it
    /// does and whether its signer may. A CORS preflight and an anonymous
    /// read leave after phase 1, unsigned (`public.rs`).
    pub(super) fn head_phases<'h>(
        &self,
        ctx: &mut RequestCtx,
        head: &'h Parts,
    ) -> Result<Signing<'h>, S3Error> {
        let query = self.check_head(head)?;
        if head.method == http::Method::OPTIONS {
            return Ok(Signing::Preflight);
        }
        if self.anonymous_reads && auth::is_anonymous(&head.headers, &query) {
            return Ok(Signing::Anonymous(query));
        }
        let verified = self.authenticate(ctx, head, &query)?;
        let via = match self.gate.mode() {
            Mode::Owners(_) => Via::of(&head.headers),
            _ => Via::default(),
        };
        let op = self.classify(ctx, head, &query)?;
        self.authorize(&verified, &op, &query)?;
        let versioned = query::has_query_param(&query, "versionId");
        let conditions = Conditions::of_request(&head.headers, op.op, versioned)?;
        Ok(Signing::Signed(Signed {
            query,
            verified,
            op,
            conditions,
            via,
        }))
    }

    /// Phase 1: the head's size, and the query parsed once.
    pub(super) fn check_head<'h>(&self, head: &'h Parts) -> Result<Vec<Param<'h>>, S3Error> {
        let header_bytes: usize = head
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>()
            + head.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
        if header_bytes > self.max_header_bytes {
            return Err(S3Error::RequestHeaderSectionTooLarge);
        }
        let query = query::decode_query(head.uri.query());
        // A short query (a presigned URL has eight names) is scanned; a
        // long one goes through a set, so that it cannot cost quadratic
        // time.
        let repeated = if query.len() <= 16 {
            (1..query.len()).find(|&i| query[..i].iter().any(|(k, _)| *k == query[i].0))
        } else {
            let mut names = std::collections::HashSet::with_capacity(query.len());
            query.iter().position(|(k, _)| !names.insert(k.as_ref()))
        };
        if let Some(i) = repeated {
            return Err(S3Error::InvalidArgument(format!(
                "query parameter {:?} is given more than once",
                query[i].0
            )));
        }
        Ok(query)
    }

    /// Phase 2: SigV4.
    pub(super) fn authenticate(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        query: &[Param<'_>],
    ) -> Result<Verified, S3Error> {
        let verified = auth::verify(
            &auth::Head {
                method: head.method.as_str(),
                raw_path: head.uri.path(),
                query,
                headers: &head.headers,
            },
            &self.creds,
            &self.region,
            SystemTime::now(),
        )?;
        ctx.credential = Some(verified.credential.clone());
        ctx.session = verified.session.clone();
        ctx.payload = verified.payload.name();
        Ok(verified)
    }

    /// Phase 3: what the request does, to which bucket and key.
    pub(super) fn classify(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        query: &[Param<'_>],
    ) -> Result<Operation, S3Error> {
        let (bucket, key) = self.split(ctx, head)?;
        let op = op::classify(&head.method, bucket, key, query, &head.headers)?;
        ctx.op = op.op.name();
        Ok(op)
    }

    /// The bucket and key of a request, from its host and path.
    pub(super) fn split(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
    ) -> Result<(Option<String>, Option<String>), S3Error> {
        let host = head
            .headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok());
        let (bucket, key) = names::split_request(host, head.uri.path(), &self.domains)?;
        ctx.bucket = bucket.clone();
        ctx.key = key.clone();
        Ok((bucket, key))
    }

    /// Phase 4: the credential's buckets and admin right, and a session
    /// credential's scope.
    pub(super) fn authorize(
        &self,
        v: &Verified,
        op: &Operation,
        query: &[Param<'_>],
    ) -> Result<(), S3Error> {
        let Some(bucket) = &op.bucket else {
            return Ok(());
        };
        // A session credential's scope first: its refusal names the scope
        // and the lock, which the checks below cannot.
        if let Some(s) = &v.session {
            s.reaches(op, query)?;
        }
        let key_id = &v.credential.access_key_id;
        if !v.credential.allows_bucket(bucket) {
            return Err(S3Error::AccessDenied(format!(
                "access key {key_id} may not use bucket {bucket}"
            )));
        }
        if let Some(src) = &op.copy_source
            && !v.credential.allows_bucket(&src.bucket)
        {
            return Err(S3Error::AccessDenied(format!(
                "access key {key_id} may not read the copy source bucket {}",
                src.bucket
            )));
        }
        if op.effect() == Effect::BucketWrite && !v.credential.bucket_admin {
            return Err(S3Error::AccessDenied(format!(
                "access key {key_id} may not administer bucket {bucket}"
            )));
        }
        Ok(())
    }
}
