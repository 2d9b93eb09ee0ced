//! Plain reads of the embedded store, answered without s3s. A GET or HEAD
//! of a whole object that asks nothing else is most of what a store
//! serves, and s3s's routing, decoding, access check and encoding were a
//! tenth of such a HEAD's CPU on the default setup. Such a read is
//! answered here from the store's own GetObject output
//! ([`Store::plain_read`]), with the headers s3s would have written for it.
//!
//! Anything else goes through s3s as before: another method, a query, a
//! path whose bytes are not plain (anything s3s would percent-decode or
//! could read two ways), any header s3s reads for GetObject or HeadObject
//! (conditions, `Range`, checksum mode, SSE-C, `Authorization`), a request
//! fencegate did not mark as its own (`upstream/embedded.rs` asks only for
//! those), metadata s3s would encode, and every refusal (s3s answers the error, as it always did). tests/plain_reads.rs
//! holds the two answers equal, header by header and byte by byte.

use crate::store::Store;
use http::header::{self, HeaderName, HeaderValue};
use s3s::dto::{GetObjectOutput, Timestamp, TimestampFormat};

/// A plain read: the object, and whether it is a HEAD.
pub struct Plain {
    bucket: String,
    key: String,
    head: bool,
}

/// The headers s3s reads for GetObject or HeadObject (beyond the path):
/// a request that has one is not plain. `x-amz-server-side-encryption-*`
/// too, by prefix.
const READ_BY_S3S: &[&str] = &[
    "authorization",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-unmodified-since",
    "range",
    "x-amz-checksum-mode",
    "x-amz-expected-bucket-owner",
    "x-amz-request-payer",
];

/// `req` as a plain read, or `None` when s3s must read it.
pub fn plain<B>(req: &http::Request<B>) -> Option<Plain> {
    let head = match *req.method() {
        http::Method::GET => false,
        http::Method::HEAD => true,
        _ => return None,
    };
    if req.uri().query().is_some() {
        return None;
    }
    let path = req.uri().path().strip_prefix('/')?;
    let (bucket, key) = path.split_once('/')?;
    let segments_plain = key
        .split('/')
        .all(|s| !s.is_empty() && s != "." && s != "..");
    if bucket.is_empty() || !segments_plain || !path.bytes().all(plain_byte) {
        return None;
    }
    let read_by_s3s = |n: &HeaderName| {
        READ_BY_S3S.contains(&n.as_str()) || n.as_str().starts_with("x-amz-server-side-encryption")
    };
    if req.headers().keys().any(read_by_s3s) {
        return None;
    }
    Some(Plain {
        bucket: bucket.into(),
        key: key.into(),
        head,
    })
}

/// Unreserved bytes and `/`: a path made only of them means the same
/// percent-decoded or not.
fn plain_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/')
}

/// The store's answer to a plain read, or `None` when it refused it or
/// the answer needs s3s's encoding (the caller then asks s3s).
pub async fn answer(store: &Store, read: &Plain) -> Option<s3s::HttpResponse> {
    let out = store
        .plain_read(&read.bucket, &read.key, !read.head)
        .await
        .ok()?;
    encode(out)
}

/// `out` as s3s writes a GetObject or HeadObject answer with these fields
/// (`s3s::ops::generated`, `serialize_http`): the fields the store fills.
fn encode(out: GetObjectOutput) -> Option<s3s::HttpResponse> {
    if out.content_range.is_some() {
        return None;
    }
    let mut h = http::HeaderMap::with_capacity(16);
    let mut put = |name: HeaderName, value: Option<String>| -> Option<()> {
        if let Some(v) = value {
            h.insert(name, HeaderValue::try_from(v).ok()?);
        }
        Some(())
    };
    put(header::ACCEPT_RANGES, out.accept_ranges)?;
    put(header::CACHE_CONTROL, out.cache_control)?;
    put(header::CONTENT_DISPOSITION, out.content_disposition)?;
    put(header::CONTENT_ENCODING, out.content_encoding)?;
    put(header::CONTENT_LANGUAGE, out.content_language)?;
    put(
        header::CONTENT_LENGTH,
        out.content_length.map(|n| n.to_string()),
    )?;
    put(header::CONTENT_TYPE, out.content_type)?;
    put(header::EXPIRES, out.expires.as_ref().and_then(http_date))?;
    put(
        header::LAST_MODIFIED,
        out.last_modified.as_ref().and_then(http_date),
    )?;
    put(MP_PARTS_COUNT, out.parts_count.map(|n| n.to_string()))?;
    put(WEBSITE_REDIRECT, out.website_redirect_location)?;
    if let Some(etag) = out.e_tag {
        h.insert(header::ETAG, etag.to_http_header().ok()?);
    }
    for (k, v) in out.metadata.into_iter().flatten() {
        // s3s encodes any other value (RFC 2047): that answer is its own.
        if !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return None;
        }
        let name = HeaderName::from_bytes(format!("x-amz-meta-{k}").as_bytes()).ok()?;
        h.insert(name, HeaderValue::try_from(v).ok()?);
    }
    let body = out
        .body
        .map(s3s::Body::from)
        .unwrap_or_else(s3s::Body::empty);
    let mut resp = http::Response::new(body);
    *resp.headers_mut() = h;
    Some(resp)
}

const MP_PARTS_COUNT: HeaderName = HeaderName::from_static("x-amz-mp-parts-count");
const WEBSITE_REDIRECT: HeaderName = HeaderName::from_static("x-amz-website-redirect-location");

fn http_date(t: &Timestamp) -> Option<String> {
    let mut buf = Vec::with_capacity(32);
    t.format(TimestampFormat::HttpDate, &mut buf).ok()?;
    String::from_utf8(buf).ok()
}
