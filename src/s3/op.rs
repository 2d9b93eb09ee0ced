//! Classifies a request into an S3 operation, its bucket and key, and what
//! kind of access it is: which ones are fenced writes is CONTRACT §2.

use super::error::S3Error;
use http::{HeaderMap, Method};
use percent_encoding::percent_decode_str;

/// What a request does, as far as fencing and permissions are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// ListBuckets and other service-level reads.
    Service,
    /// Bucket reads: List*, GetBucket*, HeadBucket.
    BucketRead,
    /// Bucket-level writes: CreateBucket, DeleteBucket, PutBucket*... No
    /// token, but the credential must administer the bucket.
    BucketWrite,
    /// Object reads: GET, HEAD, GetObjectTagging...
    ObjectRead,
    /// Object writes fenced on the object's resource.
    ObjectWrite,
    /// DeleteObjects: fenced on every key listed in the body.
    MultiDelete,
}

/// A classified request.
#[derive(Debug, Clone)]
pub struct Operation {
    /// S3 operation name, for logs and metrics.
    pub name: &'static str,
    pub access: Access,
    pub bucket: Option<String>,
    pub key: Option<String>,
    /// Whether the accepted token is stamped on the stored object.
    pub stamps_token: bool,
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

/// Splits a request into decoded bucket and key: virtual-host style when
/// the host names a bucket under one of `domains`, else path style.
pub fn split_request(
    host: Option<&str>,
    raw_path: &str,
    domains: &[String],
) -> Result<(Option<String>, Option<String>), S3Error> {
    let Some(bucket) = host.and_then(|h| bucket_from_host(h, domains)) else {
        return split_path(raw_path);
    };
    // The whole path is the key.
    let (b, k) = split_path(&format!("/{bucket}{raw_path}"))?;
    Ok((b, k))
}

/// A copy source: bucket, key, version.
pub type CopySource = (String, String, Option<String>);

/// The object named by `x-amz-copy-source` (`[/]bucket/key[?versionId=v]`,
/// URL-encoded).
pub fn copy_source(headers: &HeaderMap) -> Option<Result<CopySource, S3Error>> {
    let raw = headers.get("x-amz-copy-source")?;
    let bad = || S3Error::InvalidArgument("x-amz-copy-source is malformed".into());
    let parse = || {
        let raw = raw.to_str().map_err(|_| bad())?;
        let (path, version) = match raw.split_once("?versionId=") {
            Some((p, v)) => (p, Some(v.to_string())),
            None => (raw, None),
        };
        let path = path.strip_prefix('/').unwrap_or(path);
        match split_path(&format!("/{path}"))? {
            (Some(b), Some(k)) => Ok((b, k, version)),
            _ => Err(bad()),
        }
    };
    Some(parse())
}

/// Splits a path-style request path into decoded bucket and key.
pub fn split_path(raw_path: &str) -> Result<(Option<String>, Option<String>), S3Error> {
    let trimmed = raw_path.strip_prefix('/').unwrap_or(raw_path);
    if trimmed.is_empty() {
        return Ok((None, None));
    }
    let (bucket, key) = match trimmed.split_once('/') {
        Some((b, k)) => (b, Some(k)),
        None => (trimmed, None),
    };
    let decode = |s: &str| -> Result<String, S3Error> {
        percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| S3Error::InvalidArgument("the path is not valid UTF-8".into()))
    };
    let bucket = decode(bucket)?;
    if bucket.is_empty() || bucket.len() > 255 || bucket.contains(['/', '\\']) {
        return Err(S3Error::InvalidBucketName(format!(
            "invalid bucket name {bucket:?}"
        )));
    }
    let key = match key {
        Some("") | None => None,
        Some(k) => Some(decode(k)?),
    };
    Ok((Some(bucket), key))
}

fn has(query: &[(String, String)], name: &str) -> bool {
    query.iter().any(|(k, _)| k == name)
}

/// Classifies a request. `query` holds decoded query pairs.
pub fn classify(
    method: &Method,
    bucket: Option<String>,
    key: Option<String>,
    query: &[(String, String)],
    headers: &HeaderMap,
) -> Result<Operation, S3Error> {
    let q = |n| has(query, n);
    let copy = headers.contains_key("x-amz-copy-source");
    let op = |name, access, stamps_token| Operation {
        name,
        access,
        bucket: bucket.clone(),
        key: key.clone(),
        stamps_token,
    };
    let unsupported = |what: &str| Err(S3Error::NotImplemented(format!("{what} is not supported")));
    Ok(match (bucket.is_some(), key.is_some()) {
        (false, _) => match *method {
            Method::GET | Method::HEAD => op("ListBuckets", Access::Service, false),
            _ => return unsupported("this service-level request"),
        },
        (true, false) => match *method {
            Method::GET | Method::HEAD => {
                let name = if q("uploads") {
                    "ListMultipartUploads"
                } else if q("versions") {
                    "ListObjectVersions"
                } else if q("list-type") {
                    "ListObjectsV2"
                } else if *method == Method::HEAD {
                    "HeadBucket"
                } else if query.is_empty() {
                    "ListObjects"
                } else {
                    "GetBucketConfig"
                };
                op(name, Access::BucketRead, false)
            }
            Method::PUT => {
                let name = if query.is_empty() {
                    "CreateBucket"
                } else {
                    "PutBucketConfig"
                };
                op(name, Access::BucketWrite, false)
            }
            Method::DELETE => {
                let name = if query.is_empty() {
                    "DeleteBucket"
                } else {
                    "DeleteBucketConfig"
                };
                op(name, Access::BucketWrite, false)
            }
            Method::POST if q("delete") => op("DeleteObjects", Access::MultiDelete, false),
            Method::POST => return unsupported("browser-form POST upload"),
            _ => return unsupported("this bucket request"),
        },
        (true, true) => match *method {
            Method::GET | Method::HEAD => {
                let name = if q("tagging") {
                    "GetObjectTagging"
                } else if q("acl") {
                    "GetObjectAcl"
                } else if q("uploadId") {
                    "ListParts"
                } else if *method == Method::HEAD {
                    "HeadObject"
                } else {
                    "GetObject"
                };
                op(name, Access::ObjectRead, false)
            }
            Method::PUT => {
                let (name, stamps) = if q("partNumber") && q("uploadId") {
                    if copy {
                        ("UploadPartCopy", false)
                    } else {
                        ("UploadPart", false)
                    }
                } else if q("tagging") {
                    ("PutObjectTagging", false)
                } else if q("acl") {
                    ("PutObjectAcl", false)
                } else if q("retention") {
                    ("PutObjectRetention", false)
                } else if q("legal-hold") {
                    ("PutObjectLegalHold", false)
                } else if copy {
                    ("CopyObject", true)
                } else {
                    // Anything else that PUTs to a key is fenced like a PutObject.
                    ("PutObject", true)
                };
                op(name, Access::ObjectWrite, stamps)
            }
            Method::POST if q("uploads") => op("CreateMultipartUpload", Access::ObjectWrite, true),
            Method::POST if q("uploadId") => {
                op("CompleteMultipartUpload", Access::ObjectWrite, false)
            }
            Method::POST if q("select") => op("SelectObjectContent", Access::ObjectRead, false),
            Method::POST if q("restore") => op("RestoreObject", Access::ObjectWrite, false),
            Method::DELETE => {
                let name = if q("uploadId") {
                    "AbortMultipartUpload"
                } else if q("tagging") {
                    "DeleteObjectTagging"
                } else {
                    "DeleteObject"
                };
                op(name, Access::ObjectWrite, false)
            }
            _ => return unsupported("this object request"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(method: Method, path: &str, query: &[(&str, &str)], copy: bool) -> Operation {
        let (b, k) = split_path(path).unwrap();
        let q: Vec<(String, String)> = query
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let mut h = HeaderMap::new();
        if copy {
            h.insert("x-amz-copy-source", "/src/k".parse().unwrap());
        }
        classify(&method, b, k, &q, &h).unwrap()
    }

    #[test]
    fn classifies_fenced_writes() {
        let w = |m, p, q: &[(&str, &str)], copy| {
            let o = c(m, p, q, copy);
            assert_eq!(o.access, Access::ObjectWrite, "{}", o.name);
            o.name
        };
        assert_eq!(w(Method::PUT, "/b/k", &[], false), "PutObject");
        assert_eq!(w(Method::PUT, "/b/k", &[], true), "CopyObject");
        assert_eq!(
            w(
                Method::PUT,
                "/b/k",
                &[("partNumber", "1"), ("uploadId", "u")],
                false
            ),
            "UploadPart"
        );
        assert_eq!(
            w(
                Method::PUT,
                "/b/k",
                &[("partNumber", "1"), ("uploadId", "u")],
                true
            ),
            "UploadPartCopy"
        );
        assert_eq!(
            w(Method::POST, "/b/k", &[("uploads", "")], false),
            "CreateMultipartUpload"
        );
        assert_eq!(
            w(Method::POST, "/b/k", &[("uploadId", "u")], false),
            "CompleteMultipartUpload"
        );
        assert_eq!(
            w(Method::DELETE, "/b/k", &[("uploadId", "u")], false),
            "AbortMultipartUpload"
        );
        assert_eq!(w(Method::DELETE, "/b/k", &[], false), "DeleteObject");
        assert_eq!(
            w(Method::PUT, "/b/k", &[("tagging", "")], false),
            "PutObjectTagging"
        );
        assert_eq!(
            w(Method::DELETE, "/b/k", &[("tagging", "")], false),
            "DeleteObjectTagging"
        );
        assert_eq!(
            w(Method::PUT, "/b/k", &[("acl", "")], false),
            "PutObjectAcl"
        );
        assert_eq!(
            w(Method::PUT, "/b/k", &[("retention", "")], false),
            "PutObjectRetention"
        );
        assert_eq!(
            w(Method::PUT, "/b/k", &[("legal-hold", "")], false),
            "PutObjectLegalHold"
        );
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
    }

    #[test]
    fn classifies_reads_and_bucket_ops() {
        assert_eq!(
            c(Method::GET, "/b/a%20b/c", &[], false).key.as_deref(),
            Some("a b/c")
        );
        assert_eq!(
            c(Method::GET, "/b/k", &[], false).access,
            Access::ObjectRead
        );
        assert_eq!(
            c(Method::HEAD, "/b/k", &[], false).access,
            Access::ObjectRead
        );
        assert_eq!(
            c(Method::GET, "/b", &[("list-type", "2")], false).access,
            Access::BucketRead
        );
        assert_eq!(c(Method::PUT, "/b", &[], false).access, Access::BucketWrite);
        assert_eq!(
            c(Method::DELETE, "/b/", &[], false).access,
            Access::BucketWrite
        );
        assert_eq!(
            c(Method::POST, "/b", &[("delete", "")], false).access,
            Access::MultiDelete
        );
        assert_eq!(c(Method::GET, "/", &[], false).access, Access::Service);
    }
}
