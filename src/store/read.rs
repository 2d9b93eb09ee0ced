//! The conditions of a GET or HEAD (`If-Match`, `If-None-Match`,
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

use s3s::dto::{ETag, ETagCondition, Timestamp};
use s3s::{S3Error, S3ErrorCode, S3Result};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn at(secs: u64) -> Timestamp {
        Timestamp::from(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
    }

    fn tag(v: &str) -> ETagCondition {
        ETagCondition::ETag(ETag::Strong(v.into()))
    }

    fn answer(c: ReadConditions) -> u16 {
        // The object: ETag "abc", modified at 1000.5 s.
        let modified = Timestamp::from(SystemTime::UNIX_EPOCH + Duration::from_millis(1_000_500));
        match c.check(Some(&ETag::Strong("abc".into())), Some(&modified)) {
            Ok(()) => 200,
            Err(e) => e.status_code().map_or(0, |s| s.as_u16()),
        }
    }

    fn conditions() -> ReadConditions {
        ReadConditions {
            if_match: None,
            if_none_match: None,
            if_modified_since: None,
            if_unmodified_since: None,
        }
    }

    /// The table S3 documents for GetObject, and the second precision of
    /// HTTP dates (the object's 1000.5 s is "1000" to a client).
    #[test]
    fn conditions_answer_as_s3_does() {
        let cases: Vec<(ReadConditions, u16)> = vec![
            (conditions(), 200),
            (
                ReadConditions {
                    if_match: Some(tag("abc")),
                    ..conditions()
                },
                200,
            ),
            (
                ReadConditions {
                    if_match: Some(ETagCondition::Any),
                    ..conditions()
                },
                200,
            ),
            (
                ReadConditions {
                    if_match: Some(tag("xyz")),
                    ..conditions()
                },
                412,
            ),
            (
                ReadConditions {
                    if_none_match: Some(tag("abc")),
                    ..conditions()
                },
                304,
            ),
            (
                ReadConditions {
                    if_none_match: Some(ETagCondition::Any),
                    ..conditions()
                },
                304,
            ),
            (
                ReadConditions {
                    if_none_match: Some(tag("xyz")),
                    ..conditions()
                },
                200,
            ),
            (
                ReadConditions {
                    if_modified_since: Some(at(1000)),
                    ..conditions()
                },
                304,
            ),
            (
                ReadConditions {
                    if_modified_since: Some(at(999)),
                    ..conditions()
                },
                200,
            ),
            (
                ReadConditions {
                    if_unmodified_since: Some(at(1000)),
                    ..conditions()
                },
                200,
            ),
            (
                ReadConditions {
                    if_unmodified_since: Some(at(999)),
                    ..conditions()
                },
                412,
            ),
            // If-Match holds: If-Unmodified-Since is not looked at.
            (
                ReadConditions {
                    if_match: Some(tag("abc")),
                    if_unmodified_since: Some(at(999)),
                    ..conditions()
                },
                200,
            ),
            // If-None-Match does not match: If-Modified-Since is not looked at.
            (
                ReadConditions {
                    if_none_match: Some(tag("xyz")),
                    if_modified_since: Some(at(1000)),
                    ..conditions()
                },
                200,
            ),
            // 412 before 304.
            (
                ReadConditions {
                    if_match: Some(tag("xyz")),
                    if_none_match: Some(tag("abc")),
                    ..conditions()
                },
                412,
            ),
        ];
        for (i, (c, want)) in cases.into_iter().enumerate() {
            assert_eq!(answer(c), want, "case {i}");
        }
    }
}
