//! The store seam: everything the engine and the API need from durable
//! storage. [`Store`] is the sum of one trait per concern, each in its own
//! file with the models that belong to it: `settings`, `apps`,
//! `endpoints`, `event_types`, `queue` (ingest → claim → complete),
//! `replay`, `history`, `health`, `tokens`, `audit`, `retention` and
//! `secrets` (credentials sealed at rest). This file keeps
//! what they all share (times, errors, pages, delivery states). Each
//! backend, `sqlite/` and `postgres/`, implements every part in the same
//! files, each with its SQL beside it (the schemas: `migrations/sqlite/`,
//! `migrations/postgres/`); the conformance suite in
//! `tests/it/store_conformance.rs` runs the same tests against each.
//!
//! The engine holds an `Arc<dyn Store>`, on which every part's methods can
//! be called as they are; on a concrete store (`SqliteStore`,
//! `PostgresStore`) bring the parts in scope: `use crate::store::prelude::*;`.
//!
//! Times are Unix milliseconds (`Millis`), passed in by the caller, so the
//! store never reads a clock and tests can move time freely.

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use herald_policy::DeadReason;

use crate::ids::{AppId, AttemptId, DeliveryId, EndpointId, MsgId};

mod apps;
mod audit;
mod circuits;
mod conditions;
pub mod copy;
mod endpoints;
mod event_types;
mod finder;
mod health;
mod history;
mod migrations;
pub mod postgres;
mod queue;
mod replay;
mod retention;
pub mod rows;
pub mod secrets;
mod sessions;
mod settings;
pub mod sqlite;
mod tokens;

pub use apps::{App, Apps};
pub use audit::{ActorKind, Audit, AuditEntry, AuditFilter};
pub use circuits::{
    circuit_from_columns, fold_seen, step_circuits, BreakerRule, Circuit, CircuitChange,
    CircuitState, Circuits, EndpointCircuit, Seen, Transition, WindowCounts, CIRCUIT_COLUMNS,
};
pub use endpoints::{
    headers_of, rotated_old_secrets, rotated_secret_columns, throttled_rate, valid_old_secrets,
    EnableReport, Endpoint, EndpointChanges, EndpointChangesJson, EndpointOrdering, EndpointStatus,
    Endpoints, OldSecret, MAX_OLD_SECRETS,
};
pub use event_types::{EventType, EventTypes};
pub use finder::{FindFilter, Finder, FoundMessage};
pub use health::{
    buckets_by_endpoint, DeliveryCounts, EndpointOverview, Health, QueueStats, StatsBucket,
    DUE_COUNT_CAP,
};
pub use history::{
    AttemptFilter, Delivery, EndpointMessageFilter, History, MessageFilter, SvixStatus,
};
pub use migrations::{newer_schema, Migration, MigrationStatus};
pub use queue::{
    claim_window, fan_out, fold_endpoint_batches, fold_stats, may_hand_off, retry_share, saturated,
    storable, storable_batch, throttle_step_us, AttemptRecord, ClaimRequest, ClaimedDelivery,
    Completed, Completion, EndpointBatch, FanoutTarget, IngestClaim, InsertOutcome, Message,
    NewDelivery, NewMessage, NextState, Queue, Room, SendTo, StreakUpdate, Subscriber,
    ThrottleSlots, ThrottleWaiting, THROTTLE_DRIFT_US, THROTTLE_HORIZON_MS,
};
pub use replay::{wanted_by, DeadFilter, MissingBatch, Replay, ResendOutcome, REPLAY_BATCH};
pub use retention::{PruneReport, Retention};
pub use secrets::{
    open_column, open_endpoint_credentials, open_or_fail, seal_column, ResealScope, SealedSample,
    SecretColumn, SecretRow, Secrets, RESEAL_BATCH,
};
pub use sessions::{Session, SessionKind, Sessions};
pub use settings::Settings;
pub use tokens::{idem_verdict, unscoped_verdict, ApiToken, IdemBegin, IdemKey, Tokens};

/// The store's traits, for callers that call its methods on a concrete
/// store: `use crate::store::prelude::*;`.
pub mod prelude {
    pub use super::{
        Apps, Audit, Circuits, Endpoints, EventTypes, Finder, Health, History, Queue, Replay,
        Retention, Secrets, Sessions, Settings, Store, Tokens,
    };
}

pub type Millis = i64;

pub fn now_millis() -> Millis {
    chrono::Utc::now().timestamp_millis()
}

/// Svix's time format: RFC 3339 in UTC with milliseconds (`…T12:00:00.000Z`).
pub fn rfc3339(ms: Millis) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[derive(Debug, thiserror::Error, Clone)]
pub enum StoreError {
    /// A uniqueness rule was broken (a `uid` already taken, …).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The row's parent (its application, its endpoint) does not exist any
    /// more: deleted while the request that writes the row was handled.
    #[error("parent gone: {0}")]
    ParentGone(String),
    /// The database cannot be reached or is busy; the caller may retry.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Anything else: a bug or corruption. Never shown to API clients.
    #[error("store error: {0}")]
    Internal(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Delivery states as stored. `Pending` and `Delivering` are "live": they
/// sit in the claim index; the other two have left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    Pending = 0,
    Delivering = 1,
    Delivered = 2,
    Dead = 3,
}

impl DeliveryState {
    pub fn from_i64(v: i64) -> Option<Self> {
        Some(match v {
            0 => DeliveryState::Pending,
            1 => DeliveryState::Delivering,
            2 => DeliveryState::Delivered,
            3 => DeliveryState::Dead,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivering => "delivering",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }
}

/// A page request over a list sorted by id (ids sort by creation time).
#[derive(Debug, Clone, Default)]
pub struct PageReq {
    pub limit: usize,
    /// Return items strictly after this id in the chosen order (or, when
    /// `backwards`, strictly before it).
    pub after: Option<String>,
    pub ascending: bool,
    /// The page that ends just before `after` (a `prevIterator`), still
    /// in the chosen order.
    pub backwards: bool,
}

impl PageReq {
    /// The direction the store walks its index in.
    pub fn walks_ascending(&self) -> bool {
        self.ascending != self.backwards
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub has_more: bool,
}

/// A value kept as JSON text.
pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Internal(e.to_string()))
}

/// A value the store keeps as JSON text.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Internal(format!("bad JSON in store: {e}")))
}

/// Everything the engine and the API need from durable storage: the sum of
/// one trait per concern (see the table in docs/design/store.md), implemented
/// for every type that implements all of them. The engine holds an
/// `Arc<dyn Store>` and calls the parts' methods on it directly; on a
/// concrete store, bring the parts in scope with [`prelude`].
pub trait Store: StoreParts + Send + Sync + 'static {}

impl<T> Store for T where T: StoreParts + Send + Sync + 'static {}

/// The parts a [`Store`] is the sum of, listed once.
macro_rules! store_parts {
    ($($part:ident),+) => {
        /// Every part of a store at once (see [`Store`]).
        pub trait StoreParts: $($part +)+ {}
        impl<T> StoreParts for T where T: $($part +)+ {}
    };
}

store_parts!(
    Settings, Apps, Endpoints, EventTypes, Queue, Replay, History, Finder, Health, Tokens, Audit,
    Retention, Secrets, Sessions, Circuits
);
