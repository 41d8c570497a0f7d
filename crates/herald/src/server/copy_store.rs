//! `herald copy-store --to URL`: everything in the configured store copied
//! into an empty store at `URL` (either backend to either), with Herald
//! stopped on both. The table list and how columns convert are
//! `store::copy`; each backend's reads and writes are its `copy.rs`.
//!
//! The walk: each table in insertion order (parents first), in pages in
//! key order; each page is inserted with the source key of its last row
//! recorded in the target's settings, in one transaction, so an
//! interrupted copy resumes after the last page it committed
//! (`--resume`), and a page sent twice inserts nothing twice. Endpoint
//! credentials are opened with the source's keys and sealed with the
//! target's. The kept counts are not copied: the target's triggers keep
//! them as its deliveries arrive, and the end compares them, and every
//! table's rows, with the source's.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::{lock_sqlite_file, open_backend};
use crate::config::{redact_url, Config};
use crate::crypto::Keyring;
use crate::store::copy::{
    decode_key, reseal_endpoint, to_target, CopyRow, CopyTable, CopyValue, Derived, KeptCounts,
    TABLES,
};
use crate::store::postgres::copy::PgEnd;
use crate::store::sqlite::copy::SqliteEnd;

/// Rows read and inserted at a time (PostgreSQL splits an insert further
/// under its parameter limit).
pub const PAGE_ROWS: usize = 5_000;

pub struct CopyStoreOptions {
    /// The target store's URL (`sqlite://…` or `postgres://…`).
    pub to: String,
    /// The target's PostgreSQL schema (default: the configured one).
    pub to_schema: Option<String>,
    /// The keys the target is served with (default: the configured ones).
    pub to_keys: Option<Arc<Keyring>>,
    /// Continue an interrupted copy into a target that holds its progress.
    pub resume: bool,
    pub page_rows: usize,
}

/// What the copy did and found, table by table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableTally {
    pub table: &'static str,
    /// Rows inserted by this run (a resumed run counts only its own).
    pub copied: u64,
    pub source: u64,
    pub target: u64,
}

#[derive(Debug, Clone)]
pub struct CopyReport {
    pub tables: Vec<TableTally>,
    /// Kept (endpoint, state) counts compared, and whether they agree.
    pub kept_counts: usize,
    pub kept_counts_equal: bool,
    pub throttle_slots: u64,
    pub elapsed: Duration,
}

impl CopyReport {
    pub fn complete(&self) -> bool {
        self.kept_counts_equal && self.tables.iter().all(|t| t.source == t.target)
    }

    pub fn rows_copied(&self) -> u64 {
        self.tables.iter().map(|t| t.copied).sum()
    }
}

/// Told of each page as it lands, to draw progress.
pub trait CopyProgress: Send + Sync {
    fn table_started(&self, table: &'static str, rows: u64, already: u64);
    fn page_copied(&self, table: &'static str, rows: u64);
    fn table_done(&self, table: &'static str);
}

/// One end of the copy, either backend.
enum End {
    Sqlite(Arc<Mutex<SqliteEnd>>),
    Postgres(Box<PgEnd>),
}

/// Runs a blocking call on a SQLite end off the runtime's threads.
async fn blocking<T: Send + 'static>(
    end: &Arc<Mutex<SqliteEnd>>,
    f: impl FnOnce(&mut SqliteEnd) -> crate::store::StoreResult<T> + Send + 'static,
) -> anyhow::Result<T> {
    let end = end.clone();
    let done = tokio::task::spawn_blocking(move || {
        let mut end = end.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut end)
    })
    .await
    .context("a SQLite task of the copy failed")?;
    Ok(done?)
}

impl End {
    fn is_postgres(&self) -> bool {
        matches!(self, End::Postgres(_))
    }

    async fn read_page(
        &mut self,
        table: &'static CopyTable,
        after: Option<Vec<CopyValue>>,
        limit: usize,
    ) -> anyhow::Result<Vec<CopyRow>> {
        match self {
            End::Sqlite(s) => {
                blocking(s, move |e| e.read_page(table, after.as_deref(), limit)).await
            }
            End::Postgres(p) => Ok(p.read_page(table, after.as_deref(), limit).await?),
        }
    }

    async fn insert_page(
        &mut self,
        table: &'static CopyTable,
        rows: Vec<CopyRow>,
        last: Vec<CopyValue>,
    ) -> anyhow::Result<u64> {
        match self {
            End::Sqlite(s) => blocking(s, move |e| e.insert_page(table, &rows, &last)).await,
            End::Postgres(p) => Ok(p.insert_page(table, &rows, &last).await?),
        }
    }

    async fn count(&mut self, table: &'static CopyTable) -> anyhow::Result<u64> {
        match self {
            End::Sqlite(s) => blocking(s, move |e| e.count(table)).await,
            End::Postgres(p) => Ok(p.count(table).await?),
        }
    }

    async fn progress(&mut self, table: &'static CopyTable) -> anyhow::Result<Option<String>> {
        match self {
            End::Sqlite(s) => blocking(s, move |e| e.progress(table)).await,
            End::Postgres(p) => Ok(p.progress(table).await?),
        }
    }

    async fn clear_progress(&mut self) -> anyhow::Result<()> {
        match self {
            End::Sqlite(s) => blocking(s, |e| e.clear_progress()).await,
            End::Postgres(p) => Ok(p.clear_progress().await?),
        }
    }

    async fn throttle_slots(
        &mut self,
        after: String,
        limit: usize,
    ) -> anyhow::Result<Vec<(String, i64)>> {
        match self {
            End::Sqlite(s) => blocking(s, move |e| e.throttle_slots(&after, limit)).await,
            End::Postgres(p) => Ok(p.throttle_slots(&after, limit).await?),
        }
    }

    async fn set_throttle_slots(&mut self, slots: Vec<(String, i64)>) -> anyhow::Result<()> {
        match self {
            End::Sqlite(s) => blocking(s, move |e| e.set_throttle_slots(&slots)).await,
            End::Postgres(p) => Ok(p.set_throttle_slots(&slots).await?),
        }
    }

    async fn kept_counts(&mut self) -> anyhow::Result<KeptCounts> {
        match self {
            End::Sqlite(s) => blocking(s, |e| e.kept_counts()).await,
            End::Postgres(p) => Ok(p.kept_counts().await?),
        }
    }

    async fn close(self) {
        if let End::Postgres(p) = self {
            p.close().await;
        }
    }
}

/// Where a store is, as the copy opens it.
enum Place {
    Sqlite(PathBuf),
    Postgres { url: String, schema: String },
}

impl Place {
    fn of(url: &str, schema: &str, what: &str) -> anyhow::Result<Place> {
        if url.starts_with("sqlite:") {
            let path = crate::store::sqlite::sqlite_path(url)
                .with_context(|| format!("{what}: `{url}` names no file (sqlite://PATH)"))?;
            Ok(Place::Sqlite(path))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Place::Postgres {
                url: url.to_owned(),
                schema: schema.to_owned(),
            })
        } else {
            anyhow::bail!(
                "{what}: `{}` is not a store URL: expected sqlite://PATH or postgres://…",
                redact_url(url)
            )
        }
    }

    fn same_as(&self, other: &Place) -> bool {
        match (self, other) {
            (Place::Sqlite(a), Place::Sqlite(b)) => {
                a == b
                    || matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)),
                        (Ok(a), Ok(b)) if a == b)
            }
            (Place::Postgres { url: a, schema: s }, Place::Postgres { url: b, schema: t }) => {
                a == b && s == t
            }
            _ => false,
        }
    }
}

/// Holds the lock `serve` takes on a SQLite store, so that no Herald
/// serves it during the copy; refuses when one does.
fn hold(path: &std::path::Path, which: &str) -> anyhow::Result<std::fs::File> {
    lock_sqlite_file(path)?.ok_or_else(|| {
        anyhow::anyhow!(
            "a Herald process is serving the {which} store {}: stop it first \
             (copy-store runs with Herald stopped on both stores)",
            path.display()
        )
    })
}

async fn open_end(place: &Place, which: &str) -> anyhow::Result<End> {
    match place {
        Place::Sqlite(path) => {
            let path = path.clone();
            let end = tokio::task::spawn_blocking(move || SqliteEnd::open(&path))
                .await
                .context("opening a SQLite store failed")??;
            Ok(End::Sqlite(Arc::new(Mutex::new(end))))
        }
        Place::Postgres { url, schema } => {
            let mut end = PgEnd::connect(url, schema)
                .await
                .with_context(|| format!("connecting to the {which} store"))?;
            let serving = end.serving_sessions().await?;
            if serving > 0 {
                anyhow::bail!(
                    "{serving} Herald session(s) are listening on the {which} store's schema \
                     {schema}: stop every Herald process on it first (copy-store runs with \
                     Herald stopped on both stores)"
                );
            }
            Ok(End::Postgres(Box::new(end)))
        }
    }
}

/// Copies the configured store into `options.to`; see the module's comment.
/// An error leaves the target resumable; a report whose counts differ is
/// returned (not an error) so its table can be shown, and the caller exits
/// non-zero ([`CopyReport::complete`]).
pub async fn copy_store(
    config: &Config,
    options: CopyStoreOptions,
    progress: &dyn CopyProgress,
) -> anyhow::Result<CopyReport> {
    let started = Instant::now();
    let source_place = Place::of(
        &config.store.database_url,
        &config.store.database_schema,
        "HERALD_DATABASE_URL",
    )?;
    let to_schema = options
        .to_schema
        .clone()
        .unwrap_or_else(|| config.store.database_schema.clone());
    // The rule `serve` applies: a copy into a schema no Herald can serve
    // is no copy.
    crate::config::check_schema_name(&to_schema)
        .map_err(|rule| anyhow::anyhow!("--to-schema: {rule}"))?;
    let target_place = Place::of(&options.to, &to_schema, "--to")?;
    if source_place.same_as(&target_place) {
        anyhow::bail!("--to names the configured store itself: give another store to copy into");
    }
    if let Place::Sqlite(path) = &source_place {
        if !path.is_file() {
            anyhow::bail!(
                "HERALD_DATABASE_URL: no SQLite store at {}: nothing to copy",
                path.display()
            );
        }
    }
    // Held to the end: no `serve` starts on either file meanwhile.
    let _source_lock = match &source_place {
        Place::Sqlite(path) => Some(hold(path, "source")?),
        Place::Postgres { .. } => None,
    };
    let _target_lock = match &target_place {
        Place::Sqlite(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            Some(hold(path, "target")?)
        }
        Place::Postgres { .. } => None,
    };

    // The source as this Herald knows it: every migration applied, none
    // newer (the table list is this version's).
    let status = super::migration_status(config)
        .await
        .context("reading the source store's migrations")?;
    if let Some(newer) = status.newer_than_this_binary() {
        anyhow::bail!("the source store: {newer}");
    }
    if !status.pending.is_empty() {
        anyhow::bail!(
            "the source store has {} migration(s) pending: run `herald migrate` on it first",
            status.pending.len()
        );
    }
    let mut source = open_end(&source_place, "source").await?;

    // The target migrated to this version, as `herald migrate` would.
    let from_keys = config.security.encryption_keys.clone();
    let to_keys = options.to_keys.clone().unwrap_or_else(|| from_keys.clone());
    let mut target_config = config.clone();
    target_config.store.database_url = options.to.clone();
    target_config.store.database_schema = to_schema.clone();
    target_config.store.auto_migrate = true;
    target_config.security.encryption_keys = to_keys.clone();
    open_backend(&target_config)
        .await
        .context("migrating the target store")?
        .close()
        .await;
    let mut target = open_end(&target_place, "target").await?;

    let (from_pg, to_pg) = (source.is_postgres(), target.is_postgres());
    let tables: Vec<&'static CopyTable> = TABLES
        .iter()
        .filter(|t| t.derived == Derived::No && t.on(from_pg) && t.on(to_pg))
        .collect();

    // Empty, or holding an interrupted copy's progress with --resume.
    let mut resumed = Vec::with_capacity(tables.len());
    let mut holds_rows = None;
    for table in &tables {
        let key = target.progress(table).await?;
        if holds_rows.is_none() && key.is_none() && target.count(table).await? > 0 {
            holds_rows = Some(table.name);
        }
        resumed.push(key);
    }
    let has_progress = resumed.iter().any(Option::is_some);
    match (options.resume, has_progress, holds_rows) {
        (false, true, _) => anyhow::bail!(
            "the target holds an interrupted copy: run again with --resume to finish it"
        ),
        (false, false, Some(table)) => anyhow::bail!(
            "the target is not empty (table {table} holds rows): copy-store copies into an \
             empty store only"
        ),
        (true, false, Some(table)) => anyhow::bail!(
            "--resume: the target holds rows (table {table}) but no copy in progress: \
             it was not made by an interrupted copy-store, or that copy completed"
        ),
        _ => {}
    }

    let page_rows = options.page_rows.max(1);
    let mut tallies = Vec::with_capacity(tables.len());
    for (table, progress_key) in tables.iter().zip(resumed) {
        let mut after = match progress_key {
            Some(text) => Some(decode_key(&text).with_context(|| {
                format!("the target's progress of {} is not a key", table.name)
            })?),
            None => None,
        };
        let total = source.count(table).await?;
        let already = if after.is_some() {
            target.count(table).await?
        } else {
            0
        };
        progress.table_started(table.name, total, already);
        let mut copied = 0;
        loop {
            let page = source.read_page(table, after.take(), page_rows).await?;
            let Some(last) = page.last() else { break };
            let last_key = table.key_of(last, from_pg);
            let mut rows: Vec<CopyRow> = page
                .iter()
                .map(|r| to_target(table, r, from_pg, to_pg))
                .collect();
            if table.name == "endpoints" {
                for row in &mut rows {
                    reseal_endpoint(table, row, to_pg, &from_keys, &to_keys)?;
                }
            }
            let n = page.len() as u64;
            copied += target
                .insert_page(table, rows, last_key.clone())
                .await
                .with_context(|| format!("copying {} into the target", table.name))?;
            progress.page_copied(table.name, n);
            if (n as usize) < page_rows {
                break;
            }
            after = Some(last_key);
        }
        progress.table_done(table.name);
        tallies.push(TableTally {
            table: table.name,
            copied,
            source: total,
            target: 0,
        });
    }

    // Each throttled endpoint's next send slot, which the backends keep
    // in different places (`store::copy`).
    let mut throttle_slots = 0;
    let mut after = String::new();
    loop {
        let slots = source.throttle_slots(after.clone(), page_rows).await?;
        let Some((last, _)) = slots.last() else { break };
        after = last.clone();
        throttle_slots += slots.len() as u64;
        let full = slots.len() == page_rows;
        target.set_throttle_slots(slots).await?;
        if !full {
            break;
        }
    }

    // Both sides counted again at the end: a PostgreSQL source that a
    // process started serving mid-copy shows here as a difference.
    for (tally, table) in tallies.iter_mut().zip(&tables) {
        tally.source = source.count(table).await?;
        tally.target = target.count(table).await?;
    }
    let source_counts = source.kept_counts().await?;
    let target_counts = target.kept_counts().await?;
    let report = CopyReport {
        tables: tallies,
        kept_counts: source_counts.len(),
        kept_counts_equal: source_counts == target_counts,
        throttle_slots,
        elapsed: started.elapsed(),
    };
    if report.complete() {
        target.clear_progress().await?;
    }
    source.close().await;
    target.close().await;
    Ok(report)
}
