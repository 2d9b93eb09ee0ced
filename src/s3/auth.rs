//! SigV4 verification of the request head (the `Authorization` header or
//! a presigned URL) against fencegate's own credential table. What the body must then prove
//! is returned as a [`Payload`]; `body.rs` and `chunked.rs` check it while it
//! streams.

use super::error::S3Error;
use super::headers::{X_AMZ_CONTENT_SHA256, X_AMZ_DATE, X_AMZ_SECURITY_TOKEN};
use super::query::{Param, query_param};
use super::session::{self, Session, SessionKeys};
use crate::config::Credential;
use http::HeaderMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::signing_key::{KeyCache, SigningKey, Started, signing_key};
pub use super::sigv4::{Head, canonical_request};
use super::sigv4::{is_signature, parse_amz_date};

// Where these lived before `sigv4.rs` and `query.rs`; the parser tests
// (`tests/parsers.rs`) name them here.
pub use super::query::decode_query;
pub use super::sigv4::{PATH, STRICT, canonical_query};

pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// How the body is protected, from `x-amz-content-sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// `UNSIGNED-PAYLOAD`, or no header at all (a presigned URL's form; a
    /// header-signed request without it is taken alike, body or not).
    Unsigned,
    /// The hex SHA-256 of the whole body.
    Sha256([u8; 32]),
    /// aws-chunked with a signature per chunk
    /// (`STREAMING-AWS4-HMAC-SHA256-PAYLOAD[-TRAILER]`).
    StreamingSigned { trailer: bool },
    /// aws-chunked without signatures, with a checksum trailer
    /// (`STREAMING-UNSIGNED-PAYLOAD-TRAILER`).
    StreamingUnsignedTrailer,
}

impl Payload {
    /// The `x-amz-content-sha256` form, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Payload::Unsigned => "unsigned",
            Payload::Sha256(_) => "sha256",
            Payload::StreamingSigned { trailer: false } => "chunked-signed",
            Payload::StreamingSigned { trailer: true } => "chunked-signed-trailer",
            Payload::StreamingUnsignedTrailer => "chunked-unsigned-trailer",
        }
    }

    pub fn is_chunked(&self) -> bool {
        matches!(
            self,
            Payload::StreamingSigned { .. } | Payload::StreamingUnsignedTrailer
        )
    }
}

/// What a verified request proved, and what is needed to verify its chunks.
#[derive(Clone)]
pub struct Verified {
    pub credential: Arc<Credential>,
    pub payload: Payload,
    /// For a body of signed chunks (`Payload::StreamingSigned`) only;
    /// boxed, as most requests have none and a `Verified` is moved with
    /// its request (216 bytes inline).
    pub signing: Option<Box<Signing>>,
    /// Whether the signature is in the URL (presigned) or the header.
    pub presigned: bool,
    /// The signed header names, `;`-separated, as signed.
    pub signed_headers: String,
    /// A session credential's token, lock and scope (`s3::session`).
    pub session: Option<Arc<Session>>,
}

impl Verified {
    /// Whether the signature covers header `name` (lower case).
    pub fn signs_header(&self, name: &str) -> bool {
        split_ascii(&self.signed_headers, b';').any(|h| h == name)
    }
}

/// Material for chunk and trailer signatures: the signing key, the request's
/// timestamp and scope, and the seed (the request's own) signature.
#[derive(Clone)]
pub struct Signing {
    pub key: SigningKey,
    pub amz_date: String,
    pub scope: String,
    pub seed_signature: String,
}

impl Signing {
    /// HMAC-SHA256 of `string_to_sign` with the signing key, as lowercase hex.
    pub fn sign(&self, string_to_sign: &str) -> String {
        self.key.sign(string_to_sign)
    }
}

/// The credential table, by access key id, and the keys that verify
/// session credentials (none: they are refused).
#[derive(Default)]
pub struct Credentials {
    by_key: HashMap<String, Known>,
    sessions: Option<Arc<SessionKeys>>,
}

/// One credential and the signing key last derived for it (test:
/// `tests::remembered_signing_key_follows_the_scope` below).
struct Known {
    credential: Arc<Credential>,
    last_key: KeyCache,
}

/// Where the key that checks a request comes from.
enum KeyOf<'a> {
    /// A credential of the table, its key kept by scope.
    Kept(&'a Known),
    /// A session credential's, derived for this request.
    Derived(SigningKey),
}

impl KeyOf<'_> {
    /// The request's signature begun: all but its canonical request's
    /// hash fed.
    fn start(&self, claim: &Claim<'_>) -> Started {
        match self {
            KeyOf::Kept(known) => {
                let derive = || known.derive(claim);
                (known.last_key).start(claim.scope, claim.amz_date, derive)
            }
            KeyOf::Derived(key) => key.start(claim.amz_date, claim.scope),
        }
    }

    /// The key itself (for the signatures of chunks).
    fn key(self, claim: &Claim<'_>) -> SigningKey {
        match self {
            KeyOf::Kept(known) => (known.last_key).get(claim.scope, || known.derive(claim)),
            KeyOf::Derived(key) => key,
        }
    }
}

impl Known {
    /// The key for the claim's scope (`date/region/service/aws4_request`,
    /// as the request's credential names it).
    fn derive(&self, claim: &Claim<'_>) -> [u8; 32] {
        let secret = &self.credential.secret_access_key;
        signing_key(secret, claim.date, claim.region, claim.service)
    }
}

impl Credentials {
    pub fn new(list: &[Credential]) -> Credentials {
        Credentials {
            by_key: list
                .iter()
                .map(|c| {
                    let known = Known {
                        credential: Arc::new(c.clone()),
                        last_key: KeyCache::default(),
                    };
                    (c.access_key_id.clone(), known)
                })
                .collect(),
            sessions: None,
        }
    }

    /// Session credentials verified with `keys` are accepted too.
    pub fn with_sessions(mut self, keys: Option<Arc<SessionKeys>>) -> Credentials {
        self.sessions = keys;
        self
    }
}

/// The longest validity of a presigned URL: 7 days.
pub const MAX_PRESIGN_EXPIRY: u64 = 7 * 24 * 3600;

/// What a request claims, from its `Authorization` header or its presigned
/// URL's `X-Amz-*` parameters: who signed, in which scope, when, over which
/// headers, and the signature itself.
#[derive(Debug, PartialEq, Eq)]
struct Claim<'a> {
    access_key: &'a str,
    /// `date/region/service/aws4_request`, as the credential spells it.
    scope: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    /// The same, `;`-separated, as signed.
    signed_list: &'a str,
    signature: &'a str,
    /// The request's timestamp (`x-amz-date` or `X-Amz-Date`).
    amz_date: &'a str,
}

/// `KEY/DATE/REGION/SERVICE/aws4_request`, split into the key, the scope
/// (all after `KEY/`) and the scope's date, region and service; `None` if
/// it is not that.
fn split_credential(credential: &str) -> Option<(&str, &str, [&str; 3])> {
    // The first four `/`s, found by `memchr` (a `str::split` per part
    // costs several times as much on every request); what follows the
    // fourth must be `aws4_request`, so a fifth is refused there.
    let mut slashes = memchr::memchr_iter(b'/', credential.as_bytes());
    let [Some(a), Some(b), Some(c), Some(d)] = [(); 4].map(|_| slashes.next()) else {
        return None;
    };
    // `/` is ASCII: every index is a char boundary.
    let part = |from: usize, to: usize| &credential[from + 1..to];
    let scope = &credential[a + 1..];
    (&credential[d + 1..] == "aws4_request").then(|| {
        (
            &credential[..a],
            scope,
            [part(a, b), part(b, c), part(c, d)],
        )
    })
}

/// `s` split at each `sep` (ASCII), as `str::split` does; found by
/// `memchr`, which costs a fraction of a `char` pattern's search per part
/// (the signed headers are split on every request).
fn split_ascii(s: &str, sep: u8) -> impl Iterator<Item = &str> {
    debug_assert!(sep.is_ascii());
    let mut start = 0;
    let ends = memchr::memchr_iter(sep, s.as_bytes()).chain([s.len()]);
    ends.map(move |end| {
        // `sep` is ASCII: every index is a char boundary.
        let part = &s[start..end];
        start = end + 1;
        part
    })
}

/// The names of a `SignedHeaders` list, in a vector sized for an SDK's
/// (it would otherwise grow twice on most requests).
fn signed_names(list: &str) -> Vec<&str> {
    let mut names = Vec::with_capacity(16);
    names.extend(split_ascii(list, b';'));
    names
}

/// Whether a request carries no signature at all: no `Authorization`
/// header and none of a presigned URL's parameters.
pub fn is_anonymous(headers: &http::HeaderMap, query: &[Param<'_>]) -> bool {
    !headers.contains_key(http::header::AUTHORIZATION)
        && !query.iter().any(|(k, _)| {
            matches!(
                k.as_ref(),
                "X-Amz-Algorithm" | "X-Amz-Credential" | "X-Amz-Signature"
            )
        })
}

/// Verifies a SigV4 request, signed in the `Authorization` header or as a
/// presigned URL (query parameters), in four steps shared by both forms:
/// the claim (parsed and checked against the clock), its scope and signed
/// headers against this server, the canonical request, and the signature
/// over the string to sign. `now` is injected for tests.
pub fn verify(
    head: &Head<'_>,
    creds: &Credentials,
    region: &str,
    now: SystemTime,
) -> Result<Verified, S3Error> {
    let presigned = query_param(head.query, "X-Amz-Algorithm").is_some();
    let claim = if presigned {
        presigned_claim(head, now)?
    } else {
        header_claim(head, now)?
    };
    check_scope(&claim, region)?;
    check_signed_headers(&claim, head.headers)?;
    let content_sha = head
        .headers
        .get(X_AMZ_CONTENT_SHA256)
        .and_then(|v| v.to_str().ok());
    let payload = payload_of(content_sha)?;
    let canonical = canonical_request(head, &claim.signed_headers, presigned, content_sha)?;
    let (credential, key, session) = match creds.by_key.get(claim.access_key) {
        Some(known) => (known.credential.clone(), KeyOf::Kept(known), None),
        None => {
            let (credential, key, session) =
                session_credential(head, creds, &claim, presigned, now)?;
            (credential, KeyOf::Derived(key), session)
        }
    };
    let mac = key.start(&claim).finish(&canonical);
    if !is_signature(&mac, claim.signature) {
        return Err(S3Error::SignatureDoesNotMatch);
    }
    // Only signed chunks need the material again (most requests have
    // none: three strings not made).
    let signing = matches!(payload, Payload::StreamingSigned { .. }).then(|| {
        Box::new(Signing {
            key: key.key(&claim),
            amz_date: claim.amz_date.to_string(),
            scope: claim.scope.to_string(),
            seed_signature: claim.signature.to_string(),
        })
    });
    Ok(Verified {
        credential,
        payload,
        signing,
        presigned,
        signed_headers: claim.signed_list.to_string(),
        session,
    })
}

/// Who signed, the key that checks the signature, and the session.
type SessionSigner = (Arc<Credential>, SigningKey, Option<Arc<Session>>);

/// A session credential's signing key, from the session token the request
/// carries (`X-Amz-Security-Token`, a signed header or a presigned URL's
/// parameter): no lookup, the secret is derived (`s3::session`).
fn session_credential(
    head: &Head<'_>,
    creds: &Credentials,
    claim: &Claim<'_>,
    presigned: bool,
    now: SystemTime,
) -> Result<SessionSigner, S3Error> {
    let keys = match &creds.sessions {
        Some(k) if session::is_session_key(claim.access_key) => k,
        _ => return Err(S3Error::InvalidAccessKeyId),
    };
    let token = match presigned {
        true => query_param(head.query, "X-Amz-Security-Token").map(|t| t.to_string()),
        false => (head.headers.get(X_AMZ_SECURITY_TOKEN))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    };
    let token = token.ok_or_else(|| {
        S3Error::InvalidToken(format!(
            "access key {} is a session credential: send its session token \
             (X-Amz-Security-Token)",
            claim.access_key
        ))
    })?;
    let (s, secret) = keys.verify(claim.access_key, &token, now)?;
    let key = SigningKey::new(&signing_key(
        &secret,
        claim.date,
        claim.region,
        claim.service,
    ));
    Ok((Arc::new(s.credential()), key, Some(Arc::new(s))))
}

/// The claim of an `Authorization: AWS4-HMAC-SHA256 ...` header, with its
/// `x-amz-date`, checked against the clock.
fn header_claim<'a>(head: &'a Head<'a>, now: SystemTime) -> Result<Claim<'a>, S3Error> {
    let Some(auth) = head.headers.get(http::header::AUTHORIZATION) else {
        return Err(S3Error::AccessDenied(
            "anonymous requests are not accepted: sign with SigV4".into(),
        ));
    };
    let auth = auth
        .to_str()
        .map_err(|_| S3Error::AuthorizationHeaderMalformed("not ASCII".into()))?;
    let amz_date = head.headers.get(X_AMZ_DATE).and_then(|v| v.to_str().ok());
    let claim = parse_auth_header(auth, amz_date.unwrap_or_default())?;
    let amz_date =
        amz_date.ok_or_else(|| S3Error::AccessDenied("x-amz-date is required".into()))?;
    let when = parse_amz_date(amz_date)
        .ok_or_else(|| S3Error::AccessDenied(format!("x-amz-date {amz_date:?} is malformed")))?;
    let skew = now.duration_since(when).unwrap_or_else(|e| e.duration());
    if skew > MAX_SKEW {
        return Err(S3Error::RequestTimeTooSkewed);
    }
    Ok(claim)
}

/// The parts of an `Authorization: AWS4-HMAC-SHA256 ...` header, with the
/// request's `amz_date`.
fn parse_auth_header<'a>(value: &'a str, amz_date: &'a str) -> Result<Claim<'a>, S3Error> {
    let malformed = |m: &str| S3Error::AuthorizationHeaderMalformed(m.to_string());
    let rest = value
        .strip_prefix("AWS4-HMAC-SHA256")
        .ok_or_else(|| malformed("only AWS4-HMAC-SHA256 signatures are accepted"))?;
    let (mut cred, mut signed, mut sig) = (None, None, None);
    for part in split_ascii(rest, b',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("Credential=") {
            cred = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed = Some(v);
        } else if let Some(v) = part.strip_prefix("Signature=") {
            sig = Some(v);
        }
    }
    let cred = cred.ok_or_else(|| malformed("missing Credential"))?;
    let signed = signed.ok_or_else(|| malformed("missing SignedHeaders"))?;
    let signature = sig.ok_or_else(|| malformed("missing Signature"))?;
    let (access_key, scope, [date, region, service]) = split_credential(cred)
        .ok_or_else(|| malformed("Credential must be KEY/DATE/REGION/SERVICE/aws4_request"))?;
    Ok(Claim {
        access_key,
        scope,
        date,
        region,
        service,
        signed_headers: signed_names(signed),
        signed_list: signed,
        signature,
        amz_date,
    })
}

/// The claim of a presigned URL's `X-Amz-*` query parameters, checked
/// against the clock: not expired, expiry at most 7 days, not from the
/// future.
fn presigned_claim<'a>(head: &'a Head<'a>, now: SystemTime) -> Result<Claim<'a>, S3Error> {
    let malformed = |m: &str| S3Error::AuthorizationQueryParametersError(m.to_string());
    let q =
        |n: &str| query_param(head.query, n).ok_or_else(|| malformed(&format!("{n} is missing")));
    if head.headers.contains_key(http::header::AUTHORIZATION) {
        return Err(malformed(
            "a request is signed in the header or the URL, not both",
        ));
    }
    if q("X-Amz-Algorithm")? != "AWS4-HMAC-SHA256" {
        return Err(malformed("X-Amz-Algorithm must be AWS4-HMAC-SHA256"));
    }
    let (access_key, scope, [date, region, service]) = split_credential(q("X-Amz-Credential")?)
        .ok_or_else(|| {
            malformed("X-Amz-Credential must be KEY/DATE/REGION/SERVICE/aws4_request")
        })?;
    let amz_date = q("X-Amz-Date")?;
    let when = parse_amz_date(amz_date).ok_or_else(|| malformed("X-Amz-Date is malformed"))?;
    let expires: u64 = q("X-Amz-Expires")?
        .parse()
        .map_err(|_| malformed("X-Amz-Expires must be a number of seconds"))?;
    if expires == 0 || expires > MAX_PRESIGN_EXPIRY {
        return Err(malformed(
            "X-Amz-Expires must be between 1 and 604800 seconds (7 days)",
        ));
    }
    if when > now + MAX_SKEW {
        return Err(S3Error::RequestTimeTooSkewed);
    }
    if now > when + Duration::from_secs(expires) {
        return Err(S3Error::ExpiredRequest);
    }
    let signed = q("X-Amz-SignedHeaders")?;
    Ok(Claim {
        access_key,
        scope,
        date,
        region,
        service,
        signed_headers: signed_names(signed),
        signed_list: signed,
        signature: q("X-Amz-Signature")?,
        amz_date,
    })
}

/// The claim's scope is this server's: its region, the service `s3`, and
/// the day of the request's timestamp.
fn check_scope(claim: &Claim<'_>, region: &str) -> Result<(), S3Error> {
    if claim.region != region {
        return Err(S3Error::AuthorizationHeaderMalformed(format!(
            "the region {:?} is wrong; expecting {region:?}",
            claim.region
        )));
    }
    if claim.service != "s3" {
        return Err(S3Error::AuthorizationHeaderMalformed(
            "the service must be s3".into(),
        ));
    }
    if !claim.amz_date.starts_with(claim.date) || claim.date.len() != 8 {
        return Err(S3Error::AuthorizationHeaderMalformed(
            "the credential date does not match the request date".into(),
        ));
    }
    Ok(())
}

/// `host` is signed, and so is every `x-amz-*` header sent, as S3 requires,
/// so that nothing that changes the request's meaning rides along unsigned.
fn check_signed_headers(claim: &Claim<'_>, headers: &HeaderMap) -> Result<(), S3Error> {
    if !claim.signed_headers.contains(&"host") {
        return Err(S3Error::AuthorizationHeaderMalformed(
            "host must be a signed header".into(),
        ));
    }
    for name in headers.keys() {
        let n = name.as_str();
        if n.starts_with("x-amz-") && !claim.signed_headers.contains(&n) {
            return Err(S3Error::AccessDenied(format!("header {n} must be signed")));
        }
    }
    Ok(())
}

/// How the body is protected, from the `x-amz-content-sha256` value.
fn payload_of(content_sha: Option<&str>) -> Result<Payload, S3Error> {
    Ok(match content_sha {
        None | Some("UNSIGNED-PAYLOAD") => Payload::Unsigned,
        Some("STREAMING-AWS4-HMAC-SHA256-PAYLOAD") => Payload::StreamingSigned { trailer: false },
        Some("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER") => {
            Payload::StreamingSigned { trailer: true }
        }
        Some("STREAMING-UNSIGNED-PAYLOAD-TRAILER") => Payload::StreamingUnsignedTrailer,
        Some(h) => {
            let mut out = [0u8; 32];
            hex::decode_to_slice(h, &mut out).map_err(|_| {
                S3Error::InvalidArgument(format!("x-amz-content-sha256 {h:?} is not valid"))
            })?;
            Payload::Sha256(out)
        }
    })
}

#[cfg(test)]
mod tests;
