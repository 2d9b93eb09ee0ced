//! Access control lists, as far as this store has them: it has one
//! credential and one owner, so every bucket and object is private to it.
//! The ACL reads answer that (the owner, with FULL_CONTROL), and the ACL
//! writes accept what changes nothing (`private`, or a policy granting the
//! owner alone FULL_CONTROL) and refuse anything else with `501`, rather
//! than accept a grant they would not keep. fencegate's own credentials
//! decide who may read and write.

use super::index::{BUCKETS, OBJECTS};
use super::listing::owner;
use super::{Store, bucket_exists, internal};
use s3s::dto::*;
use s3s::{S3Request, S3Response, S3Result, s3_error};

/// The one grant every bucket and object has.
fn owner_full_control() -> Vec<Grant> {
    let o = owner();
    vec![Grant {
        grantee: Some(Grantee {
            display_name: o.display_name,
            id: o.id,
            type_: Type::from_static(Type::CANONICAL_USER),
            email_address: None,
            uri: None,
        }),
        permission: Some(Permission::from_static(Permission::FULL_CONTROL)),
    }]
}

/// Whether an ACL write asks for nothing but the owner's full control.
fn changes_nothing(
    canned: Option<&str>,
    policy: Option<&AccessControlPolicy>,
    grants: [Option<&String>; 5],
) -> bool {
    let canned_ok = canned.is_none_or(|c| c == ObjectCannedACL::PRIVATE);
    let policy_ok = policy.is_none_or(|p| {
        p.grants.as_deref().unwrap_or_default().iter().all(|g| {
            let full = g
                .permission
                .as_ref()
                .is_some_and(|p| p.as_str() == Permission::FULL_CONTROL);
            let mine = g
                .grantee
                .as_ref()
                .is_some_and(|e| e.id.as_deref() == owner().id.as_deref());
            full && mine
        })
    });
    canned_ok && policy_ok && grants.iter().all(Option::is_none)
}

fn not_kept() -> s3s::S3Error {
    s3_error!(
        NotImplemented,
        "the embedded store keeps no grants: every bucket and object is private to its owner"
    )
}

impl Store {
    /// The object exists (or `NoSuchKey`).
    async fn object_exists(&self, bucket: String, key: String) -> S3Result<()> {
        self.in_read_txn(move |txn| {
            let buckets = txn.open_table(BUCKETS).map_err(internal)?;
            bucket_exists(&buckets, &bucket).map_err(internal)??;
            let t = txn.open_table(OBJECTS).map_err(internal)?;
            match t.get((bucket.as_str(), key.as_str())).map_err(internal)? {
                Some(_) => Ok(()),
                None => Err(s3_error!(NoSuchKey, "the key does not exist")),
            }
        })
        .await
    }

    pub(super) async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        self.object_exists(req.input.bucket, req.input.key).await?;
        Ok(S3Response::new(GetObjectAclOutput {
            owner: Some(owner()),
            grants: Some(owner_full_control()),
            ..Default::default()
        }))
    }

    pub(super) async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        let i = req.input;
        let grants = [
            &i.grant_full_control,
            &i.grant_read,
            &i.grant_read_acp,
            &i.grant_write,
            &i.grant_write_acp,
        ];
        if !changes_nothing(
            i.acl.as_ref().map(|a| a.as_str()),
            i.access_control_policy.as_ref(),
            grants.map(Option::as_ref),
        ) {
            return Err(not_kept());
        }
        self.object_exists(i.bucket, i.key).await?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }

    pub(super) async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        let bucket = req.input.bucket;
        self.bucket_must_exist(bucket).await?;
        Ok(S3Response::new(GetBucketAclOutput {
            owner: Some(owner()),
            grants: Some(owner_full_control()),
        }))
    }

    pub(super) async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        let i = req.input;
        let grants = [
            &i.grant_full_control,
            &i.grant_read,
            &i.grant_read_acp,
            &i.grant_write,
            &i.grant_write_acp,
        ];
        if !changes_nothing(
            i.acl.as_ref().map(|a| a.as_str()),
            i.access_control_policy.as_ref(),
            grants.map(Option::as_ref),
        ) {
            return Err(not_kept());
        }
        let bucket = i.bucket;
        self.bucket_must_exist(bucket).await?;
        Ok(S3Response::new(PutBucketAclOutput::default()))
    }
}
