//! Herald: durable, signed, retried outbound webhooks in one binary.
//!
//! The map of this crate is in ARCHITECTURE.md at the repository root.

pub mod api;
pub mod audit;
pub mod bench;
pub mod bench_engine;
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
