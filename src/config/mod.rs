//! Configuration: the TOML file, its defaults, and the checks that make a bad
//! file stop start-up with a message naming the offending field.
//!
//! Every table denies unknown fields, so a typo is an error instead of a
//! silently ignored setting.

pub mod access;
pub mod locks;
mod validate;

use locks::{EagerConfig, LocksConfig};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default of `fence.max_cached_resources`: how many resources the gate
/// keeps in memory before it evicts idle ones.
pub const DEFAULT_MAX_CACHED_RESOURCES: usize = 100_000;

/// Access key of the demo credential shipped in the sample config.
pub const DEMO_ACCESS_KEY: &str = "fencegate-demo";
/// Secret of the demo credential. Public on purpose: see [`Config::validate`].
pub const DEMO_SECRET_KEY: &str = "fencegate-demo-secret-key";

/// The shortest session key (`[sessions] key_file`) fencegate accepts.
pub const MIN_SESSION_KEY_CHARS: usize = 32;
/// The shortest admin bearer (`server.admin_token`, or `FENCEGATE_ADMIN_TOKEN`
/// when the file names none).
pub const MIN_ADMIN_BEARER_CHARS: usize = 16;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub fence: FenceConfig,
    pub backend: BackendConfig,
    pub credentials: Vec<Credential>,
    pub rules: Vec<RuleConfig>,
    pub log: LogConfig,
    /// Where the lock services are (for eager fencing).
    pub locks: LocksConfig,
    /// Resources whose fence follows a lock (eager fencing).
    pub eager: Vec<EagerConfig>,
    /// Cluster mode: fences shared with other replicas through etcd.
    pub cluster: Option<ClusterConfig>,
    /// Session credentials that carry a fencing token.
    pub sessions: SessionsConfig,
}

/// `[sessions]`: credentials fencegate issues bound to a lock's token, a
/// scope and an expiry (docs/credentials.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// The issuing key (at least 32 characters). Unset: one node makes
    /// `<data_dir>/session.key` on first start; in cluster mode sessions
    /// are off unless every replica names the same file here.
    #[serde(rename = "key_file")]
    pub session_key_file: Option<PathBuf>,
    /// Keys that still verify, after a rotation (none issues).
    pub previous_key_files: Vec<PathBuf>,
    /// Longest lifetime of a credential, in seconds.
    pub max_ttl_secs: u64,
    /// Lifetime when the caller names none.
    pub default_ttl_secs: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            session_key_file: None,
            previous_key_files: Vec::new(),
            max_ttl_secs: 12 * 3600,
            default_ttl_secs: 3600,
        }
    }
}

/// `[cluster]`: run as one of several interchangeable replicas whose fence
/// table and ordering barrier live in etcd (docs/cluster.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// etcd client URLs, `http://host:port`.
    pub etcd_endpoints: Vec<String>,
    /// Key prefix in etcd of this deployment's fences and registrations.
    pub prefix: String,
    /// Lease of this replica's in-flight registrations: how long newer
    /// writes wait for a replica that died mid-write. Rounded up to whole
    /// seconds (etcd's unit).
    pub replica_ttl_ms: u64,
    /// TLS and credentials for etcd (`https://` endpoints, RBAC user).
    pub etcd_access: access::AccessConfig,
    /// Each resource is owned by one replica at a time, which admits its
    /// requests locally; the others forward them there (docs/cluster.md,
    /// "Owners"). Off: every write is admitted in etcd.
    pub ownership: bool,
    /// The URL other replicas forward requests to, `http(s)://host:port`.
    /// Default: the S3 listener's address, which must then not be a
    /// wildcard (`0.0.0.0`).
    pub advertise: Option<String>,
    /// CA of the other replicas' certificates when `advertise` is
    /// `https://` (default: the system's roots).
    pub peer_ca_file: Option<std::path::PathBuf>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            etcd_endpoints: Vec::new(),
            prefix: "fencegate/".into(),
            replica_ttl_ms: 5000,
            etcd_access: access::AccessConfig::default(),
            ownership: true,
            advertise: None,
            peer_ca_file: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// S3 API listener.
    pub listen: SocketAddr,
    /// Admin listener (health, fences). Loopback by default.
    pub admin_listen: SocketAddr,
    /// Holds the fence table (`fences.redb`) and the embedded store's objects.
    pub data_dir: PathBuf,
    /// Region clients sign for.
    pub region: String,
    /// Root domains for virtual-host style requests (`bucket.<domain>`);
    /// requests to other hosts are path style.
    pub domains: Vec<String>,
    /// Largest accepted request header section, in bytes.
    pub max_header_bytes: usize,
    /// Forward unsigned GET and HEAD requests (object reads and listings)
    /// to the backend unsigned, so that its own public-access policy
    /// decides. Off: unsigned requests are refused. Never re-signed with
    /// fencegate's backend credential; never a write; never a token.
    pub anonymous_reads: bool,
    /// Most S3 connections open at once; more are answered 503 SlowDown.
    pub max_connections: usize,
    /// Threads serving S3 connections, each a single-threaded runtime
    /// that keeps a connection and its requests to itself; 0 is one a core
    /// the process may run on.
    pub threads: usize,
    /// How long a connection may take to send a request's header section
    /// (and, between requests, stay idle) before it is closed.
    pub idle_timeout_ms: u64,
    /// Longest pause in a request body before the request fails with
    /// `400 RequestTimeout`.
    pub request_timeout_ms: u64,
    /// TLS on the S3 listener: PEM certificate chain and private key.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The admin bearer, for admin writes (`POST /fences/...`, `POST
    /// /credentials`); falls back to `FENCEGATE_ADMIN_TOKEN`. Without one,
    /// raising by hand and issuing session credentials are disabled.
    pub admin_token: Option<Secret>,
}

/// A secret string: never printed by `Debug`.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FenceConfig {
    /// Header that carries the token (lower-cased on load).
    pub token_header: String,
    /// Query parameter that carries the token (presigned URLs).
    pub token_query: String,
    /// User-metadata name the accepted token is stamped on objects as
    /// (`x-amz-meta-<name>`); empty turns stamping off.
    pub stamp_metadata: String,
    /// User-metadata name the token is read from (`x-amz-meta-<name>`).
    /// Unset: the stamp's name, or `fencing-token` when stamping is off.
    pub token_metadata: Option<String>,
    /// How long a newer request waits for older in-flight writes with a
    /// complete body before it is answered `503 SlowDown`.
    pub admission_wait_ms: u64,
    /// A write whose answer was lost after the backend had its whole body
    /// (timeout, broken connection) may still be applied. Its resource stays
    /// closed to newer tokens this long: the longest the backend may take to
    /// apply a request it already has.
    pub quarantine_ms: u64,
    /// Treat a `token_header` that the request's signature does not cover
    /// as a presigned URL always does: ignored beside a signed carrier,
    /// refused alone. Off by default: rclone's `--header` is added after
    /// signing.
    pub require_signed_token: bool,
    /// Resources whose fence is kept in memory; beyond this, idle ones are
    /// dropped and read from the store again when next used.
    pub max_cached_resources: usize,
    /// Send fenced per-object writes with `If-Match`/`If-None-Match` on the
    /// object as it was at admission, so that the backend itself refuses
    /// one that something else overtook, and orders what comes after a
    /// write whose answer was lost. A HEAD per write whose object's ETag
    /// fencegate does not know; needs a backend that honours conditional
    /// writes (not Garage). `"auto"` (the default): on in front of a
    /// remote backend the probe found honouring them.
    pub conditional_writes: ConditionalWrites,
}

/// `fence.conditional_writes`: `true`, `false`, or `"auto"` (and shown as
/// written).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub enum ConditionalWrites {
    /// On in front of a remote backend the probe found honouring them.
    #[default]
    Auto,
    On,
    Off,
}

impl std::fmt::Debug for ConditionalWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConditionalWrites::Auto => "\"auto\"",
            ConditionalWrites::On => "true",
            ConditionalWrites::Off => "false",
        })
    }
}

impl<'de> Deserialize<'de> for ConditionalWrites {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = ConditionalWrites;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false or \"auto\"")
            }
            fn visit_bool<E>(self, v: bool) -> Result<ConditionalWrites, E> {
                Ok(match v {
                    true => ConditionalWrites::On,
                    false => ConditionalWrites::Off,
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ConditionalWrites, E> {
                match v {
                    "auto" => Ok(ConditionalWrites::Auto),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
                }
            }
        }
        // A self-describing format (TOML) gives what it has either way.
        d.deserialize_bool(Visit)
    }
}

impl FenceConfig {
    /// The metadata header stamped with the accepted token, if stamping is on.
    pub fn stamp_header(&self) -> Option<String> {
        (!self.stamp_metadata.is_empty()).then(|| format!("x-amz-meta-{}", self.stamp_metadata))
    }

    /// The metadata header a token is read from.
    pub fn token_meta_header(&self) -> String {
        let name = match (&self.token_metadata, self.stamp_metadata.as_str()) {
            (Some(t), _) => t.as_str(),
            (None, "") => "fencing-token",
            (None, stamp) => stamp,
        };
        format!("x-amz-meta-{name}")
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// fencegate's own store (`src/store/`), called in-process.
    Embedded,
    /// Any S3-compatible endpoint.
    S3,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Addressing {
    Path,
    VirtualHost,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    pub kind: BackendKind,
    /// `http://host:port` of the backend (kind = "s3").
    pub endpoint: Option<String>,
    /// Region the backend expects in signatures.
    pub region: Option<String>,
    /// Backend credentials; fall back to `AWS_ACCESS_KEY_ID` /
    /// `AWS_SECRET_ACCESS_KEY` when absent.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<Secret>,
    /// Give up on a backend response after this long.
    pub timeout_ms: u64,
    /// How the backend is addressed: `path` (`/bucket/key`) or
    /// `virtual-host` (`Host: bucket.<endpoint host>`).
    pub addressing: Addressing,
    /// Extra CA certificate (PEM) to trust for an `https://` backend, on top
    /// of the system roots.
    pub ca_file: Option<PathBuf>,
    /// At start-up, find out whether the backend itself honours
    /// conditional writes (`upstream::probe`): it writes and deletes one
    /// object, `.fencegate-probe/<random>`.
    pub probe_conditions: bool,
    /// The bucket the probe writes in; unset: the first the backend lists.
    pub probe_bucket: Option<String>,
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Buckets this credential may use; `"*"` means all.
    #[serde(default)]
    pub buckets: Vec<String>,
    /// May do bucket-level writes (CreateBucket, DeleteBucket, policies...)
    /// on its buckets.
    #[serde(default)]
    pub bucket_admin: bool,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("Credential")
            .field("access_key_id", &self.access_key_id)
            .field("buckets", &self.buckets)
            .field("bucket_admin", &self.bucket_admin)
            .finish_non_exhaustive()
    }
}

impl Credential {
    pub fn allows_bucket(&self, bucket: &str) -> bool {
        self.buckets.iter().any(|b| b == "*" || b == bucket)
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RuleMode {
    /// Every key under the prefix shares the resource named by `resource`.
    Shared,
    /// Every object is its own resource (`bucket/key`), as for an object no
    /// rule matches.
    PerObject,
    /// Writes under the prefix need no token.
    Unfenced,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    pub mode: RuleMode,
    pub resource: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// `tracing` filter directive, e.g. `info` or `fencegate=debug`.
    pub level: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            server: ServerConfig::default(),
            fence: FenceConfig::default(),
            backend: BackendConfig::default(),
            credentials: vec![Credential {
                access_key_id: DEMO_ACCESS_KEY.into(),
                secret_access_key: DEMO_SECRET_KEY.into(),
                buckets: vec!["*".into()],
                bucket_admin: true,
            }],
            rules: Vec::new(),
            log: LogConfig::default(),
            locks: Default::default(),
            eager: Vec::new(),
            cluster: None,
            sessions: SessionsConfig::default(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:9000".parse().unwrap(),
            admin_listen: "127.0.0.1:9001".parse().unwrap(),
            data_dir: PathBuf::from("./data"),
            region: "us-east-1".into(),
            domains: Vec::new(),
            max_header_bytes: 64 * 1024,
            anonymous_reads: false,
            max_connections: 1024,
            threads: 0,
            idle_timeout_ms: 60_000,
            request_timeout_ms: 60_000,
            admin_token: None,
            tls_cert: None,
            tls_key: None,
        }
    }
}

impl Default for FenceConfig {
    fn default() -> Self {
        FenceConfig {
            token_header: "x-fencing-token".into(),
            token_query: "x-fencing-token".into(),
            stamp_metadata: "fencing-token".into(),
            token_metadata: None,
            admission_wait_ms: 10_000,
            quarantine_ms: 30_000,
            require_signed_token: false,
            max_cached_resources: DEFAULT_MAX_CACHED_RESOURCES,
            conditional_writes: ConditionalWrites::Auto,
        }
    }
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            kind: BackendKind::Embedded,
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            timeout_ms: 300_000,
            ca_file: None,
            addressing: Addressing::Path,
            probe_conditions: true,
            probe_bucket: None,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Human,
            level: "info".into(),
        }
    }
}

/// A configuration problem, always naming the field at fault.
#[derive(Debug, thiserror::Error)]
#[error("config error: {0}")]
pub struct ConfigError(pub String);

pub(crate) fn err(field: &str, msg: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("`{field}`: {msg}"))
}

impl Config {
    /// Loads `path`. A missing file is an error unless `optional` (the
    /// default path), in which case the built-in defaults apply.
    pub fn load(path: &Path, optional: bool) -> Result<Config, ConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Config::default());
            }
            Err(e) => return Err(ConfigError(format!("cannot read {}: {e}", path.display()))),
        };
        Self::parse(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    /// Parses TOML text. toml's own messages already name the field and line.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        cfg.fence.token_header = cfg.fence.token_header.to_ascii_lowercase();
        cfg.fence.stamp_metadata = cfg.fence.stamp_metadata.to_ascii_lowercase();
        if let Some(t) = &mut cfg.fence.token_metadata {
            *t = t.to_ascii_lowercase();
        }
        Ok(cfg)
    }

    /// Checks what serde cannot: relations between fields and values, one
    /// table after another (see `validate.rs`), naming the first field at
    /// fault. Called after command-line overrides are applied.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate::server(&self.server)?;
        validate::fence(&self.fence)?;
        validate::backend(&self.backend)?;
        validate::credentials(&self.credentials, &self.server)?;
        validate::rules(&self.rules)?;
        if let Some(c) = &self.cluster {
            validate::cluster(c, &self.backend, &self.server)?;
        }
        validate::sessions(&self.sessions)?;
        locks::validate(&self.locks, &self.eager)
    }

    /// What `fencegate serve` reads besides the file (the session keys, the
    /// backend's keys from the file or the environment), checked before
    /// start-up begins: a bad one is a config error, naming its field, not
    /// a failed start (see `validate.rs`, `serving`).
    pub fn validate_serving(&self) -> Result<(), ConfigError> {
        validate::serving(self, &|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
    }

    /// The admin bearer: from the file, else `FENCEGATE_ADMIN_TOKEN`.
    pub fn admin_bearer(&self) -> Option<Secret> {
        self.server.admin_token.clone().or_else(|| {
            std::env::var("FENCEGATE_ADMIN_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
                .map(Secret)
        })
    }

    pub fn admission_wait(&self) -> Duration {
        Duration::from_millis(self.fence.admission_wait_ms)
    }
}

#[cfg(test)]
mod tests;
