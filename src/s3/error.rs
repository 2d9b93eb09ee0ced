//! Every error fencegate itself answers, and the one place that renders it as
//! an S3 XML error body so that every SDK surfaces the code.

use super::headers::number_value;
use crate::fence::gate::{Permit, Refusal};
use crate::fence::hold::HoldError;
use bytes::Bytes;
use http::{HeaderValue, StatusCode};

#[derive(Debug, Clone, thiserror::Error)]
pub enum S3Error {
    // Fencing (CONTRACT §3).
    #[error("fencing token {token} is below the highest token {highest} recorded for {resource}")]
    StaleFencingToken {
        token: u64,
        highest: u64,
        resource: String,
    },
    #[error("this write is fenced and needs a fencing token (resource {0})")]
    MissingFencingToken(String),
    /// A token that would raise a verified resource's fence, which its
    /// lock never gave its holder (CONTRACT §7).
    #[error("fencing token {token} was never given to the holder of lock {lock} ({}); nothing was raised or done on {resource}", match holder { Some(h) => format!("its holder has token {h}"), None => "it has no holder now".to_string() })]
    FencingTokenNotIssued {
        token: u64,
        lock: String,
        holder: Option<u64>,
        resource: String,
    },
    #[error("{0}")]
    InvalidFencingToken(String),

    // Conditional writes (CONTRACT §8).
    #[error("{0}")]
    PreconditionFailed(String),
    #[error("{0}")]
    NoSuchKey(String),
    #[error("{0}; retry")]
    SlowDown(String),
    /// Cluster mode with owners: a forwarded request its replica did not
    /// admit, because the resource is not owned there at the epoch its
    /// forwarder saw. Marked ([`MOVED`]) so the forwarder routes it again.
    #[error("{0}; retry")]
    Moved(String),
    #[error("{0}; retry")]
    ServiceUnavailable(String),

    // Authentication and authorisation.
    #[error("{0}")]
    AccessDenied(String),
    #[error("the access key id does not exist in fencegate's credentials")]
    InvalidAccessKeyId,
    #[error("the request signature does not match")]
    SignatureDoesNotMatch,
    #[error("the request time differs from the server time by more than 15 minutes")]
    RequestTimeTooSkewed,
    #[error("{0}")]
    AuthorizationHeaderMalformed(String),
    #[error("the request has expired")]
    ExpiredRequest,
    #[error("{0}")]
    AuthorizationQueryParametersError(String),
    /// A session token fencegate did not issue, or altered.
    #[error("{0}")]
    InvalidToken(String),
    #[error("the session credential has expired: ask for a new one")]
    ExpiredToken,

    // Bodies.
    #[error("the body's SHA-256 does not match x-amz-content-sha256")]
    ContentSha256Mismatch,
    #[error("the body ended before its declared length")]
    IncompleteBody,
    #[error("{0}")]
    InvalidChunk(String),
    #[error("the decoded body length does not match x-amz-decoded-content-length")]
    DecodedLengthMismatch,

    // Requests.
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("the client sent nothing for too long; the request timed out")]
    RequestTimeout,
    #[error("the request header section is too large")]
    RequestHeaderSectionTooLarge,
    #[error("{0}")]
    NotImplemented(String),
    #[error("{0}")]
    InvalidBucketName(String),
    #[error("{0}")]
    InvalidObjectName(String),
    #[error("{0}")]
    MalformedXML(String),
    #[error("{0}")]
    IllegalLocationConstraint(String),
    #[error("a Content-Length header is required")]
    MissingContentLength,

    // Ours and the backend's.
    #[error("the backend could not be reached or failed: {0}")]
    BadGateway(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl S3Error {
    /// The answer to a request the gate refused on `resource`.
    pub fn from_refusal(refusal: Refusal, resource: &str) -> S3Error {
        match refusal {
            Refusal::Stale { token, highest } => S3Error::StaleFencingToken {
                token,
                highest,
                resource: resource.to_string(),
            },
            Refusal::Busy => S3Error::SlowDown(format!(
                "older writes to {resource} are still finishing upstream"
            )),
            Refusal::Held(object) => S3Error::from_hold(HoldError::Busy(object)),
            Refusal::Table(e) => S3Error::ServiceUnavailable(e.to_string()),
            Refusal::Unavailable(e) => S3Error::ServiceUnavailable(format!(
                "the shared fence table cannot be reached: {e}"
            )),
            Refusal::TenureLost => {
                S3Error::SlowDown(format!("{resource} moved to another replica"))
            }
            Refusal::Unmarked => S3Error::SlowDown(format!("{resource} is changing hands")),
            Refusal::NotIssued {
                lock,
                token,
                holder,
            } => S3Error::FencingTokenNotIssued {
                token,
                lock,
                holder,
                resource: resource.to_string(),
            },
            Refusal::Unverified { lock, why } => S3Error::ServiceUnavailable(format!(
                "this token would raise the fence of {resource}, which is verified with lock \
                 {lock}, and the lock service cannot be asked now ({why}); nothing was done"
            )),
            Refusal::InDoubt(left) => S3Error::SlowDown(format!(
                "an older write to {resource} whose outcome is unknown (its answer was lost, \
                 or fencegate restarted while it was in flight) may still land at the backend \
                 for {:.1} s more: nothing newer is admitted before; nothing was done",
                left.as_secs_f64()
            )),
            Refusal::Landing(left) => S3Error::SlowDown(format!(
                "{resource}'s previous owner stopped with a write that may still land at the \
                 backend for {:.1} s more: nothing is admitted before; nothing was done",
                left.as_secs_f64()
            )),
        }
    }

    /// The answer to a write that could not hold its object.
    pub fn from_hold(e: HoldError) -> S3Error {
        match e {
            HoldError::Busy(object) => {
                S3Error::SlowDown(format!("other writes to {object} are still in progress"))
            }
            HoldError::Unavailable(e) => S3Error::ServiceUnavailable(e),
            HoldError::InDoubt(object, left) => S3Error::SlowDown(format!(
                "an earlier write to {object} whose outcome is unknown (its answer was lost, \
                 or fencegate restarted while it was in flight) may still land at the backend \
                 for {:.1} s more; nothing was done",
                left.as_secs_f64()
            )),
        }
    }

    /// The answer to a write whose permit was aborted by a higher token.
    pub fn aborted(permit: &Permit, resource: &str) -> S3Error {
        if permit.lease_lost() {
            return S3Error::lease_lapsed(resource);
        }
        S3Error::StaleFencingToken {
            token: permit.token(),
            highest: permit.highest(),
            resource: resource.to_string(),
        }
    }

    /// The answer to a write this replica stopped because its cluster
    /// lease may have lapsed while it wrote `what`.
    pub fn lease_lapsed(what: &str) -> S3Error {
        S3Error::ServiceUnavailable(format!(
            "this replica's cluster lease may have lapsed while it wrote {what}; \
             the write was not completed"
        ))
    }

    pub fn status(&self) -> StatusCode {
        use S3Error::*;
        match self {
            StaleFencingToken { .. } => StatusCode::CONFLICT,
            MissingFencingToken(_) => StatusCode::PRECONDITION_REQUIRED,
            PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            NoSuchKey(_) => StatusCode::NOT_FOUND,
            SlowDown(_) | Moved(_) | ServiceUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AccessDenied(_)
            | InvalidAccessKeyId
            | SignatureDoesNotMatch
            | RequestTimeTooSkewed
            | InvalidToken(_)
            | FencingTokenNotIssued { .. }
            | ExpiredRequest => StatusCode::FORBIDDEN,
            NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            MissingContentLength => StatusCode::LENGTH_REQUIRED,
            BadGateway(_) => StatusCode::BAD_GATEWAY,
            Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            InvalidFencingToken(_)
            | ExpiredToken
            | AuthorizationHeaderMalformed(_)
            | AuthorizationQueryParametersError(_)
            | ContentSha256Mismatch
            | IncompleteBody
            | InvalidChunk(_)
            | DecodedLengthMismatch
            | InvalidRequest(_)
            | InvalidArgument(_)
            | RequestHeaderSectionTooLarge
            | RequestTimeout
            | MalformedXML(_)
            | IllegalLocationConstraint(_)
            | InvalidBucketName(_)
            | InvalidObjectName(_) => StatusCode::BAD_REQUEST,
        }
    }

    /// The S3 error code.
    pub fn code(&self) -> &'static str {
        use S3Error::*;
        match self {
            StaleFencingToken { .. } => "StaleFencingToken",
            MissingFencingToken(_) => "MissingFencingToken",
            FencingTokenNotIssued { .. } => "FencingTokenNotIssued",
            InvalidFencingToken(_) => "InvalidFencingToken",
            PreconditionFailed(_) => "PreconditionFailed",
            NoSuchKey(_) => "NoSuchKey",
            SlowDown(_) | Moved(_) => "SlowDown",
            ServiceUnavailable(_) => "ServiceUnavailable",
            AccessDenied(_) => "AccessDenied",
            InvalidAccessKeyId => "InvalidAccessKeyId",
            SignatureDoesNotMatch => "SignatureDoesNotMatch",
            RequestTimeTooSkewed => "RequestTimeTooSkewed",
            AuthorizationHeaderMalformed(_) => "AuthorizationHeaderMalformed",
            ExpiredRequest => "AccessDenied",
            AuthorizationQueryParametersError(_) => "AuthorizationQueryParametersError",
            InvalidToken(_) => "InvalidToken",
            ExpiredToken => "ExpiredToken",
            ContentSha256Mismatch => "XAmzContentSHA256Mismatch",
            IncompleteBody => "IncompleteBody",
            InvalidChunk(_) => "InvalidRequest",
            DecodedLengthMismatch => "IncompleteBody",
            InvalidRequest(_) => "InvalidRequest",
            InvalidArgument(_) => "InvalidArgument",
            RequestHeaderSectionTooLarge => "RequestHeaderSectionTooLarge",
            RequestTimeout => "RequestTimeout",
            NotImplemented(_) => "NotImplemented",
            InvalidBucketName(_) => "InvalidBucketName",
            InvalidObjectName(_) => "InvalidObjectName",
            MalformedXML(_) => "MalformedXML",
            IllegalLocationConstraint(_) => "IllegalLocationConstraintException",
            MissingContentLength => "MissingContentLength",
            BadGateway(_) => "BadGateway",
            Internal(_) => "InternalError",
        }
    }

    /// A short word for logs and metrics.
    pub fn outcome(&self) -> &'static str {
        use S3Error::*;
        match self {
            StaleFencingToken { .. } => "stale",
            FencingTokenNotIssued { .. } => "not_issued",
            MissingFencingToken(_) => "missing",
            InvalidFencingToken(_) => "invalid",
            PreconditionFailed(_) | NoSuchKey(_) => "condition_failed",
            SlowDown(_) => "busy",
            Moved(_) => "moved",
            ServiceUnavailable(_) => "unavailable",
            AccessDenied(_)
            | InvalidAccessKeyId
            | SignatureDoesNotMatch
            | RequestTimeTooSkewed
            | AuthorizationHeaderMalformed(_)
            | AuthorizationQueryParametersError(_)
            | InvalidToken(_)
            | ExpiredToken
            | ExpiredRequest => "auth",
            BadGateway(_) => "upstream_error",
            Internal(_) => "internal",
            _ => "bad_request",
        }
    }

    /// Renders the error as an S3 XML response. `resource` is the request
    /// path; `request_id` is echoed in the body and the headers.
    pub fn to_response(&self, resource: &str, request_id: &str) -> http::Response<Bytes> {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>{}</Message><Resource>{}</Resource><RequestId>{}</RequestId></Error>",
            self.code(),
            xml_escape(&self.to_string()),
            xml_escape(resource),
            xml_escape(request_id),
        );
        let mut resp = http::Response::new(Bytes::from(body));
        *resp.status_mut() = self.status();
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        );
        if let Ok(v) = HeaderValue::from_str(request_id) {
            h.insert("x-amz-request-id", v);
        }
        match self {
            S3Error::StaleFencingToken { highest, .. } => {
                h.insert("x-fencing-highest-token", number_value(*highest));
            }
            S3Error::SlowDown(_) => {
                h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            S3Error::Moved(_) => {
                h.insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
                h.insert(MOVED, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        resp
    }
}

/// The header of a [`S3Error::Moved`] answer: between replicas only (a
/// client never sees it; its forwarder routes the request again, or drops
/// the header with the rest of the hop's own).
pub const MOVED: &str = "x-fencegate-moved";

pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_renders_code_and_highest() {
        let e = S3Error::StaleFencingToken {
            token: 33,
            highest: 34,
            resource: "b/k".into(),
        };
        let r = e.to_response("/b/k<", "RID");
        assert_eq!(r.status(), 409);
        assert_eq!(r.headers()["x-fencing-highest-token"], "34");
        let body = std::str::from_utf8(r.body()).unwrap();
        assert!(body.contains("<Code>StaleFencingToken</Code>"));
        assert!(body.contains("<Resource>/b/k&lt;</Resource>"));
        assert!(body.contains("<RequestId>RID</RequestId>"));
    }
}
