//! The embedded store: SQLite in WAL mode with `synchronous=FULL`, so a
//! commit is on disk before anyone hears of it.
//!
//! SQLite allows one writer at a time, so one thread owns the only writing
//! connection and runs every write as a job. It takes all the jobs that
//! queued up while it was busy and runs them in ONE transaction, each in
//! its own savepoint (a failing job rolls back alone), then commits once
//! and only then answers each job. Ingest batches, claims and completions
//! therefore share fsyncs: this group commit is what makes a durable queue
//! on one disk fast. Reads run on a small pool of read-only connections,
//! beside the writer, as WAL allows.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use herald_policy::DeadReason;
use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use tokio::sync::{mpsc, oneshot};

use super::*;

/// The schema, in order. A database records how many it has applied in
/// `PRAGMA user_version`; at open the rest are applied in a transaction.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/sqlite/0001_initial.sql"),
    include_str!("../../../migrations/sqlite/0002_parking.sql"),
    include_str!("../../../migrations/sqlite/0003_health.sql"),
    include_str!("../../../migrations/sqlite/0004_secret_rotation.sql"),
    include_str!("../../../migrations/sqlite/0005_event_types.sql"),
    include_str!("../../../migrations/sqlite/0006_channels_headers.sql"),
    include_str!("../../../migrations/sqlite/0007_tokens_idempotency.sql"),
    include_str!("../../../migrations/sqlite/0008_held.sql"),
];

/// A full endpoint's due deliveries are parked once they have waited this
/// long (see `walk_due_head`).
const PARK_AFTER_MS: Millis = 1_000;
/// Rows one claim sets aside at most (parks or holds); the next claims go
/// on from there, so that no claim holds the writer for a whole stuck
/// backlog. Rows of a full endpoint too young to park are passed without
/// counting: there are at most a second's worth of them, and stopping at
/// them would leave the claimable rows behind them waiting (the fairness
/// bench's healthy p99 went from 1.5× to 10–14× with them counted).
const PASSED_PER_CLAIM: usize = 2_000;

/// Jobs per transaction at most; the rest wait for the next one.
const MAX_JOBS_PER_COMMIT: usize = 512;
const READERS: usize = 4;

type Finish = Box<dyn FnOnce(&StoreResult<()>) + Send>;
type Job = Box<dyn FnOnce(&Connection) -> Finish + Send>;

enum Command {
    Run(Job),
    /// Finish what is queued before this, then stop.
    Stop,
}

pub struct SqliteStore {
    jobs: mpsc::Sender<Command>,
    readers: Arc<Mutex<Vec<Connection>>>,
    path: PathBuf,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
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

fn map_err(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode;
    match &e {
        rusqlite::Error::SqliteFailure(f, msg) => match f.code {
            ErrorCode::ConstraintViolation
                if matches!(
                    f.extended_code,
                    rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                        | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                ) =>
            {
                StoreError::Conflict(msg.clone().unwrap_or_else(|| e.to_string()))
            }
            ErrorCode::ConstraintViolation
                if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY =>
            {
                StoreError::ParentGone(e.to_string())
            }
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::CannotOpen => StoreError::Unavailable(e.to_string()),
            _ => StoreError::Internal(e.to_string()),
        },
        _ => StoreError::Internal(e.to_string()),
    }
}

/// Page cache per connection, in KiB (SQLite's default is 2,000).
const CACHE_KIB: i64 = 32 * 1024;

fn open_connection(path: &std::path::Path, read_only: bool) -> StoreResult<Connection> {
    let flags = if read_only {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags)
        .map_err(|e| StoreError::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    conn.busy_timeout(Duration::from_secs(10))
        .map_err(map_err)?;
    conn.set_prepared_statement_cache_capacity(64);
    if !read_only {
        // WAL: readers never block the writer. FULL: a commit is fsynced.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(map_err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(map_err)?;
        conn.pragma_update(None, "wal_autocheckpoint", 4000)
            .map_err(map_err)?;
    }
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(map_err)?;
    // Each writer job runs in a savepoint, whose sub-journal would
    // otherwise spill to a temporary file (a write per page touched).
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(map_err)?;
    // A group commit touches more than the default 2 MiB of pages; a
    // smaller cache spills dirty pages into the WAL mid-transaction.
    conn.pragma_update(None, "cache_size", -CACHE_KIB)
        .map_err(map_err)?;
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> StoreResult<()> {
    let applied: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(map_err)?;
    let applied = usize::try_from(applied).unwrap_or(0);
    if applied > MIGRATIONS.len() {
        return Err(StoreError::Internal(format!(
            "database schema version {applied} is newer than this Herald ({}); upgrade Herald",
            MIGRATIONS.len()
        )));
    }
    let tx = conn.transaction().map_err(map_err)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied) {
        tx.execute_batch(sql)
            .map_err(|e| StoreError::Internal(format!("migration {} failed: {e}", i + 1)))?;
        tx.pragma_update(None, "user_version", i + 1)
            .map_err(map_err)?;
    }
    tx.commit().map_err(map_err)
}

/// The writer thread: gathers queued jobs, runs them in one transaction
/// (a savepoint each), commits, then lets each job answer.
fn writer_loop(conn: Connection, mut jobs: mpsc::Receiver<Command>) {
    let mut batch: Vec<Job> = Vec::with_capacity(MAX_JOBS_PER_COMMIT);
    let mut stopping = false;
    while !stopping {
        match jobs.blocking_recv() {
            Some(Command::Run(job)) => batch.push(job),
            Some(Command::Stop) | None => break,
        }
        while batch.len() < MAX_JOBS_PER_COMMIT {
            match jobs.try_recv() {
                Ok(Command::Run(job)) => batch.push(job),
                Ok(Command::Stop) => {
                    stopping = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let begun = conn.execute_batch("BEGIN IMMEDIATE").map_err(map_err);
        let mut finishes = Vec::with_capacity(batch.len());
        if begun.is_ok() {
            for job in batch.drain(..) {
                finishes.push(job(&conn));
            }
        }
        let outcome = begun.and_then(|()| conn.execute_batch("COMMIT").map_err(map_err));
        if outcome.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        for finish in finishes {
            finish(&outcome);
        }
        // Jobs never run (BEGIN failed) are dropped: their callers see the
        // reply channel close and report the store unavailable.
        batch.clear();
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies migrations.
    pub async fn open(url: &str) -> StoreResult<Self> {
        let path = sqlite_path(url)
            .ok_or_else(|| StoreError::Internal(format!("not a sqlite URL: {url}")))?;
        let opened = tokio::task::spawn_blocking(
            move || -> StoreResult<(Connection, Vec<Connection>, PathBuf)> {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
                let mut writer = open_connection(&path, false)?;
                migrate(&mut writer)?;
                let readers = (0..READERS)
                    .map(|_| open_connection(&path, true))
                    .collect::<StoreResult<Vec<_>>>()?;
                Ok((writer, readers, path))
            },
        )
        .await
        .map_err(|e| StoreError::Internal(format!("open task failed: {e}")))??;
        let (writer, readers, path) = opened;
        let (tx, rx) = mpsc::channel(4 * MAX_JOBS_PER_COMMIT);
        let handle = std::thread::Builder::new()
            .name("herald-sqlite-writer".into())
            .spawn(move || writer_loop(writer, rx))
            .map_err(|e| StoreError::Internal(format!("cannot start writer thread: {e}")))?;
        Ok(SqliteStore {
            jobs: tx,
            readers: Arc::new(Mutex::new(readers)),
            path,
            writer: Mutex::new(Some(handle)),
        })
    }

    /// Lets the writer finish the jobs already queued, then stops it and
    /// waits for it. Later writes fail with `Unavailable`.
    pub async fn close(&self) {
        let _ = self.jobs.send(Command::Stop).await;
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }

    /// Runs `f` on the writer, in the shared transaction, in a savepoint.
    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel::<StoreResult<T>>();
        let job: Job = Box::new(move |conn: &Connection| -> Finish {
            let result = match conn.execute_batch("SAVEPOINT job") {
                Ok(()) => {
                    let r = f(conn);
                    let end = if r.is_ok() {
                        "RELEASE job"
                    } else {
                        "ROLLBACK TO job; RELEASE job"
                    };
                    match (r, conn.execute_batch(end).map_err(map_err)) {
                        (Ok(v), Ok(())) => Ok(v),
                        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
                    }
                }
                Err(e) => Err(map_err(e)),
            };
            Box::new(move |committed: &StoreResult<()>| {
                let _ = reply.send(match committed {
                    Ok(()) => result,
                    Err(e) => Err(e.clone()),
                });
            })
        });
        self.jobs
            .send(Command::Run(job))
            .await
            .map_err(|_| StoreError::Unavailable("store is closed".into()))?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("store transaction did not run".into()))?
    }

    /// Runs `f` on a read-only connection, off the async threads.
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let pool = self.readers.clone();
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || {
            let taken = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let conn = match taken {
                Some(c) => c,
                None => open_connection(&path, true)?,
            };
            let result = f(&conn);
            let mut idle = pool.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < READERS {
                idle.push(conn);
            }
            result
        })
        .await
        .map_err(|e| StoreError::Internal(format!("read task failed: {e}")))?
    }
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

/// Reads a row into `T`, keeping rusqlite's and our errors apart.
fn rows<T>(
    stmt: &mut rusqlite::Statement<'_>,
    params: impl rusqlite::Params,
    map: fn(&Row<'_>) -> StoreResult<T>,
) -> StoreResult<Vec<T>> {
    let mut out = Vec::new();
    let mut rs = stmt.query(params).map_err(map_err)?;
    while let Some(row) = rs.next().map_err(map_err)? {
        out.push(map(row)?);
    }
    Ok(out)
}

fn get<T: rusqlite::types::FromSql>(r: &Row<'_>, col: &str) -> StoreResult<T> {
    r.get(col).map_err(map_err)
}

fn app_from_row(r: &Row<'_>) -> StoreResult<App> {
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

fn endpoint_from_row(r: &Row<'_>) -> StoreResult<Endpoint> {
    let filter: Option<String> = get(r, "filter_types")?;
    Ok(Endpoint {
        id: EndpointId::from_trusted(get(r, "id")?),
        app_id: AppId::from_trusted(get(r, "app_id")?),
        uid: get(r, "uid")?,
        url: get(r, "url")?,
        description: get(r, "description")?,
        filter_types: filter.as_deref().map(from_json).transpose()?,
        disabled: get::<i64>(r, "disabled")? != 0,
        rate_limit: u16_opt(get(r, "rate_limit")?),
        metadata: from_json(&get::<String>(r, "metadata")?)?,
        channels: json_opt(get(r, "channels")?)?,
        headers: from_json(&get::<String>(r, "headers")?)?,
        secret: get(r, "secret")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
    })
}

fn json_opt<T: serde::de::DeserializeOwned>(text: Option<String>) -> StoreResult<Option<T>> {
    text.as_deref().map(from_json).transpose()
}

fn message_from_row(r: &Row<'_>) -> StoreResult<Message> {
    Ok(Message {
        id: MsgId::from_trusted(get(r, "id")?),
        app_id: AppId::from_trusted(get(r, "app_id")?),
        event_type: get(r, "event_type")?,
        event_id: get(r, "event_id")?,
        payload: get(r, "payload")?,
        channels: json_opt(get(r, "channels")?)?,
        created_at: get(r, "created_at")?,
    })
}

const DELIVERY_COLUMNS: &str =
    "d.id, d.msg_id, d.app_id, d.endpoint_id, m.event_type, d.state, d.attempts, \
     d.next_attempt_at, d.dead_reason, d.last_status, d.last_error, d.created_at, d.updated_at";

fn delivery_from_row(r: &Row<'_>) -> StoreResult<Delivery> {
    let state: i64 = get(r, "state")?;
    let reason: Option<String> = get(r, "dead_reason")?;
    Ok(Delivery {
        id: DeliveryId::from_trusted(get(r, "id")?),
        msg_id: MsgId::from_trusted(get(r, "msg_id")?),
        app_id: AppId::from_trusted(get(r, "app_id")?),
        endpoint_id: EndpointId::from_trusted(get(r, "endpoint_id")?),
        event_type: get(r, "event_type")?,
        state: DeliveryState::from_i64(state)
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

fn attempt_from_row(r: &Row<'_>) -> StoreResult<AttemptRecord> {
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
        success: get::<i64>(r, "success")? != 0,
        manual: get::<i64>(r, "manual")? != 0,
    })
}

/// A keyset page over `column` (ids sort by creation time). `sql` ends in
/// an open WHERE clause; `args` are its parameters.
fn page_of<T>(
    conn: &Connection,
    sql: &str,
    column: &str,
    mut args: Vec<Value>,
    page: &PageReq,
    map: fn(&Row<'_>) -> StoreResult<T>,
) -> StoreResult<Page<T>> {
    let mut sql = sql.to_owned();
    let up = page.walks_ascending();
    if let Some(after) = &page.after {
        sql.push_str(&format!(" AND {column} {} ?", if up { ">" } else { "<" }));
        args.push(after.clone().into());
    }
    sql.push_str(&format!(
        " ORDER BY {column} {} LIMIT {}",
        if up { "ASC" } else { "DESC" },
        page.limit.saturating_add(1)
    ));
    let mut stmt = conn.prepare_cached(&sql).map_err(map_err)?;
    let mut items = rows(&mut stmt, rusqlite::params_from_iter(args), map)?;
    let has_more = items.len() > page.limit;
    items.truncate(page.limit);
    if page.backwards {
        items.reverse();
    }
    Ok(Page { items, has_more })
}

fn insert_messages_tx(
    conn: &Connection,
    batch: &[NewMessage],
    mut claim: Option<IngestClaim>,
) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
    let mut insert_msg = conn
        .prepare_cached(
            "INSERT INTO messages (id, app_id, event_type, event_id, payload, created_at, channels) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT DO NOTHING",
        )
        .map_err(map_err)?;
    let mut endpoints_q = conn
        .prepare_cached(
            "SELECT id, filter_types, channels, disabled, url, secret, old_secrets, headers \
             FROM endpoints WHERE app_id = ?1 AND (disabled = 0 OR disabled_by = 'auto')",
        )
        .map_err(map_err)?;
    // A delivery claimed at ingest is born `delivering` under a lease, just
    // as `claim_tx` would leave it; the others are born pending.
    let mut insert_delivery = conn
        .prepare_cached(
            "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, lease_token, \
             cycle_started_at, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8)",
        )
        .map_err(map_err)?;
    let mut app_exists = conn
        .prepare_cached("SELECT 1 FROM applications WHERE id = ?1")
        .map_err(map_err)?;
    let mut claimed = Vec::new();
    let mut apps_known: HashMap<&str, bool> = HashMap::new();
    let mut endpoints_of: HashMap<String, Vec<FanoutTarget>> = HashMap::new();
    let mut outcomes = Vec::with_capacity(batch.len());
    for m in batch {
        // An app deleted after the API looked it up: refuse that message
        // alone rather than fail the batch on the foreign key.
        let known = match apps_known.get(m.app_id.as_str()) {
            Some(k) => *k,
            None => {
                let k = app_exists
                    .exists(params![m.app_id.as_str()])
                    .map_err(map_err)?;
                apps_known.insert(m.app_id.as_str(), k);
                k
            }
        };
        if !known {
            outcomes.push(InsertOutcome::NoSuchApp);
            continue;
        }
        let inserted = insert_msg
            .execute(params![
                m.id.as_str(),
                m.app_id.as_str(),
                m.event_type,
                m.event_id,
                m.payload,
                m.created_at,
                m.channels.as_ref().map(to_json).transpose()?
            ])
            .map_err(map_err)?;
        if inserted == 0 {
            outcomes.push(InsertOutcome::DuplicateEventId);
            continue;
        }
        if !endpoints_of.contains_key(m.app_id.as_str()) {
            let mut eps = Vec::new();
            let mut rs = endpoints_q
                .query(params![m.app_id.as_str()])
                .map_err(map_err)?;
            while let Some(r) = rs.next().map_err(map_err)? {
                eps.push(FanoutTarget::from_row(
                    get(r, "id")?,
                    get::<Option<String>>(r, "filter_types")?.as_deref(),
                    get::<Option<String>>(r, "channels")?.as_deref(),
                    get::<i64>(r, "disabled")? == 0,
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
                )?);
            }
            endpoints_of.insert(m.app_id.as_str().to_owned(), eps);
        }
        let deliveries = fan_out(&endpoints_of, m, &mut claim);
        let fanned = deliveries.len();
        for d in deliveries {
            insert_delivery
                .execute(params![
                    d.id.as_str(),
                    m.id.as_str(),
                    d.endpoint_id,
                    m.app_id.as_str(),
                    d.state as i64,
                    d.due,
                    d.lease_token(),
                    m.created_at
                ])
                .map_err(map_err)?;
            claimed.extend(d.claimed);
        }
        outcomes.push(InsertOutcome::Inserted { deliveries: fanned });
    }
    Ok((outcomes, claimed))
}

fn claim_tx(
    conn: &Connection,
    now: Millis,
    lease_until: Millis,
    limit: usize,
    in_flight: &HashMap<EndpointId, usize>,
    endpoint_cap: usize,
) -> StoreResult<Vec<ClaimedDelivery>> {
    let saturated: HashSet<&str> = saturated(in_flight, endpoint_cap).into_iter().collect();
    unpark(conn, in_flight, endpoint_cap)?;
    let mut room = Room::new(limit, in_flight, endpoint_cap);
    let head = walk_due_head(conn, now, claim_window(limit), &mut room, &saturated)?;
    set_aside(conn, &head)?;
    let picked = head.picked;
    if picked.is_empty() {
        return Ok(Vec::new());
    }
    let token = ulid::Ulid::new().to_string();
    let mut take = conn
        .prepare_cached(
            "UPDATE deliveries SET state = 1, next_attempt_at = ?1, lease_token = ?2, updated_at = ?3 \
             WHERE id = ?4 \
             RETURNING id, msg_id, app_id, endpoint_id, attempts, cycle_started_at, cycle_base, manual",
        )
        .map_err(map_err)?;
    let mut details = conn
        .prepare_cached(
            "SELECT m.event_type, m.payload, e.url, e.secret, e.old_secrets, e.headers FROM messages m, endpoints e \
             WHERE m.id = ?1 AND e.id = ?2",
        )
        .map_err(map_err)?;
    let mut out = Vec::with_capacity(picked.len());
    for id in &picked {
        let claimed = take
            .query_row(params![lease_until, token, now, id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, i64>(7)?,
                ))
            })
            .map_err(map_err)?;
        let (id, msg_id, app_id, endpoint_id, attempts, cycle_started_at, cycle_base, manual) =
            claimed;
        let (event_type, payload, url, secret, old_secrets, headers) = details
            .query_row(params![msg_id, endpoint_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, String>(5)?,
                ))
            })
            .map_err(map_err)?;
        out.push(ClaimedDelivery {
            id: DeliveryId::from_trusted(id),
            lease_token: token.clone(),
            msg_id: MsgId::from_trusted(msg_id),
            app_id: AppId::from_trusted(app_id),
            endpoint_id: EndpointId::from_trusted(endpoint_id),
            url,
            secret,
            old_secrets: valid_old_secrets(&old_secrets, now)?,
            headers: headers_of(&headers)?,
            event_type,
            payload,
            attempts: u32_of(attempts),
            cycle_started_at,
            cycle_base: u32_of(cycle_base),
            manual: manual != 0,
        });
    }
    Ok(out)
}

/// What one walk of the claim index's due head found.
#[derive(Debug, Default)]
struct DueHead {
    /// Claimable and within the claim's room: the claim takes these.
    picked: Vec<String>,
    /// (delivery, endpoint): of full endpoints and due for over
    /// `PARK_AFTER_MS`, to park.
    park: Vec<(String, String)>,
    /// Pending, of disabled endpoints: to hold.
    hold: Vec<String>,
}

/// Walks the due head of `deliveries_due`, oldest first, once: picks the
/// claim's deliveries (at most `room` allows, from the first `window`
/// claimable rows) and notes on the way the rows every claim would
/// otherwise pass over again: a disabled endpoint's (to hold) and a full
/// endpoint's that have waited `PARK_AFTER_MS` (to park). It stops there,
/// or after setting aside `PASSED_PER_CLAIM` rows of full or disabled endpoints,
/// so a claim reads what it takes and what it sets aside, whatever lies
/// behind: a backlog of claimable rows costs it nothing.
fn walk_due_head(
    conn: &Connection,
    now: Millis,
    window: usize,
    room: &mut Room,
    saturated: &HashSet<&str>,
) -> StoreResult<DueHead> {
    // INDEXED BY: the walk is in due order, and must not become a scan of
    // an endpoint's whole history. `off` is a probe of the (small) index of
    // disabled endpoints per row read, not a list built per claim.
    let mut due = conn
        .prepare_cached(
            "SELECT id, endpoint_id, state, next_attempt_at, \
                    EXISTS (SELECT 1 FROM endpoints INDEXED BY endpoints_disabled \
                             WHERE id = d.endpoint_id AND disabled = 1) AS off \
             FROM deliveries d INDEXED BY deliveries_due \
             WHERE state < 2 AND parked = 0 AND next_attempt_at <= ?1 \
             ORDER BY next_attempt_at",
        )
        .map_err(map_err)?;
    // Only rows that have waited a while are parked: a busy but healthy
    // endpoint's rows are claimed within milliseconds and never pay for it.
    let overdue = now.saturating_sub(PARK_AFTER_MS);
    let mut head = DueHead::default();
    let (mut claimable, mut passed) = (0, 0);
    let mut rs = due.query(params![now]).map_err(map_err)?;
    while let Some(r) = rs.next().map_err(map_err)? {
        let id: String = get(r, "id")?;
        let endpoint: String = get(r, "endpoint_id")?;
        // (A delivering row here is a lease that expired: claimable, but
        // neither parked nor held.)
        let pending = get::<i64>(r, "state")? == 0;
        if get::<i64>(r, "off")? != 0 {
            if pending {
                head.hold.push(id);
                passed += 1;
            }
        } else if saturated.contains(endpoint.as_str()) {
            if pending && get::<Millis>(r, "next_attempt_at")? <= overdue {
                head.park.push((id, endpoint));
                passed += 1;
            }
        } else {
            claimable += 1;
            if room.take(&endpoint) {
                head.picked.push(id);
            }
            if room.is_full() || claimable >= window {
                break;
            }
        }
        if passed >= PASSED_PER_CLAIM {
            break;
        }
    }
    Ok(head)
}

/// Takes what a walk found to park or hold out of the claim index.
fn set_aside(conn: &Connection, head: &DueHead) -> StoreResult<()> {
    if head.park.is_empty() && head.hold.is_empty() {
        return Ok(());
    }
    let mut set = conn
        .prepare_cached("UPDATE deliveries SET parked = ?1 WHERE id = ?2")
        .map_err(map_err)?;
    for id in &head.hold {
        set.execute(params![2, id]).map_err(map_err)?;
    }
    let mut remember = conn
        .prepare_cached(
            "INSERT INTO parked_endpoints (endpoint_id) VALUES (?1) ON CONFLICT DO NOTHING",
        )
        .map_err(map_err)?;
    let mut noted = HashSet::new();
    for (id, endpoint) in &head.park {
        set.execute(params![1, id]).map_err(map_err)?;
        if noted.insert(endpoint.as_str()) {
            remember.execute(params![endpoint]).map_err(map_err)?;
        }
    }
    Ok(())
}

/// Gives endpoints with room (and enabled) back as many of their parked
/// deliveries as they can take, oldest first; an endpoint with none left
/// is forgotten. Each row is parked and unparked at most once per wait.
fn unpark(
    conn: &Connection,
    in_flight: &HashMap<EndpointId, usize>,
    endpoint_cap: usize,
) -> StoreResult<()> {
    let parked: Vec<String> = {
        let mut stmt = conn
            .prepare_cached("SELECT endpoint_id FROM parked_endpoints")
            .map_err(map_err)?;
        let ids = stmt.query_map([], |r| r.get(0)).map_err(map_err)?;
        ids.collect::<Result<_, _>>().map_err(map_err)?
    };
    let mut disabled = conn
        .prepare_cached("SELECT 1 FROM endpoints WHERE id = ?1 AND disabled = 1")
        .map_err(map_err)?;
    let mut unpark = conn
        .prepare_cached(
            "UPDATE deliveries SET parked = 0 WHERE id IN \
             (SELECT id FROM deliveries WHERE endpoint_id = ?1 AND parked = 1 ORDER BY next_attempt_at LIMIT ?2)",
        )
        .map_err(map_err)?;
    let mut forget = conn
        .prepare_cached("DELETE FROM parked_endpoints WHERE endpoint_id = ?1")
        .map_err(map_err)?;
    for ep in parked {
        let busy = in_flight
            .get(&EndpointId::from_trusted(ep.clone()))
            .copied()
            .unwrap_or(0);
        let room = endpoint_cap.saturating_sub(busy);
        // A disabled endpoint's deliveries wait for it to be enabled.
        if room == 0 || disabled.exists(params![ep]).map_err(map_err)? {
            continue;
        }
        let moved = unpark
            .execute(params![ep, i64::try_from(room).unwrap_or(i64::MAX)])
            .map_err(map_err)?;
        if moved < room {
            forget.execute(params![ep]).map_err(map_err)?;
        }
    }
    Ok(())
}

/// Lets an enabled endpoint's held deliveries back into the claim index.
fn unhold(conn: &Connection, endpoint_id: &str) -> StoreResult<()> {
    conn.prepare_cached(
        "UPDATE deliveries INDEXED BY deliveries_held SET parked = 0 \
         WHERE endpoint_id = ?1 AND parked = 2",
    )
    .map_err(map_err)?
    .execute(params![endpoint_id])
    .map_err(map_err)?;
    Ok(())
}

fn complete_tx(conn: &Connection, batch: &[Completion]) -> StoreResult<Completed> {
    let mut insert = conn
        .prepare_cached(
            "INSERT INTO attempts (id, delivery_id, msg_id, endpoint_id, app_id, url, attempt_number, started_at, \
             duration_ms, status_code, response, error, success, manual) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        )
        .map_err(map_err)?;
    // The lease token guard leaves a re-claimed delivery to its new holder.
    let mut update = conn
        .prepare_cached(
            "UPDATE deliveries SET state = ?1, attempts = ?2, next_attempt_at = ?3, lease_token = NULL, manual = 0, \
             dead_reason = ?4, last_status = ?5, last_error = ?6, updated_at = ?7 \
             WHERE id = ?8 AND lease_token = ?9",
        )
        .map_err(map_err)?;
    let mut moved = Vec::with_capacity(batch.len());
    for c in batch {
        let a = &c.attempt;
        insert
            .execute(params![
                a.id.as_str(),
                a.delivery_id.as_str(),
                a.msg_id.as_str(),
                a.endpoint_id.as_str(),
                a.app_id.as_str(),
                a.url,
                i64::from(a.attempt_number),
                a.started_at,
                a.duration_ms,
                a.status_code.map(i64::from),
                a.response,
                a.error,
                i64::from(a.success),
                i64::from(a.manual),
            ])
            .map_err(map_err)?;
        let (state, next_at, reason) = match c.next {
            NextState::Delivered => (DeliveryState::Delivered, c.now, None),
            NextState::Retry { at } => (DeliveryState::Pending, at, None),
            NextState::Dead(r) => (DeliveryState::Dead, c.now, Some(r.as_str())),
        };
        let changed = update
            .execute(params![
                state as i64,
                i64::from(a.attempt_number),
                next_at,
                reason,
                a.status_code.map(i64::from),
                a.error,
                c.now,
                a.delivery_id.as_str(),
                c.lease_token,
            ])
            .map_err(map_err)?;
        moved.push(changed == 1);
    }
    let streaks = record_endpoint_health(conn, batch)?;
    Ok(Completed { moved, streaks })
}

/// Moves each endpoint's failing streak on and adds the batch to its stats
/// buckets: one write per endpoint and per bucket, whatever the batch size.
fn record_endpoint_health(
    conn: &Connection,
    batch: &[Completion],
) -> StoreResult<Vec<StreakUpdate>> {
    let mut streak = conn
        .prepare_cached(
            "UPDATE endpoints SET \
               fail_streak = CASE WHEN ?1 THEN ?2 ELSE fail_streak + ?2 END, \
               streak_started_at = CASE WHEN ?1 THEN ?3 ELSE COALESCE(streak_started_at, ?3) END, \
               last_success_at = CASE WHEN ?1 THEN MAX(COALESCE(last_success_at, 0), ?4) ELSE last_success_at END, \
               last_error = COALESCE(?5, last_error), last_error_at = COALESCE(?6, last_error_at) \
             WHERE id = ?7 RETURNING fail_streak, streak_started_at, disabled",
        )
        .map_err(map_err)?;
    let mut out = Vec::new();
    for e in fold_endpoint_batches(batch) {
        let (error, error_at) = match &e.last_error {
            Some((text, at)) => (Some(text.as_str()), Some(*at)),
            None => (None, None),
        };
        let row = streak
            .query_row(
                params![
                    e.reset,
                    i64::from(e.failures),
                    e.first_failure_at,
                    e.last_success_at,
                    error,
                    error_at,
                    e.endpoint_id.as_str()
                ],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, Option<i64>>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                },
            )
            .optional()
            .map_err(map_err)?;
        // (None: the endpoint was deleted while its attempt was in flight.)
        if let Some((fail_streak, started, disabled)) = row {
            if e.failures > 0 {
                out.push(StreakUpdate {
                    endpoint_id: e.endpoint_id,
                    app_id: e.app_id,
                    fail_streak: u32_of(fail_streak),
                    streak_started_at: started,
                    disabled: disabled != 0,
                });
            }
        }
    }
    let mut add = conn
        .prepare_cached(
            "INSERT INTO endpoint_stats (endpoint_id, bucket, attempts, successes, failures, latency_sum, \
               h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18) \
             ON CONFLICT (endpoint_id, bucket) DO UPDATE SET \
               attempts = attempts + excluded.attempts, successes = successes + excluded.successes, \
               failures = failures + excluded.failures, latency_sum = latency_sum + excluded.latency_sum, \
               h0 = h0 + excluded.h0, h1 = h1 + excluded.h1, h2 = h2 + excluded.h2, h3 = h3 + excluded.h3, \
               h4 = h4 + excluded.h4, h5 = h5 + excluded.h5, h6 = h6 + excluded.h6, h7 = h7 + excluded.h7, \
               h8 = h8 + excluded.h8, h9 = h9 + excluded.h9, h10 = h10 + excluded.h10, h11 = h11 + excluded.h11",
        )
        .map_err(map_err)?;
    for (ep, b) in fold_stats(batch) {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut values: Vec<Value> = vec![
            ep.as_str().to_owned().into(),
            b.bucket.into(),
            n(b.attempts).into(),
            n(b.successes).into(),
            n(b.failures).into(),
            n(b.latency_sum_ms).into(),
        ];
        values.extend(b.histogram.iter().map(|h| Value::from(n(*h))));
        add.execute(rusqlite::params_from_iter(values))
            .map_err(map_err)?;
    }
    Ok(out)
}

/// The dead-letter filter as SQL over `deliveries d JOIN messages m`, with
/// its arguments.
fn dead_filter_sql(filter: &DeadFilter) -> (String, Vec<Value>) {
    let mut sql = String::from("d.state = 3");
    let mut args: Vec<Value> = Vec::new();
    if let Some(app) = &filter.app {
        sql.push_str(" AND d.app_id = ?");
        args.push(app.as_str().to_owned().into());
    }
    if let Some(ep) = &filter.endpoint {
        sql.push_str(" AND d.endpoint_id = ?");
        args.push(ep.as_str().to_owned().into());
    }
    if let Some(t) = &filter.event_type {
        sql.push_str(" AND m.event_type = ?");
        args.push(t.clone().into());
    }
    if let Some(r) = filter.reason {
        sql.push_str(" AND d.dead_reason = ?");
        args.push(r.as_str().to_owned().into());
    }
    if let Some(since) = filter.since {
        sql.push_str(" AND d.updated_at >= ?");
        args.push(since.into());
    }
    if let Some(until) = filter.until {
        sql.push_str(" AND d.updated_at < ?");
        args.push(until.into());
    }
    if let Some(since) = filter.created_since {
        sql.push_str(" AND d.created_at >= ?");
        args.push(since.into());
    }
    if let Some(until) = filter.created_until {
        sql.push_str(" AND d.created_at < ?");
        args.push(until.into());
    }
    (sql, args)
}

fn event_type_from_row(r: &Row<'_>) -> StoreResult<EventType> {
    Ok(EventType {
        name: get(r, "name")?,
        description: get(r, "description")?,
        archived: get::<i64>(r, "archived")? != 0,
        deprecated: get::<i64>(r, "deprecated")? != 0,
        schemas: get(r, "schemas")?,
        feature_flag: get(r, "feature_flag")?,
        group_name: get(r, "group_name")?,
        created_at: get(r, "created_at")?,
        updated_at: get(r, "updated_at")?,
    })
}

fn token_from_row(r: &Row<'_>) -> StoreResult<ApiToken> {
    Ok(ApiToken {
        id: get(r, "id")?,
        app_id: AppId::from_trusted(get(r, "app_id")?),
        name: get(r, "name")?,
        created_at: get(r, "created_at")?,
    })
}

fn status_from_row(r: &Row<'_>) -> StoreResult<EndpointStatus> {
    let by: Option<String> = get(r, "disabled_by")?;
    Ok(EndpointStatus {
        fail_streak: u32_of(get(r, "fail_streak")?),
        streak_started_at: get(r, "streak_started_at")?,
        last_success_at: get(r, "last_success_at")?,
        last_error: get(r, "last_error")?,
        last_error_at: get(r, "last_error_at")?,
        disabled: get::<i64>(r, "disabled")? != 0,
        disabled_reason: get(r, "disabled_reason")?,
        disabled_at: get(r, "disabled_at")?,
        auto_disabled: by.as_deref() == Some("auto"),
    })
}

fn stats_from_row(r: &Row<'_>) -> StoreResult<StatsBucket> {
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

/// One batch of retention (see `Retention::prune`), in the writer's
/// transaction. Dead deliveries go first, so a message whose only
/// unfinished delivery was one of them can go in the same call.
fn prune_tx(
    conn: &Connection,
    finished_before: Millis,
    dead_before: Millis,
    batch: usize,
) -> StoreResult<PruneReport> {
    let limit = i64::try_from(batch).unwrap_or(i64::MAX);
    let mut dead = Vec::new();
    {
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, msg_id FROM deliveries WHERE state = 3 AND updated_at < ?1 \
                 ORDER BY updated_at LIMIT ?2",
            )
            .map_err(map_err)?;
        let mut rs = stmt.query(params![dead_before, limit]).map_err(map_err)?;
        while let Some(r) = rs.next().map_err(map_err)? {
            dead.push((get::<String>(r, "id")?, get::<String>(r, "msg_id")?));
        }
    }
    let mut delete_attempts_of_delivery = conn
        .prepare_cached("DELETE FROM attempts WHERE msg_id = ?1 AND delivery_id = ?2")
        .map_err(map_err)?;
    let mut delete_delivery = conn
        .prepare_cached("DELETE FROM deliveries WHERE id = ?1")
        .map_err(map_err)?;
    // Attempts are history without a foreign key: a message's go with it,
    // including those of endpoints deleted since.
    let mut delete_attempts_of_message = conn
        .prepare_cached("DELETE FROM attempts WHERE msg_id = ?1")
        .map_err(map_err)?;
    let mut delete_orphan = conn
        .prepare_cached(
            "DELETE FROM messages WHERE id = ?1 AND created_at < ?2 \
               AND NOT EXISTS (SELECT 1 FROM deliveries WHERE msg_id = ?1)",
        )
        .map_err(map_err)?;
    let mut messages: usize = 0;
    for (id, msg) in &dead {
        delete_attempts_of_delivery
            .execute(params![msg, id])
            .map_err(map_err)?;
        delete_delivery.execute(params![id]).map_err(map_err)?;
    }
    let mut dead_msgs: Vec<&String> = dead.iter().map(|(_, m)| m).collect();
    dead_msgs.sort_unstable();
    dead_msgs.dedup();
    for msg in dead_msgs {
        if delete_orphan
            .execute(params![msg, finished_before])
            .map_err(map_err)?
            == 1
        {
            delete_attempts_of_message
                .execute(params![msg])
                .map_err(map_err)?;
            messages += 1;
        }
    }

    // Old messages whose deliveries are all delivered (or that have none),
    // oldest first, within what is left of the batch.
    let budget = batch.saturating_sub(messages);
    let mut finished = Vec::new();
    if budget > 0 {
        let mut stmt = conn
            .prepare_cached(
                "SELECT id FROM messages m WHERE created_at < ?1 \
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.msg_id = m.id AND d.state <> 2) \
                 ORDER BY created_at LIMIT ?2",
            )
            .map_err(map_err)?;
        let mut rs = stmt
            .query(params![
                finished_before,
                i64::try_from(budget).unwrap_or(i64::MAX)
            ])
            .map_err(map_err)?;
        while let Some(r) = rs.next().map_err(map_err)? {
            finished.push(get::<String>(r, "id")?);
        }
    }
    let mut delete_deliveries_of_message = conn
        .prepare_cached("DELETE FROM deliveries WHERE msg_id = ?1")
        .map_err(map_err)?;
    let mut delete_message = conn
        .prepare_cached("DELETE FROM messages WHERE id = ?1")
        .map_err(map_err)?;
    for msg in &finished {
        delete_attempts_of_message
            .execute(params![msg])
            .map_err(map_err)?;
        delete_deliveries_of_message
            .execute(params![msg])
            .map_err(map_err)?;
        delete_message.execute(params![msg]).map_err(map_err)?;
    }
    messages += finished.len();
    Ok(PruneReport {
        messages: u64::try_from(messages).unwrap_or(u64::MAX),
        dead_deliveries: u64::try_from(dead.len()).unwrap_or(u64::MAX),
        // (No budget left means the dead batch was full.)
        more: dead.len() >= batch || (budget > 0 && finished.len() >= budget),
    })
}

const REPLAY_SET: &str =
    "state = 0, next_attempt_at = ?1, cycle_started_at = ?1, cycle_base = attempts, \
     manual = 1, lease_token = NULL, dead_reason = NULL, parked = 0, updated_at = ?1";

#[async_trait]
impl Settings for SqliteStore {
    async fn get_setting(&self, key: &str) -> StoreResult<Option<String>> {
        let key = key.to_owned();
        self.read(move |c| {
            c.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .optional()
            .map_err(map_err)
        })
        .await
    }

    async fn init_setting(&self, key: &str, value: &str) -> StoreResult<String> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.write(move |c| {
            c.execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                params![key, value],
            )
            .map_err(map_err)?;
            c.query_row(
                "SELECT value FROM settings WHERE key = ?1",
                params![key],
                |r| r.get(0),
            )
            .map_err(map_err)
        })
        .await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.read(|c| c.query_row("SELECT 1", [], |_| Ok(())).map_err(map_err))
            .await
    }
}

#[async_trait]
impl Apps for SqliteStore {
    async fn create_app(&self, app: &App) -> StoreResult<()> {
        let app = app.clone();
        let metadata = to_json(&app.metadata)?;
        self.write(move |c| {
            c.execute(
                "INSERT INTO applications (id, uid, name, rate_limit, metadata, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![app.id.as_str(), app.uid, app.name, app.rate_limit, metadata, app.created_at, app.updated_at],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn update_app(&self, app: &App) -> StoreResult<bool> {
        let app = app.clone();
        let metadata = to_json(&app.metadata)?;
        self.write(move |c| {
            let n = c
                .execute(
                    "UPDATE applications SET uid = ?1, name = ?2, rate_limit = ?3, metadata = ?4, updated_at = ?5 \
                     WHERE id = ?6",
                    params![app.uid, app.name, app.rate_limit, metadata, app.updated_at, app.id.as_str()],
                )
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn delete_app(&self, id: &AppId) -> StoreResult<bool> {
        let id = id.as_str().to_owned();
        self.write(move |c| {
            // Attempts are history without a foreign key: they go first,
            // found through the messages (indexed); the rest cascades.
            c.execute(
                "DELETE FROM attempts WHERE msg_id IN (SELECT id FROM messages WHERE app_id = ?1)",
                params![id],
            )
            .map_err(map_err)?;
            c.execute(
                "DELETE FROM endpoint_stats WHERE endpoint_id IN (SELECT id FROM endpoints WHERE app_id = ?1)",
                params![id],
            )
            .map_err(map_err)?;
            let n = c
                .execute("DELETE FROM applications WHERE id = ?1", params![id])
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn get_app(&self, id_or_uid: &str) -> StoreResult<Option<App>> {
        let key = id_or_uid.to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM applications WHERE id = ?1 OR uid = ?1 ORDER BY id = ?1 DESC LIMIT 1")
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![key], app_from_row)?.pop())
        })
        .await
    }

    async fn list_apps(&self, page: &PageReq) -> StoreResult<Page<App>> {
        let page = page.clone();
        self.read(move |c| {
            page_of(
                c,
                "SELECT * FROM applications WHERE 1 = 1",
                "id",
                vec![],
                &page,
                app_from_row,
            )
        })
        .await
    }
}

#[async_trait]
impl Endpoints for SqliteStore {
    async fn create_endpoint(&self, ep: &Endpoint) -> StoreResult<()> {
        let ep = ep.clone();
        let filter = ep.filter_types.as_ref().map(to_json).transpose()?;
        let metadata = to_json(&ep.metadata)?;
        let channels = ep.channels.as_ref().map(to_json).transpose()?;
        let headers = to_json(&ep.headers)?;
        self.write(move |c| {
            c.execute(
                "INSERT INTO endpoints (id, app_id, uid, url, description, filter_types, disabled, rate_limit, \
                 metadata, secret, created_at, updated_at, channels, headers) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
                params![
                    ep.id.as_str(),
                    ep.app_id.as_str(),
                    ep.uid,
                    ep.url,
                    ep.description,
                    filter,
                    i64::from(ep.disabled),
                    ep.rate_limit,
                    metadata,
                    ep.secret,
                    ep.created_at,
                    ep.updated_at,
                    channels,
                    headers
                ],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn get_endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>> {
        let (app, key) = (app.as_str().to_owned(), id_or_uid.to_owned());
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT * FROM endpoints WHERE app_id = ?1 AND (id = ?2 OR uid = ?2) ORDER BY id = ?2 DESC LIMIT 1",
                )
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![app, key], endpoint_from_row)?.pop())
        })
        .await
    }

    async fn list_endpoints(&self, app: &AppId, page: &PageReq) -> StoreResult<Page<Endpoint>> {
        let (app, page) = (app.as_str().to_owned(), page.clone());
        self.read(move |c| {
            page_of(
                c,
                "SELECT * FROM endpoints WHERE app_id = ?",
                "id",
                vec![app.into()],
                &page,
                endpoint_from_row,
            )
        })
        .await
    }

    async fn update_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        changes: &EndpointChanges,
        now: Millis,
    ) -> StoreResult<bool> {
        let (app, ep) = (app.as_str().to_owned(), ep.as_str().to_owned());
        let ch = changes.clone();
        let EndpointChangesJson {
            filter_types: filter,
            metadata,
            channels,
        } = changes.json_columns()?;
        self.write(move |c| {
            // Only the columns the caller set: a column it did not name may
            // have been changed since it read the endpoint.
            let n = c
                .prepare_cached(
                    "UPDATE endpoints SET uid = CASE WHEN ?1 THEN ?2 ELSE uid END, \
                     url = COALESCE(?3, url), description = COALESCE(?4, description), \
                     filter_types = CASE WHEN ?5 THEN ?6 ELSE filter_types END, \
                     rate_limit = CASE WHEN ?7 THEN ?8 ELSE rate_limit END, \
                     metadata = COALESCE(?9, metadata), \
                     channels = CASE WHEN ?10 THEN ?11 ELSE channels END, updated_at = ?12 \
                     WHERE id = ?13 AND app_id = ?14",
                )
                .map_err(map_err)?
                .execute(params![
                    ch.uid.is_some(),
                    ch.uid.flatten(),
                    ch.url,
                    ch.description,
                    filter.is_some(),
                    filter.flatten(),
                    ch.rate_limit.is_some(),
                    ch.rate_limit.flatten(),
                    metadata,
                    channels.is_some(),
                    channels.flatten(),
                    now,
                    ep,
                    app
                ])
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn set_endpoint_headers(
        &self,
        app: &AppId,
        ep: &EndpointId,
        headers: &BTreeMap<String, String>,
        now: Millis,
    ) -> StoreResult<bool> {
        let (app, ep) = (app.as_str().to_owned(), ep.as_str().to_owned());
        let headers = to_json(headers)?;
        self.write(move |c| {
            let n = c
                .execute(
                    "UPDATE endpoints SET headers = ?1, updated_at = ?2 WHERE id = ?3 AND app_id = ?4",
                    params![headers, now, ep, app],
                )
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<bool> {
        let (app, id) = (app.as_str().to_owned(), id.as_str().to_owned());
        // Deliveries go with it (ON DELETE CASCADE); attempts are history.
        self.write(move |c| {
            let n = c
                .execute(
                    "DELETE FROM endpoints WHERE id = ?1 AND app_id = ?2",
                    params![id, app],
                )
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn rotate_secret(
        &self,
        app: &AppId,
        ep: &EndpointId,
        new_secret: &str,
        grace_until: Millis,
        now: Millis,
    ) -> StoreResult<bool> {
        let (app, ep, new_secret) = (
            app.as_str().to_owned(),
            ep.as_str().to_owned(),
            new_secret.to_owned(),
        );
        self.write(move |c| {
            let current: Option<(String, String)> = c
                .query_row(
                    "SELECT secret, old_secrets FROM endpoints WHERE id = ?1 AND app_id = ?2",
                    params![ep, app],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(map_err)?;
            let Some((secret, old)) = current else {
                return Ok(false);
            };
            let old = rotated_old_secrets(&old, &secret, grace_until, now)?;
            c.execute(
                "UPDATE endpoints SET secret = ?1, old_secrets = ?2, updated_at = ?3 WHERE id = ?4",
                params![new_secret, old, now, ep],
            )
            .map_err(map_err)?;
            Ok(true)
        })
        .await
    }

    async fn endpoint_status(&self, ep: &EndpointId) -> StoreResult<Option<EndpointStatus>> {
        let ep = ep.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM endpoints WHERE id = ?1")
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![ep], status_from_row)?.pop())
        })
        .await
    }

    async fn disable_endpoint(
        &self,
        ep: &EndpointId,
        reason: &str,
        auto: bool,
        streak_started_at: Option<Millis>,
        now: Millis,
    ) -> StoreResult<bool> {
        let (ep, reason) = (ep.as_str().to_owned(), reason.to_owned());
        let by = if auto { "auto" } else { "operator" };
        self.write(move |c| {
            let n = c
                .execute(
                    "UPDATE endpoints SET disabled = 1, disabled_reason = ?1, disabled_by = ?2, \
                     disabled_at = ?3, updated_at = ?3 \
                     WHERE id = ?4 AND disabled = 0 AND (?5 IS NULL OR streak_started_at = ?5)",
                    params![reason, by, now, ep, streak_started_at],
                )
                .map_err(map_err)?;
            if n == 1 {
                // Its pending deliveries are held from now on, parked or
                // not: out of the claim index, and found by retention's age
                // cap. (Claims hold those made pending later.)
                c.execute(
                    "UPDATE deliveries SET parked = 2 WHERE endpoint_id = ?1 AND state = 0",
                    params![ep],
                )
                .map_err(map_err)?;
                c.execute(
                    "DELETE FROM parked_endpoints WHERE endpoint_id = ?1",
                    params![ep],
                )
                .map_err(map_err)?;
            }
            Ok(n == 1)
        })
        .await
    }

    async fn enable_endpoint(
        &self,
        app: &AppId,
        ep: &EndpointId,
        now: Millis,
        too_old_before: Millis,
    ) -> StoreResult<Option<EnableReport>> {
        let (app, ep) = (app.as_str().to_owned(), ep.as_str().to_owned());
        self.write(move |c| {
            let was: Option<i64> = c
                .query_row(
                    "SELECT disabled FROM endpoints WHERE id = ?1 AND app_id = ?2",
                    params![ep, app],
                    |r| r.get(0),
                )
                .optional()
                .map_err(map_err)?;
            let Some(was) = was else { return Ok(None) };
            if was == 0 {
                // Nothing is held for an enabled endpoint: the age cap at
                // enable is for deliveries that waited while it was off.
                return Ok(Some(EnableReport::default()));
            }
            c.execute(
                "UPDATE endpoints SET disabled = 0, disabled_reason = NULL, disabled_by = NULL, \
                 disabled_at = NULL, fail_streak = 0, streak_started_at = NULL, updated_at = ?1 WHERE id = ?2",
                params![now, ep],
            )
            .map_err(map_err)?;
            // Held past the age cap: dead now, and replayable like any other.
            let expired = c
                .execute(
                    "UPDATE deliveries SET state = 3, dead_reason = 'too_old', parked = 0, \
                     next_attempt_at = ?1, updated_at = ?1 \
                     WHERE endpoint_id = ?2 AND state = 0 AND cycle_started_at < ?3",
                    params![now, ep, too_old_before],
                )
                .map_err(map_err)?;
            c.execute(
                "UPDATE deliveries SET parked = 0 WHERE endpoint_id = ?1 AND parked = 1",
                params![ep],
            )
            .map_err(map_err)?;
            unhold(c, &ep)?;
            c.execute("DELETE FROM parked_endpoints WHERE endpoint_id = ?1", params![ep])
                .map_err(map_err)?;
            Ok(Some(EnableReport {
                was_disabled: true,
                expired: u64::try_from(expired).unwrap_or(0),
            }))
        })
        .await
    }
}

#[async_trait]
impl EventTypes for SqliteStore {
    async fn create_event_type(&self, et: &EventType) -> StoreResult<()> {
        let et = et.clone();
        self.write(move |c| {
            let n = c
                .execute(
                    "INSERT INTO event_types (name, description, archived, deprecated, schemas, feature_flag, \
                     group_name, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                     ON CONFLICT DO NOTHING",
                    params![
                        et.name,
                        et.description,
                        et.archived,
                        et.deprecated,
                        et.schemas,
                        et.feature_flag,
                        et.group_name,
                        et.created_at,
                        et.updated_at
                    ],
                )
                .map_err(map_err)?;
            if n == 0 {
                return Err(StoreError::Conflict(format!(
                    "an event type named `{}` already exists",
                    et.name
                )));
            }
            Ok(())
        })
        .await
    }

    async fn get_event_type(&self, name: &str) -> StoreResult<Option<EventType>> {
        let name = name.to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM event_types WHERE name = ?1")
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![name], event_type_from_row)?.pop())
        })
        .await
    }

    async fn list_event_types(
        &self,
        include_archived: bool,
        page: &PageReq,
    ) -> StoreResult<Page<EventType>> {
        let sql = if include_archived {
            "SELECT * FROM event_types WHERE 1 = 1"
        } else {
            "SELECT * FROM event_types WHERE archived = 0"
        };
        let page = page.clone();
        self.read(move |c| page_of(c, sql, "name", Vec::new(), &page, event_type_from_row))
            .await
    }

    async fn update_event_type(&self, et: &EventType) -> StoreResult<bool> {
        let et = et.clone();
        self.write(move |c| {
            let n = c
                .execute(
                    "UPDATE event_types SET description = ?1, archived = ?2, deprecated = ?3, schemas = ?4, \
                     feature_flag = ?5, group_name = ?6, updated_at = ?7 WHERE name = ?8",
                    params![
                        et.description,
                        et.archived,
                        et.deprecated,
                        et.schemas,
                        et.feature_flag,
                        et.group_name,
                        et.updated_at,
                        et.name
                    ],
                )
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn delete_event_type(&self, name: &str) -> StoreResult<bool> {
        let name = name.to_owned();
        self.write(move |c| {
            let n = c
                .execute("DELETE FROM event_types WHERE name = ?1", params![name])
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
    }

    async fn unknown_event_types(&self, names: &[String]) -> StoreResult<Vec<String>> {
        let list = to_json(&names)?;
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT value FROM json_each(?1) WHERE value NOT IN (SELECT name FROM event_types)",
                )
                .map_err(map_err)?;
            let found = stmt
                .query_map(params![list], |r| r.get::<_, String>(0))
                .map_err(map_err)?;
            found.collect::<Result<Vec<_>, _>>().map_err(map_err)
        })
        .await
    }
}

#[async_trait]
impl Queue for SqliteStore {
    async fn insert_messages(&self, batch: &[NewMessage]) -> StoreResult<Vec<InsertOutcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let batch = batch.to_vec();
        self.write(move |c| Ok(insert_messages_tx(c, &batch, None)?.0))
            .await
    }

    async fn insert_messages_claiming(
        &self,
        batch: &[NewMessage],
        req: &ClaimRequest<'_>,
    ) -> StoreResult<(Vec<InsertOutcome>, Vec<ClaimedDelivery>)> {
        if batch.is_empty() {
            return Ok((Vec::new(), Vec::new()));
        }
        let batch = batch.to_vec();
        let claim = IngestClaim::new(req);
        self.write(move |c| insert_messages_tx(c, &batch, Some(claim)))
            .await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> StoreResult<Vec<ClaimedDelivery>> {
        if req.limit == 0 {
            return Ok(Vec::new());
        }
        let (now, lease_until, limit, cap) =
            (req.now, req.lease_until, req.limit, req.endpoint_cap);
        let in_flight = req.in_flight.clone();
        self.write(move |c| claim_tx(c, now, lease_until, limit, &in_flight, cap))
            .await
    }

    async fn next_due_at(&self) -> StoreResult<Option<Millis>> {
        self.read(|c| {
            // Both halves are index seeks: `state < 2` alone matches no
            // partial index and would scan the whole history on every
            // idle moment of the dispatcher. A disabled endpoint's held
            // deliveries are no claim's work (its older ones are parked,
            // so the first half skips at most a moment's worth of them).
            c.prepare_cached(
                "SELECT MIN(due) FROM ( \
                   SELECT MIN(next_attempt_at) AS due FROM deliveries INDEXED BY deliveries_due \
                    WHERE state < 2 AND parked = 0 \
                      AND endpoint_id NOT IN (SELECT id FROM endpoints WHERE disabled = 1) \
                   UNION ALL \
                   SELECT (SELECT MIN(d.next_attempt_at) FROM deliveries d INDEXED BY deliveries_parked \
                            WHERE d.parked = 1 AND d.endpoint_id = p.endpoint_id) \
                     FROM parked_endpoints p \
                    WHERE p.endpoint_id NOT IN (SELECT id FROM endpoints WHERE disabled = 1))",
            )
            .map_err(map_err)?
            .query_row([], |r| r.get(0))
            .map_err(map_err)
        })
        .await
    }

    async fn complete(&self, batch: &[Completion]) -> StoreResult<Completed> {
        if batch.is_empty() {
            return Ok(Completed::default());
        }
        // SQLite would keep a NUL, and PostgreSQL refuses it: both store it
        // alike.
        let batch = storable_batch(batch).into_owned();
        self.write(move |c| complete_tx(c, &batch)).await
    }

    async fn release(&self, id: &DeliveryId, lease_token: &str, now: Millis) -> StoreResult<()> {
        let (id, token) = (id.as_str().to_owned(), lease_token.to_owned());
        self.write(move |c| {
            c.execute(
                "UPDATE deliveries SET state = 0, next_attempt_at = ?1, lease_token = NULL, updated_at = ?1 \
                 WHERE id = ?2 AND lease_token = ?3",
                params![now, id, token],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl Replay for SqliteStore {
    async fn replay_dead_matching(
        &self,
        filter: &DeadFilter,
        ids: Option<&[DeliveryId]>,
        limit: usize,
        now: Millis,
    ) -> StoreResult<u64> {
        let (mut cond, filter_args) = dead_filter_sql(filter);
        let mut args: Vec<Value> = vec![now.into()];
        args.extend(filter_args);
        if let Some(ids) = ids {
            let list: Vec<&str> = ids.iter().map(|i| i.as_str()).collect();
            cond.push_str(" AND d.id IN (SELECT value FROM json_each(?))");
            args.push(to_json(&list)?.into());
        }
        // REPLAY_SET's time is ?1; the filter's parameters follow it.
        let sql = format!(
            "UPDATE deliveries SET {REPLAY_SET} WHERE id IN (SELECT d.id FROM deliveries d \
             JOIN messages m ON m.id = d.msg_id WHERE {} LIMIT {limit})",
            renumber_from(&cond, 2)
        );
        self.write(move |c| {
            let n = c
                .execute(&sql, rusqlite::params_from_iter(args))
                .map_err(map_err)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    async fn resend(
        &self,
        app: &AppId,
        msg: &MsgId,
        ep: &EndpointId,
        now: Millis,
    ) -> StoreResult<ResendOutcome> {
        let (app, msg, ep) = (
            app.as_str().to_owned(),
            msg.as_str().to_owned(),
            ep.as_str().to_owned(),
        );
        self.write(move |c| {
            let exists = |sql: &str, id: &str| -> StoreResult<bool> {
                c.query_row(sql, params![id, app], |_| Ok(())).optional().map(|o| o.is_some()).map_err(map_err)
            };
            if !exists("SELECT 1 FROM messages WHERE id = ?1 AND app_id = ?2", &msg)? {
                return Ok(ResendOutcome::NoSuchMessage);
            }
            if !exists("SELECT 1 FROM endpoints WHERE id = ?1 AND app_id = ?2", &ep)? {
                return Ok(ResendOutcome::NoSuchEndpoint);
            }
            // Reuse the delivery so the Idempotency-Key stays the same;
            // clearing the lease token makes an in-flight outcome leave the
            // state alone.
            let n = c
                .execute(
                    &format!("UPDATE deliveries SET {REPLAY_SET} WHERE msg_id = ?2 AND endpoint_id = ?3"),
                    params![now, msg, ep],
                )
                .map_err(map_err)?;
            if n == 0 {
                c.execute(
                    "INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at, cycle_started_at, \
                     manual, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, 0, ?5, ?5, 1, ?5, ?5)",
                    params![DeliveryId::generate().as_str(), msg, ep, app, now],
                )
                .map_err(map_err)?;
            }
            Ok(ResendOutcome::Queued)
        })
        .await
    }
}

#[async_trait]
impl History for SqliteStore {
    async fn get_message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>> {
        let (app, key) = (app.as_str().to_owned(), id_or_event_id.to_owned());
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT * FROM messages WHERE app_id = ?1 AND (id = ?2 OR event_id = ?2) ORDER BY id = ?2 DESC LIMIT 1",
                )
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![app, key], message_from_row)?.pop())
        })
        .await
    }

    async fn get_delivery(&self, app: &AppId, id: &DeliveryId) -> StoreResult<Option<Delivery>> {
        let (app, id) = (app.as_str().to_owned(), id.as_str().to_owned());
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
                     WHERE d.id = ?1 AND d.app_id = ?2"
                ))
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![id, app], delivery_from_row)?.pop())
        })
        .await
    }

    async fn list_deliveries_of_message(
        &self,
        app: &AppId,
        msg: &MsgId,
    ) -> StoreResult<Vec<Delivery>> {
        let (app, msg) = (app.as_str().to_owned(), msg.as_str().to_owned());
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(&format!(
                    "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id \
                     WHERE d.msg_id = ?1 AND d.app_id = ?2 ORDER BY d.id"
                ))
                .map_err(map_err)?;
            rows(&mut stmt, params![msg, app], delivery_from_row)
        })
        .await
    }

    async fn list_dead(&self, filter: &DeadFilter, page: &PageReq) -> StoreResult<Page<Delivery>> {
        let (cond, args) = dead_filter_sql(filter);
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.id = d.msg_id WHERE {cond}"
        );
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "d.id", args, &page, delivery_from_row))
            .await
    }

    async fn list_attempts(
        &self,
        app: &AppId,
        filter: &AttemptFilter,
        page: &PageReq,
    ) -> StoreResult<Page<AttemptRecord>> {
        let mut sql = String::from("SELECT * FROM attempts WHERE app_id = ?");
        let mut args: Vec<Value> = vec![app.as_str().to_owned().into()];
        if let Some(msg) = &filter.msg {
            sql.push_str(" AND msg_id = ?");
            args.push(msg.as_str().to_owned().into());
        }
        if let Some(ep) = &filter.endpoint {
            sql.push_str(" AND endpoint_id = ?");
            args.push(ep.as_str().to_owned().into());
        }
        if let Some(ok) = filter.success {
            sql.push_str(if ok {
                " AND success = 1"
            } else {
                " AND success = 0"
            });
        }
        match filter.code_class {
            None => {}
            Some(0) => sql.push_str(" AND status_code IS NULL"),
            Some(class) => {
                sql.push_str(" AND status_code >= ? AND status_code < ?");
                args.push(i64::from(class).into());
                args.push((i64::from(class) + 100).into());
            }
        }
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "id", args, &page, attempt_from_row))
            .await
    }

    async fn get_attempt(&self, app: &AppId, id: &AttemptId) -> StoreResult<Option<AttemptRecord>> {
        let (app, id) = (app.as_str().to_owned(), id.as_str().to_owned());
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM attempts WHERE id = ?1 AND app_id = ?2")
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![id, app], attempt_from_row)?.pop())
        })
        .await
    }

    async fn list_messages(
        &self,
        app: &AppId,
        filter: &MessageFilter,
        page: &PageReq,
    ) -> StoreResult<Page<Message>> {
        let mut sql = String::from("SELECT * FROM messages WHERE app_id = ?");
        let mut args: Vec<Value> = vec![app.as_str().to_owned().into()];
        if let Some(types) = &filter.event_types {
            sql.push_str(" AND event_type IN (SELECT value FROM json_each(?))");
            args.push(to_json(types)?.into());
        }
        if let Some(channel) = &filter.channel {
            sql.push_str(" AND EXISTS (SELECT 1 FROM json_each(channels) WHERE value = ?)");
            args.push(channel.clone().into());
        }
        if let Some(before) = filter.before {
            sql.push_str(" AND created_at < ?");
            args.push(before.into());
        }
        if let Some(after) = filter.after {
            sql.push_str(" AND created_at > ?");
            args.push(after.into());
        }
        let page = page.clone();
        self.read(move |c| page_of(c, &sql, "id", args, &page, message_from_row))
            .await
    }

    async fn list_endpoint_messages(
        &self,
        app: &AppId,
        ep: &EndpointId,
        page: &PageReq,
    ) -> StoreResult<Page<(Delivery, Message)>> {
        let args: Vec<Value> = vec![
            ep.as_str().to_owned().into(),
            app.as_str().to_owned().into(),
        ];
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS}, m.payload, m.event_id, m.channels, m.created_at AS msg_created_at \
             FROM deliveries d JOIN messages m ON m.id = d.msg_id WHERE d.endpoint_id = ? AND d.app_id = ?"
        );
        let page = page.clone();
        self.read(move |c| {
            page_of(c, &sql, "d.msg_id", args, &page, |r| {
                let d = delivery_from_row(r)?;
                let m = Message {
                    id: d.msg_id.clone(),
                    app_id: d.app_id.clone(),
                    event_type: d.event_type.clone(),
                    event_id: get(r, "event_id")?,
                    payload: get(r, "payload")?,
                    channels: json_opt(get(r, "channels")?)?,
                    created_at: get(r, "msg_created_at")?,
                };
                Ok((d, m))
            })
        })
        .await
    }
}

#[async_trait]
impl Health for SqliteStore {
    async fn endpoint_delivery_counts(&self, ep: &EndpointId) -> StoreResult<DeliveryCounts> {
        let ep = ep.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT state, COUNT(*) FROM deliveries WHERE endpoint_id = ?1 GROUP BY state",
                )
                .map_err(map_err)?;
            let mut counts = DeliveryCounts::default();
            let mut rs = stmt.query(params![ep]).map_err(map_err)?;
            while let Some(r) = rs.next().map_err(map_err)? {
                counts.set(r.get(0).map_err(map_err)?, r.get(1).map_err(map_err)?);
            }
            Ok(counts)
        })
        .await
    }

    async fn endpoint_stats(
        &self,
        ep: &EndpointId,
        since: Millis,
    ) -> StoreResult<Vec<StatsBucket>> {
        let ep = ep.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT * FROM endpoint_stats WHERE endpoint_id = ?1 AND bucket >= ?2 ORDER BY bucket",
                )
                .map_err(map_err)?;
            rows(&mut stmt, params![ep, since], stats_from_row)
        })
        .await
    }

    async fn list_endpoint_overview(
        &self,
        app: Option<&AppId>,
        offset: usize,
        limit: usize,
    ) -> StoreResult<Vec<EndpointOverview>> {
        let app = app.map(|a| a.as_str().to_owned());
        let (offset, limit) = (
            i64::try_from(offset).unwrap_or(i64::MAX),
            i64::try_from(limit).unwrap_or(i64::MAX),
        );
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT e.*, a.name AS app_name FROM endpoints e JOIN applications a ON a.id = e.app_id \
                     WHERE (?1 IS NULL OR e.app_id = ?1) \
                     ORDER BY e.fail_streak DESC, e.id LIMIT ?2 OFFSET ?3",
                )
                .map_err(map_err)?;
            rows(&mut stmt, params![app, limit, offset], |r| {
                Ok(EndpointOverview {
                    endpoint: endpoint_from_row(r)?,
                    app_name: get(r, "app_name")?,
                    status: status_from_row(r)?,
                })
            })
        })
        .await
    }

    async fn queue_stats(&self, now: Millis) -> StoreResult<QueueStats> {
        self.read(move |c| {
            let count = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> StoreResult<(i64, Option<i64>)> {
                c.prepare_cached(sql)
                    .map_err(map_err)?
                    .query_row(args, |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(map_err)
            };
            let u = |n: i64| u64::try_from(n).unwrap_or(0);
            // Each count walks a partial index, never the history.
            let (pending_live, _) = count(
                "SELECT COUNT(*), NULL FROM deliveries INDEXED BY deliveries_due \
                 WHERE state < 2 AND parked = 0 AND state = 0",
                &[],
            )?;
            let (delivering, _) = count(
                "SELECT COUNT(*), NULL FROM deliveries INDEXED BY deliveries_due \
                 WHERE state < 2 AND parked = 0 AND state = 1",
                &[],
            )?;
            let (due_live, oldest_live) = count(
                "SELECT COUNT(*), MIN(next_attempt_at) FROM deliveries INDEXED BY deliveries_due \
                 WHERE state < 2 AND parked = 0 AND state = 0 AND next_attempt_at <= ?1",
                &[&now],
            )?;
            let (parked, oldest_parked) = count(
                "SELECT COUNT(*), MIN(next_attempt_at) FROM deliveries INDEXED BY deliveries_parked \
                 WHERE parked = 1",
                &[],
            )?;
            let (held, _) = count(
                "SELECT COUNT(*), NULL FROM deliveries INDEXED BY deliveries_held WHERE parked = 2",
                &[],
            )?;
            let (held_due, oldest_held) = count(
                "SELECT COUNT(*), MIN(next_attempt_at) FROM deliveries INDEXED BY deliveries_held \
                 WHERE parked = 2 AND next_attempt_at <= ?1",
                &[&now],
            )?;
            let (dead, _) = count(
                "SELECT COUNT(*), NULL FROM deliveries INDEXED BY deliveries_dead_all WHERE state = 3",
                &[],
            )?;
            let (disabled, _) = count(
                "SELECT COUNT(*), NULL FROM endpoints WHERE disabled = 1",
                &[],
            )?;
            let oldest_due_at = [oldest_live, oldest_parked, oldest_held]
                .into_iter()
                .flatten()
                .min();
            Ok(QueueStats {
                pending: u(pending_live + parked + held),
                delivering: u(delivering),
                dead: u(dead),
                due: u(due_live + parked + held_due),
                oldest_due_at,
                disabled_endpoints: u(disabled),
            })
        })
        .await
    }
}

#[async_trait]
impl Tokens for SqliteStore {
    async fn create_token(&self, token: &ApiToken, sha256_hex: &str) -> StoreResult<()> {
        let (t, sha) = (token.clone(), sha256_hex.to_owned());
        self.write(move |c| {
            c.execute(
                "INSERT INTO api_tokens (id, app_id, sha256, name, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![t.id, t.app_id.as_str(), sha, t.name, t.created_at],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn find_token(&self, sha256_hex: &str) -> StoreResult<Option<ApiToken>> {
        let sha = sha256_hex.to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM api_tokens WHERE sha256 = ?1")
                .map_err(map_err)?;
            Ok(rows(&mut stmt, params![sha], token_from_row)?.pop())
        })
        .await
    }

    async fn list_tokens(&self, app: &AppId) -> StoreResult<Vec<ApiToken>> {
        let app = app.as_str().to_owned();
        self.read(move |c| {
            let mut stmt = c
                .prepare_cached("SELECT * FROM api_tokens WHERE app_id = ?1 ORDER BY id")
                .map_err(map_err)?;
            rows(&mut stmt, params![app], token_from_row)
        })
        .await
    }

    async fn delete_token(&self, app: &AppId, id: &str) -> StoreResult<bool> {
        let (app, id) = (app.as_str().to_owned(), id.to_owned());
        self.write(move |c| {
            let n = c
                .execute(
                    "DELETE FROM api_tokens WHERE id = ?1 AND app_id = ?2",
                    params![id, app],
                )
                .map_err(map_err)?;
            Ok(n == 1)
        })
        .await
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
        let (scope, key, hash) = (scope.to_owned(), key.to_owned(), request_hash.to_owned());
        self.write(move |c| {
            let found: Option<(String, i64, String, i64)> = c
                .query_row(
                    "SELECT request_hash, status, body, created_at FROM idempotency WHERE scope = ?1 AND key = ?2",
                    params![scope, key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
                .optional()
                .map_err(map_err)?;
            let verdict = idem_verdict(found, &hash, valid_after, stale_before);
            if verdict == IdemBegin::Fresh {
                c.execute(
                    "INSERT INTO idempotency (scope, key, request_hash, status, body, created_at) \
                     VALUES (?1, ?2, ?3, 0, '', ?4) \
                     ON CONFLICT (scope, key) DO UPDATE SET request_hash = excluded.request_hash, \
                     status = 0, body = '', created_at = excluded.created_at",
                    params![scope, key, hash, now],
                )
                .map_err(map_err)?;
            }
            Ok(verdict)
        })
        .await
    }

    async fn idempotency_finish(
        &self,
        scope: &str,
        key: &str,
        status: u16,
        body: &str,
    ) -> StoreResult<()> {
        let (scope, key, body) = (scope.to_owned(), key.to_owned(), body.to_owned());
        self.write(move |c| {
            c.execute(
                "UPDATE idempotency SET status = ?1, body = ?2 WHERE scope = ?3 AND key = ?4",
                params![i64::from(status), body, scope, key],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn idempotency_abort(&self, scope: &str, key: &str) -> StoreResult<()> {
        let (scope, key) = (scope.to_owned(), key.to_owned());
        self.write(move |c| {
            c.execute(
                "DELETE FROM idempotency WHERE scope = ?1 AND key = ?2 AND status = 0",
                params![scope, key],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl Retention for SqliteStore {
    async fn prune(
        &self,
        finished_before: Millis,
        dead_before: Millis,
        batch: usize,
    ) -> StoreResult<PruneReport> {
        if batch == 0 {
            return Ok(PruneReport::default());
        }
        self.write(move |c| prune_tx(c, finished_before, dead_before, batch))
            .await
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
        let limit = i64::try_from(batch).unwrap_or(i64::MAX);
        self.write(move |c| {
            // Per disabled endpoint, one seek into its held deliveries by
            // cycle start, whatever else is held.
            let n = c
                .prepare_cached(
                    "UPDATE deliveries SET state = 3, dead_reason = 'too_old', parked = 0, \
                     next_attempt_at = ?1, updated_at = ?1 \
                     WHERE id IN (SELECT d.id FROM endpoints e INDEXED BY endpoints_disabled \
                                  JOIN deliveries d INDEXED BY deliveries_held ON d.endpoint_id = e.id \
                                  WHERE e.disabled = 1 AND d.parked = 2 AND d.cycle_started_at < ?2 \
                                  LIMIT ?3)",
                )
                .map_err(map_err)?
                .execute(params![now, too_old_before, limit])
                .map_err(map_err)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    async fn prune_idempotency(&self, before: Millis) -> StoreResult<u64> {
        self.write(move |c| {
            let n = c
                .execute(
                    "DELETE FROM idempotency WHERE created_at < ?1",
                    params![before],
                )
                .map_err(map_err)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    async fn prune_stats(&self, before: Millis) -> StoreResult<u64> {
        self.write(move |c| {
            let n = c
                .execute(
                    "DELETE FROM endpoint_stats WHERE bucket < ?1",
                    params![before],
                )
                .map_err(map_err)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }
}

/// Numbers a fragment's bare `?` parameters from `first` on, so that it
/// can follow numbered ones (numbered and bare ones must not mix).
fn renumber_from(sql: &str, first: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = first;
    for ch in sql.chars() {
        if ch == '?' {
            out.push_str(&format!("?{n}"));
            n += 1;
        } else {
            out.push(ch);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A fresh database in `dir` with one app and `endpoints` enabled
    /// endpoints, each with `per_endpoint` pending deliveries long overdue
    /// (due at 1, 2, …, like a backlog after an outage).
    fn backlog(dir: &std::path::Path, endpoints: usize, per_endpoint: usize) -> Connection {
        let mut conn = open_connection(&dir.join("claims.db"), false).expect("open");
        migrate(&mut conn).expect("migrate");
        conn.execute_batch(&format!(
            "INSERT INTO applications (id, name, created_at, updated_at) VALUES ('app_1', 'a', 0, 0);
             WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {endpoints})
             INSERT INTO endpoints (id, app_id, url, secret, created_at, updated_at)
               SELECT printf('ep_%04d', i), 'app_1', 'http://127.0.0.1:9/', 's', 0, 0 FROM n;
             WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {per_endpoint})
             INSERT INTO messages (id, app_id, event_type, payload, created_at)
               SELECT printf('msg_%08d', i), 'app_1', 'x', '{{}}', 1 + i FROM n;
             INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at,
                                     cycle_started_at, created_at, updated_at)
               SELECT 'dlv_' || m.id || e.id, m.id, e.id, 'app_1', 0, m.created_at, m.created_at,
                      m.created_at, m.created_at
               FROM messages m, endpoints e;"
        ))
        .expect("fill");
        conn
    }

    /// One claim of `limit` with nothing in flight, and the SQLite VM
    /// instructions it ran (about: the progress handler is called every
    /// 16), which the same statements over the same rows always repeat.
    fn counted_claim(conn: &Connection, now: Millis, limit: usize) -> (usize, u64) {
        let ops = Arc::new(AtomicU64::new(0));
        let counter = ops.clone();
        conn.progress_handler(
            16,
            Some(move || {
                counter.fetch_add(16, Ordering::Relaxed);
                false
            }),
        );
        let claimed = claim_tx(conn, now, now + 60_000, limit, &HashMap::new(), 128)
            .expect("claim")
            .len();
        conn.progress_handler(0, None::<fn() -> bool>);
        (claimed, ops.load(Ordering::Relaxed))
    }

    fn count(conn: &Connection, sql: &str) -> i64 {
        conn.query_row(sql, [], |r| r.get(0)).expect("count")
    }

    /// Issue 16, defect 7: with a claimable backlog and no endpoint full, a
    /// claim's parking walked the whole overdue head of the claim index
    /// (22 ms per claim over 200,000 rows on the single writer). A claim
    /// now costs the same over 40 times the backlog, and parks nothing.
    #[test]
    fn a_claim_costs_what_it_takes_whatever_claimable_backlog_lies_behind() {
        let now = 10_000_000;
        let (small_dir, large_dir) = (
            tempfile::tempdir().expect("tempdir"),
            tempfile::tempdir().expect("tempdir"),
        );
        let small = backlog(small_dir.path(), 50, 20);
        let large = backlog(large_dir.path(), 50, 800);
        // The first claim of each also prepares its statements.
        counted_claim(&small, now, 16);
        counted_claim(&large, now, 16);
        let (got_small, ops_small) = counted_claim(&small, now, 16);
        let (got_large, ops_large) = counted_claim(&large, now, 16);
        assert_eq!((got_small, got_large), (16, 16));
        assert!(
            ops_large < ops_small * 2,
            "a claim over 40,000 overdue rows ran {ops_large} VM instructions, \
             over 1,000 rows {ops_small}"
        );
        let set_aside = "SELECT COUNT(*) FROM deliveries WHERE parked <> 0";
        assert_eq!(count(&large, set_aside), 0, "nothing parked or held");
        assert_eq!(count(&large, "SELECT COUNT(*) FROM parked_endpoints"), 0);
    }

    /// The walk still sets aside what claims would pass over again: a
    /// full endpoint's overdue rows (parked, and given back once it has
    /// room) and a disabled endpoint's (held until it is enabled).
    #[test]
    fn the_walk_parks_a_full_endpoints_rows_and_holds_a_disabled_ones() {
        let now = 10_000_000;
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = backlog(dir.path(), 3, 10);
        conn.execute("UPDATE endpoints SET disabled = 1 WHERE id = 'ep_0002'", [])
            .expect("disable");
        let full: HashMap<EndpointId, usize> =
            [(EndpointId::from_trusted("ep_0000".to_owned()), 128)].into();
        let got = claim_tx(&conn, now, now + 60_000, 100, &full, 128).expect("claim");
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|d| d.endpoint_id.as_str() == "ep_0001"));
        let parked = "SELECT COUNT(*) FROM deliveries WHERE parked = 1 AND endpoint_id = 'ep_0000'";
        let held = "SELECT COUNT(*) FROM deliveries WHERE parked = 2 AND endpoint_id = 'ep_0002'";
        assert_eq!((count(&conn, parked), count(&conn, held)), (10, 10));
        // Room again: the parked rows come back, oldest first; the held
        // ones stay.
        let got = claim_tx(&conn, now, now + 60_000, 100, &HashMap::new(), 4).expect("claim");
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|d| d.endpoint_id.as_str() == "ep_0000"));
        assert_eq!(count(&conn, held), 10);
    }
}
