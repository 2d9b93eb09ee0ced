//! The `[locks]` table (where the lock services are) and the `[[eager]]`
//! entries (which resource follows which lock), with their checks. The
//! schema lives with the rest of the file's; `locks` reads it.

use super::{ConfigError, err};
use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LocksConfig {
    /// etcd client URLs, e.g. `["http://127.0.0.1:2379"]`.
    pub etcd_endpoints: Vec<String>,
    /// ZooKeeper connect string, e.g. `"127.0.0.1:2181"`.
    pub zookeeper: Option<String>,
    /// Session timeout fencegate asks ZooKeeper for.
    pub zookeeper_session_timeout_ms: u64,
}

impl Default for LocksConfig {
    fn default() -> Self {
        LocksConfig {
            etcd_endpoints: Vec::new(),
            zookeeper: None,
            zookeeper_session_timeout_ms: 10_000,
        }
    }
}

impl LocksConfig {
    pub fn zookeeper_session_timeout(&self) -> Duration {
        Duration::from_millis(self.zookeeper_session_timeout_ms)
    }
}

/// One resource whose fence follows a lock.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EagerConfig {
    /// The resource as the rules name it: a shared rule's `resource`, or
    /// `bucket/key` for a per-object resource.
    pub resource: String,
    /// The etcd lock name (`etcdctl lock NAME`, `fencegate lock --etcd .. NAME`).
    pub etcd_lock: Option<String>,
    /// The ZooKeeper lock directory (`fencegate lock --zookeeper .. PATH`).
    pub zookeeper_lock: Option<String>,
}

/// The lock an eager entry follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockRef {
    Etcd(String),
    ZooKeeper(String),
}

impl EagerConfig {
    pub fn lock(&self) -> LockRef {
        match (&self.etcd_lock, &self.zookeeper_lock) {
            (Some(n), _) => LockRef::Etcd(n.clone()),
            (None, Some(p)) => LockRef::ZooKeeper(p.clone()),
            (None, None) => unreachable!("validated"),
        }
    }
}

pub fn validate(locks: &LocksConfig, eager: &[EagerConfig]) -> Result<(), ConfigError> {
    for (i, e) in locks.etcd_endpoints.iter().enumerate() {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            return Err(err(
                &format!("locks.etcd_endpoints[{i}]"),
                format!("{e:?} is not an http:// or https:// URL"),
            ));
        }
    }
    if locks.zookeeper.as_deref() == Some("") {
        return Err(err("locks.zookeeper", "must not be empty"));
    }
    if locks.zookeeper_session_timeout_ms < 100 {
        return Err(err(
            "locks.zookeeper_session_timeout_ms",
            "must be at least 100",
        ));
    }
    for (i, e) in eager.iter().enumerate() {
        let field = |f: &str| format!("eager[{i}].{f}");
        if e.resource.is_empty() {
            return Err(err(&field("resource"), "must not be empty"));
        }
        match (&e.etcd_lock, &e.zookeeper_lock) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(err(
                    &field("etcd_lock"),
                    "give exactly one of etcd_lock and zookeeper_lock",
                ));
            }
            (Some(name), None) => {
                if name.is_empty() {
                    return Err(err(&field("etcd_lock"), "must not be empty"));
                }
                if locks.etcd_endpoints.is_empty() {
                    return Err(err(
                        "locks.etcd_endpoints",
                        format!("needed by {}", field("etcd_lock")),
                    ));
                }
            }
            (None, Some(path)) => {
                if !path.starts_with('/') || path.len() < 2 || path.ends_with('/') {
                    return Err(err(
                        &field("zookeeper_lock"),
                        format!("{path:?} is not a ZooKeeper path like /locks/orders"),
                    ));
                }
                if locks.zookeeper.is_none() {
                    return Err(err(
                        "locks.zookeeper",
                        format!("needed by {}", field("zookeeper_lock")),
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn check(toml: &str) -> Result<(), String> {
        Config::parse(toml)
            .and_then(|c| c.validate())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn eager_entries_name_the_field_at_fault() {
        let etcd = "[locks]\netcd_endpoints = [\"http://127.0.0.1:2379\"]\n";
        assert!(
            check(&format!(
                "{etcd}[[eager]]\nresource = \"r\"\netcd_lock = \"r\"\n"
            ))
            .is_ok()
        );
        let both = check(&format!(
            "{etcd}[[eager]]\nresource = \"r\"\netcd_lock = \"r\"\nzookeeper_lock = \"/l\"\n"
        ));
        assert!(both.unwrap_err().contains("eager[0].etcd_lock"));
        let no_service = check("[[eager]]\nresource = \"r\"\netcd_lock = \"r\"\n");
        assert!(no_service.unwrap_err().contains("locks.etcd_endpoints"));
        let bad_path = check(
            "[locks]\nzookeeper = \"h:1\"\n[[eager]]\nresource = \"r\"\nzookeeper_lock = \"locks\"\n",
        );
        assert!(bad_path.unwrap_err().contains("eager[0].zookeeper_lock"));
        let bad_url = check("[locks]\netcd_endpoints = [\"127.0.0.1:2379\"]\n");
        assert!(bad_url.unwrap_err().contains("locks.etcd_endpoints[0]"));
        let typo = check("[[eager]]\nresource = \"r\"\netcd_lok = \"r\"\n");
        assert!(typo.unwrap_err().contains("etcd_lok"));
    }
}
