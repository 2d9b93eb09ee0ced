//! Objects: PutObject, and the object record every write of one commits
//! and every read of one starts from.
//!
//! A PUT saves its body in a new blob, checked against the digests the
//! request declared (`save.rs`), and only then commits the record. `put_record`
//! is the step that puts a record, a PUT's, a copy's (`copy.rs`) or a
//! completed upload's (`multipart.rs`): it checks that the bucket still
//! exists and that the request's conditions hold (`conditions.rs`), puts
//! the record and counts the references of its blobs. `current` and
//! `object_in` read the record at a key, in a step or in a read.

use super::blobs::FreshBlob;
use super::conditions::WriteConditions;
use super::index::{BUCKETS, OBJECTS, ObjectRecord, decode, encode, headers_in};
use super::save::declared_in;
use super::{Store, blob_ref, blob_unref, bucket_exists, check_key, internal, now_ms};
use redb::{ReadableTable, WriteTransaction};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

/// The record at `(bucket, key)` in `txn`'s view.
pub(super) fn current(
    t: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    bucket: &str,
    key: &str,
) -> Result<Option<ObjectRecord>, redb::Error> {
    match t.get((bucket, key))? {
        Some(v) => decode(v.value()).map(Some).map_err(redb::Error::Corrupted),
        None => Ok(None),
    }
}

/// Puts `record` at `(bucket, key)` in `txn` if the bucket exists and
/// `cond` holds; returns the blobs nobody uses any more, or the refusal.
pub(super) fn put_record(
    txn: &WriteTransaction,
    bucket: &str,
    key: &str,
    record: &ObjectRecord,
    cond: &WriteConditions,
) -> Result<S3Result<Vec<u128>>, redb::Error> {
    if let Err(e) = bucket_exists(&txn.open_table(BUCKETS)?, bucket)? {
        return Ok(Err(e));
    }
    let mut objects = txn.open_table(OBJECTS)?;
    let old = current(&objects, bucket, key)?;
    if let Err(e) = cond.check(old.as_ref()) {
        return Ok(Err(e));
    }
    objects.insert((bucket, key), encode(record).as_slice())?;
    drop(objects);
    for b in record.blobs() {
        blob_ref(txn, b)?;
    }
    let mut unused = Vec::new();
    for b in old.iter().flat_map(ObjectRecord::blobs) {
        if blob_unref(txn, b)? {
            unused.push(b);
        }
    }
    Ok(Ok(unused))
}

impl Store {
    pub(super) async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let mut input = req.input;
        check_key(&input.key)?;
        let bucket = input.bucket.clone();
        self.bucket_must_exist(bucket).await?;
        let body = input.body.take().ok_or_else(|| s3_error!(IncompleteBody))?;
        let declared = declared_in!(req, input);
        let mut saved = self.save_body(body, Some(declared), None).await?;
        saved.checksums.kind = Some(ChecksumType::FULL_OBJECT.to_string());
        let record = ObjectRecord {
            segments: vec![saved.segment()],
            size: saved.size,
            etag: hex::encode(saved.md5),
            last_modified_ms: now_ms(),
            headers: headers_in!(input),
            checksums: saved.checksums,
            parts: Vec::new(),
            upload_id: None,
        };
        let cond = WriteConditions {
            if_match: input.if_match,
            if_none_match: input.if_none_match,
        };
        let stored = self
            .store_record(input.bucket, input.key, record, cond, saved.fresh)
            .await?;
        let c = &stored.checksums;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(ETag::Strong(stored.etag.clone())),
            checksum_crc32: c.crc32.clone(),
            checksum_crc32c: c.crc32c.clone(),
            checksum_crc64nvme: c.crc64nvme.clone(),
            checksum_sha1: c.sha1.clone(),
            checksum_sha256: c.sha256.clone(),
            checksum_type: c.kind.clone().map(ChecksumType::from),
            ..Default::default()
        }))
    }

    /// Commits `record` at `(bucket, key)` under `cond`; `fresh` is the
    /// blob this request wrote for it.
    async fn store_record(
        &self,
        bucket: String,
        key: String,
        record: ObjectRecord,
        cond: WriteConditions,
        fresh: FreshBlob,
    ) -> S3Result<ObjectRecord> {
        let step_record = record.clone();
        let unused = self
            .commit_fresh(fresh, move |txn| {
                put_record(txn, &bucket, &key, &step_record, &cond)
            })
            .await?;
        self.blobs.remove_later(unused);
        Ok(record)
    }
}

/// The record at `(bucket, key)` as `txn` sees it, or `NoSuchKey`
/// (`NoSuchBucket`).
pub(super) fn object_in(
    txn: &redb::ReadTransaction,
    bucket: &str,
    key: &str,
) -> S3Result<ObjectRecord> {
    // The object first: a bucket is removed only when it holds no object
    // (`delete_bucket`, in one transaction), so a record found here proves
    // its bucket, and the bucket's table is read only to tell a miss's
    // `NoSuchBucket` from its `NoSuchKey`.
    let t = txn.open_table(OBJECTS).map_err(internal)?;
    if let Some(record) = current(&t, bucket, key).map_err(internal)? {
        return Ok(record);
    }
    let buckets = txn.open_table(BUCKETS).map_err(internal)?;
    bucket_exists(&buckets, bucket).map_err(internal)??;
    Err(s3_error!(NoSuchKey, "the key does not exist"))
}
