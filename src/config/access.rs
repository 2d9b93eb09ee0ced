//! How fencegate reaches a coordination service that demands TLS or a
//! password: `[cluster.etcd_access]`, `[locks.etcd_access]`,
//! `[locks.redis_access]`, `[locks.postgres_access]`,
//! `[locks.zookeeper_access]`, and the same flags on `fencegate lock`.
//!
//! Whether TLS is used at all is said by the endpoint, as each service's
//! own tools say it (`https://`, `rediss://`, `sslmode=`, `tcp+tls://`);
//! this table says whom to trust, who fencegate is, and where its password
//! is. Secrets are never in the table itself: they come from a file (a
//! mounted Kubernetes secret) or an environment variable, and are read at
//! each connection, so a rotated file is picked up by the next one.

use super::{ConfigError, err};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct AccessConfig {
    /// PEM file of the CA(s) that signed the service's certificate. Without
    /// it the system's roots are trusted, except by ZooKeeper's client:
    /// `tcp+tls://` needs it.
    pub ca_file: Option<PathBuf>,
    /// PEM file of fencegate's client certificate (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[serde(rename = "key_file")]
    pub tls_key_file: Option<PathBuf>,
    /// User name (etcd RBAC user, Redis ACL user, PostgreSQL role,
    /// ZooKeeper SASL user).
    pub user: Option<String>,
    /// File whose content (one trailing newline dropped) is the password.
    pub password_file: Option<PathBuf>,
    /// Environment variable that holds the password.
    pub password_env: Option<String>,
}

/// PEM bytes of a client certificate (chain) and its private key.
pub type CertAndKey = (Vec<u8>, Vec<u8>);

/// A password: kept out of `Debug`, so out of every log line and error.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(..)")
    }
}

impl AccessConfig {
    /// True when nothing is set: a plain, anonymous connection as before.
    pub fn is_empty(&self) -> bool {
        *self == AccessConfig::default()
    }

    /// The password, read now from its file or variable.
    pub fn password(&self) -> Result<Option<Password>, String> {
        if let Some(path) = &self.password_file {
            let mut s = std::fs::read_to_string(path)
                .map_err(|e| format!("password_file {}: {e}", path.display()))?;
            if s.ends_with('\n') {
                s.pop();
                if s.ends_with('\r') {
                    s.pop();
                }
            }
            return Ok(Some(Password(s)));
        }
        if let Some(var) = &self.password_env {
            return match std::env::var(var) {
                Ok(s) => Ok(Some(Password(s))),
                Err(_) => Err(format!("password_env: ${var} is not set")),
            };
        }
        Ok(None)
    }

    /// The user and password, when both are given.
    pub fn credentials(&self) -> Result<Option<(String, Password)>, String> {
        match (&self.user, self.password()?) {
            (Some(u), Some(p)) => Ok(Some((u.clone(), p))),
            _ => Ok(None),
        }
    }

    /// PEM bytes of the CA file, if one is set.
    pub fn ca_pem(&self) -> Result<Option<Vec<u8>>, String> {
        read_opt(&self.ca_file, "ca_file")
    }

    /// PEM bytes of the client certificate and key, if set.
    pub fn identity_pem(&self) -> Result<Option<CertAndKey>, String> {
        match (
            read_opt(&self.cert_file, "cert_file")?,
            read_opt(&self.tls_key_file, "key_file")?,
        ) {
            (Some(c), Some(k)) => Ok(Some((c, k))),
            _ => Ok(None),
        }
    }

    /// Checks that the table is whole: `field` is its name in the file.
    /// Files are read, so that a missing one stops start-up at once.
    pub fn validate(&self, field: &str) -> Result<(), ConfigError> {
        let f = |name: &str| format!("{field}.{name}");
        if self.cert_file.is_some() != self.tls_key_file.is_some() {
            return Err(err(
                &f("cert_file"),
                "cert_file and key_file go together (mutual TLS needs both)",
            ));
        }
        if self.password_file.is_some() && self.password_env.is_some() {
            return Err(err(
                &f("password_file"),
                "give password_file or password_env, not both",
            ));
        }
        let has_password = self.password_file.is_some() || self.password_env.is_some();
        if has_password && self.user.is_none() {
            return Err(err(&f("user"), "a password needs a user"));
        }
        self.ca_pem().map_err(|e| err(&f("ca_file"), e))?;
        self.identity_pem().map_err(|e| err(&f("cert_file"), e))?;
        self.password().map_err(|e| err(&f("password"), e))?;
        Ok(())
    }
}

fn read_opt(path: &Option<PathBuf>, what: &str) -> Result<Option<Vec<u8>>, String> {
    match path {
        None => Ok(None),
        Some(p) => std::fs::read(p)
            .map(Some)
            .map_err(|e| format!("{what} {}: {e}", p.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_comes_from_a_file_or_a_variable_and_never_shows() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\n").unwrap();
        let a = AccessConfig {
            user: Some("u".into()),
            password_file: Some(file),
            ..Default::default()
        };
        let (u, p) = a.credentials().unwrap().unwrap();
        assert_eq!((u.as_str(), p.expose()), ("u", "s3cret"));
        assert!(!format!("{p:?}").contains("s3cret"));
        let missing = AccessConfig {
            user: Some("u".into()),
            password_env: Some("FENCEGATE_TEST_SURELY_UNSET".into()),
            ..Default::default()
        };
        assert!(missing.validate("locks.redis_access").is_err());
    }

    #[test]
    fn a_half_identity_or_a_missing_file_is_refused_by_name() {
        let half = AccessConfig {
            cert_file: Some("/nonexistent/c.pem".into()),
            ..Default::default()
        };
        let e = half
            .validate("cluster.etcd_access")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cluster.etcd_access.cert_file"), "{e}");
        let gone = AccessConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..Default::default()
        };
        let e = gone.validate("locks.etcd_access").unwrap_err().to_string();
        assert!(e.contains("locks.etcd_access.ca_file"), "{e}");
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }
}
