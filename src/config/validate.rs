//! The checks serde cannot make, one function per table, each naming the
//! first field at fault. [`Config::validate`](super::Config::validate)
//! calls them in order; the `[locks]` and `[[eager]]` checks are in
//! `locks.rs`, beside their schema. [`serving`] checks what `fencegate
//! serve` reads besides the file ([`Config::validate_serving`](super::Config::validate_serving)).

use super::{
    BackendConfig, BackendKind, ClusterConfig, Config, ConfigError, Credential, DEMO_ACCESS_KEY,
    DEMO_SECRET_KEY, FenceConfig, MIN_ADMIN_BEARER_CHARS, MIN_SESSION_KEY_CHARS, RuleConfig,
    RuleMode, ServerConfig, SessionsConfig, err,
};
use std::collections::HashSet;
use std::path::Path;

/// `[server]`: region, domains, limits, TLS pair, admin bearer.
pub(super) fn server(server: &ServerConfig) -> Result<(), ConfigError> {
    if server.region.is_empty() {
        return Err(err("server.region", "must not be empty"));
    }
    for (i, d) in server.domains.iter().enumerate() {
        if d.is_empty() || d.contains(['/', ':', ' ']) || d.starts_with('.') {
            return Err(err(
                &format!("server.domains[{i}]"),
                format!("{d:?} is not a domain name"),
            ));
        }
    }
    if server.max_header_bytes < 1024 {
        return Err(err("server.max_header_bytes", "must be at least 1024"));
    }
    if server.tls_cert.is_some() != server.tls_key.is_some() {
        return Err(err("server.tls_key", "tls_cert and tls_key go together"));
    }
    if server.max_connections == 0 {
        return Err(err("server.max_connections", "must be greater than 0"));
    }
    if server.threads > 1024 {
        return Err(err(
            "server.threads",
            "must be at most 1024 (0: one a core)",
        ));
    }
    if server.idle_timeout_ms == 0 {
        return Err(err("server.idle_timeout_ms", "must be greater than 0"));
    }
    if server.request_timeout_ms == 0 {
        return Err(err("server.request_timeout_ms", "must be greater than 0"));
    }
    if let Some(t) = &server.admin_token
        && t.0.len() < MIN_ADMIN_BEARER_CHARS
    {
        return Err(err(
            "server.admin_token",
            format!("must be at least {MIN_ADMIN_BEARER_CHARS} characters"),
        ));
    }
    Ok(())
}

/// `[fence]`: the carrier names, the admission wait, the cache size.
pub(super) fn fence(fence: &FenceConfig) -> Result<(), ConfigError> {
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !name_ok(&fence.token_header) {
        return Err(err("fence.token_header", "must be a non-empty header name"));
    }
    if !name_ok(&fence.token_query) {
        return Err(err(
            "fence.token_query",
            "must be a non-empty parameter name",
        ));
    }
    if !fence.stamp_metadata.is_empty() && !name_ok(&fence.stamp_metadata) {
        return Err(err(
            "fence.stamp_metadata",
            "must be a metadata name, or empty to turn stamping off",
        ));
    }
    if let Some(t) = &fence.token_metadata
        && !name_ok(t)
    {
        return Err(err("fence.token_metadata", "must be a non-empty name"));
    }
    if fence.admission_wait_ms == 0 {
        return Err(err("fence.admission_wait_ms", "must be greater than 0"));
    }
    if fence.max_cached_resources == 0 {
        return Err(err("fence.max_cached_resources", "must be greater than 0"));
    }
    Ok(())
}

/// `[backend]`: an endpoint exactly when the kind is `s3`, a URL, and the
/// key pair whole.
pub(super) fn backend(backend: &BackendConfig) -> Result<(), ConfigError> {
    match backend.kind {
        BackendKind::Embedded => {
            if backend.endpoint.is_some() {
                return Err(err(
                    "backend.endpoint",
                    "only valid with backend.kind = \"s3\"",
                ));
            }
        }
        BackendKind::S3 => {
            let Some(ep) = &backend.endpoint else {
                return Err(err(
                    "backend.endpoint",
                    "required when backend.kind = \"s3\"",
                ));
            };
            let uri: http::Uri = ep
                .parse()
                .map_err(|e| err("backend.endpoint", format!("not a URL: {e}")))?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                return Err(err(
                    "backend.endpoint",
                    "must look like http://host:port or https://host:port",
                ));
            }
            if backend.access_key_id.is_some() != backend.secret_access_key.is_some() {
                return Err(err(
                    "backend.secret_access_key",
                    "access_key_id and secret_access_key go together",
                ));
            }
        }
    }
    Ok(())
}

/// `[[credentials]]`: at least one, none empty, no access key twice; and the
/// demo credential only on a loopback listener.
pub(super) fn credentials(
    credentials: &[Credential],
    server: &ServerConfig,
) -> Result<(), ConfigError> {
    if credentials.is_empty() {
        return Err(err("credentials", "at least one credential is required"));
    }
    let mut seen = HashSet::new();
    for (i, c) in credentials.iter().enumerate() {
        if c.access_key_id.is_empty() {
            return Err(err(&format!("credentials[{i}].access_key_id"), "empty"));
        }
        if c.secret_access_key.is_empty() {
            return Err(err(&format!("credentials[{i}].secret_access_key"), "empty"));
        }
        if !seen.insert(&c.access_key_id) {
            return Err(err(
                &format!("credentials[{i}].access_key_id"),
                format!("duplicate access key {:?}", c.access_key_id),
            ));
        }
    }
    let demo = credentials
        .iter()
        .any(|c| c.access_key_id == DEMO_ACCESS_KEY || c.secret_access_key == DEMO_SECRET_KEY);
    if demo && !server.listen.ip().is_loopback() {
        return Err(err(
            "server.listen",
            "the demo credential is configured; refusing to listen on a non-loopback \
             address (replace [[credentials]] first)",
        ));
    }
    Ok(())
}

/// `[[rules]]`: a bucket, a resource exactly for `shared`, no bucket and
/// prefix twice.
pub(super) fn rules(rules: &[RuleConfig]) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for (i, r) in rules.iter().enumerate() {
        let field = |f: &str| format!("rules[{i}].{f}");
        if r.bucket.is_empty() {
            return Err(err(&field("bucket"), "must not be empty"));
        }
        match (r.mode, &r.resource) {
            (RuleMode::Shared, None) => {
                return Err(err(&field("resource"), "required when mode = \"shared\""));
            }
            (RuleMode::Shared, Some(name)) if name.is_empty() => {
                return Err(err(&field("resource"), "must not be empty"));
            }
            (RuleMode::PerObject | RuleMode::Unfenced, Some(_)) => {
                return Err(err(&field("resource"), "only valid with mode = \"shared\""));
            }
            _ => {}
        }
        if !seen.insert((&r.bucket, &r.prefix)) {
            return Err(err(
                &field("prefix"),
                "duplicate rule for this bucket and prefix",
            ));
        }
    }
    Ok(())
}

/// `[cluster]`: etcd endpoints, a prefix, a lease etcd can keep, a backend
/// every replica shares, and an address the others can forward to.
pub(super) fn cluster(
    cluster: &ClusterConfig,
    backend: &BackendConfig,
    server: &ServerConfig,
) -> Result<(), ConfigError> {
    if backend.kind == BackendKind::Embedded {
        return Err(err(
            "backend.kind",
            "[cluster] needs a backend the replicas share (kind = \"s3\"): with the \
             embedded store each replica would hold its own objects",
        ));
    }
    if cluster.etcd_endpoints.is_empty() {
        return Err(err(
            "cluster.etcd_endpoints",
            "must name at least one etcd endpoint",
        ));
    }
    for (i, e) in cluster.etcd_endpoints.iter().enumerate() {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            return Err(err(
                &format!("cluster.etcd_endpoints[{i}]"),
                format!("{e:?} is not an http:// or https:// URL"),
            ));
        }
    }
    cluster.etcd_access.validate("cluster.etcd_access")?;
    if cluster.prefix.is_empty() {
        return Err(err("cluster.prefix", "must not be empty"));
    }
    match &cluster.advertise {
        Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
            return Err(err(
                "cluster.advertise",
                format!("{url:?} is not an http:// or https:// URL"),
            ));
        }
        None if server.listen.ip().is_unspecified() => {
            let scheme = match server.tls_cert {
                Some(_) => "https",
                None => "http",
            };
            return Err(err(
                "cluster.advertise",
                format!(
                    "required when server.listen is {}, which the other replicas cannot \
                     reach as such: set the URL they should forward to, e.g. \
                     \"{scheme}://10.0.0.5:{}\"",
                    server.listen,
                    server.listen.port()
                ),
            ));
        }
        _ => {}
    }
    if cluster.replica_ttl_ms < 2000 {
        return Err(err(
            "cluster.replica_ttl_ms",
            "must be at least 2000 (etcd's shortest lease with its default election timeout)",
        ));
    }
    Ok(())
}

/// `[sessions]`: lifetimes, and no previous key without a current one.
pub(super) fn sessions(s: &SessionsConfig) -> Result<(), ConfigError> {
    if s.max_ttl_secs == 0 {
        return Err(err("sessions.max_ttl_secs", "must be greater than 0"));
    }
    if s.default_ttl_secs == 0 || s.default_ttl_secs > s.max_ttl_secs {
        return Err(err(
            "sessions.default_ttl_secs",
            "must be between 1 and sessions.max_ttl_secs",
        ));
    }
    if s.session_key_file.is_none() && !s.previous_key_files.is_empty() {
        return Err(err(
            "sessions.previous_key_files",
            "name the current key in sessions.key_file too",
        ));
    }
    Ok(())
}

/// What `fencegate serve` reads besides the file, checked before start-up
/// begins, so that a bad one stops it as a config error (exit 2, the field
/// named) and not as a failed start a service manager would retry: the
/// session keys (`[sessions]`'s files, or the one a single node keeps in
/// its data directory), the admin bearer from `FENCEGATE_ADMIN_TOKEN` when
/// the file names none (as long as `server.admin_token` must be), and with
/// `kind = "s3"` the backend's keys, from the file or the environment.
/// `env` looks a variable up (empty is unset). The other commands
/// (`fencegate fences`) need none of them.
pub(super) fn serving(
    cfg: &Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    session_keys(cfg)?;
    if cfg.server.admin_token.is_none()
        && let Some(t) = env("FENCEGATE_ADMIN_TOKEN")
        && t.len() < MIN_ADMIN_BEARER_CHARS
    {
        return Err(err(
            "FENCEGATE_ADMIN_TOKEN",
            format!(
                "the admin bearer (server.admin_token is unset) is {} characters long: at \
                 least {MIN_ADMIN_BEARER_CHARS} are needed, as for server.admin_token",
                t.len()
            ),
        ));
    }
    let b = &cfg.backend;
    if b.kind == BackendKind::S3 {
        if b.access_key_id.is_none() && env("AWS_ACCESS_KEY_ID").is_none() {
            return Err(err(
                "backend.access_key_id",
                "unset, and so is AWS_ACCESS_KEY_ID: fencegate signs what it sends \
                 the backend with this key",
            ));
        }
        if b.secret_access_key.is_none() && env("AWS_SECRET_ACCESS_KEY").is_none() {
            return Err(err(
                "backend.secret_access_key",
                "unset, and so is AWS_SECRET_ACCESS_KEY: fencegate signs what it \
                 sends the backend with this key",
            ));
        }
    }
    Ok(())
}

/// The session keys `s3::session::keys_from_config` will load: each file
/// `[sessions]` names readable and long enough; unnamed, on one node, the
/// data directory's `session.key` long enough if it is there (it is made
/// on first start).
fn session_keys(cfg: &Config) -> Result<(), ConfigError> {
    let s = &cfg.sessions;
    let current = (s.session_key_file.iter()).map(|p| ("sessions.key_file".to_string(), p));
    let previous = (s.previous_key_files.iter().enumerate())
        .map(|(i, p)| (format!("sessions.previous_key_files[{i}]"), p));
    for (field, path) in current.chain(previous) {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(&field, format!("cannot read {}: {e}", path.display())))?;
        long_enough(&field, path, &text)?;
    }
    if s.session_key_file.is_none() && cfg.cluster.is_none() {
        let path = cfg.server.data_dir.join("session.key");
        if let Ok(text) = std::fs::read_to_string(&path) {
            long_enough("sessions.key_file", &path, &text)
                .map_err(|e| ConfigError(format!("{} (unset, so that file is the key)", e.0)))?;
        }
    }
    Ok(())
}

fn long_enough(field: &str, path: &Path, text: &str) -> Result<(), ConfigError> {
    let n = text.trim().len();
    if n < MIN_SESSION_KEY_CHARS {
        return Err(err(
            field,
            format!(
                "the session key {} has {n} characters: at least {MIN_SESSION_KEY_CHARS} \
                 are needed (make one with `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`)",
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_backend_keys_come_from_the_file_or_the_environment() {
        let s3 = "[backend]\nkind = \"s3\"\nendpoint = \"http://127.0.0.1:1\"\n";
        let cfg = Config::parse(s3).unwrap();
        cfg.validate().unwrap();
        let e = serving(&cfg, &no_env).unwrap_err();
        assert!(e.to_string().contains("`backend.access_key_id`"), "{e}");
        let only_id = |k: &str| (k == "AWS_ACCESS_KEY_ID").then(|| "id".to_string());
        let e = serving(&cfg, &only_id).unwrap_err();
        assert!(e.to_string().contains("`backend.secret_access_key`"), "{e}");
        serving(&cfg, &|k| k.starts_with("AWS_").then(|| "k".into())).unwrap();
        let keys = "access_key_id = \"k\"\nsecret_access_key = \"s\"\n";
        let cfg = Config::parse(&format!("{s3}{keys}")).unwrap();
        serving(&cfg, &no_env).unwrap();
    }

    /// `FENCEGATE_ADMIN_TOKEN` needs the 16 characters `server.admin_token`
    /// needs (it was taken at any length, one character included), and is
    /// not looked at when the file names the bearer.
    #[test]
    fn the_admin_bearer_from_the_environment_needs_16_characters() {
        let bearer =
            |v: &'static str| move |k: &str| (k == "FENCEGATE_ADMIN_TOKEN").then(|| v.to_string());
        let dir = tempfile::tempdir().unwrap();
        let server = format!("[server]\ndata_dir = \"{}\"\n", dir.path().display());
        let cfg = Config::parse(&server).unwrap();
        let e = serving(&cfg, &bearer("x")).unwrap_err().to_string();
        assert!(
            e.contains("`FENCEGATE_ADMIN_TOKEN`") && e.contains("is 1 characters long"),
            "{e}"
        );
        assert!(serving(&cfg, &bearer("0123456789abcde")).is_err());
        serving(&cfg, &bearer("0123456789abcdef")).unwrap();
        let named = format!("{server}admin_token = \"0123456789abcdef\"\n");
        serving(&Config::parse(&named).unwrap(), &bearer("x")).unwrap();
    }

    #[test]
    fn a_wildcard_listener_needs_cluster_advertise() {
        let cluster = "[backend]\nkind = \"s3\"\nendpoint = \"http://127.0.0.1:1\"\n\
                       [[credentials]]\naccess_key_id = \"a\"\nsecret_access_key = \"b\"\n\
                       [cluster]\netcd_endpoints = [\"http://127.0.0.1:2379\"]\n";
        let check = |listen: &str, more: &str| {
            let text = format!("[server]\nlisten = \"{listen}\"\n{cluster}{more}");
            Config::parse(&text)
                .unwrap()
                .validate()
                .map_err(|e| e.to_string())
        };
        for wildcard in ["0.0.0.0:9000", "[::]:9000"] {
            let e = check(wildcard, "").unwrap_err();
            assert!(e.contains("`cluster.advertise`: required"), "{e}");
            check(wildcard, "advertise = \"http://10.0.0.5:9000\"\n").unwrap();
        }
        check("10.0.0.5:9000", "").unwrap();
    }

    #[test]
    fn a_short_session_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let (short, long) = (dir.path().join("short"), dir.path().join("long"));
        std::fs::write(&short, "too-short\n").unwrap();
        std::fs::write(&long, "0123456789abcdef0123456789abcdef\n").unwrap();
        let sessions = |files: &str| {
            let data = dir.path().display();
            let text = format!("[server]\ndata_dir = \"{data}\"\n[sessions]\n{files}");
            serving(&Config::parse(&text).unwrap(), &no_env).map_err(|e| e.to_string())
        };
        let (s, l) = (short.display(), long.display());
        let e = sessions(&format!("key_file = \"{s}\"\n")).unwrap_err();
        assert!(
            e.contains("`sessions.key_file`") && e.contains("9 characters"),
            "{e}"
        );
        let e = sessions(&format!(
            "key_file = \"{l}\"\nprevious_key_files = [\"{l}\", \"{s}\"]\n"
        ))
        .unwrap_err();
        assert!(e.contains("`sessions.previous_key_files[1]`"), "{e}");
        sessions(&format!("key_file = \"{l}\"\n")).unwrap();
        let e = sessions(&format!(
            "key_file = \"{}\"\n",
            dir.path().join("none").display()
        ))
        .unwrap_err();
        assert!(e.contains("`sessions.key_file`: cannot read"), "{e}");
        // Unnamed: the data directory's, when it is there.
        sessions("").unwrap();
        std::fs::write(dir.path().join("session.key"), "short\n").unwrap();
        let e = sessions("").unwrap_err();
        assert!(
            e.contains("`sessions.key_file`") && e.contains("session.key"),
            "{e}"
        );
    }
}
