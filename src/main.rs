//! The `fencegate` binary: parse the command line, load the config, run.

use clap::Parser;
use fencegate::admin::client::{self, FenceCommand};
use fencegate::cli::{
    Cli, Command, CredentialsArgs, CredentialsFormat, FencesAction, FencesArgs, IssueArgs,
    LockArgs, ServeArgs,
};
use fencegate::config::LogFormat;
use std::process::ExitCode;

/// jemalloc: cheaper allocation and free on the request path than glibc's
/// malloc, with memory still returned while a large body streams
/// (docs/benchmarks-log.md, "CPU per request").
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    fencegate::access::install_crypto_provider();
    let cli = Cli::parse();
    let reads_config = matches!(
        cli.command,
        None | Some(Command::Serve(_) | Command::Fences(_))
    );
    let ignored = !reads_config && cli.serve.any();
    if ignored {
        eprintln!(
            "fencegate: --config, --listen, --admin-listen and --data-dir are for serve and \
             fences; this command does not read them"
        );
        return ExitCode::from(2);
    }
    match cli.command {
        Some(Command::Serve(a)) => serve(merge(a, cli.serve)),
        Some(Command::Fences(mut f)) => {
            let args = merge(std::mem::take(&mut f.serve), cli.serve);
            fences(f, args)
        }
        Some(Command::Lock(l)) => lock(l),
        Some(Command::Credentials(c)) => credentials(c),
        Some(Command::Bench(b)) => bench(b),
        None => serve(cli.serve),
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    // What serving reads besides the file is checked here too, before
    // start-up: a bad value exits 2, which the systemd unit does not retry.
    let cfg = match args.load().and_then(|c| c.validate_serving().map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencegate: {e}");
            return ExitCode::from(2);
        }
    };
    let _log_flush = match init_logging(cfg.log.format, &cfg.log.level) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("fencegate: cannot start the log writer: {e}");
            return ExitCode::FAILURE;
        }
    };
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

fn fences(f: FencesArgs, args: ServeArgs) -> ExitCode {
    let cfg = match args.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fencegate: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    match f.action {
        FencesAction::Export => return rt.block_on(export(&cfg, f.admin.as_deref())),
        FencesAction::Import { file } => return rt.block_on(import(&cfg, &file)),
        _ => {}
    }
    let base = f
        .admin
        .unwrap_or_else(|| format!("http://{}", cfg.server.admin_listen));
    let token = f
        .admin_token
        .or_else(|| cfg.admin_bearer().map(|t| t.expose().to_string()));
    if let FencesAction::Highest { prefix } = &f.action {
        return rt.block_on(highest(&base, prefix.as_deref()));
    }
    let cmd = match f.action {
        FencesAction::List {
            prefix,
            limit,
            after,
        } => FenceCommand::List {
            prefix,
            limit,
            after,
        },
        FencesAction::Get { resource } => FenceCommand::Get { resource },
        FencesAction::Raise { resource, token } => FenceCommand::Raise { resource, token },
        FencesAction::Export | FencesAction::Import { .. } | FencesAction::Highest { .. } => {
            unreachable!("handled above")
        }
    };
    match rt.block_on(client::run(&base, token.as_deref(), cmd)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fencegate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `fencegate fences highest`: the highest fence as JSON on stdout, and
/// what to do with it on stderr.
async fn highest(base: &str, prefix: Option<&str>) -> ExitCode {
    match client::highest(base, prefix).await {
        Ok((Some(top), n)) => {
            println!(
                "{}",
                serde_json::json!({"highest": top.highest, "resource": top.resource, "fences": n})
            );
            eprintln!(
                "fencegate: the highest of {n} fences is {} ({}): a lock service whose tokens \
                 went back must give its next holder a token of at least {} \
                 (docs/lock-services.md, \"When the tokens go back\")",
                top.highest, top.resource, top.highest
            );
            ExitCode::SUCCESS
        }
        Ok((None, _)) => {
            println!("{}", serde_json::json!({"highest": null, "fences": 0}));
            eprintln!(
                "fencegate: no fence is recorded{}",
                prefix.map_or(String::new(), |p| format!(" under {p:?}"))
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fencegate fences highest: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `fencegate fences export`: JSON lines on stdout, a count on stderr.
async fn export(cfg: &fencegate::config::Config, admin: Option<&str>) -> ExitCode {
    use fencegate::admin::{client, transfer};
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let done = match admin {
        Some(base) => client::export(base, &mut out).await,
        None => match transfer::open_table(cfg).await {
            Ok(store) => transfer::export(store.as_ref(), &mut out).await,
            Err(e) => Err(e),
        },
    };
    let flushed = std::io::Write::flush(&mut out).map_err(|e| e.to_string());
    match done.and_then(|n| flushed.map(|()| n)) {
        Ok(n) => {
            eprintln!("fencegate: exported {n} fences");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fencegate fences export: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `fencegate fences import FILE`.
async fn import(cfg: &fencegate::config::Config, file: &std::path::Path) -> ExitCode {
    use fencegate::admin::transfer;
    let input: Box<dyn std::io::BufRead> = if file.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        match std::fs::File::open(file) {
            Ok(f) => Box::new(std::io::BufReader::new(f)),
            Err(e) => {
                eprintln!("fencegate fences import: {}: {e}", file.display());
                return ExitCode::FAILURE;
            }
        }
    };
    let mut input = input;
    let store = match transfer::open_table(cfg).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fencegate fences import: {e}");
            return ExitCode::FAILURE;
        }
    };
    match transfer::import(store.as_ref(), &mut input).await {
        Ok(d) => {
            eprintln!(
                "fencegate: imported {} fences ({} were already higher)",
                d.fences, d.already
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("fencegate fences import: {e}");
            ExitCode::FAILURE
        }
    }
}

fn lock(a: LockArgs) -> ExitCode {
    use fencegate::locks::helper::{self, LockSpec};
    use std::time::Duration;
    if let Some(t) = a.timeout
        && !(t.is_finite() && t >= 0.0)
    {
        eprintln!("fencegate lock: --timeout must be a number of seconds");
        return ExitCode::from(2);
    }
    let spec = LockSpec {
        etcd: a.etcd,
        zookeeper: a.zookeeper,
        redis: a.redis,
        postgres: a.postgres,
        access: fencegate::config::access::AccessConfig {
            ca_file: a.ca_file,
            cert_file: a.cert_file,
            tls_key_file: a.tls_key_file,
            user: a.user,
            password_file: a.password_file,
            password_env: a.password_env,
        },
        postgres_sequence: a.sequence,
        name: a.name,
        ttl: Duration::from_secs(a.ttl),
        timeout: a.timeout.map(Duration::from_secs_f64),
        kill_grace: Duration::from_secs(a.kill_grace),
        extra_env: match (a.credentials, a.credentials_endpoint) {
            (true, _) => Some(credentials_env(a.issue)),
            (_, true) => Some(credentials_endpoint(
                a.issue,
                a.credentials_listen,
                a.credentials_token_file,
            )),
            _ => None,
        },
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let code = rt.block_on(helper::run(spec, a.command));
    ExitCode::from(code.clamp(0, 255) as u8)
}

/// Session credentials for `token` from `lock`, asked of the admin API as
/// `issue` says (`fencegate credentials` and `fencegate lock --credentials`).
async fn issue_for(
    issue: &IssueArgs,
    token: u64,
    lock: &str,
) -> Result<client::CredentialsReply, String> {
    let (admin, scope) = (&issue.admin_url, &issue.scope);
    let admin_token = issue.admin_token.as_deref();
    client::issue(
        admin,
        admin_token,
        token,
        lock,
        scope,
        issue.credentials_ttl,
    )
    .await
}

/// `fencegate lock --credentials`: once the lock is held, session
/// credentials bound to its token, as the command's environment.
fn credentials_env(issue: IssueArgs) -> fencegate::locks::helper::ExtraEnv {
    Box::new(move |token, lock, _lost| {
        Box::pin(async move {
            let got = issue_for(&issue, token, &lock)
                .await
                .map_err(|e| format!("cannot get credentials for token {token}: {e}"))?;
            let env = got.env(issue.s3_url.as_deref());
            Ok(fencegate::locks::helper::Extra {
                set: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                ..Default::default()
            })
        })
    })
}

/// The default lifetime of the endpoint's credentials: minutes, so that a
/// leaked one is short-lived; renewed each half of it.
const ENDPOINT_TTL_SECS: u64 = 900;

/// `fencegate lock --credentials-endpoint`: once the lock is held, the
/// container-credentials endpoint serving session credentials bound to its
/// token, renewed until the lock is lost; the command's environment points
/// at it.
fn credentials_endpoint(
    issue: IssueArgs,
    listen: Option<std::net::SocketAddr>,
    token_file: Option<std::path::PathBuf>,
) -> fencegate::locks::helper::ExtraEnv {
    use fencegate::locks::endpoint::{self, Creds, CredsSource};
    Box::new(move |token, lock, lost| {
        Box::pin(async move {
            let ttl = issue.credentials_ttl.unwrap_or(ENDPOINT_TTL_SECS);
            let issue = std::sync::Arc::new(IssueArgs {
                credentials_ttl: Some(ttl),
                ..issue
            });
            let asking = issue.clone();
            let source: CredsSource = std::sync::Arc::new(move || {
                let (issue, lock) = (asking.clone(), lock.clone());
                Box::pin(async move {
                    let got = issue_for(&issue, token, &lock)
                        .await
                        .map_err(|e| format!("cannot get credentials for token {token}: {e}"))?;
                    Ok(Creds {
                        access_key_id: got.access_key_id,
                        secret_access_key: got.secret_access_key,
                        session_token: got.session_token,
                        expiration: got.expiration,
                    })
                })
            });
            let listen = listen.unwrap_or(([127, 0, 0, 1], 0).into());
            let ttl = std::time::Duration::from_secs(ttl);
            let ep = endpoint::start(listen, token_file, source, ttl, lost).await?;
            eprintln!(
                "fencegate lock: credentials for token {token} at {} (authorization token in {}), renewed every {} s",
                ep.url,
                ep.token_file.display(),
                ttl.as_secs() / 2
            );
            let mut set = ep.env();
            if let Some(u) = &issue.s3_url {
                set.push(("AWS_ENDPOINT_URL".into(), u.clone()));
            }
            Ok(fencegate::locks::helper::Extra {
                set,
                remove: vec![
                    "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY",
                    "AWS_SESSION_TOKEN",
                    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                ],
                keep: Some(Box::new(ep)),
            })
        })
    })
}

/// `fencegate credentials`: issue, then print in the asked form.
fn credentials(c: CredentialsArgs) -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let i = &c.issue;
    let got = match rt.block_on(issue_for(i, c.token, &c.lock)) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("fencegate credentials: {e}");
            return ExitCode::FAILURE;
        }
    };
    match c.format {
        CredentialsFormat::Env => {
            for (k, v) in got.env(i.s3_url.as_deref()) {
                println!("export {k}='{v}'");
            }
        }
        CredentialsFormat::Process => println!("{}", got.process_json()),
        CredentialsFormat::Values => {
            println!("aws_access_key_id = {}", got.access_key_id);
            println!("aws_secret_access_key = {}", got.secret_access_key);
            println!("aws_session_token = {}", got.session_token);
        }
    }
    eprintln!(
        "fencegate credentials: {} carries fencing token {} until {}",
        got.access_key_id, got.fencing_token, got.expiration
    );
    ExitCode::SUCCESS
}

fn bench(b: fencegate::bench::BenchArgs) -> ExitCode {
    use fencegate::bench::{BenchCommand, load, relay, sink, store};
    let threads = match &b.command {
        Some(BenchCommand::Sink(s)) => s.threads.max(1),
        Some(BenchCommand::Store(s)) => s.threads.max(1),
        Some(BenchCommand::Relay(r)) => r.threads.max(1),
        None => b.load.threads.max(1),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("runtime");
    let result = match b.command {
        Some(BenchCommand::Sink(s)) => rt.block_on(sink::run(s)).map_err(|e| e.to_string()),
        Some(BenchCommand::Store(s)) => rt.block_on(store::run(s)),
        Some(BenchCommand::Relay(r)) => rt.block_on(relay::run(r)),
        None => {
            let json = b.load.json;
            rt.block_on(load::run(b.load)).and_then(|report| {
                eprintln!("{}", report.human());
                if json {
                    println!("{}", report.json());
                }
                match report.tally.ok {
                    0 => Err("no request succeeded".into()),
                    _ => Ok(()),
                }
            })
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencegate bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Flags given after `serve` win over those given before it.
fn merge(a: ServeArgs, b: ServeArgs) -> ServeArgs {
    ServeArgs {
        config: a.config.or(b.config),
        listen: a.listen.or(b.listen),
        admin_listen: a.admin_listen.or(b.admin_listen),
        data_dir: a.data_dir.or(b.data_dir),
    }
}

/// `log.level` as a filter. s3s (the embedded store's S3 layer) logs
/// nothing at `info`, but opens an `info` span to check each request's
/// signature: at the default level that span is dropped, not made and
/// thrown away for every request. At `debug` and `trace` it is kept.
fn default_directives(level: &str) -> String {
    match level.trim().eq_ignore_ascii_case("info") {
        true => "info,s3s::ops::signature=warn".into(),
        false => level.into(),
    }
}

/// Log lines go to stderr through `LogBuffer`: appended in memory by the
/// request, written out in batches by a thread of their own (about 20 ms
/// late), never dropped. The guard writes out what is left when `serve`
/// returns.
fn init_logging(format: LogFormat, level: &str) -> std::io::Result<fencegate::log_buffer::Guard> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_directives(level)));
    let (writer, guard) = fencegate::log_buffer::LogBuffer::start(std::io::stderr())?;
    fencegate::access_log::install(format == LogFormat::Json, writer.clone());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Human => builder.with_ansi(false).init(),
    }
    Ok(guard)
}
