//! Resources: the unit a lock protects. Rules map `(bucket, key prefix)` to a
//! resource; the longest matching prefix wins (CONTRACT §2).

use crate::config::{RuleConfig, RuleMode};
use std::collections::HashMap;

/// What a key's writes are fenced by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fencing {
    /// Writes need a token checked against this resource.
    Fenced(String),
    /// Writes need no token (a token, if given, is read as anywhere, but
    /// checked against no fence and raises none).
    Unfenced,
}

#[derive(Debug, Clone)]
struct Rule {
    prefix: String,
    mode: RuleMode,
    resource: Option<String>,
}

/// The rule table, grouped by bucket and ordered longest prefix first.
#[derive(Debug, Default, Clone)]
pub struct Resolver {
    by_bucket: HashMap<String, Vec<Rule>>,
}

impl Resolver {
    pub fn new(rules: &[RuleConfig]) -> Resolver {
        let mut by_bucket: HashMap<String, Vec<Rule>> = HashMap::new();
        for r in rules {
            by_bucket.entry(r.bucket.clone()).or_default().push(Rule {
                prefix: r.prefix.clone(),
                mode: r.mode,
                resource: r.resource.clone(),
            });
        }
        for rules in by_bucket.values_mut() {
            rules.sort_by_key(|r| std::cmp::Reverse(r.prefix.len()));
        }
        Resolver { by_bucket }
    }

    /// The resource that fences writes to `bucket/key`.
    pub fn resolve(&self, bucket: &str, key: &str) -> Fencing {
        let rule = self
            .by_bucket
            .get(bucket)
            .and_then(|rules| rules.iter().find(|r| key.starts_with(&r.prefix)));
        match rule {
            Some(Rule {
                mode: RuleMode::Shared,
                resource: Some(name),
                ..
            }) => Fencing::Fenced(name.clone()),
            Some(Rule {
                mode: RuleMode::Unfenced,
                ..
            }) => Fencing::Unfenced,
            _ => Fencing::Fenced([bucket, "/", key].concat()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(bucket: &str, prefix: &str, mode: RuleMode, resource: Option<&str>) -> RuleConfig {
        RuleConfig {
            bucket: bucket.into(),
            prefix: prefix.into(),
            mode,
            resource: resource.map(Into::into),
        }
    }

    #[test]
    fn longest_prefix_wins() {
        let r = Resolver::new(&[
            rule("b", "tables/", RuleMode::Shared, Some("tables")),
            rule("b", "tables/orders/", RuleMode::Shared, Some("orders")),
            rule("b", "tables/orders/tmp/", RuleMode::Unfenced, None),
            rule("b", "tables/orders/own/", RuleMode::PerObject, None),
        ]);
        assert_eq!(r.resolve("b", "tables/x"), Fencing::Fenced("tables".into()));
        assert_eq!(
            r.resolve("b", "tables/orders/a"),
            Fencing::Fenced("orders".into())
        );
        assert_eq!(r.resolve("b", "tables/orders/tmp/a"), Fencing::Unfenced);
        assert_eq!(
            r.resolve("b", "tables/orders/own/a"),
            Fencing::Fenced("b/tables/orders/own/a".into())
        );
        assert_eq!(r.resolve("b", "other"), Fencing::Fenced("b/other".into()));
        assert_eq!(
            r.resolve("c", "tables/orders/a"),
            Fencing::Fenced("c/tables/orders/a".into())
        );
    }
}
