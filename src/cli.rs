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
