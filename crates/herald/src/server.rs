//! Wiring: opens the store, starts ingest, the dispatcher and the HTTP
//! server, and stops them in order. `main` and the tests both start Herald
//! through [`start`].

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use rand::RngCore;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, token_sha256, ApiState};
use crate::config::Config;
use crate::dispatch::Dispatcher;
use crate::ingest::Ingest;
use crate::net::NetworkPolicy;
use crate::store::sqlite::SqliteStore;
use crate::store::Store;

const ADMIN_TOKEN_KEY: &str = "admin_token_sha256";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// API and dispatcher in one process (the default).
    All,
    /// The API only: tests that step the dispatcher by hand use this.
    ApiOnly,
}

pub struct Running {
    pub addr: SocketAddr,
    pub store: Arc<dyn Store>,
    /// The dispatcher, also when it is not running in the background, so
    /// tests can call [`Dispatcher::process_batch`].
    pub dispatcher: Arc<Dispatcher>,
    /// Set only on the first start without `HERALD_ADMIN_TOKEN`: the token
    /// was just generated and is shown this once.
    pub generated_admin_token: Option<String>,
    shutdown: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    dispatcher_task: Option<JoinHandle<()>>,
    sqlite: Option<Arc<SqliteStore>>,
}

pub async fn open_store(config: &Config) -> anyhow::Result<Arc<SqliteStore>> {
    let store = SqliteStore::open(&config.database_url)
        .await
        .with_context(|| format!("opening store {}", config.database_url))?;
    Ok(Arc::new(store))
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

/// Starts Herald on `listener` with `config`.
pub async fn start(config: Config, listener: TcpListener, role: Role) -> anyhow::Result<Running> {
    let sqlite = open_store(&config).await?;
    let store: Arc<dyn Store> = sqlite.clone();
    let (admin_digest, generated_admin_token) = admin_token(&config, store.as_ref()).await?;
    let wake = Arc::new(Notify::new());
    let ingest = Ingest::start(store.clone(), wake.clone());
    let dispatcher = Arc::new(Dispatcher::new(store.clone(), &config, wake.clone())?);
    let shutdown = CancellationToken::new();

    let dispatcher_task = match role {
        Role::All => Some(tokio::spawn(dispatcher.clone().run(shutdown.clone()))),
        Role::ApiOnly => None,
    };

    let state = ApiState {
        store: store.clone(),
        ingest,
        wake,
        net: NetworkPolicy {
            allow_private: config.allow_private_networks,
        },
        admin_token_sha256: admin_digest,
        app_ids: Default::default(),
    };
    // Trailing slashes are optional, as in Svix: normalise before routing.
    let app = tower::Layer::layer(
        &tower_http::normalize_path::NormalizePathLayer::trim_trailing_slash(),
        api::router(state),
    );
    let addr = listener.local_addr()?;
    let server_shutdown = shutdown.clone();
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            axum::ServiceExt::<axum::extract::Request>::into_make_service(app),
        )
        .with_graceful_shutdown(async move { server_shutdown.cancelled().await })
        .await
    });
    tracing::info!(%addr, database = %config.database_url, "herald is serving");
    Ok(Running {
        addr,
        store,
        dispatcher,
        generated_admin_token,
        shutdown,
        server,
        dispatcher_task,
        sqlite: Some(sqlite),
    })
}

impl Running {
    /// Stops accepting requests and claiming work, waits for requests in
    /// flight to finish and their outcomes to be written, then closes the
    /// store.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match (&mut self.server).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "server stopped with an error"),
            Err(e) => tracing::warn!(error = %e, "server task failed"),
        }
        if let Some(task) = self.dispatcher_task.take() {
            task.await.context("dispatcher task failed")?;
        }
        if let Some(sqlite) = self.sqlite.take() {
            sqlite.close().await;
        }
        Ok(())
    }

    /// Resolves when the server stops by itself (it should not).
    pub async fn stopped(&mut self) -> anyhow::Result<()> {
        match (&mut self.server).await {
            Ok(r) => r.context("server failed"),
            Err(e) => Err(anyhow::anyhow!("server task failed: {e}")),
        }
    }
}
