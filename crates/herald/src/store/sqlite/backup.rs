//! Backups of the SQLite store, taken while Herald serves, and restoring
//! one (`herald backup`, `herald restore`).
//!
//! A backup is `VACUUM INTO` a file beside the target, run on a read-only
//! connection of its own: in WAL mode it reads one snapshot and never
//! blocks the writer (ingest goes on; the WAL only grows until it ends).
//! The copy is checked (`PRAGMA integrity_check`, its schema version) and
//! only then renamed to the target, so a target path never holds a
//! half-written file. Secrets are copied as stored: sealed when
//! `HERALD_ENCRYPTION_KEY` was set.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::migrations::newest_version;
use crate::store::{StoreError, StoreResult};

/// What a backup (or a restored file) holds, for its one-line summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub bytes: u64,
    pub schema_version: i64,
    pub messages: u64,
    /// Deliveries by state: pending, delivering, delivered, dead.
    pub deliveries: [u64; 4],
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [pending, delivering, delivered, dead] = self.deliveries;
        write!(
            f,
            "{:.1} MB, schema {}, {} messages, deliveries: {pending} pending, \
             {delivering} delivering, {delivered} delivered, {dead} dead",
            self.bytes as f64 / 1e6,
            self.schema_version,
            self.messages
        )
    }
}

fn unavailable(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("{what} {}: {e}", path.display()))
}

/// `path` with `suffix` appended to its file name.
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Checks the file at `path` as a Herald store: it opens, passes `PRAGMA
/// integrity_check`, and its schema is not newer than this binary's.
/// Returns what it holds.
pub fn check(path: &Path) -> StoreResult<Summary> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| unavailable("cannot open", path, e))?;
    let not_a_store = |e: rusqlite::Error| {
        StoreError::Internal(format!(
            "{} is not a Herald SQLite store: {e}",
            path.display()
        ))
    };
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(not_a_store)?;
    if integrity != "ok" {
        return Err(StoreError::Internal(format!(
            "{} fails the integrity check: {integrity}",
            path.display()
        )));
    }
    let schema_version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(not_a_store)?;
    if schema_version > newest_version() {
        return Err(StoreError::Internal(format!(
            "{}: {}",
            path.display(),
            crate::store::newer_schema(schema_version, newest_version())
        )));
    }
    if schema_version == 0 {
        return Err(StoreError::Internal(format!(
            "{} is not a Herald store (no schema)",
            path.display()
        )));
    }
    let messages: i64 = conn
        .query_row("SELECT count(*) FROM messages", [], |r| r.get(0))
        .map_err(not_a_store)?;
    let mut deliveries = [0u64; 4];
    let mut stmt = conn
        .prepare("SELECT state, count(*) FROM deliveries GROUP BY state")
        .map_err(not_a_store)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
        .map_err(not_a_store)?;
    for row in rows {
        let (state, n) = row.map_err(not_a_store)?;
        if let Some(slot) = usize::try_from(state)
            .ok()
            .and_then(|s| deliveries.get_mut(s))
        {
            *slot = u64::try_from(n).unwrap_or(0);
        }
    }
    let bytes = std::fs::metadata(path)
        .map_err(|e| unavailable("cannot read", path, e))?
        .len();
    Ok(Summary {
        bytes,
        schema_version,
        messages: u64::try_from(messages).unwrap_or(0),
        deliveries,
    })
}

/// Writes a consistent copy of the store at `store` to `target` (which the
/// caller has made sure may be written), checks it, and returns what it
/// holds. The copy is made as `<target>.partial` and renamed only once
/// checked; on any failure nothing is left at `target`.
pub fn backup(store: &Path, target: &Path) -> StoreResult<Summary> {
    if !store.exists() {
        return Err(StoreError::Internal(format!(
            "no store at {} to back up",
            store.display()
        )));
    }
    let partial = with_suffix(target, ".partial");
    let _ = std::fs::remove_file(&partial);
    let result = (|| {
        let conn = Connection::open_with_flags(store, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| unavailable("cannot open", store, e))?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| unavailable("cannot open", store, e))?;
        let into = partial.to_str().ok_or_else(|| {
            StoreError::Internal(format!("{} is not a UTF-8 path", partial.display()))
        })?;
        conn.execute("VACUUM INTO ?1", [into])
            .map_err(|e| unavailable("cannot write the backup", &partial, e))?;
        drop(conn);
        let summary = check(&partial)?;
        std::fs::rename(&partial, target)
            .map_err(|e| unavailable("cannot move the backup to", target, e))?;
        Ok(summary)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Puts the backup at `backup` in place as the store at `store`: checks
/// it, moves the current store (and its `-wal`/`-shm`, which may hold
/// committed rows) aside as `<store>.replaced-<stamp>`, and copies the
/// backup in (through `<store>.partial`). The caller holds the store's
/// lock (no process serves it). Returns what the restored store holds and
/// where the replaced one went, if there was one.
pub fn restore(
    backup: &Path,
    store: &Path,
    stamp: &str,
) -> StoreResult<(Summary, Option<PathBuf>)> {
    let summary = check(backup)?;
    let partial = with_suffix(store, ".partial");
    std::fs::copy(backup, &partial).map_err(|e| unavailable("cannot copy to", &partial, e))?;
    let aside = if store.exists() {
        let aside = with_suffix(store, &format!(".replaced-{stamp}"));
        for companion in ["", "-wal", "-shm"] {
            let from = with_suffix(store, companion);
            if from.exists() {
                let to = with_suffix(&aside, companion);
                std::fs::rename(&from, &to)
                    .map_err(|e| unavailable("cannot move aside", &from, e))?;
            }
        }
        Some(aside)
    } else {
        None
    };
    std::fs::rename(&partial, store).map_err(|e| unavailable("cannot put in place", store, e))?;
    Ok((summary, aside))
}
