//! Saving a body: the one path by which a request's bytes become a blob,
//! for PutObject, UploadPart and UploadPartCopy alike. The bytes are
//! hashed (`digests.rs`) as they stream into a fresh blob, the blob is made
//! durable, and the digests are checked against what the request declared.
//! What is saved is not yet visible: the handler commits a record that
//! points at the blob, or drops the blob and with it the file.

use super::blobs::FreshBlob;
use super::digests::{Hashes, verify};
use super::index::{Checksums, Segment};
use super::{Store, write_error};
use bytes::Bytes;
use futures_util::Stream;
use s3s::S3Result;

/// What a request declares of its body, checked once the body is saved.
pub(super) struct Declared {
    /// `Content-MD5`, base64.
    pub content_md5: Option<String>,
    /// The `x-amz-checksum-*` headers.
    pub checksums: Checksums,
    /// The aws-chunked trailers, which come once the body has ended.
    pub trailers: Option<s3s::TrailingHeaders>,
    /// The checksum algorithms it names (`declared_algorithms`).
    pub algorithms: Vec<String>,
}

/// What the request `$req` declares of the body in its input `$input`,
/// taken out of it: PutObject's and UploadPart's, which name it alike.
macro_rules! declared_in {
    ($req:expr, $input:expr) => {{
        let checksums = $crate::store::index::checksums_in!($input);
        let algorithms = $crate::store::digests::declared_algorithms(
            $input.checksum_algorithm.as_ref(),
            &checksums,
            &$req.headers,
        );
        $crate::store::save::Declared {
            content_md5: $input.content_md5.take(),
            checksums,
            trailers: $req.trailing_headers.clone(),
            algorithms,
        }
    }};
}
pub(super) use declared_in;

/// A body saved in a blob of its own, not yet committed.
pub(super) struct Saved {
    /// Removed on any way out but a commit that points at it.
    pub fresh: FreshBlob,
    pub size: u64,
    pub md5: [u8; 16],
    pub checksums: Checksums,
}

impl Saved {
    /// All of the blob, as a record points at it.
    pub fn segment(&self) -> Segment {
        Segment {
            blob: self.fresh.id(),
            offset: 0,
            len: self.size,
        }
    }
}

impl Store {
    /// Saves `body` in a fresh blob, hashed with MD5, the algorithms
    /// `declared` names and `also` (an upload's own), and checks it against
    /// `declared` (a copy declares nothing): a mismatch is `400 BadDigest`,
    /// and the blob is removed.
    pub(super) async fn save_body<S, E>(
        &self,
        body: S,
        declared: Option<Declared>,
        also: Option<String>,
    ) -> S3Result<Saved>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let mut algorithms: Vec<String> =
            declared.iter().flat_map(|d| d.algorithms.clone()).collect();
        algorithms.extend(also);
        algorithms.sort();
        algorithms.dedup();
        let mut hashes = Hashes::new(&algorithms)?;
        let fresh = self.blobs.fresh();
        let size = self
            .blobs
            .write(fresh.id(), body, |p| hashes.update(p))
            .await
            .map_err(write_error)?;
        let (md5, checksums) = hashes.finish();
        if let Some(d) = declared {
            let trailers = d.trailers.and_then(|t| t.take());
            let (want_md5, want) = (d.content_md5.as_deref(), &d.checksums);
            verify(want_md5, &md5, want, trailers.as_ref(), &checksums)?;
        }
        Ok(Saved {
            fresh,
            size,
            md5,
            checksums,
        })
    }
}
