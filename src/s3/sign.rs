//! SigV4 for the requests fencegate sends the backend: the header form,
//! built from the same canonical forms (`sigv4.rs`) that verify what
//! clients send, so there is one implementation of SigV4 in both
//! directions. The signing key is derived once per day (the scope's region
//! and service never change for one backend) and kept.

use super::error::S3Error;
use super::headers::{X_AMZ_CONTENT_SHA256, X_AMZ_DATE};
use super::query::Param;
use super::signing_key::{KeyCache, signing_key};
use super::sigv4::{EMPTY_SHA256, Head, amz_date, canonical_request, push_hex};
use http::{HeaderMap, HeaderName, HeaderValue};
use std::time::{SystemTime, UNIX_EPOCH};

/// One backend credential, and the key last derived for it.
pub struct HeaderSigner {
    access_key: String,
    secret_key: String,
    region: String,
    /// By scope, which only the day changes here.
    last_key: KeyCache,
}

impl HeaderSigner {
    pub fn new(access_key: &str, secret_key: &str, region: &str) -> HeaderSigner {
        HeaderSigner {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            region: region.into(),
            last_key: KeyCache::default(),
        }
    }

    /// Signs a request: sets `x-amz-date`, `x-amz-content-sha256` (to
    /// `payload`) and `Authorization` over every header in `headers`.
    /// `path` is the path as it goes on the wire (encoded once), `query`
    /// the decoded pairs the wire's query encodes.
    pub fn sign(
        &self,
        method: &str,
        path: &str,
        query: &[Param<'_>],
        headers: &mut HeaderMap,
        payload: &str,
        now: SystemTime,
    ) -> Result<(), S3Error> {
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let date_value = this_second(secs);
        headers.insert(X_AMZ_DATE, date_value.clone());
        let date = date_value.to_str().expect("an amz date is ASCII");
        let day = &date[..8];
        let payload_value = match payload {
            "UNSIGNED-PAYLOAD" => HeaderValue::from_static("UNSIGNED-PAYLOAD"),
            EMPTY_SHA256 => HeaderValue::from_static(EMPTY_SHA256),
            other => header(other)?,
        };
        headers.insert(X_AMZ_CONTENT_SHA256, payload_value);
        headers.remove(http::header::AUTHORIZATION);
        // Each name once (a map's keys are distinct), but for those the
        // AWS SDKs leave unsigned; sorted by their first 16 bytes, which
        // tell nearly every two names apart in one compare, and then whole.
        let mut keyed: Vec<(u128, &str)> = Vec::with_capacity(headers.keys_len());
        keyed.extend(
            (headers.keys())
                .filter(|&n| !UNSIGNED.contains(n))
                .map(|n| (sort_key(n.as_str()), n.as_str())),
        );
        keyed.sort_unstable();
        let names: Vec<&str> = keyed.iter().map(|&(_, n)| n).collect();
        let head = Head {
            method,
            raw_path: path,
            query,
            headers,
        };
        let canonical = canonical_request(&head, &names, false, Some(payload))?;
        // The header value is written in one buffer, the scope (which the
        // string to sign repeats) and the signature straight into it. Its
        // size is known: the fixed text (146 bytes with the date and the
        // signature) and the names.
        let listed: usize = names.iter().map(|n| n.len() + 1).sum();
        let mut authorization =
            String::with_capacity(160 + self.access_key.len() + self.region.len() + listed);
        authorization.push_str("AWS4-HMAC-SHA256 Credential=");
        authorization.push_str(&self.access_key);
        authorization.push('/');
        let scope_at = authorization.len();
        for part in [day, "/", &self.region, "/s3/aws4_request"] {
            authorization.push_str(part);
        }
        let scope = &authorization[scope_at..];
        let derive = || signing_key(&self.secret_key, day, &self.region, "s3");
        let mac = (self.last_key)
            .start(scope, date, derive)
            .finish(&canonical);
        authorization.push_str(", SignedHeaders=");
        for (i, name) in names.iter().enumerate() {
            if i > 0 {
                authorization.push(';');
            }
            authorization.push_str(name);
        }
        authorization.push_str(", Signature=");
        push_hex(&mut authorization, &mac);
        // The buffer becomes the value as it is: no copy.
        let value = HeaderValue::from_maybe_shared(bytes::Bytes::from(authorization))
            .map_err(signing_error)?;
        headers.insert(http::header::AUTHORIZATION, value);
        Ok(())
    }
}

/// What fencegate forwards but does not sign, as AWS's own signers do not
/// (aws-sigv4's default `excluded_headers`, the set common to the Go, Java
/// and JS SDKs): headers a proxy on the way may change. `authorization`
/// is the signature itself; `transfer-encoding` is never forwarded (it is
/// hop-by-hop). Leaving them out keeps the backend's signature valid
/// through such a proxy, and spares each re-sign the hash of an SDK's
/// long `user-agent` (docs/benchmarks-log.md).
const UNSIGNED: [HeaderName; 2] = [
    http::header::USER_AGENT,
    HeaderName::from_static("x-amzn-trace-id"),
];

/// A header name's first 16 bytes as a number that sorts as they do
/// (names hold no NUL, so the zeros that pad a short one sort first).
fn sort_key(name: &str) -> u128 {
    let mut first = [0u8; 16];
    for (to, &b) in first.iter_mut().zip(name.as_bytes()) {
        *to = b;
    }
    u128::from_be_bytes(first)
}

/// `x-amz-date` for `secs` as a header value, formatted once per second
/// per thread.
fn this_second(secs: u64) -> HeaderValue {
    use std::cell::RefCell;
    thread_local! {
        static LAST: RefCell<Option<(u64, HeaderValue)>> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((s, value)) if *s == secs => value.clone(),
        _ => {
            let value = HeaderValue::from_str(&amz_date(secs)).expect("an amz date is ASCII");
            *last = Some((secs, value.clone()));
            value
        }
    })
}

fn header(s: &str) -> Result<HeaderValue, S3Error> {
    HeaderValue::from_str(s).map_err(signing_error)
}

/// A value fencegate cannot send as a header: the backend's credential or
/// the payload hash it was given is not header-safe.
fn signing_error(e: http::header::InvalidHeaderValue) -> S3Error {
    S3Error::Internal(format!("upstream signing: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Credential;
    use crate::s3::auth::{self, Credentials};
    use crate::s3::query::decode_query;
    use crate::s3::sigv4::EMPTY_SHA256;

    /// What fencegate signs, its own verifier accepts (the backend side of
    /// this is every test against Garage and moto).
    #[test]
    fn a_signed_request_verifies() {
        let signer = HeaderSigner::new("AK", "SK", "garage");
        let creds = Credentials::new(&[Credential {
            access_key_id: "AK".into(),
            secret_access_key: "SK".into(),
            buckets: vec!["*".into()],
            bucket_admin: false,
        }]);
        let mut h = HeaderMap::new();
        h.insert("host", "127.0.0.1:3900".parse().unwrap());
        h.insert("x-amz-meta-a", "  two   spaces ".parse().unwrap());
        h.append("x-amz-meta-b", "1".parse().unwrap());
        h.append("x-amz-meta-b", "2".parse().unwrap());
        let query = decode_query(Some("uploadId=a%2Fb&partNumber=2&x=%20y"));
        let path = "/bucket/a%20key/%C3%A9";
        let now = SystemTime::now();
        signer
            .sign("PUT", path, &query, &mut h, EMPTY_SHA256, now)
            .unwrap();
        let head = auth::Head {
            method: "PUT",
            raw_path: path,
            query: &query,
            headers: &h,
        };
        auth::verify(&head, &creds, "garage", now).unwrap();
        let mut other = query.clone();
        other[1].1 = "3".into();
        let tampered = auth::Head {
            query: &other,
            ..head
        };
        assert!(auth::verify(&tampered, &creds, "garage", now).is_err());
    }

    /// Names sort by their keys as they sort whole.
    #[test]
    fn sort_keys_sort_as_names() {
        let mut names = [
            "x-amz-meta-aaaaaaaaaaaaaaaab",
            "x-amz-meta-aaaaaaaaaaaaaaaa",
            "x-amz-meta-aaaaaa",
            "content-type",
            "content-length",
            "content-md5",
            "content",
            "a",
            "host",
            "x-amz-date",
            "x-amz-content-sha256",
            "amz-sdk-request",
            "amz-sdk-invocation-id",
        ];
        let mut keyed: Vec<(u128, &str)> = names.iter().map(|&n| (sort_key(n), n)).collect();
        keyed.sort_unstable();
        names.sort_unstable();
        assert_eq!(keyed.iter().map(|k| k.1).collect::<Vec<_>>(), names);
    }

    /// The same request signed by aws-sigv4 (the AWS SDK's signer) at the
    /// same time gives the same `Authorization`: the same headers signed,
    /// the same ones (`user-agent`, `x-amzn-trace-id`) left out.
    #[test]
    fn aws_sigv4_signs_the_same() {
        use aws_sigv4::http_request::{
            PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
            SigningSettings, UriPathNormalizationMode, sign,
        };
        let now = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let path = "/bucket/a%20key/%C3%A9%2B";
        let query = decode_query(Some("partNumber=2&uploadId=a%2Fb"));
        let mut ours = HeaderMap::new();
        ours.insert("host", "127.0.0.1:3900".parse().unwrap());
        ours.insert("x-amz-meta-a", "a  b".parse().unwrap());
        ours.insert("content-length", "5".parse().unwrap());
        ours.insert("user-agent", "aws-cli/2.17 md/awscrt#0.20".parse().unwrap());
        ours.insert("x-amzn-trace-id", "Root=1-5759e988".parse().unwrap());
        ours.insert("amz-sdk-request", "attempt=1; max=3".parse().unwrap());
        let theirs = ours.clone();
        let signer = HeaderSigner::new("AK", "SK", "garage");
        (signer.sign("PUT", path, &query, &mut ours, "UNSIGNED-PAYLOAD", now)).unwrap();

        let url = format!("http://127.0.0.1:3900{path}?partNumber=2&uploadId=a%2Fb");
        let pairs = theirs
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap()));
        let signable =
            SignableRequest::new("PUT", &url, pairs, SignableBody::UnsignedPayload).unwrap();
        let mut settings = SigningSettings::default();
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        let identity =
            aws_credential_types::Credentials::new("AK", "SK", None, None, "test").into();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region("garage")
            .name("s3")
            .time(now)
            .settings(settings)
            .build()
            .unwrap()
            .into();
        let (instructions, _) = sign(signable, &params).unwrap().into_parts();
        let mut req = http::Request::builder().uri(&url).body(()).unwrap();
        *req.headers_mut() = theirs;
        instructions.apply_to_request_http1x(&mut req);
        assert_eq!(req.headers()["authorization"], ours["authorization"]);
    }
}
