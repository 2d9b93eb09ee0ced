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
    /// Inspect or raise fences through the admin API.
    Fences(FencesArgs),
}

#[derive(Debug, Args)]
pub struct FencesArgs {
    /// Admin API base URL. Default: http://<server.admin_listen of the config>.
    #[arg(long)]
    pub admin: Option<String>,
    /// Admin bearer token for raising. Default: FENCEGATE_ADMIN_TOKEN, then
    /// server.admin_token of the config.
    #[arg(long, env = "FENCEGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    #[command(subcommand)]
    pub action: FencesAction,
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
}

#[derive(Debug, Clone, Args, Default)]
pub struct ServeArgs {
    /// Config file (TOML). Default: config/fencegate.toml if it exists.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// S3 API address, overrides server.listen.
    #[arg(long, global = true)]
    pub listen: Option<SocketAddr>,
    /// Admin address, overrides server.admin_listen.
    #[arg(long, global = true)]
    pub admin_listen: Option<SocketAddr>,
    /// Data directory, overrides server.data_dir.
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
}

impl ServeArgs {
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
