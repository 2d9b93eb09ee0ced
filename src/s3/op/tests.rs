//! The unit tests of `s3::op`: the classification table, folder markers,
//! upload ids, copy sources, and the requests refused as ambiguous.

use super::super::names::split_path;
use super::*;

fn classify_path(method: Method, path: &str, query: &[(&str, &str)], copy: bool) -> Operation {
    let (b, k) = split_path(path).unwrap();
    let q: Vec<Param> = query.iter().map(|&(a, b)| (a.into(), b.into())).collect();
    let mut h = HeaderMap::new();
    if copy {
        h.insert("x-amz-copy-source", "/src/k".parse().unwrap());
    }
    classify(&method, b, k, &q, &h).unwrap()
}

/// One row: method, path, query, copy header → operation and effect.
type Row<'a> = (Method, &'a str, &'a [(&'a str, &'a str)], bool, Op, Effect);

/// (method, path, query, copy header) → operation, as a table.
#[test]
fn classification_table() {
    use Method as M;
    let part = &[("partNumber", "1"), ("uploadId", "u")][..];
    let table: &[Row] = &[
        (
            M::PUT,
            "/b/k",
            &[],
            false,
            Op::PutObject,
            Effect::ObjectWrite,
        ),
        (
            M::PUT,
            "/b/k",
            &[],
            true,
            Op::CopyObject,
            Effect::ObjectWrite,
        ),
        (
            M::PUT,
            "/b/k",
            part,
            false,
            Op::UploadPart,
            Effect::ObjectWrite,
        ),
        (
            M::PUT,
            "/b/k",
            part,
            true,
            Op::UploadPartCopy,
            Effect::ObjectWrite,
        ),
        (
            M::POST,
            "/b/k",
            &[("uploads", "")],
            false,
            Op::CreateMultipartUpload,
            Effect::ObjectWrite,
        ),
        (
            M::POST,
            "/b/k",
            &[("uploadId", "u")],
            false,
            Op::CompleteMultipartUpload,
            Effect::ObjectWrite,
        ),
        (
            M::DELETE,
            "/b/k",
            &[("uploadId", "u")],
            false,
            Op::AbortMultipartUpload,
            Effect::ObjectWrite,
        ),
        (
            M::DELETE,
            "/b/k",
            &[],
            false,
            Op::DeleteObject,
            Effect::ObjectWrite,
        ),
        (
            M::PUT,
            "/b/k",
            &[("tagging", "")],
            false,
            Op::PutObjectTagging,
            Effect::ObjectWrite,
        ),
        (
            M::DELETE,
            "/b/k",
            &[("tagging", "")],
            false,
            Op::DeleteObjectTagging,
            Effect::ObjectWrite,
        ),
        (
            M::PUT,
            "/b/k",
            &[("acl", "")],
            false,
            Op::PutObjectAcl,
            Effect::ObjectWrite,
        ),
        (
            M::PUT,
            "/b/k",
            &[("retention", "")],
            false,
            Op::PutObjectRetention,
            Effect::ObjectWrite,
        ),
        (
            M::PUT,
            "/b/k",
            &[("legal-hold", "")],
            false,
            Op::PutObjectLegalHold,
            Effect::ObjectWrite,
        ),
        (
            M::PUT,
            "/b/k",
            &[("uploadId", "u")],
            false,
            Op::PutObject,
            Effect::ObjectWrite,
        ),
        (
            M::GET,
            "/b/k",
            &[],
            false,
            Op::GetObject,
            Effect::ObjectRead,
        ),
        (
            M::HEAD,
            "/b/k",
            &[],
            false,
            Op::HeadObject,
            Effect::ObjectRead,
        ),
        (
            M::GET,
            "/b/k",
            &[("uploadId", "u")],
            false,
            Op::ListParts,
            Effect::ObjectRead,
        ),
        (
            M::GET,
            "/b",
            &[("list-type", "2")],
            false,
            Op::ListObjectsV2,
            Effect::BucketRead,
        ),
        (
            M::GET,
            "/b",
            &[],
            false,
            Op::ListObjects,
            Effect::BucketRead,
        ),
        // A v1 listing's parameters, or an SDK's `x-id`, name no
        // subresource: still the listing, as S3 reads it.
        (
            M::GET,
            "/b",
            &[
                ("prefix", "p/"),
                ("delimiter", "/"),
                ("encoding-type", "url"),
            ],
            false,
            Op::ListObjects,
            Effect::BucketRead,
        ),
        (
            M::GET,
            "/b",
            &[("acl", "")],
            false,
            Op::GetBucketConfig,
            Effect::BucketRead,
        ),
        (
            M::PUT,
            "/b",
            &[("x-id", "CreateBucket")],
            false,
            Op::CreateBucket,
            Effect::BucketWrite,
        ),
        (
            M::DELETE,
            "/b",
            &[("x-id", "DeleteBucket")],
            false,
            Op::DeleteBucket,
            Effect::BucketWrite,
        ),
        (
            M::PUT,
            "/b",
            &[],
            false,
            Op::CreateBucket,
            Effect::BucketWrite,
        ),
        (
            M::PUT,
            "/b",
            &[("lifecycle", "")],
            false,
            Op::PutBucketConfig,
            Effect::BucketWrite,
        ),
        (
            M::DELETE,
            "/b/",
            &[],
            false,
            Op::DeleteBucket,
            Effect::BucketWrite,
        ),
        (
            M::POST,
            "/b",
            &[("delete", "")],
            false,
            Op::DeleteObjects,
            Effect::MultiDelete,
        ),
        (M::GET, "/", &[], false, Op::ListBuckets, Effect::Service),
    ];
    for (m, path, q, copy, op, effect) in table {
        let o = classify_path(m.clone(), path, q, *copy);
        assert_eq!((o.op, o.effect()), (*op, *effect), "{m} {path} {q:?}");
    }
}

#[test]
fn folder_markers_are_written_by_put_only() {
    let mut h = HeaderMap::new();
    h.insert("x-amz-copy-source", "/src/k".parse().unwrap());
    let folder = || (Some("b".to_string()), Some("a/".to_string()));
    let (b, k) = folder();
    assert!(classify(&Method::PUT, b, k, &[], &h).is_err());
    let (b, k) = folder();
    let uploads = [("uploads".into(), "".into())];
    assert!(classify(&Method::POST, b, k, &uploads, &HeaderMap::new()).is_err());
    let (b, k) = folder();
    let put = classify(&Method::PUT, b, k, &[], &HeaderMap::new()).unwrap();
    assert_eq!(put.op, Op::PutObject);
}

#[test]
fn upload_ids_belong_to_multipart_requests_only() {
    let put = classify_path(Method::PUT, "/b/k", &[("uploadId", "u")], false);
    assert_eq!(put.upload_id, None);
    let list = classify_path(Method::GET, "/b/k", &[("uploadId", "u")], false);
    assert_eq!(list.upload_id, None);
    let part = classify_path(
        Method::PUT,
        "/b/k",
        &[("partNumber", "1"), ("uploadId", "u")],
        false,
    );
    assert_eq!(part.upload_id.as_deref(), Some("u"));
}

/// What a backend could read as another operation than fencegate does
/// is refused before any fence moves: two subresources at once (s3s
/// and Garage pick the subresource, fencegate would have picked the
/// upload and its token), a part without a number from 1 to 10000
/// (Garage takes an empty one for a PutObject), S3 Express's
/// CreateSession, and a metadata directive neither COPY nor REPLACE.
#[test]
fn what_a_backend_could_read_otherwise_is_refused() {
    let code = |m: Method, path: &str, q: &[(&str, &str)], h: &HeaderMap| {
        let (b, k) = split_path(path).unwrap();
        let q: Vec<Param> = q.iter().map(|&(a, b)| (a.into(), b.into())).collect();
        classify(&m, b, k, &q, h).map(|_| ()).map_err(|e| e.code())
    };
    let none = HeaderMap::new();
    let part = [("partNumber", "1"), ("uploadId", "u")];
    assert_eq!(code(Method::PUT, "/b/k", &part, &none), Ok(()));
    for extra in ["tagging", "acl", "retention", "legal-hold"] {
        let q = [part[0], part[1], (extra, "")];
        assert_eq!(
            code(Method::PUT, "/b/k", &q, &none),
            Err("InvalidRequest"),
            "{extra}"
        );
    }
    let q = [("uploadId", "u"), ("tagging", "")];
    assert_eq!(
        code(Method::DELETE, "/b/k", &q, &none),
        Err("InvalidRequest")
    );
    let q = [("select", ""), ("restore", "")];
    assert_eq!(code(Method::POST, "/b/k", &q, &none), Err("InvalidRequest"));
    let q = [("uploads", ""), ("acl", "")];
    assert_eq!(code(Method::GET, "/b", &q, &none), Err("InvalidRequest"));
    for n in ["", "0", "10001", "x", "-1"] {
        let q = [("partNumber", n), ("uploadId", "u")];
        assert_eq!(
            code(Method::PUT, "/b/k", &q, &none),
            Err("InvalidArgument"),
            "{n:?}"
        );
    }
    let q = [("partNumber", "10000"), ("uploadId", "u")];
    assert_eq!(code(Method::PUT, "/b/k", &q, &none), Ok(()));
    assert_eq!(
        code(Method::GET, "/b", &[("session", "")], &none),
        Err("NotImplemented")
    );
    let mut h = HeaderMap::new();
    h.insert("x-amz-copy-source", "src/k".parse().unwrap());
    for (d, ok) in [("replace", true), ("COPY", true), ("MOVE", false)] {
        h.insert("x-amz-metadata-directive", d.parse().unwrap());
        let want = if ok { Ok(()) } else { Err("InvalidArgument") };
        assert_eq!(code(Method::PUT, "/b/k", &[], &h), want, "{d}");
    }
}

#[test]
fn copy_source_is_parsed_for_copies_only() {
    let copy = classify_path(Method::PUT, "/b/k", &[], true);
    assert_eq!(copy.copy_source.unwrap().bucket, "src");
    let mut h = HeaderMap::new();
    h.insert("x-amz-copy-source", "oth%2Fk".parse().unwrap());
    let o = classify(&Method::PUT, Some("b".into()), Some("k".into()), &[], &h).unwrap();
    assert_eq!(o.copy_source.unwrap().bucket, "oth");
    h.insert("x-amz-copy-source", "oth".parse().unwrap());
    assert!(classify(&Method::PUT, Some("b".into()), Some("k".into()), &[], &h).is_err());
    let post = classify(
        &Method::POST,
        Some("b".into()),
        Some("k".into()),
        &[("uploads".into(), "".into())],
        &h,
    )
    .unwrap();
    assert!(post.copy_source.is_none());
}
