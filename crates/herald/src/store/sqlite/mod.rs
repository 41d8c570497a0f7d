//! The embedded store: SQLite in WAL mode with `synchronous=FULL`, so a
//! commit is on disk before anyone hears of it.
//!
//! SQLite allows one writer at a time, so one thread owns the only writing
//! connection and runs every write as a job. It takes all the jobs that
//! queued up while it was busy and runs them in ONE transaction, each in
//! its own savepoint but the first (a failing job rolls back alone; a
//! failing first job takes the transaction, which holds nothing else, and
//! the jobs after it run in a new one), then commits once
//! and only then answers each job. Ingest batches, claims and completions
//! therefore share fsyncs: this group commit is what makes a durable queue
//! on one disk fast. Reads run on a small pool of read-only connections,
//! beside the writer, as WAL allows.
//!
//! This file holds what every part needs: opening, the writer thread and
//! the readers, the migrations, error mapping and row helpers. Each part of
//! the store has its file beside it, with its SQL: `settings.rs`,
//! `apps.rs`, `endpoints.rs`, `event_types.rs`, `queue.rs` (ingest, claim
//! with parking and holding, complete, release), `replay.rs`, `history.rs`,
//! `health.rs`, `tokens.rs`, `audit.rs`, `retention.rs`, and `counts.rs`
//! (the kept delivery counts, folded in memory and written before COMMIT).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use tokio::sync::{mpsc, oneshot};

use super::conditions::{Arg, Conditions, Dialect};
use super::*;

mod apps;
mod audit;
pub mod backup;
mod circuits;
mod claim;
pub mod copy;
mod counts;
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
use circuits::circuit_of_row;
use counts::CountFold;

/// The schema, in order, by name. A database records how many it has
/// applied in `PRAGMA user_version`; at open the rest are applied in a
/// transaction.
pub(crate) const MIGRATIONS: &[(&str, &str)] = &[
    (
        "0001_initial",
        include_str!("../../../migrations/sqlite/0001_initial.sql"),
    ),
    (
        "0002_parking",
        include_str!("../../../migrations/sqlite/0002_parking.sql"),
    ),
    (
        "0003_health",
        include_str!("../../../migrations/sqlite/0003_health.sql"),
    ),
    (
        "0004_secret_rotation",
        include_str!("../../../migrations/sqlite/0004_secret_rotation.sql"),
    ),
    (
        "0005_event_types",
        include_str!("../../../migrations/sqlite/0005_event_types.sql"),
    ),
    (
        "0006_channels_headers",
        include_str!("../../../migrations/sqlite/0006_channels_headers.sql"),
    ),
    (
        "0007_tokens_idempotency",
        include_str!("../../../migrations/sqlite/0007_tokens_idempotency.sql"),
    ),
    (
        "0008_held",
        include_str!("../../../migrations/sqlite/0008_held.sql"),
    ),
    (
        "0009_audit",
        include_str!("../../../migrations/sqlite/0009_audit.sql"),
    ),
    (
        "0010_traceparent",
        include_str!("../../../migrations/sqlite/0010_traceparent.sql"),
    ),
    (
        "0011_message_fields",
        include_str!("../../../migrations/sqlite/0011_message_fields.sql"),
    ),
    (
        "0012_expunge",
        include_str!("../../../migrations/sqlite/0012_expunge.sql"),
    ),
    (
        "0013_payload_expiry",
        include_str!("../../../migrations/sqlite/0013_payload_expiry.sql"),
    ),
    (
        "0014_portal",
        include_str!("../../../migrations/sqlite/0014_portal.sql"),
    ),
    (
        "0015_throttle_fifo",
        include_str!("../../../migrations/sqlite/0015_throttle_fifo.sql"),
    ),
    (
        "0016_finder",
        include_str!("../../../migrations/sqlite/0016_finder.sql"),
    ),
    (
        "0017_circuit_breaker",
        include_str!("../../../migrations/sqlite/0017_circuit_breaker.sql"),
    ),
    (
        "0018_counts_fold",
        include_str!("../../../migrations/sqlite/0018_counts_fold.sql"),
    ),
    (
        "0019_failed_attempts_index",
        include_str!("../../../migrations/sqlite/0019_failed_attempts_index.sql"),
    ),
    (
        "0020_attempts_by_success",
        include_str!("../../../migrations/sqlite/0020_attempts_by_success.sql"),
    ),
];

/// Jobs per transaction at most; the rest wait for the next one.
const MAX_JOBS_PER_COMMIT: usize = 512;
const READERS: usize = 4;

type Finish = Box<dyn FnOnce(&StoreResult<()>) + Send>;
/// A writer job, told whether it is the first of its transaction.
type Job = Box<dyn FnOnce(&Connection, &CountFold, bool) -> Ran + Send>;

/// What running a job left.
struct Ran {
    finish: Finish,
    /// The job ran first in its transaction, without a savepoint, and
    /// failed: the transaction holds its partial work and nothing else,
    /// so the writer rolls it back whole and begins a new one.
    failed_first: bool,
}

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
    /// Seals and opens the credential columns (see `store::secrets`).
    keys: Arc<crate::crypto::Keyring>,
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

/// Lets `?` classify a driver error (conflict, parent gone, unavailable)
/// where each statement would otherwise spell `.map_err(map_err)`.
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        map_err(e)
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
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.set_prepared_statement_cache_capacity(64);
    if !read_only {
        // WAL: readers never block the writer. FULL: a commit is fsynced.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "wal_autocheckpoint", 4000)?;
    }
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Each writer job runs in a savepoint, whose sub-journal would
    // otherwise spill to a temporary file (a write per page touched).
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // A group commit touches more than the default 2 MiB of pages; a
    // smaller cache spills dirty pages into the WAL mid-transaction.
    conn.pragma_update(None, "cache_size", -CACHE_KIB)?;
    Ok(conn)
}

/// Applies the migrations `conn` lacks; `counts` is the fold registered on
/// it, flushed before the commit (a migration may move deliveries).
fn migrate(conn: &mut Connection, counts: &CountFold) -> StoreResult<()> {
    let applied: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let applied = usize::try_from(applied).unwrap_or(0);
    if applied > MIGRATIONS.len() {
        return Err(StoreError::Internal(crate::store::newer_schema(
            i64::try_from(applied).unwrap_or(i64::MAX),
            migrations::newest_version(),
        )));
    }
    let tx = conn.transaction()?;
    counts.begin();
    for (i, (_, sql)) in MIGRATIONS.iter().enumerate().skip(applied) {
        tx.execute_batch(sql)
            .map_err(|e| StoreError::Internal(format!("migration {} failed: {e}", i + 1)))?;
        tx.pragma_update(None, "user_version", i + 1)?;
    }
    counts.flush(&tx)?;
    tx.commit().map_err(map_err)
}

/// Opens the writing connection with `herald_count` registered on it.
fn open_writer(path: &std::path::Path) -> StoreResult<(Connection, CountFold)> {
    let conn = open_connection(path, false)?;
    let counts = CountFold::register(&conn)?;
    Ok((conn, counts))
}

/// The writer thread: gathers queued jobs, runs them in one transaction
/// (each in a savepoint of its own, but the first: see [`Ran`]), commits,
/// then lets each job answer.
/// The kept counts' deltas are flushed just before COMMIT, in the same
/// transaction (see `counts.rs`).
fn writer_loop(conn: Connection, counts: CountFold, mut jobs: mpsc::Receiver<Command>) {
    counts.install();
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
        // `Some` while a transaction is open: whether no job has run in
        // it yet.
        let mut fresh = begun.is_ok().then_some(true);
        if fresh.is_some() {
            counts.begin();
        }
        for job in batch.drain(..) {
            let Some(first) = fresh else {
                // No transaction to run the rest in: they are dropped with
                // the batch, and their callers see the store unavailable.
                break;
            };
            let ran = job(&conn, &counts, first);
            finishes.push(ran.finish);
            fresh = if ran.failed_first {
                counts.discard();
                // SQLite may have rolled back already (a full disk, say):
                // then ROLLBACK fails, harmlessly.
                let _ = conn.execute_batch("ROLLBACK");
                let again = conn.is_autocommit() && conn.execute_batch("BEGIN IMMEDIATE").is_ok();
                if again {
                    counts.begin();
                }
                again.then_some(true)
            } else {
                Some(false)
            };
        }
        let begun = match (begun, fresh) {
            (Ok(()), None) => Err(StoreError::Unavailable(
                "store transaction could not begin again".into(),
            )),
            (begun, _) => begun,
        };
        let outcome = begun
            .and_then(|()| counts.flush(&conn).map_err(map_err))
            .and_then(|()| conn.execute_batch("COMMIT").map_err(map_err));
        if outcome.is_err() {
            counts.discard();
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

/// Runs `f` in a savepoint of the open transaction, so that its failure
/// takes back its own changes only.
fn in_savepoint<T>(
    conn: &Connection,
    counts: &CountFold,
    f: impl FnOnce(&Connection) -> StoreResult<T>,
) -> StoreResult<T> {
    conn.execute_batch("SAVEPOINT job")?;
    counts.job_start();
    let r = f(conn);
    let end = if r.is_ok() {
        conn.execute_batch("RELEASE job").map_err(map_err)
    } else {
        // The job's count deltas go back with its rows (or, if its rows
        // might not have, the whole transaction fails at the flush).
        let undone = conn
            .execute_batch("ROLLBACK TO job; RELEASE job")
            .map_err(map_err);
        counts.job_rollback(undone.is_ok());
        undone
    };
    match (r, end) {
        (Ok(v), Ok(())) => Ok(v),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies migrations;
    /// credentials are stored in plain text (see [`SqliteStore::open_with_keys`]).
    pub async fn open(url: &str) -> StoreResult<Self> {
        Self::open_with_keys(url, Arc::new(crate::crypto::Keyring::plain())).await
    }

    /// [`SqliteStore::open`], sealing credentials with `keys`.
    pub async fn open_with_keys(url: &str, keys: Arc<crate::crypto::Keyring>) -> StoreResult<Self> {
        let path = sqlite_path(url)
            .ok_or_else(|| StoreError::Internal(format!("not a sqlite URL: {url}")))?;
        let opened = tokio::task::spawn_blocking(
            move || -> StoreResult<(Connection, CountFold, Vec<Connection>, PathBuf)> {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| {
                        StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
                    })?;
                }
                let (mut writer, counts) = open_writer(&path)?;
                migrate(&mut writer, &counts)?;
                counts::use_writer_triggers(&writer)?;
                let readers = (0..READERS)
                    .map(|_| open_connection(&path, true))
                    .collect::<StoreResult<Vec<_>>>()?;
                Ok((writer, counts, readers, path))
            },
        )
        .await
        .map_err(|e| StoreError::Internal(format!("open task failed: {e}")))??;
        let (writer, counts, readers, path) = opened;
        let (tx, rx) = mpsc::channel(4 * MAX_JOBS_PER_COMMIT);
        let handle = std::thread::Builder::new()
            .name("herald-sqlite-writer".into())
            .spawn(move || writer_loop(writer, counts, rx))
            .map_err(|e| StoreError::Internal(format!("cannot start writer thread: {e}")))?;
        Ok(SqliteStore {
            jobs: tx,
            readers: Arc::new(Mutex::new(readers)),
            path,
            writer: Mutex::new(Some(handle)),
            keys,
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
    /// One statement on the writer (prepared once, cached); the rows it
    /// changed.
    async fn changed_rows<S, P>(&self, sql: S, params: P) -> StoreResult<u64>
    where
        S: AsRef<str> + Send + 'static,
        P: rusqlite::Params + Send + 'static,
    {
        self.write(move |c| {
            let n = c.prepare_cached(sql.as_ref())?.execute(params)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
        .await
    }

    async fn write<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel::<StoreResult<T>>();
        let job: Job = Box::new(
            move |conn: &Connection, counts: &CountFold, first: bool| -> Ran {
                let (result, failed_first) = if first {
                    // First in its transaction, the job needs no savepoint: if
                    // it fails, the writer rolls back the transaction, which
                    // holds nothing else. (A savepoint copies each page the job
                    // changes into SQLite's sub-journal; callgrind counted the
                    // savepoints at about 3 % of a delivery's instructions.)
                    counts.job_start();
                    let r = f(conn);
                    let failed = r.is_err();
                    (r, failed)
                } else {
                    (in_savepoint(conn, counts, f), false)
                };
                Ran {
                    finish: Box::new(move |committed: &StoreResult<()>| {
                        let _ = reply.send(match committed {
                            Ok(()) => result,
                            Err(e) => Err(e.clone()),
                        });
                    }),
                    failed_first,
                }
            },
        );
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

/// A filter's arguments as SQLite binds them (flags as 0 or 1).
fn sqlite_args(args: Vec<Arg>) -> Vec<Value> {
    args.into_iter()
        .map(|a| match a {
            Arg::Text(s) => Value::Text(s),
            Arg::Int(n) => Value::Integer(n),
            Arg::Flag(b) => Value::Integer(i64::from(b)),
        })
        .collect()
}

/// A filter as SQLite runs it: the WHERE clause and its arguments.
fn sqlite_where(c: Conditions) -> (String, Vec<Value>) {
    (c.sql, sqlite_args(c.args))
}

impl crate::store::rows::StoredRow for Row<'_> {
    fn text(&self, column: &str) -> StoreResult<Option<String>> {
        self.get(column).map_err(map_err)
    }

    fn int(&self, column: &str) -> StoreResult<Option<i64>> {
        self.get(column).map_err(map_err)
    }

    /// SQLite keeps flags as 0 and 1.
    fn flag(&self, column: &str) -> StoreResult<Option<bool>> {
        Ok(self.get::<_, Option<i64>>(column)?.map(|v| v != 0))
    }
}

fn u32_of(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// Reads a row into `T`, keeping rusqlite's and our errors apart.
fn rows<T>(
    stmt: &mut rusqlite::Statement<'_>,
    params: impl rusqlite::Params,
    map: impl Fn(&Row<'_>) -> StoreResult<T>,
) -> StoreResult<Vec<T>> {
    let mut out = Vec::new();
    let mut rs = stmt.query(params)?;
    while let Some(row) = rs.next()? {
        out.push(map(row)?);
    }
    Ok(out)
}

fn get<T: rusqlite::types::FromSql>(r: &Row<'_>, col: &str) -> StoreResult<T> {
    r.get(col).map_err(map_err)
}

/// A keyset page over `column` (ids sort by creation time). `sql` ends in
/// an open WHERE clause; `args` are its parameters.
fn page_of<T>(
    conn: &Connection,
    sql: &str,
    column: &str,
    mut args: Vec<Value>,
    page: &PageReq,
    map: impl Fn(&Row<'_>) -> StoreResult<T>,
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
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut items = rows(&mut stmt, rusqlite::params_from_iter(args), map)?;
    let has_more = items.len() > page.limit;
    items.truncate(page.limit);
    if page.backwards {
        items.reverse();
    }
    Ok(Page { items, has_more })
}

/// Runs `erase` with `secure_delete` on, so what it deletes or overwrites
/// (an expunged payload, pruned history, large payloads' overflow pages)
/// is zeroed in the file rather than left readable in free space. Only
/// here: on for every statement it costs the hot path's updates ≈ 4 %
/// (BENCHMARKS.md). The WAL holds older page images until a checkpoint.
fn securely<T>(c: &Connection, erase: impl FnOnce() -> StoreResult<T>) -> StoreResult<T> {
    c.pragma_update(None, "secure_delete", "ON")?;
    let result = erase();
    c.pragma_update(None, "secure_delete", "OFF")?;
    result
}

/// The SQLite VM instructions `f` runs on `conn` (about: the progress
/// handler is called every 16), which the same statements over the same
/// rows always repeat: a measure of a query's work that no timing gives.
#[cfg(test)]
fn vm_instructions<T>(conn: &Connection, f: impl FnOnce() -> T) -> (T, u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let ops = Arc::new(AtomicU64::new(0));
    let counter = ops.clone();
    conn.progress_handler(
        16,
        Some(move || {
            counter.fetch_add(16, Ordering::Relaxed);
            false
        }),
    );
    let out = f();
    conn.progress_handler(0, None::<fn() -> bool>);
    (out, ops.load(Ordering::Relaxed))
}
