//! The query string, decoded once into pairs, and the one way to look a
//! parameter up in it.

use super::sigv4::percent_decode;
use std::borrow::Cow;

/// Decodes a raw query string into pairs (no `+`-as-space: S3 signs `%20`).
/// A `%` not followed by two hex digits stays as it is; bytes that do not
/// decode to UTF-8 become U+FFFD.
pub fn decode_query(raw: Option<&str>) -> Vec<(String, String)> {
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
                false => (k.to_string(), v.to_string()),
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
fn decode(s: &str) -> String {
    match percent_decode(s) {
        Cow::Borrowed(_) => s.to_string(),
        Cow::Owned(bytes) => String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

/// The value of the first parameter `name` (case-sensitive, as S3 reads it).
pub fn query_param<'a>(query: &'a [(String, String)], name: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Whether the query has a parameter `name`, with or without a value.
pub fn has_query_param(query: &[(String, String)], name: &str) -> bool {
    query_param(query, name).is_some()
}
