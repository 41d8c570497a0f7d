//! The `herald` binary: parses the command line and hands over to the
//! library. Nothing here but wiring.

use std::path::PathBuf;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

// glibc's allocator spends a fifth of the CPU on this workload's
// many small, cross-thread allocations; mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use herald::config::Config;
use herald::server::{self, Role};

#[derive(Parser)]
#[command(
    name = "herald",
    version,
    about = "Durable, signed, retried outbound webhooks."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run Herald: the API and the dispatcher, or one of them.
    Serve {
        #[command(flatten)]
        config: ConfigFile,
        /// all: API and dispatcher; api: the API only; worker: the
        /// dispatcher only (many of each may share one PostgreSQL).
        #[arg(long, value_enum, default_value = "all")]
        role: Role,
    },
    /// Apply the store's migrations and exit (whatever HERALD_AUTO_MIGRATE
    /// says).
    Migrate {
        #[command(flatten)]
        config: ConfigFile,
        /// List applied and pending migrations; exit 0 when none is
        /// pending, 1 otherwise. Applies nothing.
        #[arg(long, conflicts_with = "dry_run")]
        status: bool,
        /// Print the migrations that would run. Applies nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Write a consistent copy of the SQLite store to PATH while Herald
    /// serves, check it and print what it holds (PostgreSQL: use pg_dump).
    Backup {
        /// Where the copy goes (refused if it exists, unless --force).
        path: PathBuf,
        /// Replace an existing file at PATH (never a served store).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Put a backup in place as the SQLite store (Herald stopped); the
    /// replaced store is kept aside beside it.
    Restore {
        /// The backup file.
        path: PathBuf,
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Copy everything in the configured store into an empty store at
    /// --to (SQLite or PostgreSQL), with Herald stopped on both; prints
    /// each table's rows on both sides and exits 1 when any differ.
    CopyStore {
        #[command(flatten)]
        args: herald::cli::CopyStoreArgs,
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Copy event types, applications and endpoints (with their headers
    /// and signing secrets) from a server speaking Svix's API v1 into the
    /// configured store; again later to bring over what changed.
    ImportSvix {
        #[command(flatten)]
        args: herald::cli::import_svix::ImportSvixArgs,
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Exit 0 when the Herald serving on HERALD_LISTEN (or --url) answers
    /// /healthz, 1 otherwise: a container's HEALTHCHECK (images without curl).
    Healthcheck {
        /// The base URL to ask (default: http:// and HERALD_LISTEN, a
        /// wildcard address asked on loopback).
        #[arg(long, value_parser = herald::cli::BaseUrl)]
        url: Option<String>,
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Re-encrypt stored secrets with the first key of HERALD_ENCRYPTION_KEY
    /// (safe while Herald serves); then older keys can be removed.
    RotateEncryptionKey {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Dead letters of a running Herald: list, replay.
    #[command(subcommand)]
    Dead(herald::cli::DeadCommand),
    /// Endpoints of a running Herald: enable, disable.
    #[command(subcommand)]
    Endpoint(herald::cli::EndpointCommand),
    /// Application-scoped API tokens of a running Herald: create, revoke.
    #[command(subcommand)]
    Token(herald::cli::TokenCommand),
}

/// `--config`, taken by every command that reads the settings.
#[derive(clap::Args)]
struct ConfigFile {
    /// TOML configuration file; HERALD_* environment variables override it.
    #[arg(long = "config", id = "config", value_name = "FILE")]
    file: Option<PathBuf>,
}

/// mimalloc's `mi_option_purge_delay` (its position in `mi_option_t`,
/// the same in mimalloc 2 and 3; the Rust bindings do not name it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> std::process::ExitCode {
    // By default mimalloc hands freed memory back to the OS after 10 ms;
    // under steady load that memory is wanted again at once, and faulting
    // fresh zeroed pages back in cost ≈ 5 % of the throughput. A second
    // keeps an idle process lean all the same. `MIMALLOC_PURGE_DELAY`
    // still overrides it.
    // SAFETY: sets a plain integer option before any other thread exists.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, 1000) };
    // clap takes a `&'static str`; the line lives as long as the process.
    let version: &'static str = Box::leak(herald::version_line().into_boxed_str());
    let matches = Cli::command().version(version).get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // A command's output piped into `head` or `true` ends it quietly, as
    // any Unix tool's does, where `println!` panicked on the closed pipe.
    // Not `serve`: its log must not end it when a reader goes away.
    if !matches!(cli.command, Command::Serve { .. }) {
        // SAFETY: sets one signal's disposition before any other thread
        // exists. TCP sockets are written with MSG_NOSIGNAL by std and
        // tokio; a Unix-socket peer (PostgreSQL's) that goes away ends the
        // command as a closed stdout does, with a non-zero status.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("herald: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve { config, role } => serve(config.file, role).await,
            Command::Migrate {
                config,
                status: true,
                ..
            } => migrate_status(config.file).await,
            Command::Migrate {
                config,
                dry_run: true,
                ..
            } => migrate_dry_run(config.file).await,
            Command::Migrate { config, .. } => migrate(config.file).await,
            Command::RotateEncryptionKey { config } => rotate_encryption_key(config.file).await,
            Command::Backup {
                path,
                force,
                config,
            } => backup(config.file, path, force).await,
            Command::Restore { path, config } => restore(config.file, path).await,
            Command::Healthcheck { url, config } => healthcheck(config.file, url).await,
            Command::CopyStore { args, config } => copy_store(config.file, args).await,
            Command::ImportSvix { args, config } => import_svix(config.file, args).await,
            Command::Dead(cmd) => herald::cli::dead(cmd).await,
            Command::Endpoint(cmd) => herald::cli::endpoint(cmd).await,
            Command::Token(cmd) => herald::cli::token(cmd).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<PendingMigrations>().is_some() => {
            std::process::ExitCode::FAILURE
        }
        Err(e) if e.downcast_ref::<StatusUnknown>().is_some() => {
            eprintln!("herald: {e:#}");
            std::process::ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("herald: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(config: &Config) -> anyhow::Result<herald::telemetry::Telemetry> {
    herald::telemetry::init(config)
}

async fn serve(config_file: Option<PathBuf>, role: Role) -> anyhow::Result<()> {
    let config = Config::load(config_file.as_deref())?;
    let telemetry = init_logging(&config)?;
    // One process per SQLite file: an API-only or worker-only process
    // there has no partner. Allowed (an API that must send nothing, as CI's
    // fuzzing wants), but said: messages accepted are not delivered.
    if role != Role::All && config.store.database_url.starts_with("sqlite:") {
        tracing::warn!(
            "--role {} on SQLite: no other process can serve this store, so {}; \
             run `herald serve` (both roles), or PostgreSQL to split them (docs/scaling-out.md)",
            if role == Role::Api { "api" } else { "worker" },
            if role == Role::Api {
                "nothing accepted here is delivered"
            } else {
                "no message can be accepted"
            }
        );
    }
    // Held until the process ends.
    let _store_lock = server::hold_sqlite_store(&config)?;
    let https = config.listener.tls.is_some();
    let listener = match role {
        Role::Worker => None,
        Role::All | Role::Api => Some(
            tokio::net::TcpListener::bind(config.listener.listen)
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "HERALD_LISTEN: cannot listen on {}: {e}",
                        config.listener.listen
                    )
                })?,
        ),
    };
    let mut running = server::start(config, listener, role).await?;
    if let Some(token) = &running.generated_admin_token {
        // Shown once: only its digest is kept.
        println!("Generated admin token (shown only now; keep it safe): {token}");
    }
    match running.addr {
        Some(addr) if https => println!("herald listening on https://{addr}"),
        Some(addr) => println!("herald listening on http://{addr}"),
        None => println!("herald worker running"),
    }
    let failed = tokio::select! {
        r = running.stopped() => Some(r),
        _ = terminate_signal() => None,
    };
    match &failed {
        // Exiting non-zero, for the service manager to start it again.
        Some(Err(e)) => tracing::error!(error = %e, "herald cannot go on: stopping"),
        _ => tracing::info!("shutting down: finishing requests in flight"),
    }
    let stopped = running.shutdown().await;
    // The exporter's blocking flush, off the runtime's threads.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    failed.unwrap_or(Ok(())).and(stopped)
}

/// `migrate --status` found migrations pending: exit 1, having said so.
#[derive(Debug)]
struct PendingMigrations;

impl std::fmt::Display for PendingMigrations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("migrations pending")
    }
}

impl std::error::Error for PendingMigrations {}

/// `migrate --status` could not read the store (unreachable past
/// `HERALD_DATABASE_WAIT`, refused): exit 2, so that a deploy's gate tells
/// it from migrations pending (1).
#[derive(Debug)]
struct StatusUnknown(anyhow::Error);

impl std::fmt::Display for StatusUnknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for StatusUnknown {}

async fn migrate_status(config_file: Option<PathBuf>) -> anyhow::Result<()> {
    let config = Config::load(config_file.as_deref())?;
    let _telemetry = init_logging(&config)?;
    let status = server::migration_status_waiting(&config)
        .await
        .map_err(StatusUnknown)?;
    println!(
        "store {}: {} applied, {} pending (this Herald knows up to {})",
        herald::config::redact_url(&config.store.database_url),
        status.applied.len(),
        status.pending.len(),
        status.newest_known
    );
    for m in &status.applied {
        println!("  applied  {m}");
    }
    for m in &status.pending {
        println!("  pending  {m}");
    }
    if let Some(newer) = status.newer_than_this_binary() {
        anyhow::bail!("{newer}");
    }
    if status.pending.is_empty() {
        Ok(())
    } else {
        Err(PendingMigrations.into())
    }
}

async fn migrate_dry_run(config_file: Option<PathBuf>) -> anyhow::Result<()> {
    let config = Config::load(config_file.as_deref())?;
    let _telemetry = init_logging(&config)?;
    let status = server::migration_status_waiting(&config).await?;
    if let Some(newer) = status.newer_than_this_binary() {
        anyhow::bail!("{newer}");
    }
    if status.pending.is_empty() {
        println!(
            "nothing to run: {} is up to date",
            herald::config::redact_url(&config.store.database_url)
        );
    }
    for m in &status.pending {
        println!("would run  {m}");
    }
    Ok(())
}

async fn migrate(config_file: Option<PathBuf>) -> anyhow::Result<()> {
    let mut config = Config::load(config_file.as_deref())?;
    // This is the step HERALD_AUTO_MIGRATE=false leaves to the operator.
    config.store.auto_migrate = true;
    let _telemetry = init_logging(&config)?;
    // Opening a store applies its migrations.
    let backend = server::open_store(&config).await?;
    backend.close().await;
    println!(
        "migrations applied to {}",
        herald::config::redact_url(&config.store.database_url)
    );
    Ok(())
}

async fn backup(config_file: Option<PathBuf>, path: PathBuf, force: bool) -> anyhow::Result<()> {
    let config = Config::load(config_file.as_deref())?;
    let summary = server::backup(&config, path.clone(), force).await?;
    println!("backup {}: {summary}", path.display());
    Ok(())
}

async fn restore(config_file: Option<PathBuf>, path: PathBuf) -> anyhow::Result<()> {
    let config = Config::load(config_file.as_deref())?;
    let (summary, aside) = server::restore(&config, path.clone()).await?;
    let shown = herald::config::redact_url(&config.store.database_url);
    match aside {
        Some(aside) => println!(
            "restored {} as {shown}: {summary}; the replaced store is at {}",
            path.display(),
            aside.display()
        ),
        None => println!("restored {} as {shown}: {summary}", path.display()),
    }
    Ok(())
}

async fn copy_store(
    config_file: Option<PathBuf>,
    args: herald::cli::CopyStoreArgs,
) -> anyhow::Result<()> {
    let config = Config::load(config_file.as_deref())?;
    herald::cli::copy_store(&config, args).await
}

async fn import_svix(
    config_file: Option<PathBuf>,
    args: herald::cli::import_svix::ImportSvixArgs,
) -> anyhow::Result<()> {
    let config = Config::load(config_file.as_deref())?;
    let report = herald::cli::import_svix::import_svix(&config, &args).await?;
    println!("{report}");
    if report.failed() {
        anyhow::bail!("some objects were not imported (above); run again once fixed");
    }
    Ok(())
}

async fn healthcheck(config_file: Option<PathBuf>, url: Option<String>) -> anyhow::Result<()> {
    let base = match url {
        Some(url) => url,
        None => {
            let config = Config::load(config_file.as_deref())?;
            let mut listen = config.listener.listen;
            if listen.ip().is_unspecified() {
                listen.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            let scheme = if config.listener.tls.is_some() {
                "https"
            } else {
                "http"
            };
            format!("{scheme}://{listen}")
        }
    };
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        // The listener's own certificate may name the public host only.
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .build()?;
    let response = client
        .get(format!("{base}/healthz"))
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("{base}/healthz: {e}"))?;
    if !response.status().is_success() {
        anyhow::bail!("{base}/healthz answered {}", response.status());
    }
    println!("{base}/healthz: {}", response.status());
    Ok(())
}

async fn rotate_encryption_key(config_file: Option<PathBuf>) -> anyhow::Result<()> {
    let config = Config::load(config_file.as_deref())?;
    let _telemetry = init_logging(&config)?;
    let rows = server::rotate_encryption_key(&config).await?;
    println!(
        "re-encrypted {rows} endpoint rows with key id {}",
        config
            .security
            .encryption_keys
            .current_id()
            .unwrap_or_default()
    );
    Ok(())
}

async fn terminate_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    /// clap checks its own rules (unique argument ids, among them) only
    /// when a command is built in a debug build: every command, here.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
