//! Classifies a request into an S3 operation, its bucket and key, and what
//! it does to them (its [`Effect`]): which ones are fenced writes is
//! CONTRACT §2 (see docs/contract.md). Each operation is a variant of
//! [`Op`], so a misspelt operation does not compile, and what each one
//! means for fencing is one table of `match`es below.

use super::error::S3Error;
use super::headers::{X_AMZ_COPY_SOURCE, X_AMZ_METADATA_DIRECTIVE};
use super::names::CopySource;
use super::query::{Param, has_query_param, query_param};
use http::{HeaderMap, Method};

/// What a request does, as far as fencing and permissions are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
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

/// The S3 operations fencegate tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    ListBuckets,
    ListObjects,
    ListObjectsV2,
    ListObjectVersions,
    ListMultipartUploads,
    HeadBucket,
    /// Any other `GET /bucket?<subresource>`.
    GetBucketConfig,
    CreateBucket,
    /// Any `PUT /bucket?<subresource>`.
    PutBucketConfig,
    DeleteBucket,
    /// Any `DELETE /bucket?<subresource>`.
    DeleteBucketConfig,
    DeleteObjects,
    GetObject,
    HeadObject,
    GetObjectTagging,
    GetObjectAcl,
    ListParts,
    SelectObjectContent,
    /// Any PUT to a key not named below is fenced like a PutObject.
    PutObject,
    CopyObject,
    UploadPart,
    UploadPartCopy,
    PutObjectTagging,
    PutObjectAcl,
    PutObjectRetention,
    PutObjectLegalHold,
    CreateMultipartUpload,
    CompleteMultipartUpload,
    AbortMultipartUpload,
    RestoreObject,
    DeleteObjectTagging,
    DeleteObject,
}

impl Op {
    /// The S3 operation name, for logs and metrics.
    pub fn name(self) -> &'static str {
        use Op::*;
        match self {
            ListBuckets => "ListBuckets",
            ListObjects => "ListObjects",
            ListObjectsV2 => "ListObjectsV2",
            ListObjectVersions => "ListObjectVersions",
            ListMultipartUploads => "ListMultipartUploads",
            HeadBucket => "HeadBucket",
            GetBucketConfig => "GetBucketConfig",
            CreateBucket => "CreateBucket",
            PutBucketConfig => "PutBucketConfig",
            DeleteBucket => "DeleteBucket",
            DeleteBucketConfig => "DeleteBucketConfig",
            DeleteObjects => "DeleteObjects",
            GetObject => "GetObject",
            HeadObject => "HeadObject",
            GetObjectTagging => "GetObjectTagging",
            GetObjectAcl => "GetObjectAcl",
            ListParts => "ListParts",
            SelectObjectContent => "SelectObjectContent",
            PutObject => "PutObject",
            CopyObject => "CopyObject",
            UploadPart => "UploadPart",
            UploadPartCopy => "UploadPartCopy",
            PutObjectTagging => "PutObjectTagging",
            PutObjectAcl => "PutObjectAcl",
            PutObjectRetention => "PutObjectRetention",
            PutObjectLegalHold => "PutObjectLegalHold",
            CreateMultipartUpload => "CreateMultipartUpload",
            CompleteMultipartUpload => "CompleteMultipartUpload",
            AbortMultipartUpload => "AbortMultipartUpload",
            RestoreObject => "RestoreObject",
            DeleteObjectTagging => "DeleteObjectTagging",
            DeleteObject => "DeleteObject",
        }
    }

    pub fn effect(self) -> Effect {
        use Op::*;
        match self {
            ListBuckets => Effect::Service,
            ListObjects | ListObjectsV2 | ListObjectVersions | ListMultipartUploads
            | HeadBucket | GetBucketConfig => Effect::BucketRead,
            CreateBucket | PutBucketConfig | DeleteBucket | DeleteBucketConfig => {
                Effect::BucketWrite
            }
            DeleteObjects => Effect::MultiDelete,
            GetObject | HeadObject | GetObjectTagging | GetObjectAcl | ListParts
            | SelectObjectContent => Effect::ObjectRead,
            PutObject
            | CopyObject
            | UploadPart
            | UploadPartCopy
            | PutObjectTagging
            | PutObjectAcl
            | PutObjectRetention
            | PutObjectLegalHold
            | CreateMultipartUpload
            | CompleteMultipartUpload
            | AbortMultipartUpload
            | RestoreObject
            | DeleteObjectTagging
            | DeleteObject => Effect::ObjectWrite,
        }
    }

    /// Whether the accepted token is stamped on the stored object.
    pub fn stamps_token(self) -> bool {
        matches!(
            self,
            Op::PutObject | Op::CopyObject | Op::CreateMultipartUpload
        )
    }

    /// Whether the request puts a new version of its object in place (of
    /// the destination, for a copy): the writes `If-None-Match` and
    /// `If-Match` guard (CONTRACT §8).
    pub fn replaces_object(self) -> bool {
        matches!(
            self,
            Op::PutObject | Op::CopyObject | Op::CompleteMultipartUpload
        )
    }

    /// Whether the request changes which version of its object there is
    /// (replaces or deletes it): these hold the object while they write, so
    /// that a conditional write's check and write are one step
    /// (`fence::hold`). DeleteObjects holds each key it names.
    pub fn changes_object(self) -> bool {
        self.replaces_object() || self == Op::DeleteObject
    }

    /// Whether the request belongs to a multipart upload and, carrying no
    /// token of its own, is checked with the token that created the upload.
    pub fn inherits_upload_token(self) -> bool {
        matches!(
            self,
            Op::UploadPart
                | Op::UploadPartCopy
                | Op::CompleteMultipartUpload
                | Op::AbortMultipartUpload
        )
    }

    /// Whether the request reads another object (`x-amz-copy-source`).
    pub fn copies(self) -> bool {
        matches!(self, Op::CopyObject | Op::UploadPartCopy)
    }

    /// Whether the request writes an object's content by another way than a
    /// PutObject. A key ending in `/` is a folder marker: a store on a file
    /// system (s3s-fs, the embedded store before fencegate's own) resolves
    /// `a/b/` to the file `a/b`, so these would overwrite `a/b` while the
    /// fence guards `a/b/`. fencegate fronts any store, so it keeps
    /// refusing them.
    pub fn writes_content_indirectly(self) -> bool {
        matches!(
            self,
            Op::CopyObject
                | Op::UploadPartCopy
                | Op::UploadPart
                | Op::CreateMultipartUpload
                | Op::CompleteMultipartUpload
        )
    }
}

/// A classified request.
#[derive(Debug, Clone)]
pub struct Operation {
    pub op: Op,
    pub bucket: Option<String>,
    pub key: Option<String>,
    /// The parsed `x-amz-copy-source` of a copy (never set otherwise: the
    /// header is not forwarded on other requests).
    pub copy_source: Option<CopySource>,
    /// The `uploadId` of a request that belongs to a multipart upload.
    pub upload_id: Option<String>,
    /// `x-amz-metadata-directive`, read in any case, before any fence
    /// moves: REPLACE (`true`) or COPY. The backend gets it as read, in
    /// capitals, which is how the stores compare it (`proxy/outgoing.rs`).
    pub replace_metadata: Option<bool>,
}

impl Operation {
    pub fn effect(&self) -> Effect {
        self.op.effect()
    }
}

/// Query parameters refused outright: `renameObject` would make a backend
/// act on another object than the one in the path (S3 Express's
/// RenameObject deletes its source); `session` is S3 Express's
/// CreateSession, whose answer would hand the client credentials of the
/// backend's own, signed for by fencegate.
const REFUSED_SUBRESOURCES: &[&str] = &["renameObject", "session"];

/// The subresources that make an object request another operation than
/// its method's plain one. A request naming two of them is refused: S3
/// and its emulations pick one by rules of their own (s3s and Garage the
/// subresource before the upload, fencegate once the upload), and a
/// write taken for an upload's part would borrow the upload's token.
const OBJECT_SUBRESOURCES: &[&str] = &[
    "acl",
    "attributes",
    "legal-hold",
    "restore",
    "retention",
    "select",
    "tagging",
    "torrent",
    "uploadId",
    "uploads",
];

/// The bucket request's own subresources (a listing's kind, DeleteObjects),
/// which with [`BUCKET_SUBRESOURCES`] a bucket request may name one of.
const BUCKET_KINDS: &[&str] = &["delete", "list-type", "uploads", "versions"];

/// The subresources by which S3 reads, writes and deletes a bucket's
/// configuration (`GET /bucket?acl`). A bucket request that names none of
/// them is the bucket's own request (a listing, CreateBucket,
/// DeleteBucket), whatever else its query holds (a listing's `prefix` or
/// `delimiter`, a presigned URL's `X-Amz-*`, an SDK's `x-id`), as S3
/// itself reads it: `GET /bucket?prefix=p` is a ListObjects, and is held
/// to a session credential's prefixes like one.
const BUCKET_SUBRESOURCES: &[&str] = &[
    "accelerate",
    "acl",
    "analytics",
    "cors",
    "encryption",
    "intelligent-tiering",
    "inventory",
    "lifecycle",
    "location",
    "logging",
    "metadataConfiguration",
    "metadataTable",
    "metrics",
    "notification",
    "object-lock",
    "ownershipControls",
    "policy",
    "policyStatus",
    "publicAccessBlock",
    "replication",
    "requestPayment",
    "tagging",
    "versioning",
    "website",
];

/// Classifies a request. `query` holds decoded query pairs.
pub fn classify(
    method: &Method,
    bucket: Option<String>,
    key: Option<String>,
    query: &[Param<'_>],
    headers: &HeaderMap,
) -> Result<Operation, S3Error> {
    let q = |n| has_query_param(query, n);
    let unsupported = |what: &str| Err(S3Error::NotImplemented(format!("{what} is not supported")));
    if let Some(r) = REFUSED_SUBRESOURCES.iter().find(|r| q(r)) {
        return unsupported(&format!("?{r}"));
    }
    let copy = headers.contains_key(X_AMZ_COPY_SOURCE);
    let named = |list: &[&str]| list.iter().filter(|r| has_query_param(query, r)).count();
    // A bucket request's configuration subresources, counted once: the
    // operation (none: the bucket's own) and the one-subresource rule.
    let configs = match (bucket.is_some(), key.is_some()) {
        (true, false) => named(BUCKET_SUBRESOURCES),
        _ => 0,
    };
    let two = match (bucket.is_some(), key.is_some()) {
        (true, false) => configs + named(BUCKET_KINDS) > 1,
        (true, true) => named(OBJECT_SUBRESOURCES) > 1,
        _ => false,
    };
    if two {
        return Err(S3Error::InvalidRequest(
            "the request names more than one subresource: send one operation a request".into(),
        ));
    }
    let op = match (bucket.is_some(), key.is_some()) {
        (false, _) => match *method {
            Method::GET | Method::HEAD => Op::ListBuckets,
            _ => return unsupported("this service-level request"),
        },
        (true, false) => match *method {
            Method::GET | Method::HEAD if q("uploads") => Op::ListMultipartUploads,
            Method::GET | Method::HEAD if q("versions") => Op::ListObjectVersions,
            Method::GET | Method::HEAD if q("list-type") => Op::ListObjectsV2,
            Method::HEAD => Op::HeadBucket,
            Method::GET if configs > 0 => Op::GetBucketConfig,
            Method::GET => Op::ListObjects,
            Method::PUT if configs > 0 => Op::PutBucketConfig,
            Method::PUT => Op::CreateBucket,
            Method::DELETE if configs > 0 => Op::DeleteBucketConfig,
            Method::DELETE => Op::DeleteBucket,
            Method::POST if q("delete") => Op::DeleteObjects,
            Method::POST => return unsupported("browser-form POST upload"),
            _ => return unsupported("this bucket request"),
        },
        (true, true) => match *method {
            Method::GET | Method::HEAD if q("tagging") => Op::GetObjectTagging,
            Method::GET | Method::HEAD if q("acl") => Op::GetObjectAcl,
            Method::GET | Method::HEAD if q("uploadId") => Op::ListParts,
            Method::HEAD => Op::HeadObject,
            Method::GET => Op::GetObject,
            Method::PUT if q("partNumber") && q("uploadId") && copy => Op::UploadPartCopy,
            Method::PUT if q("partNumber") && q("uploadId") => Op::UploadPart,
            Method::PUT if q("tagging") => Op::PutObjectTagging,
            Method::PUT if q("acl") => Op::PutObjectAcl,
            Method::PUT if q("retention") => Op::PutObjectRetention,
            Method::PUT if q("legal-hold") => Op::PutObjectLegalHold,
            Method::PUT if copy => Op::CopyObject,
            Method::PUT => Op::PutObject,
            Method::POST if q("uploads") => Op::CreateMultipartUpload,
            Method::POST if q("uploadId") => Op::CompleteMultipartUpload,
            Method::POST if q("select") => Op::SelectObjectContent,
            Method::POST if q("restore") => Op::RestoreObject,
            Method::DELETE if q("uploadId") => Op::AbortMultipartUpload,
            Method::DELETE if q("tagging") => Op::DeleteObjectTagging,
            Method::DELETE => Op::DeleteObject,
            _ => return unsupported("this object request"),
        },
    };
    if op.writes_content_indirectly()
        && let Some(k) = key.as_deref().filter(|k| k.ends_with('/'))
    {
        return Err(S3Error::InvalidObjectName(format!(
            "{} to {k:?}: a key ending in '/' is a folder marker, written only by PutObject",
            op.name()
        )));
    }
    // A part's number is what makes it a part: Garage takes a PUT whose
    // `partNumber` is empty for a PutObject, which this one is not fenced as.
    if matches!(op, Op::UploadPart | Op::UploadPartCopy) {
        let number = query_param(query, "partNumber").and_then(|n| n.parse::<u16>().ok());
        if !number.is_some_and(|n| (1..=10_000).contains(&n)) {
            return Err(S3Error::InvalidArgument(
                "partNumber must be an integer from 1 to 10000".into(),
            ));
        }
    }
    let replace_metadata = match headers.get(X_AMZ_METADATA_DIRECTIVE) {
        None => None,
        Some(d) => {
            let d = String::from_utf8_lossy(d.as_bytes());
            match d {
                d if d.eq_ignore_ascii_case("REPLACE") => Some(true),
                d if d.eq_ignore_ascii_case("COPY") => Some(false),
                d => {
                    return Err(S3Error::InvalidArgument(format!(
                        "x-amz-metadata-directive {d:?} is neither COPY nor REPLACE"
                    )));
                }
            }
        }
    };
    let copy_source = match headers.get(X_AMZ_COPY_SOURCE) {
        Some(v) if op.copies() => Some(CopySource::parse(v.as_bytes())?),
        _ => None,
    };
    let upload_id =
        if op.inherits_upload_token() {
            let id = query_param(query, "uploadId").map(str::to_string);
            Some(id.filter(|i| !i.is_empty()).ok_or_else(|| {
                S3Error::InvalidArgument(format!("{} needs an uploadId", op.name()))
            })?)
        } else {
            None
        };
    Ok(Operation {
        op,
        bucket,
        key,
        copy_source,
        upload_id,
        replace_metadata,
    })
}

#[cfg(test)]
mod tests;
