//! The embedded store's file layout, answered as an S3 store would answer.
//!
//! s3s-fs keeps the object `a/b` as the file `a/b` under its bucket's
//! directory. So `a` cannot be an object while `a/b` is one, a directory is
//! not an object, and a folder marker `a/` is the directory `a`. Left to
//! itself, s3s-fs answers every request that runs into this with `500
//! InternalError`, which SDKs retry four times and a user cannot act on; a
//! DeleteObjects with one such key fails half done; a failed
//! CompleteMultipartUpload has already consumed its parts; and a read of
//! `a/` returns the object `a`.
//!
//! [`Layout`] wraps s3s-fs and answers those requests itself:
//!
//! - a read (GET, HEAD, a copy's source) of a key whose path is a
//!   directory, or of a folder marker `a/` (kept as a directory, never
//!   listed, or the path of the object `a`): `404 NoSuchKey`;
//! - a delete of a key whose path holds something else (a directory for
//!   `a`, the object `a` for `a/`): deleted, as S3 answers for a key that
//!   does not exist, and nothing on disk is touched;
//! - a write of a key too long for s3s-fs's file names (it names two
//!   metadata files after the key in base64, so about 160 bytes is the
//!   most it takes, where S3 takes 1024): `400 KeyTooLongError` before
//!   s3s-fs starts it (left alone, s3s-fs writes the object's bytes, then
//!   fails on the metadata and answers 500);
//! - a write (PUT, copy, CreateMultipartUpload, CompleteMultipartUpload)
//!   the layout cannot hold, refused before s3s-fs starts it, with the
//!   errors MinIO, whose file layout has the same limit, answers:
//!   `400 XMinioParentIsObject` when an object stands where a directory
//!   would have to be, and `409 XMinioObjectExistsAsDirectory` when other
//!   keys continue the key with `/`. An empty directory in the way (what
//!   deleting every key under `a/` leaves behind) is removed instead.
//!
//! A PUT's and an UploadPart's `Content-MD5` and checksums are checked
//! before the object or part lands (`put_checks`); s3s-fs checks a PUT's
//! after, with the object replaced, and a part's not at all.
//!
//! GET and HEAD honour `If-Match`, `If-None-Match`, `If-Modified-Since`
//! and `If-Unmodified-Since` (`read_conditions`), which s3s-fs ignores.
//!
//! Two more answers follow S3 where s3s-fs does not: a write into a bucket
//! that does not exist is `404 NoSuchBucket` (s3s-fs made the bucket), and
//! DeleteBucket deletes only an empty bucket, else `409 BucketNotEmpty`
//! (s3s-fs removed the bucket with every object in it).
//!
//! The checks read the same path s3s-fs computes (bucket directory joined
//! with the key); the keys that reach the embedded store have been checked
//! by fencegate (no `.`, `..` or empty segments but a trailing one), so that
//! path is the key's and no other. Every other operation goes to s3s-fs as
//! it is.

use super::put_checks;
use super::read_conditions::ReadConditions;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use std::path::{Path, PathBuf};

/// s3s-fs with its layout's conflicts answered (see the module doc).
pub struct Layout {
    fs: s3s_fs::FileSystem,
    root: PathBuf,
}

/// What is on disk where a key would be.
#[derive(Debug, PartialEq, Eq)]
enum OnDisk {
    File,
    Dir,
    Nothing,
}

async fn on_disk(path: &Path) -> OnDisk {
    match tokio::fs::metadata(path).await {
        Ok(m) if m.is_dir() => OnDisk::Dir,
        Ok(_) => OnDisk::File,
        Err(_) => OnDisk::Nothing,
    }
}

fn no_such_key() -> S3Error {
    S3Error::new(S3ErrorCode::NoSuchKey)
}

fn no_such_bucket() -> S3Error {
    S3Error::new(S3ErrorCode::NoSuchBucket)
}

/// Removes the directory tree at `dir` if it holds no file, deepest first;
/// false, and nothing removed but empty directories, if it holds one. It
/// never deletes a file, so a write that lands meanwhile is kept (its
/// directory is then not empty).
async fn remove_empty_tree(dir: &Path) -> std::io::Result<bool> {
    let mut found = vec![dir.to_path_buf()];
    let mut next = 0;
    while let Some(d) = found.get(next).cloned() {
        next += 1;
        let mut entries = tokio::fs::read_dir(&d).await?;
        while let Some(e) = entries.next_entry().await? {
            if !e.file_type().await?.is_dir() {
                return Ok(false);
            }
            found.push(e.path());
        }
    }
    for d in found.iter().rev() {
        match tokio::fs::remove_dir(d).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn layout_error(status: http::StatusCode, code: &'static str, msg: String) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::Custom(code.into()), msg);
    e.set_status_code(status);
    e
}

fn copy_source(src: &CopySource) -> Option<(&str, &str)> {
    match src {
        CopySource::Bucket { bucket, key, .. } => Some((bucket, key)),
        _ => None,
    }
}

/// The longest file name Linux file systems take (ext4, XFS, btrfs).
const NAME_MAX: usize = 255;

/// Which of s3s-fs's metadata files a write names after its key:
/// `.bucket-{bucket}.object-{key}[.upload-{id}].metadata.json`, the names
/// in unpadded URL-safe base64, the upload's id a 36-character UUID.
#[derive(Clone, Copy)]
enum Names {
    Object,
    Upload,
}

fn base64_len(bytes: usize) -> usize {
    (4 * bytes).div_ceil(3)
}

/// Why `key` is too long for s3s-fs's file names, if it is: a segment
/// over `NAME_MAX`, or a metadata file name that would be.
fn too_long(bucket: &str, key: &str, names: Names) -> Option<S3Error> {
    let upload = match names {
        Names::Object => 0,
        Names::Upload => ".upload-".len() + 36,
    };
    let fixed = ".bucket-".len()
        + base64_len(bucket.len())
        + ".object-".len()
        + upload
        + ".metadata.json".len();
    let longest = NAME_MAX.saturating_sub(fixed) * 3 / 4;
    let segment = key.split('/').map(str::len).max().unwrap_or(0);
    if key.len() <= longest && segment <= NAME_MAX {
        return None;
    }
    Some(S3Error::with_message(
        S3ErrorCode::KeyTooLongError,
        format!(
            "the key is {} bytes: the embedded store names files after keys and takes \
             keys up to {longest} bytes in bucket {bucket:?}, with no segment over \
             {NAME_MAX} bytes (an S3 backend takes 1024)",
            key.len()
        ),
    ))
}

impl Layout {
    /// s3s-fs on `root`, which must exist.
    pub fn new(root: &Path) -> Result<Layout, String> {
        let fs = s3s_fs::FileSystem::new(root)
            .map_err(|e| format!("embedded store at {}: {e:?}", root.display()))?;
        // The same directory s3s-fs resolves keys under.
        let root = std::env::current_dir()
            .and_then(|cwd| cwd.join(root).canonicalize())
            .map_err(|e| format!("embedded store at {}: {e}", root.display()))?;
        Ok(Layout { fs, root })
    }

    /// Whether `bucket` exists: s3s-fs would make a missing bucket's
    /// directory on the first write into it.
    async fn bucket_exists(&self, bucket: &str) -> bool {
        on_disk(&self.root.join(bucket)).await == OnDisk::Dir
    }

    /// Where s3s-fs keeps `key` (a folder marker's `/` left off).
    fn path(&self, bucket: &str, key: &str) -> PathBuf {
        self.root.join(bucket).join(key.trim_end_matches('/'))
    }

    /// Whether a read of `key` must be answered no such key: its path is
    /// a directory (not an object), or `key` is a folder marker `a/`, which
    /// s3s-fs keeps as the directory `a` (never listed, so never an object
    /// to read) and whose path, when `a` is a file, is that other object's.
    async fn unreadable(&self, bucket: &str, key: &str) -> bool {
        match on_disk(&self.path(bucket, key)).await {
            OnDisk::Dir => true,
            OnDisk::File => key.ends_with('/'),
            OnDisk::Nothing => false,
        }
    }

    /// Whether a delete of `key` has nothing to delete although its path
    /// holds something: a directory for a plain key, a file (another
    /// object) for a folder marker. (A marker's own empty directory is
    /// s3s-fs's to remove.)
    async fn nothing_to_delete(&self, bucket: &str, key: &str) -> bool {
        let other = if key.ends_with('/') {
            OnDisk::File
        } else {
            OnDisk::Dir
        };
        on_disk(&self.path(bucket, key)).await == other
    }

    /// Why `key` cannot be written here, if it cannot. An empty directory
    /// where its file goes (what deleting every key under `key/` leaves) is
    /// removed to make room.
    async fn make_room(&self, bucket: &str, key: &str) -> Option<S3Error> {
        // The directories the key's file (or, for a marker, the key
        // itself) needs: each must not be an object.
        let dirs = match key.strip_suffix('/') {
            Some(marker) => marker,
            None => key.rsplit_once('/').map_or("", |(dirs, _)| dirs),
        };
        let ends = dirs.match_indices('/').map(|(i, _)| i);
        for end in ends.chain((!dirs.is_empty()).then_some(dirs.len())) {
            let above = &dirs[..end];
            if on_disk(&self.path(bucket, above)).await == OnDisk::File {
                return Some(layout_error(
                    http::StatusCode::BAD_REQUEST,
                    "XMinioParentIsObject",
                    format!(
                        "{key:?} cannot be stored: {above:?} is an object, and the embedded \
                         store keeps keys as file paths, so an object is never also a prefix \
                         of other keys (an S3 backend has no such limit)"
                    ),
                ));
            }
        }
        let path = self.path(bucket, key);
        if key.ends_with('/') || on_disk(&path).await != OnDisk::Dir {
            return None;
        }
        // Only an empty directory can be removed; one with keys under it
        // stays, and the write is refused.
        match tokio::fs::remove_dir(&path).await {
            Ok(()) => None,
            Err(_) => Some(layout_error(
                http::StatusCode::CONFLICT,
                "XMinioObjectExistsAsDirectory",
                format!(
                    "{key:?} cannot be stored: other keys begin with \"{key}/\", and the \
                     embedded store keeps keys as file paths (an S3 backend has no such limit)"
                ),
            )),
        }
    }

    /// A write's answer: refused before s3s-fs starts it when the layout
    /// cannot hold it (a key too long for its file names, an object or
    /// directory in the way); an internal error (a conflict that came meanwhile)
    /// explained the same way.
    async fn write<T, F>(&self, bucket: &str, key: &str, names: Names, run: F) -> S3Result<T>
    where
        F: Future<Output = S3Result<T>>,
    {
        if !self.bucket_exists(bucket).await {
            return Err(no_such_bucket());
        }
        if let Some(e) = too_long(bucket, key, names) {
            return Err(e);
        }
        if let Some(e) = self.make_room(bucket, key).await {
            return Err(e);
        }
        match run.await {
            Err(e) if *e.code() == S3ErrorCode::InternalError => {
                Err(self.make_room(bucket, key).await.unwrap_or(e))
            }
            done => done,
        }
    }

    /// A read's answer: no such key when no object can be there.
    async fn read<T, F>(&self, bucket: &str, key: &str, run: F) -> S3Result<T>
    where
        F: Future<Output = S3Result<T>>,
    {
        if !self.bucket_exists(bucket).await {
            return Err(no_such_bucket());
        }
        if self.unreadable(bucket, key).await {
            return Err(no_such_key());
        }
        run.await
    }
}

/// A GET's or HEAD's conditions: their inputs name them alike.
macro_rules! conditions_of {
    ($input:expr) => {
        ReadConditions {
            if_match: $input.if_match.clone(),
            if_none_match: $input.if_none_match.clone(),
            if_modified_since: $input.if_modified_since.clone(),
            if_unmodified_since: $input.if_unmodified_since.clone(),
        }
    };
}

/// The digests a PutObject's or UploadPart's head claims: their inputs
/// name them alike.
macro_rules! claimed_digests {
    ($input:expr) => {
        put_checks::Claimed {
            content_md5: $input.content_md5.clone(),
            algorithm: $input
                .checksum_algorithm
                .as_ref()
                .map(|a| a.as_str().to_string()),
            sums: Checksum {
                checksum_crc32: $input.checksum_crc32.clone(),
                checksum_crc32c: $input.checksum_crc32c.clone(),
                checksum_sha1: $input.checksum_sha1.clone(),
                checksum_sha256: $input.checksum_sha256.clone(),
                checksum_crc64nvme: $input.checksum_crc64nvme.clone(),
                ..Default::default()
            },
        }
    };
}

#[async_trait::async_trait]
impl S3 for Layout {
    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let (b, k) = (req.input.bucket.clone(), req.input.key.clone());
        let conditions = conditions_of!(req.input);
        // Checked against the object the answer carries (its file open).
        let resp = self.read(&b, &k, self.fs.get_object(req)).await?;
        let out = &resp.output;
        conditions.check(out.e_tag.as_ref(), out.last_modified.as_ref())?;
        Ok(resp)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let (b, k) = (req.input.bucket.clone(), req.input.key.clone());
        let conditions = conditions_of!(req.input);
        let resp = self.read(&b, &k, self.fs.head_object(req)).await?;
        let out = &resp.output;
        conditions.check(out.e_tag.as_ref(), out.last_modified.as_ref())?;
        Ok(resp)
    }

    async fn put_object(
        &self,
        mut req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let (b, k) = (req.input.bucket.clone(), req.input.key.clone());
        let claimed = claimed_digests!(req.input);
        let verdict =
            put_checks::checked(claimed, &mut req.input.body, req.trailing_headers.clone())?;
        let put = self.write(&b, &k, Names::Object, self.fs.put_object(req));
        put.await.map_err(|e| verdict.explain(e))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        if let Some((b, k)) = copy_source(&req.input.copy_source)
            && self.unreadable(b, k).await
        {
            return Err(no_such_key());
        }
        let (b, k) = (req.input.bucket.clone(), req.input.key.clone());
        self.write(&b, &k, Names::Object, self.fs.copy_object(req))
            .await
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let source =
            copy_source(&req.input.copy_source).map(|(b, k)| (b.to_string(), k.to_string()));
        match source {
            Some((b, k)) => self.read(&b, &k, self.fs.upload_part_copy(req)).await,
            None => self.fs.upload_part_copy(req).await,
        }
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let (b, k) = (req.input.bucket.clone(), req.input.key.clone());
        self.write(&b, &k, Names::Upload, self.fs.create_multipart_upload(req))
            .await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let (b, k) = (req.input.bucket.clone(), req.input.key.clone());
        self.write(
            &b,
            &k,
            Names::Object,
            self.fs.complete_multipart_upload(req),
        )
        .await
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        if self
            .nothing_to_delete(&req.input.bucket, &req.input.key)
            .await
        {
            return Ok(S3Response::new(DeleteObjectOutput::default()));
        }
        self.fs.delete_object(req).await
    }

    async fn delete_objects(
        &self,
        mut req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        // Keys with nothing to delete are answered here: s3s-fs would fail
        // the whole request on the first, after deleting the keys before it.
        let mut absent = Vec::new();
        let mut present = Vec::new();
        for object in std::mem::take(&mut req.input.delete.objects) {
            if self.nothing_to_delete(&req.input.bucket, &object.key).await {
                absent.push(DeletedObject {
                    key: Some(object.key),
                    version_id: object.version_id,
                    ..Default::default()
                });
            } else {
                present.push(object);
            }
        }
        req.input.delete.objects = present;
        let mut resp = self.fs.delete_objects(req).await?;
        resp.output
            .deleted
            .get_or_insert_with(Vec::new)
            .extend(absent);
        Ok(resp)
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        self.fs.create_bucket(req).await
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        // s3s-fs would remove the bucket's directory with every object in
        // it; S3 deletes only an empty bucket.
        if !self.bucket_exists(&req.input.bucket).await {
            return self.fs.delete_bucket(req).await;
        }
        match remove_empty_tree(&self.root.join(&req.input.bucket)).await {
            Ok(true) => Ok(S3Response::new(DeleteBucketOutput {})),
            Ok(false) => Err(S3Error::with_message(
                S3ErrorCode::BucketNotEmpty,
                "the bucket you tried to delete is not empty",
            )),
            Err(e) => Err(S3Error::internal_error(e)),
        }
    }

    // The rest s3s-fs answers as S3 does: passed on as they are. (A
    // method left out here would answer 501 NotImplemented.)

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.fs.get_bucket_location(req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.fs.head_bucket(req).await
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.fs.list_buckets(req).await
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        self.fs.list_objects(req).await
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        self.fs.list_objects_v2(req).await
    }

    async fn upload_part(
        &self,
        mut req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let claimed = claimed_digests!(req.input);
        let verdict =
            put_checks::checked(claimed, &mut req.input.body, req.trailing_headers.clone())?;
        self.fs
            .upload_part(req)
            .await
            .map_err(|e| verdict.explain(e))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        self.fs.list_parts(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.fs.abort_multipart_upload(req).await
    }
}
