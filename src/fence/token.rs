//! Fencing tokens: parsing the decimal form and picking the token out of the
//! three carriers a request may use (CONTRACT §1).

use http::{HeaderMap, HeaderName};
use std::borrow::Cow;

/// A decoded query parameter, as `s3::query::Param` spells it (named here
/// by its parts: `s3` depends on `fence`, not the other way round).
type Param<'a> = (Cow<'a, str>, Cow<'a, str>);

/// Why a request's token could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("fencing token {0:?} is not an unsigned 64-bit decimal integer")]
    Malformed(String),
    #[error("{0} is given more than once")]
    Repeated(&'static str),
    #[error("fencing token carriers disagree: {0} vs {1}")]
    Disagree(u64, u64),
}

/// Parses `0` … `18446744073709551615`: ASCII digits only, leading zeros
/// allowed, no sign, no spaces.
pub fn parse(s: &str) -> Result<u64, TokenError> {
    let bad = || TokenError::Malformed(s.chars().take(40).collect());
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    s.parse::<u64>().map_err(|_| bad())
}

/// Where fencegate looks for a token.
#[derive(Debug, Clone)]
pub struct Carriers {
    /// e.g. `x-fencing-token`
    pub header: HeaderName,
    /// e.g. `x-amz-meta-fencing-token`
    pub meta_header: HeaderName,
    /// e.g. `x-fencing-token` (decoded query parameter name)
    pub query: String,
}

impl Carriers {
    /// The request's token, if any. `query` holds the decoded query pairs.
    pub fn extract(
        &self,
        headers: &HeaderMap,
        query: &[Param<'_>],
    ) -> Result<Option<u64>, TokenError> {
        self.extract_from(headers, query, true)
    }

    /// The token of the carriers other than the `header` one (for a request
    /// whose signature does not cover that header).
    pub fn extract_without_header(
        &self,
        headers: &HeaderMap,
        query: &[Param<'_>],
    ) -> Result<Option<u64>, TokenError> {
        self.extract_from(headers, query, false)
    }

    fn extract_from(
        &self,
        headers: &HeaderMap,
        query: &[Param<'_>],
        use_header: bool,
    ) -> Result<Option<u64>, TokenError> {
        let mut found: Option<u64> = None;
        let mut take = |v: u64| -> Result<(), TokenError> {
            match found {
                Some(prev) if prev != v => Err(TokenError::Disagree(prev, v)),
                _ => {
                    found = Some(v);
                    Ok(())
                }
            }
        };
        let header = use_header.then_some((&self.header, "token header"));
        let meta = Some((&self.meta_header, "token metadata header"));
        for (name, label) in [header, meta].into_iter().flatten() {
            let mut values = headers.get_all(name).iter();
            if let Some(v) = values.next() {
                if values.next().is_some() {
                    return Err(TokenError::Repeated(label));
                }
                let s = v
                    .to_str()
                    .map_err(|_| TokenError::Malformed("<non-ASCII>".into()))?;
                take(parse(s)?)?;
            }
        }
        let mut q = query.iter().filter(|(k, _)| *k == self.query);
        if let Some((_, v)) = q.next() {
            if q.next().is_some() {
                return Err(TokenError::Repeated("token query parameter"));
            }
            take(parse(v)?)?;
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_full_range() {
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("0034"), Ok(34));
        assert_eq!(parse("18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn rejects_everything_else() {
        for s in [
            "",
            "-1",
            "+1",
            " 1",
            "1 ",
            "1e3",
            "0x10",
            "18446744073709551616",
            "1.0",
            "١",
        ] {
            assert!(parse(s).is_err(), "{s:?} accepted");
        }
    }

    fn carriers() -> Carriers {
        Carriers {
            header: HeaderName::from_static("x-fencing-token"),
            meta_header: HeaderName::from_static("x-amz-meta-fencing-token"),
            query: "x-fencing-token".into(),
        }
    }

    #[test]
    fn carriers_agree_or_fail() {
        let mut h = HeaderMap::new();
        h.insert("x-fencing-token", "34".parse().unwrap());
        h.insert("x-amz-meta-fencing-token", "034".parse().unwrap());
        assert_eq!(carriers().extract(&h, &[]), Ok(Some(34)));
        let q = vec![("x-fencing-token".into(), "35".into())];
        assert_eq!(
            carriers().extract(&h, &q),
            Err(TokenError::Disagree(34, 35))
        );
        h.append("x-fencing-token", "34".parse().unwrap());
        assert!(matches!(
            carriers().extract(&h, &[]),
            Err(TokenError::Repeated(_))
        ));
        assert_eq!(carriers().extract(&HeaderMap::new(), &[]), Ok(None));
    }
}
