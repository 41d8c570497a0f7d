//! The server store: PostgreSQL through a sqlx connection pool.
//!
//! The semantics are those of `sqlite.rs` (the conformance suite checks
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use async_trait::async_trait;
use herald_policy::DeadReason;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Executor, Row};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::*;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

const MAX_CONNECTIONS: u32 = 16;
// Short, so that while the database is down requests get their 503 quickly.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// Between attempts to listen again after the listener's connection failed.
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(100);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(5);

pub struct PostgresStore {
    pool: PgPool,
    /// The schema's NOTIFY channel, as `herald_wake_channel()` names it.
    wake_channel: String,
    /// Cancelled on close (or drop): stops the listener tasks, which hold
    /// a pooled connection each.
    closing: CancellationToken,
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
                // connection_exception (class 08), admin_shutdown,
                // crash_shutdown, cannot_connect_now
                Some(c) if c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03") => {
                    StoreError::Unavailable(e.to_string())
                }
                _ => StoreError::Internal(e.to_string()),
            }
        }
        _ => StoreError::Internal(e.to_string()),
    }
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
            .await
            .map_err(map_err)?;
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
        let wake_channel = sqlx::query_scalar("SELECT herald_wake_channel()")
            .fetch_one(&pool)
            .await
            .map_err(map_err)?;
        Ok(PostgresStore {
            pool,
            wake_channel,
            closing: CancellationToken::new(),
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

    /// Wakes the processes listening on this schema when `tx` commits.
    async fn notify_in(&self, tx: &mut sqlx::PgConnection) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(&self.wake_channel)
            .execute(tx)
            .await
            .map_err(map_err)?;
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

/// A listener on `channel`, LISTENing once this returns.
async fn start_listener(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

/// Turns every notification on `channel` into a wake-up, until `closing`.
/// A lost connection is listened on again (with a growing pause while that
/// fails), followed by one wake-up for whatever was notified meanwhile.
async fn listen_loop(
    first: PgListener,
    pool: PgPool,
    channel: String,
    wake: std::sync::Arc<Notify>,
    closing: CancellationToken,
) {
    let mut listener = Some(first);
    let mut retry = LISTEN_RETRY_MIN;
    loop {
        let current = match listener.as_mut() {
            Some(l) => l,
            None => {
                tokio::select! {
                    _ = closing.cancelled() => return,
                    _ = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(LISTEN_RETRY_MAX);
                match start_listener(&pool, &channel).await {
                    Ok(l) => {
                        tracing::info!(channel = %channel, "listening for work again");
                        retry = LISTEN_RETRY_MIN;
                        wake.notify_one();
                        listener.insert(l)
                    }
                    Err(e) => {
                        if closing.is_cancelled() || pool.is_closed() {
                            return;
                        }
                        tracing::warn!(error = %e, channel = %channel, "cannot listen for work; will retry");
                        continue;
                    }
                }
            }
        };
        let received = tokio::select! {
            _ = closing.cancelled() => return,
            r = current.try_recv() => r,
        };
        match received {
            Ok(Some(_)) => wake.notify_one(),
            // The connection was lost and the listener has LISTENed again
            // on a new one; notifications in between are gone.
            Ok(None) => {
                tracing::warn!(channel = %channel, "lost the connection listening for work; reconnected");
                wake.notify_one();
            }
            Err(e) => {
                if closing.is_cancelled() || pool.is_closed() {
                    return;
                }
                tracing::warn!(error = %e, channel = %channel, "lost the connection listening for work; will reconnect");
                // Dropped, and started afresh above.
                listener = None;
            }
        }
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Internal(e.to_string()))
}

fn u16_opt(v: Option<i32>) -> Option<u16> {
    v.and_then(|n| u16::try_from(n).ok())
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

const APP_COLUMNS: &str =
    "id, uid, name, rate_limit, metadata::text AS metadata, created_at, updated_at";

fn app_from_row(r: &PgRow) -> StoreResult<App> {
    Ok(App {
        id: AppId::from_trusted(get(r, "id")?),
        uid: get(r, "uid")?,
        name: get(r, "name")?,
        rate_limit: u16_opt(get(r, "rate_limit")?),
        metadata: from_json::<BTreeMap<String, String>>(&get::<String>(r, "metadata")?)?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
    })
}

const ENDPOINT_COLUMNS: &str =
    "id, app_id, uid, url, description, filter_types::text AS filter_types, disabled, rate_limit, \
     metadata::text AS metadata, secret, created_at, updated_at, channels, headers";

fn endpoint_from_row(r: &PgRow) -> StoreResult<Endpoint> {
    let filter: Option<String> = get(r, "filter_types")?;
    Ok(Endpoint {
        id: EndpointId::from_trusted(get(r, "id")?),
        app_id: AppId::from_trusted(get(r, "app_id")?),
        uid: get(r, "uid")?,
        url: get(r, "url")?,
        description: get(r, "description")?,
        filter_types: filter.as_deref().map(from_json).transpose()?,
        disabled: get(r, "disabled")?,
        rate_limit: u16_opt(get(r, "rate_limit")?),
        metadata: from_json(&get::<String>(r, "metadata")?)?,
        channels: get::<Option<String>>(r, "channels")?
            .as_deref()
            .map(from_json)
            .transpose()?,
        headers: from_json(&get::<String>(r, "headers")?)?,
        secret: get(r, "secret")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
    })
}

const MESSAGE_COLUMNS: &str = "id, app_id, event_type, event_id, payload, created_at, channels";

fn message_from_row(r: &PgRow) -> StoreResult<Message> {
    Ok(Message {
        id: MsgId::from_trusted(get(r, "id")?),
        app_id: AppId::from_trusted(get(r, "app_id")?),
        event_type: get(r, "event_type")?,
        event_id: get(r, "event_id")?,
        payload: get(r, "payload")?,
        channels: get::<Option<String>>(r, "channels")?
            .as_deref()
            .map(from_json)
            .transpose()?,
        created_at: get(r, "created_at")?,
    })
}

const DELIVERY_COLUMNS: &str =
    "d.id, d.msg_id, d.app_id, d.endpoint_id, m.event_type, d.state, d.attempts, \
     d.next_attempt_at, d.dead_reason, d.last_status, d.last_error, d.created_at, d.updated_at";

fn delivery_from_row(r: &PgRow) -> StoreResult<Delivery> {
    let state: i16 = get(r, "state")?;
    let reason: Option<String> = get(r, "dead_reason")?;
    Ok(Delivery {
        id: DeliveryId::from_trusted(get(r, "id")?),
        msg_id: MsgId::from_trusted(get(r, "msg_id")?),
        app_id: AppId::from_trusted(get(r, "app_id")?),
        endpoint_id: EndpointId::from_trusted(get(r, "endpoint_id")?),
        event_type: get(r, "event_type")?,
        state: DeliveryState::from_i64(i64::from(state))
            .ok_or_else(|| StoreError::Internal(format!("bad state {state}")))?,
        attempts: u32_of(get(r, "attempts")?),
        next_attempt_at: get(r, "next_attempt_at")?,
        dead_reason: reason.as_deref().and_then(DeadReason::parse),
        last_status: u16_opt(get(r, "last_status")?),
        last_error: get(r, "last_error")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
    })
}

const ATTEMPT_COLUMNS: &str =
    "id, delivery_id, msg_id, endpoint_id, app_id, url, attempt_number, started_at, duration_ms, \
     status_code, response, error, success, manual";

fn attempt_from_row(r: &PgRow) -> StoreResult<AttemptRecord> {
    Ok(AttemptRecord {
        id: AttemptId::from_trusted(get(r, "id")?),
        delivery_id: DeliveryId::from_trusted(get(r, "delivery_id")?),
        msg_id: MsgId::from_trusted(get(r, "msg_id")?),
        endpoint_id: EndpointId::from_trusted(get(r, "endpoint_id")?),
        app_id: AppId::from_trusted(get(r, "app_id")?),
        url: get(r, "url")?,
        attempt_number: u32_of(get(r, "attempt_number")?),
        started_at: get(r, "started_at")?,
        duration_ms: get(r, "duration_ms")?,
        status_code: u16_opt(get(r, "status_code")?),
        response: get(r, "response")?,
        error: get(r, "error")?,
        success: get(r, "success")?,
        manual: get(r, "manual")?,
    })
}

fn map_rows<T>(rows: &[PgRow], map: fn(&PgRow) -> StoreResult<T>) -> StoreResult<Vec<T>> {
    rows.iter().map(map).collect()
}

/// `state`, `next_attempt_at` and `dead_reason` of a finished attempt.
fn next_state(c: &Completion) -> (DeliveryState, Millis, Option<&'static str>) {
    match c.next {
        NextState::Delivered => (DeliveryState::Delivered, c.now, None),
        NextState::Retry { at } => (DeliveryState::Pending, at, None),
        NextState::Dead(r) => (DeliveryState::Dead, c.now, Some(r.as_str())),
    }
}

/// A fresh retry cycle, due now (`$1`), asked for by an operator.
const REPLAY_SET: &str =
    "state = 0, next_attempt_at = $1, cycle_started_at = $1, cycle_base = attempts, \
     manual = TRUE, lease_token = NULL, dead_reason = NULL, updated_at = $1";

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

const STATUS_COLUMNS: &str =
    "fail_streak, streak_started_at, last_success_at, last_error, last_error_at, disabled, \
     disabled_reason, disabled_at, disabled_by";
const STATUS_COLUMNS_E: &str =
    "e.fail_streak, e.streak_started_at, e.last_success_at, e.last_error, e.last_error_at, \
     e.disabled_reason, e.disabled_at, e.disabled_by";
const ENDPOINT_COLUMNS_E: &str =
    "e.id, e.app_id, e.uid, e.url, e.description, e.filter_types::text AS filter_types, e.disabled, \
     e.rate_limit, e.metadata::text AS metadata, e.secret, e.created_at, e.updated_at, e.channels, e.headers";

fn event_type_from_row(r: &PgRow) -> StoreResult<EventType> {
    Ok(EventType {
        name: get(r, "name")?,
        description: get(r, "description")?,
        archived: get(r, "archived")?,
        deprecated: get(r, "deprecated")?,
        schemas: get(r, "schemas")?,
        feature_flag: get(r, "feature_flag")?,
        group_name: get(r, "group_name")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
    })
}

fn token_from_row(r: &PgRow) -> StoreResult<ApiToken> {
    Ok(ApiToken {
        id: get(r, "id")?,
        app_id: AppId::from_trusted(get(r, "app_id")?),
        name: get(r, "name")?,
        created_at: get(r, "created_at")?,
    })
}

fn status_from_row(r: &PgRow) -> StoreResult<EndpointStatus> {
    let by: Option<String> = get(r, "disabled_by")?;
    Ok(EndpointStatus {
        fail_streak: u32_of(get(r, "fail_streak")?),
        streak_started_at: get(r, "streak_started_at")?,
        last_success_at: get(r, "last_success_at")?,
        last_error: get(r, "last_error")?,
        last_error_at: get(r, "last_error_at")?,
        disabled: get(r, "disabled")?,
        disabled_reason: get(r, "disabled_reason")?,
        disabled_at: get(r, "disabled_at")?,
        auto_disabled: by.as_deref() == Some("auto"),
    })
}

fn stats_from_row(r: &PgRow) -> StoreResult<StatsBucket> {
    let n = |col: &str| -> StoreResult<u64> { Ok(u64::try_from(get::<i64>(r, col)?).unwrap_or(0)) };
    let mut histogram = [0u64; crate::health::HISTOGRAM_LEN];
    for (i, h) in histogram.iter_mut().enumerate() {
        *h = n(&format!("h{i}"))?;
    }
    Ok(StatsBucket {
        bucket: get(r, "bucket")?,
        attempts: n("attempts")?,
        successes: n("successes")?,
        failures: n("failures")?,
        latency_sum_ms: n("latency_sum")?,
        histogram,
    })
}

/// The dead-letter filter as SQL over `deliveries d JOIN messages m`, its
/// parameters numbered from `$first`, with their values (all text; the
/// times are cast).
fn dead_filter_sql(filter: &DeadFilter, first: usize) -> (String, Vec<String>) {
    let mut sql = String::from("d.state = 3");
    let mut args: Vec<String> = Vec::new();
    let mut add = |sql: &mut String, fragment: &str, value: String| {
        args.push(value);
        sql.push_str(&fragment.replace('#', &format!("${}", first + args.len() - 1)));
    };
    if let Some(app) = &filter.app {
        add(&mut sql, " AND d.app_id = #", app.as_str().to_owned());
    }
    if let Some(ep) = &filter.endpoint {
        add(&mut sql, " AND d.endpoint_id = #", ep.as_str().to_owned());
    }
    if let Some(t) = &filter.event_type {
        add(&mut sql, " AND m.event_type = #", t.clone());
    }
    if let Some(r) = filter.reason {
        add(&mut sql, " AND d.dead_reason = #", r.as_str().to_owned());
    }
    if let Some(since) = filter.since {
        add(&mut sql, " AND d.updated_at >= #::int8", since.to_string());
    }
    if let Some(until) = filter.until {
        add(&mut sql, " AND d.updated_at < #::int8", until.to_string());
    }
    if let Some(since) = filter.created_since {
        add(&mut sql, " AND d.created_at >= #::int8", since.to_string());
    }
    if let Some(until) = filter.created_until {
        add(&mut sql, " AND d.created_at < #::int8", until.to_string());
    }
    (sql, args)
}

/// Lets an enabled endpoint's held deliveries back into the claim index,
/// in `tx`, after the endpoint's row was locked or updated there.
async fn unhold(tx: &mut sqlx::PgConnection, ep: &EndpointId) -> StoreResult<()> {
    sqlx::query("UPDATE deliveries SET held = FALSE WHERE endpoint_id = $1 AND held")
        .bind(ep.as_str())
        .execute(tx)
        .await
        .map_err(map_err)?;
    Ok(())
}

impl PostgresStore {
    /// Stores `batch` with its deliveries; claims some of them when
    /// `claim` is given (see [`Queue::insert_messages_claiming`]).
    async fn ingest(
        &self,
        batch: &[NewMessage],
        mut claim: Option<IngestClaim>,
    ) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
        if batch.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        // Two round trips, no explicit transaction: under load the API
        // waits on this path, and each BEGIN/COMMIT or extra statement is
        // another wait for a database server that shares the machine.
        // First the subscribers of every app in the batch, read without
        // locks; routing is decided on them here.
        let mut apps: Vec<&str> = batch.iter().map(|m| m.app_id.as_str()).collect();
        apps.sort_unstable();
        apps.dedup();
        let rows = sqlx::query(
            "SELECT id, app_id, filter_types::text AS filter_types, channels, disabled, url, secret, \
                    old_secrets, headers FROM endpoints \
             WHERE app_id = ANY($1) AND (NOT disabled OR disabled_by = 'auto')",
        )
        .bind(&apps)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        let mut endpoints_of: HashMap<String, Vec<FanoutTarget>> = HashMap::new();
        for r in &rows {
            let target = FanoutTarget::from_row(
                get(r, "id")?,
                get::<Option<String>>(r, "filter_types")?.as_deref(),
                get::<Option<String>>(r, "channels")?.as_deref(),
                !get::<bool>(r, "disabled")?,
                claim.as_ref(),
                |now| {
                    SendTo::from_columns(
                        get(r, "url")?,
                        get(r, "secret")?,
                        &get::<String>(r, "old_secrets")?,
                        &get::<String>(r, "headers")?,
                        now,
                    )
                },
            )?;
            endpoints_of
                .entry(get(r, "app_id")?)
                .or_default()
                .push(target);
        }
        let (mut d_id, mut d_msg, mut d_ep, mut d_app, mut d_at) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Claimed at ingest: born `delivering` under the lease; the store
        // returns them only if their message and endpoint made it in.
        let (mut d_state, mut d_due, mut d_token) = (Vec::new(), Vec::new(), Vec::new());
        let mut claimed: HashMap<String, ClaimedDelivery> = HashMap::new();
        // A message id repeated in the batch is stored once: so are its
        // deliveries.
        let mut seen: HashSet<&str> = HashSet::new();
        for m in batch {
            if !seen.insert(m.id.as_str()) {
                continue;
            }
            for d in fan_out(&endpoints_of, m, &mut claim) {
                d_state.push(d.state as i16);
                d_due.push(d.due);
                d_token.push(d.lease_token().map(str::to_owned));
                d_ep.push(d.endpoint_id);
                d_msg.push(m.id.as_str());
                d_app.push(m.app_id.as_str());
                d_at.push(m.created_at);
                if let Some(c) = d.claimed {
                    claimed.insert(d.id.as_str().to_owned(), c);
                }
                d_id.push(d.id.into_string());
            }
        }
        let mut subscribers: Vec<&str> = d_ep.clone();
        subscribers.sort_unstable();
        subscribers.dedup();

        // Then everything else in one statement (one implicit transaction).
        // KEY SHARE on the apps and endpoints keeps them from being deleted
        // under the new rows. An endpoint is locked only once its app is
        // (`e` reads `a`), the order in which deleting an app takes them,
        // so the two cannot deadlock. One deleted in between is simply not
        // locked, so its messages are refused alone (NoSuchApp) or its
        // deliveries left out, never failing the batch on a foreign key.
        // Messages go in in batch order, so that of two with the same
        // eventId the first is kept, as one at a time would. Workers are
        // woken when deliveries were made. Routing read the endpoints
        // without locks: one disabled since is judged again here, on the
        // row as locked, by the rule routing applies (disabled by a person:
        // no delivery; by Herald: held, so never born delivering).
        let rows = sqlx::query(
            "WITH a AS MATERIALIZED ( \
                 SELECT id FROM applications WHERE id = ANY($8::text[]) ORDER BY id FOR KEY SHARE), \
             e AS MATERIALIZED ( \
                 SELECT id, disabled, disabled_by FROM endpoints \
                 WHERE id = ANY($9::text[]) AND app_id IN (SELECT id FROM a) \
                 ORDER BY id FOR KEY SHARE), \
             m AS ( \
                 INSERT INTO messages (id, app_id, event_type, event_id, payload, created_at, channels) \
                 SELECT id, app_id, event_type, event_id, payload, created_at, channels \
                 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::text[]) \
                      WITH ORDINALITY AS u(id, app_id, event_type, event_id, payload, created_at, channels, ord) \
                 WHERE u.app_id IN (SELECT id FROM a) \
                 ORDER BY ord \
                 ON CONFLICT DO NOTHING \
                 RETURNING id), \
             d AS ( \
                 INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
                                         lease_token, cycle_started_at, created_at, updated_at) \
                 SELECT v.id, v.msg_id, v.endpoint_id, v.app_id, \
                        CASE WHEN e.disabled THEN 0 ELSE v.state END, \
                        CASE WHEN e.disabled THEN v.at ELSE v.due END, \
                        CASE WHEN e.disabled THEN NULL ELSE v.token END, v.at, v.at, v.at \
                 FROM UNNEST($10::text[], $11::text[], $12::text[], $13::text[], $14::int8[], \
                             $16::int2[], $17::int8[], $18::text[]) \
                      AS v(id, msg_id, endpoint_id, app_id, at, state, due, token) \
                      JOIN e ON e.id = v.endpoint_id \
                 WHERE v.msg_id IN (SELECT id FROM m) \
                   AND (NOT e.disabled OR e.disabled_by = 'auto') \
                 RETURNING id, msg_id, state) \
             SELECT 'a' AS kind, id, NULL AS delivery FROM a \
             UNION ALL SELECT 'm', id, NULL FROM m \
             UNION ALL SELECT 'd', msg_id, CASE WHEN state = 1 THEN id END FROM d \
             UNION ALL SELECT 'n', NULL, NULL FROM ( \
                 SELECT pg_notify($15, '') FROM (SELECT 1 FROM d WHERE state = 0 LIMIT 1) one) woken",
        )
        .bind(batch.iter().map(|m| m.id.as_str()).collect::<Vec<_>>())
        .bind(batch.iter().map(|m| m.app_id.as_str()).collect::<Vec<_>>())
        .bind(
            batch
                .iter()
                .map(|m| m.event_type.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            batch
                .iter()
                .map(|m| m.event_id.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(batch.iter().map(|m| m.payload.as_str()).collect::<Vec<_>>())
        .bind(batch.iter().map(|m| m.created_at).collect::<Vec<_>>())
        .bind(
            batch
                .iter()
                .map(|m| m.channels.as_ref().map(to_json).transpose())
                .collect::<StoreResult<Vec<_>>>()?,
        )
        .bind(&apps)
        .bind(&subscribers)
        .bind(&d_id)
        .bind(&d_msg)
        .bind(&d_ep)
        .bind(&d_app)
        .bind(&d_at)
        .bind(&self.wake_channel)
        .bind(&d_state)
        .bind(&d_due)
        .bind(&d_token)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        let (mut existing, mut stored) = (HashSet::new(), HashSet::new());
        let mut taken = Vec::new();
        let mut fanned: HashMap<String, usize> = HashMap::new();
        for r in &rows {
            let kind: String = get(r, "kind")?;
            let id: Option<String> = get(r, "id")?;
            match (kind.as_str(), id) {
                ("a", Some(id)) => {
                    existing.insert(id);
                }
                ("m", Some(id)) => {
                    stored.insert(id);
                }
                ("d", Some(id)) => {
                    *fanned.entry(id).or_default() += 1;
                    if let Some(d) = get::<Option<String>>(r, "delivery")?
                        .and_then(|delivery| claimed.remove(&delivery))
                    {
                        taken.push(d);
                    }
                }
                _ => {}
            }
        }
        let outcomes = batch
            .iter()
            .map(|m| {
                if !existing.contains(m.app_id.as_str()) {
                    InsertOutcome::NoSuchApp
                } else if !stored.remove(m.id.as_str()) {
                    // `remove`: a repeated message id counts as stored once.
                    InsertOutcome::DuplicateEventId
                } else {
                    InsertOutcome::Inserted {
                        deliveries: fanned.get(m.id.as_str()).copied().unwrap_or(0),
                    }
                }
            })
            .collect();
        Ok((outcomes, taken))
    }

    /// A keyset page over `column` (ids sort by creation time). `sql` ends
    /// in an open WHERE clause whose parameters are `$1..$n`, bound from
    /// `args` in order.
    async fn page_of<T>(
        &self,
        sql: &str,
        column: &str,
        mut args: Vec<String>,
        page: &PageReq,
        map: fn(&PgRow) -> StoreResult<T>,
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
            .await
            .map_err(map_err)?;
        let mut items = map_rows(&rows, map)?;
        let has_more = items.len() > page.limit;
        items.truncate(page.limit);
        if page.backwards {
            items.reverse();
        }
        Ok(Page { items, has_more })
    }
}

#[async_trait]
impl Settings for PostgresStore {
    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        sqlx::query_scalar("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_err)
    }

    async fn init_setting(&self, key: &str, value: &str) -> StoreResult<String> {
        let inserted: Option<String> = sqlx::query_scalar(
            "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING RETURNING value",
        )
        .bind(key)
        .bind(value)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        if let Some(v) = inserted {
            return Ok(v);
        }
        // The conflicting row is committed (ON CONFLICT waits for it), and
        // this statement's fresh snapshot sees it.
        sqlx::query_scalar("SELECT value FROM settings WHERE key = $1")
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }
}

#[async_trait]
impl Apps for PostgresStore {
    async fn create_app(&self, app: &App) -> StoreResult<()> {
        let metadata = to_json(&app.metadata)?;
        sqlx::query(
            "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)",
        )
        .bind(app.id.as_str())
        .bind(app.uid.as_deref())
        .bind(&app.name)
        .bind(app.rate_limit.map(i32::from))
        .bind(metadata)
        .bind(app.created_at)
        .bind(app.updated_at)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn update_app(&self, app: &App) -> StoreResult<bool> {
        let metadata = to_json(&app.metadata)?;
        let done = sqlx::query(
            "UPDATE applications SET uid = $1, name = $2, rate_limit = $3, metadata = $4::jsonb, updated_at = $5 \
             WHERE id = $6",
        )
        .bind(app.uid.as_deref())
        .bind(&app.name)
        .bind(app.rate_limit.map(i32::from))
        .bind(metadata)
        .bind(app.updated_at)
        .bind(app.id.as_str())
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_app(&self, id: &AppId) -> StoreResult<bool> {
        // Locks in the order every other transaction takes them (see
        // ARCHITECTURE.md, "Lock order"): the application, its endpoints
        // in id order, its messages, then (by cascade) the deliveries, and
        // last the attempts and stats buckets. Deleting the stats before the
        // endpoints, as this once did, closed a cycle with a completer that
        // held an endpoint and was adding to its bucket.
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        // The application's row lock makes a concurrent ingest (which takes
        // KEY SHARE on it) wait and then find it gone, and lets one that
        // committed before show its messages to the statements below.
        let found = sqlx::query("SELECT 1 FROM applications WHERE id = $1 FOR UPDATE")
            .bind(id.as_str())
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
        if found.is_none() {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        }
        // Waits for the completers holding them: their stats and attempts
        // are then written, and no new one can start on these endpoints.
        let endpoints: Vec<String> =
            sqlx::query_scalar("SELECT id FROM endpoints WHERE app_id = $1 ORDER BY id FOR UPDATE")
                .bind(id.as_str())
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
        // Before the deliveries go: retention locks a message, then its
        // deliveries.
        sqlx::query(
            "SELECT count(*) FROM (SELECT 1 FROM messages WHERE app_id = $1 FOR UPDATE) AS locked",
        )
        .bind(id.as_str())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        // Endpoints, their deliveries and tokens cascade.
        sqlx::query("DELETE FROM applications WHERE id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        // Attempts are history without a foreign key, found through the
        // messages (indexed), which carry none either (migration 0008).
        sqlx::query(
            "DELETE FROM attempts WHERE msg_id IN (SELECT id FROM messages WHERE app_id = $1)",
        )
        .bind(id.as_str())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        sqlx::query("DELETE FROM endpoint_stats WHERE endpoint_id = ANY($1)")
            .bind(&endpoints)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        sqlx::query("DELETE FROM messages WHERE app_id = $1")
            .bind(id.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Option<App>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {APP_COLUMNS} FROM applications WHERE id = $1 OR uid = $1 \
             ORDER BY id = $1 DESC LIMIT 1"
        )))
        .bind(id_or_uid)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(app_from_row).transpose()
    }

    async fn list_apps(&self, page: &PageReq) -> StoreResult<Page<App>> {
        self.page_of(
            &format!("SELECT {APP_COLUMNS} FROM applications WHERE TRUE"),
            "id",
            vec![],
            page,
            app_from_row,
        )
        .await
    }
}

#[async_trait]
impl Endpoints for PostgresStore {
    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let filter = ep.filter_types.as_ref().map(to_json).transpose()?;
        let metadata = to_json(&ep.metadata)?;
        sqlx::query(
            "INSERT INTO endpoints (id, app_id, uid, url, description, filter_types, disabled, rate_limit, \
             metadata, secret, created_at, updated_at, channels, headers) \
             VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9::jsonb, $10, $11, $12, $13, $14)",
        )
        .bind(ep.id.as_str())
        .bind(ep.app_id.as_str())
        .bind(ep.uid.as_deref())
        .bind(&ep.url)
        .bind(&ep.description)
        .bind(filter)
        .bind(ep.disabled)
        .bind(ep.rate_limit.map(i32::from))
        .bind(metadata)
        .bind(&ep.secret)
        .bind(ep.created_at)
        .bind(ep.updated_at)
        .bind(ep.channels.as_ref().map(to_json).transpose()?)
        .bind(to_json(&ep.headers)?)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn get_endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE app_id = $1 AND (id = $2 OR uid = $2) \
             ORDER BY id = $2 DESC LIMIT 1"
        )))
        .bind(app.as_str())
        .bind(id_or_uid)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(endpoint_from_row).transpose()
    }

    async fn list_endpoints(&self, app: &AppId, page: &PageReq) -> StoreResult<Page<Endpoint>> {
        self.page_of(
            &format!("SELECT {ENDPOINT_COLUMNS} FROM endpoints WHERE app_id = $1"),
            "id",
            vec![app.as_str().to_owned()],
            page,
            endpoint_from_row,
        )
        .await
    }

    async fn update_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        changes: &EndpointChanges,
        now: Millis,
    ) -> StoreResult<bool> {
        let EndpointChangesJson {
            filter_types: filter,
            metadata,
            channels,
        } = changes.json_columns()?;
        // Only the columns the caller set: a column it did not name may
        // have been changed since it read the endpoint. Nothing here makes
        // held work claimable (the flag is not among them): no wake-up.
        let done = sqlx::query(
            "UPDATE endpoints SET uid = CASE WHEN $1 THEN $2 ELSE uid END, \
             url = COALESCE($3, url), description = COALESCE($4, description), \
             filter_types = CASE WHEN $5 THEN $6::jsonb ELSE filter_types END, \
             rate_limit = CASE WHEN $7 THEN $8 ELSE rate_limit END, \
             metadata = COALESCE($9::jsonb, metadata), \
             channels = CASE WHEN $10 THEN $11 ELSE channels END, updated_at = $12 \
             WHERE id = $13 AND app_id = $14",
        )
        .bind(changes.uid.is_some())
        .bind(changes.uid.as_ref().and_then(|u| u.as_deref()))
        .bind(changes.url.as_deref())
        .bind(changes.description.as_deref())
        .bind(filter.is_some())
        .bind(filter.flatten())
        .bind(changes.rate_limit.is_some())
        .bind(changes.rate_limit.flatten().map(i32::from))
        .bind(metadata)
        .bind(channels.is_some())
        .bind(channels.flatten())
        .bind(now)
        .bind(ep.as_str())
        .bind(app.as_str())
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn set_endpoint_headers(
        &self,
        app: &AppId,
        ep: &EndpointId,
        headers: &BTreeMap<String, String>,
        now: Millis,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE endpoints SET headers = $1, updated_at = $2 WHERE id = $3 AND app_id = $4",
        )
        .bind(to_json(headers)?)
        .bind(now)
        .bind(ep.as_str())
        .bind(app.as_str())
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<bool> {
        // Deliveries go with it (ON DELETE CASCADE); attempts are history.
        let done = sqlx::query("DELETE FROM endpoints WHERE id = $1 AND app_id = $2")
            .bind(id.as_str())
            .bind(app.as_str())
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn rotate_secret(
        &self,
        app: &AppId,
        ep: &EndpointId,
        new_secret: &str,
        grace_until: Millis,
        now: Millis,
    ) -> StoreResult<bool> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let row = sqlx::query(
            "SELECT secret, old_secrets FROM endpoints WHERE id = $1 AND app_id = $2 FOR NO KEY UPDATE",
        )
        .bind(ep.as_str())
        .bind(app.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(row) = row else { return Ok(false) };
        let old = rotated_old_secrets(
            &get::<String>(&row, "old_secrets")?,
            &get::<String>(&row, "secret")?,
            grace_until,
            now,
        )?;
        sqlx::query(
            "UPDATE endpoints SET secret = $1, old_secrets = $2, updated_at = $3 WHERE id = $4",
        )
        .bind(new_secret)
        .bind(old)
        .bind(now)
        .bind(ep.as_str())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    async fn endpoint_status(&self, ep: &EndpointId) -> StoreResult<Option<EndpointStatus>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {STATUS_COLUMNS} FROM endpoints WHERE id = $1"
        )))
        .bind(ep.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(status_from_row).transpose()
    }

    async fn disable_endpoint(
        &self,
        ep: &EndpointId,
        reason: &str,
        auto: bool,
        streak_started_at: Option<Millis>,
        now: Millis,
    ) -> StoreResult<bool> {
        // Its pending deliveries are held from the same statement on: out
        // of the claim index, and found by retention's age cap. (Claims
        // hold those made pending later; one a claim is taking right now
        // is waited for, then seen delivering and left alone.)
        let n: i64 = sqlx::query_scalar(
            "WITH off AS ( \
                 UPDATE endpoints SET disabled = TRUE, disabled_reason = $1, disabled_by = $2, \
                 disabled_at = $3, updated_at = $3 \
                 WHERE id = $4 AND NOT disabled AND ($5::int8 IS NULL OR streak_started_at = $5) \
                 RETURNING id), \
             held AS ( \
                 UPDATE deliveries SET held = TRUE \
                 WHERE endpoint_id IN (SELECT id FROM off) AND state = 0 AND NOT held) \
             SELECT count(*) FROM off",
        )
        .bind(reason)
        .bind(if auto { "auto" } else { "operator" })
        .bind(now)
        .bind(ep.as_str())
        .bind(streak_started_at)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(n == 1)
    }

    async fn enable_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        now: Millis,
        too_old_before: Millis,
    ) -> StoreResult<Option<EnableReport>> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let was: Option<bool> = sqlx::query_scalar(
            "SELECT disabled FROM endpoints WHERE id = $1 AND app_id = $2 FOR NO KEY UPDATE",
        )
        .bind(ep.as_str())
        .bind(app.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(was) = was else { return Ok(None) };
        if !was {
            // Nothing is held for an enabled endpoint: the age cap at
            // enable is for deliveries that waited while it was off.
            tx.rollback().await.map_err(map_err)?;
            return Ok(Some(EnableReport::default()));
        }
        sqlx::query(
            "UPDATE endpoints SET disabled = FALSE, disabled_reason = NULL, disabled_by = NULL, \
             disabled_at = NULL, fail_streak = 0, streak_started_at = NULL, updated_at = $1 WHERE id = $2",
        )
        .bind(now)
        .bind(ep.as_str())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        // Held past the age cap: dead now, and replayable like any other.
        let expired = sqlx::query(
            "UPDATE deliveries SET state = 3, dead_reason = 'too_old', held = FALSE, \
             next_attempt_at = $1, updated_at = $1 \
             WHERE endpoint_id = $2 AND state = 0 AND cycle_started_at < $3",
        )
        .bind(now)
        .bind(ep.as_str())
        .bind(too_old_before)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?
        .rows_affected();
        // Its held deliveries are claimable again. (The row lock above
        // waited for any claim holding more of them: these statements
        // see what it held.)
        unhold(&mut tx, ep).await?;
        self.notify_in(&mut tx).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(Some(EnableReport {
            was_disabled: true,
            expired,
        }))
    }
}

#[async_trait]
impl EventTypes for PostgresStore {
    async fn create_event_type(&self, et: &EventType) -> StoreResult<()> {
        let done = sqlx::query(
            "INSERT INTO event_types (name, description, archived, deprecated, schemas, feature_flag, \
             group_name, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&et.name)
        .bind(&et.description)
        .bind(et.archived)
        .bind(et.deprecated)
        .bind(et.schemas.as_deref())
        .bind(et.feature_flag.as_deref())
        .bind(et.group_name.as_deref())
        .bind(et.created_at)
        .bind(et.updated_at)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        if done.rows_affected() == 0 {
            return Err(StoreError::Conflict(format!(
                "an event type named `{}` already exists",
                et.name
            )));
        }
        Ok(())
    }

    async fn get_event_type(&self, name: &str) -> StoreResult<Option<EventType>> {
        let row = sqlx::query("SELECT * FROM event_types WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(map_err)?;
        row.as_ref().map(event_type_from_row).transpose()
    }

    async fn list_event_types(
        &self,
        include_archived: bool,
        page: &PageReq,
    ) -> StoreResult<Page<EventType>> {
        let sql = if include_archived {
            "SELECT * FROM event_types WHERE TRUE"
        } else {
            "SELECT * FROM event_types WHERE NOT archived"
        };
        self.page_of(sql, "name", Vec::new(), page, event_type_from_row)
            .await
    }

    async fn update_event_type(&self, et: &EventType) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE event_types SET description = $1, archived = $2, deprecated = $3, schemas = $4, \
             feature_flag = $5, group_name = $6, updated_at = $7 WHERE name = $8",
        )
        .bind(&et.description)
        .bind(et.archived)
        .bind(et.deprecated)
        .bind(et.schemas.as_deref())
        .bind(et.feature_flag.as_deref())
        .bind(et.group_name.as_deref())
        .bind(et.updated_at)
        .bind(&et.name)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_event_type(&self, name: &str) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM event_types WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn unknown_event_types(&self, names: &[String]) -> StoreResult<Vec<String>> {
        sqlx::query_scalar(
            "SELECT n FROM UNNEST($1::text[]) AS u(n) \
             WHERE NOT EXISTS (SELECT 1 FROM event_types WHERE name = u.n)",
        )
        .bind(names)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)
    }
}

#[async_trait]
impl Queue for PostgresStore {
    async fn insert_messages(&self, batch: &[NewMessage]) -> StoreResult<Vec<InsertOutcome>> {
        Ok(self.ingest(batch, None).await?.0)
    }

    async fn insert_messages_claiming(
        &self,
        batch: &[NewMessage],
        req: &ClaimRequest<'_>,
    ) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
        self.ingest(batch, Some(IngestClaim::new(req))).await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> StoreResult<Vec<ClaimedDelivery>> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let saturated = saturated(req.in_flight, req.endpoint_cap);
        let window = claim_window(req.limit);
        // Room left on the endpoints with requests in flight; the others
        // have the whole cap.
        let (busy, room): (Vec<&str>, Vec<i64>) = req
            .in_flight
            .iter()
            .filter(|(_, n)| **n < req.endpoint_cap)
            .map(|(id, n)| (id.as_str(), i64_of(req.endpoint_cap - n)))
            .unzip();
        let token = ulid::Ulid::new().to_string();
        // One statement, so one round trip and no explicit transaction: the
        // row locks last only while it runs. SKIP LOCKED: rows another
        // claimer is taking right now are left to it; this claim takes the
        // next ones instead of waiting. Of the due rows, each endpoint gets
        // no more than its room, earliest first, and `limit` in all.
        // Held deliveries are not in `deliveries_due`; the pending ones of
        // a disabled endpoint the window still meets (made pending after
        // it was disabled) are held here, so no claim meets them again.
        // Holding takes a share lock on their endpoint, as enabling it
        // takes a stronger one: the two never cross, so a delivery held
        // here is always one enabling will see; an endpoint locked by
        // someone else is left for a later claim (SKIP LOCKED).
        let rows = sqlx::query(
            "WITH due AS MATERIALIZED ( \
                 SELECT d.id, d.endpoint_id, d.next_attempt_at, d.state FROM deliveries d \
                 WHERE d.state < 2 AND NOT d.held AND d.next_attempt_at <= $1 \
                   AND d.endpoint_id <> ALL($2::text[]) \
                 ORDER BY d.next_attempt_at LIMIT $3 \
                 FOR UPDATE OF d SKIP LOCKED), \
             off AS MATERIALIZED ( \
                 SELECT e.id FROM endpoints e \
                 WHERE e.id IN (SELECT endpoint_id FROM due) AND e.disabled), \
             held AS ( \
                 UPDATE deliveries d SET held = TRUE FROM due \
                 WHERE d.id = due.id AND due.state = 0 \
                   AND due.endpoint_id IN ( \
                       SELECT e.id FROM endpoints e WHERE e.id IN (SELECT id FROM off) AND e.disabled \
                       FOR SHARE SKIP LOCKED)), \
             ranked AS ( \
                 SELECT id, next_attempt_at, endpoint_id, \
                        row_number() OVER (PARTITION BY endpoint_id ORDER BY next_attempt_at, id) AS nth \
                 FROM due WHERE endpoint_id NOT IN (SELECT id FROM off)), \
             picked AS ( \
                 SELECT r.id, r.next_attempt_at FROM ranked r \
                 LEFT JOIN UNNEST($4::text[], $5::int8[]) AS b(endpoint_id, room) ON b.endpoint_id = r.endpoint_id \
                 WHERE r.nth <= COALESCE(b.room, $6) \
                 ORDER BY r.next_attempt_at, r.id LIMIT $7) \
             UPDATE deliveries d SET state = 1, next_attempt_at = $8, lease_token = $9, updated_at = $1 \
             FROM picked p, messages m, endpoints e \
             WHERE d.id = p.id AND m.id = d.msg_id AND e.id = d.endpoint_id \
             RETURNING p.next_attempt_at AS due_at, d.id, d.msg_id, d.app_id, d.endpoint_id, d.attempts, \
                       d.cycle_started_at, d.cycle_base, d.manual, m.event_type, m.payload, e.url, \
                       e.secret, e.old_secrets, e.headers",
        )
        .bind(req.now)
        .bind(&saturated)
        .bind(i64_of(window))
        .bind(&busy)
        .bind(&room)
        .bind(i64_of(req.endpoint_cap))
        .bind(i64_of(req.limit))
        .bind(req.lease_until)
        .bind(&token)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        let mut out = rows
            .iter()
            .map(|r| {
                let due_at: Millis = get(r, "due_at")?;
                let d = ClaimedDelivery {
                    id: DeliveryId::from_trusted(get(r, "id")?),
                    lease_token: token.clone(),
                    msg_id: MsgId::from_trusted(get(r, "msg_id")?),
                    app_id: AppId::from_trusted(get(r, "app_id")?),
                    endpoint_id: EndpointId::from_trusted(get(r, "endpoint_id")?),
                    url: get(r, "url")?,
                    secret: get(r, "secret")?,
                    old_secrets: valid_old_secrets(&get::<String>(r, "old_secrets")?, req.now)?,
                    headers: headers_of(&get::<String>(r, "headers")?)?,
                    event_type: get(r, "event_type")?,
                    payload: get(r, "payload")?,
                    attempts: u32_of(get(r, "attempts")?),
                    cycle_started_at: get(r, "cycle_started_at")?,
                    cycle_base: u32_of(get(r, "cycle_base")?),
                    manual: get(r, "manual")?,
                };
                Ok((due_at, d))
            })
            .collect::<StoreResult<Vec<_>>>()?;
        // In the order picked (due time), as the SQLite store returns them.
        out.sort_by(|(a, x), (b, y)| (a, x.id.as_str()).cmp(&(b, y.id.as_str())));
        Ok(out.into_iter().map(|(_, d)| d).collect())
    }

    async fn next_due_at(&self) -> StoreResult<Option<Millis>> {
        // A disabled endpoint's held deliveries are no claim's work: held
        // ones are out of `deliveries_due`, and the few not held yet (see
        // `claim`) are skipped. ORDER BY … LIMIT 1 (not MIN) walks
        // `deliveries_due` from its start and stops at the first row that
        // counts; MIN over the anti-join aggregates every live row first.
        sqlx::query_scalar(
            "SELECT d.next_attempt_at FROM deliveries d WHERE d.state < 2 AND NOT d.held \
               AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = d.endpoint_id AND e.disabled) \
             ORDER BY d.next_attempt_at LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)
    }

    async fn complete(&self, batch: &[Completion]) -> StoreResult<Completed> {
        if batch.is_empty() {
            return Ok(Completed::default());
        }
        // PostgreSQL refuses NUL in text: one such excerpt would fail the
        // whole batch.
        let batch = storable_batch(batch);
        let batch = &batch[..];
        let attempts: Vec<&AttemptRecord> = batch.iter().map(|c| &c.attempt).collect();
        // Applied one after another, a second completion holding the same
        // lease would find the token already cleared by the first; one
        // UPDATE ... FROM would pick either, so keep only the first.
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        let moves: Vec<&Completion> = batch
            .iter()
            .filter(|c| seen.insert((c.attempt.delivery_id.as_str(), c.lease_token.as_str())))
            .collect();
        let next: Vec<_> = moves.iter().map(|c| next_state(c)).collect();
        let eps = fold_endpoint_batches(batch);
        let ep_ids: Vec<&str> = eps.iter().map(|e| e.endpoint_id.as_str()).collect();
        let stats = fold_stats(batch);
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let column = |f: &dyn Fn(&StatsBucket) -> u64| -> Vec<i64> {
            stats.iter().map(|(_, b)| n(f(b))).collect()
        };
        // Endpoint rows first, locked in id order, so that concurrent
        // completers cannot deadlock on them or on their stats rows (which
        // only holders of the endpoint's lock touch). NO KEY UPDATE does
        // not block ingest's KEY SHARE. Within one statement the order in
        // which PostgreSQL runs its parts is not ours to choose: hence a
        // statement of its own.
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        sqlx::query("SELECT 1 FROM endpoints WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE")
            .bind(&ep_ids)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        // Then the rest in one statement: the attempt log, the deliveries'
        // next states, each endpoint's failing streak and its stats
        // buckets. The lease token guard leaves a re-claimed delivery to its
        // new holder.
        let mut query = sqlx::query(
            "WITH logged AS ( \
                 INSERT INTO attempts (id, delivery_id, msg_id, endpoint_id, app_id, url, attempt_number, \
                                       started_at, duration_ms, status_code, response, error, success, manual) \
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
                                      $7::int4[], $8::int8[], $9::int8[], $10::int4[], $11::text[], $12::text[], \
                                      $13::bool[], $14::bool[])), \
             moved AS ( \
                 UPDATE deliveries SET state = v.state, attempts = v.attempts, next_attempt_at = v.next_at, \
                        lease_token = NULL, manual = FALSE, dead_reason = v.reason, last_status = v.status, \
                        last_error = v.error, updated_at = v.now \
                 FROM (SELECT * FROM UNNEST($15::text[], $16::text[], $17::int2[], $18::int4[], $19::int8[], \
                                            $20::text[], $21::int4[], $22::text[], $23::int8[]) \
                       AS u(id, tok, state, attempts, next_at, reason, status, error, now)) v \
                 WHERE deliveries.id = v.id AND deliveries.lease_token = v.tok \
                 RETURNING deliveries.id, v.tok), \
             counted AS ( \
                 INSERT INTO endpoint_stats (endpoint_id, bucket, attempts, successes, failures, latency_sum, \
                                             h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11) \
                 SELECT * FROM UNNEST($31::text[], $32::int8[], $33::int8[], $34::int8[], $35::int8[], $36::int8[], \
                   $37::int8[], $38::int8[], $39::int8[], $40::int8[], $41::int8[], $42::int8[], $43::int8[], \
                   $44::int8[], $45::int8[], $46::int8[], $47::int8[], $48::int8[]) \
                 ON CONFLICT (endpoint_id, bucket) DO UPDATE SET \
                   attempts = endpoint_stats.attempts + excluded.attempts, \
                   successes = endpoint_stats.successes + excluded.successes, \
                   failures = endpoint_stats.failures + excluded.failures, \
                   latency_sum = endpoint_stats.latency_sum + excluded.latency_sum, \
                   h0 = endpoint_stats.h0 + excluded.h0, h1 = endpoint_stats.h1 + excluded.h1, \
                   h2 = endpoint_stats.h2 + excluded.h2, h3 = endpoint_stats.h3 + excluded.h3, \
                   h4 = endpoint_stats.h4 + excluded.h4, h5 = endpoint_stats.h5 + excluded.h5, \
                   h6 = endpoint_stats.h6 + excluded.h6, h7 = endpoint_stats.h7 + excluded.h7, \
                   h8 = endpoint_stats.h8 + excluded.h8, h9 = endpoint_stats.h9 + excluded.h9, \
                   h10 = endpoint_stats.h10 + excluded.h10, h11 = endpoint_stats.h11 + excluded.h11), \
             streaked AS ( \
             UPDATE endpoints e SET \
               fail_streak = CASE WHEN v.reset THEN v.failures ELSE e.fail_streak + v.failures END, \
               streak_started_at = CASE WHEN v.reset THEN v.first_fail ELSE COALESCE(e.streak_started_at, v.first_fail) END, \
               last_success_at = CASE WHEN v.reset THEN GREATEST(COALESCE(e.last_success_at, 0), v.last_ok) ELSE e.last_success_at END, \
               last_error = COALESCE(v.err, e.last_error), last_error_at = COALESCE(v.err_at, e.last_error_at) \
             FROM UNNEST($24::text[], $25::bool[], $26::int4[], $27::int8[], $28::int8[], $29::text[], $30::int8[]) \
                  AS v(id, reset, failures, first_fail, last_ok, err, err_at) \
             WHERE e.id = v.id \
             RETURNING e.id, e.app_id, e.fail_streak, e.streak_started_at, e.disabled, v.failures AS batch_failures) \
             SELECT id, app_id, fail_streak, streak_started_at, disabled, batch_failures, NULL::text AS moved_tok \
               FROM streaked \
             UNION ALL \
             SELECT id, NULL, NULL, NULL, NULL, NULL, tok FROM moved",
        )
        .bind(attempts.iter().map(|a| a.id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.delivery_id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.msg_id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.endpoint_id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.app_id.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.url.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| i32_of(a.attempt_number)).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.started_at).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.duration_ms).collect::<Vec<_>>())
        .bind(
            attempts
                .iter()
                .map(|a| a.status_code.map(i32::from))
                .collect::<Vec<_>>(),
        )
        .bind(attempts.iter().map(|a| a.response.as_str()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.error.as_deref()).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.success).collect::<Vec<_>>())
        .bind(attempts.iter().map(|a| a.manual).collect::<Vec<_>>())
        .bind(moves.iter().map(|c| c.attempt.delivery_id.as_str()).collect::<Vec<_>>())
        .bind(moves.iter().map(|c| c.lease_token.as_str()).collect::<Vec<_>>())
        .bind(next.iter().map(|(s, _, _)| *s as i16).collect::<Vec<_>>())
        .bind(moves.iter().map(|c| i32_of(c.attempt.attempt_number)).collect::<Vec<_>>())
        .bind(next.iter().map(|(_, at, _)| *at).collect::<Vec<_>>())
        .bind(next.iter().map(|(_, _, r)| *r).collect::<Vec<_>>())
        .bind(
            moves
                .iter()
                .map(|c| c.attempt.status_code.map(i32::from))
                .collect::<Vec<_>>(),
        )
        .bind(moves.iter().map(|c| c.attempt.error.as_deref()).collect::<Vec<_>>())
        .bind(moves.iter().map(|c| c.now).collect::<Vec<_>>())
        .bind(&ep_ids)
        .bind(eps.iter().map(|e| e.reset).collect::<Vec<_>>())
        .bind(eps.iter().map(|e| i32_of(e.failures)).collect::<Vec<_>>())
        .bind(eps.iter().map(|e| e.first_failure_at).collect::<Vec<_>>())
        .bind(eps.iter().map(|e| e.last_success_at).collect::<Vec<_>>())
        .bind(
            eps.iter()
                .map(|e| e.last_error.as_ref().map(|(t, _)| t.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            eps.iter()
                .map(|e| e.last_error.as_ref().map(|(_, at)| *at))
                .collect::<Vec<_>>(),
        )
        .bind(stats.iter().map(|(ep, _)| ep.as_str()).collect::<Vec<_>>())
        .bind(stats.iter().map(|(_, b)| b.bucket).collect::<Vec<_>>())
        .bind(column(&|b| b.attempts))
        .bind(column(&|b| b.successes))
        .bind(column(&|b| b.failures))
        .bind(column(&|b| b.latency_sum_ms));
        for i in 0..crate::health::HISTOGRAM_LEN {
            query = query.bind(column(&|b| b.histogram[i]));
        }
        let rows = query.fetch_all(&mut *tx).await.map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        // The moved deliveries' rows carry the token that moved them; the
        // rest are endpoints.
        let mut moved_by: HashSet<(String, String)> = HashSet::new();
        let mut streaks = Vec::new();
        for r in &rows {
            if let Some(tok) = get::<Option<String>>(r, "moved_tok")? {
                moved_by.insert((get(r, "id")?, tok));
            } else if get::<i32>(r, "batch_failures")? > 0 {
                streaks.push(StreakUpdate {
                    endpoint_id: EndpointId::from_trusted(get(r, "id")?),
                    app_id: AppId::from_trusted(get(r, "app_id")?),
                    fail_streak: u32_of(get(r, "fail_streak")?),
                    streak_started_at: get(r, "streak_started_at")?,
                    disabled: get(r, "disabled")?,
                });
            }
        }
        streaks.sort_by(|a, b| a.endpoint_id.as_str().cmp(b.endpoint_id.as_str()));
        // As in `moves`, the first completion holding a lease is the one
        // that moved it.
        let moved = batch
            .iter()
            .map(|c| {
                moved_by.remove(&(
                    c.attempt.delivery_id.as_str().to_owned(),
                    c.lease_token.clone(),
                ))
            })
            .collect();
        Ok(Completed { moved, streaks })
    }

    async fn release(&self, id: &DeliveryId, lease_token: &str, now: Millis) -> StoreResult<()> {
        // Due now: another process may take it.
        sqlx::query(AssertSqlSafe(waking(
            "UPDATE deliveries SET state = 0, next_attempt_at = $1, lease_token = NULL, updated_at = $1 \
             WHERE id = $2 AND lease_token = $3 RETURNING TRUE AS wakes",
            4,
        )))
        .bind(now)
        .bind(id.as_str())
        .bind(lease_token)
        .bind(&self.wake_channel)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn listen_for_work(&self, wake: std::sync::Arc<Notify>) -> StoreResult<()> {
        let listener = start_listener(&self.pool, &self.wake_channel)
            .await
            .map_err(map_err)?;
        tokio::spawn(listen_loop(
            listener,
            self.pool.clone(),
            self.wake_channel.clone(),
            wake,
            self.closing.clone(),
        ));
        Ok(())
    }
}

#[async_trait]
impl Replay for PostgresStore {
    async fn replay_dead_matching(
        &self,
        filter: &DeadFilter,
        ids: Option<&[DeliveryId]>,
        limit: usize,
        now: Millis,
    ) -> StoreResult<u64> {
        // $1 is REPLAY_SET's time, the filter's follow, then the id list,
        // then the channel.
        let (mut cond, args) = dead_filter_sql(filter, 2);
        let mut next = args.len() + 2;
        if ids.is_some() {
            cond.push_str(&format!(" AND d.id = ANY(${next}::text[])"));
            next += 1;
        }
        // A sweep over a filter leaves rows another replay holds to it; named
        // deliveries wait for that replay and are then seen no longer dead.
        let skip = if ids.is_none() { "SKIP LOCKED" } else { "" };
        let sql = waking(
            &format!(
                "UPDATE deliveries SET {REPLAY_SET} WHERE id IN (SELECT d.id FROM deliveries d \
                 JOIN messages m ON m.id = d.msg_id WHERE {cond} LIMIT {limit} FOR UPDATE OF d {skip}) \
                 RETURNING TRUE AS wakes"
            ),
            next,
        );
        let mut query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql)).bind(now);
        for a in args {
            query = query.bind(a);
        }
        if let Some(ids) = ids {
            query = query.bind(
                ids.iter()
                    .map(|i| i.as_str().to_owned())
                    .collect::<Vec<_>>(),
            );
        }
        let n = query
            .bind(&self.wake_channel)
            .fetch_one(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn resend(
        &self,
        app: &AppId,
        msg: &MsgId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<ResendOutcome> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        // KEY SHARE on the endpoint keeps it from being deleted meanwhile;
        // NO KEY UPDATE on the message serialises resends of it, so two at
        // once cannot both find no delivery and both create one. Endpoint
        // first: the lock order deleting an application takes them in.
        let has_ep =
            sqlx::query("SELECT 1 FROM endpoints WHERE id = $1 AND app_id = $2 FOR KEY SHARE")
                .bind(ep.as_str())
                .bind(app.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?
                .is_some();
        let has_msg =
            sqlx::query("SELECT 1 FROM messages WHERE id = $1 AND app_id = $2 FOR NO KEY UPDATE")
                .bind(msg.as_str())
                .bind(app.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?
                .is_some();
        if !has_msg || !has_ep {
            tx.rollback().await.map_err(map_err)?;
            return Ok(if has_msg {
                ResendOutcome::NoSuchEndpoint
            } else {
                ResendOutcome::NoSuchMessage
            });
        }
        // Reuse the delivery so the Idempotency-Key stays the same;
        // clearing the lease token makes an in-flight outcome leave the
        // state alone.
        let done = sqlx::query(AssertSqlSafe(format!(
            "UPDATE deliveries SET {REPLAY_SET} WHERE msg_id = $2 AND endpoint_id = $3"
        )))
        .bind(now)
        .bind(msg.as_str())
        .bind(ep.as_str())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        if done.rows_affected() == 0 {
            sqlx::query(
                "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
                 cycle_started_at, manual, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, 0, $5, $5, TRUE, $5, $5)",
            )
            .bind(DeliveryId::generate().as_str())
            .bind(msg.as_str())
            .bind(ep.as_str())
            .bind(app.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        self.notify_in(&mut tx).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(ResendOutcome::Queued)
    }
}

#[async_trait]
impl History for PostgresStore {
    async fn get_message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE app_id = $1 AND (id = $2 OR event_id = $2) \
             ORDER BY id = $2 DESC LIMIT 1"
        )))
        .bind(app.as_str())
        .bind(id_or_event_id)
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(message_from_row).transpose()
    }

    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
             WHERE d.id = $1 AND d.app_id = $2"
        )))
        .bind(id.as_str())
        .bind(app.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(delivery_from_row).transpose()
    }

    async fn list_deliveries_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
    ) -> StoreResult<Vec<Delivery>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
             WHERE d.msg_id = $1 AND d.app_id = $2 ORDER BY d.id"
        )))
        .bind(msg.as_str())
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        map_rows(&rows, delivery_from_row)
    }

    async fn list_dead(&self, filter: &DeadFilter, page: &PageReq) -> StoreResult<Page<Delivery>> {
        let (cond, args) = dead_filter_sql(filter, 1);
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id WHERE {cond}"
        );
        self.page_of(&sql, "d.id", args, page, delivery_from_row)
            .await
    }

    async fn list_attempts(
        &self,
        app: &AppId,
        filter: &AttemptFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>> {
        let mut sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE app_id = $1");
        let mut args = vec![app.as_str().to_owned()];
        let mut add = |sql: &mut String, fragment: &str, value: String| {
            args.push(value);
            sql.push_str(&fragment.replace('#', &format!("${}", args.len())));
        };
        if let Some(msg) = &filter.msg {
            add(&mut sql, " AND msg_id = #", msg.as_str().to_owned());
        }
        if let Some(ep) = &filter.endpoint {
            add(&mut sql, " AND endpoint_id = #", ep.as_str().to_owned());
        }
        if let Some(ok) = filter.success {
            sql.push_str(if ok {
                " AND success"
            } else {
                " AND NOT success"
            });
        }
        match filter.code_class {
            None => {}
            Some(0) => sql.push_str(" AND status_code IS NULL"),
            Some(class) => {
                add(&mut sql, " AND status_code >= #::int4", class.to_string());
                add(
                    &mut sql,
                    " AND status_code < #::int4",
                    (class + 100).to_string(),
                );
            }
        }
        self.page_of(&sql, "id", args, page, attempt_from_row).await
    }

    async fn get_attempt(&self, app: &AppId, id: &AttemptId) -> StoreResult<Option<AttemptRecord>> {
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ATTEMPT_COLUMNS} FROM attempts WHERE id = $1 AND app_id = $2"
        )))
        .bind(id.as_str())
        .bind(app.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        row.as_ref().map(attempt_from_row).transpose()
    }

    async fn list_messages(
        &self,
        app: &AppId,
        filter: &MessageFilter,
        page: &PageReq,
    ) -> StoreResult<Page<Message>> {
        let mut sql = format!("SELECT {MESSAGE_COLUMNS} FROM messages WHERE app_id = $1");
        let mut args = vec![app.as_str().to_owned()];
        let mut add = |sql: &mut String, fragment: &str, value: String| {
            args.push(value);
            sql.push_str(&fragment.replace('#', &format!("${}", args.len())));
        };
        if let Some(types) = &filter.event_types {
            add(
                &mut sql,
                " AND event_type IN (SELECT jsonb_array_elements_text(#::jsonb))",
                to_json(types)?,
            );
        }
        if let Some(channel) = &filter.channel {
            add(
                &mut sql,
                " AND jsonb_exists(channels::jsonb, #)",
                channel.clone(),
            );
        }
        if let Some(before) = filter.before {
            add(&mut sql, " AND created_at < #::int8", before.to_string());
        }
        if let Some(after) = filter.after {
            add(&mut sql, " AND created_at > #::int8", after.to_string());
        }
        self.page_of(&sql, "id", args, page, message_from_row).await
    }

    async fn list_endpoint_messages(
        &self,
        app: &AppId,
        ep: &EndpointId,
        page: &PageReq,
    ) -> StoreResult<Page<(Delivery, Message)>> {
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS}, m.payload, m.event_id, m.channels, m.created_at AS msg_created_at \
             FROM deliveries d JOIN messages m ON m.id = d.msg_id WHERE d.endpoint_id = $1 AND d.app_id = $2"
        );
        self.page_of(
            &sql,
            "d.msg_id",
            vec![ep.as_str().to_owned(), app.as_str().to_owned()],
            page,
            |r| {
                let d = delivery_from_row(r)?;
                let m = Message {
                    id: d.msg_id.clone(),
                    app_id: d.app_id.clone(),
                    event_type: d.event_type.clone(),
                    event_id: get(r, "event_id")?,
                    payload: get(r, "payload")?,
                    channels: get::<Option<String>>(r, "channels")?
                        .as_deref()
                        .map(from_json)
                        .transpose()?,
                    created_at: get(r, "msg_created_at")?,
                };
                Ok((d, m))
            },
        )
        .await
    }
}

#[async_trait]
impl Health for PostgresStore {
    async fn endpoint_delivery_counts(&self, ep: &EndpointId) -> StoreResult<DeliveryCounts> {
        let rows = sqlx::query(
            "SELECT state, count(*) AS n FROM deliveries WHERE endpoint_id = $1 GROUP BY state",
        )
        .bind(ep.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        let mut counts = DeliveryCounts::default();
        for r in &rows {
            counts.set(i64::from(get::<i16>(r, "state")?), get::<i64>(r, "n")?);
        }
        Ok(counts)
    }

    async fn endpoint_stats(
        &self,
        ep: &EndpointId,
        since: Millis,
    ) -> StoreResult<Vec<StatsBucket>> {
        let rows = sqlx::query(
            "SELECT * FROM endpoint_stats WHERE endpoint_id = $1 AND bucket >= $2 ORDER BY bucket",
        )
        .bind(ep.as_str())
        .bind(since)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        map_rows(&rows, stats_from_row)
    }

    async fn list_endpoint_overview(
        &self,
        app: Option<&AppId>,
        offset: usize,
        limit: usize,
    ) -> StoreResult<Vec<EndpointOverview>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {ENDPOINT_COLUMNS_E}, {STATUS_COLUMNS_E}, a.name AS app_name \
             FROM endpoints e JOIN applications a ON a.id = e.app_id \
             WHERE ($1::text IS NULL OR e.app_id = $1) \
             ORDER BY e.fail_streak DESC, e.id LIMIT $2 OFFSET $3"
        )))
        .bind(app.map(|a| a.as_str()))
        .bind(i64_of(limit))
        .bind(i64_of(offset))
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        rows.iter()
            .map(|r| {
                Ok(EndpointOverview {
                    endpoint: endpoint_from_row(r)?,
                    app_name: get(r, "app_name")?,
                    status: status_from_row(r)?,
                })
            })
            .collect()
    }

    async fn queue_stats(&self, now: Millis) -> StoreResult<QueueStats> {
        // Each count walks a partial index, never the history.
        // (Held deliveries are pending, and due once their time has come.)
        let row = sqlx::query(
            "SELECT \
               (SELECT count(*) FROM deliveries WHERE state < 2 AND NOT held AND state = 0) \
                 + (SELECT count(*) FROM deliveries WHERE held) AS pending, \
               (SELECT count(*) FROM deliveries WHERE state < 2 AND NOT held AND state = 1) AS delivering, \
               (SELECT count(*) FROM deliveries WHERE state = 3) AS dead, \
               (SELECT count(*) FROM deliveries \
                 WHERE state < 2 AND NOT held AND state = 0 AND next_attempt_at <= $1) \
                 + (SELECT count(*) FROM deliveries WHERE held AND next_attempt_at <= $1) AS due, \
               LEAST((SELECT min(next_attempt_at) FROM deliveries \
                       WHERE state < 2 AND NOT held AND state = 0 AND next_attempt_at <= $1), \
                     (SELECT min(next_attempt_at) FROM deliveries \
                       WHERE held AND next_attempt_at <= $1)) AS oldest, \
               (SELECT count(*) FROM endpoints WHERE disabled) AS disabled",
        )
        .bind(now)
        .fetch_one(&self.pool)
        .await
        .map_err(map_err)?;
        let u = |col: &str| -> StoreResult<u64> {
            Ok(u64::try_from(get::<i64>(&row, col)?).unwrap_or(0))
        };
        Ok(QueueStats {
            pending: u("pending")?,
            delivering: u("delivering")?,
            dead: u("dead")?,
            due: u("due")?,
            oldest_due_at: get(&row, "oldest")?,
            disabled_endpoints: u("disabled")?,
        })
    }
}

#[async_trait]
impl Tokens for PostgresStore {
    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO api_tokens (id, app_id, sha256, name, created_at) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&token.id)
        .bind(token.app_id.as_str())
        .bind(sha256_hex)
        .bind(&token.name)
        .bind(token.created_at)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>> {
        let row =
            sqlx::query("SELECT id, app_id, name, created_at FROM api_tokens WHERE sha256 = $1")
                .bind(sha256_hex)
                .fetch_optional(&self.pool)
                .await
                .map_err(map_err)?;
        row.as_ref().map(token_from_row).transpose()
    }

    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>> {
        let rows = sqlx::query(
            "SELECT id, app_id, name, created_at FROM api_tokens WHERE app_id = $1 ORDER BY id",
        )
        .bind(app.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
        map_rows(&rows, token_from_row)
    }

    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM api_tokens WHERE id = $1 AND app_id = $2")
            .bind(id)
            .bind(app.as_str())
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn idempotency_begin(
        &self,
        scope: &str,
        key: &str,
        request_hash: &str,
        now: Millis,
        valid_after: Millis,
        stale_before: Millis,
    ) -> StoreResult<IdemBegin> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        // Concurrent first requests: one inserts, the other waits on its
        // row and then sees it (in progress, or done).
        let inserted = sqlx::query(
            "INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) \
             VALUES ($1, $2, $3, 0, '', $4) ON CONFLICT DO NOTHING",
        )
        .bind(scope)
        .bind(key)
        .bind(request_hash)
        .bind(now)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?
        .rows_affected();
        if inserted == 1 {
            tx.commit().await.map_err(map_err)?;
            return Ok(IdemBegin::Fresh);
        }
        let row = sqlx::query(
            "SELECT request_hash, status, body, created_at FROM idempotency \
             WHERE scope = $1 AND key = $2 FOR UPDATE",
        )
        .bind(scope)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let found = match &row {
            Some(r) => Some((
                get::<String>(r, "request_hash")?,
                i64::from(get::<i32>(r, "status")?),
                get::<String>(r, "body")?,
                get::<i64>(r, "created_at")?,
            )),
            None => None,
        };
        let verdict = idem_verdict(found, request_hash, valid_after, stale_before);
        if verdict == IdemBegin::Fresh {
            sqlx::query(
                "INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) \
                 VALUES ($1, $2, $3, 0, '', $4) \
                 ON CONFLICT (scope, key) DO UPDATE SET request_hash = excluded.request_hash, \
                 status = 0, body = '', created_at = excluded.created_at",
            )
            .bind(scope)
            .bind(key)
            .bind(request_hash)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(verdict)
    }

    async fn idempotency_finish(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()> {
        sqlx::query("UPDATE idempotency SET status = $1, body = $2 WHERE scope = $3 AND key = $4")
            .bind(i32::from(status))
            .bind(body)
            .bind(scope)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn idempotency_abort(&self, scope: &str, key: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM idempotency WHERE scope = $1 AND key = $2 AND status = 0")
            .bind(scope)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }
}

#[async_trait]
impl Retention for PostgresStore {
    async fn prune(
        &self,
        finished_before: Millis,
        dead_before: Millis,
        batch: usize,
    ) -> StoreResult<PruneReport> {
        if batch == 0 {
            return Ok(PruneReport::default());
        }
        let limit = i64_of(batch);
        let mut tx = self.pool.begin().await.map_err(map_err)?;

        // Dead deliveries past their retention, oldest first. SKIP LOCKED:
        // one being replayed or resent right now is left alone. Locked by
        // one statement and deleted by the next: as a subquery of the
        // DELETE, the LIMIT may be applied more than once.
        let locked: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM deliveries WHERE state = 3 AND updated_at < $1 \
             ORDER BY updated_at LIMIT $2 FOR UPDATE SKIP LOCKED",
        )
        .bind(dead_before)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        let dead = if locked.is_empty() {
            Vec::new()
        } else {
            sqlx::query("DELETE FROM deliveries WHERE id = ANY($1) RETURNING id, msg_id")
                .bind(&locked)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?
        };
        let mut dead_ids = Vec::with_capacity(dead.len());
        let mut dead_msgs = Vec::with_capacity(dead.len());
        for r in &dead {
            dead_ids.push(get::<String>(r, "id")?);
            dead_msgs.push(get::<String>(r, "msg_id")?);
        }
        dead_msgs.sort_unstable();
        dead_msgs.dedup();
        let mut messages: Vec<String> = Vec::new();
        if !dead_ids.is_empty() {
            sqlx::query("DELETE FROM attempts WHERE msg_id = ANY($1) AND delivery_id = ANY($2)")
                .bind(&dead_msgs)
                .bind(&dead_ids)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
            // Their messages go too once old enough and left with no
            // delivery. Locked first (one a resend holds is skipped: with
            // no delivery left, a later prune takes it), then checked by a
            // new statement, whose snapshot sees any delivery committed
            // before the lock was taken.
            let locked: Vec<String> = sqlx::query_scalar(
                "SELECT id FROM messages WHERE id = ANY($1) AND created_at < $2 \
                 ORDER BY id FOR UPDATE SKIP LOCKED",
            )
            .bind(&dead_msgs)
            .bind(finished_before)
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
            if !locked.is_empty() {
                messages = sqlx::query_scalar(
                    "DELETE FROM messages m WHERE m.id = ANY($1) \
                       AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id) \
                     RETURNING m.id",
                )
                .bind(&locked)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
            }
        }

        // Old messages whose deliveries are all delivered (or that have
        // none), oldest first, within what is left of the batch. Locked,
        // then checked again as above; their deliveries go with them.
        let budget = batch.saturating_sub(messages.len());
        let mut taken = 0;
        if budget > 0 {
            let locked: Vec<String> = sqlx::query_scalar(
                "SELECT m.id FROM messages m WHERE m.created_at < $1 \
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id AND d.state <> 2) \
                 ORDER BY m.created_at LIMIT $2 FOR UPDATE SKIP LOCKED",
            )
            .bind(finished_before)
            .bind(i64_of(budget))
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
            taken = locked.len();
            if !locked.is_empty() {
                let gone: Vec<String> = sqlx::query_scalar(
                    "DELETE FROM messages m WHERE m.id = ANY($1) \
                       AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id AND d.state <> 2) \
                     RETURNING m.id",
                )
                .bind(&locked)
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
                // No foreign key cascades them (migration 0008); a resend
                // adding one waits on the message's lock, then finds it gone.
                sqlx::query("DELETE FROM deliveries WHERE msg_id = ANY($1)")
                    .bind(&gone)
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
                messages.extend(gone);
            }
        }
        if !messages.is_empty() {
            // Attempts are history without a foreign key: the message's
            // go with it, including those of endpoints deleted since.
            sqlx::query("DELETE FROM attempts WHERE msg_id = ANY($1)")
                .bind(&messages)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(PruneReport {
            messages: u64::try_from(messages.len()).unwrap_or(u64::MAX),
            dead_deliveries: u64::try_from(dead_ids.len()).unwrap_or(u64::MAX),
            // (No budget left means the dead batch was full.)
            more: dead_ids.len() >= batch || (budget > 0 && taken >= budget),
        })
    }

    async fn expire_held(
        &self,
        too_old_before: Millis,
        now: Millis,
        batch: usize,
    ) -> StoreResult<u64> {
        if batch == 0 {
            return Ok(0);
        }
        // Per disabled endpoint, a seek into its held deliveries by cycle
        // start (LATERAL: a plain join may be planned as a scan of every
        // delivery). SKIP LOCKED: one being enabled (or resent) right now
        // is left to that; a later pass sees what it became.
        let n = sqlx::query(
            "WITH old AS MATERIALIZED ( \
                 SELECT h.id FROM endpoints e \
                 CROSS JOIN LATERAL ( \
                     SELECT d.id FROM deliveries d \
                     WHERE d.held AND d.endpoint_id = e.id AND d.cycle_started_at < $1 \
                     LIMIT $2 FOR UPDATE OF d SKIP LOCKED) h \
                 WHERE e.disabled LIMIT $2) \
             UPDATE deliveries d SET state = 3, dead_reason = 'too_old', held = FALSE, \
                    next_attempt_at = $3, updated_at = $3 \
             FROM old WHERE d.id = old.id",
        )
        .bind(too_old_before)
        .bind(i64_of(batch))
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(n)
    }

    async fn prune_idempotency(&self, before: Millis) -> StoreResult<u64> {
        let done = sqlx::query("DELETE FROM idempotency WHERE created_at < $1")
            .bind(before)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn prune_stats(&self, before: Millis) -> StoreResult<u64> {
        // SKIP LOCKED: a bucket some transaction holds (an application's
        // deletion, which takes them in its own order) is left to it or to
        // the next round, never waited for.
        let done = sqlx::query(
            "DELETE FROM endpoint_stats s USING (SELECT endpoint_id, bucket FROM endpoint_stats \
             WHERE bucket < $1 FOR UPDATE SKIP LOCKED) AS old \
             WHERE s.endpoint_id = old.endpoint_id AND s.bucket = old.bucket",
        )
        .bind(before)
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }
}
