//! Herald: durable, signed, retried outbound webhooks in one binary.
//!
//! The map of this crate is in ARCHITECTURE.md at the repository root.

pub mod api;
pub mod audit;
pub mod backups;
pub mod cli;
pub mod config;
pub mod crypto;
pub mod dashboard;
pub mod dispatch;
pub mod health;
pub mod ids;
pub mod ingest;
pub mod limits;
pub mod metrics;
pub mod net;
pub mod operator;
pub mod outbox;
pub mod portal;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod tls;

/// What `herald --version` prints: the version, the commit it was built
/// from, and the newest schema version it knows on each store.
pub fn version_line() -> String {
    format!(
        "{} (commit {}; newest schema: SQLite {}, PostgreSQL {})",
        env!("CARGO_PKG_VERSION"),
        env!("HERALD_GIT_COMMIT"),
        store::sqlite::migrations::newest_version(),
        store::postgres::migrations::newest_version()
    )
}
