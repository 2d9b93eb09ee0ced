//! The SigV4 primitives: the canonical forms of a request's parts, the
//! timestamp format, hex, constant-time comparison (the keys and the HMAC
//! are `signing_key.rs`'s). They hold no policy; `auth.rs` decides what a
//! request must prove with them, and the chunk signatures (`chunked.rs`)
//! and the load generator (`bench::load`) sign with them.

use super::error::S3Error;
use super::query::{Param, percent_decode};
use http::{HeaderMap, HeaderValue};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use sha2::{Digest, Sha256};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Characters SigV4 leaves unencoded, `A-Za-z0-9-._~`, as a
/// `percent-encoding` set: the reference that [`push_encoded`] is tested
/// against (`tests/parsers.rs`).
pub const STRICT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');
/// The same, keeping `/` (object key paths).
pub const PATH: &AsciiSet = &STRICT.remove(b'/');

/// SHA-256 of nothing, as hex: the content hash of an empty body.
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
/// The same, as bytes.
pub const EMPTY_SHA256_BYTES: [u8; 32] = [
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
    0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
];

pub fn sha256_hex(data: &[u8]) -> String {
    hex_lower(&Sha256::digest(data))
}

/// Lowercase hex, by table: hashes and signatures, several per request.
pub fn hex_lower(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

/// Appends `bytes` as lowercase hex (two digits per byte, by table).
pub fn push_hex(out: &mut String, bytes: &[u8]) {
    for chunk in bytes.chunks(32) {
        let mut buf = [0u8; 64];
        hex_into(chunk, &mut buf);
        let hex = &buf[..chunk.len() * 2];
        out.push_str(std::str::from_utf8(hex).expect("hex digits are ASCII"));
    }
}

/// Writes `bytes` as lowercase hex into the start of `out` (twice as long).
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    static PAIRS: [[u8; 2]; 256] = {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut t = [[0u8; 2]; 256];
        let mut b = 0;
        while b < 256 {
            t[b] = [DIGITS[b >> 4], DIGITS[b & 15]];
            b += 1;
        }
        t
    };
    for (pair, &b) in out.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(b)]);
    }
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time in seconds.
pub fn amz_date(unix: u64) -> String {
    let t = crate::utc::civil(unix);
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

/// Constant-time comparison of two hex signatures.
pub fn same_signature(a: &str, b: &str) -> bool {
    same_bytes(a.as_bytes(), b.as_bytes())
}

/// Whether `mac`, as lowercase hex, is the hex signature `claimed`, in
/// constant time.
pub fn is_signature(mac: &[u8; 32], claimed: &str) -> bool {
    let mut hex = [0u8; 64];
    hex_into(mac, &mut hex);
    same_bytes(&hex, claimed.as_bytes())
}

fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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

/// The bytes SigV4 never encodes (`A-Za-z0-9-._~`), as tables: the
/// canonical forms look every byte of a path and a query up in one.
/// `KEEP[1]` keeps `/` too (a key path).
static KEEP: [[bool; 256]; 2] = [keep_table(false), keep_table(true)];

const fn keep_table(slash: bool) -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric()
            || matches!(c, b'-' | b'.' | b'_' | b'~')
            || (slash && c == b'/');
        b += 1;
    }
    t
}

/// The canonical URI: the decoded path re-encoded with SigV4's rules
/// (S3 does not normalise `.` or `//`).
pub fn canonical_uri(raw_path: &str) -> String {
    let mut out = String::with_capacity(raw_path.len());
    push_canonical_uri(&mut out, raw_path);
    out
}

fn push_canonical_uri(out: &mut String, raw_path: &str) {
    // Most paths need no work: nothing encoded, nothing to encode.
    if !raw_path.is_empty() && raw_path.bytes().all(|b| KEEP[1][usize::from(b)]) {
        return out.push_str(raw_path);
    }
    let decoded = percent_decode(raw_path);
    let decoded = String::from_utf8_lossy(&decoded);
    if decoded.is_empty() {
        return out.push('/');
    }
    push_encoded(out, &decoded, true);
}

/// Appends `s` percent-encoded with SigV4's rules: every byte but the
/// unreserved ones as `%XX` (and `/` kept as is when `keep_slash`: a key
/// path). The same output as `utf8_percent_encode` with `STRICT` (or
/// `PATH`), without its iterator: a plain string, the common case, is
/// copied whole. The canonical forms, the upstream URL and the forwarded
/// copy source all encode with it.
pub fn push_encoded(out: &mut String, s: &str, keep_slash: bool) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let keep = &KEEP[usize::from(keep_slash)];
    let mut rest = s;
    while let Some(i) = rest.bytes().position(|b| !keep[usize::from(b)]) {
        out.push_str(&rest[..i]);
        // Every byte of a multi-byte character is encoded, so the loop
        // below only ever cuts `rest` at a character boundary.
        let end = i + rest[i..].chars().next().map_or(1, char::len_utf8);
        for &b in &rest.as_bytes()[i..end] {
            out.push('%');
            out.push(char::from(DIGITS[usize::from(b >> 4)]));
            out.push(char::from(DIGITS[usize::from(b & 15)]));
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
}

/// The canonical query string from decoded pairs, skipping `skip`: each
/// name and value percent-encoded, sorted, joined.
pub fn canonical_query(pairs: &[Param<'_>], skip: Option<&str>) -> String {
    let mut out = String::new();
    push_canonical_query(&mut out, pairs, skip);
    out
}

/// [`canonical_query`], appended to `out`. The pairs are encoded once into
/// one buffer and sorted as spans of it.
fn push_canonical_query(out: &mut String, pairs: &[Param<'_>], skip: Option<&str>) {
    if pairs.is_empty() {
        return;
    }
    let mut encoded = String::with_capacity(pairs.iter().map(|(k, v)| k.len() + v.len()).sum());
    // (start of the name, start of the value, end of the value) in `encoded`.
    let mut spans: Vec<(usize, usize, usize)> = Vec::with_capacity(pairs.len());
    for (k, v) in pairs.iter().filter(|(k, _)| Some(k.as_ref()) != skip) {
        let start = encoded.len();
        push_encoded(&mut encoded, k, false);
        let mid = encoded.len();
        push_encoded(&mut encoded, v, false);
        spans.push((start, mid, encoded.len()));
    }
    let pair = |&(a, b, c): &(usize, usize, usize)| (&encoded[a..b], &encoded[b..c]);
    spans.sort_unstable_by(|x, y| pair(x).cmp(&pair(y)));
    out.reserve(encoded.len() + 2 * spans.len());
    for (i, span) in spans.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        let (k, v) = pair(span);
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
}

/// The request head as SigV4 signs it.
pub struct Head<'a> {
    pub method: &'a str,
    pub raw_path: &'a str,
    pub query: &'a [Param<'a>],
    pub headers: &'a HeaderMap,
}

/// The canonical request: method, URI, query (without the signature of a
/// presigned URL), the signed headers with their values, and the payload
/// hash as the client sent it; as the bytes SigV4 hashes.
///
/// `signed_headers` are names as the client listed them, or the names of
/// the request's own headers when fencegate signs.
pub fn canonical_request(
    head: &Head<'_>,
    signed_headers: &[&str],
    presigned: bool,
    content_sha: Option<&str>,
) -> Result<Vec<u8>, S3Error> {
    // The request's few headers, listed once: a signed one is found by a
    // scan of names (mostly of other lengths), not parsed and hashed.
    let listed: Vec<(&str, &HeaderValue)> = (head.headers.iter())
        .map(|(n, v)| (n.as_str(), v))
        .collect();
    // Room for all of it, so that it is not copied as it grows: every
    // header twice over (its line, and its name in the list), the path
    // and query once (longer only where they need encoding), the hash.
    let headers: usize = listed.iter().map(|(n, v)| 2 * n.len() + v.len() + 3).sum();
    let query: usize = head.query.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    let mut line = String::with_capacity(128 + head.raw_path.len() + query + headers);
    line.push_str(head.method);
    line.push('\n');
    push_canonical_uri(&mut line, head.raw_path);
    line.push('\n');
    let skip = presigned.then_some("X-Amz-Signature");
    push_canonical_query(&mut line, head.query, skip);
    line.push('\n');
    // The headers' values go in as the bytes they are.
    let mut canonical = line.into_bytes();
    for &name in signed_headers {
        canonical.extend_from_slice(name.as_bytes());
        canonical.push(b':');
        push_canonical_header_value(&mut canonical, &listed, head.headers, name)?;
        canonical.push(b'\n');
    }
    canonical.push(b'\n');
    for (i, name) in signed_headers.iter().enumerate() {
        if i > 0 {
            canonical.push(b';');
        }
        canonical.extend_from_slice(name.as_bytes());
    }
    canonical.push(b'\n');
    canonical.extend_from_slice(content_sha.unwrap_or("UNSIGNED-PAYLOAD").as_bytes());
    Ok(canonical)
}

/// Appends a signed header's canonical value: every value of the header,
/// white space runs folded to one space and trimmed, joined with `,`.
/// `listed` are the headers of `headers` in the map's order (a name's
/// values in the order they came); a name not found there as written
/// (upper case) is looked up as the map looks names up.
fn push_canonical_header_value(
    out: &mut Vec<u8>,
    listed: &[(&str, &HeaderValue)],
    headers: &HeaderMap,
    name: &str,
) -> Result<(), S3Error> {
    // Where no name has a second value (as in nearly every request), the
    // scan stops at the first match.
    let one_each = headers.len() == headers.keys_len();
    let mut found = 0;
    for &(_, value) in listed.iter().filter(|&&(n, _)| n == name) {
        push_canonical_value(out, name, value, found)?;
        found += 1;
        if one_each {
            break;
        }
    }
    if found == 0 {
        for value in headers.get_all(name) {
            push_canonical_value(out, name, value, found)?;
            found += 1;
        }
    }
    if found == 0 {
        return Err(S3Error::AuthorizationHeaderMalformed(format!(
            "signed header {name} is missing"
        )));
    }
    Ok(())
}

/// Appends one value of header `name`, the `index`th, after a `,` when it
/// is not the first: white space runs folded to one space and trimmed.
fn push_canonical_value(
    out: &mut Vec<u8>,
    name: &str,
    value: &HeaderValue,
    index: usize,
) -> Result<(), S3Error> {
    if index > 0 {
        out.push(b',');
    }
    // A plain value needs no UTF-8 check: it is printable ASCII.
    if is_plain_value(value.as_bytes()) {
        out.extend_from_slice(value.as_bytes());
        return Ok(());
    }
    let value = std::str::from_utf8(value.as_bytes()).map_err(|_| {
        S3Error::AuthorizationHeaderMalformed(format!("header {name} is not UTF-8"))
    })?;
    for (j, word) in value.split_whitespace().enumerate() {
        if j > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(word.as_bytes());
    }
    Ok(())
}

/// Whether a header value is already canonical: printable ASCII, no
/// space at either end, no two spaces in a row (anything else, Unicode
/// white space included, takes the general path). Both checks fold over
/// every byte without an early exit, so that the compiler checks many
/// bytes at a time: a byte-by-byte scan of the signed headers' values was
/// about 40 % of a verification's own time (docs/benchmarks-log.md).
fn is_plain_value(v: &[u8]) -> bool {
    let (Some(&first), Some(&last)) = (v.first(), v.last()) else {
        return true;
    };
    let printable = v
        .iter()
        .fold(true, |ok, &b| ok & (b' '..=b'~').contains(&b));
    let pairs = v.iter().zip(&v[1..]);
    let two_spaces = pairs.fold(false, |seen, (&a, &b)| seen | ((a == b' ') & (b == b' ')));
    first != b' ' && last != b' ' && printable && !two_spaces
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::query::decode_query;

    #[test]
    fn amz_date_parses() {
        let t = parse_amz_date("19700102T000001Z").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 86_401);
        assert!(parse_amz_date("2013-05-24T00:00:00Z").is_none());
    }

    #[test]
    fn the_empty_hash_is_the_hash_of_nothing() {
        let hash = <sha2::Sha256 as sha2::Digest>::digest(b"");
        assert_eq!(hash[..], EMPTY_SHA256_BYTES);
        assert_eq!(hex_lower(&hash), EMPTY_SHA256);
    }

    #[test]
    fn hex_is_lowercase_hex() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_lower(&all), hex::encode(&all));
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical_uri("/b/plain-key_1.txt~"), "/b/plain-key_1.txt~");
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(canonical_uri("/b/a%20b/c~d"), "/b/a%20b/c~d");
        assert_eq!(canonical_uri("/b/a+b"), "/b/a%2Bb");
        let q = decode_query(Some("uploads&b=2&a=x%2Fy"));
        assert_eq!(canonical_query(&q, None), "a=x%2Fy&b=2&uploads=");
    }

    #[test]
    fn plain_header_values_are_the_canonical_ones() {
        let long = "aws-sdk-rust/1.3.3 os/linux lang/rust/1.90.0 md/x#y ".repeat(3);
        let long = long.trim_end();
        let double = format!("{long}  {long}");
        let tail = format!("{long}\u{7f}");
        for v in [
            "", "a", "a b", "a  b", " a", "a ", "a\tb", "a\u{a0}b", "é", "x-y=z;q", "  ", long,
            &double, &tail, "a\u{1}b",
        ] {
            let canonical = v.split_whitespace().collect::<Vec<_>>().join(" ");
            if is_plain_value(v.as_bytes()) {
                assert_eq!(canonical, v, "{v:?} is not canonical");
            }
        }
        assert!(is_plain_value(b"AWS4-HMAC-SHA256 Credential=a/b"));
        assert!(!is_plain_value(b"a  b"));
        assert!(is_plain_value(long.as_bytes()));
        assert!(!is_plain_value(double.as_bytes()));
        assert!(!is_plain_value(tail.as_bytes()));
    }

    /// Every value of a signed header, in the order it came, whether or
    /// not some other header has a second value.
    #[test]
    fn a_signed_header_keeps_all_its_values() {
        let canonical = |headers: &HeaderMap| {
            let head = Head {
                method: "PUT",
                raw_path: "/b/k",
                query: &[],
                headers,
            };
            let signed = ["host", "x-amz-meta-a", "x-amz-meta-b"];
            String::from_utf8(canonical_request(&head, &signed, false, None).unwrap()).unwrap()
        };
        let mut h = HeaderMap::new();
        h.insert("x-amz-meta-b", "only".parse().unwrap());
        h.insert("host", "h".parse().unwrap());
        h.insert("x-amz-meta-a", "1".parse().unwrap());
        let single = canonical(&h);
        assert!(single.contains("\nhost:h\nx-amz-meta-a:1\nx-amz-meta-b:only\n"));
        h.append("x-amz-meta-a", " 2  3 ".parse().unwrap());
        h.append("x-amz-meta-a", "4".parse().unwrap());
        let multi = canonical(&h);
        assert!(multi.contains("\nx-amz-meta-a:1,2 3,4\nx-amz-meta-b:only\n"));
    }

    #[test]
    fn amz_date_round_trips() {
        for t in [0u64, 86_401, 951_782_400, 1_700_000_000, 4_102_444_799] {
            let s = amz_date(t);
            let back = parse_amz_date(&s).unwrap();
            assert_eq!(back.duration_since(UNIX_EPOCH).unwrap().as_secs(), t, "{s}");
        }
        assert_eq!(amz_date(1_369_353_600), "20130524T000000Z");
    }
}
