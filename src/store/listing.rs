//! Listings as S3 does them: ListObjects (v1 and v2),
//! ListObjectVersions (every version `null`: buckets here are not
//! versioned), ListMultipartUploads and ListParts. Keys come in UTF-8 byte order
//! straight from the index, a page at a time: a listing reads at most one
//! page and skips a rolled-up common prefix with one seek, so its memory
//! and time do not grow with the bucket.

use super::index::{
    BUCKETS, OBJECTS, ObjectRecord, PARTS, PartRecord, UPLOADS, UploadRecord, decode,
};
use super::{Store, bucket_exists, internal, timestamp};
use redb::{ReadTransaction, ReadableTable};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

/// S3's default and largest page.
const PAGE: usize = 1000;

/// The first string after every string that starts with `prefix` (UTF-8
/// byte order is code point order: the last character, one up), or
/// `None` when there is none.
fn after_prefix(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(c) = next {
            chars.push(c);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// One entry of a listing: an object, or a rolled-up common prefix.
pub(super) enum Entry<T> {
    Item(String, T),
    Prefix(String),
}

/// A page of a listing.
pub(super) struct Page<T> {
    pub entries: Vec<Entry<T>>,
    pub truncated: bool,
}

/// Lists the keys of `table` under `bucket` that start with `prefix`,
/// after `after` (exclusive), rolling keys up at the first `delimiter`
/// after the prefix, at most `max` entries. `value` turns a stored value
/// into what the listing shows.
pub(super) fn list_keys<T>(
    table: &impl ReadableTable<(&'static str, &'static str), &'static [u8]>,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    after: Option<&str>,
    max: usize,
    value: impl Fn(&str, &[u8]) -> S3Result<T>,
) -> S3Result<Page<T>> {
    let delimiter = delimiter.filter(|d| !d.is_empty());
    let roll_up = |key: &str| -> Option<String> {
        let d = delimiter?;
        let rest = key.get(prefix.len()..)?;
        rest.find(d)
            .map(|i| key[..prefix.len() + i + d.len()].to_string())
    };
    // S3 answers max-keys=0 with nothing, and not as truncated.
    let Some((mut from, mut skip_equal)) = start(prefix, after, roll_up).filter(|_| max > 0) else {
        return Ok(Page::end(vec![], false));
    };
    let mut entries = Vec::new();
    loop {
        let range = table.range((bucket, from.as_str())..).map_err(internal)?;
        let mut jump = None;
        for item in range {
            let (k, v) = item.map_err(internal)?;
            let (b, key) = k.value();
            if b != bucket || !key.starts_with(prefix) {
                return Ok(Page::end(entries, false));
            }
            if skip_equal.as_deref() == Some(key) {
                continue;
            }
            if entries.len() == max {
                return Ok(Page::end(entries, true));
            }
            match roll_up(key) {
                Some(cp) => {
                    jump = after_prefix(&cp);
                    entries.push(Entry::Prefix(cp));
                    break;
                }
                None => entries.push(Entry::Item(key.to_string(), value(key, v.value())?)),
            }
        }
        // After a common prefix, on past it (if any key can follow it).
        let Some(next) = jump else {
            return Ok(Page::end(entries, false));
        };
        from = next;
        skip_equal = None;
    }
}

/// Where a listing under `prefix` after the marker `after` starts: the key
/// to seek, and a key equal to it to skip (the marker itself). Past a whole
/// common prefix when the marker is one (`roll_up`); none when nothing can
/// follow it.
fn start(
    prefix: &str,
    after: Option<&str>,
    roll_up: impl Fn(&str) -> Option<String>,
) -> Option<(String, Option<String>)> {
    let Some(a) = after.filter(|a| *a >= prefix) else {
        return Some((prefix.to_string(), None));
    };
    match roll_up(a) {
        Some(cp) if cp == a => after_prefix(&cp).map(|next| (next, None)),
        _ => Some((a.to_string(), Some(a.to_string()))),
    }
}

impl<T> Page<T> {
    fn end(entries: Vec<Entry<T>>, truncated: bool) -> Self {
        Page { entries, truncated }
    }
}

/// `encoding-type=url`: keys and prefixes percent-encoded (all but the
/// unreserved characters and `/`), as S3 sends them.
fn encoder(encoding: Option<&EncodingType>) -> impl Fn(&str) -> String + use<> {
    let url = encoding.is_some_and(|e| e.as_str() == EncodingType::URL);
    move |s: &str| {
        if !url {
            return s.to_string();
        }
        const KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
            .remove(b'-')
            .remove(b'_')
            .remove(b'.')
            .remove(b'~')
            .remove(b'/');
        percent_encoding::utf8_percent_encode(s, KEEP).to_string()
    }
}

fn max_keys(n: Option<i32>) -> S3Result<usize> {
    match n {
        None => Ok(PAGE),
        Some(n) if n < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(n) => Ok((n as usize).min(PAGE)),
    }
}

/// The one owner of everything here (the store has one credential).
pub(super) fn owner() -> Owner {
    Owner {
        display_name: Some("fencegate".into()),
        id: Some("fencegate".into()),
    }
}

fn object(key: String, r: ObjectRecord, enc: &impl Fn(&str) -> String) -> Object {
    Object {
        key: Some(enc(&key)),
        e_tag: Some(ETag::Strong(r.etag)),
        last_modified: Some(timestamp(r.last_modified_ms)),
        size: Some(r.size as i64),
        storage_class: Some(ObjectStorageClass::from_static(
            ObjectStorageClass::STANDARD,
        )),
        ..Default::default()
    }
}

/// The objects of a listing and its common prefixes, encoded.
fn split(
    entries: Vec<Entry<ObjectRecord>>,
    enc: &impl Fn(&str) -> String,
) -> (Vec<Object>, Vec<CommonPrefix>, Option<String>) {
    let mut last = None;
    let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
    for e in entries {
        match e {
            Entry::Item(k, r) => {
                last = Some(k.clone());
                objects.push(object(k, r, enc));
            }
            Entry::Prefix(p) => {
                last = Some(p.clone());
                prefixes.push(CommonPrefix {
                    prefix: Some(enc(&p)),
                });
            }
        }
    }
    (objects, prefixes, last)
}

fn record(_: &str, v: &[u8]) -> S3Result<ObjectRecord> {
    decode(v).map_err(internal)
}

/// The delimiter as an answer gives it back: encoded, and none when empty.
fn delimiter_shown(delimiter: Option<&str>, enc: &impl Fn(&str) -> String) -> Option<String> {
    delimiter.filter(|d| !d.is_empty()).map(enc)
}

/// A page as the three object listings show it: objects and common
/// prefixes, encoded, and the last entry (as it is) for the next marker.
struct Listed {
    objects: Vec<Object>,
    prefixes: Vec<CommonPrefix>,
    last: Option<String>,
    truncated: bool,
}

impl Store {
    /// What the three object listings share: a page of `bucket`'s objects
    /// under `prefix` after `after` (see [`list_keys`]), split into
    /// objects and common prefixes encoded with `enc`.
    async fn list_page(
        &self,
        bucket: &str,
        (prefix, delimiter): (Option<&str>, Option<&str>),
        after: Option<String>,
        max: usize,
        enc: &impl Fn(&str) -> String,
    ) -> S3Result<Listed> {
        let (bucket, prefix) = (bucket.to_string(), prefix.unwrap_or_default().to_string());
        let delimiter = delimiter.map(str::to_string);
        let page = self
            .in_read_txn(move |txn: &ReadTransaction| {
                let buckets = txn.open_table(BUCKETS).map_err(internal)?;
                bucket_exists(&buckets, &bucket).map_err(internal)??;
                let t = txn.open_table(OBJECTS).map_err(internal)?;
                list_keys(
                    &t,
                    &bucket,
                    &prefix,
                    delimiter.as_deref(),
                    after.as_deref(),
                    max,
                    record,
                )
            })
            .await?;
        let (objects, prefixes, last) = split(page.entries, enc);
        Ok(Listed {
            objects,
            prefixes,
            last,
            truncated: page.truncated,
        })
    }

    pub(super) async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = req.input;
        let max = max_keys(i.max_keys)?;
        let token = match &i.continuation_token {
            Some(t) => Some(
                hex::decode(t)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| {
                        s3_error!(
                            InvalidArgument,
                            "the continuation token is not one this store gave"
                        )
                    })?,
            ),
            None => None,
        };
        let after = token.or_else(|| i.start_after.clone());
        let enc = encoder(i.encoding_type.as_ref());
        let asked = (i.prefix.as_deref(), i.delimiter.as_deref());
        let mut page = self.list_page(&i.bucket, asked, after, max, &enc).await?;
        if i.fetch_owner == Some(true) {
            (page.objects.iter_mut()).for_each(|o| o.owner = Some(owner()));
        }
        let truncated = page.truncated;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: i.prefix.as_deref().map(&enc),
            delimiter: delimiter_shown(i.delimiter.as_deref(), &enc),
            start_after: i.start_after.as_deref().map(&enc),
            max_keys: Some(max as i32),
            key_count: Some((page.objects.len() + page.prefixes.len()) as i32),
            continuation_token: i.continuation_token,
            next_continuation_token: truncated.then(|| page.last.map(hex::encode)).flatten(),
            is_truncated: Some(truncated),
            encoding_type: i.encoding_type,
            contents: Some(page.objects),
            common_prefixes: Some(page.prefixes),
            ..Default::default()
        }))
    }

    pub(super) async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let i = req.input;
        let max = max_keys(i.max_keys)?;
        let enc = encoder(i.encoding_type.as_ref());
        let asked = (i.prefix.as_deref(), i.delimiter.as_deref());
        let mut page = (self.list_page(&i.bucket, asked, i.marker.clone(), max, &enc)).await?;
        // v1 names each object's owner.
        (page.objects.iter_mut()).for_each(|o| o.owner = Some(owner()));
        let truncated = page.truncated;
        let with_delimiter = i.delimiter.as_deref().is_some_and(|d| !d.is_empty());
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            // v1 gives the prefix as it is (clients decode the delimiter,
            // the markers and the keys only).
            prefix: i.prefix.clone(),
            delimiter: delimiter_shown(i.delimiter.as_deref(), &enc),
            marker: Some(i.marker.as_deref().map(&enc).unwrap_or_default()),
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            // S3 gives NextMarker only with a delimiter; without one the
            // last key is the marker.
            next_marker: (truncated && with_delimiter)
                .then(|| page.last.as_deref().map(&enc))
                .flatten(),
            encoding_type: i.encoding_type,
            contents: Some(page.objects),
            common_prefixes: Some(page.prefixes),
            ..Default::default()
        }))
    }

    pub(super) async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let i = req.input;
        let max = max_keys(i.max_keys)?;
        let enc = encoder(i.encoding_type.as_ref());
        let asked = (i.prefix.as_deref(), i.delimiter.as_deref());
        // One version per key: after a key marker, the next key.
        let page = (self.list_page(&i.bucket, asked, i.key_marker.clone(), max, &enc)).await?;
        let truncated = page.truncated;
        let versions = page
            .objects
            .into_iter()
            .map(|o| ObjectVersion {
                key: o.key,
                e_tag: o.e_tag,
                last_modified: o.last_modified,
                size: o.size,
                is_latest: Some(true),
                version_id: Some("null".into()),
                storage_class: Some(ObjectVersionStorageClass::from_static(
                    ObjectVersionStorageClass::STANDARD,
                )),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(i.bucket),
            prefix: i.prefix.as_deref().map(&enc),
            delimiter: delimiter_shown(i.delimiter.as_deref(), &enc),
            key_marker: i.key_marker.as_deref().map(&enc),
            version_id_marker: i.version_id_marker,
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: truncated.then(|| page.last.as_deref().map(&enc)).flatten(),
            next_version_id_marker: truncated.then(|| "null".to_string()),
            encoding_type: i.encoding_type,
            versions: Some(versions),
            common_prefixes: Some(page.prefixes),
            ..Default::default()
        }))
    }

    pub(super) async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = req.input;
        let max = max_keys(i.max_uploads)?;
        let (bucket, prefix) = (i.bucket.clone(), i.prefix.clone().unwrap_or_default());
        let (after, delimiter) = (i.key_marker.clone(), i.delimiter.clone());
        let after_id = i.upload_id_marker.clone();
        let (uploads, prefixes, truncated) = self
            .in_read_txn(move |txn| {
                let buckets = txn.open_table(BUCKETS).map_err(internal)?;
                bucket_exists(&buckets, &bucket).map_err(internal)??;
                let t = txn.open_table(UPLOADS).map_err(internal)?;
                list_uploads(
                    &t,
                    &bucket,
                    &prefix,
                    delimiter.as_deref(),
                    after.as_deref(),
                    after_id.as_deref(),
                    max,
                )
            })
            .await?;
        let enc = encoder(i.encoding_type.as_ref());
        let next = uploads
            .last()
            .map(|(k, id, _): &(String, String, UploadRecord)| (k.clone(), id.clone()));
        let uploads = uploads
            .into_iter()
            .map(|(key, id, r)| MultipartUpload {
                key: Some(enc(&key)),
                upload_id: Some(id),
                initiated: Some(timestamp(r.initiated_ms)),
                checksum_algorithm: r.checksum_algorithm.map(ChecksumAlgorithm::from),
                storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket),
            prefix: i.prefix.as_deref().map(&enc),
            delimiter: delimiter_shown(i.delimiter.as_deref(), &enc),
            key_marker: i.key_marker.as_deref().map(&enc),
            upload_id_marker: i.upload_id_marker,
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: truncated
                .then(|| next.as_ref().map(|n| enc(&n.0)))
                .flatten(),
            next_upload_id_marker: truncated.then(|| next.map(|n| n.1)).flatten(),
            encoding_type: i.encoding_type,
            uploads: Some(uploads),
            common_prefixes: Some(
                prefixes
                    .into_iter()
                    .map(|p| CommonPrefix {
                        prefix: Some(enc(&p)),
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    pub(super) async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let i = req.input;
        let max = max_keys(i.max_parts)?;
        let marker = u32::try_from(i.part_number_marker.unwrap_or(0)).unwrap_or(0);
        let (b, k, id) = (i.bucket.clone(), i.key.clone(), i.upload_id.clone());
        let (upload, parts, truncated) = self
            .in_read_txn(move |txn| {
                let uploads = txn.open_table(UPLOADS).map_err(internal)?;
                let up = uploads
                    .get((b.as_str(), k.as_str(), id.as_str()))
                    .map_err(internal)?;
                let up: UploadRecord =
                    decode(up.ok_or_else(|| s3_error!(NoSuchUpload))?.value()).map_err(internal)?;
                let t = txn.open_table(PARTS).map_err(internal)?;
                let mut parts = Vec::new();
                let mut truncated = false;
                for item in t
                    .range((id.as_str(), marker.saturating_add(1))..=(id.as_str(), u32::MAX))
                    .map_err(internal)?
                {
                    let (n, v) = item.map_err(internal)?;
                    if parts.len() == max {
                        truncated = true;
                        break;
                    }
                    let p: PartRecord = decode(v.value()).map_err(internal)?;
                    parts.push((n.value().1, p));
                }
                Ok((up, parts, truncated))
            })
            .await?;
        let next = parts.last().map(|(n, _)| *n as i32);
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            upload_id: Some(i.upload_id),
            part_number_marker: i.part_number_marker,
            next_part_number_marker: truncated.then_some(next).flatten(),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            checksum_algorithm: upload.checksum_algorithm.map(ChecksumAlgorithm::from),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            parts: Some(
                parts
                    .into_iter()
                    .map(|(n, p)| Part {
                        part_number: Some(n as i32),
                        e_tag: Some(ETag::Strong(p.etag)),
                        size: Some(p.segment.len as i64),
                        last_modified: Some(timestamp(p.last_modified_ms)),
                        checksum_crc32: p.checksums.crc32,
                        checksum_crc32c: p.checksums.crc32c,
                        checksum_crc64nvme: p.checksums.crc64nvme,
                        checksum_sha1: p.checksums.sha1,
                        checksum_sha256: p.checksums.sha256,
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }
}

/// One page of ListMultipartUploads: (key, upload id, record), the
/// common prefixes, and whether more follow. Uploads of one key come in
/// upload-id order (S3's is by initiation; ids here are random).
#[allow(clippy::type_complexity)]
fn list_uploads(
    t: &impl ReadableTable<(&'static str, &'static str, &'static str), &'static [u8]>,
    bucket: &str,
    prefix: &str,
    delimiter: Option<&str>,
    after_key: Option<&str>,
    after_id: Option<&str>,
    max: usize,
) -> S3Result<(Vec<(String, String, UploadRecord)>, Vec<String>, bool)> {
    let delimiter = delimiter.filter(|d| !d.is_empty());
    let (mut uploads, mut prefixes) = (Vec::new(), Vec::<String>::new());
    let start = after_key.unwrap_or(prefix).max(prefix);
    for item in t.range((bucket, start, "")..).map_err(internal)? {
        let (k, v) = item.map_err(internal)?;
        let (b, key, id) = k.value();
        if b != bucket || !key.starts_with(prefix) {
            break;
        }
        let after_marker = match (after_key, after_id) {
            (Some(ak), Some(ai)) if key == ak => id > ai,
            (Some(ak), _) => key > ak,
            _ => true,
        };
        if !after_marker {
            continue;
        }
        let rolled = delimiter.and_then(|d| {
            let rest = &key[prefix.len()..];
            rest.find(d)
                .map(|i| key[..prefix.len() + i + d.len()].to_string())
        });
        if let Some(cp) = &rolled
            && prefixes.last() == Some(cp)
        {
            continue;
        }
        if uploads.len() + prefixes.len() == max {
            return Ok((uploads, prefixes, true));
        }
        match rolled {
            Some(cp) => prefixes.push(cp),
            None => uploads.push((
                key.to_string(),
                id.to_string(),
                decode(v.value()).map_err(internal)?,
            )),
        }
    }
    Ok((uploads, prefixes, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_string_after_a_prefix() {
        assert_eq!(after_prefix("a/").as_deref(), Some("a0"));
        assert_eq!(after_prefix("ab").as_deref(), Some("ac"));
        assert_eq!(after_prefix("x\u{bf}").as_deref(), Some("x\u{c0}"));
        assert_eq!(
            after_prefix("x\u{d7ff}").as_deref(),
            Some("x\u{e000}"),
            "no surrogates"
        );
        assert_eq!(after_prefix("x\u{10ffff}").as_deref(), Some("y"));
        assert_eq!(after_prefix(""), None);
    }
}
