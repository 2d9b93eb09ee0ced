//! What reaches the backend without fencegate's credential, and CORS.
//!
//! A browser's CORS preflight (`OPTIONS`) and, with `server.anonymous_reads`,
//! an unsigned `GET` or `HEAD` are forwarded **unsigned**: the backend's own
//! CORS rules and public-access policy decide, exactly as they would for a
//! caller talking to the backend directly. Re-signing them with the backend
//! credential would lend fencegate's own read access to anyone. Anonymous
//! requests never write and never carry a token (a token on a read still
//! raises the fence, which only a signed request may do).
//!
//! The errors fencegate answers itself (a stale token, say) carry the CORS
//! headers the backend's rules give the request's origin, asked of the
//! backend with a preflight of the failed request, so that a web page can
//! read the error code and `x-fencing-highest-token`.

use super::{Proxy, RequestCtx, read_small_body};
use crate::body::ProxyBody;
use crate::s3::error::S3Error;
use crate::s3::op::Effect;
use crate::s3::query::{self, Param};
use crate::upstream::client::{
    Outgoing, UpstreamPayload, clean_response_headers, forwarded_headers,
};
use http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS,
    ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Response};
use http_body_util::BodyExt;

/// Headers of fencegate's own error answers that a page may read.
const OWN_EXPOSED: &str = "x-fencing-highest-token, x-amz-request-id";

/// How long an error answer waits for the backend's CORS rules: an error
/// must not wait for a backend that is itself the problem.
const CORS_ASK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl Proxy {
    /// `OPTIONS`: the preflight's own headers, to the bucket and key as
    /// fencegate reads them, unsigned; the backend's answer as it is.
    pub(super) async fn preflight(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
    ) -> Result<Response<ProxyBody>, S3Error> {
        ctx.op = "CorsPreflight";
        let (bucket, key) = self.split(ctx, head)?;
        let mut headers = HeaderMap::new();
        for name in [
            ORIGIN,
            ACCESS_CONTROL_REQUEST_METHOD,
            ACCESS_CONTROL_REQUEST_HEADERS,
        ] {
            for v in head.headers.get_all(&name) {
                headers.append(name.clone(), v.clone());
            }
        }
        self.pass_through(unsigned(Method::OPTIONS, bucket, key, &[], headers))
            .await
    }

    /// An unsigned request with `server.anonymous_reads` on: a read without
    /// a token, forwarded unsigned.
    pub(super) async fn anonymous_read(
        &self,
        ctx: &mut RequestCtx,
        head: &Parts,
        query: Vec<Param<'_>>,
    ) -> Result<Response<ProxyBody>, S3Error> {
        let op = self.classify(ctx, head, &query)?;
        let reads = matches!(
            op.effect(),
            Effect::Service | Effect::BucketRead | Effect::ObjectRead
        );
        if !(reads && matches!(head.method, Method::GET | Method::HEAD)) {
            return Err(S3Error::AccessDenied(
                "anonymous requests may only read (GET, HEAD): sign writes with SigV4".into(),
            ));
        }
        let token = self
            .carriers
            .extract(&head.headers, &query)
            .map_err(|e| S3Error::InvalidFencingToken(e.to_string()))?;
        if token.is_some() {
            return Err(S3Error::InvalidFencingToken(
                "a fencing token needs a signed request: anonymous reads carry none".into(),
            ));
        }
        let mut headers = forwarded_headers(&head.headers, &[]);
        crate::s3::range::forward_range(op.op, &mut headers);
        let out = unsigned(head.method.clone(), op.bucket, op.key, &query, headers);
        self.pass_through(out).await
    }

    /// The backend's answer to an unsigned request, streamed back.
    async fn pass_through(&self, out: Outgoing) -> Result<Response<ProxyBody>, S3Error> {
        let resp = self.upstream.send(out).await?;
        let (mut parts, body) = resp.into_parts();
        clean_response_headers(&mut parts.headers);
        let body = body.boxed();
        Ok(Response::from_parts(parts, body))
    }

    /// The CORS headers for an error fencegate answers itself: what the
    /// backend's preflight of the same method, bucket and key allows the
    /// request's origin, plus fencegate's own headers exposed. `None` when
    /// the request is not cross-origin (or names no bucket), is itself a
    /// preflight, failed at the backend (`502`: the backend's own failure),
    /// or the backend allows nothing or does not answer within
    /// `CORS_ASK_TIMEOUT`.
    pub(super) async fn cors_for_error(
        &self,
        ctx: &RequestCtx,
        error: &S3Error,
    ) -> Option<HeaderMap> {
        if ctx.method == Method::OPTIONS || matches!(error, S3Error::BadGateway(_)) {
            return None;
        }
        let origin = ctx.origin.clone()?;
        let method = HeaderValue::from_str(ctx.method.as_str()).ok()?;
        let mut headers = HeaderMap::new();
        headers.insert(ORIGIN, origin);
        headers.insert(ACCESS_CONTROL_REQUEST_METHOD, method);
        let ask = unsigned(
            Method::OPTIONS,
            Some(ctx.bucket.clone()?),
            ctx.key.clone(),
            &[],
            headers,
        );
        let asked = async {
            let resp = self.upstream.send(ask).await.ok()?;
            let (parts, body) = resp.into_parts();
            let body = body.boxed();
            // Read to the end, so the connection goes back to the pool.
            let _ = read_small_body(body, 64 << 10).await;
            Some(parts)
        };
        let parts = tokio::time::timeout(CORS_ASK_TIMEOUT, asked).await.ok()??;
        if !parts.status.is_success() {
            return None;
        }
        cors_headers(&parts.headers)
    }
}

/// From a backend's preflight answer, the headers an actual response to
/// that origin carries, with fencegate's own headers exposed.
fn cors_headers(preflight: &HeaderMap) -> Option<HeaderMap> {
    let mut out = HeaderMap::new();
    out.insert(
        ACCESS_CONTROL_ALLOW_ORIGIN,
        preflight.get(ACCESS_CONTROL_ALLOW_ORIGIN)?.clone(),
    );
    if let Some(v) = preflight.get(ACCESS_CONTROL_ALLOW_CREDENTIALS) {
        out.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, v.clone());
    }
    let mut exposed: Vec<&str> = preflight
        .get_all(ACCESS_CONTROL_EXPOSE_HEADERS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    exposed.push(OWN_EXPOSED);
    out.insert(
        ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_str(&exposed.join(", ")).ok()?,
    );
    out.insert(VARY, HeaderValue::from_static("Origin"));
    Some(out)
}

/// A request the backend gets without a signature.
fn unsigned(
    method: Method,
    bucket: Option<String>,
    key: Option<String>,
    query: &[Param<'_>],
    headers: HeaderMap,
) -> Outgoing {
    Outgoing {
        method,
        bucket,
        key,
        query: query.iter().map(query::owned).collect(),
        headers,
        body: None,
        content_length: None,
        payload: UpstreamPayload::Empty,
        anonymous: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_errors_carry_the_origin_the_backend_allowed_and_expose_the_token() {
        let mut pre = HeaderMap::new();
        assert!(cors_headers(&pre).is_none(), "no allowed origin, no CORS");
        pre.insert(
            ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("http://a"),
        );
        pre.insert(
            ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("ETag"),
        );
        let h = cors_headers(&pre).unwrap();
        assert_eq!(h[ACCESS_CONTROL_ALLOW_ORIGIN], "http://a");
        assert_eq!(
            h[ACCESS_CONTROL_EXPOSE_HEADERS],
            "ETag, x-fencing-highest-token, x-amz-request-id"
        );
        assert_eq!(h[VARY], "Origin");
    }
}
