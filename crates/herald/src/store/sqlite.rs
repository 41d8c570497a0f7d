//! The embedded store: SQLite in WAL mode with `synchronous=FULL`, so a
//! committed batch is on disk before any request in it is answered.
//!
//! SQLite allows one writer at a time, so there is exactly one writer
//! connection (every write queues for it; nothing ever sees SQLITE_BUSY)
//! and a small pool of readers that WAL lets run beside it. Batching is
//! what makes this fast: one transaction (one fsync) per ingest batch, per
//! claim and per completion batch, with multi-row statements inside.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use herald_policy::DeadReason;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite, SqlitePool};

use super::*;

/// Rows per multi-row statement: well under SQLite's 32,766 variables.
const CHUNK: usize = 500;

pub struct SqliteStore {
    write: SqlitePool,
    read: SqlitePool,
}

/// Turns `sqlite:///abs/path.db` or `sqlite://rel.db` into a file path.
pub fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let rest = rest.split('?').next().unwrap_or(rest);
    if rest.is_empty() {
        None
    } else {
        Some(PathBuf::from(rest))
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies migrations.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let path = sqlite_path(url)
            .ok_or_else(|| StoreError::Internal(format!("not a sqlite URL: {url}")))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let base = SqliteConnectOptions::from_str("sqlite://")
            .map_err(map_err)?
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10))
            // The WAL is checkpointed by the writer as it grows.
            .pragma("wal_autocheckpoint", "4000");
        let write = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(base.clone())
            .await
            .map_err(map_err)?;
        sqlx::migrate!("migrations/sqlite")
            .run(&write)
            .await
            .map_err(|e| StoreError::Internal(format!("migration failed: {e}")))?;
        let read = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(base.read_only(true))
            .await
            .map_err(map_err)?;
        Ok(SqliteStore { write, read })
    }

    pub async fn close(&self) {
        self.read.close().await;
        self.write.close().await;
    }
}

fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() => {
            StoreError::Conflict(db.message().to_owned())
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Internal(e.to_string()),
    }
}

fn json_map(text: &str) -> StoreResult<BTreeMap<String, String>> {
    serde_json::from_str(text).map_err(|e| StoreError::Internal(format!("bad metadata: {e}")))
}

fn to_json<T: serde::Serialize>(v: &T) -> StoreResult<String> {
    serde_json::to_string(v).map_err(|e| StoreError::Internal(e.to_string()))
}

fn u16_opt(v: Option<i64>) -> Option<u16> {
    v.and_then(|n| u16::try_from(n).ok())
}

fn u32_of(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

fn app_from_row(r: &SqliteRow) -> StoreResult<App> {
    Ok(App {
        id: AppId::from_trusted(r.try_get("id").map_err(map_err)?),
        uid: r.try_get("uid").map_err(map_err)?,
        name: r.try_get("name").map_err(map_err)?,
        rate_limit: u16_opt(r.try_get("rate_limit").map_err(map_err)?),
        metadata: json_map(r.try_get("metadata").map_err(map_err)?)?,
        created_at: r.try_get("created_at").map_err(map_err)?,
        updated_at: r.try_get("updated_at").map_err(map_err)?,
    })
}

fn endpoint_from_row(r: &SqliteRow) -> StoreResult<Endpoint> {
    let filter: Option<String> = r.try_get("filter_types").map_err(map_err)?;
    Ok(Endpoint {
        id: EndpointId::from_trusted(r.try_get("id").map_err(map_err)?),
        app_id: AppId::from_trusted(r.try_get("app_id").map_err(map_err)?),
        uid: r.try_get("uid").map_err(map_err)?,
        url: r.try_get("url").map_err(map_err)?,
        description: r.try_get("description").map_err(map_err)?,
        filter_types: match filter {
            Some(text) => {
                Some(serde_json::from_str(&text).map_err(|e| StoreError::Internal(e.to_string()))?)
            }
            None => None,
        },
        disabled: r.try_get::<i64, _>("disabled").map_err(map_err)? != 0,
        rate_limit: u16_opt(r.try_get("rate_limit").map_err(map_err)?),
        metadata: json_map(r.try_get("metadata").map_err(map_err)?)?,
        secret: r.try_get("secret").map_err(map_err)?,
        created_at: r.try_get("created_at").map_err(map_err)?,
        updated_at: r.try_get("updated_at").map_err(map_err)?,
    })
}

fn message_from_row(r: &SqliteRow) -> StoreResult<Message> {
    Ok(Message {
        id: MsgId::from_trusted(r.try_get("id").map_err(map_err)?),
        app_id: AppId::from_trusted(r.try_get("app_id").map_err(map_err)?),
        event_type: r.try_get("event_type").map_err(map_err)?,
        event_id: r.try_get("event_id").map_err(map_err)?,
        payload: r.try_get("payload").map_err(map_err)?,
        created_at: r.try_get("created_at").map_err(map_err)?,
    })
}

const DELIVERY_COLUMNS: &str =
    "d.id, d.msg_id, d.app_id, d.endpoint_id, m.event_type, d.state, d.attempts, \
     d.next_attempt_at, d.dead_reason, d.last_status, d.last_error, d.created_at, d.updated_at";

fn delivery_from_row(r: &SqliteRow) -> StoreResult<Delivery> {
    let state: i64 = r.try_get("state").map_err(map_err)?;
    let reason: Option<String> = r.try_get("dead_reason").map_err(map_err)?;
    Ok(Delivery {
        id: DeliveryId::from_trusted(r.try_get("id").map_err(map_err)?),
        msg_id: MsgId::from_trusted(r.try_get("msg_id").map_err(map_err)?),
        app_id: AppId::from_trusted(r.try_get("app_id").map_err(map_err)?),
        endpoint_id: EndpointId::from_trusted(r.try_get("endpoint_id").map_err(map_err)?),
        event_type: r.try_get("event_type").map_err(map_err)?,
        state: DeliveryState::from_i64(state)
            .ok_or_else(|| StoreError::Internal(format!("bad state {state}")))?,
        attempts: u32_of(r.try_get("attempts").map_err(map_err)?),
        next_attempt_at: r.try_get("next_attempt_at").map_err(map_err)?,
        dead_reason: reason.as_deref().and_then(DeadReason::parse),
        last_status: u16_opt(r.try_get("last_status").map_err(map_err)?),
        last_error: r.try_get("last_error").map_err(map_err)?,
        created_at: r.try_get("created_at").map_err(map_err)?,
        updated_at: r.try_get("updated_at").map_err(map_err)?,
    })
}

fn attempt_from_row(r: &SqliteRow) -> StoreResult<AttemptRecord> {
    Ok(AttemptRecord {
        id: AttemptId::from_trusted(r.try_get("id").map_err(map_err)?),
        delivery_id: DeliveryId::from_trusted(r.try_get("delivery_id").map_err(map_err)?),
        msg_id: MsgId::from_trusted(r.try_get("msg_id").map_err(map_err)?),
        endpoint_id: EndpointId::from_trusted(r.try_get("endpoint_id").map_err(map_err)?),
        app_id: AppId::from_trusted(r.try_get("app_id").map_err(map_err)?),
        url: r.try_get("url").map_err(map_err)?,
        attempt_number: u32_of(r.try_get("attempt_number").map_err(map_err)?),
        started_at: r.try_get("started_at").map_err(map_err)?,
        duration_ms: r.try_get("duration_ms").map_err(map_err)?,
        status_code: u16_opt(r.try_get("status_code").map_err(map_err)?),
        response: r.try_get("response").map_err(map_err)?,
        error: r.try_get("error").map_err(map_err)?,
        success: r.try_get::<i64, _>("success").map_err(map_err)? != 0,
        manual: r.try_get::<i64, _>("manual").map_err(map_err)? != 0,
    })
}

/// Appends the keyset condition, order and limit of a page to `qb`, whose
/// WHERE clause is already open.
fn push_page(qb: &mut QueryBuilder<'_, Sqlite>, column: &str, page: &PageReq) {
    if let Some(after) = &page.after {
        qb.push(format!(
            " AND {column} {} ",
            if page.ascending { ">" } else { "<" }
        ));
        qb.push_bind(after.clone());
    }
    qb.push(format!(
        " ORDER BY {column} {} LIMIT ",
        if page.ascending { "ASC" } else { "DESC" }
    ));
    qb.push_bind(i64::try_from(page.limit.saturating_add(1)).unwrap_or(i64::MAX));
}

fn into_page<T>(mut items: Vec<T>, page: &PageReq) -> Page<T> {
    let has_more = items.len() > page.limit;
    items.truncate(page.limit);
    Page { items, has_more }
}

impl SqliteStore {
    async fn fetch_page<T>(
        &self,
        mut qb: QueryBuilder<'_, Sqlite>,
        column: &str,
        page: &PageReq,
        map: fn(&SqliteRow) -> StoreResult<T>,
    ) -> StoreResult<Page<T>> {
        push_page(&mut qb, column, page);
        let rows = qb.build().fetch_all(&self.read).await.map_err(map_err)?;
        let items = rows.iter().map(map).collect::<StoreResult<Vec<T>>>()?;
        Ok(into_page(items, page))
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        sqlx::query_scalar("SELECT value FROM settings WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.read)
            .await
            .map_err(map_err)
    }

    async fn init_setting(&self, key: &str, value: &str) -> StoreResult<String> {
        sqlx::query("INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING")
            .bind(key)
            .bind(value)
            .execute(&self.write)
            .await
            .map_err(map_err)?;
        sqlx::query_scalar("SELECT value FROM settings WHERE key = ?")
            .bind(key)
            .fetch_one(&self.write)
            .await
            .map_err(map_err)
    }

    async fn create_app(&self, app: &App) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(app.id.as_str())
        .bind(&app.uid)
        .bind(&app.name)
        .bind(app.rate_limit.map(i64::from))
        .bind(to_json(&app.metadata)?)
        .bind(app.created_at)
        .bind(app.updated_at)
        .execute(&self.write)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Option<App>> {
        let row = sqlx::query(
            "SELECT * FROM applications WHERE id = ?1 OR uid = ?1 ORDER BY id = ?1 DESC LIMIT 1",
        )
        .bind(id_or_uid)
        .fetch_optional(&self.read)
        .await
        .map_err(map_err)?;
        row.as_ref().map(app_from_row).transpose()
    }

    async fn list_apps(&self, page: &PageReq) -> StoreResult<Page<App>> {
        let qb = QueryBuilder::new("SELECT * FROM applications WHERE 1=1");
        self.fetch_page(qb, "id", page, app_from_row).await
    }

    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO endpoints (id, app_id, uid, url, description, filter_types, disabled, rate_limit, \
             metadata, secret, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(ep.id.as_str())
        .bind(ep.app_id.as_str())
        .bind(&ep.uid)
        .bind(&ep.url)
        .bind(&ep.description)
        .bind(ep.filter_types.as_ref().map(to_json).transpose()?)
        .bind(i64::from(ep.disabled))
        .bind(ep.rate_limit.map(i64::from))
        .bind(to_json(&ep.metadata)?)
        .bind(&ep.secret)
        .bind(ep.created_at)
        .bind(ep.updated_at)
        .execute(&self.write)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn get_endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>> {
        let row = sqlx::query(
            "SELECT * FROM endpoints WHERE app_id = ?1 AND (id = ?2 OR uid = ?2) ORDER BY id = ?2 DESC LIMIT 1",
        )
        .bind(app.as_str())
        .bind(id_or_uid)
        .fetch_optional(&self.read)
        .await
        .map_err(map_err)?;
        row.as_ref().map(endpoint_from_row).transpose()
    }

    async fn list_endpoints(&self, app: &AppId, page: &PageReq) -> StoreResult<Page<Endpoint>> {
        let mut qb = QueryBuilder::new("SELECT * FROM endpoints WHERE app_id = ");
        qb.push_bind(app.as_str().to_owned());
        self.fetch_page(qb, "id", page, endpoint_from_row).await
    }

    async fn update_endpoint(&self, ep: &Endpoint) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE endpoints SET uid = ?, url = ?, description = ?, filter_types = ?, disabled = ?, \
             rate_limit = ?, metadata = ?, secret = ?, updated_at = ? WHERE id = ? AND app_id = ?",
        )
        .bind(&ep.uid)
        .bind(&ep.url)
        .bind(&ep.description)
        .bind(ep.filter_types.as_ref().map(to_json).transpose()?)
        .bind(i64::from(ep.disabled))
        .bind(ep.rate_limit.map(i64::from))
        .bind(to_json(&ep.metadata)?)
        .bind(&ep.secret)
        .bind(ep.updated_at)
        .bind(ep.id.as_str())
        .bind(ep.app_id.as_str())
        .execute(&self.write)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<bool> {
        // Deliveries go with it (ON DELETE CASCADE); attempts are history.
        let done = sqlx::query("DELETE FROM endpoints WHERE id = ? AND app_id = ?")
            .bind(id.as_str())
            .bind(app.as_str())
            .execute(&self.write)
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn insert_messages(&self, batch: &[NewMessage]) -> StoreResult<Vec<InsertOutcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.write.begin().await.map_err(map_err)?;

        // 1. Messages, multi-row; a repeated eventId is skipped, not fatal.
        let mut inserted: std::collections::HashSet<String> =
            std::collections::HashSet::with_capacity(batch.len());
        for chunk in batch.chunks(CHUNK) {
            let mut qb = QueryBuilder::<Sqlite>::new(
                "INSERT INTO messages (id, app_id, event_type, event_id, payload, created_at) ",
            );
            qb.push_values(chunk, |mut b, m| {
                b.push_bind(m.id.as_str())
                    .push_bind(m.app_id.as_str())
                    .push_bind(&m.event_type)
                    .push_bind(&m.event_id)
                    .push_bind(&m.payload)
                    .push_bind(m.created_at);
            });
            qb.push(" ON CONFLICT DO NOTHING RETURNING id");
            let ids: Vec<String> = qb
                .build_query_scalar()
                .fetch_all(&mut *tx)
                .await
                .map_err(map_err)?;
            inserted.extend(ids);
        }

        // 2. Fan-out: the subscribed, enabled endpoints of each app, once.
        let mut endpoints_of: HashMap<&str, Vec<(String, Option<Vec<String>>)>> = HashMap::new();
        for m in batch {
            if endpoints_of.contains_key(m.app_id.as_str()) {
                continue;
            }
            let rows = sqlx::query(
                "SELECT id, filter_types FROM endpoints WHERE app_id = ? AND disabled = 0",
            )
            .bind(m.app_id.as_str())
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
            let mut eps = Vec::with_capacity(rows.len());
            for r in rows {
                let filter: Option<String> = r.try_get("filter_types").map_err(map_err)?;
                let filter = match filter {
                    Some(t) => Some(
                        serde_json::from_str(&t)
                            .map_err(|e| StoreError::Internal(e.to_string()))?,
                    ),
                    None => None,
                };
                eps.push((r.try_get("id").map_err(map_err)?, filter));
            }
            endpoints_of.insert(m.app_id.as_str(), eps);
        }

        struct NewDelivery<'a> {
            id: DeliveryId,
            msg: &'a NewMessage,
            endpoint_id: &'a str,
        }
        let mut deliveries = Vec::new();
        let mut outcomes = Vec::with_capacity(batch.len());
        for m in batch {
            if !inserted.contains(m.id.as_str()) {
                outcomes.push(InsertOutcome::DuplicateEventId);
                continue;
            }
            let before = deliveries.len();
            for (ep_id, filter) in endpoints_of
                .get(m.app_id.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                let subscribed = filter
                    .as_ref()
                    .is_none_or(|types| types.contains(&m.event_type));
                if subscribed {
                    deliveries.push(NewDelivery {
                        id: DeliveryId::generate(),
                        msg: m,
                        endpoint_id: ep_id,
                    });
                }
            }
            outcomes.push(InsertOutcome::Inserted {
                deliveries: deliveries.len() - before,
            });
        }
        for chunk in deliveries.chunks(CHUNK) {
            let mut qb = QueryBuilder::<Sqlite>::new(
                "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, \
                 cycle_started_at, created_at, updated_at) ",
            );
            qb.push_values(chunk, |mut b, d| {
                b.push_bind(d.id.as_str())
                    .push_bind(d.msg.id.as_str())
                    .push_bind(d.endpoint_id)
                    .push_bind(d.msg.app_id.as_str())
                    .push_bind(DeliveryState::Pending as i64)
                    .push_bind(d.msg.created_at)
                    .push_bind(d.msg.created_at)
                    .push_bind(d.msg.created_at)
                    .push_bind(d.msg.created_at);
            });
            qb.build().execute(&mut *tx).await.map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(outcomes)
    }

    async fn get_message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>> {
        let row = sqlx::query(
            "SELECT * FROM messages WHERE app_id = ?1 AND (id = ?2 OR event_id = ?2) ORDER BY id = ?2 DESC LIMIT 1",
        )
        .bind(app.as_str())
        .bind(id_or_event_id)
        .fetch_optional(&self.read)
        .await
        .map_err(map_err)?;
        row.as_ref().map(message_from_row).transpose()
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> StoreResult<Vec<ClaimedDelivery>> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let saturated: Vec<&str> = req
            .in_flight
            .iter()
            .filter(|(_, n)| **n >= req.endpoint_cap)
            .map(|(id, _)| id.as_str())
            .collect();
        // Look a little past `limit` so that one busy endpoint at the head of
        // the queue does not leave the other slots empty.
        let window = req.limit.saturating_mul(4).max(64);
        let mut tx = self.write.begin().await.map_err(map_err)?;
        let candidates = sqlx::query(
            "SELECT id, endpoint_id FROM deliveries \
             WHERE state < 2 AND next_attempt_at <= ?1 \
               AND endpoint_id NOT IN (SELECT value FROM json_each(?2) \
                                       UNION ALL SELECT id FROM endpoints WHERE disabled = 1) \
             ORDER BY next_attempt_at LIMIT ?3",
        )
        .bind(req.now)
        .bind(to_json(&saturated)?)
        .bind(i64::try_from(window).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;

        let mut room: HashMap<String, usize> = HashMap::new();
        let mut picked: Vec<String> = Vec::with_capacity(req.limit);
        for row in &candidates {
            if picked.len() >= req.limit {
                break;
            }
            let ep: String = row.try_get("endpoint_id").map_err(map_err)?;
            let used = room.entry(ep).or_insert_with_key(|ep| {
                req.in_flight
                    .get(&EndpointId::from_trusted(ep.clone()))
                    .copied()
                    .unwrap_or(0)
            });
            if *used < req.endpoint_cap {
                *used += 1;
                picked.push(row.try_get("id").map_err(map_err)?);
            }
        }
        if picked.is_empty() {
            tx.commit().await.map_err(map_err)?;
            return Ok(Vec::new());
        }
        let token = ulid::Ulid::new().to_string();
        let ids = to_json(&picked)?;
        sqlx::query(
            "UPDATE deliveries SET state = 1, next_attempt_at = ?1, lease_token = ?2, updated_at = ?3 \
             WHERE id IN (SELECT value FROM json_each(?4))",
        )
        .bind(req.lease_until)
        .bind(&token)
        .bind(req.now)
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let rows = sqlx::query(
            "SELECT d.id, d.msg_id, d.app_id, d.endpoint_id, d.attempts, d.cycle_started_at, d.cycle_base, \
                    d.manual, m.event_type, m.payload, e.url, e.secret \
             FROM deliveries d JOIN messages m ON m.id = d.msg_id JOIN endpoints e ON e.id = d.endpoint_id \
             WHERE d.id IN (SELECT value FROM json_each(?1)) ORDER BY d.id",
        )
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        rows.iter()
            .map(|r| {
                Ok(ClaimedDelivery {
                    id: DeliveryId::from_trusted(r.try_get("id").map_err(map_err)?),
                    lease_token: token.clone(),
                    msg_id: MsgId::from_trusted(r.try_get("msg_id").map_err(map_err)?),
                    app_id: AppId::from_trusted(r.try_get("app_id").map_err(map_err)?),
                    endpoint_id: EndpointId::from_trusted(
                        r.try_get("endpoint_id").map_err(map_err)?,
                    ),
                    url: r.try_get("url").map_err(map_err)?,
                    secret: r.try_get("secret").map_err(map_err)?,
                    event_type: r.try_get("event_type").map_err(map_err)?,
                    payload: r.try_get("payload").map_err(map_err)?,
                    attempts: u32_of(r.try_get("attempts").map_err(map_err)?),
                    cycle_started_at: r.try_get("cycle_started_at").map_err(map_err)?,
                    cycle_base: u32_of(r.try_get("cycle_base").map_err(map_err)?),
                    manual: r.try_get::<i64, _>("manual").map_err(map_err)? != 0,
                })
            })
            .collect()
    }

    async fn next_due_at(&self) -> StoreResult<Option<Millis>> {
        sqlx::query_scalar("SELECT MIN(next_attempt_at) FROM deliveries WHERE state < 2")
            .fetch_one(&self.read)
            .await
            .map_err(map_err)
    }

    async fn complete(&self, batch: &[Completion]) -> StoreResult<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut tx = self.write.begin().await.map_err(map_err)?;
        for chunk in batch.chunks(CHUNK) {
            let mut qb = QueryBuilder::<Sqlite>::new(
                "INSERT INTO attempts (id, delivery_id, msg_id, endpoint_id, app_id, url, attempt_number, \
                 started_at, duration_ms, status_code, response, error, success, manual) ",
            );
            qb.push_values(chunk, |mut b, c| {
                let a = &c.attempt;
                b.push_bind(a.id.as_str())
                    .push_bind(a.delivery_id.as_str())
                    .push_bind(a.msg_id.as_str())
                    .push_bind(a.endpoint_id.as_str())
                    .push_bind(a.app_id.as_str())
                    .push_bind(&a.url)
                    .push_bind(i64::from(a.attempt_number))
                    .push_bind(a.started_at)
                    .push_bind(a.duration_ms)
                    .push_bind(a.status_code.map(i64::from))
                    .push_bind(&a.response)
                    .push_bind(&a.error)
                    .push_bind(i64::from(a.success))
                    .push_bind(i64::from(a.manual));
            });
            qb.build().execute(&mut *tx).await.map_err(map_err)?;

            // One UPDATE … FROM (VALUES …) for the whole chunk. The lease
            // token guard leaves a re-claimed delivery to its new holder.
            let mut qb = QueryBuilder::<Sqlite>::new(
                "WITH v(id, tok, state, attempts, next_at, reason, status, error, now) AS (",
            );
            qb.push_values(chunk, |mut b, c| {
                let (state, next_at, reason) = match c.next {
                    NextState::Delivered => (DeliveryState::Delivered, c.now, None),
                    NextState::Retry { at } => (DeliveryState::Pending, at, None),
                    NextState::Dead(r) => (DeliveryState::Dead, c.now, Some(r.as_str())),
                };
                b.push_bind(c.attempt.delivery_id.as_str())
                    .push_bind(&c.lease_token)
                    .push_bind(state as i64)
                    .push_bind(i64::from(c.attempt.attempt_number))
                    .push_bind(next_at)
                    .push_bind(reason)
                    .push_bind(c.attempt.status_code.map(i64::from))
                    .push_bind(&c.attempt.error)
                    .push_bind(c.now);
            });
            qb.push(
                ") UPDATE deliveries SET state = v.state, attempts = v.attempts, next_attempt_at = v.next_at, \
                 lease_token = NULL, manual = 0, dead_reason = v.reason, last_status = v.status, \
                 last_error = v.error, updated_at = v.now \
                 FROM v WHERE deliveries.id = v.id AND deliveries.lease_token = v.tok",
            );
            qb.build().execute(&mut *tx).await.map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(())
    }

    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        let row = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
             WHERE d.id = ? AND d.app_id = ?"
        ))
        .bind(id.as_str())
        .bind(app.as_str())
        .fetch_optional(&self.read)
        .await
        .map_err(map_err)?;
        row.as_ref().map(delivery_from_row).transpose()
    }

    async fn list_deliveries_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
    ) -> StoreResult<Vec<Delivery>> {
        let rows = sqlx::query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
             WHERE d.msg_id = ? AND d.app_id = ? ORDER BY d.id"
        ))
        .bind(msg.as_str())
        .bind(app.as_str())
        .fetch_all(&self.read)
        .await
        .map_err(map_err)?;
        rows.iter().map(delivery_from_row).collect()
    }

    async fn list_dead(
        &self,
        app: &AppId,
        endpoint: Option<&EndpointId>,
        page: &PageReq,
    ) -> StoreResult<Page<Delivery>> {
        let mut qb = QueryBuilder::new(format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id WHERE d.state = 3 AND d.app_id = "
        ));
        qb.push_bind(app.as_str().to_owned());
        if let Some(ep) = endpoint {
            qb.push(" AND d.endpoint_id = ");
            qb.push_bind(ep.as_str().to_owned());
        }
        self.fetch_page(qb, "d.id", page, delivery_from_row).await
    }

    async fn replay_dead(&self, app: &AppId, id: &DeliveryId, now: Millis) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE deliveries SET state = 0, next_attempt_at = ?1, cycle_started_at = ?1, cycle_base = attempts, \
             manual = 1, dead_reason = NULL, updated_at = ?1 WHERE id = ?2 AND app_id = ?3 AND state = 3",
        )
        .bind(now)
        .bind(id.as_str())
        .bind(app.as_str())
        .execute(&self.write)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn replay_dead_of_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<u64> {
        let done = sqlx::query(
            "UPDATE deliveries SET state = 0, next_attempt_at = ?1, cycle_started_at = ?1, cycle_base = attempts, \
             manual = 1, dead_reason = NULL, updated_at = ?1 WHERE endpoint_id = ?2 AND app_id = ?3 AND state = 3",
        )
        .bind(now)
        .bind(ep.as_str())
        .bind(app.as_str())
        .execute(&self.write)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn resend(
        &self,
        app: &AppId,
        msg: &MsgId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<ResendOutcome> {
        let mut tx = self.write.begin().await.map_err(map_err)?;
        let msg_exists: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM messages WHERE id = ? AND app_id = ?")
                .bind(msg.as_str())
                .bind(app.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?;
        if msg_exists.is_none() {
            return Ok(ResendOutcome::NoSuchMessage);
        }
        let ep_exists: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM endpoints WHERE id = ? AND app_id = ?")
                .bind(ep.as_str())
                .bind(app.as_str())
                .fetch_optional(&mut *tx)
                .await
                .map_err(map_err)?;
        if ep_exists.is_none() {
            return Ok(ResendOutcome::NoSuchEndpoint);
        }
        // Reuse the delivery so the Idempotency-Key stays the same; clearing
        // the lease token makes any in-flight outcome leave the state alone.
        let updated = sqlx::query(
            "UPDATE deliveries SET state = 0, next_attempt_at = ?1, cycle_started_at = ?1, cycle_base = attempts, \
             manual = 1, lease_token = NULL, dead_reason = NULL, updated_at = ?1 WHERE msg_id = ?2 AND endpoint_id = ?3",
        )
        .bind(now)
        .bind(msg.as_str())
        .bind(ep.as_str())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        if updated.rows_affected() == 0 {
            sqlx::query(
                "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, cycle_started_at, \
                 manual, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?5, 1, ?5, ?5)",
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
        tx.commit().await.map_err(map_err)?;
        Ok(ResendOutcome::Queued)
    }

    async fn list_attempts_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>> {
        let mut qb = QueryBuilder::new("SELECT * FROM attempts WHERE msg_id = ");
        qb.push_bind(msg.as_str().to_owned());
        qb.push(" AND app_id = ");
        qb.push_bind(app.as_str().to_owned());
        self.fetch_page(qb, "id", page, attempt_from_row).await
    }

    async fn list_attempts_of_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>> {
        let mut qb = QueryBuilder::new("SELECT * FROM attempts WHERE endpoint_id = ");
        qb.push_bind(ep.as_str().to_owned());
        qb.push(" AND app_id = ");
        qb.push_bind(app.as_str().to_owned());
        self.fetch_page(qb, "id", page, attempt_from_row).await
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1")
            .execute(&self.read)
            .await
            .map_err(map_err)?;
        Ok(())
    }
}
