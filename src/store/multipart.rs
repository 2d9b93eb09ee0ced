//! Multipart uploads as AWS does them: parts of at least 5 MiB (the last
//! excepted), at most 10,000, the `<md5 of the parts' md5s>-<N>` ETag,
//! part ETags checked on completion, UploadPartCopy by range. A part is a
//! blob of its own; the completed object points at the parts' blobs in
//! order, so completing copies nothing. Completion is one step: the
//! upload, its parts, the destination's conditions and the object it
//! replaces are all seen and changed at once.

use super::blobs::FreshBlob;
use super::checksums::{check_object, check_part, composite, full_object, upload_type};
use super::conditions::WriteConditions;
use super::copy::{copy_source, source_conditions, source_record};
use super::index::{
    BUCKETS, Checksums, OBJECTS, ObjectRecord, PARTS, PartRecord, UPLOADS, UploadRecord,
    checksums_in, decode, encode, headers_in,
};
use super::objects::put_record;
use super::save::{Saved, declared_in};
use super::{Store, blob_ref, blob_unref, bucket_exists, check_key, internal, now_ms, timestamp};
use redb::{ReadableTable, WriteTransaction};
use s3s::crypto::Checksum as _;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

/// S3's smallest part, the last excepted.
pub const MIN_PART: u64 = 5 << 20;
/// S3's most parts in one upload.
pub const MAX_PARTS: i32 = 10_000;

fn no_such_upload() -> s3s::S3Error {
    s3_error!(
        NoSuchUpload,
        "the multipart upload does not exist (completed or aborted?)"
    )
}

fn check_part_number(n: i32) -> S3Result<u32> {
    if (1..=MAX_PARTS).contains(&n) {
        Ok(n as u32)
    } else {
        Err(s3_error!(
            InvalidArgument,
            "part numbers are 1 to {MAX_PARTS}"
        ))
    }
}

/// The upload `(bucket, key, id)` in `txn`, or `None`.
fn upload_w(
    txn: &WriteTransaction,
    bucket: &str,
    key: &str,
    id: &str,
) -> Result<Option<UploadRecord>, redb::Error> {
    let t = txn.open_table(UPLOADS)?;
    let v = t.get((bucket, key, id))?;
    v.map(|v| decode(v.value()).map_err(redb::Error::Corrupted))
        .transpose()
}

/// Puts part `n` of upload `id` in `txn`; returns the replaced part's
/// blobs nobody uses any more.
fn put_part(
    txn: &WriteTransaction,
    (bucket, key, id): (&str, &str, &str),
    n: u32,
    part: &PartRecord,
) -> Result<S3Result<Vec<u128>>, redb::Error> {
    if upload_w(txn, bucket, key, id)?.is_none() {
        return Ok(Err(no_such_upload()));
    }
    let old: Option<PartRecord> = {
        let mut parts = txn.open_table(PARTS)?;
        let old = parts.insert((id, n), encode(part).as_slice())?;
        match old {
            Some(v) => Some(decode(v.value()).map_err(redb::Error::Corrupted)?),
            None => None,
        }
    };
    blob_ref(txn, part.segment.blob)?;
    let mut unused = Vec::new();
    if let Some(old) = old
        && blob_unref(txn, old.segment.blob)?
    {
        unused.push(old.segment.blob);
    }
    Ok(Ok(unused))
}

/// Removes upload `id` and all its parts; returns the blobs nobody uses.
pub(super) fn drop_upload(
    txn: &WriteTransaction,
    (bucket, key, id): (&str, &str, &str),
) -> Result<Vec<u128>, redb::Error> {
    txn.open_table(UPLOADS)?.remove((bucket, key, id))?;
    let mut parts = txn.open_table(PARTS)?;
    let mut blobs = Vec::new();
    for entry in parts.extract_from_if((id, 0)..=(id, u32::MAX), |_, _| true)? {
        let (_, v) = entry?;
        let p: PartRecord = decode(v.value()).map_err(redb::Error::Corrupted)?;
        blobs.push(p.segment.blob);
    }
    drop(parts);
    let mut unused = Vec::new();
    for b in blobs {
        if blob_unref(txn, b)? {
            unused.push(b);
        }
    }
    Ok(unused)
}

/// The record of a part saved in a blob of its own, and the blob.
fn part_of(saved: Saved) -> (PartRecord, FreshBlob) {
    let part = PartRecord {
        segment: saved.segment(),
        etag: hex::encode(saved.md5),
        last_modified_ms: now_ms(),
        checksums: saved.checksums,
    };
    (part, saved.fresh)
}

/// The ETag of a multipart object: the MD5 of its parts' MD5s, `-N`.
fn multipart_etag(part_etags: &[String]) -> S3Result<String> {
    let mut md5 = s3s::crypto::Md5::new();
    for e in part_etags {
        let raw =
            hex::decode(e).map_err(|_| s3_error!(InvalidPart, "a part's ETag is not an MD5"))?;
        md5.update(&raw);
    }
    let sum: [u8; 16] = md5.finalize();
    Ok(format!("{}-{}", hex::encode(sum), part_etags.len()))
}

impl Store {
    pub(super) async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let mut input = req.input;
        check_key(&input.key)?;
        let id = format!("{:032x}", rand::random::<u128>());
        let algorithm = input.checksum_algorithm.as_ref().map(|a| a.as_str());
        let asked = input.checksum_type.as_ref().map(|t| t.as_str());
        let checksum_type = upload_type(algorithm, asked)?;
        let record = UploadRecord {
            initiated_ms: now_ms(),
            headers: headers_in!(input),
            checksum_algorithm: input
                .checksum_algorithm
                .as_ref()
                .map(|a| a.as_str().to_string()),
            checksum_type: checksum_type.clone(),
        };
        let (bucket, key, upload) = (input.bucket.clone(), input.key.clone(), id.clone());
        self.commit(move |txn| {
            if let Err(e) = bucket_exists(&txn.open_table(BUCKETS)?, &bucket)? {
                return Ok(Err(e));
            }
            let mut t = txn.open_table(UPLOADS)?;
            t.insert(
                (bucket.as_str(), key.as_str(), upload.as_str()),
                encode(&record).as_slice(),
            )?;
            Ok(Ok(()))
        })
        .await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            checksum_algorithm: input.checksum_algorithm,
            checksum_type: checksum_type.map(ChecksumType::from),
            ..Default::default()
        }))
    }

    /// The upload `(bucket, key, id)`, or `NoSuchUpload`.
    async fn upload(&self, bucket: &str, key: &str, id: &str) -> S3Result<UploadRecord> {
        let (b, k, i) = (bucket.to_string(), key.to_string(), id.to_string());
        self.in_read_txn(move |txn| {
            let t = txn.open_table(UPLOADS).map_err(internal)?;
            let v = t
                .get((b.as_str(), k.as_str(), i.as_str()))
                .map_err(internal)?;
            let v = v.ok_or_else(no_such_upload)?;
            decode(v.value()).map_err(internal)
        })
        .await
    }

    /// Commits part `n` of an upload, in the blob `fresh` this request
    /// wrote.
    async fn commit_part(
        &self,
        (bucket, key, id): (String, String, String),
        n: u32,
        part: PartRecord,
        fresh: FreshBlob,
    ) -> S3Result<()> {
        debug_assert_eq!(part.segment.blob, fresh.id());
        let unused = self
            .commit_fresh(fresh, move |txn| {
                put_part(txn, (&bucket, &key, &id), n, &part)
            })
            .await?;
        self.blobs.remove_later(unused);
        Ok(())
    }

    pub(super) async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let mut input = req.input;
        let n = check_part_number(input.part_number)?;
        let upload = self
            .upload(&input.bucket, &input.key, &input.upload_id)
            .await?;
        let body = input.body.take().ok_or_else(|| s3_error!(IncompleteBody))?;
        let declared = declared_in!(req, input);
        // Hashed with the upload's algorithm too, for the object's checksum.
        let also = upload.checksum_algorithm;
        let saved = self.save_body(body, Some(declared), also).await?;
        let (part, fresh) = part_of(saved);
        let sums = part.checksums.clone();
        let etag = part.etag.clone();
        let upload = (input.bucket, input.key, input.upload_id);
        self.commit_part(upload, n, part, fresh).await?;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(etag)),
            checksum_crc32: sums.crc32,
            checksum_crc32c: sums.crc32c,
            checksum_crc64nvme: sums.crc64nvme,
            checksum_sha1: sums.sha1,
            checksum_sha256: sums.sha256,
            ..Default::default()
        }))
    }

    pub(super) async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let input = req.input;
        let n = check_part_number(input.part_number)?;
        let upload = self
            .upload(&input.bucket, &input.key, &input.upload_id)
            .await?;
        let (src_bucket, src_key) = copy_source(&input.copy_source)?;
        let src = source_record(self, src_bucket, src_key).await?;
        source_conditions(
            &src,
            input.copy_source_if_match,
            input.copy_source_if_none_match,
            input.copy_source_if_modified_since,
            input.copy_source_if_unmodified_since,
        )?;
        let range = match input.copy_source_range.as_deref() {
            None => 0..src.size,
            Some(r) => copy_range(r, src.size)?,
        };
        // The bytes are copied into a blob of the part's own: its ETag is
        // their MD5, as S3 gives it.
        let reading = self.blobs.hold_for_read(src.blobs().collect());
        let bytes = self.blobs.stream_range(src.spans(), range.start, range.end);
        let also = upload.checksum_algorithm;
        let saved = self.save_body(bytes, None, also).await?;
        drop(reading);
        let (part, fresh) = part_of(saved);
        let (etag, modified) = (part.etag.clone(), part.last_modified_ms);
        let upload = (input.bucket, input.key, input.upload_id);
        self.commit_part(upload, n, part, fresh).await?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(etag)),
                last_modified: Some(timestamp(modified)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    pub(super) async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let mut input = req.input;
        let listed: Vec<Listed> = input
            .multipart_upload
            .take()
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|mut p| {
                let n = p.part_number.unwrap_or(0);
                let etag = p.e_tag.take().map(|e| e.into_value()).unwrap_or_default();
                (n, etag, checksums_in!(p))
            })
            .collect();
        let declared = checksums_in!(input);
        if listed.is_empty() {
            return Err(s3_error!(
                MalformedXML,
                "CompleteMultipartUpload lists no part"
            ));
        }
        if listed.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(s3_error!(
                InvalidPartOrder,
                "parts must be listed in ascending order"
            ));
        }
        let cond = WriteConditions {
            if_match: input.if_match,
            if_none_match: input.if_none_match,
        };
        let (bucket, key, id) = (
            input.bucket.clone(),
            input.key.clone(),
            input.upload_id.clone(),
        );
        let (record, unused) = self
            .commit(move |txn| complete_step(txn, (&bucket, &key, &id), &listed, &declared, &cond))
            .await?;
        self.blobs.remove_later(unused);
        let c = &record.checksums;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(ETag::Strong(record.etag.clone())),
            checksum_crc32: c.crc32.clone(),
            checksum_crc32c: c.crc32c.clone(),
            checksum_crc64nvme: c.crc64nvme.clone(),
            checksum_sha1: c.sha1.clone(),
            checksum_sha256: c.sha256.clone(),
            checksum_type: c.kind.clone().map(ChecksumType::from),
            ..Default::default()
        }))
    }

    pub(super) async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        let unused = self
            .commit(move |txn| {
                let upload = (
                    input.bucket.as_str(),
                    input.key.as_str(),
                    input.upload_id.as_str(),
                );
                if upload_w(txn, upload.0, upload.1, upload.2)?.is_none() {
                    return Ok(Err(no_such_upload()));
                }
                Ok(Ok(drop_upload(txn, upload)?))
            })
            .await?;
        self.blobs.remove_later(unused);
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }
}

/// A multipart object's checksums, as its upload asked: the CRC of the
/// whole object, or the composite of its parts'.
fn checksums_of(up: &UploadRecord, parts: &[PartRecord]) -> Result<Checksums, redb::Error> {
    if up.checksum_type.as_deref() != Some(ChecksumType::FULL_OBJECT) {
        return Ok(composite(
            &parts.iter().map(|p| &p.checksums).collect::<Vec<_>>(),
        ));
    }
    let sums: Vec<_> = parts
        .iter()
        .map(|p| (&p.checksums, p.segment.len))
        .collect();
    let algorithm = up.checksum_algorithm.as_deref().unwrap_or_default();
    // Every part was hashed with the upload's algorithm as it was written.
    full_object(&sums, algorithm)
        .ok_or_else(|| redb::Error::Corrupted(format!("a part of upload has no {algorithm}")))
}

/// A completed object, and the blobs nobody uses any more.
type Completed = (ObjectRecord, Vec<u128>);

/// A part as a completion lists it: number, ETag, declared checksums.
type Listed = (i32, String, Checksums);

/// The one step of a completion (see the module doc): the object record,
/// and the blobs nobody uses any more.
fn complete_step(
    txn: &WriteTransaction,
    upload: (&str, &str, &str),
    listed: &[Listed],
    declared: &Checksums,
    cond: &WriteConditions,
) -> super::commit::Applied<S3Result<Completed>> {
    let (bucket, key, id) = upload;
    let refused = |e| Ok(Err(e));
    let Some(up) = upload_w(txn, bucket, key, id)? else {
        // A retry of a completion that went through: its answer again,
        // while the object is still the one it made.
        let objects = txn.open_table(OBJECTS)?;
        return match super::objects::current(&objects, bucket, key)? {
            Some(done) if done.upload_id.as_deref() == Some(id) => Ok(Ok((done, vec![]))),
            _ => refused(no_such_upload()),
        };
    };
    let mut parts = Vec::new();
    {
        let t = txn.open_table(PARTS)?;
        for (n, etag, sums) in listed {
            let got = match u32::try_from(*n) {
                Ok(n) => t.get((id, n))?,
                Err(_) => None,
            };
            let Some(got) = got else {
                return refused(s3_error!(InvalidPart, "part {n} was not uploaded"));
            };
            let p: PartRecord = decode(got.value()).map_err(redb::Error::Corrupted)?;
            if super::unquote(etag) != p.etag {
                return refused(s3_error!(
                    InvalidPart,
                    "part {n}'s ETag is not the one listed"
                ));
            }
            if let Err(e) = check_part(*n, sums, &p.checksums) {
                return refused(e);
            }
            parts.push(p);
        }
    }
    let last = parts.len() - 1;
    if let Some(i) = parts[..last].iter().position(|p| p.segment.len < MIN_PART) {
        return refused(s3_error!(
            EntityTooSmall,
            "part {} is {} bytes; every part but the last must be at least 5 MiB",
            listed[i].0,
            parts[i].segment.len
        ));
    }
    let etags: Vec<String> = parts.iter().map(|p| p.etag.clone()).collect();
    let etag = match multipart_etag(&etags) {
        Ok(e) => e,
        Err(e) => return refused(e),
    };
    let checksums = checksums_of(&up, &parts)?;
    let record = ObjectRecord {
        segments: parts.iter().map(|p| p.segment.clone()).collect(),
        size: parts.iter().map(|p| p.segment.len).sum(),
        etag,
        last_modified_ms: now_ms(),
        headers: up.headers,
        checksums,
        parts: parts.iter().map(|p| p.segment.len).collect(),
        upload_id: Some(id.to_string()),
    };
    if let Err(e) = check_object(declared, &record.checksums, parts.len()) {
        return refused(e);
    }
    let mut unused = match put_record(txn, bucket, key, &record, cond)? {
        Ok(u) => u,
        Err(e) => return refused(e),
    };
    unused.extend(drop_upload(txn, upload)?);
    Ok(Ok((record, unused)))
}

/// `bytes=a-b` of a copy source of `size` bytes.
fn copy_range(r: &str, size: u64) -> S3Result<std::ops::Range<u64>> {
    let bad = || {
        s3_error!(
            InvalidArgument,
            "x-amz-copy-source-range must be bytes=first-last within the source"
        )
    };
    let (a, b) = r
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .ok_or_else(bad)?;
    let a: u64 = a.parse().map_err(|_| bad())?;
    let b: u64 = b.parse().map_err(|_| bad())?;
    if a > b || b >= size {
        return Err(s3_error!(
            InvalidRange,
            "the copy range {r} is not within the source's {size} bytes"
        ));
    }
    Ok(a..b + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_etags_and_ranges_as_s3_makes_them() {
        // Two parts of "a" and "b": md5(md5("a") ++ md5("b")) and "-2".
        let a = "0cc175b9c0f1b6a831c399e269772661".to_string();
        let b = "92eb5ffee6ae2fec3ad71c777531578f".to_string();
        let e = multipart_etag(&[a, b]).unwrap();
        assert!(e.ends_with("-2") && e.len() == 34, "{e}");
        assert_eq!(copy_range("bytes=0-9", 10).unwrap(), 0..10);
        assert!(copy_range("bytes=5-10", 10).is_err());
        assert!(copy_range("0-1", 10).is_err());
    }
}
