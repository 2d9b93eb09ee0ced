//! Command line: `fencegate [serve]` with overrides for the config file.

use crate::config::{Config, ConfigError};
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

/// Default config path, relative to the working directory.
pub const DEFAULT_CONFIG: &str = "config/fencegate.toml";

#[derive(Debug, Parser)]
#[command(
    name = "fencegate",
    version,
    about = "Fencing-token enforcing reverse proxy for S3"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the S3 API (the default).
    Serve(ServeArgs),
    /// Inspect or raise fences through the admin API; export and import
    /// them from the config's fence table.
    Fences(FencesArgs),
    /// Hold a lock from etcd, ZooKeeper, Redis or PostgreSQL while a command runs, with the
    /// lock's fencing token in FENCING_TOKEN (and its key in FENCING_LOCK_KEY).
    /// Exits with the command's status, 69 if the lock could not be taken,
    /// 75 if it was lost while the command ran (the command is then stopped).
    Lock(LockArgs),
    /// Issue session credentials bound to a fencing token you hold (from
    /// FENCING_TOKEN, as `fencegate lock` sets it): every request a program
    /// signs with them carries the token, with no change to the program.
    /// Printed as shell exports (default), as the JSON of the aws CLI's
    /// `credential_process`, or as config-file values.
    Credentials(CredentialsArgs),
    /// Load generator (SigV4 PUT/GET at a size and concurrency, latency
    /// percentiles), or `bench sink` (an in-memory S3 that discards),
    /// `bench store` (the embedded store alone) or `bench relay` (the floor
    /// of a hop between replicas).
    Bench(crate::bench::BenchArgs),
}

#[derive(Debug, Args)]
pub struct LockArgs {
    /// etcd client URLs, comma-separated (the lock is `etcdctl lock NAME`'s).
    #[arg(
        long,
        env = "FENCEGATE_ETCD",
        value_delimiter = ',',
        required_unless_present_any = ["zookeeper", "redis", "postgres"],
        conflicts_with_all = ["zookeeper", "redis", "postgres"]
    )]
    pub etcd: Vec<String>,
    /// ZooKeeper connect string, host:port[,host:port...] (Curator's mutex
    /// recipe under the directory NAME).
    #[arg(long, env = "FENCEGATE_ZOOKEEPER", conflicts_with_all = ["redis", "postgres"])]
    pub zookeeper: Option<String>,
    /// Redis URL, redis://host:port[/db] (the lock is the key NAME, set with
    /// SET NX PX; the token counter is redisson_lock_token:{NAME}).
    #[arg(long, env = "FENCEGATE_REDIS", conflicts_with = "postgres")]
    pub redis: Option<String>,
    /// PostgreSQL URL, postgres://user@host:port/db (the lock is
    /// pg_advisory_lock(hashtext(NAME)); the token is nextval of --sequence).
    #[arg(long, env = "FENCEGATE_POSTGRES")]
    pub postgres: Option<String>,
    /// The PostgreSQL sequence tokens come from (created if missing).
    #[arg(long, default_value = "fencegate_tokens")]
    pub sequence: String,
    /// PEM file of the CA that signed the service's certificate (etcd
    /// https://, Redis rediss://, PostgreSQL sslmode=verify-*); without
    /// it, the system's roots.
    #[arg(long, env = "FENCEGATE_LOCK_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate, for a service that demands one (mutual TLS).
    #[arg(long, env = "FENCEGATE_LOCK_CERT_FILE", requires = "tls_key_file")]
    pub cert_file: Option<std::path::PathBuf>,
    /// PEM private key of --cert-file.
    #[arg(
        long = "key-file",
        env = "FENCEGATE_LOCK_KEY_FILE",
        requires = "cert_file"
    )]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// User: etcd RBAC user, Redis ACL user, PostgreSQL role, ZooKeeper
    /// SASL (DIGEST-MD5) user.
    #[arg(long, env = "FENCEGATE_LOCK_USER")]
    pub user: Option<String>,
    /// File holding the password (one trailing newline ignored).
    #[arg(
        long,
        env = "FENCEGATE_LOCK_PASSWORD_FILE",
        requires = "user",
        conflicts_with = "password_env"
    )]
    pub password_file: Option<std::path::PathBuf>,
    /// Name of the environment variable holding the password.
    #[arg(long, requires = "user")]
    pub password_env: Option<String>,
    /// etcd lease TTL, ZooKeeper session timeout, Redis key TTL, or
    /// PostgreSQL idle_session_timeout (pinged every TTL/3), in seconds. The lease or key is renewed every TTL/3; without an acknowledged renewal for a whole
    /// TTL the lock counts as lost.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub ttl: u64,
    /// Give up (exit 69) when the lock is not taken within this many seconds.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Seconds between SIGTERM and SIGKILL when the lock is lost.
    #[arg(long, default_value_t = 5)]
    pub kill_grace: u64,
    /// Lock name (etcd), lock directory such as /locks/orders (ZooKeeper), or
    /// lock key (Redis), or lock name (PostgreSQL).
    pub name: String,
    /// Give the command session credentials bound to the lock's token:
    /// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and
    /// AWS_ENDPOINT_URL (--s3-url) in its environment, asked of the admin
    /// API (--admin, --admin-token).
    #[arg(long, conflicts_with = "credentials_endpoint")]
    pub credentials: bool,
    /// Serve the command session credentials bound to the lock's token,
    /// renewed while the lock is held, as the AWS container-credentials
    /// endpoint: AWS_CONTAINER_CREDENTIALS_FULL_URI,
    /// AWS_CONTAINER_AUTHORIZATION_TOKEN (and _FILE) and AWS_ENDPOINT_URL
    /// (--s3-url) in its environment, and no static AWS_ACCESS_KEY_ID.
    /// Credentials last --credentials-ttl (default 900 s).
    #[arg(long)]
    pub credentials_endpoint: bool,
    /// Where the endpoint listens (a loopback address; default: a free
    /// port on 127.0.0.1), for a program that is not the command's child.
    #[arg(long, requires = "credentials_endpoint")]
    pub credentials_listen: Option<SocketAddr>,
    /// Write the endpoint's authorization token to this file (mode 0600)
    /// rather than a temporary one, for a program beside the command.
    #[arg(long, requires = "credentials_endpoint")]
    pub credentials_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub issue: IssueArgs,
    /// The command to run under the lock, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Where and how session credentials are asked for.
#[derive(Debug, Clone, Args)]
pub struct IssueArgs {
    /// fencegate's admin API, which issues the credentials.
    #[arg(
        long = "admin",
        env = "FENCEGATE_ADMIN_URL",
        default_value = "http://127.0.0.1:9001"
    )]
    pub admin_url: String,
    /// The admin bearer, which the admin API's writes must present
    /// (`Authorization: Bearer ...`).
    #[arg(long, env = "FENCEGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// fencegate's S3 URL, given to the program as AWS_ENDPOINT_URL.
    #[arg(long = "s3-url", env = "FENCEGATE_S3_URL")]
    pub s3_url: Option<String>,
    /// What the credentials reach: BUCKET, BUCKET/PREFIX or * (the
    /// default); repeatable.
    #[arg(long)]
    pub scope: Vec<String>,
    /// Lifetime of the credentials in seconds (default: the server's
    /// sessions.default_ttl_secs, or 900 s for `lock
    /// --credentials-endpoint`; at most its sessions.max_ttl_secs).
    #[arg(long)]
    pub credentials_ttl: Option<u64>,
}

#[derive(Debug, Args)]
pub struct CredentialsArgs {
    /// The fencing token the credentials carry.
    #[arg(long, env = "FENCING_TOKEN")]
    pub token: u64,
    /// The lock the token came from (shown in refusals and logs).
    #[arg(long, env = "FENCING_LOCK_KEY", default_value = "")]
    pub lock: String,
    /// How to print them.
    #[arg(long, value_enum, default_value_t = CredentialsFormat::Env)]
    pub format: CredentialsFormat,
    #[command(flatten)]
    pub issue: IssueArgs,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum CredentialsFormat {
    /// `export AWS_...=...` lines for a shell's `eval`.
    Env,
    /// The JSON of the aws `credential_process` setting (Version 1).
    Process,
    /// `aws_access_key_id = ...` lines for an aws config or credentials file.
    Values,
}

#[derive(Debug, Args)]
pub struct FencesArgs {
    /// Admin API base URL. Default: http://<server.admin_listen of the config>
    /// (for export: none, the config's fence table is read).
    #[arg(long)]
    pub admin: Option<String>,
    /// The admin bearer, for raising. Default: FENCEGATE_ADMIN_TOKEN, then
    /// server.admin_token of the config.
    #[arg(long, env = "FENCEGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    #[command(subcommand)]
    pub action: FencesAction,
    /// The config, as `serve` takes it (also accepted before `fences`).
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum FencesAction {
    /// List recorded fences, in resource order.
    List {
        #[arg(long)]
        prefix: Option<String>,
        #[arg(long)]
        limit: Option<usize>,
        /// Start after this resource (the previous page's next_after).
        #[arg(long)]
        after: Option<String>,
    },
    /// Show one resource's fence.
    Get { resource: String },
    /// Raise a resource's fence by hand (revokes holders below TOKEN).
    Raise { resource: String, token: u64 },
    /// The highest fence of all resources (or those under --prefix): what a
    /// lock service whose tokens went back must be bumped to, so that its
    /// next holder's token is at least that (docs/lock-services.md).
    Highest {
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Print every fence as JSON lines: from the running node at --admin
    /// if given, else straight from the store the config names (etcd with
    /// [cluster], else fences.redb of a stopped node).
    Export,
    /// Raise the config's store (etcd with [cluster], else fences.redb of a
    /// stopped node) to every fence in FILE (JSON lines, as export prints
    /// them; `-` for stdin). Never lowers a fence.
    Import { file: PathBuf },
}

#[derive(Debug, Clone, Args, Default)]
pub struct ServeArgs {
    /// Config file (TOML). Default: config/fencegate.toml if it exists.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// S3 API address, overrides server.listen.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Admin address, overrides server.admin_listen.
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
    /// Data directory, overrides server.data_dir.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

impl ServeArgs {
    /// Whether any of these flags was given. Before a subcommand they are
    /// the top level's, which only `serve` and `fences` read: `main`
    /// refuses them before the others rather than ignore them.
    pub fn any(&self) -> bool {
        self.config.is_some()
            || self.listen.is_some()
            || self.admin_listen.is_some()
            || self.data_dir.is_some()
    }

    /// The effective configuration: file, then flags, then validation.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut cfg = match &self.config {
            Some(p) => Config::load(p, false)?,
            None => Config::load(std::path::Path::new(DEFAULT_CONFIG), true)?,
        };
        if let Some(a) = self.listen {
            cfg.server.listen = a;
        }
        if let Some(a) = self.admin_listen {
            cfg.server.admin_listen = a;
        }
        if let Some(d) = &self.data_dir {
            cfg.server.data_dir = d.clone();
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    /// clap's own checks of the whole command line (unique names, valid
    /// relations), which it otherwise makes only when a command is run.
    #[test]
    fn the_command_line_is_well_formed() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
