//! The query string, decoded once into pairs, and the one way to look a
//! parameter up in it.

use percent_encoding::percent_decode_str;

/// Decodes a raw query string into pairs (no `+`-as-space: S3 signs `%20`).
pub fn decode_query(raw: Option<&str>) -> Vec<(String, String)> {
    let Some(raw) = raw else { return Vec::new() };
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let dec = |s: &str| match s.contains('%') {
                false => s.to_string(),
                true => {
                    let bytes: Vec<u8> = percent_decode_str(s).collect();
                    String::from_utf8(bytes)
                        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
                }
            };
            (dec(k), dec(v))
        })
        .collect()
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
