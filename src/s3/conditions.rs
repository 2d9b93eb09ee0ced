//! A write's conditions (CONTRACT §8), read once from the request, and
//! judged by fencegate itself against the object as it is while the object
//! is held (`fence::hold`), so that they hold on every store, whether or
//! not the store honours them:
//!
//! - PutObject, CopyObject (its destination) and CompleteMultipartUpload:
//!   `If-None-Match: *` (only if absent) and `If-Match: <etag>` (only the
//!   version read);
//! - DeleteObject: `If-Match`, `x-amz-if-match-last-modified-time` and
//!   `x-amz-if-match-size`; each key of DeleteObjects: its `ETag`,
//!   `LastModifiedTime` and `Size` (`s3::multi_delete`).
//!
//! The verdicts are AWS's (docs/conditional-writes.md has the table and its
//! sources): a condition that does not hold is `412 PreconditionFailed`;
//! `If-Match` on a key that does not exist is `404 NoSuchKey`; the size and
//! time conditions of a delete hold for a key that does not exist (the
//! delete then deletes nothing). What AWS does not implement is
//! `501 NotImplemented`: `If-None-Match` other than `*`, `If-Match: *` on a
//! write, both headers at once, conditions on a delete of a given version.
//! `If-Match` compares the whole value as one ETag (AWS reads no list);
//! ETags compare without their quotes; times compare in whole seconds, the
//! precision of the HTTP dates both sides send.

use super::error::S3Error;
use super::op::Op;
use http::HeaderMap;
use http::header::{AsHeaderName, IF_MATCH, IF_NONE_MATCH};

pub const X_AMZ_IF_MATCH_LAST_MODIFIED_TIME: &str = "x-amz-if-match-last-modified-time";
pub const X_AMZ_IF_MATCH_SIZE: &str = "x-amz-if-match-size";

/// What a condition asks of the object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conditions {
    /// `If-Match`: the object exists with this ETag (unquoted); `*`
    /// (deletes only) matches any existing object.
    pub if_match: Option<String>,
    /// `If-None-Match: *`: the object does not exist.
    pub if_none_match: bool,
    /// The object was last modified at this Unix second.
    pub last_modified: Option<i64>,
    /// The object is this many bytes.
    pub size: Option<u64>,
}

/// The object as the backend has it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// Without its quotes.
    pub etag: String,
    /// Unix seconds.
    pub last_modified: Option<i64>,
    pub size: Option<u64>,
}

/// Why a condition failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// `412 PreconditionFailed`.
    Precondition,
    /// `404 NoSuchKey`: `If-Match` (or another condition on the object's
    /// version) on a key that does not exist.
    Missing,
}

impl Failed {
    /// The answer to a whole request whose condition failed on `object`.
    pub fn error(self, object: &str) -> S3Error {
        match self {
            Failed::Precondition => S3Error::PreconditionFailed(format!(
                "At least one of the pre-conditions you specified did not hold ({object})"
            )),
            Failed::Missing => S3Error::NoSuchKey(format!(
                "The specified key does not exist ({object}), so If-Match cannot hold"
            )),
        }
    }
}

/// An ETag without its quotes (and without a weak marker, which S3 never
/// gives).
pub fn bare_etag(s: &str) -> &str {
    let s = s.trim();
    let s = s.strip_prefix("W/").unwrap_or(s);
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

/// A header given at most once, as text. `name` is a `&HeaderName` where
/// one is defined (looked up without parsing and hashing its letters).
fn one_header<N>(headers: &HeaderMap, name: N) -> Result<Option<&str>, S3Error>
where
    N: AsHeaderName + Copy + std::fmt::Display,
{
    let mut all = headers.get_all(name).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(S3Error::InvalidArgument(format!(
            "the {name} header is given more than once"
        )));
    }
    v.to_str()
        .map(|s| Some(s.trim()))
        .map_err(|_| S3Error::InvalidArgument(format!("the {name} header is not text")))
}

/// An HTTP date (IMF-fixdate, or the two obsolete forms HTTP allows) or an
/// ISO 8601 time, as Unix seconds.
pub fn parse_time(s: &str) -> Option<i64> {
    if let Ok(t) = httpdate::parse_http_date(s) {
        return t
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_secs()).ok());
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some(t.unix_timestamp())
}

impl Conditions {
    /// The conditions of a write request, `None` when it has none. Only the
    /// writes that replace or delete an object have conditions fencegate
    /// judges; on others these headers are forwarded as they are.
    /// `versioned`: the request names a version of its object.
    pub fn of_request(
        headers: &HeaderMap,
        op: Op,
        versioned: bool,
    ) -> Result<Option<Conditions>, S3Error> {
        let deletes = op == Op::DeleteObject;
        if !(deletes || op.replaces_object()) {
            return Ok(None);
        }
        let not_implemented = |what: String| {
            S3Error::NotImplemented(format!(
                "A header you provided implies functionality that is not implemented: {what}"
            ))
        };
        let mut c = Conditions::default();
        if let Some(v) = one_header(headers, &IF_MATCH)? {
            let tag = bare_etag(v);
            if tag.is_empty() {
                return Err(S3Error::InvalidArgument("If-Match is empty".into()));
            }
            if tag == "*" && !deletes {
                return Err(not_implemented(
                    "If-Match: * (a write takes the ETag it replaces)".into(),
                ));
            }
            c.if_match = Some(tag.to_string());
        }
        if let Some(v) = one_header(headers, &IF_NONE_MATCH)? {
            if deletes {
                return Err(not_implemented("If-None-Match on DeleteObject".into()));
            }
            if v != "*" {
                return Err(not_implemented(format!(
                    "If-None-Match: {v} (a write takes only `*`, create only if absent)"
                )));
            }
            if c.if_match.is_some() {
                return Err(not_implemented(
                    "If-Match and If-None-Match together".into(),
                ));
            }
            c.if_none_match = true;
        }
        if deletes {
            if let Some(v) = one_header(headers, X_AMZ_IF_MATCH_LAST_MODIFIED_TIME)? {
                c.last_modified = Some(parse_time(v).ok_or_else(|| {
                    S3Error::InvalidArgument(format!(
                        "{X_AMZ_IF_MATCH_LAST_MODIFIED_TIME}: {v:?} is not an HTTP date"
                    ))
                })?);
            }
            if let Some(v) = one_header(headers, X_AMZ_IF_MATCH_SIZE)? {
                c.size = Some(v.parse().map_err(|_| {
                    S3Error::InvalidArgument(format!(
                        "{X_AMZ_IF_MATCH_SIZE}: {v:?} is not a size in bytes"
                    ))
                })?);
            }
        }
        if c == Conditions::default() {
            return Ok(None);
        }
        if versioned && deletes {
            return Err(not_implemented(
                "conditions on the delete of a given version (versionId)".into(),
            ));
        }
        Ok(Some(c))
    }

    /// Whether these are `If-Match` / `If-None-Match` only: the conditions
    /// a store that honours them judges itself (a delete's time and size
    /// conditions are fencegate's alone to judge).
    pub fn only_etag_conditions(&self) -> bool {
        self.last_modified.is_none() && self.size.is_none()
    }

    /// Whether the conditions hold for the object as it is (`None`: there
    /// is none).
    pub fn judge(&self, current: Option<&Current>) -> Result<(), Failed> {
        let Some(cur) = current else {
            // Absent: `If-Match` cannot hold; `If-None-Match` does, and so
            // do a delete's size and time (there is nothing to delete).
            return match self.if_match {
                Some(_) => Err(Failed::Missing),
                None => Ok(()),
            };
        };
        let holds = !self.if_none_match
            && self
                .if_match
                .as_ref()
                .is_none_or(|t| t == "*" || *t == cur.etag)
            && self
                .last_modified
                .is_none_or(|t| cur.last_modified == Some(t))
            && self.size.is_none_or(|s| cur.size == Some(s));
        if holds {
            Ok(())
        } else {
            Err(Failed::Precondition)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    fn of(op: Op, pairs: &[(&str, &str)]) -> Result<Option<Conditions>, S3Error> {
        Conditions::of_request(&headers(pairs), op, false)
    }

    fn cur(etag: &str) -> Current {
        Current {
            etag: etag.into(),
            last_modified: Some(1_700_000_000),
            size: Some(5),
        }
    }

    #[test]
    fn verdicts_as_s3_gives_them() {
        use Failed::*;
        let put = |pairs: &[(&str, &str)]| of(Op::PutObject, pairs).unwrap().unwrap();
        let del = |pairs: &[(&str, &str)]| of(Op::DeleteObject, pairs).unwrap().unwrap();
        let absent = put(&[("if-none-match", "*")]);
        let swap = put(&[("if-match", "\"e1\"")]);
        let table: Vec<(&Conditions, Option<Current>, Result<(), Failed>)> = vec![
            (&absent, None, Ok(())),
            (&absent, Some(cur("e1")), Err(Precondition)),
            (&swap, Some(cur("e1")), Ok(())),
            (&swap, Some(cur("e2")), Err(Precondition)),
            (&swap, None, Err(Missing)),
        ];
        for (c, current, want) in table {
            assert_eq!(c.judge(current.as_ref()), want, "{c:?} on {current:?}");
        }
        let any = del(&[("if-match", "*")]);
        assert_eq!(any.judge(Some(&cur("x"))), Ok(()));
        assert_eq!(any.judge(None), Err(Missing));
        // A list is one (wrong) ETag to AWS.
        let list = put(&[("if-match", "\"a\", \"e1\"")]);
        assert_eq!(list.judge(Some(&cur("e1"))), Err(Precondition));

        let when = "Tue, 14 Nov 2023 22:13:20 GMT"; // 1_700_000_000
        let by_time = del(&[(X_AMZ_IF_MATCH_LAST_MODIFIED_TIME, when)]);
        assert_eq!(by_time.last_modified, Some(1_700_000_000));
        assert_eq!(by_time.judge(Some(&cur("e"))), Ok(()));
        let mut later = cur("e");
        later.last_modified = Some(1_700_000_001);
        assert_eq!(by_time.judge(Some(&later)), Err(Precondition));
        assert_eq!(by_time.judge(None), Ok(()), "nothing to delete");
        let by_size = del(&[(X_AMZ_IF_MATCH_SIZE, "5")]);
        assert_eq!(by_size.judge(Some(&cur("e"))), Ok(()));
        let by_size = del(&[(X_AMZ_IF_MATCH_SIZE, "6")]);
        assert_eq!(by_size.judge(Some(&cur("e"))), Err(Precondition));
    }

    #[test]
    fn what_is_read_and_what_is_refused() {
        assert_eq!(of(Op::PutObject, &[]).unwrap(), None);
        // Conditions of reads and of writes that change no object's
        // version are not fencegate's to judge.
        assert_eq!(of(Op::GetObject, &[("if-match", "x")]).unwrap(), None);
        assert_eq!(of(Op::UploadPart, &[("if-none-match", "*")]).unwrap(), None);
        // The delete conditions belong to DeleteObject only.
        assert_eq!(
            of(Op::PutObject, &[(X_AMZ_IF_MATCH_SIZE, "5")]).unwrap(),
            None
        );
        for (op, bad) in [
            (Op::PutObject, ("if-none-match", "\"e1\"")),
            (Op::PutObject, ("if-match", "*")),
            (Op::CopyObject, ("if-match", "\"*\"")),
            (Op::DeleteObject, ("if-none-match", "*")),
            (Op::DeleteObject, (X_AMZ_IF_MATCH_SIZE, "-1")),
            (
                Op::DeleteObject,
                (X_AMZ_IF_MATCH_LAST_MODIFIED_TIME, "yesterday"),
            ),
            (Op::CopyObject, ("if-match", " ")),
        ] {
            assert!(of(op, &[bad]).is_err(), "{op:?} {bad:?}");
        }
        assert!(of(Op::PutObject, &[("if-match", "a"), ("if-match", "b")]).is_err());
        let h = headers(&[("if-match", "a")]);
        assert!(Conditions::of_request(&h, Op::DeleteObject, true).is_err());
        assert!(Conditions::of_request(&h, Op::PutObject, true).is_ok());
        let both = of(Op::PutObject, &[("if-match", "a"), ("if-none-match", "*")]);
        assert_eq!(both.unwrap_err().code(), "NotImplemented");
        assert_eq!(
            parse_time("2023-11-14T22:13:20.000Z"),
            Some(1_700_000_000),
            "ISO 8601, as DeleteObjects' XML has it"
        );
    }
}
