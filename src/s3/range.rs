//! The `Range` header of a GET or HEAD, read once. S3 answers one byte
//! range (`bytes=F-L`, `bytes=F-`, `bytes=-N`) and ignores any other
//! value, a malformed one or several ranges, serving the whole object with
//! `200` (RFC 9110 §14.2 lets a server ignore it). Stores differ here: the
//! embedded store's s3s refuses a malformed one with `400`, and reads
//! `bytes=-` as an empty suffix (`416`). So fencegate reads the header
//! itself and forwards only a range it read, in one form, and every backend
//! answers it as S3 does.

use super::op::Op;
use http::HeaderMap;

/// One byte range, as S3 reads it: `bytes=` (the unit in any case, as
/// RFC 9110 §14.1 allows) then `FIRST-LAST` (FIRST ≤ LAST), `FIRST-` or
/// `-SUFFIX`, decimal digits only. FIRST and LAST fit an `i64`, as in s3s,
/// so that every range read here is one the embedded store reads the same
/// way (tested against it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    From { first: u64, last: Option<u64> },
    Suffix(u64),
}

impl ByteRange {
    pub fn parse(value: &[u8]) -> Option<ByteRange> {
        let unit = value.get(..6)?;
        if !unit.eq_ignore_ascii_case(b"bytes=") {
            return None;
        }
        let spec = &value[6..];
        let number = |s: &[u8], max: u64| -> Option<u64> {
            if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let n = std::str::from_utf8(s).ok()?.parse::<u64>().ok()?;
            (n <= max).then_some(n)
        };
        let int = i64::MAX as u64;
        let dash = spec.iter().position(|b| *b == b'-')?;
        if dash == 0 {
            return number(&spec[1..], u64::MAX).map(ByteRange::Suffix);
        }
        let first = number(&spec[..dash], int)?;
        let last = &spec[dash + 1..];
        if last.is_empty() {
            return Some(ByteRange::From { first, last: None });
        }
        let last = number(last, int).filter(|l| first <= *l)?;
        Some(ByteRange::From {
            first,
            last: Some(last),
        })
    }

    /// The header value in its one form (`bytes=`, no leading zeros).
    pub fn to_header(self) -> String {
        match self {
            ByteRange::From { first, last: None } => format!("bytes={first}-"),
            ByteRange::From {
                first,
                last: Some(last),
            } => format!("bytes={first}-{last}"),
            ByteRange::Suffix(n) => format!("bytes=-{n}"),
        }
    }
}

/// A request's `Range` as the backend gets it, for a GetObject or
/// HeadObject: the one byte range read here, in its one form, or none (a
/// value not read, or several `Range` headers), so that the backend serves
/// the whole object as S3 would. Other operations' headers are left alone.
pub fn forward_range(op: Op, headers: &mut HeaderMap) {
    if !matches!(op, Op::GetObject | Op::HeadObject) {
        return;
    }
    let mut values = headers.get_all(http::header::RANGE).iter();
    let read = match (values.next(), values.next()) {
        (None, _) => return,
        (Some(v), None) => ByteRange::parse(v.as_bytes()),
        (Some(_), Some(_)) => None,
    };
    let value = read.and_then(|r| http::HeaderValue::from_str(&r.to_header()).ok());
    match value {
        Some(v) => headers.insert(http::header::RANGE, v),
        None => headers.remove(http::header::RANGE),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUES: &[&str] = &[
        "bytes=0-9",
        "bytes=0-",
        "bytes=-8",
        "bytes=-0",
        "bytes=0-0",
        "bytes=9-0",
        "bytes=33-10",
        "bytes=0-999999",
        "bytes=00-09",
        "invalid",
        "bytes=invalid-range",
        "bytes=",
        "bytes=-",
        "bytes=--1",
        "bytes=1--2",
        "bytes=0-1,3-4",
        "bytes= 0-9",
        "bytes=0-9 ",
        "Bytes=0-9",
        "bytes 0-9",
        "items=0-9",
        "bytes=+1-2",
        "bytes=0x10-",
        "bytes=9223372036854775807-",
        "bytes=9223372036854775808-",
        "bytes=0-9223372036854775808",
        "bytes=-18446744073709551615",
        "bytes=-18446744073709551616",
    ];

    /// What fencegate forwards, the embedded store's parser reads as the
    /// same range, so no range fencegate passes meets s3s's 400. s3s reads
    /// two values that fencegate does not: `bytes=-`, which s3s takes for a
    /// suffix of 0 (a 416) where RFC 9110's grammar has none and S3 (moto)
    /// ignores it; and nothing else. fencegate reads one s3s does not: the
    /// unit in another case, which it forwards as `bytes=`.
    fn agrees_with_s3s(v: &str) -> Result<(), String> {
        let ours = ByteRange::parse(v.as_bytes());
        let theirs = s3s::dto::Range::parse(&ours.map_or(v.to_string(), |r| r.to_header()));
        match (ours, theirs) {
            (
                Some(ByteRange::From { first, last }),
                Ok(s3s::dto::Range::Int { first: f, last: l }),
            ) if (first, last) == (f, l) => Ok(()),
            (Some(ByteRange::Suffix(n)), Ok(s3s::dto::Range::Suffix { length })) if n == length => {
                Ok(())
            }
            (None, Err(_)) => Ok(()),
            (None, Ok(_)) if v == "bytes=-" => Ok(()),
            (ours, theirs) => Err(format!("{v:?}: fencegate {ours:?}, s3s {theirs:?}")),
        }
    }

    #[test]
    fn reads_a_range_as_the_embedded_store_does() {
        for v in VALUES {
            agrees_with_s3s(v).unwrap();
        }
        assert_eq!(
            ByteRange::parse(b"Bytes=007-9")
                .map(ByteRange::to_header)
                .as_deref(),
            Some("bytes=7-9")
        );
    }

    proptest::proptest! {
        /// The same on generated values of the header's alphabet.
        #[test]
        fn generated_values_are_read_as_the_embedded_store_does(
            v in "(bytes=|Bytes=|BYTES=|bytes |)[0-9,+ -]{0,24}"
        ) {
            proptest::prop_assert_eq!(agrees_with_s3s(&v), Ok(()));
        }
    }

    #[test]
    fn a_range_not_read_is_dropped() {
        let mut h = HeaderMap::new();
        h.insert(http::header::RANGE, "bytes=5-3".parse().unwrap());
        forward_range(Op::GetObject, &mut h);
        assert!(h.get(http::header::RANGE).is_none());
        h.insert(http::header::RANGE, "BYTES=03-5".parse().unwrap());
        forward_range(Op::GetObject, &mut h);
        assert_eq!(h[http::header::RANGE], "bytes=3-5");
        h.append(http::header::RANGE, "bytes=3-5".parse().unwrap());
        forward_range(Op::GetObject, &mut h);
        assert!(h.get(http::header::RANGE).is_none());
        // A copy's range is not a read's: left as it is.
        h.insert(http::header::RANGE, "bytes=5-3".parse().unwrap());
        forward_range(Op::UploadPartCopy, &mut h);
        assert_eq!(h[http::header::RANGE], "bytes=5-3");
    }
}
