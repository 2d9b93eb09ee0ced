//! The conditions a write of an object is checked against: `If-None-Match`
//! and `If-Match` of a PutObject, a CompleteMultipartUpload and a
//! CopyObject's destination, and the `412` a failed one answers (`404
//! NoSuchKey` for an `If-Match` on no object, as AWS). They are
//! checked in the step that commits the write (`commit.rs`), against the
//! object as that step sees it, so a condition holds for the change it
//! lets through. (A delete's conditions are `delete.rs`'s, a read's
//! `read.rs`'s.)

use super::index::ObjectRecord;
use s3s::dto::*;
use s3s::{S3Error, S3Result, s3_error};

/// The conditions a write of an object is checked against, in the step
/// that commits it.
#[derive(Default, Clone)]
pub(super) struct WriteConditions {
    pub if_match: Option<ETagCondition>,
    pub if_none_match: Option<ETagCondition>,
}

impl WriteConditions {
    pub(super) fn check(&self, current: Option<&ObjectRecord>) -> S3Result<()> {
        if let Some(c) = &self.if_none_match
            && current.is_some_and(|cur| c.is_any() || etag_is(c, cur))
        {
            return Err(precondition_failed());
        }
        if let Some(c) = &self.if_match {
            match current {
                None => {
                    return Err(s3_error!(
                        NoSuchKey,
                        "the key does not exist, so If-Match cannot hold"
                    ));
                }
                Some(cur) if !c.is_any() && !etag_is(c, cur) => return Err(precondition_failed()),
                Some(_) => {}
            }
        }
        Ok(())
    }
}

fn etag_is(c: &ETagCondition, cur: &ObjectRecord) -> bool {
    c.as_etag().is_some_and(|e| e.value() == cur.etag)
}

/// The answer to a condition that does not hold.
pub(super) fn precondition_failed() -> S3Error {
    s3_error!(
        PreconditionFailed,
        "At least one of the pre-conditions you specified did not hold"
    )
}

#[cfg(test)]
mod tests {
    use super::super::index::{Checksums, Headers};
    use super::*;

    fn record(etag: &str) -> ObjectRecord {
        ObjectRecord {
            segments: vec![],
            size: 10,
            etag: etag.into(),
            last_modified_ms: 0,
            headers: Headers::default(),
            checksums: Checksums::default(),
            parts: vec![4, 6],
            upload_id: None,
        }
    }

    #[test]
    fn write_conditions_answer_as_s3_does() {
        let tag = |t: &str| Some(ETagCondition::ETag(ETag::Strong(t.into())));
        let code = |c: WriteConditions, cur: Option<&ObjectRecord>| {
            c.check(cur).err().map(|e| e.code().as_str().to_string())
        };
        let absent = WriteConditions {
            if_none_match: Some(ETagCondition::Any),
            ..Default::default()
        };
        let swap = WriteConditions {
            if_match: tag("e1"),
            ..Default::default()
        };
        let e1 = record("e1");
        assert_eq!(code(absent.clone(), None), None);
        assert_eq!(
            code(absent, Some(&e1)).as_deref(),
            Some("PreconditionFailed")
        );
        assert_eq!(code(swap.clone(), Some(&e1)), None);
        assert_eq!(
            code(swap.clone(), Some(&record("e2"))).as_deref(),
            Some("PreconditionFailed")
        );
        assert_eq!(code(swap, None).as_deref(), Some("NoSuchKey"));
    }
}
