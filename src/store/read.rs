//! Reads: GetObject and HeadObject, their byte ranges and part numbers,
//! and their conditions (`If-Match`, `If-None-Match`,
//! `If-Modified-Since`, `If-Unmodified-Since`), evaluated as S3 does. They
//! matter beyond caches: the SDKs' transfer managers (boto3's s3transfer,
//! the Java, Ruby, C++ and Rust ones) download a large object in ranged
//! GETs with `If-Match` on its ETag, so that an object replaced midway (a
//! fenced writer's new version) fails the download with 412 instead of
//! leaving a file made of two versions.
//!
//! A failed `If-Match` (or, without one, a modification after
//! `If-Unmodified-Since`) is `412 PreconditionFailed`; then a matching
//! `If-None-Match` (or, without one, no modification after
//! `If-Modified-Since`) is `304 Not Modified`. Times compare in whole
//! seconds, the precision of the HTTP dates clients send back.

use super::blobs::Blobs;
use super::index::ObjectRecord;
use super::objects::object_in;
use super::{Store, check_version, internal, timestamp};
use redb::ReadTransaction;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

/// A GET's or HEAD's conditions.
pub struct ReadConditions {
    pub if_match: Option<ETagCondition>,
    pub if_none_match: Option<ETagCondition>,
    pub if_modified_since: Option<Timestamp>,
    pub if_unmodified_since: Option<Timestamp>,
}

fn seconds(t: &Timestamp) -> i64 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp()
}

impl ReadConditions {
    /// Whether the object with `etag`, last modified at `modified`, may be
    /// answered; else the 412 or 304 to answer instead.
    pub fn check(&self, etag: Option<&ETag>, modified: Option<&Timestamp>) -> S3Result<()> {
        let etag_is = |c: &ETagCondition, weak: bool| match c {
            ETagCondition::Any => etag.is_some(),
            ETagCondition::ETag(want) if weak => etag.is_some_and(|e| e.weak_cmp(want)),
            ETagCondition::ETag(want) => etag.is_some_and(|e| e.strong_cmp(want)),
        };
        let modified_after = |t: &Timestamp| modified.is_some_and(|m| seconds(m) > seconds(t));
        let unchanged_since = |t: &Timestamp| modified.is_some_and(|m| seconds(m) <= seconds(t));

        let failed = match (&self.if_match, &self.if_unmodified_since) {
            (Some(c), _) => !etag_is(c, false),
            (None, Some(t)) => modified_after(t),
            (None, None) => false,
        };
        if failed {
            return Err(S3Error::with_message(
                S3ErrorCode::PreconditionFailed,
                "at least one of the preconditions you specified did not hold",
            ));
        }
        let not_modified = match (&self.if_none_match, &self.if_modified_since) {
            (Some(c), _) => etag_is(c, true),
            (None, Some(t)) => unchanged_since(t),
            (None, None) => false,
        };
        if not_modified {
            let mut e = S3Error::new(S3ErrorCode::NotModified);
            if let Some(v) =
                etag.and_then(|e| http::HeaderValue::from_str(&format!("\"{}\"", e.value())).ok())
            {
                let mut headers = http::HeaderMap::new();
                headers.insert(http::header::ETAG, v);
                e.set_headers(headers);
            }
            return Err(e);
        }
        Ok(())
    }
}

/// The most bytes a GET reads in the same trip off the async threads as
/// its record: one hand-off to the blocking pool for a small object, where
/// streaming it costs one for the index and one for each of opening,
/// seeking and reading the file.
const READ_WITH_RECORD: u64 = 256 * 1024;

/// The most bytes a GET reads on the async thread itself, with its
/// record (`Store::in_read_txn_here`): a few pages from the page cache,
/// cheaper than the hop to a blocking thread and back.
const READ_HERE: u64 = 16 * 1024;

/// The record `asked` names, once its conditions passed, and its bytes
/// when there are at most `limit` of them (none without a limit). Its
/// blobs are held while read, as a streamed read holds them.
fn pick(
    txn: &ReadTransaction,
    asked: &Asked,
    limit: Option<u64>,
    blobs: &Blobs,
    checksums_wanted: bool,
) -> Result<Selected, S3Error> {
    let record = object_in(txn, &asked.bucket, &asked.key)?;
    let modified = timestamp(record.last_modified_ms);
    let etag = ETag::Strong(record.etag.clone());
    asked.conditions.check(Some(&etag), Some(&modified))?;
    let bytes = byte_range(&record, asked.range.as_ref(), asked.part)?;
    let (start, end) = (bytes.range.start, bytes.range.end);
    let read = match limit.is_some_and(|l| end - start <= l) {
        true => {
            let _reading = blobs.hold_for_read(record.blobs().collect());
            let read = blobs.read_now(record.spans(), start, end);
            Some(read.map_err(internal)?)
        }
        false => None,
    };
    Ok(Selected {
        checksums: bytes.checksums && checksums_wanted,
        record,
        bytes,
        read,
    })
}

/// What a GET or HEAD reads: the record, once its version and conditions
/// have passed, the bytes asked for, and those bytes themselves when they
/// were small enough to read with the record.
struct Selected {
    record: ObjectRecord,
    bytes: Bytes,
    read: Option<bytes::Bytes>,
    /// The object's checksums go with the answer: all of it was read, and
    /// the request asked for them (`x-amz-checksum-mode: ENABLED`).
    checksums: bool,
}

impl Selected {
    fn content_length(&self) -> i64 {
        (self.bytes.range.end - self.bytes.range.start) as i64
    }

    /// `Content-Range` (and with it `206`) for every read of a range or a
    /// part, also one that covers the whole object, as S3 answers.
    fn content_range(&self) -> Option<String> {
        let r = &self.bytes.range;
        self.bytes
            .partial
            .then(|| format!("bytes {}-{}/{}", r.start, r.end - 1, self.record.size))
    }
}

/// What a GET and a HEAD ask alike: the object, the conditions, the
/// bytes, and whether the checksums may go with them.
struct Asked {
    bucket: String,
    key: String,
    version: Option<String>,
    conditions: ReadConditions,
    range: Option<Range>,
    part: Option<i32>,
    checksum_mode: Option<ChecksumMode>,
}

/// `Asked` out of GetObject's and HeadObject's inputs, whose fields are
/// named alike.
macro_rules! asked_from {
    ($($input:ty),*) => {$(
        impl From<$input> for Asked {
            fn from(i: $input) -> Asked {
                Asked {
                    bucket: i.bucket,
                    key: i.key,
                    version: i.version_id,
                    conditions: ReadConditions {
                        if_match: i.if_match,
                        if_none_match: i.if_none_match,
                        if_modified_since: i.if_modified_since,
                        if_unmodified_since: i.if_unmodified_since,
                    },
                    range: i.range,
                    part: i.part_number,
                    checksum_mode: i.checksum_mode,
                }
            }
        }
    )*};
}
asked_from!(GetObjectInput, HeadObjectInput);

impl Store {
    /// The one way GET and HEAD pick what they read: the version (only
    /// `null`), the object, its conditions, the range or part; with `read`,
    /// the bytes too when they are few. Looked up on this thread, reading
    /// at most [`READ_HERE`] bytes there; a larger small read (up to
    /// `READ_WITH_RECORD`) is looked up again, and read, on a blocking
    /// thread (its blobs are held inside the read transaction that found
    /// them, as every read's are: a second lookup of a few microseconds,
    /// against a read of 16 KiB or more).
    async fn select(&self, asked: Asked, read: bool) -> S3Result<Selected> {
        check_version(asked.version.as_deref())?;
        let checksums = checksum_wanted(asked.checksum_mode.as_ref());
        let limit = read.then_some(READ_HERE);
        let here = self.in_read_txn_here(|txn| pick(txn, &asked, limit, &self.blobs, checksums));
        let limit = read.then_some(READ_WITH_RECORD);
        let Some(sel) = here else {
            return self.pick_off_thread(asked, limit, checksums).await;
        };
        let sel = sel?;
        let len = sel.bytes.range.end - sel.bytes.range.start;
        if !read || sel.read.is_some() || len > READ_WITH_RECORD {
            return Ok(sel);
        }
        self.pick_off_thread(asked, limit, checksums).await
    }

    /// [`pick`] on a blocking thread.
    async fn pick_off_thread(
        &self,
        asked: Asked,
        limit: Option<u64>,
        checksums: bool,
    ) -> S3Result<Selected> {
        let blobs = self.blobs.clone();
        self.in_read_txn(move |txn| pick(txn, &asked, limit, &blobs, checksums))
            .await
    }

    pub(super) async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        self.read(req.input.into(), true).await.map(S3Response::new)
    }

    pub(super) async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let got = self.read(req.input.into(), false).await?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: got.content_length,
            content_range: got.content_range,
            accept_ranges: got.accept_ranges,
            e_tag: got.e_tag,
            last_modified: got.last_modified,
            content_type: got.content_type,
            content_encoding: got.content_encoding,
            content_disposition: got.content_disposition,
            content_language: got.content_language,
            cache_control: got.cache_control,
            expires: got.expires,
            website_redirect_location: got.website_redirect_location,
            metadata: got.metadata,
            parts_count: got.parts_count,
            checksum_crc32: got.checksum_crc32,
            checksum_crc32c: got.checksum_crc32c,
            checksum_crc64nvme: got.checksum_crc64nvme,
            checksum_sha1: got.checksum_sha1,
            checksum_sha256: got.checksum_sha256,
            checksum_type: got.checksum_type,
            ..Default::default()
        }))
    }

    /// A plain read of `bucket`/`key`, all of it, with nothing else asked
    /// (no condition, range, part, version or checksum mode): what
    /// GetObject answers, without its body for a HEAD (`body` false). The
    /// embedded store's callers answer it without s3s
    /// (`upstream/plain_read.rs`).
    pub async fn plain_read(
        &self,
        bucket: &str,
        key: &str,
        body: bool,
    ) -> S3Result<GetObjectOutput> {
        let asked = Asked {
            bucket: bucket.into(),
            key: key.into(),
            version: None,
            conditions: ReadConditions {
                if_match: None,
                if_none_match: None,
                if_modified_since: None,
                if_unmodified_since: None,
            },
            range: None,
            part: None,
            checksum_mode: None,
        };
        self.read(asked, body).await
    }

    /// GetObject's output for `asked`, the one every read is answered from;
    /// without `body` (a HEAD) nothing is read but the record.
    async fn read(&self, asked: Asked, body: bool) -> S3Result<GetObjectOutput> {
        let sel = self.select(asked, body).await?;
        let record = &sel.record;
        let body = body.then(|| match &sel.read {
            Some(read) => StreamingBlob::from(s3s::Body::from(read.clone())),
            None => {
                let reading = self.blobs.hold_for_read(record.blobs().collect());
                let (start, end) = (sel.bytes.range.start, sel.bytes.range.end);
                let stream = (self.blobs).stream_range(record.spans(), start, end);
                StreamingBlob::wrap(futures_util::StreamExt::map(stream, move |piece| {
                    let _still_reading = &reading;
                    piece
                }))
            }
        });
        let mut out = GetObjectOutput {
            body,
            content_length: Some(sel.content_length()),
            content_range: sel.content_range(),
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        };
        describe(record, &mut out, sel.checksums);
        Ok(out)
    }
}

fn checksum_wanted(mode: Option<&ChecksumMode>) -> bool {
    mode.is_some_and(|m| m.as_str().eq_ignore_ascii_case(ChecksumMode::ENABLED))
}

/// The bytes a read picks, and how it is answered.
#[derive(Debug, PartialEq)]
struct Bytes {
    range: std::ops::Range<u64>,
    /// Answered `206` with `Content-Range`: every satisfiable `Range`, and
    /// every `partNumber` of a part that has bytes.
    partial: bool,
    /// The object's checksums may go with it: no `Range`, and all of it.
    checksums: bool,
}

/// The bytes a read asks for (a `Range`, or a part of a multipart
/// object), as S3 answers them:
/// - a `Range` that starts inside the object is `206`, clamped to its end,
///   even when it covers all of it (object_store, and with it delta-rs and
///   SlateDB, refuse a `200` to a ranged read);
/// - one that starts at or past the end, or any int range of an empty
///   object, is `416` with `Content-Range: bytes */SIZE`;
/// - a suffix range of an empty object is `200` and no bytes, as S3
///   answers it;
/// - `partNumber` is a range over that part (`206`, S3 answers so also for
///   part 1 of an object uploaded whole), unless the part is empty.
///
/// A malformed `Range` never gets here: s3s refuses it, and fencegate drops
/// it before forwarding (S3 ignores it), so through fencegate it is `200`.
fn byte_range(record: &ObjectRecord, range: Option<&Range>, part: Option<i32>) -> S3Result<Bytes> {
    let size = record.size;
    if let Some(n) = part {
        if range.is_some() {
            return Err(s3_error!(
                InvalidRequest,
                "a Range and a partNumber together"
            ));
        }
        let sizes: &[u64] = if record.parts.is_empty() {
            &[size]
        } else {
            &record.parts
        };
        let i = usize::try_from(n)
            .ok()
            .filter(|i| (1..=sizes.len()).contains(i));
        let i = i.ok_or_else(|| s3_error!(InvalidPart, "the object has {} parts", sizes.len()))?;
        let start: u64 = sizes[..i - 1].iter().sum();
        let r = start..start + sizes[i - 1];
        return Ok(Bytes {
            checksums: r.start == 0 && r.end == size,
            partial: r.end > r.start,
            range: r,
        });
    }
    let whole = Bytes {
        range: 0..size,
        partial: false,
        checksums: true,
    };
    match range {
        None => Ok(whole),
        Some(Range::Suffix { length }) if *length > 0 && size == 0 => Ok(Bytes {
            checksums: false,
            ..whole
        }),
        Some(r) => match r.check(size) {
            Ok(range) => Ok(Bytes {
                range,
                partial: true,
                checksums: false,
            }),
            Err(_) => {
                let mut e = S3Error::with_message(
                    S3ErrorCode::InvalidRange,
                    format!("the range is not within the object's {size} bytes"),
                );
                let mut headers = http::HeaderMap::new();
                headers.insert(
                    http::header::CONTENT_RANGE,
                    http::HeaderValue::from_str(&format!("bytes */{size}")).expect("ASCII"),
                );
                e.set_headers(headers);
                Err(e)
            }
        },
    }
}

/// The object's stored description on a GET's answer (a HEAD copies it).
fn describe(record: &ObjectRecord, out: &mut GetObjectOutput, checksums: bool) {
    let h = &record.headers;
    out.e_tag = Some(ETag::Strong(record.etag.clone()));
    out.last_modified = Some(timestamp(record.last_modified_ms));
    // What S3 answers for an object stored without one.
    let default_type = || "binary/octet-stream".parse().ok();
    out.content_type = h.content_type.clone().or_else(default_type);
    out.content_encoding = h.content_encoding.clone();
    out.content_disposition = h.content_disposition.clone();
    out.content_language = h.content_language.clone();
    out.cache_control = h.cache_control.clone();
    out.expires = h
        .expires
        .as_deref()
        .and_then(|e| Timestamp::parse(TimestampFormat::HttpDate, e).ok());
    out.website_redirect_location = h.website_redirect_location.clone();
    out.metadata = (!h.metadata.is_empty()).then(|| h.metadata.clone().into_iter().collect());
    out.parts_count = (!record.parts.is_empty()).then_some(record.parts.len() as i32);
    if checksums {
        let c = &record.checksums;
        out.checksum_crc32 = c.crc32.clone();
        out.checksum_crc32c = c.crc32c.clone();
        out.checksum_crc64nvme = c.crc64nvme.clone();
        out.checksum_sha1 = c.sha1.clone();
        out.checksum_sha256 = c.sha256.clone();
        out.checksum_type = c.kind.clone().map(ChecksumType::from);
    }
}

#[cfg(test)]
#[path = "read_tests.rs"]
mod tests;
