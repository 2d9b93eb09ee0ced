//! The tests of `read.rs`: which conditions pass, which ranges and parts
//! a GET answers.

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

fn record() -> ObjectRecord {
    ObjectRecord {
        segments: vec![],
        size: 10,
        etag: "e".into(),
        last_modified_ms: 0,
        headers: Default::default(),
        checksums: Default::default(),
        parts: vec![4, 6],
        upload_id: None,
    }
}

/// An answer of `byte_range`: (first, end, partial), or the status.
type Answer = Result<(u64, u64, bool), u16>;

fn ranged(size: u64, parts: &[u64], range: Option<&str>, part: Option<i32>) -> Answer {
    let r = ObjectRecord {
        size,
        parts: parts.to_vec(),
        ..record()
    };
    let range = range.map(|h| Range::parse(h).unwrap());
    byte_range(&r, range.as_ref(), part)
        .map(|b| (b.range.start, b.range.end, b.partial))
        .map_err(|e| e.status_code().map_or(0, |s| s.as_u16()))
}

/// The table of issue #39 and RFC 9110 §14's edge cases, for a
/// 3,893-byte object and an empty one.
#[test]
fn ranges_answer_as_s3_does() {
    let n = 3893;
    let cases: &[(u64, &str, Answer)] = &[
        (n, "bytes=0-9", Ok((0, 10, true))),
        (n, "bytes=-8", Ok((n - 8, n, true))),
        (n, "bytes=0-3892", Ok((0, n, true))),
        (n, "bytes=0-999999", Ok((0, n, true))),
        (n, "bytes=0-", Ok((0, n, true))),
        (n, "bytes=-99999", Ok((0, n, true))),
        (n, "bytes=3892-", Ok((n - 1, n, true))),
        (n, "bytes=3892-3892", Ok((n - 1, n, true))),
        (n, "bytes=3893-", Err(416)),
        (n, "bytes=3893-4000", Err(416)),
        (n, "bytes=-0", Err(416)),
        (0, "bytes=0-", Err(416)),
        (0, "bytes=0-0", Err(416)),
        (0, "bytes=-1", Ok((0, 0, false))),
    ];
    for (size, h, want) in cases {
        assert_eq!(
            &ranged(*size, &[], Some(h), None),
            want,
            "{h} of {size} bytes"
        );
    }
    let e = byte_range(
        &ObjectRecord {
            size: n,
            ..record()
        },
        Some(&Range::parse("bytes=3893-").unwrap()),
        None,
    )
    .unwrap_err();
    let cr = e.headers().and_then(|h| h.get(http::header::CONTENT_RANGE));
    assert_eq!(cr.unwrap(), "bytes */3893");
}

#[test]
fn parts_are_ranges_of_their_own() {
    assert_eq!(ranged(10, &[4, 6], None, Some(2)), Ok((4, 10, true)));
    assert_eq!(ranged(10, &[4, 6], None, Some(1)), Ok((0, 4, true)));
    assert_eq!(ranged(10, &[4, 6], None, Some(3)), Err(400));
    // Part 1 of an object uploaded whole is all of it, still a range.
    assert_eq!(ranged(10, &[], None, Some(1)), Ok((0, 10, true)));
    assert_eq!(ranged(0, &[], None, Some(1)), Ok((0, 0, false)));
    assert_eq!(ranged(10, &[], Some("bytes=0-1"), Some(1)), Err(400));
}
