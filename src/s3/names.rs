//! Bucket names, object keys and copy sources in the one form fencegate
//! fences and forwards.
//!
//! A fence is only as good as the agreement between fencegate and the
//! backend on *which object* a request touches. Backends rewrite some keys
//! before they act on them: a file-system store resolves `a/../k` to `k`,
//! Garage trims a key's leading slash, s3s-fs joins `/k` as an absolute
//! path. Such keys would be fenced under one name and written under
//! another, so they are refused here, once, with `400 InvalidObjectName`;
//! every key that passes names exactly one object on every backend tried
//! (the differential test checks this against each of them).
//!
//! A key is refused when it:
//! - is empty or longer than 1024 bytes;
//! - starts with `/`, or has an empty segment (`a//b`);
//! - has a `.` or `..` segment (`./k`, `a/../k`, `k/.`);
//! - holds an ASCII control character (XML bodies and file systems read
//!   them differently; S3 itself advises against them).
//!
//! A trailing `/` (a "folder" object, `photos/`) is allowed.

use super::error::S3Error;
use super::query::percent_decode;
use super::sigv4::push_encoded;

/// The longest key S3 accepts, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// Checks a decoded object key (see the module doc for what is refused).
pub fn check_key(key: &str) -> Result<(), S3Error> {
    let bad = |why: &str| {
        Err(S3Error::InvalidObjectName(format!(
            "object key {:?} {why}",
            key.chars().take(80).collect::<String>()
        )))
    };
    if key.is_empty() {
        return bad("is empty");
    }
    if key.len() > MAX_KEY_BYTES {
        return bad("is longer than 1024 bytes");
    }
    if key.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return bad("holds a control character");
    }
    if key.starts_with('/') {
        return bad("starts with '/', which some stores trim or read as a root");
    }
    // Every segment but a trailing empty one (`photos/`) must be a name.
    let body = key.strip_suffix('/').unwrap_or(key);
    for seg in body.split('/') {
        match seg {
            "" => return bad("has an empty path segment ('//'), which some stores merge"),
            "." | ".." => {
                return bad("has a '.' or '..' segment, which some stores resolve to another key");
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks a decoded bucket name: 1 to 255 of `A-Z a-z 0-9 . - _`, and not
/// `.` or `..`. (Stores apply their own, stricter naming rules on creation;
/// this only makes sure that every name reaches them as one path segment.)
pub fn check_bucket(bucket: &str) -> Result<(), S3Error> {
    let ok = !bucket.is_empty()
        && bucket.len() <= 255
        && bucket != "."
        && bucket != ".."
        && bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(S3Error::InvalidBucketName(format!(
            "invalid bucket name {:?}",
            bucket.chars().take(80).collect::<String>()
        )))
    }
}

fn decode(s: &str, what: &str) -> Result<String, S3Error> {
    String::from_utf8(percent_decode(s).into_owned())
        .map_err(|_| S3Error::InvalidArgument(format!("the {what} is not valid UTF-8")))
}

/// A path-style request path split into its checked, decoded bucket and key.
pub fn split_path(raw_path: &str) -> Result<(Option<String>, Option<String>), S3Error> {
    let Some(trimmed) = raw_path.strip_prefix('/') else {
        return Err(S3Error::InvalidArgument(
            "the request path must start with '/'".into(),
        ));
    };
    if trimmed.is_empty() {
        return Ok((None, None));
    }
    let (bucket, key) = match trimmed.split_once('/') {
        Some((b, k)) => (b, Some(k)),
        None => (trimmed, None),
    };
    let bucket = decode(bucket, "bucket name")?;
    check_bucket(&bucket)?;
    let key = match key {
        Some("") | None => None,
        Some(k) => {
            let k = decode(k, "object key")?;
            check_key(&k)?;
            Some(k)
        }
    };
    Ok((Some(bucket), key))
}

/// The bucket named by a virtual-host style `Host` (`bucket.<domain>`), for
/// one of the configured root `domains`.
pub fn bucket_from_host<'a>(host: &'a str, domains: &[String]) -> Option<&'a str> {
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    domains.iter().find_map(|d| {
        host.strip_suffix(d.as_str())
            .and_then(|rest| rest.strip_suffix('.'))
            .filter(|b| !b.is_empty())
    })
}

/// Splits a request into checked bucket and key: virtual-host style when
/// the host names a bucket under one of `domains`, else path style.
pub fn split_request(
    host: Option<&str>,
    raw_path: &str,
    domains: &[String],
) -> Result<(Option<String>, Option<String>), S3Error> {
    match host.and_then(|h| bucket_from_host(h, domains)) {
        // The whole path is the key.
        Some(bucket) => split_path(&format!("/{bucket}{raw_path}")),
        None => split_path(raw_path),
    }
}

/// The object a CopyObject or UploadPartCopy reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopySource {
    pub bucket: String,
    pub key: String,
    pub version_id: Option<String>,
}

impl CopySource {
    /// Parses `x-amz-copy-source` the way S3 and the stores tried read it:
    /// an optional `?versionId=` split off the raw value, then the rest
    /// percent-decoded *as a whole*, one leading `/` dropped, and split at
    /// the first `/` into bucket and key. (`oth%2Fk` is bucket `oth`, key
    /// `k`.) Anything else after `?` is refused, as is a bucket or key that
    /// [`check_bucket`] or [`check_key`] refuses.
    pub fn parse(raw: &[u8]) -> Result<CopySource, S3Error> {
        let bad = |why: &str| S3Error::InvalidArgument(format!("x-amz-copy-source {why}"));
        let raw = std::str::from_utf8(raw).map_err(|_| bad("is not ASCII"))?;
        let (path, version_id) = match raw.split_once('?') {
            None => (raw, None),
            Some((p, q)) => match q.strip_prefix("versionId=") {
                Some(v) if !v.is_empty() && !v.contains(['&', '?']) => {
                    (p, Some(decode(v, "copy source version id")?))
                }
                _ => return Err(bad("may carry only ?versionId=<id> after the key")),
            },
        };
        let path = decode(path, "copy source")?;
        let path = path.strip_prefix('/').unwrap_or(&path);
        let Some((bucket, key)) = path.split_once('/') else {
            return Err(bad("must name a bucket and a key"));
        };
        check_bucket(bucket)?;
        check_key(key)?;
        Ok(CopySource {
            bucket: bucket.to_string(),
            key: key.to_string(),
            version_id,
        })
    }

    /// The header value fencegate forwards: `/bucket/key` with the key
    /// percent-encoded (slashes kept), and the version id, if any.
    pub fn to_header(&self) -> String {
        let mut s = String::with_capacity(self.bucket.len() + self.key.len() + 2);
        s.push('/');
        push_encoded(&mut s, &self.bucket, false);
        s.push('/');
        push_encoded(&mut s, &self.key, true);
        if let Some(v) = &self.version_id {
            s.push_str("?versionId=");
            push_encoded(&mut s, v, false);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_a_store_would_rewrite_are_refused() {
        for k in [
            "", "/k", "x/../k", "./k", "k/.", "k/..", "a//b", "..", ".", "a/./b", "k\0", "k\r",
            "a/../",
        ] {
            assert!(check_key(k).is_err(), "{k:?} accepted");
        }
        for k in [
            "k", "a/b", "photos/", "k.", "..k", "a b", "a\\b", "é/ü", "a/.b/c",
        ] {
            assert!(check_key(k).is_ok(), "{k:?} refused");
        }
        assert!(check_key(&"k".repeat(1025)).is_err());
    }

    #[test]
    fn paths_split_and_checked() {
        let s = split_path;
        assert_eq!(
            s("/b/a%20b/c").unwrap(),
            (Some("b".into()), Some("a b/c".into()))
        );
        assert_eq!(s("/b/").unwrap(), (Some("b".into()), None));
        assert_eq!(s("/").unwrap(), (None, None));
        for p in [
            "/b/x/../k",
            "/b//k",
            "/b/%2E%2E/k",
            "/../oth/loot",
            "/b//",
            "/%2E%2E/k",
            "b/k",
        ] {
            assert!(s(p).is_err(), "{p} accepted");
        }
    }

    #[test]
    fn virtual_host_style() {
        let d = vec!["s3.example.com".to_string()];
        assert_eq!(
            bucket_from_host("demo.s3.example.com:9000", &d),
            Some("demo")
        );
        assert_eq!(bucket_from_host("s3.example.com:9000", &d), None);
        assert_eq!(bucket_from_host("demo.other.com", &d), None);
        let (b, k) = split_request(Some("demo.s3.example.com"), "/a/b%20c", &d).unwrap();
        assert_eq!((b.as_deref(), k.as_deref()), (Some("demo"), Some("a/b c")));
        let (b, k) = split_request(Some("s3.example.com"), "/demo/a", &d).unwrap();
        assert_eq!((b.as_deref(), k.as_deref()), (Some("demo"), Some("a")));
        let (b, k) = split_request(Some("demo.s3.example.com"), "/", &d).unwrap();
        assert_eq!((b.as_deref(), k), (Some("demo"), None));
        assert!(split_request(Some("demo.s3.example.com"), "//k", &d).is_err());
    }

    #[test]
    fn copy_sources_decode_then_split() {
        let p = |s: &str| CopySource::parse(s.as_bytes());
        let src = p("oth%2Fpayroll.csv").unwrap();
        assert_eq!(
            (src.bucket.as_str(), src.key.as_str()),
            ("oth", "payroll.csv")
        );
        let src = p("/b/a%20b%3Fc?versionId=v%2B1").unwrap();
        assert_eq!(src.key, "a b?c");
        assert_eq!(src.version_id.as_deref(), Some("v+1"));
        assert_eq!(src.to_header(), "/b/a%20b%3Fc?versionId=v%2B1");
        for bad in [
            "b",
            "/b/",
            "b/x/../k",
            "b%2F..%2Fk",
            "../b/k",
            "b/k?partNumber=1",
            "b/k?versionId=",
            "b/k?versionId=1&x=2",
        ] {
            assert!(p(bad).is_err(), "{bad} accepted");
        }
    }
}
