//! The embedded store's index, in redb: what buckets, objects, multipart
//! uploads and parts there are, and which blob files hold their bytes.
//!
//! Tables (keys sort as S3 lists: by bucket, then by key in UTF-8 byte
//! order):
//!
//! - `buckets`: bucket → creation time (unix ms);
//! - `objects`: (bucket, key) → [`ObjectRecord`];
//! - `uploads`: (bucket, key, upload id) → [`UploadRecord`];
//! - `parts`: (upload id, part number) → [`PartRecord`];
//! - `blobs`: blob id → how many records point at it (a copy points at its
//!   source's blobs); a blob no record points at is removed from here. A
//!   blob file that is not here is garbage (an interrupted write, or one
//!   replaced or deleted before its file could be removed) and is
//!   collected.
//!
//! Records are JSON: readable with any redb tool, and extended without a
//! migration (unknown fields are ignored; each optional field defaults
//! when missing, so a new field must be one). Fields that are absent or
//! empty are not written: a plain object's record is about 120 bytes.

use redb::TableDefinition;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const BUCKETS: TableDefinition<&str, u64> = TableDefinition::new("buckets");
pub const OBJECTS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("objects");
pub const UPLOADS: TableDefinition<(&str, &str, &str), &[u8]> = TableDefinition::new("uploads");
pub const PARTS: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("parts");
pub const BLOBS: TableDefinition<u128, u64> = TableDefinition::new("blobs");

/// A run of an object's bytes: a whole blob file, or (UploadPartCopy) a
/// range of one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// The blob file, by id (see `blobs.rs`).
    pub blob: u128,
    /// Where in the blob the segment starts.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offset: u64,
    pub len: u64,
}

/// What a write stores beside the bytes and gives back on a read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Headers {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// As the client sent it (an HTTP date).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub website_redirect_location: Option<String>,
    /// `x-amz-meta-*`, without the prefix.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// The checksums stored with an object or a part (base64, as S3 sends
/// them; a multipart object's may end in `-N`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Checksums {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crc32: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crc64nvme: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha1: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// `FULL_OBJECT` or `COMPOSITE` (multipart).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    pub segments: Vec<Segment>,
    pub size: u64,
    /// Without quotes: an MD5 in hex, or `<hex>-<parts>` for multipart.
    pub etag: String,
    pub last_modified_ms: i64,
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    #[serde(default, skip_serializing_if = "Checksums::is_empty")]
    pub checksums: Checksums,
    /// For a multipart object: its parts' sizes, in order (GET/HEAD
    /// `partNumber`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<u64>,
    /// For a multipart object: the upload that made it (a retried
    /// CompleteMultipartUpload is answered as the first was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadRecord {
    pub initiated_ms: i64,
    #[serde(default, skip_serializing_if = "Headers::is_empty")]
    pub headers: Headers,
    /// The checksum algorithm the upload was created with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_algorithm: Option<String>,
    /// `COMPOSITE` or `FULL_OBJECT`, with an algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRecord {
    pub segment: Segment,
    pub etag: String,
    pub last_modified_ms: i64,
    #[serde(default, skip_serializing_if = "Checksums::is_empty")]
    pub checksums: Checksums,
}

/// The checksums an s3s input or output carries in its `checksum_*`
/// fields (every S3 shape names them alike), taken out of it: one place
/// that names all five algorithms.
macro_rules! checksums_in {
    ($x:expr) => {
        $crate::store::index::Checksums {
            crc32: $x.checksum_crc32.take(),
            crc32c: $x.checksum_crc32c.take(),
            crc64nvme: $x.checksum_crc64nvme.take(),
            sha1: $x.checksum_sha1.take(),
            sha256: $x.checksum_sha256.take(),
            kind: None,
        }
    };
}
pub(super) use checksums_in;

/// The headers a write stores with the object, taken out of the s3s input
/// that carries them (PutObject, CopyObject under `REPLACE`,
/// CreateMultipartUpload: every one names them alike), as `checksums_in!`
/// takes the checksums.
macro_rules! headers_in {
    ($x:expr) => {
        $crate::store::index::Headers {
            content_type: $x.content_type.take(),
            content_encoding: $x.content_encoding.take(),
            content_disposition: $x.content_disposition.take(),
            content_language: $x.content_language.take(),
            cache_control: $x.cache_control.take(),
            expires: $x.expires.take().and_then($crate::store::index::http_date),
            website_redirect_location: $x.website_redirect_location.take(),
            metadata: $x.metadata.take().unwrap_or_default().into_iter().collect(),
        }
    };
}
pub(super) use headers_in;

/// A time as an HTTP date, the form `Expires` is stored in.
pub fn http_date(t: s3s::dto::Timestamp) -> Option<String> {
    let mut buf = Vec::new();
    t.format(s3s::dto::TimestampFormat::HttpDate, &mut buf)
        .ok()?;
    String::from_utf8(buf).ok()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Headers {
    fn is_empty(&self) -> bool {
        *self == Headers::default()
    }
}

impl Checksums {
    fn is_empty(&self) -> bool {
        *self == Checksums::default()
    }
}

/// A record as stored: what is absent or empty is left out (and read back
/// as its default), which keeps the index small.
pub fn encode<T: Serialize>(r: &T) -> Vec<u8> {
    serde_json::to_vec(r).expect("records serialise")
}

/// A stored record; one that does not parse is a damaged index.
pub fn decode<T: for<'a> Deserialize<'a>>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("a damaged index record: {e}"))
}

impl ObjectRecord {
    /// Every blob the object's bytes are in.
    pub fn blobs(&self) -> impl Iterator<Item = u128> + '_ {
        self.segments.iter().map(|s| s.blob)
    }

    /// The object's bytes as `(blob, offset, len)` spans, in order: what
    /// `Blobs::stream_range` and `Blobs::read_now` take.
    pub fn spans(&self) -> impl Iterator<Item = (u128, u64, u64)> + '_ {
        self.segments.iter().map(|s| (s.blob, s.offset, s.len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_old_ones_still_read() {
        let r = ObjectRecord {
            segments: vec![Segment {
                blob: u128::MAX,
                offset: 0,
                len: 3,
            }],
            size: 3,
            etag: "abc".into(),
            last_modified_ms: 1,
            headers: Headers::default(),
            checksums: Checksums::default(),
            parts: vec![],
            upload_id: None,
        };
        assert_eq!(decode::<ObjectRecord>(&encode(&r)).unwrap(), r);
        // What is absent is not written.
        let text = String::from_utf8(encode(&r)).unwrap();
        assert!(
            !text.contains("null") && !text.contains("headers"),
            "{text}"
        );
        let full = ObjectRecord {
            segments: vec![Segment {
                blob: 7,
                offset: 5,
                len: 3,
            }],
            headers: Headers {
                content_type: Some("text/plain".into()),
                expires: Some("Thu, 01 Dec 1994 16:00:00 GMT".into()),
                metadata: [("k".to_string(), "v".to_string())].into(),
                ..Headers::default()
            },
            checksums: Checksums {
                crc32: Some("AAAAAA==".into()),
                kind: Some("FULL_OBJECT".into()),
                ..Checksums::default()
            },
            parts: vec![5, 3],
            upload_id: Some("u".into()),
            ..r.clone()
        };
        assert_eq!(decode::<ObjectRecord>(&encode(&full)).unwrap(), full);
        let minimal = br#"{"segments":[],"size":0,"etag":"e","last_modified_ms":5,"later":1}"#;
        let old: ObjectRecord = decode(minimal).unwrap();
        assert_eq!(old.etag, "e");
        assert!(decode::<ObjectRecord>(b"{").is_err());
    }
}
