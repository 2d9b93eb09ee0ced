//! Objects: PutObject, GetObject, HeadObject, DeleteObject, DeleteObjects
//! and CopyObject.
//!
//! A write streams its body into a new blob, checks the digests the
//! request declared (Content-MD5, `x-amz-checksum-*` in headers or
//! trailers), and only then commits the record, in one step that also
//! checks the request's conditions and that the bucket still exists. A
//! copy is a record that points at the source's blobs (read in the same
//! step, so the source cannot go away in between): no bytes are copied.

use super::blobs::{self, WriteError};
use super::conditions::WriteConditions;
use super::index::{
    BUCKETS, Checksums, OBJECTS, ObjectRecord, Segment, checksums_in, decode, encode, headers_in,
};
use super::{Store, blob_ref, blob_unref, bucket_exists, check_key, full, internal, now_ms};
use redb::{ReadableTable, WriteTransaction};
use s3s::crypto::Checksum as _;
use s3s::dto::*;
use s3s::{S3Error, S3Request, S3Response, S3Result, s3_error};

/// The body's digests, computed as it streams.
pub(super) struct Hashes {
    md5: s3s::crypto::Md5,
    sums: s3s::checksum::ChecksumHasher,
}

/// The checksum algorithms a request declares: its `x-amz-checksum-*`
/// headers, its `x-amz-sdk-checksum-algorithm`, and the trailers it names.
pub(super) fn declared_algorithms(
    algorithm: Option<&ChecksumAlgorithm>,
    given: &Checksums,
    headers: &http::HeaderMap,
) -> Vec<String> {
    let mut names: Vec<String> = algorithm
        .map(|a| a.as_str().to_string())
        .into_iter()
        .collect();
    for (name, v) in [
        ("CRC32", &given.crc32),
        ("CRC32C", &given.crc32c),
        ("CRC64NVME", &given.crc64nvme),
        ("SHA1", &given.sha1),
        ("SHA256", &given.sha256),
    ] {
        if v.is_some() {
            names.push(name.to_string());
        }
    }
    for t in headers
        .get_all("x-amz-trailer")
        .iter()
        .filter_map(|v| v.to_str().ok())
    {
        for t in t.split(',') {
            if let Some(a) = t
                .trim()
                .to_ascii_lowercase()
                .strip_prefix("x-amz-checksum-")
            {
                names.push(a.to_ascii_uppercase());
            }
        }
    }
    names.sort();
    names.dedup();
    names
}

impl Hashes {
    pub(super) fn new(algorithms: &[String]) -> S3Result<Hashes> {
        let mut sums = s3s::checksum::ChecksumHasher::default();
        for a in algorithms {
            match a.as_str() {
                ChecksumAlgorithm::CRC32 => sums.crc32 = Some(Default::default()),
                ChecksumAlgorithm::CRC32C => sums.crc32c = Some(Default::default()),
                ChecksumAlgorithm::CRC64NVME => sums.crc64nvme = Some(Default::default()),
                ChecksumAlgorithm::SHA1 => sums.sha1 = Some(Default::default()),
                ChecksumAlgorithm::SHA256 => sums.sha256 = Some(Default::default()),
                other => {
                    return Err(s3_error!(
                        InvalidRequest,
                        "unknown checksum algorithm {other}"
                    ));
                }
            }
        }
        Ok(Hashes {
            md5: s3s::crypto::Md5::new(),
            sums,
        })
    }

    pub(super) fn update(&mut self, piece: &[u8]) {
        self.md5.update(piece);
        self.sums.update(piece);
    }

    /// The MD5 (raw) and the checksums.
    pub(super) fn finish(self) -> ([u8; 16], Checksums) {
        let md5: [u8; 16] = self.md5.finalize();
        let mut s = self.sums.finalize();
        let sums = checksums_in!(s);
        (md5, sums)
    }
}

/// Checks a body's digests against what its request declared; the
/// trailers (`aws-chunked`) add theirs to the headers'.
pub(super) fn verify(
    content_md5: Option<&str>,
    md5: &[u8; 16],
    declared: &Checksums,
    trailers: Option<&http::HeaderMap>,
    computed: &Checksums,
) -> S3Result<()> {
    if let Some(want) = content_md5 {
        let want = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, want.trim())
            .map_err(|_| s3_error!(InvalidDigest, "Content-MD5 is not base64"))?;
        if want != md5 {
            return Err(s3_error!(
                BadDigest,
                "the body does not match its Content-MD5"
            ));
        }
    }
    let trailer = |name: &str| {
        trailers
            .and_then(|t| t.get(name))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    for (name, given, got) in [
        ("crc32", &declared.crc32, &computed.crc32),
        ("crc32c", &declared.crc32c, &computed.crc32c),
        ("crc64nvme", &declared.crc64nvme, &computed.crc64nvme),
        ("sha1", &declared.sha1, &computed.sha1),
        ("sha256", &declared.sha256, &computed.sha256),
    ] {
        let want = given
            .clone()
            .or_else(|| trailer(&format!("x-amz-checksum-{name}")));
        if let Some(want) = want
            && Some(&want) != got.as_ref()
        {
            return Err(s3_error!(
                BadDigest,
                "the body does not match its x-amz-checksum-{name}"
            ));
        }
    }
    Ok(())
}

/// A body write's error as S3 answers it.
pub(super) fn write_error(e: WriteError) -> S3Error {
    match e {
        WriteError::Body(e) => s3_error!(IncompleteBody, "the request body broke off: {e}"),
        WriteError::Full(e) => full(e),
        WriteError::Io(e) => internal(e),
    }
}

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
        let trailers = req.trailing_headers.clone();
        let mut input = req.input;
        check_key(&input.key)?;
        let bucket = input.bucket.clone();
        self.bucket_must_exist(bucket).await?;
        let body = input.body.take().ok_or_else(|| s3_error!(IncompleteBody))?;
        let declared = checksums_in!(input);
        let algorithms =
            declared_algorithms(input.checksum_algorithm.as_ref(), &declared, &req.headers);
        let mut hashes = Hashes::new(&algorithms)?;
        let id = blobs::new_id();
        let size = self
            .blobs
            .write(id, body, |p| hashes.update(p))
            .await
            .map_err(write_error)?;
        let (md5, mut sums) = hashes.finish();
        let trailers = trailers.and_then(|t| t.take());
        if let Err(e) = verify(
            input.content_md5.as_deref(),
            &md5,
            &declared,
            trailers.as_ref(),
            &sums,
        ) {
            self.blobs.remove(id);
            return Err(e);
        }
        sums.kind = Some(ChecksumType::FULL_OBJECT.to_string());
        let record = ObjectRecord {
            segments: vec![Segment {
                blob: id,
                offset: 0,
                len: size,
            }],
            size,
            etag: hex::encode(md5),
            last_modified_ms: now_ms(),
            headers: headers_in!(input),
            checksums: sums,
            parts: Vec::new(),
            upload_id: None,
        };
        let cond = WriteConditions {
            if_match: input.if_match,
            if_none_match: input.if_none_match,
        };
        let stored = self
            .store_record(input.bucket, input.key, record, cond, vec![id])
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

    /// Commits `record` at `(bucket, key)` under `cond`. `fresh` are the
    /// blobs this request wrote: removed if the record is refused.
    pub(super) async fn store_record(
        &self,
        bucket: String,
        key: String,
        record: ObjectRecord,
        cond: WriteConditions,
        fresh: Vec<u128>,
    ) -> S3Result<ObjectRecord> {
        let step_record = record.clone();
        let new = fresh.clone();
        let result = self
            .commit(move |txn| {
                let r = put_record(txn, &bucket, &key, &step_record, &cond)?;
                Ok((r, new))
            })
            .await;
        match result {
            Ok(unused) => {
                self.blobs.remove_later(unused);
                Ok(record)
            }
            Err(e) => {
                for id in fresh {
                    self.blobs.remove(id);
                }
                Err(e)
            }
        }
    }
}

/// The record at `(bucket, key)` as `txn` sees it, or `NoSuchKey`
/// (`NoSuchBucket`).
pub(super) fn object_in(
    txn: &redb::ReadTransaction,
    bucket: &str,
    key: &str,
) -> S3Result<ObjectRecord> {
    let buckets = txn.open_table(BUCKETS).map_err(internal)?;
    bucket_exists(&buckets, bucket).map_err(internal)??;
    let t = txn.open_table(OBJECTS).map_err(internal)?;
    current(&t, bucket, key)
        .map_err(internal)?
        .ok_or_else(|| s3_error!(NoSuchKey, "the key does not exist"))
}

/// Only the one version an unversioned bucket has: `null`.
pub(super) fn check_version(v: Option<&str>) -> S3Result<()> {
    match v {
        None | Some("null") => Ok(()),
        Some(_) => Err(s3_error!(
            NoSuchVersion,
            "this store keeps one version per key, `null`"
        )),
    }
}
