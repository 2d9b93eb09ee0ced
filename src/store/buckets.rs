//! Buckets: CreateBucket, DeleteBucket (only one without objects; uploads
//! still open go with it, as on S3), HeadBucket, GetBucketLocation, ListBuckets. A bucket is
//! a row of the index; its objects are rows under its name.

use super::index::{BUCKETS, OBJECTS, UPLOADS};
use super::multipart::drop_upload;
use super::{Store, internal, now_ms, timestamp};
use redb::ReadableTable;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

impl Store {
    pub(super) async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let bucket = req.input.bucket;
        self.commit(move |txn| {
            let mut t = txn.open_table(BUCKETS)?;
            // Made again by its owner (the store has one): done, as AWS
            // answers in us-east-1.
            if t.get(bucket.as_str())?.is_none() {
                t.insert(bucket.as_str(), now_ms() as u64)?;
            }
            Ok(Ok(()))
        })
        .await?;
        Ok(S3Response::new(CreateBucketOutput::default()))
    }

    pub(super) async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let bucket = req.input.bucket;
        let unused = self
            .commit(move |txn| {
                let b = bucket.as_str();
                let mut t = txn.open_table(BUCKETS)?;
                if t.get(b)?.is_none() {
                    let e = s3_error!(NoSuchBucket, "the bucket {bucket} does not exist");
                    return Ok(Err(e));
                }
                let objects = txn.open_table(OBJECTS)?;
                let first = objects.range((b, "")..)?.next().transpose()?;
                if first.is_some_and(|(k, _)| k.value().0 == b) {
                    let e = s3_error!(BucketNotEmpty, "the bucket {bucket} holds objects");
                    return Ok(Err(e));
                }
                t.remove(b)?;
                // Uploads still open go with the bucket, as on S3.
                let mut open = Vec::new();
                for item in txn.open_table(UPLOADS)?.range((b, "", "")..)? {
                    let (k, _) = item?;
                    let (ub, key, id) = k.value();
                    if ub != b {
                        break;
                    }
                    open.push((key.to_string(), id.to_string()));
                }
                let mut unused = Vec::new();
                for (key, id) in &open {
                    unused.extend(drop_upload(txn, (b, key, id))?);
                }
                Ok(Ok(unused))
            })
            .await?;
        self.blobs.remove_later(unused);
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    pub(super) async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let bucket = req.input.bucket;
        self.bucket_must_exist(bucket).await?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    pub(super) async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let bucket = req.input.bucket;
        self.bucket_must_exist(bucket).await?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    pub(super) async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let buckets = self
            .in_read_txn(|txn| {
                let t = txn.open_table(BUCKETS).map_err(internal)?;
                let mut out = Vec::new();
                for item in t.iter().map_err(internal)? {
                    let (name, created) = item.map_err(internal)?;
                    out.push(Bucket {
                        name: Some(name.value().to_string()),
                        creation_date: Some(timestamp(created.value() as i64)),
                        ..Default::default()
                    });
                }
                Ok(out)
            })
            .await?;
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(super::listing::owner()),
            ..Default::default()
        }))
    }
}
