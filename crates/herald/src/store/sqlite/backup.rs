//! Backups of the SQLite store, taken while Herald serves, and restoring
//! one (`herald backup`, `herald restore`).
//!
//! A backup is SQLite's online backup, page by page, from a read-only
//! connection of its own into a file beside the target. That connection
//! holds one read transaction through every step, so in WAL mode all the
//! steps read one snapshot (a step outside it would start the copy again
//! whenever the writer commits) and the writer is never blocked (ingest
//! goes on; the WAL only grows until the copy ends). The serving process
//! shares the machine, so the copy is gentle with it: pages as they are
//! (a fraction of the CPU `VACUUM INTO` spent rebuilding every table and
//! index), a thread at nice 19, and the copy's writes flushed to disk
//! 4 MiB at a time with a pause after each ([`PAUSE_PER_STEP`]) rather
//! than in one burst, which held up the writer's own fsyncs behind it.
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
///
/// It runs on a thread of its own at the lowest CPU priority (nice 19):
/// the serving process shares the cores with it, and a backup that takes
/// longer is better than deliveries that do.
pub fn backup(store: &Path, target: &Path) -> StoreResult<Summary> {
    backup_making_room(store, target, || {}, || true)
}

/// As [`backup`], with `make_room` called once the copy is whole and
/// checked, just before it is renamed to `target`: a rotation removes its
/// oldest backup there, so no more than it keeps ever lie in the folder,
/// and none is removed for a copy that failed. `keep_going` is asked
/// between steps: false stops the copy (a shutdown need not wait for a
/// large store's), and its partial file is removed.
pub fn backup_making_room(
    store: &Path,
    target: &Path,
    make_room: impl FnOnce() + Send + 'static,
    keep_going: impl Fn() -> bool + Send + 'static,
) -> StoreResult<Summary> {
    let (store, target) = (store.to_owned(), target.to_owned());
    std::thread::Builder::new()
        .name("herald-backup".into())
        .spawn(move || {
            lower_this_threads_priority();
            backup_here(&store, &target, make_room, &keep_going)
        })
        .map_err(|e| StoreError::Internal(format!("cannot start the backup thread: {e}")))?
        .join()
        .map_err(|_| StoreError::Internal("the backup thread panicked".into()))?
}

/// Nice 19 for the calling thread (Linux: a thread's own priority); a
/// refusal only leaves it at the process's.
fn lower_this_threads_priority() {
    // SAFETY: gettid has no preconditions; setpriority on this thread's
    // id changes only this thread's nice value.
    unsafe {
        let tid = libc::gettid();
        let _ = libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

fn backup_here(
    store: &Path,
    target: &Path,
    make_room: impl FnOnce(),
    keep_going: &dyn Fn() -> bool,
) -> StoreResult<Summary> {
    if !store.exists() {
        return Err(StoreError::Internal(format!(
            "no store at {} to back up",
            store.display()
        )));
    }
    let partial = with_suffix(target, ".partial");
    let result = whole_copy(store, &partial, keep_going).and_then(|summary| {
        make_room();
        std::fs::rename(&partial, target)
            .map_err(|e| unavailable("cannot move the backup to", target, e))?;
        Ok(summary)
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// `store` copied page by page into one self-contained file at `partial`
/// (what is still in its write-ahead log included: SQLite reads the store
/// as a whole, where a copy of the main file alone would miss every
/// transaction not checkpointed yet), on disk and checked.
fn whole_copy(store: &Path, partial: &Path, keep_going: &dyn Fn() -> bool) -> StoreResult<Summary> {
    let _ = std::fs::remove_file(partial);
    let conn = Connection::open_with_flags(store, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| unavailable("cannot open", store, e))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| unavailable("cannot open", store, e))?;
    let mut copy =
        Connection::open(partial).map_err(|e| unavailable("cannot create", partial, e))?;
    // Durable by the one fsync below, once the copy is whole.
    copy.pragma_update(None, "synchronous", "OFF")
        .map_err(|e| unavailable("cannot write the backup", partial, e))?;
    copy_every_page(&conn, &mut copy, partial, keep_going)
        .and_then(|()| {
            // One self-contained file: the copy came in WAL mode, whose
            // -wal and -shm would be left beside it under the partial name.
            copy.pragma_update_and_check(None, "journal_mode", "DELETE", |_| Ok(()))
        })
        .map_err(|e| unavailable("cannot write the backup", partial, e))?;
    drop(copy);
    drop(conn);
    std::fs::File::open(partial)
        .and_then(|f| f.sync_all())
        .map_err(|e| unavailable("cannot write the backup", partial, e))?;
    check(partial)
}

/// Pages copied per backup step (4 MiB of 4 KiB pages), each step's
/// writes flushed before the next.
const PAGES_PER_STEP: std::os::raw::c_int = 1024;

/// The pause after each step: at most 4 MiB per 50 ms (80 MB/s) of the
/// disk goes to the copy, and the writer's commits (each an fsync) keep
/// theirs; an unpaced copy slowed the deliveries beside it by a third
/// (BENCHMARKS.md), a paced one takes about twice as long.
const PAUSE_PER_STEP: std::time::Duration = std::time::Duration::from_millis(50);

/// Every page of `from` into `to` (the file at `to_path`), in steps under
/// one read transaction of `from` (one snapshot); a source busy or locked
/// for a moment is asked again, for up to ten seconds, as the busy timeout
/// would.
fn copy_every_page(
    from: &Connection,
    to: &mut Connection,
    to_path: &Path,
    keep_going: &dyn Fn() -> bool,
) -> rusqlite::Result<()> {
    // Any read opens the transaction; the snapshot is fixed from here.
    from.execute_batch("BEGIN; SELECT count(*) FROM sqlite_schema;")?;
    let copied = copy_steps(from, to, to_path, keep_going);
    let ended = from.execute_batch("COMMIT");
    copied.and(ended)
}

fn copy_steps(
    from: &Connection,
    to: &mut Connection,
    to_path: &Path,
    keep_going: &dyn Fn() -> bool,
) -> rusqlite::Result<()> {
    use rusqlite::backup::{Backup, StepResult};
    let backup = Backup::new(from, to)?;
    let mut waits = 0;
    let mut file = None;
    loop {
        if !keep_going() {
            return Err(failure(
                rusqlite::ffi::SQLITE_INTERRUPT,
                "stopped: the process is shutting down",
            ));
        }
        match backup.step(PAGES_PER_STEP)? {
            StepResult::Done => return Ok(()),
            StepResult::More => {
                // Flush this step's pages now, a few megabytes at a time.
                if file.is_none() {
                    file = std::fs::File::open(to_path).ok();
                }
                if let Some(f) = &file {
                    flush_written(f);
                }
                std::thread::sleep(PAUSE_PER_STEP);
            }
            StepResult::Busy | StepResult::Locked => {
                waits += 1;
                if waits > 1000 {
                    return Err(failure(
                        rusqlite::ffi::SQLITE_BUSY,
                        "the store stayed busy for ten seconds",
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            _ => {}
        }
    }
}

/// A copy that ends as SQLite's `code` would, saying why.
fn failure(code: std::os::raw::c_int, why: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), Some(why.to_owned()))
}

/// Writes out the file's dirty pages and waits for them (Linux's
/// `sync_file_range`: data only, no metadata, no cache flush of the
/// device): bounded bursts in place of one of the whole copy.
fn flush_written(file: &std::fs::File) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a valid open descriptor; the call only starts and awaits
    // writeback of that file's pages.
    unsafe {
        let _ = libc::sync_file_range(
            file.as_raw_fd(),
            0,
            0,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        );
    }
}

/// `<store>.replaced-<stamp>`, or `…-2`, `…-3`… when a restore in the
/// same second has taken it: a rename onto a name in use would overwrite
/// the store set aside before (and could pair a `-wal` with another file).
fn free_aside_name(store: &Path, stamp: &str) -> StoreResult<PathBuf> {
    const TRIES: u32 = 1000;
    for n in 1..=TRIES {
        let suffix = match n {
            1 => format!(".replaced-{stamp}"),
            n => format!(".replaced-{stamp}-{n}"),
        };
        let aside = with_suffix(store, &suffix);
        if ["", "-wal", "-shm"]
            .iter()
            .all(|companion| !with_suffix(&aside, companion).exists())
        {
            return Ok(aside);
        }
    }
    Err(StoreError::Unavailable(format!(
        "cannot move {} aside: {TRIES} names `.replaced-{stamp}…` are taken",
        store.display()
    )))
}

/// Puts the backup at `backup` in place as the store at `store`: checks
/// it, moves the current store (and its `-wal`/`-shm`, which may hold
/// committed rows) aside as `<store>.replaced-<stamp>` (a name no earlier
/// restore took: [`free_aside_name`]), and copies the
/// backup in (through `<store>.partial`). The caller holds the store's
/// lock (no process serves it). Returns what the restored store holds and
/// where the replaced one went, if there was one.
pub fn restore(
    backup: &Path,
    store: &Path,
    stamp: &str,
) -> StoreResult<(Summary, Option<PathBuf>)> {
    check(backup)?;
    let partial = with_suffix(store, ".partial");
    // Through SQLite, not as a file: a backup file may have a write-ahead
    // log beside it (a stopped store, one moved aside by an earlier
    // restore) holding what it reports. On disk before it is renamed in: a
    // power cut after the rename must not leave a store whose pages never
    // reached the disk.
    let summary = whole_copy(backup, &partial, &|| true).inspect_err(|_| {
        let _ = std::fs::remove_file(&partial);
    })?;
    let aside = if store.exists() {
        let aside = free_aside_name(store, stamp)?;
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
    // The renames themselves, durable too (they live in the folder).
    if let Some(dir) = store.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| unavailable("cannot write", dir, e))?;
    }
    Ok((summary, aside))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backup file whose write-ahead log holds what it reports (a store
    /// stopped with its log not yet folded in, or one an earlier restore
    /// moved aside with its companions) is restored whole: a copy of the
    /// main file alone restored an empty store while the summary counted
    /// its messages.
    #[test]
    fn a_backup_with_a_write_ahead_log_is_restored_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("h.db");
        let conn = Connection::open(&store).expect("open");
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; \
             CREATE TABLE messages (id TEXT); CREATE TABLE deliveries (state INTEGER); \
             INSERT INTO messages VALUES ('a'), ('b'); INSERT INTO deliveries VALUES (0), (3); \
             PRAGMA user_version = 1;",
        )
        .expect("fill");
        // Taken while the log is still apart from the main file.
        let backup = dir.path().join("bk.db");
        for companion in ["", "-wal"] {
            std::fs::copy(
                with_suffix(&store, companion),
                with_suffix(&backup, companion),
            )
            .expect("copy");
        }
        drop(conn);
        let restored = dir.path().join("restored.db");
        let (summary, aside) = restore(&backup, &restored, "t").expect("restore");
        assert_eq!((summary.messages, summary.deliveries), (2, [1, 0, 0, 1]));
        assert_eq!(aside, None);
        let back = check(&restored).expect("a store");
        assert_eq!((back.messages, back.deliveries), (2, [1, 0, 0, 1]));
        assert!(!with_suffix(&restored, ".partial").exists());
    }

    /// A backup told to stop (the process shutting down) ends at its next
    /// step with an error, leaving neither the target nor its partial
    /// file: a stopped copy is not a backup, and it is as large as the store.
    #[test]
    fn a_stopped_backup_leaves_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("h.db");
        let conn = Connection::open(&store).expect("open");
        conn.execute_batch("CREATE TABLE t (x BLOB); INSERT INTO t VALUES (zeroblob(100000));")
            .expect("fill");
        let target = dir.path().join("copy.db");
        let stopped = backup_making_room(&store, &target, || {}, || false);
        assert!(
            matches!(&stopped, Err(e) if e.to_string().contains("shutting down")),
            "{stopped:?}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("copy.db"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
