//! The `fencegate` binary: parse the command line, load the config, run.

use clap::Parser;
use fencegate::cli::{Cli, Command};
use fencegate::config::LogFormat;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(a)) => merge(a, cli.serve),
        None => cli.serve,
    };
    let cfg = match args.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencegate: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(cfg.log.format, &cfg.log.level);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fencegate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fencegate::server::run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("fencegate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Flags given after `serve` win over those given before it.
fn merge(a: fencegate::cli::ServeArgs, b: fencegate::cli::ServeArgs) -> fencegate::cli::ServeArgs {
    fencegate::cli::ServeArgs {
        config: a.config.or(b.config),
        listen: a.listen.or(b.listen),
        admin_listen: a.admin_listen.or(b.admin_listen),
        data_dir: a.data_dir.or(b.data_dir),
    }
}

fn init_logging(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.with_ansi(false).init(),
    }
}
