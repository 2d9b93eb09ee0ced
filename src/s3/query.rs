//! The query string, decoded once into pairs, and the one way to look a
//! parameter up in it.

use percent_encoding::percent_decode_str;

/// Decodes a raw query string into pairs (no `+`-as-space: S3 signs `%20`).
/// A `%` not followed by two hex digits stays as it is; bytes that do not
/// decode to UTF-8 become U+FFFD.
pub fn decode_query(raw: Option<&str>) -> Vec<(String, String)> {
    let Some(raw) = raw else { return Vec::new() };
    let bytes = raw.as_bytes();
    let mut pairs = Vec::with_capacity(bytes.iter().filter(|&&b| b == b'&').count() + 1);
    // One pass: each part's first `=`, and whether its name or its value
    // has a `%` to decode.
    let mut start = 0;
    while start <= bytes.len() {
        let (mut eq, mut escaped_name, mut escaped_value) = (None, false, false);
        let mut end = start;
        while end < bytes.len() && bytes[end] != b'&' {
            match (bytes[end], eq) {
                (b'=', None) => eq = Some(end),
                (b'%', None) => escaped_name = true,
                (b'%', Some(_)) => escaped_value = true,
                _ => {}
            }
            end += 1;
        }
        if end > start {
            // `&`, `=` and `%` are ASCII: every index above is a char boundary.
            let (k, v) = match eq {
                Some(eq) => (&raw[start..eq], &raw[eq + 1..end]),
                None => (&raw[start..end], ""),
            };
            pairs.push((decode(k, escaped_name), decode(v, escaped_value)));
        }
        start = end + 1;
    }
    pairs
}

/// One name or value, percent-decoded (`escaped`: it has a `%`).
fn decode(s: &str, escaped: bool) -> String {
    if !escaped {
        return s.to_string();
    }
    let bytes: Vec<u8> = percent_decode_str(s).collect();
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
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
