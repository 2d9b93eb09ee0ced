//! Reaching etcd, ZooKeeper, Redis and PostgreSQL as production runs them:
//! TLS (with a CA of the operator's and a client certificate) and
//! passwords, from an [`AccessConfig`]. Cluster mode and the lock
//! integrations build their clients here, so that each service is reached
//! the same way everywhere, and so that every failure names the service,
//! the endpoint and what failed, with no secret in it.
//!
//! Files are read at each connection: a certificate or password rotated on
//! disk is used by the next connection (etcd's client, which lives as long
//! as the process, needs a restart; docs/operating.md).

mod pg_tls;

pub use pg_tls::PgTls;

use crate::config::access::AccessConfig;
use std::sync::Once;

/// rustls picks its crypto from the process default when a client crate
/// (redis) builds its own config; fencegate uses ring everywhere.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `service endpoint: what`, the shape of every error from here.
pub fn failure(service: &str, endpoint: &str, what: impl std::fmt::Display) -> String {
    format!("{service} {endpoint}: {what}")
}

// ---- etcd ----

/// Adds TLS and the user to `base` for `endpoints`. TLS is on when the
/// endpoints are `https://` (all of them or none).
pub fn etcd_options(
    endpoints: &[String],
    base: etcd_client::ConnectOptions,
    access: &AccessConfig,
) -> Result<etcd_client::ConnectOptions, String> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let where_ = endpoints.join(",");
    let https = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    let mut opts = base;
    if https > 0 {
        if https != endpoints.len() {
            return Err(failure(
                "etcd",
                &where_,
                "mixes http:// and https:// endpoints",
            ));
        }
        let mut tls = TlsOptions::new();
        tls = match access.ca_pem().map_err(|e| failure("etcd", &where_, e))? {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
            None => tls.with_native_roots(),
        };
        if let Some((c, k)) = access
            .identity_pem()
            .map_err(|e| failure("etcd", &where_, e))?
        {
            tls = tls.identity(Identity::from_pem(c, k));
        }
        opts = opts.with_tls(tls);
    } else if access.ca_file.is_some() || access.cert_file.is_some() {
        return Err(failure(
            "etcd",
            &where_,
            "ca_file or cert_file is set but the endpoints are http://: write https://",
        ));
    }
    if let Some((user, password)) = access
        .credentials()
        .map_err(|e| failure("etcd", &where_, e))?
    {
        // etcd's tokens expire (and die with a restarted member): on
        // "invalid auth token" the client authenticates again and retries.
        opts = opts
            .with_user(user, password.expose())
            .with_auto_token_refresh(true);
    }
    Ok(opts)
}

/// Connects to etcd. With a user, the client authenticates at once, so a
/// refused password or an untrusted certificate is an error here.
pub async fn etcd_connect(
    endpoints: &[String],
    base: etcd_client::ConnectOptions,
    access: &AccessConfig,
) -> Result<etcd_client::Client, String> {
    let opts = etcd_options(endpoints, base, access)?;
    etcd_client::Client::connect(endpoints, Some(opts))
        .await
        .map_err(|e| etcd_failure(endpoints, access, &e))
}

/// `etcd ENDPOINTS: what failed (what it likely means)`.
pub fn etcd_failure(endpoints: &[String], access: &AccessConfig, e: &etcd_client::Error) -> String {
    let mut text = etcd_error(e);
    if closed_early(&text) {
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        text.push_str(match (https, access.cert_file.is_some()) {
            (false, _) => " (the server closed the connection: if it serves TLS, write https://)",
            (true, false) => {
                " (the server closed the connection: does it want a client certificate?)"
            }
            (true, true) => {
                " (the server closed the connection: it refuses the client certificate, expired or from another CA?)"
            }
        });
    }
    failure("etcd", &endpoints.join(","), text)
}

/// A connection the server closed before answering: how a TLS server
/// refusing a client certificate (TLS 1.3), or a TLS port spoken to in
/// plain text, looks from the client.
fn closed_early(text: &str) -> bool {
    [
        "connection closed",
        "broken pipe",
        "Connection reset",
        "operation was canceled",
    ]
    .iter()
    .any(|s| text.contains(s))
}

/// What an etcd error means, in words an operator acts on.
pub fn etcd_error(e: &etcd_client::Error) -> String {
    let text = e.to_string();
    let hint = if text.contains("authentication failed") {
        " (the user or password is wrong)"
    } else if text.contains("authentication is not enabled") {
        " (a user is configured but etcd's auth is off: drop the user, or `etcdctl auth enable`)"
    } else if text.contains("UnknownIssuer") || text.contains("invalid peer certificate") {
        " (the server's certificate is not signed by a trusted CA: check ca_file)"
    } else if [
        "BadCertificate",
        "CertificateRequired",
        "CertificateExpired",
        "UnknownCA",
    ]
    .iter()
    .any(|alert| text.contains(alert))
    {
        " (the server refused the client certificate: check cert_file and key_file, and their expiry)"
    } else {
        ""
    };
    format!("{text}{hint}")
}

/// True when `e` will not go away by retrying: a wrong password or a
/// certificate that is not trusted. Start-up stops on these.
pub fn etcd_error_is_permanent(e: &str) -> bool {
    [
        "authentication failed",
        "authentication is not enabled",
        "permission denied",
        "certificate",
        "HTTP/2 was not negotiated",
        "write https://",
    ]
    .iter()
    .any(|s| e.contains(s))
}

// ---- Redis ----

/// A Redis client for `url`: `rediss://` is TLS (trusting `ca_file`, or the
/// system's roots), with `cert_file`/`key_file` if the server asks for a
/// client certificate; the user and password go into AUTH.
pub fn redis_client(url: &str, access: &AccessConfig) -> Result<redis::Client, String> {
    use redis::IntoConnectionInfo;
    install_crypto_provider();
    let shown = redacted_url(url);
    let fail = |e: &dyn std::fmt::Display| failure("redis", &shown, e);
    let info = url.into_connection_info().map_err(|e| fail(&e))?;
    let mut settings = info.redis_settings().clone();
    if let Some((user, password)) = access.credentials().map_err(|e| fail(&e))? {
        settings = settings.set_username(user).set_password(password.expose());
    }
    let info = info.set_redis_settings(settings);
    if url.starts_with("rediss://") {
        let client_tls =
            access
                .identity_pem()
                .map_err(|e| fail(&e))?
                .map(|(c, k)| redis::ClientTlsConfig {
                    client_cert: c,
                    client_key: k,
                });
        let root_cert = access.ca_pem().map_err(|e| fail(&e))?;
        redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(|e| fail(&e))
    } else if access.ca_file.is_some() || access.cert_file.is_some() {
        Err(fail(
            &"ca_file or cert_file is set but the URL is redis://: write rediss://",
        ))
    } else {
        redis::Client::open(info).map_err(|e| fail(&e))
    }
}

/// What a Redis error means, in words an operator acts on.
pub fn redis_error(e: &redis::RedisError) -> String {
    let hint = match e.kind() {
        redis::ErrorKind::AuthenticationFailed => " (the user or password is wrong)",
        _ if e.code() == Some("NOAUTH") => {
            " (the server wants a password: set user and password_file or password_env)"
        }
        _ if e.to_string().contains("UnknownIssuer") => {
            " (the server's certificate is not signed by a trusted CA: check ca_file)"
        }
        _ if closed_early(&e.to_string()) => {
            " (the server closed the connection: a TLS port takes rediss://, and a refused client certificate looks the same)"
        }
        _ => "",
    };
    format!("{e}{hint}")
}

/// `url` without the password it may carry (for messages).
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_string()
            };
            format!("{scheme}://{masked}@{host}{}", strip_query_secrets(tail))
        }
        None => format!("{scheme}://{authority}{}", strip_query_secrets(tail)),
    }
}

fn strip_query_secrets(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let kept: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => kv.to_string(),
        })
        .collect();
    format!("{path}?{}", kept.join("&"))
}

// ---- PostgreSQL ----

/// A PostgreSQL config and its TLS connector for `url` (libpq's URL, with
/// `sslmode` up to `verify-full` and `sslrootcert`/`sslcert`/`sslkey`);
/// the user and password of `access` override the URL's.
pub fn postgres_config(
    url: &str,
    access: &AccessConfig,
) -> Result<(tokio_postgres::Config, PgTls), String> {
    install_crypto_provider();
    let shown = redacted_url(url);
    let fail = |e: &dyn std::fmt::Display| failure("postgres", &shown, e);
    let (rest, tls) = pg_tls::split_url(url, access).map_err(|e| fail(&e))?;
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| fail(&e))?;
    config.ssl_mode(tls.ssl_mode());
    if let Some(user) = &access.user {
        config.user(user);
    }
    if let Some(password) = access.password().map_err(|e| fail(&e))? {
        config.password(password.expose());
    }
    Ok((config, tls))
}

/// What a PostgreSQL error means: its cause, which `Display` leaves out.
pub fn postgres_error(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{e}: {} ({})", db.message(), db.code().code());
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

// ---- ZooKeeper ----

/// A ZooKeeper connector: TLS for the servers written `tcp+tls://host:port`
/// (trusting `ca_file`, which ZooKeeper's TLS needs; with `cert_file` and
/// `key_file` when the server wants a client certificate, which is its
/// default), and SASL DIGEST-MD5 when a user and password are given.
pub fn zookeeper_connector(
    servers: &str,
    access: &AccessConfig,
) -> Result<zookeeper_client::Connector, String> {
    let fail = |e: &dyn std::fmt::Display| failure("zookeeper", servers, e);
    let mut connector = zookeeper_client::Client::connector();
    let tls = servers.contains("tcp+tls://");
    if tls {
        install_crypto_provider();
        let text = |pem: Vec<u8>| String::from_utf8(pem).map_err(|e| fail(&e));
        let Some(ca) = access.ca_pem().map_err(|e| fail(&e))? else {
            return Err(fail(
                &"tcp+tls:// needs ca_file (the CA that signed ZooKeeper's certificate)",
            ));
        };
        let mut options = zookeeper_client::TlsOptions::new()
            .with_pem_ca(&text(ca)?)
            .map_err(|e| fail(&format!("ca_file: {e}")))?;
        if let Some((cert, key)) = access.identity_pem().map_err(|e| fail(&e))? {
            options = options
                .with_pem_identity(&text(cert)?, &text(key)?)
                .map_err(|e| fail(&format!("cert_file / key_file: {e}")))?;
        }
        connector = connector.with_tls(options);
    } else if access.ca_file.is_some() || access.cert_file.is_some() {
        return Err(fail(
            &"ca_file or cert_file is set but no server is tcp+tls://: write tcp+tls://host:port",
        ));
    }
    if let Some((user, password)) = access.credentials().map_err(|e| fail(&e))? {
        connector = connector.with_sasl(zookeeper_client::SaslOptions::digest_md5(
            user,
            password.expose().to_string(),
        ));
    }
    Ok(connector)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_in_messages_carry_no_password() {
        assert_eq!(
            redacted_url("rediss://alice:s3cret@h:6380/0"),
            "rediss://alice:***@h:6380/0"
        );
        assert_eq!(
            redacted_url("postgres://u:pw@h/db?sslmode=require&password=x"),
            "postgres://u:***@h/db?sslmode=require&password=***"
        );
        assert_eq!(redacted_url("redis://h:6379"), "redis://h:6379");
        assert_eq!(redacted_url("redis://:pw@h"), "redis://:***@h");
    }

    #[test]
    fn tls_settings_on_a_plain_endpoint_are_refused() {
        let a = AccessConfig {
            ca_file: Some("/x/ca.pem".into()),
            ..Default::default()
        };
        let e = redis_client("redis://127.0.0.1:1", &a).unwrap_err();
        assert!(e.contains("rediss://"), "{e}");
        let e = etcd_options(
            &["http://127.0.0.1:1".into()],
            etcd_client::ConnectOptions::new(),
            &a,
        )
        .unwrap_err();
        assert!(e.contains("https://"), "{e}");
    }
}
