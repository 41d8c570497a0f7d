//! The kept delivery counts (`delivery_counts`), folded per transaction.
//!
//! Migration 0018's triggers on `deliveries` call `herald_count(endpoint,
//! state, held, delta)`, a Rust function registered on every connection
//! that writes deliveries. It only adds the delta into an in-memory map;
//! the owner of the connection writes the map's net changes into
//! `delivery_counts` (one upsert per (endpoint, state, held) changed)
//! just before it commits, in the same transaction, so a reader never
//! sees deliveries and counts disagree. Row triggers writing the table
//! (migration 0016) cost the hot path one B-tree upsert per delivery
//! change; the fold costs a hash lookup.
//!
//! **The writer's own statements** (issue 13: the hot path must not pay for
//! the counts). A statement that fires a row trigger is a "multi-write"
//! one to SQLite, so inside the writer's transaction it opens a statement
//! journal and copies every page it touches before changing it: that, not
//! the fold, was most of what the counts cost a delivery. So the writer
//! connection runs with the schema's triggers off
//! (`SQLITE_DBCONFIG_ENABLE_TRIGGER`) and with [`WRITER_TRIGGERS`] of its
//! own, TEMP ones, which leave out its hottest statements:
//! - inserts of deliveries carry no trigger at all: every insert on the
//!   writer counts itself with [`counted`] (ingest, the example, resend,
//!   replay of missing deliveries);
//! - updates fire the count trigger only when they name `parked`; the
//!   three statements of the hot path (the claim's take, the completion,
//!   the release) do not, and count themselves with [`counted`]; every
//!   other update that moves `state` names `parked` (a test holds the
//!   sources to it: `every_state_update_on_the_writer_is_counted`);
//! - deletes fire as before.
//!
//! Every other connection (the migration runner, an operator's `sqlite3`
//! shell) keeps the schema's triggers of migration 0018, which count every
//! insert, update and delete, and fail without the function.
//!
//! Exactness rests on three rules, all enforced here or loudly:
//! - deltas are taken only inside a counted transaction (between
//!   [`CountFold::begin`] and [`CountFold::flush`]); outside one, the
//!   function fails and so does the statement ("no such function" on a
//!   connection without it), rather than lose a change silently;
//! - a writer job rolled back to its savepoint takes its deltas back
//!   ([`CountFold::job_start`] / [`CountFold::job_rollback`]), and a
//!   failing first job, run without one, takes the transaction's
//!   ([`CountFold::discard`], then `begin` for the next transaction);
//! - a transaction that fails to commit loses nothing kept: the flushed
//!   rows roll back with it, and the next `begin` starts from an empty map.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::functions::FunctionFlags;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection};

use crate::store::{StoreError, StoreResult};

/// The function the triggers call.
pub const COUNT_FUNCTION: &str = "herald_count";

/// The writer connection's count triggers (see the module's comment): the
/// schema's, less the insert trigger and with the update trigger narrowed
/// to updates that name `parked`.
pub const WRITER_TRIGGERS: &str = "
CREATE TEMP TRIGGER writer_counts_update AFTER UPDATE OF parked ON main.deliveries
WHEN old.state != new.state OR (old.parked = 2) != (new.parked = 2)
BEGIN
    SELECT herald_count(old.endpoint_id, old.state, old.parked = 2, -1),
           herald_count(new.endpoint_id, new.state, new.parked = 2, 1);
END;
CREATE TEMP TRIGGER writer_counts_delete AFTER DELETE ON main.deliveries
BEGIN
    SELECT herald_count(old.endpoint_id, old.state, old.parked = 2, -1);
END;
CREATE TEMP TRIGGER writer_counts_endpoint_deleted AFTER DELETE ON main.endpoints
BEGIN
    DELETE FROM delivery_counts WHERE endpoint_id = old.id;
END;";

thread_local! {
    /// The fold of the connection this thread writes with (the writer
    /// thread's), for the statements that count themselves.
    static INSTALLED: RefCell<Option<CountFold>> = const { RefCell::new(None) };
}

/// Switches `conn` (the writer, migrated) to [`WRITER_TRIGGERS`].
pub fn use_writer_triggers(conn: &Connection) -> rusqlite::Result<()> {
    use rusqlite::config::DbConfig;
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false)?;
    conn.execute_batch(WRITER_TRIGGERS)
}

/// A delivery change made by a statement of the writer that carries no
/// count trigger: `delta` deliveries of `endpoint` in `state` (`held`: a
/// disabled endpoint's, `parked = 2`). Fails, and so fails the statement's
/// job, outside a counted transaction or on a thread with no installed
/// fold, as the trigger function does.
pub fn counted(endpoint: &str, state: i64, held: bool, delta: i64) -> StoreResult<()> {
    INSTALLED
        .with(|installed| match &*installed.borrow() {
            Some(fold) => lock(&fold.0).add(endpoint, state, i64::from(held), delta),
            None => Err(format!(
                "{COUNT_FUNCTION}: a delivery changed on a thread with no installed count fold"
            )),
        })
        .map_err(StoreError::Internal)
}

/// A delivery of `endpoint` moved from `from` to `to` (neither held), by a
/// statement that counts itself.
pub fn moved(endpoint: &str, from: i64, to: i64, held: bool) -> StoreResult<()> {
    if from == to {
        return Ok(());
    }
    counted(endpoint, from, held, -1)?;
    counted(endpoint, to, held, 1)
}

/// Delivery states are 0 pending, 1 delivering, 2 delivered, 3 dead (and
/// room for a few more); a slot is `state * 2 + held`.
const STATES: usize = 8;
const SLOTS: usize = STATES * 2;

#[derive(Default)]
struct Fold {
    /// Between `begin` and `flush`: deltas are accepted.
    armed: bool,
    /// Endpoint id → its row in `changes`.
    index: HashMap<Box<str>, usize>,
    changes: Vec<(Box<str>, [i64; SLOTS])>,
    /// The current job's deltas, (row, slot, delta), undone on rollback.
    journal: Vec<(usize, usize, i64)>,
    /// A job's rollback failed: this transaction's counts are unknown.
    broken: bool,
}

impl Fold {
    fn add(&mut self, endpoint: &str, state: i64, held: i64, delta: i64) -> Result<(), String> {
        if !self.armed {
            return Err(format!(
                "{COUNT_FUNCTION}: a delivery changed outside a counted transaction \
                 (change deliveries only through the store's writer, which folds the counts)"
            ));
        }
        let state = usize::try_from(state)
            .ok()
            .filter(|s| *s < STATES)
            .ok_or_else(|| format!("{COUNT_FUNCTION}: delivery state {state} out of range"))?;
        let slot = state * 2 + usize::from(held != 0);
        let row = match self.index.get(endpoint) {
            Some(row) => *row,
            None => {
                let row = self.changes.len();
                self.changes.push((endpoint.into(), [0; SLOTS]));
                self.index.insert(endpoint.into(), row);
                row
            }
        };
        self.changes[row].1[slot] += delta;
        self.journal.push((row, slot, delta));
        Ok(())
    }

    fn clear(&mut self) {
        self.index.clear();
        self.changes.clear();
        self.journal.clear();
        self.broken = false;
    }
}

/// The count deltas of one connection's current transaction (a cheap
/// handle: clones share the map).
#[derive(Clone)]
pub(super) struct CountFold(Arc<Mutex<Fold>>);

impl CountFold {
    /// Registers `herald_count` on `conn`, folding into the returned map.
    /// Every connection that writes deliveries needs it (the triggers fail
    /// with "no such function" without it).
    pub(super) fn register(conn: &Connection) -> rusqlite::Result<CountFold> {
        let fold = CountFold(Arc::new(Mutex::new(Fold::default())));
        let inner = fold.0.clone();
        // Not DETERMINISTIC: it has a side effect, and must run every time.
        conn.create_scalar_function(COUNT_FUNCTION, 4, FunctionFlags::SQLITE_UTF8, move |ctx| {
            let endpoint = match ctx.get_raw(0) {
                ValueRef::Text(t) => std::str::from_utf8(t)
                    .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e)))?,
                _ => {
                    return Err(rusqlite::Error::UserFunctionError(
                        format!("{COUNT_FUNCTION}: endpoint id is not text").into(),
                    ))
                }
            };
            let (state, held, delta) = (ctx.get::<i64>(1)?, ctx.get::<i64>(2)?, ctx.get::<i64>(3)?);
            lock(&inner)
                .add(endpoint, state, held, delta)
                .map_err(|e| rusqlite::Error::UserFunctionError(e.into()))?;
            Ok(rusqlite::types::Null)
        })?;
        Ok(fold)
    }

    /// Makes this the fold [`counted`] adds to on the current thread.
    pub fn install(&self) {
        INSTALLED.with(|installed| *installed.borrow_mut() = Some(self.clone()));
    }

    /// A transaction begins: deltas are accepted from now on, from an empty
    /// map (whatever a failed transaction left is dropped).
    pub fn begin(&self) {
        let mut f = lock(&self.0);
        f.clear();
        f.armed = true;
    }

    /// A writer job begins (in its own savepoint, or first in the
    /// transaction).
    pub fn job_start(&self) {
        lock(&self.0).journal.clear();
    }

    /// The job failed and was rolled back to its savepoint (`undone`): its
    /// deltas go too. If that rollback itself failed, which of its rows
    /// remain is unknown, so the transaction must not commit: `flush`
    /// refuses.
    pub fn job_rollback(&self, undone: bool) {
        let mut f = lock(&self.0);
        let journal = std::mem::take(&mut f.journal);
        if !undone {
            f.broken = true;
            return;
        }
        for (row, slot, delta) in journal {
            f.changes[row].1[slot] -= delta;
        }
    }

    /// Writes the net changes into `delivery_counts` on `conn`, inside the
    /// transaction about to commit, and stops accepting deltas. Changes of
    /// an endpoint deleted meanwhile are dropped: its rows went with it.
    pub fn flush(&self, conn: &Connection) -> rusqlite::Result<()> {
        let mut f = lock(&self.0);
        f.armed = false;
        let broken = f.broken;
        let changes = std::mem::take(&mut f.changes);
        f.clear();
        drop(f);
        if broken {
            return Err(rusqlite::Error::UserFunctionError(
                format!(
                    "{COUNT_FUNCTION}: a job's rollback failed, so the kept counts of this \
                     transaction are unknown; it is rolled back whole"
                )
                .into(),
            ));
        }
        if changes.is_empty() {
            return Ok(());
        }
        let mut upsert = conn.prepare_cached(
            "INSERT INTO delivery_counts (endpoint_id, state, held, n) \
             SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM endpoints WHERE id = ?1) \
             ON CONFLICT (endpoint_id, state, held) DO UPDATE SET n = n + excluded.n",
        )?;
        for (endpoint, slots) in &changes {
            for (slot, delta) in slots.iter().enumerate().filter(|(_, d)| **d != 0) {
                let (state, held) = (slot / 2, slot % 2);
                upsert.execute(params![
                    &**endpoint,
                    i64::try_from(state).unwrap_or(0),
                    i64::try_from(held).unwrap_or(0),
                    delta
                ])?;
            }
        }
        Ok(())
    }

    /// The transaction failed: drop its deltas and accept no more.
    pub fn discard(&self) {
        let mut f = lock(&self.0);
        f.clear();
        f.armed = false;
    }
}

fn lock(m: &Mutex<Fold>) -> MutexGuard<'_, Fold> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    /// Every file of the SQLite store, whose statements run on the writer.
    /// Every source file of this store but tests, read when the test runs,
    /// so a new file cannot be left out of the scan.
    fn sources() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store/sqlite");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("the store's folder") {
            let path = entry.expect("an entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            if name.ends_with(".rs") && !name.ends_with("_tests.rs") {
                let source = std::fs::read_to_string(&path).expect("a source file");
                out.push((name, source));
            }
        }
        out
    }

    /// The rest of the function `at` is in: a self-counting site calls
    /// `counts::` there (a prepared statement runs further down).
    fn rest_of_function(code: &str, at: usize) -> &str {
        let rest = &code[at..];
        let end = ["\nfn ", "\npub(super) fn ", "\n    fn ", "\n    async fn "]
            .iter()
            .filter_map(|next| rest.find(next))
            .min()
            .unwrap_or(rest.len());
        &rest[..end]
    }

    /// The writer's triggers count only updates that name `parked` and no
    /// inserts (see the module's comment): every other update that sets
    /// `state`, and every insert of deliveries, must count itself.
    #[test]
    fn every_state_update_on_the_writer_is_counted() {
        assert!(super::super::replay::REPLAY_SET.contains("parked"));
        let mut checked = 0;
        for (file, source) in sources() {
            let code = source.split("#[cfg(test)]").next().unwrap_or(&source);
            for (at, _) in code.match_indices("UPDATE deliveries") {
                let statement = code[at..].split('"').next().unwrap_or_default();
                let set = statement.split(" WHERE ").next().unwrap_or(statement);
                let sets_state = set.contains(" state =") || set.contains("{REPLAY_SET}");
                if sets_state && !set.contains("parked") && !set.contains("{REPLAY_SET}") {
                    let after = rest_of_function(code, at);
                    assert!(
                        after.contains("counts::moved") || after.contains("counts::counted"),
                        "{file}: `{statement}` moves a delivery's state, names no `parked` \
                         (so no count trigger fires on the writer) and counts nothing itself"
                    );
                }
                checked += 1;
            }
            for (at, _) in code.match_indices("INSERT INTO deliveries") {
                let after = rest_of_function(code, at);
                assert!(
                    after.contains("counts::counted"),
                    "{file}: an insert of deliveries that counts nothing (the writer has no \
                     insert trigger)"
                );
                checked += 1;
            }
        }
        assert!(
            checked > 20,
            "found only {checked} statements: the scan is broken"
        );
    }
}
