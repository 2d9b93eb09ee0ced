//! Percent-decoding (of query parts, paths and keys), the query string
//! decoded once into pairs, and the one way to look a parameter up in it.
//! A pair borrows from the request's URI unless decoding changed it: of a
//! presigned URL's parameters only the escaped credential allocates.

use std::borrow::Cow;

/// One decoded query parameter, name and value: borrowed from the raw
/// query when it has no escape, owned when decoding changed it.
pub type Param<'a> = (Cow<'a, str>, Cow<'a, str>);

/// Decodes a raw query string into pairs (no `+`-as-space: S3 signs `%20`).
/// A `%` not followed by two hex digits stays as it is; bytes that do not
/// decode to UTF-8 become U+FFFD.
pub fn decode_query(raw: Option<&str>) -> Vec<Param<'_>> {
    let Some(raw) = raw else { return Vec::new() };
    let bytes = raw.as_bytes();
    let mut pairs = Vec::with_capacity(memchr::memchr_iter(b'&', bytes).count() + 1);
    // One pass over the bytes that matter (`&`, `=`, `%`, found by
    // `memchr3`): each part, its first `=`, and whether it has a `%` at all
    // (most parts have none, and are copied as they are).
    let (mut start, mut eq, mut escaped) = (0, None, false);
    let mut push_part = |start: usize, end: usize, eq: Option<usize>, escaped: bool| {
        if end > start {
            // `&`, `=` and `%` are ASCII: every index is a char boundary.
            let (k, v) = match eq {
                Some(eq) => (&raw[start..eq], &raw[eq + 1..end]),
                None => (&raw[start..end], ""),
            };
            pairs.push(match escaped {
                false => (Cow::Borrowed(k), Cow::Borrowed(v)),
                true => (decode(k), decode(v)),
            });
        }
    };
    for i in memchr::memchr3_iter(b'&', b'=', b'%', bytes) {
        match bytes[i] {
            b'&' => {
                push_part(start, i, eq, escaped);
                (start, eq, escaped) = (i + 1, None, false);
            }
            b'=' if eq.is_none() => eq = Some(i),
            b'%' => escaped = true,
            _ => {}
        }
    }
    push_part(start, bytes.len(), eq, escaped);
    pairs
}

/// One name or value, percent-decoded.
fn decode(s: &str) -> Cow<'_, str> {
    match percent_decode(s) {
        Cow::Borrowed(_) => Cow::Borrowed(s),
        Cow::Owned(bytes) => Cow::Owned(
            String::from_utf8(bytes)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        ),
    }
}

/// A pair that owns its strings, to outlive the request's URI (the
/// parameters forwarded upstream).
pub fn owned(pair: &Param<'_>) -> Param<'static> {
    let (k, v) = pair;
    (Cow::Owned(k.to_string()), Cow::Owned(v.to_string()))
}

/// The value of the first parameter `name` (case-sensitive, as S3 reads it).
pub fn query_param<'a>(query: &'a [Param<'_>], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_ref())
}

/// Whether the query has a parameter `name`, with or without a value.
pub fn has_query_param(query: &[Param<'_>], name: &str) -> bool {
    query_param(query, name).is_some()
}

/// Percent-decodes `s`: each `%` and two hex digits becomes that byte; a
/// `%` without them stays as it is (as `percent_decode_str` reads it, the
/// reference it is tested against in `tests/parsers.rs`). Paths, keys and
/// query parts are all decoded here. Borrowed when there is nothing to
/// decode; otherwise the plain runs between escapes are copied whole.
pub fn percent_decode(s: &str) -> Cow<'_, [u8]> {
    let bytes = s.as_bytes();
    let Some(first) = memchr::memchr(b'%', bytes) else {
        return Cow::Borrowed(bytes);
    };
    let hex = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let (mut copied, mut at) = (0, Some(first));
    while let Some(i) = at {
        let escape = bytes
            .get(i + 1..i + 3)
            .and_then(|h| Some(hex(h[0])? << 4 | hex(h[1])?));
        let next = match escape {
            Some(b) => {
                out.extend_from_slice(&bytes[copied..i]);
                out.push(b);
                copied = i + 3;
                i + 3
            }
            None => i + 1,
        };
        at = memchr::memchr(b'%', &bytes[next..]).map(|j| next + j);
    }
    out.extend_from_slice(&bytes[copied..]);
    Cow::Owned(out)
}
