//! Wiring: opens the store, starts ingest, the dispatcher and the HTTP
//! server, and stops them in order. `main` and the tests both start Herald
//! through [`start`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rand::RngCore;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, token_sha256, ApiShared, ApiState};
use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::ingest::Ingest;
use crate::net::NetworkPolicy;
use crate::store::postgres::PostgresStore;
use crate::store::sqlite::SqliteStore;
use crate::store::Store;

const ADMIN_TOKEN_KEY: &str = "admin_token_sha256";

/// What a process does. Many `Api` and `Worker` processes may share one
/// PostgreSQL database; SQLite is for one `All` process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// API and dispatcher in one process (the default).
    All,
    /// The API only (also what tests use to step the dispatcher by hand).
    Api,
    /// The dispatcher and retention only; no HTTP listener.
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
    background: Vec<JoinHandle<()>>,
    backend: Backend,
}

/// Opens the store named by `HERALD_DATABASE_URL` and applies migrations.
pub async fn open_store(config: &Config) -> anyhow::Result<Backend> {
    let shown = crate::config::redact_url(&config.database_url);
    if config.database_url.starts_with("sqlite:") {
        let store = SqliteStore::open(&config.database_url)
            .await
            .with_context(|| format!("opening store {shown}"))?;
        Ok(Backend::Sqlite(Arc::new(store)))
    } else {
        let store = PostgresStore::open(&config.database_url, &config.database_schema)
            .await
            .with_context(|| {
                format!("opening store {shown} (schema {})", config.database_schema)
            })?;
        Ok(Backend::Postgres(Arc::new(store)))
    }
}

/// Finds the admin token's digest: from the configuration, or from the
/// store, or by generating a token now (returned so it can be shown once).
async fn admin_token(
    config: &Config,
    store: &dyn Store,
) -> anyhow::Result<([u8; 32], Option<String>)> {
    if let Some(token) = &config.admin_token {
        return Ok((token_sha256(token), None));
    }
    if let Some(stored) = store.get_setting(ADMIN_TOKEN_KEY).await? {
        return Ok((digest_from_hex(&stored)?, None));
    }
    let mut raw = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut raw);
    let token = format!("hrld_{}", hex::encode(raw));
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
    let mut background = Vec::new();
    if role.dispatches() {
        // Other processes' commits (PostgreSQL) wake this dispatcher too.
        store.listen_for_work(wake.clone()).await?;
        background.push(tokio::spawn(dispatcher.clone().run(shutdown.clone())));
        background.push(tokio::spawn(run_retention(
            store.clone(),
            config.clone(),
            shutdown.clone(),
        )));
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
        background.push(tokio::spawn(metrics.clone().run(shutdown.clone())));
        let state = ApiState::new(ApiShared {
            store: store.clone(),
            ingest: Ingest::start(store.clone(), wake.clone(), dispatcher.clone()),
            wake,
            net: NetworkPolicy {
                allow_private: config.allow_private_networks,
            },
            admin_token_sha256: admin_digest,
            app_ids: Default::default(),
            tokens: Default::default(),
            operator,
            metrics,
            dashboard: Default::default(),
            auth_failures: crate::limits::LoginLimiter::new(
                config.auth_failure_limit,
                Duration::from_secs(1),
            ),
            known_tokens: Default::default(),
            max_headers_per_endpoint: config.max_headers_per_endpoint,
        });
        // Trailing slashes are optional, as in Svix: normalise before routing.
        let app = tower::Layer::layer(
            &tower_http::normalize_path::NormalizePathLayer::trim_trailing_slash(),
            api::router(state),
        );
        let local = listener.local_addr()?;
        addr = Some(local);
        let server_shutdown = shutdown.clone();
        server = Some(tokio::spawn(async move {
            axum::serve(
                listener,
                // The client's address: failed authentications are limited per address.
                axum::ServiceExt::<axum::extract::Request>::into_make_service_with_connect_info::<
                    SocketAddr,
                >(app),
            )
            .with_graceful_shutdown(async move { server_shutdown.cancelled().await })
            .await
        }));
        tracing::info!(addr = %local, ?role, "herald is serving");
    } else {
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

/// How often retention looks for history to prune.
const RETENTION_EVERY: Duration = Duration::from_secs(60);
const RETENTION_BATCH: usize = 500;

/// Prunes old history in small batches, pausing between them so claims and
/// ingest are never held up for long.
async fn run_retention(store: Arc<dyn Store>, config: Config, shutdown: CancellationToken) {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(RETENTION_EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
        let now = crate::store::now_millis();
        // Health needs the last 24 h of stats buckets; a day more is slack.
        if let Err(e) = store.prune_stats(now - 48 * 3600 * 1000).await {
            tracing::warn!(error = %e, "pruning endpoint stats failed");
        }
        if let Err(e) = store
            .prune_idempotency(now - crate::api::idempotency::KEY_LIFETIME_MS)
            .await
        {
            tracing::warn!(error = %e, "pruning idempotency keys failed");
        }
        // The age cap, for deliveries held by an endpoint nobody enables:
        // dead ("too old") as enabling it would make them, so that they do
        // not pile up, and then pruned like any dead delivery.
        let too_old_before = now.saturating_sub(ms(config.retry.max_age));
        loop {
            match store
                .expire_held(too_old_before, now, RETENTION_BATCH)
                .await
            {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(
                            deliveries = n,
                            "held deliveries past the age cap are now dead (too_old)"
                        );
                    }
                    if usize::try_from(n).unwrap_or(usize::MAX) < RETENTION_BATCH
                        || shutdown.is_cancelled()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "expiring held deliveries failed; will try again later");
                    break;
                }
            }
        }
        loop {
            let result = store
                .prune(
                    now.saturating_sub(ms(config.retention)),
                    now.saturating_sub(ms(config.dead_retention)),
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
        for task in self.background.drain(..) {
            task.await.context("background task failed")?;
        }
        self.backend.close().await;
        Ok(())
    }

    /// Resolves when the server stops by itself (it should not); never,
    /// for a worker.
    pub async fn stopped(&mut self) -> anyhow::Result<()> {
        match &mut self.server {
            Some(server) => match server.await {
                Ok(r) => r.context("server failed"),
                Err(e) => Err(anyhow::anyhow!("server task failed: {e}")),
            },
            None => std::future::pending().await,
        }
    }
}
