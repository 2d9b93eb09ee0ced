//! CopyObject: a record that points at the source's blobs, made in one
//! step that reads the source, checks its `x-amz-copy-source-if-*`
//! conditions and the destination's `If-None-Match` / `If-Match`, and
//! writes the destination, so that neither can change in between. No bytes
//! are copied; the blobs count their references.

use super::conditions::{WriteConditions, precondition_failed};
use super::index::{OBJECTS, ObjectRecord, headers_in};
use super::objects::{current, put_record};
use super::read::ReadConditions;
use super::{Store, check_key, check_version, internal, now_ms, timestamp};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

/// The bucket and key a copy reads; a version other than `null` (or none)
/// is `NoSuchVersion`, as the store keeps one version.
pub(super) fn copy_source(src: &CopySource) -> S3Result<(String, String)> {
    match src {
        CopySource::Bucket {
            bucket,
            key,
            version_id,
        } => {
            check_version(version_id.as_deref())?;
            Ok((bucket.to_string(), key.to_string()))
        }
        _ => Err(s3_error!(NotImplemented, "copies from an access point")),
    }
}

/// A source's conditions against its record.
pub(super) fn source_conditions(
    record: &ObjectRecord,
    if_match: Option<ETagCondition>,
    if_none_match: Option<ETagCondition>,
    if_modified_since: Option<Timestamp>,
    if_unmodified_since: Option<Timestamp>,
) -> S3Result<()> {
    // A copy answers a failed source condition with 412, never 304.
    let c = ReadConditions {
        if_match,
        if_none_match,
        if_modified_since,
        if_unmodified_since,
    };
    let modified = timestamp(record.last_modified_ms);
    c.check(Some(&ETag::Strong(record.etag.clone())), Some(&modified))
        .map_err(|e| match e.code() {
            s3s::S3ErrorCode::NotModified => precondition_failed(),
            _ => e,
        })
}

impl Store {
    pub(super) async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        // s3s does not read a copy's destination conditions: the headers
        // are read here.
        let header = |name: http::header::HeaderName| {
            req.headers
                .get(name)
                .map(|v| ETagCondition::parse_http_header(v.as_bytes()))
                .transpose()
                .map_err(|_| s3_error!(InvalidArgument, "a condition header that does not parse"))
        };
        let cond = WriteConditions {
            if_match: header(http::header::IF_MATCH)?,
            if_none_match: header(http::header::IF_NONE_MATCH)?,
        };
        let mut input = req.input;
        check_key(&input.key)?;
        let (src_bucket, src_key) = copy_source(&input.copy_source)?;
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let new_headers = replace.then(|| headers_in!(input));
        if !replace && src_bucket == input.bucket && src_key == input.key {
            return Err(s3_error!(
                InvalidRequest,
                "copying an object onto itself changes nothing: name a new metadata directive (REPLACE)"
            ));
        }
        let src_cond = (
            input.copy_source_if_match,
            input.copy_source_if_none_match,
            input.copy_source_if_modified_since,
            input.copy_source_if_unmodified_since,
        );
        let (bucket, key) = (input.bucket, input.key);
        let (record, unused) = self
            .commit(move |txn| {
                let objects = txn.open_table(OBJECTS)?;
                let Some(src) = current(&objects, &src_bucket, &src_key)? else {
                    return Ok(Err(s3_error!(NoSuchKey, "the copy source does not exist")));
                };
                drop(objects);
                let (a, b, c, d) = src_cond;
                if let Err(e) = source_conditions(&src, a, b, c, d) {
                    return Ok(Err(e));
                }
                let mut record = src;
                record.upload_id = None;
                record.last_modified_ms = now_ms();
                if let Some(h) = new_headers {
                    record.headers = h;
                }
                let r = put_record(txn, &bucket, &key, &record, &cond)?;
                Ok(r.map(|unused| (record, unused)))
            })
            .await?;
        self.blobs.remove_later(unused);
        let c = &record.checksums;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(record.etag.clone())),
                last_modified: Some(timestamp(record.last_modified_ms)),
                checksum_crc32: c.crc32.clone(),
                checksum_crc32c: c.crc32c.clone(),
                checksum_crc64nvme: c.crc64nvme.clone(),
                checksum_sha1: c.sha1.clone(),
                checksum_sha256: c.sha256.clone(),
                checksum_type: c.kind.clone().map(ChecksumType::from),
            }),
            ..Default::default()
        }))
    }
}

/// (A read of the copy source outside a commit: UploadPartCopy's.)
pub(super) async fn source_record(
    store: &Store,
    bucket: String,
    key: String,
) -> S3Result<ObjectRecord> {
    store
        .in_read_txn(move |txn| {
            let t = txn.open_table(OBJECTS).map_err(internal)?;
            current(&t, &bucket, &key)
                .map_err(internal)?
                .ok_or_else(|| s3_error!(NoSuchKey, "the copy source does not exist"))
        })
        .await
}
