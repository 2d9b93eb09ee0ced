//! The `[locks]` table (where the lock services are) and the `[[eager]]`
//! entries (which resource follows which lock), with their checks. The
//! schema lives with the rest of the file's; `locks` reads it.

use super::access::AccessConfig;
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
    /// Redis URL, e.g. `"redis://127.0.0.1:6379/0"`.
    pub redis: Option<String>,
    /// PostgreSQL URL, e.g. `"postgres://fencegate@127.0.0.1:5432/app"`.
    pub postgres: Option<String>,
    /// The sequence PostgreSQL tokens come from.
    pub postgres_sequence: String,
    /// How often eager fencing polls `pg_locks`.
    pub postgres_poll_ms: u64,
    /// TLS and credentials for etcd (`https://` endpoints).
    pub etcd_access: AccessConfig,
    /// TLS and credentials for ZooKeeper (`tcp+tls://` servers, SASL).
    pub zookeeper_access: AccessConfig,
    /// TLS and credentials for Redis (`rediss://`, ACL user).
    pub redis_access: AccessConfig,
    /// TLS and credentials for PostgreSQL (`sslmode=`, SCRAM password).
    pub postgres_access: AccessConfig,
}

impl Default for LocksConfig {
    fn default() -> Self {
        LocksConfig {
            etcd_endpoints: Vec::new(),
            zookeeper: None,
            zookeeper_session_timeout_ms: 10_000,
            redis: None,
            postgres: None,
            postgres_sequence: "fencegate_tokens".into(),
            postgres_poll_ms: 1000,
            etcd_access: AccessConfig::default(),
            zookeeper_access: AccessConfig::default(),
            redis_access: AccessConfig::default(),
            postgres_access: AccessConfig::default(),
        }
    }
}

impl LocksConfig {
    pub fn postgres_poll(&self) -> Duration {
        Duration::from_millis(self.postgres_poll_ms)
    }

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
    /// The Redis lock key (`fencegate lock --redis .. NAME`).
    #[serde(default)]
    pub redis_lock: Option<String>,
    /// The PostgreSQL lock name (`fencegate lock --postgres .. NAME`).
    #[serde(default)]
    pub postgres_lock: Option<String>,
    /// Verified raises: a request's token that would raise the resource's
    /// fence must be the lock's holder's (asked of the lock service when
    /// the watch does not know), or it raises nothing and is refused `403
    /// FencingTokenNotIssued`.
    #[serde(default)]
    pub verify: bool,
}

/// The lock an eager entry follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockRef {
    Etcd(String),
    ZooKeeper(String),
    Redis(String),
    Postgres(String),
}

impl std::fmt::Display for LockRef {
    /// The lock as its service and name, e.g. `etcd:orders`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockRef::Etcd(n) => write!(f, "etcd:{n}"),
            LockRef::ZooKeeper(p) => write!(f, "zookeeper:{p}"),
            LockRef::Redis(k) => write!(f, "redis:{k}"),
            LockRef::Postgres(n) => write!(f, "postgres:{n}"),
        }
    }
}

impl EagerConfig {
    pub fn lock(&self) -> LockRef {
        if let Some(k) = &self.redis_lock {
            return LockRef::Redis(k.clone());
        }
        if let Some(n) = &self.postgres_lock {
            return LockRef::Postgres(n.clone());
        }
        match (&self.etcd_lock, &self.zookeeper_lock) {
            (Some(n), _) => LockRef::Etcd(n.clone()),
            (None, Some(p)) => LockRef::ZooKeeper(p.clone()),
            (None, None) => unreachable!("validated"),
        }
    }
}

pub fn validate(locks: &LocksConfig, eager: &[EagerConfig]) -> Result<(), ConfigError> {
    locks.etcd_access.validate("locks.etcd_access")?;
    locks.zookeeper_access.validate("locks.zookeeper_access")?;
    locks.redis_access.validate("locks.redis_access")?;
    locks.postgres_access.validate("locks.postgres_access")?;
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
    if let Some(url) = &locks.redis
        && !(url.starts_with("redis://") || url.starts_with("rediss://"))
    {
        return Err(err("locks.redis", format!("{url:?} is not a redis:// URL")));
    }
    if let Some(url) = &locks.postgres
        && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
    {
        return Err(err(
            "locks.postgres",
            format!("{url:?} is not a postgres:// URL"),
        ));
    }
    let ident = |s: &str| {
        !s.is_empty()
            && s.split('.').count() <= 2
            && s.split('.').all(|p| {
                p.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    };
    if !ident(&locks.postgres_sequence) {
        return Err(err(
            "locks.postgres_sequence",
            "must be a plain SQL name, optionally schema-qualified",
        ));
    }
    if locks.postgres_poll_ms < 50 {
        return Err(err("locks.postgres_poll_ms", "must be at least 50"));
    }
    for (i, e) in eager.iter().enumerate() {
        validate_eager(&format!("eager[{i}]"), e, locks)?;
    }
    Ok(())
}

/// One `[[eager]]` entry (`at`: `eager[i]`): a resource, and exactly one
/// lock, named, on a lock service the config gives.
fn validate_eager(at: &str, e: &EagerConfig, locks: &LocksConfig) -> Result<(), ConfigError> {
    let field = |f: &str| format!("{at}.{f}");
    if e.resource.is_empty() {
        return Err(err(&field("resource"), "must not be empty"));
    }
    const ONE_OF: &str =
        "give exactly one of etcd_lock, zookeeper_lock, redis_lock and postgres_lock";
    let given = [
        ("etcd_lock", &e.etcd_lock),
        ("zookeeper_lock", &e.zookeeper_lock),
        ("redis_lock", &e.redis_lock),
        ("postgres_lock", &e.postgres_lock),
    ];
    let mut named = given
        .iter()
        .filter_map(|(f, v)| v.as_ref().map(|v| (*f, v)));
    let (f, name) = match (named.next(), named.next()) {
        (Some(one), None) => one,
        (Some((f, _)), Some((g, _))) => {
            return Err(err(&field(f), format!("{g} is given too: {ONE_OF}")));
        }
        (None, _) => return Err(err(at, ONE_OF)),
    };
    if name.is_empty() {
        return Err(err(&field(f), "must not be empty"));
    }
    let (service, missing) = match f {
        "etcd_lock" => ("locks.etcd_endpoints", locks.etcd_endpoints.is_empty()),
        "zookeeper_lock" => {
            if !name.starts_with('/') || name.len() < 2 || name.ends_with('/') {
                return Err(err(
                    &field(f),
                    format!("{name:?} is not a ZooKeeper path like /locks/orders"),
                ));
            }
            ("locks.zookeeper", locks.zookeeper.is_none())
        }
        "redis_lock" => ("locks.redis", locks.redis.is_none()),
        _ => ("locks.postgres", locks.postgres.is_none()),
    };
    if missing {
        return Err(err(service, format!("needed by {}", field(f))));
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
        let redis = "[locks]\nredis = \"redis://127.0.0.1:6379\"\n";
        assert!(
            check(&format!(
                "{redis}[[eager]]\nresource = \"r\"\nredis_lock = \"r\"\n"
            ))
            .is_ok()
        );
        let two = check(&format!(
            "{redis}[[eager]]\nresource = \"r\"\nredis_lock = \"r\"\netcd_lock = \"r\"\n"
        ));
        let two = two.unwrap_err();
        assert!(
            two.contains("eager[0].etcd_lock") && two.contains("redis_lock"),
            "{two}"
        );
        let none = check(&format!("{redis}[[eager]]\nresource = \"r\"\n"));
        assert!(none.unwrap_err().contains("`eager[0]`: give exactly one"));
        let no_redis = check("[[eager]]\nresource = \"r\"\nredis_lock = \"r\"\n");
        assert!(no_redis.unwrap_err().contains("locks.redis"));
        let bad_redis = check("[locks]\nredis = \"127.0.0.1:6379\"\n");
        assert!(bad_redis.unwrap_err().contains("locks.redis"));
        let pg = "[locks]\npostgres = \"postgres://u@h/db\"\n";
        assert!(
            check(&format!(
                "{pg}[[eager]]\nresource = \"r\"\npostgres_lock = \"r\"\n"
            ))
            .is_ok()
        );
        let no_pg = check("[[eager]]\nresource = \"r\"\npostgres_lock = \"r\"\n");
        assert!(no_pg.unwrap_err().contains("locks.postgres"));
        let bad_seq = check("[locks]\npostgres_sequence = \"a;drop\"\n");
        assert!(bad_seq.unwrap_err().contains("locks.postgres_sequence"));
    }
}
