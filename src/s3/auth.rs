//! SigV4 verification of the request head (the `Authorization` header form)
//! against fencegate's own credential table. What the body must then prove
//! is returned as a [`Payload`]; `body.rs` and `chunked.rs` check it while it
//! streams.

use super::error::S3Error;
use crate::config::Credential;
use hmac::{Hmac, KeyInit, Mac};
use http::HeaderMap;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type HmacSha256 = Hmac<Sha256>;

/// Characters SigV4 leaves unencoded: `A-Za-z0-9-._~`.
pub const STRICT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
/// The same, keeping `/` (object key paths).
pub const PATH: &AsciiSet = &STRICT.remove(b'/');

pub const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// SHA-256 of nothing, as hex: the content hash of an empty body.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// How the body is protected, from `x-amz-content-sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// `UNSIGNED-PAYLOAD`, or no header on a request without a body.
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
    pub signing: Signing,
    /// Whether the signature is in the URL (presigned) or the header.
    pub presigned: bool,
    /// The signed header names, `;`-separated, as signed.
    pub signed_headers: String,
}

impl Verified {
    /// Whether the signature covers header `name` (lower case).
    pub fn signs_header(&self, name: &str) -> bool {
        self.signed_headers.split(';').any(|h| h == name)
    }
}

/// Material for chunk and trailer signatures: the signing key, the request's
/// timestamp and scope, and the seed (the request's own) signature.
#[derive(Clone)]
pub struct Signing {
    pub key: [u8; 32],
    pub amz_date: String,
    pub scope: String,
    pub seed_signature: String,
}

impl Signing {
    /// HMAC-SHA256 of `string_to_sign` with the signing key, as lowercase hex.
    pub fn sign(&self, string_to_sign: &str) -> String {
        hex::encode(hmac(&self.key, string_to_sign.as_bytes()))
    }
}

/// The credential table, by access key id.
#[derive(Default)]
pub struct Credentials {
    by_key: HashMap<String, Known>,
}

/// One credential and the signing key last derived for it. A client signs
/// with one scope (day, region, service) for a whole day, so remembering the
/// last key saves four HMACs on every request but the first of the day.
/// (Test: `bench::load::tests::remembered_signing_key_follows_the_scope`,
/// which signs with the load generator's signer.)
struct Known {
    credential: Arc<Credential>,
    last_key: Mutex<Option<(String, [u8; 32])>>,
}

impl Known {
    /// The key for `scope` (`date/region/service/aws4_request`, as the
    /// request's credential names it).
    fn signing_key(&self, scope: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
        let mut last = self.last_key.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some((s, key)) if s == scope => *key,
            _ => {
                let key = signing_key(&self.credential.secret_access_key, date, region, service);
                *last = Some((scope.to_string(), key));
                key
            }
        }
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
                        last_key: Mutex::new(None),
                    };
                    (c.access_key_id.clone(), known)
                })
                .collect(),
        }
    }
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data);
    mac.finalize().into_bytes().into()
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The SigV4 signing key for `date` (YYYYMMDD), `region` and `service`.
pub fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

/// The claim of an `Authorization: AWS4-HMAC-SHA256 ...` header, with its
/// `x-amz-date`, checked against the clock.
fn header_claim<'a>(
    head: &'a Head<'a>,
    now: SystemTime,
) -> Result<(AuthHeader<'a>, &'a str), S3Error> {
    let Some(auth) = head.headers.get(http::header::AUTHORIZATION) else {
        return Err(S3Error::AccessDenied(
            "anonymous requests are not accepted: sign with SigV4".into(),
        ));
    };
    let auth = auth
        .to_str()
        .map_err(|_| S3Error::AuthorizationHeaderMalformed("not ASCII".into()))?;
    let a = parse_auth_header(auth)?;
    let amz_date = head
        .headers
        .get("x-amz-date")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| S3Error::AccessDenied("x-amz-date is required".into()))?;
    let when = parse_amz_date(amz_date)
        .ok_or_else(|| S3Error::AccessDenied(format!("x-amz-date {amz_date:?} is malformed")))?;
    let skew = now.duration_since(when).unwrap_or_else(|e| e.duration());
    if skew > MAX_SKEW {
        return Err(S3Error::RequestTimeTooSkewed);
    }
    Ok((a, amz_date))
}

/// The claim of a presigned URL's `X-Amz-*` query parameters, checked
/// against the clock: not expired, expiry at most 7 days, not from the
/// future.
fn presigned_claim<'a>(
    head: &'a Head<'a>,
    now: SystemTime,
) -> Result<(AuthHeader<'a>, &'a str), S3Error> {
    let malformed = |m: &str| S3Error::AuthorizationQueryParametersError(m.to_string());
    let q = |n: &str| {
        head.query
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| malformed(&format!("{n} is missing")))
    };
    if head.headers.contains_key(http::header::AUTHORIZATION) {
        return Err(malformed(
            "a request is signed in the header or the URL, not both",
        ));
    }
    if q("X-Amz-Algorithm")? != "AWS4-HMAC-SHA256" {
        return Err(malformed("X-Amz-Algorithm must be AWS4-HMAC-SHA256"));
    }
    let scope: Vec<&str> = q("X-Amz-Credential")?.split('/').collect();
    if scope.len() != 5 || scope[4] != "aws4_request" {
        return Err(malformed(
            "X-Amz-Credential must be KEY/DATE/REGION/SERVICE/aws4_request",
        ));
    }
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
    Ok((
        AuthHeader {
            access_key: scope[0],
            date: scope[1],
            region: scope[2],
            service: scope[3],
            signed_headers: q("X-Amz-SignedHeaders")?.split(';').collect(),
            signature: q("X-Amz-Signature")?,
        },
        amz_date,
    ))
}

/// Constant-time comparison of two hex signatures.
pub fn same_signature(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The parts of an `Authorization: AWS4-HMAC-SHA256 ...` header.
#[derive(Debug, PartialEq, Eq)]
struct AuthHeader<'a> {
    access_key: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

fn parse_auth_header(value: &str) -> Result<AuthHeader<'_>, S3Error> {
    let malformed = |m: &str| S3Error::AuthorizationHeaderMalformed(m.to_string());
    let rest = value
        .strip_prefix("AWS4-HMAC-SHA256")
        .ok_or_else(|| malformed("only AWS4-HMAC-SHA256 signatures are accepted"))?;
    let (mut cred, mut signed, mut sig) = (None, None, None);
    for part in rest.split(',') {
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
    let scope: Vec<&str> = cred.split('/').collect();
    if scope.len() != 5 || scope[4] != "aws4_request" {
        return Err(malformed(
            "Credential must be KEY/DATE/REGION/SERVICE/aws4_request",
        ));
    }
    Ok(AuthHeader {
        access_key: scope[0],
        date: scope[1],
        region: scope[2],
        service: scope[3],
        signed_headers: signed.split(';').collect(),
        signature,
    })
}

/// Parses `YYYYMMDDTHHMMSSZ` into a point in time.
pub fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    u64::try_from(secs)
        .ok()
        .map(|s| UNIX_EPOCH + Duration::from_secs(s))
}

/// Decodes a raw query string into pairs (no `+`-as-space: S3 signs `%20`).
pub fn decode_query(raw: Option<&str>) -> Vec<(String, String)> {
    let Some(raw) = raw else { return Vec::new() };
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
            (dec(k), dec(v))
        })
        .collect()
}

/// The canonical URI: the decoded path re-encoded with SigV4's rules
/// (S3 does not normalise `.` or `//`).
pub fn canonical_uri(raw_path: &str) -> String {
    let decoded = percent_decode_str(raw_path).collect::<Vec<u8>>();
    let decoded = String::from_utf8_lossy(&decoded);
    let enc = utf8_percent_encode(&decoded, PATH).to_string();
    if enc.is_empty() { "/".into() } else { enc }
}

/// The canonical query string from decoded pairs, skipping `skip`.
pub fn canonical_query(pairs: &[(String, String)], skip: Option<&str>) -> String {
    let mut enc: Vec<(String, String)> = pairs
        .iter()
        .filter(|(k, _)| Some(k.as_str()) != skip)
        .map(|(k, v)| {
            (
                utf8_percent_encode(k, STRICT).to_string(),
                utf8_percent_encode(v, STRICT).to_string(),
            )
        })
        .collect();
    enc.sort();
    enc.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

fn canonical_header_value(headers: &HeaderMap, name: &str) -> Result<String, S3Error> {
    let mut values = Vec::new();
    for v in headers.get_all(name) {
        let v = std::str::from_utf8(v.as_bytes()).map_err(|_| {
            S3Error::AuthorizationHeaderMalformed(format!("header {name} is not UTF-8"))
        })?;
        values.push(v.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    if values.is_empty() {
        return Err(S3Error::AuthorizationHeaderMalformed(format!(
            "signed header {name} is missing"
        )));
    }
    Ok(values.join(","))
}

/// The request head as the verifier needs it.
pub struct Head<'a> {
    pub method: &'a str,
    pub raw_path: &'a str,
    pub query: &'a [(String, String)],
    pub headers: &'a HeaderMap,
}

/// The longest validity of a presigned URL: 7 days.
pub const MAX_PRESIGN_EXPIRY: u64 = 7 * 24 * 3600;

/// Verifies a SigV4 request, signed in the `Authorization` header or as a
/// presigned URL (query parameters). `now` is injected for tests.
pub fn verify(
    head: &Head<'_>,
    creds: &Credentials,
    region: &str,
    now: SystemTime,
) -> Result<Verified, S3Error> {
    let q = |n: &str| {
        head.query
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    };
    let presigned = q("X-Amz-Algorithm").is_some();
    let (a, amz_date) = if presigned {
        presigned_claim(head, now)?
    } else {
        header_claim(head, now)?
    };
    let known = creds
        .by_key
        .get(a.access_key)
        .ok_or(S3Error::InvalidAccessKeyId)?;
    let credential = known.credential.clone();
    if a.region != region {
        return Err(S3Error::AuthorizationHeaderMalformed(format!(
            "the region {:?} is wrong; expecting {region:?}",
            a.region
        )));
    }
    if a.service != "s3" {
        return Err(S3Error::AuthorizationHeaderMalformed(
            "the service must be s3".into(),
        ));
    }
    if !amz_date.starts_with(a.date) || a.date.len() != 8 {
        return Err(S3Error::AuthorizationHeaderMalformed(
            "the credential date does not match the request date".into(),
        ));
    }
    if !a.signed_headers.contains(&"host") {
        return Err(S3Error::AuthorizationHeaderMalformed(
            "host must be a signed header".into(),
        ));
    }
    // Every x-amz-* header sent must be signed, as S3 requires, so that
    // nothing that changes the request's meaning rides along unsigned.
    for name in head.headers.keys() {
        let n = name.as_str();
        if n.starts_with("x-amz-") && !a.signed_headers.contains(&n) {
            return Err(S3Error::AccessDenied(format!("header {n} must be signed")));
        }
    }
    let content_sha = head
        .headers
        .get("x-amz-content-sha256")
        .and_then(|v| v.to_str().ok());
    let payload = match content_sha {
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
    };
    let mut canonical = String::with_capacity(512);
    canonical.push_str(head.method);
    canonical.push('\n');
    canonical.push_str(&canonical_uri(head.raw_path));
    canonical.push('\n');
    let skip = presigned.then_some("X-Amz-Signature");
    canonical.push_str(&canonical_query(head.query, skip));
    canonical.push('\n');
    for name in &a.signed_headers {
        canonical.push_str(name);
        canonical.push(':');
        canonical.push_str(&canonical_header_value(head.headers, name)?);
        canonical.push('\n');
    }
    canonical.push('\n');
    let signed_headers = a.signed_headers.join(";");
    canonical.push_str(&signed_headers);
    canonical.push('\n');
    canonical.push_str(content_sha.unwrap_or("UNSIGNED-PAYLOAD"));

    let scope = format!("{}/{}/{}/aws4_request", a.date, a.region, a.service);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let signing = Signing {
        key: known.signing_key(&scope, a.date, a.region, a.service),
        amz_date: amz_date.to_string(),
        scope,
        seed_signature: a.signature.to_string(),
    };
    if !same_signature(&signing.sign(&string_to_sign), a.signature) {
        return Err(S3Error::SignatureDoesNotMatch);
    }
    Ok(Verified {
        credential,
        payload,
        signing,
        presigned,
        signed_headers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The GET Object example of the AWS SigV4 documentation for S3
    // ("Example: GET Object" with a Range header).
    #[test]
    fn aws_documentation_get_object_example() {
        let creds = Credentials::new(&[Credential {
            access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            buckets: vec!["*".into()],
            bucket_admin: false,
        }]);
        let mut h = HeaderMap::new();
        h.insert("host", "examplebucket.s3.amazonaws.com".parse().unwrap());
        h.insert("range", "bytes=0-9".parse().unwrap());
        h.insert(
            "x-amz-content-sha256",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
                .parse()
                .unwrap(),
        );
        h.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
        h.insert("authorization", "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41".parse().unwrap());
        let head = Head {
            method: "GET",
            raw_path: "/test.txt",
            query: &[],
            headers: &h,
        };
        let now = parse_amz_date("20130524T000500Z").unwrap();
        let v = verify(&head, &creds, "us-east-1", now).unwrap();
        assert!(matches!(v.payload, Payload::Sha256(_)));

        // Too far from the server's clock.
        let later = parse_amz_date("20130524T001600Z").unwrap();
        assert!(matches!(
            verify(&head, &creds, "us-east-1", later),
            Err(S3Error::RequestTimeTooSkewed)
        ));

        // One changed signed header breaks it.
        let mut h2 = h.clone();
        h2.insert("range", "bytes=0-10".parse().unwrap());
        let head = Head {
            headers: &h2,
            ..head
        };
        assert!(matches!(
            verify(&head, &creds, "us-east-1", now),
            Err(S3Error::SignatureDoesNotMatch)
        ));
    }

    #[test]
    fn amz_date_parses() {
        let t = parse_amz_date("19700102T000001Z").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 86_401);
        assert!(parse_amz_date("2013-05-24T00:00:00Z").is_none());
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical_uri("/b/a%20b/c~d"), "/b/a%20b/c~d");
        assert_eq!(canonical_uri("/b/a+b"), "/b/a%2Bb");
        let q = decode_query(Some("uploads&b=2&a=x%2Fy"));
        assert_eq!(canonical_query(&q, None), "a=x%2Fy&b=2&uploads=");
    }
}
