//! The server store: PostgreSQL through a sqlx connection pool.
//!
//! The semantics are those of `sqlite/` (the conformance suite checks
//! both); what differs is how the work is shaped. There is no single
//! writer: many Herald processes may share one database, so each write is
//! its own transaction, and the claim takes its rows with
//! `FOR UPDATE SKIP LOCKED` so that concurrent claimers never wait on, nor
//! hand out, each other's rows. Batches travel as arrays (`= ANY($1)`,
//! `UNNEST`), so a claim, a completion or an ingest batch costs a fixed
//! number of statements whatever its size.
//!
//! Everything lives in one schema, chosen at open: it is created if
//! missing and set as the `search_path` of every pooled connection, so the
//! SQL (and the migrations) never name it.
//!
//! Processes sharing a schema wake each other with LISTEN/NOTIFY: every
//! write that can make work due notifies the schema's channel once, inside
//! its transaction (so only if it commits, and PostgreSQL folds repeats in
//! one transaction into one), and `listen_for_work` turns those into
//! wake-ups of this process's dispatcher. The outbox function
//! (`send_message`, migration 0002) notifies the same channel.
//!
//! This file holds what every part needs: opening (schema, pool,
//! migrations), error mapping, row helpers and paging. Each part of the
//! store has its file beside it, with its SQL: `settings.rs`, `apps.rs`,
//! `endpoints.rs`, `event_types.rs`, `queue.rs` (ingest, claim, complete,
//! release, and the listener), `replay.rs`, `history.rs`, `health.rs`,
//! `tokens.rs`, `audit.rs`, `retention.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Executor, Row};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::conditions::{Arg, Conditions, Dialect};
use super::*;

mod circuits;
mod counts;
use crate::store::apps::app_from_row;
use crate::store::audit::entry_from_row;
use crate::store::endpoints::{disabled_by, endpoint_from_row, status_from_row};
use crate::store::event_types::event_type_from_row;
use crate::store::finder::found_from_row;
use crate::store::health::stats_from_row;
use crate::store::history::{
    attempt_from_row, delivery_and_message_from_row, delivery_from_row, endpoint_messages_sql,
    message_from_row,
};
use crate::store::sessions::session_from_row;
use crate::store::tokens::token_from_row;
use circuits::circuit_of_pg_row;
mod apps;
mod audit;
pub mod backup;
pub mod copy;
mod endpoints;
mod event_types;
mod finder;
mod health;
mod history;
pub mod migrations;
mod queue;
mod replay;
mod retention;
mod secrets;
mod sessions;
mod settings;
mod tokens;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

const MAX_CONNECTIONS: u32 = 16;
// Short, so that while the database is down requests get their 503 quickly.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

pub struct PostgresStore {
    pool: PgPool,
    /// The schema's NOTIFY channel, as `herald_wake_channel()` names it.
    wake_channel: String,
    /// The schema's channel for token changes (see
    /// [`Tokens::announce_token_change`]): apart from the wake channel, so
    /// that the API's cache hears none of the work notifications and the
    /// dispatchers none of these.
    tokens_channel: String,
    /// Cancelled on close (or drop): stops the listener tasks, which hold
    /// a pooled connection each.
    closing: CancellationToken,
    /// Seals and opens the credential columns (see `store::secrets`).
    keys: Arc<crate::crypto::Keyring>,
}

/// Lets `?` classify a driver error (conflict, parent gone, unavailable)
/// where each statement would otherwise spell `.map_err(map_err)`.
impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        map_err(e)
    }
}

fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            StoreError::Unavailable(e.to_string())
        }
        sqlx::Error::Database(db) => {
            let code = db.code();
            match code.as_deref() {
                // unique_violation
                Some("23505") => StoreError::Conflict(db.message().to_owned()),
                // foreign_key_violation: the parent row was deleted meanwhile
                Some("23503") => StoreError::ParentGone(db.message().to_owned()),
                Some(c) if is_transient(c) => StoreError::Unavailable(e.to_string()),
                _ => StoreError::Internal(e.to_string()),
            }
        }
        _ => StoreError::Internal(e.to_string()),
    }
}

/// Whether a SQLSTATE says the database cannot serve now but may soon:
/// the API answers 503 (not 500), a start waits `HERALD_DATABASE_WAIT`, the
/// completer retries its batch within the lease (rather than dropping the
/// outcomes, which sends the deliveries again).
fn is_transient(code: &str) -> bool {
    // connection_exception (class 08); insufficient_resources (class 53:
    // too many clients, out of memory, disk full)
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code,
            // "database … is not currently accepting connections" (a
            // database closed to connections for maintenance)
            "55000"
            // lock_not_available, serialization_failure, deadlock_detected
            | "55P03" | "40001" | "40P01"
            // query_canceled (a statement timeout), admin_shutdown,
            // crash_shutdown, cannot_connect_now (starting up)
            | "57014" | "57P01" | "57P02" | "57P03"
        )
}

fn map_migrate_err(e: sqlx::migrate::MigrateError) -> StoreError {
    match e {
        sqlx::migrate::MigrateError::Execute(e) => map_err(e),
        other => StoreError::Internal(format!("migration failed: {other}")),
    }
}

/// `schema` as a double-quoted SQL identifier.
pub(crate) fn quote_ident(schema: &str) -> StoreResult<String> {
    if schema.is_empty() || schema.contains('\0') {
        return Err(StoreError::Internal(format!(
            "invalid PostgreSQL schema name {schema:?}"
        )));
    }
    Ok(format!("\"{}\"", schema.replace('"', "\"\"")))
}

impl PostgresStore {
    /// Connects to `url`, creates `schema` if missing, makes it every
    /// pooled connection's `search_path`, and applies the migrations (their
    /// bookkeeping table lives in that schema too).
    pub async fn open(url: &str, schema: &str) -> StoreResult<Self> {
        Self::open_with_keys(url, schema, Arc::new(crate::crypto::Keyring::plain())).await
    }

    /// [`PostgresStore::open`], sealing credentials with `keys`.
    pub async fn open_with_keys(
        url: &str,
        schema: &str,
        keys: Arc<crate::crypto::Keyring>,
    ) -> StoreResult<Self> {
        let ident = quote_ident(schema)?;
        let set_path = format!("SET search_path TO {ident}");
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(move |conn, _meta| {
                let sql = set_path.clone();
                Box::pin(async move {
                    conn.execute(AssertSqlSafe(sql)).await?;
                    Ok(())
                })
            })
            .connect(url)
            .await?;
        // Setting a search_path to a schema that does not exist yet is
        // allowed; it takes effect once the schema is there.
        let created = pool
            .execute(AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS {ident}"
            )))
            .await
            .map_err(map_err);
        match created {
            // Two processes creating it at once: the loser sees a unique
            // violation, and the schema exists all the same.
            Ok(_) | Err(StoreError::Conflict(_)) => {}
            Err(e) => return Err(e),
        }
        MIGRATOR.run(&pool).await.map_err(map_migrate_err)?;
        // Named in SQL (migration 0002), where the outbox function needs it
        // too, so both sides always agree.
        let wake_channel: String = sqlx::query_scalar("SELECT herald_wake_channel()")
            .fetch_one(&pool)
            .await?;
        // `herald_wake_…` with a prefix one byte shorter: within 63 bytes
        // whenever the wake channel is.
        let tokens_channel = wake_channel.replacen("herald_wake_", "herald_tok_", 1);
        Ok(PostgresStore {
            pool,
            wake_channel,
            tokens_channel,
            closing: CancellationToken::new(),
            keys,
        })
    }

    /// The NOTIFY channel on which writes to this schema wake the Herald
    /// processes sharing it: `herald_wake_<schema>`, or a hash of the
    /// schema name when that would be longer than 63 bytes.
    pub fn wake_channel(&self) -> &str {
        &self.wake_channel
    }

    /// Stops listening for work, then closes the pool: waits for
    /// checked-out connections to come back, then closes them all. Later
    /// calls fail with `Unavailable`.
    pub async fn close(&self) {
        self.closing.cancel();
        self.pool.close().await;
    }

    /// One statement on the pool; the rows it changed.
    async fn changed_rows(
        &self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> StoreResult<u64> {
        Ok(query.execute(&self.pool).await?.rows_affected())
    }

    /// Wakes the processes listening on this schema when `tx` commits.
    async fn notify_in(&self, tx: &mut sqlx::PgConnection) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(&self.wake_channel)
            .execute(tx)
            .await?;
        Ok(())
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        // A listener task holds its own handle on the pool: without this it
        // would keep a connection (and the pool) alive forever.
        self.closing.cancel();
    }
}

/// A filter as PostgreSQL runs it: the WHERE clause and its arguments as
/// text (the clause casts each to its type).
fn postgres_where(c: Conditions) -> (String, Vec<String>) {
    let args = c
        .args
        .into_iter()
        .map(|a| match a {
            Arg::Text(s) => s,
            Arg::Int(n) => n.to_string(),
            Arg::Flag(b) => b.to_string(),
        })
        .collect();
    (c.sql, args)
}

impl crate::store::rows::StoredRow for PgRow {
    fn text(&self, column: &str) -> StoreResult<Option<String>> {
        self.try_get(column).map_err(map_err)
    }

    /// Whole numbers are kept in several widths (int2, int4, int8).
    fn int(&self, column: &str) -> StoreResult<Option<i64>> {
        if let Ok(v) = self.try_get::<Option<i64>, _>(column) {
            return Ok(v);
        }
        if let Ok(v) = self.try_get::<Option<i32>, _>(column) {
            return Ok(v.map(i64::from));
        }
        self.try_get::<Option<i16>, _>(column)
            .map(|v| v.map(i64::from))
            .map_err(map_err)
    }

    fn flag(&self, column: &str) -> StoreResult<Option<bool>> {
        self.try_get(column).map_err(map_err)
    }
}

fn u32_of(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn i32_of(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn i64_of(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn get<'r, T>(r: &'r PgRow, col: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    r.try_get(col).map_err(map_err)
}

fn map_rows<T>(rows: &[PgRow], map: impl Fn(&PgRow) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(map).collect()
}

/// Runs `change`, a data-modifying statement ending in
/// `RETURNING <bool> AS wakes`, and in the same statement (so the same
/// transaction) notifies channel `$<channel>` once if any changed row says
/// it wakes. One row: `n`, the rows changed.
fn waking(change: &str, channel: usize) -> String {
    format!(
        "WITH changed AS ({change}), \
              woke AS (SELECT pg_notify(${channel}, '') \
                       FROM (SELECT 1 FROM changed WHERE wakes LIMIT 1) AS any_row) \
         SELECT (SELECT count(*) FROM changed) AS n, (SELECT count(*) FROM woke) AS woke"
    )
}

impl PostgresStore {
    /// A keyset page over `column` (ids sort by creation time). `sql` ends
    /// in an open WHERE clause whose parameters are `$1..$n`, bound from
    /// `args` in order.
    async fn page_of<T>(
        &self,
        sql: &str,
        column: &str,
        mut args: Vec<String>,
        page: &PageReq,
        map: impl Fn(&PgRow) -> StoreResult<T> + Send,
    ) -> StoreResult<Page<T>> {
        // Only constant SQL fragments are spliced in; every value is bound.
        let mut sql = sql.to_owned();
        let up = page.walks_ascending();
        if let Some(after) = &page.after {
            args.push(after.clone());
            sql.push_str(&format!(
                " AND {column} {} ${}",
                if up { ">" } else { "<" },
                args.len()
            ));
        }
        sql.push_str(&format!(
            " ORDER BY {column} {} LIMIT ${}",
            if up { "ASC" } else { "DESC" },
            args.len() + 1
        ));
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for a in args {
            query = query.bind(a);
        }
        let rows = query
            .bind(i64_of(page.limit.saturating_add(1)))
            .fetch_all(&self.pool)
            .await?;
        let mut items = map_rows(&rows, map)?;
        let has_more = items.len() > page.limit;
        items.truncate(page.limit);
        if page.backwards {
            items.reverse();
        }
        Ok(Page { items, has_more })
    }
}

#[cfg(test)]
mod tests {
    use super::is_transient;

    /// A database that refuses for now is "unavailable" (503, waited for,
    /// retried); a fault of the request or the schema is not. A database
    /// closed to connections (55000) and too many clients (53300) were
    /// internal errors: 500s, a start that did not wait, outcomes dropped.
    #[test]
    fn transient_sqlstates_are_unavailable_and_faults_are_not() {
        for code in [
            "08006", "08001", "53300", "53200", "53100", "55000", "55P03", "40001", "40P01",
            "57014", "57P01", "57P02", "57P03",
        ] {
            assert!(is_transient(code), "{code}");
        }
        for code in [
            "23505", "23503", "42P01", "42703", "22P02", "XX000", "55006",
        ] {
            assert!(!is_transient(code), "{code}");
        }
    }
}
