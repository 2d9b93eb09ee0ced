//! Phase 5 of a request (`Proxy::process`): its fencing token, from a
//! carrier its signature covers, from its session credential, or
//! inherited from the multipart upload it belongs to.

use super::{Proxy, Signed, upload_key};
use crate::s3::error::S3Error;
use http::request::Parts;

impl Proxy {
    /// Phase 5: the request's token, from a carrier its signature covers,
    /// from its session credential, or inherited from the multipart upload
    /// it belongs to.
    pub(super) async fn token(
        &self,
        head: &Parts,
        signed: &Signed<'_>,
    ) -> Result<Option<u64>, S3Error> {
        let (query, verified, op) = (&signed.query, &signed.verified, &signed.op);
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
        let session = (verified.session.as_ref()).filter(|_| !self.session_fencing_off);
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
                .table()
                .upload_token(&upload)
                .await
                .map_err(|e| S3Error::ServiceUnavailable(e.to_string()))?,
            None => token,
        };
        Ok(token)
    }
}
