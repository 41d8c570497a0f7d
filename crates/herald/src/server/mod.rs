//! Wiring: opens the store, starts ingest, the dispatcher and the HTTP
//! server, and stops them in order. `main` and the tests both start Herald
//! through [`start`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::Context;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http_body::Body as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, token_sha256, ApiShared, ApiState};
use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::ingest::Ingest;
use crate::limits::LoginLimiter;
use crate::net::NetworkPolicy;
use crate::store::postgres::PostgresStore;
use crate::store::sqlite::SqliteStore;
use crate::store::Store;

pub mod copy_store;
mod listener;
pub mod tasks;

use listener::{body_deadline, secure_transport, serve, trace_request, ListenerLimits};

const ADMIN_TOKEN_KEY: &str = "admin_token_sha256";
/// After its burst, an address may fail one more log-in per this.
const LOGIN_REFILL: Duration = Duration::from_secs(1);

/// What a process does. Many `Api` and `Worker` processes may share one
/// PostgreSQL database; SQLite is for one `All` process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// API and dispatcher in one process (the default).
    All,
    /// The API only (PostgreSQL: dispatching is left to worker processes).
    Api,
    /// The dispatcher and retention only; no HTTP listener (PostgreSQL).
    Worker,
}

impl Role {
    fn serves_api(self) -> bool {
        matches!(self, Role::All | Role::Api)
    }
    fn dispatches(self) -> bool {
        matches!(self, Role::All | Role::Worker)
    }
}

/// The opened store, kept by its concrete type so it can be closed.
pub enum Backend {
    Sqlite(Arc<SqliteStore>),
    Postgres(Arc<PostgresStore>),
}

impl Backend {
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Backend::Sqlite(s) => s.clone(),
            Backend::Postgres(s) => s.clone(),
        }
    }

    pub async fn close(&self) {
        match self {
            Backend::Sqlite(s) => s.close().await,
            Backend::Postgres(s) => s.close().await,
        }
    }
}

pub struct Running {
    /// The API's address (None for a worker).
    pub addr: Option<SocketAddr>,
    pub store: Arc<dyn Store>,
    /// The dispatcher, also when it is not running in the background, so
    /// tests can call [`Dispatcher::process_batch`].
    pub dispatcher: Arc<Dispatcher>,
    /// Set only on the first start without `HERALD_ADMIN_TOKEN`: the token
    /// was just generated and is shown this once.
    pub generated_admin_token: Option<String>,
    shutdown: CancellationToken,
    server: Option<JoinHandle<std::io::Result<()>>>,
    background: tasks::BackgroundTasks,
    backend: Backend,
}

/// Opens the store named by `HERALD_DATABASE_URL`, applies migrations and
/// prepares secrets at rest: every key the stored values name must be in
/// `HERALD_ENCRYPTION_KEY` (else an error naming it), and with a key, plain
/// values are encrypted now (see `store::secrets::prepare`).
pub async fn open_store(config: &Config) -> anyhow::Result<Backend> {
    let backend = open_backend(config).await?;
    let prepared =
        crate::store::secrets::prepare(backend.store().as_ref(), &config.security.encryption_keys)
            .await;
    if let Err(e) = prepared {
        backend.close().await;
        return Err(e);
    }
    Ok(backend)
}

/// `herald rotate-encryption-key`: re-encrypts, with the first key of
/// `HERALD_ENCRYPTION_KEY`, every stored value not under it, in batches,
/// while other processes serve. Returns how many endpoint rows it rewrote.
pub async fn rotate_encryption_key(config: &Config) -> anyhow::Result<u64> {
    anyhow::ensure!(
        config.security.encryption_keys.is_enabled(),
        "HERALD_ENCRYPTION_KEY is not set: nothing to rotate to (put the new key first, keep the old after it)"
    );
    let backend = open_store(config).await?;
    let done = backend
        .store()
        .reseal_secrets(crate::store::ResealScope::NotCurrent)
        .await;
    backend.close().await;
    Ok(done?)
}

/// Opens the store, waiting up to `HERALD_DATABASE_WAIT` while it cannot be
/// reached ([`waiting_for_the_store`]).
async fn open_backend(config: &Config) -> anyhow::Result<Backend> {
    waiting_for_the_store(config, "opening store", || open_backend_once(config)).await
}

/// The configured store's migrations ([`migration_status`]), waiting up to
/// `HERALD_DATABASE_WAIT` while it cannot be reached, as a start does: a
/// deploy's `migrate --status` gate meets the same database a start would.
pub async fn migration_status_waiting(
    config: &Config,
) -> anyhow::Result<crate::store::MigrationStatus> {
    waiting_for_the_store(config, "reading the migrations of", || {
        migration_status(config)
    })
    .await
}

/// `attempt`, tried again while the store cannot be reached, up to
/// `HERALD_DATABASE_WAIT`: a database that is still starting (or, as CI
/// saw, too busy to hand out a connection within the pool's short acquire
/// timeout) should delay the work, not fail it. Any other error fails at
/// once. An error names the store as `doing {store}`.
async fn waiting_for_the_store<T, F, Fut>(
    config: &Config,
    doing: &str,
    mut attempt: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::store::StoreResult<T>>,
{
    let shown = crate::config::redact_url(&config.store.database_url);
    let deadline = tokio::time::Instant::now() + config.store.database_wait;
    let mut pause = Duration::from_millis(250);
    let mut waited = false;
    let done = loop {
        match attempt().await {
            Err(crate::store::StoreError::Unavailable(reason))
                if tokio::time::Instant::now() < deadline =>
            {
                // The last pause ends at the deadline, for one last try
                // there: the whole wait is spent, not cut short by a pause
                // that would pass it.
                let wait = pause.min(deadline - tokio::time::Instant::now());
                tracing::warn!(
                    store = %shown,
                    %reason,
                    retry_in_ms = wait.as_millis() as u64,
                    "store unreachable; waiting for it (HERALD_DATABASE_WAIT)"
                );
                tokio::time::sleep(wait).await;
                waited = true;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => break other,
        }
    };
    done.with_context(|| {
        let waited = if waited {
            format!(
                ", unreachable for {:?} (HERALD_DATABASE_WAIT)",
                config.store.database_wait
            )
        } else {
            String::new()
        };
        if config.store.database_url.starts_with("sqlite:") {
            format!("{doing} {shown}{waited}")
        } else {
            format!(
                "{doing} {shown} (schema {}){waited}",
                config.store.database_schema
            )
        }
    })
}

/// The whole application: the API's routes, and beside them the dashboard
/// (its own log-in, not the bearer token) and the customer portal (its own
/// sessions, opened by a link). Assembled here, above all three, so that
/// the API does not import what is built on it.
pub fn app_router(state: ApiState) -> axum::Router {
    api::router(state.clone())
        .nest("/dashboard", crate::dashboard::router())
        .nest("/portal", crate::portal::router(&state))
        .fallback(|| async { api::ApiError::NotFound("route") })
        .layer(axum::extract::DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .with_state(state)
}

/// A serving process's hold on its SQLite store: an exclusive lock on
/// `<file>.lock`, released when the process ends however it ends (kill -9
/// too). One process per SQLite file: a second `serve` on it is refused.
/// `herald migrate` and `rotate-encryption-key` do not take it (they are
/// safe beside a serving Herald). `None` on PostgreSQL, where many
/// processes share the store.
pub fn hold_sqlite_store(config: &Config) -> anyhow::Result<Option<std::fs::File>> {
    if !config.store.database_url.starts_with("sqlite:") {
        return Ok(None);
    }
    let path = sqlite_store_path(config)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    match lock_sqlite_file(&path)? {
        Some(lock) => Ok(Some(lock)),
        None => anyhow::bail!(
            "another Herald process is serving the SQLite store {}: one process per SQLite file \
             (stop it first, or use PostgreSQL to run several)",
            path.display()
        ),
    }
}

/// The configured SQLite store's file.
fn sqlite_store_path(config: &Config) -> anyhow::Result<std::path::PathBuf> {
    crate::store::sqlite::sqlite_path(&config.store.database_url)
        .context("HERALD_DATABASE_URL: not a sqlite URL")
}

/// The lock on `<path>.lock` that a serving process holds; `None` when
/// another process holds it.
fn lock_sqlite_file(path: &std::path::Path) -> anyhow::Result<Option<std::fs::File>> {
    let lock_path = crate::store::sqlite::backup::with_suffix(path, ".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("cannot lock {}", lock_path.display()))
        }
    }
}

/// `herald backup TARGET`: a consistent copy of the configured SQLite
/// store, taken while it serves (see `store::sqlite::backup`). Refuses an
/// existing `target` unless `force`, and never a target that is a served
/// store (its own or another's).
pub async fn backup(
    config: &Config,
    target: std::path::PathBuf,
    force: bool,
) -> anyhow::Result<crate::store::sqlite::backup::Summary> {
    if !config.store.database_url.starts_with("sqlite:") {
        anyhow::bail!(
            "{}",
            crate::store::postgres::backup::advice(&config.store.database_schema)
        );
    }
    let store = sqlite_store_path(config)?;
    // A store's write-ahead log, shared memory, journal or lock, replaced,
    // loses or corrupts what the store holds (its WAL holds every write
    // since the last checkpoint): never a backup's name, forced or not.
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned());
    if let Some(part) = name.as_deref().and_then(|n| {
        ["-wal", "-shm", "-journal", ".lock"]
            .into_iter()
            .find(|suffix| n.ends_with(suffix))
    }) {
        anyhow::bail!(
            "{}: a name ending in `{part}` is a SQLite store's companion file; \
             name the backup otherwise (e.g. herald-backup.db)",
            target.display()
        );
    }
    if target.exists() {
        if !force {
            anyhow::bail!(
                "{} exists: choose another path, or --force to replace it",
                target.display()
            );
        }
        let same = std::fs::canonicalize(&target).ok() == std::fs::canonicalize(&store).ok();
        let served = lock_sqlite_file(&target)?.is_none();
        if same || served {
            anyhow::bail!(
                "{} is a store a Herald process serves (or the configured store itself): \
                 a backup never replaces it",
                target.display()
            );
        }
    }
    tokio::task::spawn_blocking(move || crate::store::sqlite::backup::backup(&store, &target))
        .await
        .context("the backup task failed")?
        .map_err(Into::into)
}

/// `herald restore BACKUP`: puts a checked backup in place as the
/// configured SQLite store, the replaced one kept aside. Refused while a
/// Herald process serves the store.
pub async fn restore(
    config: &Config,
    backup: std::path::PathBuf,
) -> anyhow::Result<(
    crate::store::sqlite::backup::Summary,
    Option<std::path::PathBuf>,
)> {
    if !config.store.database_url.starts_with("sqlite:") {
        anyhow::bail!(
            "{}",
            crate::store::postgres::backup::advice(&config.store.database_schema)
        );
    }
    let store = sqlite_store_path(config)?;
    if !backup.is_file() {
        anyhow::bail!("no backup file at {}", backup.display());
    }
    if let Some(dir) = store.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Held while the files move: no `serve` can start on them meanwhile.
    let Some(lock) = lock_sqlite_file(&store)? else {
        anyhow::bail!(
            "a Herald process is serving {}: stop it before restoring",
            store.display()
        );
    };
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
    let done = tokio::task::spawn_blocking(move || {
        crate::store::sqlite::backup::restore(&backup, &store, &stamp)
    })
    .await
    .context("the restore task failed")?;
    drop(lock);
    Ok(done?)
}

/// The configured store's migrations, read without applying any.
pub async fn migration_status(
    config: &Config,
) -> crate::store::StoreResult<crate::store::MigrationStatus> {
    if config.store.database_url.starts_with("sqlite:") {
        let path =
            crate::store::sqlite::sqlite_path(&config.store.database_url).ok_or_else(|| {
                crate::store::StoreError::Internal(format!(
                    "not a sqlite URL: {}",
                    crate::config::redact_url(&config.store.database_url)
                ))
            })?;
        crate::store::sqlite::migrations::status(&path)
    } else {
        crate::store::postgres::migrations::status(
            &config.store.database_url,
            &config.store.database_schema,
        )
        .await
    }
}

async fn open_backend_once(config: &Config) -> crate::store::StoreResult<Backend> {
    // Read before anything is applied: a store a newer Herald migrated is
    // refused on both backends, and with HERALD_AUTO_MIGRATE=false so is
    // one with migrations pending.
    let status = migration_status(config).await?;
    if let Some(newer) = status.newer_than_this_binary() {
        return Err(crate::store::StoreError::Internal(newer));
    }
    if !config.store.auto_migrate && !status.pending.is_empty() {
        return Err(crate::store::StoreError::Internal(format!(
            "{} migration(s) pending ({}) and HERALD_AUTO_MIGRATE is false: run `herald migrate` first",
            status.pending.len(),
            status.pending_names()
        )));
    }
    if config.store.database_url.starts_with("sqlite:") {
        let store = SqliteStore::open_with_keys(
            &config.store.database_url,
            config.security.encryption_keys.clone(),
        )
        .await?;
        Ok(Backend::Sqlite(Arc::new(store)))
    } else {
        let store = PostgresStore::open_with_keys(
            &config.store.database_url,
            &config.store.database_schema,
            config.security.encryption_keys.clone(),
        )
        .await?;
        Ok(Backend::Postgres(Arc::new(store)))
    }
}

/// Finds the admin token's digest: from the configuration, or from the
/// store, or by generating a token now (returned so it can be shown once).
async fn admin_token(
    config: &Config,
    store: &dyn Store,
) -> anyhow::Result<([u8; 32], Option<String>)> {
    if let Some(token) = &config.security.admin_token {
        let digest = token_sha256(token);
        // A token generated before is retired for good: unset again later,
        // the one set now, not it (it may have leaked), comes back.
        let kept = match config.security.admin_token_kept {
            true => store.get_setting(ADMIN_TOKEN_KEY).await?,
            false => None,
        };
        if kept.is_some_and(|kept| kept != hex::encode(digest)) {
            store
                .put_setting(ADMIN_TOKEN_KEY, &hex::encode(digest))
                .await?;
        }
        return Ok((digest, None));
    }
    if let Some(stored) = store.get_setting(ADMIN_TOKEN_KEY).await? {
        return Ok((digest_from_hex(&stored)?, None));
    }
    let token = format!("hrld_{}", crate::api::auth::random_hex(24));
    let digest = token_sha256(&token);
    let kept = store
        .init_setting(ADMIN_TOKEN_KEY, &hex::encode(digest))
        .await?;
    if kept == hex::encode(digest) {
        Ok((digest, Some(token)))
    } else {
        // Another process generated one first; its token stands.
        Ok((digest_from_hex(&kept)?, None))
    }
}

fn digest_from_hex(s: &str) -> anyhow::Result<[u8; 32]> {
    let bytes = hex::decode(s).context("stored admin token digest is not hex")?;
    bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("stored admin token digest has the wrong length"))
}

/// Starts Herald with `config` in `role`; `listener` is required for the
/// roles that serve the API.
pub async fn start(
    config: Config,
    listener: Option<TcpListener>,
    role: Role,
) -> anyhow::Result<Running> {
    // Allowed (erasure may matter more than delivery), but said: a
    // delivery may wait up to twice the age cap (a `deliverAt` that far
    // ahead, then its retries), and one whose payload is erased first
    // dies unsent.
    if let Some(keep) = config.retention.payload_retention {
        let max_age = config.delivery.retry.max_age;
        if keep < max_age.saturating_mul(2) {
            tracing::warn!(
                payload_retention = ?keep,
                max_age = ?max_age,
                "HERALD_PAYLOAD_RETENTION is shorter than a delivery may wait (twice HERALD_MAX_AGE): \
                 deliveries still waiting when their payload is erased become dead (expunged) unsent"
            );
        }
    }
    // A certificate that cannot be read stops the start before the store
    // is opened (and perhaps migrated), not after.
    let listener_tls = match (&listener, &config.listener.tls) {
        (Some(_), Some((cert, key))) => Some(crate::tls::ListenerTls::load(cert, key)?),
        _ => None,
    };
    let backend = open_store(&config).await?;
    let store = backend.store();
    let wake = Arc::new(Notify::new());
    let operator = crate::operator::Operator::start(store.clone(), &config, wake.clone()).await?;
    let dispatcher = Arc::new(Dispatcher::new(
        store.clone(),
        &config,
        wake.clone(),
        operator.clone(),
    )?);
    let shutdown = CancellationToken::new();
    let mut background = tasks::BackgroundTasks::default();
    // Only PostgreSQL keeps count deltas apart; SQLite folds them in each
    // writing transaction.
    if matches!(backend, Backend::Postgres(_)) {
        background.spawn(
            "the count fold",
            run_count_fold(store.clone(), shutdown.clone()),
        );
    }
    let backups = Arc::new(crate::backups::Backups::new(config.store.backups.clone()));
    if config.store.backups.is_some() {
        let path = sqlite_store_path(&config)?;
        background.spawn(
            "scheduled backups",
            backups.clone().run(path, shutdown.clone()),
        );
    }
    if role.dispatches() {
        // Other processes' commits (PostgreSQL) wake this dispatcher too.
        store.listen_for_work(wake.clone()).await?;
        background.spawn("the dispatcher", dispatcher.clone().run(shutdown.clone()));
        background.spawn(
            "retention",
            run_retention(store.clone(), config.clone(), shutdown.clone()),
        );
    }

    let mut generated_admin_token = None;
    let mut server = None;
    let mut addr = None;
    if role.serves_api() {
        let listener = listener.context("the API needs a listener")?;
        let (admin_digest, generated) = admin_token(&config, store.as_ref()).await?;
        generated_admin_token = generated;
        // The queue gauges are refreshed where /metrics is served.
        let metrics = Arc::new(crate::metrics::Exporter::new(store.clone()));
        background.spawn("the metrics refresh", metrics.clone().run(shutdown.clone()));
        let local = listener.local_addr()?;
        // Unset: the address this listener is bound to (its real port
        // when the configured one is 0); a wildcard address, which no
        // browser can open (a container's `0.0.0.0`), as `localhost`.
        let public_url = config.portal.public_url.clone().unwrap_or_else(|| {
            let scheme = if config.listener.tls.is_some() {
                "https"
            } else {
                "http"
            };
            if local.ip().is_unspecified() {
                tracing::warn!(
                    listen = %local,
                    "HERALD_PUBLIC_URL is not set: portal links name localhost:{}; set it to the address browsers reach Herald at",
                    local.port()
                );
                return format!("{scheme}://localhost:{}", local.port());
            }
            format!("{scheme}://{local}")
        });
        // Tokens revoked or ended, and applications deleted or renamed,
        // through another process (PostgreSQL) leave this one's caches at
        // once.
        let tokens = Arc::new(api::auth::TokenCache::new(10_000));
        let app_ids = Arc::new(api::AppIdCache::new(100_000));
        let token_changes = Arc::new(tokio::sync::Notify::new());
        store
            .listen_for_token_changes(token_changes.clone())
            .await?;
        background.spawn(
            "the cache clearing",
            api::auth::clear_caches_on(
                tokens.clone(),
                app_ids.clone(),
                token_changes,
                shutdown.clone(),
            ),
        );
        let state = ApiState::new(ApiShared {
            store: store.clone(),
            ingest: Ingest::start(store.clone(), wake.clone(), dispatcher.clone()),
            wake,
            net: NetworkPolicy {
                allow_private: config.egress.allow_private_networks,
            },
            admin_token_sha256: admin_digest,
            app_ids,
            tokens,
            operator,
            metrics,
            public_url,
            portal: config.portal.clone(),
            auth_failures: crate::limits::LoginLimiter::new(
                config.security.auth_failure_limit,
                Duration::from_secs(1),
            ),
            max_headers_per_endpoint: config.security.max_headers_per_endpoint,
            keys: config.security.encryption_keys.clone(),
            max_endpoints_per_app: config.security.max_endpoints_per_app,
            rate_limit: Arc::new(crate::limits::RateLimit::new(
                config.security.api_rate_limit,
            )),
            max_age: config.delivery.retry.max_age,
            breaker: config.delivery.breaker,
            backups,
            login_limiter: Arc::new(LoginLimiter::new(
                config.security.login_failure_limit,
                LOGIN_REFILL,
            )),
            portal_login_limiter: Arc::new(LoginLimiter::new(
                config.security.login_failure_limit,
                LOGIN_REFILL,
            )),
        });
        // Every request's body has its deadline; trailing slashes are
        // optional, as in Svix: normalise before routing.
        // Middleware that only some configurations need is added only
        // then: each layer costs every request (≈ 1–2 µs on the hot path).
        let mut router = app_router(state);
        if config.telemetry.otlp.is_some() {
            router = router.layer(axum::middleware::from_fn(trace_request));
        }
        if config.listener.tls.is_some() {
            router = router.layer(axum::middleware::from_fn_with_state(true, secure_transport));
        }
        let router = router.layer(axum::middleware::from_fn_with_state(
            config.listener.body_timeout,
            body_deadline,
        ));
        let app = tower::Layer::layer(
            &tower_http::normalize_path::NormalizePathLayer::trim_trailing_slash(),
            router,
        );
        addr = Some(local);
        let tls = listener_tls;
        if let Some(tls) = &tls {
            background.spawn("TLS reload", tls.clone().reload_on_hangup(shutdown.clone()));
        }
        let https = tls.is_some();
        if !https {
            background.spawn("SIGHUP", note_hangups(shutdown.clone()));
        }
        let limits = ListenerLimits {
            header_timeout: config.listener.header_timeout,
            max_connections_per_ip: config.listener.max_connections_per_ip,
            tls,
        };
        server = Some(tokio::spawn(serve(listener, app, limits, shutdown.clone())));
        tracing::info!(addr = %local, ?role, https, "herald is serving");
    } else {
        background.spawn("SIGHUP", note_hangups(shutdown.clone()));
        tracing::info!(?role, "herald worker is running");
    }
    Ok(Running {
        addr,
        store,
        dispatcher,
        generated_admin_token,
        shutdown,
        server,
        background,
        backend,
    })
}

/// Takes SIGHUP where there is no TLS certificate to reload: its default
/// action ends the process at once, without the graceful shutdown, which a
/// service manager's "reload" (or a stray `kill -HUP`) should not do.
async fn note_hangups(shutdown: CancellationToken) {
    crate::tls::on_each_hangup(shutdown, || {
        tracing::info!(
            "SIGHUP: nothing to reload (no TLS certificate); settings are read at start, restart to change them"
        )
    })
    .await;
}

/// How often a process folds the kept counts' deltas (PostgreSQL): it
/// bounds the deltas readers add up, not what they see.
const COUNT_FOLD_EVERY: Duration = Duration::from_secs(1);

/// Folds the kept delivery counts' deltas, in every process on PostgreSQL
/// (folders skip each other's rows, so several never wait on one another).
async fn run_count_fold(store: Arc<dyn crate::store::Store>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(COUNT_FOLD_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
        if let Err(e) = store.fold_delivery_counts().await {
            tracing::warn!(error = %e, "folding the kept delivery counts failed; readers still add the deltas");
        }
    }
}

/// How often retention looks for history to prune.
const RETENTION_EVERY: Duration = Duration::from_secs(60);
const RETENTION_BATCH: usize = 500;

/// Prunes audit log entries made before `before`, in batches.
pub async fn prune_audit(
    store: &dyn Store,
    before: crate::store::Millis,
    shutdown: &CancellationToken,
) {
    in_batches(
        shutdown,
        || store.prune_audit(before, RETENTION_BATCH),
        |n| tracing::info!(entries = n, "pruned old audit log entries"),
        "pruning the audit log failed; will try again later",
    )
    .await;
}

/// Runs `batch` (one batch of [`RETENTION_BATCH`] rows at most, answering
/// how many it changed) until one is not full or `shutdown`, pausing
/// between them so claims and ingest are never held up for long; `done`
/// logs each batch that changed rows, a failure is logged as `failed` and
/// left to the next pass.
async fn in_batches<Fut>(
    shutdown: &CancellationToken,
    mut batch: impl FnMut() -> Fut,
    done: impl Fn(u64),
    failed: &str,
) where
    Fut: Future<Output = crate::store::StoreResult<u64>>,
{
    loop {
        match batch().await {
            Ok(n) => {
                if n > 0 {
                    done(n);
                }
                if usize::try_from(n).unwrap_or(usize::MAX) < RETENTION_BATCH
                    || shutdown.is_cancelled()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "{failed}");
                break;
            }
        }
    }
}

/// Prunes old history in small batches, pausing between them so claims and
/// ingest are never held up for long.
async fn run_retention(store: Arc<dyn Store>, config: Config, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RETENTION_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
        retention_pass(&*store, &config, crate::store::now_millis(), &shutdown).await;
    }
}

/// One round of retention as of `now` (the task runs one a minute; tests
/// step it).
pub async fn retention_pass(
    store: &dyn Store,
    config: &Config,
    now: crate::store::Millis,
    shutdown: &CancellationToken,
) {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    // Health needs the last 24 h of stats buckets; a day more is slack.
    if let Err(e) = store.prune_stats(now - 48 * 3600 * 1000).await {
        tracing::warn!(error = %e, "pruning endpoint stats failed");
    }
    if let Err(e) = store.prune_sessions(now).await {
        tracing::warn!(error = %e, "pruning expired sessions failed");
    }
    if let Err(e) = store
        .prune_idempotency(now - crate::api::idempotency::KEY_LIFETIME_MS)
        .await
    {
        tracing::warn!(error = %e, "pruning idempotency keys failed");
    }
    prune_audit(
        store,
        now.saturating_sub(ms(config.retention.audit_retention)),
        shutdown,
    )
    .await;
    // Each message's own payloadRetentionPeriod, then the setting's.
    in_batches(
        shutdown,
        || store.expunge_expired_payloads(now, RETENTION_BATCH),
        |n| {
            tracing::info!(
                messages = n,
                "payloads past their payloadRetentionPeriod erased"
            )
        },
        "erasing expired payloads failed; will try again later",
    )
    .await;
    if let Some(keep) = config.retention.payload_retention {
        let before = now.saturating_sub(ms(keep));
        in_batches(
            shutdown,
            || store.expunge_payloads(before, now, RETENTION_BATCH),
            |n| {
                tracing::info!(
                    messages = n,
                    "payloads past HERALD_PAYLOAD_RETENTION erased"
                )
            },
            "erasing old payloads failed; will try again later",
        )
        .await;
    }
    // The age cap, for deliveries held by an endpoint nobody enables:
    // dead ("too old") as enabling it would make them, so that they do
    // not pile up, and then pruned like any dead delivery.
    let too_old_before = now.saturating_sub(ms(config.delivery.retry.max_age));
    in_batches(
        shutdown,
        || store.expire_held(too_old_before, now, RETENTION_BATCH),
        |n| {
            tracing::info!(
                deliveries = n,
                "held deliveries past the age cap are now dead (too_old)"
            )
        },
        "expiring held deliveries failed; will try again later",
    )
    .await;
    // The same age cap on what an open circuit breaker holds back (pending,
    // unclaimed): no attempt would judge those either while it stays open.
    in_batches(
        shutdown,
        || store.expire_circuit_held(too_old_before, now, RETENTION_BATCH),
        |n| {
            tracing::info!(
                deliveries = n,
                "deliveries held by an open circuit breaker past the age cap are now dead (too_old)"
            )
        },
        "expiring deliveries held by circuit breakers failed; will try again later",
    )
    .await;
    loop {
        let result = store
            .prune(
                now.saturating_sub(ms(config.retention.retention)),
                now.saturating_sub(ms(config.retention.dead_retention)),
                RETENTION_BATCH,
            )
            .await;
        match result {
            Ok(report) => {
                if report.messages + report.dead_deliveries > 0 {
                    tracing::info!(
                        messages = report.messages,
                        dead = report.dead_deliveries,
                        "pruned old history"
                    );
                }
                if !report.more || shutdown.is_cancelled() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "pruning failed; will try again later");
                break;
            }
        }
    }
}

impl Running {
    /// Stops accepting requests and claiming work, waits for requests in
    /// flight to finish and their outcomes to be written, then closes the
    /// store.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            match server.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "server stopped with an error"),
                Err(e) => tracing::warn!(error = %e, "server task failed"),
            }
        }
        // The store is closed whatever a task did.
        let joined = self.background.join_all().await;
        self.backend.close().await;
        joined
    }

    /// Resolves when the server stops by itself or a background task
    /// fails (neither should happen): the process cannot do its work any
    /// longer, and is to be stopped ([`Running::shutdown`] still finishes
    /// what is in flight). Never otherwise.
    pub async fn stopped(&mut self) -> anyhow::Result<()> {
        let Running {
            server, background, ..
        } = self;
        let serving = async {
            match server.as_mut() {
                Some(handle) => handle.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            ended = serving => {
                // Awaited: not to be awaited again at shutdown.
                *server = None;
                match ended {
                    Ok(r) => r.context("server failed"),
                    Err(e) => Err(anyhow::anyhow!("server task failed: {e}")),
                }
            }
            failure = background.failed() => Err(failure),
        }
    }
}
