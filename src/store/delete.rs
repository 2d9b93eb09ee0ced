//! DeleteObject and DeleteObjects, each one step of a commit: the
//! conditions (ETag, last-modified time, size) are checked in the step
//! that deletes, so they hold atomically. A key that does not exist is
//! deleted already (204), unless an `If-Match` asked for it (404).

use super::conditions::precondition_failed;
use super::index::{BUCKETS, OBJECTS, ObjectRecord};
use super::objects::current;
use super::{Store, blob_unref, bucket_exists, check_key, check_version};
use redb::WriteTransaction;
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

/// A delete's conditions (AWS's conditional deletes).
#[derive(Default, Clone)]
struct DeleteConditions {
    etag: Option<ETagCondition>,
    modified: Option<Timestamp>,
    size: Option<i64>,
}

impl DeleteConditions {
    fn check(&self, current: Option<&ObjectRecord>) -> S3Result<()> {
        let Some(cur) = current else {
            return match self.etag {
                Some(_) => Err(s3_error!(
                    NoSuchKey,
                    "the key does not exist, so If-Match cannot hold"
                )),
                None => Ok(()),
            };
        };
        let etag_ok = self
            .etag
            .as_ref()
            .is_none_or(|c| c.is_any() || c.as_etag().is_some_and(|e| e.value() == cur.etag));
        let secs = |t: &Timestamp| time::OffsetDateTime::from(t.clone()).unix_timestamp();
        let modified_ok = self
            .modified
            .as_ref()
            .is_none_or(|t| secs(t) == cur.last_modified_ms.div_euclid(1000));
        let size_ok = self.size.is_none_or(|s| u64::try_from(s) == Ok(cur.size));
        if etag_ok && modified_ok && size_ok {
            Ok(())
        } else {
            Err(precondition_failed())
        }
    }
}

/// Deletes `(bucket, key)` in `txn` if `cond` holds; returns the blobs
/// nobody uses any more, or the refusal.
fn delete_record(
    txn: &WriteTransaction,
    bucket: &str,
    key: &str,
    cond: &DeleteConditions,
) -> Result<S3Result<Vec<u128>>, redb::Error> {
    let mut objects = txn.open_table(OBJECTS)?;
    let old = current(&objects, bucket, key)?;
    if let Err(e) = cond.check(old.as_ref()) {
        return Ok(Err(e));
    }
    let Some(old) = old else {
        return Ok(Ok(Vec::new()));
    };
    objects.remove((bucket, key))?;
    drop(objects);
    let mut unused = Vec::new();
    for b in old.blobs() {
        if blob_unref(txn, b)? {
            unused.push(b);
        }
    }
    Ok(Ok(unused))
}

impl Store {
    pub(super) async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let input = req.input;
        check_key(&input.key)?;
        check_version(input.version_id.as_deref())?;
        let cond = DeleteConditions {
            etag: input.if_match,
            modified: input.if_match_last_modified_time,
            size: input.if_match_size,
        };
        let (bucket, key) = (input.bucket, input.key);
        let unused = self
            .commit(move |txn| {
                if let Err(e) = bucket_exists(&txn.open_table(BUCKETS)?, &bucket)? {
                    return Ok(Err(e));
                }
                delete_record(txn, &bucket, &key, &cond)
            })
            .await?;
        self.blobs.remove_later(unused);
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    pub(super) async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        let quiet = input.delete.quiet.unwrap_or(false);
        let objects = input.delete.objects;
        if objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "more than 1000 keys"));
        }
        let bucket = input.bucket;
        let (results, unused) = self
            .commit(move |txn| {
                if let Err(e) = bucket_exists(&txn.open_table(BUCKETS)?, &bucket)? {
                    return Ok(Err(e));
                }
                let mut results = Vec::new();
                let mut unused = Vec::new();
                for o in objects {
                    let cond = DeleteConditions {
                        etag: o.e_tag.clone().map(ETagCondition::ETag),
                        modified: o.last_modified_time.clone(),
                        size: o.size,
                    };
                    let refused =
                        check_key(&o.key).and_then(|()| check_version(o.version_id.as_deref()));
                    let r = match refused {
                        Err(e) => Err(e),
                        Ok(()) => delete_record(txn, &bucket, &o.key, &cond)?,
                    };
                    match r {
                        Ok(gone) => {
                            unused.extend(gone);
                            results.push((o, None));
                        }
                        Err(e) => results.push((o, Some(e))),
                    }
                }
                Ok(Ok((results, unused)))
            })
            .await?;
        self.blobs.remove_later(unused);
        let mut out = DeleteObjectsOutput::default();
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for (o, e) in results {
            match e {
                None if quiet => {}
                None => deleted.push(DeletedObject {
                    key: Some(o.key),
                    version_id: o.version_id,
                    ..Default::default()
                }),
                Some(e) => errors.push(Error {
                    code: Some(e.code().as_str().to_string()),
                    key: Some(o.key),
                    message: e.message().map(str::to_string),
                    version_id: o.version_id,
                }),
            }
        }
        out.deleted = Some(deleted);
        out.errors = Some(errors);
        Ok(S3Response::new(out))
    }
}

#[cfg(test)]
mod tests {
    use super::super::index::{Checksums, Headers};
    use super::*;

    #[test]
    fn delete_conditions_answer_as_aws_does() {
        let cur = ObjectRecord {
            segments: vec![],
            size: 5,
            etag: "e1".into(),
            last_modified_ms: 1_700_000_000_500,
            headers: Headers::default(),
            checksums: Checksums::default(),
            parts: vec![],
            upload_id: None,
        };
        let at = |s: i64| Timestamp::from(time::OffsetDateTime::from_unix_timestamp(s).unwrap());
        let code = |c: DeleteConditions, cur: Option<&ObjectRecord>| {
            c.check(cur).err().map(|e| e.code().as_str().to_string())
        };
        let tag = |t: &str| Some(ETagCondition::ETag(ETag::Strong(t.into())));
        let c = |etag, modified, size| DeleteConditions {
            etag,
            modified,
            size,
        };
        assert_eq!(
            code(c(tag("e1"), Some(at(1_700_000_000)), Some(5)), Some(&cur)),
            None
        );
        assert_eq!(
            code(c(Some(ETagCondition::Any), None, None), Some(&cur)),
            None
        );
        assert_eq!(
            code(c(tag("e2"), None, None), Some(&cur)).as_deref(),
            Some("PreconditionFailed")
        );
        assert_eq!(
            code(c(None, Some(at(1_700_000_001)), None), Some(&cur)).as_deref(),
            Some("PreconditionFailed")
        );
        assert_eq!(
            code(c(None, None, Some(6)), Some(&cur)).as_deref(),
            Some("PreconditionFailed")
        );
        assert_eq!(
            code(c(tag("e1"), None, None), None).as_deref(),
            Some("NoSuchKey")
        );
        assert_eq!(
            code(c(None, None, Some(6)), None),
            None,
            "nothing to delete"
        );
    }
}
